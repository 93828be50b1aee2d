//! The owner side of the request path: serving a request with the local
//! app, whether a peer forwarded it (the [`ProxiedHandler`] the peer server
//! calls, never forwarded again: hop limit 1) or this node's own ingress
//! is the first candidate. A peer's stream of another kind (a SIP message,
//! an admin change for this member) goes to the handler the composition
//! root registered for it ([`KindHandlers`]); and it relays the tunnels (WebSocket) of the proxied requests its app
//! upgraded.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::{Request, Response};
use tracing::debug;

use crate::adapters::REQUEST_PATH;
use crate::adapters::body::Body;
use crate::adapters::errors::RequestError;
use crate::adapters::node_state::{Hold, NodeState, track_body};
use crate::adapters::serve::app::{App, AppError, ServeCtx};
use crate::adapters::serve::sip::SipApp;
use crate::adapters::transport::peer::ProxiedHandler;
use crate::adapters::tunnel::{BoxIo, Role, Tunnel};
use crate::adapters::wire::{RequestHeadView, StreamKind};
use crate::engine::node_id::NodeId;

/// Answers a peer's admin stream ([`StreamKind::Admin`]) for the node
/// whose state is given: the head, and the change as the body.
pub(crate) type AdminAnswer =
    for<'a> fn(
        &'a NodeState,
        &'a RequestHeadView<'a>,
        Body,
    ) -> Pin<Box<dyn Future<Output = Response<Body>> + Send + 'a>>;

/// What serves the streams that are not HTTP requests for the app, by
/// kind: registered by the composition root (`node.rs`).
pub(crate) struct KindHandlers {
    /// [`StreamKind::Sip`]: the node's SIP server.
    pub(crate) sip: Arc<SipApp>,
    /// [`StreamKind::Admin`]: the admin API's answer to a peer.
    pub(crate) admin: AdminAnswer,
}

/// The local app of one node, with the node state its serve times and
/// counters go to, and the handlers of the other stream kinds.
pub(crate) struct Owner {
    state: Arc<NodeState>,
    app: App,
    kinds: KindHandlers,
}

impl Owner {
    /// The owner side of the node whose state is `state`, serving HTTP
    /// requests with `app` and the other kinds with `kinds`.
    pub(crate) fn new(state: Arc<NodeState>, app: App, kinds: KindHandlers) -> Owner {
        Owner { state, app, kinds }
    }

    /// False for an app that never sends a 1xx (the built-in): a request
    /// it serves needs no informational sink.
    pub(crate) fn app_may_send_informational(&self) -> bool {
        self.app.may_send_informational()
    }

    /// Serves with the local app, adding its time to the response head to
    /// the cumulative processing time of the load metric
    /// ([`NodeState::observe_latency`]).
    ///
    /// # Errors
    /// [`AppError`] when the upstream app fails before a response head.
    pub(crate) async fn serve_app(
        &self,
        req: Request<Body>,
        ctx: ServeCtx<'_>,
    ) -> Result<Response<Body>, AppError> {
        let start = tokio::time::Instant::now();
        let r = self.app.serve(req, ctx).await;
        self.state.observe_latency(start.elapsed());
        r
    }
}

impl ProxiedHandler for Owner {
    fn node_id(&self) -> &str {
        self.state.node_id()
    }

    fn accepting(&self) -> bool {
        self.state.accepting()
    }

    fn may_send_informational(&self, kind: StreamKind) -> bool {
        // The built-in app never sends a 1xx, nor do the admin and SIP
        // paths.
        self.app_may_send_informational() && kind == StreamKind::Http
    }

    async fn serve(
        &self,
        kind: StreamKind,
        entry: &NodeId,
        head: &RequestHeadView<'_>,
        req: Request<Body>,
    ) -> Response<Body> {
        let line = crate::adapters::access::enabled().then(|| {
            let me = self.state.node_id();
            let mut line = crate::adapters::access::Line::of(
                me,
                "owner",
                None,
                entry,
                &req,
                tokio::time::Instant::now(),
            );
            line.routed.request_id = head.request_id;
            line.routed.owner = Some(me.clone());
            line.routed.reason = "proxied";
            // Boxed: it lives across the await below (see the entry's).
            Box::new(line)
        });
        let resp = self.serve_proxied(kind, entry, head, req).await;
        match line {
            Some(line) => crate::adapters::access::log_when_done(resp, *line),
            None => resp,
        }
    }

    async fn relay(&self, peer_side: BoxIo, app: Tunnel) {
        match app.open().await {
            Ok(app_io) => {
                self.state.tunnels.run(Role::Owner, peer_side, app_io).await;
            }
            Err(e) => debug!(target: REQUEST_PATH, error = %e, "app side of a tunnel failed"),
        }
    }
}

impl Owner {
    /// Serves a proxied request with the local app (hop limit 1).
    async fn serve_proxied(
        &self,
        kind: StreamKind,
        entry: &NodeId,
        head: &RequestHeadView<'_>,
        req: Request<Body>,
    ) -> Response<Body> {
        let state = &self.state;
        match kind {
            StreamKind::Http => {}
            // An admin change a peer's admin API forwarded. Boxed, as
            // the SIP path below: rare paths kept out of every proxied
            // request's future (which is moved once per request).
            StreamKind::Admin => return (self.kinds.admin)(state, head, req.into_body()).await,
            StreamKind::Sip(_) => {
                // A request of the SIP server for a caller's connection
                // this node holds (RFC 5923).
                let flow = head
                    .headers
                    .iter()
                    .find(|(k, _)| *k == crate::adapters::wire::SIP_FLOW.as_bytes());
                if let Some(id) = flow.and_then(|(_, v)| std::str::from_utf8(v).ok()) {
                    let id = id.to_owned();
                    let sip = self.kinds.sip.clone();
                    return Box::pin(sip.serve_flow(id, req.into_body())).await;
                }
                state.metrics.count_proxied_in();
                let inflight = state.enter_proxied();
                let sip = self.kinds.sip.clone();
                return Box::pin(sip.serve_proxied(req.into_body(), inflight)).await;
            }
        }
        state.metrics.count_proxied_in();
        let inflight = state.enter_proxied();
        if let Some(k) = head.hash_key {
            let view = state.view();
            if view.ring().owner(k).is_some_and(|o| o != state.node_id()) {
                state
                    .counters
                    .proxied_disagree
                    .fetch_add(1, Ordering::Relaxed);
                debug!(target: REQUEST_PATH, key = %k, "proxied request for a key this node's view gives to another owner: serving it (hop limit 1)");
            }
        }
        state.counters.served_local.fetch_add(1, Ordering::Relaxed);
        let ctx = ServeCtx {
            node: state.node_id(),
            entry,
            key: head.hash_key,
            client: head.client,
            tls: head.tls.as_ref(),
            forwarded: None,
        };
        match self.serve_app(req, ctx).await {
            Ok(r) => track_body(r, Hold::default(), inflight),
            Err(e) => state.failed(RequestError::App(e)),
        }
    }
}
