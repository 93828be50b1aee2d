use super::*;

fn ctx() -> ServeCtx<'static> {
    static N2: std::sync::LazyLock<NodeId> = std::sync::LazyLock::new(|| NodeId::from("n2"));
    static N1: std::sync::LazyLock<NodeId> = std::sync::LazyLock::new(|| NodeId::from("n1"));
    ServeCtx {
        node: &N2,
        entry: &N1,
        key: Some("alice"),
        client: "127.0.0.1:4000".parse().unwrap(),
        tls: None,
        forwarded: None,
    }
}

fn builtin_app() -> App {
    App::new(
        &AppKind::Builtin,
        Arc::new(AtomicU32::new(1)),
        Handle::alone(NodeId::from("n2")),
    )
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(body::empty()).unwrap()
}

#[tokio::test]
async fn json_answer_names_node_entry_and_key() {
    let app = builtin_app();
    let r = app.serve(get("/x?user=alice"), ctx()).await.unwrap();
    let b = r.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["node"], "n2");
    assert_eq!(v["entry"], "n1");
    assert_eq!(v["proxied"], true);
    assert_eq!(v["key"], "alice");
    assert_eq!(v["path"], "/x");
}

/// Records what it is told: (entry, key, path and query).
#[derive(Default)]
struct Served(std::sync::Mutex<Vec<(String, Option<String>, String)>>);

impl Observer for Served {
    fn observe(&self, event: &NodeEvent<'_>) {
        if let NodeEvent::Served {
            entry,
            key,
            path_and_query,
        } = *event
        {
            let mut g = self.0.lock().unwrap();
            g.push((entry.into(), key.map(Into::into), path_and_query.into()));
        }
    }
}

#[tokio::test]
async fn every_request_served_is_reported_to_the_observer() {
    let seen = Arc::new(Served::default());
    let app = builtin_app().with_observer(seen.clone());
    app.serve(get("/x?user=alice&r=c1-7"), ctx()).await.unwrap();
    app.serve(get("/delay/abc"), ctx()).await.unwrap();
    let got = seen.0.lock().unwrap().clone();
    let alice = || (String::from("n1"), Some(String::from("alice")));
    assert_eq!(
        got,
        vec![
            (alice().0, alice().1, "/x?user=alice&r=c1-7".to_owned()),
            (alice().0, alice().1, "/delay/abc".to_owned()),
        ]
    );
}

#[tokio::test]
async fn session_sets_a_cookie_with_increasing_ids() {
    let app = builtin_app();
    for n in 1..=2 {
        let r = app.serve(get("/session"), ctx()).await.unwrap();
        assert_eq!(
            r.headers()[header::SET_COOKIE],
            format!("session=n2-{n}; Path=/").as_str()
        );
    }
}

#[tokio::test]
async fn bytes_streams_exactly_n_bytes_of_the_pattern() {
    let app = builtin_app();
    let r = app.serve(get("/bytes/200000"), ctx()).await.unwrap();
    assert_eq!(r.headers()[header::CONTENT_LENGTH], "200000");
    let b = r.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(b.len(), 200_000);
    assert!(
        b.iter()
            .enumerate()
            .all(|(i, &x)| x == ((i % (64 * 1024)) % 251) as u8)
    );
    let r = app.serve(get("/bytes/huge"), ctx()).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test(start_paused = true)]
async fn delay_waits_then_answers_and_refuses_too_long() {
    let app = builtin_app();
    let t0 = tokio::time::Instant::now();
    let r = app.serve(get("/delay/1500"), ctx()).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(t0.elapsed(), Duration::from_millis(1500));
    // The answer after the wait names what the request was told, as an
    // immediate one does (kept owned across the wait).
    let b = r.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(
        (
            &v["node"],
            &v["entry"],
            &v["key"],
            &v["client"],
            &v["proxied"]
        ),
        (
            &"n2".into(),
            &"n1".into(),
            &"alice".into(),
            &"127.0.0.1:4000".into(),
            &true.into()
        )
    );
    let r = app.serve(get("/delay/60001"), ctx()).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn echo_returns_the_body() {
    let app = builtin_app();
    let req = Request::post("/echo")
        .header(header::CONTENT_LENGTH, "5")
        .body(body::full("hello"))
        .unwrap();
    let r = app.serve(req, ctx()).await.unwrap();
    assert_eq!(r.headers()[header::CONTENT_LENGTH], "5");
    assert_eq!(
        &r.into_body().collect().await.unwrap().to_bytes()[..],
        b"hello"
    );
}

#[test]
fn hop_by_hop_headers_and_those_connection_names_are_removed() {
    let mut h = http::HeaderMap::new();
    h.insert(
        header::CONNECTION,
        HeaderValue::from_static("keep-alive, X-Secret"),
    );
    h.insert("x-secret", HeaderValue::from_static("1"));
    h.insert("te", HeaderValue::from_static("trailers"));
    h.insert("x-kept", HeaderValue::from_static("1"));
    strip_hop_by_hop(&mut h);
    assert_eq!(h.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["x-kept"]);
}

#[tokio::test]
async fn unreachable_upstream_is_an_app_error() {
    // Port 9 on loopback: nothing listens (discard service is not run here).
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let app = App::new(
        &AppKind::Upstream(crate::config::UpstreamApp {
            addr: crate::config::AppAddr::Http(format!("http://{addr}").parse().unwrap()),
            idle_timeout: Duration::from_secs(2),
        }),
        Arc::new(AtomicU32::new(1)),
        Handle::alone(NodeId::from("n2")),
    );
    let e = app.serve(get("/"), ctx()).await.unwrap_err();
    assert!(e.to_string().contains(&addr.to_string()), "{e}");
}

/// A service that is not ready until its gate opens: it keeps the waker
/// of its last `poll_ready` and counts its calls.
#[derive(Clone, Default)]
struct Gated {
    open: Arc<std::sync::atomic::AtomicBool>,
    waker: Arc<std::sync::Mutex<Option<std::task::Waker>>>,
    calls: Arc<AtomicU32>,
}

impl tower::Service<Request<Body>> for Gated {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Response<Body>, std::convert::Infallible>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        if self.open.load(Ordering::SeqCst) {
            return std::task::Poll::Ready(Ok(()));
        }
        *self.waker.lock().unwrap() = Some(cx.waker().clone());
        std::task::Poll::Pending
    }

    fn call(&mut self, _: Request<Body>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(Response::new(body::full("gated"))))
    }
}

#[tokio::test]
async fn a_service_not_ready_at_once_is_called_once_it_wakes_the_request() {
    // The erased call polls readiness first with a waker that does nothing;
    // a service not ready then must still be waited for with the
    // request's own waker, and called once, when it is ready.
    let gated = Gated::default();
    let app = App::erased(
        service::ErasedApp::new(gated.clone()),
        Handle::alone(NodeId::from("n2")),
    );
    let serving = tokio::spawn(async move {
        let r = app.serve(get("/x"), ctx()).await.unwrap();
        r.into_body().collect().await.unwrap().to_bytes()
    });
    tokio::task::yield_now().await;
    assert!(
        !serving.is_finished(),
        "answered before the service was ready"
    );
    assert_eq!(gated.calls.load(Ordering::SeqCst), 0);
    gated.open.store(true, Ordering::SeqCst);
    let waker = gated.waker.lock().unwrap().take();
    let waker = waker.expect("the request's task left its waker");
    assert!(
        !waker.will_wake(std::task::Waker::noop()),
        "the last readiness poll was the no-op one: nothing would wake the request"
    );
    waker.wake();
    assert_eq!(serving.await.unwrap(), "gated");
    assert_eq!(gated.calls.load(Ordering::SeqCst), 1);
}

/// A service whose readiness fails.
#[derive(Clone)]
struct Broken;

impl tower::Service<Request<Body>> for Broken {
    type Response = Response<Body>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Response<Body>, std::io::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Err(std::io::Error::other("backend gone")))
    }

    fn call(&mut self, _: Request<Body>) -> Self::Future {
        unreachable!("a service that is not ready is never called")
    }
}

#[tokio::test]
async fn a_service_whose_readiness_fails_answers_the_app_error_it_gave() {
    let app = App::erased(
        service::ErasedApp::new(Broken),
        Handle::alone(NodeId::from("n2")),
    );
    let e = app.serve(get("/x"), ctx()).await.unwrap_err();
    assert_eq!(e.uri, "embedded app");
    assert!(e.to_string().contains("backend gone"), "{e}");
}
