//! An upstream SIP app (`sip_app = "udp:<ip>:<port>"`): real `peerlb`
//! processes on loopback and a small fake user agent server (UAS) in this
//! test. The owner forwards each request it owns to the fake with its own
//! `Via` on top, and the fake's answers reach the client through the entry;
//! the owner ACKs a non-2xx answer itself; an upstream that does not answer
//! gets `408` after retransmissions, a closed port `503`; a bad `sip_app`
//! exits 64 before anything is bound. A BYE the upstream sends (the
//! callee hangs up) reaches the caller and the caller's 200 the upstream;
//! after the owner dies, a re-INVITE moves the dialog to the next ring
//! node, whose mark in the `Contact` keeps the dialog there once the old
//! owner is back.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;
// The SIP text helpers of the strict server's tests; the rest of that
// module (the strict server itself) is not used here.
#[allow(dead_code)]
#[path = "sip_transactions/uas.rs"]
mod uas;

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::*;
use uas::{all_headers, header, status};

/// A fake UAS on an ephemeral loopback UDP port, answering from a
/// thread until dropped: INVITE `100`, `180`, `200` (to user `busy`:
/// `100`, `486`), BYE and OPTIONS `200`, ACK nothing. Answers copy `Via`,
/// `Record-Route`, `From`, `To` (with tag `fake`), `Call-ID` and `CSeq`
/// (RFC 3261 8.2.6.2, 12.1.1) and carry `X-Fake-Uas: yes`; an INVITE's
/// `180` and `200` carry `Contact: <sip:bob@<its address>>`. Every
/// datagram received (requests and responses) is kept, with its source
/// address. While `hold_bye` is set a BYE is kept but not answered. An
/// INVITE for `ring@` rings (100, 180) and never answers finally. A
/// CANCEL is matched strictly to the INVITE transaction by its top `Via`
/// branch (RFC 3261 9.2): `200` when an INVITE with that branch was seen,
/// else `481 Call/Transaction Does Not Exist`.
/// [`FakeUas::send`] sends a request of its own from the same socket.
struct FakeUas {
    addr: SocketAddr,
    sock: UdpSocket,
    seen: Arc<Mutex<Vec<String>>>,
    sources: Arc<Mutex<Vec<SocketAddr>>>,
    hold_bye: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl FakeUas {
    fn start() -> FakeUas {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let addr = sock.local_addr().unwrap();
        let sender = sock.try_clone().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let sources = Arc::new(Mutex::new(Vec::new()));
        let hold_bye = Arc::new(AtomicBool::new(false));
        let (s, st, src, hold) = (
            seen.clone(),
            stop.clone(),
            sources.clone(),
            hold_bye.clone(),
        );
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            let mut invites = std::collections::BTreeSet::new();
            let top_branch = |text: &str| {
                all_headers(text, "via")
                    .first()
                    .and_then(|v| v.split(';').find_map(|p| p.trim().strip_prefix("branch=")))
                    .unwrap_or("")
                    .to_owned()
            };
            while !st.load(Ordering::Relaxed) {
                let Ok((n, from)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                s.lock().unwrap().push(text.clone());
                src.lock().unwrap().push(from);
                let method = text.split(' ').next().unwrap_or("").to_owned();
                if method == "BYE" && hold.load(Ordering::Relaxed) {
                    continue;
                }
                if method == "INVITE" {
                    invites.insert(top_branch(&text));
                }
                let codes: &[(u16, &str)] = match method.as_str() {
                    "CANCEL" if invites.contains(&top_branch(&text)) => &[(200, "OK")],
                    "CANCEL" => &[(481, "Call/Transaction Does Not Exist")],
                    "INVITE" if text.starts_with("INVITE sip:ring@") => {
                        &[(100, "Trying"), (180, "Ringing")]
                    }
                    "INVITE" if text.starts_with("INVITE sip:busy@") => {
                        &[(100, "Trying"), (486, "Busy Here")]
                    }
                    "INVITE" => &[(100, "Trying"), (180, "Ringing"), (200, "OK")],
                    "BYE" | "OPTIONS" => &[(200, "OK")],
                    _ => &[],
                };
                for (code, reason) in codes {
                    let mut r = format!("SIP/2.0 {code} {reason}\r\n");
                    for name in ["via", "record-route", "from", "call-id", "cseq"] {
                        for v in all_headers(&text, name) {
                            r += &format!("{name}: {v}\r\n");
                        }
                    }
                    let to = header(&text, "to").unwrap_or("");
                    if *code == 100 || to.contains(";tag=") {
                        r += &format!("To: {to}\r\n");
                    } else {
                        r += &format!("To: {to};tag=fake\r\n");
                    }
                    if method == "INVITE" && (101..300).contains(code) {
                        r += &format!("Contact: <sip:bob@{addr}>\r\n");
                    }
                    r += "X-Fake-Uas: yes\r\nContent-Length: 0\r\n\r\n";
                    let _ = sock.send_to(r.as_bytes(), from);
                }
            }
        });
        FakeUas {
            addr,
            sock: sender,
            seen,
            sources,
            hold_bye,
            stop,
        }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    /// Sends `text` to `to` from the fake's own socket.
    fn send(&self, text: &str, to: SocketAddr) {
        self.sock.send_to(text.as_bytes(), to).unwrap();
    }

    /// The Request-URIs of the requests whose Call-ID is `call` and whose
    /// method is `method`, in order.
    fn uris_of(&self, method: &str, call: &str) -> Vec<String> {
        self.seen()
            .iter()
            .filter(|t| t.starts_with(&format!("{method} ")) && header(t, "call-id") == Some(call))
            .map(|t| t.split(' ').nth(1).unwrap_or("").to_owned())
            .collect()
    }

    /// The source addresses of the requests whose Call-ID is `call` and
    /// whose method is `method`.
    fn sources_of(&self, method: &str, call: &str) -> Vec<SocketAddr> {
        let seen = self.seen.lock().unwrap();
        let sources = self.sources.lock().unwrap();
        seen.iter()
            .zip(sources.iter())
            .filter(|(t, _)| t.starts_with(method) && header(t, "call-id") == Some(call))
            .map(|(_, a)| *a)
            .collect()
    }
}

impl Drop for FakeUas {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Sends `text` from `sock` to `to` and returns the answers until a final
/// one (>= 200), waiting at most `limit` in all.
fn exchange(sock: &UdpSocket, to: SocketAddr, text: &str, limit: Duration) -> Vec<String> {
    sock.send_to(text.as_bytes(), to).unwrap();
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 65_536];
    while Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        sock.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        let Ok((n, _)) = sock.recv_from(&mut buf) else {
            break;
        };
        let a = String::from_utf8_lossy(&buf[..n]).into_owned();
        let last = status(&a) >= 200;
        out.push(a);
        if last {
            break;
        }
    }
    out
}

fn request(
    method: &str,
    to_user: &str,
    call_id: &str,
    cseq: u32,
    via: SocketAddr,
    extra: &str,
) -> String {
    format!(
        "{method} sip:{to_user}@test SIP/2.0\r\n\
         Via: SIP/2.0/UDP {via};branch=z9hG4bK{call_id}{cseq}{method};rport\r\n\
         Max-Forwards: 70\r\nFrom: <sip:alice@test>;tag=a{call_id}\r\n\
         To: <sip:{to_user}@test>{extra}\r\nCall-ID: {call_id}\r\nCSeq: {cseq} {method}\r\n\
         Contact: <sip:alice@{via}>\r\nContent-Length: 0\r\n\r\n"
    )
}

#[test]
fn an_upstream_sip_app_gets_the_owned_requests_and_its_answers_reach_the_client() {
    let fake = FakeUas::start();
    let c = Cluster::start_sip(
        "sip-upstream",
        3,
        &format!("sip_app = \"udp:{}\"", fake.addr),
        "",
    );
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let me = client.local_addr().unwrap();
    for (i, node) in c.nodes.iter().enumerate() {
        let entry = node.sip.unwrap();
        let call = format!("up{i}");
        let answers = exchange(
            &client,
            entry,
            &request("INVITE", "bob", &call, 1, me, ""),
            Duration::from_secs(20),
        );
        // The entry's own 100 at once (RFC 3261 16.2); the upstream's is
        // not relayed (16.7 step 5).
        let statuses: Vec<u16> = answers.iter().map(|a| status(a)).collect();
        assert_eq!(statuses, [100, 180, 200], "{answers:?}");
        assert_eq!(header(&answers[0], "x-fake-uas"), None, "{answers:?}");
        let ok = &answers[2];
        assert_eq!(header(ok, "x-fake-uas"), Some("yes"), "{ok}");
        // Only the client's own Via is left, with where the entry saw it
        // come from (RFC 3581: `received`, and `rport` filled in).
        assert_eq!(
            all_headers(ok, "via"),
            [format!(
                "SIP/2.0/UDP {me};branch=z9hG4bK{call}1INVITE;received={};rport={}",
                me.ip(),
                me.port()
            )]
        );
        let rr = header(ok, "record-route").expect("the entry's Record-Route, copied by the UAS");
        assert!(rr.contains("peerlb-owner="), "{rr}");

        // What reached the fake: the owner's Via on top of the client's.
        let invite = fake
            .seen()
            .into_iter()
            .find(|t| t.starts_with("INVITE") && header(t, "call-id") == Some(call.as_str()))
            .expect("the INVITE reached the upstream");
        let vias = all_headers(&invite, "via");
        assert!(vias[0].contains(";branch=z9hG4bK-plbo-"), "{invite}");
        assert!(vias.last().unwrap().contains(&me.to_string()), "{invite}");
        assert_eq!(header(&invite, "max-forwards"), Some("69"), "{invite}");

        // The dialog goes on through another entry: ACK (no answer) and BYE.
        let other = c.nodes[(i + 1) % 3].sip.unwrap();
        let route = format!("\r\nRoute: {rr}");
        let ack = request("ACK", "bob", &call, 1, me, ";tag=fake")
            .replace("\r\nCall-ID", &format!("{route}\r\nCall-ID"));
        client.send_to(ack.as_bytes(), other).unwrap();
        let bye = request("BYE", "bob", &call, 2, me, ";tag=fake")
            .replace("\r\nCall-ID", &format!("{route}\r\nCall-ID"));
        let answers = exchange(&client, other, &bye, Duration::from_secs(20));
        assert_eq!(
            answers.iter().map(|a| status(a)).collect::<Vec<_>>(),
            [200],
            "{answers:?}"
        );
        assert_eq!(header(answers.last().unwrap(), "x-fake-uas"), Some("yes"));
        poll(Duration::from_secs(10), || {
            fake.seen()
                .iter()
                .any(|t| t.starts_with("ACK") && header(t, "call-id") == Some(call.as_str()))
        })
        .expect("the client's ACK reached the upstream");
        // One socket per owner: the dialog's requests all come from the
        // address its INVITE came from (a UAS such as SIPp's answers there).
        let from: Vec<SocketAddr> = ["INVITE", "ACK", "BYE"]
            .iter()
            .flat_map(|m| fake.sources_of(m, &call))
            .collect();
        assert!(from.iter().all(|a| *a == from[0]), "{from:?}");
    }

    // A 486 reaches the client, and the owner ACKs it upstream itself
    // (RFC 3261 17.1.1.3) with its INVITE's branch.
    let answers = exchange(
        &client,
        c.nodes[0].sip.unwrap(),
        &request("INVITE", "busy", "busy1", 1, me, ""),
        Duration::from_secs(20),
    );
    assert_eq!(
        answers.iter().map(|a| status(a)).collect::<Vec<_>>(),
        [100, 486],
        "{answers:?}"
    );
    poll(Duration::from_secs(10), || {
        fake.seen()
            .iter()
            .any(|t| t.starts_with("ACK") && header(t, "call-id") == Some("busy1"))
    })
    .expect("the owner ACKed the 486");
    let seen = fake.seen();
    let branch = |t: &String| {
        all_headers(t, "via")[0]
            .split(";branch=")
            .nth(1)
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_owned()
    };
    let invite = seen
        .iter()
        .find(|t| t.starts_with("INVITE") && header(t, "call-id") == Some("busy1"))
        .unwrap();
    let ack = seen
        .iter()
        .find(|t| t.starts_with("ACK") && header(t, "call-id") == Some("busy1"))
        .unwrap();
    assert_eq!(branch(ack), branch(invite), "{ack}");
    assert_eq!(header(ack, "cseq"), Some("1 ACK"));
    assert_eq!(header(ack, "to"), Some("<sip:busy@test>;tag=fake"));
}

/// A client's retransmission that reaches the owner while its
/// transaction is in flight joins it: the upstream sees one transaction
/// (every copy from one source port) and both requests get its answer.
#[test]
fn a_retransmission_in_flight_joins_the_owners_transaction() {
    let fake = FakeUas::start();
    let c = Cluster::start_sip(
        "sip-upstream-retrans",
        1,
        &format!("sip_app = \"udp:{}\"", fake.addr),
        "",
    );
    let entry = c.nodes[0].sip.unwrap();
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let me = client.local_addr().unwrap();
    let answers = exchange(
        &client,
        entry,
        &request("INVITE", "bob", "rt", 1, me, ""),
        Duration::from_secs(20),
    );
    assert_eq!(
        answers.iter().map(|a| status(a)).collect::<Vec<_>>(),
        [100, 180, 200]
    );
    fake.hold_bye.store(true, Ordering::Relaxed);
    let bye = request("BYE", "bob", "rt", 2, me, ";tag=fake");
    client.send_to(bye.as_bytes(), entry).unwrap();
    poll(Duration::from_secs(10), || {
        !fake.sources_of("BYE", "rt").is_empty()
    })
    .expect("the BYE reached the upstream");
    let before = counter(c.nodes[0].http, "sip_requests");
    client.send_to(bye.as_bytes(), entry).unwrap();
    poll(Duration::from_secs(10), || {
        counter(c.nodes[0].http, "sip_requests") > before
    })
    .expect("the node took the retransmission");
    // The owner's own resend (Timer E) is answered now.
    fake.hold_bye.store(false, Ordering::Relaxed);
    client
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut buf = vec![0u8; 65_536];
    for _ in 0..2 {
        let (n, _) = client.recv_from(&mut buf).expect("an answer to each copy");
        assert_eq!(status(&String::from_utf8_lossy(&buf[..n])), 200);
    }
    let ports = fake.sources_of("BYE", "rt");
    assert!(ports.len() >= 2, "{ports:?}");
    assert!(
        ports.iter().all(|p| *p == ports[0]),
        "copies from several ports: {ports:?}"
    );
}

#[test]
fn a_silent_upstream_gets_408_after_retransmissions_and_a_closed_port_503() {
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    // The owner waits half of response_timeout_ms for a final answer.
    let c = Cluster::start_sip(
        "sip-upstream-silent",
        1,
        &format!("sip_app = \"udp:{addr}\"\n[limits]\nresponse_timeout_ms = 3000\n"),
        "",
    );
    let entry = c.nodes[0].sip.unwrap();
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let me = client.local_addr().unwrap();
    let answers = exchange(
        &client,
        entry,
        &request("OPTIONS", "bob", "quiet", 1, me, ""),
        Duration::from_secs(20),
    );
    assert_eq!(
        answers.iter().map(|a| status(a)).collect::<Vec<_>>(),
        [408],
        "{answers:?}"
    );
    assert_eq!(header(&answers[0], "peerlb-served-by"), Some("n1"));
    // The request was sent, then resent (Timer E: 500 ms, then 1 s).
    silent
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buf = vec![0u8; 65_536];
    let mut copies = 0;
    while let Ok(n) = silent.recv(&mut buf) {
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("OPTIONS sip:bob@test"));
        copies += 1;
    }
    assert!(copies >= 2, "the upstream got {copies} copies");

    drop(silent);
    let answers = exchange(
        &client,
        entry,
        &request("OPTIONS", "bob", "closed", 1, me, ""),
        Duration::from_secs(20),
    );
    assert_eq!(
        answers.iter().map(|a| status(a)).collect::<Vec<_>>(),
        [503],
        "{answers:?}"
    );
}

#[test]
fn a_bad_sip_app_exits_64_naming_the_field() {
    let dir = temp_dir("sip-app-config");
    for (value, says) in [
        (
            "sctp:127.0.0.1:5070",
            "sip_app: \"sctp:127.0.0.1:5070\" is none of \"builtin\", udp:<ip>:<port>, tcp:<ip>:<port>, tls:<ip>:<port>",
        ),
        (
            "tls:127.0.0.1:5070",
            "sips.upstream_ca: is required with sip_app = \"tls:...\"",
        ),
        (
            "tcp:127.0.0.1:0",
            "sip_app: \"tcp:127.0.0.1:0\": 127.0.0.1:0 cannot be sent to",
        ),
        (
            "udp:nowhere:5070",
            "sip_app: \"udp:nowhere:5070\": \"nowhere:5070\" is not an ip:port",
        ),
        (
            "udp:127.0.0.1:0",
            "sip_app: \"udp:127.0.0.1:0\": 127.0.0.1:0 cannot be sent to",
        ),
        (
            "udp:0.0.0.0:5070",
            "sip_app: \"udp:0.0.0.0:5070\": 0.0.0.0:5070 cannot be sent to",
        ),
    ] {
        let file = write(
            &dir,
            "bad.toml",
            &format!(
                "sip_app = \"{value}\"\n[[nodes]]\nid = \"n1\"\nhttp_addr = \"127.0.0.1:{}\"\npeer_addr = \"127.0.0.1:{}\"\ngossip_addr = \"127.0.0.1:{}\"\n",
                free_port(),
                free_port(),
                free_port()
            ),
        );
        for args in [
            vec!["check-config", "--config"],
            vec!["node", "--node", "n1", "--config"],
        ] {
            let out = std::process::Command::new(bin())
                .args(&args)
                .arg(&file)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(64), "{value} {args:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains(says), "{value} {args:?}: {err}");
        }
    }
}

/// The URI inside a `Contact` value's `<>`.
fn contact_uri(contact: &str) -> &str {
    let a = contact.find('<').expect("a name-addr");
    let b = contact.rfind('>').expect("a name-addr");
    &contact[a + 1..b]
}

/// `text` (from [`request`]) with `uri` as its Request-URI and `extra`
/// header lines before `Call-ID`.
fn retarget(text: &str, uri: &str, extra: &str) -> String {
    let (line, rest) = text.split_once("\r\n").unwrap();
    let method = line.split(' ').next().unwrap();
    format!("{method} {uri} SIP/2.0\r\n{rest}").replacen(
        "\r\nCall-ID",
        &format!("{extra}\r\nCall-ID"),
        1,
    )
}

/// The callee hangs up (RFC 3261 15.1.1): the fake UAS sends a BYE, to the
/// address the dialog's requests came from (the owner's socket, as SIPp's
/// `uas` does) or to a node's `sip_addr` (as a UAS following the
/// `Record-Route` does). The owner (or that node) relays it to the caller
/// as a stateful proxy: the cluster's `Route` removed, `Max-Forwards`
/// down by one, its own `Via` on top naming the socket it sent from; the
/// caller's 200 goes back to the upstream with only the upstream's `Via`.
#[test]
fn a_bye_from_the_upstream_reaches_the_caller_and_the_callers_200_the_upstream() {
    let fake = FakeUas::start();
    let c = Cluster::start_sip(
        "sip-upstream-bye",
        3,
        &format!("sip_app = \"udp:{}\"", fake.addr),
        "",
    );
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let me = client.local_addr().unwrap();
    for (k, call) in ["callee-bye-1", "callee-bye-2"].into_iter().enumerate() {
        let entry = c.nodes[k].sip.unwrap();
        let answers = exchange(
            &client,
            entry,
            &request("INVITE", "bob", call, 1, me, ""),
            Duration::from_secs(20),
        );
        assert_eq!(
            answers.iter().map(|a| status(a)).collect::<Vec<_>>(),
            [100, 180, 200]
        );
        let rr = header(&answers[2], "record-route").unwrap().to_owned();
        let ack = request("ACK", "bob", call, 1, me, ";tag=fake")
            .replace("\r\nCall-ID", &format!("\r\nRoute: {rr}\r\nCall-ID"));
        client.send_to(ack.as_bytes(), entry).unwrap();
        poll(Duration::from_secs(10), || {
            !fake.sources_of("ACK", call).is_empty()
        })
        .expect("the ACK reached the upstream");
        let owner_socket = fake.sources_of("INVITE", call)[0];
        // The first BYE goes where the dialog's requests came from, the
        // second to another node's sip_addr.
        let to = if k == 0 {
            owner_socket
        } else {
            c.nodes[2].sip.unwrap()
        };
        let fake_via = format!("SIP/2.0/UDP {};branch=z9hG4bKfakebye{k}", fake.addr);
        let bye = format!(
            "BYE sip:alice@{me} SIP/2.0\r\nVia: {fake_via}\r\nRoute: {rr}\r\nMax-Forwards: 70\r\n\
             From: <sip:bob@test>;tag=fake\r\nTo: <sip:alice@test>;tag=a{call}\r\nCall-ID: {call}\r\n\
             CSeq: 1 BYE\r\nContent-Length: 0\r\n\r\n"
        );
        fake.send(&bye, to);
        client
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut buf = vec![0u8; 65_536];
        let (n, from) = client
            .recv_from(&mut buf)
            .expect("the BYE reaches the caller");
        let got = String::from_utf8_lossy(&buf[..n]).into_owned();
        assert!(
            got.starts_with(&format!("BYE sip:alice@{me} SIP/2.0\r\n")),
            "{got}"
        );
        let vias = all_headers(&got, "via");
        assert_eq!(vias.len(), 2, "{got}");
        assert!(
            vias[0].starts_with(&format!("SIP/2.0/UDP {from};branch=z9hG4bK-plbc-")),
            "the relay's Via names the socket it sent from ({from}): {got}"
        );
        assert_eq!(vias[1], fake_via);
        assert_eq!(
            header(&got, "route"),
            None,
            "the cluster's own Route is gone: {got}"
        );
        assert_eq!(header(&got, "max-forwards"), Some("69"));
        assert_eq!(header(&got, "call-id"), Some(call));
        // The caller answers to the top Via (its sent-by: the source).
        let mut ok = String::from("SIP/2.0 200 OK\r\n");
        for v in &vias {
            ok += &format!("Via: {v}\r\n");
        }
        for name in ["from", "to", "call-id", "cseq"] {
            ok += &format!("{name}: {}\r\n", header(&got, name).unwrap());
        }
        ok += "Content-Length: 0\r\n\r\n";
        client.send_to(ok.as_bytes(), from).unwrap();
        let answered = |t: &String| {
            t.starts_with("SIP/2.0 200")
                && header(t, "call-id") == Some(call)
                && header(t, "cseq") == Some("1 BYE")
        };
        poll(Duration::from_secs(10), || fake.seen().iter().any(answered))
            .expect("the caller's 200 reaches the upstream");
        let relayed = fake.seen().into_iter().find(answered).unwrap();
        assert_eq!(
            all_headers(&relayed, "via"),
            [fake_via.as_str()],
            "{relayed}"
        );
    }
}

/// Failover rewrites the dialog's owner (RFC 3261 12.2.1.2 target
/// refresh): the owner relays the upstream's 200 with its own id in the
/// Contact URI; once it is killed, a re-INVITE naming it (Request-URI and
/// Route) goes to the next ring node of the dialog's key, whose 200 names
/// itself; after the old owner is back, the BYE (Request-URI from the new
/// Contact, Route still naming the old owner) goes to the new one. The
/// upstream never sees the mark: it gets its own Contact as Request-URI.
#[test]
fn after_a_failover_a_reinvite_moves_the_dialog_and_it_stays_when_the_old_owner_returns() {
    let fake = FakeUas::start();
    let mut c = Cluster::start_sip(
        "sip-upstream-failover",
        3,
        &format!("sip_app = \"udp:{}\"", fake.addr),
        "",
    );
    let ids = ["n1", "n2", "n3"];
    let ring = ring(&ids, 1024);
    // A call that n1 (the entry, which stays up) does not own.
    let call = (0..)
        .map(|i| format!("moving-{i}"))
        .find(|call| *ring.owner(&format!("a{call}|{call}")).unwrap() != "n1")
        .unwrap();
    let key = format!("a{call}|{call}");
    let owner = ring.owner(&key).unwrap().to_string();
    let next = ring.candidates(&key).nth(1).unwrap().to_string();
    let entry = c.node("n1").sip.unwrap();
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let me = client.local_addr().unwrap();
    let answers = exchange(
        &client,
        entry,
        &request("INVITE", "bob", &call, 1, me, ""),
        Duration::from_secs(20),
    );
    assert_eq!(
        answers.iter().map(|a| status(a)).collect::<Vec<_>>(),
        [100, 180, 200]
    );
    let contact = header(&answers[2], "contact").unwrap().to_owned();
    assert_eq!(
        contact,
        format!("<sip:bob@{};peerlb-owner={owner}>", fake.addr)
    );
    let route = format!(
        "\r\nRoute: {}",
        header(&answers[2], "record-route").unwrap()
    );
    let ack = retarget(
        &request("ACK", "bob", &call, 1, me, ";tag=fake"),
        contact_uri(&contact),
        &route,
    );
    client.send_to(ack.as_bytes(), entry).unwrap();
    poll(Duration::from_secs(10), || {
        !fake.sources_of("ACK", &call).is_empty()
    })
    .expect("the ACK reached the upstream");

    c.kill9(&owner);
    c.wait_converged(2);
    let reinvite = retarget(
        &request("INVITE", "bob", &call, 2, me, ";tag=fake"),
        contact_uri(&contact),
        &route,
    );
    let answers = exchange(&client, entry, &reinvite, Duration::from_secs(20));
    assert_eq!(
        answers.iter().map(|a| status(a)).collect::<Vec<_>>(),
        [100, 180, 200],
        "{answers:?}"
    );
    let moved = header(&answers[2], "contact").unwrap().to_owned();
    assert_eq!(
        moved,
        format!("<sip:bob@{};peerlb-owner={next}>", fake.addr)
    );
    let ack = retarget(
        &request("ACK", "bob", &call, 2, me, ";tag=fake"),
        contact_uri(&moved),
        &route,
    );
    client.send_to(ack.as_bytes(), entry).unwrap();

    // The old owner comes back; every node sees it serving.
    let i = c.nodes.iter().position(|n| n.id == owner).unwrap();
    c.spawn(i);
    c.wait_same_view(3);
    let bye = retarget(
        &request("BYE", "bob", &call, 3, me, ";tag=fake"),
        contact_uri(&moved),
        &route,
    );
    let answers = exchange(&client, entry, &bye, Duration::from_secs(20));
    assert_eq!(
        answers.iter().map(|a| status(a)).collect::<Vec<_>>(),
        [200],
        "{answers:?}"
    );
    // Which node relayed what: one upstream socket per node.
    let invites = fake.sources_of("INVITE", &call);
    let (first, moved_to) = (invites[0], *invites.last().unwrap());
    assert_ne!(
        first, moved_to,
        "the re-INVITE came from another node: {invites:?}"
    );
    let byes = fake.sources_of("BYE", &call);
    assert!(
        !byes.is_empty() && byes.iter().all(|b| *b == moved_to),
        "the BYE followed the new owner: {byes:?}, re-INVITE from {moved_to}"
    );
    // The upstream saw its own Contact as the Request-URI, unmarked.
    let plain = format!("sip:bob@{}", fake.addr);
    assert_eq!(fake.uris_of("INVITE", &call).last(), Some(&plain));
    assert!(fake.uris_of("BYE", &call).iter().all(|u| *u == plain));
}

/// RFC 3261 9.1-9.2: a CANCEL that enters through another node than its
/// INVITE (as most do behind a sprayer) reaches the INVITE's owner, which
/// sends it upstream on the INVITE's own branch: the strict server
/// matches it to the INVITE transaction and answers 200, not 481.
#[test]
fn a_cancel_through_another_node_reaches_the_server_on_the_invites_branch() {
    let fake = FakeUas::start();
    let c = Cluster::start_sip(
        "sip-cancel",
        3,
        &format!("sip_app = \"udp:{}\"", fake.addr),
        "",
    );
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let me = client.local_addr().unwrap();
    for (i, (invite_at, cancel_at)) in [(0, 1), (1, 2), (2, 0)].into_iter().enumerate() {
        let call = format!("cancel{i}");
        let invite = request("INVITE", "ring", &call, 1, me, "");
        client
            .send_to(invite.as_bytes(), c.nodes[invite_at].sip.unwrap())
            .unwrap();
        // Ringing at the server (its 180 is relayed with the final answer:
        // provisionals are not yet relayed as they arrive).
        poll(Duration::from_secs(10), || {
            fake.seen()
                .iter()
                .any(|t| t.starts_with("INVITE ") && header(t, "call-id") == Some(call.as_str()))
        })
        .expect("the INVITE reached the server");
        // The CANCEL: the INVITE's Request-URI, Call-ID, From, To, top Via
        // and CSeq number (RFC 3261 9.1), through another node.
        let cancel = invite
            .replacen("INVITE sip:", "CANCEL sip:", 1)
            .replace("CSeq: 1 INVITE", "CSeq: 1 CANCEL");
        let answers = exchange(
            &client,
            c.nodes[cancel_at].sip.unwrap(),
            &cancel,
            Duration::from_secs(10),
        );
        let finals: Vec<u16> = answers
            .iter()
            .filter(|a| header(a, "cseq").is_some_and(|s| s.ends_with("CANCEL")))
            .map(|a| status(a))
            .collect();
        assert_eq!(
            finals,
            [200],
            "n{} -> n{}: {answers:?}",
            invite_at + 1,
            cancel_at + 1
        );
    }
}
