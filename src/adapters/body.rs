//! Streaming bodies: the one body type the node passes around, a body read
//! from a QUIC stream, and the pump that writes a body into a QUIC stream.
//! Nothing here buffers a whole body.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::{BodyExt, Empty, Full, combinators::UnsyncBoxBody};

use crate::adapters::wire;

mod framed;
pub(crate) use framed::{Http2Client, frame_response, framed, trailer_marks, unframed};

/// The body type of every request and response inside the node, and of
/// the requests and responses an embedded app sees: a boxed (`Send`, not
/// `Sync`) `http_body::Body` of [`Bytes`] frames.
pub type Body = UnsyncBoxBody<Bytes, BodyError>;

/// Why a body stopped before its end.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BodyError {
    /// The client's connection failed while its request body was read, or
    /// the body was malformed (chunked encoding).
    #[error("client body: {0}")]
    Client(hyper::Error),
    /// The client sent no body data for this long (`limits.body_read_timeout_ms`).
    #[error("client body: no data for {} ms", .0.as_millis())]
    ClientTimeout(std::time::Duration),
    /// The peer stream failed or was reset while a body was read from it.
    #[error("peer stream: {0}")]
    Peer(#[from] quinn::ReadError),
    /// The upstream app's response body failed.
    #[error("upstream body: {0}")]
    Upstream(hyper::Error),
    /// The client took no byte of a frame of its response for this long
    /// (`limits.send_timeout_ms`): the response is cut (an HTTP/2 stream
    /// reset, an HTTP/1.1 connection closed).
    #[error("the client took nothing of its response for {} ms", .0.as_millis())]
    Stalled(std::time::Duration),
    /// The node's response budget (`limits.response_budget_bytes`) was
    /// reached and this response held the most: it is cut.
    #[error("cut: the node's response budget is reached and this response held the most")]
    OverBudget,
    /// A framed body from a peer (one that may carry trailers,
    /// `framed`) did not frame: a broken or hostile peer.
    #[error("peer body framing: {0}")]
    Framing(String),
}

/// A body of `bytes`, in one frame.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// An empty body.
pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// A client's request body (hyper) as a [`Body`].
pub(crate) fn from_incoming(b: hyper::body::Incoming) -> Body {
    b.map_err(BodyError::Client).boxed_unsync()
}

/// Request extension set by the client server on a request with a body:
/// flipped to true once the body was read to its end
/// ([`from_incoming_with_timeout`]), so the server knows whether the
/// client may still be sending it after the answer (`http::client_gone`:
/// the early answer drain).
#[derive(Debug, Clone)]
pub(crate) struct BodyEnd(pub std::sync::Arc<std::sync::atomic::AtomicBool>);

/// A client's request body (hyper) as a [`Body`] that fails with
/// [`BodyError::ClientTimeout`] when `idle` passes with no frame (measured
/// from the first poll, then from each frame). With `counted`, the bytes of
/// its data frames are added to it as they are read (the access log's
/// `bytes_in`). With `end`, its flag is set once the body was read to its
/// end ([`BodyEnd`]).
pub(crate) fn from_incoming_with_timeout(
    b: hyper::body::Incoming,
    idle: std::time::Duration,
    counted: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
    end: Option<BodyEnd>,
) -> Body {
    ReadTimeout {
        inner: b,
        idle,
        deadline: None,
        counted,
        end,
    }
    .boxed_unsync()
}

/// See [`from_incoming_with_timeout`].
struct ReadTimeout {
    inner: hyper::body::Incoming,
    idle: std::time::Duration,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    counted: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
    end: Option<BodyEnd>,
}

impl HttpBody for ReadTimeout {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if let Poll::Ready(r) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.deadline = None;
            if let (Some(c), Some(Ok(f))) = (&this.counted, &r)
                && let Some(d) = f.data_ref()
            {
                c.fetch_add(d.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
            if let Some(e) = &this.end
                && (r.is_none() || this.inner.is_end_stream())
            {
                e.0.store(true, std::sync::atomic::Ordering::Release);
            }
            return Poll::Ready(r.map(|f| f.map_err(BodyError::Client)));
        }
        let idle = this.idle;
        let deadline = this
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        ready!(deadline.as_mut().poll(cx));
        this.deadline = None;
        Poll::Ready(Some(Err(BodyError::ClientTimeout(idle))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Largest chunk taken from a QUIC stream per read, and largest frame a
/// [`QuicBody`] gathers.
const READ_CHUNK: usize = 64 * 1024;

/// A chunk at least this large is passed on as it is, never gathered.
const COALESCE_BELOW: usize = 16 * 1024;

/// A body read from a QUIC receive stream until its FIN.
///
/// Reads are zero-copy: each frame is a chunk of a received packet as
/// quinn holds it (`read_chunk`), not a copy into a buffer of our own.
/// With a known length (`Content-Length`), it looks for the FIN right after
/// the last byte, so the stream is read to its end and dropping the body
/// costs no STOP_SENDING frame (docs/architecture.md, "Read every response
/// stream to its end").
pub(crate) struct QuicBody {
    recv: quinn::RecvStream,
    remaining: Option<u64>,
    done: bool,
    /// An error met after data that was already returned: the next frame.
    failed: Option<quinn::ReadError>,
}

impl QuicBody {
    /// Wraps `recv`; `length` is the announced body length, if any.
    pub(crate) fn new(recv: quinn::RecvStream, length: Option<u64>) -> QuicBody {
        QuicBody {
            recv,
            remaining: length,
            done: false,
            failed: None,
        }
    }

    /// Appends the chunks that are already here to `first`, up to
    /// [`READ_CHUNK`] bytes, so a bulk body becomes frames of tens of KiB
    /// instead of one frame per packet (a write per frame downstream).
    /// A small body is one chunk and is never copied.
    fn gather(&mut self, cx: &mut Context<'_>, first: Bytes) -> Bytes {
        if first.len() >= COALESCE_BELOW || self.remaining.is_some_and(|r| r <= first.len() as u64)
        {
            return first;
        }
        let mut buf: Option<bytes::BytesMut> = None;
        loop {
            let len = buf.as_ref().map_or(first.len(), |b| b.len());
            if len >= READ_CHUNK || self.remaining.is_some_and(|r| r <= len as u64) {
                break;
            }
            match self.poll_chunk(cx) {
                Poll::Ready(Ok(Some(c))) => {
                    let b = buf.get_or_insert_with(|| {
                        let mut b = bytes::BytesMut::with_capacity(READ_CHUNK);
                        b.extend_from_slice(&first);
                        b
                    });
                    b.extend_from_slice(&c);
                }
                Poll::Ready(Ok(None)) => {
                    self.done = true;
                    break;
                }
                Poll::Ready(Err(e)) => {
                    self.failed = Some(e);
                    break;
                }
                Poll::Pending => break,
            }
        }
        match buf {
            Some(b) => b.freeze(),
            None => first,
        }
    }

    /// Polls for the next chunk of the stream, in order; `None` is the FIN.
    fn poll_chunk(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, quinn::ReadError>> {
        poll_chunk(&mut self.recv, cx)
    }
}

/// Polls `recv` for its next chunk, in order, without copying; `None` is
/// the FIN. quinn's `read_chunk` is cancel-safe, so a future made and
/// dropped per poll loses nothing (its waker stays registered).
pub(crate) fn poll_chunk(
    recv: &mut quinn::RecvStream,
    cx: &mut Context<'_>,
) -> Poll<Result<Option<Bytes>, quinn::ReadError>> {
    let fut = std::pin::pin!(recv.read_chunk(READ_CHUNK, true));
    fut.poll(cx).map(|r| r.map(|c| c.map(|c| c.bytes)))
}

impl HttpBody for QuicBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if let Some(e) = this.failed.take() {
            this.done = true;
            return Poll::Ready(Some(Err(e.into())));
        }
        if this.done {
            return Poll::Ready(None);
        }
        let data = match ready!(this.poll_chunk(cx)) {
            Ok(Some(d)) => this.gather(cx, d),
            Ok(None) => {
                this.done = true;
                return Poll::Ready(None);
            }
            Err(e) => {
                this.done = true;
                return Poll::Ready(Some(Err(e.into())));
            }
        };
        if let Some(rem) = &mut this.remaining {
            *rem = rem.saturating_sub(data.len() as u64);
            if *rem == 0 && !this.done && this.failed.is_none() {
                // Read the FIN now if it is already here (it usually arrives
                // with the last bytes), so the stream ends cleanly.
                if let Poll::Ready(Ok(None)) = this.poll_chunk(cx) {
                    this.done = true;
                }
            }
        }
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.failed.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.remaining {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

/// Why [`pump`] stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PumpError {
    /// The body source failed; the stream was reset with [`wire::RESET_BODY_FAILED`].
    #[error("body source failed: {0}")]
    Source(BodyError),
    /// The stream could not be written (peer stopped it, connection lost).
    #[error("peer stream write failed: {0}")]
    Write(#[from] quinn::WriteError),
}

/// Writes `body` into `send` chunk by chunk, then finishes the stream.
/// Trailers are dropped: a body that may carry them goes through
/// [`framed`](mod@framed) first.
///
/// # Errors
/// [`PumpError::Source`] after resetting the stream when the body fails;
/// [`PumpError::Write`] when the stream cannot be written.
pub(crate) async fn pump<B>(mut body: B, send: &mut quinn::SendStream) -> Result<u64, PumpError>
where
    B: HttpBody<Data = Bytes, Error = BodyError> + Unpin,
{
    let mut sent = 0u64;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Ok(data) = f.into_data() {
                    if data.is_empty() {
                        continue;
                    }
                    sent += data.len() as u64;
                    send.write_chunk(data).await?;
                }
            }
            Err(e) => {
                let _ = send.reset(wire::RESET_BODY_FAILED.into());
                return Err(PumpError::Source(e));
            }
        }
    }
    let _ = send.finish();
    Ok(sent)
}
