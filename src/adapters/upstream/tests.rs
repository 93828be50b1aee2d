use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::adapters::body;

/// What the test app saw: connections accepted, request heads in order.
#[derive(Default)]
struct Seen {
    conns: AtomicUsize,
    heads: Mutex<Vec<String>>,
}

/// A raw HTTP/1.1 app on loopback answering every request with `body`
/// (keep-alive); with `close_after_each` it closes the connection right
/// after each response without saying so (an app dropping idle
/// connections).
async fn app(body: &'static str, close_after_each: bool) -> (Uri, Arc<Seen>) {
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
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let mut chunk = [0u8; 4096];
                    let n = match c.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head: Vec<u8> = buf.drain(..end + 4).collect();
                        s.heads
                            .lock()
                            .unwrap()
                            .push(String::from_utf8(head).unwrap());
                        let resp = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if c.write_all(resp.as_bytes()).await.is_err() {
                            return;
                        }
                        if close_after_each {
                            return;
                        }
                    }
                }
            });
        }
    });
    (uri, seen)
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
    let pool = Upstream::new(&uri);
    for _ in 0..5 {
        assert_eq!(text(pool.send(get("/a")).await.unwrap()).await, "hello");
    }
    assert_eq!(seen.conns.load(Ordering::SeqCst), 1);
    assert_eq!(seen.heads.lock().unwrap().len(), 5);
}

#[tokio::test]
async fn adds_host_when_missing_and_speaks_http11_in_origin_form() {
    let (uri, seen) = app("x", false).await;
    let pool = Upstream::new(&uri);
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
    let pool = Upstream::new(&uri);
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
    let pool = Upstream::new(&uri);
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
    let pool = Upstream::new(&uri);
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
    let e = Upstream::new(&uri).send(get("/")).await.unwrap_err();
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
    let pool = Upstream::new(&uri);
    // A client body that fails (as a malformed chunked one does): a bad
    // request the ingress answers with 400.
    let body = Failing(Some(BodyError::Client(hyper_client_error().await))).boxed_unsync();
    let req = Request::post("/echo")
        .header(header::TRANSFER_ENCODING, "chunked")
        .body(body)
        .unwrap();
    let e = pool.send(req).await.unwrap_err();
    let app_error = crate::adapters::app::AppError {
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
    let app_error = crate::adapters::app::AppError {
        uri: gone.to_string(),
        source: Upstream::new(&gone).send(get("/")).await.unwrap_err(),
    };
    assert!(app_error.client_body().is_none(), "{app_error:?}");
}
