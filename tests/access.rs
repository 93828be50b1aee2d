//! The access log (`peerlb node --access-log --log-format json`) over real
//! `peerlb` processes on loopback: the fields of a routed request on the
//! entry and the owner, the time to the last byte of a long body, and a
//! line for each answer the edge gives before routing (400, 414, 431, and
//! 408 for a head that timed out), counted apart from the app's 4xx.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use support::*;

/// The JSON objects of a node's log (every line must be one).
fn json_lines(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: not JSON: {l}")))
        .collect()
}

/// The access lines of a node's log.
fn access_lines(c: &Cluster, id: &str) -> Vec<serde_json::Value> {
    json_lines(&c.log(id))
        .into_iter()
        .filter(|l| l["target"] == "peerlb::access")
        .collect()
}

/// `raw` written on a fresh connection; what came back (the connection
/// closed by the node, or after 5 s).
fn raw(addr: SocketAddr, raw: &[u8]) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(raw);
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_lines_carry_the_request_its_routing_and_the_time_to_the_last_byte() {
    let c = Cluster::start_args(
        "access-fields",
        2,
        "[ring]\nvnodes = 64\n",
        USER_RULES,
        &["--log-format", "json", "--access-log"],
    );
    let r = ring(&["n1", "n2"], 64);
    let remote = user_where(&r, |o| o == "n2");
    let local = user_where(&r, |o| o == "n1");
    let n1 = c.nodes[0].http;
    // 4 MiB from the owner: the body takes longer than its head.
    let size = 4 << 20;
    // A client-sent UUID is kept (headers.trust_client_forwarded, the
    // default): the lines are found by it.
    let id = "3b241101-e2bb-4255-8caf-4136c566a962".to_owned();
    let resp = get(
        n1,
        &format!("/bytes/{size}?user={remote}"),
        &[("x-request-id", &id)],
    )
    .await;
    assert_eq!((resp.status, resp.served_by()), (200, "n2"));
    assert_eq!(resp.body.len(), size);
    let mut lines = (Vec::new(), Vec::new());
    poll(Duration::from_secs(10), || {
        lines = (access_lines(&c, "n1"), access_lines(&c, "n2"));
        lines.0.iter().any(|l| l["request_id"] == id.as_str())
            && lines.1.iter().any(|l| l["request_id"] == id.as_str())
    })
    .unwrap_or_else(|()| panic!("no access lines for {id}:\n{}", c.log("n1")));
    let entry = lines
        .0
        .iter()
        .find(|l| l["request_id"] == id.as_str())
        .unwrap();
    let owner = lines
        .1
        .iter()
        .find(|l| l["request_id"] == id.as_str())
        .unwrap();
    let path = format!("/bytes/{size}?user={remote}");
    for l in [entry, owner] {
        assert_eq!(l["method"], "GET", "{l}");
        assert_eq!(l["path"], path.as_str(), "{l}");
        assert_eq!(l["host"], n1.to_string().as_str(), "{l}");
        assert_eq!(l["protocol"], "HTTP/1.1", "{l}");
        assert_eq!(l["status"], 200, "{l}");
        assert_eq!(l["entry"], "n1", "{l}");
        assert_eq!(l["owner"], "n2", "{l}");
        assert_eq!(l["bytes_in"], 0, "{l}");
        assert_eq!(l["bytes_out"], size as u64, "{l}");
        let (ttfb, total) = (
            l["ttfb_us"].as_u64().unwrap(),
            l["duration_us"].as_u64().unwrap(),
        );
        assert!(ttfb <= total, "{l}");
    }
    // A chunked upload (no Content-Length): the entry logs the body bytes
    // it read from the client, on the local path and across the hop.
    for user in [remote.as_str(), local.as_str()] {
        let chunked = format!(
            "POST /echo?user={user}&chunked HTTP/1.1\r\nhost: up\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n400\r\n{}\r\n200\r\n{}\r\n0\r\n\r\n",
            "a".repeat(0x400),
            "b".repeat(0x200)
        );
        let got = raw(n1, chunked.as_bytes());
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        let path = format!("/echo?user={user}&chunked");
        let mut up = None;
        poll(Duration::from_secs(10), || {
            up = access_lines(&c, "n1")
                .into_iter()
                .find(|l| l["path"] == path.as_str() && l["role"] == "entry");
            up.is_some()
        })
        .unwrap_or_else(|()| panic!("no line for {path}:\n{}", c.log("n1")));
        let up = up.unwrap();
        assert_eq!(up["bytes_in"], 0x600, "{up}");
        assert_eq!(up["bytes_out"], 0x600, "{up}");
        // A body the app answers without reading: its declared length.
        let unread = format!(
            "POST /plain?user={user}&unread HTTP/1.1\r\nhost: up\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello"
        );
        assert!(raw(n1, unread.as_bytes()).starts_with("HTTP/1.1 200"));
        let path = format!("/plain?user={user}&unread");
        let mut line = None;
        poll(Duration::from_secs(10), || {
            line = access_lines(&c, "n1")
                .into_iter()
                .find(|l| l["path"] == path.as_str() && l["role"] == "entry");
            line.is_some()
        })
        .unwrap_or_else(|()| panic!("no line for {path}:\n{}", c.log("n1")));
        assert_eq!(line.unwrap()["bytes_in"], 5);
    }
    assert_eq!(entry["role"], "entry", "{entry}");
    assert_eq!(entry["reason"], "rule", "{entry}");
    assert_eq!(entry["rule"], 0, "{entry}");
    assert_eq!(entry["key"], remote.as_str(), "{entry}");
    assert_eq!(entry["sticky"], false, "{entry}");
    assert_eq!(entry["failover"], false, "{entry}");
    assert_eq!(entry["retries"], 0, "{entry}");
    let client = entry["client"].as_str().unwrap();
    assert!(client.starts_with("127.0.0.1:"), "{entry}");
    assert_eq!(owner["role"], "owner", "{owner}");
    assert_eq!(owner["reason"], "proxied", "{owner}");
    // The entry's time runs to its last byte, past the owner's head and
    // past its own first byte (a relation in one run, no absolute time).
    assert!(
        entry["duration_us"].as_u64() > entry["ttfb_us"].as_u64(),
        "{entry}"
    );
}

/// Every answer the edge gives has its line (peerlb's own 414 and 400,
/// hyper's 431 and 400; a head begun and not finished within
/// `limits.header_read_timeout_ms`, closed with nothing written, says
/// 408), and the ones written count in `edge_client_errors`, which the
/// app's own 4xx (the built-in app's 400 for `/bytes/x`) does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edges_answers_have_access_lines() {
    let c = Cluster::start_args(
        "access-edge",
        1,
        "[limits]\nmax_request_target = 64\nheader_read_timeout_ms = 1000\n",
        "",
        &["--log-format", "json", "--access-log"],
    );
    let n1 = c.nodes[0].http;
    let long = "a".repeat(100);
    let big = "x".repeat(40_000);
    let cases: [(&str, Vec<u8>, u16); 4] = [
        (
            "414",
            format!("GET /{long} HTTP/1.1\r\nhost: h414\r\nconnection: close\r\n\r\n").into_bytes(),
            414,
        ),
        (
            "400 two hosts",
            b"GET /two HTTP/1.1\r\nhost: a\r\nhost: b\r\nconnection: close\r\n\r\n".to_vec(),
            400,
        ),
        (
            "431 hyper's",
            format!(
                "GET /big HTTP/1.1\r\nhost: h431\r\n{}\r\n\r\n",
                (0..4)
                    .map(|i| format!("x-{i}: {big}\r\n"))
                    .collect::<String>()
            )
            .into_bytes(),
            431,
        ),
        ("400 hyper's", b"NOT HTTP AT ALL\r\n\r\n".to_vec(), 400),
    ];
    for (name, bytes, status) in &cases {
        let got = raw(n1, bytes);
        assert!(
            got.starts_with(&format!("HTTP/1.1 {status}")),
            "{name}: {got}"
        );
    }
    // Half a head, then nothing: closed at the head read timeout (1 s,
    // well inside raw's 5 s wait) with nothing written.
    let got = raw(n1, b"GET /slow HTTP/1.1\r\nhost: h408\r\n");
    assert_eq!(got, "", "a timed-out head gets no answer");
    // The app's own 4xx: an entry line, not an edge answer.
    let app = raw(
        n1,
        b"GET /bytes/x HTTP/1.1\r\nhost: app\r\nconnection: close\r\n\r\n",
    );
    assert!(app.starts_with("HTTP/1.1 400"), "{app}");
    let mut lines = Vec::new();
    poll(Duration::from_secs(10), || {
        lines = access_lines(&c, "n1");
        lines.len() >= cases.len() + 2
    })
    .unwrap_or_else(|()| panic!("access lines: {lines:?}\n{}", c.log("n1")));
    let statuses: Vec<u64> = lines
        .iter()
        .map(|l| l["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [414, 400, 431, 400, 408, 400], "{lines:?}");
    assert_eq!(lines[5]["role"], "entry", "{}", lines[5]);
    // The four edge answers written; not the timed-out head, not the
    // app's 400.
    assert_eq!(counter(n1, "edge_client_errors"), 4);
    let lines = &lines[..5];
    for l in lines {
        assert_eq!(l["role"], "edge", "{l}");
        assert_eq!(l["owner"], "-", "{l}");
        assert!(
            l["client"].as_str().unwrap().starts_with("127.0.0.1:"),
            "{l}"
        );
    }
    // The ones peerlb answered itself carry the request.
    assert_eq!(lines[0]["host"], "h414", "{}", lines[0]);
    assert_eq!(lines[0]["method"], "GET", "{}", lines[0]);
    assert_eq!(lines[1]["path"], "/two", "{}", lines[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_tunnel_is_logged_when_it_closes_with_its_bytes() {
    let c = Cluster::start_args(
        "access-ws",
        1,
        "",
        "",
        &["--log-format", "json", "--access-log"],
    );
    let n1 = c.nodes[0].http;
    let mut s = std::net::TcpStream::connect(n1).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /ws/echo HTTP/1.1\r\nHost: ws\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n").unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        assert_eq!(s.read(&mut b).unwrap(), 1, "{head:?}");
        head.push(b[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "{head:?}");
    // No line while the tunnel is open.
    assert!(access_lines(&c, "n1").is_empty());
    // A masked text frame "hi" (mask 0), 8 bytes; its echo, 4.
    s.write_all(&[0x81, 0x82, 0, 0, 0, 0, b'h', b'i']).unwrap();
    let mut echo = [0u8; 4];
    s.read_exact(&mut echo).unwrap();
    assert_eq!(echo, [0x81, 0x02, b'h', b'i']);
    drop(s);
    let mut lines = Vec::new();
    poll(Duration::from_secs(10), || {
        lines = access_lines(&c, "n1");
        !lines.is_empty()
    })
    .unwrap_or_else(|()| panic!("no tunnel line:\n{}", c.log("n1")));
    let l = &lines[0];
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(l["role"], "tunnel", "{l}");
    assert_eq!(l["status"], 101, "{l}");
    assert_eq!(l["path"], "/ws/echo", "{l}");
    assert_eq!(l["host"], "ws", "{l}");
    assert_eq!(l["bytes_in"], 8, "{l}");
    assert_eq!(l["bytes_out"], 4, "{l}");
    assert!(l["duration_us"].as_u64() >= l["ttfb_us"].as_u64(), "{l}");
}
