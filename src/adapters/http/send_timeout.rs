//! A client connection whose writes give up when the client stops reading:
//! nginx's `send_timeout`, HAProxy's `timeout client` on the sending side.
//! Without it, a client that never reads its response holds the request
//! (and, for a forwarded one, the owner's stream and app) for ever.
//!
//! It also counts the bytes read from and written to the client (the
//! metrics' `peerlb_client_received_bytes_total` and `_sent_`): one relaxed
//! atomic add per read or write call, nothing per request.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::adapters::metrics::ByteCounts;

/// Wraps a client connection: a write (or flush) that makes no progress
/// for `limit` fails with [`io::ErrorKind::TimedOut`], which ends the
/// connection. Reads are untouched (the head and body read timeouts cover
/// them).
pub(crate) struct SendTimeout<S> {
    inner: S,
    limit: Duration,
    /// Running while the client's receive window is full.
    stalled: Option<Pin<Box<Sleep>>>,
    /// Where the bytes read and written are counted.
    counts: Option<Arc<ByteCounts>>,
}

impl<S> SendTimeout<S> {
    /// `inner` with writes bounded by `limit` without progress.
    pub(crate) fn new(inner: S, limit: Duration) -> Self {
        SendTimeout {
            inner,
            limit,
            stalled: None,
            counts: None,
        }
    }

    /// Counts the bytes read and written in `counts` from now on.
    pub(crate) fn counting(mut self, counts: Arc<ByteCounts>) -> Self {
        self.counts = Some(counts);
        self
    }

    /// Counts `n` bytes written.
    fn wrote(&self, r: &Poll<io::Result<usize>>) {
        if let (Some(c), Poll::Ready(Ok(n))) = (&self.counts, r) {
            c.add_sent(*n);
        }
    }

    /// Passes a ready result on (progress: the stall timer stops); on
    /// pending, starts or checks the stall timer.
    fn watch<T>(&mut self, r: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let limit = self.limit;
                let timer = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client read nothing for {} ms", limit.as_millis()),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for SendTimeout<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let (Some(c), Poll::Ready(Ok(()))) = (&self.counts, &r) {
            c.add_received(buf.filled().len() - before);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SendTimeout<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.wrote(&r);
        self.watch(r, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote(&r);
        self.watch(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(r, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_stops_fails_the_writer_after_the_limit() {
        let (a, mut b) = tokio::io::duplex(1024);
        let mut w = SendTimeout::new(a, Duration::from_millis(500));
        // The reader keeps up: no timeout however long it takes overall.
        for _ in 0..4 {
            w.write_all(&[1u8; 1024]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(400)).await;
            let mut buf = [0u8; 1024];
            b.read_exact(&mut buf).await.unwrap();
        }
        // The reader stops: the buffer fills, and 500 ms later the write fails.
        w.write_all(&[1u8; 1024]).await.unwrap();
        let start = tokio::time::Instant::now();
        let e = w.write_all(&[1u8; 1]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(start.elapsed(), Duration::from_millis(500));
    }

    #[tokio::test]
    async fn bytes_read_and_written_are_counted() {
        let (a, mut b) = tokio::io::duplex(1024);
        let counts = Arc::new(ByteCounts::default());
        let mut w = SendTimeout::new(a, Duration::from_secs(5)).counting(counts.clone());
        w.write_all(&[1u8; 300]).await.unwrap();
        b.write_all(&[2u8; 70]).await.unwrap();
        let mut buf = [0u8; 70];
        w.read_exact(&mut buf).await.unwrap();
        assert_eq!(counts.sent(), 300);
        assert_eq!(counts.received(), 70);
    }
}
