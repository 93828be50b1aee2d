//! What keeps a request counted while it lasts: the requests an entry has
//! outstanding per owner ([`Tracker`], [`Outstanding`]: the load figures'
//! own part and by-traffic's bytes), the requests in flight on this node
//! ([`Inflight`]), and the response body that holds both until it ends
//! ([`track_body`]).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use http::Response;
use http_body::Body as _;
use http_body_util::BodyExt;

use crate::adapters::body::{self, Body};
use crate::engine::balance::PolicyKind;
use crate::engine::node_id::NodeId;
use crate::engine::route::Router;

/// Requests an entry node has outstanding, per node.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    pub(super) counts: Mutex<std::collections::BTreeMap<NodeId, u32>>,
    /// Per node: the published `inflight` figure a decision last read and
    /// this entry's count when it first read it (`OwnInflight::at_publish`).
    /// Locked after `counts`.
    pub(super) seen: Mutex<std::collections::BTreeMap<NodeId, (u32, u32)>>,
    /// The policy is by-traffic: a finished request's bytes go to the
    /// router (no other policy reads them, so no other takes its lock).
    pub(super) records_bytes: bool,
}

impl Tracker {
    /// A tracker for `router`'s policy.
    pub(super) fn for_router(router: &Router) -> Tracker {
        Tracker {
            records_bytes: router.policy() == PolicyKind::ByTraffic,
            ..Tracker::default()
        }
    }
}

/// Counts one outstanding request to `node` until dropped; then, under
/// by-traffic, records the bytes it moved.
pub(crate) struct Outstanding {
    tracker: Arc<Tracker>,
    router: Arc<Mutex<Router>>,
    node: NodeId,
    /// Bytes it moved so far (request body, then response body).
    pub(super) bytes: u64,
}

impl Outstanding {
    pub(super) fn new(
        tracker: &Arc<Tracker>,
        router: &Arc<Mutex<Router>>,
        node: NodeId,
        request_bytes: u64,
    ) -> Outstanding {
        *tracker
            .counts
            .lock()
            .expect("tracker lock")
            .entry(node.clone())
            .or_insert(0) += 1;
        Outstanding {
            tracker: tracker.clone(),
            router: router.clone(),
            node,
            bytes: request_bytes,
        }
    }
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        let mut counts = self.tracker.counts.lock().expect("tracker lock");
        if let Some(n) = counts.get_mut(&self.node) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&self.node);
            }
        }
        drop(counts);
        if self.tracker.records_bytes {
            self.router
                .lock()
                .expect("router lock")
                .record_bytes(&self.node, self.bytes);
        }
    }
}

/// Counts one request in flight on this node (and in a second counter, the
/// requests the app serves, when set) until dropped.
pub(crate) struct Inflight(pub(super) Arc<AtomicU32>, pub(super) Option<Arc<AtomicU32>>);
impl Drop for Inflight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
        if let Some(c) = &self.1 {
            c.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// What keeps a response's request counted until its body ends, besides
/// this node's in-flight count: outstanding to the node serving it (an
/// entry's), and served by the local app (a request the entry serves
/// itself), so one body wrapper holds all three ([`track_body`]).
#[derive(Default)]
pub(crate) struct Hold {
    pub(crate) guard: Option<Outstanding>,
    pub(crate) serving: Option<Inflight>,
}

/// A response body that keeps its request counted (in flight on this node,
/// served by its app, and outstanding to its owner) until the body ends,
/// and counts the bytes it carries.
struct TrackedBody {
    inner: Body,
    guard: Option<Outstanding>,
    inflight: Option<Inflight>,
    serving: Option<Inflight>,
}

impl http_body::Body for TrackedBody {
    type Data = bytes::Bytes;
    type Error = body::BodyError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, body::BodyError>>> {
        let this = &mut *self;
        let r = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        match &r {
            std::task::Poll::Ready(Some(Ok(f))) => {
                if let (Some(g), Some(d)) = (this.guard.as_mut(), f.data_ref()) {
                    g.bytes += d.len() as u64;
                }
            }
            std::task::Poll::Ready(_) => {
                this.guard = None;
                this.inflight = None;
                this.serving = None;
            }
            std::task::Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Wraps `resp`'s body so the guards live until the body ends (a body
/// that is already at its end is left as it is: they drop now).
pub(crate) fn track_body(resp: Response<Body>, hold: Hold, inflight: Inflight) -> Response<Body> {
    if resp.body().is_end_stream() {
        return resp;
    }
    resp.map(|inner| {
        TrackedBody {
            inner,
            guard: hold.guard,
            inflight: Some(inflight),
            serving: hold.serving,
        }
        .boxed_unsync()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One wrapper keeps every count of an answer until its body ends (the
    /// node's in flight and, for a request its app served, the app's), not
    /// until it is dropped; an answer whose body has already ended keeps
    /// none.
    #[tokio::test]
    async fn the_counts_last_until_the_body_ends_and_not_past_it() {
        let count = |n: u32| Arc::new(AtomicU32::new(n));
        let (inflight, serving) = (count(1), count(1));
        let hold = Hold {
            guard: None,
            serving: Some(Inflight(serving.clone(), None)),
        };
        let resp = track_body(
            Response::new(body::full("abc")),
            hold,
            Inflight(inflight.clone(), None),
        );
        let now = |a: &AtomicU32| a.load(Ordering::Relaxed);
        assert_eq!((now(&inflight), now(&serving)), (1, 1));
        let mut b = resp.into_body();
        let first = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, "abc");
        assert_eq!((now(&inflight), now(&serving)), (1, 1), "a frame is out");
        assert!(b.frame().await.is_none());
        assert_eq!((now(&inflight), now(&serving)), (0, 0), "the body ended");
        drop(b);
        assert_eq!((now(&inflight), now(&serving)), (0, 0));

        let (inflight, serving) = (count(1), count(1));
        let hold = Hold {
            guard: None,
            serving: Some(Inflight(serving.clone(), None)),
        };
        let resp = track_body(
            Response::new(body::empty()),
            hold,
            Inflight(inflight.clone(), None),
        );
        assert_eq!(
            (now(&inflight), now(&serving)),
            (0, 0),
            "no body to wait for"
        );
        drop(resp);
    }
}
