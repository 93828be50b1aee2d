//! Response bodies on their way to a client connection: backpressure, the
//! stall cut, and the node's budget of buffered response bytes.
//!
//! Every response body the client server writes passes through a
//! [`Relay`]:
//!
//! - **One frame at a time.** A frame handed to the connection (hyper's
//!   HTTP/1.1 write queue, the h2 crate's send buffer) is a lease: the
//!   relay polls its source for the next frame only once the client
//!   connection has let go of the previous one, i.e. once it was written
//!   to the socket. A forwarded answer's source is the peer stream, whose
//!   receive window is `limits.response_buffer_bytes`
//!   (`transport::peer::quic_config`), so a client that stops reading
//!   stops the owner within that window plus one frame (at most 64 KiB).
//!   Without this, hyper's HTTP/2 server polls a body for a second frame
//!   as soon as the first is queued, whatever the client's window.
//! - **The stall cut.** A frame not taken within `limits.send_timeout_ms`
//!   ends the body with [`BodyError::Stalled`]: hyper resets that HTTP/2
//!   stream (RST_STREAM, the connection's other streams go on) and closes
//!   an HTTP/1.1 connection, as the socket's own send timeout
//!   (`send_timeout`) does. Progress is counted per frame: a client that
//!   takes less than one frame per send timeout is cut. On HTTP/2 a
//!   body's end is told only once its last frame was let go (then an
//!   empty DATA frame carries END_STREAM), so a small answer the client
//!   never takes is cut too.
//! - **The budget** ([`ResponseBudget`], Envoy's overload manager
//!   "reset high memory streams"). Each relay is a holder charged the
//!   bytes of its frame at the connection, plus, for a forwarded answer
//!   ([`Answer::from_peer`]) whose peer stream has a backlog (its last read found
//!   data waiting, so the client or this node is slower than the owner),
//!   twice the stream's window: quinn holds up to the window for us, in
//!   packet buffers it shares ([`WINDOW_PINS`]). The charge goes when a
//!   read finds the stream empty. When the node's charges pass
//!   `limits.response_budget_bytes`, the holders that hold the most (of
//!   equal ones, the one that made no progress for longest) are cut until
//!   the rest fit: the body fails with [`BodyError::OverBudget`], and an
//!   HTTP/1.1 connection is aborted ([`ConnState::abort`]; hyper does not
//!   poll a body while its write queue is full). The frame that passed the
//!   budget is still sent: new work is admitted, the largest holders pay.
//!
//! Costs: per response with a body, one small allocation (its holder) and,
//! unless its first frame is its last, a registration (a short lock of the
//! holders' map, again when it ends); per frame one small allocation (the
//! lease) and two short uncontended locks. An HTTP/1.1 answer whose first
//! frame is its last (most are) has no holder: its lease charges the
//! node's total alone, two atomic operations.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tracing::debug;

use super::conns::ConnState;
use crate::adapters::REQUEST_PATH;
use crate::adapters::body::BodyError;

/// What a forwarded answer's full peer window costs, in multiples of the
/// window: quinn keeps each received datagram batch (up to 10 packets of
/// 6,500 bytes, read with GRO) in one allocation that every stream chunk
/// in it shares, so the bytes a stalled stream holds pin batches that
/// carried other streams too. Measured: 300 stalled HTTP/1.1 connections
/// with 256 KiB windows held about 550 KiB each in the entry
/// (tests/backpressure.rs).
const WINDOW_PINS: u64 = 2;

/// A handler's answer to one client request: the response, and whether
/// its body is a forwarded answer read from a peer stream, so while one
/// of its frames waits for the client the stream's receive window fills
/// (charged to the budget as held). Set by the entry's forward path; a
/// flag beside the response, not a response extension (an extension is
/// two allocations per forwarded request).
#[derive(Debug)]
pub(crate) struct Answer<B> {
    /// The response to write.
    pub(crate) response: http::Response<B>,
    /// The body comes from a peer stream.
    pub(crate) from_peer: bool,
}

impl<B> From<http::Response<B>> for Answer<B> {
    /// A response not read from a peer.
    fn from(response: http::Response<B>) -> Self {
        Answer {
            response,
            from_peer: false,
        }
    }
}

/// Responses a [`ResponseBudget`] cut, by cause (the status's
/// `counters.responses_cut_budget` and `responses_cut_stalled`).
#[derive(Debug, Default)]
pub(crate) struct CutCounts {
    /// Cut at the budget: they held the most.
    pub(crate) budget: AtomicU64,
    /// Cut for a frame the client did not take within the send timeout.
    pub(crate) stalled: AtomicU64,
}

/// The node's budget of response bytes held for clients, and the registry
/// of the relays holding them. Shared by every client connection.
pub(crate) struct ResponseBudget {
    /// Most bytes charged at once before holders are cut
    /// (`limits.response_budget_bytes`).
    limit: u64,
    /// The peer streams' receive window (`limits.response_buffer_bytes`):
    /// the charge of a forwarded answer's window while a frame waits.
    window: u64,
    /// Longest a frame may wait for the client (`limits.send_timeout_ms`).
    stall: Duration,
    /// Bytes charged to every holder (signed: charges and releases race).
    total: AtomicI64,
    /// Of `total`, what holders already cut still hold (on their way out).
    cut_held: AtomicI64,
    /// The holders, by registration order.
    holders: Mutex<BTreeMap<u64, Arc<Holder>>>,
    next_id: AtomicU64,
    /// Responses cut, by cause.
    counts: Arc<CutCounts>,
}

impl ResponseBudget {
    /// A budget of `limit` bytes; `window` is the peer streams' receive
    /// window, `stall` the send timeout; cuts are counted in `counts`.
    pub(crate) fn new(
        limit: u64,
        window: u64,
        stall: Duration,
        counts: Arc<CutCounts>,
    ) -> Arc<ResponseBudget> {
        Arc::new(ResponseBudget {
            limit,
            window,
            stall,
            total: AtomicI64::new(0),
            cut_held: AtomicI64::new(0),
            holders: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            counts,
        })
    }

    /// Bytes charged now, cut holders' included.
    pub(crate) fn held(&self) -> u64 {
        u64::try_from(self.total.load(Ordering::Acquire)).unwrap_or(0)
    }

    /// Charges of holders not cut, over the limit.
    fn over(&self) -> bool {
        let live = self.total.load(Ordering::Acquire) - self.cut_held.load(Ordering::Acquire);
        live > i64::try_from(self.limit).unwrap_or(i64::MAX)
    }

    /// A new holder; in the registry (so the budget can cut it) unless
    /// `last`: a body whose first frame is its last holds that frame only,
    /// for as long as its client takes it, and costs no lock of the
    /// registry (most answers are one frame; on HTTP/1.1 such a body has
    /// no holder at all, [`Charged::Budget`]).
    fn register(self: &Arc<Self>, conn: Option<Arc<ConnState>>, last: bool) -> Arc<Holder> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let h = Arc::new(Holder {
            id,
            registered: !last,
            budget: self.clone(),
            conn,
            acct: Mutex::new(Acct {
                held: 0,
                leased: 0,
                parked: false,
                cut: false,
                // Read by the budget's cut only, among registered holders:
                // an unregistered one costs no clock read.
                since: (!last).then(Instant::now),
                waker: None,
            }),
        });
        if !last {
            self.holders
                .lock()
                .expect("holders lock")
                .insert(id, h.clone());
        }
        h
    }

    fn deregister(&self, id: u64) {
        self.holders.lock().expect("holders lock").remove(&id);
    }

    /// Cuts the holders that hold the most (of equal ones, the one without
    /// progress for longest) until the others fit the limit.
    fn enforce(&self) {
        let holders = self.holders.lock().expect("holders lock");
        while self.over() {
            let victim = holders
                .values()
                .filter_map(|h| {
                    let a = h.acct.lock().expect("holder lock");
                    (!a.cut && a.held > 0).then(|| (a.held, std::cmp::Reverse(a.since), h))
                })
                .max_by_key(|(held, since, _)| (*held, *since));
            let Some((_, _, h)) = victim else { break };
            let waker = {
                let mut a = h.acct.lock().expect("holder lock");
                a.cut = true;
                self.cut_held.fetch_add(signed(a.held), Ordering::AcqRel);
                a.waker.take()
            };
            self.counts.budget.fetch_add(1, Ordering::Relaxed);
            debug!(target: REQUEST_PATH, holder = h.id, total = self.held(), limit = self.limit, "response budget reached: cutting the response that holds the most");
            if let Some(conn) = &h.conn {
                conn.abort();
            }
            if let Some(w) = waker {
                w.wake();
            }
        }
    }
}

fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// One relay's place in the budget.
struct Holder {
    id: u64,
    /// In the registry ([`ResponseBudget::register`]).
    registered: bool,
    budget: Arc<ResponseBudget>,
    /// The HTTP/1.1 connection the response is written to, aborted when
    /// the holder is cut (`None` on HTTP/2: the stream is reset instead).
    conn: Option<Arc<ConnState>>,
    acct: Mutex<Acct>,
}

struct Acct {
    /// Bytes charged: the frame at the connection, and a forwarded
    /// answer's window while its stream has a backlog.
    held: u64,
    /// Of `held`, the frame at the connection (a [`Lease`]).
    leased: u64,
    /// Cut by the budget: the relay fails at its next poll.
    cut: bool,
    /// The last time a frame was handed on (registered holders only:
    /// the budget's cut compares it).
    since: Option<Instant>,
    /// The task that polled the relay last: woken when it is cut, and
    /// when its frame is let go while it waits for that (`parked`).
    waker: Option<Waker>,
    /// The relay returned `Pending` to wait for its frame to be let go.
    /// Only then does the release wake it: the client connection that
    /// took the last frame of a body polls nothing more (no wakeup per
    /// response).
    parked: bool,
}

impl Holder {
    /// Charges `n` bytes, of which `leased` are a frame handed on; then
    /// enforces the budget.
    fn charge(&self, n: u64, leased: u64, waker: &Waker) {
        {
            let mut a = self.acct.lock().expect("holder lock");
            a.held += n;
            a.leased += leased;
            if self.registered {
                a.since = Some(Instant::now());
            }
            set_waker(&mut a.waker, waker);
            self.budget.total.fetch_add(signed(n), Ordering::AcqRel);
            if a.cut {
                self.budget.cut_held.fetch_add(signed(n), Ordering::AcqRel);
            }
        }
        if self.budget.over() {
            self.budget.enforce();
        }
    }

    /// Releases `n` bytes, of which `leased` are a frame let go (then
    /// the relay is woken: its next frame may go).
    fn release(&self, n: u64, leased: u64) {
        let waker = {
            let mut a = self.acct.lock().expect("holder lock");
            a.held -= n;
            a.leased -= leased;
            self.budget.total.fetch_sub(signed(n), Ordering::AcqRel);
            if a.cut {
                self.budget.cut_held.fetch_sub(signed(n), Ordering::AcqRel);
            }
            if leased > 0 && a.parked {
                a.parked = false;
                a.waker.clone()
            } else {
                None
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

fn set_waker(slot: &mut Option<Waker>, waker: &Waker) {
    match slot {
        Some(w) if w.will_wake(waker) => {}
        _ => *slot = Some(waker.clone()),
    }
}

/// A frame's bytes while the client connection holds them: dropped (the
/// last clone of the frame's `Bytes`) when written, or when the stream or
/// connection is gone; releases its charge then.
struct Lease {
    data: Bytes,
    charge: u64,
    from: Charged,
}

/// Whose charge a [`Lease`] is.
enum Charged {
    /// A holder's frame: its release may wake the relay for the next one.
    Holder(Arc<Holder>),
    /// A one-frame answer's only frame on HTTP/1.1: charged to the node's
    /// total alone. Such an answer has no holder (no allocation, no
    /// locks): nothing can cut it (the budget cuts registered holders
    /// only), no next frame waits for this one's release, and its end
    /// is told with the frame, not after its release (that is HTTP/2's
    /// `hold_end`).
    Budget(Arc<ResponseBudget>),
}

impl AsRef<[u8]> for Lease {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        match &self.from {
            Charged::Holder(h) => h.release(self.charge, self.charge),
            Charged::Budget(b) => {
                b.total.fetch_sub(signed(self.charge), Ordering::AcqRel);
            }
        }
    }
}

/// A response body handed to the client connection one frame at a time,
/// under the stall limit and the node's budget (see the module doc).
/// Without a budget (the admin listener) it passes the body on as it is.
pub(crate) struct Relay<B> {
    inner: B,
    budget: Option<Arc<ResponseBudget>>,
    /// A forwarded answer ([`Answer::from_peer`]): its window is charged too.
    from_peer: bool,
    /// The HTTP/1.1 connection, aborted when the budget cuts this.
    conn: Option<Arc<ConnState>>,
    /// HTTP/2 (no connection to abort): the body's end is told only once
    /// its last frame was let go, so a stream whose client never takes
    /// that frame still meets the stall cut (hyper then sends an empty
    /// DATA frame with END_STREAM). HTTP/1.1 needs none of this: the
    /// socket's send timeout cuts the whole connection.
    hold_end: bool,
    /// Registered at the first frame.
    holder: Option<Arc<Holder>>,
    /// The window charged while the peer stream has a backlog: its last
    /// read found data waiting (quinn holds up to the window then).
    backlog: u64,
    /// Runs while a frame waits for the client.
    stall: Option<Pin<Box<Sleep>>>,
    /// Ended with an error: nothing more.
    failed: bool,
}

impl<B> Relay<B> {
    /// `inner` through `budget` (`None`: passed on as it is); `from_peer`
    /// for a forwarded answer; `conn` is the HTTP/1.1 connection (`None`
    /// on HTTP/2).
    pub(crate) fn new(
        inner: B,
        budget: Option<Arc<ResponseBudget>>,
        from_peer: bool,
        conn: Option<Arc<ConnState>>,
    ) -> Relay<B> {
        Relay {
            inner,
            hold_end: budget.is_some() && conn.is_none(),
            budget,
            from_peer,
            conn,
            holder: None,
            backlog: 0,
            stall: None,
            failed: false,
        }
    }
}

impl<B> Relay<B>
where
    B: HttpBody<Data = Bytes, Error = BodyError> + Unpin,
{
    /// `Ready` with the error that ends the body, or `Pending` while the
    /// last frame still waits for the client; `None` when the next frame
    /// may be polled.
    fn wait_for_client(&mut self, cx: &mut Context<'_>) -> Option<Poll<BodyError>> {
        let holder = self.holder.as_ref()?;
        let (cut, waiting) = {
            let mut a = holder.acct.lock().expect("holder lock");
            // Registered before the check: a release or cut after it wakes us.
            set_waker(&mut a.waker, cx.waker());
            a.parked = a.leased > 0;
            (a.cut, a.parked)
        };
        if cut {
            return Some(Poll::Ready(BodyError::OverBudget));
        }
        if !waiting {
            self.stall = None;
            return None;
        }
        let limit = holder.budget.stall;
        let timer = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => {
                holder.budget.counts.stalled.fetch_add(1, Ordering::Relaxed);
                debug!(target: REQUEST_PATH, limit_ms = limit.as_millis() as u64, "client took no byte of its response in time: cut");
                Some(Poll::Ready(BodyError::Stalled(limit)))
            }
            Poll::Pending => Some(Poll::Pending),
        }
    }
}

impl<B> HttpBody for Relay<B>
where
    B: HttpBody<Data = Bytes, Error = BodyError> + Unpin,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        let Some(budget) = this.budget.clone() else {
            return Pin::new(&mut this.inner).poll_frame(cx);
        };
        if this.failed {
            return Poll::Ready(None);
        }
        if let Some(waited) = this.wait_for_client(cx) {
            let e = ready!(waited);
            this.failed = true;
            return Poll::Ready(Some(Err(e)));
        }
        let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => f,
            Poll::Ready(other) => {
                this.drop_backlog();
                return Poll::Ready(other);
            }
            Poll::Pending => {
                // Read to the end of what arrived: no backlog.
                this.drop_backlog();
                return Poll::Pending;
            }
        };
        let data = match frame.into_data() {
            Ok(d) if !d.is_empty() => d,
            Ok(d) => return Poll::Ready(Some(Ok(Frame::data(d)))),
            Err(f) => return Poll::Ready(Some(Ok(f))),
        };
        // A forwarded answer with more to come whose stream had data
        // waiting: its peer window is full or filling (and pins up to
        // twice its bytes), whether its client or this node is slow.
        let window = if this.from_peer && !this.inner.is_end_stream() {
            let rest = this.inner.size_hint().upper().unwrap_or(u64::MAX);
            WINDOW_PINS * budget.window.min(rest)
        } else {
            0
        };
        let leased = data.len() as u64;
        if this.holder.is_none() && !this.hold_end && this.inner.is_end_stream() {
            // A one-frame answer (most are): its frame alone is charged,
            // with no holder ([`Charged::Budget`]). Its window is 0: the
            // body has no more to come.
            budget.total.fetch_add(signed(leased), Ordering::AcqRel);
            if budget.over() {
                budget.enforce();
            }
            let lease = Lease {
                data,
                charge: leased,
                from: Charged::Budget(budget),
            };
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_owner(lease)))));
        }
        let holder = this
            .holder
            .get_or_insert_with(|| budget.register(this.conn.clone(), this.inner.is_end_stream()))
            .clone();
        // The backlog charge moves to the new window (it shrinks near the
        // end of the body).
        let more = window.saturating_sub(this.backlog);
        let less = this.backlog.saturating_sub(window);
        if less > 0 {
            holder.release(less, 0);
        }
        this.backlog = window;
        holder.charge(leased + more, leased, cx.waker());
        let lease = Lease {
            data,
            charge: leased,
            from: Charged::Holder(holder),
        };
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_owner(lease)))))
    }

    fn is_end_stream(&self) -> bool {
        self.failed || (self.inner.is_end_stream() && !(self.hold_end && self.leased()))
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Relay<B> {
    /// A frame of this body is still at the client connection.
    fn leased(&self) -> bool {
        self.holder
            .as_ref()
            .is_some_and(|h| h.acct.lock().expect("holder lock").leased > 0)
    }

    /// Releases the backlog's window charge.
    fn drop_backlog(&mut self) {
        if let (Some(h), n @ 1..) = (&self.holder, self.backlog) {
            h.release(n, 0);
            self.backlog = 0;
        }
    }
}

impl<B> Drop for Relay<B> {
    fn drop(&mut self) {
        self.drop_backlog();
        if let Some(h) = self.holder.take()
            && h.registered
        {
            h.budget.deregister(h.id);
        }
    }
}

#[cfg(test)]
mod tests;
