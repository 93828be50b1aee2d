//! Trailers end to end, on the local path and across the hop: HTTP/1.1
//! chunked trailers from the app to a client that sent `TE: trailers`
//! and from a client to the app (a raw HTTP/1.1 app in the test process,
//! so the chunked bytes are exactly what it writes and reads), and gRPC
//! over HTTP/2: unary and server-streaming calls through a 3-node cluster
//! whose app is a gRPC server speaking HTTP/2 with prior knowledge
//! (`app = "h2c://..."`), `grpc-status` and every message intact.
//!
//! The gRPC server is written with hyper here (length-prefixed messages,
//! `grpc-status` as a trailer: the parts of gRPC a proxy must carry), not
//! a gRPC library: the test needs no tool installed and sees every frame.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A raw HTTP/1.1 app: `/trailers` answers a chunked body with the
/// trailer `x-checksum: abc` (declared in `Trailer`); `/echo-trailers`
/// reads a chunked request and answers with the trailer section it got
/// and the `te` field it was sent.
async fn raw_app() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut c, _) = l.accept().await.unwrap();
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
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    buf.drain(..end + 4);
                    let answer = if head.contains("transfer-encoding: chunked") {
                        // The body up to its last chunk and trailer section.
                        let tail = loop {
                            let s = String::from_utf8_lossy(&buf).into_owned();
                            if let Some(at) = s.find("0\r\n")
                                && (at == 0 || s[..at].ends_with("\r\n"))
                                && let Some(t) = s[at + 3..]
                                    .find("\r\n\r\n")
                                    .or_else(|| s[at + 3..].starts_with("\r\n").then_some(0))
                            {
                                let trailers = s[at + 3..at + 3 + t].to_owned();
                                buf.clear();
                                break trailers;
                            }
                            match c.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        };
                        let te = head
                            .lines()
                            .find(|l| l.starts_with("te:"))
                            .unwrap_or("te: none")
                            .to_owned();
                        let body = format!("{te}\n{}", tail.to_ascii_lowercase());
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        )
                    } else if head.starts_with("get /trailers") {
                        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: x-checksum\r\n\r\n5\r\nhello\r\n0\r\nx-checksum: abc\r\n\r\n".to_owned()
                    } else {
                        "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_owned()
                    };
                    if c.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Reads from `s` until `want` is in what came (at most 10 s).
async fn read_until(s: &mut TcpStream, want: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(want) {
        let n = tokio::time::timeout_at(deadline, s.read(&mut chunk))
            .await
            .unwrap_or_else(|_| panic!("no {want:?}: {:?}", String::from_utf8_lossy(&got)))
            .unwrap();
        assert!(n > 0, "closed: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// The app's chunked trailers reach an HTTP/1.1 client that sent `TE:
/// trailers`, and a client's request trailers reach the app (with `te:
/// trailers` said again to it), on the local path and across the hop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_trailers_cross_both_ways_on_both_paths() {
    let app = raw_app().await;
    let c = Cluster::start(
        "trailers-h1",
        2,
        &format!("app = \"http://{app}\"\n[ring]\nvnodes = 1024\n{STEADY}"),
        USER_RULES,
    );
    let r = ring(&["n1", "n2"], 1024);
    let local = user_where(&r, |o| o == "n1");
    let remote = user_where(&r, |o| o == "n2");
    let entry = c.nodes[0].http;
    for user in [&local, &remote] {
        let mut s = TcpStream::connect(entry).await.unwrap();
        s.write_all(
            format!("GET /trailers?user={user} HTTP/1.1\r\nHost: a\r\nTE: trailers\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let text = read_until(&mut s, "\r\n0\r\n").await;
        let text = if text.ends_with("\r\n\r\n") && text.contains("x-checksum: abc") {
            text
        } else {
            text + &read_until(&mut s, "x-checksum: abc\r\n\r\n").await
        };
        assert!(
            text.contains("\r\n5\r\nhello\r\n0\r\nx-checksum: abc\r\n\r\n"),
            "{user}: {text:?}"
        );

        s.write_all(
            format!(
                "POST /echo-trailers?user={user} HTTP/1.1\r\nHost: a\r\nTE: trailers\r\nTransfer-Encoding: chunked\r\nTrailer: x-sig\r\n\r\n3\r\nabc\r\n0\r\nx-sig: 42\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let text = read_until(&mut s, "x-sig: 42").await;
        assert!(text.contains("te: trailers\n"), "{user}: {text:?}");
    }
}

/// One gRPC message: the 5-byte prefix (not compressed, length) and
/// `payload`.
fn grpc_message(payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + payload.len());
    b.extend_from_slice(&[0]);
    b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    b.extend_from_slice(payload);
    b.freeze()
}

/// The messages of a gRPC body.
fn grpc_messages(mut body: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    while body.len() >= 5 {
        let len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
        out.push(String::from_utf8_lossy(&body[5..5 + len]).into_owned());
        body = &body[5 + len..];
    }
    out
}

type GrpcBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// The gRPC server: `/echo.Echo/Unary` answers `pong:<request>`;
/// `/echo.Echo/Stream` answers three messages 50 ms apart. Both end with
/// the trailers `grpc-status: 0` and `grpc-message`, and echo the
/// request's trailer `x-req` (if any) as `x-req-echo`.
async fn grpc(req: Request<Incoming>) -> Result<Response<GrpcBody>, Infallible> {
    let path = req.uri().path().to_owned();
    let te = req.headers().get("te").cloned();
    let collected = req.into_body().collect().await.unwrap();
    let req_trailer = collected.trailers().and_then(|t| t.get("x-req")).cloned();
    let asked = grpc_messages(&collected.to_bytes()).join(",");
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    trailers.insert("grpc-message", "fine".parse().unwrap());
    if let Some(v) = req_trailer {
        trailers.insert("x-req-echo", v);
    }
    let frames: Vec<(Duration, Frame<Bytes>)> = if path == "/echo.Echo/Unary" {
        vec![(
            Duration::ZERO,
            Frame::data(grpc_message(format!("pong:{asked}").as_bytes())),
        )]
    } else {
        (0..3)
            .map(|i| {
                (
                    Duration::from_millis(50),
                    Frame::data(grpc_message(format!("m{i}:{asked}").as_bytes())),
                )
            })
            .collect()
    };
    let stream = futures_util::stream::unfold(
        (frames.into_iter(), Some(trailers)),
        |(mut frames, mut trailers)| async move {
            match frames.next() {
                Some((wait, f)) => {
                    tokio::time::sleep(wait).await;
                    Some((Ok::<_, Infallible>(f), (frames, trailers)))
                }
                None => trailers
                    .take()
                    .map(|t| (Ok(Frame::trailers(t)), (frames, None))),
            }
        },
    );
    let mut resp = Response::new(StreamBody::new(stream).boxed());
    resp.headers_mut()
        .insert("content-type", "application/grpc".parse().unwrap());
    if te.is_none() {
        // gRPC servers refuse a request without `te: trailers`.
        *resp.status_mut() = http::StatusCode::BAD_REQUEST;
    }
    Ok(resp)
}

/// The gRPC server on an h2c (prior knowledge) listener.
async fn grpc_server() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (c, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(c), hyper::service::service_fn(grpc))
                    .await;
            });
        }
    });
    addr
}

/// One gRPC call on `sender`: the status, the messages, the trailers.
async fn call(
    sender: &mut hyper::client::conn::http2::SendRequest<GrpcBody>,
    user: &str,
    method: &str,
    request: &str,
    req_trailer: Option<&str>,
) -> (u16, Vec<String>, HeaderMap, String) {
    let mut frames = vec![Ok::<_, Infallible>(Frame::data(grpc_message(
        request.as_bytes(),
    )))];
    if let Some(v) = req_trailer {
        let mut t = HeaderMap::new();
        t.insert("x-req", v.parse().unwrap());
        frames.push(Ok(Frame::trailers(t)));
    }
    let body = StreamBody::new(futures_util::stream::iter(frames)).boxed();
    let req = Request::builder()
        .method("POST")
        .uri(format!("http://grpc.test/echo.Echo/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("x-user", user)
        .body(body)
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let served = resp.headers()["peerlb-served-by"]
        .to_str()
        .unwrap()
        .to_owned();
    let collected = resp.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap_or_default();
    (
        status,
        grpc_messages(&collected.to_bytes()),
        trailers,
        served,
    )
}

/// Unary and server-streaming gRPC calls through a 3-node cluster over
/// HTTP/2 at both ends (the client's connection and `app = "h2c://..."`),
/// entry n1 and the owner another node, then the entry itself: every
/// message and `grpc-status`, `grpc-message` and the echoed request
/// trailer intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_unary_and_server_streaming_calls_cross_a_3_node_cluster() {
    let app = grpc_server().await;
    let c = Cluster::start(
        "trailers-grpc",
        3,
        &format!("app = \"h2c://{app}\"\n[ring]\nvnodes = 1024\n{STEADY}"),
        USER_RULES,
    );
    let r = ring(&["n1", "n2", "n3"], 1024);
    let remote = user_where(&r, |o| o == "n3");
    let local = user_where(&r, |o| o == "n1");
    let tcp = TcpStream::connect(c.nodes[0].http).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake::<_, GrpcBody>(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    for (user, owner) in [(&remote, "n3"), (&local, "n1")] {
        let (status, messages, trailers, served) =
            call(&mut sender, user, "Unary", "ping", Some("r1")).await;
        assert_eq!(status, 200, "{user}");
        assert_eq!(served, owner);
        assert_eq!(messages, ["pong:ping"], "{user}");
        assert_eq!(
            trailers.get("grpc-status").unwrap(),
            "0",
            "{user}: {trailers:?}"
        );
        assert_eq!(trailers.get("grpc-message").unwrap(), "fine");
        assert_eq!(
            trailers.get("x-req-echo").unwrap(),
            "r1",
            "{user}: {trailers:?}"
        );

        let (status, messages, trailers, served) =
            call(&mut sender, user, "Stream", "s", None).await;
        assert_eq!(status, 200, "{user}");
        assert_eq!(served, owner);
        assert_eq!(messages, ["m0:s", "m1:s", "m2:s"], "{user}");
        assert_eq!(
            trailers.get("grpc-status").unwrap(),
            "0",
            "{user}: {trailers:?}"
        );
        assert!(trailers.get("x-req-echo").is_none());
    }
}
