//! The one sender of the peer wire: every stream this node opens to a
//! peer (an HTTP request from the ingress, a SIP message, an admin
//! action) goes out through [`open`] and [`Ready::send`] (or
//! [`Ready::send_tunnel`]), or [`send()`], which is both. The request is an
//! [`Outgoing`]: the stream's kind and its head, encoded for the layout of
//! the connection the stream opened on ([`wire::Version`]) and kept for
//! the next attempt. Its errors are one type, [`SendError`], which each
//! sender maps to its own once.

use super::*;

/// A request for a peer: the stream's kind and its head, each frame
/// layout's bytes encoded the first time a stream on a connection of that
/// layout asks for them, and shared by every later attempt (the entry's
/// failover tries the next candidate with the same bytes).
#[derive(Debug)]
pub(crate) struct Outgoing<'a> {
    frame: wire::RequestFrame<'a>,
    /// The `peerlb/2` frame, then the `peerlb/3` one.
    encoded: [Option<Bytes>; 2],
}

impl<'a> Outgoing<'a> {
    /// A request of `kind` whose head is `head`, with peerlb's own marks
    /// `marks` ([`wire::MarkedRequestHead`]) after its header lines.
    pub(crate) fn new(
        kind: StreamKind,
        head: wire::RequestHeadRef<'a>,
        marks: &'a [(&'static str, &'static str)],
    ) -> Outgoing<'a> {
        Outgoing {
            frame: wire::RequestFrame {
                kind,
                head: wire::MarkedRequestHead { head, marks },
            },
            encoded: [None, None],
        }
    }

    /// The frame's bytes for a connection of `version`.
    fn bytes(&mut self, version: wire::Version) -> Result<Bytes, wire::WireError> {
        let slot = &mut self.encoded[match version {
            wire::Version::V2 => 0,
            wire::Version::V3 => 1,
        }];
        if let Some(b) = slot {
            return Ok(b.clone());
        }
        let b = Bytes::from(wire::encode_request(&self.frame, version)?);
        Ok(slot.insert(b).clone())
    }
}

/// A send that failed, by how far it got.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    /// No stream could be opened: nothing reached the peer; always safe
    /// to try another.
    #[error(transparent)]
    Open(OpenError),
    /// The head cannot be encoded (longer than [`wire::MAX_HEAD_LEN`]):
    /// nothing was sent, and no peer can take it.
    #[error(transparent)]
    Head(wire::WireError),
    /// The exchange failed after the head was sent: the peer may have
    /// processed the request unless it is [`ExchangeError::Refused`].
    #[error(transparent)]
    Exchange(ExchangeError),
}

/// A stream opened to a peer and the head to send on it, in its
/// connection's layout: [`Ready::send`] or [`Ready::send_tunnel`] sends it.
#[derive(Debug)]
pub(crate) struct Ready<'p> {
    peer: &'p NodeId,
    stream: PeerStream,
    head: Bytes,
}

/// Opens a stream to `peer` (dialling it when no connection is usable:
/// [`PeerLinks::open`]) and encodes `out` for its connection.
///
/// # Errors
/// [`SendError::Open`] or [`SendError::Head`]: nothing was sent.
pub(crate) async fn open<'p>(
    links: &Arc<PeerLinks>,
    peer: &'p NodeId,
    out: &mut Outgoing<'_>,
) -> Result<Ready<'p>, SendError> {
    let stream = links.open(peer).await.map_err(SendError::Open)?;
    let head = out.bytes(stream.version).map_err(SendError::Head)?;
    Ok(Ready { peer, stream, head })
}

impl<'p> Ready<'p> {
    /// Sends the head and `body`, and waits for the response head (each
    /// 1xx head before it goes to `info`, when the head asked for them:
    /// [`exchange_informational`]). The exchange's own future, not one
    /// around it: the entry's request future holds it inline.
    ///
    /// # Errors
    /// [`ExchangeError`] (a [`SendError::Exchange`] to the callers that
    /// also opened the stream).
    pub(crate) fn send<'a>(
        self,
        body: Body,
        timeout: Duration,
        info: Option<&'a Informational>,
    ) -> impl std::future::Future<Output = Result<(DecodedResponseHead, PeerBody), ExchangeError>>
    + Send
    + 'a
    where
        'p: 'a,
    {
        exchange_informational(self.peer, self.stream, self.head, body, timeout, info)
    }

    /// Sends the head of a tunnel request (no body) and waits for the
    /// response head ([`exchange_tunnel`]).
    ///
    /// # Errors
    /// [`ExchangeError`].
    pub(crate) fn send_tunnel(
        self,
        timeout: Duration,
    ) -> impl std::future::Future<
        Output = Result<(DecodedResponseHead, TunnelAnswer), ExchangeError>,
    > + Send
    + 'p {
        exchange_tunnel(self.peer, self.stream, self.head, timeout)
    }
}

/// [`open`] then [`Ready::send`] without informational answers: one
/// request of `out`'s kind to `peer` with `body`.
///
/// # Errors
/// [`SendError`].
pub(crate) async fn send(
    links: &Arc<PeerLinks>,
    peer: &NodeId,
    out: &mut Outgoing<'_>,
    body: Body,
    timeout: Duration,
) -> Result<(DecodedResponseHead, PeerBody), SendError> {
    open(links, peer, out)
        .await?
        .send(body, timeout, None)
        .await
        .map_err(SendError::Exchange)
}

#[cfg(test)]
mod tests;
