//! The app a node serves requests with: the built-in demo app or an upstream
//! HTTP application behind a connection pool.
//!
//! Built-in demo app endpoints:
//!
//! | path | answer |
//! | --- | --- |
//! | `/session` | starts a session: sets the cookie `session=<node>-<n>` |
//! | `/bytes/<n>` | streams a body of `n` bytes (at most 1 GiB), in 64 KiB chunks |
//! | `/echo` | streams the request body back |
//! | `/delay/<ms>` | waits `ms` milliseconds (at most 60000), then answers like any other path |
//! | `/ws/echo` | a WebSocket (RFC 6455) that echoes every text and binary message; the text message `close` makes the app close it (code 1000); 426 to a request that is not a WebSocket opening |
//! | anything else | JSON: `node`, `entry`, `proxied`, `method`, `path`, `key`, `client`, `request_id` (the `X-Request-Id` it received), `peerlb_headers` (the `peerlb-*` header names the app received: always empty) |
//!
//! Case code (H4) names a case of `docs/cases.md`: the input, the
//! value peerlb must give, and where it is tested.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::adapters::body::{self, Body, BodyError};
pub(crate) use crate::adapters::errors::AppError;
use crate::adapters::serve::upstream::Upstream;
use crate::adapters::tunnel::{self, Tunnel};

pub(crate) mod handle;
pub(crate) mod service;
mod websocket;
use crate::config::AppKind;
use crate::engine::header_scan::Scan as _;
use crate::engine::node_id::NodeId;
use crate::seam::{NoObserver, NodeEvent, Observer};
use bytes::Bytes;
use handle::Handle;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
pub use service::RequestInfo;
use service::{AppFuture, Call, ErasedApp, TlsInfo};

/// The tracing target of this module's events: its path before the
/// adapters were put in wings (`crate::adapters::REQUEST_PATH`).
const LOG: &str = "peerlb::adapters::app";

/// Largest body `/bytes/<n>` streams (1 GiB).
pub(crate) const MAX_BYTES_BODY: u64 = 1 << 30;

/// Longest wait `/delay/<ms>` accepts, in milliseconds.
pub(crate) const MAX_DELAY_MS: u64 = 60_000;

/// What the app is told about a request besides the request itself (the
/// borrowed form the request path has; [`App::serve`] hands it to the
/// app, an embedded one as the [`RequestInfo`] extension).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServeCtx<'a> {
    /// The node serving it.
    pub node: &'a NodeId,
    /// The node that received it from the client.
    pub entry: &'a NodeId,
    /// The hash key it was routed on.
    pub key: Option<&'a str>,
    /// The client address the entry saw.
    pub client: SocketAddr,
    /// The client connection's TLS facts (`None`: cleartext HTTP).
    pub tls: Option<&'a crate::adapters::wire::TlsFacts>,
    /// The client connection's forwarded header values, made once per
    /// connection (`ConnInfo::forwarded`); `None` across the hop (the
    /// owner makes them per request).
    pub forwarded: Option<&'a [HeaderValue; 2]>,
}

impl ServeCtx<'_> {
    /// The request extension an embedded app reads (the node's own apps
    /// read the context itself: [`Call::call`]).
    fn info(&self, handle: &Handle) -> RequestInfo {
        RequestInfo {
            node: self.node.clone(),
            entry: self.entry.clone(),
            key: self.key.map(Into::into),
            client: self.client,
            tls: self.tls.map(|t| TlsInfo {
                sni: t.sni.as_deref().map(Into::into),
                version: t.version_name(),
            }),
            handle: handle.clone(),
        }
    }
}

/// The local app of a node: a `tower::Service` erased (the built-in demo
/// app, an upstream app, or an embedded one: one path for all), the node's
/// handle each request's [`RequestInfo`] carries, and the observer told of
/// every request served.
pub(crate) struct App {
    service: ErasedApp,
    handle: Handle,
    /// Told of every request served (see [`App::with_observer`]).
    observer: Arc<dyn Observer>,
    /// False only for the built-in app, which never sends a 1xx: the owner
    /// then makes no 1xx channel for a proxied request
    /// ([`App::may_send_informational`]).
    informational: bool,
}

impl App {
    /// The app `kind` names (does no I/O: the pool connects lazily), with
    /// `slowdown` shared with the built-in app (see [`BuiltinApp::new`]).
    pub(crate) fn new(kind: &AppKind, slowdown: Arc<AtomicU32>, handle: Handle) -> App {
        match kind {
            AppKind::Builtin => App {
                informational: false,
                ..App::erased(ErasedApp::direct(BuiltinApp::new(slowdown)), handle)
            },
            AppKind::Upstream(up) => App::erased(
                ErasedApp::direct(UpstreamApp {
                    base: up.addr.to_string().into(),
                    pool: Arc::new(Upstream::new(&up.addr, up.idle_timeout)),
                }),
                handle,
            ),
        }
    }

    /// The app that serves with an erased service.
    pub(crate) fn erased(service: ErasedApp, handle: Handle) -> App {
        App {
            service,
            handle,
            observer: Arc::new(NoObserver),
            informational: true,
        }
    }

    /// Whether this app may answer with a 1xx before its final response
    /// (an upstream app relays its server's; an embedded one may send its
    /// own); false for the built-in app.
    pub(crate) fn may_send_informational(&self) -> bool {
        self.informational
    }

    /// Reports every request this app serves to `observer`
    /// ([`NodeEvent::Served`]; [`App::new`] reports to no one).
    #[must_use]
    pub(crate) fn with_observer(mut self, to: Arc<dyn Observer>) -> App {
        self.observer = to;
        self
    }

    /// Serves one request. `req`'s URI is the request-target as received
    /// (path and query); `ctx` reaches an embedded service as the
    /// request's [`RequestInfo`] extension, the node's own apps as it is.
    ///
    /// # Errors
    /// [`AppError`] when the service fails (an upstream app that cannot
    /// be reached); the built-in app never fails.
    pub(crate) async fn serve(
        &self,
        req: Request<Body>,
        ctx: ServeCtx<'_>,
    ) -> Result<Response<Body>, AppError> {
        // One event per request the app serves: the simulation counts them
        // to prove no request is served twice.
        tracing::debug!(target: LOG, uri = %req.uri(), "app serving");
        self.observer.observe(&NodeEvent::Served {
            entry: ctx.entry,
            key: ctx.key,
            path_and_query: req.uri().path_and_query().map_or("/", |p| p.as_str()),
        });
        self.service.call(req, &ctx, &self.handle).await
    }
}

/// The built-in demo app (the module doc lists its endpoints).
pub(crate) struct BuiltinApp {
    /// Sessions started so far, for session ids.
    sessions: Arc<AtomicU64>,
    /// `/delay/<ms>` waits this many times `ms`: 1 in production; a
    /// simulation's slow-node fault raises it.
    slowdown: Arc<AtomicU32>,
}

impl BuiltinApp {
    /// The built-in app, sharing `slowdown` (its `/delay/<ms>` work then
    /// takes `slowdown` times `ms`: the simulation's slow-node fault;
    /// [`crate::Env`] hands in 1).
    pub(crate) fn new(slowdown: Arc<AtomicU32>) -> BuiltinApp {
        BuiltinApp {
            sessions: Arc::new(AtomicU64::new(0)),
            slowdown,
        }
    }
}

impl Call for BuiltinApp {
    fn call(&self, req: Request<Body>, ctx: &ServeCtx<'_>, handle: &Handle) -> AppFuture {
        let Some(ms) = req.uri().path().strip_prefix("/delay/") else {
            let told = Told::from(ctx);
            return AppFuture::Ready(Some(Ok(builtin(req, &told, &self.sessions))));
        };
        match ms.parse::<u64>() {
            Ok(ms) if ms <= MAX_DELAY_MS => {
                let factor = u64::from(self.slowdown.load(Ordering::Relaxed).max(1));
                let sessions = self.sessions.clone();
                // Kept owned across the wait.
                let info = ctx.info(handle);
                AppFuture::Boxed(Box::pin(async move {
                    tokio::time::sleep(Duration::from_millis(ms * factor)).await;
                    Ok(builtin(req, &Told::from(&info), &sessions))
                }))
            }
            _ => AppFuture::Ready(Some(Ok(text(
                StatusCode::BAD_REQUEST,
                "want /delay/<ms> with ms <= 60000\n",
            )))),
        }
    }
}

/// An upstream application behind its connection pool.
pub(crate) struct UpstreamApp {
    /// Where the app listens (`http://host:port` or `unix:/path`), as
    /// errors name it.
    base: Arc<str>,
    /// Its connection pool.
    pool: Arc<Upstream>,
}

impl Call for UpstreamApp {
    fn call(&self, req: Request<Body>, ctx: &ServeCtx<'_>, _: &Handle) -> AppFuture {
        let (base, pool) = (self.base.clone(), self.pool.clone());
        let client = Client {
            addr: ctx.client,
            https: ctx.tls.is_some(),
            forwarded: ctx.forwarded.cloned(),
        };
        AppFuture::Boxed(Box::pin(async move {
            upstream(&base, &pool, req, client).await
        }))
    }
}

/// What the upstream app's request says of the client (the forwarding
/// headers): its address, its scheme, the entry connection's own
/// forwarded values when it was served at its entry
/// ([`ServeCtx::forwarded`]).
struct Client {
    addr: SocketAddr,
    https: bool,
    forwarded: Option<[HeaderValue; 2]>,
}

/// What the built-in app's answer names, borrowed from the request path's
/// [`ServeCtx`], or from the [`RequestInfo`] a `/delay/<ms>` keeps across
/// its wait.
struct Told<'a> {
    node: &'a str,
    entry: &'a str,
    key: Option<&'a str>,
    client: SocketAddr,
    sni: Option<&'a str>,
    tls_version: Option<&'static str>,
}

impl<'a> From<&'a ServeCtx<'a>> for Told<'a> {
    fn from(c: &'a ServeCtx<'a>) -> Told<'a> {
        Told {
            node: c.node.as_str(),
            entry: c.entry.as_str(),
            key: c.key,
            client: c.client,
            sni: c.tls.and_then(|t| t.sni.as_deref()),
            tls_version: c.tls.map(|t| t.version_name()),
        }
    }
}

impl<'a> From<&'a RequestInfo> for Told<'a> {
    fn from(i: &'a RequestInfo) -> Told<'a> {
        Told {
            node: i.node.as_str(),
            entry: i.entry.as_str(),
            key: i.key(),
            client: i.client,
            sni: i.sni(),
            tls_version: i.tls_version(),
        }
    }
}

/// Where `peerlb app` listens: a TCP listener or a Unix domain socket.
pub enum AppListener {
    /// TCP (`--listen 127.0.0.1:9001`).
    Tcp(tokio::net::TcpListener),
    /// A Unix domain socket (`--listen unix:/path.sock`).
    Unix(tokio::net::UnixListener),
}

/// Serves the built-in demo app alone over plain HTTP/1.1 on `listener`
/// (keep-alive, `TCP_NODELAY` over TCP), with no cluster, gossip or peer
/// link: `peerlb app`, the backend of the side-by-side benchmark (bench/)
/// and the tests' app on a Unix socket. Every request is answered as if
/// node `name` were both entry and owner; a client on a Unix socket is
/// reported as `0.0.0.0:0` (it has no IP address). Runs until the listener
/// fails for good; a failed accept is logged and retried.
pub async fn serve_standalone(listener: AppListener, name: String) {
    use tracing::warn;

    let name = NodeId::from(name);
    let app = Arc::new(App::new(
        &AppKind::Builtin,
        Arc::new(AtomicU32::new(1)),
        Handle::alone(name.clone()),
    ));
    loop {
        let accepted = match &listener {
            AppListener::Tcp(l) => l.accept().await.map(|(stream, client)| {
                let _ = stream.set_nodelay(true);
                spawn_standalone(stream, client, app.clone(), name.clone());
            }),
            AppListener::Unix(l) => l.accept().await.map(|(stream, _)| {
                let client = SocketAddr::from(([0, 0, 0, 0], 0));
                spawn_standalone(stream, client, app.clone(), name.clone());
            }),
        };
        if let Err(e) = accepted {
            warn!(target: LOG, error = %e, "accept failed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Serves one connection of [`serve_standalone`].
fn spawn_standalone<S>(stream: S, client: SocketAddr, app: Arc<App>, name: NodeId)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;

    let svc = service_fn(move |mut req: Request<hyper::body::Incoming>| {
        let (app, name) = (app.clone(), name.clone());
        let upgrade = tunnel::wants_websocket(req.method(), req.version(), req.headers())
            .then(|| hyper::upgrade::on(&mut req));
        async move {
            let ctx = ServeCtx {
                node: &name,
                entry: &name,
                key: None,
                client,
                tls: None,
                forwarded: None,
            };
            let mut resp = app
                .serve(req.map(body::from_incoming), ctx)
                .await
                .unwrap_or_else(|e| text_owned(StatusCode::BAD_GATEWAY, e.to_string()));
            // The echo's 101: its tunnel is relayed to the client's
            // connection once hyper hands that over.
            if let (Some(on), Some(t)) = (upgrade, resp.extensions_mut().remove::<Tunnel>()) {
                tokio::spawn(async move {
                    if let (Ok(client), Ok(mut app)) = (on.await, t.open().await) {
                        let mut client = TokioIo::new(client);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut app).await;
                    }
                });
            }
            Ok::<_, std::convert::Infallible>(resp)
        }
    });
    tokio::spawn(async move {
        if let Err(e) = hyper::server::conn::http1::Builder::new()
            .keep_alive(true)
            .serve_connection(TokioIo::new(stream), svc)
            .with_upgrades()
            .await
        {
            tracing::debug!(target: LOG, error = %e, %client, "app connection ended with an error");
        }
    });
}

fn text_owned(status: StatusCode, msg: String) -> Response<Body> {
    let mut r = Response::new(body::full(msg));
    *r.status_mut() = status;
    r
}

fn builtin(req: Request<Body>, ctx: &Told<'_>, sessions: &AtomicU64) -> Response<Body> {
    let path = req.uri().path();
    if path == websocket::PATH {
        return websocket::answer(&req);
    }
    if let Some(n) = path.strip_prefix("/bytes/") {
        return match n.parse::<u64>() {
            Ok(n) if n <= MAX_BYTES_BODY => bytes_response(n),
            _ => text(
                StatusCode::BAD_REQUEST,
                "want /bytes/<n> with n <= 1073741824\n",
            ),
        };
    }
    if path == "/echo" {
        let len = req.headers().get(header::CONTENT_LENGTH).cloned();
        let mut resp = Response::new(req.into_body());
        if let Some(len) = len {
            resp.headers_mut().insert(header::CONTENT_LENGTH, len);
        }
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        return resp;
    }
    let mut info = serde_json::json!({
        "node": ctx.node,
        "entry": ctx.entry,
        "proxied": ctx.node != ctx.entry,
        "method": req.method().as_str(),
        "path": path,
        "key": ctx.key,
        "client": ctx.client.to_string(),
        // The request id the entry gave the request (`access.rs`).
        "request_id": req
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok()),
        "proto": if ctx.tls_version.is_some() { "https" } else { "http" },
        "sni": ctx.sni,
        "tls_version": ctx.tls_version,
        // Marks the node uses itself; a client must never be able to set them (H4).
        "peerlb_headers": req
            .headers()
            .keys()
            .filter(|k| k.as_str().starts_with("peerlb-"))
            .map(|k| k.as_str())
            .collect::<Vec<_>>(),
    });
    let mut resp = Response::builder().header(header::CONTENT_TYPE, "application/json");
    if path == "/session" {
        let id = format!(
            "{}-{}",
            ctx.node,
            sessions.fetch_add(1, Ordering::Relaxed) + 1
        );
        resp = resp.header(header::SET_COOKIE, format!("session={id}; Path=/"));
        info["session"] = id.into();
    }
    let mut text = info.to_string();
    text.push('\n');
    resp.body(body::full(text))
        .expect("static response parts are valid")
}

fn text(status: StatusCode, msg: &'static str) -> Response<Body> {
    let mut r = Response::new(body::full(Bytes::from_static(msg.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

/// Chunk size of `/bytes/<n>` bodies.
const CHUNK: usize = 64 * 1024;

/// The `/bytes/<n>` pattern: byte `i` of every chunk is `i % 251`. Built
/// at compile time, so a response costs no allocation or fill.
static PATTERN: [u8; CHUNK] = {
    let mut a = [0u8; CHUNK];
    let mut i = 0;
    while i < CHUNK {
        a[i] = (i % 251) as u8;
        i += 1;
    }
    a
};

/// `n` bytes of a repeating pattern, streamed in 64 KiB chunks.
fn bytes_response(n: u64) -> Response<Body> {
    let pattern = Bytes::from_static(&PATTERN);
    let mut left = n;
    let stream = std::iter::from_fn(move || {
        if left == 0 {
            return None;
        }
        let take = left.min(CHUNK as u64) as usize;
        left -= take as u64;
        Some(Ok::<_, BodyError>(http_body::Frame::data(
            pattern.slice(..take),
        )))
    });
    let body = http_body_util::StreamBody::new(IterStream(stream));
    let mut r = Response::new(body.boxed_unsync());
    r.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    r
}

/// An iterator as a (always ready) stream, so a generated body is polled
/// lazily chunk by chunk instead of being built whole.
struct IterStream<I>(I);

impl<I: Iterator + Unpin> futures_core::Stream for IterStream<I> {
    type Item = I::Item;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<I::Item>> {
        std::task::Poll::Ready(self.0.next())
    }
}

/// The fixed hop-by-hop fields. `Trailer` is not one (RFC 9110 section
/// 6.6.2: it names the trailer fields end to end, and hyper writes an
/// HTTP/1.1 message's trailers only when it names them); `TE` is, and
/// `te: trailers` is sent on when the client asked ([`takes_trailers`]).
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "upgrade",
];

/// True when the request's `TE` field lists `trailers` (RFC 9110 section
/// 10.1.4: the client accepts trailer fields), or when it came over
/// HTTP/2 (where trailers always may come).
pub(crate) fn takes_trailers(version: http::Version, h: &http::HeaderMap) -> bool {
    version == http::Version::HTTP_2
        || h.all_of(&header::TE).any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',').any(|t| {
                    t.split(';')
                        .next()
                        .is_some_and(|t| t.trim().eq_ignore_ascii_case("trailers"))
                })
            })
        })
}

/// Removes the hop-by-hop headers (RFC 9110 7.6.1): the fixed list and
/// every header the `Connection` header names. One pass over the (usually
/// few) names first: when none is hop-by-hop (`Connection` included),
/// there is nothing to look up.
fn strip_hop_by_hop(h: &mut http::HeaderMap) {
    if !h.keys().any(|k| HOP_BY_HOP.contains(&k.as_str())) {
        return;
    }
    let named: Vec<String> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .collect();
    for n in named {
        h.remove(n.as_str());
    }
    for n in HOP_BY_HOP {
        h.remove(n);
    }
}

async fn upstream(
    base: &str,
    pool: &Upstream,
    req: Request<Body>,
    client: Client,
) -> Result<Response<Body>, AppError> {
    let (mut parts, body) = req.into_parts();
    let Client {
        addr: client,
        https,
        forwarded: made,
    } = client;
    // Origin-form: the pool's connection already names the app.
    if parts.uri.scheme().is_some() || parts.uri.authority().is_some() {
        parts.uri = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"))
            .into();
    }
    // A WebSocket opening keeps its upgrade (the only hop-by-hop fields
    // that reach the app): the app's 101 becomes a tunnel.
    let websocket =
        crate::adapters::tunnel::wants_websocket(&parts.method, parts.version, &parts.headers)
            .then(|| parts.headers.get(header::UPGRADE).cloned())
            .flatten();
    // `TE: trailers` is said again to the app: peerlb relays trailers.
    let trailers = takes_trailers(http::Version::HTTP_11, &parts.headers);
    strip_hop_by_hop(&mut parts.headers);
    if let Some(upgrade) = websocket {
        set_upgrade(&mut parts.headers, upgrade);
    }
    if trailers {
        parts
            .headers
            .insert(header::TE, HeaderValue::from_static("trailers"));
    }
    // One combined line, the client's own address last.
    crate::adapters::serve::forwarded::set_all(
        &mut parts.headers,
        client.ip(),
        https,
        made.as_ref(),
    );
    let resp = pool
        .send(Request::from_parts(parts, body))
        .await
        .map_err(|source| AppError {
            uri: base.to_owned(),
            source,
        })?;
    let (mut parts, body) = resp.into_parts();
    let upgrade = (parts.status == StatusCode::SWITCHING_PROTOCOLS)
        .then(|| parts.headers.get(header::UPGRADE).cloned())
        .flatten();
    strip_hop_by_hop(&mut parts.headers);
    if let Some(upgrade) = upgrade {
        set_upgrade(&mut parts.headers, upgrade);
    }
    Ok(Response::from_parts(parts, body))
}

/// Puts back `Connection: Upgrade` and `upgrade` as the `Upgrade` field.
fn set_upgrade(h: &mut http::HeaderMap, upgrade: HeaderValue) {
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, upgrade);
}

#[cfg(test)]
mod tests;
