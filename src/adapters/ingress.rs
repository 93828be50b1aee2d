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
use tracing::{Instrument, debug, debug_span, info, info_span, warn};

use super::admin;
use super::app::{App, AppError, ServeCtx};
use super::body::{self, Body};
use super::gossip::Publisher;
use super::peer::{self, ExchangeError, PeerLinks, ProxiedHandler};
use super::send_timeout::SendTimeout;
use super::wire::{self, RequestHead, RequestHeadRef};
use crate::config::MAX_WEIGHT;
use crate::engine::membership::{MembershipView, NodeId};
use crate::engine::route::Router;
use crate::engine::rules::RequestView;
use crate::engine::sticky;
use crate::env::HttpListener;

/// Response header naming the node that served the request.
pub(crate) const SERVED_BY: &str = "peerlb-served-by";
/// Response header naming the entry node.
pub(crate) const ENTRY: &str = "peerlb-entry";
/// Response header carrying a new sticky route as a path parameter
/// (`;peerlb-route=<id>`), for clients that refuse cookies.
pub(crate) const ROUTE: &str = "peerlb-route";

/// Why a request got no answer from an app: each maps to one status in
/// [`error_response`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum RequestError {
    /// The request-target is longer than `limits.max_request_target` (414).
    #[error("request-target of {len} bytes exceeds the {max}-byte limit")]
    UriTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The request head (target and headers) is larger than a peer frame
    /// carries (431).
    #[error("request head of {len} bytes exceeds the {max}-byte limit")]
    HeadTooLarge {
        /// Its size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The request is malformed (400).
    #[error("bad request: {0}")]
    BadRequest(&'static str),
    /// A method peerlb does not proxy: CONNECT (tunnels) (501).
    #[error("{0} is not supported: peerlb proxies HTTP requests, not tunnels")]
    NotImplemented(http::Method),
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
    /// The client's request body stalled past `limits.body_read_timeout_ms` (408).
    #[error("reading the request body: {0}")]
    ClientTimeout(String),
    /// The local upstream app failed (502).
    #[error(transparent)]
    App(#[from] AppError),
}

impl RequestError {
    /// The error for a client body that failed: 408 when it stalled, else 400.
    fn client_body(e: &body::BodyError) -> RequestError {
        match e {
            body::BodyError::ClientTimeout(_) => RequestError::ClientTimeout(e.to_string()),
            _ => RequestError::ClientBody(e.to_string()),
        }
    }
}

/// The one place where errors become HTTP statuses.
pub(crate) fn error_response(err: &RequestError, node: &str) -> Response<Body> {
    let status = match err {
        RequestError::UriTooLong { .. } => StatusCode::URI_TOO_LONG,
        RequestError::ClientBody(_) | RequestError::BadRequest(_) => StatusCode::BAD_REQUEST,
        RequestError::HeadTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        RequestError::NoNode(_) => StatusCode::SERVICE_UNAVAILABLE,
        RequestError::OwnerFailed(_) | RequestError::App(_) => StatusCode::BAD_GATEWAY,
        RequestError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
        RequestError::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
        RequestError::ClientTimeout(_) => StatusCode::REQUEST_TIMEOUT,
    };
    let mut r = Response::new(body::full(format!("{err}\n")));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    if let Ok(v) = HeaderValue::from_str(node) {
        r.headers_mut().insert("peerlb-error-from", v);
    }
    // The rest of a broken or stalled request body cannot be skipped: the
    // connection ends with this answer, and says so.
    if matches!(
        err,
        RequestError::ClientBody(_) | RequestError::ClientTimeout(_)
    ) {
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// Rules could not be reloaded; the rules in force stay.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReloadError {
    /// The rules come from the embedded cluster.toml, which cannot change.
    #[error("the rules come from the embedded cluster.toml: nothing to reload")]
    Embedded,
    /// The new rules are invalid (the error names the file and field).
    #[error(transparent)]
    Invalid(crate::config::ConfigError),
}

/// A weight from `PUT /_peerlb/weight` was refused; the weight in force
/// stays.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WeightError {
    /// The body is not a decimal integer (the offending text, at most 64
    /// bytes, is quoted). Send digits only, e.g. `300`.
    #[error("the body must be a decimal integer weight 0..={MAX_WEIGHT}, got {0:?}")]
    NotANumber(String),
    /// The weight is above [`MAX_WEIGHT`], the limit config validation
    /// applies to `[[nodes]] weight` and `--weight`.
    #[error("weight {0} is out of range 0..={MAX_WEIGHT}")]
    OutOfRange(u64),
    /// Weight 0 while every other serving member in this node's view has
    /// weight 0: no node would receive keys (config validation refuses the
    /// same for `[[nodes]]`). Raise another node's weight first.
    #[error(
        "weight 0 refused: every other serving node has weight 0, so no node would receive requests"
    )]
    AllZero,
    /// The request body could not be read (too long: more than 64 bytes,
    /// or the connection failed).
    #[error("reading the body: {0}")]
    Body(String),
}

/// Settings of the request path.
#[derive(Debug, Clone)]
pub(crate) struct IngressSettings {
    /// Longest request-target in bytes.
    pub max_request_target: usize,
    /// Longest wait for an owner's response head.
    pub response_timeout: Duration,
    /// Add `peerlb-served-by`.
    pub header_served_by: bool,
    /// Add `peerlb-entry`.
    pub header_entry: bool,
    /// Where the rules come from, for reloads.
    pub rules_source: Option<crate::config::RulesSource>,
    /// Longest wait for a complete request head, idle keep-alive included.
    pub header_read_timeout: Duration,
    /// Longest wait between two reads of a request body.
    pub body_read_timeout: Duration,
    /// Longest a write to a client may make no progress.
    pub send_timeout: Duration,
}

/// Request counters (monotonic).
#[derive(Debug, Default)]
pub(crate) struct Counters {
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

/// Whether the router's policy reads load figures.
fn router_tracks_load(r: &Router) -> bool {
    use crate::engine::balance::PolicyKind;
    matches!(r.policy(), PolicyKind::LeastLoad | PolicyKind::ByTraffic)
        || r.options().hash_balance_factor.is_some()
}

/// Requests an entry node has outstanding, per node.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    counts: Mutex<std::collections::BTreeMap<NodeId, u32>>,
    /// The policy is by-traffic: a finished request's bytes go to the
    /// router (no other policy reads them, so no other takes its lock).
    records_bytes: bool,
}

impl Tracker {
    /// A tracker for `router`'s policy.
    fn for_router(router: &Router) -> Tracker {
        Tracker {
            records_bytes: router.policy() == crate::engine::balance::PolicyKind::ByTraffic,
            ..Tracker::default()
        }
    }
}

/// Counts one outstanding request to `node` until dropped; then, under
/// by-traffic, records the bytes it moved.
struct Outstanding {
    tracker: Arc<Tracker>,
    router: Arc<Mutex<Router>>,
    node: NodeId,
    bytes: u64,
}

impl Outstanding {
    fn new(
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

/// A response body that keeps its request counted (in flight on this node,
/// and outstanding to its owner) until the body ends, and counts the bytes
/// it carries.
struct TrackedBody {
    inner: Body,
    guard: Option<Outstanding>,
    inflight: Option<Inflight>,
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

/// Wraps `resp`'s body so the guards live until the body ends.
fn track_body(
    resp: Response<Body>,
    guard: Option<Outstanding>,
    inflight: Inflight,
) -> Response<Body> {
    if resp.body().is_end_stream() {
        return resp;
    }
    resp.map(|inner| {
        TrackedBody {
            inner,
            guard,
            inflight: Some(inflight),
        }
        .boxed_unsync()
    })
}

/// The request path of one node, shared by its client and peer servers.
pub(crate) struct Ingress {
    node_id: NodeId,
    view: watch::Receiver<Arc<MembershipView>>,
    router: Arc<Mutex<Router>>,
    /// Requests this entry has outstanding per node, when the policy needs
    /// load figures (least-load, by-traffic, bounded load).
    tracker: Option<Arc<Tracker>>,
    /// Mean time the local app takes to answer, in µs (EWMA, 1/8 weight).
    latency_us: AtomicU64,
    rng: Mutex<SmallRng>,
    links: Arc<PeerLinks>,
    app: App,
    settings: IngressSettings,
    inflight: Arc<AtomicU32>,
    accepting: AtomicBool,
    epoch: tokio::time::Instant,
    /// This node's id as a header value (`peerlb-entry`, `peerlb-served-by`),
    /// made once.
    id_header: Option<HeaderValue>,
    /// Publishes this node's state (`weight`) into gossip.
    publisher: Publisher,
    /// The weight this node publishes (config, or the last `PUT
    /// /_peerlb/weight`).
    weight: AtomicU32,
    /// Request counters.
    pub counters: Counters,
}

/// Counts one request in flight on this node until dropped.
struct Inflight(Arc<AtomicU32>);
impl Drop for Inflight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Largest request head accepted, in bytes (request-target plus header
/// lines): it must fit a peer frame ([`super::wire::MAX_HEAD_LEN`]) with room
/// for the rest of the head.
pub(crate) const MAX_HEAD_BYTES: usize = super::wire::MAX_HEAD_LEN - 4096;

/// Largest body kept for replay on the next candidate (64 KiB), like
/// Envoy's per-request retry buffer.
pub(crate) const REPLAY_LIMIT: u64 = 64 * 1024;

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

/// The request-target as received: path and query in origin form (no
/// copy), the whole URI in absolute form.
fn request_target(uri: &http::Uri) -> std::borrow::Cow<'_, str> {
    match (uri.scheme(), uri.path_and_query()) {
        (None, Some(pq)) => std::borrow::Cow::Borrowed(pq.as_str()),
        _ => std::borrow::Cow::Owned(uri.to_string()),
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
    /// Creates the request path. `seed` seeds request ids and random picks;
    /// `publisher` serves [`Ingress::set_weight`]. The weight this node
    /// publishes starts as its own member's weight in `view`.
    #[allow(clippy::too_many_arguments)] // the node's parts, wired once in node.rs
    pub(crate) fn new(
        node_id: NodeId,
        view: watch::Receiver<Arc<MembershipView>>,
        router: Router,
        links: Arc<PeerLinks>,
        app: App,
        settings: IngressSettings,
        seed: u64,
        publisher: Publisher,
    ) -> Ingress {
        let weight = view.borrow().get(&node_id).map_or(0, |m| m.weight);
        Ingress {
            publisher,
            weight: AtomicU32::new(weight),
            id_header: HeaderValue::from_str(&node_id).ok(),
            node_id,
            view,
            tracker: router_tracks_load(&router).then(|| Arc::new(Tracker::for_router(&router))),
            router: Arc::new(Mutex::new(router)),
            latency_us: AtomicU64::new(0),
            rng: Mutex::new(SmallRng::seed_from_u64(seed)),
            links,
            app,
            settings,
            inflight: Arc::new(AtomicU32::new(0)),
            accepting: AtomicBool::new(true),
            epoch: tokio::time::Instant::now(),
            counters: Counters::default(),
        }
    }

    /// Open QUIC connections to peers (`peer_connections` in the status).
    pub(crate) fn peer_connections(&self) -> usize {
        self.links.connection_count()
    }

    /// Requests in flight on this node (client and proxied).
    pub(crate) fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Reads and compiles the rules again and puts them in force for new
    /// requests. On error the rules in force stay.
    ///
    /// # Errors
    /// [`ReloadError`].
    pub(crate) fn reload_rules(&self) -> Result<usize, ReloadError> {
        let Some(src) = &self.settings.rules_source else {
            return Err(ReloadError::Embedded);
        };
        let rules = src.load().map_err(ReloadError::Invalid)?;
        let n = rules.len();
        self.router.lock().expect("router lock").set_rules(rules);
        info!(rules = n, "data-centric rules reloaded");
        Ok(n)
    }

    /// The weight this node publishes in gossip now.
    pub(crate) fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    /// Publishes `weight` as this node's new weight (gossip key `weight`):
    /// every node, this one included, rebuilds its ring with it once gossip
    /// brings it (about one gossip interval per hop). Not persisted: a
    /// restart publishes the configured weight again. Returns the previous
    /// weight.
    ///
    /// # Errors
    /// [`WeightError::OutOfRange`] above [`MAX_WEIGHT`];
    /// [`WeightError::AllZero`] for 0 when every other serving member in
    /// this node's view has weight 0. The weight in force stays.
    pub(crate) async fn set_weight(&self, weight: u64) -> Result<u32, WeightError> {
        let w = u32::try_from(weight)
            .ok()
            .filter(|w| *w <= MAX_WEIGHT)
            .ok_or(WeightError::OutOfRange(weight))?;
        if w == 0 {
            let view = self.view();
            let others_zero = view
                .members()
                .filter(|m| m.id != self.node_id && view.is_serving(&m.id))
                .all(|m| m.weight == 0);
            if others_zero {
                return Err(WeightError::AllZero);
            }
        }
        let previous = self.weight.swap(w, Ordering::Relaxed);
        self.publisher.set_weight(w).await;
        info!(weight = w, previous, "weight changed: published in gossip");
        Ok(previous)
    }

    /// Counts a request to `node` as outstanding, when the policy needs it.
    fn track(&self, node: &NodeId, request_bytes: u64) -> Option<Outstanding> {
        self.tracker
            .as_ref()
            .map(|t| Outstanding::new(t, &self.router, node.clone(), request_bytes))
    }

    /// Serves with the local app, keeping the mean serve time for the load metric.
    async fn serve_app(
        &self,
        req: Request<Body>,
        ctx: ServeCtx<'_>,
    ) -> Result<Response<Body>, AppError> {
        let start = tokio::time::Instant::now();
        let r = self.app.serve(req, ctx).await;
        let us = start.elapsed().as_micros().min(u128::from(u32::MAX)) as u64;
        let old = self.latency_us.load(Ordering::Relaxed);
        let new = if old == 0 { us } else { (old * 7 + us) / 8 };
        self.latency_us.store(new, Ordering::Relaxed);
        r
    }

    /// Halves the mean serve time: called when a tick passed with no
    /// request served, so an idle node's metric recovers.
    pub(crate) fn decay_latency(&self) {
        let v = self.latency_us.load(Ordering::Relaxed);
        self.latency_us.store(v / 2, Ordering::Relaxed);
    }

    /// Mean time the local app took to answer recently (EWMA), in ms.
    pub(crate) fn app_latency_ms(&self) -> u32 {
        (self.latency_us.load(Ordering::Relaxed) / 1000) as u32
    }

    /// Stops accepting proxied requests (they are refused, retryable):
    /// called when the node closes its listeners on shutdown.
    pub(crate) fn stop_accepting(&self) {
        self.accepting.store(false, Ordering::Relaxed);
    }

    /// This node's id.
    pub(crate) fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The current membership view.
    pub(crate) fn view(&self) -> Arc<MembershipView> {
        self.view.borrow().clone()
    }

    fn enter(&self) -> Inflight {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        Inflight(self.inflight.clone())
    }

    /// Handles one client request end to end; never fails (errors become
    /// statuses).
    pub(crate) async fn handle(
        &self,
        req: Request<Incoming>,
        client: SocketAddr,
    ) -> Response<Body> {
        let mut resp = match self.check(&req) {
            Err(e) => self.failed(e),
            Ok(()) if admin::is_admin(req.uri().path()) => admin::answer(self, req, client).await,
            Ok(()) => {
                let inflight = self.enter();
                self.counters.requests.fetch_add(1, Ordering::Relaxed);
                match self.route_and_serve(req, client).await {
                    Ok((resp, guard)) => track_body(resp, guard, inflight),
                    Err(e) => self.failed(e),
                }
            }
        };
        if self.settings.header_entry
            && let Some(v) = &self.id_header
        {
            resp.headers_mut().insert(ENTRY, v.clone());
        }
        resp
    }

    fn failed(&self, e: RequestError) -> Response<Body> {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        debug!(error = %e, "request failed");
        error_response(&e, &self.node_id)
    }

    /// The entry node's limits, before anything else looks at the request:
    /// request-target length (414), head size (431), one Host (400).
    fn check(&self, req: &Request<Incoming>) -> Result<(), RequestError> {
        let len = target_len(req.uri());
        if len > self.settings.max_request_target {
            return Err(RequestError::UriTooLong {
                len,
                max: self.settings.max_request_target,
            });
        }
        let head: usize = req
            .headers()
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum::<usize>()
            + len;
        if head > MAX_HEAD_BYTES {
            return Err(RequestError::HeadTooLarge {
                len: head,
                max: MAX_HEAD_BYTES,
            });
        }
        if req.method() == http::Method::CONNECT {
            return Err(RequestError::NotImplemented(http::Method::CONNECT));
        }
        let hosts = req.headers().get_all(header::HOST).iter().count();
        if hosts > 1 || (hosts == 0 && req.version() == http::Version::HTTP_11) {
            return Err(RequestError::BadRequest(
                "an HTTP/1.1 request needs exactly one Host header",
            ));
        }
        Ok(())
    }

    async fn route_and_serve(
        &self,
        mut req: Request<Incoming>,
        client: SocketAddr,
    ) -> Result<(Response<Body>, Option<Outstanding>), RequestError> {
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
            let d = match &self.tracker {
                Some(t) => {
                    let counts = t.counts.lock().expect("tracker lock");
                    let local = |id: &str| counts.get(id).copied().unwrap_or(0);
                    router.decide_with_loads(&rv, &view, now, &mut *rng, &local)
                }
                None => router.decide(&rv, &view, now, &mut *rng),
            };
            (d, router.is_sticky(), rng.random::<u128>())
        };
        let route = if sticky_on {
            sticky::route_from_request(req.headers(), req.uri())
        } else {
            None
        };
        // The route parameter is peerlb's own mark: the app never sees it.
        let route_in_url = strip_route_param(req.uri_mut());
        // Per-request spans are debug level: at info, creating and closing
        // one (fields formatted into the registry) costs several percent of
        // a node's CPU per hop (docs/performance.md). Events that matter at
        // info carry the request id themselves.
        let span = debug_span!("request", id = %uuid::Uuid::from_u128(request_id), owner = %decision.owner, reason = decision.reason.as_str());
        let (mut resp, served_by, guard) = self
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
            let v = if served_by == self.node_id {
                self.id_header.clone()
            } else {
                HeaderValue::from_str(&served_by).ok()
            };
            if let Some(v) = v {
                resp.headers_mut().insert(SERVED_BY, v);
            }
        }
        Ok((resp, guard))
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
    ) -> Result<(Response<Body>, NodeId, Option<Outstanding>), RequestError> {
        let (parts, incoming) = req.into_parts();
        let empty_body = incoming.is_end_stream();
        let request_bytes = content_length(&parts.headers).unwrap_or(0);
        // A small body of an idempotent request is kept so the request can
        // be replayed on the next candidate; other bodies stream once.
        let (replay, mut body) = if !empty_body
            && is_idempotent(&parts.method)
            && content_length(&parts.headers).is_some_and(|n| n <= REPLAY_LIMIT)
        {
            let timed = body::from_incoming_with_timeout(incoming, self.settings.body_read_timeout);
            let collected = http_body_util::Limited::new(timed, REPLAY_LIMIT as usize)
                .collect()
                .await
                .map_err(|e| match e.downcast_ref::<body::BodyError>() {
                    Some(b) => RequestError::client_body(b),
                    None => RequestError::ClientBody(e.to_string()),
                })?;
            (Some(collected.to_bytes()), None)
        } else {
            let timed = body::from_incoming_with_timeout(incoming, self.settings.body_read_timeout);
            (None, Some(timed))
        };
        let replayable = empty_body || replay.is_some();
        let mut last_err: Option<RequestError> = None;
        let mut head: Option<bytes::Bytes> = None;
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
                let guard = self.track(cand, request_bytes);
                let resp = self
                    .serve_app(Request::from_parts(parts, b), ctx)
                    .await
                    .map_err(|e| match e.client_body() {
                        Some(b) => RequestError::client_body(b),
                        None => RequestError::App(e),
                    })?;
                return Ok((resp, self.node_id.clone(), guard));
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
            // The head is encoded once, straight from the request parts,
            // and shared by every attempt.
            let h = match &head {
                Some(h) => h.clone(),
                None => {
                    let uri = request_target(&parts.uri);
                    let encoded = wire::encode(&RequestHeadRef {
                        request_id,
                        entry: &self.node_id,
                        hops: 1,
                        view_version,
                        method: parts.method.as_str(),
                        uri: &uri,
                        headers: &parts.headers,
                        client,
                        hash_key: key,
                    });
                    match encoded {
                        Ok(frame) => head.insert(bytes::Bytes::from(frame)).clone(),
                        Err(e) => {
                            // A head too large for the wire: no peer can
                            // take it; the entry itself still may.
                            let err = RequestError::OwnerFailed(format!("peer {cand}: {e}"));
                            if !(replayable && is_idempotent(&parts.method)) {
                                return Err(err);
                            }
                            last_err = Some(err);
                            continue;
                        }
                    }
                }
            };
            let b = match (&replay, empty_body) {
                (Some(bytes), _) => body::full(bytes.clone()),
                (None, true) => body::empty(),
                (None, false) => match body.take() {
                    Some(b) => b,
                    None => break,
                },
            };
            self.counters.forwarded.fetch_add(1, Ordering::Relaxed);
            let guard = self.track(cand, request_bytes);
            match peer::exchange(cand, pair, h, b, self.settings.response_timeout).await {
                Ok((rh, qb)) => {
                    let served = NodeId::from(rh.served_by.as_str());
                    let resp = peer::response_from_head(rh, qb.boxed_unsync());
                    return Ok((resp, served, guard));
                }
                Err(ExchangeError::Timeout(p)) => {
                    return Err(RequestError::Timeout(p.to_string()));
                }
                // The client's body broke before the owner answered: the
                // client's fault, never retried.
                Err(ExchangeError::ClientBody(b)) => {
                    return Err(RequestError::client_body(&b));
                }
                Err(e) => {
                    let retry = replayable
                        && (matches!(e, ExchangeError::Refused(_)) || is_idempotent(&parts.method));
                    warn!(id = %uuid::Uuid::from_u128(request_id), peer = %cand, error = %e, retry, "forward failed after the request was sent");
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
        let inflight = self.enter();
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
        match self.serve_app(req, ctx).await {
            Ok(r) => track_body(r, None, inflight),
            Err(e) => self.failed(RequestError::App(e)),
        }
    }
}

/// Accepts client connections on `listener` until `shutdown` turns true;
/// each connection is watched by `graceful` so in-flight requests finish.
pub(crate) async fn serve(
    mut listener: Box<dyn HttpListener>,
    ingress: Arc<Ingress>,
    mut shutdown: watch::Receiver<bool>,
    graceful: Arc<GracefulShutdown>,
) {
    let local = listener.local_addr().ok();
    let header_timeout = ingress.settings.header_read_timeout;
    let mut last_warn: Option<tokio::time::Instant> = None;
    loop {
        let (stream, client) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors, typically: say so once a
                    // second, not once per try.
                    if last_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                        warn!(error = %e, "accept failed");
                        last_warn = Some(tokio::time::Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
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
            // A forwarded answer still reaches a client that half-closed.
            .half_close(true)
            // Closes connections that send no complete head in time,
            // idle keep-alive connections included (slowloris).
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(header_timeout)
            .serve_connection(
                TokioIo::new(SendTimeout::new(stream, ingress.settings.send_timeout)),
                svc,
            );
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
    if let Some(local) = local {
        debug!(%local, "listener closed");
    }
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
            (RequestError::ClientTimeout("x".into()), 408),
            (RequestError::BadRequest("x"), 400),
            (RequestError::NotImplemented(http::Method::CONNECT), 501),
            (RequestError::HeadTooLarge { len: 9, max: 8 }, 431),
        ] {
            assert_eq!(error_response(&e, "n1").status().as_u16(), s);
        }
    }

    fn tracked(
        policy: crate::engine::balance::PolicyKind,
    ) -> (Arc<Mutex<Router>>, Arc<Tracker>, Outstanding) {
        let router = Arc::new(Mutex::new(Router::new(
            policy,
            crate::engine::rules::Rules::default(),
        )));
        let tracker = Arc::new(Tracker::for_router(&router.lock().unwrap()));
        let g = Outstanding::new(&tracker, &router, NodeId::from("a"), 10);
        (router, tracker, g)
    }

    #[test]
    fn least_load_ends_a_request_without_the_router_lock() {
        let (router, tracker, g) = tracked(crate::engine::balance::PolicyKind::LeastLoad);
        // A decision in progress holds the router lock while the request
        // ends on another thread: the drop must not wait for it.
        let held = router.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            drop(g);
            tx.send(()).unwrap();
        });
        // A deadlock detector: it answers in microseconds unless the drop
        // waits for `held`.
        let done = rx.recv_timeout(std::time::Duration::from_secs(5)).is_ok();
        drop(held);
        t.join().unwrap();
        assert!(done, "the drop waited for the router lock");
        assert_eq!(*tracker.counts.lock().unwrap(), Default::default());
    }

    #[test]
    fn by_traffic_records_a_finished_requests_bytes() {
        let (router, tracker, mut g) = tracked(crate::engine::balance::PolicyKind::ByTraffic);
        g.bytes += 90;
        drop(g);
        assert_eq!(router.lock().unwrap().recorded_bytes("a"), 100);
        assert_eq!(*tracker.counts.lock().unwrap(), Default::default());
    }

    #[test]
    fn idempotent_methods() {
        assert!(is_idempotent(&http::Method::GET));
        assert!(is_idempotent(&http::Method::PUT));
        assert!(!is_idempotent(&http::Method::POST));
        assert!(!is_idempotent(&http::Method::PATCH));
    }
}
