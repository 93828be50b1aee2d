//! Which node serves a SIP request: the same ring and membership view as
//! HTTP, always consistent hash (the converged load balancer balances SIP
//! by hash key whatever the HTTP policy is).
//!
//! Order of precedence:
//!
//! 1. The Request-URI carries `peerlb-owner` (the remote target an
//!    owner's `Contact` set, [`super::target_owner`]) or the topmost
//!    `Route` carries this cluster's dialog parameters
//!    ([`super::dialog_route`]): the owner the Request-URI names while it
//!    is serving or draining (it finishes its dialogs, as it finishes the
//!    sessions of its sticky routes), else the one the `Route` names on
//!    the same terms, else the owner of the dialog's key (the `Route`'s)
//!    on the ring (the next ring node for it:
//!    [`SipReason::DialogFailover`]).
//! 2. The first `<sip-rules>` rule yielding a key ([`Rules::extract_sip`]).
//! 3. The default key: From tag + Call-ID ([`super::default_key`]); a
//!    request without a From tag (RFC 3261 8.1.1.3 requires one) is keyed
//!    by its Call-ID alone.
//!
//! With no serving member with weight on the ring, the entry node serves.

use std::net::SocketAddr;

use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};

use super::{SipMessage, StartLine, dialog_route, full_name, target_owner, uri_params_as_query};
use crate::engine::membership::MembershipView;
use crate::engine::node_id::NodeId;
use crate::engine::rules::{RequestView, Rules};

/// Why a [`SipDecision`] picked its owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SipReason {
    /// The top `Route`'s `peerlb-owner` names a serving or draining member.
    DialogOwner,
    /// The Request-URI's `peerlb-owner` (the remote target an owner's
    /// `Contact` set) names a serving or draining member.
    TargetOwner,
    /// The dialog's owner is gone: the owner of its key on the ring.
    DialogFailover,
    /// `<sip-rules>` rule `n` (0-based) gave the key.
    Rule(usize),
    /// The default key (From tag + Call-ID).
    DefaultKey,
    /// No serving member on the ring: the entry node serves.
    NoMembers,
}

impl SipReason {
    /// The reason as logs and metrics spell it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SipReason::DialogOwner => "dialog-owner",
            SipReason::TargetOwner => "dialog-target",
            SipReason::DialogFailover => "dialog-failover",
            SipReason::Rule(_) => "rule",
            SipReason::DefaultKey => "default-key",
            SipReason::NoMembers => "no-members",
        }
    }
}

/// The outcome of routing one SIP request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SipDecision {
    /// The node that should serve the request.
    pub owner: NodeId,
    /// The hash key (the dialog's key for an in-dialog request).
    pub key: String,
    /// Why the owner was picked.
    pub reason: SipReason,
}

impl SipDecision {
    /// The owner, then the other ring nodes in the key's failover order,
    /// each once.
    pub(crate) fn candidates<'a>(
        &'a self,
        view: &'a MembershipView,
    ) -> impl Iterator<Item = &'a NodeId> {
        std::iter::once(&self.owner).chain(
            view.ring()
                .candidates(&self.key)
                .filter(move |id| **id != self.owner),
        )
    }
}

/// The parts of a SIP request the rules look at, owned (a SIP message
/// has no `http::Request` to borrow from): the method, the Request-URI's
/// parameters as the query of `/`, and the header fields under their full
/// lowercase names (fields whose name or value HTTP cannot hold are left
/// out).
#[derive(Debug)]
pub(crate) struct SipView {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
}

impl SipView {
    /// The view of `msg` (a request; a response has only headers).
    pub(crate) fn new(msg: &SipMessage) -> SipView {
        let (method, query) = match &msg.start {
            StartLine::Request { method, uri } => (
                Method::from_bytes(method.as_bytes()).unwrap_or(Method::GET),
                uri_params_as_query(uri),
            ),
            StartLine::Response { .. } => (Method::GET, String::new()),
        };
        let uri = format!("/?{query}")
            .parse()
            .unwrap_or_else(|_| Uri::from_static("/"));
        let mut headers = HeaderMap::new();
        for (n, v) in &msg.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(full_name(n).as_bytes()),
                HeaderValue::from_str(v),
            ) {
                headers.append(n, v);
            }
        }
        SipView {
            method,
            uri,
            headers,
        }
    }

    /// As the rules see it, from `client`.
    pub(crate) fn view(&self, client: SocketAddr) -> RequestView<'_> {
        RequestView {
            method: &self.method,
            uri: &self.uri,
            headers: &self.headers,
            client,
            tls: false,
            sni: None,
        }
    }
}

/// Routes the SIP request `msg` from `client` (see the module doc).
pub(crate) fn decide(
    msg: &SipMessage,
    client: SocketAddr,
    rules: &Rules,
    view: &MembershipView,
) -> SipDecision {
    let route = dialog_route(msg);
    // The remote target's owner wins over the Route's: a target refresh
    // answered by a new owner after a failover names it there, while the
    // route set never changes (RFC 3261 12.2.1.2). Either is taken only
    // while serving or draining; then the dialog key's owner.
    let target = target_owner(msg).map(|o| (o, SipReason::TargetOwner));
    let routed = route
        .as_ref()
        .map(|d| (d.owner.as_str(), SipReason::DialogOwner));
    // Serving or draining, like a sticky route: a draining node finishes
    // its dialogs.
    let named = target
        .into_iter()
        .chain(routed)
        .find_map(|(name, reason)| view.sticky_target(name).map(|id| (id, reason)));
    if let Some((id, reason)) = named {
        let key = match &route {
            Some(d) => d.key.clone(),
            None => request_key(msg, client, rules).0,
        };
        return SipDecision {
            owner: id.clone(),
            key,
            reason,
        };
    }
    let (key, reason) = match route {
        Some(d) => (d.key, SipReason::DialogFailover),
        None => request_key(msg, client, rules),
    };
    match view.ring().owner(&key) {
        Some(owner) => SipDecision {
            owner: owner.clone(),
            key,
            reason,
        },
        None => SipDecision {
            owner: view.self_id().clone(),
            key,
            reason: SipReason::NoMembers,
        },
    }
}

/// The key of a request outside a dialog of this cluster: the first
/// `<sip-rules>` rule yielding one, else From tag + Call-ID, else the
/// Call-ID.
fn request_key(msg: &SipMessage, client: SocketAddr, rules: &Rules) -> (String, SipReason) {
    if let Some((i, key)) = (rules.sip_len() > 0)
        .then(|| rules.extract_sip(&SipView::new(msg).view(client)))
        .flatten()
    {
        return (key, SipReason::Rule(i));
    }
    let key = super::default_key(msg)
        .or_else(|| msg.call_id().map(str::to_owned))
        .unwrap_or_default();
    (key, SipReason::DefaultKey)
}
