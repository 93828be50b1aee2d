//! What a client connection goes through before HTTP: the PROXY protocol
//! header when the listener expects one (`proxy_protocol`), then the TLS
//! handshake when the listener serves HTTPS. [`open`] turns an accepted
//! socket into the byte stream HTTP is served on ([`ClientIo`]) and the
//! connection's facts ([`ConnInfo`]): the client's address, and the TLS
//! facts the rules, the owner and the app are told.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::proxy_protocol::{self, ProxyError};
use crate::adapters::http::client_cert::EntryTls;
use crate::adapters::http::entry_tls::EntryCerts;
use crate::adapters::wire::TlsFacts;
use crate::seam::Connection;

/// The byte stream a client connection's HTTP is served on: the accepted
/// socket, after the PROXY header and the TLS handshake when the listener
/// has them (plain TCP, or a rustls server stream over it).
pub(crate) type ClientIo = Box<dyn Connection>;

/// What one client listener does before HTTP (`[listener]`).
pub(crate) struct ListenerSetup {
    /// Read a PROXY header within this time; `None`: never read one.
    pub proxy_protocol: Option<Duration>,
    /// Serve HTTPS: the server configurations (one per client
    /// certificate policy) and the certificates they serve.
    pub tls: Option<(Arc<EntryTls>, Arc<EntryCerts>)>,
    /// Longest TLS handshake (`limits.header_read_timeout_ms`: the head
    /// must come within it anyway).
    pub handshake_timeout: Duration,
}

impl ListenerSetup {
    /// A cleartext listener that expects no PROXY header.
    pub(crate) fn plain() -> ListenerSetup {
        ListenerSetup {
            proxy_protocol: None,
            tls: None,
            handshake_timeout: Duration::from_secs(30),
        }
    }
}

/// One client connection's facts, the same for every request on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConnInfo {
    /// The client's address: from the PROXY header when the listener
    /// expects one (and it carries one), else the socket's peer.
    pub client: SocketAddr,
    /// The socket's peer address (the sprayer's, behind a PROXY sender).
    pub peer: SocketAddr,
    /// The TLS facts; `None` for cleartext HTTP.
    pub tls: Option<TlsFacts>,
    /// Over TLS: the DNS names of the certificate the handshake served
    /// (`EntryCerts::names_for`), which a request's authority must be one
    /// of (else 421, `front/client_input.rs`); `None` for cleartext.
    pub cert_names: Option<Arc<[String]>>,
    /// The `X-Forwarded-Client-Cert` value of the client certificate the
    /// handshake verified (`client_cert.rs`), made once per connection;
    /// `None`: none was sent or asked for.
    pub client_cert: Option<http::HeaderValue>,
    /// The `X-Forwarded-For` and `Forwarded` values of a request on this
    /// connection that carries none of its own, made on the first request
    /// that needs them (`serve::forwarded::connection_values`): the
    /// client's address and scheme do not change on a connection.
    pub forwarded: std::sync::OnceLock<[http::HeaderValue; 2]>,
    /// Where the 1xx answers of this connection's HTTP/1.1 requests go,
    /// set by its HTTP/1.1 server (`informational`).
    pub informational: crate::adapters::informational::H1Sinks,
}

/// Why a connection was closed before HTTP.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    /// The PROXY header was missing, malformed, late or cut.
    #[error(transparent)]
    Proxy(#[from] ProxyError),
    /// The TLS handshake failed.
    #[error("tls handshake: {0}")]
    Handshake(io::Error),
    /// No TLS handshake within the timeout.
    #[error("tls handshake not complete within {0:?}")]
    HandshakeTimeout(Duration),
}

/// Takes an accepted connection from `peer` through `setup`: the stream to
/// serve HTTP on and the connection's facts.
///
/// # Errors
/// [`OpenError`]: the connection is to be closed.
pub(crate) async fn open(
    mut stream: Box<dyn Connection>,
    peer: SocketAddr,
    setup: &ListenerSetup,
) -> Result<(ClientIo, ConnInfo), OpenError> {
    let mut client = peer;
    if let Some(timeout) = setup.proxy_protocol {
        let (header, rest) = proxy_protocol::read_header(&mut stream, timeout).await?;
        client = header.source.unwrap_or(peer);
        if !rest.is_empty() {
            stream = Box::new(Prefixed {
                prefix: rest,
                inner: stream,
            });
        }
    }
    let Some((configs, certs)) = &setup.tls else {
        return Ok((
            stream,
            ConnInfo {
                client,
                peer,
                tls: None,
                cert_names: None,
                client_cert: None,
                forwarded: Default::default(),
                informational: Default::default(),
            },
        ));
    };
    // The ClientHello first: its SNI name picks the configuration (the
    // client certificate policy of the certificate that name gets).
    let handshake = async {
        let start =
            tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream)
                .await?;
        let config = configs.config_for(start.client_hello().server_name());
        start.into_stream(config).await
    };
    let tls = tokio::time::timeout(setup.handshake_timeout, handshake)
        .await
        .map_err(|_| OpenError::HandshakeTimeout(setup.handshake_timeout))?
        .map_err(OpenError::Handshake)?;
    let (_, session) = tls.get_ref();
    let client_cert = session
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| {
            http::HeaderValue::try_from(super::client_cert::forwarded_client_cert(c)).ok()
        });
    let facts = TlsFacts {
        sni: session.server_name().map(str::to_owned),
        version: session.protocol_version().map_or(0, u16::from),
        alpn: session.alpn_protocol().map(<[u8]>::to_vec),
    };
    let cert_names = Some(certs.names_for(facts.sni.as_deref()));
    Ok((
        Box::new(tls),
        ConnInfo {
            client,
            peer,
            tls: Some(facts),
            cert_names,
            client_cert,
            forwarded: Default::default(),
            informational: Default::default(),
        },
    ))
}

/// A stream whose first bytes were already read (past a PROXY header):
/// those first, then the stream itself.
struct Prefixed {
    prefix: Bytes,
    inner: Box<dyn Connection>,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.prefix.has_remaining() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_proxy_listener_takes_the_header_address_and_keeps_the_bytes_after_it() {
        let (mut a, b) = tokio::io::duplex(256);
        a.write_all(b"PROXY TCP4 203.0.113.9 10.0.0.1 4000 80\r\nGET / HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        drop(a);
        let setup = ListenerSetup {
            proxy_protocol: Some(Duration::from_secs(5)),
            ..ListenerSetup::plain()
        };
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let (mut io, info) = open(Box::new(b), peer, &setup).await.unwrap();
        assert_eq!(info.client, "203.0.113.9:4000".parse().unwrap());
        assert_eq!(info.peer, peer);
        let mut rest = String::new();
        io.read_to_string(&mut rest).await.unwrap();
        assert_eq!(rest, "GET / HTTP/1.1\r\n\r\n");
    }

    #[tokio::test]
    async fn a_plain_listener_never_reads_a_proxy_header() {
        let (mut a, b) = tokio::io::duplex(256);
        a.write_all(b"PROXY TCP4 203.0.113.9 10.0.0.1 4000 80\r\n")
            .await
            .unwrap();
        drop(a);
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let (mut io, info) = open(Box::new(b), peer, &ListenerSetup::plain())
            .await
            .unwrap();
        assert_eq!(
            info,
            ConnInfo {
                client: peer,
                peer,
                tls: None,
                cert_names: None,
                client_cert: None,
                forwarded: Default::default(),
                informational: Default::default(),
            }
        );
        let mut rest = String::new();
        io.read_to_string(&mut rest).await.unwrap();
        assert!(
            rest.starts_with("PROXY TCP4"),
            "the header is left to HTTP: {rest}"
        );
    }

    #[tokio::test]
    async fn a_proxy_listener_refuses_a_connection_without_a_header() {
        let (mut a, b) = tokio::io::duplex(256);
        a.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let setup = ListenerSetup {
            proxy_protocol: Some(Duration::from_secs(5)),
            ..ListenerSetup::plain()
        };
        let e = open(Box::new(b), "127.0.0.1:9".parse().unwrap(), &setup)
            .await
            .err()
            .unwrap();
        assert!(matches!(e, OpenError::Proxy(ProxyError::Missing)), "{e}");
    }
}
