//! Which members a node's membership view is made of, from what gossip
//! and the peer links say: the rule of the composition root's view task,
//! as a value, so it is tested without gossip, sockets or a clock.
//!
//! - A peer is routable only while gossip lists it AND its authenticated
//!   QUIC connection is up (`connected`).
//! - This node is always in its own view. Its entry is the node's own
//!   [`Member`] (addresses, generation), with the status, weight, load and
//!   in-flight count of its newest generation in gossip when gossip has
//!   it (so a drain or weight change this node published shows in its own
//!   view as in everyone else's).
//! - While this node is `holding` (just after a pause of its own), a peer
//!   that left gossip's live set or lost its connection stays: its
//!   silence is this node's absence. The last composition's members and
//!   routable set are kept for that.
//! - Every member gossip lists, and every held one, is a peer the links
//!   supervise (dial and keep), routable or not yet.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use super::membership::Member;
use super::node_id::NodeId;

/// A peer the links keep a connection to: (id, peer address, generation).
pub(crate) type Supervised = (NodeId, SocketAddr, u64);

/// The view task's memory between compositions: this node's own member
/// and the last composition's members and routable peers (for holding).
pub(crate) struct ViewComposer {
    me: Member,
    last_members: Vec<Member>,
    last_up: BTreeSet<NodeId>,
}

/// One composition: the peers to supervise and the view's members.
#[derive(Debug, PartialEq)]
pub(crate) struct Composition {
    /// Every other member gossip lists (and every held one), in gossip's
    /// order: the links dial and keep them.
    pub(crate) supervised: Vec<Supervised>,
    /// The view's members: the routable peers in gossip's order, then
    /// this node.
    pub(crate) members: Vec<Member>,
}

impl ViewComposer {
    /// A composer for the node `me` (its own addresses and generation).
    pub(crate) fn new(me: Member) -> ViewComposer {
        ViewComposer {
            me,
            last_members: Vec::new(),
            last_up: BTreeSet::new(),
        }
    }

    /// The routable peers of the last composition (the connected ones,
    /// plus the held ones while holding).
    pub(crate) fn up(&self) -> &BTreeSet<NodeId> {
        &self.last_up
    }

    /// Composes the view from gossip's live `members` and the `connected`
    /// peers; `holding` keeps the last composition's members and routable
    /// peers that are missing now (see the module doc).
    pub(crate) fn compose(
        &mut self,
        mut members: Vec<Member>,
        mut up: BTreeSet<NodeId>,
        holding: bool,
    ) -> Composition {
        let self_id = self.me.id.clone();
        if holding {
            let held: Vec<Member> = self
                .last_members
                .iter()
                .filter(|m| m.id != self_id && !members.iter().any(|n| n.id == m.id))
                .cloned()
                .collect();
            members.extend(held);
            up.extend(self.last_up.iter().cloned());
        }
        self.last_members.clone_from(&members);
        self.last_up = up;
        let supervised = members
            .iter()
            .filter(|m| m.id != self_id)
            .map(|m| (m.id.clone(), m.peer_addr, m.generation))
            .collect();
        let mut me = self.me.clone();
        if let Some(m) = members
            .iter()
            .filter(|m| m.id == self_id)
            .max_by_key(|m| m.generation)
        {
            me.status = m.status;
            me.weight = m.weight;
            me.load = m.load;
            me.inflight = m.inflight;
        }
        let up = &self.last_up;
        let members = members
            .into_iter()
            .filter(|m| m.id != self_id && up.contains(&m.id))
            .chain(std::iter::once(me))
            .collect();
        Composition {
            supervised,
            members,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::membership::NodeStatus;

    /// A serving member (the membership tests' helper) of `weight`.
    fn member(id: &str, generation: u64, weight: u32) -> Member {
        Member {
            weight,
            ..crate::engine::membership::tests::member(id, generation, NodeStatus::Serving)
        }
    }

    fn ids(members: &[Member]) -> Vec<&str> {
        members.iter().map(|m| m.id.as_str()).collect()
    }

    fn up(ids: &[&str]) -> BTreeSet<NodeId> {
        ids.iter().map(|i| NodeId::from(*i)).collect()
    }

    #[test]
    fn a_peer_is_routable_only_while_gossip_lists_it_and_its_link_is_up() {
        let mut c = ViewComposer::new(member("n1", 1, 100));
        let gossip = vec![
            member("n1", 1, 100),
            member("n2", 1, 100),
            member("n3", 1, 100),
        ];
        // n3 is in gossip without a connection; n4 connected but unknown
        // to gossip.
        let out = c.compose(gossip, up(&["n2", "n4"]), false);
        assert_eq!(ids(&out.members), ["n2", "n1"]);
        // Both of gossip's other members are supervised, routable or not.
        let supervised: Vec<&str> = out.supervised.iter().map(|s| s.0.as_str()).collect();
        assert_eq!(supervised, ["n2", "n3"]);
    }

    #[test]
    fn this_node_is_always_in_its_view_with_its_newest_published_state() {
        let mut c = ViewComposer::new(member("n1", 7, 100));
        // Not in gossip at all: still in its own view, as built.
        let out = c.compose(Vec::new(), BTreeSet::new(), false);
        assert_eq!(out.members, vec![member("n1", 7, 100)]);
        // Gossip holds an older and a newer generation's state: the
        // newest one's status and weight, the node's own generation.
        let mut old = member("n1", 3, 500);
        old.status = NodeStatus::Offline;
        let mut new = member("n1", 9, 250);
        new.status = NodeStatus::Draining;
        new.inflight = 4;
        let out = c.compose(vec![old, new], BTreeSet::new(), false);
        let me = &out.members[0];
        assert_eq!(
            (me.generation, me.weight, me.status, me.inflight),
            (7, 250, NodeStatus::Draining, 4)
        );
        assert!(out.supervised.is_empty(), "a node never dials itself");
    }

    #[test]
    fn holding_keeps_the_peers_that_went_silent_until_it_ends() {
        let mut c = ViewComposer::new(member("n1", 1, 100));
        let all = vec![
            member("n1", 1, 100),
            member("n2", 1, 100),
            member("n3", 1, 100),
        ];
        c.compose(all, up(&["n2", "n3"]), false);
        // After this node's pause, gossip lost n3 and the link to n2 is
        // down: both stay, routable, while holding.
        let out = c.compose(
            vec![member("n1", 1, 100), member("n2", 1, 100)],
            BTreeSet::new(),
            true,
        );
        assert_eq!(ids(&out.members), ["n2", "n3", "n1"]);
        assert_eq!(c.up(), &up(&["n2", "n3"]));
        // The grace ends: the view is what gossip and the links say now.
        let out = c.compose(
            vec![member("n1", 1, 100), member("n2", 1, 100)],
            up(&["n2"]),
            false,
        );
        assert_eq!(ids(&out.members), ["n2", "n1"]);
        assert_eq!(c.up(), &up(&["n2"]));
    }

    #[test]
    fn without_holding_a_silent_peer_leaves_at_once() {
        let mut c = ViewComposer::new(member("n1", 1, 100));
        c.compose(
            vec![member("n1", 1, 100), member("n2", 1, 100)],
            up(&["n2"]),
            false,
        );
        let out = c.compose(vec![member("n1", 1, 100)], up(&["n2"]), false);
        assert_eq!(ids(&out.members), ["n1"]);
        assert!(out.supervised.is_empty());
    }
}
