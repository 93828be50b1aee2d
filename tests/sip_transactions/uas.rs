//! The strict SIP server of `tests/sip_transactions.rs` ([`StrictUas`]),
//! over UDP or TCP, and the caller's side: requests, their CANCEL and
//! ACK, answers gathered with when they came, SIP over a TCP stream.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The value of header `name` (full name, case-insensitive) in `text`.
pub(crate) fn header<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    all_headers(text, name).into_iter().next()
}

pub(crate) fn all_headers<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    let head = text.split("\r\n\r\n").next().unwrap_or("");
    head.lines()
        .skip(1)
        .filter_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
        .collect()
}

pub(crate) fn status(text: &str) -> u16 {
    text.strip_prefix("SIP/2.0 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not a SIP response: {text:?}"))
}

pub(crate) fn top_branch(text: &str) -> String {
    all_headers(text, "via")
        .first()
        .and_then(|v| v.split(';').find_map(|p| p.trim().strip_prefix("branch=")))
        .unwrap_or("")
        .to_owned()
}

pub(crate) fn cseq_method(text: &str) -> &str {
    header(text, "cseq")
        .and_then(|c| c.split_whitespace().nth(1))
        .unwrap_or("")
}

/// One datagram the server received or sent, with when.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) at: Instant,
    /// Received (`true`) or sent by the server.
    pub(crate) received: bool,
    pub(crate) text: String,
}

/// An INVITE server transaction of [`StrictUas`] (RFC 3261 17.2.1).
pub(crate) struct InviteTx {
    /// Where its answers go (a UDP source, or a TCP connection's number).
    pub(crate) from: Peer,
    pub(crate) text: String,
    /// The final status sent, once sent.
    pub(crate) final_status: Option<u16>,
    /// The 180s still to send (`long@`), and when the next one is due.
    pub(crate) rings_left: u32,
    pub(crate) next_ring: Instant,
}

/// Where an answer of [`StrictUas`] goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Peer {
    Udp(SocketAddr),
    Tcp(usize),
}

/// The server transactions of [`StrictUas`], whatever the transport.
#[derive(Default)]
pub(crate) struct Core {
    pub(crate) invites: BTreeMap<String, InviteTx>,
    /// The last answer of each non-INVITE server transaction, by (branch,
    /// method).
    pub(crate) others: BTreeMap<(String, String), String>,
}

impl Core {
    /// The answers due by now (the rings of `long@` calls).
    pub(crate) fn tick(&mut self, contact: SocketAddr) -> Vec<(Peer, String)> {
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
    pub(crate) fn take(
        &mut self,
        text: &str,
        from: Peer,
        contact: SocketAddr,
    ) -> Vec<(Peer, String)> {
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
/// its answers to one fixed proxy address, not to the `Via`). Over UDP
/// [`StrictUas::send_to`] sends a request of the server's own (a BYE
/// toward a caller) from its socket.
pub(crate) struct StrictUas {
    pub(crate) addr: SocketAddr,
    pub(crate) udp: Option<UdpSocket>,
    pub(crate) seen: Arc<Mutex<Vec<Seen>>>,
    pub(crate) answer_to: Arc<Mutex<Option<SocketAddr>>>,
    pub(crate) stop: Arc<AtomicBool>,
}

impl StrictUas {
    pub(crate) fn start() -> StrictUas {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let addr = sock.local_addr().unwrap();
        let mut uas = StrictUas::new(addr);
        uas.udp = Some(sock.try_clone().unwrap());
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
    pub(crate) fn start_tcp() -> StrictUas {
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

    pub(crate) fn new(addr: SocketAddr) -> StrictUas {
        StrictUas {
            addr,
            udp: None,
            seen: Arc::default(),
            answer_to: Arc::default(),
            stop: Arc::default(),
        }
    }

    /// Sends `text`, a request of the server's own, to `to` from its UDP
    /// socket (recorded as sent); its answers are recorded as received.
    pub(crate) fn send_to(&self, text: &str, to: SocketAddr) {
        let udp = self.udp.as_ref().expect("a UDP server");
        udp.send_to(text.as_bytes(), to).unwrap();
        self.seen.lock().unwrap().push(Seen {
            at: Instant::now(),
            received: false,
            text: text.to_owned(),
        });
    }

    /// The answers of `status_code` to `method` of call `call` the server
    /// received.
    pub(crate) fn received(&self, status_code: u16, method: &str, call: &str) -> Vec<String> {
        self.seen()
            .into_iter()
            .filter(|s| {
                s.received
                    && s.text.starts_with("SIP/2.0 ")
                    && status(&s.text) == status_code
                    && cseq_method(&s.text) == method
                    && header(&s.text, "call-id") == Some(call)
            })
            .map(|s| s.text)
            .collect()
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The requests of `method` with Call-ID `call` the server received.
    pub(crate) fn requests(&self, method: &str, call: &str) -> Vec<String> {
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
    pub(crate) fn sent(&self, status_code: u16, method: &str, call: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| {
                !s.received
                    && s.text.starts_with("SIP/2.0 ")
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
pub(crate) fn answer(req: &str, code: u16, contact: SocketAddr) -> String {
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
pub(crate) fn request(
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
pub(crate) fn cancel_of(invite: &str) -> String {
    let n = header(invite, "cseq").unwrap().split(' ').next().unwrap();
    invite
        .replacen("INVITE sip:", "CANCEL sip:", 1)
        .replace(&format!("CSeq: {n} INVITE"), &format!("CSeq: {n} CANCEL"))
}

/// The ACK of a non-2xx final `resp` to `invite` (17.1.1.3: the INVITE's
/// top Via and Request-URI, the answer's To).
pub(crate) fn ack_of(invite: &str, resp: &str) -> String {
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
pub(crate) fn gather(
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
pub(crate) fn has_final(answers: &[(Instant, String)], method: &str) -> bool {
    answers
        .iter()
        .any(|(_, a)| status(a) >= 200 && cseq_method(a) == method)
}

/// The statuses of the answers to `method`, in order.
pub(crate) fn statuses(answers: &[(Instant, String)], method: &str) -> Vec<u16> {
    answers
        .iter()
        .filter(|(_, a)| cseq_method(a) == method)
        .map(|(_, a)| status(a))
        .collect()
}

/// SIP messages read from a TCP stream, framed by Content-Length.
pub(crate) struct TcpReader {
    pub(crate) tcp: TcpStream,
    pub(crate) buf: Vec<u8>,
}

impl TcpReader {
    pub(crate) fn connect(to: SocketAddr) -> TcpReader {
        let tcp = TcpStream::connect(to).unwrap();
        TcpReader {
            tcp,
            buf: Vec::new(),
        }
    }

    pub(crate) fn send(&mut self, text: &str) {
        self.tcp.write_all(text.as_bytes()).unwrap();
    }

    /// The next message within `limit`, or `None`.
    pub(crate) fn next(&mut self, limit: Duration) -> Option<(Instant, String)> {
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
