//! HTTP edge cases at the entry node: slow or idle clients, half-closed
//! clients, oversized heads, missing Host.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_idle_half_closed_and_oversized_clients_get_the_right_answer() {
    let c = Cluster::start(
        "http",
        3,
        "[ring]\nvnodes = 1024\n[limits]\nheader_read_timeout_ms = 500\n",
        USER_RULES,
    );
    let entry = c.nodes[0].http;
    let r = ring(&["n1", "n2", "n3"], 1024);

    // A connection that sends nothing, and one that sends half a head, are
    // closed after the header read timeout (slowloris).
    let mut idle = TcpStream::connect(entry).unwrap();
    let mut partial = TcpStream::connect(entry).unwrap();
    partial
        .write_all(b"GET /x?user=a HTTP/1.1\r\nHost: a\r\nx-slow: ")
        .unwrap();
    let (_, closed) = read_until_closed(&mut idle);
    assert!(
        closed,
        "an idle connection stays open past the header read timeout"
    );
    let (_, closed) = read_until_closed(&mut partial);
    assert!(
        closed,
        "a half-sent head stays open past the header read timeout"
    );

    // A client that half-closes after its request still gets the forwarded
    // answer (HAProxy in TCP mode passes such half-closes on).
    let user = user_where(&r, |o| o != "n1");
    let mut s = TcpStream::connect(entry).unwrap();
    write!(
        s,
        "GET /x?user={user} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let (text, _) = read_until_closed(&mut s);
    assert!(text.starts_with("HTTP/1.1 200"), "{text:?}");
    assert!(
        text.contains(&format!("peerlb-served-by: {}", r.owner(&user).unwrap())),
        "{text}"
    );

    // A head too large for a peer frame gets 431 at the entry, whoever owns the key.
    let big = "v".repeat(70_000);
    for n in &c.nodes {
        let resp = get(n.http, &format!("/x?user={user}"), &[("x-big", &big)]).await;
        assert_eq!(resp.status, 431, "via {}", n.id);
    }
    assert_eq!(
        counter(entry, "forwarded"),
        1,
        "only the half-closed request was forwarded"
    );

    // HTTP/1.1 without Host, or with two, is a bad request.
    for head in [
        "GET /x HTTP/1.1\r\n\r\n".to_owned(),
        "GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n".to_owned(),
    ] {
        let mut s = TcpStream::connect(entry).unwrap();
        s.write_all(head.as_bytes()).unwrap();
        let (text, _) = read_until_closed(&mut s);
        assert!(text.starts_with("HTTP/1.1 400"), "{head:?}: {text:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_chunked_body_is_400_and_connect_is_501() {
    let c = Cluster::start("badchunk", 2, "[ring]\nvnodes = 1024\n", USER_RULES);
    let entry = c.nodes[0].http;
    let r = ring(&["n1", "n2"], 1024);
    // The key's owner is the other node: the body is pumped to it over
    // QUIC and breaks there (a chunk size that is not hex).
    let user = user_where(&r, |o| o == "n2");
    let mut s = TcpStream::connect(entry).unwrap();
    write!(
        s,
        "POST /echo?user={user} HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\nbad\r\n0\r\n\r\n"
    )
    .unwrap();
    let (text, _) = read_until_closed(&mut s);
    assert!(text.starts_with("HTTP/1.1 400"), "{text:?}");
    assert!(text.contains("connection: close\r\n"), "{text:?}");
    assert_eq!(counter(entry, "forwarded"), 1, "the request was forwarded");
    // CONNECT asks for a tunnel, which peerlb does not proxy: 501 from the
    // entry, whoever owns the key.
    for owner in ["n1", "n2"] {
        let user = user_where(&r, |o| o == owner);
        let mut s = TcpStream::connect(entry).unwrap();
        write!(
            s,
            "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nx-user: {user}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let (text, _) = read_until_closed(&mut s);
        assert!(text.starts_with("HTTP/1.1 501"), "owner {owner}: {text:?}");
        assert!(text.contains("peerlb-error-from: n1"), "{text:?}");
    }
    // The node still serves.
    let ok = get(entry, &format!("/x?user={user}"), &[]).await;
    assert_eq!((ok.status, ok.served_by()), (200, "n2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_body_gets_408_or_a_cut_connection() {
    let c = Cluster::start(
        "stallbody",
        2,
        "[ring]\nvnodes = 1024\n[limits]\nbody_read_timeout_ms = 300\n",
        USER_RULES,
    );
    let entry = c.nodes[0].http;
    let r = ring(&["n1", "n2"], 1024);
    // A small idempotent body is read whole before any attempt (to replay
    // it): 3 of 10 bytes, then nothing, is a 408 whoever owns the key.
    for owner in ["n1", "n2"] {
        let user = user_where(&r, |o| o == owner);
        let mut s = TcpStream::connect(entry).unwrap();
        write!(
            s,
            "PUT /x?user={user} HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc"
        )
        .unwrap();
        let (text, closed) = read_until_closed(&mut s);
        assert!(text.starts_with("HTTP/1.1 408"), "owner {owner}: {text:?}");
        assert!(
            closed,
            "owner {owner}: the connection is closed after a 408"
        );
    }
    // A streamed body to an owner whose echo answer has started: the
    // stall cuts the connection (never a truncated answer that looks whole).
    let user = user_where(&r, |o| o == "n2");
    let mut s = TcpStream::connect(entry).unwrap();
    write!(
        s,
        "POST /echo?user={user} HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nabc"
    )
    .unwrap();
    let (text, closed) = read_until_closed(&mut s);
    assert!(
        closed,
        "a stalled streamed body leaves the connection open: {text:?}"
    );
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    assert!(
        text.contains("content-length: 100") && body.len() < 100,
        "the cut answer is visibly short of its Content-Length: {text:?}"
    );
    // The node still serves.
    let ok = get(entry, &format!("/x?user={user}"), &[]).await;
    assert_eq!((ok.status, ok.served_by()), (200, "n2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_after_the_send_timeout() {
    let c = Cluster::start(
        "sendtimeout",
        2,
        "[ring]\nvnodes = 1024\n[limits]\nsend_timeout_ms = 300\n",
        USER_RULES,
    );
    let (entry, owner) = (c.nodes[0].http, c.nodes[1].http);
    let r = ring(&["n1", "n2"], 1024);
    let user = user_where(&r, |o| o == "n2");
    // 1 GiB from the other node, and the client never reads a byte.
    let mut s = TcpStream::connect(entry).unwrap();
    write!(
        s,
        "GET /bytes/1073741824?user={user} HTTP/1.1\r\nHost: a\r\n\r\n"
    )
    .unwrap();
    c.wait_until(Duration::from_secs(5), || {
        status(owner).is_some_and(|v| v["inflight"] == 1)
    })
    .expect("the owner serves the request");
    // Once the socket buffers are full, no write progresses: 300 ms later
    // the entry closes the connection, and both nodes let the request go.
    c.wait_until(Duration::from_secs(10), || {
        status(entry).is_some_and(|v| v["inflight"] == 0)
            && status(owner).is_some_and(|v| v["inflight"] == 0)
    })
    .expect("the stalled request is released on both nodes");
    // The client finds its connection ended, short of the 1 GiB.
    let (text, closed) = read_until_closed(&mut s);
    assert!(closed && text.len() < 1 << 30);
}

/// A node publishes (gossip `inflight`, the figure of bounded-load hashing
/// and `least-load`) the requests its app serves, not the ones it only
/// forwards: an entry forwarding a request its owner holds (the gated app
/// answers only when the test lets it) keeps publishing 0 while the owner
/// publishes 1, for as long as the request is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_publishes_the_requests_it_serves_not_those_it_forwards() {
    let app = GatedApp::start().await;
    let c = Cluster::start(
        "servedload",
        2,
        &format!("app = \"http://{}\"\n[ring]\nvnodes = 1024\n", app.addr),
        USER_RULES,
    );
    let (entry, owner) = (c.nodes[0].http, c.nodes[1].http);
    let r = ring(&["n1", "n2"], 1024);
    let user = user_where(&r, |o| o == "n2");
    let long = tokio::spawn(async move { get(entry, &format!("/hold?user={user}"), &[]).await });
    // The published count of `id` as node `at` sees it.
    let published = |at, id: &str| -> Option<u64> {
        let v = status(at)?;
        let m = v["members"].as_array()?.iter().find(|m| m["id"] == id)?;
        m["inflight"].as_u64()
    };
    c.wait_until(Duration::from_secs(5), || published(entry, "n2") == Some(1))
        .expect("the owner publishes the request it serves");
    // The entry has the request in flight (forwarded) ...
    assert_eq!(status(entry).unwrap()["inflight"], 1);
    // ... and for 1.5 s (seven publish intervals of 200 ms, with gossip
    // rounds between) it never publishes it as its own load; counting it
    // (as nodes did) shows 1 at the owner within a few hundred ms.
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_millis(1500) {
        assert_eq!(
            published(owner, "n1"),
            Some(0),
            "the entry published a forwarded request"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The request was held through the whole window: still in flight at
    // the entry, still published by the owner, not answered.
    assert_eq!(status(entry).unwrap()["inflight"], 1);
    assert_eq!(published(entry, "n2"), Some(1));
    assert!(!long.is_finished());
    app.release();
    let resp = long.await.unwrap();
    assert_eq!((resp.status, resp.served_by()), (200, "n2"));
    assert_eq!(app.arrived("/hold"), 1);
}

/// Reads one HTTP/1.1 response with a `Content-Length` body from a
/// keep-alive connection: its status line and body.
fn read_response(s: &mut TcpStream) -> (String, Vec<u8>) {
    use std::io::Read;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed before a response: {got:?}");
        got.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&got[..head_end]).into_owned();
    let len = content_length(&head).expect("a content-length");
    while got.len() < head_end + len {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed in a body");
        got.extend_from_slice(&buf[..n]);
    }
    let status = head.lines().next().unwrap_or_default().to_owned();
    (status, got[head_end..head_end + len].to_vec())
}

/// On a keep-alive connection the header read timeout counts for each
/// head from the end of the previous exchange: a request served for
/// longer than the timeout (the timer waits, not counting, while it is
/// served) neither closes the connection nor shortens the next head's
/// time, and a pause past the timeout after the last answer closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_header_read_timeout_counts_again_for_each_head_of_a_connection() {
    let c = Cluster::start(
        "http-head-timer",
        1,
        "[limits]\nheader_read_timeout_ms = 500\n",
        "",
    );
    let mut s = TcpStream::connect(c.nodes[0].http).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // Served for 900 ms, past the 500 ms the first head had.
    s.write_all(b"GET /delay/900 HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    let (status, _) = read_response(&mut s);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    // The same connection takes the next request.
    s.write_all(b"GET /bytes/3 HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    let (status, body) = read_response(&mut s);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert_eq!(body.len(), 3);
    // Then half a head and nothing more: closed at the timeout (counted
    // from the end of the last answer, just before this write: not
    // sooner than that, whatever the machine's load), with nothing
    // written.
    let sent = std::time::Instant::now();
    s.write_all(b"GET /bytes/3 HTTP/1.1\r\nHost: ").unwrap();
    let (text, closed) = read_until_closed(&mut s);
    assert!(closed && text.is_empty(), "{text:?}");
    assert!(
        sent.elapsed() >= Duration::from_millis(400),
        "closed after {:?}, before the 500 ms timeout",
        sent.elapsed()
    );
}
