use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::adapters::body;
use http::Uri;

/// What the test app saw: connections accepted, request heads in order.
#[derive(Default)]
struct Seen {
    conns: AtomicUsize,
    heads: Mutex<Vec<String>>,
}

/// How the test app treats a keep-alive connection.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Answers every request.
    KeepAlive,
    /// Closes the connection right after each response without saying so
    /// (an app dropping idle connections at once).
    CloseAfterEach,
    /// Answers the first request of a connection; reads the next one and
    /// closes without answering (an app closing an idle connection just as
    /// a request was sent on it).
    DropSecond,
}

/// A raw HTTP/1.1 app on loopback answering every request with `body`
/// (keep-alive), treating connections as `mode` says.
async fn app(body: &'static str, close_after_each: bool) -> (Uri, Arc<Seen>) {
    let mode = if close_after_each {
        Mode::CloseAfterEach
    } else {
        Mode::KeepAlive
    };
    app_with(mode, move |_| {
        format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    })
    .await
}

/// A raw HTTP/1.1 app on loopback answering each request head (bodies as
/// its `content-length` says are read and counted in the head as
/// `body-len: n`) with `answer(head)`, treating connections as `mode` says.
async fn app_with(
    mode: Mode,
    answer: impl Fn(&str) -> String + Send + Sync + 'static,
) -> (Uri, Arc<Seen>) {
    let answer = Arc::new(answer);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri: Uri = format!("http://{}", l.local_addr().unwrap())
        .parse()
        .unwrap();
    let seen = Arc::new(Seen::default());
    let s = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let (mut c, _) = l.accept().await.unwrap();
            s.conns.fetch_add(1, Ordering::SeqCst);
            let s = Arc::clone(&s);
            let answer = Arc::clone(&answer);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut answered = 0;
                loop {
                    let mut chunk = [0u8; 4096];
                    let n = match c.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8(buf[..end + 4].to_vec()).unwrap();
                        let len: usize = head
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse().ok())?
                            })
                            .unwrap_or(0);
                        if buf.len() < end + 4 + len {
                            break;
                        }
                        buf.drain(..end + 4 + len);
                        s.heads
                            .lock()
                            .unwrap()
                            .push(format!("{head}body-len: {len}"));
                        if mode == Mode::DropSecond && answered == 1 {
                            return;
                        }
                        if c.write_all(answer(&head).as_bytes()).await.is_err() {
                            return;
                        }
                        answered += 1;
                        if mode == Mode::CloseAfterEach {
                            return;
                        }
                    }
                }
            });
        }
    });
    (uri, seen)
}

/// A pool for the app at `uri` with `idle` as its idle time.
fn pool_with(uri: &Uri, idle: Duration) -> Upstream {
    Upstream::new(&AppAddr::Http(uri.clone()), idle)
}

/// A pool for the app at `uri` with the default idle time (2 s).
fn pool_for(uri: &Uri) -> Upstream {
    pool_with(uri, Duration::from_secs(2))
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(body::empty()).unwrap()
}

async fn text(resp: Response<Body>) -> String {
    let b = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(b.to_vec()).unwrap()
}

#[tokio::test]
async fn sequential_requests_reuse_one_connection() {
    let (uri, seen) = app("hello", false).await;
    let pool = pool_for(&uri);
    for _ in 0..5 {
        assert_eq!(text(pool.send(get("/a")).await.unwrap()).await, "hello");
    }
    assert_eq!(seen.conns.load(Ordering::SeqCst), 1);
    assert_eq!(seen.heads.lock().unwrap().len(), 5);
}

#[tokio::test]
async fn adds_host_when_missing_and_speaks_http11_in_origin_form() {
    let (uri, seen) = app("x", false).await;
    let pool = pool_for(&uri);
    let mut req = get("/p?q=1");
    *req.version_mut() = Version::HTTP_10;
    text(pool.send(req).await.unwrap()).await;
    let mut req = get("/p");
    req.headers_mut()
        .insert(header::HOST, HeaderValue::from_static("client.example"));
    text(pool.send(req).await.unwrap()).await;
    let heads = seen.heads.lock().unwrap().clone();
    let authority = uri.authority().unwrap().as_str().to_owned();
    assert!(
        heads[0].starts_with("GET /p?q=1 HTTP/1.1\r\n"),
        "{}",
        heads[0]
    );
    assert!(
        heads[0]
            .to_ascii_lowercase()
            .contains(&format!("host: {authority}\r\n")),
        "{}",
        heads[0]
    );
    assert!(
        heads[1]
            .to_ascii_lowercase()
            .contains("host: client.example\r\n"),
        "the client's Host is kept: {}",
        heads[1]
    );
}

#[tokio::test]
async fn a_body_dropped_before_its_end_closes_its_connection() {
    let (uri, seen) = app("a longer body", false).await;
    let pool = pool_for(&uri);
    let resp = pool.send(get("/")).await.unwrap();
    assert!(!resp.body().is_end_stream());
    drop(resp);
    assert_eq!(
        text(pool.send(get("/")).await.unwrap()).await,
        "a longer body"
    );
    assert_eq!(
        seen.conns.load(Ordering::SeqCst),
        2,
        "the unread response's connection is not reused"
    );
}

#[tokio::test]
async fn concurrent_requests_get_their_own_connections() {
    let (uri, seen) = app("c", false).await;
    let pool = pool_for(&uri);
    // Both responses are held (bodies unread) at once: two connections.
    let a = pool.send(get("/1")).await.unwrap();
    let b = pool.send(get("/2")).await.unwrap();
    assert_eq!(seen.conns.load(Ordering::SeqCst), 2);
    assert_eq!(text(a).await, "c");
    assert_eq!(text(b).await, "c");
    // Both went back to the pool: the next two reuse them.
    let a = pool.send(get("/3")).await.unwrap();
    let b = pool.send(get("/4")).await.unwrap();
    assert_eq!((text(a).await, text(b).await), ("c".into(), "c".into()));
    assert_eq!(seen.conns.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_app_closing_idle_connections_fails_no_request() {
    let (uri, seen) = app("ok", true).await;
    let pool = pool_for(&uri);
    for i in 0..10 {
        let r = pool.send(get("/")).await;
        assert_eq!(
            text(r.unwrap_or_else(|e| panic!("request {i}: {e}"))).await,
            "ok"
        );
    }
    assert_eq!(
        seen.heads.lock().unwrap().len(),
        10,
        "each request sent once"
    );
}

#[tokio::test]
async fn nothing_listening_is_a_connect_error() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let uri: Uri = format!("http://{}", l.local_addr().unwrap())
        .parse()
        .unwrap();
    drop(l);
    let e = pool_for(&uri).send(get("/")).await.unwrap_err();
    assert!(matches!(e, UpstreamError::Connect(_)), "{e:?}");
}

/// A real `hyper::Error`: a request on a connection the server closes
/// at once.
async fn hyper_client_error() -> hyper::Error {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (c, _) = l.accept().await.unwrap();
        drop(c);
    });
    let s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get("/")
        .header(header::HOST, "a")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    sender.send_request(req).await.unwrap_err()
}

/// A request body whose first frame is the error `e`.
struct Failing(Option<BodyError>);

impl HttpBody for Failing {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        Poll::Ready(self.0.take().map(Err))
    }
}

#[tokio::test]
async fn a_failing_client_body_is_told_apart_from_an_app_failure() {
    let (uri, _seen) = app("never", false).await;
    let pool = pool_for(&uri);
    // A client body that fails (as a malformed chunked one does): a bad
    // request the ingress answers with 400.
    let body = Failing(Some(BodyError::Client(hyper_client_error().await))).boxed_unsync();
    let req = Request::post("/echo")
        .header(header::TRANSFER_ENCODING, "chunked")
        .body(body)
        .unwrap();
    let e = pool.send(req).await.unwrap_err();
    let app_error = crate::adapters::serve::app::AppError {
        uri: uri.to_string(),
        source: e,
    };
    assert!(app_error.client_body().is_some(), "{app_error:?}");
    // The app failing is not the client's fault.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone: Uri = format!("http://{}", l.local_addr().unwrap())
        .parse()
        .unwrap();
    drop(l);
    let app_error = crate::adapters::serve::app::AppError {
        uri: gone.to_string(),
        source: pool_for(&gone).send(get("/")).await.unwrap_err(),
    };
    assert!(app_error.client_body().is_none(), "{app_error:?}");
}

fn put(path: &str, body: &'static str) -> Request<Body> {
    Request::put(path)
        .header(header::CONTENT_LENGTH, body.len())
        .body(body::full(body))
        .unwrap()
}

#[tokio::test]
async fn a_get_the_app_closed_unanswered_on_a_reused_connection_is_sent_again() {
    let (uri, seen) = app_with(Mode::DropSecond, |_| {
        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".into()
    })
    .await;
    let pool = pool_for(&uri);
    assert_eq!(text(pool.send(get("/1")).await.unwrap()).await, "ok");
    // The second goes on the reused connection, which the app closes
    // after reading it: sent again on a new connection, answered there.
    // No copy of it is kept: hyper hands the written request back
    // (`keep_sent_head`), every header line of it.
    let mut second = get("/2");
    second
        .headers_mut()
        .insert("x-kept", http::HeaderValue::from_static("1"));
    assert_eq!(text(pool.send(second).await.unwrap()).await, "ok");
    assert_eq!(seen.conns.load(Ordering::SeqCst), 2);
    let heads = seen.heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 3, "{heads:?}");
    assert!(
        heads[1].starts_with("GET /2 ") && heads[1].contains("x-kept: 1\r\n"),
        "{heads:?}"
    );
    assert_eq!(heads[2], heads[1], "sent again as it was sent first");
}

/// The request sent again carries the 1xx callback too (the kept head
/// has no extensions: each attempt gets the callback anew), so the app's
/// `103` on the new connection reaches the request's sink, once.
#[tokio::test]
async fn a_request_sent_again_still_relays_the_apps_informational_answers() {
    let (uri, _seen) = app_with(Mode::DropSecond, |_| {
        "HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\n\
         HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
            .into()
    })
    .await;
    let pool = pool_for(&uri);
    let with_sink = |path: &str| {
        let (sink, rx) = crate::adapters::informational::channel();
        let mut req = get(path);
        req.extensions_mut().insert(sink);
        (req, rx)
    };
    let (first, mut first_rx) = with_sink("/1");
    assert_eq!(text(pool.send(first).await.unwrap()).await, "ok");
    assert_eq!(
        first_rx.recv().await.unwrap().status,
        StatusCode::EARLY_HINTS
    );
    // Sent on the reused connection, dropped unanswered, sent again.
    let (second, mut rx) = with_sink("/2");
    assert_eq!(text(pool.send(second).await.unwrap()).await, "ok");
    let hint = rx.recv().await.unwrap();
    assert_eq!(hint.status, StatusCode::EARLY_HINTS);
    assert_eq!(hint.headers["link"], "</a.css>");
    assert!(rx.try_recv().is_err(), "one 103 per attempt answered");
}

#[tokio::test]
async fn a_small_put_is_sent_again_with_its_body() {
    let (uri, seen) = app_with(Mode::DropSecond, |_| {
        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".into()
    })
    .await;
    let pool = pool_for(&uri);
    text(pool.send(get("/1")).await.unwrap()).await;
    assert_eq!(
        text(pool.send(put("/p", "hello")).await.unwrap()).await,
        "ok"
    );
    let heads = seen.heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 3, "{heads:?}");
    assert!(
        heads[2].starts_with("PUT /p ") && heads[2].ends_with("body-len: 5"),
        "{}",
        heads[2]
    );
}

#[tokio::test]
async fn a_post_the_app_closed_unanswered_is_not_sent_again() {
    let (uri, seen) = app_with(Mode::DropSecond, |_| {
        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".into()
    })
    .await;
    let pool = pool_for(&uri);
    text(pool.send(get("/1")).await.unwrap()).await;
    let post = Request::post("/order")
        .header(header::CONTENT_LENGTH, "3")
        .body(body::full("abc"))
        .unwrap();
    let e = pool.send(post).await.unwrap_err();
    assert!(
        matches!(&e, UpstreamError::Http(h) if never_answered(h)),
        "{e:?}"
    );
    // The app may have acted on it: not sent twice.
    assert_eq!(seen.conns.load(Ordering::SeqCst), 1);
    assert_eq!(seen.heads.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_get_on_a_new_connection_the_app_drops_is_not_sent_again() {
    // The resend is for a connection that sat idle in the pool; an app
    // that fails a fresh connection fails the request.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri: Uri = format!("http://{}", l.local_addr().unwrap())
        .parse()
        .unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let a = Arc::clone(&accepted);
    tokio::spawn(async move {
        loop {
            let (mut c, _) = l.accept().await.unwrap();
            a.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 1024];
            let _ = c.read(&mut buf).await;
        }
    });
    let e = pool_for(&uri).send(get("/")).await.unwrap_err();
    assert!(matches!(&e, UpstreamError::Http(_)), "{e:?}");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn connections_idle_past_the_idle_time_are_not_reused() {
    let (uri, seen) = app("x", false).await;
    let short = pool_with(&uri, Duration::from_millis(50));
    text(short.send(get("/")).await.unwrap()).await;
    // Idle for longer than its idle time: closed, a new one is made.
    tokio::time::sleep(Duration::from_millis(120)).await;
    text(short.send(get("/")).await.unwrap()).await;
    assert_eq!(seen.conns.load(Ordering::SeqCst), 2);
    // Within its idle time: reused.
    let long = pool_with(&uri, Duration::from_secs(60));
    text(long.send(get("/")).await.unwrap()).await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    text(long.send(get("/")).await.unwrap()).await;
    assert_eq!(seen.conns.load(Ordering::SeqCst), 3);
    // Zero: never reused.
    let never = pool_with(&uri, Duration::ZERO);
    text(never.send(get("/")).await.unwrap()).await;
    text(never.send(get("/")).await.unwrap()).await;
    assert_eq!(seen.conns.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn content_length_beside_transfer_encoding_is_dropped() {
    let (uri, _) = app_with(Mode::KeepAlive, |_| {
        "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".into()
    })
    .await;
    let resp = pool_for(&uri).send(get("/")).await.unwrap();
    assert!(!resp.headers().contains_key(header::CONTENT_LENGTH));
    assert_eq!(resp.headers()[header::TRANSFER_ENCODING], "chunked");
    assert_eq!(text(resp).await, "hello");
}

#[tokio::test]
async fn a_101_without_an_upgrade_is_an_error_and_its_connection_is_dropped() {
    let (uri, seen) = app_with(Mode::KeepAlive, |head| {
        if head.starts_with("GET /switch ") {
            "HTTP/1.1 101 Switching Protocols\r\n\r\n".into()
        } else {
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".into()
        }
    })
    .await;
    let pool = pool_for(&uri);
    let e = pool.send(get("/switch")).await.unwrap_err();
    assert!(matches!(e, UpstreamError::SwitchingProtocols), "{e:?}");
    assert_eq!(text(pool.send(get("/after")).await.unwrap()).await, "ok");
    assert_eq!(seen.conns.load(Ordering::SeqCst), 2, "not reused after 101");
}

#[tokio::test]
async fn serves_over_a_unix_socket() {
    let dir = std::env::temp_dir().join(format!("peerlb-upstream-unix-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("app.sock");
    let l = tokio::net::UnixListener::bind(&path).unwrap();
    tokio::spawn(async move {
        loop {
            let (mut c, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    match c.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8(buf.drain(..end + 4).collect()).unwrap();
                        let host = head
                            .lines()
                            .find_map(|l| l.strip_prefix("host: "))
                            .unwrap_or("")
                            .to_owned();
                        let resp = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{host}",
                            host.len()
                        );
                        if c.write_all(resp.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    let pool = Upstream::new(&AppAddr::Unix(path.clone()), Duration::from_secs(2));
    // No Host from the client: the socket's `localhost`.
    assert_eq!(text(pool.send(get("/")).await.unwrap()).await, "localhost");
    assert_eq!(text(pool.send(get("/")).await.unwrap()).await, "localhost");
    let missing = Upstream::new(
        &AppAddr::Unix(dir.join("none.sock")),
        Duration::from_secs(2),
    );
    match missing.send(get("/")).await {
        Err(UpstreamError::Connect(e)) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound),
        other => panic!("{other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}
