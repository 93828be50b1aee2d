//! A request of the upstream relayed toward a caller over the caller's own
//! TCP or TLS connection (RFC 5923 connection reuse), held by the entry
//! node that accepted it (`serve/sip/flows.rs`): written on it here when
//! this node holds it, else sent to the holder over the peer wire, marked
//! [`wire::SIP_FLOW`] (value: the flow id), which writes it on the
//! connection and answers `200`, or `410` when the connection is gone.
//! The caller's answers come back over that connection to the holder's
//! listener, and from there, as any answer a caller sends a listener, to
//! the relay (`SipEntry`'s stray responses, `SipUpstream::deliver`).

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt as _;

use super::super::flows::Flows;
use crate::adapters::body;
use crate::adapters::node_state::NodeState;
use crate::adapters::transport::peer::{self, PeerLinks};
use crate::adapters::wire::{self, RequestHeadRef, SipTransport, StreamKind};
use crate::engine::node_id::NodeId;
use crate::engine::sip::FlowRoute;

/// What a node needs to reach the callers' connections of the cluster.
pub(crate) struct FlowReach {
    /// This node's flows.
    pub(crate) flows: Arc<Flows>,
    /// The peer links, to the node that holds another flow; `None` in unit
    /// tests of a lone node.
    pub(crate) links: Option<Arc<PeerLinks>>,
    /// The node's state (its id and view version for the peer head).
    pub(crate) state: Arc<NodeState>,
    /// How long a peer may take to answer.
    pub(crate) timeout: Duration,
}

/// The caller's connection a request goes over.
pub(crate) struct FlowSocket {
    pub(crate) route: FlowRoute,
    pub(crate) reach: Arc<FlowReach>,
}

impl FlowSocket {
    /// Writes `bytes` (one whole message) on the flow.
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone (its connection closed, or the
    /// node that held it does not know it), the peer's error when its node
    /// cannot be reached.
    pub(crate) async fn send(&self, bytes: &[u8]) -> std::io::Result<()> {
        let gone = || std::io::Error::from(std::io::ErrorKind::NotConnected);
        let reach = &self.reach;
        let me = reach.state.node_id();
        if self.route.node == me.as_str() {
            return if reach.flows.send(&self.route.id, bytes.to_vec()) {
                Ok(())
            } else {
                Err(gone())
            };
        }
        let Some(links) = &reach.links else {
            return Err(gone());
        };
        let to = NodeId::from(self.route.node.as_str());
        let other = |e: String| std::io::Error::other(e);
        let mut headers = http::HeaderMap::new();
        let transport = if self.route.tls {
            SipTransport::Tls
        } else {
            SipTransport::Tcp
        };
        let id = http::HeaderValue::from_str(&self.route.id).map_err(|_| gone())?;
        headers.insert(wire::SIP_FLOW, id);
        headers.insert(http::header::CONTENT_LENGTH, bytes.len().into());
        let mut out = peer::Outgoing::new(
            StreamKind::Sip(transport),
            RequestHeadRef {
                request_id: xxhash_rust::xxh3::xxh3_128(bytes),
                entry: me,
                hops: 1,
                view_version: reach.state.view().version(),
                method: "SIP",
                uri: "/",
                headers: &headers,
                client: self.route.addr,
                hash_key: None,
                tls: None,
            },
            &[],
        );
        let (head, body) = peer::send(
            links,
            &to,
            &mut out,
            body::full(bytes.to_vec()),
            reach.timeout,
        )
        .await
        .map_err(|e| other(e.to_string()))?;
        // Read to its end (an empty body), so the stream closes cleanly.
        let _ = body.collect().await;
        if head.status == 200 {
            Ok(())
        } else {
            Err(gone())
        }
    }
}
