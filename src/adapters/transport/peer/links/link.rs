//! One QUIC connection to a peer ([`Link`]), the hold that keeps it busy
//! while a stream is open on it ([`Busy`]), and a request stream and
//! response body on it ([`PeerStream`], [`PeerBody`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;
use tokio::time::Instant;

use tracing::warn;

use super::LOG;
use crate::adapters::body::{BodyError, QuicBody};
use crate::adapters::transport::tls;
use crate::adapters::wire;
use crate::engine::node_id::NodeId;
use crate::engine::peer_link::LinkFacts;

/// One QUIC connection to a peer.
pub(crate) struct Link {
    pub(super) conn: quinn::Connection,
    /// Dialled by this node (else accepted from the peer).
    pub(super) dialled: bool,
    /// Negotiated the previous protocol (ALPN `peerlb/1`): this node opens
    /// streams on it only if it dialled it, serves them only if it
    /// accepted it, and the peer keeps it alive (QUIC keep-alive).
    pub(super) legacy: bool,
    /// The frame layout its ALPN says (`peerlb/3`: the typed stream kind).
    pub(crate) version: wire::Version,
    pub(super) established: Instant,
    pub(super) state: Mutex<LinkState>,
    /// Told when the first stream opens on a quiet connection.
    pub(super) wake: Notify,
}

pub(super) struct LinkState {
    /// Streams open on it (opened or accepted by this node).
    pub(super) streams: u32,
    /// When the last stream ended (or the connection was established).
    pub(super) last_busy: Instant,
    /// This node opens no new stream on it (another connection won).
    pub(super) retired: bool,
    /// The keeper closed it: the peer went silent while busy.
    pub(super) silent: bool,
}

impl Link {
    /// Busy: streams open, or the last one ended less than `linger` ago.
    pub(super) fn busy(&self, now: Instant, linger: Duration) -> bool {
        let s = self.state.lock().expect("link state lock");
        s.streams > 0 || now < s.last_busy + linger
    }

    /// What the link choice needs of it (`engine::peer_link::choose`),
    /// its times as durations since `epoch`.
    pub(super) fn facts(&self, epoch: Instant, predates_pause: bool) -> LinkFacts {
        let s = self.state.lock().expect("link state lock");
        LinkFacts {
            dialled: self.dialled,
            legacy: self.legacy,
            open: self.conn.close_reason().is_none(),
            retired: s.retired,
            streams: s.streams,
            last_busy: s.last_busy.saturating_duration_since(epoch),
            established: self.established.saturating_duration_since(epoch),
            predates_pause,
        }
    }

    /// Marks a stream open on this connection until the [`Busy`] drops.
    pub(crate) fn enter(self: &Arc<Self>) -> Busy {
        let first = {
            let mut s = self.state.lock().expect("link state lock");
            s.streams += 1;
            s.streams == 1
        };
        if first {
            self.wake.notify_one();
        }
        Busy(self.clone())
    }
}

/// Holds a connection busy (its keeper pings) while a stream is open on it.
pub(crate) struct Busy(pub(super) Arc<Link>);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut s = self.0.state.lock().expect("link state lock");
        s.streams = s.streams.saturating_sub(1);
        s.last_busy = Instant::now();
    }
}

impl std::fmt::Debug for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Busy")
            .field("connection", &self.0.conn.stable_id())
            .finish()
    }
}

/// A request stream opened by [`PeerLinks::open`](super::PeerLinks::open): the send and receive
/// halves, and the hold that keeps its connection's liveness checks on.
#[derive(Debug)]
pub(crate) struct PeerStream {
    /// Request direction.
    pub(crate) send: quinn::SendStream,
    /// Response direction.
    pub(crate) recv: quinn::RecvStream,
    /// Dropped with the response body.
    pub(crate) busy: Busy,
    /// The frame layout of its connection.
    pub(crate) version: wire::Version,
}

/// A response body from a peer: a [`QuicBody`] that holds its connection
/// busy until the body is dropped.
pub(crate) struct PeerBody {
    inner: QuicBody,
    _busy: Busy,
}

impl PeerBody {
    pub(crate) fn new(inner: QuicBody, busy: Busy) -> PeerBody {
        PeerBody { inner, _busy: busy }
    }
}

impl http_body::Body for PeerBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BodyError>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// True when the connection negotiated the previous peer protocol (ALPN
/// `peerlb/1`).
pub(super) fn negotiated_v1(conn: &quinn::Connection) -> bool {
    conn.handshake_data()
        .and_then(|h| h.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|h| h.protocol)
        .is_some_and(|p| p == tls::ALPN_V1)
}

/// The frame layout of a connection, from the ALPN it negotiated:
/// `peerlb/3` the typed stream kind, anything else the header marks.
pub(super) fn negotiated_version(conn: &quinn::Connection) -> wire::Version {
    let v3 = conn
        .handshake_data()
        .and_then(|h| h.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|h| h.protocol)
        .is_some_and(|p| p == tls::ALPN);
    if v3 {
        wire::Version::V3
    } else {
        wire::Version::V2
    }
}

/// The node id an accepted connection's client certificate proves, or
/// `None` (the connection is then closed): the certificate must name
/// exactly one node id and verify for it.
pub(super) fn dialler_id(conn: &quinn::Connection) -> Option<NodeId> {
    let certs = conn.peer_identity().and_then(|id| {
        id.downcast::<Vec<rustls_pki_types::CertificateDer<'static>>>()
            .ok()
    });
    let Some(certs) = certs else {
        conn.close(1u32.into(), b"client certificate required");
        return None;
    };
    let id = tls::peer_node_id(&certs);
    match id.map(|id| tls::verify_peer_is(&certs, &id).map(|()| id)) {
        Some(Ok(id)) => Some(NodeId::from(id.as_str())),
        Some(Err(e)) => {
            warn!(target: LOG, error = %e, "peer certificate does not verify for the node it names: refusing the connection");
            conn.close(2u32.into(), b"certificate does not match a node id");
            None
        }
        None => {
            warn!(target: LOG, "peer certificate names no single node id: refusing the connection");
            conn.close(2u32.into(), b"certificate does not match a node id");
            None
        }
    }
}
