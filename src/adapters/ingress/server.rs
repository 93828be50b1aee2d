//! The client server: the accept loop, which hands each accepted socket
//! to its own task, where `conn::open` reads the PROXY header and makes
//! the TLS handshake the listener asks for; then [`serve_connection`]
//! serves HTTP on the resulting stream with the connection's facts
//! ([`ConnInfo`]) and its HTTP/1.1 settings (keep-alive, half-close, head
//! read timeout, send timeout).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::sync::watch;
use tracing::{Instrument, debug, info_span, warn};

use super::conn::{self, ClientIo, ConnInfo, ListenerSetup, OpenError};
use crate::adapters::REQUEST_PATH;
use crate::adapters::body::Body;
use crate::adapters::send_timeout::SendTimeout;
use crate::env::HttpListener;

/// Largest read buffer of a client connection, in bytes: the peer frame
/// limit ([`crate::adapters::wire::MAX_HEAD_LEN`], 64 KiB), above peerlb's
/// head limit ([`super::limits::MAX_HEAD_BYTES`], 60 KiB) so the heads
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
    ) -> impl Future<Output = Response<Body>> + Send;
    /// Longest wait for a complete request head, idle keep-alive included.
    fn header_read_timeout(&self) -> Duration;
    /// Longest a write to a client may make no progress.
    fn send_timeout(&self) -> Duration;
    /// Most client connections open at once (over every listener).
    fn max_connections(&self) -> usize;
    /// The gauge of open client connections (shared by every listener).
    fn connections(&self) -> &AtomicU64;
    /// Counts a connection closed at accept because of the cap.
    fn connection_refused(&self);
    /// Counts a connection closed before HTTP: its PROXY header or TLS
    /// handshake failed (`conn::open`). Nothing by default.
    fn closed_before_http(&self, error: &OpenError) {
        let _ = error;
    }
}

/// Holds one place under the connection cap; gives it back when dropped.
struct ConnSlot<H: Handler>(Arc<H>);

impl<H: Handler> Drop for ConnSlot<H> {
    fn drop(&mut self) {
        self.0.connections().fetch_sub(1, Ordering::Relaxed);
    }
}

/// Takes a place under the cap (`max`), or `None` when `max` connections
/// are open.
fn take_slot<H: Handler>(ingress: &Arc<H>, max: usize) -> Option<ConnSlot<H>> {
    let max = max as u64;
    ingress
        .connections()
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < max).then_some(n + 1)
        })
        .ok()
        .map(|_| ConnSlot(ingress.clone()))
}

/// Accepts client connections on `listener` until `shutdown` turns true;
/// each goes through `setup` (PROXY header, TLS) in its own task, then is
/// served and watched by `graceful` so in-flight requests finish.
pub(crate) async fn serve<H: Handler>(
    mut listener: Box<dyn HttpListener>,
    setup: Arc<ListenerSetup>,
    ingress: Arc<H>,
    mut shutdown: watch::Receiver<bool>,
    graceful: Arc<GracefulShutdown>,
) {
    let local = listener.local_addr().ok();
    let header_timeout = ingress.header_read_timeout();
    let mut last_warn: Option<tokio::time::Instant> = None;
    let mut last_cap_warn: Option<tokio::time::Instant> = None;
    let max_connections = ingress.max_connections();
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
        // At the cap the new connection is closed at once: accepted, so it
        // leaves the kernel's backlog and the client sees a close instead
        // of a handshake that hangs.
        let Some(slot) = take_slot(&ingress, max_connections) else {
            drop(stream);
            ingress.connection_refused();
            if last_cap_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                warn!(target: REQUEST_PATH, max_connections, %client, "connection cap reached: closing new client connections (limits.max_connections)");
                last_cap_warn = Some(tokio::time::Instant::now());
            }
            continue;
        };
        let (ing, setup, watcher) = (ingress.clone(), setup.clone(), graceful.watcher());
        let mut stop = shutdown.clone();
        let span = info_span!(target: REQUEST_PATH, "conn", peer = %client, client = tracing::field::Empty);
        tokio::spawn(
            async move {
                let _slot = slot;
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
                        ing.closed_before_http(&e);
                        return;
                    }
                };
                if info.client != info.peer {
                    tracing::Span::current().record("client", tracing::field::display(info.client));
                }
                serve_connection(io, Arc::new(info), ing, header_timeout, watcher).await;
            }
            .instrument(span),
        );
    }
    if let Some(local) = local {
        debug!(target: REQUEST_PATH, %local, "listener closed");
    }
}

/// Serves HTTP/1.1 on one client connection's stream `io` (after the PROXY
/// header and the TLS handshake), every request with the connection's
/// facts `info`, until the connection closes or `watcher`'s shutdown has
/// let its in-flight request finish.
async fn serve_connection<H: Handler>(
    io: ClientIo,
    info: Arc<ConnInfo>,
    ingress: Arc<H>,
    header_timeout: Duration,
    watcher: Watcher,
) {
    let send_timeout = ingress.send_timeout();
    let svc = service_fn(move |req| {
        let (ing, info) = (ingress.clone(), info.clone());
        async move { Ok::<_, std::convert::Infallible>(ing.handle(req, info).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        // A forwarded answer still reaches a client that half-closed.
        .half_close(true)
        // Closes connections that send no complete head in time,
        // idle keep-alive connections included (slowloris).
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_timeout)
        // A connection's read buffer stops at the head limit's order
        // (hyper's default grows to about 408 KB): a head up to
        // READ_BUFFER_BYTES gets peerlb's own 431 (`limits::check`), a
        // longer one hyper's bare 431.
        .max_buf_size(READ_BUFFER_BYTES)
        .serve_connection(TokioIo::new(SendTimeout::new(io, send_timeout)), svc);
    if let Err(e) = watcher.watch(conn).await {
        debug!(target: REQUEST_PATH, error = %e, "client connection ended with an error");
    }
}
