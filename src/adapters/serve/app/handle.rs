//! The ring's answers to the app: [`Handle`] (who owns a key, the serving
//! members) and [`ViewChanges`] (each change of the ring, with the key
//! ranges that moved to and from this node: Ringpop's `lookup` and
//! `ringChanged`). Read from the membership view routing uses, through
//! the engine's own functions (`engine::ownership`), so the answers are
//! routing's, slow start and drain included. [`Handle::forward`] sends
//! an app's own request to a key's owner on the entry's forwarding path
//! (groupcache's peer fetch), through the [`Forward`] the running node
//! sets (the ingress, a wing above this one).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, Weak};

use http::{Request, Response};
use tokio::sync::watch;

use crate::adapters::body::Body;

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

struct Inner {
    me: NodeId,
    /// `None`: a node with no cluster (`peerlb app`): it owns every key.
    view: Option<watch::Receiver<Arc<MembershipView>>>,
    /// The running node's forwarding path ([`Handle::forward`]): set once
    /// by [`Node::run`](crate::Node::run); weak, as the path holds the app
    /// that holds this handle (gone once the node stops).
    forward: OnceLock<Weak<dyn Forward>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("me", &self.me)
            .field("running", &self.forward.get().is_some())
            .finish_non_exhaustive()
    }
}

/// The future of one [`Forward::forward`].
pub(crate) type ForwardFuture =
    Pin<Box<dyn Future<Output = Result<Response<Body>, ForwardError>> + Send>>;

/// Sends an app's request for `key` to the key's owner: the ingress's
/// candidate loop (`front/ingress/forward.rs`), set by the running node.
pub(crate) trait Forward: Send + Sync {
    /// Sends `req` to `key`'s owner (serves it here when this node owns
    /// it), failing over as a client request would.
    fn forward(self: Arc<Self>, key: &str, req: Request<Body>) -> ForwardFuture;
}

/// [`Handle::forward`] got no response.
///
/// The failover rules are a forwarded client request's
/// (docs/architecture.md, "Failover and replay"): a candidate that cannot
/// be reached before anything was sent is skipped; a request whose method
/// is idempotent (GET, HEAD, PUT, DELETE, OPTIONS, TRACE) with no body or
/// a body of a known length (`Content-Length`, or an exact
/// `http_body::Body::size_hint`) of at most 64 KiB is replayed on the next
/// candidate after the owner failed or refused it; any other request is
/// sent once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ForwardError {
    /// The node is not running ([`Node::run`](crate::Node::run) has not
    /// started or has stopped), or has no cluster (`peerlb app`): nothing
    /// was sent.
    #[error("the node is not running")]
    NotRunning,
    /// No serving owner could be reached before anything was sent: every
    /// candidate of the key was unreachable. Nothing ran; retry once the
    /// ring has settled (see [`Handle::watch`]).
    #[error("no serving owner could take the request: {0}")]
    NoServingOwner(String),
    /// The owner refused the request or failed after it may have reached
    /// it (its link broke, it is draining), and the request could not be
    /// replayed (not idempotent, or a streamed body): it may have run on
    /// the owner. The reason names the peer.
    #[error("the owner failed: {0}")]
    PeerFailed(String),
    /// The owner sent no response head within `ingress.response_timeout_ms`;
    /// never replayed (it may still be running).
    #[error("the owner timed out: {0}")]
    Timeout(String),
    /// The request's own body failed while it was read or sent.
    #[error("the request body failed: {0}")]
    Body(String),
    /// This node owned the key (or was the candidate left) and its app
    /// failed.
    #[error("the local app failed: {0}")]
    App(String),
}

impl Handle {
    /// The handle of the node `me` whose views arrive on `view`.
    pub(crate) fn new(me: NodeId, view: watch::Receiver<Arc<MembershipView>>) -> Handle {
        Handle {
            inner: Arc::new(Inner {
                me,
                view: Some(view),
                forward: OnceLock::new(),
            }),
        }
    }

    /// The handle of a node with no cluster: it owns every key.
    pub(crate) fn alone(me: NodeId) -> Handle {
        Handle {
            inner: Arc::new(Inner {
                me,
                view: None,
                forward: OnceLock::new(),
            }),
        }
    }

    /// Sets the running node's forwarding path (once; later calls are
    /// ignored).
    pub(crate) fn set_forward(&self, forward: Weak<dyn Forward>) {
        let _ = self.inner.forward.set(forward);
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

    /// Sends `req` to the owner of hash key `key` and returns its
    /// response: an app that needs another owner's data asks that owner
    /// (groupcache's peer fetch).
    ///
    /// The request takes a forwarded client request's path: the owner and
    /// the failover order are the ring's for `key` in this node's current
    /// view ([`Handle::owner`] first), it goes over the peer link's QUIC
    /// with mutual TLS, and fails over by the same rules (see
    /// [`ForwardError`]). When this node is the candidate, the request is
    /// served here by the app. The owner serves it with its app and never
    /// forwards it on (hop limit 1), its [`RequestInfo`](crate::RequestInfo)
    /// saying [`proxied`](crate::RequestInfo::proxied) with this node as
    /// the [`entry`](crate::RequestInfo::entry), the key as its
    /// [`key`](crate::RequestInfo::key) and this node's client listener
    /// address (`http_addr`) as its [`client`](crate::RequestInfo::client).
    /// The request's `peerlb-*` headers are removed; its URI is sent as its
    /// request-target (path and query; an absolute URI's authority becomes
    /// nothing: set `Host` if the app reads it).
    ///
    /// An app serving a proxied request should answer it from its own
    /// state rather than forward again: two nodes whose views disagree for
    /// a moment would send a key back and forth.
    ///
    /// ```no_run
    /// # async fn fetch(handle: peerlb::Handle) -> Result<(), peerlb::ForwardError> {
    /// use http_body_util::BodyExt;
    ///
    /// let req = http::Request::get("/kv/alice")
    ///     .body(peerlb::body::empty())
    ///     .unwrap();
    /// let resp = handle.forward("alice", req).await?;
    /// let value = resp.into_body().collect().await.map(|b| b.to_bytes());
    /// # let _ = value; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ForwardError`]: the node is not running, no owner could be
    /// reached, or the owner failed and the request could not be replayed.
    pub fn forward(
        &self,
        key: &str,
        req: Request<Body>,
    ) -> impl Future<Output = Result<Response<Body>, ForwardError>> + Send + 'static {
        let path = self.inner.forward.get().and_then(Weak::upgrade);
        let sent = path.map(|p| p.forward(key, req));
        async move {
            match sent {
                Some(f) => f.await,
                None => Err(ForwardError::NotRunning),
            }
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
    async fn forward_before_the_node_runs_or_after_it_stopped_sends_nothing() {
        let (_tx, rx) = watch::channel(Arc::new(view("n1", &[("n1", Serving)])));
        let req = || Request::new(crate::adapters::body::empty());
        let h = Handle::new(NodeId::from("n1"), rx);
        assert_eq!(
            h.forward("k", req()).await.unwrap_err(),
            ForwardError::NotRunning
        );
        // A path that has gone (the node stopped): the same.
        struct Never;
        impl Forward for Never {
            fn forward(self: Arc<Self>, _: &str, _: Request<Body>) -> ForwardFuture {
                unreachable!("a stopped node's path is not called")
            }
        }
        let gone: Arc<dyn Forward> = Arc::new(Never);
        h.set_forward(Arc::downgrade(&gone));
        drop(gone);
        assert_eq!(
            h.forward("k", req()).await.unwrap_err(),
            ForwardError::NotRunning
        );
        let alone = Handle::alone(NodeId::from("a"));
        assert_eq!(
            alone.forward("k", req()).await.unwrap_err(),
            ForwardError::NotRunning
        );
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
