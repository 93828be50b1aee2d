//! Failover rules at the entry node, drain on SIGTERM, and upstream app
//! mode, over real `peerlb` processes on loopback.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use support::*;

/// One request on its own connection, as the failover tests send it.
async fn send(addr: std::net::SocketAddr, method: &str, target: String, body: Bytes) -> Resp {
    let mut conn = Conn::open(addr).await.unwrap();
    conn.request(method, &target, &[], body)
        .await
        .unwrap_or_else(|e| panic!("{method} {target}: {e}"))
}

/// A PUT with a chunked body (no Content-Length) on a raw connection.
fn chunked_put(addr: std::net::SocketAddr, target: &str) -> (String, bool) {
    raw_exchange(
        addr,
        format!(
            "PUT {target} HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nstate\r\n0\r\n\r\n"
        )
        .as_bytes(),
    )
}

/// The replay rules when the owner dies after the request reached it
/// (docs/architecture.md, "Failover and replay"): a request is replayed on
/// the next candidate when its method is idempotent and it has no body or
/// a Content-Length body of at most 64 KiB; every other request gets 502
/// from the entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_dying_mid_request_replays_only_small_idempotent_requests() {
    let app = GatedApp::start().await;
    let mut c = Cluster::start(
        "midreq",
        3,
        &format!("app = \"http://{}\"\n[ring]\nvnodes = 1024\n", app.addr),
        // The kill is seen when n1's link to n2 idles out: 4 s rides out a
        // loaded machine's stalls (a stall past the idle timeout would
        // replay the held requests before the kill).
        &format!("[peer]\nkeep_alive_ms = 300\nidle_timeout_ms = 4000\n\n{USER_RULES}"),
    );
    let r = ring(&["n1", "n2", "n3"], 1024);
    // A key owned by n2, entering at n1; its next node serves the replays.
    let user = user_where(&r, |o| o == "n2");
    let next = r.candidates(&user).nth(1).unwrap().to_string();
    let entry = c.nodes[0].http;
    const LIMIT: usize = 64 * 1024;
    // (method, path, body, replayed?)
    let cases: Vec<(&str, &str, Bytes, bool)> = vec![
        ("GET", "/hold/get", Bytes::new(), true),
        ("HEAD", "/hold/head", Bytes::new(), true),
        ("DELETE", "/hold/delete", Bytes::new(), true),
        ("OPTIONS", "/hold/options", Bytes::new(), true),
        ("TRACE", "/hold/trace", Bytes::new(), true),
        ("PUT", "/hold/put-small", Bytes::from_static(b"state"), true),
        ("PUT", "/hold/put-64k", Bytes::from(vec![b'a'; LIMIT]), true),
        (
            "PUT",
            "/hold/put-64k-plus-1",
            Bytes::from(vec![b'a'; LIMIT + 1]),
            false,
        ),
        ("PATCH", "/hold/patch", Bytes::from_static(b"state"), false),
        ("POST", "/hold/post-empty", Bytes::new(), false),
    ];
    let tasks: Vec<_> = cases
        .iter()
        .map(|(m, p, b, _)| tokio::spawn(send(entry, m, format!("{p}?user={user}"), b.clone())))
        .collect();
    let chunked = tokio::task::spawn_blocking({
        let target = format!("/hold/put-chunked?user={user}");
        move || chunked_put(entry, &target)
    });
    // Every request is held by the app behind n2: n2 dies before answering.
    let held = cases.len() as u64 + 1;
    eventually(Duration::from_secs(20), || app.arrived_total() == held)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{} of {held} requests reached n2's app",
                app.arrived_total()
            )
        });
    c.kill9("n2");
    app.release();
    for ((method, path, body, replayed), t) in cases.iter().zip(tasks) {
        let resp = t.await.unwrap();
        assert_eq!(resp.header("peerlb-entry"), Some("n1"), "{method} {path}");
        if *replayed {
            assert_eq!(
                resp.status, 200,
                "{method} {path} is replayed: {:?}",
                resp.body
            );
            assert_eq!(resp.served_by(), next, "{method} {path}");
            assert_eq!(app.arrived(path), 2, "{method} {path}: sent twice");
            if *method != "HEAD" {
                assert_eq!(
                    String::from_utf8_lossy(&resp.body),
                    format!("app {method} {path}?user={user} {}", body.len()),
                    "the replay carries the whole body"
                );
            }
        } else {
            assert_eq!(resp.status, 502, "{method} {path} is not replayed");
            assert_eq!(
                resp.header("peerlb-error-from"),
                Some("n1"),
                "{method} {path}"
            );
            assert_eq!(resp.header("peerlb-served-by"), None, "{method} {path}");
            assert_eq!(app.arrived(path), 1, "{method} {path}: sent once");
        }
    }
    let (text, _) = chunked.await.unwrap();
    assert!(
        text.starts_with("HTTP/1.1 502"),
        "a chunked PUT is not replayed: {text:?}"
    );
    assert!(text.contains("peerlb-error-from: n1\r\n"), "{text:?}");
    assert_eq!(app.arrived("/hold/put-chunked"), 1);
}

// SIGTERM drains: in-flight requests finish, none routed to the leaving node fails (case C8 in docs/cases.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c8_sigterm_drains_in_flight_requests_and_loses_none_routed_to_the_leaving_node() {
    let app = GatedApp::start().await;
    let mut c = Cluster::start(
        "drain",
        3,
        &format!(
            "app = \"http://{}\"\n[ring]\nvnodes = 1024\n[limits]\ndrain_grace_ms = 800\n",
            app.addr
        ),
        &format!("{STEADY}{USER_RULES}"),
    );
    let r = ring(&["n1", "n2", "n3"], 1024);
    let user = user_where(&r, |o| o == "n2");
    let (n1, n2, n3) = (c.nodes[0].http, c.nodes[1].http, c.nodes[2].http);
    // A request held by n2's app when n2 is told to stop.
    let long = tokio::spawn(send(
        n1,
        "GET",
        format!("/hold/long?user={user}"),
        Bytes::new(),
    ));
    eventually(Duration::from_secs(10), || app.arrived("/hold/long") == 1)
        .await
        .expect("the long request reaches n2's app");
    // Continuous traffic entering through the nodes that stay.
    let stop = Arc::new(AtomicBool::new(false));
    // Set just before SIGTERM: requests sent after it show who served
    // during n2's grace period.
    let termed = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for (k, addr) in [n1, n3, n1, n3].into_iter().enumerate() {
        let (stop, termed, ok, failed) = (stop.clone(), termed.clone(), ok.clone(), failed.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr).await.unwrap();
            let mut served_after_term = BTreeSet::new();
            let mut i = k * 1000;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let after_term = termed.load(Ordering::Relaxed);
                match conn.get(&format!("/x?user=u{}", i % 100), &[]).await {
                    Ok(r) if r.status == 200 => {
                        ok.fetch_add(1, Ordering::Relaxed);
                        if after_term {
                            served_after_term.insert(r.served_by().to_owned());
                        }
                    }
                    other => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        eprintln!("failed: {other:?}");
                    }
                }
            }
            served_after_term
        }));
    }
    eventually(Duration::from_secs(20), || ok.load(Ordering::Relaxed) >= 40)
        .await
        .expect("traffic flows before the SIGTERM");
    termed.store(true, Ordering::Relaxed);
    let mut child = c.sigterm("n2");
    // n2's grace ends and its listeners close while the long request is
    // still held: the drain must wait for it.
    eventually(Duration::from_secs(20), || {
        std::net::TcpStream::connect(n2).is_err()
    })
    .await
    .expect("n2 closes its listeners after the grace period");
    let in_flight = child.try_wait().unwrap().is_none();
    app.release();
    let exited = eventually(Duration::from_secs(20), || {
        child.try_wait().unwrap().is_some()
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut served = BTreeSet::new();
    for t in tasks {
        served.extend(t.await.unwrap());
    }
    assert!(in_flight, "n2 exited with a request in flight");
    exited.expect("n2 exits after draining");
    assert!(
        child.wait().unwrap().success(),
        "a drained node exits with status 0"
    );
    let long = long.await.unwrap();
    assert_eq!(
        long.status, 200,
        "the in-flight request finished before n2 closed"
    );
    assert_eq!(long.served_by(), "n2");
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "requests failed while n2 was leaving"
    );
    assert!(
        served.contains("n2"),
        "n2 kept serving requests sent after its SIGTERM, during its grace period: {served:?}"
    );
    assert_eq!(serving(n1).unwrap(), vec!["n1", "n3"]);
    let log = c.log("n2");
    assert!(
        log.contains("draining") && log.contains("node stopped"),
        "{log}"
    );
}

/// A tiny upstream app: answers `upstream <path> <x-forwarded-for>` and
/// counts its TCP connections.
async fn upstream() -> (std::net::SocketAddr, Arc<AtomicU64>) {
    use hyper::service::service_fn;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicU64::new(0));
    let counted = conns.clone();
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            counted.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let svc = service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                    let xff = req
                        .headers()
                        .get("x-forwarded-for")
                        .map(|v| v.to_str().unwrap().to_owned());
                    let text = format!("upstream {} {}", req.uri(), xff.unwrap_or_default());
                    Ok::<_, std::convert::Infallible>(http::Response::new(
                        http_body_util::Full::new(Bytes::from(text)),
                    ))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    (addr, conns)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_mode_proxies_to_the_local_app_through_a_connection_pool() {
    let (app, conns) = upstream().await;
    let c = Cluster::start(
        "upstream",
        3,
        &format!("app = \"http://{app}\"\n[ring]\nvnodes = 1024\n"),
        USER_RULES,
    );
    let r = ring(&["n1", "n2", "n3"], 1024);
    let user = user_where(&r, |o| o == "n3");
    let mut conn = Conn::open(c.nodes[0].http).await.unwrap();
    for _ in 0..20 {
        let resp = conn
            .get(&format!("/api/items?user={user}"), &[])
            .await
            .unwrap();
        assert_eq!(resp.status, 200);
        assert_eq!(resp.served_by(), "n3");
        assert_eq!(
            String::from_utf8_lossy(&resp.body),
            format!("upstream /api/items?user={user} 127.0.0.1")
        );
    }
    assert_eq!(
        conns.load(Ordering::Relaxed),
        1,
        "20 sequential requests reuse one pooled upstream connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_app_gives_502_from_the_owner() {
    let dead = free_port();
    let c = Cluster::start(
        "noupstream",
        2,
        &format!("app = \"http://127.0.0.1:{dead}\"\n"),
        USER_RULES,
    );
    let resp = get(c.nodes[0].http, "/x?user=a", &[]).await;
    assert_eq!(resp.status, 502);
    assert!(String::from_utf8_lossy(&resp.body).contains(&dead.to_string()));
}

/// A POST on the admin address of the node whose client address is
/// `http`: the raw answer.
fn admin_post(http: std::net::SocketAddr, path: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(admin_of(http)).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.0\r\nhost: 127.0.0.1\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// An owner that is shutting down refuses a proxied request before it
/// reads any of it (stream reset, code 2 "refused"): the entry replays a
/// request with no body on the next candidate, even a POST, and the
/// client gets 200; a POST whose body streamed once gets 502 from the
/// entry (docs/architecture.md, "Failover and replay": refused).
///
/// The owner (n2) is held alive past its SIGTERM by a request its app
/// holds, refuses new proxied streams at once (`drain_grace_ms = 0`), and
/// the entry (n1) does not hear that it is leaving: n1 alone moved to a
/// new gossip key, so it reads none of n2's gossip (phi 1000 keeps n2 in
/// its view meanwhile) while their QUIC connection stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_without_a_body_is_replayed_even_a_post_and_a_streamed_post_is_not() {
    use peerlb::keyring::{GossipKey, Keyring};
    let app = GatedApp::start().await;
    let mut c = Cluster::start_phi(
        "refused",
        2,
        1000,
        &format!(
            "app = \"http://{}\"\n{STEADY}[limits]\ndrain_grace_ms = 0\ndrain_timeout_ms = 60000\n",
            app.addr
        ),
        USER_RULES,
    );
    let (entry, owner) = (c.node("n1").http, c.node("n2").http);
    let user = user_where(&ring(&["n1", "n2"], 1024), |o| o == "n2");
    // A request held by n2's app keeps n2 running once it is told to stop.
    let held = tokio::spawn(send(
        entry,
        "GET",
        format!("/hold?user={user}"),
        Bytes::new(),
    ));
    eventually(Duration::from_secs(10), || app.arrived("/hold") == 1)
        .await
        .expect("the held request did not reach n2's app");

    // n1 alone moves to a new gossip key: it no longer opens n2's gossip.
    let old = Keyring::load(&c.dir.join("certs").join("gossip.keys")).unwrap();
    let new = GossipKey::from_bytes([7; 32]);
    for (op, arg) in [
        ("install", new.to_base64()),
        ("use", new.fingerprint()),
        ("remove", old.keys()[0].fingerprint()),
    ] {
        let r = admin_post(entry, &format!("/_peerlb/keyring/{op}"), &arg);
        assert!(r.starts_with("HTTP/1.0 200"), "keyring {op}: {r}");
    }
    let unauthenticated = || {
        status(entry)
            .and_then(|v| v["gossip"]["dropped"]["unauthenticated"].as_u64())
            .unwrap_or(0)
    };
    let cut_at = unauthenticated();
    eventually(Duration::from_secs(10), || unauthenticated() > cut_at + 2)
        .await
        .expect("n1 still opens n2's gossip");

    // n2 stops: it publishes leaving (n1 cannot read it) and refuses new
    // proxied streams before its client listener closes.
    let mut stopping = c.sigterm("n2");
    eventually(Duration::from_secs(10), || {
        std::net::TcpStream::connect(owner).is_err()
    })
    .await
    .expect("n2's client listener did not close");
    assert_eq!(
        serving(entry),
        Some(vec!["n1".to_owned(), "n2".to_owned()]),
        "n1 must still route to n2 for this test"
    );
    let failovers = counter(entry, "failovers");

    // A POST without a body: refused by n2, replayed on n1 (the next
    // candidate), served once.
    let resp = send(entry, "POST", format!("/post?user={user}"), Bytes::new()).await;
    assert_eq!(
        (resp.status, resp.served_by()),
        (200, "n1"),
        "{:?}",
        resp.body
    );
    assert_eq!(
        resp.body,
        Bytes::from(format!("app POST /post?user={user} 0"))
    );
    assert_eq!(app.arrived("/post"), 1);
    assert_eq!(counter(entry, "failovers"), failovers + 1);

    // A POST with a body streams it once: refused, it is not replayed.
    let resp = send(
        entry,
        "POST",
        format!("/streamed?user={user}"),
        Bytes::from("hello"),
    )
    .await;
    assert_eq!(resp.status, 502, "{:?}", resp.body);
    assert_eq!(resp.header("peerlb-error-from"), Some("n1"));
    assert_eq!(resp.header("peerlb-entry"), Some("n1"));
    assert_eq!(
        app.arrived("/streamed"),
        0,
        "a refused request reached an app"
    );
    let log = c.log("n1");
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains("forward failed after the request was sent")
                && l.contains("peer n2 refused the request")
        })
        .collect();
    assert!(
        refused.len() == 2
            && refused[0].contains("retry=true")
            && refused[1].contains("retry=false"),
        "{log}"
    );
    // The warning names the client itself: the client connection's span
    // is at debug level (entered on every poll: too dear per request).
    assert!(
        refused
            .iter()
            .all(|l| l.contains("client=127.0.0.1:") && !l.contains("conn{")),
        "{log}"
    );

    // The held request still completes on n2, which then stops.
    app.release();
    let resp = held.await.unwrap();
    assert_eq!((resp.status, resp.served_by()), (200, "n2"));
    let exit = tokio::task::spawn_blocking(move || stopping.wait().unwrap())
        .await
        .unwrap();
    assert!(exit.success(), "n2 did not stop cleanly: {exit:?}");
}
