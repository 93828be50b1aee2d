//! The client-facing HTTP/1.1 server and the request path at the entry node.
//!
//! Per request: (1) a request-target over the limit gets 414 and goes
//! nowhere; (2) client-sent `peerlb-*` headers are stripped; (3) the engine
//! decides the owner and the failover candidates; (4) the entry serves it
//! itself or forwards it over QUIC, trying the next candidate when the
//! owner could not have received it (or when it may have, for an idempotent
//! request without a body); (5) the response streams back with
//! `peerlb-served-by` / `peerlb-entry` and, under sticky round robin, the
//! sticky route cookie when a session starts or moves.
//!
//! Errors become HTTP statuses in exactly one function: [`error_response`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::watch;
use tracing::{Instrument, debug, info_span, warn};

use super::admin;
use super::app::{App, AppError, ServeCtx};
use super::body::{self, Body};
use super::peer::{self, ExchangeError, PeerLinks, ProxiedHandler};
use super::wire::RequestHead;
use crate::engine::membership::{MembershipView, NodeId};
use crate::engine::route::Router;
use crate::engine::rules::RequestView;
use crate::engine::sticky;
use crate::env::HttpListener;

/// Response header naming the node that served the request.
pub const SERVED_BY: &str = "peerlb-served-by";
/// Response header naming the entry node.
pub const ENTRY: &str = "peerlb-entry";
/// Response header carrying a new sticky route as a path parameter
/// (`;peerlb-route=<id>`), for clients that refuse cookies.
pub const ROUTE: &str = "peerlb-route";

/// Why a request got no answer from an app: each maps to one status in
/// [`error_response`].
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The request-target is longer than `limits.max_request_target` (414).
    #[error("request-target of {len} bytes exceeds the {max}-byte limit")]
    UriTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// No candidate could be reached before anything was sent (503).
    #[error("no node could take the request: {0}")]
    NoNode(String),
    /// The owner failed after the request may have reached it, and the
    /// request cannot be safely retried (502).
    #[error("owner failed: {0}")]
    OwnerFailed(String),
    /// The owner sent no response head within the response timeout (504).
    #[error("owner timed out: {0}")]
    Timeout(String),
    /// The client's request body could not be read (400).
    #[error("reading the request body: {0}")]
    ClientBody(String),
    /// The local upstream app failed (502).
    #[error(transparent)]
    App(#[from] AppError),
}

/// The one place where errors become HTTP statuses.
pub fn error_response(err: &RequestError, node: &str) -> Response<Body> {
    let status = match err {
        RequestError::UriTooLong { .. } => StatusCode::URI_TOO_LONG,
        RequestError::ClientBody(_) => StatusCode::BAD_REQUEST,
        RequestError::NoNode(_) => StatusCode::SERVICE_UNAVAILABLE,
        RequestError::OwnerFailed(_) | RequestError::App(_) => StatusCode::BAD_GATEWAY,
        RequestError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
    };
    let mut r = Response::new(body::full(format!("{err}\n")));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    if let Ok(v) = HeaderValue::from_str(node) {
        r.headers_mut().insert("peerlb-error-from", v);
    }
    r
}

/// Settings of the request path.
#[derive(Debug, Clone)]
pub struct IngressSettings {
    /// Longest request-target in bytes.
    pub max_request_target: usize,
    /// Longest wait for an owner's response head.
    pub response_timeout: Duration,
    /// Add `peerlb-served-by`.
    pub header_served_by: bool,
    /// Add `peerlb-entry`.
    pub header_entry: bool,
}

/// Request counters (monotonic).
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests received from clients.
    pub requests: AtomicU64,
    /// Requests served by the local app (client or proxied).
    pub served_local: AtomicU64,
    /// Requests forwarded to an owner.
    pub forwarded: AtomicU64,
    /// Forward attempts that failed over to the next candidate.
    pub failovers: AtomicU64,
    /// Proxied requests received whose owner in this node's view is another node.
    pub proxied_disagree: AtomicU64,
    /// Requests answered with an error status by this node.
    pub errors: AtomicU64,
}

/// The request path of one node, shared by its client and peer servers.
pub struct Ingress {
    node_id: NodeId,
    view: watch::Receiver<Arc<MembershipView>>,
    router: Mutex<Router>,
    rng: Mutex<SmallRng>,
    links: Arc<PeerLinks>,
    app: App,
    settings: IngressSettings,
    inflight: AtomicU32,
    accepting: AtomicBool,
    epoch: tokio::time::Instant,
    /// Request counters.
    pub counters: Counters,
}

struct Inflight<'a>(&'a AtomicU32);
impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Largest body kept for replay on the next candidate (64 KiB), like
/// Envoy's per-request retry buffer.
pub const REPLAY_LIMIT: u64 = 64 * 1024;

fn content_length(h: &http::HeaderMap) -> Option<u64> {
    h.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

fn is_idempotent(m: &http::Method) -> bool {
    matches!(
        *m,
        http::Method::GET
            | http::Method::HEAD
            | http::Method::PUT
            | http::Method::DELETE
            | http::Method::OPTIONS
            | http::Method::TRACE
    )
}

/// Length of the request-target as received.
fn target_len(uri: &http::Uri) -> usize {
    match (uri.scheme(), uri.path_and_query()) {
        (None, Some(pq)) => pq.as_str().len(),
        _ => uri.to_string().len(),
    }
}

/// Removes every `peerlb-*` header a client sent (marks of proxied requests
/// and the like must not be forgeable).
fn strip_peerlb_headers(h: &mut http::HeaderMap) {
    if !h.keys().any(|k| k.as_str().starts_with("peerlb-")) {
        return;
    }
    let names: Vec<http::HeaderName> = h
        .keys()
        .filter(|k| k.as_str().starts_with("peerlb-"))
        .cloned()
        .collect();
    for n in names {
        h.remove(n);
    }
}

/// Removes `;peerlb-route=` from the request-target's last path segment;
/// true when there was one.
fn strip_route_param(uri: &mut http::Uri) -> bool {
    let std::borrow::Cow::Owned(path) = sticky::strip_route_param(uri.path()) else {
        return false;
    };
    let pq = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    let mut parts = std::mem::take(uri).into_parts();
    parts.path_and_query = pq.parse().ok();
    *uri = http::Uri::from_parts(parts).unwrap_or_default();
    true
}

/// Tells the client its (new) sticky route: the `peerlb-route` cookie, the
/// `peerlb-route` response header, and, for a client that carries the
/// route in the URL (cookies refused), the route parameter on `Location`.
fn set_route(resp: &mut Response<Body>, node: &str, in_url: bool) {
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&sticky::set_cookie_value(node)) {
        h.append(header::SET_COOKIE, v);
    }
    if let Ok(v) = HeaderValue::from_str(&sticky::encode_route_param(node)) {
        h.insert(ROUTE, v);
    }
    if in_url {
        let rewritten = h
            .get(header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .map(|l| sticky::with_route_param(l, node));
        if let Some(v) = rewritten.and_then(|l| HeaderValue::from_str(&l).ok()) {
            h.insert(header::LOCATION, v);
        }
    }
}

impl Ingress {
    /// Creates the request path. `seed` seeds request ids and random picks.
    pub fn new(
        node_id: NodeId,
        view: watch::Receiver<Arc<MembershipView>>,
        router: Router,
        links: Arc<PeerLinks>,
        app: App,
        settings: IngressSettings,
        seed: u64,
    ) -> Ingress {
        Ingress {
            node_id,
            view,
            router: Mutex::new(router),
            rng: Mutex::new(SmallRng::seed_from_u64(seed)),
            links,
            app,
            settings,
            inflight: AtomicU32::new(0),
            accepting: AtomicBool::new(true),
            epoch: tokio::time::Instant::now(),
            counters: Counters::default(),
        }
    }

    /// Requests in flight on this node (client and proxied).
    pub fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Stops accepting proxied requests (they are refused, retryable):
    /// called when the node closes its listeners on shutdown.
    pub fn stop_accepting(&self) {
        self.accepting.store(false, Ordering::Relaxed);
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The current membership view.
    pub fn view(&self) -> Arc<MembershipView> {
        self.view.borrow().clone()
    }

    fn enter(&self) -> Inflight<'_> {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        Inflight(&self.inflight)
    }

    /// Handles one client request end to end; never fails (errors become
    /// statuses).
    pub async fn handle(&self, req: Request<Incoming>, client: SocketAddr) -> Response<Body> {
        if let Some(r) = admin::answer(self, req.uri().path()) {
            return r;
        }
        let _inflight = self.enter();
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        let mut resp = match self.route_and_serve(req, client).await {
            Ok(r) => r,
            Err(e) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                debug!(error = %e, "request failed");
                error_response(&e, &self.node_id)
            }
        };
        if self.settings.header_entry {
            if let Ok(v) = HeaderValue::from_str(&self.node_id) {
                resp.headers_mut().insert(ENTRY, v);
            }
        }
        resp
    }

    async fn route_and_serve(
        &self,
        mut req: Request<Incoming>,
        client: SocketAddr,
    ) -> Result<Response<Body>, RequestError> {
        let len = target_len(req.uri());
        if len > self.settings.max_request_target {
            return Err(RequestError::UriTooLong {
                len,
                max: self.settings.max_request_target,
            });
        }
        strip_peerlb_headers(req.headers_mut());
        let view = self.view.borrow().clone();
        let now = self.epoch.elapsed();
        let (decision, sticky_on, request_id) = {
            let rv = RequestView {
                method: req.method(),
                uri: req.uri(),
                headers: req.headers(),
                client,
            };
            let mut rng = self.rng.lock().expect("rng lock");
            let mut router = self.router.lock().expect("router lock");
            let d = router.decide(&rv, &view, now, &mut *rng);
            (d, router.is_sticky(), rng.random::<u128>())
        };
        let route = if sticky_on {
            sticky::route_from_request(req.headers(), req.uri())
        } else {
            None
        };
        // The route parameter is peerlb's own mark: the app never sees it.
        let route_in_url = strip_route_param(req.uri_mut());
        let span = info_span!("request", id = %uuid::Uuid::from_u128(request_id), owner = %decision.owner, reason = decision.reason.as_str());
        let (mut resp, served_by) = self
            .serve_candidates(
                req,
                client,
                &decision.candidates,
                decision.key.as_deref(),
                request_id,
                view.version(),
            )
            .instrument(span)
            .await?;
        if sticky_on && route.as_deref() != Some(&*served_by) {
            let starts = resp.headers().contains_key(header::SET_COOKIE);
            if starts || route.is_some() {
                set_route(&mut resp, &served_by, route_in_url);
            }
        }
        if self.settings.header_served_by {
            if let Ok(v) = HeaderValue::from_str(&served_by) {
                resp.headers_mut().insert(SERVED_BY, v);
            }
        }
        Ok(resp)
    }

    /// Tries each candidate in order; returns the response and who served it.
    async fn serve_candidates(
        &self,
        req: Request<Incoming>,
        client: SocketAddr,
        candidates: &[NodeId],
        key: Option<&str>,
        request_id: u128,
        view_version: u64,
    ) -> Result<(Response<Body>, NodeId), RequestError> {
        let (parts, incoming) = req.into_parts();
        let empty_body = incoming.is_end_stream();
        // A small body of an idempotent request is kept so the request can
        // be replayed on the next candidate; other bodies stream once.
        let (replay, mut body) = if !empty_body
            && is_idempotent(&parts.method)
            && content_length(&parts.headers).is_some_and(|n| n <= REPLAY_LIMIT)
        {
            let collected = http_body_util::Limited::new(incoming, REPLAY_LIMIT as usize)
                .collect()
                .await
                .map_err(|e| RequestError::ClientBody(e.to_string()))?;
            (Some(collected.to_bytes()), None)
        } else {
            (None, Some(body::from_incoming(incoming)))
        };
        let replayable = empty_body || replay.is_some();
        let mut last_err: Option<RequestError> = None;
        let mut head: Option<RequestHead> = None;
        for cand in candidates {
            if *cand == self.node_id {
                let b = match &replay {
                    Some(bytes) => body::full(bytes.clone()),
                    None => body.take().unwrap_or_else(body::empty),
                };
                let ctx = ServeCtx {
                    node: &self.node_id,
                    entry: &self.node_id,
                    key,
                    client,
                };
                self.counters.served_local.fetch_add(1, Ordering::Relaxed);
                let resp = self.app.serve(Request::from_parts(parts, b), ctx).await?;
                return Ok((resp, self.node_id.clone()));
            }
            let pair = match self.links.open(cand).await {
                Ok(p) => p,
                Err(e) => {
                    debug!(error = %e, "owner not reachable: trying the next candidate");
                    self.counters.failovers.fetch_add(1, Ordering::Relaxed);
                    last_err = Some(RequestError::NoNode(e.to_string()));
                    continue;
                }
            };
            let h = head.get_or_insert_with(|| RequestHead {
                request_id,
                entry: self.node_id.to_string(),
                hops: 1,
                view_version,
                method: parts.method.as_str().to_owned(),
                uri: parts.uri.to_string(),
                headers: parts
                    .headers
                    .iter()
                    .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec()))
                    .collect(),
                client,
                hash_key: key.map(str::to_owned),
            });
            let b = match (&replay, empty_body) {
                (Some(bytes), _) => body::full(bytes.clone()),
                (None, true) => body::empty(),
                (None, false) => match body.take() {
                    Some(b) => b,
                    None => break,
                },
            };
            self.counters.forwarded.fetch_add(1, Ordering::Relaxed);
            match peer::exchange(cand, pair, h, b, self.settings.response_timeout).await {
                Ok((rh, qb)) => {
                    let served = NodeId::from(rh.served_by.as_str());
                    return Ok((peer::response_from_head(rh, qb.boxed_unsync()), served));
                }
                Err(ExchangeError::Timeout(p)) => {
                    return Err(RequestError::Timeout(p.to_string()));
                }
                Err(e) => {
                    let retry = replayable
                        && (matches!(e, ExchangeError::Refused(_)) || is_idempotent(&parts.method));
                    warn!(error = %e, retry, "forward failed after the request was sent");
                    if !retry {
                        return Err(RequestError::OwnerFailed(e.to_string()));
                    }
                    self.counters.failovers.fetch_add(1, Ordering::Relaxed);
                    last_err = Some(RequestError::OwnerFailed(e.to_string()));
                }
            }
        }
        Err(last_err.unwrap_or_else(|| RequestError::NoNode("no candidate".into())))
    }
}

impl ProxiedHandler for Ingress {
    fn node_id(&self) -> &str {
        &self.node_id
    }

    fn accepting(&self) -> bool {
        self.accepting.load(Ordering::Relaxed)
    }

    async fn serve(&self, head: &RequestHead, req: Request<Body>) -> Response<Body> {
        let _inflight = self.enter();
        if let Some(k) = &head.hash_key {
            let view = self.view.borrow();
            if view.ring().owner(k).is_some_and(|o| *o != self.node_id) {
                self.counters
                    .proxied_disagree
                    .fetch_add(1, Ordering::Relaxed);
                debug!(key = %k, "proxied request for a key this node's view gives to another owner: serving it (hop limit 1)");
            }
        }
        self.counters.served_local.fetch_add(1, Ordering::Relaxed);
        let ctx = ServeCtx {
            node: &self.node_id,
            entry: &head.entry,
            key: head.hash_key.as_deref(),
            client: head.client,
        };
        match self.app.serve(req, ctx).await {
            Ok(r) => r,
            Err(e) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                error_response(&RequestError::App(e), &self.node_id)
            }
        }
    }
}

/// Accepts client connections on `listener` until `shutdown` turns true;
/// each connection is watched by `graceful` so in-flight requests finish.
pub async fn serve(
    mut listener: Box<dyn HttpListener>,
    ingress: Arc<Ingress>,
    mut shutdown: watch::Receiver<bool>,
    graceful: Arc<GracefulShutdown>,
) {
    let local = listener.local_addr().ok();
    loop {
        let (stream, client) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        let ing = ingress.clone();
        let svc = service_fn(move |req| {
            let ing = ing.clone();
            async move { Ok::<_, std::convert::Infallible>(ing.handle(req, client).await) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .keep_alive(true)
            .serve_connection(TokioIo::new(stream), svc);
        let fut = graceful.watch(conn);
        tokio::spawn(
            async move {
                if let Err(e) = fut.await {
                    debug!(error = %e, "client connection ended with an error");
                }
            }
            .instrument(info_span!("conn", %client)),
        );
    }
    debug!(?local, "listener closed");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peerlb_headers_are_stripped_and_others_kept() {
        let mut h = http::HeaderMap::new();
        h.insert("peerlb-entry", HeaderValue::from_static("n9"));
        h.insert("peerlb-hops", HeaderValue::from_static("0"));
        h.insert("x-user", HeaderValue::from_static("a"));
        strip_peerlb_headers(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h["x-user"], "a");
    }

    #[test]
    fn route_param_is_stripped_from_the_request_target() {
        let mut u: http::Uri = "/cart;peerlb-route=n2?x=1".parse().unwrap();
        assert!(strip_route_param(&mut u));
        assert_eq!(u, "/cart?x=1");
        let mut u: http::Uri = "/cart;v=1".parse().unwrap();
        assert!(!strip_route_param(&mut u));
        assert_eq!(u, "/cart;v=1");
    }

    #[test]
    fn target_len_counts_the_request_target_as_sent() {
        assert_eq!(target_len(&"/a?b=c".parse().unwrap()), 6);
        assert_eq!(
            target_len(&"http://h:1/a".parse().unwrap()),
            "http://h:1/a".len()
        );
    }

    #[test]
    fn each_error_has_its_status() {
        for (e, s) in [
            (RequestError::UriTooLong { len: 9, max: 8 }, 414),
            (RequestError::NoNode("x".into()), 503),
            (RequestError::OwnerFailed("x".into()), 502),
            (RequestError::Timeout("x".into()), 504),
            (RequestError::ClientBody("x".into()), 400),
        ] {
            assert_eq!(error_response(&e, "n1").status().as_u16(), s);
        }
    }

    #[test]
    fn idempotent_methods() {
        assert!(is_idempotent(&http::Method::GET));
        assert!(is_idempotent(&http::Method::PUT));
        assert!(!is_idempotent(&http::Method::POST));
        assert!(!is_idempotent(&http::Method::PATCH));
    }
}
