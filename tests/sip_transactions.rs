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

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::*;

/// Timer C in these tests, in ms.
const TIMER_C_MS: u64 = 1_000;

/// The value of header `name` (full name, case-insensitive) in `text`.
fn header<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    all_headers(text, name).into_iter().next()
}

fn all_headers<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    let head = text.split("\r\n\r\n").next().unwrap_or("");
    head.lines()
        .skip(1)
        .filter_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
        .collect()
}

fn status(text: &str) -> u16 {
    text.strip_prefix("SIP/2.0 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not a SIP response: {text:?}"))
}

fn top_branch(text: &str) -> String {
    all_headers(text, "via")
        .first()
        .and_then(|v| v.split(';').find_map(|p| p.trim().strip_prefix("branch=")))
        .unwrap_or("")
        .to_owned()
}

fn cseq_method(text: &str) -> &str {
    header(text, "cseq")
        .and_then(|c| c.split_whitespace().nth(1))
        .unwrap_or("")
}

/// One datagram the server received or sent, with when.
#[derive(Clone, Debug)]
struct Seen {
    at: Instant,
    /// Received (`true`) or sent by the server.
    received: bool,
    text: String,
}

/// An INVITE server transaction of [`StrictUas`] (RFC 3261 17.2.1).
struct InviteTx {
    /// Where its answers go (a UDP source, or a TCP connection's number).
    from: Peer,
    text: String,
    /// The final status sent, once sent.
    final_status: Option<u16>,
    /// The 180s still to send (`long@`), and when the next one is due.
    rings_left: u32,
    next_ring: Instant,
}

/// Where an answer of [`StrictUas`] goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Peer {
    Udp(SocketAddr),
    Tcp(usize),
}

/// The server transactions of [`StrictUas`], whatever the transport.
#[derive(Default)]
struct Core {
    invites: BTreeMap<String, InviteTx>,
    /// The last answer of each non-INVITE server transaction, by (branch,
    /// method).
    others: BTreeMap<(String, String), String>,
}

impl Core {
    /// The answers due by now (the rings of `long@` calls).
    fn tick(&mut self, contact: SocketAddr) -> Vec<(Peer, String)> {
        let now = Instant::now();
        let mut out = Vec::new();
        for tx in self.invites.values_mut() {
            if tx.final_status.is_none() && tx.rings_left > 0 && now >= tx.next_ring {
                tx.rings_left -= 1;
                tx.next_ring = now + Duration::from_millis(300);
                let code = if tx.rings_left == 0 { 200 } else { 180 };
                if code == 200 {
                    tx.final_status = Some(200);
                }
                out.push((tx.from, answer(&tx.text, code, contact)));
            }
        }
        out
    }

    /// The answers to `text` received from `from`.
    fn take(&mut self, text: &str, from: Peer, contact: SocketAddr) -> Vec<(Peer, String)> {
        let method = text.split(' ').next().unwrap_or("").to_owned();
        let branch = top_branch(text);
        let mut out = Vec::new();
        match method.as_str() {
            "SIP/2.0" | "ACK" => {}
            "INVITE" => {
                if let Some(tx) = self.invites.get(&branch) {
                    // A retransmission: the last answer again.
                    let code = tx
                        .final_status
                        .unwrap_or(if tx.rings_left > 0 { 100 } else { 180 });
                    out.push((from, answer(&tx.text, code, contact)));
                    return out;
                }
                out.push((from, answer(text, 100, contact)));
                let (final_status, rings) = if text.starts_with("INVITE sip:busy@") {
                    out.push((from, answer(text, 486, contact)));
                    (Some(486), 0)
                } else if text.starts_with("INVITE sip:long@") {
                    (None, 9)
                } else if text.starts_with("INVITE sip:ring@") {
                    out.push((from, answer(text, 180, contact)));
                    (None, 0)
                } else {
                    out.push((from, answer(text, 180, contact)));
                    out.push((from, answer(text, 200, contact)));
                    (Some(200), 0)
                };
                self.invites.insert(
                    branch,
                    InviteTx {
                        from,
                        text: text.to_owned(),
                        final_status,
                        rings_left: rings,
                        next_ring: Instant::now(),
                    },
                );
            }
            "CANCEL" => {
                let key = (branch.clone(), method.clone());
                if let Some(last) = self.others.get(&key) {
                    out.push((from, last.clone()));
                    return out;
                }
                let ok = match self.invites.get_mut(&branch) {
                    Some(tx) => {
                        if tx.final_status.is_none() {
                            tx.final_status = Some(487);
                            out.push((tx.from, answer(&tx.text, 487, contact)));
                        }
                        answer(text, 200, contact)
                    }
                    None => answer(text, 481, contact),
                };
                out.push((from, ok.clone()));
                self.others.insert(key, ok);
            }
            _ => {
                let a = answer(text, 200, contact);
                out.push((from, a.clone()));
                self.others.insert((branch, method), a);
            }
        }
        out
    }
}

/// A strict user agent server on an ephemeral loopback port (UDP, or TCP
/// with [`StrictUas::start_tcp`]), answering from threads until dropped.
/// Server transactions are keyed by the top `Via` branch (RFC 3261
/// 17.2.3): a retransmitted request gets the transaction's last answer
/// again, and nothing new. INVITE `sip:ring@` rings (100, 180) without
/// end; `sip:long@` answers 100, then 180 every 300 ms eight times, then
/// 200; `sip:busy@` answers 100, 486; any other user 100, 180, 200. A
/// CANCEL whose branch is a pending INVITE's gets 200 and the INVITE 487;
/// one whose branch is an answered INVITE's gets 200 (no effect, 9.2);
/// any other 481. An ACK is only recorded. BYE and OPTIONS get 200.
/// Answers copy `Via`, `Record-Route`, `From`, `To` (tag `uas` on all but
/// 100), `Call-ID` and `CSeq`, and carry `X-Fake-Uas: yes`.
///
/// With [`StrictUas::answer_to`] set, every answer over UDP goes to that
/// address instead of where its request came from (a server that sends
/// its answers to one fixed proxy address, not to the `Via`).
struct StrictUas {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    answer_to: Arc<Mutex<Option<SocketAddr>>>,
    stop: Arc<AtomicBool>,
}

impl StrictUas {
    fn start() -> StrictUas {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let addr = sock.local_addr().unwrap();
        let uas = StrictUas::new(addr);
        let (log, st, fixed) = (uas.seen.clone(), uas.stop.clone(), uas.answer_to.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            let mut core = Core::default();
            let send = |out: Vec<(Peer, String)>| {
                for (to, text) in out {
                    let Peer::Udp(to) = to else { continue };
                    let to = fixed.lock().unwrap().unwrap_or(to);
                    let _ = sock.send_to(text.as_bytes(), to);
                    log.lock().unwrap().push(Seen {
                        at: Instant::now(),
                        received: false,
                        text,
                    });
                }
            };
            while !st.load(Ordering::Relaxed) {
                send(core.tick(addr));
                let Ok((n, from)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                log.lock().unwrap().push(Seen {
                    at: Instant::now(),
                    received: true,
                    text: text.clone(),
                });
                send(core.take(&text, Peer::Udp(from), addr));
            }
        });
        uas
    }

    /// The same server over TCP: each connection read by a thread of its
    /// own, the answers written on the connection the request came in on.
    fn start_tcp() -> StrictUas {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let uas = StrictUas::new(addr);
        let core = Arc::new(Mutex::new(Core::default()));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let send = {
            let (log, conns) = (uas.seen.clone(), conns.clone());
            move |out: Vec<(Peer, String)>| {
                for (to, text) in out {
                    let Peer::Tcp(i) = to else { continue };
                    let _ = conns.lock().unwrap()[i].write_all(text.as_bytes());
                    log.lock().unwrap().push(Seen {
                        at: Instant::now(),
                        received: false,
                        text,
                    });
                }
            }
        };
        let (st, log) = (uas.stop.clone(), uas.seen.clone());
        std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let due = core.lock().unwrap().tick(addr);
                send(due);
                std::thread::sleep(Duration::from_millis(20));
                while let Ok((conn, _)) = listener.accept() {
                    conn.set_nonblocking(false).unwrap();
                    let reader = conn.try_clone().unwrap();
                    let i = {
                        let mut all = conns.lock().unwrap();
                        all.push(conn);
                        all.len() - 1
                    };
                    let (core, send, log) = (core.clone(), send.clone(), log.clone());
                    std::thread::spawn(move || {
                        let mut reader = TcpReader {
                            tcp: reader,
                            buf: Vec::new(),
                        };
                        while let Some((at, text)) = reader.next(Duration::from_secs(3600)) {
                            log.lock().unwrap().push(Seen {
                                at,
                                received: true,
                                text: text.clone(),
                            });
                            let out = core.lock().unwrap().take(&text, Peer::Tcp(i), addr);
                            send(out);
                        }
                    });
                }
            }
        });
        uas
    }

    fn new(addr: SocketAddr) -> StrictUas {
        StrictUas {
            addr,
            seen: Arc::default(),
            answer_to: Arc::default(),
            stop: Arc::default(),
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The requests of `method` with Call-ID `call` the server received.
    fn requests(&self, method: &str, call: &str) -> Vec<String> {
        self.seen()
            .into_iter()
            .filter(|s| {
                s.received
                    && s.text.starts_with(&format!("{method} "))
                    && header(&s.text, "call-id") == Some(call)
            })
            .map(|s| s.text)
            .collect()
    }

    /// The answers of `status` to `method` of call `call` the server
    /// sent, with when.
    fn sent(&self, status_code: u16, method: &str, call: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| {
                !s.received
                    && status(&s.text) == status_code
                    && cseq_method(&s.text) == method
                    && header(&s.text, "call-id") == Some(call)
            })
            .collect()
    }
}

impl Drop for StrictUas {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The server's answer `code` to `req` (RFC 3261 8.2.6.2).
fn answer(req: &str, code: u16, contact: SocketAddr) -> String {
    let reason = match code {
        100 => "Trying",
        180 => "Ringing",
        200 => "OK",
        481 => "Call/Transaction Does Not Exist",
        486 => "Busy Here",
        487 => "Request Terminated",
        _ => "Whatever",
    };
    let mut r = format!("SIP/2.0 {code} {reason}\r\n");
    for name in ["via", "record-route", "from", "call-id", "cseq"] {
        for v in all_headers(req, name) {
            r += &format!("{name}: {v}\r\n");
        }
    }
    let to = header(req, "to").unwrap_or("");
    if code == 100 || to.contains(";tag=") {
        r += &format!("To: {to}\r\n");
    } else {
        r += &format!("To: {to};tag=uas\r\n");
    }
    if req.starts_with("INVITE ") && (101..300).contains(&code) {
        r += &format!("Contact: <sip:uas@{contact}>\r\n");
    }
    r + "X-Fake-Uas: yes\r\nContent-Length: 0\r\n\r\n"
}

/// A request from a caller at `via` over `transport` (`UDP` or `TCP`).
fn request(
    method: &str,
    to_user: &str,
    call: &str,
    cseq: u32,
    (transport, via): (&str, SocketAddr),
    branch: &str,
    to_tag: &str,
) -> String {
    format!(
        "{method} sip:{to_user}@test SIP/2.0\r\n\
         Via: SIP/2.0/{transport} {via};branch=z9hG4bK{branch};rport\r\n\
         Max-Forwards: 70\r\nFrom: <sip:alice@test>;tag=a{call}\r\n\
         To: <sip:{to_user}@test>{to_tag}\r\nCall-ID: {call}\r\nCSeq: {cseq} {method}\r\n\
         Contact: <sip:alice@{via}>\r\nContent-Length: 0\r\n\r\n"
    )
}

/// The CANCEL of `invite` (RFC 3261 9.1: its Request-URI, Call-ID, From,
/// To, top Via and CSeq number).
fn cancel_of(invite: &str) -> String {
    let n = header(invite, "cseq").unwrap().split(' ').next().unwrap();
    invite
        .replacen("INVITE sip:", "CANCEL sip:", 1)
        .replace(&format!("CSeq: {n} INVITE"), &format!("CSeq: {n} CANCEL"))
}

/// The ACK of a non-2xx final `resp` to `invite` (17.1.1.3: the INVITE's
/// top Via and Request-URI, the answer's To).
fn ack_of(invite: &str, resp: &str) -> String {
    let n = header(invite, "cseq").unwrap().split(' ').next().unwrap();
    let to = header(invite, "to").unwrap();
    invite
        .replacen("INVITE sip:", "ACK sip:", 1)
        .replace(&format!("CSeq: {n} INVITE"), &format!("CSeq: {n} ACK"))
        .replace(
            &format!("To: {to}\r\n"),
            &format!("To: {}\r\n", header(resp, "to").unwrap()),
        )
}

/// The answers `sock` receives, with when, until `done` holds for the
/// ones so far or `limit` passed.
fn gather(
    sock: &UdpSocket,
    limit: Duration,
    done: impl Fn(&[(Instant, String)]) -> bool,
) -> Vec<(Instant, String)> {
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 65_536];
    while !done(&out) && Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        sock.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            out.push((
                Instant::now(),
                String::from_utf8_lossy(&buf[..n]).into_owned(),
            ));
        }
    }
    out
}

/// Whether `answers` hold a final answer to `method`.
fn has_final(answers: &[(Instant, String)], method: &str) -> bool {
    answers
        .iter()
        .any(|(_, a)| status(a) >= 200 && cseq_method(a) == method)
}

/// The statuses of the answers to `method`, in order.
fn statuses(answers: &[(Instant, String)], method: &str) -> Vec<u16> {
    answers
        .iter()
        .filter(|(_, a)| cseq_method(a) == method)
        .map(|(_, a)| status(a))
        .collect()
}

/// SIP messages read from a TCP stream, framed by Content-Length.
struct TcpReader {
    tcp: TcpStream,
    buf: Vec<u8>,
}

impl TcpReader {
    fn connect(to: SocketAddr) -> TcpReader {
        let tcp = TcpStream::connect(to).unwrap();
        TcpReader {
            tcp,
            buf: Vec::new(),
        }
    }

    fn send(&mut self, text: &str) {
        self.tcp.write_all(text.as_bytes()).unwrap();
    }

    /// The next message within `limit`, or `None`.
    fn next(&mut self, limit: Duration) -> Option<(Instant, String)> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                let len: usize = header(&format!("{head}\r\n\r\n"), "content-length")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                if self.buf.len() >= end + 4 + len {
                    let msg: Vec<u8> = self.buf.drain(..end + 4 + len).collect();
                    return Some((Instant::now(), String::from_utf8_lossy(&msg).into_owned()));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.tcp.set_read_timeout(Some(left)).unwrap();
            let mut chunk = [0u8; 16 * 1024];
            match self.tcp.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }
}

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
