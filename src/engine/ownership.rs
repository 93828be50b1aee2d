//! Who owns a hash key in a membership view, and which key ranges moved
//! between two views: the answers an embedded app gets from its node's
//! handle (Ringpop's `lookup` and `ringChanged`), pure functions of views.
//!
//! A key's owner is the owner of its point (xxh3-64 of the key) on the
//! view's ring, the same lookup the router makes for a hashed request with
//! no sticky route ([`Ring::owner`]); a view whose ring is empty (no member
//! serves) gives every key to the view's own node, as the router does
//! (`Reason::NoMembers`).

use std::ops::RangeInclusive;

use crate::engine::membership::MembershipView;
use crate::engine::node_id::NodeId;
use crate::engine::ring::{Ring, slot_bits};

/// The owner of `key` in `view`: its ring's owner, or the view's own node
/// when the ring is empty.
pub(crate) fn owner_of<'a>(view: &'a MembershipView, key: &str) -> &'a NodeId {
    view.ring().owner(key).unwrap_or(view.self_id())
}

/// The nodes a request for `key` is tried on in `view`, in order: the
/// key's owner ([`owner_of`]) first, then the ring's failover order for
/// the key ([`Ring::candidates`]), each serving node once; the view's own
/// node alone when the ring is empty. The order the router gives a hashed
/// request with no sticky route (`Decision::candidates`).
pub(crate) fn candidates_of<'a>(
    view: &'a MembershipView,
    key: &str,
) -> impl Iterator<Item = &'a NodeId> {
    let ring = view.ring().candidates(key);
    let alone = (ring.len() == 0).then(|| view.self_id());
    alone.into_iter().chain(ring)
}

/// True when the two views' rings give every point the same owner: the
/// same nodes at the same weights and the same table spec.
pub(crate) fn same_ring(a: &MembershipView, b: &MembershipView) -> bool {
    rings_equal(a.ring(), b.ring())
}

fn rings_equal(a: &Ring, b: &Ring) -> bool {
    a.spec() == b.spec() && a.nodes().eq(b.nodes())
}

/// A range of ring points (hash values of keys) whose owner changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedRange {
    /// The first point of the range.
    pub start: u64,
    /// The last point of the range (inclusive).
    pub end: u64,
    /// Its owner before the change.
    pub from: NodeId,
    /// Its owner after the change.
    pub to: NodeId,
}

impl MovedRange {
    /// The points of the range.
    pub fn points(&self) -> RangeInclusive<u64> {
        self.start..=self.end
    }

    /// True when `point` is in the range.
    pub fn contains_point(&self, point: u64) -> bool {
        self.points().contains(&point)
    }

    /// True when `key`'s point is in the range.
    pub fn contains_key(&self, key: &str) -> bool {
        self.contains_point(crate::engine::ring::hash_key(key))
    }
}

/// The ranges of points that moved to or from `new`'s own node between
/// `old` and `new`, in ring order, adjacent ranges with the same owners
/// merged. Each ring is read slot by slot (at the finer of the two tables:
/// `2^bits` slots, 2^18 at the default 1024 vnodes).
pub(crate) fn moved(old: &MembershipView, new: &MembershipView) -> Vec<MovedRange> {
    let me = new.self_id();
    let (a, b) = (old.ring(), new.ring());
    let bits = slot_bits(a.vnodes()).max(slot_bits(b.vnodes()));
    let shift = 64 - bits;
    let mut out: Vec<MovedRange> = Vec::new();
    for slot in 0..(1u64 << bits) {
        let point = slot << shift;
        let from = a.owner_of_point(point).unwrap_or(old.self_id());
        let to = b.owner_of_point(point).unwrap_or(me);
        if from == to || (from != me && to != me) {
            continue;
        }
        let end = point | ((1u64 << shift) - 1);
        match out.last_mut() {
            Some(m) if m.end.wrapping_add(1) == point && &m.from == from && &m.to == to => {
                m.end = end;
            }
            _ => out.push(MovedRange {
                start: point,
                end,
                from: from.clone(),
                to: to.clone(),
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::membership::NodeStatus::{Draining, Serving};
    use crate::engine::membership::tests::view;

    fn keys() -> impl Iterator<Item = String> {
        (0..3000).map(|i| format!("k{i}"))
    }

    #[test]
    fn owner_of_is_the_rings_owner_and_self_when_no_one_serves() {
        let v = view("n1", &[("n1", Serving), ("n2", Serving), ("n3", Serving)]);
        for k in keys() {
            assert_eq!(owner_of(&v, &k), v.ring().owner(&k).unwrap());
        }
        let owners: std::collections::BTreeSet<_> =
            keys().map(|k| owner_of(&v, &k).clone()).collect();
        assert_eq!(owners.len(), 3);
        let alone = view("n2", &[("n2", Draining)]);
        assert_eq!(owner_of(&alone, "k1").as_str(), "n2");
    }

    #[test]
    fn candidates_start_at_the_owner_and_are_the_routers_failover_order() {
        use rand::SeedableRng;
        let rules = crate::engine::testing::user_rules();
        let mut router = crate::engine::route::Router::new(
            crate::engine::balance::PolicyKind::ConsistentHash,
            rules,
        );
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let v = view("n1", &[("n1", Serving), ("n2", Serving), ("n3", Draining)]);
        for k in keys().take(300) {
            let c: Vec<_> = candidates_of(&v, &k).collect();
            assert_eq!(c[0], owner_of(&v, &k), "{k}");
            let ids: std::collections::BTreeSet<_> = c.iter().map(|n| n.as_str()).collect();
            assert_eq!(ids, ["n1", "n2"].into(), "{k}: each serving node once");
            let req = crate::engine::testing::TestRequest::get(&format!("/x?user={k}"));
            let d = router.decide(&req.view(), &v, std::time::Duration::ZERO, &mut rng);
            assert!(d.candidates(&v).eq(c.iter().copied()), "{k}");
        }
        let alone = view("n2", &[("n2", Draining)]);
        let c: Vec<_> = candidates_of(&alone, "k1").map(|n| n.as_str()).collect();
        assert_eq!(c, ["n2"]);
    }

    #[test]
    fn moved_ranges_are_exactly_the_keys_whose_owner_changed_to_or_from_me() {
        let old = view("n1", &[("n1", Serving), ("n2", Serving), ("n3", Serving)]);
        let new = view("n1", &[("n1", Serving), ("n2", Serving), ("n3", Draining)]);
        let m = moved(&old, &new);
        assert!(!m.is_empty());
        assert!(
            m.iter()
                .all(|r| r.to.as_str() == "n1" && r.from.as_str() == "n3")
        );
        assert!(m.windows(2).all(|w| w[0].end < w[1].start));
        for k in keys() {
            let (o, n) = (owner_of(&old, &k), owner_of(&new, &k));
            let in_moved = m.iter().any(|r| r.contains_key(&k));
            assert_eq!(
                in_moved,
                o != n && (o.as_str() == "n1" || n.as_str() == "n1"),
                "{k}"
            );
        }
        // The other way: n1 drains, its ranges go to n2 and n3.
        let gone = view("n1", &[("n1", Draining), ("n2", Serving), ("n3", Serving)]);
        let m = moved(&old, &gone);
        assert!(m.iter().all(|r| r.from.as_str() == "n1"));
        for k in keys() {
            let lost = m.iter().find(|r| r.contains_key(&k)).map(|r| r.to.clone());
            let want = (owner_of(&old, &k).as_str() == "n1").then(|| owner_of(&gone, &k).clone());
            assert_eq!(lost, want, "{k}");
        }
    }

    #[test]
    fn nothing_moves_between_equal_rings() {
        let a = view("n1", &[("n1", Serving), ("n2", Serving)]);
        let b = view("n1", &[("n1", Serving), ("n2", Serving)]);
        assert!(same_ring(&a, &b));
        assert!(moved(&a, &b).is_empty());
    }
}
