//! Bounds on what an opened gossip datagram may say, checked before
//! chitchat sees it, so that even a holder of the gossip key cannot
//! overflow, freeze, bloat or panic a node.
//!
//! The check reads chitchat's protocol V0 wire format (the only version
//! peerlb speaks): magic `0xB053` (u16 LE), version byte `0`, message type
//! (0 Syn, 1 SynAck, 2 Ack, 3 BadCluster); a digest is a u16 count of
//! `(ChitchatId, heartbeat u64, last_gc_version u64, max_version u64)`; a
//! delta is a block stream (block type 0 end, 1 zstd-compressed, 2 plain,
//! each with a u16 length) of operations: 0 node `(ChitchatId,
//! last_gc_version u64, from_version u64)`, 1 key-value `(key, value,
//! version u64, status u8 0..=2)`, 2 set-max-version `(u64)`. Strings are
//! a u16 length and UTF-8; a ChitchatId is `(node id, generation u64,
//! address: 4|6, octets, port u16)`; integers little-endian.
//!
//! A datagram is refused (and counted) when it does not parse, or:
//! - a node id is longer than 63 bytes, a key than [`MAX_KEY_LEN`], a value
//!   than [`MAX_VALUE_LEN`];
//! - a digest or delta names more than `max_members` nodes, or a node
//!   carries more than [`MAX_KEYS_PER_NODE`] keys;
//! - a heartbeat or version exceeds [`MAX_COUNTER`] (2^40): chitchat adds
//!   one to versions and heartbeats, so 2^64 - 1 would overflow and panic,
//!   and 2^62 would freeze a member's real heartbeats for good; an honest
//!   node reaches 2^40 after 35,000 years at one update a millisecond;
//! - a heartbeat or version of a member this node already knows (same node
//!   id and generation) runs further ahead of the largest one it accepted
//!   for it than an honest member can advance in the time since (see
//!   [`Lead`]: a budget earned with wall-clock time, shared by all the
//!   datagrams that name the member): datagrams sealed by a key holder
//!   cannot push a live member's heartbeat or version far ahead (the
//!   others would then ignore the member's real heartbeats and declare it
//!   dead, or ignore its real updates), however many it sends, and naming
//!   many made-up members does not make this node forget a real one
//!   ([`KNOWN_PER_MEMBER`]);
//! - a delta carries state about this very node (its id and generation)
//!   with a version above this node's own `max_version`: only this node
//!   writes its own state, so such a delta is forged and chitchat would
//!   otherwise replace this node's values with it. (A delta about itself
//!   at or below its own `max_version` is an honest peer answering a stale
//!   digest; chitchat rejects it, so the datagram passes.)
//!
//! Dropping a delta about itself protects this node's own view only. Other
//! routes a key holder has to this node's state: a digest naming this node
//! changes nothing here (chitchat ignores its own id's heartbeat, and a
//! larger `max_version` only makes it send the digest's sender nothing
//! about itself); but a forged delta about this node sent to *another*
//! node is taken there (within the bounds above), and this node's real
//! updates with a version at or below the forged one are then ignored
//! there. Such foreign state is never adopted by this node (a peer's
//! delta that carries it, above this node's own versions, is dropped here
//! whole), and it is bounded by the [`Lead`] budget: `SLACK_ROUNDS`
//! rounds' worth plus a round's worth per round of the attack. So
//! dropping is not the whole defence: the peers holding the forged state
//! name this node in their digests with the forged heartbeat or version,
//! [`Bounds::check`] hands those figures on ([`SelfEcho`]), and the gossip
//! layer republishes this node's own values above them (its heartbeat
//! past the forged one, every key at a new version past the forged
//! `max_version`, a step at a time, at half the pace peers' budgets
//! earn: [`REPUBLISH_PAUSE_ROUNDS`]), so a few rounds after a forged jump
//! (about `2 x` the attack's length in rounds after a sustained one)
//! every view holds the node's real state again and its real heartbeats
//! count again.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

#[cfg(test)]
use crate::engine::gossip_budget::DEFAULT_MAX_MEMBERS;

/// Longest key, in bytes.
pub(crate) const MAX_KEY_LEN: usize = 64;
/// Longest value, in bytes.
pub(crate) const MAX_VALUE_LEN: usize = 256;
/// Most keys one node's delta may carry.
pub(crate) const MAX_KEYS_PER_NODE: usize = 32;
/// Largest heartbeat, version or garbage-collection version accepted.
pub(crate) const MAX_COUNTER: u64 = 1 << 40;
/// Heartbeats an honest member may add per gossip round as seen by this
/// node in a cluster of at most [`DEFAULT_MAX_MEMBERS`](crate::engine::gossip_budget::DEFAULT_MAX_MEMBERS): one per round of
/// its own plus one per message it processes (at most a Syn and an Ack
/// from each member and a few SynAcks), rounded up to a power of two.
/// [`heartbeats_per_round`] gives it for another `gossip.max_members`.
pub(crate) const HEARTBEATS_PER_ROUND: u64 = 256;

/// [`HEARTBEATS_PER_ROUND`] for a cluster of at most `max_members`: two
/// messages a member, rounded up to a power of two, never below the
/// default's.
pub(crate) fn heartbeats_per_round(max_members: usize) -> u64 {
    (2 * max_members as u64)
        .next_power_of_two()
        .max(HEARTBEATS_PER_ROUND)
}
/// Versions an honest member may add per gossip round: each change of one
/// of its keys adds one (`load` and `inflight` every load tick, `weight`
/// and `status` on demand).
pub(crate) const VERSIONS_PER_ROUND: u64 = 1024;
/// Rounds of lead always allowed on top of the time since the member was
/// last heard (gossip datagrams arrive out of order and late).
const SLACK_ROUNDS: u64 = 4;
/// Most a node moves its own heartbeat ahead in one republish: one
/// allowance of [`Lead`] with no silence, so its peers take the jump (a
/// figure further ahead is approached one step per echo of it).
pub(crate) const REPUBLISH_HEARTBEAT_STEP: u64 = HEARTBEATS_PER_ROUND * SLACK_ROUNDS / 2;
/// Most a node moves its own `max_version` ahead in one republish.
pub(crate) const REPUBLISH_VERSION_STEP: u64 = VERSIONS_PER_ROUND * SLACK_ROUNDS / 2;
/// Gossip rounds a node waits after a republish before the next: a step
/// ([`REPUBLISH_HEARTBEAT_STEP`], half a full budget of [`Lead`]) every
/// four rounds is half what peers' budgets earn meanwhile, so they take
/// every step on top of the node's own heartbeats.
pub(crate) const REPUBLISH_PAUSE_ROUNDS: u32 = 4;
/// Members remembered per member allowed: `KNOWN_PER_MEMBER x
/// max_members` members' last accepted heartbeat and version are kept.
/// When the memory is full, a newly named member takes the place of the
/// least recently heard one only if that one was not heard for
/// [`FORGET_AFTER_ROUNDS`]; otherwise the newcomer is not remembered (it is
/// judged as a new member again next time: absolute bounds only). Every
/// member of a cluster is named in every digest, so a live or recently
/// dead member is heard every round and a key holder naming thousands of
/// made-up members cannot make this node forget a real one (and then take
/// a 2^40 heartbeat for it).
const KNOWN_PER_MEMBER: usize = 4;
/// Rounds a remembered member must go unheard before a newcomer may take
/// its place in a full memory ([`KNOWN_PER_MEMBER`]).
pub(crate) const FORGET_AFTER_ROUNDS: u32 = 64;

/// Longest node id (as certificate names allow).
const MAX_NODE_ID_LEN: usize = 63;
/// Largest decompressed delta block (chitchat's own limit).
const MAX_BLOCK: usize = u16::MAX as usize;

/// Why a datagram was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BoundsError {
    /// The bytes are not a V0 chitchat message.
    #[error("malformed: {0}")]
    Malformed(&'static str),
    /// A length or count bound is broken.
    #[error("{what} {got} over the bound {max}")]
    TooLarge {
        /// What (node id, key, value, members, ...).
        what: &'static str,
        /// The value found.
        got: u64,
        /// The bound.
        max: u64,
    },
    /// A delta writes this node's own state past its own versions.
    #[error("a delta about this node itself")]
    AboutSelf,
    /// A known member's heartbeat or version runs too far ahead.
    #[error("{what} of {node} jumps {got} ahead of the known one, more than {max}")]
    Jump {
        /// `heartbeat` or `version`.
        what: &'static str,
        /// The member's node id.
        node: String,
        /// The lead found.
        got: u64,
        /// The lead allowed ([`Lead`]).
        max: u64,
    },
}

/// How far a known member's heartbeat and versions may run ahead of the
/// largest ones this node accepted for it: a token bucket per member and
/// figure, `per_round` ([`HEARTBEATS_PER_ROUND`] or
/// [`VERSIONS_PER_ROUND`]) earned per round of wall-clock time (fractions
/// count), at most `SLACK_ROUNDS` rounds' worth kept between datagrams,
/// and the whole of it earned during a silence. The allowance grows with
/// silence, so a member (or this node) cut off for a while is taken back;
/// a member forgotten (see [`KNOWN_PER_MEMBER`]) is judged as new. A key
/// holder moves a member ahead by at most `SLACK_ROUNDS` rounds' worth
/// plus `per_round` a round of its attack, however many datagrams it
/// sends (before, each accepted datagram was allowed a full allowance
/// again: a thousand datagrams, a thousand allowances), and the member
/// republishes over it once the attack stops (`gossip.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lead {
    /// Largest heartbeat accepted.
    heartbeat: u64,
    /// Largest version accepted (digest `max_version` or a delta's versions).
    version: u64,
    /// Heartbeats the member may still move ahead at `at` (see [`Lead::allowed`]).
    heartbeat_credit: u64,
    /// Versions the member may still move ahead at `at`.
    version_credit: u64,
    /// When it was last heard.
    at: Instant,
}

impl Lead {
    /// A member first heard at `now` with these figures: full credit.
    fn new(heartbeat: u64, version: u64, heartbeats_per_round: u64, now: Instant) -> Lead {
        Lead {
            heartbeat,
            version,
            heartbeat_credit: heartbeats_per_round.saturating_mul(SLACK_ROUNDS),
            version_credit: VERSIONS_PER_ROUND.saturating_mul(SLACK_ROUNDS),
            at: now,
        }
    }

    /// The lead allowed after `elapsed` since the member was last heard,
    /// given its `credit` then and `per_round`: the credit plus
    /// `per_round` per round elapsed (fractions count). Once a lead is
    /// taken, what is left of it (at most `SLACK_ROUNDS` rounds' worth) is
    /// the new credit ([`Lead::after`]), so datagrams in quick succession
    /// share one allowance: a key holder moves a member ahead at most
    /// `per_round` a round after its first `SLACK_ROUNDS` rounds' worth,
    /// however many datagrams it sends, and a member silent for a while is
    /// still taken back with what it did meanwhile.
    fn allowed(credit: u64, per_round: u64, elapsed: Duration, interval: Duration) -> u64 {
        let earned = u128::from(per_round) * elapsed.as_nanos() / interval.as_nanos().max(1);
        credit.saturating_add(u64::try_from(earned).unwrap_or(u64::MAX))
    }

    /// The credit left when `lead` of `allowed` was taken.
    fn after(allowed: u64, lead: u64, per_round: u64) -> u64 {
        allowed
            .saturating_sub(lead)
            .min(per_round.saturating_mul(SLACK_ROUNDS))
    }
}

/// The largest heartbeat and version other nodes' digests gave for this
/// node (its own id and generation): an honest peer only repeats what this
/// node published, so a figure above this node's own is forged state
/// about it held by that peer, which this node republishes over.
#[derive(Debug, Default)]
pub(crate) struct SelfEcho {
    heartbeat: AtomicU64,
    version: AtomicU64,
    /// This node's own `max_version` (set by the gossip layer after each
    /// change; may lag, never lead).
    own_version: AtomicU64,
    /// Told when a figure grows.
    grown: tokio::sync::Notify,
}

impl SelfEcho {
    /// Records figures a digest gave for this node.
    pub(crate) fn see(&self, heartbeat: u64, version: u64) {
        let h = self.heartbeat.fetch_max(heartbeat, Ordering::Relaxed);
        let v = self.version.fetch_max(version, Ordering::Relaxed);
        if heartbeat > h || version > v {
            self.grown.notify_one();
        }
    }

    /// Records this node's own `max_version`.
    pub(crate) fn set_own_version(&self, version: u64) {
        self.own_version.fetch_max(version, Ordering::Relaxed);
    }

    /// This node's own `max_version` as last recorded.
    pub(crate) fn own_version(&self) -> u64 {
        self.own_version.load(Ordering::Relaxed)
    }

    /// The largest (heartbeat, version) seen since the last call, reset:
    /// a figure only peers that still hold it repeat counts again.
    pub(crate) fn take(&self) -> (u64, u64) {
        (
            self.heartbeat.swap(0, Ordering::Relaxed),
            self.version.swap(0, Ordering::Relaxed),
        )
    }

    /// Waits until a figure grows.
    pub(crate) async fn grown(&self) {
        self.grown.notified().await;
    }
}

/// One member's figures read from a datagram: (node id, generation),
/// largest heartbeat and version.
type Seen = BTreeMap<(String, u64), (u64, u64)>;

/// The bounds one node applies (see the module doc).
pub(crate) struct Bounds {
    self_id: String,
    self_generation: u64,
    max_members: usize,
    /// [`heartbeats_per_round`] of `max_members`.
    heartbeats_per_round: u64,
    interval: Duration,
    /// Largest heartbeat and version accepted per known member, updated
    /// from every datagram handed to chitchat.
    known: Mutex<BTreeMap<(String, u64), Lead>>,
}

impl fmt::Debug for Bounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bounds")
            .field("self_id", &self.self_id)
            .field("max_members", &self.max_members)
            .finish()
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], BoundsError> {
        if self.0.len() < n {
            return Err(BoundsError::Malformed("truncated"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, BoundsError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, BoundsError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, BoundsError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn str(&mut self, what: &'static str, max: usize) -> Result<&'a str, BoundsError> {
        let n = usize::from(self.u16()?);
        let s = self.take(n)?;
        if n > max {
            return Err(too_large(what, n as u64, max as u64));
        }
        std::str::from_utf8(s).map_err(|_| BoundsError::Malformed("string not UTF-8"))
    }
    /// A ChitchatId: (node id, generation).
    fn id(&mut self) -> Result<(&'a str, u64), BoundsError> {
        let node = self.str("node id length", MAX_NODE_ID_LEN)?;
        let generation = self.u64()?;
        match self.u8()? {
            4 => drop(self.take(4)?),
            6 => drop(self.take(16)?),
            _ => return Err(BoundsError::Malformed("address family")),
        }
        self.u16()?;
        Ok((node, generation))
    }
}

fn too_large(what: &'static str, got: u64, max: u64) -> BoundsError {
    BoundsError::TooLarge { what, got, max }
}

fn counter(what: &'static str, v: u64) -> Result<(), BoundsError> {
    if v > MAX_COUNTER {
        return Err(too_large(what, v, MAX_COUNTER));
    }
    Ok(())
}

impl Bounds {
    /// Bounds for the node `self_id` of generation `self_generation` in a
    /// cluster of at most `max_members` members (dead ones included),
    /// gossiping every `interval`.
    pub(crate) fn new(
        self_id: &str,
        self_generation: u64,
        max_members: usize,
        interval: Duration,
    ) -> Bounds {
        Bounds {
            self_id: self_id.to_owned(),
            self_generation,
            max_members,
            heartbeats_per_round: heartbeats_per_round(max_members),
            interval,
            known: Mutex::new(BTreeMap::new()),
        }
    }

    /// The most members a digest or delta may name (`gossip.max_members`).
    pub(crate) fn max_members(&self) -> usize {
        self.max_members
    }

    /// The gossip round interval (`gossip.interval_ms`).
    pub(crate) fn interval(&self) -> Duration {
        self.interval
    }

    /// Checks an opened datagram received now; when it passes, its
    /// heartbeats and versions become the known ones, and the largest
    /// heartbeat and version its digest gives for this node itself (if it
    /// names it) are returned, for [`SelfEcho::see`].
    ///
    /// # Errors
    /// [`BoundsError`] naming the first broken bound.
    /// `own_version` is this node's own `max_version` ([`SelfEcho`]).
    pub(crate) fn check(
        &self,
        datagram: &[u8],
        own_version: u64,
    ) -> Result<Option<(u64, u64)>, BoundsError> {
        self.check_at(datagram, own_version, Instant::now())
    }

    /// [`Bounds::check`] at `now`.
    fn check_at(
        &self,
        datagram: &[u8],
        own_version: u64,
        now: Instant,
    ) -> Result<Option<(u64, u64)>, BoundsError> {
        let mut seen = Seen::new();
        let mut about_self = 0;
        self.parse(datagram, &mut seen, &mut about_self)?;
        if about_self > own_version {
            return Err(BoundsError::AboutSelf);
        }
        let me = seen.remove(&(self.self_id.clone(), self.self_generation));
        let mut known = self.known.lock().expect("gossip bounds lock");
        // The new figures of each known member, checked before any is kept
        // (a refused datagram moves nothing).
        let mut updates = Vec::new();
        for (id, &(heartbeat, version)) in &seen {
            let Some(k) = known.get(id) else {
                continue;
            };
            let elapsed = now.saturating_duration_since(k.at);
            let mut credits = [0; 2];
            for (i, (what, got, had, credit, per_round)) in [
                (
                    "heartbeat",
                    heartbeat,
                    k.heartbeat,
                    k.heartbeat_credit,
                    self.heartbeats_per_round,
                ),
                (
                    "version",
                    version,
                    k.version,
                    k.version_credit,
                    VERSIONS_PER_ROUND,
                ),
            ]
            .into_iter()
            .enumerate()
            {
                let max = Lead::allowed(credit, per_round, elapsed, self.interval);
                let lead = got.saturating_sub(had);
                if lead > max {
                    return Err(BoundsError::Jump {
                        what,
                        node: id.0.clone(),
                        got: lead,
                        max,
                    });
                }
                credits[i] = Lead::after(max, lead, per_round);
            }
            updates.push((id.clone(), credits));
        }
        for (id, [heartbeat_credit, version_credit]) in updates {
            let k = known.get_mut(&id).expect("checked above");
            k.heartbeat_credit = heartbeat_credit;
            k.version_credit = version_credit;
        }
        let cap = KNOWN_PER_MEMBER * self.max_members;
        let forget_after = self.interval * FORGET_AFTER_ROUNDS;
        for (id, (heartbeat, version)) in seen {
            if let Some(k) = known.get_mut(&id) {
                k.heartbeat = k.heartbeat.max(heartbeat);
                k.version = k.version.max(version);
                k.at = now;
                continue;
            }
            if known.len() >= cap {
                let oldest = known
                    .iter()
                    .min_by_key(|(_, k)| k.at)
                    .map(|(id, k)| (id.clone(), k.at))
                    .expect("not empty");
                if now.saturating_duration_since(oldest.1) < forget_after {
                    continue;
                }
                known.remove(&oldest.0);
            }
            known.insert(
                id,
                Lead::new(heartbeat, version, self.heartbeats_per_round, now),
            );
        }
        Ok(me)
    }

    /// Parses a datagram, checking every bound that needs no memory, and
    /// collects each other member's largest heartbeat and version in `seen`.
    /// `about_self` gets the largest version a delta gives this node.
    fn parse(
        &self,
        datagram: &[u8],
        seen: &mut Seen,
        about_self: &mut u64,
    ) -> Result<(), BoundsError> {
        let mut r = Reader(datagram);
        if r.u16()? != 0xB053 {
            return Err(BoundsError::Malformed("magic"));
        }
        if r.u8()? != 0 {
            return Err(BoundsError::Malformed("protocol version other than V0"));
        }
        match r.u8()? {
            0 => {
                self.digest(&mut r, seen)?;
                // Compared, never stored: any length a datagram holds.
                r.str("cluster id length", usize::from(u16::MAX))?;
            }
            1 => {
                self.digest(&mut r, seen)?;
                self.delta(&mut r, seen, about_self)?;
            }
            2 => self.delta(&mut r, seen, about_self)?,
            3 => {}
            _ => return Err(BoundsError::Malformed("message type")),
        }
        Ok(())
    }

    fn members(&self, n: usize) -> Result<(), BoundsError> {
        if n > self.max_members {
            return Err(too_large("members", n as u64, self.max_members as u64));
        }
        Ok(())
    }

    /// Records `heartbeat` and `version` of a member (this node's own
    /// figures are taken out before the jump rule applies).
    fn see(&self, seen: &mut Seen, (node, generation): (&str, u64), heartbeat: u64, version: u64) {
        let e = seen.entry((node.to_owned(), generation)).or_insert((0, 0));
        e.0 = e.0.max(heartbeat);
        e.1 = e.1.max(version);
    }

    fn digest(&self, r: &mut Reader<'_>, seen: &mut Seen) -> Result<(), BoundsError> {
        let n = usize::from(r.u16()?);
        self.members(n)?;
        for _ in 0..n {
            let id = r.id()?;
            let heartbeat = r.u64()?;
            counter("heartbeat", heartbeat)?;
            counter("last_gc_version", r.u64()?)?;
            let max_version = r.u64()?;
            counter("max_version", max_version)?;
            self.see(seen, id, heartbeat, max_version);
        }
        Ok(())
    }

    fn delta(
        &self,
        r: &mut Reader<'_>,
        seen: &mut Seen,
        about_self: &mut u64,
    ) -> Result<(), BoundsError> {
        let mut ops = Vec::new();
        loop {
            match r.u8()? {
                0 => break,
                1 => {
                    let len = usize::from(r.u16()?);
                    let block = r.take(len)?;
                    let mut out = vec![0u8; MAX_BLOCK];
                    let n = zstd::bulk::decompress_to_buffer(block, &mut out[..])
                        .map_err(|_| BoundsError::Malformed("compressed block"))?;
                    ops.extend_from_slice(&out[..n]);
                }
                2 => {
                    let len = usize::from(r.u16()?);
                    ops.extend_from_slice(r.take(len)?);
                }
                _ => return Err(BoundsError::Malformed("block type")),
            }
            if ops.len() > 16 * MAX_BLOCK {
                return Err(too_large(
                    "delta bytes",
                    ops.len() as u64,
                    16 * MAX_BLOCK as u64,
                ));
            }
        }
        let mut r = Reader(&ops);
        let (mut nodes, mut keys) = (0usize, 0usize);
        let mut node = None;
        while !r.0.is_empty() {
            match r.u8()? {
                0 => {
                    let (id, generation) = r.id()?;
                    let is_self = id == self.self_id && generation == self.self_generation;
                    node = (!is_self).then_some((id, generation));
                    nodes += 1;
                    self.members(nodes)?;
                    keys = 0;
                    counter("last_gc_version", r.u64()?)?;
                    counter("from_version", r.u64()?)?;
                }
                1 if nodes > 0 => {
                    r.str("key length", MAX_KEY_LEN)?;
                    r.str("value length", MAX_VALUE_LEN)?;
                    let version = r.u64()?;
                    counter("version", version)?;
                    match node {
                        Some(id) => self.see(seen, id, 0, version),
                        None => *about_self = (*about_self).max(version),
                    }
                    if r.u8()? > 2 {
                        return Err(BoundsError::Malformed("deletion status"));
                    }
                    keys += 1;
                    if keys > MAX_KEYS_PER_NODE {
                        return Err(too_large(
                            "keys of a node",
                            keys as u64,
                            MAX_KEYS_PER_NODE as u64,
                        ));
                    }
                }
                2 if nodes > 0 => {
                    let version = r.u64()?;
                    counter("max_version", version)?;
                    match node {
                        Some(id) => self.see(seen, id, 0, version),
                        None => *about_self = (*about_self).max(version),
                    }
                }
                _ => return Err(BoundsError::Malformed("delta operation")),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
