//! A SIP request's hash key and this cluster's dialog parameters:
//! SailFin's BERoute / BEKey as `Record-Route` / `Route` URI parameters
//! (docs/architecture.md, "SIP", "Dialog stickiness"), the owner named in
//! the remote target (`Contact` URI, then Request-URI) so that a target
//! refresh can move a dialog to a new owner after a failover, the default
//! key (From tag + Call-ID), and the Request-URI parameters `<sip-rules>`
//! read.

use std::borrow::Cow;
use std::fmt::Write as _;

use super::{SipMessage, uri_param};

/// The `Route` / `Record-Route` / `Contact` URI parameter naming a
/// dialog's owner (SailFin's `BERoute`): `peerlb-owner=<node id>`.
const OWNER_PARAM: &str = "peerlb-owner";
/// The `Route` / `Record-Route` URI parameter carrying a dialog's hash key
/// (SailFin's `BEKey`), percent-encoded: `peerlb-key=<key>`.
const KEY_PARAM: &str = "peerlb-key";
/// The `Record-Route` / `Route` URI parameter naming the caller's
/// connection a request reached an entry over (TCP or TLS):
/// `peerlb-flow=<id>.<node>` (RFC 5923 connection reuse, the flow token
/// of RFC 5626 5.2 kept by the entry node that holds the connection).
const FLOW_PARAM: &str = "peerlb-flow";

/// A caller's connection as a `Route` names it ([`FLOW_PARAM`]): the
/// entry node that holds it, its id there, and the listener address and
/// transport the `Route`'s URI gives (a request sent over it names them
/// in its `Via`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FlowRoute {
    /// The flow's id on its node (hex digits).
    pub id: String,
    /// The entry node that accepted the connection.
    pub node: String,
    /// The listener the connection reached (the `Route`'s host and port).
    pub addr: std::net::SocketAddr,
    /// Over TLS (a `sips:` URI or `transport=tls`), else TCP.
    pub tls: bool,
}

/// The flow token of the connection `id` held by `node`, as
/// [`record_route`] puts it: `<id>.<node>` (an id is hex, so the first `.`
/// ends it; a node id is a SIP token and may hold more).
pub(crate) fn flow_token(id: &str, node: &str) -> String {
    format!("{id}.{node}")
}

/// The [`FlowRoute`] of `route`, one `Route` value: a URI of this
/// cluster's with a well-formed `peerlb-flow` (`<hex>.<node>`) and an IP
/// host and port; `None` otherwise.
pub(crate) fn flow_of_route(route: &str) -> Option<FlowRoute> {
    let uri = match (route.find('<'), route.rfind('>')) {
        (Some(a), Some(b)) if a < b => &route[a + 1..b],
        _ => route,
    };
    let token = uri_param(uri, FLOW_PARAM)?;
    let (id, node) = token.split_once('.')?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) || node.is_empty() {
        return None;
    }
    let (scheme, rest) = uri.split_once(':')?;
    let sips = scheme.eq_ignore_ascii_case("sips");
    let tls = sips || uri_param(uri, "transport").is_some_and(|t| t.eq_ignore_ascii_case("tls"));
    let (main, _, _) = split_uri(rest);
    let hostport = main.rfind('@').map_or(main, |i| &main[i + 1..]);
    let addr = hostport.parse().ok()?;
    Some(FlowRoute {
        id: id.to_owned(),
        node: node.to_owned(),
        addr,
        tls,
    })
}

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

/// The transport a request reached an entry node over (its listener's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// UDP on `sip_addr`.
    Udp,
    /// TCP on `sip_addr`.
    Tcp,
    /// TLS over TCP on `sips_addr` (RFC 3261 26.2: SIPS).
    Tls,
}

impl Transport {
    /// The name in a `Via` sent-protocol (`UDP`, `TCP`, `TLS`).
    pub(crate) fn via_name(self) -> &'static str {
        match self {
            Transport::Udp => "UDP",
            Transport::Tcp => "TCP",
            Transport::Tls => "TLS",
        }
    }

    /// The URI `transport` parameter's value (`udp`, `tcp`, `tls`).
    pub(crate) fn param(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
            Transport::Tls => "tls",
        }
    }
}

/// Whether `msg` is a request whose Request-URI is a SIPS URI (RFC 3261
/// 19.1: `sips:`, scheme case-insensitive).
pub(crate) fn is_sips_request(msg: &SipMessage) -> bool {
    matches!(&msg.start, super::StartLine::Request { uri, .. }
        if uri.get(..5).is_some_and(|s| s.eq_ignore_ascii_case("sips:")))
}

/// The `Record-Route` value an entry node adds to a dialog-creating
/// request (RFC 3261 16.6 step 4): `<sip:<addr>;transport=<t>;lr;
/// peerlb-owner=<owner>;peerlb-key=<key, percent-encoded>>`, or for a
/// request with a SIPS Request-URI (which 16.6 step 4 requires a SIPS
/// Record-Route of; it came over TLS) `<sips:<addr>;lr;...>`. `addr` is
/// the address of the listener the request reached (any node of the
/// cluster accepts the route as its own). With `flow` (a [`flow_token`]:
/// the caller's TCP or TLS connection) `;peerlb-flow=<flow>` follows, so a
/// request of the dialog toward the caller can reach it over that
/// connection ([`flow_of_route`]).
pub(crate) fn record_route(
    addr: std::net::SocketAddr,
    transport: Transport,
    sips: bool,
    (owner, key): (&str, &str),
    flow: Option<&str>,
) -> String {
    let key = escape_param(key);
    let flow = flow.map_or(String::new(), |f| format!(";{FLOW_PARAM}={f}"));
    if sips {
        return format!("<sips:{addr};lr;{OWNER_PARAM}={owner};{KEY_PARAM}={key}{flow}>");
    }
    let transport = transport.param();
    format!("<sip:{addr};transport={transport};lr;{OWNER_PARAM}={owner};{KEY_PARAM}={key}{flow}>")
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

/// The `peerlb-owner` parameter of the request's Request-URI: the owner
/// the dialog's remote target names (the `Contact` an owner answered a
/// dialog-creating or target-refresh request with, [`with_owner_param`];
/// RFC 3261 12.2.1.1 has the caller copy that URI into the Request-URI of
/// every later request). `None` when absent or empty.
pub(crate) fn target_owner(msg: &SipMessage) -> Option<&str> {
    let super::StartLine::Request { uri, .. } = &msg.start else {
        return None;
    };
    uri_param(uri, OWNER_PARAM).filter(|o| !o.is_empty())
}

/// The parts of a SIP URI: everything through the host and port, the
/// `;`-separated parameters (without the first `;`), and the `?` headers
/// (without the `?`). The host part starts after the last `@`, since a
/// user part may hold `;` and `?` (RFC 3261 25.1 `user-unreserved`) and
/// neither parameters nor headers hold a bare `@`.
pub(crate) fn split_uri(uri: &str) -> (&str, Option<&str>, Option<&str>) {
    let host_at = uri.rfind('@').map_or(0, |i| i + 1);
    let rest = &uri[host_at..];
    let (main, headers) = match rest.find('?') {
        Some(q) => (&uri[..host_at + q], Some(&rest[q + 1..])),
        None => (uri, None),
    };
    match main[host_at..].find(';') {
        Some(p) => (
            &main[..host_at + p],
            Some(&main[host_at + p + 1..]),
            headers,
        ),
        None => (main, None, headers),
    }
}

/// `uri` with its parameter `name` (case-insensitive) removed and, when
/// `value` is given, `;name=value` added after the other parameters.
fn set_uri_param(uri: &str, name: &str, value: Option<&str>) -> String {
    let (main, params, headers) = split_uri(uri);
    let mut out = main.to_owned();
    for p in params.into_iter().flat_map(|p| p.split(';')) {
        let k = p.split_once('=').map_or(p, |(k, _)| k);
        if !k.trim().eq_ignore_ascii_case(name) {
            out.push(';');
            out.push_str(p);
        }
    }
    if let Some(v) = value {
        let _ = write!(out, ";{name}={v}");
    }
    if let Some(h) = headers {
        out.push('?');
        out.push_str(h);
    }
    out
}

/// A Request-URI without this cluster's `peerlb-owner` parameter: what
/// an owner sends its upstream SIP server, whose own `Contact` URI the
/// parameter was added to ([`with_owner_param`]), so the server sees the
/// URI it gave.
pub(crate) fn strip_owner_param(uri: &str) -> String {
    set_uri_param(uri, OWNER_PARAM, None)
}

/// A `Contact` value whose URI names `owner` as `peerlb-owner` (replacing
/// any such parameter): `<sip:bob@192.0.2.4:5070;peerlb-owner=n2>`, the
/// display name and header parameters kept; an addr-spec without `<>` is
/// put in `<>` (RFC 3261 20.10: outside them every `;` parameter is the
/// header's, not the URI's). `None` for `*` or a value that is not one
/// name-addr or addr-spec.
pub(crate) fn with_owner_param(contact: &str, owner: &str) -> Option<String> {
    let contact = contact.trim();
    let (before, uri, after) = match (contact.find('<'), contact.rfind('>')) {
        (Some(a), Some(b)) if a < b => (&contact[..a], &contact[a + 1..b], &contact[b + 1..]),
        (None, None) => {
            // An addr-spec: the URI ends at its first `;` (RFC 3261 20.10).
            let end = contact.find(';').unwrap_or(contact.len());
            ("", &contact[..end], &contact[end..])
        }
        _ => return None,
    };
    if !uri.contains(':') || uri.contains([',', ' ', '<', '>']) {
        return None;
    }
    Some(format!(
        "{before}<{}>{after}",
        set_uri_param(uri, OWNER_PARAM, Some(owner))
    ))
}

/// Methods whose `1xx`/`2xx` answer sets the dialog's remote target from
/// its `Contact` (RFC 3261 12.1.1 dialog creation, 12.2.1.2 target
/// refresh; UPDATE RFC 3311, SUBSCRIBE and NOTIFY RFC 6665, REFER RFC
/// 3515), and whose request's `Contact` does the same for the other side.
pub(crate) fn sets_remote_target(method: &str) -> bool {
    matches!(
        method,
        "INVITE" | "UPDATE" | "SUBSCRIBE" | "NOTIFY" | "REFER"
    )
}

/// Names `owner` in the `Contact` of `msg` (a request, or a `101..=299`
/// answer to one, of a method that [`sets_remote_target`]): the caller
/// then addresses the dialog's later requests to a URI naming `owner`
/// ([`target_owner`]). A message with no `Contact`, several, or `*` is
/// left alone; so is every other message (a `REGISTER` answer's
/// `Contact` lists bindings, a `3xx`'s redirect targets).
pub(crate) fn mark_contact(msg: &mut SipMessage, method: &str, owner: &str) {
    if !sets_remote_target(method) {
        return;
    }
    if let super::StartLine::Response { status, .. } = msg.start
        && !(101..=299).contains(&status)
    {
        return;
    }
    if msg.header_list("contact").len() != 1 {
        return;
    }
    let Some(i) = msg
        .headers
        .iter()
        .position(|(n, _)| super::full_name(n) == "contact")
    else {
        return;
    };
    if let Some(v) = with_owner_param(&msg.headers[i].1, owner) {
        msg.headers[i].1 = v;
    }
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
