//! Informational (1xx) answers of the app reach the client as they are
//! sent, before the final answer, on the local path and across the hop
//! (RFC 9110 section 15.2): several in a row (`103 Early Hints` with its
//! `Link`, then `102 Processing`), none to an HTTP/1.0 client, and each
//! one starts a forwarded request's `response_timeout_ms` again. Real
//! `peerlb` processes on loopback; the app is a raw HTTP/1.1 server in the
//! test process, so the 1xx bytes are exactly what it writes.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// A raw app: `/hints` writes `103` (with a `Link`) and `102`, then holds
/// its final `200` until the test adds a permit to `gate`; `/processing`
/// writes a `102` every 300 ms for 2.4 s, then `200`.
async fn raw_app(gate: Arc<Semaphore>) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut c, _) = l.accept().await.unwrap();
            let gate = gate.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let end = loop {
                        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break end;
                        }
                        match c.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end + 4);
                    let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                    let w = if path.starts_with("/hints") {
                        c.write_all(
                            b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
                        )
                        .await
                        .and(c.write_all(b"HTTP/1.1 102 Processing\r\n\r\n").await)
                        .map(|_| ())
                    } else {
                        Ok(())
                    };
                    if w.is_err() {
                        return;
                    }
                    if path.starts_with("/hints") {
                        gate.acquire().await.unwrap().forget();
                    } else if path.starts_with("/processing") {
                        for _ in 0..8 {
                            tokio::time::sleep(Duration::from_millis(300)).await;
                            if c.write_all(b"HTTP/1.1 102 Processing\r\n\r\n")
                                .await
                                .is_err()
                            {
                                return;
                            }
                        }
                    }
                    if c.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\ndone")
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Reads from `s` into `got` until `want` is in it (at most 10 s).
async fn read_until(s: &mut TcpStream, got: &mut Vec<u8>, want: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(got).contains(want) {
        let n = tokio::time::timeout_at(deadline, s.read(&mut chunk))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no {want:?} within 10 s; got {:?}",
                    String::from_utf8_lossy(got)
                )
            })
            .unwrap();
        assert!(
            n > 0,
            "closed before {want:?}; got {:?}",
            String::from_utf8_lossy(got)
        );
        got.extend_from_slice(&chunk[..n]);
    }
}

/// A 2-node cluster keyed on `user` with the raw app and a 1 s response
/// timeout; the users n1 serves itself and forwards to n2.
async fn cluster(tag: &str) -> (Cluster, Arc<Semaphore>, String, String) {
    let gate = Arc::new(Semaphore::new(0));
    let app = raw_app(gate.clone()).await;
    let c = Cluster::start(
        tag,
        2,
        &format!(
            "app = \"http://{app}\"\n[ring]\nvnodes = 1024\n[limits]\nresponse_timeout_ms = 1000\n{STEADY}"
        ),
        USER_RULES,
    );
    let r = ring(&["n1", "n2"], 1024);
    let local = user_where(&r, |o| o == "n1");
    let remote = user_where(&r, |o| o == "n2");
    (c, gate, local, remote)
}

/// Both 1xx heads reach an HTTP/1.1 client while the app still holds its
/// final answer, in order and with their fields, then the final answer;
/// twice on one keep-alive connection, on each path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_hints_and_processing_reach_the_client_before_the_answer_on_both_paths() {
    let (c, gate, local, remote) = cluster("info-hints").await;
    let entry = c.nodes[0].http;
    for user in [&local, &remote] {
        let mut s = TcpStream::connect(entry).await.unwrap();
        for round in 0..2 {
            s.write_all(format!("GET /hints?user={user} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut got = Vec::new();
            read_until(&mut s, &mut got, "HTTP/1.1 102 Processing\r\n\r\n").await;
            let text = String::from_utf8_lossy(&got).into_owned();
            assert!(
                text.starts_with(
                    "HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n"
                ),
                "user {user} round {round}: {text:?}"
            );
            assert!(!text.contains("200 OK"), "the app still holds it: {text:?}");
            gate.add_permits(1);
            read_until(&mut s, &mut got, "done").await;
            let text = String::from_utf8_lossy(&got).into_owned();
            let final_at = text.find("HTTP/1.1 200 OK").expect("a final answer");
            assert!(text[final_at..].ends_with("\r\n\r\ndone"), "{text:?}");
        }
    }
}

/// An HTTP/1.0 client gets the final answer alone (RFC 9110 section
/// 15.2), on each path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_1_0_client_gets_no_informational_answer() {
    let (c, gate, local, remote) = cluster("info-10").await;
    let entry = c.nodes[0].http;
    for user in [&local, &remote] {
        gate.add_permits(1);
        let (text, _) = tokio::task::spawn_blocking({
            let user = user.clone();
            move || {
                raw_exchange(
                    entry,
                    format!("GET /hints?user={user} HTTP/1.0\r\nHost: a\r\n\r\n").as_bytes(),
                )
            }
        })
        .await
        .unwrap();
        let status_line = text.lines().next().unwrap_or("");
        assert!(status_line.ends_with(" 200 OK"), "{user}: {text:?}");
        assert!(
            !text.contains(" 103 ") && !text.contains(" 102 "),
            "{text:?}"
        );
        assert!(text.ends_with("done"), "{text:?}");
    }
}

/// An app that answers `102 Processing` every 300 ms for 2.4 s keeps a
/// forwarded request alive past the 1 s response timeout: each 1xx starts
/// it again, and the client gets the app's 200 (not 504) after the eight
/// 102s; on the local path likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_processing_answer_starts_the_response_timeout_again() {
    let (c, _gate, local, remote) = cluster("info-timeout").await;
    let entry = c.nodes[0].http;
    for user in [&remote, &local] {
        let mut s = TcpStream::connect(entry).await.unwrap();
        s.write_all(
            format!("GET /processing?user={user} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let mut got = Vec::new();
        read_until(&mut s, &mut got, "done").await;
        let text = String::from_utf8_lossy(&got).into_owned();
        assert_eq!(
            text.matches("HTTP/1.1 102 Processing\r\n\r\n").count(),
            8,
            "{user}: {text:?}"
        );
        assert!(text.contains("HTTP/1.1 200 OK\r\n"), "{user}: {text:?}");
    }
}

/// An HTTP/2 client's forwarded request is kept alive by the app's 1xx:
/// the app's 200 after 2.4 s of `102`s, past the 1 s response timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processing_answers_keep_an_http_2_clients_forwarded_request_alive() {
    use http_body_util::{BodyExt, Empty};
    let (c, _gate, _local, remote) = cluster("info-h2").await;
    let tcp = TcpStream::connect(c.nodes[0].http).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake::<_, Empty<bytes::Bytes>>(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .uri(format!("http://a/processing?user={remote}"))
        .body(Empty::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["peerlb-served-by"], "n2");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"done");
}

/// Both 1xx heads reach an HTTP/2 client as HEADERS frames while the app
/// still holds its final answer, in order and with their fields, then the
/// final answer; on each path, on one connection (`vendor/hyper`'s patch:
/// hyper's HTTP/2 server could send none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_hints_and_processing_reach_an_http_2_client_before_the_answer() {
    let (c, gate, local, remote) = cluster("info-h2-hints").await;
    let tcp = TcpStream::connect(c.nodes[0].http).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    for (user, owner) in [(&local, "n1"), (&remote, "n2")] {
        let mut client = client.clone().ready().await.unwrap();
        let req = http::Request::get(format!("http://a/hints?user={user}"))
            .body(())
            .unwrap();
        let (mut resp, _) = client.send_request(req, true).unwrap();
        let mut got = Vec::new();
        while got.len() < 2 {
            let next = std::future::poll_fn(|cx| resp.poll_informational(cx));
            match tokio::time::timeout(Duration::from_secs(5), next)
                .await
                .unwrap_or_else(|_| panic!("{user}: no 1xx within 5 s after {got:?}"))
            {
                Some(Ok(r)) => got.push((
                    r.status().as_u16(),
                    r.headers()
                        .get("link")
                        .map(|v| v.to_str().unwrap().to_owned()),
                )),
                other => panic!("{user}: {other:?} after {got:?}"),
            }
        }
        assert_eq!(
            got,
            [
                (103, Some("</style.css>; rel=preload".to_owned())),
                (102, None)
            ],
            "{user}"
        );
        gate.add_permits(1);
        let resp = resp.await.unwrap();
        assert_eq!(resp.status(), 200, "{user}");
        assert_eq!(resp.headers()["peerlb-served-by"], owner);
    }
}
