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
    exchange_after(addr, "", method, path)
}

/// [`exchange`] with `prefix` written before the request (a PROXY
/// protocol header, for a listener that expects one).
fn exchange_after(
    addr: SocketAddr,
    prefix: &str,
    method: &str,
    path: &str,
) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "{prefix}{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
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
    let delta = |a: &str, b: &str, s: &str| sample(a, s) - sample_or_zero(b, s);
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
    assert_eq!(sample(&after, "peerlb_member_weight{node=\"n2\"}"), 100.0);
    // Answers by status and by owner at the entry; proxied in at the owner.
    assert_eq!(
        delta(&after, &before, "peerlb_responses_total{code=\"200\"}"),
        8.0
    );
    assert_eq!(
        delta(
            &after,
            &before,
            "peerlb_requests_by_owner_total{owner=\"n2\"}"
        ),
        5.0
    );
    assert_eq!(
        delta(
            &after,
            &before,
            "peerlb_requests_by_owner_total{owner=\"n1\"}"
        ),
        3.0
    );
    assert_eq!(delta(&after2, &before2, "peerlb_proxied_in_total"), 5.0);
    assert_eq!(delta(&after, &before, "peerlb_proxied_in_total"), 0.0);
    // Bytes on the client connections: at least each request's line and
    // each answer's status line.
    let got = delta(&after, &before, "peerlb_client_received_bytes_total");
    let sent = delta(&after, &before, "peerlb_client_sent_bytes_total");
    assert!(
        got >= 8.0 * 20.0 && sent >= 8.0 * 17.0,
        "{got} in, {sent} out"
    );
    assert_eq!(
        delta(&after2, &before2, "peerlb_client_sent_bytes_total"),
        0.0
    );
    // Peer links: the connection to n2 counted in one state; n2 up.
    let by_state: f64 = ["busy", "idle", "retired"]
        .iter()
        .map(|s| {
            sample(
                &after,
                &format!("peerlb_peer_connections_by_state{{state=\"{s}\"}}"),
            )
        })
        .sum();
    assert_eq!(by_state, sample(&after, "peerlb_peer_connections"));
    assert_eq!(sample(&after, "peerlb_peers{state=\"up\"}"), 1.0);
    assert_eq!(sample(&after, "peerlb_peer_ejections_total"), 0.0);
    // Gossip: exchanges started and datagrams taken.
    assert!(sample(&after, "peerlb_gossip_messages_sent_total{kind=\"syn\"}") > 0.0);
    assert!(sample(&after, "peerlb_gossip_received_datagrams_total") > 0.0);
    assert_eq!(
        sample(
            &after,
            "peerlb_gossip_dropped_datagrams_total{reason=\"out_of_bounds\"}"
        ),
        0.0
    );
    // No slow start configured: the full weight, no ramp.
    assert_eq!(sample(&after, "peerlb_target_weight"), 100.0);
    assert_eq!(sample(&after, "peerlb_slow_start_step"), 0.0);
    // A refused head is answered and counted by its status.
    let long = format!("/{}", "a".repeat(9000));
    assert_eq!(exchange(n1, "GET", &long).map(|(s, _)| s), Some(414));
    // Gossip rounds go on: the SYN count moves between scrapes.
    let syn = "peerlb_gossip_messages_sent_total{kind=\"syn\"}";
    poll(Duration::from_secs(10), || {
        sample(&scrape(n1), syn) > sample(&after, syn)
    })
    .expect("gossip exchanges counted as they happen");
    // Scrapes are admin requests: not counted as client requests.
    let again = scrape(n1);
    assert_eq!(delta(&again, &after, "peerlb_requests_total"), 0.0);
    assert_eq!(
        delta(&again, &after, "peerlb_responses_total{code=\"414\"}"),
        1.0
    );
    // Only GET.
    let (status, _) = exchange(admin_of(n1), "POST", "/_peerlb/metrics").unwrap();
    assert_eq!(status, 405);
}

/// [`sample`], or 0 when the series is not exposed (a labelled counter
/// appears with its first count).
fn sample_or_zero(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series).then(|| value.parse::<f64>().expect("a number"))
        })
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_round_robin_exposes_lbstatus_per_node() {
    let c = Cluster::start("metrics-wrr", 2, "policy = \"weighted-round-robin\"\n", "");
    let n1 = c.nodes[0].http;
    for _ in 0..7 {
        assert_eq!(get(n1, "/w", &[]).await.status, 200);
    }
    let text = scrape(n1);
    // byrequests: each pick adds every lbfactor and takes the total from
    // the winner, so the lbstatus values always sum to 0; after 7 picks
    // between two equal weights one node is 100 ahead of the other.
    let (a, b) = (
        sample(&text, "peerlb_lbstatus{node=\"n1\"}"),
        sample(&text, "peerlb_lbstatus{node=\"n2\"}"),
    );
    assert_eq!(a + b, 0.0, "{a} {b}");
    assert_eq!((a - b).abs(), 200.0, "{a} {b}");
    // Not the by-traffic policy: no bytes series.
    assert!(!text.contains("peerlb_by_traffic_bytes{"), "{text}");
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

/// The JSON objects of a node's log (every line must be one).
fn json_lines(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: not JSON: {l}")))
        .collect()
}

/// The access log line (`target` `peerlb::access`) of request `id` in
/// `lines`, when there is one.
fn access_line<'a>(lines: &'a [serde_json::Value], id: &str) -> Option<&'a serde_json::Value> {
    lines
        .iter()
        .find(|l| l["target"] == "peerlb::access" && l["request_id"] == id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_access_log_lines_share_the_request_id_on_entry_and_owner() {
    let c = Cluster::start_args(
        "jsonlog",
        2,
        "[ring]\nvnodes = 64\n",
        USER_RULES,
        &["--log-format", "json", "--access-log"],
    );
    let r = ring(&["n1", "n2"], 64);
    let remote = user_where(&r, |o| o == "n2");
    let n1 = c.nodes[0].http;
    let resp = get(n1, &format!("/j?user={remote}"), &[]).await;
    assert_eq!((resp.status, resp.served_by()), (200, "n2"));
    // The app received the id the entry gave the request.
    let id = resp.json()["request_id"]
        .as_str()
        .expect("the app saw X-Request-Id")
        .to_owned();
    assert_eq!(uuid_version(&id), Some('4'), "{id}");
    let mut lines = (Vec::new(), Vec::new());
    poll(Duration::from_secs(10), || {
        lines = (json_lines(&c.log("n1")), json_lines(&c.log("n2")));
        access_line(&lines.0, &id).is_some() && access_line(&lines.1, &id).is_some()
    })
    .unwrap_or_else(|()| {
        panic!(
            "no access lines for {id}:\n{}\n{}",
            c.log("n1"),
            c.log("n2")
        )
    });
    let entry = access_line(&lines.0, &id).unwrap();
    let owner = access_line(&lines.1, &id).unwrap();
    for (l, node, role) in [(entry, "n1", "entry"), (owner, "n2", "owner")] {
        assert_eq!(l["node"], node, "{l}");
        assert_eq!(l["role"], role, "{l}");
        assert_eq!(l["entry"], "n1", "{l}");
        assert_eq!(l["owner"], "n2", "{l}");
        assert_eq!(l["status"], 200, "{l}");
        assert_eq!(l["method"], "GET", "{l}");
        assert!(l["duration_us"].as_u64().is_some(), "{l}");
        assert_eq!(l["level"], "INFO", "{l}");
    }
    assert_eq!(entry["reason"], "rule", "{entry}");
    assert_eq!(owner["reason"], "proxied", "{owner}");
    // The hop is inside the entry's time.
    assert!(entry["duration_us"].as_u64() >= owner["duration_us"].as_u64());
    // Every line is JSON, the ordinary ones too (startup, view changes).
    assert!(
        lines.0.iter().any(|l| l["message"] == "node running"),
        "{:?}",
        lines.0
    );
    // Lists are arrays: the view's serving members as n1 saw the
    // cluster whole.
    assert!(
        lines
            .0
            .iter()
            .any(|l| l["message"] == "membership view changed"
                && l["serving"] == serde_json::json!(["n1", "n2"])),
        "{:?}",
        lines.0
    );

    // A client-sent UUID is kept (headers.trust_client_forwarded, the
    // default): both nodes log it, and the app receives it.
    let sent = "0f8fad5b-d9cb-469f-a165-70867728950e";
    let resp = get(n1, &format!("/j?user={remote}"), &[("x-request-id", sent)]).await;
    assert_eq!(resp.json()["request_id"], sent);
    poll(Duration::from_secs(10), || {
        access_line(&json_lines(&c.log("n1")), sent).is_some()
            && access_line(&json_lines(&c.log("n2")), sent).is_some()
    })
    .expect("the client's request id on both nodes");
    // One that is not a UUID is replaced.
    let resp = get(n1, "/j", &[("x-request-id", "not-a-uuid")]).await;
    let got = resp.json()["request_id"].as_str().unwrap().to_owned();
    assert_ne!(got, "not-a-uuid");
    assert_eq!(uuid_version(&got), Some('4'));
}

/// The version digit of a hyphenated UUID.
fn uuid_version(s: &str) -> Option<char> {
    (s.len() == 36 && s.as_bytes()[8] == b'-').then(|| s.as_bytes()[14] as char)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_access_flag_no_request_is_logged() {
    let c = Cluster::start_args("noaccess", 1, "", "", &["--log-format", "json"]);
    let n1 = c.nodes[0].http;
    let id = get(n1, "/q", &[]).await.json()["request_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The entry writes its access line before it answers, so it would be
    // in the log by now.
    let lines = json_lines(&c.log("n1"));
    assert!(!lines.is_empty());
    assert!(access_line(&lines, &id).is_none(), "{lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_start_ramps_the_published_weight_in_steps_seen_by_every_node() {
    // 4 steps over 10 s: 25, 50, 75 (from 0, 2.5, 5 s), then 100 from
    // 7.5 s on; over at 10 s. A cluster converges in 1-3 s, so inside the
    // first three steps even on a loaded machine. (Each step's effect on
    // routing is checked in the slow-start simulation; here only that the
    // steps are published and seen.)
    let c = Cluster::start(
        "slowstart",
        2,
        "[balance]\nslow_start_ms = 10000\nslow_start_steps = 4\n",
        "",
    );
    let (n1, n2) = (c.nodes[0].http, c.nodes[1].http);
    let first = status(n1).expect("status");
    assert_eq!(first["target_weight"], 100, "{first}");
    // Still ramping.
    let w = first["weight"].as_u64().unwrap();
    assert!([25, 50, 75].contains(&w), "{first}");
    assert_eq!(first["slow_start"]["steps"], 4, "{first}");
    let m = scrape(n1);
    assert!(sample(&m, "peerlb_weight") < 100.0, "{m}");
    assert!(sample(&m, "peerlb_slow_start_step") >= 1.0, "{m}");
    // A new weight during the ramp is its new target: n2 publishes the
    // step in force of 200 (50, 100 or 150), and 200 once the ramp is over.
    let mut conn = Conn::open(admin_of(n2)).await.unwrap();
    let r = conn
        .request("PUT", "/_peerlb/weight", &[], bytes::Bytes::from("200"))
        .await
        .unwrap();
    assert_eq!(
        r.json(),
        serde_json::json!({ "node": "n2", "weight": 200, "previous": 100 })
    );
    let st2 = status(n2).unwrap();
    assert_eq!(st2["target_weight"], 200, "{st2}");
    let w2 = st2["weight"].as_u64().unwrap();
    assert!([50, 100, 150].contains(&w2), "{st2}");
    // n2 sees n1's published weight climb step by step, never down.
    let mut seen = vec![];
    poll(Duration::from_secs(60), || {
        let st = status(n2);
        let w = st.as_ref().and_then(|s| {
            s["members"].as_array()?.iter().find(|m| m["id"] == "n1")?["weight"].as_u64()
        });
        if let Some(w) = w
            && seen.last() != Some(&w)
        {
            seen.push(w);
        }
        w == Some(100) && status(n1).is_some_and(|s| s["slow_start"].is_null())
    })
    .unwrap_or_else(|()| panic!("the ramp did not end: {seen:?}\n{}", c.log("n1")));
    assert!(seen.windows(2).all(|p| p[0] < p[1]), "{seen:?}");
    assert!(seen.len() >= 2 && seen[0] < 100, "{seen:?}");
    assert!(
        seen.iter().all(|w| [25, 50, 75, 100].contains(w)),
        "{seen:?}"
    );
    let m = scrape(n1);
    assert_eq!(sample(&m, "peerlb_weight"), 100.0);
    assert_eq!(sample(&m, "peerlb_slow_start_step"), 0.0);
    poll(Duration::from_secs(10), || {
        status(n2).is_some_and(|s| s["weight"] == 200 && s["slow_start"].is_null())
    })
    .expect("n2 publishes its new weight in full once its ramp is over");
}
