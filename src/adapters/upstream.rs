//! The connection pool to a node's upstream app: HTTP/1.1 keep-alive
//! connections, one request at a time each, kept for reuse once a response
//! body has been read to its end.
//!
//! A leaner path than `hyper_util`'s legacy client (no per-request pool
//! key, connector service, checkout channel or URI rebuilding): idle
//! connections are a LIFO stack (the most recently used, warmest, first),
//! and a connection goes back on it when the response body it carried
//! ends. docs/performance.md gives the effect.
//!
//! A request that a reused connection could not even start (the app
//! closed it while idle) is retried once per idle connection, then on a
//! new one: hyper hands such a request back untouched
//! ([`hyper::client::conn::http1::SendRequest::try_send_request`]), so
//! nothing is sent twice.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, Uri, Version, header};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use super::body::{Body, BodyError};

/// Longest wait for a TCP connection to the app.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// An idle connection older than this is closed rather than reused (the
/// app may have dropped it; most servers keep idle connections 60 s or
/// more).
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Most idle connections kept; more are closed when their response ends.
const MAX_IDLE: usize = 256;

/// Why the app could not be asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    /// The TCP connection failed.
    #[error("connecting: {0}")]
    Connect(std::io::Error),
    /// No TCP connection within [`CONNECT_TIMEOUT`].
    #[error("connecting: no answer within {} s", CONNECT_TIMEOUT.as_secs())]
    ConnectTimeout,
    /// The HTTP/1.1 connection could not be set up, or failed before a
    /// response head.
    #[error("{0}")]
    Http(#[from] hyper::Error),
}

/// A pool of HTTP/1.1 connections to one app (`http://host:port`).
pub(crate) struct Upstream {
    host: String,
    port: u16,
    authority: HeaderValue,
    idle: Arc<Idle>,
}

/// The idle connections, most recently returned last.
#[derive(Default)]
struct Idle(Mutex<Vec<(SendRequest<Body>, Instant)>>);

impl Idle {
    fn take(&self) -> Option<SendRequest<Body>> {
        let mut idle = self.0.lock().expect("upstream pool lock");
        while let Some((sender, since)) = idle.pop() {
            if !sender.is_closed() && since.elapsed() < IDLE_TIMEOUT {
                return Some(sender);
            }
        }
        None
    }

    fn put(&self, sender: SendRequest<Body>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.0.lock().expect("upstream pool lock");
        if idle.len() < MAX_IDLE {
            idle.push((sender, Instant::now()));
        }
    }
}

impl Upstream {
    /// A pool for the app at `base` (`http://host:port`, as config
    /// validation leaves it: scheme `http`, a host, a port or 80). Does no
    /// I/O: connections open on first use.
    pub(crate) fn new(base: &Uri) -> Upstream {
        let host = base.host().unwrap_or("127.0.0.1");
        let port = base.port_u16().unwrap_or(80);
        let authority = base
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .unwrap_or_else(|| HeaderValue::from_static("localhost"));
        Upstream {
            // `[::1]` in a URI is `::1` to connect to.
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port,
            authority,
            idle: Arc::default(),
        }
    }

    /// Sends `req` (origin-form target, the client's headers) to the app and
    /// returns its response, whose body streams from the app; the
    /// connection is reused once that body has been read to its end. Adds
    /// a `Host` header (the app's authority) when the request has none,
    /// and always speaks HTTP/1.1 to the app.
    ///
    /// # Errors
    /// [`UpstreamError`] when no connection could be made, or the app
    /// failed or closed the connection before a response head.
    pub(crate) async fn send(
        &self,
        mut req: Request<Body>,
    ) -> Result<Response<Body>, UpstreamError> {
        *req.version_mut() = Version::HTTP_11;
        if !req.headers().contains_key(header::HOST) {
            req.headers_mut()
                .insert(header::HOST, self.authority.clone());
        }
        loop {
            let (mut sender, reused) = match self.idle.take() {
                Some(s) => (s, true),
                None => (self.connect().await?, false),
            };
            if let Err(e) = sender.ready().await {
                if reused {
                    continue;
                }
                return Err(e.into());
            }
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    let (parts, body) = resp.into_parts();
                    let body = Pooled {
                        body,
                        ended: false,
                        sender: Some(sender),
                        idle: Arc::clone(&self.idle),
                    };
                    return Ok(Response::from_parts(
                        parts,
                        body.map_err(BodyError::Upstream).boxed_unsync(),
                    ));
                }
                Err(mut e) => match e.take_message() {
                    // Never started on a connection the app had closed:
                    // try the next one.
                    Some(r) if reused => req = r,
                    _ => return Err(e.into_error().into()),
                },
            }
        }
    }

    async fn connect(&self) -> Result<SendRequest<Body>, UpstreamError> {
        let stream = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect((self.host.as_str(), self.port)),
        )
        .await
        .map_err(|_| UpstreamError::ConnectTimeout)?
        .map_err(UpstreamError::Connect)?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream app connection ended with an error");
            }
        });
        Ok(sender)
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
