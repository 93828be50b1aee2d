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
//! robin, the sticky route the engine says to announce; while the node is
//! draining, offline or leaving every answer says `Connection: close`.
//!
//! An HTTP/2 request (each stream of an HTTP/2 connection, routed on its
//! own) first takes the HTTP/1.1 form ([`client_input::http2_as_http11`]),
//! so every stage below treats it as the same request over HTTP/1.1. A
//! WebSocket request (`Upgrade: websocket`) is routed like any request;
//! when the owner's app answers 101, the client's connection and the
//! owner's side are relayed as a tunnel (`tunnel`). An HTTP/2 WebSocket
//! (RFC 8441: CONNECT with `:protocol websocket`) becomes that same
//! HTTP/1.1 opening handshake before the limits (a key made here, the
//! app's accept checked, its 101 answered 200: `tunnel::extended_connect`),
//! and its tunnel's client side is the stream; any other CONNECT gets 501.
//!
//! The stages, one file each: `ingress/server` (the accept loop and the
//! connection settings, HTTP/1.1 and HTTP/2), `ingress/conn` (what a
//! connection goes through before HTTP: the PROXY header,
//! `ingress/proxy_protocol`, and the TLS handshake), `ingress/preface`
//! (HTTP/2 prior knowledge on cleartext), `ingress/limits` (head limits, and the marks
//! peerlb strips from requests and adds to responses), `ingress/forward`
//! (routing, failover and replay). The owner side is `owner`, the state
//! shared with it and the admin API is `node_state`, and errors become
//! HTTP answers in `errors::error_response`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;

use crate::adapters::body::Body;
use crate::adapters::errors::RequestError;
use crate::adapters::front::client_input::{self, PathClass};
use crate::adapters::front::extended_connect::{self, Connect};
use crate::adapters::http::client_cert::FORWARDED_CLIENT_CERT;
use crate::adapters::http::relay::ResponseBudget;
use crate::adapters::http::server::{self, ConnHold};
use crate::adapters::node_state::{NodeState, track_body};
use crate::adapters::ops::admin;
use crate::adapters::serve::app::handle::{Forward, ForwardError, ForwardFuture};
use crate::adapters::serve::owner::Owner;
use crate::adapters::transport::peer::PeerLinks;
use crate::adapters::tunnel::{self, Role, Tunnel};
use crate::config::IngressSettings;
use forward::{ForwardSettings, Forwarder};

mod forward;
mod limits;

use crate::adapters::http::relay::Answer;
use crate::adapters::http::{ConnEvent, Refusal, conn};
pub(crate) use crate::adapters::http::{ConnInfo, ConnTable, ListenerSetup, serve};

/// Response header naming the entry node.
pub(crate) const ENTRY: &str = "peerlb-entry";

/// [`ENTRY`] as a header name, made once: a `&str` name is parsed again
/// on every insert (about 290 instructions for a name HTTP has no
/// constant for).
const ENTRY_NAME: http::HeaderName = http::HeaderName::from_static(ENTRY);

/// The request path of one node's client listeners.
pub(crate) struct Ingress {
    state: Arc<NodeState>,
    forwarder: Forwarder,
    settings: IngressSettings,
    /// This node's id as a header value (`peerlb-entry`), made once.
    id_header: Option<HeaderValue>,
    /// When this ingress was made: the clock of `proxy_warned`.
    epoch: tokio::time::Instant,
    /// Seconds after `epoch` of the last warning about a missing PROXY
    /// header (0: none yet).
    proxy_warned: std::sync::atomic::AtomicU64,
    /// The open client connections, under the cap and the per-source cap.
    conns: Arc<ConnTable>,
    /// The node's budget of response bytes held for clients.
    budget: Arc<ResponseBudget>,
}

/// An app's own request (`Handle::forward`) takes the client requests'
/// candidate loop (`ingress/forward`).
impl Forward for Ingress {
    fn forward(self: Arc<Self>, key: &str, req: Request<Body>) -> ForwardFuture {
        let key: Box<str> = key.into();
        Box::pin(async move {
            self.forwarder
                .forward_app(&key, req)
                .await
                .map_err(|e| match e {
                    RequestError::NoNode(s) => ForwardError::NoServingOwner(s),
                    RequestError::Timeout(s) => ForwardError::Timeout(s),
                    RequestError::ClientBody(s) | RequestError::ClientTimeout(s) => {
                        ForwardError::Body(s)
                    }
                    RequestError::App(e) => ForwardError::App(e.to_string()),
                    e => ForwardError::PeerFailed(e.to_string()),
                })
        })
    }
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
            keep_client_request_id: settings.trust_client_forwarded,
        };
        Ingress {
            budget: ResponseBudget::new(
                settings.response_budget_bytes,
                settings.response_buffer_bytes,
                settings.send_timeout,
                state.counters.response_cuts.clone(),
            ),
            conns: ConnTable::with_tunnels(
                settings.max_connections,
                settings.max_connections_per_source(),
                settings.tunnel_closable_after,
                settings.max_tunnels_percent,
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
            epoch: tokio::time::Instant::now(),
            proxy_warned: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Handles one client request end to end; never fails (errors become
    /// statuses). The answer says whether its body is read from a peer.
    pub(crate) async fn handle(
        &self,
        mut req: Request<Incoming>,
        conn: Arc<ConnInfo>,
    ) -> Answer<Body> {
        // Long: the request's stages in the order they run (the checks of client_input, the
        // limits, the decision, then serving or forwarding), as the module doc lists them.
        // The access line, taken as the request arrived (only when the
        // access log is on: nothing is copied otherwise).
        // Boxed: it lives across the await below, and unboxed it made every
        // request's future (moved once per request) some 300 bytes larger.
        let mut line = crate::adapters::access::enabled().then(|| {
            let me = self.state.node_id();
            Box::new(crate::adapters::access::Line::of(
                me,
                "edge",
                Some(conn.client),
                me,
                &req,
                tokio::time::Instant::now(),
            ))
        });
        // The body bytes as read, for the line's `bytes_in`.
        if let Some(l) = &mut line {
            let read = crate::adapters::access::BodyBytes::default();
            req.extensions_mut().insert(read.clone());
            l.body_read = Some(read);
        }
        // An HTTP/2 WebSocket (RFC 8441): the HTTP/1.1 handshake from here
        // on, and what its answer must carry.
        let mut h2_websocket = None;
        if req.version() == http::Version::HTTP_2 {
            let (mut parts, body) = req.into_parts();
            client_input::http2_as_http11(&mut parts.uri, &mut parts.headers, &mut parts.version);
            let protocol = parts.extensions.get::<hyper::ext::Protocol>();
            if extended_connect::classify(&parts.method, protocol.map(|p| p.as_str()))
                == Connect::WebSocket
            {
                parts.extensions.remove::<hyper::ext::Protocol>();
                h2_websocket = Some(extended_connect::websocket_as_http11(
                    &mut parts.method,
                    &mut parts.headers,
                    self.forwarder.nonce(),
                ));
            }
            req = Request::from_parts(parts, body);
        }
        // Taken before the request moves on: the client's connection (an
        // HTTP/2 client's stream) once the app's 101 has been answered,
        // and on HTTP/2 the hold that keeps the connection in use while
        // the tunnel is open.
        let mut upgrade =
            tunnel::wants_websocket(req.method(), req.version(), req.headers()).then(|| {
                let hold = req.extensions_mut().remove::<ConnHold>();
                (hyper::upgrade::on(&mut req), hold)
            });
        let class = limits::check(&req, self.settings.max_request_target)
            .and_then(|()| match &upgrade {
                // Open tunnels hold their share of the cap: the rest stays
                // for new clients.
                Some(_) if self.conns.tunnels_full() => {
                    self.state
                        .counters
                        .tunnels_refused
                        .fetch_add(1, Ordering::Relaxed);
                    Err(RequestError::TunnelsFull(self.conns.max_tunnels()))
                }
                _ => Ok(()),
            })
            .and_then(|()| {
                let sni = conn.tls.as_ref().and_then(|t| t.sni.as_deref());
                // Asked only for a name the certificate covers that is not
                // the SNI's: would a rule keyed on sni route it otherwise?
                let sni_rules_differ = |host: &str| {
                    let rv = crate::engine::rules::RequestView {
                        method: req.method(),
                        uri: req.uri(),
                        headers: req.headers(),
                        client: conn.client,
                        tls: true,
                        sni,
                    };
                    self.state.sni_would_differ(&rv, host)
                };
                match client_input::misdirected(
                    sni,
                    conn.cert_names.as_deref(),
                    req.uri(),
                    req.headers(),
                    sni_rules_differ,
                ) {
                    Some(host) => Err(RequestError::Misdirected {
                        sni: sni.unwrap_or_default().to_owned(),
                        host,
                    }),
                    None => Ok(()),
                }
            })
            .map(|()| client_input::classify_path(req.uri().path(), admin::PREFIX));
        // Admin answers (the sprayer's health checks) are not client
        // requests: not counted by status.
        let admin_path = matches!(class, Ok(PathClass::Admin));
        let mut from_peer = false;
        let mut resp = match class {
            Err(e) => self.state.failed(e),
            // Boxed: a rare path, kept out of every request's future.
            Ok(PathClass::Admin) => Box::pin(admin::answer_client_port(&self.state, req)).await,
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

                // The forwarding headers (unless trusted); the scheme the
                // client used (the app layer sets it) and the client
                // certificate's identity (only the one this connection's
                // handshake verified): a client's own values never reach
                // the app.
                let headers = req.headers_mut();
                client_input::drop_client_set(headers, self.settings.trust_client_forwarded);
                if let Some(v) = &conn.client_cert {
                    headers.insert(FORWARDED_CLIENT_CERT, v.clone());
                }
                let inflight = self.state.enter();
                self.state.counters.requests.fetch_add(1, Ordering::Relaxed);
                let start = tokio::time::Instant::now();
                let routed = line.as_mut().map(|l| {
                    l.role = "entry";
                    &mut l.routed
                });
                // Boxed for the reason `serve_decided` boxes its attempts:
                // hyper moves this future (and the service's around it)
                // once per request; unboxed, the routing's 1.6 KB were in
                // each move.
                let mut resp =
                    match Box::pin(self.forwarder.route_and_serve(req, &conn, routed)).await {
                        Ok((answer, hold)) => {
                            from_peer = answer.from_peer;
                            track_body(answer.response, hold, inflight)
                        }
                        Err(answer) => answer,
                    };
                self.state.metrics.observe_request(start.elapsed());
                // HTTP/2: a 101 becomes 200 (RFC 8441 section 5).
                let answered = match &h2_websocket {
                    Some(hs) => {
                        let (mut parts, body) = resp.into_parts();
                        let r = hs.answer_as_h2(&mut parts.status, &mut parts.headers);
                        resp = Response::from_parts(parts, body);
                        r.map_err(|e| RequestError::OwnerFailed(e.to_string()))
                    }
                    None => Ok(resp.status() == http::StatusCode::SWITCHING_PROTOCOLS),
                };
                match answered {
                    Ok(false) => {}
                    Ok(true) => {
                        let app = resp.extensions_mut().remove::<Tunnel>();
                        match (upgrade.take(), app) {
                            (Some((client_side, hold)), Some(app)) => {
                                // The tunnel's access line is written when
                                // it closes, with the bytes it relayed.
                                let tunnel_line = line.take().map(|mut l| {
                                    l.status = resp.status().as_u16();
                                    l.ttfb = l.start.elapsed();
                                    l.role = "tunnel";
                                    *l
                                });
                                self.open_tunnel(
                                    client_side,
                                    hold.map(|h| h.hold()),
                                    app,
                                    tunnel_line,
                                )
                            }
                            // Cannot happen (an app's 101 to a request that
                            // asked for no upgrade is refused where it is
                            // read); a 101 must never reach a client that
                            // did not ask for one.
                            _ => {
                                from_peer = false;
                                resp = self.state.failed(RequestError::OwnerFailed(
                                    "101 Switching Protocols without a tunnel".into(),
                                ));
                            }
                        }
                    }
                    // The app's side of a tunnel, if any, is dropped with
                    // the response: closed.
                    Err(e) => {
                        from_peer = false;
                        resp = self.state.failed(e);
                    }
                }
                resp
            }
        };
        if !admin_path {
            self.state.metrics.count_status(resp.status());
            if resp.status().is_client_error()
                && resp
                    .headers()
                    .contains_key(crate::adapters::errors::ERROR_FROM_NAME)
            {
                self.state
                    .counters
                    .edge_client_errors
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        if self.settings.header_entry
            && let Some(v) = &self.id_header
        {
            resp.headers_mut().insert(ENTRY_NAME, v.clone());
        }
        // Draining, offline or leaving: the client reconnects through the
        // sprayer, which no longer picks this node, before the listener
        // closes (hyper closes the connection after this answer).
        if self.state.closing() {
            resp.headers_mut()
                .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        }
        let response = match line {
            Some(line) if !admin_path => crate::adapters::access::log_when_done(resp, *line),
            _ => resp,
        };
        Answer {
            response,
            from_peer,
        }
    }
}

impl Ingress {
    /// Relays the client's connection (once hyper has written the 101 and
    /// handed it over; on HTTP/2, the stream once the 200 is written) and
    /// the owner's side `app` as a tunnel, in a task of its own, which
    /// keeps `hold` on an HTTP/2 client connection until the tunnel ends;
    /// then writes its access `line` (if the log is on) with the bytes
    /// relayed: `bytes_in` client to app, `bytes_out` app to client.
    fn open_tunnel(
        &self,
        client_side: hyper::upgrade::OnUpgrade,
        hold: Option<server::Held>,
        app: Tunnel,
        line: Option<crate::adapters::access::Line>,
    ) {
        let state = self.state.clone();
        let watched = hold.as_ref().map(server::Held::watched);
        tokio::spawn(async move {
            let _hold = hold;
            let client_io = match client_side.await {
                Ok(u) => Box::new(hyper_util::rt::TokioIo::new(u)) as tunnel::BoxIo,
                Err(e) => {
                    tracing::debug!(target: crate::adapters::REQUEST_PATH, error = %e, "client connection not upgraded: tunnel dropped");
                    if let Some(l) = &line {
                        l.write();
                    }
                    return;
                }
            };
            let app_io = match app.open().await {
                Ok(io) => io,
                Err(e) => {
                    tracing::debug!(target: crate::adapters::REQUEST_PATH, error = %e, "owner side of a tunnel failed");
                    if let Some(l) = &line {
                        l.write();
                    }
                    return;
                }
            };
            let (_, up, down) = state
                .tunnels
                .run_counted(Role::Entry, client_io, app_io, watched)
                .await;
            if let Some(mut line) = line {
                line.body_read = None;
                line.bytes_in = up;
                line.bytes_out = down;
                line.write();
            }
        });
    }
}

impl server::Handler for Ingress {
    fn handle(
        &self,
        req: Request<Incoming>,
        conn: Arc<ConnInfo>,
    ) -> impl std::future::Future<Output = Answer<Body>> + Send {
        Ingress::handle(self, req, conn)
    }

    fn header_read_timeout(&self) -> Duration {
        self.settings.header_read_timeout
    }

    fn edge_answer(&self, client: std::net::SocketAddr, status: u16) {
        // A timed-out head (408) was closed with nothing written: logged,
        // not counted as an answer.
        if status != 408
            && let Ok(s) = http::StatusCode::from_u16(status)
        {
            self.state.metrics.count_status(s);
            self.state
                .counters
                .edge_client_errors
                .fetch_add(1, Ordering::Relaxed);
        }
        if crate::adapters::access::enabled() {
            crate::adapters::access::edge_line(self.state.node_id(), client, status);
        }
    }

    fn send_timeout(&self) -> Duration {
        self.settings.send_timeout
    }

    fn early_answer_drain_bytes(&self) -> u64 {
        self.settings.early_answer_drain_bytes
    }

    fn response_budget(&self) -> Option<&Arc<ResponseBudget>> {
        Some(&self.budget)
    }

    fn conn_table(&self) -> &Arc<ConnTable> {
        &self.conns
    }

    fn connections(&self) -> &std::sync::atomic::AtomicU64 {
        &self.state.counters.client_connections
    }

    fn byte_counts(&self) -> Option<&Arc<crate::adapters::metrics::ByteCounts>> {
        Some(&self.state.metrics.client_bytes)
    }

    fn connection_event(&self, event: ConnEvent) {
        let c = &self.state.counters;
        match event {
            ConnEvent::Refused(Refusal::Full) => &c.connections_refused,
            ConnEvent::Refused(Refusal::SourceFull) => &c.connections_refused_source,
            ConnEvent::ClosedIdle => &c.connections_closed_idle,
            ConnEvent::ClientAborted => &c.client_aborted,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    fn h2_max_concurrent_streams(&self) -> u32 {
        self.settings.h2_max_concurrent_streams
    }

    fn h2_connection(&self) {
        self.state
            .counters
            .h2_connections
            .fetch_add(1, Ordering::Relaxed);
    }

    fn h2_reset_flood(&self) {
        self.state
            .counters
            .h2_reset_floods
            .fetch_add(1, Ordering::Relaxed);
    }

    fn closed_before_http(&self, peer: std::net::SocketAddr, error: &conn::OpenError) {
        let c = &self.state.counters;
        match error {
            conn::OpenError::Proxy(e) => {
                c.proxy_header_refused.fetch_add(1, Ordering::Relaxed);
                // A sprayer that does not send the header is a setup
                // mistake worth seeing at info; once in 10 s, not per
                // connection.
                let now = self.epoch.elapsed().as_secs();
                let last = self.proxy_warned.load(Ordering::Relaxed);
                if (last == 0 || now >= last + 10)
                    && self
                        .proxy_warned
                        .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()
                {
                    tracing::warn!(target: crate::adapters::REQUEST_PATH, %peer, error = %e, "closed a client connection without a valid PROXY header (listener proxy_protocol = true): is the sprayer sending it?");
                }
            }
            conn::OpenError::Handshake(_) | conn::OpenError::HandshakeTimeout(_) => {
                c.tls_handshake_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
