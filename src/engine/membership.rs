//! Membership: the node state each node publishes in gossip ([`Member`]) and
//! the immutable snapshot routing decides against ([`MembershipView`]).
//!
//! The gossip adapter turns chitchat's live node states into `Member`s and
//! builds a new view whenever they change; the view's consistent-hash ring,
//! of the members whose status is [`NodeStatus::Serving`], is built once,
//! when it is first used: a cluster forming sends each node a burst of
//! views (one per member learned and per handshake), and only the views
//! something routes with (or that the adapter warms once the burst is
//! over) pay for a table.
//!
//! Case codes (C5, C9) name cases of `docs/cases.md`: the input, the
//! value peerlb must give, and where it is tested.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use xxhash_rust::xxh3::Xxh3;

use super::node_id::NodeId;
use super::ring::{Ring, RingSpec};

/// A node's published lifecycle state (gossip key `status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeStatus {
    /// Accepts new requests; on the ring.
    Serving,
    /// Finishing what is bound to it: off the ring and out of every
    /// policy's picks (no new hash keys, no new sticky sessions), but a
    /// request whose sticky route names it still reaches it
    /// ([`MembershipView::sticky_target`]), so its sessions finish there.
    Draining,
    /// Shutting down (SIGTERM received); receives no new requests.
    Leaving,
    /// Taken out by an operator (httpd's Stopped, HAProxy's maint): no
    /// traffic at all, sticky routes included, but still a member (it
    /// gossips, stays connected, and can return to `serving`).
    Offline,
}

impl NodeStatus {
    /// Every status, in the order status tables list them.
    pub const ALL: [NodeStatus; 4] = [
        NodeStatus::Serving,
        NodeStatus::Draining,
        NodeStatus::Offline,
        NodeStatus::Leaving,
    ];

    /// The gossip/wire spelling: `"serving"`, `"draining"`, `"leaving"` or
    /// `"offline"`.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Serving => "serving",
            NodeStatus::Draining => "draining",
            NodeStatus::Leaving => "leaving",
            NodeStatus::Offline => "offline",
        }
    }

    /// A status's code in the view checksum. `offline` came last and takes
    /// the next code, so the versions of views without it are unchanged.
    fn code(self) -> u8 {
        match self {
            NodeStatus::Serving => 0,
            NodeStatus::Draining => 1,
            NodeStatus::Leaving => 2,
            NodeStatus::Offline => 3,
        }
    }
}

impl fmt::Display for NodeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status string that is not `serving`, `draining`, `leaving` or
/// `offline`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown node status {0:?} (expected serving, draining, leaving or offline)")]
pub struct ParseStatusError(pub String);

impl FromStr for NodeStatus {
    type Err = ParseStatusError;

    /// Parses the exact lowercase spelling of [`NodeStatus::as_str`].
    ///
    /// # Errors
    ///
    /// `ParseStatusError` for any other string; a gossip adapter should
    /// treat such a member as not serving (it may run a newer version).
    fn from_str(s: &str) -> Result<NodeStatus, ParseStatusError> {
        match s {
            "serving" => Ok(NodeStatus::Serving),
            "draining" => Ok(NodeStatus::Draining),
            "leaving" => Ok(NodeStatus::Leaving),
            "offline" => Ok(NodeStatus::Offline),
            other => Err(ParseStatusError(other.to_owned())),
        }
    }
}

/// [`Member::load`] of a member that published no load metric (gossip key
/// `load` absent or unparsable). Any value above 100 means the same.
pub(crate) const NO_METRIC: u8 = u8::MAX;

/// One member of the cluster as seen in gossip.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    /// The node's id.
    pub id: NodeId,
    /// Increases on every restart of the node (chitchat `generation_id`); the
    /// highest generation of an id is the live one (case C9).
    pub generation: u64,
    /// QUIC address peers forward to.
    pub peer_addr: SocketAddr,
    /// HTTP address the node's ingress listens on.
    pub http_addr: SocketAddr,
    /// Relative share of the ring's slots (weighted rendezvous: 200 owns twice what
    /// 100 owns); 100 is the unit, 0 = not on the ring.
    pub weight: u32,
    /// Lifecycle state.
    pub status: NodeStatus,
    /// Smoothed load metric, 0..=100, 100 = idle (mod_oc4j convention; see
    /// `balance::metric` for how a node computes and smooths it), or
    /// `NO_METRIC` (255) when the node published none (the `metric` policy then
    /// counts it as 50).
    pub load: u8,
    /// Requests the node's app was serving when it last published (client
    /// requests served there plus proxied ones; not the requests it only
    /// forwards, so every node counts the load it serves): its load
    /// figure for `least-load` and bounded-load hashing (plus the entry's own
    /// count, see `Router::decide_with_loads`).
    pub inflight: u32,
}

impl Member {
    /// The fields that determine ring ownership and the view version.
    fn rank(&self) -> (u64, u8, u32, SocketAddr, SocketAddr, u8, u32) {
        (
            self.generation,
            // Prefer the more final state for equal generations.
            self.status.code(),
            self.weight,
            self.peer_addr,
            self.http_addr,
            self.load,
            self.inflight,
        )
    }
}

/// An immutable snapshot of the cluster: members by id, the serving set, the
/// ring built from it, and a version checksum.
///
/// Cheap to clone (the ring is shared).
#[derive(Clone, Debug)]
pub struct MembershipView {
    self_id: NodeId,
    members: BTreeMap<NodeId, Member>,
    serving: Vec<NodeId>,
    /// Serving and draining members, sorted: what a sticky route may name.
    sticky_targets: Vec<NodeId>,
    ring: Arc<LazyRing>,
    version: u64,
}

/// A view's ring, built on first use ([`LazyRing::get`]): from `base` (the
/// last ring built for an earlier view, [`Ring::rebuild`]) when there is
/// one, else in full. Either way the table equals `Ring::build(input,
/// spec)`, so when it is built changes no routing decision.
#[derive(Debug)]
struct LazyRing {
    /// The serving members with weight > 0, sorted by id (normalised).
    input: Vec<(NodeId, u32)>,
    spec: RingSpec,
    /// The nearest ring built for an earlier view, if any.
    base: Option<Arc<Ring>>,
    built: OnceLock<Arc<Ring>>,
}

impl LazyRing {
    fn new(input: Vec<(NodeId, u32)>, spec: RingSpec, previous: Option<&LazyRing>) -> LazyRing {
        LazyRing {
            input,
            spec,
            base: previous.and_then(LazyRing::nearest_built),
            built: OnceLock::new(),
        }
    }

    /// The table, built now if it was not yet (concurrent callers wait
    /// for one build), or taken from another view of this process that
    /// built the same one ([`shared`]).
    fn get(&self) -> &Ring {
        self.built.get_or_init(|| {
            if let Some(ring) = shared::find(&self.input, self.spec) {
                return ring;
            }
            // Rebuilt from whichever ring is nearest (this view's last one,
            // or one another node of the process built), when that costs
            // less than a full build.
            let own = self
                .base
                .as_ref()
                .map(|b| (shared::distance(b, &self.input), b.clone()));
            let base = match (own, shared::nearest(&self.input, self.spec)) {
                (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
                (a, b) => a.or(b),
            }
            .filter(|(d, _)| *d < self.input.len());
            let ring = Arc::new(match base {
                Some((_, base)) => base.rebuild(&self.input, self.spec),
                None => Ring::build(&self.input, self.spec),
            });
            shared::keep(&self.input, self.spec, &ring);
            ring
        })
    }

    /// This ring if built, else the ring it would be rebuilt from.
    fn nearest_built(&self) -> Option<Arc<Ring>> {
        self.built.get().cloned().or_else(|| self.base.clone())
    }

    /// True when this ring is the one for `input` and `spec`.
    fn is_for(&self, input: &[(NodeId, u32)], spec: RingSpec) -> bool {
        self.spec == spec && self.input == input
    }
}

/// Rings in use in this process, found by their input: every node of a
/// process that routes with the same serving members and weights uses one
/// table. A production process runs one node and finds only the rings of
/// its own views here; the simulation runs a whole cluster in one process,
/// where N nodes that agree on the members build one table instead of N
/// (at 100 nodes and the default 1,024 vnodes, 100 tables of 262,144 slots
/// scored against 100 nodes: seconds of CPU per membership change). The
/// table is a function of its input only ([`Ring::build`]), so which view
/// built it changes no routing decision. Entries are weak: a ring no view
/// holds is freed, and its entry is dropped at the next sweep.
mod shared {
    use super::*;

    type Rings = BTreeMap<(RingSpec, u64), Vec<Weak<Ring>>>;

    struct Table {
        rings: Rings,
        /// Entries after the last sweep; the next sweep comes at twice as
        /// many (at least 64), so sweeping costs O(1) per entry kept.
        swept_at: usize,
        entries: usize,
    }

    static TABLE: Mutex<Table> = Mutex::new(Table {
        rings: BTreeMap::new(),
        swept_at: 0,
        entries: 0,
    });

    fn hash(input: &[(NodeId, u32)]) -> u64 {
        let mut h = Xxh3::new();
        for (id, weight) in input {
            h.update(&(id.as_str().len() as u64).to_le_bytes());
            h.update(id.as_str().as_bytes());
            h.update(&weight.to_le_bytes());
        }
        h.digest()
    }

    fn is_for(ring: &Ring, input: &[(NodeId, u32)], spec: RingSpec) -> bool {
        ring.spec() == spec
            && ring.node_count() == input.len()
            && ring
                .nodes()
                .zip(input)
                .all(|((a, w), (b, v))| a == b && w == *v)
    }

    /// A ring in use somewhere in this process for `input` and `spec`.
    pub(super) fn find(input: &[(NodeId, u32)], spec: RingSpec) -> Option<Arc<Ring>> {
        let table = TABLE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        table
            .rings
            .get(&(spec, hash(input)))?
            .iter()
            .filter_map(Weak::upgrade)
            .find(|r| is_for(r, input, spec))
    }

    /// How many nodes a rebuild from `ring` to `input` rescores: the
    /// nodes that join, leave or change weight. A rebuild costs about one
    /// score per slot for each ([`Ring::rebuild`]), a full build one per
    /// slot for each node of `input`.
    pub(super) fn distance(ring: &Ring, input: &[(NodeId, u32)]) -> usize {
        let (mut a, mut b) = (ring.nodes().peekable(), input.iter().peekable());
        let mut d = 0;
        loop {
            match (a.peek(), b.peek()) {
                (None, None) => return d,
                (Some(_), None) => {
                    a.next();
                    d += 1;
                }
                (None, Some(_)) => {
                    b.next();
                    d += 1;
                }
                (Some((x, w)), Some((y, v))) => match (*x).cmp(y) {
                    std::cmp::Ordering::Less => {
                        a.next();
                        d += 1;
                    }
                    std::cmp::Ordering::Greater => {
                        b.next();
                        d += 1;
                    }
                    std::cmp::Ordering::Equal => {
                        d += usize::from(w != v);
                        a.next();
                        b.next();
                    }
                },
            }
        }
    }

    /// The ring of this process with `spec` nearest to `input` (fewest
    /// nodes to rescore, [`distance`]), with that distance.
    pub(super) fn nearest(input: &[(NodeId, u32)], spec: RingSpec) -> Option<(usize, Arc<Ring>)> {
        let table = TABLE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        table
            .rings
            .range((spec, 0)..=(spec, u64::MAX))
            .flat_map(|(_, v)| v.iter().filter_map(Weak::upgrade))
            .map(|r| (distance(&r, input), r))
            .min_by_key(|(d, _)| *d)
    }

    /// Makes `ring` (built for `input` and `spec`) findable.
    pub(super) fn keep(input: &[(NodeId, u32)], spec: RingSpec, ring: &Arc<Ring>) {
        let mut table = TABLE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let t = &mut *table;
        t.rings
            .entry((spec, hash(input)))
            .or_default()
            .push(Arc::downgrade(ring));
        t.entries += 1;
        if t.entries >= (2 * t.swept_at).max(64) {
            t.rings.retain(|_, v| {
                v.retain(|w| w.strong_count() > 0);
                !v.is_empty()
            });
            t.entries = t.rings.values().map(Vec::len).sum();
            t.swept_at = t.entries;
        }
    }
}

impl MembershipView {
    /// Builds a view as seen by node `self_id`.
    ///
    /// If two members share an id, the one with the highest generation is kept
    /// (an old generation never lingers as a ghost: case C9); for equal
    /// generations the choice is still independent of input order. The ring is
    /// built once from the [`NodeStatus::Serving`] members with their weights
    /// and a table size set by `vnodes` (see [`Ring::build`]).
    pub fn new(
        self_id: NodeId,
        members: impl IntoIterator<Item = Member>,
        spec: impl Into<RingSpec>,
    ) -> Self {
        Self::assemble(self_id, members, spec.into(), None)
    }

    /// Builds the next view from a fresh member list, reusing this view's
    /// ring when the serving set and weights (and `vnodes`) are unchanged, so
    /// frequent load/inflight reports do not rebuild the ring, and otherwise
    /// rebuilding it incrementally from this view's ring ([`Ring::rebuild`]).
    /// Same result as [`MembershipView::new`] with this view's self id.
    pub fn with_members(
        &self,
        members: impl IntoIterator<Item = Member>,
        spec: impl Into<RingSpec>,
    ) -> Self {
        Self::assemble(self.self_id.clone(), members, spec.into(), Some(&self.ring))
    }

    /// True when this view's ring table is built (by a lookup, or by
    /// [`MembershipView::ring`] to warm it).
    pub fn ring_is_built(&self) -> bool {
        self.ring.built.get().is_some()
    }

    fn assemble(
        self_id: NodeId,
        members: impl IntoIterator<Item = Member>,
        spec: RingSpec,
        previous: Option<&Arc<LazyRing>>,
    ) -> Self {
        let mut by_id: BTreeMap<NodeId, Member> = BTreeMap::new();
        for m in members {
            match by_id.get(&m.id) {
                Some(old) if old.rank() >= m.rank() => {}
                _ => {
                    by_id.insert(m.id.clone(), m);
                }
            }
        }
        let serving: Vec<NodeId> = by_id
            .values()
            .filter(|m| m.status == NodeStatus::Serving)
            .map(|m| m.id.clone())
            .collect();
        let sticky_targets: Vec<NodeId> = by_id
            .values()
            .filter(|m| matches!(m.status, NodeStatus::Serving | NodeStatus::Draining))
            .map(|m| m.id.clone())
            .collect();
        let ring_input: Vec<(NodeId, u32)> = by_id
            .values()
            .filter(|m| m.status == NodeStatus::Serving && m.weight > 0)
            .map(|m| (m.id.clone(), m.weight))
            .collect();
        let ring = match previous {
            Some(r) if r.is_for(&ring_input, spec) => Arc::clone(r),
            // A membership change: built when first used, incrementally
            // from the last ring built.
            _ => Arc::new(LazyRing::new(ring_input, spec, previous.map(|r| &**r))),
        };

        let mut h = Xxh3::new();
        for m in by_id.values() {
            h.update(&(m.id.len() as u64).to_le_bytes());
            h.update(m.id.as_bytes());
            h.update(&m.generation.to_le_bytes());
            h.update(&[m.status.code()]);
            h.update(&m.weight.to_le_bytes());
        }
        MembershipView {
            self_id,
            members: by_id,
            serving,
            sticky_targets,
            ring,
            version: h.digest(),
        }
    }

    /// The id of the node holding this view.
    pub fn self_id(&self) -> &NodeId {
        &self.self_id
    }

    /// All members (any status), in id order.
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    /// The member with id `id`, if known.
    pub fn get(&self, id: &str) -> Option<&Member> {
        self.members.get(id)
    }

    /// True if `id` is a member with status [`NodeStatus::Serving`].
    pub fn is_serving(&self, id: &str) -> bool {
        self.get(id)
            .is_some_and(|m| m.status == NodeStatus::Serving)
    }

    /// The ids of the serving members (any weight), sorted ascending.
    pub fn serving_ids(&self) -> &[NodeId] {
        &self.serving
    }

    /// The member a sticky route naming `id` reaches: `id` itself while it
    /// is serving or draining (a draining node finishes the sessions bound
    /// to it), `None` otherwise (unknown, leaving, offline).
    pub fn sticky_target(&self, id: &str) -> Option<&NodeId> {
        self.sticky_targets
            .binary_search_by(|m| (**m).cmp(id))
            .ok()
            .map(|i| &self.sticky_targets[i])
    }

    /// The consistent-hash ring of the serving members with weight > 0.
    /// Built by the first call on this view (or an earlier view with the
    /// same serving set and weights): incrementally from the last ring
    /// built for an earlier view, 1-4 ms at 1,000 nodes, or in full when
    /// none was (see [`Ring::rebuild`]); then free.
    pub fn ring(&self) -> &Ring {
        self.ring.get()
    }

    /// Checksum of the view: xxh3-64 over the id-sorted list of
    /// `(id, generation, status, weight)` (length-prefixed ids, little-endian
    /// integers). Two nodes with the same live set have the same version,
    /// whatever order they learned the members in; load and inflight reports
    /// do not change it. Carried on proxied requests to detect skew (C5).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Each ring member's share of the ring's slots, `0..=1` (they sum to
    /// 1 on a non-empty ring; members off the ring are absent). One pass
    /// over the table (`256 * vnodes` slots, rounded up to a power of two).
    pub fn ring_shares(&self) -> BTreeMap<NodeId, f64> {
        self.ring()
            .shares()
            .into_iter()
            .filter(|(_, share)| *share > 0.0)
            .collect()
    }

    /// Number of members (any status).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// True when the view has no members at all.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A serving member of weight 100 with addresses derived from `port`.
    pub(crate) fn member(id: &str, generation: u64, status: NodeStatus) -> Member {
        Member {
            id: NodeId::from(id),
            generation,
            peer_addr: SocketAddr::from(([127, 0, 0, 1], 7000)),
            http_addr: SocketAddr::from(([127, 0, 0, 1], 8000)),
            weight: 100,
            status,
            load: 100,
            inflight: 0,
        }
    }

    pub(crate) fn view(self_id: &str, members: &[(&str, NodeStatus)]) -> MembershipView {
        MembershipView::new(
            NodeId::from(self_id),
            members.iter().map(|(id, s)| member(id, 1, *s)),
            64,
        )
    }

    #[test]
    fn status_roundtrip() {
        for s in NodeStatus::ALL {
            assert_eq!(s.as_str().parse::<NodeStatus>(), Ok(s));
            assert_eq!(s.to_string(), s.as_str());
        }
        assert_eq!(
            "Serving".parse::<NodeStatus>().unwrap_err().to_string(),
            "unknown node status \"Serving\" (expected serving, draining, leaving or offline)"
        );
    }

    #[test]
    fn serving_set_ring_and_lookup() {
        use NodeStatus::*;
        let v = view(
            "b",
            &[
                ("c", Serving),
                ("a", Serving),
                ("b", Draining),
                ("d", Leaving),
            ],
        );
        assert_eq!(v.self_id().as_ref(), "b");
        assert_eq!(v.len(), 4);
        let ids: Vec<&str> = v.members().map(|m| &*m.id).collect();
        assert_eq!(ids, ["a", "b", "c", "d"]);
        let serving: Vec<&str> = v.serving_ids().iter().map(|s| &**s).collect();
        assert_eq!(serving, ["a", "c"]);
        assert!(v.is_serving("a"));
        assert!(!v.is_serving("b"));
        assert!(!v.is_serving("zz"));
        assert_eq!(v.get("d").map(|m| m.status), Some(Leaving));
        assert_eq!(v.ring().node_count(), 2);
        // A sticky route reaches serving and draining members only.
        assert_eq!(v.sticky_target("a").map(|s| &**s), Some("a"));
        assert_eq!(v.sticky_target("b").map(|s| &**s), Some("b"));
        assert_eq!(v.sticky_target("d"), None);
        assert_eq!(v.sticky_target("zz"), None);
        // vnodes 64: a table of 256 * 64 slots.
        assert_eq!(v.ring().len(), 16384);
        let shares = v.ring_shares();
        assert_eq!(shares.keys().map(|k| &**k).collect::<Vec<_>>(), ["a", "c"]);
        assert!(
            (shares.values().sum::<f64>() - 1.0).abs() < 1e-9,
            "{shares:?}"
        );
        assert!(
            shares.values().all(|s| (0.4..0.6).contains(s)),
            "{shares:?}"
        );
    }

    #[test]
    fn an_offline_member_stays_a_member_off_the_ring_and_unreachable_by_sticky_routes() {
        use NodeStatus::*;
        let v = view("a", &[("a", Serving), ("b", Offline), ("c", Draining)]);
        assert_eq!(v.len(), 3);
        assert_eq!(v.get("b").map(|m| m.status), Some(Offline));
        let serving: Vec<&str> = v.serving_ids().iter().map(|s| &**s).collect();
        assert_eq!(serving, ["a"]);
        assert_eq!(v.ring().node_count(), 1);
        assert_eq!(v.sticky_target("b"), None);
        assert_eq!(v.sticky_target("c").map(|s| &**s), Some("c"));
        // Offline is its own state in the version.
        let off = view("a", &[("a", Serving), ("b", Offline), ("c", Serving)]);
        let left = view("a", &[("a", Serving), ("b", Leaving), ("c", Serving)]);
        assert_ne!(off.version(), left.version());
    }

    #[test]
    fn c9_highest_generation_wins_in_any_order() {
        let old = member("n1", 1, NodeStatus::Serving);
        let mut new = member("n1", 2, NodeStatus::Serving);
        new.peer_addr = SocketAddr::from(([127, 0, 0, 1], 7100));
        let a = MembershipView::new("x".into(), [old.clone(), new.clone()], 64);
        let b = MembershipView::new("x".into(), [new.clone(), old.clone()], 64);
        assert_eq!(a.get("n1"), Some(&new));
        assert_eq!(b.get("n1"), Some(&new));
        assert_eq!(a.len(), 1);
        assert_eq!(a.version(), b.version());
    }

    #[test]
    fn version_ignores_order_and_load_but_not_status() {
        let ms = [
            member("a", 1, NodeStatus::Serving),
            member("b", 3, NodeStatus::Serving),
            member("c", 2, NodeStatus::Serving),
        ];
        let mut rev = ms.clone();
        rev.reverse();
        let v1 = MembershipView::new("a".into(), ms.clone(), 64);
        let v2 = MembershipView::new("c".into(), rev, 64);
        assert_eq!(v1.version(), v2.version());

        let mut loaded = ms.clone();
        loaded[1].load = 3;
        loaded[1].inflight = 99;
        assert_eq!(
            MembershipView::new("a".into(), loaded, 64).version(),
            v1.version()
        );

        let mut drained = ms.clone();
        drained[1].status = NodeStatus::Draining;
        assert_ne!(
            MembershipView::new("a".into(), drained, 64).version(),
            v1.version()
        );

        let mut reweighted = ms.clone();
        reweighted[1].weight = 50;
        assert_ne!(
            MembershipView::new("a".into(), reweighted, 64).version(),
            v1.version()
        );
    }

    #[test]
    fn with_members_reuses_the_ring_only_when_unchanged() {
        let ms = vec![
            member("a", 1, NodeStatus::Serving),
            member("b", 1, NodeStatus::Serving),
        ];
        let v1 = MembershipView::new("a".into(), ms.clone(), 64);
        let mut loaded = ms.clone();
        loaded[0].load = 10;
        let v2 = v1.with_members(loaded.clone(), 64);
        assert!(Arc::ptr_eq(&v1.ring, &v2.ring));
        assert_eq!(v2.get("a").map(|m| m.load), Some(10));

        let mut reweighted = ms.clone();
        reweighted[0].weight = 50;
        let v3 = v1.with_members(reweighted.clone(), 64);
        assert!(!Arc::ptr_eq(&v1.ring, &v3.ring));
        assert_eq!(
            *v3.ring(),
            Ring::build(&[("a".into(), 50), ("b".into(), 100)], 64)
        );
        let v4 = v1.with_members(ms.clone(), 32);
        assert_eq!(v4.ring().vnodes(), 32);
        let v5 = v1.with_members(ms[..1].to_vec(), 64);
        assert_eq!(v5.ring().node_count(), 1);
    }

    #[test]
    fn a_ring_is_built_on_first_use_from_the_last_ring_built_and_equals_a_full_build() {
        let ms: Vec<Member> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|id| member(id, 1, NodeStatus::Serving))
            .collect();
        let v1 = MembershipView::new("a".into(), ms[..2].to_vec(), 64);
        assert!(!v1.ring_is_built());
        v1.ring();
        assert!(v1.ring_is_built());
        // A burst of views none routes with: none builds a table, each
        // keeps the last built one to rebuild from.
        let v2 = v1.with_members(ms[..3].to_vec(), 64);
        let v3 = v2.with_members(ms[..4].to_vec(), 64);
        let v4 = v3.with_members(ms[1..].to_vec(), 64);
        for v in [&v2, &v3, &v4] {
            assert!(!v.ring_is_built());
            assert!(Arc::ptr_eq(
                v.ring.base.as_ref().unwrap(),
                v1.ring.built.get().unwrap()
            ));
        }
        let ids: Vec<(NodeId, u32)> = ms[1..].iter().map(|m| (m.id.clone(), 100)).collect();
        assert_eq!(*v4.ring(), Ring::build(&ids, 64));
        assert!(!v3.ring_is_built());
        // Never built: a full build, the same table.
        let fresh = MembershipView::new("a".into(), ms.clone(), 64);
        let next = fresh.with_members(ms[1..].to_vec(), 64);
        assert!(next.ring.base.is_none());
        assert_eq!(*next.ring(), *v4.ring());
    }

    /// Two nodes of one process (the simulation runs a cluster in one)
    /// that see the same serving members and weights route with one
    /// table; another weight or `vnodes` is another table.
    #[test]
    fn views_of_one_process_with_the_same_members_share_one_ring() {
        let ms: Vec<Member> = ["share-a", "share-b", "share-c"]
            .iter()
            .map(|id| member(id, 1, NodeStatus::Serving))
            .collect();
        let on_a = MembershipView::new("share-a".into(), ms.clone(), 64);
        let on_b = MembershipView::new("share-b".into(), ms.clone(), 64);
        assert!(std::ptr::eq(on_a.ring(), on_b.ring()));
        let mut heavier = ms.clone();
        heavier[2].weight = 200;
        let on_c = MembershipView::new("share-c".into(), heavier.clone(), 64);
        assert!(!std::ptr::eq(on_a.ring(), on_c.ring()));
        let ids: Vec<(NodeId, u32)> = heavier.iter().map(|m| (m.id.clone(), m.weight)).collect();
        assert_eq!(*on_c.ring(), Ring::build(&ids, 64));
        let coarse = MembershipView::new("share-a".into(), ms, 16);
        assert!(!std::ptr::eq(on_a.ring(), coarse.ring()));
        assert_eq!(coarse.ring().vnodes(), 16);
        // The table holds rings weakly: one no view holds is freed.
        let weak = Arc::downgrade(on_a.ring.built.get().unwrap());
        drop((on_a, on_b));
        assert!(weak.upgrade().is_none());
    }

    /// A rebuild rescores the nodes that join, leave or change weight:
    /// the distance that picks the nearest ring to rebuild from.
    #[test]
    fn distance_counts_nodes_joining_leaving_or_reweighted() {
        let ids = |v: &[(&str, u32)]| -> Vec<(NodeId, u32)> {
            v.iter().map(|(id, w)| (NodeId::from(*id), *w)).collect()
        };
        let ring = Ring::build(&ids(&[("a", 100), ("b", 100), ("c", 100)]), 4);
        assert_eq!(
            shared::distance(&ring, &ids(&[("a", 100), ("b", 100), ("c", 100)])),
            0
        );
        assert_eq!(
            shared::distance(&ring, &ids(&[("b", 100), ("c", 200), ("d", 100)])),
            3
        );
        assert_eq!(shared::distance(&ring, &ids(&[])), 3);
        assert_eq!(shared::distance(&ring, &ids(&[("0", 1), ("z", 1)])), 5);
    }
}
