//! Backpressure across the hop: an entry reads a forwarded answer from
//! its owner only as fast as the client takes it. Clients that never read
//! forwarded 10 MiB answers (100 HTTP/2 streams on one connection that
//! never sends WINDOW_UPDATE; 300 HTTP/1.1 connections that never read)
//! grow the entry's resident memory by less than 64 MiB while another
//! client's requests are answered; an HTTP/2 stream whose client window
//! stays at zero for `limits.send_timeout_ms` is reset on its own (the
//! connection's other streams go on); and at `limits.response_budget_bytes`
//! the entry cuts the largest holders and still answers new requests.
//! Two real `peerlb` processes on loopback, every answer owned by n2 and
//! asked of n1; RSS is read from `/proc/<pid>/status`.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use support::*;

/// The body of every unread answer: 10 MiB from the built-in app.
const TEN_MIB: &str = "/bytes/10485760";

/// The node's resident memory, in KiB (`VmRSS`).
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Two nodes with `extra` in `[limits]`; the key of a user n2 owns, so
/// every request for it that n1 receives is forwarded.
fn two_nodes(tag: &str, limits: &str) -> (Cluster, String) {
    let c = Cluster::start(
        tag,
        2,
        &format!("[ring]\nvnodes = 1024\n{STEADY}[limits]\n{limits}\n"),
        USER_RULES,
    );
    let r = ring(&["n1", "n2"], 1024);
    (c, user_where(&r, |o| o == "n2"))
}

/// Warms the entry up (peer connection, pools, one forwarded 10 MiB
/// answer read whole) before a memory baseline.
async fn warm_up(entry: SocketAddr, user: &str) {
    for _ in 0..20 {
        assert_eq!(
            get(entry, &format!("/x?user={user}"), &[]).await.status,
            200
        );
    }
    let r = get(entry, &format!("{TEN_MIB}?user={user}"), &[]).await;
    assert_eq!(
        (r.status, r.body.len(), r.served_by()),
        (200, 10 << 20, "n2")
    );
}

/// Another client, started once the unread answers are under way: one
/// forwarded request every 20 ms on a keep-alive connection until `stop`;
/// each must be answered 200 within 5 s (the machine running the tests
/// may be loaded: its normal latency is milliseconds). Gives how many were
/// answered and the slowest.
fn other_client(
    entry: SocketAddr,
    user: String,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u32, Duration)> {
    tokio::spawn(async move {
        let mut conn = Conn::open(entry).await.unwrap();
        let (mut answered, mut worst) = (0u32, Duration::ZERO);
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            let r = tokio::time::timeout(
                Duration::from_secs(5),
                conn.get(&format!("/x?user={user}"), &[]),
            )
            .await
            .expect("another client's request answered within 5 s")
            .unwrap();
            assert_eq!((r.status, r.served_by()), (200, "n2"));
            worst = worst.max(t.elapsed());
            answered += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (answered, worst)
    })
}

/// The counter `name` of the node at `entry`'s Prometheus metrics.
async fn metric(entry: SocketAddr, name: &str) -> u64 {
    let r = get(admin_of(entry), "/_peerlb/metrics", &[]).await;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}")) as u64
}

/// Bytes the node at `entry` wrote to its clients.
async fn client_sent_bytes(entry: SocketAddr) -> u64 {
    metric(entry, "peerlb_client_sent_bytes_total").await
}

/// Samples the RSS of `pid` every 100 ms, at least 8 s, until the node at
/// `entry` has written less than 1 MiB to its clients in 2 s (every unread
/// answer stalled, the kernel's socket buffers full; only the other
/// client's small answers go on), 40 s at most (below the 60 s send
/// timeout): the highest seen, ramp included.
async fn peak_rss(pid: u32, entry: SocketAddr) -> u64 {
    let start = Instant::now();
    let mut peak = 0;
    let mut sent = (client_sent_bytes(entry).await, Instant::now());
    while start.elapsed() < Duration::from_secs(40) {
        for _ in 0..5 {
            peak = peak.max(rss_kib(pid));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let now = client_sent_bytes(entry).await;
        if now >= sent.0 + (1 << 20) {
            sent = (now, Instant::now());
        } else if sent.1.elapsed() >= Duration::from_secs(2)
            && start.elapsed() >= Duration::from_secs(8)
        {
            break;
        }
    }
    eprintln!(
        "sampled {:.1} s; the node's writes to clients stopped: {}",
        start.elapsed().as_secs_f64(),
        sent.1.elapsed() >= Duration::from_secs(2)
    );
    peak
}

/// A TCP connection to `addr` with a 4 KiB receive buffer (set before the
/// handshake, so the window it offers is small): an unread answer then
/// stalls in the node, not in this machine's socket buffers, and the test
/// does not spend its time moving megabytes nobody reads.
fn small_window_connect(addr: SocketAddr) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(4096).unwrap();
    s.connect(&addr.into()).unwrap();
    s.into()
}

/// The forwarded-requests counter of the node at `entry`.
fn forwarded(entry: SocketAddr) -> u64 {
    status(entry).unwrap()["counters"]["forwarded"]
        .as_u64()
        .unwrap()
}

/// 100 HTTP/2 streams of forwarded 10 MiB answers on one connection whose
/// client never reads (the h2 crate's client, which sends WINDOW_UPDATE
/// only for data the caller releases: none). Before the change the entry
/// grew about 1.3 MB per stream (quinn's default 1.25 MB receive window
/// per stream, read for nobody); now each stream holds at most its
/// `limits.response_buffer_bytes` window and one frame, and the entry
/// stays within +64 MiB while another client is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_unread_http2_streams_keep_the_entry_within_64_mib() {
    let (c, user) = two_nodes("bp-h2", "");
    let entry = c.nodes[0].http;
    let pid = c.children["n1"].id();
    warm_up(entry, &user).await;
    let before = rss_kib(pid);
    let base = forwarded(entry);

    let tcp = tokio::net::TcpStream::connect(entry).await.unwrap();
    let (mut h2c, conn) = h2::client::handshake(tcp).await.unwrap();
    let driver = tokio::spawn(conn);
    let mut held = Vec::new();
    for i in 0..100 {
        h2c = h2c.ready().await.unwrap();
        let req = http::Request::get(format!("http://{entry}{TEN_MIB}?user={user}&s={i}"))
            .body(())
            .unwrap();
        let (resp, _) = h2c.send_request(req, true).unwrap();
        held.push(resp);
    }
    let mut bodies = Vec::new();
    for resp in held {
        let resp = tokio::time::timeout(Duration::from_secs(10), resp)
            .await
            .expect("a response head within 10 s")
            .unwrap();
        assert_eq!(resp.status(), 200);
        bodies.push(resp.into_body());
    }
    // Every stream was forwarded; then another client comes.
    eventually(Duration::from_secs(10), || forwarded(entry) >= base + 100)
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let other = other_client(entry, user.clone(), stop.clone());
    let peak = peak_rss(pid, entry).await;
    stop.store(true, Ordering::Relaxed);
    eprintln!(
        "100 unread h2 streams: rss {before} KiB -> peak {peak} KiB (+{} KiB)",
        peak.saturating_sub(before)
    );
    let st = status(entry).unwrap();
    let counters = &st["counters"];
    eprintln!(
        "cut at the budget {}, stalled {}; client connections {}",
        counters["responses_cut_budget"],
        counters["responses_cut_stalled"],
        st["client_connections"]
    );
    let (answered, worst) = other.await.unwrap();
    eprintln!("other client: {answered} answered, worst {worst:?}");
    assert!(answered > 0);
    assert!(
        peak < before + 64 * 1024,
        "memory grew from {before} to {peak} KiB"
    );
    assert!(!driver.is_finished(), "the connection stays open");
    drop(bodies);
}

/// 300 HTTP/1.1 connections each asking for a forwarded 10 MiB answer and
/// never reading it. Before the change: about 3.4 MB per connection (the
/// stream's receive window, gathered frames, hyper's write queue). Now the
/// window and one frame per connection, and the node's budget of buffered
/// response bytes cuts the largest holders: within +64 MiB, another
/// client answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_unread_http1_connections_keep_the_entry_within_64_mib() {
    let (c, user) = two_nodes("bp-h1", "");
    let entry = c.nodes[0].http;
    let pid = c.children["n1"].id();
    warm_up(entry, &user).await;
    let before = rss_kib(pid);
    let base = forwarded(entry);
    let conns: Vec<TcpStream> = (0..300)
        .map(|i| {
            let mut s = small_window_connect(entry);
            write!(
                s,
                "GET {TEN_MIB}?user={user}&c={i} HTTP/1.1\r\nHost: a\r\n\r\n"
            )
            .unwrap();
            s
        })
        .collect();
    // Every request was forwarded; then another client comes.
    eventually(Duration::from_secs(20), || forwarded(entry) >= base + 300)
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let other = other_client(entry, user.clone(), stop.clone());
    let peak = peak_rss(pid, entry).await;
    stop.store(true, Ordering::Relaxed);
    eprintln!(
        "300 unread h1 connections: rss {before} KiB -> peak {peak} KiB (+{} KiB)",
        peak.saturating_sub(before)
    );
    let st = status(entry).unwrap();
    let counters = &st["counters"];
    eprintln!(
        "cut at the budget {}, stalled {}; client connections {}",
        counters["responses_cut_budget"],
        counters["responses_cut_stalled"],
        st["client_connections"]
    );
    let (answered, worst) = other.await.unwrap();
    eprintln!("other client: {answered} answered, worst {worst:?}");
    assert!(answered > 0);
    assert!(
        peak < before + 64 * 1024,
        "memory grew from {before} to {peak} KiB"
    );
    drop(conns);
}

/// An HTTP/2 stream whose client window stays at zero for
/// `limits.send_timeout_ms` (1.5 s here) is reset, and only that stream:
/// a 10 MiB answer, and a one-frame answer one byte over the window (its
/// end waits for its last frame); another stream of the same connection
/// is answered whole afterwards.
/// The client's connection window is large, so only the stream's own
/// window (65,535 bytes, never updated) stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_stalled_for_the_send_timeout_is_reset_alone() {
    let (c, user) = two_nodes("bp-stall", "send_timeout_ms = 1500");
    let entry = c.nodes[0].http;
    warm_up(entry, &user).await;
    let tcp = tokio::net::TcpStream::connect(entry).await.unwrap();
    let (h2c, conn) = h2::client::Builder::new()
        .initial_connection_window_size(64 << 20)
        .handshake::<_, Bytes>(tcp)
        .await
        .unwrap();
    let driver = tokio::spawn(conn);
    let mut h2c = h2c.ready().await.unwrap();
    let req = http::Request::get(format!("http://{entry}{TEN_MIB}?user={user}"))
        .body(())
        .unwrap();
    let (resp, _) = h2c.send_request(req, true).unwrap();
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), 200);
    let started = Instant::now();
    // Read what the stream's window let through, never releasing it.
    let mut stalled = resp.into_body();
    let mut got = 0usize;
    let reset = loop {
        match tokio::time::timeout(Duration::from_secs(30), stalled.data()).await {
            Ok(Some(Ok(d))) => got += d.len(),
            Ok(Some(Err(e))) => break e,
            Ok(None) => panic!("the stalled stream ended cleanly after {got} bytes"),
            Err(_) => panic!("the stalled stream was not reset within 30 s"),
        }
    };
    let after = started.elapsed();
    eprintln!("stalled stream reset after {after:?} ({got} bytes): {reset:?}");
    assert_eq!(
        reset.reason(),
        Some(h2::Reason::INTERNAL_ERROR),
        "{reset:?}"
    );
    assert!(got <= 65_535, "{got} bytes past the stream window");
    assert!(after >= Duration::from_millis(1400), "{after:?}");
    // An answer of one 64 KiB frame, one byte over the stream's window:
    // its last frame is never taken whole, and the stream is reset too.
    let mut h2c = h2c.ready().await.unwrap();
    let req = http::Request::get(format!("http://{entry}/bytes/65536?user={user}"))
        .body(())
        .unwrap();
    let (resp, _) = h2c.send_request(req, true).unwrap();
    let mut small = resp.await.unwrap().into_body();
    let started = Instant::now();
    let reset = loop {
        match tokio::time::timeout(Duration::from_secs(30), small.data()).await {
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(e))) => break e,
            Ok(None) => panic!("the one-frame answer ended without its last byte"),
            Err(_) => panic!("the one-frame answer was not reset within 30 s"),
        }
    };
    assert_eq!(
        reset.reason(),
        Some(h2::Reason::INTERNAL_ERROR),
        "{reset:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(1400));
    // The connection lives: a new stream is answered whole.
    let mut h2c = h2c.ready().await.unwrap();
    let req = http::Request::get(format!("http://{entry}/bytes/1048576?user={user}"))
        .body(())
        .unwrap();
    let (resp, _) = h2c.send_request(req, true).unwrap();
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut n = 0;
    while let Some(d) = body.data().await {
        let d = d.unwrap();
        n += d.len();
        body.flow_control().release_capacity(d.len()).unwrap();
    }
    assert_eq!(n, 1 << 20);
    assert!(!driver.is_finished(), "the connection stays open");
    let counters = &status(entry).unwrap()["counters"];
    assert!(
        counters["responses_cut_stalled"].as_u64() >= Some(2),
        "{counters}"
    );
    assert!(metric(entry, "peerlb_responses_cut_stalled_total").await >= 2);
}

/// At `limits.response_budget_bytes` (1 MiB here; each stalled forwarded
/// answer is charged its frame and twice its 256 KiB window) the entry
/// cuts the largest holders: of 10 HTTP/1.1 clients that never read their
/// forwarded 10 MiB answers, at least 8 are cut (their connections end
/// short of the answer), and a new request is still answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_response_budget_the_largest_holders_are_cut_and_new_work_is_answered() {
    let (c, user) = two_nodes("bp-budget", "response_budget_bytes = 1048576");
    let entry = c.nodes[0].http;
    warm_up(entry, &user).await;
    let mut conns: Vec<TcpStream> = (0..10)
        .map(|i| {
            let mut s = TcpStream::connect(entry).unwrap();
            write!(
                s,
                "GET {TEN_MIB}?user={user}&c={i} HTTP/1.1\r\nHost: a\r\n\r\n"
            )
            .unwrap();
            s
        })
        .collect();
    eventually(Duration::from_secs(30), || {
        status(entry).unwrap()["counters"]["responses_cut_budget"].as_u64() >= Some(8)
    })
    .await
    .expect("8 holders cut");
    assert!(metric(entry, "peerlb_responses_cut_budget_total").await >= 8);
    // New work is admitted.
    let r = get(entry, &format!("/x?user={user}"), &[]).await;
    assert_eq!((r.status, r.served_by()), (200, "n2"));
    // The cut connections end short of their answers.
    let mut short = 0;
    for s in &mut conns {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut all = Vec::new();
        let _ = std::io::Read::read_to_end(s, &mut all);
        if all.len() < 10 << 20 {
            short += 1;
        }
    }
    assert!(short >= 8, "{short} of 10 connections cut");
}

/// The owner stops reading its app when the entry's client stops reading:
/// an app streaming a 256 MiB answer to a forwarded request whose client
/// reads nothing has written only a bounded part of it (the peer stream's
/// window, a frame at each hop, and the sockets' kernel buffers on the
/// way) once its writes stop, and stays there. The owner's body pump
/// awaits the peer stream's flow control; a pump that read ahead would
/// let the app write the whole answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_stops_reading_its_app_when_the_client_stops() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const BODY: u64 = 256 << 20;
    let app = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app_addr = app.local_addr().unwrap();
    let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let w = written.clone();
    tokio::spawn(async move {
        loop {
            let (mut c, _) = app.accept().await.unwrap();
            let w = w.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|x| x == b"\r\n\r\n") {
                    match c.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let big = head.starts_with(b"GET /big");
                let len = if big { BODY } else { 2 };
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n");
                if c.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                if !big {
                    let _ = c.write_all(b"ok").await;
                    return;
                }
                let chunk = vec![0u8; 64 * 1024];
                let mut left = BODY;
                while left > 0 {
                    if c.write_all(&chunk).await.is_err() {
                        return;
                    }
                    left -= chunk.len() as u64;
                    w.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
            });
        }
    });
    let c = Cluster::start(
        "bp-owner",
        2,
        &format!("app = \"http://{app_addr}\"\n[ring]\nvnodes = 1024\n{STEADY}"),
        USER_RULES,
    );
    let user = user_where(&ring(&["n1", "n2"], 1024), |o| o == "n2");
    let entry = c.nodes[0].http;
    let mut client = TcpStream::connect(entry).unwrap();
    write!(client, "GET /big?user={user} HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    // Wait until the app's writes stop: no progress for 2 s.
    let mut last = (0, Instant::now());
    poll(Duration::from_secs(60), || {
        let now = written.load(Ordering::Relaxed);
        if now != last.0 {
            last = (now, Instant::now());
        }
        now > 0 && last.1.elapsed() >= Duration::from_secs(2)
    })
    .expect("the app's writes stop");
    let stopped = written.load(Ordering::Relaxed);
    eprintln!(
        "the app wrote {} KiB of {} MiB before it stopped",
        stopped / 1024,
        BODY >> 20
    );
    assert!(stopped < 64 << 20, "the app wrote {stopped} bytes");
    // Reading resumes the flow: the client gets the whole answer.
    client
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut got = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    while got < BODY {
        match std::io::Read::read(&mut client, &mut buf) {
            Ok(0) => break,
            Ok(n) => got += n as u64,
            Err(e) => panic!("after {got} bytes: {e}"),
        }
    }
    assert!(got >= BODY, "{got} bytes");
}
