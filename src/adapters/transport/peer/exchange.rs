//! The entry's side of a peer stream: one request sent on an opened
//! stream and its answer read, the owner's 1xx heads before the final one
//! ([`exchange_informational`]), or a tunnel ([`exchange_tunnel`]); the
//! sender (`send.rs`) calls them. Moved out of `peer.rs` as it was (the owner's
//! side, `serve`, stays there).

use bytes::Bytes;
use http_body::Body as _;
use tracing::debug;

use super::*;

/// Sends one request on an opened stream and waits for the response head.
/// `head` is the encoded request frame ([`wire::encode_request`], made
/// once per layout and shared by every attempt: `send::Outgoing`). Each
/// 1xx head the owner sends before the final one (when the head asked:
/// [`wire::INFORMATIONAL`]) goes to `info` and starts the response timeout
/// again.
///
/// The request body streams in a task of its own, so a large upload and
/// the response flow at the same time.
///
/// # Errors
/// [`ExchangeError`]; the owner may have processed the request unless it
/// is [`ExchangeError::Refused`].
pub(crate) async fn exchange_informational(
    peer: &NodeId,
    stream: PeerStream,
    head: Bytes,
    body: Body,
    timeout: Duration,
    info: Option<&Informational>,
) -> Result<(DecodedResponseHead, PeerBody), ExchangeError> {
    let PeerStream {
        mut send,
        mut recv,
        busy,
        ..
    } = stream;
    let failed = |reason: String| ExchangeError::Failed {
        peer: peer.clone(),
        reason,
    };
    send.write_chunk(head)
        .await
        .map_err(|e| failed(e.to_string()))?;
    // Told when the client's own body fails while it is pumped (no channel
    // for a request without a body).
    let client_failure = if body.is_end_stream() {
        let _ = send.finish();
        None
    } else {
        let (client_failed, client_failure) = tokio::sync::oneshot::channel::<body::BodyError>();
        tokio::spawn(async move {
            match body::pump(body, &mut send).await {
                Ok(_) => {}
                Err(body::PumpError::Source(
                    e @ (body::BodyError::Client(_) | body::BodyError::ClientTimeout(_)),
                )) => {
                    debug!(target: LOG, error = %e, "client request body failed: stream reset");
                    let _ = client_failed.send(e);
                }
                Err(e) => debug!(target: LOG, error = %e, "request body to peer stopped"),
            }
        });
        Some(client_failure)
    };
    // A client body failure before the head is a bad request; a pump
    // that ended otherwise (the sender dropped) changes nothing.
    let client_body = async {
        match client_failure {
            Some(rx) => match rx.await {
                Ok(why) => why,
                Err(_) => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    };
    tokio::pin!(client_body);
    // Each informational head (asked for with `wire::INFORMATIONAL`) is
    // handed on and starts the response timeout again: the app is alive.
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let resp = loop {
        let head = tokio::select! {
            biased;
            why = &mut client_body => return Err(ExchangeError::ClientBody(why)),
            resp = read_response_head(&mut recv) => resp.map_err(|e| response_head_error(peer, e))?,
            () = &mut deadline => return Err(ExchangeError::Timeout(peer.clone())),
        };
        if !crate::adapters::informational::relayed(head.status) {
            break head;
        }
        if let (Some(sink), Ok(status)) = (info, http::StatusCode::from_u16(head.status)) {
            sink.send(InfoHead::new(status, &head.headers));
        }
        deadline
            .as_mut()
            .reset(tokio::time::Instant::now() + timeout);
    };
    let len = resp.content_length();
    Ok((resp, PeerBody::new(QuicBody::new(recv, len), busy)))
}

/// The exchange error of a response head that could not be read.
fn response_head_error(peer: &NodeId, e: HeadError) -> ExchangeError {
    match e {
        HeadError::Read(quinn::ReadExactError::ReadError(quinn::ReadError::Reset(code)))
            if code.into_inner() == u64::from(wire::RESET_REFUSED) =>
        {
            ExchangeError::Refused(peer.clone())
        }
        e => ExchangeError::Failed {
            peer: peer.clone(),
            reason: e.to_string(),
        },
    }
}

/// What an owner answered to a tunnel request.
pub(crate) enum TunnelAnswer {
    /// `101`: the stream is the tunnel now (both directions raw bytes).
    Tunnel(BoxIo),
    /// Any other status: an ordinary response body.
    Body(PeerBody),
}

/// Sends a tunnel request (a WebSocket upgrade, marked [`wire::TUNNEL`] in
/// `head`; no body) on an opened stream and waits for the response head:
/// on `101` the stream itself is the tunnel's owner side, else the entry
/// ends its direction and the response body follows as in [`exchange_informational`].
/// See the tunnel section of [`crate::adapters::wire`].
///
/// # Errors
/// As [`exchange_informational`] (no client body can fail: there is none).
pub(crate) async fn exchange_tunnel(
    peer: &NodeId,
    stream: PeerStream,
    head: Bytes,
    timeout: Duration,
) -> Result<(DecodedResponseHead, TunnelAnswer), ExchangeError> {
    let PeerStream {
        mut send,
        mut recv,
        busy,
        ..
    } = stream;
    send.write_chunk(head)
        .await
        .map_err(|e| ExchangeError::Failed {
            peer: peer.clone(),
            reason: e.to_string(),
        })?;
    let resp = tokio::time::timeout(timeout, read_response_head(&mut recv))
        .await
        .map_err(|_| ExchangeError::Timeout(peer.clone()))?
        .map_err(|e| response_head_error(peer, e))?;
    if resp.status == http::StatusCode::SWITCHING_PROTOCOLS.as_u16() {
        let io = StreamTunnel {
            io: tokio::io::join(recv, send),
            _busy: Some(busy),
        };
        return Ok((resp, TunnelAnswer::Tunnel(Box::new(io))));
    }
    let _ = send.finish();
    let len = resp.content_length();
    Ok((
        resp,
        TunnelAnswer::Body(PeerBody::new(QuicBody::new(recv, len), busy)),
    ))
}

/// A request stream as a tunnel's byte stream: reads from the peer,
/// writes to it, and its end of writes is the stream's FIN. Holds its
/// connection busy (liveness checks on) while open, at the entry.
pub(super) struct StreamTunnel {
    pub(super) io: tokio::io::Join<quinn::RecvStream, quinn::SendStream>,
    pub(super) _busy: Option<links::Busy>,
}

impl tokio::io::AsyncRead for StreamTunnel {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for StreamTunnel {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
