//! The owner's side of SIP: the built-in demo server ([`SipApp`]), with
//! the dialogs it established, or a relay to an upstream SIP server
//! (`sip_app = "udp:<ip>:<port>"`, [`upstream`]). The entry side (the
//! listeners, routing and forwarding) is `front/sip.rs`.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body::Frame;
use http_body_util::BodyExt as _;
use tokio::sync::mpsc;

use crate::adapters::body::{Body, BodyError};
use crate::adapters::errors::SipStreamAnswer::{FlowGone, NotSip, Taken};
use crate::adapters::errors::sip_stream_answer;
use crate::engine::node_id::NodeId;
use crate::engine::sip::{self as sipmsg, DialogTable, MAX_MESSAGE, SipMessage};

mod flows;
mod upstream;

pub(crate) use flows::Flow;
pub(crate) use upstream::{SipUpstream, Transport as SipTransport, UpstreamTls, UpstreamTlsError};

/// The SIP server of one node: the built-in demo server (`engine::sip`
/// `uas`), with the dialogs it established, or a relay to an upstream SIP
/// server (`sip_app`).
pub(crate) struct SipApp {
    node: NodeId,
    contact: String,
    dialogs: Mutex<DialogTable>,
    upstream: Option<SipUpstream>,
}

impl SipApp {
    /// The demo server of node `node`; its `Contact` names `sip_addr`
    /// (`<node>.invalid` on a node with no SIP listener).
    pub(crate) fn new(node: NodeId, sip_addr: Option<SocketAddr>) -> SipApp {
        let contact = sip_addr.map_or_else(|| format!("{node}.invalid"), |a| a.to_string());
        SipApp {
            node,
            contact,
            dialogs: Mutex::new(DialogTable::default()),
            upstream: None,
        }
    }

    /// The same node relaying every request to `upstream` instead of
    /// answering it with the demo server.
    pub(crate) fn with_upstream(mut self, upstream: Option<SipUpstream>) -> SipApp {
        self.upstream = upstream;
        self
    }

    /// The upstream SIP server, when `sip_app` names one.
    pub(crate) fn upstream(&self) -> Option<&SipUpstream> {
        self.upstream.as_ref()
    }

    /// Hands `emit` the answers to `req` as they come, in order (none
    /// for `ACK` or a response): the demo server's (all at once), or the
    /// upstream's (`SipUpstream::transact`).
    pub(crate) async fn answer(&self, req: &SipMessage, emit: &Emit<'_>) {
        if let Some(up) = &self.upstream {
            return up.transact(req, self.node.as_str(), emit).await;
        }
        let answers = {
            let mut dialogs = self.dialogs.lock().expect("dialog table lock");
            sipmsg::serve_uas(req, &self.node, &self.contact, &mut dialogs)
        };
        for a in &answers {
            emit(a);
        }
    }

    /// Serves a SIP request a peer forwarded (`wire::SIP`): the body is
    /// the SIP message (a response of the upstream, that reached the
    /// peer's listener, is handed to its transaction and answered `200`
    /// with no body); the answer is `200` at once, its body the SIP
    /// responses one after the other as they come (each framed by its
    /// `Content-Length`; the body ends after the final one), or `400` (no
    /// body) when the body is not a SIP request. The transaction runs in
    /// a task of its own: an entry that goes away does not cut it short.
    ///
    /// `inflight` (the node's in-flight count of the request) is held
    /// until the transaction ends, as for an HTTP request until its
    /// response ends.
    pub(crate) async fn serve_proxied<G: Send + 'static>(
        self: Arc<Self>,
        body: Body,
        inflight: G,
    ) -> Response<Body> {
        let Ok(bytes) = http_body_util::Limited::new(body, MAX_MESSAGE)
            .collect()
            .await
        else {
            return sip_stream_answer(NotSip);
        };
        let req = match sipmsg::parse(&bytes.to_bytes()) {
            Ok(m) if m.method().is_some() => m,
            // A response of the upstream that reached a peer's listener
            // (`SipEntry`'s stray responses): handed to its transaction
            // here, never passed on.
            Ok(m) => {
                if let Some(up) = &self.upstream {
                    up.deliver(m).await;
                    return sip_stream_answer(Taken);
                }
                return sip_stream_answer(NotSip);
            }
            Err(_) => return sip_stream_answer(NotSip),
        };
        let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
        tokio::spawn(async move {
            let _inflight = inflight;
            let emit = |m: &SipMessage| {
                let _ = tx.send(Bytes::from(m.to_bytes()));
            };
            self.answer(&req, &emit).await;
        });
        Response::new(ChannelBody(rx).boxed_unsync())
    }
}

impl SipApp {
    /// Serves a request of the SIP server a peer sent for the caller's
    /// connection `id` this node holds ([`wire::SIP_FLOW`](crate::adapters::wire::SIP_FLOW)):
    /// the body, one SIP message, is written on it and the answer is
    /// `200`; `410` when no such connection is open (or this node relays
    /// to no SIP server, so registers none), `400` for a body that is not
    /// one SIP message. No body either way.
    pub(crate) async fn serve_flow(self: Arc<Self>, id: String, body: Body) -> Response<Body> {
        let Ok(bytes) = http_body_util::Limited::new(body, MAX_MESSAGE)
            .collect()
            .await
        else {
            return sip_stream_answer(NotSip);
        };
        let bytes = bytes.to_bytes();
        if sipmsg::frame_len(&bytes) != Ok(Some(bytes.len())) {
            return sip_stream_answer(NotSip);
        }
        match &self.upstream {
            Some(up) if up.flows().send(&id, bytes.to_vec()) => sip_stream_answer(Taken),
            _ => sip_stream_answer(FlowGone),
        }
    }
}

/// The transport and address of `config`'s `sip_app`, `None` for the
/// built-in server; a `tls:` one with its trust (`[sips]`).
///
/// # Errors
/// [`UpstreamTlsError`] when that trust cannot be used.
pub(crate) fn upstream_of(
    config: &crate::config::NodeConfig,
) -> Result<Option<(SipTransport, SocketAddr)>, UpstreamTlsError> {
    use crate::config::SipAppKind as K;
    Ok(match config.sip_app {
        K::Builtin => None,
        K::Udp(a) => Some((SipTransport::Udp, a)),
        K::Tcp(a) => Some((SipTransport::Tcp, a)),
        K::Tls(a) => {
            let ca = config.sips.upstream_ca.as_deref().unwrap_or("".as_ref());
            let name = config.sips.upstream_server_name.as_deref();
            Some((SipTransport::Tls(UpstreamTls::load(ca, name, a.ip())?), a))
        }
    })
}

/// Checks the trust of `sip_app = "tls:..."` (`[sips] upstream_ca` and
/// `upstream_server_name`) as the node will use it, before it binds
/// anything; nothing to check for another `sip_app`.
///
/// # Errors
/// What is wrong, naming the field (`sips.upstream_ca: ...`).
pub fn check_upstream_tls(config: &crate::config::NodeConfig) -> Result<(), String> {
    upstream_of(config).map(|_| ()).map_err(|e| e.to_string())
}

/// Where a SIP transaction hands each answer, as it comes.
pub(crate) type Emit<'a> = dyn Fn(&SipMessage) + Send + Sync + 'a;

/// A response body fed by a channel: one data frame per message sent,
/// ending when every sender is dropped.
struct ChannelBody(mpsc::UnboundedReceiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.0.poll_recv(cx).map(|m| m.map(|b| Ok(Frame::data(b))))
    }
}
