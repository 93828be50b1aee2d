//! A SIP request's hash key and this cluster's dialog parameters:
//! SailFin's BERoute / BEKey as `Record-Route` / `Route` URI parameters
//! (docs/architecture.md, "SIP", "Dialog stickiness"), the default key
//! (From tag + Call-ID), and the Request-URI parameters `<sip-rules>` read.

use std::borrow::Cow;
use std::fmt::Write as _;

use super::{SipMessage, uri_param};

/// The `Route` / `Record-Route` URI parameter naming a dialog's owner
/// (SailFin's `BERoute`): `peerlb-owner=<node id>`.
const OWNER_PARAM: &str = "peerlb-owner";
/// The `Route` / `Record-Route` URI parameter carrying a dialog's hash key
/// (SailFin's `BEKey`), percent-encoded: `peerlb-key=<key>`.
const KEY_PARAM: &str = "peerlb-key";

/// The dialog's owner and hash key, as a `Record-Route` of this cluster
/// names them in the top `Route` of a later request of the dialog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DialogRoute {
    /// The node that served the dialog-creating request.
    pub owner: String,
    /// The dialog's hash key (for failover on the ring when the owner is
    /// gone).
    pub key: String,
}

/// The `Record-Route` value an entry node adds to a dialog-creating
/// request (RFC 3261 16.6 step 4): `<sip:<addr>;transport=<t>;lr;
/// peerlb-owner=<owner>;peerlb-key=<key, percent-encoded>>`. `addr` is the
/// entry's `sip_addr` (any node of the cluster accepts it as its own).
pub(crate) fn record_route(
    addr: std::net::SocketAddr,
    tcp: bool,
    owner: &str,
    key: &str,
) -> String {
    let transport = if tcp { "tcp" } else { "udp" };
    format!(
        "<sip:{addr};transport={transport};lr;{OWNER_PARAM}={owner};{KEY_PARAM}={}>",
        escape_param(key)
    )
}

/// The [`DialogRoute`] of a request whose topmost `Route` carries this
/// cluster's parameters; `None` otherwise.
pub(crate) fn dialog_route(msg: &SipMessage) -> Option<DialogRoute> {
    let top = *msg.header_list("route").first()?;
    let owner = uri_param(top, OWNER_PARAM).filter(|o| !o.is_empty())?;
    let key = uri_param(top, KEY_PARAM).map(unescape_param)?;
    Some(DialogRoute {
        owner: owner.to_owned(),
        key: key.into_owned(),
    })
}

/// Percent-encodes everything but RFC 3261 25.1 `unreserved` characters.
fn escape_param(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn unescape_param(s: &str) -> Cow<'_, str> {
    crate::engine::sticky::percent_decode(s, false)
}

/// The hash key of a SIP request with no `<sip-rules>` rule yielding one
/// (the converged load balancer's default): `From` tag and `Call-ID` as
/// `<tag>|<call-id>`. A `CANCEL` and the `ACK` of a non-2xx carry the
/// INVITE's From tag and Call-ID (RFC 3261 9.1, 17.1.1.3), so they get the
/// INVITE's key. `None` when either is missing.
pub(crate) fn default_key(msg: &SipMessage) -> Option<String> {
    Some(format!("{}|{}", msg.tag_of_from()?, msg.call_id()?))
}

/// The query-string form of a Request-URI's parameters
/// (`sip:a@h;x=1;lr` gives `x=1&lr`): what `<request-uri parameter=...>`
/// of a `<sip-rules>` rule reads.
pub(crate) fn uri_params_as_query(uri: &str) -> String {
    let uri = uri.split_once('?').map_or(uri, |(u, _)| u);
    uri.split(';').skip(1).collect::<Vec<_>>().join("&")
}
