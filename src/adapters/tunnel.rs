//! Tunnels: what a WebSocket (an HTTP/1.1 `Upgrade: websocket` request the
//! app answered `101 Switching Protocols`) becomes after its heads. peerlb
//! relays the two byte streams both ways and never looks inside them: the
//! relay is protocol-agnostic.
//!
//! - At the entry, the client's connection (hyper's upgraded IO) is
//!   relayed to the owner's side of the tunnel: the QUIC stream the
//!   request went out on (forwarded owner) or the app's upgraded
//!   connection (local owner). A WebSocket over HTTP/2 (RFC 8441 extended
//!   CONNECT, `front::extended_connect`) takes the HTTP/1.1 form at the entry,
//!   so everything after it is the same; its client side is the HTTP/2
//!   stream (hyper's upgraded IO of the CONNECT), not the connection.
//! - At a forwarded owner, the QUIC stream is relayed to the app's
//!   upgraded connection.
//!
//! The app's side travels in the 101 response's extensions as a
//! [`Tunnel`]. Each relay ends when both directions have ended (a side
//! that ends its writes has its end passed on, so a close from either side
//! reaches the other), when neither direction moved a byte for the idle
//! timeout (`limits.websocket_idle_timeout_ms`), when the connection cap
//! closes the client connection of a tunnel idle past
//! `limits.tunnel_closable_after_ms` to admit a new one ([`Watched`],
//! `http/conns.rs`), or when the node closes the tunnels that outlived its
//! drain ([`Tunnels::close_all`]).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::engine::header_scan::Scan as _;
use http::{HeaderMap, Method, Version, header};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tracing::debug;

/// A byte stream both ways (a client connection, a QUIC stream pair, an
/// app connection).
pub(crate) trait Duplex: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Duplex for T {}

/// A tunnel's client connection as the connection table sees it: the relay
/// reports every byte it moves, and ends when the table closes the
/// connection to admit another (idle tunnels are closable at the cap).
pub(crate) trait Watched: Send + Sync + 'static {
    /// A byte moved, either way.
    fn touch(&self);
    /// Resolves once the table has closed the connection.
    fn cut(&self) -> Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>;
}

/// A boxed [`Duplex`].
pub(crate) type BoxIo = Box<dyn Duplex>;

/// Copy buffer of each direction, in bytes.
const RELAY_BUFFER: usize = 64 * 1024;

/// Default `limits.websocket_idle_timeout_ms`.
pub(crate) const DEFAULT_IDLE: Duration = Duration::from_secs(300);

enum Side {
    Ready(BoxIo),
    Hyper(hyper::upgrade::OnUpgrade),
}

/// The app's side of a tunnel, carried in a 101 response's extensions
/// (hence `Clone`: the first [`Tunnel::open`] takes it).
#[derive(Clone)]
pub(crate) struct Tunnel(Arc<Mutex<Option<Side>>>);

impl Tunnel {
    /// A tunnel whose IO is at hand (a QUIC stream pair, an in-process
    /// duplex).
    pub(crate) fn ready(io: BoxIo) -> Tunnel {
        Tunnel(Arc::new(Mutex::new(Some(Side::Ready(io)))))
    }

    /// A tunnel on a hyper connection that is being upgraded.
    pub(crate) fn hyper(on: hyper::upgrade::OnUpgrade) -> Tunnel {
        Tunnel(Arc::new(Mutex::new(Some(Side::Hyper(on)))))
    }

    /// The tunnel's IO (waits for a hyper upgrade to complete).
    ///
    /// # Errors
    /// `io::ErrorKind::Other` when the upgrade failed or the tunnel was
    /// already taken.
    pub(crate) async fn open(self) -> std::io::Result<BoxIo> {
        let side = self.0.lock().expect("tunnel lock").take();
        match side {
            Some(Side::Ready(io)) => Ok(io),
            Some(Side::Hyper(on)) => on
                .await
                .map(|u| Box::new(TokioIo::new(u)) as BoxIo)
                .map_err(std::io::Error::other),
            None => Err(std::io::Error::other("tunnel already taken")),
        }
    }
}

/// True for a request that asks to become a WebSocket: HTTP/1.1, a
/// `Connection` header naming `upgrade` and an `Upgrade` header naming
/// `websocket` (RFC 6455 section 4.1; tokens case-insensitive). Other
/// upgrades (h2c, TLS) are not tunnelled: their `Upgrade` header is
/// removed before the app, as before.
pub(crate) fn wants_websocket(method: &Method, version: Version, headers: &HeaderMap) -> bool {
    let names = |name: header::HeaderName, token: &str| {
        headers
            .all_of(&name)
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    // `Upgrade` first, by one lookup: most requests have none (the token
    // scan's iterators cost more than the lookup), and many a
    // `Connection: keep-alive` whose tokens would be scanned for nothing.
    method == Method::GET
        && version == Version::HTTP_11
        && headers.has(&header::UPGRADE)
        && names(header::UPGRADE, "websocket")
        && names(header::CONNECTION, "upgrade")
}

/// The GUID of the `Sec-WebSocket-Accept` computation (RFC 6455 section 1.3).
const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// `Sec-WebSocket-Accept` for `key` (RFC 6455 section 4.2.2): base64 of
/// the SHA-1 of the key (as sent, base64 text) and [`GUID`].
pub(crate) fn accept_key(key: &[u8]) -> String {
    use base64::Engine as _;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(key);
    ctx.update(GUID.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(ctx.finish().as_ref())
}

/// Why a relay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// Both directions ended (each side closed its writes).
    Closed,
    /// One side failed (reset, broken pipe).
    Failed,
    /// No byte either way for the idle timeout.
    Idle,
    /// The node closed it (drain timeout, shutdown).
    Shutdown,
    /// Idle at the connection cap: closed to admit a new connection.
    Cut,
}

/// Marks each successful read with the relay's clock, so the idle check
/// reads one atomic.
struct Active<T> {
    io: T,
    last: Arc<AtomicU64>,
    epoch: tokio::time::Instant,
    watched: Option<Arc<dyn Watched>>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Active<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            let ms = self.epoch.elapsed().as_millis() as u64;
            self.last.store(ms, Ordering::Relaxed);
            if let Some(w) = &self.watched {
                w.touch();
            }
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Active<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Relays `a` and `b` both ways until both directions end, one side
/// fails, neither direction moves a byte for `idle`, `close` turns true,
/// or the connection table closes `watched` (the client connection).
/// Returns why, and the bytes moved `a` to `b` and `b` to `a`.
pub(crate) async fn relay(
    a: BoxIo,
    b: BoxIo,
    idle: Duration,
    mut close: watch::Receiver<bool>,
    watched: Option<Arc<dyn Watched>>,
) -> (End, u64, u64) {
    let epoch = tokio::time::Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let mut a = Active {
        io: a,
        last: last.clone(),
        epoch,
        watched: watched.clone(),
    };
    let mut b = Active {
        io: b,
        last: last.clone(),
        epoch,
        watched: watched.clone(),
    };
    let cut = async {
        match &watched {
            Some(w) => w.cut().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(cut);
    let copy = tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, RELAY_BUFFER, RELAY_BUFFER);
    tokio::pin!(copy);
    let mut deadline = epoch + idle;
    loop {
        tokio::select! {
            r = &mut copy => return match r {
                Ok((ab, ba)) => (End::Closed, ab, ba),
                Err(e) => {
                    debug!(error = %e, "tunnel side failed");
                    (End::Failed, 0, 0)
                }
            },
            _ = tokio::time::sleep_until(deadline) => {
                let at = epoch + Duration::from_millis(last.load(Ordering::Relaxed)) + idle;
                if at <= tokio::time::Instant::now() {
                    return (End::Idle, 0, 0);
                }
                deadline = at;
            }
            _ = close.wait_for(|c| *c) => return (End::Shutdown, 0, 0),
            () = &mut cut => return (End::Cut, 0, 0),
        }
    }
}

/// Where a node's end of a tunnel is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The entry: a client connection relayed to the owner's side.
    Entry,
    /// A forwarded owner: a peer stream relayed to the app.
    Owner,
}

/// The tunnels a node relays: gauges and counters for the status and
/// metrics, the idle timeout, and the switch that closes them all.
#[derive(Debug)]
pub(crate) struct Tunnels {
    /// Open tunnels by role (`[entry, owner]`).
    open: [AtomicU64; 2],
    /// Tunnels opened since start by role.
    opened: [AtomicU64; 2],
    /// Tunnels closed for idleness since start.
    idle_closed: AtomicU64,
    /// `limits.websocket_idle_timeout_ms`, in ms.
    idle_ms: AtomicU64,
    close: watch::Sender<bool>,
}

impl Default for Tunnels {
    fn default() -> Tunnels {
        Tunnels {
            open: Default::default(),
            opened: Default::default(),
            idle_closed: AtomicU64::new(0),
            idle_ms: AtomicU64::new(DEFAULT_IDLE.as_millis() as u64),
            close: watch::channel(false).0,
        }
    }
}

/// Holds one place in a role's gauge.
struct Open<'a>(&'a AtomicU64);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Tunnels {
    /// Sets the idle timeout of the tunnels opened from now on.
    pub(crate) fn set_idle_timeout(&self, idle: Duration) {
        self.idle_ms
            .store(idle.as_millis() as u64, Ordering::Relaxed);
    }

    /// Relays `a` and `b` as a tunnel of `role` (see [`relay`]), counted
    /// while it is open.
    pub(crate) async fn run(&self, role: Role, a: BoxIo, b: BoxIo) -> End {
        self.run_counted(role, a, b, None).await.0
    }

    /// [`Tunnels::run`], with the bytes relayed each way: (why it ended,
    /// `a` to `b`, `b` to `a`), for the tunnel's access line; `watched` is
    /// the client connection's place in the connection table (entry).
    pub(crate) async fn run_counted(
        &self,
        role: Role,
        a: BoxIo,
        b: BoxIo,
        watched: Option<Arc<dyn Watched>>,
    ) -> (End, u64, u64) {
        let i = role as usize;
        self.opened[i].fetch_add(1, Ordering::Relaxed);
        self.open[i].fetch_add(1, Ordering::Relaxed);
        let _open = Open(&self.open[i]);
        let idle = Duration::from_millis(self.idle_ms.load(Ordering::Relaxed));
        let (end, ab, ba) = relay(a, b, idle, self.close.subscribe(), watched).await;
        if end == End::Idle {
            self.idle_closed.fetch_add(1, Ordering::Relaxed);
        }
        debug!(?role, ?end, a_to_b = ab, b_to_a = ba, "tunnel ended");
        (end, ab, ba)
    }

    /// Open tunnels of `role`.
    pub(crate) fn open(&self, role: Role) -> u64 {
        self.open[role as usize].load(Ordering::Relaxed)
    }

    /// Tunnels of `role` opened since start.
    pub(crate) fn opened(&self, role: Role) -> u64 {
        self.opened[role as usize].load(Ordering::Relaxed)
    }

    /// Tunnels closed for idleness since start.
    pub(crate) fn idle_closed(&self) -> u64 {
        self.idle_closed.load(Ordering::Relaxed)
    }

    /// Closes every open tunnel and every one opened later (the end of a
    /// drain).
    pub(crate) fn close_all(&self) {
        self.close.send_replace(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn hm(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, http::HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn accept_key_matches_rfc_6455_example() {
        // RFC 6455 section 1.3.
        assert_eq!(
            accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn only_http11_get_websocket_upgrades_are_tunnels() {
        let ws = hm(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "WebSocket"),
        ]);
        assert!(wants_websocket(&Method::GET, Version::HTTP_11, &ws));
        assert!(!wants_websocket(&Method::POST, Version::HTTP_11, &ws));
        assert!(!wants_websocket(&Method::GET, Version::HTTP_10, &ws));
        assert!(!wants_websocket(&Method::GET, Version::HTTP_2, &ws));
        let h2c = hm(&[("connection", "upgrade"), ("upgrade", "h2c")]);
        assert!(!wants_websocket(&Method::GET, Version::HTTP_11, &h2c));
        let no_conn = hm(&[("upgrade", "websocket")]);
        assert!(!wants_websocket(&Method::GET, Version::HTTP_11, &no_conn));
    }

    #[tokio::test]
    async fn a_relay_carries_both_ways_and_passes_a_close_on() {
        let (client, a) = tokio::io::duplex(1024);
        let (b, app) = tokio::io::duplex(1024);
        let (_tx, rx) = watch::channel(false);
        let relay = tokio::spawn(relay(
            Box::new(a),
            Box::new(b),
            Duration::from_secs(60),
            rx,
            None,
        ));
        let (mut cr, mut cw) = tokio::io::split(client);
        let (mut ar, mut aw) = tokio::io::split(app);
        cw.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        ar.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        aw.write_all(b"pong!").await.unwrap();
        let mut got = [0u8; 5];
        cr.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"pong!");
        // The client ends its writes: the app reads the end; the app ends
        // its own: the relay is done.
        cw.shutdown().await.unwrap();
        assert_eq!(ar.read(&mut got).await.unwrap(), 0);
        aw.shutdown().await.unwrap();
        assert_eq!(cr.read(&mut got).await.unwrap(), 0);
        assert_eq!(relay.await.unwrap(), (End::Closed, 4, 5));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_relay_ends_after_the_idle_timeout_and_not_before() {
        let (client, a) = tokio::io::duplex(1024);
        let (b, app) = tokio::io::duplex(1024);
        let (_tx, rx) = watch::channel(false);
        let t0 = tokio::time::Instant::now();
        let relay = tokio::spawn(relay(
            Box::new(a),
            Box::new(b),
            Duration::from_secs(10),
            rx,
            None,
        ));
        let (_cr, mut cw) = tokio::io::split(client);
        let (mut ar, _aw) = tokio::io::split(app);
        tokio::time::sleep(Duration::from_secs(6)).await;
        cw.write_all(b"x").await.unwrap();
        let mut got = [0u8; 1];
        ar.read_exact(&mut got).await.unwrap();
        let (end, _, _) = relay.await.unwrap();
        assert_eq!(end, End::Idle);
        // Ten seconds after the last byte, not after the start.
        assert!(
            t0.elapsed() >= Duration::from_secs(16),
            "{:?}",
            t0.elapsed()
        );
        assert!(t0.elapsed() < Duration::from_secs(17), "{:?}", t0.elapsed());
    }

    #[tokio::test]
    async fn close_all_ends_open_tunnels_and_the_gauge_follows() {
        let tunnels = Arc::new(Tunnels::default());
        let (_client, a) = tokio::io::duplex(1024);
        let (b, _app) = tokio::io::duplex(1024);
        let t = tunnels.clone();
        let run = tokio::spawn(async move { t.run(Role::Entry, Box::new(a), Box::new(b)).await });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while tunnels.open(Role::Entry) == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "tunnel never counted"
            );
            tokio::task::yield_now().await;
        }
        assert_eq!(tunnels.opened(Role::Entry), 1);
        tunnels.close_all();
        assert_eq!(run.await.unwrap(), End::Shutdown);
        assert_eq!(tunnels.open(Role::Entry), 0);
        assert_eq!(tunnels.open(Role::Owner), 0);
    }
}
