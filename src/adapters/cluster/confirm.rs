//! Which gossip addresses are confirmed: a seed's, or one an authenticated
//! datagram came from. Shared by the sealed transport ([`super::sealed`],
//! which records and probes) and the gossip layer ([`super::gossip`],
//! which hands only confirmed members on to be dialled).
//!
//! A member learnt from gossip alone may be a ghost a holder of the
//! gossip key announced with a third party's addresses; dialling its peer
//! address sends that party QUIC Initials (1,200 bytes each, a few KB per
//! attempt) from every node, 30 times the bytes of the announcement in
//! the review of issue 34. So a member is dialled only once its gossip
//! address is confirmed. A real member is: it gossips to its seeds and
//! answers whoever gossips to it. For a live member not yet confirmed
//! (two non-seed members learn of each other through a seed), the
//! transport sends its gossip address a *probe*, a sealed Syn with an
//! empty digest (about 45 bytes); a real member answers it with a sealed
//! SynAck, which confirms it. Probes are paced: at most
//! [`PROBES_PER_ROUND`] per gossip round per node
//! ([`Confirmed::next_probe`]) and one per address per [`PROBE_AGAIN`], so
//! a ghost costs its address at most one probe per node per minute,
//! whatever the key holder sends, and a node of a large cluster with few
//! seeds still confirms its members within a few dozen rounds (each probe
//! confirms both ends: the probed member hears the prober too).
//!
//! Until [`Confirmed::gate`] is called (by the production transport),
//! every address counts as confirmed: the simulation's transport applies
//! the bounds but not this gate (every simulated member is real).

use std::collections::{BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How long an address probed is not probed again.
pub(crate) const PROBE_AGAIN: Duration = Duration::from_secs(60);
/// Most probes a node sends per gossip round.
pub(crate) const PROBES_PER_ROUND: usize = 16;

/// Confirmed gossip addresses and pending probes (see the module doc).
#[derive(Debug)]
pub(crate) struct Confirmed {
    state: Mutex<State>,
    /// Bumped when an address is confirmed, so the gossip layer looks at
    /// its members again.
    changed: tokio::sync::watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct State {
    /// False: every address counts as confirmed (see the module doc).
    gated: bool,
    /// Most addresses kept in `heard`, `wanted` and `probed` each.
    cap: usize,
    /// A `BTreeSet`, not a `HashSet`: building a `RandomState` moves the
    /// thread's hash keys, and with them the iteration order of every
    /// hash map built after it on that thread (the simulation runs every
    /// node on one thread: its trace hashes changed).
    seeds: BTreeSet<SocketAddr>,
    /// Addresses an authenticated datagram came from, oldest first.
    heard: VecDeque<SocketAddr>,
    /// Addresses of live members to probe, oldest first.
    wanted: VecDeque<SocketAddr>,
    /// Addresses probed and when, oldest first.
    probed: VecDeque<(SocketAddr, Instant)>,
    /// When the current round of probes began, and probes sent in it.
    round: Option<(Instant, usize)>,
}

impl Default for Confirmed {
    fn default() -> Confirmed {
        Confirmed {
            state: Mutex::default(),
            changed: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl Confirmed {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// From now on only seeds and addresses heard from are confirmed;
    /// `cap` addresses are remembered per list, the oldest forgotten first.
    pub(crate) fn gate(&self, cap: usize) {
        let mut s = self.state();
        s.gated = true;
        s.cap = cap.max(1);
    }

    /// True once [`Confirmed::gate`] was called.
    pub(crate) fn is_gated(&self) -> bool {
        self.state().gated
    }

    /// Records a seed address (always confirmed).
    pub(crate) fn add_seed(&self, seed: SocketAddr) {
        self.state().seeds.insert(seed);
    }

    /// Records that an authenticated datagram came from `from`.
    pub(crate) fn heard(&self, from: SocketAddr) {
        let new = {
            let mut s = self.state();
            let new = match s.heard.iter().position(|a| *a == from) {
                Some(i) => {
                    s.heard.remove(i);
                    false
                }
                None => {
                    if s.heard.len() >= s.cap {
                        s.heard.pop_front();
                    }
                    true
                }
            };
            s.heard.push_back(from);
            s.wanted.retain(|a| *a != from);
            new && !s.seeds.contains(&from)
        };
        if new {
            self.changed.send_modify(|n| *n += 1);
        }
    }

    /// True when gossip may be sent to `to`: a seed, or heard from.
    pub(crate) fn may_send(&self, to: SocketAddr) -> bool {
        let s = self.state();
        s.seeds.contains(&to) || s.heard.contains(&to)
    }

    /// True when a member gossiping from `addr` may be dialled.
    pub(crate) fn is_confirmed(&self, addr: SocketAddr) -> bool {
        let s = self.state();
        !s.gated || s.seeds.contains(&addr) || s.heard.contains(&addr)
    }

    /// Asks for a probe of `addr` (a live member's gossip address not
    /// confirmed yet); ignored when it is confirmed, already asked for, or
    /// probed within [`PROBE_AGAIN`] of `now`.
    pub(crate) fn want_probe(&self, addr: SocketAddr, now: Instant) {
        let mut s = self.state();
        if !s.gated
            || s.seeds.contains(&addr)
            || s.heard.contains(&addr)
            || s.wanted.contains(&addr)
            || s.probed
                .iter()
                .any(|(a, at)| *a == addr && now.saturating_duration_since(*at) < PROBE_AGAIN)
        {
            return;
        }
        if s.wanted.len() >= s.cap {
            s.wanted.pop_front();
        }
        s.wanted.push_back(addr);
    }

    /// The address to probe now, if any: at most [`PROBES_PER_ROUND`] in
    /// every `every` (the gossip interval), each address once per
    /// [`PROBE_AGAIN`].
    pub(crate) fn next_probe(&self, now: Instant, every: Duration) -> Option<SocketAddr> {
        let mut s = self.state();
        let sent = match s.round {
            Some((start, sent)) if now.saturating_duration_since(start) < every => sent,
            _ => {
                s.round = Some((now, 0));
                0
            }
        };
        if sent >= PROBES_PER_ROUND {
            return None;
        }
        let addr = s.wanted.pop_front()?;
        s.round = s.round.map(|(start, n)| (start, n + 1));
        s.probed.retain(|(a, _)| *a != addr);
        if s.probed.len() >= s.cap {
            s.probed.pop_front();
        }
        s.probed.push_back((addr, now));
        Some(addr)
    }

    /// A receiver told whenever an address is confirmed.
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn ungated_everything_is_confirmed_and_nothing_probed() {
        let c = Confirmed::default();
        assert!(c.is_confirmed(addr(1)));
        assert!(!c.may_send(addr(1)));
        c.want_probe(addr(1), Instant::now());
        assert_eq!(c.next_probe(Instant::now(), Duration::ZERO), None);
    }

    #[test]
    fn seeds_and_addresses_heard_from_are_confirmed_others_probed_at_a_pace() {
        let c = Confirmed::default();
        c.gate(64);
        c.add_seed(addr(1));
        let mut changed = c.subscribe();
        assert!(c.is_confirmed(addr(1)));
        assert!(!c.is_confirmed(addr(2)));
        let t0 = Instant::now();
        let round = Duration::from_millis(100);
        let last = 2 + PROBES_PER_ROUND as u16 + 1;
        for p in 2..=last {
            c.want_probe(addr(p), t0);
        }
        c.want_probe(addr(1), t0);
        // PROBES_PER_ROUND a round, in order; a seed is never probed.
        for p in 2..2 + PROBES_PER_ROUND as u16 {
            assert_eq!(c.next_probe(t0, round), Some(addr(p)));
        }
        assert_eq!(c.next_probe(t0 + round / 2, round), None);
        assert_eq!(c.next_probe(t0 + round, round), Some(addr(last - 1)));
        // `last` answered: confirmed, no probe left for it, the gossip
        // layer told.
        assert!(!changed.has_changed().unwrap());
        c.heard(addr(last));
        assert!(changed.has_changed().unwrap());
        changed.mark_unchanged();
        assert!(c.is_confirmed(addr(last)) && c.may_send(addr(last)));
        assert_eq!(c.next_probe(t0 + 2 * round, round), None);
        // 2 never answered: not probed again within PROBE_AGAIN.
        c.want_probe(addr(2), t0 + 3 * round);
        assert_eq!(c.next_probe(t0 + 3 * round, round), None);
        let later = t0 + PROBE_AGAIN;
        c.want_probe(addr(2), later);
        assert_eq!(c.next_probe(later, round), Some(addr(2)));
        // A seed heard from is no news.
        c.heard(addr(1));
        assert!(!changed.has_changed().unwrap());
    }

    #[test]
    fn every_list_is_bounded() {
        let c = Confirmed::default();
        c.gate(3);
        let t0 = Instant::now();
        for p in 10..20 {
            c.heard(addr(p));
            c.want_probe(addr(p + 100), t0);
        }
        let s = c.state();
        assert_eq!(s.heard.len(), 3);
        assert_eq!(s.wanted.len(), 3);
        assert!(s.heard.contains(&addr(19)) && !s.heard.contains(&addr(10)));
    }
}
