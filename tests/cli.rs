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
    // The client port is taken while the commands run: a node that bound
    // it before validating would fail on the bind instead, and its error
    // would not name the field. Bound here first (port 0), so no other
    // test can take it between choosing it and holding it.
    let held = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = held.local_addr().unwrap().port();
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
        assert!(!err.contains("bind"), "{args:?}: {err}");
    }
    drop(held);
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

/// A file for `n` loopback nodes (`n1`..) on free ports, gossip every 100 ms.
/// Returns the file and each node's (http, peer) ports.
fn cluster_file(
    dir: &std::path::Path,
    n: usize,
    head: &str,
) -> (std::path::PathBuf, Vec<(u16, u16)>) {
    let mut text = format!("name = \"cli\"\n{head}\n[gossip]\ninterval_ms = 100\n");
    let mut ports = Vec::new();
    for i in 1..=n {
        let (http, peer) = (free_port(), free_port());
        ports.push((http, peer));
        text += &format!(
            "[[nodes]]\nid = \"n{i}\"\nhttp_addr = \"127.0.0.1:{http}\"\npeer_addr = \"127.0.0.1:{peer}\"\ngossip_addr = \"127.0.0.1:{}\"\n",
            free_port()
        );
    }
    (write(dir, "cluster.toml", &text), ports)
}

/// `check-config --node ID` adds the per-node check: an id not in the
/// file is an error there (64, naming `--node`), while the whole-file
/// check alone passes.
#[test]
fn check_config_with_node_also_runs_the_per_node_check() {
    let dir = temp_dir("checknode");
    let (cfg, ports) = cluster_file(&dir, 2, "");
    let run = |extra: &[&str]| {
        Command::new(bin())
            .args(["check-config", "--config"])
            .arg(&cfg)
            .args(extra)
            .env_remove("PEERLB_NODE")
            .output()
            .unwrap()
    };
    let whole = run(&[]);
    assert_eq!(whole.status.code(), Some(0), "{whole:?}");
    // With --node it reads the node's files: none yet.
    let missing = run(&["--node", "n2"]);
    assert_eq!(missing.status.code(), Some(64), "{missing:?}");
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(
        err.contains("tls: reading") && err.contains("ca.pem") && err.contains("peerlb certs"),
        "{err}"
    );
    let certs = Command::new(bin())
        .args(["certs", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(certs.status.success(), "{certs:?}");
    // A keyring that is not one: named by its field.
    let keyring = dir.join("certs/gossip.keys");
    let good_keys = std::fs::read(&keyring).unwrap();
    std::fs::write(&keyring, "not a key\n").unwrap();
    let bad = run(&["--node", "n2"]);
    assert_eq!(bad.status.code(), Some(64), "{bad:?}");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("tls.gossip_keyring"),
        "{bad:?}"
    );
    std::fs::write(&keyring, good_keys).unwrap();
    let known = run(&["--node", "n2"]);
    assert_eq!(known.status.code(), Some(0), "{known:?}");
    // It says what the per-node check adds: the node's own addresses.
    let said = String::from_utf8_lossy(&known.stdout);
    let http2 = ports[1].0;
    assert!(
        said.contains(&format!("node n2: http 127.0.0.1:{http2}"))
            && said.contains(&format!("admin 127.0.0.1:{}", http2 + 1000)),
        "{said}"
    );
    assert!(said.contains("(read)"), "{said}");
    assert!(
        !String::from_utf8_lossy(&whole.stdout).contains("node n2:"),
        "{whole:?}"
    );
    let unknown = run(&["--node", "n9"]);
    assert_eq!(unknown.status.code(), Some(64), "{unknown:?}");
    let err = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        err.contains("--node") && err.contains("\"n9\" is not in [[nodes]]"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A node handed another node's certificate and key refuses to start
/// under a false name: exit 1 with the documented message.
#[test]
fn node_exits_1_on_another_nodes_certificate() {
    let dir = temp_dir("othercert");
    let (cfg, _) = cluster_file(&dir, 2, "");
    let out = Command::new(bin())
        .args(["certs", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let certs = dir.join("certs");
    std::fs::copy(certs.join("n2.pem"), certs.join("n1.pem")).unwrap();
    std::fs::copy(certs.join("n2.key"), certs.join("n1.key")).unwrap();
    let mut child = Command::new(bin())
        .args(["node", "--node", "n1", "--config"])
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut status = None;
    let exited = poll(Duration::from_secs(20), || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    if exited.is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("a node with n2's certificate kept running as n1");
    }
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.unwrap().code(), Some(1), "{err}");
    assert!(
        err.contains("peer certificate is not valid for node \"n1\""),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A child of `up` that exits before the cluster is ready (its http port
/// is taken) stops the start: `up` reports it and exits 1.
#[test]
fn up_exits_1_when_a_node_fails_to_start() {
    let dir = temp_dir("upfail");
    let sprayer = free_port();
    let (cfg, ports) = cluster_file(&dir, 3, &format!("sprayer_addr = \"127.0.0.1:{sprayer}\""));
    // n2's peer (UDP) port is taken: n2 cannot bind it and exits 1.
    let _taken = std::net::UdpSocket::bind(("127.0.0.1", ports[1].1)).unwrap();
    let http: Vec<u16> = ports.iter().map(|p| p.0).collect();
    let mut up = Command::new(bin())
        .args(["up", "--config"])
        .arg(&cfg)
        .current_dir(&dir)
        .stdout(std::fs::File::create(dir.join("up.out")).unwrap())
        .stderr(std::fs::File::create(dir.join("up.err")).unwrap())
        .spawn()
        .unwrap();
    let mut status = None;
    let exited = poll(Duration::from_secs(30), || {
        status = up.try_wait().unwrap();
        status.is_some()
    });
    if exited.is_err() {
        // SAFETY: kill(2) on our own child: SIGTERM stops its nodes too.
        unsafe { libc::kill(up.id() as libc::pid_t, libc::SIGTERM) };
        let _ = up.wait();
        panic!(
            "up kept running with a node that could not start\n{}",
            std::fs::read_to_string(dir.join("up.out")).unwrap_or_default()
        );
    }
    let out = std::fs::read_to_string(dir.join("up.out")).unwrap()
        + &std::fs::read_to_string(dir.join("up.err")).unwrap();
    assert_eq!(status.unwrap().code(), Some(1), "{out}");
    assert!(out.contains("node n2 exited (status 1)"), "{out}");
    // The others were stopped: nothing serves on their ports any more.
    poll(Duration::from_secs(20), || {
        [http[0], http[2]]
            .iter()
            .all(|p| std::net::TcpStream::connect(("127.0.0.1", *p)).is_err())
    })
    .expect("up stops the nodes that did start");
    let _ = std::fs::remove_dir_all(dir);
}

/// On the embedded config there is no file to reload: the rules reload
/// answers 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_reload_on_the_embedded_config_is_409() {
    let dir = temp_dir("embedded");
    let out = Command::new(bin())
        .arg("certs")
        .current_dir(&dir)
        .env_remove("PEERLB_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let http: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let log = std::fs::File::create(dir.join("n1.log")).unwrap();
    let mut node = Command::new(bin())
        .args(["node", "--node", "n1", "--http-addr", &http.to_string()])
        .args(["--peer-addr", &format!("127.0.0.1:{}", free_port())])
        .args(["--gossip-addr", &format!("127.0.0.1:{}", free_port())])
        .current_dir(&dir)
        .env_remove("PEERLB_CONFIG")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let up = eventually(Duration::from_secs(20), || status(http).is_some()).await;
    let answer = if up.is_ok() {
        let mut conn = Conn::open(admin_of(http)).await.unwrap();
        conn.request("POST", "/_peerlb/rules/reload", &[], bytes::Bytes::new())
            .await
            .ok()
    } else {
        None
    };
    let _ = node.kill();
    let _ = node.wait();
    let log = std::fs::read_to_string(dir.join("n1.log")).unwrap_or_default();
    let r = answer.unwrap_or_else(|| panic!("the node never answered\n{log}"));
    assert_eq!(r.status, 409, "{:?}", r.body);
    assert!(r.json()["error"].is_string(), "{:?}", r.body);
    // The admin address is not a client entry: no `peerlb-entry`.
    assert_eq!(r.header("peerlb-entry"), None);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn route_replays_the_least_load_example_with_a_load_step() {
    // Citrix custom load: figures 20, 70, 80, each request adding 10.
    // Requests 1-5 to s1; 6 to s2 (s1 and s2 tie at 70); 7 to s1 (alone at
    // 70); 8 to s3 (all tie at 80; the tie rotation continues after s2).
    let picks = |step: &str| -> String {
        let out = Command::new(bin())
            .args(["route", "--request", "GET /", "--policy", "least-load"])
            .args(["--members", "s1=inflight:20,s2=inflight:70,s3=inflight:80"])
            .args(["--count", "8", "--load-step", step, "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let picks: Vec<&str> = v["picks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap())
            .collect();
        picks.join(" ")
    };
    assert_eq!(picks("10"), "s1 s1 s1 s1 s1 s2 s1 s3");
    // Without a step nothing adds load: the first pick repeats.
    assert_eq!(picks("0"), "s1 s1 s1 s1 s1 s1 s1 s1");
}

/// The global options (`--log-format`, `--access-log`) are listed once,
/// in `peerlb --help`; each command's help says where they are instead of
/// repeating them, and they are still accepted after the command.
#[test]
fn global_options_are_listed_once_and_accepted_after_any_command() {
    let help = |args: &[&str]| {
        let out = Command::new(bin()).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let top = help(&["--help"]);
    assert_eq!(top.matches("--log-format <LOG_FORMAT>").count(), 1, "{top}");
    assert_eq!(top.matches("--access-log\n").count(), 1, "{top}");
    for cmd in [
        &["node", "--help"][..],
        &["status", "--help"],
        &["drain", "--help"],
        &["keyring", "list", "--help"],
    ] {
        let text = help(cmd);
        assert!(
            !text.contains("--log-format <") && !text.contains("Log one line per request"),
            "{cmd:?} repeats the global options:\n{text}"
        );
        assert!(
            text.contains("Global options (before or after the command): --log-format"),
            "{cmd:?}:\n{text}"
        );
    }
    // Accepted after the command all the same.
    let out = Command::new(bin())
        .args(["check-config", "--log-format", "json", "--access-log"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // undrain and offline have no timeout to offer.
    for cmd in ["undrain", "offline"] {
        assert!(!help(&[cmd, "--help"]).contains("--timeout-ms"), "{cmd}");
    }
    assert!(help(&["drain", "--help"]).contains("--timeout-ms"));
}

/// `--node-addr` takes `host:port`; one that is not is a usage error
/// naming the flag (64), before anything is sent.
#[test]
fn a_node_addr_that_is_not_host_port_exits_64_naming_the_flag() {
    for cmd in ["status", "reload-rules"] {
        let out = Command::new(bin())
            .args([cmd, "--node-addr", "nowhere"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--node-addr: \"nowhere\" is not host:port"),
            "{err}"
        );
    }
}
