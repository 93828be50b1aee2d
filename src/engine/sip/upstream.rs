//! The owner's client transaction toward an upstream SIP app
//! (`sip_app = "udp:<ip>:<port>"`), as pure functions: the request as
//! sent upstream, the retransmission schedule, which datagrams belong to
//! the transaction, and the ACK of a non-2xx final answer to an INVITE.
//! `adapters/serve/sip/upstream.rs` does the sending and the waiting.
//!
//! The owner acts as a transaction-stateful proxy for one hop (RFC 3261
//! 16.6, 17.1): it puts its own `Via` on top, retransmits over UDP until
//! the upstream answers, drops `100 Trying` (16.7 step 5: a proxy never
//! forwards it), removes its `Via` from every answer (16.7 step 3) and
//! relays the rest until the first final response.

use std::net::SocketAddr;
use std::time::Duration;

use super::{SipMessage, StartLine, full_name};

/// RFC 3261 T1 (17.1.1.1): the round-trip estimate, 500 ms.
pub(crate) const T1: Duration = Duration::from_millis(500);
/// RFC 3261 T2 (17.1.2.2): the cap of a non-INVITE request's
/// retransmission interval, 4 s.
pub(crate) const T2: Duration = Duration::from_secs(4);
/// RFC 3261 Timer B / F (17.1.1.2, 17.1.2.2): the longest a client
/// transaction waits for a final response, `64 x T1` = 32 s.
pub(crate) const TIMER_B: Duration = Duration::from_secs(32);

/// The `Via` branch prefix of an owner's request to its upstream: the
/// magic cookie `z9hG4bK` (8.1.1.7), then `-plbo-` (the entry's own
/// prefix is `-plb-`).
pub(crate) const OWNER_BRANCH_PREFIX: &str = "z9hG4bK-plbo-";

pub(crate) use super::forward::ENTRY_BRANCH_PREFIX;

/// The branch of the owner's `Via` for `req` on node `node`:
/// [`OWNER_BRANCH_PREFIX`], 16 hex digits, `-`, the node id (a node id is
/// a SIP token: letters, digits, `-`, `_`, `.`; so a node that gets the
/// answer on its listener knows whose transaction it is,
/// [`node_of_branch`]). The digits are hashed from the Call-ID,
/// the CSeq number, the client's `Via` (its branch and sent-by: the
/// topmost `Via` that is not an entry node's, [`ENTRY_BRANCH_PREFIX`])
/// and the node id. A retransmission gets the same branch, and so does a
/// `CANCEL` of an `INVITE` (same Call-ID, CSeq number and client `Via`)
/// whichever entry each came through, as RFC 3261 9.1 requires of a
/// proxy's `CANCEL`: the server matches it to the INVITE's transaction.
pub(crate) fn branch(req: &SipMessage, node: &str) -> String {
    branch_with(OWNER_BRANCH_PREFIX, req, node)
}

fn branch_with(prefix: &str, req: &SipMessage, node: &str) -> String {
    let vias = req.header_list("via");
    let client = vias
        .iter()
        .filter_map(|v| super::Via::parse_value(v))
        .find(|v| {
            !v.param("branch")
                .is_some_and(|b| b.starts_with(ENTRY_BRANCH_PREFIX))
        });
    let (via_branch, host, port) = client.map_or(("", "", 0), |v| {
        (v.param("branch").unwrap_or(""), v.host, v.port.unwrap_or(0))
    });
    let h = xxhash_rust::xxh3::xxh3_64(
        format!(
            "{}\n{}\n{via_branch}\n{host}:{port}\n{node}",
            req.call_id().unwrap_or(""),
            req.cseq().map_or(0, |(n, _)| n),
        )
        .as_bytes(),
    );
    format!("{prefix}{h:016x}-{node}")
}

/// The node named in `branch`, an owner's ([`OWNER_BRANCH_PREFIX`]) branch
/// made by [`branch`]; `None` for any other branch.
pub(crate) fn node_of_branch(branch: &str) -> Option<&str> {
    node_of_branch_with(OWNER_BRANCH_PREFIX, branch)
}

/// The node named in `branch`, a branch [`callee_branch`] made
/// ([`CALLEE_BRANCH_PREFIX`]): the owner relaying a request of its
/// upstream toward a caller; `None` for any other branch.
pub(crate) fn node_of_callee_branch(branch: &str) -> Option<&str> {
    node_of_branch_with(CALLEE_BRANCH_PREFIX, branch)
}

fn node_of_branch_with<'a>(prefix: &str, branch: &'a str) -> Option<&'a str> {
    let rest = branch.strip_prefix(prefix)?;
    let (hash, node) = (rest.get(..16)?, rest.get(16..)?.strip_prefix('-')?);
    (hash.bytes().all(|b| b.is_ascii_hexdigit()) && !node.is_empty()).then_some(node)
}

/// The 8 characters of `branch`, one [`branch`] made, that a response the
/// owner makes itself (`408`, `503`) uses as its `To` tag: the last 8 of
/// its hash.
pub(crate) fn generated_tag(branch: &str) -> &str {
    let hex = branch
        .strip_prefix(OWNER_BRANCH_PREFIX)
        .and_then(|r| r.get(..16))
        .unwrap_or(branch);
    &hex[hex.len().saturating_sub(8)..]
}

/// `req` as sent upstream from `local` (the owner's UDP socket): a `Via`
/// `SIP/2.0/UDP <local>;branch=<branch>;rport` on top (RFC 3261 16.6 step
/// 8, RFC 3581), this cluster's `peerlb-owner` removed from the
/// Request-URI (the owner added it to the upstream's own `Contact`,
/// [`relayed_answer`]), everything else as the entry forwarded it.
#[cfg(test)]
pub(crate) fn upstream_request(req: &SipMessage, local: SocketAddr, branch: &str) -> SipMessage {
    upstream_request_over(req, "UDP", local, branch)
}

/// `upstream_request` over `transport` (`UDP` or `TCP`, the `Via`'s
/// transport; `sip_app = "tcp:..."` sends from a TCP connection).
pub(crate) fn upstream_request_over(
    req: &SipMessage,
    transport: &str,
    local: SocketAddr,
    branch: &str,
) -> SipMessage {
    let mut out = req.clone();
    if let StartLine::Request { uri, .. } = &mut out.start {
        *uri = super::strip_owner_param(uri);
    }
    out.push_front(
        "Via",
        format!("SIP/2.0/{transport} {local};branch={branch};rport"),
    );
    out
}

/// An upstream's answer to `method` as the owner `node` relays it: its
/// `Contact` names `node` (`peerlb-owner`) when the answer sets the
/// caller's remote target (a `101..=299` answer to INVITE, UPDATE, ...:
/// RFC 3261 12.1.1, 12.2.1.2), so the caller's later requests of the
/// dialog name the owner that relayed it, a new one after a failover.
pub(crate) fn relayed_answer(mut msg: SipMessage, method: &str, node: &str) -> SipMessage {
    super::mark_contact(&mut msg, method, node);
    msg
}

/// How long the owner waits after the `sent`-th transmission (1-based)
/// before sending the request again: `T1 x 2^(sent-1)`, capped at [`T2`]
/// for a non-INVITE request (Timer A, 17.1.1.2; Timer E, 17.1.2.2). An
/// INVITE's interval is not capped; the whole wait is bounded by the
/// caller's deadline.
pub(crate) fn retransmit_interval(invite: bool, sent: u32) -> Duration {
    let d = T1.saturating_mul(1u32 << sent.saturating_sub(1).min(16));
    if invite { d } else { d.min(T2) }
}

/// What the transaction makes of one datagram from the upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Received {
    /// Not a response of this transaction (other branch, not SIP, a
    /// request): ignored.
    Ignore,
    /// `100 Trying`: stops retransmission, is not relayed (16.7 step 5).
    Trying,
    /// A provisional response (101..=199), the owner's `Via` removed:
    /// relayed, stops retransmission.
    Provisional(SipMessage),
    /// A final response (200..=699), the owner's `Via` removed: relayed,
    /// ends the transaction.
    Final(SipMessage),
}

/// Classifies `msg`, received on the transaction whose `Via` branch is
/// `branch` (17.1.3: a response matches a client transaction by the top
/// `Via`'s branch).
pub(crate) fn receive(mut msg: SipMessage, branch: &str) -> Received {
    let StartLine::Response { status, .. } = msg.start else {
        return Received::Ignore;
    };
    if msg.top_via().and_then(|v| v.param("branch")) != Some(branch) {
        return Received::Ignore;
    }
    msg.pop_via();
    match status {
        100 => Received::Trying,
        101..=199 => Received::Provisional(msg),
        _ => Received::Final(msg),
    }
}

/// The ACK the owner sends for a non-2xx final `resp` to the INVITE it
/// sent upstream (`sent`, its own `Via` on top): RFC 3261 17.1.1.3, the
/// INVITE's Request-URI, `Call-ID`, `From`, `Route` and top `Via` only,
/// `To` from the response (with its tag), `CSeq` `<n> ACK`.
pub(crate) fn ack_for_non_2xx(sent: &SipMessage, resp: &SipMessage) -> SipMessage {
    in_transaction_of(sent, "ACK", resp.header("to"))
}

/// A `method` request (ACK or CANCEL) of `sent`'s transaction (RFC 3261
/// 9.1, 17.1.1.3): `sent`'s Request-URI, top `Via` only, `From`,
/// `Call-ID`, `Route`, its `To` unless `to` is given (the response's, with
/// its tag), `CSeq` `<n> <method>`, `Max-Forwards: 70`, no body.
pub(super) fn in_transaction_of(sent: &SipMessage, method: &str, to: Option<&str>) -> SipMessage {
    let uri = match &sent.start {
        StartLine::Request { uri, .. } => uri.clone(),
        StartLine::Response { .. } => String::new(),
    };
    let mut headers = Vec::new();
    if let Some(via) = sent.header_list("via").first() {
        headers.push(("Via".to_owned(), (*via).to_owned()));
    }
    for (n, v) in &sent.headers {
        match full_name(n).as_ref() {
            "from" | "call-id" | "route" => headers.push((n.clone(), v.clone())),
            "to" if to.is_none() => headers.push((n.clone(), v.clone())),
            _ => {}
        }
    }
    if let Some(to) = to {
        headers.push(("To".to_owned(), to.to_owned()));
    }
    let n = sent.cseq().map_or(1, |(n, _)| n);
    headers.push(("CSeq".to_owned(), format!("{n} {method}")));
    headers.push(("Max-Forwards".to_owned(), "70".to_owned()));
    SipMessage {
        start: StartLine::Request {
            method: method.to_owned(),
            uri,
        },
        headers,
        body: Vec::new(),
    }
}

/// The ACK the owner itself sends upstream after `resp`, a final answer
/// to `sent`: [`ack_for_non_2xx`] when `sent` is an INVITE and `resp` is
/// not a 2xx (the ACK of a 2xx is the caller's, end to end, RFC 3261
/// 13.2.2.4), else `None`.
pub(crate) fn owner_ack(sent: &SipMessage, resp: &SipMessage) -> Option<SipMessage> {
    let StartLine::Response { status, .. } = resp.start else {
        return None;
    };
    (sent.method() == Some("INVITE") && status >= 300).then(|| ack_for_non_2xx(sent, resp))
}

/// The `Via` branch prefix of a request the upstream sent that an owner
/// relays toward the caller: the magic cookie, then `-plbc-`.
pub(crate) const CALLEE_BRANCH_PREFIX: &str = "z9hG4bK-plbc-";

/// The branch of the owner's `Via` on a request its upstream sent
/// ([`CALLEE_BRANCH_PREFIX`], then hashed like [`branch`]): the same for a
/// retransmission, and for the hop-by-hop ACK of a non-2xx answer to an
/// INVITE (same Call-ID, CSeq number and upstream branch, RFC 3261
/// 17.1.1.3), relayed like any ACK (a caller drops one that matches
/// nothing, 17.2.3).
pub(crate) fn callee_branch(req: &SipMessage, node: &str) -> String {
    branch_with(CALLEE_BRANCH_PREFIX, req, node)
}

/// Why a request the upstream sent is not relayed: the answer the owner
/// sends the upstream itself, or `None` (an ACK is never answered).
pub(crate) type Refusal = Option<SipMessage>;

/// A request the upstream server sent (the callee's side of a dialog: a
/// BYE, a re-INVITE) made ready for the caller, as a stateful proxy does
/// (RFC 3261 16.3-16.6), and where it goes:
///
/// - `Max-Forwards: 0` is refused `483 Too Many Hops` (16.3 step 3);
///   otherwise decremented, 70 when absent (16.6 step 3).
/// - A top `Route` carrying this cluster's dialog parameters names this
///   cluster and is removed (16.4: the owner stands in for any node).
/// - The caller's connection ([`Target::flow`]): a removed `Route` of
///   this cluster's that names one (`peerlb-flow`, the entry's
///   `Record-Route` over TCP or TLS) is tried first (RFC 5923: a request
///   toward a caller goes over the connection it opened).
/// - The destination (16.6 steps 6-7, loose routing only): the next
///   `Route`'s URI when there is one, else the Request-URI; its host must
///   be an IP address (no DNS here), its port defaults to 5060; UDP, or
///   TCP with `transport=tcp` (over a new connection); another
///   `transport` or a `sips:` URI is refused `503 Service Unavailable`
///   (the owner cannot send it, 16.9), as is any other scheme (`416
///   Unsupported URI Scheme`, 16.3 step 2); with a flow the refusal waits
///   until the flow is found gone ([`Target::dest`], [`flow_failed`]).
/// - A request that sets the remote target (re-INVITE, UPDATE, ...) gets
///   `peerlb-owner=<node>` in its `Contact`, as an answer the owner relays
///   does ([`relayed_answer`]): the caller's next requests to the callee
///   name this owner.
///
/// The owner's own `Via` is added by [`with_via`] once the sending socket
/// is known.
///
/// # Errors
/// The [`Refusal`] to send the upstream instead.
pub(crate) fn callee_request(
    req: &SipMessage,
    node: &str,
) -> Result<(SipMessage, Target), Refusal> {
    let method = req.method().unwrap_or("");
    let refuse = |status: u16, reason: &str| {
        (method != "ACK").then(|| {
            let mut r = req.response(status, reason, None);
            r.headers
                .push((super::SERVED_BY.to_owned(), node.to_owned()));
            r
        })
    };
    let mut out = req.clone();
    let Ok(ours) = super::forward::hop(&mut out) else {
        return Err(refuse(483, "Too Many Hops"));
    };
    let flow = ours.as_deref().and_then(super::flow_of_route);
    let target = match out.header_list("route").first() {
        Some(r) => {
            let r = *r;
            match (r.find('<'), r.rfind('>')) {
                (Some(a), Some(b)) if a < b => r[a + 1..b].to_owned(),
                _ => r.to_owned(),
            }
        }
        None => match &out.start {
            StartLine::Request { uri, .. } => uri.clone(),
            StartLine::Response { .. } => return Err(None),
        },
    };
    let dest = destination(&target);
    if let (Err(status), None) = (dest, &flow) {
        let reason = if status == 416 {
            "Unsupported URI Scheme"
        } else {
            "Service Unavailable"
        };
        return Err(refuse(status, reason));
    }
    super::mark_contact(&mut out, method, node);
    Ok((out, Target { flow, dest }))
}

/// Where [`callee_request`] sends a request toward a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The caller's TCP or TLS connection its dialog's `Route` names, held
    /// by an entry node: tried first.
    pub(crate) flow: Option<super::FlowRoute>,
    /// Where a new connection or datagram goes (`Err`: the status the
    /// owner cannot send there with, 416 or 503); `Ok` whenever `flow` is
    /// `None`.
    pub(crate) dest: Result<Destination, u16>,
}

/// The owner's answer to `req`, a request of its upstream toward a caller
/// whose connection (`Target::flow`) is gone and which cannot be reached
/// otherwise: `430 Flow Failed` (RFC 5626 5.3: the proxy that holds a
/// flow answers so when it failed, and the server may try another), or
/// none for an ACK.
pub(crate) fn flow_failed(req: &SipMessage, node: &str) -> Option<SipMessage> {
    (req.method() != Some("ACK")).then(|| {
        let mut r = req.response(430, "Flow Failed", None);
        r.headers
            .push((super::SERVED_BY.to_owned(), node.to_owned()));
        r
    })
}

/// The `Via` sent-by and transport of a request the owner sends over the
/// caller's connection `flow`: the listener the connection reached and
/// `TCP` or `TLS` (RFC 3261 18.2.2: the caller answers on the connection;
/// were it to fail, at the sent-by, which any node of the cluster serves).
pub(crate) fn flow_via(flow: &super::FlowRoute) -> (&'static str, SocketAddr) {
    (if flow.tls { "TLS" } else { "TCP" }, flow.addr)
}

/// Where a request the owner relays toward a caller goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Destination {
    /// The target's IP and port.
    pub(crate) addr: SocketAddr,
    /// Over TCP (`transport=tcp`), else UDP.
    pub(crate) tcp: bool,
}

/// Where a message for SIP URI `uri` goes: `sip:[user@]<ip>[:port]`,
/// port 5060 when absent, over UDP (no `transport`, or `transport=udp`) or
/// TCP (`transport=tcp`). `Err(416)` for a scheme other than
/// `sip`/`sips`, `Err(503)` for what the owner cannot send to (`sips`,
/// TLS or another transport, a host name).
fn destination(uri: &str) -> Result<Destination, u16> {
    let (scheme, rest) = uri.split_once(':').ok_or(416u16)?;
    if scheme.eq_ignore_ascii_case("sips") {
        return Err(503);
    }
    if !scheme.eq_ignore_ascii_case("sip") {
        return Err(416);
    }
    let tcp = match super::uri_param(rest, "transport") {
        None => false,
        Some(t) if t.eq_ignore_ascii_case("udp") => false,
        Some(t) if t.eq_ignore_ascii_case("tcp") => true,
        Some(_) => return Err(503),
    };
    let (main, _, _) = super::dialog::split_uri(rest);
    let hostport = main.rfind('@').map_or(main, |i| &main[i + 1..]);
    if let Ok(addr) = hostport.parse::<SocketAddr>() {
        return Ok(Destination { addr, tcp });
    }
    let host = hostport.trim_start_matches('[').trim_end_matches(']');
    host.parse::<std::net::IpAddr>()
        .map(|ip| Destination {
            addr: SocketAddr::new(ip, 5060),
            tcp,
        })
        .map_err(|_| 503)
}

/// `msg` with the owner's `Via` on top, naming `transport` (`UDP` or
/// `TCP`), `local` (the socket the caller answers to) and `branch` (16.6
/// step 8, RFC 3581 `rport`).
pub(crate) fn with_via(
    mut msg: SipMessage,
    transport: &str,
    local: SocketAddr,
    branch: &str,
) -> SipMessage {
    msg.push_front(
        "Via",
        format!("SIP/2.0/{transport} {local};branch={branch};rport"),
    );
    msg
}

/// How long an owner waits for its upstream's final response when the
/// entry waits `response_timeout` for the owner: half of it (so the
/// owner's `408` reaches the entry before the entry gives up), at most
/// [`TIMER_B`].
pub(crate) fn transaction_timeout(response_timeout: Duration) -> Duration {
    (response_timeout / 2).min(TIMER_B)
}

#[cfg(test)]
mod tests {
    use super::super::parse;
    use super::*;

    const INVITE: &str = "INVITE sip:bob@h SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5062;branch=z9hG4bK-plb-1\r\n\
        Via: SIP/2.0/UDP 192.0.2.1:5070;branch=z9hG4bKc\r\nRoute: <sip:proxy.example;lr>\r\n\
        From: <sip:a@h>;tag=1\r\nTo: <sip:bob@h>\r\nCall-ID: c\r\nCSeq: 7 INVITE\r\nMax-Forwards: 69\r\n\
        Content-Length: 0\r\n\r\n";

    fn msg(s: &str) -> SipMessage {
        parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn the_upstream_request_has_the_owners_via_on_top_and_keeps_the_rest() {
        let req = msg(INVITE);
        let b = branch(&req, "n2");
        let out = upstream_request(&req, "127.0.0.1:40000".parse().unwrap(), &b);
        let vias = out.header_list("via");
        assert_eq!(vias.len(), 3);
        let top = out.top_via().unwrap();
        assert_eq!((top.host, top.port), ("127.0.0.1", Some(40000)));
        assert_eq!(top.param("branch"), Some(b.as_str()));
        assert_eq!(top.param("rport"), Some(""));
        assert_eq!(out.header("max-forwards"), Some("69"));
        assert_eq!(out.body, req.body);
    }

    #[test]
    fn a_retransmission_and_a_cancel_share_the_invites_branch_and_nodes_differ() {
        let req = msg(INVITE);
        let b = branch(&req, "n2");
        assert!(b.starts_with(OWNER_BRANCH_PREFIX) && b.len() == OWNER_BRANCH_PREFIX.len() + 19);
        assert_eq!(node_of_branch(&b), Some("n2"));
        assert_eq!(generated_tag(&b), &b[OWNER_BRANCH_PREFIX.len() + 8..][..8]);
        for other in [
            "z9hG4bK-plb-0123456789abcdef-n2",
            "z9hG4bK-plbo-0123-n2",
            "z9hG4bK-plbo-0123456789abcdef-",
            "z9hG4bK-plbo-0123456789abcdefn2",
            "z9hG4bKc",
        ] {
            assert_eq!(node_of_branch(other), None, "{other}");
        }
        assert_eq!(
            node_of_branch("z9hG4bK-plbo-0123456789abcdef-n-1.a_b"),
            Some("n-1.a_b")
        );
        assert_eq!(branch(&msg(INVITE), "n2"), b);
        let cancel = INVITE
            .replace("INVITE sip", "CANCEL sip")
            .replace("7 INVITE", "7 CANCEL");
        assert_eq!(branch(&msg(&cancel), "n2"), b);
        assert_ne!(branch(&req, "n3"), b);
        let next = INVITE.replace("7 INVITE", "8 INVITE");
        assert_ne!(branch(&msg(&next), "n2"), b);
        // Behind a sprayer the CANCEL comes through another entry, whose
        // Via is on top: the owner's branch is still the INVITE's.
        let through = |text: &str, entry_branch: &str| {
            let mut m = msg(text);
            m.push_front(
                "Via",
                format!("SIP/2.0/UDP 127.0.0.1:5061;branch={ENTRY_BRANCH_PREFIX}{entry_branch}"),
            );
            m
        };
        let invite = branch(&through(INVITE, "00000000000000aa"), "n2");
        assert_eq!(invite, b, "the entry's Via is not hashed");
        assert_eq!(branch(&through(&cancel, "00000000000000bb"), "n2"), invite);
        // Another client's Via (other sent-by, same branch) is another
        // transaction.
        let other = INVITE.replace(
            "192.0.2.1:5070;branch=z9hG4bKc",
            "192.0.2.9:5070;branch=z9hG4bKc",
        );
        assert_ne!(other, INVITE);
        assert_ne!(branch(&msg(&other), "n2"), b);
        // The entry's own Via (the INVITE's top one) is not hashed.
        let other_entry = INVITE.replace(
            "127.0.0.1:5062;branch=z9hG4bK-plb-1",
            "127.0.0.1:5063;branch=z9hG4bK-plb-2",
        );
        assert_eq!(branch(&msg(&other_entry), "n2"), b);
    }

    /// Timer A doubles without bound for an INVITE; Timer E stops at T2.
    #[test]
    fn retransmission_doubles_from_t1_and_a_non_invite_stops_at_t2() {
        let ms = |invite, n| retransmit_interval(invite, n).as_millis();
        assert_eq!(
            (1..=6).map(|n| ms(true, n)).collect::<Vec<_>>(),
            [500, 1000, 2000, 4000, 8000, 16000]
        );
        assert_eq!(
            (1..=6).map(|n| ms(false, n)).collect::<Vec<_>>(),
            [500, 1000, 2000, 4000, 4000, 4000]
        );
    }

    #[test]
    fn responses_are_matched_by_branch_and_100_is_not_relayed() {
        let req = msg(INVITE);
        let b = branch(&req, "n2");
        let sent = upstream_request(&req, "127.0.0.1:40000".parse().unwrap(), &b);
        assert_eq!(
            receive(sent.response(100, "Trying", None), &b),
            Received::Trying
        );
        let Received::Provisional(r) = receive(sent.response(180, "Ringing", Some("u")), &b) else {
            panic!("a 180 is provisional");
        };
        // The owner's Via is gone; the entry's is on top.
        assert_eq!(r.top_via().unwrap().param("branch"), Some("z9hG4bK-plb-1"));
        assert!(matches!(
            receive(sent.response(486, "Busy Here", Some("u")), &b),
            Received::Final(_)
        ));
        assert_eq!(
            receive(sent.response(200, "OK", Some("u")), "z9hG4bK-plbo-other"),
            Received::Ignore
        );
        assert_eq!(receive(sent.clone(), &b), Received::Ignore);
    }

    /// RFC 3261 17.1.1.3: the ACK of a non-2xx answer copies the
    /// INVITE's Request-URI, Call-ID, From, Route and top Via, takes To
    /// from the response and has the INVITE's CSeq number.
    #[test]
    fn the_ack_of_a_non_2xx_answer_follows_17_1_1_3() {
        let req = msg(INVITE);
        let b = branch(&req, "n2");
        let sent = upstream_request(&req, "127.0.0.1:40000".parse().unwrap(), &b);
        let busy = sent.response(486, "Busy Here", Some("u"));
        let ack = ack_for_non_2xx(&sent, &busy);
        assert_eq!(ack.method(), Some("ACK"));
        assert_eq!(
            ack.start,
            StartLine::Request {
                method: "ACK".into(),
                uri: "sip:bob@h".into()
            }
        );
        assert_eq!(ack.header_list("via").len(), 1);
        assert_eq!(ack.top_via().unwrap().param("branch"), Some(b.as_str()));
        assert_eq!(ack.header("to"), Some("<sip:bob@h>;tag=u"));
        assert_eq!(ack.header("cseq"), Some("7 ACK"));
        assert_eq!(ack.header("route"), Some("<sip:proxy.example;lr>"));
        assert_eq!(ack.call_id(), Some("c"));
        assert_eq!(ack.tag_of_from(), Some("1"));
        // It parses as a valid request.
        parse(&ack.to_bytes()).unwrap();
    }

    #[test]
    fn the_owner_acks_only_a_non_2xx_final_answer_to_an_invite() {
        let req = msg(INVITE);
        let sent = upstream_request(
            &req,
            "127.0.0.1:40000".parse().unwrap(),
            &branch(&req, "n2"),
        );
        assert!(owner_ack(&sent, &sent.response(486, "Busy Here", Some("u"))).is_some());
        assert!(owner_ack(&sent, &sent.response(200, "OK", Some("u"))).is_none());
        let bye = msg(&INVITE
            .replace("INVITE sip", "BYE sip")
            .replace("7 INVITE", "7 BYE"));
        assert!(
            owner_ack(
                &bye,
                &bye.response(481, "Call/Transaction Does Not Exist", None)
            )
            .is_none()
        );
    }

    #[test]
    fn the_owner_waits_half_the_entrys_timeout_at_most_timer_b() {
        assert_eq!(
            transaction_timeout(Duration::from_secs(10)),
            Duration::from_secs(5)
        );
        assert_eq!(transaction_timeout(Duration::from_secs(300)), TIMER_B);
    }

    const CALLEE_BYE: &str = "BYE sip:alice@192.0.2.1:5070 SIP/2.0\r\n\
        Via: SIP/2.0/UDP 127.0.0.1:5090;branch=z9hG4bKu1\r\n\
        Route: <sip:127.0.0.1:5062;transport=udp;lr;peerlb-owner=n2;peerlb-key=k>\r\n\
        From: <sip:bob@h>;tag=u\r\nTo: <sip:alice@h>;tag=1\r\nCall-ID: c\r\nCSeq: 1 BYE\r\n\
        Max-Forwards: 70\r\nContent-Length: 0\r\n\r\n";

    /// RFC 3261 16.4-16.6: the cluster's own Route is removed, the target
    /// is the Request-URI (or the next Route), Max-Forwards goes down
    /// by one, and the owner's Via goes on top.
    #[test]
    fn a_request_from_the_upstream_goes_to_the_callers_target_through_the_next_route() {
        let (out, to) = callee_request(&msg(CALLEE_BYE), "n2").unwrap();
        assert_eq!(to.dest.unwrap().addr, "192.0.2.1:5070".parse().unwrap());
        assert!(!to.dest.unwrap().tcp);
        assert_eq!(to.flow, None);
        assert!(out.header("route").is_none());
        assert_eq!(out.header("max-forwards"), Some("69"));
        let b = callee_branch(&msg(CALLEE_BYE), "n2");
        assert!(b.starts_with(CALLEE_BRANCH_PREFIX));
        let sent = with_via(out, "UDP", "127.0.0.1:41000".parse().unwrap(), &b);
        assert_eq!(sent.header_list("via").len(), 2);
        assert_eq!(sent.top_via().unwrap().param("branch"), Some(b.as_str()));
        parse(&sent.to_bytes()).unwrap();
        // A Route after the cluster's own is the next hop.
        let routed = CALLEE_BYE.replace(
            "Route: <sip:127.0.0.1:5062",
            "Route: <sip:127.0.0.1:5062;lr;peerlb-owner=n2;peerlb-key=k>, <sip:[::1]:5099;lr>\r\nX: <sip:x",
        );
        let (out, to) = callee_request(&msg(&routed), "n2").unwrap();
        assert_eq!(to.dest.unwrap().addr, "[::1]:5099".parse().unwrap());
        assert_eq!(out.header_list("route"), ["<sip:[::1]:5099;lr>"]);
        // No port: 5060.
        let (_, to) = callee_request(
            &msg(&CALLEE_BYE.replace("192.0.2.1:5070", "192.0.2.1")),
            "n2",
        )
        .unwrap();
        assert_eq!(to.dest.unwrap().addr, "192.0.2.1:5060".parse().unwrap());
        // transport=tcp: over TCP.
        let (_, to) = callee_request(
            &msg(&CALLEE_BYE.replace("192.0.2.1:5070", "192.0.2.1:5070;transport=TCP")),
            "n2",
        )
        .unwrap();
        assert_eq!(
            to.dest,
            Ok(Destination {
                addr: "192.0.2.1:5070".parse().unwrap(),
                tcp: true
            })
        );
    }

    #[test]
    fn a_request_from_the_upstream_the_owner_cannot_send_is_refused() {
        for (from, to, status) in [
            ("Max-Forwards: 70", "Max-Forwards: 0", 483),
            ("sip:alice@192.0.2.1:5070 SIP", "tel:+15551234 SIP", 416),
            (
                "sip:alice@192.0.2.1:5070 SIP",
                "sips:alice@192.0.2.1 SIP",
                503,
            ),
            (
                "sip:alice@192.0.2.1:5070 SIP",
                "sip:alice@pc.example.com SIP",
                503,
            ),
            (
                "sip:alice@192.0.2.1:5070 SIP",
                "sip:alice@192.0.2.1;transport=sctp SIP",
                503,
            ),
        ] {
            let req = msg(&CALLEE_BYE.replace(from, to));
            let Err(Some(r)) = callee_request(&req, "n2") else {
                panic!("{to}: relayed");
            };
            assert_eq!(
                r.start,
                StartLine::Response {
                    status,
                    reason: match status {
                        483 => "Too Many Hops",
                        416 => "Unsupported URI Scheme",
                        _ => "Service Unavailable",
                    }
                    .into()
                },
                "{to}"
            );
            // To the upstream: its own Via only.
            assert_eq!(
                r.header_list("via"),
                ["SIP/2.0/UDP 127.0.0.1:5090;branch=z9hG4bKu1"]
            );
        }
        let ack = CALLEE_BYE
            .replace("BYE sip", "ACK sip")
            .replace("1 BYE", "1 ACK")
            .replace("Max-Forwards: 70", "Max-Forwards: 0");
        assert_eq!(callee_request(&msg(&ack), "n2").unwrap_err(), None);
    }

    /// The owner's mark: out of the Request-URI sent upstream, into the
    /// Contact of an answer that sets the caller's remote target.
    #[test]
    fn the_owner_mark_leaves_the_request_uri_and_enters_the_relayed_contact() {
        let req = msg(&INVITE.replace(
            "INVITE sip:bob@h SIP",
            "INVITE sip:bob@h;peerlb-owner=n1 SIP",
        ));
        let b = branch(&req, "n2");
        let sent = upstream_request(&req, "127.0.0.1:40000".parse().unwrap(), &b);
        assert_eq!(
            sent.start,
            StartLine::Request {
                method: "INVITE".into(),
                uri: "sip:bob@h".into()
            }
        );
        let mut ok = sent.response(200, "OK", Some("u"));
        ok.headers
            .push(("Contact".into(), "<sip:bob@192.0.2.5:5080>".into()));
        let ok = relayed_answer(ok, "INVITE", "n2");
        assert_eq!(
            ok.header("contact"),
            Some("<sip:bob@192.0.2.5:5080;peerlb-owner=n2>")
        );
    }
}
