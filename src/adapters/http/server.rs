//! The client server: the accept loop, which hands each accepted socket
//! to its own task, where `conn::open` reads the PROXY header and makes
//! the TLS handshake the listener asks for; then [`serve_connection`]
//! serves the resulting stream with the connection's facts ([`ConnInfo`]):
//! HTTP/1.1 (keep-alive, half-close, head read timeout, WebSocket
//! upgrades) or HTTP/2 (prior knowledge on cleartext, [`preface`]; ALPN
//! `h2` over TLS; WebSockets by extended CONNECT, RFC 8441), the send
//! timeout, and the HTTP/2 limits and rapid-reset defence. On HTTP/1.1 the
//! app's 1xx answers are written between hyper's messages
//! (`informational::H1Inject`) and a client that leaves cancels its
//! request, or has the rest of its body drained after an early answer
//! (`client_gone`).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tracing::{Instrument, debug, debug_span, info_span, warn};

use super::client_gone::{ClientGone, Mode, ReadAhead};
use super::conn::{self, ClientIo, ConnInfo, ListenerSetup, OpenError};
use super::conns::{BusyGuard, Closable, ConnState, ConnTable, Refusal, Tracked, TunnelGuard};
use super::h2_streams::{ConnStreams, FLOOD_DRAIN, StreamGuard};
use super::relay::{Answer, Relay, ResponseBudget};
use crate::adapters::REQUEST_PATH;
use crate::adapters::body::Body;
use crate::adapters::http::send_timeout::SendTimeout;
use crate::adapters::informational::{H1Inject, Informational};
use crate::seam::HttpListener;

use super::on_own_wake::OnOwnWake;
use super::preface::{self, Prefixed};
use crate::engine::header_scan::Scan as _;

/// Largest read buffer of a client connection, in bytes: the peer frame
/// limit ([`crate::adapters::wire::MAX_HEAD_LEN`], 64 KiB), above peerlb's
/// head limit (`MAX_HEAD_BYTES` in `front/ingress/limits.rs`, 60 KiB) so the heads
/// between the two get peerlb's own 431. hyper requires at least 8192.
pub(super) const READ_BUFFER_BYTES: usize = crate::adapters::wire::MAX_HEAD_LEN;

/// What the client server calls: the request path (`Ingress`).
pub(crate) trait Handler: Send + Sync + 'static {
    /// Answers one client request on the connection `conn` describes;
    /// never fails (errors become statuses).
    fn handle(
        &self,
        req: Request<Incoming>,
        conn: Arc<ConnInfo>,
    ) -> impl Future<Output = Answer<Body>> + Send;
    /// Longest wait for a complete request head, idle keep-alive included.
    fn header_read_timeout(&self) -> Duration;
    /// Longest a write to a client may make no progress.
    fn send_timeout(&self) -> Duration;
    /// Most bytes of an unfinished request body read and discarded after
    /// an early answer before an HTTP/1.1 connection closes
    /// (`client_gone`); 0 by default (the admin listener): none.
    fn early_answer_drain_bytes(&self) -> u64 {
        0
    }
    /// The open client connections (shared by every listener): the cap,
    /// the per-source cap, idle-first closing.
    fn conn_table(&self) -> &Arc<ConnTable>;
    /// The gauge of open client connections (shared by every listener).
    fn connections(&self) -> &AtomicU64;
    /// Counts a connection refused at accept, or an idle one closed.
    fn connection_event(&self, event: ConnEvent);
    /// Where the bytes of its connections are counted (`None`: not
    /// counted, the admin listener).
    fn byte_counts(&self) -> Option<&Arc<crate::adapters::metrics::ByteCounts>>;
    /// The node's budget of response bytes held for clients, through
    /// which every response body is written (`None`, the default: bodies
    /// are written as they are, the admin listener).
    fn response_budget(&self) -> Option<&Arc<ResponseBudget>> {
        None
    }
    /// Most open streams per HTTP/2 connection (default 100).
    fn h2_max_concurrent_streams(&self) -> u32 {
        100
    }
    /// Counts an answer hyper gave itself on an HTTP/1.1 connection from
    /// `client` (400, 431; 408 for a head that timed out, closed with
    /// nothing written: `access::edge_status`) and writes its access line
    /// when the log is on. Nothing by default (the admin listener).
    fn edge_answer(&self, client: std::net::SocketAddr, status: u16) {
        let _ = (client, status);
    }
    /// Counts an HTTP/2 connection (default: not counted).
    fn h2_connection(&self) {}
    /// Counts an HTTP/2 connection closed for a rapid-reset flood
    /// (default: not counted).
    fn h2_reset_flood(&self) {}
    /// Counts a connection from `peer` (its TCP peer: the sprayer, behind
    /// a PROXY header) closed before HTTP: its PROXY header or TLS
    /// handshake failed (`conn::open`). Nothing by default.
    fn closed_before_http(&self, peer: std::net::SocketAddr, error: &OpenError) {
        let _ = (peer, error);
    }
    /// True when each connection's `conn{peer, client}` span is at info
    /// level, so events at info and above carry it: the admin listener's
    /// (rare connections, whose requests change the node). The client
    /// listeners' span is at debug, the default: it is entered on every
    /// poll of a connection's task, several times per request (about 600
    /// instructions per request at info), and the events a client
    /// connection logs at info and above name the client themselves.
    fn conn_span_at_info(&self) -> bool {
        false
    }
}

/// What the connection cap did ([`Handler::connection_event`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnEvent {
    /// A new connection was closed at accept.
    Refused(Refusal),
    /// An idle connection was closed to admit a new one.
    ClosedIdle,
    /// A client left before its answer (an HTTP/1.1 connection that ended
    /// or failed while the request was pending, an HTTP/2 stream reset or
    /// connection lost): the request was cancelled (`client_aborted`).
    ClientAborted,
}

/// The error that ends an HTTP/1.1 connection whose client left before
/// its answer: hyper closes the connection, no answer is written.
#[derive(Debug, thiserror::Error)]
#[error("the client left before its answer")]
struct ClientAborted;

/// Counts one open connection in the gauge while it lives.
struct ConnSlot<H: Handler>(Arc<H>);

impl<H: Handler> ConnSlot<H> {
    fn new(ingress: &Arc<H>) -> Self {
        ingress.connections().fetch_add(1, Ordering::Relaxed);
        ConnSlot(ingress.clone())
    }
}

impl<H: Handler> Drop for ConnSlot<H> {
    fn drop(&mut self) {
        self.0.connections().fetch_sub(1, Ordering::Relaxed);
    }
}

/// Accepts client connections on `listener` until `shutdown` turns true;
/// each goes through `setup` (PROXY header, TLS) in its own task, then is
/// served by [`serve_connection`], which starts its graceful close
/// (HTTP/1.1: after the request in flight; HTTP/2: GOAWAY, then the open
/// streams finish) when `shutdown` turns true.
pub(crate) async fn serve<H: Handler>(
    mut listener: Box<dyn HttpListener>,
    setup: Arc<ListenerSetup>,
    ingress: Arc<H>,
    mut shutdown: watch::Receiver<bool>,
) {
    let local = listener.local_addr().ok();
    let mut last_warn: Option<tokio::time::Instant> = None;
    let mut last_cap_warn: Option<tokio::time::Instant> = None;
    let table = ingress.conn_table().clone();
    let max_connections = table.max();
    let per_source = table.per_source();
    loop {
        let (stream, client) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors, typically: say so once a
                    // second, not once per try.
                    if last_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                        warn!(target: REQUEST_PATH, error = %e, "accept failed");
                        last_warn = Some(tokio::time::Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        // A refused connection is closed at once: accepted, so it leaves
        // the kernel's backlog and the client sees a close instead of a
        // handshake that hangs. At the cap the connection idle longest is
        // closed instead when there is one (conns.rs).
        let cap_warn = last_cap_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        // Behind a PROXY-protocol sprayer every connection comes from the
        // sprayer: the per-source share would cap all clients together.
        let by_source = setup.proxy_protocol.is_none();
        let admitted = match table.admit(client.ip(), by_source) {
            Ok(a) => a,
            Err(why) => {
                drop(stream);
                ingress.connection_event(ConnEvent::Refused(why));
                if cap_warn {
                    match why {
                        Refusal::Full => {
                            warn!(target: REQUEST_PATH, max_connections, %client, "connection cap reached, every connection busy: closing new client connections (limits.max_connections)")
                        }
                        Refusal::SourceFull => {
                            warn!(target: REQUEST_PATH, per_source, %client, "per-source connection cap reached: closing new client connections from this address (limits.max_connections_per_source_percent)")
                        }
                    }
                    last_cap_warn = Some(tokio::time::Instant::now());
                }
                continue;
            }
        };
        if let Some(evicted) = admitted.evicted {
            ingress.connection_event(ConnEvent::ClosedIdle);
            if cap_warn {
                warn!(target: REQUEST_PATH, max_connections, %client, %evicted, "connection cap reached: closing the idle connection idle longest to admit a new one (limits.max_connections)");
                last_cap_warn = Some(tokio::time::Instant::now());
            }
        }
        let slot = ConnSlot::new(&ingress);
        let (ing, setup) = (ingress.clone(), setup.clone());
        let tracker = ConnTracker {
            table: table.clone(),
            state: admitted.state.clone(),
            admission: Arc::new((slot, admitted)),
        };
        let mut stop = shutdown.clone();
        let conn_shutdown = shutdown.clone();
        let span = if ingress.conn_span_at_info() {
            info_span!(target: REQUEST_PATH, "conn", peer = %client, client = tracing::field::Empty)
        } else {
            debug_span!(target: REQUEST_PATH, "conn", peer = %client, client = tracing::field::Empty)
        };
        tokio::spawn(
            async move {
                // A connection still in its PROXY header or TLS handshake
                // when the listener closes has no request to finish: it
                // is dropped rather than holding up the drain.
                let opened = tokio::select! {
                    biased;
                    r = conn::open(stream, client, &setup) => r,
                    _ = stop.wait_for(|stopped| *stopped) => return,
                };
                let (io, info) = match opened {
                    Ok(x) => x,
                    Err(e) => {
                        debug!(target: REQUEST_PATH, error = %e, "client connection closed before http");
                        ing.closed_before_http(client, &e);
                        return;
                    }
                };
                if info.client != info.peer {
                    tracing::Span::current().record("client", tracing::field::display(info.client));
                }
                let protocol = match &info.tls {
                    // ALPN chose (no ALPN: HTTP/1.1, RFC 7301).
                    Some(t) if t.alpn.as_deref() == Some(b"h2".as_slice()) => Protocol::Http2,
                    Some(_) => Protocol::Http1,
                    None => Protocol::Detect,
                };
                serve_connection::<H, ClientIo>(io, Arc::new(info), protocol, ing, conn_shutdown, tracker)
                    .await;
            }
            .instrument(span),
        );
    }
    if let Some(local) = local {
        debug!(target: REQUEST_PATH, %local, "listener closed");
    }
}

/// A connection's place in the [`ConnTable`]: each request marks it busy
/// until its response body is written, and the table may close it while
/// it is idle (idle-first closing at the cap, `conns.rs`).
#[derive(Clone)]
pub(crate) struct ConnTracker {
    /// The table the connection was admitted to.
    pub table: Arc<ConnTable>,
    /// The connection's entry in it.
    pub state: Arc<ConnState>,
    /// The connection's place in the table and in the connections gauge:
    /// released when the last holder drops it (the connection's task, or
    /// a WebSocket tunnel that outlives it, [`Held`]).
    admission: Arc<dyn Send + Sync>,
}

impl ConnTracker {
    /// Marks the connection busy for `resp`'s lifetime: until its body
    /// has been written (or dropped). The body is written through a
    /// [`Relay`] under `budget`; `h1` says the connection is HTTP/1.1 (the
    /// budget aborts it to cut a response).
    fn track(
        &self,
        budget: Option<&Arc<ResponseBudget>>,
        h1: bool,
    ) -> impl FnOnce(Answer<Body>) -> Response<Tracked<Relay<Body>>> + use<> {
        let busy = self.table.busy(&self.state);
        let budget = budget.cloned();
        let conn = h1.then(|| self.state.clone());
        move |Answer {
                  response,
                  from_peer,
              }| {
            response.map(|b| Tracked::new(Relay::new(b, budget, from_peer, conn), busy))
        }
    }
}

/// Keeps an HTTP/2 client connection in use while a WebSocket on one of
/// its streams is open (RFC 8441; its opening answer was written long
/// before it ends): busy in the connection table, so idle-first closing at
/// the cap passes it over, and an open stream, so the connection's idle
/// GOAWAY waits. The server puts one in the extensions of each HTTP/2
/// CONNECT; the request path takes it ([`ConnHold::hold`]) when the
/// tunnel opens. An HTTP/1.1 WebSocket takes one too: hyper hands its
/// connection over whole and the connection's task ends, so the hold is
/// what keeps it counted under `limits.max_connections` (and the
/// per-source share) and in the connections gauge, and busy, so
/// idle-first closing never cuts a tunnel.
#[derive(Clone)]
pub(crate) struct ConnHold {
    tracker: ConnTracker,
    /// The HTTP/2 connection's streams (`None` on HTTP/1.1).
    streams: Option<Arc<ConnStreams>>,
}

impl ConnHold {
    /// Holds the connection until the returned value is dropped.
    pub(crate) fn hold(&self) -> Held {
        let busy = self.tracker.table.busy(&self.tracker.state);
        let tunnel = self.tracker.table.tunnel(&self.tracker.state);
        if let Some(streams) = &self.streams {
            streams.active.fetch_add(1, Ordering::Relaxed);
            streams.touch();
        }
        Held {
            tunnel,
            _busy: busy,
            _admission: self.tracker.admission.clone(),
            streams: self.streams.clone(),
        }
    }
}

/// A tunnel's hold on its client connection ([`ConnHold::hold`]),
/// released when dropped.
pub(crate) struct Held {
    // Dropped first: the tunnel is no longer counted once it is not busy.
    tunnel: TunnelGuard,
    _busy: BusyGuard,
    _admission: Arc<dyn Send + Sync>,
    streams: Option<Arc<ConnStreams>>,
}

impl Held {
    /// The client connection's place in the connection table, for the
    /// tunnel's relay (activity, and its close at the cap).
    pub(crate) fn watched(&self) -> Arc<dyn crate::adapters::tunnel::Watched> {
        self.tunnel.watched()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(streams) = &self.streams {
            streams.active.fetch_sub(1, Ordering::Relaxed);
            streams.touch();
        }
    }
}

/// Which HTTP a client connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// Cleartext: HTTP/2 when the client opens with the HTTP/2 preface
    /// (prior knowledge, RFC 9113 section 3.3), else HTTP/1.x. The wait
    /// for the first bytes counts against the head read timeout. No h2c
    /// upgrade from HTTP/1.1 (RFC 9113 deprecated it).
    Detect,
    /// HTTP/1.x (TLS with ALPN `http/1.1` or none).
    Http1,
    /// HTTP/2 (TLS with ALPN `h2`).
    Http2,
}

/// Serves one client connection `io` from `client` until it ends: HTTP/1.1
/// (keep-alive, half-close, head read timeout, WebSocket upgrades) or
/// HTTP/2 (every stream a request of its own; limits in [`h2_builder`]), as
/// `protocol` says. Writes that make no progress for the send timeout end
/// it. When `shutdown` turns true the connection closes gracefully: HTTP/1.1
/// after the request in flight, HTTP/2 with GOAWAY once its open streams
/// finish. `io` is a plain TCP stream or a TLS stream (the HTTPS listener
/// passes [`Protocol::Http2`] when ALPN chose `h2`).
pub(crate) async fn serve_connection<H, I>(
    io: I,
    info: Arc<ConnInfo>,
    protocol: Protocol,
    ingress: Arc<H>,
    shutdown: watch::Receiver<bool>,
    tracker: ConnTracker,
) where
    H: Handler,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Closable: the connection table may close it while idle.
    let io = Closable::new(io, tracker.state.clone());
    let mut io = match ingress.byte_counts() {
        Some(c) => SendTimeout::new(io, ingress.send_timeout()).counting(c.clone()),
        None => SendTimeout::new(io, ingress.send_timeout()),
    };
    let (h2, prefix) = match protocol {
        Protocol::Http1 => (false, Bytes::new()),
        Protocol::Http2 => (true, Bytes::new()),
        Protocol::Detect => {
            let detect =
                tokio::time::timeout(ingress.header_read_timeout(), preface::detect(&mut io));
            // A connection that has sent nothing yet has no request in
            // flight: a drain closes it at once.
            let mut stop = shutdown.clone();
            let detected = tokio::select! {
                r = detect => r,
                () = stopped(&mut stop) => return,
            };
            match detected {
                Ok(Ok(found)) => found,
                Ok(Err(e)) => {
                    debug!(target: REQUEST_PATH, error = %e, "client connection failed before its first request");
                    return;
                }
                Err(_) => {
                    debug!(target: REQUEST_PATH, "client sent nothing within the head read timeout: closing");
                    return;
                }
            }
        }
    };
    let io = TokioIo::new(Prefixed::new(prefix, io));
    if h2 {
        ingress.h2_connection();
        serve_h2(io, info, ingress, shutdown, tracker).await;
    } else {
        serve_h1(io, info, ingress, shutdown, tracker).await;
    }
}

/// Counts an HTTP/2 request whose handler was dropped before its answer
/// ([`ConnEvent::ClientAborted`]), unless [`Aborted::done`].
struct Aborted<H: Handler>(Option<Arc<H>>);

impl<H: Handler> Aborted<H> {
    /// The answer came: nothing to count.
    fn done(mut self) -> Self {
        self.0 = None;
        self
    }
}

impl<H: Handler> Drop for Aborted<H> {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            h.connection_event(ConnEvent::ClientAborted);
        }
    }
}

/// Resolves when `shutdown` is true (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

/// A client connection's IO as hyper reads it.
type HyperIo<I> = TokioIo<Prefixed<SendTimeout<Closable<I>>>>;

async fn serve_h1<H, I>(
    io: HyperIo<I>,
    info: Arc<ConnInfo>,
    ingress: Arc<H>,
    mut shutdown: watch::Receiver<bool>,
    tracker: ConnTracker,
) where
    H: Handler,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let header_timeout = ingress.header_read_timeout();
    let edge = (ingress.clone(), info.client);
    // The app's 1xx answers are written between hyper's messages
    // (`informational::H1Inject`); an HTTP/1.0 client gets none (RFC 9110
    // section 15.2).
    let queue = info.informational.queue().clone();
    // A client that leaves while its answer is pending cancels the
    // request (`client_gone`).
    let gone = Arc::new(ClientGone::new(ingress.early_answer_drain_bytes()));
    let io = TokioIo::new(H1Inject::new(
        ReadAhead::new(io.into_inner(), gone.clone()),
        queue.clone(),
    ));
    let svc = service_fn(move |mut req: Request<Incoming>| {
        let (ing, info) = (ingress.clone(), info.clone());
        // Whether its body may still be coming after the answer (the
        // early answer drain).
        if http_body::Body::is_end_stream(req.body()) {
            gone.set_body(None);
        } else {
            let end = Arc::new(AtomicBool::new(false));
            gone.set_body(Some(end.clone()));
            req.extensions_mut()
                .insert(crate::adapters::body::BodyEnd(end));
        }
        let upgrade = req.headers().has(&http::header::UPGRADE);
        let armed = (!upgrade).then(|| gone.arm(Mode::of(req.version(), req.headers())));
        let gone = gone.clone();
        // Busy from its head until its response body is written.
        let track = tracker.track(ing.response_budget(), true);
        if upgrade {
            // A WebSocket keeps the connection's admission past this task.
            req.extensions_mut().insert(ConnHold {
                tracker: tracker.clone(),
                streams: None,
            });
        }
        async move {
            let Some(armed) = armed else {
                return Ok(track(ing.handle(req, info).await));
            };
            tokio::select! {
                biased;
                resp = ing.handle(req, info) => {
                    drop(armed);
                    Ok(track(resp))
                }
                () = gone.wait() => {
                    ing.connection_event(ConnEvent::ClientAborted);
                    debug!(target: REQUEST_PATH, "client left before its answer: request cancelled");
                    Err(ClientAborted)
                }
            }
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        // A forwarded answer still reaches a client that half-closed.
        .half_close(true)
        // Closes connections that send no complete head in time,
        // idle keep-alive connections included (slowloris).
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        // A connection's read buffer stops at the head limit's order
        // (hyper's default grows to about 408 KB): a head up to
        // READ_BUFFER_BYTES gets peerlb's own 431 (`limits::check`), a
        // longer one hyper's bare 431.
        .max_buf_size(READ_BUFFER_BYTES)
        .serve_connection(io, svc)
        // A WebSocket request's connection is handed to its tunnel once
        // the app's 101 is written (`Ingress::handle`).
        .with_upgrades();
    tokio::pin!(conn);
    // The drain signal is polled only when it wakes: this task wakes for
    // the connection many times per request, and each poll of a watch
    // receiver's wait takes the channel's lock and waiter list (about 950
    // instructions per forwarded request, polled beside the connection).
    let stop = OnOwnWake::new(stopped(&mut shutdown));
    // The signal first: unwoken it costs a register and a flag read, and
    // a connection that used up the task's budget cannot keep a drain
    // from being seen (the signal's wait is budgeted too).
    let r = tokio::select! {
        biased;
        () = stop => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        r = conn.as_mut() => r,
    };
    if let Err(e) = r {
        if let Some(status) = crate::adapters::access::edge_status(&e) {
            edge.0.edge_answer(edge.1, status);
        }
        debug!(target: REQUEST_PATH, error = %e, "client connection ended with an error");
    }
}

/// HTTP/2 connection limits (RFC 9113 section 6.5.2 settings and the h2
/// crate's defences), the same for every connection:
///
/// - `SETTINGS_MAX_CONCURRENT_STREAMS`: `limits.h2_max_concurrent_streams`
///   (default 100, as nginx and HAProxy);
/// - `SETTINGS_MAX_HEADER_LIST_SIZE`: [`READ_BUFFER_BYTES`] (64 KiB), the
///   HTTP/1.1 read buffer: a header list between peerlb's head limit
///   (`MAX_HEAD_BYTES` in `front/ingress/limits.rs`) and this gets peerlb's own 431;
/// - flow control: 256 KiB per stream, 1 MiB per connection (a client
///   can have at most that much request body buffered here);
/// - streams the client resets before hyper accepts them: at most
///   [`H2_MAX_PENDING_ACCEPT_RESETS`] pending, else GOAWAY
///   `ENHANCE_YOUR_CALM`; streams peerlb itself has to reset for the
///   client's errors: at most [`H2_MAX_LOCAL_ERROR_RESETS`]; streams reset
///   after hyper accepted them count in [`ConnStreams`] (rapid reset, by
///   rate: `h2_streams`);
/// - no keep-alive pings: a connection with no open stream for the head
///   read timeout is closed with GOAWAY instead (a WebSocket open on one
///   of its streams counts as an open stream, [`ConnHold`]);
/// - `SETTINGS_ENABLE_CONNECT_PROTOCOL` = 1 (RFC 8441 section 3): clients
///   may open WebSockets with an extended CONNECT (`:protocol websocket`,
///   translated at the entry by `tunnel::extended_connect`).
fn h2_builder(max_streams: u32) -> hyper::server::conn::http2::Builder<TokioExecutor> {
    let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .max_concurrent_streams(max_streams)
        .max_header_list_size(READ_BUFFER_BYTES as u32)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .max_pending_accept_reset_streams(H2_MAX_PENDING_ACCEPT_RESETS)
        .max_local_error_reset_streams(H2_MAX_LOCAL_ERROR_RESETS)
        .keep_alive_interval(None)
        .enable_connect_protocol();
    b
}

/// HTTP/2 stream flow-control window, in bytes.
pub(super) const H2_STREAM_WINDOW: u32 = 256 * 1024;
/// HTTP/2 connection flow-control window, in bytes.
pub(super) const H2_CONNECTION_WINDOW: u32 = 1024 * 1024;
/// Most streams reset by the client before hyper accepted them, pending
/// at once (the h2 crate's default).
pub(super) const H2_MAX_PENDING_ACCEPT_RESETS: usize = 20;
/// Most streams peerlb resets for the client's protocol errors before the
/// connection is closed.
pub(super) const H2_MAX_LOCAL_ERROR_RESETS: usize = 256;

async fn serve_h2<H, I>(
    io: HyperIo<I>,
    info: Arc<ConnInfo>,
    ingress: Arc<H>,
    mut shutdown: watch::Receiver<bool>,
    tracker: ConnTracker,
) where
    H: Handler,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let idle = ingress.header_read_timeout();
    let streams = Arc::new(ConnStreams::new());
    let builder = h2_builder(ingress.h2_max_concurrent_streams());
    let ing = ingress.clone();
    let st = streams.clone();
    let client = info.client;
    let svc = service_fn(move |mut req: Request<Incoming>| {
        let (ing, info) = (ing.clone(), info.clone());
        // The stream's own 1xx sender (vendor/hyper's patch: hyper's HTTP/2
        // server had none); a head is sent as a HEADERS frame before the
        // final answer's.
        let sink = match req
            .extensions_mut()
            .remove::<hyper::ext::Http2Informational>()
        {
            Some(stream) => Informational::new(move |head| {
                let mut r = http::Response::new(());
                *r.status_mut() = head.status;
                *r.headers_mut() = head.headers;
                stream.send(r);
            }),
            None => Informational::new(|_| {}),
        };
        req.extensions_mut().insert(sink);
        req.extensions_mut()
            .insert(crate::adapters::body::Http2Client);
        let guard = StreamGuard::start(&st);
        let track = tracker.track(ing.response_budget(), false);
        if req.method() == http::Method::CONNECT {
            req.extensions_mut().insert(ConnHold {
                tracker: tracker.clone(),
                streams: Some(st.clone()),
            });
        }
        async move {
            // Dropped before its answer: the client reset the stream or
            // the connection ended (hyper drops the handler).
            let aborted = Aborted(Some(ing.clone()));
            let resp = ing.handle(req, info).await;
            drop(aborted.done());
            guard.answer();
            Ok::<_, std::convert::Infallible>(track(resp))
        }
    });
    let conn = builder.serve_connection(io, svc);
    tokio::pin!(conn);
    let mut closing = false;
    let mut idle_check = tokio::time::Instant::now() + idle;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    debug!(target: REQUEST_PATH, error = %e, "client connection ended with an error");
                }
                return;
            }
            () = stopped(&mut shutdown), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            () = streams.flood.notified() => {
                ingress.h2_reset_flood();
                warn!(target: REQUEST_PATH, %client, started = streams.started(), reset = streams.premature(), "http/2 client reset most of its streams before their answers (rapid reset): GOAWAY, closing the connection");
                // GOAWAY naming the last stream processed: those finish
                // (bounded), the client retries the rest.
                conn.as_mut().graceful_shutdown();
                if let Err(e) = tokio::time::timeout(FLOOD_DRAIN, conn.as_mut()).await.unwrap_or(Ok(())) {
                    debug!(target: REQUEST_PATH, error = %e, "flooding connection ended with an error");
                }
                return;
            }
            () = tokio::time::sleep_until(idle_check), if !closing => {
                match streams.idle_until(idle) {
                    None => {
                        debug!(target: REQUEST_PATH, "http/2 connection idle: GOAWAY");
                        conn.as_mut().graceful_shutdown();
                        closing = true;
                    }
                    Some(at) => idle_check = at,
                }
            }
        }
    }
}
