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
//! A connection is busy from the moment its request reaches the handler
//! until its response body has been written or dropped ([`Tracked`]). An
//! idle connection that is closed gets a read error ([`Closable`]), which
//! ends it the way a keep-alive timeout does: between requests, so nothing
//! is cut.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Buf;
use futures_util::task::AtomicWaker;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

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
        Arc::new(ConnTable {
            max: max.max(1),
            per_source: per_source.clamp(1, max.max(1)),
            tick: AtomicU64::new(0),
            inner: Mutex::default(),
        })
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
                .ok_or(Refusal::Full)?;
            inner.open.remove(&victim.id);
            inner.release_source(victim.source);
            victim.closed.store(true, Ordering::Release);
            victim.close.wake();
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
        self.conn.busy.fetch_sub(1, Ordering::AcqRel);
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
        self.conn.closed.load(Ordering::Acquire) && self.conn.busy.load(Ordering::Acquire) == 0
    }
}

fn cut_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "closed while idle to admit a new connection (limits.max_connections)",
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for Closable<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.cut() {
            return Poll::Ready(Err(cut_error()));
        }
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        if read.is_pending() {
            // About to wait for the client: be woken by a close too. The
            // flag is read again after registering, so a close between
            // the first check and the registration is not missed.
            self.conn.close.register(cx.waker());
            if self.cut() {
                return Poll::Ready(Err(cut_error()));
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
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
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
}
