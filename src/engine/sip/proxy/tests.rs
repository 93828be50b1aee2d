//! The proxy's decisions: the entry's relay, the owner's timers, the
//! CANCEL it sends when Timer C fires, and the ACKs it absorbs.

use std::time::Duration;

use super::super::parse;
use super::*;

const INVITE: &str = "INVITE sip:bob@h SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:40000;branch=z9hG4bK-plbo-1\r\n\
    Via: SIP/2.0/UDP 192.0.2.1:5070;branch=z9hG4bKc\r\nRoute: <sip:proxy.example;lr>\r\n\
    From: <sip:a@h>;tag=1\r\nTo: <sip:bob@h>\r\nCall-ID: c\r\nCSeq: 7 INVITE\r\nMax-Forwards: 69\r\n\
    Content-Length: 3\r\n\r\nabc";

fn msg(s: &str) -> SipMessage {
    parse(s.as_bytes()).unwrap()
}

fn status(m: &SipMessage) -> u16 {
    status_of(m).unwrap()
}

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

/// RFC 3261 16.2 / 17.2.1: the entry's own 100 at once, the owner's 100
/// dropped, the 180 as it comes, one final answer, and no 503 after it.
#[test]
fn an_invite_gets_100_at_once_then_each_answer_once_and_no_503_after_a_final() {
    let req = msg(INVITE);
    let (mut relay, first) = EntryRelay::new(&req);
    let first = first.expect("100 Trying for an INVITE");
    assert_eq!(status(&first), 100);
    assert_eq!(first.header_list("via").len(), 2, "the request's Vias");
    assert!(relay.pass(req.response(100, "Trying", None)).is_none());
    assert_eq!(
        relay
            .pass(req.response(180, "Ringing", Some("u")))
            .map(|m| status(&m)),
        Some(180)
    );
    assert!(!relay.final_sent());
    assert_eq!(
        relay
            .pass(req.response(486, "Busy Here", Some("u")))
            .map(|m| status(&m)),
        Some(486)
    );
    assert!(relay.final_sent());
    // A second final answer (say, from a failed-over candidate) and the
    // 503 of a failure after the final answer never reach the caller.
    assert!(relay.pass(req.response(200, "OK", Some("u"))).is_none());
    assert!(relay.on_failure(&req).is_none());
    // A request is no answer.
    let (mut r, _) = EntryRelay::new(&req);
    assert!(r.pass(req.clone()).is_none());
}

#[test]
fn a_non_invite_gets_no_100_of_the_entry_and_its_owners_100_passes() {
    let opt = msg(&INVITE
        .replace("INVITE sip", "OPTIONS sip")
        .replace("7 INVITE", "7 OPTIONS"));
    let (mut relay, first) = EntryRelay::new(&opt);
    assert!(first.is_none());
    assert!(relay.pass(opt.response(100, "Trying", None)).is_some());
    // No answer at all: one 503.
    assert_eq!(relay.on_failure(&opt).map(|m| status(&m)), Some(503));
    assert!(relay.on_failure(&opt).is_none());
    let ack = msg(&INVITE
        .replace("INVITE sip", "ACK sip")
        .replace("7 INVITE", "7 ACK"));
    let (mut relay, first) = EntryRelay::new(&ack);
    assert!(first.is_none());
    assert!(relay.on_failure(&ack).is_none(), "an ACK is never answered");
}

/// Timer B bounds the wait for a first answer; Timer C, restarted by each
/// provisional answer but 100, bounds an INVITE's wait after it; when it
/// fires the branch is CANCELled and Timer B more is waited.
#[test]
fn timer_c_restarts_on_each_provisional_and_cancels_when_it_fires() {
    let (b, c) = (s(32), s(180));
    let mut t = ClientTimers::new(true, s(10), b, c);
    assert_eq!(t.deadline(), s(42));
    // The 100 ends Timer B's wait; Timer C runs from the sending.
    t.on_provisional(s(11), 100);
    assert_eq!(t.deadline(), s(190));
    // A 180 restarts it, and a ringing call is not cut before.
    t.on_provisional(s(70), 180);
    assert_eq!(t.deadline(), s(250));
    t.on_provisional(s(200), 183);
    assert_eq!(t.deadline(), s(380));
    assert_eq!(t.on_deadline(s(380)), Expired::Cancel);
    assert_eq!(t.deadline(), s(412));
    // A provisional answer after the CANCEL does not move it.
    t.on_provisional(s(390), 180);
    assert_eq!(t.deadline(), s(412));
    assert_eq!(t.on_deadline(s(412)), Expired::Timeout);
}

#[test]
fn without_a_provisional_answer_the_first_deadline_is_a_timeout() {
    let mut t = ClientTimers::new(true, s(0), s(32), s(180));
    assert_eq!(t.on_deadline(s(32)), Expired::Timeout);
    // Timer C shorter than Timer B (a test's setting): it still fires
    // first, as a timeout (16.8).
    let t = ClientTimers::new(true, s(0), s(32), s(2));
    assert_eq!(t.deadline(), s(2));
    // A non-INVITE: Timer F, provisional answers or not.
    let mut t = ClientTimers::new(false, s(5), s(32), s(180));
    t.on_provisional(s(6), 180);
    assert_eq!(t.deadline(), s(37));
    assert_eq!(t.on_deadline(s(37)), Expired::Timeout);
}

/// RFC 3261 9.1: what the server matches the CANCEL to its INVITE by.
#[test]
fn the_cancel_of_a_branch_follows_9_1() {
    let sent = msg(INVITE);
    let cancel = cancel_for(&sent);
    assert_eq!(
        cancel.start,
        StartLine::Request {
            method: "CANCEL".into(),
            uri: "sip:bob@h".into()
        }
    );
    assert_eq!(
        cancel.header_list("via"),
        ["SIP/2.0/UDP 127.0.0.1:40000;branch=z9hG4bK-plbo-1"]
    );
    assert_eq!(cancel.header("cseq"), Some("7 CANCEL"));
    assert_eq!(cancel.header("to"), Some("<sip:bob@h>"));
    assert_eq!(cancel.tag_of_from(), Some("1"));
    assert_eq!(cancel.call_id(), Some("c"));
    assert_eq!(cancel.header("route"), Some("<sip:proxy.example;lr>"));
    assert!(cancel.body.is_empty());
    parse(&cancel.to_bytes()).unwrap();
}

/// The caller's ACK of a non-2xx answer is absorbed for Timer D; the
/// server's retransmitted final answer is ACKed again meanwhile.
#[test]
fn a_completed_invite_absorbs_its_ack_until_timer_d() {
    let sent = msg(INVITE);
    let ack =
        super::super::upstream::ack_for_non_2xx(&sent, &sent.response(486, "Busy", Some("u")));
    let mut done = Completed::default();
    done.insert("z9hG4bK-plbo-1".into(), ack.clone(), s(100));
    assert!(done.absorbs("z9hG4bK-plbo-1", s(101)));
    assert!(
        !done.absorbs("z9hG4bK-plbo-2", s(101)),
        "a 2xx's ACK: its own branch"
    );
    assert_eq!(done.ack_of("z9hG4bK-plbo-1", s(120)), Some(&ack));
    assert!(!done.absorbs("z9hG4bK-plbo-1", s(100) + TIMER_D));
    assert_eq!(done.len(), 0);
    // Added again later: the later expiry holds.
    done.insert("b".into(), ack.clone(), s(0));
    done.insert("b".into(), ack.clone(), s(20));
    assert!(done.absorbs("b", s(40)));
    assert!(!done.absorbs("b", s(52)));
}

#[test]
fn completed_forgets_the_oldest_past_its_cap() {
    let ack = msg(INVITE);
    let mut done = Completed::default();
    for i in 0..MAX_COMPLETED + 2 {
        done.insert(format!("b{i}"), ack.clone(), s(1));
    }
    assert_eq!(done.len(), MAX_COMPLETED);
    assert!(!done.absorbs("b0", s(1)) && !done.absorbs("b1", s(1)));
    assert!(done.absorbs("b2", s(1)));
}

/// A response at a listener goes to the owner its branch names, once;
/// anything not from the server, or not an owner's branch, is dropped.
#[test]
fn a_response_at_a_listener_goes_to_the_owner_its_branch_names() {
    let req = msg(INVITE);
    let b = super::super::upstream::branch(&req, "n2");
    let sent =
        super::super::upstream::upstream_request(&req, "127.0.0.1:40000".parse().unwrap(), &b);
    let ok = sent.response(200, "OK", Some("u"));
    assert_eq!(stray_response(&ok, "n2", true), Stray::Mine);
    assert_eq!(stray_response(&ok, "n1", true), Stray::Peer("n2"));
    assert_eq!(stray_response(&ok, "n1", false), Stray::Drop);
    assert_eq!(stray_response(&sent, "n1", true), Stray::Drop, "a request");
    // The entry's or a client's branch on top: nobody's transaction here.
    assert_eq!(
        stray_response(&req.response(200, "OK", None), "n1", true),
        Stray::Drop
    );
}

/// A caller's answer to a request of the server that an owner relays
/// toward it (its branch an owner's callee branch), reaching a listener
/// from the caller's own address, goes to that owner.
#[test]
fn a_callers_answer_at_a_listener_goes_to_the_relaying_owner_from_anywhere() {
    let bye = msg(&INVITE
        .replacen("INVITE", "BYE", 1)
        .replace("CSeq: 7 INVITE", "CSeq: 7 BYE"));
    let b = super::super::upstream::callee_branch(&bye, "n3");
    let mut sent = bye.clone();
    sent.push_front("Via", format!("SIP/2.0/UDP 127.0.0.1:40001;branch={b}"));
    let ok = sent.response(200, "OK", None);
    assert_eq!(stray_response(&ok, "n3", false), Stray::Mine);
    assert_eq!(stray_response(&ok, "n1", false), Stray::Peer("n3"));
    assert_eq!(stray_response(&ok, "n1", true), Stray::Peer("n3"));
    assert_eq!(super::super::upstream::node_of_branch(&b), None);
}

#[test]
fn a_100_gathered_with_a_final_answer_is_not_sent() {
    let req = msg(INVITE);
    let a = |code| req.response(code, "x", Some("u"));
    assert_eq!(
        moot_trying([a(100), a(180), a(200)].iter()),
        [false, true, true]
    );
    assert_eq!(moot_trying([a(100), a(180)].iter()), [true, true]);
    assert_eq!(moot_trying([a(100)].iter()), [true]);
}

/// RFC 5923 / RFC 5626 5.3: a request of the server toward a caller whose
/// dialog Route names the caller's connection keeps that flow (tried
/// first, its Via naming the listener and TLS), its Route removed; a
/// target the owner could not send to otherwise waits for the flow (no
/// refusal yet), and the flow found gone is answered 430 (an ACK never).
#[test]
fn a_request_toward_a_caller_keeps_its_flow_and_a_gone_flow_is_430() {
    use super::super::upstream::{callee_request, flow_failed, flow_via};
    let bye = "BYE sips:alice@192.0.2.1:5071 SIP/2.0\r\n\
        Via: SIP/2.0/UDP 127.0.0.1:5090;branch=z9hG4bKu1\r\n\
        Route: <sips:127.0.0.1:5061;lr;peerlb-owner=n2;peerlb-key=k;peerlb-flow=0a.n1>\r\n\
        From: <sip:bob@h>;tag=u\r\nTo: <sip:alice@h>;tag=1\r\nCall-ID: c\r\nCSeq: 1 BYE\r\n\
        Max-Forwards: 70\r\nContent-Length: 0\r\n\r\n";
    let (out, to) = callee_request(&msg(bye), "n2").unwrap();
    let flow = to.flow.expect("the caller's flow");
    assert_eq!(
        (flow.id.as_str(), flow.node.as_str(), flow.tls),
        ("0a", "n1", true)
    );
    assert_eq!(flow_via(&flow), ("TLS", "127.0.0.1:5061".parse().unwrap()));
    assert_eq!(to.dest, Err(503));
    assert!(out.header("route").is_none());
    let r = flow_failed(&msg(bye), "n2").unwrap();
    assert_eq!(status(&r), 430);
    assert_eq!(
        r.header_list("via"),
        ["SIP/2.0/UDP 127.0.0.1:5090;branch=z9hG4bKu1"]
    );
    let ack = bye
        .replace("BYE sips", "ACK sips")
        .replace("1 BYE", "1 ACK");
    assert!(flow_failed(&msg(&ack), "n2").is_none());
    // Without the flow the same target is refused at once.
    let plain = bye.replace(";peerlb-flow=0a.n1", "");
    assert!(callee_request(&msg(&plain), "n2").is_err());
    // A flow that is not the top Route (not this cluster's) is no flow.
    let other = bye.replace(
        "Route: <sips:127.0.0.1:5061;lr;peerlb-owner=n2;peerlb-key=k;peerlb-flow=0a.n1>",
        "Route: <sip:192.0.2.9;lr;peerlb-flow=0a.n1>",
    );
    let (_, to) = callee_request(&msg(&other), "n2").unwrap();
    assert_eq!(to.flow, None);
}
