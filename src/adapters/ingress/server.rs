//! The client server: the accept loop and each connection's HTTP/1.1
//! settings (keep-alive, half-close, head read timeout, send timeout).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::sync::watch;
use tracing::{Instrument, debug, info_span, warn};

use super::conns::{Closable, ConnTable, Refusal, Tracked};
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
    /// Answers one client request from `client`; never fails (errors
    /// become statuses).
    fn handle(
        &self,
        req: Request<Incoming>,
        client: SocketAddr,
    ) -> impl Future<Output = Response<Body>> + Send;
    /// Longest wait for a complete request head, idle keep-alive included.
    fn header_read_timeout(&self) -> Duration;
    /// Longest a write to a client may make no progress.
    fn send_timeout(&self) -> Duration;
    /// The open client connections (shared by every listener): the cap,
    /// the per-source cap, idle-first closing.
    fn conn_table(&self) -> &Arc<ConnTable>;
    /// The gauge of open client connections (shared by every listener).
    fn connections(&self) -> &AtomicU64;
    /// Counts a connection refused at accept, or an idle one closed.
    fn connection_event(&self, event: ConnEvent);
}

/// What the connection cap did ([`Handler::connection_event`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnEvent {
    /// A new connection was closed at accept.
    Refused(Refusal),
    /// An idle connection was closed to admit a new one.
    ClosedIdle,
}

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
/// each connection is watched by `graceful` so in-flight requests finish.
pub(crate) async fn serve<H: Handler>(
    mut listener: Box<dyn HttpListener>,
    ingress: Arc<H>,
    mut shutdown: watch::Receiver<bool>,
    graceful: Arc<GracefulShutdown>,
) {
    let local = listener.local_addr().ok();
    let header_timeout = ingress.header_read_timeout();
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
        let admitted = match table.admit(client.ip()) {
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
        let ing = ingress.clone();
        let (busy_table, conn) = (table.clone(), admitted.state.clone());
        let svc = service_fn(move |req| {
            let ing = ing.clone();
            // Busy until the response body is written (idle-first closing).
            let busy = busy_table.busy(&conn);
            async move {
                let resp = ing.handle(req, client).await;
                Ok::<_, std::convert::Infallible>(resp.map(|b| Tracked::new(b, busy)))
            }
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
            .serve_connection(
                TokioIo::new(Closable::new(
                    SendTimeout::new(stream, ingress.send_timeout()),
                    admitted.state.clone(),
                )),
                svc,
            );
        let fut = graceful.watch(conn);
        tokio::spawn(
            async move {
                let _slot = (slot, admitted);
                if let Err(e) = fut.await {
                    debug!(target: REQUEST_PATH, error = %e, "client connection ended with an error");
                }
            }
            .instrument(info_span!(target: REQUEST_PATH, "conn", %client)),
        );
    }
    if let Some(local) = local {
        debug!(target: REQUEST_PATH, %local, "listener closed");
    }
}
