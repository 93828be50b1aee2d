//! SIP over TCP: the accept loop and one task per connection. A SIP TCP
//! connection is a client connection like an HTTP one: it is admitted to
//! the same table (`limits.max_connections`, the per-source share,
//! idle-first closing: `http/conns.rs`), busy only while a message is
//! being answered, and closed when it is idle past
//! `limits.sip_idle_timeout_ms` (no byte either way; an RFC 5626 ping, a
//! double CRLF, is answered with one CRLF and keeps it open) or when a
//! message begun is not finished within `limits.header_read_timeout_ms`
//! (one deadline for the whole message, however its bytes trickle in).
//! With an upstream SIP server (`sip_app`) a connection is registered as
//! a flow with its first message (`serve/sip/flows.rs`), named in the
//! `Record-Route` of the dialogs it opens, so the server's requests
//! toward the caller are written on it (RFC 5923), until it closes.
//!
//! SIPS (`sips_addr`) is the same path over TLS: a connection admitted to
//! the table completes its TLS handshake within
//! `limits.header_read_timeout_ms`, then is served as a TCP one (RFC 3261
//! 26.2: TLS is a stream under the same framing; keep-alives are answered
//! inside TLS, RFC 5626 4.4.1).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::{Semaphore, mpsc, watch};
use tracing::{debug, info, warn};

use super::{LOG, SipEntry};
use crate::adapters::REQUEST_PATH;
use crate::adapters::http::conns::{Admitted, Closable};
use crate::adapters::http::{ConnTable, Refusal};
use crate::adapters::serve::sip::Flow;
use crate::engine::sip::{self as sipmsg, SipMessage, Transport, keepalive};
use crate::seam::{Connection, HttpListener};

/// What SIP TCP connections are held to.
#[derive(Clone, Debug)]
pub(crate) struct TcpLimits {
    /// The node's client connection table, shared with HTTP.
    pub(crate) conns: Arc<ConnTable>,
    /// A connection with no byte either way this long is closed
    /// (`limits.sip_idle_timeout_ms`).
    pub(crate) idle_timeout: Duration,
}

/// Counts one open connection in the client connections gauge while it
/// lives.
struct Gauge<'a>(&'a AtomicU64);

impl<'a> Gauge<'a> {
    fn new(g: &'a AtomicU64) -> Self {
        g.fetch_add(1, Ordering::Relaxed);
        Gauge(g)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves SIP over TCP on `listener`, bound to `local` (as
/// [`super::serve_udp`]), until `stop` turns true: each connection is
/// admitted to the connection table or closed at once, then served by its
/// own task, its messages in order, answers on the same connection. With
/// `tls` (a `sips_addr` listener) each connection is first a TLS
/// handshake with it; one that fails or does not end within the read
/// timeout closes the connection.
pub(crate) async fn serve_tcp(
    mut listener: Box<dyn HttpListener>,
    local: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    entry: Arc<SipEntry>,
    mut stop: watch::Receiver<bool>,
) {
    let transport = if tls.is_some() {
        Transport::Tls
    } else {
        Transport::Tcp
    };
    info!(target: LOG, addr = %local, transport = transport.param(), "listening for sip over a stream");
    let table = entry.tcp.conns.clone();
    let mut last_warn: Option<tokio::time::Instant> = None;
    let mut last_cap_warn: Option<tokio::time::Instant> = None;
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        let (conn, client) = match accepted {
            Ok(r) => r,
            Err(e) => {
                // Out of file descriptors, typically: say so once a
                // second, and do not spin on it.
                if last_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    warn!(target: LOG, error = %e, "sip tcp accept failed");
                    last_warn = Some(tokio::time::Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let cap_warn = last_cap_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        let counters = &entry.state.counters;
        let admitted = match table.admit(client.ip(), true) {
            Ok(a) => a,
            Err(why) => {
                drop(conn);
                match why {
                    Refusal::Full => &counters.connections_refused,
                    Refusal::SourceFull => &counters.connections_refused_source,
                }
                .fetch_add(1, Ordering::Relaxed);
                if cap_warn {
                    warn!(target: LOG, ?why, %client, "connection cap reached: closing a new sip tcp connection (limits.max_connections, limits.max_connections_per_source_percent)");
                    last_cap_warn = Some(tokio::time::Instant::now());
                }
                continue;
            }
        };
        if let Some(evicted) = admitted.evicted {
            counters
                .connections_closed_idle
                .fetch_add(1, Ordering::Relaxed);
            if cap_warn {
                warn!(target: LOG, %client, %evicted, "connection cap reached: closing the connection idle longest to admit a sip tcp connection (limits.max_connections)");
                last_cap_warn = Some(tokio::time::Instant::now());
            }
        }
        let (entry, stop, tls) = (entry.clone(), stop.clone(), tls.clone());
        tokio::spawn(async move {
            let io: Box<dyn Connection> = Box::new(Closable::new(conn, admitted.state.clone()));
            let io: Box<dyn Connection> = match tls {
                None => io,
                Some(acceptor) => {
                    let shake = tokio::time::timeout(entry.read_timeout, acceptor.accept(io));
                    match shake.await {
                        Ok(Ok(s)) => Box::new(s),
                        Ok(Err(e)) => {
                            debug!(target: REQUEST_PATH, %client, error = %e, "sips handshake failed");
                            return;
                        }
                        Err(_) => {
                            debug!(target: REQUEST_PATH, %client, "sips handshake unfinished within limits.header_read_timeout_ms");
                            return;
                        }
                    }
                }
            };
            connection(io, admitted, (client, local, transport), entry, stop).await
        });
    }
}

/// The TLS acceptor of a `sips_addr` listener serving `certs`: the
/// entry's HTTPS server configuration (TLS 1.3 and 1.2, resumption,
/// certificates by SNI name, reloaded with the listener's) without ALPN,
/// since SIP names no ALPN protocol, and no client certificates asked.
///
/// # Errors
/// rustls' own error when the configuration cannot be made.
pub(crate) fn sips_acceptor(
    certs: Arc<crate::adapters::http::entry_tls::EntryCerts>,
) -> Result<tokio_rustls::TlsAcceptor, rustls::Error> {
    let mut config = (*crate::adapters::http::entry_tls::server_config(certs)?).clone();
    config.alpn_protocols.clear();
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Why a connection's read ended it.
enum Ended {
    /// The client closed it, it failed, or the table closed it.
    Closed,
    /// No message begun and no byte for the idle timeout.
    Idle,
    /// A message begun and not finished within the read timeout.
    Unfinished,
}

/// Most messages of one connection answered at once; the next one is
/// read only when one of them ends. Several, so that a ringing INVITE
/// (answered when the callee picks up or Timer C fires) holds up neither
/// its CANCEL nor any other request on the same connection.
const MAX_CONN_INFLIGHT: usize = 64;

/// What the writer of a connection is handed.
enum Out {
    /// Bytes to write (an answer or a pong).
    Bytes(Vec<u8>),
    /// Close the connection's sending side, and stop.
    Shutdown,
}

/// Serves one admitted connection `io` (closable by the table; over TLS
/// once its handshake is done) whose client is `client`, on the listener
/// bound to `local` for `transport`.
async fn connection(
    io: Box<dyn Connection>,
    admitted: Admitted,
    (client, local, transport): (SocketAddr, SocketAddr, Transport),
    entry: Arc<SipEntry>,
    mut stop: watch::Receiver<bool>,
) {
    let _gauge = Gauge::new(&entry.state.counters.client_connections);
    let table = entry.tcp.conns.clone();
    let (mut reader, half) = tokio::io::split(io);
    // One writer: the answers of the messages in flight and the pongs go
    // out whole, one after the other, in the order they are handed over.
    let mut writer = Writer::Idle(half);
    let slots = Arc::new(Semaphore::new(MAX_CONN_INFLIGHT));
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = vec![0u8; 16 * 1024];
    // Half an RFC 5626 ping already skipped.
    let mut half = false;
    // When the message in `buf` began (its first byte's read).
    let mut begun: Option<tokio::time::Instant> = None;
    // The connection as a flow (RFC 5923), from its first message on.
    let mut flow: Option<(Flow, Arc<str>)> = None;
    let ended = loop {
        let k = keepalive::scan(&buf, half);
        buf.drain(..k.skip);
        half = k.half;
        for _ in 0..k.pongs {
            if writer
                .out()
                .send(Out::Bytes(keepalive::PONG.to_vec()))
                .is_err()
            {
                return;
            }
        }
        match sipmsg::frame_len(&buf) {
            Ok(Some(n)) => {
                let msg: Vec<u8> = buf.drain(..n).collect();
                begun = None;
                let slot = tokio::select! {
                    s = slots.clone().acquire_owned() => s.expect("the slots are never closed"),
                    _ = stop.wait_for(|s| *s) => return,
                };
                // Busy while it is answered: idle-first closing at the
                // cap passes it over.
                let busy = table.busy(&admitted.state);
                let (entry, out) = (entry.clone(), writer.out().clone());
                flow = flow.take().or_else(|| as_flow(&entry, &out));
                let token = flow.as_ref().map(|(_, t)| t.clone());
                tokio::spawn(async move {
                    let (_slot, _busy) = (slot, busy);
                    let send = |m: &SipMessage| {
                        let _ = out.send(Out::Bytes(m.to_bytes()));
                    };
                    let (at, flow) = ((transport, local), token.as_deref());
                    entry.handle(&msg, client, at, flow, &send).await;
                });
                continue;
            }
            Ok(None) => {}
            Err(e) => {
                entry
                    .state
                    .counters
                    .sip_malformed
                    .fetch_add(1, Ordering::Relaxed);
                debug!(target: REQUEST_PATH, %client, error = %e, "sip stream cannot be framed: closing");
                if let Some(answer) = sipmsg::bad_request(&buf, &e) {
                    let _ = writer.out().send(Out::Bytes(answer.to_bytes()));
                }
                let _ = writer.out().send(Out::Shutdown);
                writer.finish().await;
                return;
            }
        }
        // A message begun must be finished within the read timeout, as a
        // whole; between messages the connection may stay idle up to the
        // idle timeout (a CR kept for its LF is no message yet), and
        // longer while a message is still being answered.
        let pending = !buf.is_empty() && buf != b"\r";
        let now = tokio::time::Instant::now();
        let deadline = if pending {
            *begun.get_or_insert(now) + entry.read_timeout
        } else {
            begun = None;
            now + entry.tcp.idle_timeout
        };
        let read = tokio::time::timeout_at(deadline, reader.read(&mut chunk));
        let n = tokio::select! {
            r = read => match r {
                Ok(Ok(0) | Err(_)) => break Ended::Closed,
                Ok(Ok(n)) => n,
                Err(_) if pending => break Ended::Unfinished,
                Err(_) if slots.available_permits() < MAX_CONN_INFLIGHT => continue,
                Err(_) => break Ended::Idle,
            },
            _ = stop.wait_for(|s| *s) => return,
        };
        buf.extend_from_slice(&chunk[..n]);
    };
    match ended {
        Ended::Closed => {}
        Ended::Idle | Ended::Unfinished => {
            entry
                .state
                .counters
                .sip_tcp_timed_out
                .fetch_add(1, Ordering::Relaxed);
            let why = if matches!(ended, Ended::Idle) {
                "idle past limits.sip_idle_timeout_ms"
            } else {
                "message unfinished within limits.header_read_timeout_ms"
            };
            debug!(target: REQUEST_PATH, %client, why, "sip tcp connection closed");
            let _ = writer.out().send(Out::Shutdown);
            writer.finish().await;
        }
    }
}

/// The connection whose writer takes `out` as a flow of `entry`'s node
/// (RFC 5923), with its token for the `Record-Route`; `None` without an
/// upstream SIP server (nothing would send on it).
fn as_flow(entry: &SipEntry, out: &mpsc::UnboundedSender<Out>) -> Option<(Flow, Arc<str>)> {
    let up = entry.app.upstream()?;
    let o = out.clone();
    let f = up
        .flows()
        .register(Box::new(move |b| o.send(Out::Bytes(b)).is_ok()));
    let token = sipmsg::flow_token(&f.id(), entry.state.node_id().as_str());
    Some((f, token.into()))
}

/// Writes what `outgoing` hands over to `w` until a write fails, a
/// [`Out::Shutdown`] or every sender is gone.
async fn write_out<W: tokio::io::AsyncWrite + Unpin>(
    mut w: W,
    mut outgoing: mpsc::UnboundedReceiver<Out>,
) {
    while let Some(o) = outgoing.recv().await {
        match o {
            Out::Bytes(b) => {
                if w.write_all(&b).await.is_err() {
                    return;
                }
            }
            Out::Shutdown => {
                let _ = w.shutdown().await;
                return;
            }
        }
    }
}

/// A connection's writer: its write half, until something is to be
/// written; then a task that owns it, fed by a channel. An idle connection
/// never starts one, so when the table closes it the socket is closed as
/// this connection's task ends, not a task later (under a burst of new
/// connections at the cap, that lag would hold descriptors).
enum Writer<W> {
    /// Nothing written yet.
    Idle(W),
    /// The writer task and its channel.
    Running(mpsc::UnboundedSender<Out>, AbortOnDrop),
    /// Finished.
    Done,
}

impl<W: tokio::io::AsyncWrite + Unpin + Send + 'static> Writer<W> {
    /// The writer's channel; the first call starts the writer task.
    fn out(&mut self) -> &mpsc::UnboundedSender<Out> {
        if !matches!(self, Writer::Running(..)) {
            let (tx, rx) = mpsc::unbounded_channel();
            match std::mem::replace(self, Writer::Done) {
                Writer::Idle(w) => {
                    *self = Writer::Running(tx, AbortOnDrop(tokio::spawn(write_out(w, rx))));
                }
                // Finished: a channel nobody reads (sends fail).
                _ => {
                    *self = Writer::Running(tx, AbortOnDrop(tokio::spawn(async move { drop(rx) })))
                }
            }
        }
        match self {
            Writer::Running(tx, _) => tx,
            _ => unreachable!("the writer was just started"),
        }
    }

    /// Waits until the writer task has written what it was handed up to
    /// its [`Out::Shutdown`] (at once when none was started).
    async fn finish(&mut self) {
        if let Writer::Running(tx, task) = std::mem::replace(self, Writer::Done) {
            drop(tx);
            task.finish().await;
        }
    }
}

/// A connection's writer task, aborted when the connection's task ends
/// early (the node stops) and awaited when it ends on its own.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl AbortOnDrop {
    /// Waits until the writer has written what it was handed up to its
    /// [`Out::Shutdown`].
    async fn finish(mut self) {
        let _ = (&mut self.0).await;
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
