//! SIP under the limits HTTP connections have: SIP TCP connections count
//! under `limits.max_connections` (per-source share, idle-first closing),
//! so many idle ones at a low open file limit leave the node serving new
//! HTTP and SIP clients; a message trickled in must finish within
//! `limits.header_read_timeout_ms` as a whole; an idle connection is
//! closed after `limits.sip_idle_timeout_ms` unless RFC 5626 pings (a
//! double CRLF, answered with one CRLF) keep it. Over UDP a source past
//! `limits.sip_udp_requests_per_source` is dropped unanswered, and what a
//! request draws from the built-in server stays within twice its bytes.
//! Real `peerlb` processes on loopback; the crowd's sources are the
//! loopback addresses 127.0.0.2 to 127.0.0.5.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A connection to `to` from `source` (any port).
async fn connect_from(source: &str, to: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(format!("{source}:0").parse().unwrap()).unwrap();
    s.connect(to).await.unwrap()
}

/// An OPTIONS request (no body) from `via` (`TCP a:p` or `UDP a:p`).
fn options(call_id: &str, via: &str) -> String {
    format!(
        "OPTIONS sip:bob@test SIP/2.0\r\n\
         Via: SIP/2.0/{via};branch=z9hG4bK{call_id};rport\r\n\
         Max-Forwards: 70\r\n\
         From: <sip:alice@test>;tag={call_id}\r\n\
         To: <sip:bob@test>\r\n\
         Call-ID: {call_id}\r\n\
         CSeq: 1 OPTIONS\r\n\
         Content-Length: 0\r\n\r\n"
    )
}

/// An INVITE with no body from `via`.
fn invite(call_id: &str, via: &str) -> String {
    options(call_id, via)
        .replacen("OPTIONS sip:", "INVITE sip:", 1)
        .replace("CSeq: 1 OPTIONS", "CSeq: 1 INVITE")
        .replace(
            "Content-Length",
            "Contact: <sip:alice@127.0.0.1>\r\nContent-Length",
        )
}

/// Reads one SIP answer head (the demo server's answers have no body);
/// its status, or `None` when the connection closed first (20 s bound).
async fn tcp_answer(s: &mut TcpStream) -> Option<u16> {
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut b))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        buf.push(b[0]);
    }
    String::from_utf8_lossy(&buf).get(8..11)?.parse().ok()
}

/// Waits up to `limit` for the peer to close `s` (EOF or reset); the time
/// it took, or `None` if it stayed open.
async fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut b = [0u8; 256];
    loop {
        match tokio::time::timeout(limit.saturating_sub(start.elapsed()), s.read(&mut b)).await {
            Ok(Ok(0) | Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => {}
            Err(_) => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sip_tcp_connections_at_a_1024_open_file_limit_leave_the_node_serving_http_and_sip() {
    let mut c = Cluster::start_sip("sip-fd-limit", 1, STEADY, "");
    // Restarted with soft and hard RLIMIT_NOFILE 1024: the node lowers
    // its cap to 1024 - 256 = 768 connections.
    c.kill9("n1");
    c.nofile = Some(1024);
    c.spawn(0);
    c.wait_converged(1);
    assert!(
        c.log("n1").contains("cap=768"),
        "the cap was not lowered: {}",
        c.log("n1")
    );
    let (http, sip) = (c.nodes[0].http, c.nodes[0].sip.unwrap());
    // 1,100 idle SIP TCP connections from four sources (275 each, under
    // the per-source share of 384).
    let crowd_size = 1_100;
    let sources = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"];
    let mut crowd = Vec::with_capacity(crowd_size);
    for i in 0..crowd_size {
        crowd.push(connect_from(sources[i % sources.len()], sip).await);
    }
    // Each one past the cap closed the connection idle longest.
    let evicted = (crowd_size - 768) as u64;
    poll(Duration::from_secs(30), || {
        counter(http, "connections_closed_idle") >= evicted
    })
    .unwrap_or_else(|_| panic!("status: {:?}", status(http)));
    let open = status(http).unwrap()["client_connections"]
        .as_u64()
        .unwrap();
    assert!(open <= 768, "{open} client connections open");
    // A new HTTP client and a new SIP client are served.
    let r = get(http, "/x", &[]).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let mut s = connect_from("127.0.0.1", sip).await;
    let via = format!("TCP {}", s.local_addr().unwrap());
    s.write_all(options("fd-1", &via).as_bytes()).await.unwrap();
    assert_eq!(tcp_answer(&mut s).await, Some(200));
    let log = c.log("n1");
    assert!(!log.contains("Too many open files"), "{log}");
    drop(crowd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sip_message_trickled_a_byte_at_a_time_is_cut_at_the_read_timeout() {
    let timeout = Duration::from_millis(1_000);
    let c = Cluster::start_sip(
        "sip-trickle",
        1,
        &format!(
            "[limits]\nheader_read_timeout_ms = {}\n{STEADY}",
            timeout.as_millis()
        ),
        "",
    );
    let (http, sip) = (c.nodes[0].http, c.nodes[0].sip.unwrap());
    let s = connect_from("127.0.0.1", sip).await;
    let via = format!("TCP {}", s.local_addr().unwrap());
    let text = options("trickle-1", &via).into_bytes();
    // One byte every 50 ms: the whole message would take about 13 s, each
    // read well within the timeout.
    let trickle = Duration::from_millis(50) * text.len() as u32;
    let (mut rd, mut wr) = s.into_split();
    let writer = tokio::spawn(async move {
        for b in text {
            if wr.write_all(&[b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let start = Instant::now();
    let mut b = [0u8; 64];
    let ended = loop {
        match tokio::time::timeout(trickle, rd.read(&mut b)).await {
            Ok(Ok(0) | Err(_)) => break Some(start.elapsed()),
            Ok(Ok(_)) => {}
            Err(_) => break None,
        }
    };
    writer.abort();
    let took = ended.expect("the trickled message was not cut before it finished");
    assert!(
        took >= timeout && took < trickle / 2,
        "cut after {took:?} (timeout {timeout:?}, trickle {trickle:?})"
    );
    assert_eq!(counter(http, "sip_tcp_timed_out"), 1);
    assert_eq!(counter(http, "sip_requests"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rfc_5626_pings_get_a_crlf_pong_and_keep_an_idle_sip_connection_open() {
    let idle = Duration::from_millis(1_000);
    let c = Cluster::start_sip(
        "sip-keepalive",
        1,
        &format!(
            "[limits]\nsip_idle_timeout_ms = {}\n{STEADY}",
            idle.as_millis()
        ),
        "",
    );
    let (http, sip) = (c.nodes[0].http, c.nodes[0].sip.unwrap());
    let mut s = connect_from("127.0.0.1", sip).await;
    let via = format!("TCP {}", s.local_addr().unwrap());
    // Pings for three idle timeouts: each answered with exactly one CRLF.
    let start = Instant::now();
    while start.elapsed() < idle * 3 {
        s.write_all(b"\r\n\r\n").await.unwrap();
        let mut pong = [0u8; 2];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut pong))
            .await
            .expect("no pong")
            .unwrap();
        assert_eq!(&pong, b"\r\n");
        tokio::time::sleep(idle / 4).await;
    }
    // Still open and served; the pongs were one CRLF each (nothing more
    // came before the answer).
    s.write_all(options("ka-1", &via).as_bytes()).await.unwrap();
    assert_eq!(tcp_answer(&mut s).await, Some(200));
    assert_eq!(counter(http, "sip_tcp_timed_out"), 0);
    // Silent: closed after the idle timeout.
    let took = closed_within(&mut s, idle * 10)
        .await
        .expect("an idle connection stayed open");
    assert!(took >= idle.mul_f32(0.9), "closed after {took:?}");
    assert_eq!(counter(http, "sip_tcp_timed_out"), 1);
}

/// Sends `text` from `sock` to `to`; the answers read until a final one
/// (or 5 s), each as its bytes.
fn udp_exchange(sock: &UdpSocket, to: SocketAddr, text: &str) -> Vec<Vec<u8>> {
    sock.send_to(text.as_bytes(), to).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut out = Vec::new();
    let mut buf = vec![0u8; 65_536];
    while Instant::now() < deadline {
        sock.set_read_timeout(Some(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        ))
        .unwrap();
        let Ok((n, _)) = sock.recv_from(&mut buf) else {
            break;
        };
        let fin = buf.get(8) != Some(&b'1');
        out.push(buf[..n].to_vec());
        if fin {
            break;
        }
    }
    out
}

#[test]
fn a_udp_source_past_its_rate_is_dropped_unanswered_and_counted() {
    let c = Cluster::start_sip(
        "sip-udp-rate",
        1,
        &format!(
            "[limits]\nsip_udp_requests_per_source = 5\nsip_udp_rate_interval_ms = 600000\n{STEADY}"
        ),
        "",
    );
    let (http, sip) = (c.nodes[0].http, c.nodes[0].sip.unwrap());
    let a = UdpSocket::bind("127.0.0.2:0").unwrap();
    let via = format!("UDP {}", a.local_addr().unwrap());
    for i in 0..5 {
        let answers = udp_exchange(&a, sip, &options(&format!("rate-{i}"), &via));
        assert_eq!(answers.len(), 1, "request {i}");
    }
    // Past the rate: dropped before they are read as SIP.
    for i in 5..8 {
        a.send_to(options(&format!("rate-{i}"), &via).as_bytes(), sip)
            .unwrap();
    }
    poll(Duration::from_secs(20), || {
        counter(http, "sip_udp_rate_limited") == 3
    })
    .unwrap_or_else(|_| panic!("status: {:?}", status(http)));
    assert_eq!(counter(http, "sip_requests"), 5);
    // Another source is answered.
    let b = UdpSocket::bind("127.0.0.3:0").unwrap();
    let via_b = format!("UDP {}", b.local_addr().unwrap());
    assert_eq!(udp_exchange(&b, sip, &options("rate-b", &via_b)).len(), 1);
    // Nothing came for the dropped ones.
    a.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 2048];
    assert!(a.recv_from(&mut buf).is_err());
}

#[test]
fn a_udp_invite_draws_at_most_twice_its_bytes_from_the_built_in_server() {
    let c = Cluster::start_sip("sip-udp-amplification", 1, STEADY, "");
    let (http, sip) = (c.nodes[0].http, c.nodes[0].sip.unwrap());
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let via = format!("UDP {}", sock.local_addr().unwrap());
    let text = invite("amp-1", &via);
    let answers = udp_exchange(&sock, sip, &text);
    let sent: usize = answers.iter().map(Vec::len).sum();
    let last = String::from_utf8_lossy(answers.last().expect("an answer"));
    assert!(last.starts_with("SIP/2.0 200 "), "{last}");
    assert!(
        sent <= 2 * text.len(),
        "{sent} bytes answered to {} sent",
        text.len()
    );
    // The provisional answers that did not fit were withheld, counted.
    assert!(counter(http, "sip_udp_answers_withheld") >= 1);
    eprintln!(
        "udp invite: {} bytes in, {sent} bytes out in {} answers ({:.2}x)",
        text.len(),
        answers.len(),
        sent as f64 / text.len() as f64
    );
}
