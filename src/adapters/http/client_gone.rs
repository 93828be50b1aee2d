//! Noticing an HTTP/1.1 client that left while its answer is pending, so
//! the request is cancelled (its handler dropped: the app exchange on the
//! local path, the peer stream across the hop, whose owner then drops its
//! own app exchange) instead of keeping the app busy for nobody.
//!
//! hyper's HTTP/1.1 server reads nothing while a handler runs (it serves
//! half-closed clients, `half_close(true)`), so [`ReadAhead`] reads ahead
//! itself when its connection is armed: each time hyper polls the IO
//! (hyper flushes on every turn of its connection), it reads what the
//! client sent into a small buffer of its own (given to hyper first) and
//! so sees the end of the stream or a reset as it comes. What counts as
//! gone ([`Mode`]):
//!
//! - a reset or read error, always;
//! - the end of the stream (FIN) on a request that keeps the connection
//!   alive: such a client can send nothing more and closes only when it
//!   gives up (browsers, curl, HTTP libraries); a request that said
//!   `Connection: close` (or HTTP/1.0 without keep-alive) may half-close
//!   after it and still gets its answer, as before.
//!
//! HTTP/2 needs none of this: hyper drops a stream's handler when the
//! client resets the stream or the connection ends.
//!
//! **Early answers.** When hyper closes a connection whose last request
//! body was not read to its end (the app answered 413 under the upload),
//! [`ReadAhead`] first shuts the write side (the answer and a FIN go out),
//! then reads and discards what the client still sends, up to
//! `limits.early_answer_drain_bytes` and for at most [`DRAIN_TIME`], before
//! the socket closes: closed with unread bytes, it would send a reset, and
//! a client that writes its whole body before reading (Python's
//! `http.client`) would get a broken pipe instead of its answer.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::task::{Context, Poll};

use std::future::Future;

use crate::engine::header_scan::Scan as _;
use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Most bytes read ahead of hyper (the rest of a body the app did not
/// read, a pipelined request): past it, reading ahead stops until hyper
/// takes them.
const READ_AHEAD: usize = 8 * 1024;

/// Longest time an early answer's connection reads and discards the rest
/// of the client's body before it closes (HAProxy's and nginx's lingering
/// close bound the same way).
pub(crate) const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// What ends a pending request of this connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A reset or read error only (the request asked to close the
    /// connection: a half-close after it is allowed).
    ErrorOnly = 1,
    /// The end of the stream too (a keep-alive request).
    EndOrError = 2,
}

impl Mode {
    /// The mode of a request of `version` with `headers`.
    pub(crate) fn of(version: http::Version, headers: &http::HeaderMap) -> Mode {
        // No `Connection` (most requests): one lookup, no token scan.
        if !headers.has(&http::header::CONNECTION) {
            return if version == http::Version::HTTP_10 {
                Mode::ErrorOnly
            } else {
                Mode::EndOrError
            };
        }
        let says = |token: &str| {
            headers
                .all_of(&http::header::CONNECTION)
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .any(|t| t.trim().eq_ignore_ascii_case(token))
        };
        let closes = if version == http::Version::HTTP_10 {
            !says("keep-alive")
        } else {
            says("close")
        };
        if closes {
            Mode::ErrorOnly
        } else {
            Mode::EndOrError
        }
    }
}

/// One client connection's watch: armed while a request is pending.
#[derive(Debug, Default)]
pub(crate) struct ClientGone {
    /// 0: no request pending; else the [`Mode`].
    armed: AtomicU8,
    /// The stream ended (FIN seen), whether or not armed then.
    ended: AtomicBool,
    /// A read failed (reset).
    failed: AtomicBool,
    /// Set when the pending request's client is gone.
    gone: AtomicBool,
    /// The task waiting in [`ClientGone::wait`]: one at a time, as an
    /// HTTP/1.1 connection has one pending request (a waker slot, not a
    /// `Notify`: its waiter list took a lock on every poll of the
    /// request's future).
    waker: futures_util::task::AtomicWaker,
    /// The last request's body end flag (`body::BodyEnd`), if it had a body.
    body_end: std::sync::Mutex<Option<Arc<AtomicBool>>>,
    /// Most bytes drained after an early answer (0: none).
    drain_bytes: u64,
}

/// Disarms the watch when the request's handler is done.
pub(crate) struct Armed(Arc<ClientGone>);

impl Drop for Armed {
    fn drop(&mut self) {
        self.0.armed.store(0, Ordering::Release);
        // The request is done: its task's waker is not kept (a tunnel
        // holds the connection's IO, and with it this watch, for long).
        drop(self.0.waker.take());
    }
}

impl ClientGone {
    /// A watch that drains up to `drain_bytes` after an early answer.
    pub(crate) fn new(drain_bytes: u64) -> ClientGone {
        ClientGone {
            drain_bytes,
            ..ClientGone::default()
        }
    }

    /// The body end flag of the connection's newest request (`None`: it
    /// has no body).
    pub(crate) fn set_body(&self, end: Option<Arc<AtomicBool>>) {
        *self.body_end.lock().expect("body end lock") = end;
    }

    /// The newest request's body was not read to its end.
    fn body_unfinished(&self) -> bool {
        self.body_end
            .lock()
            .expect("body end lock")
            .as_ref()
            .is_some_and(|e| !e.load(Ordering::Acquire))
    }

    /// Arms the watch for a request in `mode`; already gone if the stream
    /// ended (in that mode) or failed before.
    pub(crate) fn arm(self: &Arc<Self>, mode: Mode) -> Armed {
        self.gone.store(false, Ordering::Release);
        self.armed.store(mode as u8, Ordering::Release);
        self.check();
        Armed(Arc::clone(self))
    }

    /// Resolves once the armed request's client is gone. One waiter at a
    /// time: a later one takes the wake from an earlier one.
    pub(crate) fn wait(&self) -> impl std::future::Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            if self.gone.load(Ordering::Acquire) {
                return std::task::Poll::Ready(());
            }
            self.waker.register(cx.waker());
            // Read again once registered: a `check` in between found the
            // waker, or this read sees what it set.
            if self.gone.load(Ordering::Acquire) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
    }

    /// Whether the armed request is gone by what was seen; wakes `wait`.
    fn check(&self) {
        let armed = self.armed.load(Ordering::Acquire);
        let gone = armed != 0
            && (self.failed.load(Ordering::Acquire)
                || (armed == Mode::EndOrError as u8 && self.ended.load(Ordering::Acquire)));
        if gone && !self.gone.swap(true, Ordering::AcqRel) {
            self.waker.wake();
        }
    }

    fn armed(&self) -> bool {
        self.armed.load(Ordering::Acquire) != 0
    }
}

/// A client connection's IO that reads ahead of hyper while a request is
/// pending (module doc).
pub(crate) struct ReadAhead<T> {
    io: T,
    watch: Arc<ClientGone>,
    buf: BytesMut,
    /// The stream's end was read (hyper gets it after the buffer).
    eof: bool,
    /// A read error, for hyper after the buffer.
    err: Option<io::Error>,
    /// Draining after an early answer: bytes left, and the deadline.
    drain: Option<(u64, Pin<Box<tokio::time::Sleep>>)>,
}

impl<T> ReadAhead<T> {
    /// `io`, watched by `watch`.
    pub(crate) fn new(io: T, watch: Arc<ClientGone>) -> ReadAhead<T> {
        ReadAhead {
            io,
            watch,
            buf: BytesMut::new(),
            eof: false,
            err: None,
            drain: None,
        }
    }
}

impl<T: AsyncRead + Unpin> ReadAhead<T> {
    /// Reads what is there into the buffer while armed (registering for
    /// more), noting an end or an error.
    fn read_ahead(&mut self, cx: &mut Context<'_>) {
        while self.watch.armed() && !self.eof && self.err.is_none() && self.buf.len() < READ_AHEAD {
            let mut chunk = [0u8; 2048];
            let mut rb = ReadBuf::new(&mut chunk);
            match Pin::new(&mut self.io).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if rb.filled().is_empty() => self.ended(),
                Poll::Ready(Ok(())) => self.buf.extend_from_slice(rb.filled()),
                Poll::Ready(Err(e)) => self.failed(e),
                Poll::Pending => return,
            }
        }
    }

    fn ended(&mut self) {
        self.eof = true;
        self.watch.ended.store(true, Ordering::Release);
        self.watch.check();
    }

    fn failed(&mut self, e: io::Error) {
        self.err = Some(e);
        self.watch.failed.store(true, Ordering::Release);
        self.watch.check();
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ReadAhead<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.buf.is_empty() {
            let n = this.buf.len().min(out.remaining());
            out.put_slice(&this.buf[..n]);
            this.buf.advance(n);
            return Poll::Ready(Ok(()));
        }
        if let Some(e) = this.err.take() {
            return Poll::Ready(Err(e));
        }
        if this.eof {
            return Poll::Ready(Ok(()));
        }
        let before = out.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, out);
        match &r {
            Poll::Ready(Ok(())) if out.filled().len() == before && out.remaining() > 0 => {
                this.ended();
            }
            Poll::Ready(Err(_)) => {
                this.watch.failed.store(true, Ordering::Release);
                this.watch.check();
            }
            _ => {}
        }
        r
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for ReadAhead<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // hyper flushes on every turn of its connection: the moment to
        // look at the read side while a handler runs.
        self.read_ahead(cx);
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.drain.is_none() {
            // The answer and the FIN first, whether or not a drain follows.
            std::task::ready!(Pin::new(&mut this.io).poll_shutdown(cx))?;
            if this.watch.drain_bytes == 0 || !this.watch.body_unfinished() {
                return Poll::Ready(Ok(()));
            }
            let left = this.watch.drain_bytes.saturating_sub(this.buf.len() as u64);
            this.buf.clear();
            this.drain = Some((left, Box::pin(tokio::time::sleep(DRAIN_TIME))));
        }
        let Some((left, deadline)) = this.drain.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let mut chunk = [0u8; 8192];
        while *left > 0 && !this.eof && this.err.is_none() {
            if deadline.as_mut().poll(cx).is_ready() {
                break;
            }
            let mut rb = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.io).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if rb.filled().is_empty() => this.eof = true,
                Poll::Ready(Ok(())) => *left = left.saturating_sub(rb.filled().len() as u64),
                Poll::Ready(Err(e)) => this.err = Some(e),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn keep_alive_requests_end_with_the_stream_and_closing_ones_do_not() {
        let mut h = http::HeaderMap::new();
        assert_eq!(Mode::of(http::Version::HTTP_11, &h), Mode::EndOrError);
        assert_eq!(Mode::of(http::Version::HTTP_10, &h), Mode::ErrorOnly);
        h.insert("connection", "keep-alive".parse().unwrap());
        assert_eq!(Mode::of(http::Version::HTTP_10, &h), Mode::EndOrError);
        h.insert("connection", "Upgrade, Close".parse().unwrap());
        assert_eq!(Mode::of(http::Version::HTTP_11, &h), Mode::ErrorOnly);
    }

    /// A client connection (the test's end, the server's read-ahead)
    /// whose watch is armed for a keep-alive request.
    fn armed_connection() -> (
        tokio::io::DuplexStream,
        Arc<ClientGone>,
        ReadAhead<tokio::io::DuplexStream>,
        Armed,
    ) {
        let (a, b) = tokio::io::duplex(4096);
        let watch = Arc::new(ClientGone::default());
        let io = ReadAhead::new(a, watch.clone());
        let armed = watch.arm(Mode::EndOrError);
        (b, watch, io, armed)
    }

    /// A request already waiting (in a task of its own, polled again only
    /// when woken) is woken when its client leaves.
    #[tokio::test]
    async fn a_waiting_request_is_woken_when_its_client_leaves() {
        let (mut b, watch, mut io, _armed) = armed_connection();
        let waiting = tokio::spawn({
            let watch = watch.clone();
            async move { watch.wait().await }
        });
        // The waiting task's first poll (one thread: it runs here).
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        b.shutdown().await.unwrap();
        io.flush().await.unwrap();
        // Bounded: a lost wake would hang the test.
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .unwrap();
    }

    /// Armed, a flush reads ahead: the client's FIN makes the request
    /// gone, and hyper still gets the bytes read ahead, then the end.
    #[tokio::test]
    async fn an_armed_flush_sees_the_clients_end_and_keeps_what_it_read() {
        let (mut b, watch, mut io, armed) = armed_connection();
        b.write_all(b"next").await.unwrap();
        b.shutdown().await.unwrap();
        io.flush().await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), watch.wait())
            .await
            .expect("gone");
        drop(armed);
        let mut got = Vec::new();
        io.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"next");
    }

    /// A request that closes may half-close: the FIN is not its end.
    #[tokio::test]
    async fn a_half_close_after_a_closing_request_is_not_gone() {
        let (a, mut b) = tokio::io::duplex(4096);
        let watch = Arc::new(ClientGone::default());
        let mut io = ReadAhead::new(a, watch.clone());
        let _armed = watch.arm(Mode::ErrorOnly);
        b.shutdown().await.unwrap();
        io.flush().await.unwrap();
        assert!(!watch.gone.load(Ordering::Acquire));
        // Unarmed, nothing is read ahead.
        drop(_armed);
        assert!(io.eof);
    }
}
