//! The peer layer: one quinn endpoint per node, serving proxied requests
//! from peers and forwarding this node's requests to their owners.
//!
//! - One QUIC connection in use per unordered peer pair, carrying requests
//!   both ways (ALPN `peerlb/3`, mutual TLS with the cluster CA); liveness
//!   pings only while a connection is busy, so a quiet cluster sends
//!   nothing on the peer layer (see [`links`]).
//! - With a node that does not offer `peerlb/3` (an older release, or one
//!   configured with `peer.protocol = 2`), `peerlb/2`: the same, but each
//!   stream's kind is a header mark in its head, not a field of its frame
//!   ([`crate::adapters::wire`], "The stream's kind"). The connection's
//!   version travels with every stream opened on it ([`PeerStream`]).
//! - With a node of an older release still (ALPN `peerlb/1`, negotiated
//!   when it offers nothing else, or when this node is configured with
//!   `peer.protocol = 1`), the frames of `peerlb/2` and the rules before
//!   one connection per pair: each node opens streams only on the
//!   connection it dialled and serves streams only on the one it accepted,
//!   so a pair holds two connections (see [`links`]).
//! - The set of peers that proved their identity and were not ejected
//!   since is published on a watch channel: a peer is routable only while
//!   it is in that set, so a connection lost while busy ejects it at once
//!   (no waiting for gossip) and a new connection takes it back.
//! - One bidirectional stream per request (see [`crate::adapters::wire`]).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body::Body as _;
use tracing::{Instrument, debug, debug_span, info_span, warn};

use crate::adapters::body::{self, Body, QuicBody};
use crate::adapters::informational::{InfoHead, Informational};
use crate::adapters::transport::tls::{self, TlsMaterial};
use crate::adapters::tunnel::{BoxIo, Tunnel};
use crate::adapters::wire::{self, DecodedResponseHead, RequestHeadView, StreamKind};
use crate::config::PeerSettings;
use crate::engine::node_id::NodeId;

mod admission;
mod dial;
mod exchange;
mod links;
mod quic_config;
mod send;
pub(crate) mod udp;

use exchange::StreamTunnel;
pub(crate) use exchange::TunnelAnswer;
use exchange::{exchange_informational, exchange_tunnel};
use links::Link;
pub(crate) use links::{LinkCounts, PeerBody, PeerLinks, PeerStream};
use quic_config::transport;
pub(crate) use send::{Outgoing, SendError, open, send};

/// The tracing target of this module's events: its path before the
/// adapters were put in wings (`crate::adapters::REQUEST_PATH`).
const LOG: &str = "peerlb::adapters::peer";

/// Errors setting up the endpoint.
#[derive(Debug, thiserror::Error)]
pub enum PeerSetupError {
    /// The TLS material could not be turned into QUIC configs.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// The UDP socket could not be used by quinn.
    #[error("peer endpoint: {0}")]
    Endpoint(std::io::Error),
}

/// A forward that failed before any byte of the request reached the owner:
/// always safe to retry on the next candidate.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    /// No live authenticated connection to that peer right now.
    #[error("no connection to peer {0}")]
    NotConnected(NodeId),
    /// Opening a stream failed (connection lost, or timed out waiting for
    /// stream credit).
    #[error("cannot open a stream to peer {peer}: {reason}")]
    Stream {
        /// The peer.
        peer: NodeId,
        /// Why.
        reason: String,
    },
}

/// A forward that failed after the request head was sent: the owner may
/// have processed it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExchangeError {
    /// The owner refused the stream before processing it (shutting down):
    /// safe to retry.
    #[error("peer {0} refused the request")]
    Refused(NodeId),
    /// The connection or stream failed before the response head.
    #[error("peer {peer}: {reason}")]
    Failed {
        /// The peer.
        peer: NodeId,
        /// Why.
        reason: String,
    },
    /// No response head within the response timeout.
    #[error("peer {0} sent no response head in time")]
    Timeout(NodeId),
    /// The client's request body failed (malformed, cut off, stalled)
    /// before the response head arrived; the stream was reset.
    #[error("{0}")]
    ClientBody(body::BodyError),
}

/// Serves requests that peers forward to this node.
pub(crate) trait ProxiedHandler: Send + Sync + 'static {
    /// This node's id (the `served_by` of every response head).
    fn node_id(&self) -> &str;
    /// False once the node is shutting down: new streams are refused with
    /// [`wire::RESET_REFUSED`] before they are processed, so the entry may
    /// retry them elsewhere.
    fn accepting(&self) -> bool;
    /// Whether serving a stream of `kind` may send informational (1xx)
    /// heads: false when the app never sends one (the built-in app), so
    /// the stream makes no channel for them (the entry marks every request
    /// that can take a 1xx, and that is nearly every one).
    fn may_send_informational(&self, kind: StreamKind) -> bool;
    /// Serves one proxied stream of `kind` (never forwarded again: hop
    /// limit 1) from the entry node `entry` (the peer its certificate
    /// proved, which the head's `entry` names: checked before).
    fn serve(
        &self,
        kind: StreamKind,
        entry: &NodeId,
        head: &RequestHeadView<'_>,
        req: Request<Body>,
    ) -> impl std::future::Future<Output = Response<Body>> + Send;
    /// Relays a tunnel: `peer_side` (the request's stream, after both
    /// heads) and the app's side `app` (from the app's 101), until it ends.
    fn relay(&self, peer_side: BoxIo, app: Tunnel) -> impl std::future::Future<Output = ()> + Send;
}

/// Streams a peer may open at once on a new connection; [`serve_connection`]
/// doubles the allowance whenever half of it is in use, up to
/// [`MAX_STREAMS`]. quinn keeps an entry for every stream a peer may open
/// (two hash maps of the allowance's size per connection, made at the
/// handshake): 4,096 at once cost about 280 KB per connection, which a
/// node holds toward every peer it talked to in the last few seconds
/// (280 MB at 1,000 peers), and a handshake's time to fill them.
const FIRST_STREAMS: u32 = 64;

/// Most streams a peer may open at once on one connection (past it a
/// request waits for a stream, at most `limits.connect_timeout_ms`).
const MAX_STREAMS: u32 = 4096;

/// Largest UDP payload a node accepts, and the most `peer.max_udp_payload`
/// lets it send (after MTU discovery).
///
/// quinn sends up to 10 packets in one GSO batch (`MAX_TRANSMIT_SEGMENTS`
/// in quinn 0.11), and a batch must fit one UDP datagram (65,507 bytes):
/// above 6,550 the kernel refuses whole batches (EMSGSIZE), quinn counts
/// them lost, and its black-hole detection drops the path to 1,200 bytes
/// for 10 minutes. quinn's receive buffers grow linearly with this value.
const MAX_UDP_PAYLOAD: u16 = 6500;

/// Builds the endpoint on `socket` (bound by the caller; DESIGN: constructors
/// never bind), driven by `runtime`. `seed` seeds quinn's endpoint RNG;
/// `clock` dates its address-validation tokens.
///
/// # Errors
/// [`PeerSetupError`] when the TLS material does not make valid configs or
/// the socket cannot be used.
pub(crate) fn endpoint(
    socket: Arc<dyn quinn::AsyncUdpSocket>,
    runtime: Arc<dyn quinn::Runtime>,
    tls_material: &TlsMaterial,
    settings: &PeerSettings,
    seed: u64,
    clock: Arc<dyn crate::seam::Clock>,
) -> Result<(quinn::Endpoint, quinn::ClientConfig), PeerSetupError> {
    let (mut server_tls, mut client_tls) = (
        tls::server_config(tls_material)?,
        tls::client_config(tls_material)?,
    );
    if settings.only_v1 {
        server_tls.alpn_protocols = vec![tls::ALPN_V1.to_vec()];
        client_tls.alpn_protocols = vec![tls::ALPN_V1.to_vec()];
    } else if !settings.offer_v3 {
        let v2 = vec![tls::ALPN_V2.to_vec(), tls::ALPN_V1.to_vec()];
        server_tls.alpn_protocols = v2.clone();
        client_tls.alpn_protocols = v2;
    }
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(
        quinn::crypto::rustls::QuicServerConfig::try_from(server_tls)
            .map_err(|error| tls::TlsError::Quic { error })?,
    ));
    server.transport_config(transport(settings));
    server.time_source(Arc::new(crate::seam::ClockAdapter(clock)));
    admission::limit_server(&mut server);
    let mut client = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(client_tls)
            .map_err(|error| tls::TlsError::Quic { error })?,
    ));
    client.transport_config(transport(settings));
    let mut config = quinn::EndpointConfig::default();
    config
        .max_udp_payload_size(MAX_UDP_PAYLOAD)
        .expect("MAX_UDP_PAYLOAD is within QUIC's limits");
    let mut rng_seed = [0u8; 32];
    for (i, chunk) in rng_seed.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(
            &(seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes(),
        );
    }
    config.rng_seed(Some(rng_seed));
    let ep = quinn::Endpoint::new_with_abstract_socket(config, Some(server), socket, runtime)
        .map_err(PeerSetupError::Endpoint)?;
    Ok((ep, client))
}

/// Ends a stream whose request head could not be read or decoded: that
/// stream only, never the connection.
fn refuse_bad_head(e: &HeadError, send: &mut quinn::SendStream, recv: &mut quinn::RecvStream) {
    match e {
        // The entry gave up on the request before its head was read (the
        // client's body broke at once): nothing of ours went wrong.
        HeadError::Read(quinn::ReadExactError::ReadError(quinn::ReadError::Reset(code)))
            if code.into_inner() == u64::from(wire::RESET_BODY_FAILED) =>
        {
            debug!(target: LOG, "peer abandoned a request before its head was read");
            let _ = send.reset(wire::RESET_BODY_FAILED.into());
        }
        e => {
            warn!(target: LOG, error = %e, "bad request frame from peer: closing that stream");
            let _ = recv.stop(wire::RESET_BAD_FRAME.into());
            let _ = send.reset(wire::RESET_BAD_FRAME.into());
        }
    }
}

/// Polls `recv` once (never waits); true when nothing was there yet. The
/// usual answer is the FIN; bytes or an error after a head that announced
/// no body are dropped with the stream.
async fn nothing_read_yet(recv: &mut quinn::RecvStream) -> bool {
    std::future::poll_fn(|cx| std::task::Poll::Ready(body::poll_chunk(recv, cx).is_pending())).await
}

/// The request id header every entry sends (`X-Request-Id`), made once:
/// a name HTTP has no standard constant for is otherwise copied into an
/// allocation of its own on every request.
const X_REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-request-id");

/// A proxied request's header name, from the head's lowercase text.
fn header_name(k: &[u8]) -> Result<http::HeaderName, http::header::InvalidHeaderName> {
    if k == X_REQUEST_ID.as_str().as_bytes() {
        return Ok(X_REQUEST_ID);
    }
    http::HeaderName::from_bytes(k)
}

#[derive(Debug, thiserror::Error)]
enum HeadError {
    #[error("reading head: {0}")]
    Read(#[from] quinn::ReadExactError),
    #[error(transparent)]
    Wire(#[from] wire::WireError),
}

/// Reads and decodes a response head; its header values share the frame.
async fn read_response_head(
    recv: &mut quinn::RecvStream,
) -> Result<DecodedResponseHead, HeadError> {
    Ok(wire::decode_response(&read_frame(recv).await?)?)
}

/// Reads one length-prefixed head frame's bytes (after the prefix). A
/// head that arrived in one piece (the usual case: one STREAM frame) is
/// the received packet's own bytes, neither copied nor zero-filled first;
/// one split across frames is gathered into a buffer of its length. The
/// packet's buffer (one per datagram: the peer socket has no GRO) then
/// lives as long as the frame: at most one datagram per open stream.
async fn read_frame(recv: &mut quinn::RecvStream) -> Result<Bytes, HeadError> {
    let mut prefix = [0u8; 4];
    recv.read_exact(&mut prefix).await?;
    let len = wire::head_len(prefix)?;
    let mut gathered: Option<bytes::BytesMut> = None;
    let mut read = 0;
    while read < len {
        let chunk = recv
            .read_chunk(len - read, true)
            .await
            .map_err(quinn::ReadExactError::ReadError)?
            .ok_or(quinn::ReadExactError::FinishedEarly(read))?;
        read += chunk.bytes.len();
        if read == len && gathered.is_none() {
            return Ok(chunk.bytes);
        }
        gathered
            .get_or_insert_with(|| bytes::BytesMut::with_capacity(len))
            .extend_from_slice(&chunk.bytes);
    }
    Ok(gathered.map(bytes::BytesMut::freeze).unwrap_or_default())
}

/// Serves peers: every connection in `links` (accepted, or dialled by
/// this node) has the streams the peer opens on it served by `handler`.
/// Sets that up at once; the future accepts connections until the
/// endpoint is closed, each recorded under the node id its client
/// certificate proves.
pub(crate) fn serve<H: ProxiedHandler>(
    links: Arc<PeerLinks>,
    handler: Arc<H>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    // Weak: the handler holds the links, which hold this function (a
    // cycle would keep the endpoint and its socket alive for ever).
    let handler = Arc::downgrade(&handler);
    links.set_server(Arc::new(
        move |peer: NodeId, conn: quinn::Connection, link: Arc<Link>| {
            let Some(handler) = handler.upgrade() else {
                return;
            };
            let remote = conn.remote_address();
            // At debug: this task is polled for every stream the peer
            // opens, and an enabled span is entered on every poll (about
            // 300 instructions); its events are at debug.
            tokio::spawn(
                serve_connection(conn, peer, link, handler)
                    .instrument(debug_span!(target: LOG, "peer_conn", %remote)),
            );
        },
    ));
    async move {
        let half_open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        while let Some(incoming) = links.endpoint().accept().await {
            // Admission before authentication: a cap on half-open
            // handshakes, address validation (Retry) when they pile up.
            let n = half_open.load(std::sync::atomic::Ordering::Relaxed);
            match admission::admit(n, incoming.remote_address_validated(), incoming.may_retry()) {
                admission::Admit::Accept => {}
                admission::Admit::Retry => {
                    let _ = incoming.retry();
                    continue;
                }
                admission::Admit::Ignore => {
                    incoming.ignore();
                    continue;
                }
            }
            let pending = admission::HalfOpen::start(&half_open);
            let links = links.clone();
            let remote = incoming.remote_address();
            let connecting = outside_spans(remote, || incoming.accept());
            tokio::spawn(
                async move {
                    let r = match connecting {
                        Ok(c) => c.await,
                        Err(e) => Err(e),
                    };
                    drop(pending);
                    match r {
                        Ok(conn) => links.accepted(conn),
                        Err(e) => debug!(target: LOG, error = %e, "peer handshake failed"),
                    }
                }
                // At info (a span per connection, entered only during its
                // handshake): a refused peer certificate's warning names
                // the address. The loop serving its streams is at debug.
                .instrument(info_span!(target: LOG, "peer_conn", %remote)),
            );
        }
    }
}

/// Runs `make` (a quinn `connect` or `accept`) so that quinn's driver of
/// the connection to or from `remote` runs in no enabled span: quinn
/// instruments that task with the span current when the connection is
/// made and enters it on every poll, several per request (an enabled
/// span cost about 300 instructions per enter and exit), and the span
/// current here is the connection's info-level `peer`, `peer_link` or
/// `peer_conn` span, or a client connection's (debug level: enabled only
/// by a filter that asks for it). Under a filter that enables
/// the debug span `peer_driver` the driver runs in that one (quinn's own
/// events then name the peer's address); otherwise `make` runs with no
/// subscriber, so the driver is instrumented with no span (quinn makes a
/// connection without logging: its errors are returned).
pub(crate) fn outside_spans<T>(remote: std::net::SocketAddr, make: impl FnOnce() -> T) -> T {
    let span = debug_span!(target: LOG, "peer_driver", %remote);
    if span.is_disabled() {
        tracing::dispatcher::with_default(&tracing::Dispatch::none(), make)
    } else {
        span.in_scope(make)
    }
}

async fn serve_connection<H: ProxiedHandler>(
    conn: quinn::Connection,
    peer: NodeId,
    link: Arc<Link>,
    handler: Arc<H>,
) {
    // Streams the peer has open here, and how many it may open at once.
    let open = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut allowed = FIRST_STREAMS;
    let version = link.version;
    loop {
        let (send, recv) = match conn.accept_bi().await {
            Ok(s) => s,
            Err(e) => {
                debug!(target: LOG, reason = %e, "peer connection closed");
                return;
            }
        };
        let now_open = open.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if let Some(more) = more_streams(now_open, allowed) {
            allowed = more;
            conn.set_max_concurrent_bi_streams(allowed.into());
            debug!(target: LOG, allowed, "peer stream allowance raised");
        }
        let busy = link.enter();
        let handler = handler.clone();
        let conn = conn.clone();
        let peer = peer.clone();
        let open = open.clone();
        // Boxed: on its way into a task a spawned future is moved several
        // times (tokio's spawn, the task's cell, its stage), each a copy of
        // the whole future (about 3.5 KB here); a boxed one moves as a pointer.
        tokio::spawn(Box::pin(async move {
            serve_stream(conn, send, recv, handler, &peer, version).await;
            drop(busy);
            open.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }));
    }
}

/// The peer's new stream allowance when `open` of `allowed` streams are
/// open: double once half is used, up to [`MAX_STREAMS`]; `None` to keep
/// it (it never shrinks).
fn more_streams(open: u32, allowed: u32) -> Option<u32> {
    (open * 2 >= allowed && allowed < MAX_STREAMS).then(|| (allowed * 2).min(MAX_STREAMS))
}

async fn serve_stream<H: ProxiedHandler>(
    conn: quinn::Connection,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    handler: Arc<H>,
    peer: &NodeId,
    version: wire::Version,
) {
    // Long: the owner's side of one peer stream in wire order: read the head, admit it,
    // dispatch by kind, stream the answer back; each step is short.
    // The head is decoded in place: its strings borrow `frame`.
    let frame = match read_frame(&mut recv).await {
        Ok(f) => f,
        Err(e) => return refuse_bad_head(&e, &mut send, &mut recv),
    };
    let (kind, head) = match wire::decode_request(&frame, version) {
        Ok(h) => h,
        Err(e) => return refuse_bad_head(&HeadError::Wire(e), &mut send, &mut recv),
    };
    if !handler.accepting() {
        debug!(target: LOG, entry = %head.entry, "refusing a proxied request: this node is shutting down");
        let _ = recv.stop(wire::RESET_REFUSED.into());
        let _ = send.reset(wire::RESET_REFUSED.into());
        return;
    }
    // The connection's certificate proved `peer` at accept time; a head
    // claiming another entry is refused with the whole connection.
    if head.entry != &**peer {
        warn!(target: LOG, claimed = %head.entry, proved = %peer, "peer certificate does not match the entry it claims: refusing the connection");
        conn.close(2u32.into(), b"certificate does not match entry node id");
        return;
    }
    // The request is built in place, not through `Request::builder` (each
    // of its steps moved the whole request head). The target and the
    // header values share `frame` (no copy or allocation of their own,
    // as the entry's `decode_response`): the datagram's buffer lives as
    // long as the request. The first invalid part (method, target, then
    // header) is the error.
    let method = http::Method::from_bytes(head.method.as_bytes()).map_err(http::Error::from);
    let uri = http::Uri::from_maybe_shared(frame.slice_ref(head.uri.as_bytes()))
        .map_err(http::Error::from);
    let mut bad_header: Option<http::Error> = None;
    // The map starts with at least the 8 slots its first insert would
    // make (the app path adds forwarding headers), at most 64 (a map's
    // capacity has a ceiling a hostile head must not reach).
    let mut headers = http::HeaderMap::with_capacity(head.headers.len().clamp(6, 64));
    let mut len = None;
    let mut chunked = false;
    let mut tunnel = false;
    let mut informational = false;
    let (mut trailers_in, mut trailers_out) = (false, false);
    for &(k, v) in &head.headers {
        if k == wire::TUNNEL.as_bytes() {
            // peerlb's own mark: the app never sees it.
            tunnel = true;
            continue;
        }
        if k == wire::INFORMATIONAL.as_bytes() {
            informational = true;
            continue;
        }
        if k == wire::TRAILERS.as_bytes() {
            // Trailers across the hop (`body::framed`).
            (trailers_in, trailers_out) = body::trailer_marks(v);
            continue;
        }
        if k == b"content-length" {
            len = std::str::from_utf8(v).ok().and_then(|s| s.parse().ok());
        } else if k == b"transfer-encoding" {
            chunked = true;
        }
        if bad_header.is_none() {
            match (
                header_name(k),
                HeaderValue::from_maybe_shared(frame.slice_ref(v)),
            ) {
                (Ok(k), Ok(v)) => {
                    headers.append(k, v);
                }
                (Err(e), _) => bad_header = Some(e.into()),
                (_, Err(e)) => bad_header = Some(e.into()),
            }
        }
    }
    // A request with neither Content-Length nor Transfer-Encoding has no
    // body (HTTP/1.1), and the entry sent the FIN with the head: take it
    // now, so the app sees a known-empty body and the stream ends read to
    // its end (no STOP_SENDING when it is dropped).
    // A tunnel request has no body; its stream stays open for the tunnel.
    let (body, tunnel_recv) = if tunnel {
        (body::empty(), Some(recv))
    } else if trailers_in {
        // Framed: the stream carries more than the body's length.
        (
            body::unframed(http_body_util::BodyExt::boxed_unsync(QuicBody::new(
                recv, None,
            ))),
            None,
        )
    } else if len.is_none() && !chunked && !nothing_read_yet(&mut recv).await {
        (body::empty(), None)
    } else {
        (
            http_body_util::BodyExt::boxed_unsync(QuicBody::new(recv, len)),
            None,
        )
    };
    let built = method.and_then(|method| {
        let uri = uri?;
        if let Some(e) = bad_header {
            return Err(e);
        }
        let mut r = Request::new(body);
        *r.method_mut() = method;
        *r.uri_mut() = uri;
        *r.headers_mut() = headers;
        Ok(r)
    });
    let req = match built {
        Ok(r) => r,
        Err(e) => {
            warn!(target: LOG, id = %uuid::Uuid::from_u128(head.request_id), entry = %head.entry, error = %e, "bad request head from peer: closing that stream");
            let _ = send.reset(wire::RESET_BAD_FRAME.into());
            return;
        }
    };
    // Debug level, like the entry's `request` span (cost per request).
    let span = debug_span!(target: LOG, "proxied", id = %uuid::Uuid::from_u128(head.request_id), entry = %head.entry);
    // The app's 1xx answers, when the entry asked: a frame each, before
    // the final head (`informational::serve_relaying`).
    let mut req = req;
    let info_rx = (informational && handler.may_send_informational(kind)).then(|| {
        let (sink, rx) = crate::adapters::informational::channel();
        req.extensions_mut().insert(sink);
        rx
    });
    let node = handler.node_id();
    // The handler's future (the app's call with it, about 2.6 KB) is
    // boxed: inline it made this stream's future that much larger, copied
    // whole when the task was spawned and again on its way into
    // `serve_relaying`; boxed, it is copied once. Instrumented only when
    // the span is on (`instrument` is one more move).
    let resp = if span.is_disabled() {
        let serving = Box::pin(handler.serve(kind, peer, &head, req));
        crate::adapters::informational::serve_relaying(serving, info_rx, &mut send, node).await
    } else {
        let serving = Box::pin(handler.serve(kind, peer, &head, req).instrument(span));
        crate::adapters::informational::serve_relaying(serving, info_rx, &mut send, node).await
    };
    let Some(resp) = resp else {
        return;
    };
    let (mut parts, body) = resp.into_parts();
    let app_tunnel = (parts.status == http::StatusCode::SWITCHING_PROTOCOLS)
        .then(|| parts.extensions.remove::<Tunnel>())
        .flatten();
    // A body of known size keeps its length across the hop where hyper
    // would have written it for the client on this node (`framing`), so
    // the entry answers with Content-Length, not chunked, and invents none.
    // The length goes on the wire as a line of its own after the map's
    // (`ResponseHeadRef::content_length`), not into the map.
    let content_length = crate::adapters::framing::length_to_carry(
        head.method,
        parts.status,
        &parts.headers,
        body.is_end_stream(),
        body.size_hint().exact(),
    );
    // Framed when it may end with trailers the entry's client takes
    // (never a body of a length carried).
    let body = body::frame_response(
        trailers_out && app_tunnel.is_none() && content_length.is_none(),
        head.method,
        &mut parts,
        body,
    );
    let rh = wire::ResponseHeadRef {
        status: parts.status.as_u16(),
        headers: &parts.headers,
        content_length,
        served_by: handler.node_id(),
    };
    let frame = match wire::encode(&rh) {
        Ok(f) => f,
        Err(e) => {
            warn!(target: LOG, id = %uuid::Uuid::from_u128(head.request_id), entry = %head.entry, error = %e, "cannot encode response head");
            let _ = send.reset(wire::RESET_BAD_FRAME.into());
            return;
        }
    };
    if send.write_chunk(Bytes::from(frame)).await.is_err() {
        return;
    }
    if let (Some(app), Some(recv)) = (app_tunnel, tunnel_recv) {
        let stream = StreamTunnel {
            io: tokio::io::join(recv, send),
            _busy: None,
        };
        // Boxed: a tunnel is rare, and its relay's future would
        // otherwise make every stream's task as large as itself.
        Box::pin(handler.relay(Box::new(stream), app)).await;
        return;
    }
    if let Err(e) = body::pump(body, &mut send).await {
        debug!(target: LOG, error = %e, "response body to peer stopped");
    }
}

#[cfg(test)]
mod tests;
