//! SIP next to HTTP (the converged load balancer): real `peerlb`
//! processes on loopback, each with a `sip_addr`, and a hand-written user
//! agent client over UDP and TCP. A request with one Call-ID and From tag
//! reaches one owner whichever node it enters; a dialog's ACK and BYE reach
//! the INVITE's owner through other entries by the `Record-Route`
//! parameter, and the next ring node once that owner is killed; an HTTP
//! request and an INVITE naming one user land on one owner under a rules
//! file; malformed SIP gets `400` or is dropped, a half-sent TCP message
//! is closed after the read timeout, and the node keeps serving; a bad
//! `sip_addr` exits 64 before anything is bound. Under `peerlb up` every
//! node also listens on the shared `sip_sprayer_addr` (SO_REUSEPORT): one
//! call's requests from many source ports enter through several nodes,
//! reach one owner and are answered from the shared address.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use support::*;

/// One SIP response as the test client reads it.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    text: String,
}

impl Answer {
    fn parse(bytes: &[u8]) -> Answer {
        let text = String::from_utf8_lossy(bytes).into_owned();
        let status = text
            .strip_prefix("SIP/2.0 ")
            .and_then(|r| r.get(..3))
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("not a SIP response: {text:?}"));
        Answer { status, text }
    }

    /// The first value of header `name` (case-insensitive, full name).
    fn header(&self, name: &str) -> Option<&str> {
        let head = self.text.split("\r\n\r\n").next().unwrap_or("");
        head.lines().skip(1).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn served_by(&self) -> &str {
        self.header("peerlb-served-by").unwrap_or("")
    }

    fn to_tag(&self) -> String {
        let to = self.header("to").expect("a To header");
        to.split(";tag=").nth(1).expect("a To tag").to_owned()
    }
}

/// A request text: `method` to `sip:bob@test`, with `from`
/// (`sip:<user>@test;tag=<tag>`), Call-ID, CSeq, a Via naming `via` with
/// `rport`, and `extra` header lines (each ending in CRLF).
fn request(
    method: &str,
    user: &str,
    tag: &str,
    call_id: &str,
    cseq: u32,
    via: &str,
    extra: &str,
) -> String {
    format!(
        "{method} sip:bob@test SIP/2.0\r\n\
         Via: SIP/2.0/{via};branch=z9hG4bK{call_id}{cseq}{method};rport\r\n\
         Max-Forwards: 70\r\n\
         From: <sip:{user}@test>;tag={tag}\r\n\
         To: <sip:bob@test>\r\n\
         Call-ID: {call_id}\r\n\
         CSeq: {cseq} {method}\r\n\
         Contact: <sip:{user}@{via_host}>\r\n\
         {extra}Content-Length: 0\r\n\r\n",
        via_host = via.split(' ').nth(1).unwrap_or("x"),
    )
}

/// A UDP user agent client on an ephemeral loopback port.
struct Uac {
    sock: UdpSocket,
}

impl Uac {
    fn new() -> Uac {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        Uac { sock }
    }

    fn via(&self) -> String {
        format!("UDP {}", self.sock.local_addr().unwrap())
    }

    /// Sends `text` to `to` and reads answers until a final one (>= 200)
    /// or `limit`; returns them in order.
    fn exchange(&self, to: SocketAddr, text: &str, limit: Duration) -> Vec<Answer> {
        self.sock.send_to(text.as_bytes(), to).unwrap();
        let mut out = Vec::new();
        let deadline = Instant::now() + limit;
        let mut buf = vec![0u8; 65_536];
        while Instant::now() < deadline {
            self.sock
                .set_read_timeout(Some(
                    deadline
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(1)),
                ))
                .unwrap();
            let Ok((n, _)) = self.sock.recv_from(&mut buf) else {
                break;
            };
            let a = Answer::parse(&buf[..n]);
            let last = a.status >= 200;
            out.push(a);
            if last {
                break;
            }
        }
        out
    }

    /// [`Uac::exchange`] expecting a final answer within 20 s.
    fn final_answer(&self, to: SocketAddr, text: &str) -> Answer {
        let answers = self.exchange(to, text, Duration::from_secs(20));
        answers
            .last()
            .filter(|a| a.status >= 200)
            .cloned()
            .unwrap_or_else(|| panic!("no final answer from {to} to {text:?}: {answers:?}"))
    }
}

/// Reads one answer (head only: the demo server's answers have no body)
/// from a TCP connection, byte by byte.
fn read_tcp_answer(tcp: &mut TcpStream) -> Answer {
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        assert_eq!(
            tcp.read(&mut b).unwrap(),
            1,
            "closed after {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.push(b[0]);
    }
    Answer::parse(&buf)
}

fn sip(c: &Cluster, id: &str) -> SocketAddr {
    c.node(id).sip.expect("the cluster has sip_addr")
}

const IDS: [&str; 3] = ["n1", "n2", "n3"];

#[test]
fn one_call_id_and_from_tag_reach_the_ring_owner_from_every_entry() {
    let c = Cluster::start_sip("sip-key", 3, "", "");
    let ring = ring(&IDS, 1024);
    let uac = Uac::new();
    let mut owners = std::collections::BTreeSet::new();
    let mut forwarded = 0;
    for i in 0..12 {
        let (tag, call) = (format!("t{i}"), format!("call-{i}"));
        let want = ring.owner(&format!("{tag}|{call}")).unwrap().to_string();
        for (k, entry) in IDS.iter().enumerate() {
            let text = request(
                "OPTIONS",
                "alice",
                &tag,
                &call,
                k as u32 + 1,
                &uac.via(),
                "",
            );
            let a = uac.final_answer(sip(&c, entry), &text);
            assert_eq!(a.status, 200, "{}", a.text);
            assert_eq!(a.served_by(), want, "call {call} via {entry}");
            forwarded += u64::from(want != *entry);
            assert_eq!(a.header("call-id"), Some(call.as_str()));
            // The entry's own Via is gone: only the client's is left.
            assert_eq!(a.text.matches("Via:").count(), 1, "{}", a.text);
        }
        owners.insert(want);
    }
    assert!(owners.len() > 1, "12 calls all on {owners:?}: not balanced");
    // Every entry counted its 12 requests; only those owned elsewhere
    // were forwarded.
    for n in &c.nodes {
        assert_eq!(counter(n.http, "sip_requests"), 12, "{}", n.id);
    }
    let sent: u64 = c
        .nodes
        .iter()
        .map(|n| counter(n.http, "sip_forwarded"))
        .sum();
    assert_eq!(sent, forwarded);
}

/// The `Route` value a UAC builds from the 200's `Record-Route`.
fn route_of(ok: &Answer) -> String {
    let rr = ok
        .header("record-route")
        .expect("a Record-Route")
        .to_owned();
    assert!(rr.contains(";lr;peerlb-owner="), "{rr}");
    rr
}

/// A 3-node SIP cluster whose SIP rules key on the `Subject` header: a
/// header that may change inside a dialog, so only the Record-Route
/// parameter can bring a later request back to the dialog's owner.
fn subject_keyed_cluster(tag: &str) -> Cluster {
    let dir = temp_dir(&format!("{tag}-rules"));
    let rules = write(
        &dir,
        "rules.xml",
        r#"<user-centric-rules><sip-rules>
             <header name="Subject" return="request.Subject"><exist/></header>
           </sip-rules></user-centric-rules>"#,
    );
    Cluster::start_sip(tag, 3, &format!("rules_file = \"{}\"", rules.display()), "")
}

#[test]
fn ack_and_bye_through_other_entries_reach_the_invites_owner() {
    let c = subject_keyed_cluster("sip-dialog");
    let ring = ring(&IDS, 1024);
    let uac = Uac::new();
    let owner = ring.owner("s0").unwrap().to_string();
    let elsewhere = (1..1000)
        .map(|i| format!("s{i}"))
        .find(|s| ring.owner(s).unwrap().to_string() != owner)
        .unwrap();
    let entries: Vec<&str> = IDS.iter().copied().filter(|id| *id != owner).collect();
    let invite = request(
        "INVITE",
        "alice",
        "ft1",
        "dialog-1",
        1,
        &uac.via(),
        "Subject: s0\r\n",
    );
    let answers = uac.exchange(sip(&c, entries[0]), &invite, Duration::from_secs(20));
    // Over UDP the built-in server's 100 and 180 would pass twice the
    // INVITE's bytes (a forged source's reflection bound): the 200 only.
    let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    assert_eq!(statuses, vec![200], "{answers:?}");
    let ok = &answers[0];
    assert_eq!(ok.served_by(), owner);
    let route = route_of(ok);
    assert!(route.contains(&format!("peerlb-owner={owner};")), "{route}");
    let in_dialog = |method: &str, cseq: u32| {
        request(
            method,
            "alice",
            "ft1",
            "dialog-1",
            cseq,
            &uac.via(),
            &format!("Subject: {elsewhere}\r\nRoute: {route}\r\n"),
        )
        .replace(
            "To: <sip:bob@test>",
            &format!("To: <sip:bob@test>;tag={}", ok.to_tag()),
        )
    };
    // ACK gets no answer (the first answer read after it is the BYE's);
    // BYE through the other entry ends the dialog at the owner (a node
    // that never saw it would answer 481).
    uac.sock
        .send_to(in_dialog("ACK", 1).as_bytes(), sip(&c, entries[1]))
        .unwrap();
    let bye = uac.final_answer(sip(&c, entries[1]), &in_dialog("BYE", 2));
    assert_eq!(
        (bye.status, bye.served_by()),
        (200, owner.as_str()),
        "{}",
        bye.text
    );
    // A second BYE: the dialog is over, the same owner says 481.
    let again = uac.final_answer(sip(&c, entries[0]), &in_dialog("BYE", 3));
    assert_eq!((again.status, again.served_by()), (481, owner.as_str()));
    // Without the Route the key (the Subject) picks another node, which
    // never saw the dialog.
    let bare = in_dialog("BYE", 4).replace(&format!("Route: {route}\r\n"), "");
    let other = uac.final_answer(sip(&c, entries[0]), &bare);
    assert_eq!(other.status, 481);
    assert_ne!(other.served_by(), owner);
}

#[test]
fn converged_http_user_parameter_and_sip_from_user_share_an_owner() {
    let dir = temp_dir("sip-converged-rules");
    let rules = write(
        &dir,
        "rules.xml",
        r#"<user-centric-rules>
             <http-rules>
               <request-uri parameter="user" return="parameter.user"><exist/></request-uri>
             </http-rules>
             <sip-rules>
               <header name="From" return="request.From.uri.user"><exist/></header>
             </sip-rules>
           </user-centric-rules>"#,
    );
    let c = Cluster::start_sip(
        "sip-converged",
        3,
        &format!("rules_file = \"{}\"", rules.display()),
        "",
    );
    let uac = Uac::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut owners = std::collections::BTreeSet::new();
    for (i, user) in ["alice", "bob", "carol", "dave", "erin", "frank"]
        .iter()
        .enumerate()
    {
        let http = rt.block_on(get(c.nodes[i % 3].http, &format!("/?user={user}"), &[]));
        assert_eq!(http.status, 200);
        let text = request(
            "INVITE",
            user,
            &format!("t{i}"),
            &format!("conv-{i}"),
            1,
            &uac.via(),
            "",
        );
        let ok = uac.final_answer(sip(&c, IDS[(i + 1) % 3]), &text);
        assert_eq!(ok.status, 200, "{}", ok.text);
        assert_eq!(ok.served_by(), http.served_by(), "user {user}");
        owners.insert(ok.served_by().to_owned());
    }
    assert!(owners.len() > 1, "every user on {owners:?}");
}

#[test]
fn bye_after_the_dialogs_owner_is_killed_is_answered_481_by_the_next_ring_node() {
    let mut c = subject_keyed_cluster("sip-failover");
    let ring = ring(&IDS, 1024);
    let uac = Uac::new();
    let owner = ring.owner("s0").unwrap().to_string();
    let next = ring.candidates("s0").nth(1).unwrap().to_string();
    // The BYE's own key belongs to the third node: only the dialog's key
    // (carried in the Route) leads to `next`.
    let elsewhere = (1..1000)
        .map(|i| format!("s{i}"))
        .find(|s| {
            ring.owner(s).unwrap().to_string() != owner
                && ring.owner(s).unwrap().to_string() != next
        })
        .unwrap();
    let entry = IDS.iter().copied().find(|id| *id != owner).unwrap();
    let invite = request(
        "INVITE",
        "alice",
        "ftk",
        "dialog-kill",
        1,
        &uac.via(),
        "Subject: s0\r\n",
    );
    let ok = uac.final_answer(sip(&c, entry), &invite);
    assert_eq!((ok.status, ok.served_by()), (200, owner.as_str()));
    let route = route_of(&ok);
    c.kill9(&owner);
    let bye = request(
        "BYE",
        "alice",
        "ftk",
        "dialog-kill",
        2,
        &uac.via(),
        &format!("Subject: {elsewhere}\r\nRoute: {route}\r\n"),
    )
    .replace(
        "To: <sip:bob@test>",
        &format!("To: <sip:bob@test>;tag={}", ok.to_tag()),
    );
    // A UAC retransmits until it gets a final answer; the entry answers
    // 503 while its view still has the dead owner.
    let mut last = None;
    let done = poll(Duration::from_secs(30), || {
        let a = uac.exchange(sip(&c, entry), &bye, Duration::from_secs(2));
        let fin = a.into_iter().find(|a| a.status >= 200);
        let got = fin.as_ref().is_some_and(|a| a.status == 481);
        last = fin;
        got
    });
    let last = last.expect("a final answer");
    assert!(done.is_ok(), "no 481: last {}", last.text);
    assert_eq!(last.served_by(), next, "{}", last.text);
}

#[test]
fn malformed_sip_gets_400_or_is_dropped_and_the_node_keeps_serving() {
    let c = Cluster::start_sip("sip-malformed", 2, "", "");
    let to = sip(&c, "n1");
    let uac = Uac::new();
    // A request with a CSeq method of another request: 400, with its
    // Call-ID.
    let bad = request("OPTIONS", "a", "t", "bad-1", 1, &uac.via(), "")
        .replace("CSeq: 1 OPTIONS", "CSeq: 1 INVITE");
    let a = uac.final_answer(to, &bad);
    assert_eq!(a.status, 400, "{}", a.text);
    assert_eq!(a.header("call-id"), Some("bad-1"));
    // Garbage, a response and a truncated head get nothing: the next
    // answer this client reads is the OPTIONS' 200.
    for junk in [
        b"\x00\xff\x13garbage".to_vec(),
        b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bKx\r\n\r\n".to_vec(),
        b"INVITE sip:b@h SIP/2.0\r\nVia: SIP/2.0/UDP 127".to_vec(),
    ] {
        uac.sock.send_to(&junk, to).unwrap();
    }
    let ok = uac.final_answer(
        to,
        &request("OPTIONS", "a", "t", "good-1", 1, &uac.via(), ""),
    );
    assert_eq!(
        (ok.status, ok.header("call-id")),
        (200, Some("good-1")),
        "{}",
        ok.text
    );

    // TCP: a framed but invalid request gets 400 and the connection goes
    // on; a message without Content-Length cannot be framed: 400, closed.
    let mut tcp = TcpStream::connect(to).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let via = format!("TCP {}", tcp.local_addr().unwrap());
    let bad =
        request("BYE", "a", "t", "tcp-bad", 1, &via, "").replace("CSeq: 1 BYE", "CSeq: x BYE");
    tcp.write_all(bad.as_bytes()).unwrap();
    assert_eq!(read_tcp_answer(&mut tcp).status, 400);
    tcp.write_all(request("OPTIONS", "a", "t", "tcp-ok", 2, &via, "").as_bytes())
        .unwrap();
    let ok = read_tcp_answer(&mut tcp);
    assert_eq!((ok.status, ok.header("call-id")), (200, Some("tcp-ok")));
    // Two messages in one write (and CRLF keep-alives between them) are
    // answered in order, the RFC 5626 ping (a double CRLF) first with its
    // pong (one CRLF).
    let two = format!(
        "\r\n\r\n{}{}",
        request("OPTIONS", "a", "t", "tcp-p1", 3, &via, ""),
        request("MESSAGE", "a", "t", "tcp-p2", 4, &via, "")
    );
    tcp.write_all(two.as_bytes()).unwrap();
    let mut pong = [0u8; 2];
    tcp.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"\r\n");
    for call in ["tcp-p1", "tcp-p2"] {
        let a = read_tcp_answer(&mut tcp);
        assert_eq!((a.status, a.header("call-id")), (200, Some(call)));
    }
    let unframed =
        request("OPTIONS", "a", "t", "tcp-nocl", 3, &via, "").replace("Content-Length: 0\r\n", "");
    tcp.write_all(unframed.as_bytes()).unwrap();
    assert_eq!(read_tcp_answer(&mut tcp).status, 400);
    let mut rest = Vec::new();
    assert_eq!(
        tcp.read_to_end(&mut rest).unwrap(),
        0,
        "the connection is closed"
    );
    // UDP: the bad CSeq, garbage, a response, a cut head; TCP: the bad
    // CSeq and the unframable message.
    assert_eq!(counter(c.nodes[0].http, "sip_malformed"), 6);
    // The node still serves SIP and HTTP.
    let ok = uac.final_answer(
        to,
        &request("OPTIONS", "a", "t", "good-2", 1, &uac.via(), ""),
    );
    assert_eq!(ok.status, 200);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert_eq!(rt.block_on(get(c.nodes[0].http, "/", &[])).status, 200);
}

#[test]
fn a_bad_sip_addr_exits_64_and_a_taken_one_cannot_be_bound() {
    let dir = temp_dir("sip-config");
    let node = |sip: &str| {
        format!(
            "[[nodes]]\nid = \"n1\"\nhttp_addr = \"127.0.0.1:{}\"\npeer_addr = \"127.0.0.1:{}\"\ngossip_addr = \"127.0.0.1:{}\"\nadmin_addr = \"127.0.0.1:{}\"\nsip_addr = \"{sip}\"\n",
            free_port(),
            free_port(),
            free_port(),
            free_port()
        )
    };
    for (sip, says) in [
        ("nowhere", "nodes[0].sip_addr: \"nowhere\""),
        ("127.0.0.1:0", "nodes[0].sip_addr: 127.0.0.1:0: port 0"),
    ] {
        let bad = write(&dir, "bad.toml", &node(sip));
        for args in [
            vec!["check-config", "--config"],
            vec!["node", "--node", "n1", "--config"],
        ] {
            let out = std::process::Command::new(bin())
                .args(&args)
                .arg(&bad)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(64), "{args:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains(says), "{args:?}: {err}");
        }
    }
    // A valid one is shown by check-config (which reads the node's files).
    let sip_port = free_port();
    let good = write(&dir, "good.toml", &node(&format!("127.0.0.1:{sip_port}")));
    let certs = std::process::Command::new(bin())
        .args(["certs", "--config"])
        .arg(&good)
        .output()
        .unwrap();
    assert!(certs.status.success(), "{certs:?}");
    let out = std::process::Command::new(bin())
        .args(["check-config", "--node", "n1", "--config"])
        .arg(&good)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!(", sip 127.0.0.1:{sip_port},")),
        "{said}"
    );
    // A sip_addr whose UDP port another socket holds: exit 1 naming it.
    let taken = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let file = write(&dir, "taken.toml", &node(&addr));
    std::process::Command::new(bin())
        .args(["certs", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let out = std::process::Command::new(bin())
        .args(["node", "--node", "n1", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot bind sip_addr {addr}")),
        "{err}"
    );
}

#[test]
fn a_tcp_message_left_half_sent_is_closed_after_the_read_timeout_and_others_go_on() {
    let c = Cluster::start_sip(
        "sip-stall",
        1,
        "[limits]\nheader_read_timeout_ms = 500\n",
        "",
    );
    let to = sip(&c, "n1");
    let mut stalled = TcpStream::connect(to).unwrap();
    stalled
        .write_all(b"OPTIONS sip:h SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1:9;branch=z9hG4bKs\r\n")
        .unwrap();
    // An idle connection between messages is not closed: this one has
    // sent nothing and still gets its answer after the other is closed.
    let mut idle = TcpStream::connect(to).unwrap();
    stalled
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let start = Instant::now();
    let mut rest = Vec::new();
    assert_eq!(
        stalled.read_to_end(&mut rest).unwrap(),
        0,
        "closed, no answer"
    );
    assert!(start.elapsed() < Duration::from_secs(15));
    let via = format!("TCP {}", idle.local_addr().unwrap());
    idle.write_all(request("OPTIONS", "a", "t", "idle-ok", 1, &via, "").as_bytes())
        .unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let a = read_tcp_answer(&mut idle);
    assert_eq!((a.status, a.header("call-id")), (200, Some("idle-ok")));
}

#[test]
fn route_explains_a_sip_message_with_and_without_sip_rules() {
    let dir = temp_dir("sip-route");
    let rules = write(
        &dir,
        "rules.xml",
        r#"<user-centric-rules><sip-rules>
             <header name="From" return="request.From.uri.user"><exist/></header>
           </sip-rules></user-centric-rules>"#,
    );
    let nodes = "[[nodes]]\nid = \"n1\"\nhttp_addr = \"127.0.0.1:1\"\npeer_addr = \"127.0.0.1:2\"\ngossip_addr = \"127.0.0.1:3\"\n\
                 [[nodes]]\nid = \"n2\"\nhttp_addr = \"127.0.0.1:4\"\npeer_addr = \"127.0.0.1:5\"\ngossip_addr = \"127.0.0.1:6\"\n\
                 [[nodes]]\nid = \"n3\"\nhttp_addr = \"127.0.0.1:7\"\npeer_addr = \"127.0.0.1:8\"\ngossip_addr = \"127.0.0.1:9\"\n";
    let with_rules = write(
        &dir,
        "rules.toml",
        &format!("rules_file = \"{}\"\n{nodes}", rules.display()),
    );
    let plain = write(&dir, "plain.toml", nodes);
    let msg = write(
        &dir,
        "invite.sip",
        &request(
            "INVITE",
            "carol",
            "tg",
            "route-1",
            1,
            "UDP 127.0.0.1:5070",
            "",
        ),
    );
    let ring = ring(&IDS, 1024);
    for (config, key) in [(&with_rules, "carol"), (&plain, "tg|route-1")] {
        let out = std::process::Command::new(bin())
            .args(["route", "--json", "--config"])
            .arg(config)
            .arg("--sip-message")
            .arg(&msg)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(e["key"], key);
        assert_eq!(e["owner"], ring.owner(key).unwrap().to_string());
        assert_eq!(e["candidates"].as_array().unwrap().len(), 3);
    }
    let bad = write(&dir, "bad.sip", "SIP/2.0 200 OK\r\n\r\n");
    let out = std::process::Command::new(bin())
        .args(["route", "--config"])
        .arg(&plain)
        .arg("--sip-message")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--sip-message"));
}

/// A running `peerlb up`, stopped (SIGTERM, then waited for) when dropped.
struct Up(std::process::Child);

impl Drop for Up {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid; SIGTERM stops its nodes.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// `peerlb up` with `sip_sprayer_addr`: every node with a `sip_addr` also
/// listens there, UDP and TCP with SO_REUSEPORT. OPTIONS of one Call-ID
/// and From tag from 24 source ports are spread over several entry nodes
/// by the kernel, every one reaches the key's owner, and every answer
/// comes from the shared address (the socket the request came in on);
/// TCP through it reaches the same owner; an INVITE's Record-Route names
/// the shared address, and the owner's Contact names the owner.
#[test]
fn up_shares_the_sip_sprayer_address_and_one_call_reaches_one_owner_from_any_port() {
    use std::io::BufRead as _;
    let dir = temp_dir("sip-up");
    let sip_sprayer: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut text = format!(
        "name = \"sip-up\"\nsprayer_addr = \"127.0.0.1:{}\"\nsip_sprayer_addr = \"{sip_sprayer}\"\n\
         [gossip]\ninterval_ms = 100\n",
        free_port()
    );
    let mut http = Vec::new();
    for id in IDS {
        let h: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        text += &format!(
            "[[nodes]]\nid = \"{id}\"\nhttp_addr = \"{h}\"\npeer_addr = \"127.0.0.1:{}\"\n\
             gossip_addr = \"127.0.0.1:{}\"\nsip_addr = \"127.0.0.1:{}\"\n",
            free_port(),
            free_port(),
            free_port()
        );
        http.push(h);
    }
    let cfg = write(&dir, "cluster.toml", &text);
    let mut child = std::process::Command::new(bin())
        .args(["up", "--config"])
        .arg(&cfg)
        .current_dir(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(dir.join("up.stderr")).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _up = Up(child);
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    // What `up` printed so far, for the failure message (it says which
    // node exited and why; the nodes' logs go to up.stderr).
    let mut seen = String::new();
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|e| {
                let log = std::fs::read_to_string(dir.join("up.stderr")).unwrap_or_default();
                panic!("peerlb up reports the cluster ready within 30 s: {e}; it printed:\n{seen}its log:\n{log}")
            });
        seen += &line;
        seen.push('\n');
        if line.starts_with("cluster ready") {
            break;
        }
    }
    let want = ring(&IDS, 1024)
        .owner("shared-tag|shared-call")
        .unwrap()
        .to_string();
    let mut buf = vec![0u8; 65_536];
    for cseq in 1..=24 {
        // A new socket: a new source port for the kernel's hash.
        let uac = Uac::new();
        let req = request(
            "OPTIONS",
            "alice",
            "shared-tag",
            "shared-call",
            cseq,
            &uac.via(),
            "",
        );
        uac.sock.send_to(req.as_bytes(), sip_sprayer).unwrap();
        uac.sock
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let (n, from) = uac.sock.recv_from(&mut buf).expect("an answer");
        assert_eq!(
            from, sip_sprayer,
            "the answer leaves from the shared socket"
        );
        let a = Answer::parse(&buf[..n]);
        assert_eq!(
            (a.status, a.served_by()),
            (200, want.as_str()),
            "{}",
            a.text
        );
    }
    let took: Vec<u64> = http.iter().map(|h| counter(*h, "sip_requests")).collect();
    assert_eq!(took.iter().sum::<u64>(), 24, "{took:?}");
    assert!(
        took.iter().filter(|n| **n > 0).count() >= 2,
        "24 source ports all entered one node: {took:?}"
    );
    // TCP through the shared address.
    let mut tcp = TcpStream::connect(sip_sprayer).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let via = format!("TCP {}", tcp.local_addr().unwrap());
    tcp.write_all(
        request(
            "OPTIONS",
            "alice",
            "shared-tag",
            "shared-call",
            25,
            &via,
            "",
        )
        .as_bytes(),
    )
    .unwrap();
    let a = read_tcp_answer(&mut tcp);
    assert_eq!(
        (a.status, a.served_by()),
        (200, want.as_str()),
        "{}",
        a.text
    );
    // A dialog entering through the shared address is recorded there.
    let uac = Uac::new();
    let ok = uac.final_answer(
        sip_sprayer,
        &request(
            "INVITE",
            "alice",
            "shared-tag",
            "shared-call",
            26,
            &uac.via(),
            "",
        ),
    );
    assert_eq!(ok.status, 200, "{}", ok.text);
    let rr = route_of(&ok);
    assert!(
        rr.starts_with(&format!("<sip:{sip_sprayer};transport=udp;lr;")),
        "{rr}"
    );
    assert!(rr.contains(&format!("peerlb-owner={want};")), "{rr}");
    assert!(
        ok.header("contact")
            .is_some_and(|c| c.ends_with(&format!(";peerlb-owner={want}>"))),
        "{}",
        ok.text
    );
}

/// A bad `sip_sprayer_addr` (or `--shared-sip-listen`) exits 64 naming it,
/// before anything is bound.
#[test]
fn a_bad_shared_sip_address_exits_64_naming_the_field() {
    let dir = temp_dir("sip-shared-config");
    let (http, sip) = (free_port(), free_port());
    let node = format!(
        "[[nodes]]\nid = \"n1\"\nhttp_addr = \"127.0.0.1:{http}\"\npeer_addr = \"127.0.0.1:{}\"\n\
         gossip_addr = \"127.0.0.1:{}\"\nsip_addr = \"127.0.0.1:{sip}\"\n",
        free_port(),
        free_port()
    );
    for (head, flag, says) in [
        (
            "sip_sprayer_addr = \"nowhere\"",
            None,
            "sip_sprayer_addr: \"nowhere\"",
        ),
        (
            "sip_sprayer_addr = \"127.0.0.1:0\"",
            None,
            "sip_sprayer_addr: 127.0.0.1:0: port 0",
        ),
        (
            "sip_sprayer_addr = \"0.0.0.0:5060\"",
            None,
            "sip_sprayer_addr: 0.0.0.0:5060: clients are sent",
        ),
        (
            &*format!("sip_sprayer_addr = \"127.0.0.1:{sip}\""),
            None,
            &*format!("sip_sprayer_addr: 127.0.0.1:{sip} is also nodes[0].sip_addr"),
        ),
        (
            "sprayer_addr = \"127.0.0.1:7\"\nsip_sprayer_addr = \"127.0.0.1:7\"",
            None,
            "sip_sprayer_addr: 127.0.0.1:7 is also sprayer_addr",
        ),
        (
            "",
            Some(format!("127.0.0.1:{http}")),
            "--shared-sip-listen: 127.0.0.1:",
        ),
        ("", Some("bad".to_owned()), "--shared-sip-listen: \"bad\""),
    ] {
        let file = write(&dir, "bad.toml", &format!("{head}\n{node}"));
        let mut args = vec!["node".to_owned(), "--node".into(), "n1".into()];
        if let Some(f) = &flag {
            args.extend(["--shared-sip-listen".to_owned(), f.clone()]);
        }
        let runs: Vec<Vec<String>> = if flag.is_some() {
            vec![args]
        } else {
            vec![vec!["check-config".to_owned()], args]
        };
        for args in runs {
            let out = std::process::Command::new(bin())
                .args(&args)
                .arg("--config")
                .arg(&file)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(64), "{head} {args:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains(says), "{head} {args:?}: {err}\nwanted {says}");
        }
    }
    // A node without a sip_addr cannot join the shared SIP address.
    let plain = write(
        &dir,
        "plain.toml",
        &node.replace(&format!("sip_addr = \"127.0.0.1:{sip}\"\n"), ""),
    );
    let out = std::process::Command::new(bin())
        .args([
            "node",
            "--node",
            "n1",
            "--shared-sip-listen",
            "127.0.0.1:5999",
            "--config",
        ])
        .arg(&plain)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--shared-sip-listen: this node has no sip_addr"),
        "{err}"
    );
    // With no node serving SIP, a SIP sprayer address is an error too.
    let none = write(
        &dir,
        "none.toml",
        &format!(
            "sip_sprayer_addr = \"127.0.0.1:5999\"\n{}",
            node.replace(&format!("sip_addr = \"127.0.0.1:{sip}\"\n"), "")
        ),
    );
    let out = std::process::Command::new(bin())
        .args(["check-config", "--config"])
        .arg(&none)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("sip_sprayer_addr: no node has a sip_addr")
    );
}
