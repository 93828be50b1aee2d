//! The connection pool to a node's upstream app: HTTP/1.1 keep-alive
//! connections over TCP or a Unix domain socket, one request at a time
//! each, kept for reuse once a response body has been read to its end.
//!
//! A leaner path than `hyper_util`'s legacy client (no per-request pool
//! key, connector service, checkout channel or URI rebuilding): idle
//! connections are a LIFO stack (the most recently used, warmest, first),
//! and a connection goes back on it when the response body it carried
//! ends. docs/performance.md gives the effect.
//!
//! Stale connections (the app closed a keep-alive connection while it sat
//! idle here, or right after its last response without saying so):
//!
//! - an idle connection older than the pool's idle time
//!   (`limits.upstream_idle_timeout_ms`, default 2 s: below the 5 s that
//!   uvicorn, Node.js and Apache keep an idle connection) is closed, not
//!   reused;
//! - a request that a reused connection could not even start is retried
//!   once per idle connection, then on a new one: hyper hands such a
//!   request back untouched
//!   ([`hyper::client::conn::http1::SendRequest::try_send_request`]), so
//!   nothing is sent twice;
//! - a request sent on a reused connection that the app closed or reset
//!   before any response head is sent again once, on a new connection,
//!   when the engine's replay rules allow sending it again after it may
//!   have been processed ([`ReplayPlan::after`] with [`Failure::Lost`]: no
//!   body or a small buffered one, and an idempotent method). Anything
//!   else gets the error (a 502). A request without a body is handed back
//!   by hyper itself (`vendor/hyper`'s `keep_sent_head`: kept whole until
//!   its response head is read), so only one with a buffered body is
//!   copied before it is sent.
//!
//! The app's response framing is checked before it goes further: a
//! `Content-Length` beside a `Transfer-Encoding` is removed (RFC 9112
//! section 6.3: the transfer coding decides the length), and a
//! `101 Switching Protocols` is an error unless the request asked for a
//! WebSocket: such a request goes on a connection of its own, which a
//! `101` hands to the tunnel ([`crate::adapters::tunnel`]). The app's
//! informational answers (1xx but 100 and 101) go to the request's
//! [`Informational`] sink as they arrive, when it has one
//! ([`crate::adapters::informational`]).

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, Version, header};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::client::conn::http2;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use crate::adapters::body::{self, Body, BodyError};
pub(crate) use crate::adapters::errors::UpstreamError;
use crate::adapters::informational::{InfoHead, Informational};
use crate::adapters::tunnel::{self, Tunnel};
use crate::config::AppAddr;
use crate::engine::failover::{AfterFailure, BodyPlan, Failure, REPLAY_LIMIT, ReplayPlan};
use crate::engine::header_scan::Scan as _;

/// The tracing target of this module's events: its path before the
/// adapters were put in wings (`crate::adapters::REQUEST_PATH`).
const LOG: &str = "peerlb::adapters::upstream";

/// Longest wait for a connection to the app.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Most idle connections kept; more are closed when their response ends.
const MAX_IDLE: usize = 256;

/// Where the app listens, ready to connect to.
enum Target {
    /// A TCP host (an IP literal or a name) and port.
    Tcp { host: String, port: u16 },
    /// A Unix domain socket.
    Unix(PathBuf),
}

/// A pool of HTTP/1.1 connections to one app, or (`h2c://`) its one
/// HTTP/2 connection.
pub(crate) struct Upstream {
    target: Target,
    authority: HeaderValue,
    idle: Arc<Idle>,
    /// `Some` for an HTTP/2 app: the connection every request shares,
    /// made again once it closed.
    h2: Option<tokio::sync::Mutex<Option<http2::SendRequest<Body>>>>,
}

/// The idle connections, most recently returned last, and how long one
/// may stay idle.
struct Idle {
    conns: Mutex<Vec<(SendRequest<Body>, Instant)>>,
    timeout: Duration,
}

impl Idle {
    /// The most recently returned live connection that has been idle less
    /// than the timeout; older ones are closed (dropped).
    fn take(&self) -> Option<SendRequest<Body>> {
        let now = Instant::now();
        let mut idle = self.conns.lock().expect("upstream pool lock");
        while let Some((sender, since)) = idle.pop() {
            if !sender.is_closed() && now.saturating_duration_since(since) < self.timeout {
                return Some(sender);
            }
        }
        None
    }

    fn put(&self, sender: SendRequest<Body>) {
        if sender.is_closed() || self.timeout.is_zero() {
            return;
        }
        // One clock read for the whole call.
        let now = Instant::now();
        let mut idle = self.conns.lock().expect("upstream pool lock");
        // The oldest are first: close those past the idle time, so a quiet
        // pool does not hold connections the app has given up on.
        let stale = idle
            .iter()
            .take_while(|(s, since)| {
                s.is_closed() || now.saturating_duration_since(*since) >= self.timeout
            })
            .count();
        idle.drain(..stale);
        if idle.len() < MAX_IDLE {
            idle.push((sender, now));
        }
    }
}

/// True when `e`, from a request on a reused connection, says the app
/// closed or reset the connection before any response head: the request
/// may not have been read at all (the app closed the idle connection as it
/// was sent), and was certainly not answered.
fn never_answered(e: &hyper::Error) -> bool {
    if e.is_incomplete_message() || e.is_canceled() || e.is_closed() {
        return true;
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::UnexpectedEof
            );
        }
        cause = c.source();
    }
    false
}

impl Upstream {
    /// A pool for the app at `addr` (`http://host:port` as config
    /// validation leaves it: scheme `http`, a host, a port or 80; or a
    /// Unix socket path) whose idle connections are closed after
    /// `idle_timeout` (zero: never reused). Does no I/O: connections open
    /// on first use.
    pub(crate) fn new(addr: &AppAddr, idle_timeout: Duration) -> Upstream {
        let (target, authority) = match addr {
            AppAddr::Http(base) | AppAddr::H2c(base) => {
                let host = base.host().unwrap_or("127.0.0.1");
                let authority = base
                    .authority()
                    .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
                    .unwrap_or_else(|| HeaderValue::from_static("localhost"));
                let target = Target::Tcp {
                    // `[::1]` in a URI is `::1` to connect to.
                    host: host
                        .trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_owned(),
                    port: base.port_u16().unwrap_or(80),
                };
                (target, authority)
            }
            // A socket has no authority: `localhost`, as nginx and curl
            // send to one.
            AppAddr::Unix(path) => (
                Target::Unix(path.clone()),
                HeaderValue::from_static("localhost"),
            ),
        };
        Upstream {
            target,
            authority,
            idle: Arc::new(Idle {
                conns: Mutex::default(),
                timeout: idle_timeout,
            }),
            h2: matches!(addr, AppAddr::H2c(_)).then(tokio::sync::Mutex::default),
        }
    }

    /// Sends `req` to an HTTP/2 app on the shared connection: the
    /// client's `Host` (or the app's authority) as `:authority`, scheme
    /// `http`; trailers both ways as HTTP/2 carries them. No resend: a
    /// request the app refused with `REFUSED_STREAM` is still a 502.
    async fn send_h2(
        &self,
        mut parts: http::request::Parts,
        body: Body,
    ) -> Result<Response<Body>, UpstreamError> {
        let mut sender = self.h2_sender().await?;
        let host = parts
            .headers
            .remove(header::HOST)
            .unwrap_or_else(|| self.authority.clone());
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        parts.uri = host
            .to_str()
            .ok()
            .and_then(|h| format!("http://{h}{path}").parse().ok())
            .or_else(|| {
                format!(
                    "http://{}{path}",
                    self.authority.to_str().unwrap_or("localhost")
                )
                .parse()
                .ok()
            })
            .unwrap_or_default();
        parts.version = Version::HTTP_2;
        sender.ready().await?;
        let resp = sender
            .send_request(Request::from_parts(parts, body))
            .await?;
        let (parts, body) = resp.into_parts();
        Ok(Response::from_parts(
            parts,
            body.map_err(BodyError::Upstream).boxed_unsync(),
        ))
    }

    /// The shared HTTP/2 connection, made when there is none or it closed.
    async fn h2_sender(&self) -> Result<http2::SendRequest<Body>, UpstreamError> {
        let mut slot = self.h2.as_ref().expect("an HTTP/2 app").lock().await;
        if let Some(s) = slot.as_ref().filter(|s| !s.is_closed()) {
            return Ok(s.clone());
        }
        let Target::Tcp { host, port } = &self.target else {
            unreachable!("h2c:// apps are TCP");
        };
        let connecting = async {
            let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
                .await
                .map_err(UpstreamError::Connect)?;
            let _ = stream.set_nodelay(true);
            let (sender, conn) = http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .timer(hyper_util::rt::TokioTimer::new())
                .handshake(TokioIo::new(stream))
                .await?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(target: LOG, error = %e, "upstream HTTP/2 app connection ended with an error");
                }
            });
            Ok::<_, UpstreamError>(sender)
        };
        let sender = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
            .await
            .map_err(|_| UpstreamError::ConnectTimeout(CONNECT_TIMEOUT))??;
        *slot = Some(sender.clone());
        Ok(sender)
    }

    /// Sends `req` (origin-form target, the client's headers) to the app and
    /// returns its response, whose body streams from the app; the
    /// connection is reused once that body has been read to its end. Adds
    /// a `Host` header (the app's authority) when the request has none,
    /// and always speaks HTTP/1.1 to the app. A request the app never
    /// answered on a reused connection is sent again as the module doc
    /// says. A response with both `Content-Length` and `Transfer-Encoding`
    /// loses its `Content-Length`.
    ///
    /// # Errors
    /// [`UpstreamError`] when no connection could be made, the app failed
    /// or closed the connection before a response head, answered 101, or
    /// the request body kept for a resend failed.
    pub(crate) async fn send(&self, req: Request<Body>) -> Result<Response<Body>, UpstreamError> {
        let (mut parts, body) = req.into_parts();
        parts.version = Version::HTTP_11;
        if !parts.headers.has(&header::HOST) {
            parts.headers.insert(header::HOST, self.authority.clone());
        }
        // The rare paths' futures (HTTP/2, a WebSocket, a body kept for a
        // resend, a new connection) are boxed: awaited inline they would
        // make this future, moved on every request, as large as all of
        // them (rustc lays an awaited future out inside its awaiter).
        if self.h2.is_some() {
            return Box::pin(self.send_h2(parts, body)).await;
        }
        if tunnel::wants_websocket(&parts.method, parts.version, &parts.headers) {
            return Box::pin(self.send_upgrade(Request::from_parts(parts, body))).await;
        }
        // The app's 1xx answers go on to whoever asked for them
        // (`informational`): the callback travels in the request's
        // extensions. It is the one extension hyper's client reads, so the
        // request is sent with it alone: the others (the app's
        // `RequestInfo`, the client connection's marks) are dropped here,
        // and the head kept for a resend copies nothing it does not send.
        // The kept head has no extension map at all (a clone of one is an
        // allocation); each attempt gets the callback in the request's own
        // map, emptied (`with_sink`).
        let mut extensions = std::mem::take(&mut parts.extensions);
        let sink = extensions.remove::<Informational>();
        extensions.clear();
        let mut spare = Some(extensions);
        // The engine's replay rules: may the request be sent again after
        // the app may have read it, and how is its body kept?
        let plan = ReplayPlan::new(
            &parts.method,
            body.is_end_stream(),
            parts
                .headers
                .first(&header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse().ok()),
        );
        let resendable = plan.after(Failure::Lost) == AfterFailure::NextCandidate;
        // The head and body kept for a resend, and the first attempt. A
        // copy of the head is made only for a request that may be resent
        // and has a body: a body-less one comes back from hyper itself
        // when the connection ends before any response (`handshake`).
        let (kept, first) = match plan.body() {
            BodyPlan::Buffer if resendable => {
                let kept = (parts, Box::pin(buffer(body)).await?);
                let first = rebuild(&kept);
                (Some(kept), first)
            }
            _ => (None, Request::from_parts(parts, body)),
        };
        let with_sink = |mut req: Request<Body>, spare: &mut Option<http::Extensions>| {
            if let Some(sink) = sink.clone() {
                if let Some(map) = spare.take() {
                    *req.extensions_mut() = map;
                }
                hyper::ext::on_informational(&mut req, move |res| {
                    sink.send(InfoHead::new(res.status(), res.headers()));
                });
            }
            req
        };
        let mut req = with_sink(first, &mut spare);
        let mut resent = false;
        loop {
            let (mut sender, reused) = match (resent, self.idle.take()) {
                (false, Some(s)) => (s, true),
                _ => (Box::pin(self.connect()).await?, false),
            };
            if let Err(e) = sender.ready().await {
                if reused {
                    continue;
                }
                return Err(e.into());
            }
            match sender.try_send_request(req).await {
                Ok(resp) => return self.response(resp, sender),
                Err(mut e) => match (e.take_message(), &kept) {
                    // Never started on a connection the app had closed
                    // (hyper's cancellation): try the next one.
                    (Some(r), _) if reused && e.error().is_canceled() => req = r,
                    // A body-less request, sent, handed back by hyper: the
                    // connection ended before any response.
                    (Some(r), _) if reused && resendable && never_answered(e.error()) => {
                        tracing::debug!(target: LOG, error = %e.error(), "upstream app closed a reused connection without answering: sending the request again on a new one");
                        resent = true;
                        req = with_sink(r, &mut spare);
                    }
                    (None, Some(k)) if reused && never_answered(e.error()) => {
                        tracing::debug!(target: LOG, error = %e.error(), "upstream app closed a reused connection without answering: sending the request again on a new one");
                        resent = true;
                        req = with_sink(rebuild(k), &mut spare);
                    }
                    _ => return Err(e.into_error().into()),
                },
            }
        }
    }

    /// The app's response, its framing checked, with a body that puts
    /// `sender`'s connection back in the pool once read to its end.
    fn response(
        &self,
        resp: Response<Incoming>,
        sender: SendRequest<Body>,
    ) -> Result<Response<Body>, UpstreamError> {
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            // The connection now speaks something else: dropped with
            // `sender`, never pooled.
            return Err(UpstreamError::SwitchingProtocols);
        }
        let (mut parts, body) = resp.into_parts();
        if parts.headers.has(&header::TRANSFER_ENCODING) {
            parts.headers.remove(header::CONTENT_LENGTH);
        }
        let body = Pooled {
            body,
            ended: false,
            sender: Some(sender),
            idle: Arc::clone(&self.idle),
        };
        Ok(Response::from_parts(
            parts,
            body.map_err(BodyError::Upstream).boxed_unsync(),
        ))
    }

    /// Sends a WebSocket request on a new connection of its own (never
    /// pooled: it becomes the tunnel's app side). A `101` answer carries
    /// the connection being upgraded as a [`Tunnel`] in its extensions,
    /// with an empty body; any other answer is returned as the app sent
    /// it.
    async fn send_upgrade(&self, req: Request<Body>) -> Result<Response<Body>, UpstreamError> {
        let mut sender = self.connect_for(true).await?;
        sender.ready().await?;
        let mut resp = sender.send_request(req).await?;
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            let on = hyper::upgrade::on(&mut resp);
            let (mut parts, _) = resp.into_parts();
            parts.extensions.insert(Tunnel::hyper(on));
            return Ok(Response::from_parts(parts, body::empty()));
        }
        let (mut parts, body) = resp.into_parts();
        if parts.headers.has(&header::TRANSFER_ENCODING) {
            parts.headers.remove(header::CONTENT_LENGTH);
        }
        Ok(Response::from_parts(
            parts,
            body.map_err(BodyError::Upstream).boxed_unsync(),
        ))
    }

    async fn connect(&self) -> Result<SendRequest<Body>, UpstreamError> {
        self.connect_for(false).await
    }

    /// A new connection; `upgrades`: one that may be upgraded (a
    /// WebSocket's).
    async fn connect_for(&self, upgrades: bool) -> Result<SendRequest<Body>, UpstreamError> {
        let connecting = async {
            match &self.target {
                Target::Tcp { host, port } => {
                    let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
                        .await
                        .map_err(UpstreamError::Connect)?;
                    let _ = stream.set_nodelay(true);
                    handshake(stream, upgrades).await
                }
                Target::Unix(path) => {
                    let stream = tokio::net::UnixStream::connect(path)
                        .await
                        .map_err(UpstreamError::Connect)?;
                    handshake(stream, upgrades).await
                }
            }
        };
        tokio::time::timeout(CONNECT_TIMEOUT, connecting)
            .await
            .map_err(|_| UpstreamError::ConnectTimeout(CONNECT_TIMEOUT))?
    }
}

/// Sets up HTTP/1.1 on a new connection and spawns its driver (one that
/// hands the connection over on a `101` when `upgrades`).
async fn handshake<S>(stream: S, upgrades: bool) -> Result<SendRequest<Body>, UpstreamError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // A body-less request is handed back by hyper when the connection
    // ends before its response (`vendor/hyper`'s `keep_sent_head`), so the
    // pool keeps no copy of it for a resend.
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .keep_sent_head(true)
        .handshake(TokioIo::new(AfterWriteFailure::new(stream)))
        .await?;
    tokio::spawn(async move {
        let r = if upgrades {
            conn.with_upgrades().await
        } else {
            conn.await
        };
        if let Err(e) = r {
            tracing::debug!(target: LOG, error = %e, "upstream app connection ended with an error");
        }
    });
    Ok(sender)
}

/// An app connection that, once a write failed (the app closed or reset
/// it under a request body: an early `413`), takes and discards every
/// later write, so hyper keeps reading and an answer the app sent before
/// it closed reaches the client instead of a 502 for the failed upload
/// (RFC 9112 section 9.5: a client sending a body watches for an answer).
/// With no answer there, the read fails as the write did: a 502 still.
struct AfterWriteFailure<S> {
    io: S,
    failed: bool,
}

impl<S> AfterWriteFailure<S> {
    fn new(io: S) -> Self {
        AfterWriteFailure { io, failed: false }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for AfterWriteFailure<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for AfterWriteFailure<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.failed {
            return Poll::Ready(Ok(buf.len()));
        }
        match std::task::ready!(Pin::new(&mut self.io).poll_write(cx, buf)) {
            Ok(n) => Poll::Ready(Ok(n)),
            Err(e) => {
                tracing::debug!(target: LOG, error = %e, "upstream app closed its connection under the request: reading its answer");
                self.failed = true;
                Poll::Ready(Ok(buf.len()))
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.failed {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.failed {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A request from a kept head and body.
fn rebuild((parts, body): &(http::request::Parts, Bytes)) -> Request<Body> {
    let body = if body.is_empty() {
        body::empty()
    } else {
        body::full(body.clone())
    };
    Request::from_parts(parts.clone(), body)
}

/// Reads a request body the replay plan keeps (at most [`REPLAY_LIMIT`]
/// bytes: its `Content-Length` said so).
async fn buffer(body: Body) -> Result<Bytes, UpstreamError> {
    let limited = http_body_util::Limited::new(body, REPLAY_LIMIT as usize);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => Err(match e.downcast::<BodyError>() {
            Ok(b) => UpstreamError::RequestBody(*b),
            Err(_) => UpstreamError::RequestBodyTooLong,
        }),
    }
}

/// A response body from the app that puts its connection back in the pool
/// when it has been read to its end (and closes it when dropped earlier).
struct Pooled {
    body: Incoming,
    ended: bool,
    sender: Option<SendRequest<Body>>,
    idle: Arc<Idle>,
}

impl HttpBody for Pooled {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let r = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None) = r {
            self.ended = true;
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if (self.ended || self.body.is_end_stream())
            && let Some(sender) = self.sender.take()
        {
            self.idle.put(sender);
        }
    }
}

#[cfg(test)]
mod tests;
