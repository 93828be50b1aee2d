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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_dying_mid_request_retries_get_and_put_and_fails_a_post_with_502() {
    let mut c = Cluster::start("midreq", 3, "[ring]\nvnodes = 1024\n", USER_RULES);
    let r = ring(&["n1", "n2", "n3"], 1024);
    // A key owned by n2 whose next node is n3, entering at n1.
    let user = user_where(&r, |o| o == "n2");
    let next = r.candidates(&user).nth(1).unwrap().to_string();
    let entry = c.nodes[0].http;
    let get_task = tokio::spawn({
        let user = user.clone();
        async move { get(entry, &format!("/delay/1500?user={user}"), &[]).await }
    });
    let post_task = tokio::spawn({
        let user = user.clone();
        async move {
            let mut conn = Conn::open(entry).await.unwrap();
            conn.request(
                "POST",
                &format!("/delay/1500?user={user}"),
                &[],
                Bytes::new(),
            )
            .await
            .unwrap()
        }
    });
    // A PUT with a small body: kept for replay (at most 64 KiB).
    let put_task = tokio::spawn({
        let user = user.clone();
        async move {
            let mut conn = Conn::open(entry).await.unwrap();
            conn.request(
                "PUT",
                &format!("/delay/1500?user={user}"),
                &[],
                Bytes::from_static(b"state"),
            )
            .await
            .unwrap()
        }
    });
    // The three requests are now in flight on n2: it dies before answering.
    c.wait_until(Duration::from_secs(5), || {
        status(c.nodes[1].http).is_some_and(|s| s["inflight"].as_u64() == Some(3))
    })
    .expect("all three requests reach n2");
    c.kill9("n2");
    let got = get_task.await.unwrap();
    assert_eq!(
        got.status, 200,
        "an idempotent request that may have reached the dead owner is retried"
    );
    assert_eq!(got.served_by(), next);
    let put = put_task.await.unwrap();
    assert_eq!(
        put.status, 200,
        "a PUT with a small body is replayed on the next node"
    );
    assert_eq!(put.served_by(), next);
    let posted = post_task.await.unwrap();
    assert_eq!(
        posted.status, 502,
        "a POST that may have reached the dead owner is not replayed"
    );
    assert_eq!(posted.header("peerlb-entry"), Some("n1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c8_sigterm_drains_in_flight_requests_and_loses_none_routed_to_the_leaving_node() {
    let mut c = Cluster::start(
        "drain",
        3,
        "[ring]\nvnodes = 1024\n[limits]\ndrain_grace_ms = 800\n",
        USER_RULES,
    );
    let r = ring(&["n1", "n2", "n3"], 1024);
    let user = user_where(&r, |o| o == "n2");
    let (n1, n3) = (c.nodes[0].http, c.nodes[2].http);
    // A long request on n2 when it is told to stop.
    let long = tokio::spawn({
        let user = user.clone();
        async move { get(n1, &format!("/delay/1500?user={user}"), &[]).await }
    });
    c.wait_until(Duration::from_secs(5), || {
        status(c.nodes[1].http).is_some_and(|s| s["inflight"].as_u64() == Some(1))
    })
    .expect("the long request reaches n2");
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
    tokio::time::sleep(Duration::from_millis(300)).await;
    termed.store(true, Ordering::Relaxed);
    let mut child = c.sigterm("n2");
    let exited = c.wait_until(Duration::from_secs(10), || {
        child.try_wait().unwrap().is_some()
    });
    stop.store(true, Ordering::Relaxed);
    let mut served = BTreeSet::new();
    for t in tasks {
        served.extend(t.await.unwrap());
    }
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
    assert!(ok.load(Ordering::Relaxed) > 100);
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
