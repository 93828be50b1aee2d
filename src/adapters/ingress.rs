//! The client-facing HTTP/1.1 server and the request path at the entry node.
//!
//! Per request: (1) a head that breaks a limit (target length 414, head
//! size 431, CONNECT 501, Host count, Host value or target form 400) goes
//! nowhere, a path that resolves to the admin API is answered there (or
//! 400 when disguised, `client_input`), an absolute-form target's authority
//! becomes `Host`; (2) client-sent `peerlb-*` headers are stripped;
//! (3) the engine decides the owner and the failover candidates; (4) the
//! entry serves it itself or forwards it over QUIC, trying the next
//! candidate as the engine's replay plan allows; (5) the response streams
//! back with `peerlb-served-by` / `peerlb-entry` and, under sticky round
//! robin, the sticky route the engine says to announce.
//!
//! The stages, one file each: `ingress/server` (the accept loop and the
//! connection settings), `ingress/limits` (head limits, and the marks
//! peerlb strips from requests and adds to responses), `ingress/forward`
//! (routing, failover and replay). The owner side is `owner`, the state
//! shared with it and the admin API is `node_state`, and errors become
//! HTTP answers in `errors::error_response`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;

use super::admin;
use super::body::Body;
use super::client_input::{self, PathClass};
use super::errors::RequestError;
use super::node_state::{NodeState, track_body};
use super::owner::Owner;
use super::peer::PeerLinks;
use crate::config::IngressSettings;
use forward::{ForwardSettings, Forwarder};

mod conns;
mod forward;
mod limits;
mod server;

pub(crate) use conns::{ConnTable, Refusal};
pub(crate) use server::{ConnEvent, Handler, serve};

/// Response header naming the entry node.
pub(crate) const ENTRY: &str = "peerlb-entry";

/// The request path of one node's client listeners.
pub(crate) struct Ingress {
    state: Arc<NodeState>,
    forwarder: Forwarder,
    settings: IngressSettings,
    /// This node's id as a header value (`peerlb-entry`), made once.
    id_header: Option<HeaderValue>,
    /// The open client connections, under the cap and the per-source cap.
    conns: Arc<ConnTable>,
}

impl Ingress {
    /// Creates the request path of the node whose state is `state`: `owner`
    /// serves what this node serves itself, `links` reach the peers. `seed`
    /// seeds request ids and random picks.
    pub(crate) fn new(
        state: Arc<NodeState>,
        owner: Arc<Owner>,
        links: Arc<PeerLinks>,
        settings: IngressSettings,
        seed: u64,
    ) -> Ingress {
        let forward = ForwardSettings {
            response_timeout: settings.response_timeout,
            body_read_timeout: settings.body_read_timeout,
            header_served_by: settings.header_served_by,
        };
        Ingress {
            conns: ConnTable::new(
                settings.max_connections,
                settings.max_connections_per_source(),
            ),
            id_header: HeaderValue::from_str(state.node_id()).ok(),
            forwarder: Forwarder::new(
                state.clone(),
                owner,
                links,
                forward,
                settings.route_cookie.clone(),
                seed,
            ),
            state,
            settings,
        }
    }

    /// Handles one client request end to end; never fails (errors become
    /// statuses).
    pub(crate) async fn handle(
        &self,
        req: Request<Incoming>,
        client: SocketAddr,
    ) -> Response<Body> {
        let mut resp = match limits::check(&req, self.settings.max_request_target)
            .map(|()| client_input::classify_path(req.uri().path(), admin::PREFIX))
        {
            Err(e) => self.state.failed(e),
            Ok(PathClass::Admin) => admin::answer_client_port(&self.state, req).await,
            // Never routed: a normalising app would take it for the admin
            // API's path.
            Ok(PathClass::Disguised) => self.state.failed(RequestError::BadRequest(
                "the path resolves to the admin API's /_peerlb/ but is not written so",
            )),
            Ok(PathClass::App) => {
                let mut req = req;
                // Absolute-form: the authority wins (RFC 9112 section 3.2.2),
                // for the rules and for the app.
                let (parts, headers) = (req.uri().clone(), req.headers_mut());
                client_input::host_from_authority(&parts, headers);
                if !self.settings.trust_client_forwarded {
                    client_input::drop_client_forwarding(req.headers_mut());
                }
                let inflight = self.state.enter();
                self.state.counters.requests.fetch_add(1, Ordering::Relaxed);
                let start = tokio::time::Instant::now();
                let resp = match self.forwarder.route_and_serve(req, client).await {
                    Ok((resp, guard)) => track_body(resp, guard, inflight),
                    Err(e) => self.state.failed(e),
                };
                self.state.metrics.observe_request(start.elapsed());
                resp
            }
        };
        if self.settings.header_entry
            && let Some(v) = &self.id_header
        {
            resp.headers_mut().insert(ENTRY, v.clone());
        }
        resp
    }
}

impl server::Handler for Ingress {
    fn handle(
        &self,
        req: Request<Incoming>,
        client: SocketAddr,
    ) -> impl std::future::Future<Output = Response<Body>> + Send {
        Ingress::handle(self, req, client)
    }

    fn header_read_timeout(&self) -> Duration {
        self.settings.header_read_timeout
    }

    fn send_timeout(&self) -> Duration {
        self.settings.send_timeout
    }

    fn conn_table(&self) -> &Arc<ConnTable> {
        &self.conns
    }

    fn connections(&self) -> &std::sync::atomic::AtomicU64 {
        &self.state.counters.client_connections
    }

    fn connection_event(&self, event: ConnEvent) {
        let c = &self.state.counters;
        match event {
            ConnEvent::Refused(Refusal::Full) => &c.connections_refused,
            ConnEvent::Refused(Refusal::SourceFull) => &c.connections_refused_source,
            ConnEvent::ClosedIdle => &c.connections_closed_idle,
        }
        .fetch_add(1, Ordering::Relaxed);
    }
}
