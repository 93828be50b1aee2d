//! WebSocket through the entry: an HTTP/1.1 `Upgrade: websocket` request
//! routed like any request, the owner's app accepting it (the built-in
//! app's `/ws/echo`, or `peerlb app` as an upstream app), and the two byte
//! streams relayed through the entry and the peer stream: 10 MiB each way
//! intact, closed cleanly from either side, an idle tunnel closed, and a
//! draining node that lets an open WebSocket go on until its drain
//! timeout. Real `peerlb` processes on loopback; the client is
//! tokio-tungstenite's framing over a raw TCP connection.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

type Ws = WebSocketStream<TcpStream>;

/// Opens a WebSocket to `target` on `entry`: sends the opening request,
/// reads the 101 head. Returns the socket and the head's lines.
async fn open_ws(entry: SocketAddr, target: &str) -> Result<(Ws, Vec<String>), String> {
    let mut tcp = TcpStream::connect(entry).await.map_err(|e| e.to_string())?;
    let req = format!(
        "GET {target} HTTP/1.1\r\nHost: test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    // Byte by byte up to the blank line: nothing after the head is read.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(20), tcp.read(&mut b))
            .await
            .map_err(|_| "no 101 head in time".to_owned())?
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(format!("closed after {:?}", String::from_utf8_lossy(&head)));
        }
        head.push(b[0]);
    }
    let lines: Vec<String> = String::from_utf8_lossy(&head)
        .lines()
        .map(str::to_ascii_lowercase)
        .collect();
    if !lines[0].starts_with("http/1.1 101") {
        return Err(format!("not a 101: {lines:?}"));
    }
    assert!(
        lines.contains(&"sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo=".to_owned()),
        "{lines:?}"
    );
    let mut config = WebSocketConfig::default();
    config.max_message_size = Some(16 << 20);
    let ws = WebSocketStream::from_raw_socket(tcp, Role::Client, Some(config)).await;
    Ok((ws, lines))
}

/// The `i`th 64 KiB message of a stream: its index in its first bytes,
/// then a pattern.
fn chunk(i: u32) -> Vec<u8> {
    let mut v: Vec<u8> = (0..64 * 1024u32)
        .map(|j| (j.wrapping_mul(31) ^ i) as u8)
        .collect();
    v[..4].copy_from_slice(&i.to_be_bytes());
    v
}

/// Sends 10 MiB (160 messages of 64 KiB) while reading the echo, and
/// checks every echoed byte.
async fn echo_10_mib(ws: Ws) -> Ws {
    const N: u32 = 160;
    let (mut tx, mut rx) = ws.split();
    let sender = tokio::spawn(async move {
        for i in 0..N {
            tx.send(Message::binary(chunk(i))).await.unwrap();
        }
        tx
    });
    let mut got = 0u64;
    for i in 0..N {
        let m = tokio::time::timeout(Duration::from_secs(60), rx.next())
            .await
            .expect("echo in time")
            .expect("open")
            .expect("a message");
        let Message::Binary(b) = m else {
            panic!("want binary, got {m:?}")
        };
        assert!(b[..] == chunk(i)[..], "message {i} differs");
        got += b.len() as u64;
    }
    assert_eq!(got, 10 * 1024 * 1024);
    let tx = sender.await.unwrap();
    tx.reunite(rx).unwrap()
}

/// The client closes: the app's close frame comes back and the stream
/// ends.
async fn client_close(mut ws: Ws) {
    ws.close(None).await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(20), async {
        let mut closed = false;
        while let Some(m) = ws.next().await {
            match m {
                Ok(Message::Close(_)) => closed = true,
                Ok(m) => panic!("want the close, got {m:?}"),
                Err(e) => panic!("want a clean close, got {e}"),
            }
        }
        closed
    })
    .await;
    assert_eq!(
        end.ok(),
        Some(true),
        "the app's close frame, then the end of the stream"
    );
}

/// The app closes (the echo's `close` message): its close frame (1000)
/// arrives, the client answers, and the stream ends.
async fn app_close(mut ws: Ws) {
    ws.send(Message::text("close")).await.unwrap();
    let m = tokio::time::timeout(Duration::from_secs(20), ws.next())
        .await
        .expect("close in time")
        .expect("open")
        .expect("a message");
    match m {
        Message::Close(Some(f)) => assert_eq!(f.code, CloseCode::Normal),
        m => panic!("want the app's close, got {m:?}"),
    }
    let end = tokio::time::timeout(Duration::from_secs(20), ws.next()).await;
    assert!(
        matches!(end, Ok(None)),
        "the stream ends cleanly after the close handshake: {end:?}"
    );
}

/// `extra`: top-level keys first, then sections.
fn two_nodes(tag: &str, extra: &str) -> (Cluster, String, String) {
    let c = Cluster::start(
        tag,
        2,
        &format!("{extra}[ring]\nvnodes = 1024\n{STEADY}"),
        USER_RULES,
    );
    let r = ring(&["n1", "n2"], 1024);
    let local = user_where(&r, |o| o == "n1");
    let remote = user_where(&r, |o| o == "n2");
    (c, local, remote)
}

/// Waits until `f` of the entry's and the owner's status holds.
async fn until_status(addr: SocketAddr, what: &str, f: impl Fn(&serde_json::Value) -> bool) {
    eventually(Duration::from_secs(20), || {
        status(addr).is_some_and(|s| f(&s))
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: {:?}", status(addr)));
}

/// The built-in app's echo through a forwarded owner (n2) and on the
/// entry itself (n1): each WebSocket carries 10 MiB each way intact; one
/// is closed by the client, one by the app; the tunnels are counted at
/// the entry and the owner and are gone once closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_echo_carries_10_mib_each_way_and_closes_from_either_side() {
    let (c, local, remote) = two_nodes("wsecho", "");
    let (entry, owner) = (c.nodes[0].http, c.nodes[1].http);
    for (user, served) in [(&remote, "n2"), (&local, "n1")] {
        // Closed by the client.
        let (ws, head) = open_ws(entry, &format!("/ws/echo?user={user}"))
            .await
            .unwrap();
        assert!(
            head.contains(&format!("peerlb-served-by: {served}")),
            "{head:?}"
        );
        let ws = echo_10_mib(ws).await;
        client_close(ws).await;
        // Closed by the app.
        let (ws, _) = open_ws(entry, &format!("/ws/echo?user={user}"))
            .await
            .unwrap();
        let ws = echo_10_mib(ws).await;
        app_close(ws).await;
    }
    until_status(entry, "entry tunnels counted and closed", |s| {
        s["websockets"]["total"] == 4 && s["websockets"]["open"] == 0
    })
    .await;
    until_status(owner, "owner tunnels counted and closed", |s| {
        s["websockets"]["proxied_total"] == 2 && s["websockets"]["proxied_open"] == 0
    })
    .await;
    // The node still serves plain requests, and /ws/echo without an
    // upgrade is 426.
    let r = get(entry, &format!("/ws/echo?user={remote}"), &[]).await;
    assert_eq!(r.status, 426);
}

/// An upstream app (`peerlb app` on a TCP port) accepts the WebSocket of
/// a forwarded request: the owner's pool opens a connection of its own
/// for it and the echo carries 10 MiB each way; the app closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_through_an_upstream_app_on_a_forwarded_owner() {
    let port = free_port();
    let app = KillOnDrop(
        Command::new(bin())
            .args(["app", "--name", "up", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let app_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    eventually(Duration::from_secs(20), || {
        std::net::TcpStream::connect(app_addr).is_ok()
    })
    .await
    .expect("the app listens");
    let (c, _local, remote) = two_nodes("wsup", &format!("app = \"http://{app_addr}\"\n"));
    let entry = c.nodes[0].http;
    let (ws, head) = open_ws(entry, &format!("/ws/echo?user={remote}"))
        .await
        .unwrap();
    assert!(
        head.contains(&"peerlb-served-by: n2".to_owned()),
        "{head:?}"
    );
    let ws = echo_10_mib(ws).await;
    app_close(ws).await;
    drop(app);
}

/// A child process killed when the test ends, passed or failed.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `limits.websocket_idle_timeout_ms = 1000`: a WebSocket that carries
/// nothing is closed by the node, and counted as closed for idleness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_websocket_is_closed_after_the_idle_timeout() {
    let (c, _local, remote) = two_nodes("wsidle", "[limits]\nwebsocket_idle_timeout_ms = 1000\n");
    let entry = c.nodes[0].http;
    let (mut ws, _) = open_ws(entry, &format!("/ws/echo?user={remote}"))
        .await
        .unwrap();
    // Traffic keeps it open.
    for i in 0..3 {
        ws.send(Message::text(format!("m{i}"))).await.unwrap();
        let m = ws.next().await.unwrap().unwrap();
        assert_eq!(m, Message::text(format!("m{i}")));
    }
    // Silence closes it: the stream ends (or fails) without a message.
    let end = tokio::time::timeout(Duration::from_secs(20), ws.next()).await;
    match end {
        Ok(None | Some(Err(_))) => {}
        other => panic!("want the stream closed, got {other:?}"),
    }
    until_status(entry, "idle close counted", |s| {
        s["websockets"]["idle_closed"].as_u64() >= Some(1) && s["websockets"]["open"] == 0
    })
    .await;
}

/// SIGTERM to the entry while a WebSocket is open: the WebSocket still
/// echoes during the drain; the node closes it at the drain timeout
/// (`limits.drain_timeout_ms = 4000`) and exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_entry_lets_an_open_websocket_go_on_until_the_drain_timeout() {
    let (mut c, _local, remote) = two_nodes(
        "wsdrain",
        "[limits]\ndrain_grace_ms = 200\ndrain_timeout_ms = 4000\n",
    );
    let entry = c.nodes[0].http;
    let (mut ws, _) = open_ws(entry, &format!("/ws/echo?user={remote}"))
        .await
        .unwrap();
    let t0 = std::time::Instant::now();
    let mut child = c.sigterm("n1");
    // The listener closes (drain grace), the WebSocket goes on.
    eventually(Duration::from_secs(10), || {
        std::net::TcpStream::connect(entry).is_err()
    })
    .await
    .expect("the entry stops listening");
    ws.send(Message::text("still here")).await.unwrap();
    let m = ws.next().await.unwrap().unwrap();
    assert_eq!(m, Message::text("still here"));
    // Closed by the node at the drain timeout.
    let end = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the node closes the WebSocket");
    assert!(
        t0.elapsed() >= Duration::from_secs(3),
        "closed at the drain timeout, not before: {:?}",
        t0.elapsed()
    );
    let exit = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(exit.success(), "{exit:?}");
}
