//! Which HTTP a cleartext client speaks: HTTP/2 with prior knowledge
//! starts with the connection preface (RFC 9113 section 3.4), anything
//! else is HTTP/1.x. The bytes read to tell are handed back in front of
//! the connection ([`Prefixed`]), so the chosen server reads them first.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// The HTTP/2 client connection preface (RFC 9113 section 3.4).
pub(super) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads from `io` until its first bytes are the whole HTTP/2 preface
/// (true) or differ from it (false: HTTP/1.x; usually after the first
/// byte), or the client closes (false). Returns the bytes read.
///
/// # Errors
/// The read error of `io`.
pub(super) async fn detect<I: AsyncRead + Unpin>(io: &mut I) -> std::io::Result<(bool, Bytes)> {
    let mut buf = [0u8; PREFACE.len()];
    let mut len = 0;
    loop {
        let n = io.read(&mut buf[len..]).await?;
        if n == 0 {
            return Ok((false, Bytes::copy_from_slice(&buf[..len])));
        }
        len += n;
        if buf[..len] != PREFACE[..len] {
            return Ok((false, Bytes::copy_from_slice(&buf[..len])));
        }
        if len == PREFACE.len() {
            return Ok((true, Bytes::copy_from_slice(&buf)));
        }
    }
}

/// A connection whose first reads return `prefix` (bytes already read
/// from it), then read the connection itself; writes go straight through.
pub(crate) struct Prefixed<I> {
    prefix: Bytes,
    io: I,
}

impl<I> Prefixed<I> {
    /// `io` with `prefix` read first.
    pub(crate) fn new(prefix: Bytes, io: I) -> Prefixed<I> {
        Prefixed { prefix, io }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Prefixed<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Prefixed<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    async fn detect_bytes(chunks: &[&[u8]]) -> (bool, Vec<u8>, Vec<u8>) {
        let (mut client, server) = tokio::io::duplex(1024);
        for c in chunks {
            client.write_all(c).await.unwrap();
        }
        drop(client);
        let mut server = server;
        let (h2, prefix) = detect(&mut server).await.unwrap();
        let mut all = Vec::new();
        Prefixed::new(prefix.clone(), server)
            .read_to_end(&mut all)
            .await
            .unwrap();
        (h2, prefix.to_vec(), all)
    }

    #[tokio::test]
    async fn the_preface_means_http2_and_is_read_again() {
        let (h2, prefix, all) = detect_bytes(&[&PREFACE[..5], &PREFACE[5..], b"\0\0\x06"]).await;
        assert!(h2);
        assert_eq!(prefix, PREFACE);
        assert_eq!(all, [&PREFACE[..], b"\0\0\x06"].concat());
    }

    #[tokio::test]
    async fn anything_else_is_http1_after_its_first_differing_byte() {
        let (h2, prefix, all) = detect_bytes(&[b"GET / HTTP/1.1\r\n\r\n"]).await;
        assert!(!h2);
        assert_eq!(all, b"GET / HTTP/1.1\r\n\r\n");
        assert!(!prefix.is_empty());
        // A close before a whole preface: HTTP/1.x, with what was read.
        let (h2, prefix, _) = detect_bytes(&[b"PRI * HT"]).await;
        assert!(!h2);
        assert_eq!(prefix, b"PRI * HT");
    }
}
