//! Framed bodies on a peer stream: the form a body takes across the hop
//! when it may carry trailers (HTTP/1.1 chunked trailers, HTTP/2
//! trailers: gRPC's `grpc-status`). A plain body is its raw bytes up to
//! the FIN and has no room for them; a framed one is a sequence of
//!
//! ```text
//! [u8 kind][u32 BE length][payload]
//!   kind 0: data, the payload is body bytes
//!   kind 1: trailers, the payload is a ResponseHead (bincode, `wire`)
//!           with status 0 and served_by "" whose headers are the trailer
//!           fields; the last frame before the FIN
//! ```
//!
//! Which bodies are framed is said in the heads (`wire::TRAILERS`): only
//! those, so every other stream keeps its bytes. [`framed`] turns a body
//! into its framed bytes (the ordinary pump writes them), [`unframed`]
//! reads them back into data and trailers frames.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;

use super::{Body, BodyError};
use crate::adapters::wire;

/// Frame kind: body bytes.
const DATA: u8 = 0;
/// Frame kind: the trailer fields.
const TRAILERS: u8 = 1;
/// Bytes of a frame's kind and length.
const PREFIX: usize = 5;

/// `body` as framed bytes: each data frame after its prefix, the trailers
/// (if any) as the last frame.
pub(crate) fn framed(body: Body) -> Body {
    Framed {
        inner: body,
        pending: None,
    }
    .boxed_unsync()
}

/// The body that framed bytes `body` carry: its data, then its trailers.
/// Bytes that do not frame end it with [`BodyError::Framing`].
pub(crate) fn unframed(body: Body) -> Body {
    Unframed {
        inner: body,
        buf: BytesMut::new(),
        data_left: 0,
        ended: false,
    }
    .boxed_unsync()
}

/// Request extension: the client's request came over HTTP/2 (set by the
/// client server before the request is put in HTTP/1.1 form), so
/// trailers may come with it and may go back to it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Http2Client;

/// The tokens of a request head's `wire::TRAILERS` mark: whether the
/// request body is framed (`framed`), and whether the entry's client
/// takes trailers (`te`).
pub(crate) fn trailer_marks(v: &[u8]) -> (bool, bool) {
    let (mut framed, mut te) = (false, false);
    for t in v.split(|&b| b == b',') {
        match t.trim_ascii() {
            b"framed" => framed = true,
            b"te" => te = true,
            _ => {}
        }
    }
    (framed, te)
}

/// The owner's response `body` as it crosses the hop: framed, with the
/// mark `wire::TRAILERS: framed` in `parts`, when `te` (the entry's client
/// takes trailers) and it may end with some: not bodiless, not ended, of
/// no known length. A mark the app itself sent is removed either way.
pub(crate) fn frame_response(
    te: bool,
    method: &str,
    parts: &mut http::response::Parts,
    body: Body,
) -> Body {
    parts.headers.remove(wire::TRAILERS_NAME);
    if te
        && !body.is_end_stream()
        && !parts.headers.contains_key(http::header::CONTENT_LENGTH)
        && !crate::adapters::framing::bodiless(method, parts.status)
    {
        parts.headers.insert(
            wire::TRAILERS_NAME,
            http::HeaderValue::from_static("framed"),
        );
        return framed(body);
    }
    body
}

struct Framed {
    inner: Body,
    /// The data that follows a prefix just returned.
    pending: Option<Bytes>,
}

fn prefix(kind: u8, len: usize) -> Bytes {
    let mut p = Vec::with_capacity(PREFIX);
    p.push(kind);
    p.extend_from_slice(&(len as u32).to_be_bytes());
    Bytes::from(p)
}

impl HttpBody for Framed {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Some(d) = self.pending.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        let frame = match ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
            Some(Ok(f)) => f,
            other => return Poll::Ready(other),
        };
        match frame.into_data() {
            Ok(d) if d.is_empty() => Poll::Ready(Some(Ok(Frame::data(d)))),
            Ok(d) => {
                let p = prefix(DATA, d.len());
                self.pending = Some(d);
                Poll::Ready(Some(Ok(Frame::data(p))))
            }
            Err(f) => match f.into_trailers() {
                Ok(t) => {
                    let head = wire::ResponseHeadRef {
                        status: 0,
                        headers: &t,
                        content_length: None,
                        served_by: "",
                    };
                    match wire::encode(&head) {
                        Ok(mut enc) => {
                            // The head's own length prefix becomes the
                            // frame's: kind byte first.
                            enc.insert(0, TRAILERS);
                            Poll::Ready(Some(Ok(Frame::data(Bytes::from(enc)))))
                        }
                        Err(e) => Poll::Ready(Some(Err(BodyError::Framing(e.to_string())))),
                    }
                }
                Err(_) => Poll::Ready(Some(Ok(Frame::data(Bytes::new())))),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

struct Unframed {
    inner: Body,
    /// Bytes read and not yet parsed (a partial prefix or trailers frame).
    buf: BytesMut,
    /// Bytes of the current data frame still to pass on.
    data_left: usize,
    ended: bool,
}

impl Unframed {
    /// The next frame out of what `buf` holds, if it holds one.
    fn parse(&mut self) -> Result<Option<Frame<Bytes>>, BodyError> {
        loop {
            if self.data_left > 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                let n = self.data_left.min(self.buf.len());
                self.data_left -= n;
                return Ok(Some(Frame::data(self.buf.split_to(n).freeze())));
            }
            if self.buf.len() < PREFIX {
                return Ok(None);
            }
            let kind = self.buf[0];
            let len = u32::from_be_bytes(self.buf[1..PREFIX].try_into().expect("4 bytes")) as usize;
            match kind {
                DATA => {
                    self.buf.advance(PREFIX);
                    self.data_left = len;
                }
                TRAILERS => {
                    if len > wire::MAX_HEAD_LEN {
                        return Err(BodyError::Framing(format!(
                            "trailers of {len} bytes exceed the {}-byte limit",
                            wire::MAX_HEAD_LEN
                        )));
                    }
                    if self.buf.len() < PREFIX + len {
                        return Ok(None);
                    }
                    self.buf.advance(PREFIX);
                    let payload = self.buf.split_to(len).freeze();
                    let head = wire::decode_response(&payload)
                        .map_err(|e| BodyError::Framing(e.to_string()))?;
                    self.ended = true;
                    return Ok(Some(Frame::trailers(head.headers)));
                }
                k => return Err(BodyError::Framing(format!("unknown body frame kind {k}"))),
            }
        }
    }
}

impl HttpBody for Unframed {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            match this.parse() {
                Ok(Some(f)) => return Poll::Ready(Some(Ok(f))),
                Ok(None) => {}
                Err(e) => {
                    this.ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        if this.buf.is_empty() && this.data_left >= d.len() && !d.is_empty() {
                            // A whole chunk of data: passed on without a copy.
                            this.data_left -= d.len();
                            return Poll::Ready(Some(Ok(Frame::data(d))));
                        }
                        this.buf.extend_from_slice(&d);
                    }
                }
                Some(Err(e)) => {
                    this.ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
                None => {
                    this.ended = true;
                    if this.buf.is_empty() && this.data_left == 0 {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Err(BodyError::Framing(
                        "the stream ended inside a body frame".into(),
                    ))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    /// A body of data chunks and trailers.
    fn source(chunks: &[&'static [u8]], trailers: Option<HeaderMap>) -> Body {
        let mut frames: Vec<Result<Frame<Bytes>, BodyError>> = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::from_static(c))))
            .collect();
        if let Some(t) = trailers {
            frames.push(Ok(Frame::trailers(t)));
        }
        http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync()
    }

    /// Framed bytes cut into `step`-byte pieces, as a stream may deliver them.
    async fn wire_bytes(body: Body, step: usize) -> Body {
        let all = framed(body).collect().await.unwrap().to_bytes();
        let pieces: Vec<Result<Frame<Bytes>, BodyError>> = all
            .chunks(step)
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        http_body_util::StreamBody::new(futures_util::stream::iter(pieces)).boxed_unsync()
    }

    #[tokio::test]
    async fn data_and_trailers_survive_framing_however_the_bytes_are_cut() {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", "0".parse().unwrap());
        t.insert("grpc-message", "fine".parse().unwrap());
        for step in [1, 3, 7, 64, 4096] {
            let got =
                unframed(wire_bytes(source(&[b"hello ", b"world"], Some(t.clone())), step).await)
                    .collect()
                    .await
                    .unwrap();
            assert_eq!(got.trailers(), Some(&t), "step {step}");
            assert_eq!(&got.to_bytes()[..], b"hello world", "step {step}");
        }
        let got = unframed(wire_bytes(source(&[b"no trailers"], None), 2).await)
            .collect()
            .await
            .unwrap();
        assert!(got.trailers().is_none());
        assert_eq!(&got.to_bytes()[..], b"no trailers");
    }

    #[tokio::test]
    async fn bytes_that_do_not_frame_are_an_error() {
        let cut =
            http_body_util::StreamBody::new(futures_util::stream::iter(vec![Ok::<_, BodyError>(
                Frame::data(Bytes::from_static(&[0, 0, 0, 0, 9, b'a'])),
            )]))
            .boxed_unsync();
        assert!(unframed(cut).collect().await.is_err());
        let bad = super::super::full(Bytes::from_static(&[7, 0, 0, 0, 0]));
        assert!(unframed(bad).collect().await.is_err());
    }
}
