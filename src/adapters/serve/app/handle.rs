//! The ring's answers to the app: [`Handle`] (who owns a key, the serving
//! members) and [`ViewChanges`] (each change of the ring, with the key
//! ranges that moved to and from this node: Ringpop's `lookup` and
//! `ringChanged`). Read from the membership view routing uses, through
//! the engine's own functions (`engine::ownership`), so the answers are
//! routing's, slow start and drain included.

use std::sync::Arc;

use tokio::sync::watch;

use crate::engine::membership::MembershipView;
use crate::engine::node_id::NodeId;
use crate::engine::ownership::{self, MovedRange};

/// A cheap, cloneable view of one node's ring (`Clone + Send + Sync`):
/// from outside requests through [`Node::handle`](crate::Node::handle), from
/// inside one through [`RequestInfo::handle`](crate::RequestInfo::handle).
///
/// Every answer reads the node's current membership view, the one its
/// ingress routes with: a key's owner is the node the consistent-hash ring
/// gives it (a node in slow start owns the share of its current weight; a
/// draining or leaving node owns nothing; a node alone, or with no serving
/// member, owns every key). Before [`Node::run`](crate::Node::run) forms the
/// cluster the node sees only itself.
///
/// ```no_run
/// # async fn shard(node: peerlb::Node) {
/// let handle = node.handle();
/// tokio::spawn(async move {
///     let mut changes = handle.watch();
///     while let Some(change) = changes.changed().await {
///         for moved in &change.lost {
///             // Hand the state of the points moved.points() to moved.to.
///             println!("{:?} now belongs to {}", moved.points(), moved.to);
///         }
///     }
/// });
/// let owner = node.handle().owner("alice");
/// let here = node.handle().is_local("alice");
/// assert_eq!(here, &owner == node.handle().node_id());
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Handle {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    me: NodeId,
    /// `None`: a node with no cluster (`peerlb app`): it owns every key.
    view: Option<watch::Receiver<Arc<MembershipView>>>,
}

impl Handle {
    /// The handle of the node `me` whose views arrive on `view`.
    pub(crate) fn new(me: NodeId, view: watch::Receiver<Arc<MembershipView>>) -> Handle {
        Handle {
            inner: Arc::new(Inner {
                me,
                view: Some(view),
            }),
        }
    }

    /// The handle of a node with no cluster: it owns every key.
    pub(crate) fn alone(me: NodeId) -> Handle {
        Handle {
            inner: Arc::new(Inner { me, view: None }),
        }
    }

    /// This node's id.
    pub fn node_id(&self) -> &NodeId {
        &self.inner.me
    }

    /// The membership view routing uses now (an immutable snapshot).
    /// `None` for a node with no cluster (`peerlb app`).
    pub fn view(&self) -> Option<Arc<MembershipView>> {
        self.inner.view.as_ref().map(|v| v.borrow().clone())
    }

    /// The node a request with hash key `key` is routed to now (the
    /// consistent-hash ring's owner of the key; this node when no member
    /// serves). The key is the one the data-centric rules extract, so an
    /// app sharding by `?user=` asks with the user.
    pub fn owner(&self, key: &str) -> NodeId {
        match &self.inner.view {
            Some(v) => ownership::owner_of(&v.borrow(), key).clone(),
            None => self.inner.me.clone(),
        }
    }

    /// True when [`Handle::owner`] of `key` is this node.
    pub fn is_local(&self, key: &str) -> bool {
        match &self.inner.view {
            Some(v) => ownership::owner_of(&v.borrow(), key) == &self.inner.me,
            None => true,
        }
    }

    /// The serving members now, in id order (this node included while it
    /// serves).
    pub fn members(&self) -> Vec<NodeId> {
        match &self.inner.view {
            Some(v) => v.borrow().serving_ids().to_vec(),
            None => vec![self.inner.me.clone()],
        }
    }

    /// The ring's changes from now on: see [`ViewChanges::changed`].
    pub fn watch(&self) -> ViewChanges {
        let rx = self.inner.view.clone();
        let last = rx.as_ref().map(|v| v.borrow().clone());
        ViewChanges {
            me: self.inner.me.clone(),
            rx,
            last,
        }
    }
}

/// The ring's changes as one node sees them, from [`Handle::watch`].
#[derive(Debug)]
pub struct ViewChanges {
    me: NodeId,
    rx: Option<watch::Receiver<Arc<MembershipView>>>,
    last: Option<Arc<MembershipView>>,
}

impl ViewChanges {
    /// Waits for the next view whose ring differs from the last one this
    /// receiver returned (or from the view when [`Handle::watch`] was
    /// called), and says what moved. Views that change only load figures
    /// are skipped; several changes in a burst may arrive as one.
    /// `None` once the node has stopped (and at once for a node with no
    /// cluster).
    pub async fn changed(&mut self) -> Option<ViewChange> {
        let rx = self.rx.as_mut()?;
        loop {
            rx.changed().await.ok()?;
            let now = rx.borrow_and_update().clone();
            let last = self.last.replace(now.clone());
            let Some(last) = last else { continue };
            if ownership::same_ring(&last, &now) {
                continue;
            }
            let moved = ownership::moved(&last, &now);
            let (gained, lost) = moved.into_iter().partition(|m| m.to == self.me);
            return Some(ViewChange {
                version: now.version(),
                members: now.serving_ids().to_vec(),
                gained,
                lost,
            });
        }
    }
}

/// One change of the ring, as [`ViewChanges::changed`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ViewChange {
    /// The new view's version ([`MembershipView::version`]).
    pub version: u64,
    /// The serving members of the new view, in id order.
    pub members: Vec<NodeId>,
    /// The key ranges this node owns now and did not before (`to` is this
    /// node), in ring order.
    pub gained: Vec<MovedRange>,
    /// The key ranges this node owned and no longer does (`from` is this
    /// node; `to` is the new owner): the state to hand over, in ring order.
    pub lost: Vec<MovedRange>,
}

impl ViewChange {
    /// The new owner of `key` when this change moved it away from this
    /// node, else `None`.
    pub fn lost_to(&self, key: &str) -> Option<&NodeId> {
        let point = crate::engine::ring::hash_key(key);
        self.lost
            .iter()
            .find(|m| m.contains_point(point))
            .map(|m| &m.to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::membership::NodeStatus::{Draining, Serving};
    use crate::engine::membership::tests::{member, view};

    #[test]
    fn answers_are_the_current_views() {
        let (tx, rx) = watch::channel(Arc::new(view("n1", &[("n1", Serving), ("n2", Serving)])));
        let h = Handle::new(NodeId::from("n1"), rx);
        assert_eq!(h.members(), [NodeId::from("n1"), NodeId::from("n2")]);
        let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
        assert!(keys.iter().any(|k| !h.is_local(k)));
        tx.send_replace(Arc::new(view("n1", &[("n1", Serving), ("n2", Draining)])));
        assert_eq!(h.members(), [NodeId::from("n1")]);
        assert!(
            keys.iter()
                .all(|k| h.is_local(k) && h.owner(k).as_str() == "n1")
        );
        let alone = Handle::alone(NodeId::from("a"));
        assert!(alone.is_local("x") && alone.view().is_none());
    }

    #[tokio::test]
    async fn watch_skips_load_only_views_and_reports_what_moved() {
        let three = [("n1", Serving), ("n2", Serving), ("n3", Serving)];
        let first = Arc::new(view("n1", &three));
        let (tx, rx) = watch::channel(first.clone());
        let h = Handle::new(NodeId::from("n1"), rx);
        let mut changes = h.watch();
        // Only a load figure changes: the same ring, no change reported.
        let mut busy = member("n2", 1, Serving);
        busy.load = 10;
        let loads = first.with_members(
            [member("n1", 1, Serving), busy, member("n3", 1, Serving)],
            64,
        );
        tx.send_replace(Arc::new(loads));
        // Polled once: it takes the load-only view, skips it, and waits.
        tokio::select! {
            biased;
            c = changes.changed() => panic!("a load-only view was reported: {c:?}"),
            () = std::future::ready(()) => {}
        }
        let drained = Arc::new(view(
            "n1",
            &[("n1", Serving), ("n2", Serving), ("n3", Draining)],
        ));
        tx.send_replace(drained.clone());
        let c = changes.changed().await.unwrap();
        assert_eq!(c.members, [NodeId::from("n1"), NodeId::from("n2")]);
        assert!(c.lost.is_empty());
        assert!(!c.gained.is_empty());
        for k in (0..500).map(|i| format!("k{i}")) {
            let was = ownership::owner_of(&first, &k).as_str() == "n3";
            let now_mine = ownership::owner_of(&drained, &k).as_str() == "n1";
            assert_eq!(
                c.gained.iter().any(|m| m.contains_key(&k)),
                was && now_mine,
                "{k}"
            );
            assert_eq!(c.lost_to(&k), None);
        }
        drop(tx);
        assert_eq!(changes.changed().await, None);
    }
}
