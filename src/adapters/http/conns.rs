//! The open client connections of a listener group, under the cap
//! (`limits.max_connections`) with per-source fairness
//! (`limits.max_connections_per_source`) and idle-first closing.
//!
//! - **Per source** (nginx `limit_conn` on `$binary_remote_addr`, HAProxy
//!   `src_conn_cur`): a client IP address holding its share of the cap
//!   gets its new connections closed at accept, so one source cannot take
//!   every slot.
//! - **Idle first** (Envoy's overload manager, nginx reusing keep-alive
//!   connections under `worker_connections` pressure): at the cap, a new
//!   connection is admitted by closing the open connection that has been
//!   idle longest (no request in flight, no response being written). Only
//!   when every connection is busy is the new one closed at accept.
//!
//! - **Tunnels** (WebSockets, HTTP/1.1 or HTTP/2): a connection carrying
//!   one is busy, but one whose tunnels moved no byte either way for
//!   `limits.tunnel_closable_after_ms` is closable at the cap once no idle
//!   connection is left (its tunnels idle longest first: [`Watched`]), and
//!   open tunnels may hold at most `limits.max_tunnels_percent` of the cap
//!   ([`ConnTable::tunnels_full`]), so the rest stays for new clients.
//!
//! A connection is busy from the moment its request reaches the handler
//! until its response body has been written or dropped ([`Tracked`]). An
//! idle connection that is closed gets a read error ([`Closable`]), which
//! ends it the way a keep-alive timeout does: between requests, so nothing
//! is cut.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Buf;
use futures_util::task::AtomicWaker;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::adapters::tunnel::Watched;

/// Why a new connection was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `max` connections are open and every one is busy.
    Full,
    /// Its source address holds its share already.
    SourceFull,
}

/// The open connections and the limits they are held to.
#[derive(Debug)]
pub(crate) struct ConnTable {
    max: usize,
    per_source: usize,
    /// Hands out connection ids and activity ticks (one counter: both
    /// only need an order); outside the lock, so that a request's end
    /// takes no lock.
    tick: AtomicU64,
    inner: Mutex<Inner>,
    /// The clock of the tunnels' activity (ms since this instant).
    epoch: tokio::time::Instant,
    /// A connection whose tunnels moved no byte this long (ms) is
    /// closable at the cap.
    tunnel_closable_ms: u64,
    /// Most tunnels open at once.
    max_tunnels: usize,
    /// Tunnels open now.
    tunnels: AtomicUsize,
}

#[derive(Debug, Default)]
struct Inner {
    /// Open connections by id (ascending: admission order).
    open: BTreeMap<u64, Arc<ConnState>>,
    /// Open connections per source address (counts only; never iterated).
    by_source: HashMap<IpAddr, usize>,
}

/// One open connection's state, shared by its task and the table.
#[derive(Debug)]
pub(crate) struct ConnState {
    id: u64,
    source: IpAddr,
    /// Requests whose response has not been written yet.
    busy: AtomicU32,
    /// Tick of the last time it became idle (its admission at first).
    idle_since: AtomicU64,
    /// Set when the table closed it to admit another.
    closed: AtomicBool,
    /// The connection's reader, woken when the table closes it (one task
    /// reads a connection; registering is lock-free, unlike a `Notify`'s
    /// waiter list, which took a mutex on every read).
    close: AtomicWaker,
    /// Set when the node cut it while a response was in flight (the
    /// response budget, `relay`): reads and writes fail from then on.
    aborted: AtomicBool,
    /// Tunnels open on it (each also holds it busy).
    tunnels: AtomicU32,
    /// When one of its tunnels last moved a byte, ms after `epoch`.
    tunnel_active_ms: AtomicU64,
    /// The table's `epoch`.
    epoch: tokio::time::Instant,
    /// Set when the table closed it while its tunnels were idle: they end.
    tunnels_cut: AtomicBool,
    /// Wakes its tunnels' relays when `tunnels_cut` is set (used by
    /// tunnels only, never on a request's path).
    tunnels_cut_notify: tokio::sync::Notify,
}

/// An admitted connection: removes it from the table when dropped.
#[derive(Debug)]
pub(crate) struct Admitted {
    table: Arc<ConnTable>,
    /// The connection's state (wrap its IO in [`Closable`], its responses
    /// in [`Tracked`]).
    pub(crate) state: Arc<ConnState>,
    /// The source of the idle connection closed to make room, if any.
    pub(crate) evicted: Option<IpAddr>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut inner = self.table.inner.lock().expect("conn table lock");
        if inner.open.remove(&self.state.id).is_some() {
            inner.release_source(self.state.source);
        }
    }
}

impl Inner {
    fn release_source(&mut self, source: IpAddr) {
        if let Some(n) = self.by_source.get_mut(&source) {
            *n -= 1;
            if *n == 0 {
                self.by_source.remove(&source);
            }
        }
    }
}

impl ConnTable {
    /// A table for at most `max` connections, `per_source` of them from
    /// one address (both at least 1).
    pub(crate) fn new(max: usize, per_source: usize) -> Arc<ConnTable> {
        ConnTable::with_tunnels(max, per_source, std::time::Duration::MAX, 100)
    }

    /// [`ConnTable::new`], with tunnels idle `closable_after` closable at
    /// the cap, and at most `tunnel_percent` % of `max` (at least 1) open
    /// at once.
    pub(crate) fn with_tunnels(
        max: usize,
        per_source: usize,
        closable_after: std::time::Duration,
        tunnel_percent: u32,
    ) -> Arc<ConnTable> {
        let max = max.max(1);
        Arc::new(ConnTable {
            max,
            per_source: per_source.clamp(1, max),
            tick: AtomicU64::new(0),
            inner: Mutex::default(),
            epoch: tokio::time::Instant::now(),
            tunnel_closable_ms: u64::try_from(closable_after.as_millis()).unwrap_or(u64::MAX),
            max_tunnels: (max * tunnel_percent.min(100) as usize / 100).max(1),
            tunnels: AtomicUsize::new(0),
        })
    }

    /// Whether open tunnels hold their share of the cap
    /// (`limits.max_tunnels_percent`): a new one is refused (503).
    pub(crate) fn tunnels_full(&self) -> bool {
        self.tunnels.load(Ordering::Relaxed) >= self.max_tunnels
    }

    /// The most tunnels open at once.
    pub(crate) fn max_tunnels(&self) -> usize {
        self.max_tunnels
    }

    /// Counts a tunnel open on `conn` until the returned guard is dropped;
    /// its activity starts now. The caller holds `conn` busy meanwhile.
    pub(crate) fn tunnel(self: &Arc<Self>, conn: &Arc<ConnState>) -> TunnelGuard {
        self.tunnels.fetch_add(1, Ordering::Relaxed);
        conn.tunnels.fetch_add(1, Ordering::AcqRel);
        conn.touch();
        TunnelGuard {
            table: self.clone(),
            conn: conn.clone(),
        }
    }

    /// The connection to close at the cap when none is idle: one whose
    /// every busy mark is an open tunnel and whose tunnels moved no byte
    /// for `tunnel_closable_ms`, idle longest first.
    fn idle_tunnel(&self, inner: &Inner) -> Option<Arc<ConnState>> {
        if self.tunnel_closable_ms == u64::MAX {
            return None;
        }
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        inner
            .open
            .values()
            .filter(|c| {
                let t = c.tunnels.load(Ordering::Acquire);
                t > 0
                    && c.busy.load(Ordering::Acquire) <= t
                    && now.saturating_sub(c.tunnel_active_ms.load(Ordering::Relaxed))
                        >= self.tunnel_closable_ms
            })
            .min_by_key(|c| c.tunnel_active_ms.load(Ordering::Relaxed))
            .cloned()
    }

    /// The next connection id or activity tick (from 1).
    fn next_tick(&self) -> u64 {
        self.tick.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The cap (`limits.max_connections`).
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// The per-source cap.
    pub(crate) fn per_source(&self) -> usize {
        self.per_source
    }

    /// Connections open now.
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.inner.lock().expect("conn table lock").open.len()
    }

    /// Admits a connection from `source`: refused when `by_source` holds
    /// and the source holds its share, or when the table is full and no
    /// connection is idle; at the cap, the connection idle longest is
    /// closed to make room. `by_source` is false on a listener that reads
    /// a PROXY header: its connections all come from the sprayer, whose
    /// address is not a client's.
    ///
    /// # Errors
    /// The [`Refusal`].
    pub(crate) fn admit(
        self: &Arc<Self>,
        source: IpAddr,
        by_source: bool,
    ) -> Result<Admitted, Refusal> {
        let mut inner = self.inner.lock().expect("conn table lock");
        // A per-source cap equal to the cap is no per-source cap: a lone
        // source at the cap gets its idle connections closed, below.
        if by_source
            && self.per_source < self.max
            && inner.by_source.get(&source).copied().unwrap_or(0) >= self.per_source
        {
            return Err(Refusal::SourceFull);
        }
        let mut evicted = None;
        if inner.open.len() >= self.max {
            let victim = inner
                .open
                .values()
                .filter(|c| c.busy.load(Ordering::Acquire) == 0)
                .min_by_key(|c| c.idle_since.load(Ordering::Relaxed))
                .cloned()
                .or_else(|| self.idle_tunnel(&inner))
                .ok_or(Refusal::Full)?;
            inner.open.remove(&victim.id);
            inner.release_source(victim.source);
            victim.closed.store(true, Ordering::Release);
            victim.close.wake();
            if victim.tunnels.load(Ordering::Acquire) > 0 {
                victim.tunnels_cut.store(true, Ordering::Release);
                victim.tunnels_cut_notify.notify_waiters();
            }
            evicted = Some(victim.source);
        }
        let id = self.next_tick();
        let state = Arc::new(ConnState {
            id,
            source,
            busy: AtomicU32::new(0),
            idle_since: AtomicU64::new(id),
            closed: AtomicBool::new(false),
            close: AtomicWaker::new(),
            aborted: AtomicBool::new(false),
            tunnels: AtomicU32::new(0),
            tunnel_active_ms: AtomicU64::new(0),
            epoch: self.epoch,
            tunnels_cut: AtomicBool::new(false),
            tunnels_cut_notify: tokio::sync::Notify::new(),
        });
        inner.open.insert(id, state.clone());
        *inner.by_source.entry(source).or_insert(0) += 1;
        Ok(Admitted {
            table: self.clone(),
            state,
            evicted,
        })
    }

    /// Marks `conn` busy until the returned guard is dropped (at the end of
    /// its response body).
    pub(crate) fn busy(self: &Arc<Self>, conn: &Arc<ConnState>) -> BusyGuard {
        conn.busy.fetch_add(1, Ordering::AcqRel);
        BusyGuard {
            table: self.clone(),
            conn: conn.clone(),
        }
    }
}

/// Keeps a connection busy while it lives ([`ConnTable::busy`]).
#[derive(Debug)]
pub(crate) struct BusyGuard {
    table: Arc<ConnTable>,
    conn: Arc<ConnState>,
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        let tick = self.table.next_tick();
        self.conn.idle_since.store(tick, Ordering::Relaxed);
        if self.conn.busy.fetch_sub(1, Ordering::AcqRel) == 1
            && self.conn.closed.load(Ordering::Acquire)
        {
            // Closed while busy (its tunnels were cut): its reader may be
            // waiting, wake it to end the connection.
            self.conn.close.wake();
        }
    }
}

/// Counts one tunnel on a connection ([`ConnTable::tunnel`]).
#[derive(Debug)]
pub(crate) struct TunnelGuard {
    table: Arc<ConnTable>,
    conn: Arc<ConnState>,
}

impl TunnelGuard {
    /// What the tunnel's relay reports its activity to and waits on.
    pub(crate) fn watched(&self) -> Arc<dyn Watched> {
        self.conn.clone()
    }
}

impl Drop for TunnelGuard {
    fn drop(&mut self) {
        self.conn.tunnels.fetch_sub(1, Ordering::AcqRel);
        self.table.tunnels.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ConnState {
    /// Cuts the connection whatever is in flight on it: its next read,
    /// write or flush fails, which ends it; wakes its reader.
    pub(crate) fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        self.close.wake();
    }
}

impl Watched for ConnState {
    fn touch(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.tunnel_active_ms.store(ms, Ordering::Relaxed);
    }

    fn cut(&self) -> Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            loop {
                let notified = self.tunnels_cut_notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.tunnels_cut.load(Ordering::Acquire) {
                    return;
                }
                notified.await;
            }
        })
    }
}

/// A response body that keeps its connection busy until it has been
/// written (or dropped).
pub(crate) struct Tracked<B> {
    inner: B,
    _busy: BusyGuard,
}

impl<B> Tracked<B> {
    /// `inner`, keeping `busy` until it ends.
    pub(crate) fn new(inner: B, busy: BusyGuard) -> Self {
        Tracked { inner, _busy: busy }
    }
}

impl<B: HttpBody + Unpin> HttpBody for Tracked<B>
where
    B::Data: Buf,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A connection's IO that fails its reads once the table closed it while
/// idle ([`ConnTable::admit`]), which ends the connection.
pub(crate) struct Closable<S> {
    inner: S,
    conn: Arc<ConnState>,
}

impl<S> Closable<S> {
    /// `inner`, closed when `conn` is.
    pub(crate) fn new(inner: S, conn: Arc<ConnState>) -> Self {
        Closable { inner, conn }
    }

    /// The table closed the connection, and no request is in flight on
    /// it: a request that arrived after the connection was picked
    /// finishes; only an idle connection is cut.
    fn cut(&self) -> bool {
        self.aborted()
            || (self.conn.closed.load(Ordering::Acquire)
                && self.conn.busy.load(Ordering::Acquire) == 0)
    }

    /// Why reads fail once [`Closable::cut`].
    fn cut_error(&self) -> io::Error {
        if self.aborted() {
            abort_error()
        } else {
            cut_error()
        }
    }

    /// The node cut the connection ([`ConnState::abort`]).
    fn aborted(&self) -> bool {
        self.conn.aborted.load(Ordering::Acquire)
    }
}

fn cut_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "closed while idle to admit a new connection (limits.max_connections)",
    )
}

fn abort_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "cut: its response held the most of the node's response budget (limits.response_budget_bytes)",
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for Closable<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.cut() {
            return Poll::Ready(Err(self.cut_error()));
        }
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        if read.is_pending() {
            // About to wait for the client: be woken by a close too. The
            // flag is read again after registering, so a close between
            // the first check and the registration is not missed.
            self.conn.close.register(cx.waker());
            if self.cut() {
                return Poll::Ready(Err(self.cut_error()));
            }
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Closable<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.aborted() {
            return Poll::Ready(Err(abort_error()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.aborted() {
            return Poll::Ready(Err(abort_error()));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.aborted() {
            return Poll::Ready(Err(abort_error()));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn one_source_cannot_take_more_than_its_share() {
        let t = ConnTable::new(4, 2);
        let a1 = t.admit(ip("127.0.0.2"), true).unwrap();
        let _a2 = t.admit(ip("127.0.0.2"), true).unwrap();
        assert_eq!(
            t.admit(ip("127.0.0.2"), true).unwrap_err(),
            Refusal::SourceFull
        );
        let _b = t.admit(ip("127.0.0.3"), true).unwrap();
        drop(a1);
        assert!(t.admit(ip("127.0.0.2"), true).is_ok());
        // A share of 100 %: a lone source at the cap has its idle
        // connections closed, like any other.
        let t = ConnTable::new(2, 2);
        let _x = t.admit(ip("127.0.0.2"), true).unwrap();
        let _y = t.admit(ip("127.0.0.2"), true).unwrap();
        assert!(t.admit(ip("127.0.0.2"), true).unwrap().evicted.is_some());
    }

    #[test]
    fn a_proxy_protocol_listener_does_not_cap_its_sprayers_address() {
        // Every connection comes from the sprayer: only the cap applies.
        let t = ConnTable::new(4, 2);
        let held: Vec<_> = (0..4)
            .map(|_| t.admit(ip("198.51.100.1"), false).unwrap())
            .collect();
        assert_eq!(held.iter().filter(|a| a.evicted.is_some()).count(), 0);
        assert_eq!(t.open(), 4);
    }

    #[test]
    fn at_the_cap_the_connection_idle_longest_is_closed() {
        let t = ConnTable::new(3, 3);
        let a = t.admit(ip("10.0.0.1"), true).unwrap();
        let b = t.admit(ip("10.0.0.2"), true).unwrap();
        let c = t.admit(ip("10.0.0.3"), true).unwrap();
        // a served a request just now, b is busy: c has been idle longest.
        drop(t.busy(&a.state));
        let _b_busy = t.busy(&b.state);
        let d = t.admit(ip("10.0.0.4"), true).unwrap();
        assert_eq!(d.evicted, Some(ip("10.0.0.3")));
        assert!(c.state.closed.load(Ordering::Acquire));
        assert_eq!(t.open(), 3);
        // Then a (idle since its request), never the busy b.
        let e = t.admit(ip("10.0.0.5"), true).unwrap();
        assert_eq!(e.evicted, Some(ip("10.0.0.1")));
        // d and e are idle too now; with every connection busy: refused.
        let _d = t.busy(&d.state);
        let _e = t.busy(&e.state);
        assert_eq!(t.admit(ip("10.0.0.6"), true).unwrap_err(), Refusal::Full);
        // The closed connections' own drops change nothing.
        drop((a, c));
        assert_eq!(t.open(), 3);
    }

    #[tokio::test]
    async fn at_the_cap_a_connection_whose_tunnels_are_idle_is_closed_and_its_tunnels_end() {
        // Closable as soon as idle (0 ms), so the test needs no wait.
        let t = ConnTable::with_tunnels(2, 2, std::time::Duration::ZERO, 100);
        let a = t.admit(ip("10.0.0.1"), true).unwrap();
        let b = t.admit(ip("10.0.0.2"), true).unwrap();
        // a carries a tunnel (busy through it), b a request in flight.
        let _a_busy = t.busy(&a.state);
        let tunnel = t.tunnel(&a.state);
        let _b_busy = t.busy(&b.state);
        let watched = tunnel.watched();
        let c = t.admit(ip("10.0.0.3"), true).unwrap();
        assert_eq!(c.evicted, Some(ip("10.0.0.1")));
        // The tunnel's relay is told to end.
        tokio::time::timeout(std::time::Duration::from_secs(5), watched.cut())
            .await
            .expect("the tunnel was not cut");
        // b is never closed: with c idle, c goes first; with c busy too,
        // a new one is refused.
        let _c_busy = t.busy(&c.state);
        assert_eq!(t.admit(ip("10.0.0.4"), true).unwrap_err(), Refusal::Full);
    }

    #[test]
    fn a_tunnel_that_moved_a_byte_recently_is_not_closable() {
        let t = ConnTable::with_tunnels(1, 1, std::time::Duration::from_secs(60), 100);
        let a = t.admit(ip("10.0.0.1"), true).unwrap();
        let _busy = t.busy(&a.state);
        let _tunnel = t.tunnel(&a.state);
        assert_eq!(t.admit(ip("10.0.0.2"), true).unwrap_err(), Refusal::Full);
        // Without tunnels counted (ConnTable::new), never.
        let t = ConnTable::new(1, 1);
        let a = t.admit(ip("10.0.0.1"), true).unwrap();
        let _busy = t.busy(&a.state);
        let _tunnel = t.tunnel(&a.state);
        assert_eq!(t.admit(ip("10.0.0.2"), true).unwrap_err(), Refusal::Full);
    }

    #[test]
    fn open_tunnels_hold_at_most_their_share_of_the_cap() {
        // 768 connections, 75 %: 576 tunnels, so 192 places stay for
        // new clients whatever two sources hold open.
        let t = ConnTable::with_tunnels(768, 384, std::time::Duration::from_secs(60), 75);
        assert_eq!(t.max_tunnels(), 576);
        let conns: Vec<_> = (0..576)
            .map(|i| {
                t.admit(ip(if i % 2 == 0 { "10.0.0.1" } else { "10.0.0.2" }), true)
                    .unwrap()
            })
            .collect();
        let held: Vec<_> = conns
            .iter()
            .map(|c| (t.busy(&c.state), t.tunnel(&c.state)))
            .collect();
        assert!(t.tunnels_full());
        // Another client is admitted without closing anyone.
        assert_eq!(t.admit(ip("10.0.0.3"), true).unwrap().evicted, None);
        drop(held);
        assert!(!t.tunnels_full());
    }
}
