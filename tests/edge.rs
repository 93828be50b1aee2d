//! The edge holds against bad client input: request-target forms and Host
//! values (RFC 9112 section 3.2), absolute-form authority, forwarding
//! headers, disguised admin paths, the admin API against browsers, and
//! config values that must not panic a node. Each case is checked where
//! the entry serves the request itself and where it forwards it.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use support::*;

/// An upstream app that answers, as JSON, what it received: `path`,
/// `host`, and every line of `x-forwarded-for`, `x-real-ip` and
/// `forwarded`. It counts requests by path.
#[derive(Clone)]
struct EchoApp {
    addr: SocketAddr,
    seen: Arc<Mutex<BTreeMap<String, u64>>>,
}

impl EchoApp {
    async fn start() -> EchoApp {
        use hyper::service::service_fn;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let app = EchoApp {
            addr: l.local_addr().unwrap(),
            seen: Default::default(),
        };
        let a = app.clone();
        tokio::spawn(async move {
            loop {
                let (s, _) = l.accept().await.unwrap();
                let a = a.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let a = a.clone();
                        async move {
                            *a.seen
                                .lock()
                                .unwrap()
                                .entry(req.uri().path().to_owned())
                                .or_default() += 1;
                            let lines = |n: &str| -> Vec<String> {
                                req.headers()
                                    .get_all(n)
                                    .iter()
                                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                                    .collect()
                            };
                            let v = serde_json::json!({
                                "path": req.uri().path(),
                                "host": lines("host"),
                                "x-forwarded-for": lines("x-forwarded-for"),
                                "x-real-ip": lines("x-real-ip"),
                                "forwarded": lines("forwarded"),
                            });
                            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                                Bytes::from(v.to_string()),
                            )))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        app
    }

    fn total(&self) -> u64 {
        self.seen.lock().unwrap().values().sum()
    }
}

/// A raw answer: status, head text (lowercase names) and body.
struct Raw {
    status: u16,
    head: String,
    body: String,
}

impl Raw {
    fn has_header(&self, name: &str) -> bool {
        self.head
            .lines()
            .any(|l| l.to_ascii_lowercase().starts_with(&format!("{name}:")))
    }
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {:?}", self.body))
    }
}

/// Sends `request_line` and `headers` (each `Name: value`) on a fresh
/// connection with `Connection: close` and reads the whole answer.
fn raw(addr: SocketAddr, request_line: &str, headers: &[&str]) -> Raw {
    let mut text = format!("{request_line}\r\n");
    for h in headers {
        text += h;
        text += "\r\n";
    }
    text += "Connection: close\r\n\r\n";
    let (out, _) = raw_exchange(addr, text.as_bytes());
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {out:?}"));
    // The bodies tests read are small and not chunked except by hyper's
    // choice: undo the chunked framing when present.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut b = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            b += &tail[..n];
            rest = &tail[n + 2..];
        }
        b
    } else {
        body.to_owned()
    };
    Raw {
        status,
        head: head.to_owned(),
        body,
    }
}

/// A two-node cluster proxying to an [`EchoApp`], and a user key served by
/// the entry n1 itself and one n1 forwards to n2.
async fn echo_cluster(tag: &str, extra: &str) -> (Cluster, EchoApp, [(String, &'static str); 2]) {
    let app = EchoApp::start().await;
    let c = Cluster::start(
        tag,
        2,
        &format!(
            "app = \"http://{}\"\n[ring]\nvnodes = 1024\n{extra}{STEADY}",
            app.addr
        ),
        USER_RULES,
    );
    let r = ring(&["n1", "n2"], 1024);
    let local = user_where(&r, |o| o == "n1");
    let forwarded = user_where(&r, |o| o == "n2");
    (c, app, [(local, "n1"), (forwarded, "n2")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_hosts_and_request_target_forms_get_400_and_never_reach_the_app() {
    let (c, app, users) = echo_cluster("edge-host", "").await;
    let entry = c.nodes[0].http;
    for (user, owner) in &users {
        // A good request reaches the app on both paths.
        let ok = raw(
            entry,
            &format!("GET /x?user={user} HTTP/1.1"),
            &[&format!("Host: {entry}")],
        );
        assert_eq!(ok.status, 200, "{}", ok.body);
        assert!(
            ok.head.contains(&format!("peerlb-served-by: {owner}")),
            "{}",
            ok.head
        );
        let before = app.total();
        for (line, host) in [
            (format!("GET /x?user={user} HTTP/1.1"), "Host: a b/c@d"),
            (format!("GET /x?user={user} HTTP/1.1"), "Host: "),
            (format!("GET /x?user={user} HTTP/1.1"), "Host: u@h"),
            ("GET host:80 HTTP/1.1".to_owned(), "Host: host:80"),
            ("GET * HTTP/1.1".to_owned(), "Host: h"),
        ] {
            let r = raw(entry, &line, &[host]);
            assert_eq!(r.status, 400, "{line} / {host}: {}", r.body);
            assert!(r.head.contains("peerlb-error-from: n1"), "{}", r.head);
        }
        assert_eq!(app.total(), before, "a bad request reached the app");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_authority_is_the_host_the_app_sees_and_one_xff_line() {
    let (c, _app, users) = echo_cluster("edge-abs", "").await;
    let entry = c.nodes[0].http;
    for (user, owner) in &users {
        let r = raw(
            entry,
            &format!("GET http://tenant-a.example/x?user={user} HTTP/1.1"),
            &["Host: tenant-b.example"],
        );
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(
            r.head.contains(&format!("peerlb-served-by: {owner}")),
            "{}",
            r.head
        );
        let v = r.json();
        assert_eq!(
            v["host"],
            serde_json::json!(["tenant-a.example"]),
            "{owner}"
        );
        assert_eq!(v["path"], "/x");

        // A client-sent X-Forwarded-For is combined with peerlb's into one
        // line, the client's own address last.
        let r = raw(
            entry,
            &format!("GET /x?user={user} HTTP/1.1"),
            &[
                &format!("Host: {entry}"),
                "X-Forwarded-For: 10.0.0.1",
                "X-Real-IP: 10.0.0.2",
                "Forwarded: for=10.0.0.3",
            ],
        );
        let v = r.json();
        assert_eq!(
            v["x-forwarded-for"],
            serde_json::json!(["10.0.0.1, 127.0.0.1"]),
            "{owner}"
        );
        assert_eq!(v["x-real-ip"], serde_json::json!(["10.0.0.2"]));
        // peerlb's own Forwarded element comes last, with the scheme.
        assert_eq!(
            v["forwarded"],
            serde_json::json!(["for=10.0.0.3, for=127.0.0.1;proto=http"])
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_client_forwarding_headers_are_dropped_at_the_entry() {
    let (c, _app, users) =
        echo_cluster("edge-xff", "[headers]\ntrust_client_forwarded = false\n").await;
    let entry = c.nodes[0].http;
    for (user, owner) in &users {
        let r = raw(
            entry,
            &format!("GET /x?user={user} HTTP/1.1"),
            &[
                &format!("Host: {entry}"),
                "X-Forwarded-For: 10.0.0.1",
                "X-Forwarded-For: 10.0.0.9",
                "X-Real-IP: 10.0.0.2",
                "Forwarded: for=10.0.0.3",
            ],
        );
        assert!(
            r.head.contains(&format!("peerlb-served-by: {owner}")),
            "{}",
            r.head
        );
        let v = r.json();
        assert_eq!(
            v["x-forwarded-for"],
            serde_json::json!(["127.0.0.1"]),
            "{owner}"
        );
        assert_eq!(v["x-real-ip"], serde_json::json!([]));
        assert_eq!(
            v["forwarded"],
            serde_json::json!(["for=127.0.0.1;proto=http"])
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disguised_admin_paths_get_400_and_never_reach_the_app() {
    let (c, app, _users) = echo_cluster("edge-admin-path", "").await;
    for node in &c.nodes {
        let entry = node.http;
        let host = format!("Host: {entry}");
        // The admin API proper is on the admin address; the client port
        // answers its own spelling with 404 and disguised ones with 400.
        let admin = admin_of(entry);
        let ok = raw(
            admin,
            "GET /_peerlb/status HTTP/1.1",
            &[&format!("Host: {admin}")],
        );
        assert_eq!(ok.status, 200, "{}", ok.body);
        assert_eq!(ok.json()["node"], node.id.as_str());
        let plain = raw(entry, "GET /_peerlb/status HTTP/1.1", &[&host]);
        assert_eq!(plain.status, 404, "{}", plain.body);
        for path in [
            "//_peerlb/status",
            "/%5Fpeerlb/status",
            "/x/../_peerlb/status",
            "/./_peerlb/status",
            "/_PEERLB/status",
            "/_peerlb%2Fstatus",
            "/_peerlb%00/status",
            "/_peerlb%20/status",
            "/_peerlb%09/status",
            "/_peerlb./status",
            "/%C1%9Fpeerlb/status",
        ] {
            let r = raw(entry, &format!("GET {path} HTTP/1.1"), &[&host]);
            assert_eq!(r.status, 400, "{path}: {}", r.body);
            assert!(r.has_header("peerlb-error-from"), "{}", r.head);
        }
    }
    assert_eq!(app.total(), 0, "{:?}", app.seen.lock().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_refuses_foreign_hosts_and_origins() {
    let c = Cluster::start("edge-admin-browser", 1, "", "");
    // The admin API is on the node's admin address.
    let entry = admin_of(c.nodes[0].http);
    let port = entry.port();
    for host in [
        format!("Host: {entry}"),
        format!("Host: localhost:{port}"),
        "Host: 127.0.0.1".to_owned(),
    ] {
        let r = raw(entry, "GET /_peerlb/status HTTP/1.1", &[&host]);
        assert_eq!(r.status, 200, "{host}: {}", r.body);
    }
    let same = format!("Origin: http://{entry}");
    let r = raw(
        entry,
        "GET /_peerlb/status HTTP/1.1",
        &[&format!("Host: {entry}"), &same],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // DNS rebinding: the page's own name as Host.
    let r = raw(
        entry,
        "GET /_peerlb/status HTTP/1.1",
        &[&format!("Host: rebind.example:{port}")],
    );
    assert_eq!(r.status, 403, "{}", r.body);
    // CSRF: a page elsewhere posts to the admin API.
    for origin in [
        "Origin: http://evil.example",
        "Origin: null",
        "Origin: http://127.0.0.1:1",
    ] {
        let r = raw(
            entry,
            "POST /_peerlb/rules/reload HTTP/1.1",
            &[&format!("Host: {entry}"), origin, "Content-Length: 0"],
        );
        assert_eq!(r.status, 403, "{origin}: {}", r.body);
        let r = raw(
            entry,
            "PUT /_peerlb/weight HTTP/1.1",
            &[&format!("Host: {entry}"), origin, "Content-Length: 0"],
        );
        assert_eq!(r.status, 403, "{origin}: {}", r.body);
    }
    // Two Origin fields, the first same-site: which one a browser meant
    // cannot be known, so the request is refused.
    let r = raw(
        entry,
        "PUT /_peerlb/weight HTTP/1.1",
        &[
            &format!("Host: {entry}"),
            &same,
            "Origin: http://evil.example",
            "Content-Length: 0",
        ],
    );
    assert_eq!(r.status, 403, "{}", r.body);
    // The weight stayed as configured.
    assert_eq!(status(c.nodes[0].http).unwrap()["weight"], 100);
}

#[test]
fn a_duration_check_config_accepts_starts_and_one_too_long_exits_64() {
    let dir = temp_dir("edge-durations");
    let nodes = format!(
        "[[nodes]]\nid = \"n1\"\nhttp_addr = \"127.0.0.1:{}\"\npeer_addr = \"127.0.0.1:{}\"\ngossip_addr = \"127.0.0.1:{}\"\n",
        free_port(),
        free_port(),
        free_port()
    );
    let bad = write(
        &dir,
        "bad.toml",
        &format!("[peer]\nidle_timeout_ms = 4611686018427387904\n{nodes}"),
    );
    for args in [
        vec!["check-config", "--config"],
        vec!["node", "--node", "n1", "--config"],
    ] {
        let out = Command::new(bin()).args(&args).arg(&bad).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("peer.idle_timeout_ms"), "{err}");
    }
    let _ = std::fs::remove_dir_all(dir);
    // The longest durations check-config accepts start a node.
    let max = peerlb::config::MAX_DURATION_MS;
    let c = Cluster::start(
        "edge-max-durations",
        1,
        &format!(
            "[limits]\nresponse_timeout_ms = {max}\nconnect_timeout_ms = {max}\ndrain_timeout_ms = {max}\nstartup_wait_ms = {max}\nheader_read_timeout_ms = {max}\nbody_read_timeout_ms = {max}\nsend_timeout_ms = {max}\n[peer]\nkeep_alive_ms = {}\nidle_timeout_ms = {max}\n",
            max - 1
        ),
        "",
    );
    assert_eq!(status(c.nodes[0].http).unwrap()["node"], "n1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_route_cookie_does_not_hide_a_valid_one_and_the_cookie_is_configurable() {
    let c = Cluster::start(
        "edge-cookie",
        2,
        &format!(
            "policy = \"sticky-round-robin\"\n[sticky]\ncookie = \"lb\"\ncookie_path = \"/app\"\ncookie_same_site = \"None\"\ncookie_secure = true\n{STEADY}"
        ),
        "",
    );
    let entry = c.nodes[0].http;
    // Served by the entry itself (n1) and forwarded (n2), many times each:
    // round robin would alternate.
    for node in ["n1", "n2"] {
        for _ in 0..6 {
            let r = get(entry, "/x", &[("cookie", &format!("lb=gone; lb={node}"))]).await;
            assert_eq!(r.status, 200);
            assert_eq!(r.served_by(), node);
            // The route it carried names the server: nothing to announce.
            assert!(r.set_cookies().is_empty(), "{:?}", r.set_cookies());
        }
        // The default name is not read when another is configured.
        let r = get(
            entry,
            "/session",
            &[("cookie", &format!("peerlb-route={node}"))],
        )
        .await;
        let set = r.set_cookies();
        let route = set
            .iter()
            .find(|s| s.starts_with("lb="))
            .unwrap_or_else(|| panic!("{set:?}"));
        assert_eq!(
            route,
            &format!(
                "lb={}; Path=/app; HttpOnly; SameSite=None; Secure",
                r.served_by()
            )
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_head_is_answered_431_without_buffering_it_whole() {
    use std::io::Write;
    let (c, app, users) = echo_cluster("edge-head", "").await;
    let entry = c.nodes[0].http;
    for (user, _) in &users {
        // Over peerlb's 61,440-byte head limit, within the read buffer:
        // peerlb's own 431, with its marks.
        let big = "v".repeat(63_000);
        let r = raw(
            entry,
            &format!("GET /x?user={user} HTTP/1.1"),
            &[&format!("Host: {entry}"), &format!("x-big: {big}")],
        );
        assert_eq!(r.status, 431, "{}", r.body);
        assert!(r.has_header("peerlb-entry"), "{}", r.head);
        assert!(r.has_header("peerlb-error-from"), "{}", r.head);
        // An unfinished 100,000-byte header: answered 431 and closed once
        // the 64 KiB read buffer is full, not held until hyper's default
        // ~408 KB buffer fills or the head read timeout.
        let mut s = std::net::TcpStream::connect(entry).unwrap();
        let head = format!(
            "GET /x?user={user} HTTP/1.1\r\nHost: {entry}\r\nx-big: {}",
            "v".repeat(100_000)
        );
        // The server may close before it has read everything.
        let _ = s.write_all(head.as_bytes());
        let (text, closed) = read_until_closed(&mut s);
        assert!(text.starts_with("HTTP/1.1 431"), "{text:?}");
        assert!(closed);
    }
    assert_eq!(app.total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_closed_when_every_one_is_busy_and_said_in_log_and_status() {
    use std::io::Write;
    use std::net::TcpStream;
    let c = Cluster::start(
        "edge-cap",
        1,
        "[limits]\nmax_connections = 5\nmax_connections_per_source_percent = 100\n",
        "",
    );
    let entry = c.nodes[0].http;
    let log = c.log("n1");
    assert!(log.contains("open file limit"), "{log}");
    // Five busy connections fill the cap (the status requests go to the
    // admin address, which has a cap of its own); an idle one would be
    // closed to admit the sixth (tests/conns.rs).
    let mut busy: Vec<TcpStream> = (0..5)
        .map(|_| {
            let mut s = TcpStream::connect(entry).unwrap();
            s.write_all(
                b"GET /delay/8000 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
            )
            .unwrap();
            s
        })
        .collect();
    poll(std::time::Duration::from_secs(20), || {
        status(entry).is_some_and(|s| s["client_connections"] == 5 && s["inflight"] == 5)
    })
    .unwrap_or_else(|_| panic!("five busy connections are open: {:?}", status(entry)));
    // The sixth is closed at accept, with nothing written.
    let mut extra = TcpStream::connect(entry).unwrap();
    let _ = extra.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    let (text, closed) = read_until_closed(&mut extra);
    assert!(closed && text.is_empty(), "{text:?}");
    // The connections under the cap are still served.
    for s in &mut busy {
        let (text, _) = read_until_closed(s);
        assert!(text.starts_with("HTTP/1.1 200"), "{text:?}");
    }
    // The status says the cap was hit, and the log too.
    poll(std::time::Duration::from_secs(20), || {
        status(entry).is_some_and(|s| s["counters"]["connections_refused"].as_u64() >= Some(1))
    })
    .unwrap_or_else(|_| panic!("connections_refused counted: {:?}", status(entry)));
    assert!(
        c.log("n1")
            .contains("connection cap reached, every connection busy"),
        "{}",
        c.log("n1")
    );
}
