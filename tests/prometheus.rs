//! The metrics as Prometheus reads them, over real `peerlb` processes on
//! loopback: Debian's `promtool check metrics` (the Prometheus text
//! parser and its linter) on a scrape of the admin API and of the
//! `metrics_addr` listener, and a real `prometheus` server scraping a
//! 3-node cluster's `metrics_addr`s, queried through its HTTP API.
//!
//! Both tools come with Debian's `prometheus` package (Prometheus 2.42).
//! Without them the tests are skipped with a message (`SKIPPED: ...` on
//! stderr), unless `PEERLB_REQUIRE_PROMETHEUS` or `CI` is set (`.ci/run`
//! installs the package and sets it): then a missing tool fails.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// The tool `name` of the `prometheus` package, or `None` (after saying
/// so) when it is missing and the run does not require it.
fn tool(name: &str) -> Option<PathBuf> {
    let found = which(name);
    if found.is_none() {
        assert!(
            std::env::var_os("PEERLB_REQUIRE_PROMETHEUS").is_none()
                && std::env::var_os("CI").is_none(),
            "{name} is missing but this run requires it (apt-get install -y prometheus)"
        );
        eprintln!(
            "SKIPPED: {name} is not installed (apt-get install -y prometheus, or run .ci/run)"
        );
    }
    found
}

/// `GET path` on a fresh connection with `accept` (when given): the
/// status, the `Content-Type` and the body.
fn fetch(addr: SocketAddr, path: &str, accept: Option<&str>) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let accept = accept.map_or(String::new(), |a| format!("accept: {a}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\n{accept}connection: close\r\n\r\n"
    )
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let ctype = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    // Chunked bodies (hyper's for a body of unknown length) are joined.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, ctype, body)
}

/// The payload of a chunked body.
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

/// `promtool check metrics` on `text`: its exit status and what it said.
fn promtool_check(promtool: &PathBuf, text: &str) -> (bool, String) {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_reads_a_scrape_of_the_admin_api_and_of_metrics_addr() {
    let Some(promtool) = tool("promtool") else {
        return;
    };
    let c = Cluster::start_metrics("promtool", 2, "", "");
    // Traffic, so the labelled families have samples (and one, a 404's
    // code, that did not exist before).
    for i in 0..4 {
        let r = get(c.nodes[0].http, &format!("/p{i}"), &[]).await;
        assert_eq!(r.status, 200);
    }
    let n1 = &c.nodes[0];
    let metrics = n1.metrics.expect("a metrics_addr");
    let (status, ctype, admin) = fetch(n1.admin, "/_peerlb/metrics", None);
    assert_eq!(status, 200, "{admin}");
    assert_eq!(ctype, "text/plain; version=0.0.4; charset=utf-8");
    let (status, ctype, text) = fetch(metrics, "/metrics", None);
    assert_eq!(status, 200, "{text}");
    assert_eq!(ctype, "text/plain; version=0.0.4; charset=utf-8");
    for t in [&admin, &text] {
        let (ok, said) = promtool_check(&promtool, t);
        assert!(
            ok,
            "promtool check metrics failed:\n{said}\n--- scrape:\n{t}"
        );
        assert!(said.trim().is_empty(), "promtool's lint: {said}");
        assert!(!t.contains("# EOF"), "{t}");
        assert!(t.contains("# TYPE peerlb_requests_total counter\n"), "{t}");
        assert!(t.contains("# TYPE peerlb_responses_total counter\n"), "{t}");
        assert!(
            t.contains(&format!(
                "peerlb_build_info{{version=\"{}\",commit=\"",
                env!("CARGO_PKG_VERSION")
            )),
            "{t}"
        );
        assert!(t.contains("\npeerlb_process_start_time_seconds "), "{t}");
    }
    // The view version as an exact integer and as a label, the same.
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("peerlb_view_version "))
        .expect("a view version");
    assert!(version.parse::<u64>().is_ok(), "{version}");
    assert!(
        text.contains(&format!("peerlb_view_info{{version=\"{version}\"}} 1\n")),
        "{text}"
    );
    // OpenMetrics when asked, as Prometheus asks.
    let (status, ctype, om) = fetch(
        metrics,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
    );
    assert_eq!(status, 200);
    assert_eq!(
        ctype,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(om.contains("# TYPE peerlb_requests counter\n"), "{om}");
    // The metrics listener serves nothing of the admin API.
    for path in ["/_peerlb/status", "/_peerlb/manager", "/"] {
        let (status, _, body) = fetch(metrics, path, None);
        assert_eq!(status, 404, "{path}: {body}");
    }
    let (status, _, _) = fetch(metrics, "/_peerlb/metrics", None);
    assert_eq!(status, 200);
}

/// A `prometheus` server process, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET /api/v1/<path>` of the Prometheus server at `addr`: its JSON.
fn api(addr: SocketAddr, path: &str) -> Option<serde_json::Value> {
    let s = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    drop(s);
    let (status, _, body) = fetch(addr, &format!("/api/v1/{path}"), None);
    (status == 200).then(|| serde_json::from_str(&body).ok())?
}

/// The samples of an instant query's vector result: (labels, value).
fn query(addr: SocketAddr, q: &str) -> Vec<(serde_json::Value, f64)> {
    let q: String = q
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let Some(v) = api(addr, &format!("query?query={q}")) else {
        return Vec::new();
    };
    v["data"]["result"]
        .as_array()
        .map(|r| {
            r.iter()
                .map(|s| {
                    let value = s["value"][1].as_str().unwrap_or("NaN").parse().unwrap();
                    (s["metric"].clone(), value)
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prometheus_server_scrapes_a_three_node_cluster() {
    let Some(prometheus) = tool("prometheus") else {
        return;
    };
    let c = Cluster::start_metrics("prometheus", 3, "", "");
    let targets: Vec<String> = c
        .nodes
        .iter()
        .map(|n| format!("\"{}\"", n.metrics.unwrap()))
        .collect();
    let dir = c.dir.join("prometheus");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: peerlb\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        ),
    )
    .unwrap();
    let web: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let _server = Server(
        Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let prom_log = || std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
    // Every target up (a deadline, not a delay).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let up = query(web, "up");
        if up.len() == 3 && up.iter().all(|(_, v)| *v == 1.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "up is {up:?} after 60 s\n{}",
            prom_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Requests through n1; Prometheus sees its counter move.
    let n1 = c.nodes[0].metrics.unwrap().to_string();
    let q = format!("peerlb_requests_total{{instance=\"{n1}\"}}");
    let start = query(web, &q).first().map_or(-1.0, |s| s.1);
    assert!(start >= 0.0, "no peerlb_requests_total for {n1}");
    for i in 0..10 {
        let r = get(c.nodes[0].http, &format!("/prom{i}"), &[]).await;
        assert_eq!(r.status, 200);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = query(web, &q).first().map_or(0.0, |s| s.1);
        if now >= start + 10.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{q} stayed at {now} (from {start})\n{}",
            prom_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Prometheus typed the families as they were written: a counter, a
    // histogram, a gauge (its metadata API, per family name).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let meta = api(web, "metadata").unwrap_or_default();
        let kind = |f: &str| meta["data"][f][0]["type"].as_str().map(str::to_owned);
        let got = [
            kind("peerlb_requests"),
            kind("peerlb_responses"),
            kind("peerlb_request_duration_seconds"),
            kind("peerlb_view_version"),
        ];
        let want = ["counter", "counter", "histogram", "gauge"].map(|s| Some(s.to_owned()));
        if got == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "metadata types {got:?}, want {want:?}: {meta}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The view version, exact as a label: every node's is the same.
    let versions = query(web, "peerlb_view_info");
    assert_eq!(versions.len(), 3, "{versions:?}");
    let v: Vec<&serde_json::Value> = versions.iter().map(|(m, _)| &m["version"]).collect();
    assert!(v.iter().all(|x| *x == v[0]), "{v:?}");
}
