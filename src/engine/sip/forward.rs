//! The proxy steps a node applies to a SIP request it forwards (RFC 3261
//! 16.3-16.6), and the entry's retry rule, as pure functions: the entry
//! (`adapters/front/sip.rs`) and the owner's relay of the server's
//! requests toward a caller (`sip/upstream`) call them; nothing here sends.
//!
//! - [`hop`]: `Max-Forwards: 0` is refused `483 Too Many Hops` (16.3 step
//!   3), otherwise decremented, 70 when absent (16.6 step 3); a top
//!   `Route` carrying this cluster's dialog parameters names this cluster
//!   and is removed (16.4: any node stands in for the one named).
//! - [`entry_steps`]: [`hop`], then a `Record-Route` on top of a
//!   dialog-creating INVITE (16.6 step 4).
//! - [`entry_branch`] / [`entry_via`] / [`from_owner`]: the entry's own
//!   `Via` on a request it forwards to the owner, and its removal from the
//!   owner's answers (16.6 step 8, 16.7 step 3).
//! - [`next_candidate`]: which failures pass a request to the next ring
//!   node.

use std::net::SocketAddr;

use super::{SipMessage, Transport, full_name};

/// The `Via` branch prefix of this cluster's entry nodes: RFC 3261's
/// magic cookie `z9hG4bK` (8.1.1.7), then `-plb-`.
pub(crate) const ENTRY_BRANCH_PREFIX: &str = "z9hG4bK-plb-";

/// `Max-Forwards` was 0: the request goes no further (RFC 3261 16.3 step
/// 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooManyHops;

/// The hop-by-hop steps on `msg`, a request a node forwards: `Max-Forwards`
/// checked and decremented (70 when absent or not a number: the parser
/// allows at most 3 digits), this cluster's top `Route` removed and
/// returned (its flow, say, is read from it).
///
/// # Errors
/// [`TooManyHops`] when `Max-Forwards` is 0 (`msg` is left unchanged).
pub(crate) fn hop(msg: &mut SipMessage) -> Result<Option<String>, TooManyHops> {
    let hops = match msg.header("max-forwards") {
        Some(v) => v.parse::<u16>().unwrap_or(70),
        None => 70,
    };
    if hops == 0 {
        return Err(TooManyHops);
    }
    msg.headers.retain(|(n, _)| full_name(n) != "max-forwards");
    msg.headers
        .push(("Max-Forwards".into(), (hops - 1).to_string()));
    if super::dialog_route(msg).is_none() {
        return Ok(None);
    }
    let top = msg.header_list("route").first().map(|r| (*r).to_owned());
    msg.pop_route();
    Ok(top)
}

/// The entry's proxy steps on `msg`, a request from a client (its source
/// already noted, RFC 3581): [`hop`], then, for a dialog-creating INVITE
/// (no `To` tag), the `Record-Route` `record_route` makes on top (RFC
/// 3261 16.6 step 4; `engine::sip::record_route`).
///
/// # Errors
/// The answer to send the client instead: `483 Too Many Hops`, or none
/// for an ACK (never answered).
pub(crate) fn entry_steps(
    msg: &mut SipMessage,
    record_route: impl FnOnce() -> String,
) -> Result<(), Option<SipMessage>> {
    if hop(msg).is_err() {
        return Err((msg.method() != Some("ACK")).then(|| msg.response(483, "Too Many Hops", None)));
    }
    if msg.method() == Some("INVITE") && msg.tag_of_to().is_none() {
        msg.push_front("Record-Route", record_route());
    }
    Ok(())
}

/// The branch of the `Via` entry node `node` puts on `msg` when it
/// forwards it to the owner: [`ENTRY_BRANCH_PREFIX`] and 16 hex digits
/// hashed from the Call-ID, the `CSeq`, the caller's top `Via` branch and
/// the node (a retransmission gets the same branch; the owner's own
/// branch toward the server skips this `Via`, `upstream::branch`).
pub(crate) fn entry_branch(msg: &SipMessage, node: &str) -> String {
    let h = xxhash_rust::xxh3::xxh3_64(
        format!(
            "{}\n{}\n{}\n{node}",
            msg.call_id().unwrap_or(""),
            msg.header("cseq").unwrap_or(""),
            msg.top_via().and_then(|v| v.param("branch")).unwrap_or(""),
        )
        .as_bytes(),
    );
    format!("{ENTRY_BRANCH_PREFIX}{h:016x}")
}

/// `msg` with the entry's `Via` on top: `SIP/2.0/<transport> <local>;
/// branch=<entry_branch>` (RFC 3261 16.6 step 8), `local` being the
/// listener the request reached.
pub(crate) fn entry_via(
    msg: &SipMessage,
    (transport, local): (Transport, SocketAddr),
    node: &str,
) -> SipMessage {
    let branch = entry_branch(msg, node);
    let mut out = msg.clone();
    out.push_front(
        "Via",
        format!("SIP/2.0/{} {local};branch={branch}", transport.via_name()),
    );
    out
}

/// An owner's answer as the entry sends it to the client: its top `Via`
/// removed when it is an entry's (16.7 step 3).
pub(crate) fn from_owner(mut m: SipMessage) -> SipMessage {
    if m.top_via()
        .and_then(|v| v.param("branch"))
        .is_some_and(|b| b.starts_with(ENTRY_BRANCH_PREFIX))
    {
        m.pop_via();
    }
    m
}

/// How forwarding a request to one candidate failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ForwardFailure {
    /// No stream to the candidate could be opened.
    Unreachable,
    /// The candidate refused the stream before processing it (it is
    /// shutting down).
    Refused,
    /// Anything after the candidate took the request: a failed or
    /// timed-out stream, an answer that is not SIP, a status not `200`.
    Failed,
}

/// Whether the entry passes the request to the next candidate after
/// `failure`: only when nothing of it reached the owner (a SIP request
/// taken twice would make two server transactions, RFC 3261 17.2.3);
/// otherwise it answers `503` (16.9) unless a final answer already went
/// out (`proxy::EntryRelay::on_failure`).
pub(crate) fn next_candidate(failure: ForwardFailure) -> bool {
    matches!(
        failure,
        ForwardFailure::Unreachable | ForwardFailure::Refused
    )
}

#[cfg(test)]
mod tests {
    use super::super::{StartLine, parse, record_route};
    use super::*;

    const INVITE: &str = "INVITE sip:bob@h SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5070;branch=z9hG4bKc\r\n\
        From: <sip:a@h>;tag=1\r\nTo: <sip:bob@h>\r\nCall-ID: c\r\nCSeq: 1 INVITE\r\n\
        Max-Forwards: 5\r\nContent-Length: 0\r\n\r\n";

    fn msg(s: &str) -> SipMessage {
        parse(s.as_bytes()).unwrap()
    }

    fn rr() -> String {
        record_route(
            "127.0.0.1:5060".parse().unwrap(),
            Transport::Udp,
            false,
            ("n1", "k"),
            None,
        )
    }

    /// RFC 3261 16.3 step 3, 16.6 steps 3-4: Max-Forwards down by one, a
    /// Record-Route on a dialog-creating INVITE only; 0 is refused 483 (an
    /// ACK silently); absent counts as 70.
    #[test]
    fn the_entry_decrements_max_forwards_and_record_routes_a_new_invite() {
        let mut m = msg(INVITE);
        entry_steps(&mut m, rr).unwrap();
        assert_eq!(m.header("max-forwards"), Some("4"));
        assert_eq!(m.header("record-route"), Some(rr().as_str()));
        // In a dialog (a To tag): no Record-Route.
        let mut m = msg(&INVITE.replace("To: <sip:bob@h>", "To: <sip:bob@h>;tag=2"));
        entry_steps(&mut m, || unreachable!("no Record-Route in a dialog")).unwrap();
        assert!(m.header("record-route").is_none());
        let mut m = msg(&INVITE.replace("Max-Forwards: 5\r\n", ""));
        entry_steps(&mut m, rr).unwrap();
        assert_eq!(m.header("max-forwards"), Some("69"));
        let mut m = msg(&INVITE.replace("Max-Forwards: 5", "Max-Forwards: 0"));
        let r = entry_steps(&mut m, rr).unwrap_err().unwrap();
        assert!(matches!(r.start, StartLine::Response { status: 483, .. }));
        assert_eq!(m.header("max-forwards"), Some("0"));
        let ack = INVITE
            .replace("INVITE sip", "ACK sip")
            .replace("1 INVITE", "1 ACK")
            .replace("Max-Forwards: 5", "Max-Forwards: 0");
        assert_eq!(entry_steps(&mut msg(&ack), rr), Err(None));
    }

    /// RFC 3261 16.4: this cluster's top Route is removed and returned;
    /// another's stays.
    #[test]
    fn hop_removes_this_clusters_top_route_only() {
        let with = |route: &str| {
            msg(&INVITE.replace("Max-Forwards", &format!("Route: {route}\r\nMax-Forwards")))
        };
        let mut m = with(&format!("{}, <sip:192.0.2.9;lr>", rr()));
        assert_eq!(hop(&mut m), Ok(Some(rr())));
        assert_eq!(m.header_list("route"), ["<sip:192.0.2.9;lr>"]);
        let mut m = with("<sip:192.0.2.9;lr>");
        assert_eq!(hop(&mut m), Ok(None));
        assert_eq!(m.header_list("route"), ["<sip:192.0.2.9;lr>"]);
    }

    /// The entry's Via: its transport and listener, a branch that is the
    /// same for a retransmission and differs between nodes; removed from
    /// the owner's answers, and only when it is an entry's.
    #[test]
    fn the_entrys_via_goes_on_top_and_comes_off_the_answers() {
        let local: SocketAddr = "127.0.0.1:5061".parse().unwrap();
        let m = msg(INVITE);
        let out = entry_via(&m, (Transport::Tls, local), "n1");
        let via = out.header_list("via")[0].to_owned();
        assert!(
            via.starts_with("SIP/2.0/TLS 127.0.0.1:5061;branch=z9hG4bK-plb-"),
            "{via}"
        );
        assert_eq!(entry_branch(&m, "n1"), entry_branch(&msg(INVITE), "n1"));
        assert_ne!(entry_branch(&m, "n1"), entry_branch(&m, "n2"));
        let answer = out.response(180, "Ringing", Some("t"));
        let back = from_owner(answer);
        assert_eq!(
            back.header_list("via"),
            ["SIP/2.0/UDP 192.0.2.1:5070;branch=z9hG4bKc"]
        );
        let again = from_owner(back.clone());
        assert_eq!(again.header_list("via"), back.header_list("via"));
    }

    /// Only a request that never reached the owner passes to the next
    /// candidate.
    #[test]
    fn only_an_unreached_or_refusing_owner_passes_the_request_on() {
        assert!(next_candidate(ForwardFailure::Unreachable));
        assert!(next_candidate(ForwardFailure::Refused));
        assert!(!next_candidate(ForwardFailure::Failed));
    }
}
