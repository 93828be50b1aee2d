//! Operating a node: Prometheus metrics at `GET /_peerlb/metrics` and the
//! sprayer's health check at `GET /_peerlb/health`, over real `peerlb`
//! processes on loopback.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::*;

/// `method path` on a fresh connection (`Connection: close`): the status
/// code and the body, or `None` when the node does not answer.
fn exchange(addr: SocketAddr, method: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n")?.1.to_owned();
    Some((status, body))
}

/// One scrape of `GET /_peerlb/metrics`.
fn scrape(addr: SocketAddr) -> String {
    let (status, body) =
        exchange(admin_of(addr), "GET", "/_peerlb/metrics").expect("metrics answered");
    assert_eq!(status, 200, "{body}");
    body
}

/// The value of the sample `series` (a metric name with its labels exactly
/// as exposed, e.g. `peerlb_members{status="serving"}`) in a text
/// exposition; panics when it is absent, so a renamed metric fails.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series).then(|| value.parse::<f64>().expect("a number"))
        })
        .unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_as_requests_flow() {
    let c = Cluster::start("metrics", 2, "[ring]\nvnodes = 1024\n", USER_RULES);
    let r = ring(&["n1", "n2"], 1024);
    let remote = user_where(&r, |o| o == "n2");
    let local = user_where(&r, |o| o == "n1");
    let (n1, n2) = (c.nodes[0].http, c.nodes[1].http);
    let before = scrape(n1);
    let before2 = scrape(n2);
    for _ in 0..5 {
        let resp = get(n1, &format!("/m?user={remote}"), &[]).await;
        assert_eq!((resp.status, resp.served_by()), (200, "n2"));
    }
    for _ in 0..3 {
        let resp = get(n1, &format!("/m?user={local}"), &[]).await;
        assert_eq!((resp.status, resp.served_by()), (200, "n1"));
    }
    let after = scrape(n1);
    let after2 = scrape(n2);
    let delta = |a: &str, b: &str, s: &str| sample(a, s) - sample(b, s);
    assert_eq!(delta(&after, &before, "peerlb_requests_total"), 8.0);
    assert_eq!(delta(&after, &before, "peerlb_forwarded_total"), 5.0);
    assert_eq!(delta(&after, &before, "peerlb_served_local_total"), 3.0);
    assert_eq!(delta(&after, &before, "peerlb_errors_total"), 0.0);
    assert_eq!(delta(&after2, &before2, "peerlb_served_local_total"), 5.0);
    // The owner served the forwarded requests; it received no client request.
    assert_eq!(delta(&after2, &before2, "peerlb_requests_total"), 0.0);
    // One request histogram observation per client request, one hop per
    // forward; the hop is inside the request.
    assert_eq!(
        delta(&after, &before, "peerlb_request_duration_seconds_count"),
        8.0
    );
    assert_eq!(
        delta(&after, &before, "peerlb_hop_duration_seconds_count"),
        5.0
    );
    let req_sum = delta(&after, &before, "peerlb_request_duration_seconds_sum");
    let hop_sum = delta(&after, &before, "peerlb_hop_duration_seconds_sum");
    assert!(
        hop_sum > 0.0 && req_sum > hop_sum,
        "request {req_sum} s, hop {hop_sum} s"
    );
    assert_eq!(
        sample(
            &after,
            "peerlb_request_duration_seconds_bucket{le=\"+Inf\"}"
        ),
        sample(&after, "peerlb_request_duration_seconds_count")
    );
    // The cluster as this node sees it.
    assert_eq!(sample(&after, "peerlb_members{status=\"serving\"}"), 2.0);
    assert_eq!(sample(&after, "peerlb_members{status=\"leaving\"}"), 0.0);
    assert!(sample(&after, "peerlb_peer_connections") >= 1.0);
    assert_eq!(sample(&after, "peerlb_inflight_requests"), 0.0);
    let shares =
        sample(&after, "peerlb_ring_share_ratio") + sample(&after2, "peerlb_ring_share_ratio");
    assert!((shares - 1.0).abs() < 1e-9, "shares sum to {shares}");
    assert!(sample(&after, "peerlb_ring_share_ratio") > 0.3);
    assert_eq!(sample(&after, "peerlb_weight"), 100.0);
    assert_eq!(
        sample(
            &after,
            "peerlb_gossip_dropped_datagrams_total{reason=\"unauthenticated\"}"
        ),
        0.0
    );
    assert_eq!(
        sample(&after, "peerlb_rules_reloads_total{result=\"ok\"}"),
        0.0
    );
    // Each member's published load has a series (`sample` panics on a
    // missing one); its value moves with gossip rounds, so only the
    // series' presence is asserted here.
    for node in ["n1", "n2"] {
        let _ = sample(&after, &format!("peerlb_member_load{{node=\"{node}\"}}"));
    }
    // Scrapes are admin requests: not counted as client requests.
    let again = scrape(n1);
    assert_eq!(delta(&again, &after, "peerlb_requests_total"), 0.0);
    // Only GET.
    let (status, _) = exchange(admin_of(n1), "POST", "/_peerlb/metrics").unwrap();
    assert_eq!(status, 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_reloads_are_counted_by_result() {
    let dir = temp_dir("metrics-reload");
    let xml = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/data-centric-rules.xml"
    ))
    .unwrap();
    let rules = write(&dir, "rules.xml", &xml);
    let c = Cluster::start(
        "metrics-reload",
        1,
        &format!("rules_file = {:?}\n", rules.display().to_string()),
        "",
    );
    let n1 = c.nodes[0].http;
    assert_eq!(
        exchange(admin_of(n1), "POST", "/_peerlb/rules/reload")
            .unwrap()
            .0,
        200
    );
    std::fs::write(&rules, "<not-rules").unwrap();
    assert_eq!(
        exchange(admin_of(n1), "POST", "/_peerlb/rules/reload")
            .unwrap()
            .0,
        422
    );
    let text = scrape(n1);
    assert_eq!(
        sample(&text, "peerlb_rules_reloads_total{result=\"ok\"}"),
        1.0
    );
    // The node's file watcher (every 2 s) may also have tried the broken
    // file: one failure from the admin reload, perhaps one more from it.
    let errors = sample(&text, "peerlb_rules_reloads_total{result=\"error\"}");
    assert!((1.0..=2.0).contains(&errors), "{errors} failed reloads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_200_while_serving_and_503_while_leaving() {
    // A long grace: the node answers, as leaving, for 3 s after SIGTERM.
    let mut c = Cluster::start("health", 2, "[limits]\ndrain_grace_ms = 3000\n", "");
    let n1 = c.nodes[0].http;
    assert_eq!(
        exchange(n1, "GET", "/_peerlb/health"),
        Some((200, "serving\n".into()))
    );
    assert_eq!(
        exchange(n1, "HEAD", "/_peerlb/health"),
        Some((200, String::new()))
    );
    assert_eq!(exchange(n1, "POST", "/_peerlb/health").unwrap().0, 405);
    let mut child = c.sigterm("n1");
    // Published leaving, still answering: the sprayer's check fails while
    // client requests are still served.
    poll(Duration::from_secs(10), || {
        exchange(n1, "GET", "/_peerlb/health") == Some((503, "leaving\n".into()))
    })
    .expect("health says leaving during the grace");
    assert_eq!(exchange(n1, "GET", "/m").map(|(s, _)| s), Some(200));
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert_eq!(exchange(n1, "GET", "/_peerlb/health"), None);
}

/// The HAProxy example of docs/operations.md (the sprayer section), with
/// its `bind` and `server` lines pointed at `nodes` and a stats socket.
fn haproxy_example(front: u16, nodes: &[NodeInfo], socket: &std::path::Path) -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .unwrap();
    let block = doc
        .split_once("HAProxy in TCP mode")
        .and_then(|(_, rest)| rest.split("```").nth(1))
        .expect("the HAProxy example in docs/operations.md");
    assert!(block.contains("option httpchk") && block.contains("/_peerlb/health"));
    let mut cfg = String::new();
    for line in block.lines() {
        let t = line.trim();
        if t.starts_with("server ") {
            continue;
        }
        if t.starts_with("bind ") {
            cfg += &format!("  bind 127.0.0.1:{front}\n");
        } else if t.starts_with("maxconn ") {
            // maxconn 10000 needs about 20,000 file descriptors, more than
            // a test machine may allow.
            cfg += "  maxconn 1000\n";
        } else {
            cfg += line;
            cfg += "\n";
        }
        if t == "global" {
            cfg += &format!("  stats socket {} level admin\n", socket.display());
        }
    }
    for n in nodes {
        cfg += &format!(
            "  server {} {} check inter 200ms fall 2 rise 2\n",
            n.id, n.http
        );
    }
    cfg
}

/// Each server's status (`UP`, `DOWN`, ...) in HAProxy's `show stat`.
fn haproxy_status(socket: &std::path::Path) -> Option<std::collections::BTreeMap<String, String>> {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket).ok()?;
    s.write_all(b"show stat\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next()?.trim_start_matches("# ").split(',').collect();
    let (sv, st) = (
        header.iter().position(|h| *h == "svname")?,
        header.iter().position(|h| *h == "status")?,
    );
    Some(
        lines
            .map(|l| l.split(',').collect::<Vec<_>>())
            .filter(|f| f.len() > st && f[sv] != "FRONTEND" && f[sv] != "BACKEND")
            .map(|f| (f[sv].to_owned(), f[st].to_owned()))
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_haproxy_check_marks_a_leaving_node_down_before_its_listener_closes() {
    let Some(haproxy) = which("haproxy") else {
        // As in tests/cluster.rs: CI requires haproxy, a developer machine
        // without it is told how to get it.
        assert!(
            std::env::var_os("PEERLB_REQUIRE_HAPROXY").is_none()
                && std::env::var_os("CI").is_none(),
            "haproxy is missing but this run requires it (PEERLB_REQUIRE_HAPROXY or CI is set)"
        );
        eprintln!("SKIPPED: haproxy is not installed (apt-get install -y haproxy, or run .ci/run)");
        return;
    };
    let mut c = Cluster::start("hapcheck", 2, "[limits]\ndrain_grace_ms = 5000\n", "");
    let socket = c.dir.join("haproxy.sock");
    let cfg = haproxy_example(free_port(), &c.nodes, &socket);
    let cfg_path = write(&c.dir, "haproxy.cfg", &cfg);
    let mut hap = std::process::Command::new(haproxy)
        .arg("-f")
        .arg(&cfg_path)
        .arg("-db")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let up = |want: &[(&str, &str)]| {
        haproxy_status(&socket).is_some_and(|m| {
            want.iter()
                .all(|(id, st)| m.get(*id).is_some_and(|s| s.starts_with(st)))
        })
    };
    let both_up = poll(Duration::from_secs(10), || {
        up(&[("n1", "UP"), ("n2", "UP")])
    });
    let n1 = c.nodes[0].http;
    let mut child = c.sigterm("n1");
    let n1_down = poll(Duration::from_secs(4), || {
        up(&[("n1", "DOWN"), ("n2", "UP")])
    });
    // Still within the grace: the listener is open and says leaving.
    let still_open = exchange(n1, "GET", "/_peerlb/health");
    let status = haproxy_status(&socket);
    let _ = hap.kill();
    let _ = hap.wait();
    both_up.unwrap_or_else(|()| panic!("haproxy did not mark both nodes up: {status:?}\n{cfg}"));
    n1_down.expect("haproxy marks n1 down during its drain grace");
    assert_eq!(still_open, Some((503, "leaving\n".into())));
    assert_eq!(child.wait().unwrap().code(), Some(0));
}
