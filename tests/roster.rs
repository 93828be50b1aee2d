//! The members out of the view, over real `peerlb` processes on loopback:
//! a node named in cluster.toml that never started reads `never seen`,
//! one that drained and stopped (SIGTERM) reads `left`, on every surface
//! an operator reads (status JSON's `roster`, `peerlb status`, the
//! `peerlb_member_state` gauge), while routing keeps them out. (A member
//! killed with `kill -9` reads `failed`: tests/manager.rs, with the
//! manager page.)

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::process::Command;
use std::time::Duration;

use support::*;

/// The roster record of `id` in the status of the node at `http`.
fn record(http: std::net::SocketAddr, id: &str) -> Option<serde_json::Value> {
    status(http)?["roster"]
        .as_array()?
        .iter()
        .find(|r| r["id"] == id)
        .cloned()
}

/// The line of `id` in `peerlb status` of the node whose admin address
/// is `admin`.
fn status_row(admin: std::net::SocketAddr, id: &str) -> String {
    let out = Command::new(bin())
        .args(["status", "--node-addr", &admin.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.split_whitespace().next() == Some(id))
        .unwrap_or_else(|| panic!("no row {id}: {out:?}"))
        .to_owned()
}

/// The value of `peerlb_member_state{member="id"}` in the metrics of the
/// node whose admin address is `admin`.
fn member_state(admin: std::net::SocketAddr, id: &str) -> Option<String> {
    // The admin API answers requests for its own address only.
    let (text, _) = raw_exchange(
        admin,
        format!("GET /_peerlb/metrics HTTP/1.1\r\nhost: {admin}\r\nconnection: close\r\n\r\n")
            .as_bytes(),
    );
    let prefix = format!("peerlb_member_state{{member=\"{id}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(str::to_owned)
}

#[test]
fn a_node_never_started_reads_never_seen_and_one_that_drained_and_stopped_reads_left() {
    // cluster.toml names n3 as well; it is never started.
    let n3 = format!(
        "[[nodes]]\nid = \"n3\"\nhttp_addr = \"127.0.0.1:{}\"\npeer_addr = \"127.0.0.1:{}\"\ngossip_addr = \"127.0.0.1:{}\"\nadmin_addr = \"127.0.0.1:{}\"\n",
        free_port(),
        free_port(),
        free_port(),
        free_port()
    );
    let mut c = Cluster::start("roster", 2, STEADY, &n3);
    let (n1, admin) = (c.nodes[0].http, admin_of(c.nodes[0].http));
    let never = record(n1, "n3").expect("n3 in the roster");
    assert_eq!(never["state"], "never seen", "{never}");
    assert_eq!(
        status_row(admin, "n3").split_whitespace().nth(1),
        Some("never")
    );
    assert_eq!(member_state(admin, "n3").as_deref(), Some("3"));
    assert!(!serving(n1).unwrap().contains(&"n3".to_owned()));

    // n2 drains and stops: it publishes leaving before it goes.
    let mut child = c.sigterm("n2");
    let exited = child.wait().unwrap();
    assert!(exited.success(), "n2 exited {exited:?}:\n{}", c.log("n2"));
    poll(Duration::from_secs(20), || {
        record(n1, "n2").is_some_and(|r| r["state"] == "left")
    })
    .unwrap_or_else(|()| panic!("n2 not left: {:?}\n{}", record(n1, "n2"), c.log("n1")));
    assert!(
        status_row(admin, "n2").contains("left "),
        "{}",
        status_row(admin, "n2")
    );
    assert_eq!(member_state(admin, "n2").as_deref(), Some("2"));
    assert_eq!(serving(n1).unwrap(), ["n1"]);
    // n3 still never seen; n1 itself alive.
    assert_eq!(record(n1, "n3").unwrap()["state"], "never seen");
    assert_eq!(member_state(admin, "n1").as_deref(), Some("0"));
}
