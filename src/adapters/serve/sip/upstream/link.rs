//! The owner's link to its upstream SIP server: one connected UDP socket
//! per node (`sip_app = "udp:..."`), or one TCP connection per node
//! (`sip_app = "tcp:..."`; `"tls:..."` is the same over TLS, the server's
//! certificate checked against `[sips] upstream_ca` only, [`UpstreamTls`]),
//! made on first use and made again on the next request once it closed. Over TCP one writer task writes the messages
//! whole, in order, and one reader task frames what the server sends
//! (RFC 3261 18.3, by `Content-Length`; CRLF keep-alives between messages
//! are skipped) and hands it on as the UDP reader does: an answer to its
//! transaction, a request to the callee relay, whose answers go back on
//! the same connection. A closed connection fails every transaction
//! waiting (`503`).
//!
//! [`CallerSocket`] is the other direction: the socket of one request
//! the upstream sent, relayed toward the caller over UDP, over the
//! caller's own TCP or TLS connection when its dialog names one, or, for a
//! `transport=tcp` target, over a new TCP connection of its own.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::debug;

use super::{CalleeRelay, Datagram, LOG, Waiting, hand_over};
use crate::engine::sip::proxy::Completed;
use crate::engine::sip::{self as sipmsg, MAX_MESSAGE, SipMessage};

/// The transport of `sip_app`.
#[derive(Clone)]
pub(crate) enum Transport {
    /// `udp:<ip>:<port>`: unreliable, requests resent on Timer A/E.
    Udp,
    /// `tcp:<ip>:<port>`: reliable, nothing resent (17.1.1.2).
    Tcp,
    /// `tls:<ip>:<port>`: TCP under TLS.
    Tls(UpstreamTls),
}

impl Transport {
    /// The name in a `Via` (`SIP/2.0/<name>`).
    pub(crate) fn via_name(&self) -> &'static str {
        match self {
            Transport::Udp => "UDP",
            Transport::Tcp => "TCP",
            Transport::Tls(_) => "TLS",
        }
    }
}

/// The client side of `sip_app = "tls:..."`: TLS 1.3 and 1.2 (ring), the
/// server's certificate verified against the CA file `[sips] upstream_ca`
/// names (no system roots) for `[sips] upstream_server_name`, else for
/// the server's IP (an IP address name in its certificate).
#[derive(Clone)]
pub(crate) struct UpstreamTls {
    connector: tokio_rustls::TlsConnector,
    name: rustls_pki_types::ServerName<'static>,
}

/// `[sips] upstream_ca` or `upstream_server_name` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamTlsError {
    /// The CA file cannot be read or holds no certificate: fix
    /// `sips.upstream_ca`.
    #[error("sips.upstream_ca: {0}")]
    Ca(String),
    /// The name is neither a DNS name nor an IP: fix
    /// `sips.upstream_server_name`.
    #[error("sips.upstream_server_name: {0:?} is not a DNS name or an IP")]
    Name(String),
}

impl UpstreamTls {
    /// Trusts the CA certificates of the PEM file `ca`; checks the server
    /// for `name`, else for `ip`.
    ///
    /// # Errors
    /// [`UpstreamTlsError`] naming the field at fault.
    pub(crate) fn load(
        ca: &std::path::Path,
        name: Option<&str>,
        ip: std::net::IpAddr,
    ) -> Result<UpstreamTls, UpstreamTlsError> {
        use rustls_pki_types::pem::PemObject as _;
        let shown = ca.display();
        let certs = rustls_pki_types::CertificateDer::pem_file_iter(ca)
            .map_err(|e| UpstreamTlsError::Ca(format!("{shown}: {e}")))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| UpstreamTlsError::Ca(format!("{shown}: {e}")))?;
        let mut roots = rustls::RootCertStore::empty();
        for c in certs {
            roots
                .add(c)
                .map_err(|e| UpstreamTlsError::Ca(format!("{shown}: {e}")))?;
        }
        if roots.is_empty() {
            return Err(UpstreamTlsError::Ca(format!("{shown}: no certificate")));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| UpstreamTlsError::Ca(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = match name {
            Some(n) => rustls_pki_types::ServerName::try_from(n.to_owned())
                .map_err(|_| UpstreamTlsError::Name(n.to_owned()))?,
            None => rustls_pki_types::ServerName::IpAddress(ip.into()),
        };
        Ok(UpstreamTls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            name,
        })
    }
}

/// One open link to the upstream.
pub(crate) enum Link {
    /// A UDP socket connected to the upstream.
    Udp(Arc<UdpSocket>),
    /// A TCP connection: its writer's channel, its local address, and
    /// whether it is still open.
    Tcp {
        out: mpsc::UnboundedSender<Vec<u8>>,
        local: SocketAddr,
        open: Arc<AtomicBool>,
        /// Under TLS (`sip_app = "tls:..."`).
        tls: bool,
    },
}

impl Link {
    /// Sends `bytes` (one whole SIP message).
    ///
    /// # Errors
    /// The socket's error, or `BrokenPipe` when the TCP connection closed.
    pub(crate) async fn send(&self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Link::Udp(s) => s.send(bytes).await.map(|_| ()),
            Link::Tcp { out, .. } => out
                .send(bytes.to_vec())
                .map_err(|_| std::io::ErrorKind::BrokenPipe.into()),
        }
    }

    /// The address the upstream sees this link come from (the owner's
    /// `Via` sent-by).
    ///
    /// # Errors
    /// The socket's error.
    pub(crate) fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            Link::Udp(s) => s.local_addr(),
            Link::Tcp { local, .. } => Ok(*local),
        }
    }

    /// Whether the transport is reliable (nothing is resent on it).
    pub(crate) fn reliable(&self) -> bool {
        matches!(self, Link::Tcp { .. })
    }

    /// Whether it can still carry a message (a UDP socket always can).
    pub(crate) fn is_open(&self) -> bool {
        match self {
            Link::Udp(_) => true,
            Link::Tcp { open, .. } => open.load(Ordering::Relaxed),
        }
    }

    /// The transport's name in a `Via`.
    pub(crate) fn via_name(&self) -> &'static str {
        match self {
            Link::Udp(_) => Transport::Udp.via_name(),
            Link::Tcp { tls: false, .. } => Transport::Tcp.via_name(),
            Link::Tcp { tls: true, .. } => "TLS",
        }
    }
}

/// What a link's reader hands messages to.
pub(crate) struct Readers {
    pub(crate) waiting: Arc<Waiting>,
    pub(crate) callee: Arc<CalleeRelay>,
    pub(crate) completed: Arc<Mutex<Completed>>,
    pub(crate) epoch: Instant,
}

/// Opens a link over `transport` to `addr` (a TCP connect, and a TLS
/// handshake after it, each wait at most `connect_timeout`) and starts its
/// reader task (and, over TCP, its writer task).
///
/// # Errors
/// The socket's or the connection's error; `TimedOut` for a connect that
/// took too long.
pub(crate) async fn open(
    transport: &Transport,
    addr: SocketAddr,
    connect_timeout: Duration,
    readers: Readers,
) -> std::io::Result<Link> {
    let timed_out = || std::io::Error::from(std::io::ErrorKind::TimedOut);
    match transport {
        Transport::Udp => {
            let s = Arc::new(super::connected(addr).await?);
            tokio::spawn(read_datagrams(s.clone(), readers));
            Ok(Link::Udp(s))
        }
        Transport::Tcp | Transport::Tls(_) => {
            let stream = tokio::time::timeout(connect_timeout, TcpStream::connect(addr))
                .await
                .map_err(|_| timed_out())??;
            let _ = stream.set_nodelay(true);
            let local = stream.local_addr()?;
            let stream: Box<dyn crate::seam::Connection> = match transport {
                Transport::Tls(t) => Box::new(
                    tokio::time::timeout(
                        connect_timeout,
                        t.connector.connect(t.name.clone(), stream),
                    )
                    .await
                    .map_err(|_| timed_out())??,
                ),
                _ => Box::new(stream),
            };
            let tls = matches!(transport, Transport::Tls(_));
            let (mut rd, mut wr) = tokio::io::split(stream);
            let (out, mut outgoing) = mpsc::unbounded_channel::<Vec<u8>>();
            let open = Arc::new(AtomicBool::new(true));
            let writer_open = open.clone();
            tokio::spawn(async move {
                while let Some(b) = outgoing.recv().await {
                    if let Err(e) = wr.write_all(&b).await {
                        debug!(target: LOG, error = %e, "sip upstream tcp write failed");
                        break;
                    }
                }
                writer_open.store(false, Ordering::Relaxed);
                let _ = wr.shutdown().await;
            });
            let (reply, reader_open) = (out.clone(), open.clone());
            tokio::spawn(async move {
                let mut buf: Vec<u8> = Vec::with_capacity(4096);
                let mut chunk = vec![0u8; 16 * 1024];
                'read: loop {
                    loop {
                        let skip = sipmsg::leading_crlf(&buf);
                        buf.drain(..skip);
                        match sipmsg::frame_len(&buf) {
                            Ok(Some(n)) => {
                                let bytes: Vec<u8> = buf.drain(..n).collect();
                                if let Ok(msg) = sipmsg::parse(&bytes) {
                                    let tx = reply.clone();
                                    take(msg, &readers, move |b| {
                                        let _ = tx.send(b);
                                    });
                                }
                            }
                            Ok(None) if buf.len() <= MAX_MESSAGE => break,
                            _ => {
                                debug!(target: LOG, "sip upstream tcp stream cannot be framed: closing");
                                break 'read;
                            }
                        }
                    }
                    match rd.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                reader_open.store(false, Ordering::Relaxed);
                debug!(target: LOG, "sip upstream tcp connection closed");
                fail_waiting(&readers.waiting);
            });
            Ok(Link::Tcp {
                out,
                local,
                open,
                tls,
            })
        }
    }
}

/// Hands `msg`, from the upstream, on: a request to the callee relay in a
/// task of its own (its answers to `send`), a response to its transaction
/// (a retransmitted non-2xx final answer to an INVITE the owner ACKed
/// gets that ACK again, to `send`).
fn take(msg: SipMessage, readers: &Readers, send: impl Fn(Vec<u8>) + Send + Sync + 'static) {
    if msg.method().is_some() {
        let callee = readers.callee.clone();
        tokio::spawn(async move {
            let emit = move |m: &SipMessage| send(m.to_bytes());
            callee.relay(msg, &emit).await;
        });
        return;
    }
    if let Some(ack) = hand_over(msg, &readers.waiting, (&readers.completed, readers.epoch)) {
        send(ack);
    }
}

/// Tells every transaction waiting that the link failed.
fn fail_waiting(waiting: &Waiting) {
    for tx in waiting.lock().expect("waiting lock").values() {
        let _ = tx.send(Datagram::Failed);
    }
}

/// Reads the upstream's datagrams on `socket` for as long as the node
/// runs, each handed on by [`take`] (answers go back on `socket`); a
/// socket error goes to every waiting transaction.
async fn read_datagrams(socket: Arc<UdpSocket>, readers: Readers) {
    let mut buf = vec![0u8; MAX_MESSAGE + 1];
    loop {
        match socket.recv(&mut buf).await {
            Ok(n) => {
                let Ok(msg) = sipmsg::parse(&buf[..n]) else {
                    continue;
                };
                let s = socket.clone();
                take(msg, &readers, move |b| {
                    let _ = s.try_send(&b);
                });
            }
            Err(e) => {
                debug!(target: LOG, error = %e, "sip upstream socket error");
                fail_waiting(&readers.waiting);
            }
        }
    }
}

/// The socket of one request relayed toward a caller: a UDP socket
/// connected to the target, a TCP connection to it (a new one), or the
/// caller's own connection (RFC 5923, `upstream/flow.rs`), read one
/// whole message at a time.
pub(crate) enum CallerSocket {
    /// Over UDP.
    Udp(UdpSocket),
    /// Over TCP, with what was read of the next message.
    Tcp { stream: TcpStream, buf: Vec<u8> },
    /// Over the caller's own TCP or TLS connection, held by an entry node
    /// (RFC 5923): nothing is read here, the caller's answers come to the
    /// relay as answers that reached a listener.
    Flow(super::flow::FlowSocket),
}

impl CallerSocket {
    /// A TCP connection to `to`, made within `connect_timeout`.
    ///
    /// # Errors
    /// The connection's error, `TimedOut` when it took too long.
    pub(crate) async fn tcp(to: SocketAddr, connect_timeout: Duration) -> std::io::Result<Self> {
        let stream = tokio::time::timeout(connect_timeout, TcpStream::connect(to))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        let _ = stream.set_nodelay(true);
        Ok(CallerSocket::Tcp {
            stream,
            buf: Vec::new(),
        })
    }

    /// The address the caller sees the request come from.
    ///
    /// # Errors
    /// The socket's error.
    pub(crate) fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            CallerSocket::Udp(s) => s.local_addr(),
            CallerSocket::Tcp { stream, .. } => stream.local_addr(),
            CallerSocket::Flow(f) => Ok(crate::engine::sip::upstream::flow_via(&f.route).1),
        }
    }

    /// Whether nothing is resent on it (TCP).
    pub(crate) fn reliable(&self) -> bool {
        !matches!(self, CallerSocket::Udp(_))
    }

    /// The transport's name in a `Via`.
    pub(crate) fn via_name(&self) -> &'static str {
        match self {
            CallerSocket::Udp(_) => Transport::Udp.via_name(),
            CallerSocket::Tcp { .. } => Transport::Tcp.via_name(),
            CallerSocket::Flow(f) => crate::engine::sip::upstream::flow_via(&f.route).0,
        }
    }

    /// Sends one whole message.
    ///
    /// # Errors
    /// The socket's error.
    pub(crate) async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            CallerSocket::Udp(s) => s.send(bytes).await.map(|_| ()),
            CallerSocket::Tcp { stream, .. } => stream.write_all(bytes).await,
            CallerSocket::Flow(f) => f.send(bytes).await,
        }
    }

    /// Reads the next message into `out` (at most [`MAX_MESSAGE`] bytes)
    /// and returns its length. Cancel-safe: a read dropped unfinished
    /// loses no byte.
    ///
    /// # Errors
    /// The socket's error; over TCP `UnexpectedEof` when the connection
    /// closed, `InvalidData` for a stream that cannot be framed.
    pub(crate) async fn recv(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        match self {
            CallerSocket::Udp(s) => s.recv(out).await,
            CallerSocket::Flow(_) => std::future::pending().await,
            CallerSocket::Tcp { stream, buf } => loop {
                let skip = sipmsg::leading_crlf(buf);
                buf.drain(..skip);
                match sipmsg::frame_len(buf) {
                    Ok(Some(n)) if n <= out.len() => {
                        out[..n].copy_from_slice(&buf[..n]);
                        buf.drain(..n);
                        return Ok(n);
                    }
                    Ok(None) if buf.len() <= MAX_MESSAGE => {}
                    _ => return Err(std::io::ErrorKind::InvalidData.into()),
                }
                let mut chunk = [0u8; 4096];
                match stream.read(&mut chunk).await? {
                    0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                    n => buf.extend_from_slice(&chunk[..n]),
                }
            },
        }
    }
}
