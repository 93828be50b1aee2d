//! The `peerlb` command line as a user runs it: `check-config`, `node` with
//! a bad config, and `up` (the quick start) with the kernel as sprayer.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use support::*;

#[test]
fn check_config_accepts_the_embedded_default() {
    let out = Command::new(bin()).arg("check-config").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("valid") && text.contains("3 nodes") && text.contains("consistent-hash"),
        "{text}"
    );
}

#[test]
fn an_invalid_config_names_the_field_and_exits_64_before_binding() {
    let dir = temp_dir("badcfg");
    // Valid TOML, bad value: the field path must be named.
    let port = free_port();
    let bad = write(
        &dir,
        "bad.toml",
        &format!(
            "[[nodes]]\nid = \"n1\"\nhttp_addr = \"127.0.0.1:{port}\"\npeer_addr = \"127.0.0.1:1\"\ngossip_addr = \"not an address\"\n"
        ),
    );
    for args in [
        vec!["check-config", "--config"],
        vec!["node", "--node", "n1", "--config"],
    ] {
        let out = Command::new(bin()).args(&args).arg(&bad).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("nodes[0].gossip_addr"), "{args:?}: {err}");
    }
    // Unknown fields are named too.
    let unknown = write(&dir, "unknown.toml", "nmae = \"typo\"\n");
    let out = Command::new(bin())
        .args(["check-config", "--config"])
        .arg(&unknown)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nmae"));
    // A node id that is not in the file.
    let ok = write(
        &dir,
        "ok.toml",
        "[[nodes]]\nid = \"n1\"\nhttp_addr = \"127.0.0.1:1\"\npeer_addr = \"127.0.0.1:2\"\ngossip_addr = \"127.0.0.1:3\"\n",
    );
    let out = Command::new(bin())
        .args(["node", "--node", "n7", "--config"])
        .arg(&ok)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--node"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_node_without_certificates_is_told_to_run_peerlb_certs() {
    let dir = temp_dir("nocerts");
    let cfg = write(
        &dir,
        "c.toml",
        &format!(
            "[[nodes]]\nid = \"n1\"\nhttp_addr = \"127.0.0.1:{}\"\npeer_addr = \"127.0.0.1:{}\"\ngossip_addr = \"127.0.0.1:{}\"\n",
            free_port(),
            free_port(),
            free_port()
        ),
    );
    let out = Command::new(bin())
        .args(["node", "--node", "n1", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("peerlb certs") && err.contains("ca.pem"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// `peerlb up`: three children behind one SO_REUSEPORT address; `kill -9`
/// of one leaves the others serving every key; SIGTERM stops them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_starts_every_node_behind_one_shared_address_and_survives_a_kill() {
    let dir = temp_dir("up");
    let sprayer: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut text =
        format!("name = \"up\"\nsprayer_addr = \"{sprayer}\"\n[gossip]\ninterval_ms = 100\n");
    for i in 1..=3 {
        text += &format!(
            "[[nodes]]\nid = \"n{i}\"\nhttp_addr = \"127.0.0.1:{}\"\npeer_addr = \"127.0.0.1:{}\"\ngossip_addr = \"127.0.0.1:{}\"\n",
            free_port(),
            free_port(),
            free_port()
        );
    }
    text += USER_RULES;
    let cfg = write(&dir, "cluster.toml", &text);
    let mut up = Command::new(bin())
        .args(["up", "--config"])
        .arg(&cfg)
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = up.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut pids = std::collections::BTreeMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
            .expect("peerlb up reports the cluster ready within 30 s");
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.len() >= 2
            && ["n1", "n2", "n3"].contains(&words[0])
            && let Ok(pid) = words[1].parse::<u32>()
        {
            pids.insert(words[0].to_owned(), pid);
        }
        if line.starts_with("cluster ready") {
            break;
        }
    }
    assert_eq!(pids.len(), 3, "the table names every node's pid");
    assert!(
        dir.join("certs/ca.pem").is_file(),
        "up creates the certificates"
    );
    // The kernel spreads connections over the three nodes.
    let mut entries = std::collections::BTreeSet::new();
    for i in 0..60 {
        let r = get(sprayer, &format!("/x?user=u{i}"), &[]).await;
        assert_eq!(r.status, 200);
        entries.insert(r.header("peerlb-entry").unwrap().to_owned());
    }
    assert_eq!(
        entries.len(),
        3,
        "SO_REUSEPORT sprays connections to every node: {entries:?}"
    );
    // kill -9 one child: every request through the shared address still succeeds.
    // SAFETY: kill(2) on a child of the `up` process we started.
    unsafe { libc::kill(pids["n2"] as libc::pid_t, libc::SIGKILL) };
    poll(Duration::from_secs(10), || {
        rx.try_iter()
            .any(|l| l.starts_with("node n2") && l.contains("exited"))
    })
    .expect("up reports that n2 exited");
    // The survivors drop n2 from their views; then every key is served by
    // one of them (the ring without n2), through the shared address.
    let survivors: Vec<std::net::SocketAddr> = text
        .lines()
        .filter(|l| l.starts_with("http_addr"))
        .filter_map(|l| l.split('"').nth(1)?.parse().ok())
        .collect();
    assert_eq!(survivors.len(), 3);
    let (n1, n3) = (survivors[0], survivors[2]);
    poll(Duration::from_secs(20), || {
        [n1, n3]
            .iter()
            .all(|a| serving(*a).is_some_and(|s| s == ["n1", "n3"]))
    })
    .expect("the survivors drop n2 from their views");
    let without_n2 = ring(&["n1", "n3"], 1024);
    let mut served = std::collections::BTreeSet::new();
    for i in 0..60 {
        let user = format!("u{i}");
        let r = get(sprayer, &format!("/x?user={user}"), &[]).await;
        assert_eq!(r.status, 200, "request {i} after the kill");
        assert_eq!(r.served_by(), &**without_n2.owner(&user).unwrap());
        served.insert(r.served_by().to_owned());
    }
    assert_eq!(served.len(), 2, "both survivors serve: {served:?}");
    // SIGTERM to up: it stops the remaining nodes and exits 0.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(up.id() as libc::pid_t, libc::SIGTERM) };
    let mut status = None;
    poll(Duration::from_secs(20), || {
        status = up.try_wait().unwrap();
        status.is_some()
    })
    .expect("up exits after SIGTERM");
    assert!(status.unwrap().success());
    for id in ["n1", "n3"] {
        // SAFETY: signal 0 only checks whether the process exists.
        let alive = unsafe { libc::kill(pids[id] as libc::pid_t, 0) } == 0;
        assert!(!alive, "{id} still runs after up stopped");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn route_explains_a_decision_and_reproduces_the_byrequests_example() {
    let out = Command::new(bin())
        .args(["route", "--request", "GET /cart?user=alice"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let owner = ring(&["n1", "n2", "n3"], 1024)
        .owner("alice")
        .unwrap()
        .to_string();
    assert!(
        text.contains("rules[0] (user)") && text.contains("hash key    alice"),
        "{text}"
    );
    assert!(text.contains(&format!("owner       {owner}")), "{text}");
    let out = Command::new(bin())
        .args([
            "route",
            "--request",
            "GET /",
            "--policy",
            "weighted-round-robin",
        ])
        .args([
            "--members",
            "a=weight:70,b=weight:30",
            "--count",
            "10",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let picks: Vec<&str> = v["picks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert_eq!(picks.join(" "), "a b a a a b a a b a");
    let out = Command::new(bin())
        .args(["route", "--request", "GET /", "--members", "a=speed:9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--members"));
}
