//! WebSocket through the entry: an HTTP/1.1 `Upgrade: websocket` request
//! routed like any request, the owner's app accepting it (the built-in
//! app's `/ws/echo`, or `peerlb app` as an upstream app), and the two byte
//! streams relayed through the entry and the peer stream: 10 MiB each way
//! intact, closed cleanly from either side, an idle tunnel closed, and a
//! draining node that lets an open WebSocket go on until its drain
//! timeout. The same over HTTP/2 (RFC 8441 extended CONNECT: the entry
//! speaks the HTTP/1.1 upgrade to the app), beside ordinary streams of the
//! same connection, with other CONNECTs refused at the entry. Real
//! `peerlb` processes on loopback; the client is tokio-tungstenite's
//! framing over a raw TCP connection or over hyper's HTTP/2 client's
//! upgraded CONNECT stream.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper::upgrade::Upgraded;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

/// A client WebSocket: over a TCP connection (HTTP/1.1 upgrade) or over
/// an HTTP/2 stream (RFC 8441, [`H2Ws`]).
type Ws<S = TcpStream> = WebSocketStream<S>;

/// A WebSocket over an HTTP/2 stream (hyper's upgraded CONNECT stream).
type H2Ws = Ws<TokioIo<Upgraded>>;

/// What a WebSocket test needs of its byte stream.
trait WsIo: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> WsIo for T {}

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
async fn echo_10_mib<S: WsIo>(ws: Ws<S>) -> Ws<S> {
    echo_mib(ws, 10).await
}

/// Sends `mib` MiB (16 messages of 64 KiB each) while reading the echo,
/// and checks every echoed byte.
async fn echo_mib<S: WsIo>(ws: Ws<S>, mib: u32) -> Ws<S> {
    let n = mib * 16;
    let (mut tx, mut rx) = ws.split();
    let sender = tokio::spawn(async move {
        for i in 0..n {
            tx.send(Message::binary(chunk(i))).await.unwrap();
        }
        tx
    });
    let mut got = 0u64;
    for i in 0..n {
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
    assert_eq!(got, u64::from(mib) << 20);
    let tx = sender.await.unwrap();
    tx.reunite(rx).unwrap()
}

/// The client closes: the app's close frame comes back and the stream
/// ends.
async fn client_close<S: WsIo>(mut ws: Ws<S>) {
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
async fn app_close<S: WsIo>(mut ws: Ws<S>) {
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

/// An HTTP/2 prior-knowledge connection to `addr` (hyper's client), its
/// driver in a task that ends when the connection does.
async fn h2_connect(addr: SocketAddr) -> (SendRequest<Full<Bytes>>, tokio::task::JoinHandle<()>) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    (sender, driver)
}

/// An ordinary GET of `target` on `h2`: status and `peerlb-served-by`.
async fn h2_get(
    h2: &mut SendRequest<Full<Bytes>>,
    entry: SocketAddr,
    target: &str,
) -> Result<(u16, String), String> {
    h2.ready().await.map_err(|e| e.to_string())?;
    let req = http::Request::get(format!("http://{entry}{target}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = h2.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let served = header(resp.headers(), "peerlb-served-by");
    resp.into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    Ok((status, served))
}

fn header(h: &http::HeaderMap, name: &str) -> String {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// A CONNECT on `h2` with `:protocol` `protocol` (none: a plain CONNECT
/// to `target` as an authority) and `Sec-WebSocket-Version: 13`: the
/// response head and, for a 2xx, the stream as a WebSocket.
async fn h2_connect_request(
    h2: &mut SendRequest<Full<Bytes>>,
    entry: SocketAddr,
    target: &str,
    protocol: Option<&'static str>,
) -> (http::response::Parts, Bytes, Option<H2Ws>) {
    h2.ready().await.unwrap();
    let uri = match protocol {
        Some(_) => format!("http://{entry}{target}"),
        None => target.to_owned(),
    };
    let mut req = http::Request::builder()
        .method("CONNECT")
        .uri(uri)
        .header("sec-websocket-version", "13")
        .body(Full::new(Bytes::new()))
        .unwrap();
    if let Some(p) = protocol {
        req.extensions_mut()
            .insert(hyper::ext::Protocol::from_static(p));
    }
    let mut resp = tokio::time::timeout(Duration::from_secs(20), h2.send_request(req))
        .await
        .expect("an answer in time")
        .unwrap();
    if !resp.status().is_success() {
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        return (parts, body, None);
    }
    let upgraded = hyper::upgrade::on(&mut resp).await.unwrap();
    let mut config = WebSocketConfig::default();
    config.max_message_size = Some(16 << 20);
    let ws =
        WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, Some(config)).await;
    (resp.into_parts().0, Bytes::new(), Some(ws))
}

/// Opens a WebSocket to `target` on `h2` by extended CONNECT (RFC 8441):
/// the answer must be 200 without `Sec-WebSocket-Accept` (section 5).
/// Returns the WebSocket and the answer's headers.
async fn open_ws_h2(
    h2: &mut SendRequest<Full<Bytes>>,
    entry: SocketAddr,
    target: &str,
) -> (H2Ws, http::HeaderMap) {
    let (parts, body, ws) = h2_connect_request(h2, entry, target, Some("websocket")).await;
    assert_eq!(parts.status, 200, "{parts:?} {body:?}");
    assert!(
        !parts.headers.contains_key("sec-websocket-accept"),
        "{parts:?}"
    );
    (ws.expect("a WebSocket"), parts.headers)
}

/// RFC 8441: WebSockets opened by extended CONNECT on one HTTP/2
/// connection, through a forwarded owner (n2) and on the entry itself
/// (n1): 4 MiB each way intact, one closed by the client, one by the app;
/// the app hop is the HTTP/1.1 upgrade (the built-in echo checks the key
/// the entry made). While a WebSocket carries its echo, the same
/// connection serves 20 ordinary streams. The tunnels are counted like
/// HTTP/1.1 ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_over_http2_carries_mib_each_way_beside_ordinary_streams() {
    let (c, local, remote) = two_nodes("wsh2", "");
    let (entry, owner) = (c.nodes[0].http, c.nodes[1].http);
    let (mut h2, _driver) = h2_connect(entry).await;
    // An ordinary stream first: the node's SETTINGS (with
    // SETTINGS_ENABLE_CONNECT_PROTOCOL) have arrived once it is answered.
    let first = h2_get(&mut h2, entry, &format!("/x?user={remote}")).await;
    assert_eq!(first, Ok((200, "n2".to_owned())));
    for (user, served) in [(&remote, "n2"), (&local, "n1")] {
        let target = format!("/ws/echo?user={user}");
        let (ws, head) = open_ws_h2(&mut h2, entry, &target).await;
        assert_eq!(header(&head, "peerlb-served-by"), served);
        assert_eq!(header(&head, "peerlb-entry"), "n1");
        // The echo and ordinary streams on the same connection at once.
        let echo = tokio::spawn(echo_mib(ws, 4));
        for i in 0..20 {
            let r = h2_get(&mut h2, entry, &format!("/y{i}?user={remote}")).await;
            assert_eq!(r, Ok((200, "n2".to_owned())), "stream {i}");
        }
        let ws = echo.await.unwrap();
        client_close(ws).await;
        let (ws, _) = open_ws_h2(&mut h2, entry, &target).await;
        let ws = echo_mib(ws, 4).await;
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
    let last = h2_get(&mut h2, entry, &format!("/z?user={local}")).await;
    assert_eq!(last, Ok((200, "n1".to_owned())));
}

/// A CONNECT without `:protocol` (a TCP tunnel) and an extended CONNECT
/// for another protocol than websocket are answered 501 by the entry
/// (`peerlb-error-from: n1`, no `peerlb-served-by`), are not counted as
/// requests (they never reach routing or an app), and the connection goes
/// on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connect_without_the_websocket_protocol_is_refused_at_the_entry() {
    let (c, _local, remote) = two_nodes("wsh2no", "");
    let entry = c.nodes[0].http;
    let (mut h2, _driver) = h2_connect(entry).await;
    assert_eq!(
        h2_get(&mut h2, entry, &format!("/x?user={remote}")).await,
        Ok((200, "n2".to_owned()))
    );
    let requests = |addr| status(addr).expect("status")["counters"]["requests"].clone();
    let before = (requests(entry), requests(c.nodes[1].http));
    for (target, protocol, says) in [
        ("example.com:443", None, "CONNECT is not supported"),
        (
            &format!("/ws/echo?user={remote}")[..],
            Some("not-websocket"),
            "\"not-websocket\" is not supported",
        ),
    ] {
        let (parts, body, ws) = h2_connect_request(&mut h2, entry, target, protocol).await;
        assert!(ws.is_none());
        assert_eq!(parts.status, 501, "{protocol:?}: {body:?}");
        assert_eq!(header(&parts.headers, "peerlb-error-from"), "n1");
        assert_eq!(header(&parts.headers, "peerlb-served-by"), "");
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains(says), "{protocol:?}: {text}");
    }
    assert_eq!((requests(entry), requests(c.nodes[1].http)), before);
    assert_eq!(
        h2_get(&mut h2, entry, &format!("/x?user={remote}")).await,
        Ok((200, "n2".to_owned()))
    );
}

/// `limits.header_read_timeout_ms = 1000` closes an HTTP/2 connection
/// with no open stream after a second (GOAWAY). An open WebSocket counts
/// as an open stream: three idle timeouts later the connection still
/// serves and the WebSocket still echoes; once it is closed, the
/// connection is closed for idleness again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_with_an_open_websocket_is_not_closed_as_idle() {
    let (c, _local, remote) = two_nodes("wsh2idle", "[limits]\nheader_read_timeout_ms = 1000\n");
    let entry = c.nodes[0].http;
    let (mut h2, driver) = h2_connect(entry).await;
    assert_eq!(
        h2_get(&mut h2, entry, &format!("/x?user={remote}")).await,
        Ok((200, "n2".to_owned()))
    );
    let (mut ws, _) = open_ws_h2(&mut h2, entry, &format!("/ws/echo?user={remote}")).await;
    // Waiting past the idle timeout is the point of this test.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!driver.is_finished(), "the connection was closed as idle");
    ws.send(Message::text("still here")).await.unwrap();
    let m = tokio::time::timeout(Duration::from_secs(20), ws.next())
        .await
        .expect("echo in time");
    assert_eq!(m.unwrap().unwrap(), Message::text("still here"));
    assert_eq!(
        h2_get(&mut h2, entry, &format!("/y?user={remote}")).await,
        Ok((200, "n2".to_owned()))
    );
    client_close(ws).await;
    eventually(Duration::from_secs(20), || driver.is_finished())
        .await
        .expect("closed as idle once the WebSocket is closed");
}

/// `limits.max_connections = 2`: an HTTP/2 connection whose only open
/// stream is a WebSocket is busy, not idle, so when a third connection
/// arrives the HTTP/1.1 keep-alive connection idle between its requests
/// is the one closed to admit it (idle-first closing), and the WebSocket
/// goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_cap_an_http2_websocket_is_not_closed_as_idle() {
    let (c, _local, remote) = two_nodes(
        "wscap",
        "[limits]\nmax_connections = 2\nmax_connections_per_source_percent = 100\n",
    );
    let entry = c.nodes[0].http;
    let (mut h2, _driver) = h2_connect(entry).await;
    assert_eq!(
        h2_get(&mut h2, entry, &format!("/x?user={remote}")).await,
        Ok((200, "n2".to_owned()))
    );
    let (ws, _) = open_ws_h2(&mut h2, entry, &format!("/ws/echo?user={remote}")).await;
    // Idle since after the WebSocket opened: without the WebSocket's hold
    // the HTTP/2 connection would be the one idle longest.
    let idle = Conn::open(entry).await.unwrap();
    the_idle_one_is_closed_and_the_websocket_goes_on(entry, idle, ws).await;
}

/// At `max_connections = 2` with an open WebSocket `ws` and the keep-alive
/// connection `idle` (no request yet): after a request on `idle`, a third
/// connection gets `idle` closed (idle-first closing) and `ws` still
/// echoes.
async fn the_idle_one_is_closed_and_the_websocket_goes_on<S: WsIo>(
    entry: SocketAddr,
    mut idle: Conn,
    mut ws: Ws<S>,
) {
    assert_eq!(idle.get("/a", &[]).await.unwrap().status, 200);
    let mut third = Conn::open(entry).await.unwrap();
    assert_eq!(third.get("/b", &[]).await.unwrap().status, 200);
    assert!(
        idle.get("/c", &[]).await.is_err(),
        "the idle keep-alive connection was closed"
    );
    assert_eq!(counter(entry, "connections_closed_idle"), 1);
    ws.send(Message::text("still here")).await.unwrap();
    let m = tokio::time::timeout(Duration::from_secs(20), ws.next())
        .await
        .expect("echo in time");
    assert_eq!(m.unwrap().unwrap(), Message::text("still here"));
    app_close(ws).await;
}

/// An HTTP/1.1 WebSocket stays counted under `limits.max_connections`
/// after hyper hands its connection to the tunnel (and in
/// `client_connections`), and is never the idle connection closed at the
/// cap: with `max_connections = 2`, a WebSocket and an idle keep-alive
/// connection, a third connection gets the idle one closed, and the
/// WebSocket goes on. (Without the tunnel's hold the WebSocket's
/// connection left the table at its upgrade: no connection was closed
/// and the gauge said 1.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_cap_an_http11_websocket_is_counted_and_not_closed_as_idle() {
    let (c, _local, remote) = two_nodes(
        "ws1cap",
        "[limits]\nmax_connections = 2\nmax_connections_per_source_percent = 100\n",
    );
    let entry = c.nodes[0].http;
    let (ws, _) = open_ws(entry, &format!("/ws/echo?user={remote}"))
        .await
        .unwrap();
    let idle = Conn::open(entry).await.unwrap();
    until_status(
        entry,
        "the WebSocket and the idle connection counted",
        |s| s["client_connections"] == 2,
    )
    .await;
    the_idle_one_is_closed_and_the_websocket_goes_on(entry, idle, ws).await;
}

/// SIGTERM to the entry while an HTTP/2 WebSocket is open: its connection
/// gets GOAWAY (a new stream is refused) but the WebSocket still echoes
/// during the drain; the node closes it at the drain timeout
/// (`limits.drain_timeout_ms = 4000`) and exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_entry_lets_an_open_http2_websocket_go_on_until_the_drain_timeout() {
    let (mut c, _local, remote) = two_nodes(
        "wsh2drain",
        "[limits]\ndrain_grace_ms = 200\ndrain_timeout_ms = 4000\n",
    );
    let entry = c.nodes[0].http;
    let (mut h2, _driver) = h2_connect(entry).await;
    let (mut ws, _) = open_ws_h2(&mut h2, entry, &format!("/ws/echo?user={remote}")).await;
    let t0 = std::time::Instant::now();
    let mut child = c.sigterm("n1");
    eventually(Duration::from_secs(10), || {
        std::net::TcpStream::connect(entry).is_err()
    })
    .await
    .expect("the entry stops listening");
    // GOAWAY has come (or comes): no new stream on this connection.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while h2_get(&mut h2, entry, &format!("/x?user={remote}"))
        .await
        .is_ok()
    {
        assert!(tokio::time::Instant::now() < deadline, "no GOAWAY");
    }
    ws.send(Message::text("still here")).await.unwrap();
    let m = tokio::time::timeout(Duration::from_secs(20), ws.next())
        .await
        .expect("echo in time");
    assert_eq!(m.unwrap().unwrap(), Message::text("still here"));
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
