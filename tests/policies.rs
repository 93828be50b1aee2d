//! Balancing policies and data-centric rules as a running cluster applies
//! them: real `peerlb` processes on loopback.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use support::*;

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
    c.wait_converged(2);
    let mut seq = String::new();
    for _ in 0..20 {
        let r = get(c.nodes[0].http, "/x", &[]).await;
        assert_eq!(r.status, 200);
        seq += if r.served_by() == "n1" { "a" } else { "b" };
    }
    // mod_proxy_balancer byrequests, lbfactor 70/30 (docs/cases.md, case A3).
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
    let mut conn = Conn::open(entry).await.unwrap();
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
    let mut key = String::new();
    for _ in 0..100 {
        key = get(n2, "/x?user=alice", &[("x-tenant", "acme")])
            .await
            .json()["key"]
            .as_str()
            .unwrap()
            .to_owned();
        if key == "acme" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(key, "acme", "n2 reloads the changed file by itself");
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
