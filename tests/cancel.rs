//! A client that leaves cancels its request: an HTTP/1.1 client that
//! closes its keep-alive connection, or an HTTP/2 client that resets its
//! stream, while the app works on a slow answer ends the app's exchange
//! (the app sees its connection close long before it would have answered)
//! on the local path and across the hop, and the entry counts
//! `client_aborted`. Real `peerlb` processes on loopback; the app is a raw
//! HTTP/1.1 server in the test process that notes when its connection
//! closes under a pending request.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// What the app saw of one slow request.
#[derive(Debug)]
enum Seen {
    /// Its head arrived.
    Arrived,
    /// Its connection closed before the 8 s answer, at this instant.
    Closed(Instant),
}

/// A raw app that answers every request after 8 s, unless its connection
/// closes first; tells `seen` of each request and each such close.
async fn slow_app(seen: mpsc::UnboundedSender<Seen>) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut c, _) = l.accept().await.unwrap();
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = seen.send(Seen::Arrived);
                match tokio::time::timeout(Duration::from_secs(8), c.read(&mut chunk)).await {
                    Ok(Ok(0) | Err(_)) => {
                        let _ = seen.send(Seen::Closed(Instant::now()));
                    }
                    _ => {
                        let _ = c
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nlate")
                            .await;
                    }
                }
            });
        }
    });
    addr
}

/// A 2-node cluster keyed on `user` with the slow app; the users n1
/// serves itself and forwards to n2.
async fn cluster(tag: &str) -> (Cluster, mpsc::UnboundedReceiver<Seen>, String, String) {
    let (tx, rx) = mpsc::unbounded_channel();
    let app = slow_app(tx).await;
    let c = Cluster::start(
        tag,
        2,
        &format!("app = \"http://{app}\"\n[ring]\nvnodes = 1024\n{STEADY}"),
        USER_RULES,
    );
    let r = ring(&["n1", "n2"], 1024);
    (
        c,
        rx,
        user_where(&r, |o| o == "n1"),
        user_where(&r, |o| o == "n2"),
    )
}

/// Waits for the app's next note (at most 5 s).
async fn next(rx: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("the app heard of it within 5 s")
        .unwrap()
}

/// Every node's requests in flight back to 0: the entry's and the
/// owner's resources for the cancelled requests are freed.
fn assert_nothing_in_flight(c: &Cluster) {
    for n in &c.nodes {
        poll(Duration::from_secs(5), || {
            status(n.http).is_some_and(|s| s["inflight"] == 0 && s["app_inflight"] == 0)
        })
        .unwrap_or_else(|()| panic!("{}: still in flight: {:?}", n.id, status(n.http)));
    }
}

/// How long the app's exchange outlived the client: it must end long
/// before the app's 8 s answer (the goal is 100 ms; 2 s leaves room for
/// a loaded machine).
fn assert_cancelled(seen: Seen, left: Instant, what: &str) {
    let Seen::Closed(at) = seen else {
        panic!("{what}: the app kept the request: {seen:?}");
    };
    let after = at.saturating_duration_since(left);
    eprintln!(
        "{what}: app connection closed {} ms after the client left",
        after.as_millis()
    );
    assert!(after < Duration::from_secs(2), "{what}: {after:?}");
}

/// An HTTP/1.1 client that closes its keep-alive connection under a
/// pending request: the app's connection closes, on each path, the entry
/// counts both, and nothing stays in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_1_1_client_that_leaves_ends_the_apps_exchange_on_both_paths() {
    let (c, mut rx, local, remote) = cluster("cancel-h1").await;
    let entry = c.nodes[0].http;
    for user in [&local, &remote] {
        let mut s = TcpStream::connect(entry).await.unwrap();
        s.write_all(format!("GET /slow?user={user} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
            .await
            .unwrap();
        assert!(matches!(next(&mut rx).await, Seen::Arrived), "{user}");
        drop(s);
        let left = Instant::now();
        assert_cancelled(next(&mut rx).await, left, user);
    }
    poll(Duration::from_secs(5), || {
        counter(entry, "client_aborted") == 2
    })
    .unwrap_or_else(|()| panic!("client_aborted {}", counter(entry, "client_aborted")));
    assert_nothing_in_flight(&c);
}

/// An HTTP/2 client that resets its stream (drops its pending request)
/// ends the app's exchange across the hop, and on the local path too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_2_stream_reset_ends_the_apps_exchange_on_both_paths() {
    use http_body_util::Empty;
    let (c, mut rx, local, remote) = cluster("cancel-h2").await;
    let entry = c.nodes[0].http;
    let tcp = TcpStream::connect(entry).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake::<_, Empty<bytes::Bytes>>(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    for user in [&remote, &local] {
        let req = http::Request::builder()
            .uri(format!("http://a/slow?user={user}"))
            .body(Empty::new())
            .unwrap();
        let pending = tokio::spawn(sender.send_request(req));
        assert!(matches!(next(&mut rx).await, Seen::Arrived), "{user}");
        // Dropping the response future resets the stream (RST_STREAM CANCEL).
        pending.abort();
        let left = Instant::now();
        assert_cancelled(next(&mut rx).await, left, user);
    }
    poll(Duration::from_secs(5), || {
        counter(entry, "client_aborted") == 2
    })
    .unwrap_or_else(|()| panic!("client_aborted {}", counter(entry, "client_aborted")));
    assert_nothing_in_flight(&c);
}

/// A request that says `Connection: close` may half-close after it and
/// still gets its answer (the end of its stream is not its leaving).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closing_request_that_half_closes_still_gets_its_answer() {
    let (c, _rx, _local, remote) = cluster("cancel-half").await;
    let entry = c.nodes[0].http;
    let text = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(entry).unwrap();
        write!(
            s,
            "GET /x?user={remote} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        read_until_closed(&mut s).0
    })
    .await
    .unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text:?}");
    assert!(text.ends_with("late"), "{text:?}");
    assert_eq!(counter(entry, "client_aborted"), 0);
}
