//! Informational (1xx) responses on their way from the app to the client
//! (RFC 9110 section 15.2: a proxy forwards them, except to an HTTP/1.0
//! client), as they arrive and before the final answer.
//!
//! The path of one `103 Early Hints` or `102 Processing`:
//!
//! ```text
//! app --1xx--> upstream pool (hyper's on_informational callback)
//!          --> the request's Informational sink (a request extension)
//!   local path: the entry's client connection (HTTP/1.1: written as is)
//!   hop:        the owner's stream writes a ResponseHead frame with the 1xx
//!               status before the final head (`wire`); the entry reads it,
//!               resets the response timeout, and hands it to its own sink
//! ```
//!
//! The sink is the client connection's for each request that can take a
//! 1xx: HTTP/1.1 ([`H1Queue`], held by the connection's facts,
//! [`H1Sinks`], and made into a request's sink where the request is
//! served or forwarded: no request extension, so a request with nothing
//! else in its extension map allocates none), not HTTP/1.0; HTTP/2 (a
//! request extension set by the client server: a HEADERS frame on
//! the request's stream, through `hyper::ext::Http2Informational`: hyper's
//! HTTP/2 server had no way to send one, and `vendor/hyper` adds it); and
//! over the hop only when
//! the entry asked for them ([`crate::adapters::wire::INFORMATIONAL`]). Two
//! statuses are not relayed ([`relayed`]): `100 Continue`, which each hop
//! answers itself (hyper sends it to the client when the body is first
//! read), and `101`, which is a tunnel's answer, not a provisional one.
//!

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;
use http::{HeaderMap, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Most informational heads relayed for one request: an app that sends
/// more (a loop, a hostile app) has the rest dropped, so a request cannot
/// grow a client's write queue or a peer stream without bound.
pub(crate) const MAX_PER_REQUEST: u32 = 32;

/// Most bytes of informational heads queued on one HTTP/1.1 client
/// connection and not yet written (a client that does not read): past it
/// the next ones are dropped.
const MAX_QUEUED_BYTES: usize = 64 * 1024;

/// One informational response: its status (1xx) and header fields, the
/// hop-by-hop ones removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InfoHead {
    /// A 1xx status other than 100 and 101 ([`relayed`]).
    pub status: StatusCode,
    /// The header fields, in order, without hop-by-hop fields.
    pub headers: HeaderMap,
}

impl InfoHead {
    /// The informational head of `status` and `headers` as the app (or a
    /// peer) sent them: the hop-by-hop fields (RFC 9110 section 7.6.1)
    /// removed.
    pub(crate) fn new(status: StatusCode, headers: &HeaderMap) -> InfoHead {
        let mut headers = headers.clone();
        for n in [
            "connection",
            "keep-alive",
            "proxy-connection",
            "transfer-encoding",
            "upgrade",
            "te",
            "trailer",
            "content-length",
        ] {
            headers.remove(n);
        }
        InfoHead { status, headers }
    }

    /// The head as HTTP/1.1 writes it (RFC 9112 section 4): status line,
    /// fields, empty line.
    pub(crate) fn encode_h1(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.headers.len() * 32);
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(self.status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(
            self.status
                .canonical_reason()
                .unwrap_or("Informational")
                .as_bytes(),
        );
        out.extend_from_slice(b"\r\n");
        for (k, v) in &self.headers {
            out.extend_from_slice(k.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(v.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out
    }
}

/// True for the 1xx statuses peerlb relays: every informational status
/// but `100 Continue` (answered by each hop itself) and `101 Switching
/// Protocols` (a tunnel's final answer).
pub(crate) fn relayed(status: u16) -> bool {
    (102..200).contains(&status)
}

/// Where a request's informational heads go: set as a request extension
/// by whoever can deliver them (the HTTP/2 client server, the owner's peer
/// stream; an HTTP/1.1 connection's is made from its [`H1Sinks`] where
/// the request is served or forwarded), called by the upstream pool for
/// each 1xx the app sends. At
/// most [`MAX_PER_REQUEST`] are passed on. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub(crate) struct Informational(Inner);

#[derive(Clone)]
enum Inner {
    /// Handed to a function (the owner's channel, an HTTP/2 stream).
    Deliver(Arc<Sink>),
    /// Queued on an HTTP/1.1 connection ([`H1Queue`]) for its request
    /// number `.1`: the connection's `Arc`, so an HTTP/1.1 request's sink
    /// allocates nothing (it is made for every request, and a 1xx is rare).
    H1(Arc<H1Queue>, u64),
}

struct Sink {
    deliver: Box<dyn Fn(InfoHead) + Send + Sync>,
    count: std::sync::atomic::AtomicU32,
}

impl std::fmt::Debug for Informational {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Informational")
    }
}

impl Informational {
    /// A sink that hands each informational head to `deliver` (called on
    /// the task that reads the app's answer: it must not block).
    pub(crate) fn new(deliver: impl Fn(InfoHead) + Send + Sync + 'static) -> Informational {
        Informational(Inner::Deliver(Arc::new(Sink {
            deliver: Box::new(deliver),
            count: std::sync::atomic::AtomicU32::new(0),
        })))
    }

    /// Passes `head` on, unless its status is not [`relayed`] or this
    /// request already passed [`MAX_PER_REQUEST`].
    pub(crate) fn send(&self, head: InfoHead) {
        if !relayed(head.status.as_u16()) {
            return;
        }
        match &self.0 {
            Inner::Deliver(sink) => {
                let n = sink
                    .count
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n < MAX_PER_REQUEST {
                    (sink.deliver)(head);
                }
            }
            Inner::H1(queue, request) => queue.push(*request, &head),
        }
    }
}

/// A sink whose heads come out of the receiver, for the owner's peer
/// stream ([`serve_relaying`]); bounded by [`MAX_PER_REQUEST`].
pub(crate) fn channel() -> (
    Informational,
    tokio::sync::mpsc::UnboundedReceiver<InfoHead>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    (Informational::new(move |h| drop(tx.send(h))), rx)
}

/// Awaits `serving` (the owner's answer to a proxied request) while
/// writing each informational head out of `heads` on `send` as a
/// response head frame with its 1xx status (`wire`), those that came with
/// the answer included, so all precede the final head. `None` when the
/// stream could not be written, or when the entry stopped it before the
/// answer (its client left: `http::client_gone`): `serving` is dropped
/// then, and with it the app exchange (the app sees its connection close).
pub(crate) async fn serve_relaying<F: std::future::Future>(
    serving: F,
    mut heads: Option<tokio::sync::mpsc::UnboundedReceiver<InfoHead>>,
    send: &mut quinn::SendStream,
    node: &str,
) -> Option<F::Output> {
    enum Event<T> {
        Done(T),
        Head(InfoHead),
        Stopped,
    }
    let stopped = send.stopped();
    tokio::pin!(serving, stopped);
    let out = loop {
        let next = async {
            match heads.as_mut() {
                Some(rx) => match rx.recv().await {
                    Some(h) => h,
                    None => std::future::pending().await,
                },
                None => std::future::pending().await,
            }
        };
        let event = tokio::select! {
            biased;
            r = &mut serving => Event::Done(r),
            h = next => Event::Head(h),
            _ = &mut stopped => Event::Stopped,
        };
        match event {
            Event::Done(r) => break r,
            Event::Head(h) => {
                if !write_frame(send, &h, node).await {
                    return None;
                }
            }
            Event::Stopped => {
                tracing::debug!(target: "peerlb::adapters::informational", "the entry stopped the stream before the answer: request cancelled");
                return None;
            }
        }
    };
    while let Some(h) = heads.as_mut().and_then(|rx| rx.try_recv().ok()) {
        if !write_frame(send, &h, node).await {
            return None;
        }
    }
    Some(out)
}

/// Writes one informational head as a response head frame; false when
/// the stream is gone. A head too large for a frame is left out.
async fn write_frame(send: &mut quinn::SendStream, h: &InfoHead, node: &str) -> bool {
    let rh = crate::adapters::wire::ResponseHeadRef {
        status: h.status.as_u16(),
        headers: &h.headers,
        content_length: None,
        served_by: node,
    };
    match crate::adapters::wire::encode(&rh) {
        Ok(f) => send.write_chunk(bytes::Bytes::from(f)).await.is_ok(),
        Err(e) => {
            tracing::debug!(target: "peerlb::adapters::informational", error = %e, "informational head not relayed");
            true
        }
    }
}

/// The informational queue of one client connection, once its HTTP/1.1
/// server set it (`None` on an HTTP/2 connection, whose requests carry
/// their sink as an extension): part of the connection's facts
/// (`ConnInfo`), so a request's sink is made where it is needed
/// ([`H1Sinks::sink`]) and not carried in the request's extension map
/// (an allocation per request for the map alone).
#[derive(Debug, Default, Clone)]
pub(crate) struct H1Sinks(std::sync::OnceLock<Arc<H1Queue>>);

impl H1Sinks {
    /// The connection's queue, made on the first call (by its HTTP/1.1
    /// server, before any request).
    pub(crate) fn queue(&self) -> &Arc<H1Queue> {
        self.0.get_or_init(Arc::default)
    }

    /// The sink of one request of `version` on this connection: `None`
    /// for HTTP/1.0 (RFC 9110 section 15.2: no 1xx to an HTTP/1.0 client)
    /// and on a connection without an HTTP/1.1 server. Call it once per
    /// request: each call numbers a new request ([`MAX_PER_REQUEST`]
    /// counts per number).
    pub(crate) fn sink(&self, version: http::Version) -> Option<Informational> {
        let queue = self.0.get()?;
        (version == http::Version::HTTP_11).then(|| queue.sink())
    }
}

/// Two connections' facts compare their queues by identity (both unset,
/// or the same queue).
impl PartialEq for H1Sinks {
    fn eq(&self, other: &H1Sinks) -> bool {
        match (self.0.get(), other.0.get()) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for H1Sinks {}

/// The informational heads waiting to be written on one HTTP/1.1 client
/// connection, shared by its requests' sinks and its [`H1Inject`] IO.
#[derive(Debug, Default)]
pub(crate) struct H1Queue {
    state: Mutex<H1State>,
    /// `state.bytes` holds a head: the connection's writer takes the lock
    /// only then (set under the lock before the wake, cleared with the
    /// take; the writer registers its waker before it looks: `AtomicWaker`'s
    /// pattern, so a head queued after the look wakes it).
    queued: std::sync::atomic::AtomicBool,
    /// The number of the connection's next request (its sink's).
    next: std::sync::atomic::AtomicU64,
    waker: AtomicWaker,
}

/// What [`H1Queue`] guards.
#[derive(Debug, Default)]
struct H1State {
    /// Encoded heads not yet taken by the connection's IO.
    bytes: Vec<u8>,
    /// The request whose heads `sent` counts: HTTP/1.1 serves one request
    /// at a time on a connection, so the count restarts with the next.
    request: u64,
    sent: u32,
}

impl H1Queue {
    /// The sink of one request on this connection: each head is queued
    /// and the connection's task woken to write it. Allocates nothing.
    pub(crate) fn sink(self: &Arc<Self>) -> Informational {
        let request = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Informational(Inner::H1(Arc::clone(self), request))
    }

    /// Queues `head` of request number `request`, unless that request
    /// already queued [`MAX_PER_REQUEST`] or the queue is full.
    fn push(&self, request: u64, head: &InfoHead) {
        {
            let mut st = self.state.lock().expect("informational queue lock");
            if st.request != request {
                st.request = request;
                st.sent = 0;
            }
            if st.sent >= MAX_PER_REQUEST {
                return;
            }
            st.sent += 1;
            let encoded = head.encode_h1();
            if st.bytes.len() + encoded.len() > MAX_QUEUED_BYTES {
                return;
            }
            st.bytes.extend_from_slice(&encoded);
            self.queued
                .store(true, std::sync::atomic::Ordering::Release);
        }
        self.waker.wake();
    }
}

/// A client connection's IO that writes queued informational heads
/// between hyper's messages (hyper's HTTP/1.1 server has no API to send
/// one).
///
/// Written only at a message boundary: hyper calls `poll_flush` on its IO
/// only once its own write buffer is empty, so the bytes before a flush
/// are whole messages. The queue is written in `poll_flush`, and in
/// `poll_write` when no byte of hyper's was written since the last flush
/// (its final head then follows the 1xx, as it must). A request's heads
/// are queued before its handler returns, and hyper writes the final head
/// only after that, so no 1xx can follow the answer it belongs to.
pub(crate) struct H1Inject<T> {
    io: T,
    queue: Arc<H1Queue>,
    /// Bytes taken from the queue, not yet all written.
    pending: Vec<u8>,
    written: usize,
    /// No byte of hyper's written since its last flush.
    at_boundary: bool,
}

impl<T> H1Inject<T> {
    /// `io` with `queue`'s heads written into it.
    pub(crate) fn new(io: T, queue: Arc<H1Queue>) -> H1Inject<T> {
        H1Inject {
            io,
            queue,
            pending: Vec::new(),
            written: 0,
            at_boundary: true,
        }
    }
}

impl<T: AsyncWrite + Unpin> H1Inject<T> {
    /// Writes what was taken from the queue, and (at a boundary) what the
    /// queue holds; Ready once nothing is left.
    fn poll_drain(&mut self, cx: &mut Context<'_>, take_new: bool) -> Poll<io::Result<()>> {
        loop {
            if self.written < self.pending.len() {
                let n = std::task::ready!(
                    Pin::new(&mut self.io).poll_write(cx, &self.pending[self.written..])
                )?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.written += n;
                continue;
            }
            self.pending.clear();
            self.written = 0;
            if !take_new {
                return Poll::Ready(Ok(()));
            }
            self.queue.waker.register(cx.waker());
            // Most connections never queue a head: no lock for them.
            if !self.queue.queued.load(std::sync::atomic::Ordering::Acquire) {
                return Poll::Ready(Ok(()));
            }
            let mut q = self.queue.state.lock().expect("informational queue lock");
            self.queue
                .queued
                .store(false, std::sync::atomic::Ordering::Relaxed);
            if q.bytes.is_empty() {
                return Poll::Ready(Ok(()));
            }
            std::mem::swap(&mut q.bytes, &mut self.pending);
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for H1Inject<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for H1Inject<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let at = this.at_boundary;
        std::task::ready!(this.poll_drain(cx, at))?;
        let n = std::task::ready!(Pin::new(&mut this.io).poll_write(cx, buf))?;
        this.at_boundary = false;
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let at = this.at_boundary;
        std::task::ready!(this.poll_drain(cx, at))?;
        let n = std::task::ready!(Pin::new(&mut this.io).poll_write_vectored(cx, bufs))?;
        this.at_boundary = false;
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.at_boundary = true;
        std::task::ready!(this.poll_drain(cx, true))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn early_hints() -> InfoHead {
        let mut h = HeaderMap::new();
        h.append("link", "</a.css>; rel=preload".parse().unwrap());
        h.append("connection", "close".parse().unwrap());
        InfoHead::new(StatusCode::from_u16(103).unwrap(), &h)
    }

    #[test]
    fn heads_encode_as_http_1_1_without_hop_by_hop_fields() {
        assert_eq!(
            early_hints().encode_h1(),
            b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n"
        );
    }

    #[test]
    fn only_1xx_past_continue_and_switching_are_relayed() {
        assert!(!relayed(100));
        assert!(!relayed(101));
        assert!(relayed(102));
        assert!(relayed(103));
        assert!(relayed(199));
        assert!(!relayed(200));
    }

    #[test]
    fn a_request_relays_at_most_its_share() {
        let seen = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let s2 = seen.clone();
        let sink = Informational::new(move |_| {
            s2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        for _ in 0..MAX_PER_REQUEST + 5 {
            sink.send(early_hints());
        }
        sink.send(InfoHead::new(StatusCode::CONTINUE, &HeaderMap::new()));
        assert_eq!(
            seen.load(std::sync::atomic::Ordering::Relaxed),
            MAX_PER_REQUEST
        );
    }

    /// An HTTP/1.1 connection's sinks share its queue: each request may
    /// queue its own share, counted anew for the next request.
    #[test]
    fn an_h1_request_queues_at_most_its_share_and_the_next_its_own() {
        let q = Arc::new(H1Queue::default());
        let one = early_hints().encode_h1().len();
        let first = q.sink();
        for _ in 0..MAX_PER_REQUEST + 5 {
            first.send(early_hints());
        }
        first.send(InfoHead::new(StatusCode::CONTINUE, &HeaderMap::new()));
        let queued = |q: &H1Queue| q.state.lock().unwrap().bytes.len();
        assert_eq!(queued(&q), MAX_PER_REQUEST as usize * one);
        let second = q.sink();
        second.send(early_hints());
        assert_eq!(queued(&q), (MAX_PER_REQUEST as usize + 1) * one);
    }

    /// Queued heads go out on a flush, and before the next message's
    /// first byte; never inside a message hyper is writing.
    #[tokio::test]
    async fn queued_heads_are_written_between_messages_only() {
        let (a, mut b) = tokio::io::duplex(4096);
        let q = Arc::new(H1Queue::default());
        let mut io = H1Inject::new(a, q.clone());
        io.write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap();
        // Queued mid-message: held until the message is flushed.
        q.sink().send(early_hints());
        io.write_all(b"content-length: 0\r\n\r\n").await.unwrap();
        io.flush().await.unwrap();
        q.sink().send(early_hints());
        io.write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
            .await
            .unwrap();
        io.flush().await.unwrap();
        drop(io);
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        let hint = String::from_utf8(early_hints().encode_h1()).unwrap();
        assert_eq!(
            String::from_utf8(got).unwrap(),
            format!(
                "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n{hint}{hint}HTTP/1.1 204 No Content\r\n\r\n"
            )
        );
    }

    /// A connection's sinks come from its facts: none before its HTTP/1.1
    /// server set the queue (an HTTP/2 connection) and none for an
    /// HTTP/1.0 request; an HTTP/1.1 request's goes to the connection's
    /// queue, each one counted as a request of its own.
    #[test]
    fn a_connections_sinks_are_its_http_1_1_requests_only() {
        let sinks = H1Sinks::default();
        assert!(sinks.sink(http::Version::HTTP_11).is_none());
        let q = sinks.queue().clone();
        assert!(Arc::ptr_eq(&q, sinks.queue()), "one queue per connection");
        assert!(sinks.sink(http::Version::HTTP_10).is_none());
        let one = early_hints().encode_h1().len();
        let queued = |q: &H1Queue| q.state.lock().unwrap().bytes.len();
        for _ in 0..2 {
            let sink = sinks
                .sink(http::Version::HTTP_11)
                .expect("an HTTP/1.1 sink");
            for _ in 0..MAX_PER_REQUEST + 1 {
                sink.send(early_hints());
            }
        }
        assert_eq!(queued(&q), 2 * MAX_PER_REQUEST as usize * one);
        assert_eq!(sinks, sinks.clone());
        assert_ne!(sinks, H1Sinks::default());
    }
}
