//! Balancing policies and data-centric rules as a running cluster applies
//! them: real `peerlb` processes on loopback.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use support::*;

// Weighted round robin 70/30 picks `a b a a a b a a b a` (case A3 in docs/cases.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a3_weighted_round_robin_70_30_gives_the_byrequests_schedule() {
    let mut c = Cluster::start("wrr", 2, "policy = \"weighted-round-robin\"\n", "");
    // Weights live in [[nodes]]: restart both nodes with 70 / 30.
    let text = std::fs::read_to_string(&c.config).unwrap();
    let text = text
        .replacen("id = \"n1\"\n", "id = \"n1\"\nweight = 70\n", 1)
        .replacen("id = \"n2\"\n", "id = \"n2\"\nweight = 30\n", 1);
    std::fs::write(&c.config, text).unwrap();
    c.kill9("n1");
    c.kill9("n2");
    c.spawn(0);
    c.spawn(1);
    c.wait_same_view(2);
    let mut seq = String::new();
    for _ in 0..20 {
        let r = get(c.nodes[0].http, "/x", &[]).await;
        assert_eq!(r.status, 200);
        seq += if r.served_by() == "n1" { "a" } else { "b" };
    }
    // mod_proxy_balancer byrequests, lbfactor 70/30 (case A3 in docs/cases.md).
    assert_eq!(seq, "abaaabaaba".repeat(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_affinity_serves_at_the_entry_node() {
    let c = Cluster::start("local", 3, "policy = \"round-robin:local\"\n", "");
    for n in &c.nodes {
        for _ in 0..4 {
            let r = get(n.http, "/x", &[]).await;
            assert_eq!(
                r.served_by(),
                n.id,
                "round-robin:local keeps requests on their entry node"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sailfin_xml_rules_file_extracts_the_hash_key() {
    let xml = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/data-centric-rules.xml"
    ))
    .unwrap();
    let dir = temp_dir("xmlrules");
    write(&dir, "rules.xml", &xml);
    let c = Cluster::start(
        "xml",
        2,
        &format!("rules_file = \"{}\"\n", dir.join("rules.xml").display()),
        "",
    );
    let by_param = get(c.nodes[0].http, "/x?user=alice", &[]).await;
    assert_eq!(by_param.json()["key"], "alice");
    let by_uri_user = get(
        c.nodes[1].http,
        "/x",
        &[("x-from", "\"Bob\" <sip:bob@example.com>;tag=9")],
    )
    .await;
    assert_eq!(by_uri_user.json()["key"], "bob");
    let by_match = get(c.nodes[0].http, "/users/carol/orders", &[]).await;
    assert_eq!(by_match.json()["key"], "u:carol");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_reload_on_admin_call_affects_new_requests_and_bad_rules_are_refused() {
    let c = Cluster::start("reload", 2, "", USER_RULES);
    let entry = c.nodes[0].http;
    assert_eq!(
        get(entry, "/x?user=alice", &[("x-tenant", "acme")])
            .await
            .json()["key"],
        "alice"
    );
    // New rules: the tenant header wins.
    let text = std::fs::read_to_string(&c.config).unwrap().replace(
        "extract = [{ query = \"user\" }",
        "extract = [{ header = \"x-tenant\" }, { query = \"user\" }",
    );
    std::fs::write(&c.config, &text).unwrap();
    let mut conn = Conn::open(admin_of(entry)).await.unwrap();
    let r = conn
        .request("POST", "/_peerlb/rules/reload", &[], bytes::Bytes::new())
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["rules"], 1);
    assert_eq!(
        get(entry, "/x?user=alice", &[("x-tenant", "acme")])
            .await
            .json()["key"],
        "acme"
    );
    // The other node sees the file change by itself (2 s poll).
    let n2 = c.nodes[1].http;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let key = get(n2, "/x?user=alice", &[("x-tenant", "acme")])
            .await
            .json()["key"]
            .as_str()
            .unwrap()
            .to_owned();
        if key == "acme" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "n2 did not reload the changed file by itself: key {key}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // An invalid file is refused and the rules in force stay.
    std::fs::write(
        &c.config,
        text.replace("x-tenant\" }", "x-tenant\", cookie = \"both\" }"),
    )
    .unwrap();
    let r = conn
        .request("POST", "/_peerlb/rules/reload", &[], bytes::Bytes::new())
        .await
        .unwrap();
    assert_eq!(r.status, 422);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("rules[0].extract[0]"),
        "{:?}",
        r.body
    );
    assert_eq!(
        get(entry, "/x?user=alice", &[("x-tenant", "acme")])
            .await
            .json()["key"],
        "acme"
    );
    // n2 also sees the invalid file by itself, and keeps its rules.
    c.wait_until(std::time::Duration::from_secs(10), || {
        c.log("n2").contains("rules file changed but is invalid")
    })
    .expect("n2 notices the invalid rules file");
    assert_eq!(
        get(n2, "/x?user=alice", &[("x-tenant", "acme")])
            .await
            .json()["key"],
        "acme"
    );
}

/// A member's published figure `field` in `at`'s view.
fn published(at: std::net::SocketAddr, id: &str, field: &str) -> Option<u64> {
    status(at)?["members"]
        .as_array()?
        .iter()
        .find(|m| m["id"] == id)?[field]
        .as_u64()
}

/// Sends one GET through `entry` that `app` holds, waits until it reached
/// the app, and returns its task and the node serving it (found from the
/// nodes' own in-flight counts: only this request is in flight).
async fn hold_one(
    c: &Cluster,
    app: &GatedApp,
    entry: std::net::SocketAddr,
    target: &str,
) -> (tokio::task::JoinHandle<Resp>, String) {
    let before = app.arrived_total();
    let target = target.to_owned();
    let task = tokio::spawn(async move { get(entry, &target, &[]).await });
    eventually(Duration::from_secs(20), || {
        app.arrived_total() == before + 1
    })
    .await
    .expect("the held request reaches an app");
    let mut at = None;
    eventually(Duration::from_secs(10), || {
        at = c
            .nodes
            .iter()
            .filter(|n| n.http != entry)
            .find(|n| status(n.http).is_some_and(|s| s["inflight"] == 1))
            .map(|n| n.id.clone());
        at.is_some() || counter(entry, "served_local") > 0
    })
    .await
    .expect("some node serves the held request");
    let entry_id = c.nodes.iter().find(|n| n.http == entry).unwrap().id.clone();
    (task, at.unwrap_or(entry_id))
}

/// The nodes a policy that avoids loaded nodes must pick once one request
/// is held at `x`, entering at n1 (whose own figure counts the held client
/// request): every node but n1 and `x`.
fn idle_nodes(x: &str) -> Vec<&'static str> {
    ["n2", "n3"].into_iter().filter(|id| *id != x).collect()
}

/// `least-load` through a running cluster: with one request held at some
/// node, new requests entering at n1 go to the nodes with nothing in
/// flight (lowest `N * 10000 / weight`), ties round robin, never to a
/// loaded one (case A9 in docs/cases.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_load_sends_new_requests_to_the_idle_nodes() {
    let app = GatedApp::start().await;
    let c = Cluster::start(
        "leastload",
        3,
        &format!("policy = \"least-load\"\napp = \"http://{}\"\n", app.addr),
        STEADY,
    );
    let n1 = c.nodes[0].http;
    let (held, x) = hold_one(&c, &app, n1, "/hold/a").await;
    // n1's view has its own published figure (the held client request).
    eventually(Duration::from_secs(10), || {
        published(n1, "n1", "inflight").is_some_and(|v| v >= 1)
    })
    .await
    .expect("n1 publishes its in-flight request");
    let idle = idle_nodes(&x);
    let mut served = Vec::new();
    for i in 0..6 {
        let r = get(n1, &format!("/x{i}"), &[]).await;
        assert_eq!(r.status, 200);
        served.push(r.served_by().to_owned());
    }
    app.release();
    assert_eq!(held.await.unwrap().served_by(), x);
    assert!(
        served.iter().all(|s| idle.contains(&s.as_str())),
        "held at {x}: new requests went to {served:?}, not only to {idle:?}"
    );
    let used: BTreeSet<&String> = served.iter().collect();
    assert_eq!(used.len(), idle.len(), "ties go round robin: {served:?}");
}

/// `metric` through a running cluster: with `metric_capacity = 1`, a node
/// with a request in flight publishes load 0 and gets no new requests
/// (mod_oc4j's byrequests on the published metric; case A6 in
/// docs/cases.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_sends_nothing_to_a_node_publishing_load_0() {
    let app = GatedApp::start().await;
    let c = Cluster::start(
        "metric",
        3,
        &format!("policy = \"metric\"\napp = \"http://{}\"\n", app.addr),
        &format!("{STEADY}[balance]\nmetric_capacity = 1\nmetric_history = 0.0\n"),
    );
    let n1 = c.nodes[0].http;
    let (held, x) = hold_one(&c, &app, n1, "/hold/a").await;
    eventually(Duration::from_secs(10), || {
        published(n1, "n1", "load") == Some(0)
            && published(n1, &x, "load") == Some(0)
            && idle_nodes(&x)
                .iter()
                .all(|id| published(n1, id, "load") == Some(100))
    })
    .await
    .expect("n1's view shows the loaded nodes at metric 0, the others at 100");
    let idle = idle_nodes(&x);
    let mut served = Vec::new();
    for i in 0..6 {
        let r = get(n1, &format!("/x{i}"), &[]).await;
        assert_eq!(r.status, 200);
        served.push(r.served_by().to_owned());
    }
    app.release();
    held.await.unwrap();
    assert!(
        served.iter().all(|s| idle.contains(&s.as_str())),
        "held at {x}: metric-0 nodes were picked: {served:?}"
    );
    let used: BTreeSet<&String> = served.iter().collect();
    assert_eq!(used.len(), idle.len(), "equal metrics share: {served:?}");
}

/// `by-traffic` through a running cluster: each request goes to the node
/// this entry has moved the fewest bytes to (ties to the first id), so
/// after 100 kB to n1 and to n2, small requests all go to n3
/// (mod_proxy_balancer bytraffic; case A5 in docs/cases.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_traffic_sends_requests_to_the_node_with_the_fewest_bytes() {
    let c = Cluster::start("bytraffic", 3, "policy = \"by-traffic\"\n", STEADY);
    let n1 = c.nodes[0].http;
    let view = status(n1).unwrap()["view_version"].to_string();
    let body = bytes::Bytes::from(vec![b'a'; 100_000]);
    let mut served = Vec::new();
    for i in 0..12 {
        let mut conn = Conn::open(n1).await.unwrap();
        let r = if i < 2 {
            conn.request("POST", "/echo", &[], body.clone())
                .await
                .unwrap()
        } else {
            conn.get("/x", &[]).await.unwrap()
        };
        assert_eq!(r.status, 200);
        served.push(r.served_by().to_owned());
        // The bytes count once the answer has ended on the entry.
        eventually(Duration::from_secs(10), || {
            status(n1).is_some_and(|s| s["inflight"] == 0)
        })
        .await
        .expect("the request ends on the entry");
    }
    assert_eq!(
        status(n1).unwrap()["view_version"].to_string(),
        view,
        "n1's view changed during the run (a member flapped): the byte counts restarted"
    );
    let mut want = vec!["n1", "n2"];
    want.extend(["n3"; 10]);
    assert_eq!(served, want);
}

/// Bounded-load consistent hashing through a running cluster
/// (`hash_balance_factor = 1.0`, two equal nodes): with one request for a
/// key held at its owner n2, n1 sees loads n1 = 0 (a node publishes the
/// requests its app serves, not those it forwards) and n2 = 2 (published 1
/// + n1's own 1 outstanding); capacity ceil((2 + 1) x 1.0) = 3 splits into
/// caps 1 and 2, so n2 is at its cap and the key's next request is served
/// by n1; once the load is gone, n2 serves it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_load_hashing_moves_a_key_off_an_owner_at_its_cap() {
    let app = GatedApp::start().await;
    let c = Cluster::start(
        "bounded",
        2,
        &format!("app = \"http://{}\"\n[ring]\nvnodes = 1024\n", app.addr),
        &format!("{STEADY}[balance]\nhash_balance_factor = 1.0\n\n{USER_RULES}"),
    );
    let r = ring(&["n1", "n2"], 1024);
    let user = user_where(&r, |o| o == "n2");
    let n1 = c.nodes[0].http;
    assert_eq!(
        get(n1, &format!("/x?user={user}"), &[]).await.served_by(),
        "n2"
    );
    let (held, at) = hold_one(&c, &app, n1, &format!("/hold/a?user={user}")).await;
    assert_eq!(at, "n2", "an idle owner is below its cap");
    eventually(Duration::from_secs(10), || {
        published(n1, "n1", "inflight") == Some(0) && published(n1, "n2", "inflight") == Some(1)
    })
    .await
    .expect("n1's view shows the held request served by n2 only");
    let moved = get(n1, &format!("/x?user={user}"), &[]).await;
    assert_eq!(moved.status, 200);
    assert_eq!(
        moved.served_by(),
        "n1",
        "the owner at its cap is passed over"
    );
    app.release();
    assert_eq!(held.await.unwrap().served_by(), "n2");
    eventually(Duration::from_secs(10), || {
        published(n1, "n1", "inflight") == Some(0) && published(n1, "n2", "inflight") == Some(0)
    })
    .await
    .expect("the load is gone");
    assert_eq!(
        get(n1, &format!("/x?user={user}"), &[]).await.served_by(),
        "n2"
    );
}
