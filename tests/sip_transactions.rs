//! SIP transactions through the cluster against a strict SIP server
//! (`sip_app = "udp:..."`): real `peerlb` processes on loopback and, in
//! this test, a fake user agent server with RFC 3261 server transactions
//! ([`StrictUas`]). What is pinned: an INVITE gets `100 Trying` at once
//! from its entry and every provisional answer as the server sends it
//! (not held until the final one); a call that keeps ringing longer than
//! Timer C is not cut, since each provisional answer restarts it; a call
//! that rings without end is CANCELled by the owner when Timer C fires
//! and the caller gets the server's `487`; a caller's CANCEL, through any
//! node and over UDP or TCP, gets `200` and its INVITE `487`, the server
//! seeing one INVITE transaction; the ACK of a non-2xx answer reaches the
//! server once, as the ACK of its own transaction (the owner's, hop by
//! hop), whichever node the caller's ACK enters. Timer C is set to 1 s
//! here (`limits.sip_timer_c_ms`), so no test waits minutes.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

#[path = "sip_transactions/uas.rs"]
mod uas;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use support::*;
use uas::{status, *};

/// Timer C in these tests, in ms.
const TIMER_C_MS: u64 = 1_000;

fn cluster(tag: &str, uas: &StrictUas) -> Cluster {
    Cluster::start_sip(
        tag,
        3,
        &format!(
            "sip_app = \"udp:{}\"\n[limits]\nsip_timer_c_ms = {TIMER_C_MS}\n",
            uas.addr
        ),
        "",
    )
}

fn sum_counter(c: &Cluster, name: &str) -> u64 {
    c.nodes.iter().map(|n| counter(n.http, name)).sum()
}

/// RFC 3261 16.2 and 16.7: the 100 comes from the entry before anything
/// of the server's, each 180 reaches the caller while the call still
/// rings (before the server sends its 200), and a ring longer than Timer
/// C is not cut since every 180 restarts it.
#[test]
fn an_invite_gets_100_at_once_then_each_180_as_it_comes_and_a_long_ring_is_not_cut() {
    let uas = StrictUas::start();
    let c = cluster("sip-tx-ring", &uas);
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let me = client.local_addr().unwrap();
    for (i, node) in c.nodes.iter().enumerate() {
        let call = format!("long{i}");
        let invite = request("INVITE", "long", &call, 1, ("UDP", me), &call, "");
        let sent = Instant::now();
        client
            .send_to(invite.as_bytes(), node.sip.unwrap())
            .unwrap();
        let answers = gather(&client, Duration::from_secs(20), |a| has_final(a, "INVITE"));
        let codes = statuses(&answers, "INVITE");
        // 100 (the entry's), eight 180s, 200: 2.4 s of ringing, more than
        // twice Timer C.
        let mut want = vec![100];
        want.extend([180; 8]);
        want.push(200);
        assert_eq!(codes, want, "through n{}: {answers:?}", i + 1);
        let first = &answers[0].1;
        assert_eq!(
            header(first, "x-fake-uas"),
            None,
            "the entry's own 100: {first}"
        );
        assert_eq!(
            all_headers(first, "via"),
            [format!(
                "SIP/2.0/UDP {me};branch=z9hG4bK{call};received={};rport={}",
                me.ip(),
                me.port()
            )]
        );
        let ok_sent = uas.sent(200, "INVITE", &call);
        assert_eq!(ok_sent.len(), 1, "{ok_sent:?}");
        let ok_at = ok_sent[0].at;
        assert!(
            ok_at.duration_since(sent) > Duration::from_millis(2 * TIMER_C_MS),
            "the call rang past Timer C"
        );
        // Each 180 reached the caller before the server answered 200: none
        // was held back for the final answer.
        let rings: Vec<Instant> = answers
            .iter()
            .filter(|(_, a)| status(a) == 180)
            .map(|(t, _)| *t)
            .collect();
        assert!(
            rings.iter().all(|t| *t < ok_at),
            "a 180 came after the 200 was sent"
        );
        assert_eq!(
            uas.requests("CANCEL", &call).len(),
            0,
            "nobody cancelled it"
        );
    }
    assert_eq!(sum_counter(&c, "sip_timer_c_cancels"), 0);
}

/// RFC 3261 16.8: Timer C fires after a provisional answer and no final
/// one: the owner CANCELs the branch (the INVITE's own, so the server
/// answers 200, not 481) and the caller gets the server's 487.
#[test]
fn timer_c_cancels_a_call_that_rings_without_end_and_the_caller_gets_487() {
    let uas = StrictUas::start();
    let c = cluster("sip-tx-timer-c", &uas);
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let me = client.local_addr().unwrap();
    for (i, node) in c.nodes.iter().enumerate() {
        let call = format!("endless{i}");
        let invite = request("INVITE", "ring", &call, 1, ("UDP", me), &call, "");
        client
            .send_to(invite.as_bytes(), node.sip.unwrap())
            .unwrap();
        let answers = gather(&client, Duration::from_secs(20), |a| has_final(a, "INVITE"));
        assert_eq!(statuses(&answers, "INVITE"), [100, 180, 487], "{answers:?}");
        let invites = uas.requests("INVITE", &call);
        assert_eq!(
            invites.len(),
            1,
            "one INVITE, no retransmission: {invites:?}"
        );
        let cancels = uas.requests("CANCEL", &call);
        assert!(!cancels.is_empty(), "the owner's CANCEL");
        assert!(
            cancels
                .iter()
                .all(|c| top_branch(c) == top_branch(&invites[0]))
        );
        assert!(uas.sent(481, "CANCEL", &call).is_empty());
        assert_eq!(uas.sent(200, "CANCEL", &call).len(), 1);
    }
    assert_eq!(sum_counter(&c, "sip_timer_c_cancels"), 3);
}

/// RFC 3261 9.2 and 16.10 over UDP: a CANCEL entering through any node
/// reaches the INVITE's transaction at the server: 200 to the CANCEL, 487
/// to the INVITE, one INVITE transaction at the server; the caller's ACK
/// of the 487 through a third node is absorbed, so the server gets one
/// ACK, the owner's, on the INVITE's branch.
#[test]
fn a_cancel_through_each_node_over_udp_gets_200_and_the_invite_487() {
    let uas = StrictUas::start();
    let c = cluster("sip-tx-cancel-udp", &uas);
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let me = client.local_addr().unwrap();
    let sip = |i: usize| c.nodes[i % 3].sip.unwrap();
    for i in 0..3 {
        let call = format!("cancel-udp{i}");
        let invite = request("INVITE", "ring", &call, 1, ("UDP", me), &call, "");
        client.send_to(invite.as_bytes(), sip(i)).unwrap();
        // The 180 reaches the caller while the INVITE is pending.
        let ringing = gather(&client, Duration::from_secs(10), |a| {
            statuses(a, "INVITE").contains(&180)
        });
        assert_eq!(statuses(&ringing, "INVITE"), [100, 180], "{ringing:?}");
        client
            .send_to(cancel_of(&invite).as_bytes(), sip(i + 1))
            .unwrap();
        let answers = gather(&client, Duration::from_secs(10), |a| {
            has_final(a, "INVITE") && has_final(a, "CANCEL")
        });
        assert_eq!(
            statuses(&answers, "CANCEL"),
            [200],
            "n{} -> n{}: {answers:?}",
            i + 1,
            (i + 1) % 3 + 1
        );
        assert_eq!(statuses(&answers, "INVITE"), [487], "{answers:?}");
        let invites = uas.requests("INVITE", &call);
        assert_eq!(invites.len(), 1, "{invites:?}");
        assert!(uas.sent(481, "CANCEL", &call).is_empty());
        let terminated = &answers.iter().find(|(_, a)| status(a) == 487).unwrap().1;
        let absorbed = sum_counter(&c, "sip_acks_absorbed");
        client
            .send_to(ack_of(&invite, terminated).as_bytes(), sip(i + 2))
            .unwrap();
        poll(Duration::from_secs(10), || {
            sum_counter(&c, "sip_acks_absorbed") > absorbed
        })
        .expect("the caller's ACK was absorbed");
        let acks = uas.requests("ACK", &call);
        assert_eq!(acks.len(), 1, "{acks:?}");
        assert_eq!(top_branch(&acks[0]), top_branch(&invites[0]));
    }
}

/// The same over TCP: the CANCEL on the INVITE's own connection (which
/// the ringing INVITE must not hold up) and on a connection to another
/// node.
#[test]
fn a_cancel_over_tcp_on_the_same_connection_or_through_another_node_gets_200_and_487() {
    let uas = StrictUas::start();
    let c = cluster("sip-tx-cancel-tcp", &uas);
    for (i, same) in [(0, true), (1, false), (2, true)] {
        let call = format!("cancel-tcp{i}");
        let entry = c.nodes[i].sip.unwrap();
        let mut conn = TcpReader::connect(entry);
        let me = conn.tcp.local_addr().unwrap();
        let invite = request("INVITE", "ring", &call, 1, ("TCP", me), &call, "");
        conn.send(&invite);
        let trying = conn.next(Duration::from_secs(10)).expect("100");
        assert_eq!(status(&trying.1), 100);
        let ringing = conn.next(Duration::from_secs(10)).expect("180");
        assert_eq!(status(&ringing.1), 180);
        let cancel = cancel_of(&invite);
        let (cancel_answer, terminated) = if same {
            conn.send(&cancel);
            let a = conn.next(Duration::from_secs(10)).expect("an answer");
            let b = conn.next(Duration::from_secs(10)).expect("another answer");
            if cseq_method(&a.1) == "CANCEL" {
                (a.1, b.1)
            } else {
                (b.1, a.1)
            }
        } else {
            let mut other = TcpReader::connect(c.nodes[(i + 1) % 3].sip.unwrap());
            other.send(&cancel);
            let a = other
                .next(Duration::from_secs(10))
                .expect("the CANCEL's answer");
            let b = conn
                .next(Duration::from_secs(10))
                .expect("the INVITE's final answer");
            (a.1, b.1)
        };
        assert_eq!(
            (cseq_method(&cancel_answer), status(&cancel_answer)),
            ("CANCEL", 200),
            "{cancel_answer}"
        );
        assert_eq!(
            (cseq_method(&terminated), status(&terminated)),
            ("INVITE", 487),
            "{terminated}"
        );
        assert_eq!(uas.requests("INVITE", &call).len(), 1);
        assert!(uas.sent(481, "CANCEL", &call).is_empty());
    }
}

/// RFC 3261 17.1.1.3: the owner ACKs the 486 itself; the caller's ACK,
/// entering through another node, is absorbed there, so the server gets
/// one ACK, of its own transaction (the INVITE's branch).
#[test]
fn the_ack_of_a_486_reaches_the_server_once_as_the_ack_of_its_own_transaction() {
    let uas = StrictUas::start();
    let c = cluster("sip-tx-ack", &uas);
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let me = client.local_addr().unwrap();
    for i in 0..3 {
        let call = format!("busy{i}");
        let invite = request("INVITE", "busy", &call, 1, ("UDP", me), &call, "");
        client
            .send_to(invite.as_bytes(), c.nodes[i].sip.unwrap())
            .unwrap();
        let answers = gather(&client, Duration::from_secs(10), |a| has_final(a, "INVITE"));
        assert_eq!(statuses(&answers, "INVITE"), [100, 486], "{answers:?}");
        let busy = &answers.last().unwrap().1;
        let absorbed = sum_counter(&c, "sip_acks_absorbed");
        client
            .send_to(
                ack_of(&invite, busy).as_bytes(),
                c.nodes[(i + 1) % 3].sip.unwrap(),
            )
            .unwrap();
        poll(Duration::from_secs(10), || {
            sum_counter(&c, "sip_acks_absorbed") > absorbed
        })
        .expect("the caller's ACK was absorbed");
        let invites = uas.requests("INVITE", &call);
        let acks = uas.requests("ACK", &call);
        assert_eq!(acks.len(), 1, "{acks:?}");
        assert_eq!(top_branch(&acks[0]), top_branch(&invites[0]));
        assert_eq!(header(&acks[0], "to"), Some("<sip:busy@test>;tag=uas"));
    }
}

/// A server that sends every answer to one node's listener (not to the
/// owner's `Via`): that node hands each answer to the owner its branch
/// names, over the peer wire, so calls owned by every node complete, and
/// each answer reaches its caller once.
#[test]
fn answers_sent_to_another_nodes_listener_reach_the_owners_transaction() {
    let uas = StrictUas::start();
    let c = cluster("sip-tx-stray", &uas);
    *uas.answer_to.lock().unwrap() = Some(c.nodes[0].sip.unwrap());
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let me = client.local_addr().unwrap();
    let mut owners = std::collections::BTreeSet::new();
    for i in 0..12 {
        let call = format!("stray{i}");
        let invite = request("INVITE", "bob", &call, 1, ("UDP", me), &call, "");
        client
            .send_to(invite.as_bytes(), c.nodes[i % 3].sip.unwrap())
            .unwrap();
        let answers = gather(&client, Duration::from_secs(10), |a| has_final(a, "INVITE"));
        assert_eq!(
            statuses(&answers, "INVITE"),
            [100, 180, 200],
            "{call}: {answers:?}"
        );
        let owner = uas.requests("INVITE", &call)[0].clone();
        let branch = top_branch(&owner);
        owners.insert(branch.rsplit('-').next().unwrap().to_owned());
        // No second copy of any answer comes.
        let late = gather(&client, Duration::from_millis(300), |_| false);
        assert!(late.is_empty(), "{late:?}");
    }
    assert_eq!(owners.len(), 3, "calls owned by every node: {owners:?}");
}

/// `sip_app = "tcp:..."`: each owner reaches the server over one TCP
/// connection of its own (a `SIP/2.0/TCP` Via, nothing resent on it): a
/// call completes through each node, a CANCEL through another node gets
/// 200 and its INVITE 487, and the ACK of a 486 reaches the server once.
#[test]
fn over_tcp_to_the_server_calls_cancels_and_acks_take_the_same_ways() {
    let uas = StrictUas::start_tcp();
    let c = Cluster::start_sip(
        "sip-tx-tcp-app",
        3,
        &format!(
            "sip_app = \"tcp:{}\"\n[limits]\nsip_timer_c_ms = {TIMER_C_MS}\n",
            uas.addr
        ),
        "",
    );
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let me = client.local_addr().unwrap();
    let sip = |i: usize| c.nodes[i % 3].sip.unwrap();
    for i in 0..3 {
        let call = format!("tcp-ok{i}");
        let invite = request("INVITE", "bob", &call, 1, ("UDP", me), &call, "");
        client.send_to(invite.as_bytes(), sip(i)).unwrap();
        let answers = gather(&client, Duration::from_secs(10), |a| has_final(a, "INVITE"));
        assert_eq!(statuses(&answers, "INVITE"), [100, 180, 200], "{answers:?}");
        let seen = uas.requests("INVITE", &call);
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(
            all_headers(&seen[0], "via")[0].starts_with("SIP/2.0/TCP 127.0.0.1:"),
            "{}",
            seen[0]
        );

        let call = format!("tcp-cancel{i}");
        let invite = request("INVITE", "ring", &call, 1, ("UDP", me), &call, "");
        client.send_to(invite.as_bytes(), sip(i)).unwrap();
        let ringing = gather(&client, Duration::from_secs(10), |a| {
            statuses(a, "INVITE").contains(&180)
        });
        assert_eq!(statuses(&ringing, "INVITE"), [100, 180], "{ringing:?}");
        client
            .send_to(cancel_of(&invite).as_bytes(), sip(i + 1))
            .unwrap();
        let answers = gather(&client, Duration::from_secs(10), |a| {
            has_final(a, "INVITE") && has_final(a, "CANCEL")
        });
        assert_eq!(statuses(&answers, "CANCEL"), [200], "{answers:?}");
        assert_eq!(statuses(&answers, "INVITE"), [487], "{answers:?}");
        assert!(uas.sent(481, "CANCEL", &call).is_empty());

        let call = format!("tcp-busy{i}");
        let invite = request("INVITE", "busy", &call, 1, ("UDP", me), &call, "");
        client.send_to(invite.as_bytes(), sip(i)).unwrap();
        let answers = gather(&client, Duration::from_secs(10), |a| has_final(a, "INVITE"));
        assert_eq!(statuses(&answers, "INVITE"), [100, 486], "{answers:?}");
        let absorbed = sum_counter(&c, "sip_acks_absorbed");
        let busy = &answers.last().unwrap().1;
        client
            .send_to(ack_of(&invite, busy).as_bytes(), sip(i + 2))
            .unwrap();
        poll(Duration::from_secs(10), || {
            sum_counter(&c, "sip_acks_absorbed") > absorbed
        })
        .expect("the caller's ACK was absorbed");
        assert_eq!(uas.requests("ACK", &call).len(), 1);
    }
}

/// A request the server sends toward a caller whose target says
/// `transport=tcp` goes over a TCP connection (a new one, from the node
/// that took it: RFC 5923 reuse of the caller's own connection is not
/// built) with a `SIP/2.0/TCP` Via, and the caller's 200 on it reaches the
/// server, its own Via only.
#[test]
fn a_request_from_the_server_to_a_tcp_caller_goes_over_tcp_and_its_200_comes_back() {
    let server = UdpSocket::bind("127.0.0.1:0").unwrap();
    let c = Cluster::start_sip(
        "sip-tx-callee-tcp",
        1,
        &format!("sip_app = \"udp:{}\"", server.local_addr().unwrap()),
        "",
    );
    let caller = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = caller.local_addr().unwrap();
    let me = server.local_addr().unwrap();
    let bye = format!(
        "BYE sip:alice@{at};transport=tcp SIP/2.0\r\n\
         Via: SIP/2.0/UDP {me};branch=z9hG4bKsrvbye1\r\nMax-Forwards: 70\r\n\
         From: <sip:bob@test>;tag=uas\r\nTo: <sip:alice@test>;tag=a1\r\nCall-ID: callee-tcp\r\n\
         CSeq: 5 BYE\r\nContent-Length: 0\r\n\r\n"
    );
    server
        .send_to(bye.as_bytes(), c.nodes[0].sip.unwrap())
        .unwrap();
    caller.set_nonblocking(true).unwrap();
    let mut accepted = None;
    poll(Duration::from_secs(10), || {
        accepted = caller.accept().ok();
        accepted.is_some()
    })
    .expect("a TCP connection to the caller");
    let (conn, _) = accepted.unwrap();
    conn.set_nonblocking(false).unwrap();
    let mut conn = TcpReader {
        tcp: conn,
        buf: Vec::new(),
    };
    let (_, got) = conn
        .next(Duration::from_secs(10))
        .expect("the BYE over TCP");
    assert!(got.starts_with("BYE sip:alice@"), "{got}");
    let vias = all_headers(&got, "via");
    assert_eq!(vias.len(), 2, "{got}");
    assert!(vias[0].starts_with("SIP/2.0/TCP 127.0.0.1:"), "{got}");
    assert_eq!(header(&got, "max-forwards"), Some("69"));
    conn.send(&answer(&got, 200, at));
    server
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = vec![0u8; 65_536];
    let (n, _) = server.recv_from(&mut buf).expect("the caller's 200");
    let ok = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert_eq!(status(&ok), 200, "{ok}");
    assert_eq!(
        all_headers(&ok, "via"),
        [format!("SIP/2.0/UDP {me};branch=z9hG4bKsrvbye1")]
    );
}

/// A caller that answers a request of the server (relayed toward it by
/// the node the server sent it to) at a SIP listener instead of the
/// relaying socket's address, this node's or another node's: the answer
/// reaches the relay, and the server gets it once, its own Via only.
#[test]
fn a_callers_answer_sent_to_a_listener_reaches_the_server_once() {
    let server = UdpSocket::bind("127.0.0.1:0").unwrap();
    let me = server.local_addr().unwrap();
    let c = Cluster::start_sip(
        "sip-tx-callee-stray",
        3,
        &format!("sip_app = \"udp:{me}\""),
        "",
    );
    let caller = UdpSocket::bind("127.0.0.1:0").unwrap();
    let at = caller.local_addr().unwrap();
    server
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    // The answer to n1's relay sent to n2's listener, then to n1's own.
    for (i, answer_to) in [(0, 1), (1, 0)] {
        let call = format!("callee-stray{i}");
        let bye = format!(
            "BYE sip:alice@{at} SIP/2.0\r\n\
             Via: SIP/2.0/UDP {me};branch=z9hG4bKsrvstray{i}\r\nMax-Forwards: 70\r\n\
             From: <sip:bob@test>;tag=uas\r\nTo: <sip:alice@test>;tag=a1\r\nCall-ID: {call}\r\n\
             CSeq: 5 BYE\r\nContent-Length: 0\r\n\r\n"
        );
        server
            .send_to(bye.as_bytes(), c.nodes[0].sip.unwrap())
            .unwrap();
        let got = gather(&caller, Duration::from_secs(10), |a| !a.is_empty());
        let got = &got.first().expect("the relayed BYE").1;
        assert!(got.starts_with("BYE sip:alice@"), "{got}");
        assert!(
            top_branch(got).starts_with("z9hG4bK-plbc-") && top_branch(got).ends_with("-n1"),
            "{got}"
        );
        let ok = answer(got, 200, at);
        caller
            .send_to(ok.as_bytes(), c.nodes[answer_to].sip.unwrap())
            .unwrap();
        // Everything the server gets for 3 s: the 200 once (the relay
        // resends nothing after a final answer).
        let mut answers = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut buf = vec![0u8; 65_536];
        while Instant::now() < deadline {
            if let Ok((n, _)) = server.recv_from(&mut buf) {
                answers.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
        let oks: Vec<&String> = answers.iter().filter(|a| status(a) == 200).collect();
        assert_eq!(oks.len(), 1, "through n{}: {answers:?}", answer_to + 1);
        assert_eq!(
            all_headers(oks[0], "via"),
            [format!("SIP/2.0/UDP {me};branch=z9hG4bKsrvstray{i}")]
        );
    }
}

/// A BYE of the server toward the caller of call `call`, along `route`
/// (the INVITE's Record-Route), to the caller's Contact `target` over
/// TCP, from the server at `server` (branch number `n`).
fn server_bye(
    call: &str,
    route: &str,
    target: std::net::SocketAddr,
    server: std::net::SocketAddr,
    n: usize,
) -> String {
    format!(
        "BYE sip:alice@{target};transport=tcp SIP/2.0\r\n\
         Via: SIP/2.0/UDP {server};branch=z9hG4bKflowbye{n}\r\nRoute: {route}\r\nMax-Forwards: 70\r\n\
         From: <sip:bob@test>;tag=uas\r\nTo: <sip:alice@test>;tag=a{call}\r\nCall-ID: {call}\r\n\
         CSeq: 1 BYE\r\nContent-Length: 0\r\n\r\n"
    )
}

/// RFC 5923 connection reuse: the entry names the caller's TCP connection
/// in its Record-Route (`peerlb-flow=<id>.<entry>`), and the server's BYE,
/// sent to the entry itself or to another node, reaches the caller over
/// that connection (its Contact is a port where nothing listens), the
/// entry's `SIP/2.0/TCP` Via on top; the caller's 200 on it reaches the
/// server, its own Via only. A Route naming a flow that is gone (an id
/// its node does not have, a node not in the cluster) takes a new
/// connection to the caller's Contact instead.
#[test]
fn a_bye_from_the_server_reaches_a_tcp_caller_over_its_own_connection_through_any_node() {
    let uas = StrictUas::start();
    let c = cluster("sip-tx-flow", &uas);
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    for (i, bye_to) in [(0, 0), (1, 2), (2, 0)] {
        let call = format!("flow{i}");
        let entry = c.nodes[i].sip.unwrap();
        let mut conn = TcpReader::connect(entry);
        let me = conn.tcp.local_addr().unwrap();
        let invite = request("INVITE", "bob", &call, 1, ("TCP", me), &call, "").replace(
            &format!("Contact: <sip:alice@{me}>"),
            &format!("Contact: <sip:alice@{nowhere};transport=tcp>"),
        );
        conn.send(&invite);
        let mut answers = Vec::new();
        while !has_final(&answers, "INVITE") {
            answers.push(
                conn.next(Duration::from_secs(10))
                    .expect("the INVITE's answers"),
            );
        }
        assert_eq!(statuses(&answers, "INVITE"), [100, 180, 200], "{answers:?}");
        let seen = uas.requests("INVITE", &call);
        let rr = header(&seen[0], "record-route").unwrap().to_owned();
        assert!(
            rr.contains(";peerlb-flow=") && rr.ends_with(&format!(".n{}>", i + 1)),
            "{rr}"
        );
        uas.send_to(
            &server_bye(&call, &rr, nowhere, uas.addr, i),
            c.nodes[bye_to].sip.unwrap(),
        );
        let (_, got) = conn
            .next(Duration::from_secs(10))
            .expect("the BYE on the caller's own connection");
        assert!(got.starts_with("BYE sip:alice@"), "{got}");
        let vias = all_headers(&got, "via");
        assert_eq!(vias.len(), 2, "{got}");
        assert!(
            vias[0].starts_with(&format!("SIP/2.0/TCP {entry};branch=z9hG4bK-plbc-")),
            "{got}"
        );
        assert!(header(&got, "route").is_none(), "{got}");
        conn.send(&answer(&got, 200, me));
        poll(Duration::from_secs(10), || {
            !uas.received(200, "BYE", &call).is_empty()
        })
        .expect("the caller's 200 reached the server");
        let oks = uas.received(200, "BYE", &call);
        assert_eq!(
            all_headers(&oks[0], "via"),
            [format!("SIP/2.0/UDP {};branch=z9hG4bKflowbye{i}", uas.addr)]
        );
    }
    assert_eq!(sum_counter(&c, "sip_flow_requests"), 3);
    assert_eq!(sum_counter(&c, "sip_flow_failed"), 0);
    // Flows that are gone: a new connection to the Contact. One the
    // caller closed (once its node counts no client connection), one of
    // an id its node never had, one of a node not in the cluster.
    let caller = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    caller.set_nonblocking(true).unwrap();
    let at = caller.local_addr().unwrap();
    let closed = {
        let mut conn = TcpReader::connect(c.nodes[2].sip.unwrap());
        let me = conn.tcp.local_addr().unwrap();
        let invite = request("INVITE", "bob", "flow-gone9", 1, ("TCP", me), "g9", "").replace(
            &format!("Contact: <sip:alice@{me}>"),
            &format!("Contact: <sip:alice@{at};transport=tcp>"),
        );
        conn.send(&invite);
        let mut answers = Vec::new();
        while !has_final(&answers, "INVITE") {
            answers.push(
                conn.next(Duration::from_secs(10))
                    .expect("the INVITE's answers"),
            );
        }
        header(&uas.requests("INVITE", "flow-gone9")[0], "record-route")
            .unwrap()
            .to_owned()
    };
    poll(Duration::from_secs(10), || {
        support::status(c.nodes[2].http).is_some_and(|s| s["client_connections"] == 0)
    })
    .expect("the entry saw the caller's connection close");
    let gone = |token: &str| {
        format!(
            "<sip:{};transport=tcp;lr;peerlb-owner=n1;peerlb-key=k;peerlb-flow={token}>",
            c.nodes[0].sip.unwrap()
        )
    };
    for (i, rr) in [
        (9, closed),
        (10, gone("00000000deadbeef.n1")),
        (11, gone("00000000deadbeef.n9")),
    ] {
        let call = format!("flow-gone{i}");
        uas.send_to(
            &server_bye(&call, &rr, at, uas.addr, i),
            c.nodes[1].sip.unwrap(),
        );
        let mut accepted = None;
        poll(Duration::from_secs(10), || {
            accepted = caller.accept().ok();
            accepted.is_some()
        })
        .expect("a new TCP connection to the caller");
        let (tcp, _) = accepted.unwrap();
        tcp.set_nonblocking(false).unwrap();
        let mut conn = TcpReader {
            tcp,
            buf: Vec::new(),
        };
        let (_, got) = conn.next(Duration::from_secs(10)).expect("the BYE");
        assert!(got.starts_with("BYE sip:alice@"), "{got}");
        conn.send(&answer(&got, 200, at));
        poll(Duration::from_secs(10), || {
            !uas.received(200, "BYE", &call).is_empty()
        })
        .expect("the caller's 200 reached the server");
    }
    assert_eq!(sum_counter(&c, "sip_flow_requests"), 3);
    assert_eq!(sum_counter(&c, "sip_flow_failed"), 3);
}
