//! The admin listener: the node's `admin_addr`, bound by `Env::bind`,
//! serves the admin API (`admin::answer`) and nothing else (404 for any
//! path outside `/_peerlb/`). Like Envoy's admin address or HAProxy's
//! stats socket, it is apart from the client ports: what can reach
//! `admin_addr` (loopback by default) is what protects the API.
//!
//! The same server, made with [`AdminServer::metrics_only`], serves the
//! node's `metrics_addr`: `GET /metrics` and `GET /_peerlb/metrics` answer
//! the metrics page, every other request 404, so a scraper reaches the
//! metrics and nothing of the admin API.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use tokio::sync::watch;

use crate::adapters::body::Body;
use crate::adapters::errors::{AdminError, error_response};
use crate::adapters::http::{self as kit, Handler};
use crate::adapters::node_state::NodeState;
use crate::adapters::ops::admin;
use crate::seam::HttpListener;

/// The tracing target of this module's events: its path before the
/// adapters were put in wings (`crate::adapters::REQUEST_PATH`).
const LOG: &str = "peerlb::adapters::admin_server";

/// Answers the admin API on the admin listener.
pub(crate) struct AdminServer {
    state: Arc<NodeState>,
    header_read_timeout: Duration,
    send_timeout: Duration,
    /// Open admin connections (under [`ADMIN_MAX_CONNECTIONS`]).
    connections: AtomicU64,
    /// The admin connections (no per-source cap: loopback only).
    conns: Arc<crate::adapters::http::ConnTable>,
    /// Serves only the metrics (the `metrics_addr` listener).
    metrics_only: bool,
}

/// The path a scraper asks for by default, answered on `metrics_addr`.
pub(crate) const METRICS_PATH: &str = "/metrics";

/// Most admin connections open at once: operators and scrapers, not
/// clients; the cap keeps a runaway script from taking file descriptors
/// the client ports need.
const ADMIN_MAX_CONNECTIONS: usize = 64;

impl AdminServer {
    /// An admin server for `state`, with the client ports' head-read and
    /// send timeouts (`limits.header_read_timeout_ms`, `send_timeout_ms`).
    pub(crate) fn new(
        state: Arc<NodeState>,
        header_read_timeout: Duration,
        send_timeout: Duration,
    ) -> AdminServer {
        AdminServer {
            state,
            header_read_timeout,
            send_timeout,
            connections: AtomicU64::new(0),
            conns: crate::adapters::http::ConnTable::new(
                ADMIN_MAX_CONNECTIONS,
                ADMIN_MAX_CONNECTIONS,
            ),
            metrics_only: false,
        }
    }

    /// A server of `state`'s metrics only (the `metrics_addr` listener),
    /// with the admin server's timeouts and connection cap.
    pub(crate) fn metrics_only(
        state: Arc<NodeState>,
        header_read_timeout: Duration,
        send_timeout: Duration,
    ) -> AdminServer {
        AdminServer {
            metrics_only: true,
            ..AdminServer::new(state, header_read_timeout, send_timeout)
        }
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<Body> {
        if self.metrics_only {
            let path = req.uri().path();
            return if req.method() == http::Method::GET
                && (path == METRICS_PATH || path == crate::adapters::ops::metrics_page::PATH)
            {
                crate::adapters::ops::metrics_page::answer(&self.state, req.headers())
            } else {
                error_response(&AdminError::UnknownPath.into(), self.state.node_id())
            };
        }
        if admin::is_admin(req.uri().path()) {
            admin::answer(&self.state, req).await
        } else {
            error_response(&AdminError::UnknownPath.into(), self.state.node_id())
        }
    }
}

impl Handler for AdminServer {
    async fn handle(
        &self,
        req: Request<Incoming>,
        _conn: Arc<kit::ConnInfo>,
    ) -> crate::adapters::http::relay::Answer<Body> {
        self.answer(req).await.into()
    }

    fn conn_span_at_info(&self) -> bool {
        true
    }

    fn header_read_timeout(&self) -> Duration {
        self.header_read_timeout
    }

    fn send_timeout(&self) -> Duration {
        self.send_timeout
    }

    fn conn_table(&self) -> &Arc<crate::adapters::http::ConnTable> {
        &self.conns
    }

    fn connections(&self) -> &AtomicU64 {
        &self.connections
    }

    fn byte_counts(&self) -> Option<&Arc<crate::adapters::metrics::ByteCounts>> {
        None
    }

    fn connection_event(&self, event: crate::adapters::http::ConnEvent) {
        tracing::debug!(target: LOG,
            max = ADMIN_MAX_CONNECTIONS,
            ?event,
            "admin connection cap reached"
        );
    }
}

/// Serves the admin API on `listener` until `shutdown` turns true.
pub(crate) async fn serve(
    listener: Box<dyn HttpListener>,
    server: Arc<AdminServer>,
    shutdown: watch::Receiver<bool>,
) {
    kit::serve(
        listener,
        Arc::new(kit::ListenerSetup::plain()),
        server,
        shutdown,
    )
    .await;
}
