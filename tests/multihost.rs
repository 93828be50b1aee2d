//! The multi-host tier: three real `peerlb node` processes, each in a
//! network namespace of its own (a "machine" with its own loopback) on one
//! bridge, with the addresses 198.51.100.11-13/24 (TEST-NET-2) and no
//! other. The cluster is set up by the steps of docs/operations.md, "Nodes
//! on several machines": one `cluster.toml`, certificates made once and
//! copied per machine, `peerlb node --config cluster.toml --node <id>`,
//! status read on each machine's loopback admin address. Then partitions
//! under light load (two-way, one-way, a flapping link), with their
//! figures asserted against the bounds docs/operations.md gives
//! ("Partitions between machines"), and a node moved to a fourth machine
//! (198.51.100.14) with the same id. The docs' command blocks themselves
//! are read from docs/operations.md and run as printed
//! (`the_docs_multi_machine_steps_run_as_printed`), and so are the
//! examples of README.md and docs/operations.md that run on one machine,
//! each `peerlb up` on a machine of its own so the documented fixed
//! ports are free (`examples.rs` beside this file): every block marked
//! `<!-- tests/multihost.rs runs this block as printed: <name> -->`.
//!
//! Needs root and `ip` (iproute2), and for the docs' blocks `curl`, `jq`,
//! `tar` (and `nc` for the SIP quick start): skipped with a `SKIPPED` line
//! otherwise, a failure when `CI` or `PEERLB_REQUIRE_NETNS` is set (as
//! `.ci/run` does; tests/support/skip.rs). Namespaces, veths and the
//! bridge are removed by a guard even when a test fails.

// Real processes in real namespaces: wall-clock time and blocking sleeps.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

#[path = "multihost/examples.rs"]
mod examples;
mod support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use support::{bin, temp_dir};

/// Machines' addresses (the only ones this tier creates): three run the
/// cluster; the fourth is a spare machine a node moves to.
const IPS: [&str; 4] = [
    "198.51.100.11",
    "198.51.100.12",
    "198.51.100.13",
    "198.51.100.14",
];

/// Documented bounds (docs/operations.md, "Partitions between machines").
/// A cut node leaves every survivor's routing within this.
const LEAVE_WITHIN: Duration = Duration::from_secs(3);
/// After the heal, every node's view lists every node again within this.
const RECOVER_WITHIN: Duration = Duration::from_secs(5);
/// Requests to the survivors that may fail during a cut, per 100 sent.
const FAILED_PER_100: u64 = 1;

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    run(Command::new("ip").args(args))
}

/// Why this machine cannot make namespaces, if it cannot.
fn cannot_make_namespaces() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("no `ip` (iproute2)".into());
    }
    None
}

/// True (and a message printed) when the tier is skipped here.
fn skip() -> bool {
    let Some(why) = cannot_make_namespaces() else {
        return false;
    };
    support::skip::skip(
        "PEERLB_REQUIRE_NETNS",
        &format!("network namespaces cannot be made ({why})"),
        "run as root with iproute2 installed",
    );
    true
}

/// Namespaces ("machines") on a bridge; removed on drop.
struct Net {
    tag: String,
    bridge: String,
    machines: usize,
}

impl Net {
    fn ns(&self, i: usize) -> String {
        format!("plb{}m{}", self.tag, i + 1)
    }
    fn veth(&self, i: usize) -> String {
        format!("plb{}v{}", self.tag, i + 1)
    }

    /// `machines` namespaces, with the first `machines` of [`IPS`].
    fn make(name: &str, machines: usize) -> Net {
        // Interface names are at most 15 bytes: a short per-test tag.
        let tag = format!("{}{}", std::process::id() % 10_000, name);
        let net = Net {
            bridge: format!("plb{tag}b"),
            tag,
            machines,
        };
        let setup = || -> Result<(), String> {
            ip(&["link", "add", &net.bridge, "type", "bridge"])?;
            ip(&["link", "set", &net.bridge, "up"])?;
            for (i, addr) in IPS.iter().enumerate().take(machines) {
                let (ns, v, inner) = (net.ns(i), net.veth(i), format!("{}i", net.veth(i)));
                ip(&["netns", "add", &ns])?;
                ip(&["link", "add", &v, "type", "veth", "peer", "name", &inner])?;
                ip(&["link", "set", &inner, "netns", &ns])?;
                ip(&["link", "set", &v, "master", &net.bridge])?;
                ip(&["link", "set", &v, "up"])?;
                let n = |args: &[&str]| {
                    let mut all = vec!["netns", "exec", &ns, "ip"];
                    all.extend_from_slice(args);
                    ip(&all)
                };
                n(&["link", "set", "lo", "up"])?;
                n(&["addr", "add", &format!("{addr}/24"), "dev", &inner])?;
                n(&["link", "set", &inner, "up"])?;
            }
            Ok(())
        };
        if let Err(e) = setup() {
            drop(net);
            panic!("setting up the namespaces: {e}");
        }
        net
    }

    /// Runs `ip args` inside machine `i`.
    fn ip_in(&self, i: usize, args: &[&str]) -> Result<(), String> {
        let ns = self.ns(i);
        let mut all = vec!["netns", "exec", &ns, "ip"];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Runs `f` on a thread inside machine `i`'s network namespace.
    fn within<T: Send + 'static>(&self, i: usize, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/var/run/netns/{}", self.ns(i));
        std::thread::spawn(move || {
            enter(&path);
            f()
        })
        .join()
        .unwrap()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for i in 0..self.machines {
            let _ = ip(&["netns", "del", &self.ns(i)]);
            let _ = ip(&["link", "del", &self.veth(i)]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

/// Moves the calling thread into the network namespace at `path`.
fn enter(path: &str) {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open namespace file descriptor; only this thread moves.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
}

/// One blocking HTTP/1.0 GET: (status, served-by, body).
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String, String)> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nhost: {addr}\r\n\r\n").ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let served = head
        .lines()
        .find_map(|l| l.strip_prefix("peerlb-served-by: "))
        .unwrap_or("")
        .to_owned();
    Some((status, served, body.to_owned()))
}

/// The status of the machine's own node, read on its loopback admin
/// address (docs step 5).
fn status_here() -> Option<serde_json::Value> {
    let (status, _, body) = get("127.0.0.1:9080".parse().unwrap(), "/_peerlb/status")?;
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
    // view_version survives jq as text.
    v["view_version_text"].as_str()?;
    Some(v)
}

/// The serving ids of the machine's own node.
fn serving_here() -> Option<Vec<String>> {
    Some(
        status_here()?["serving"]
            .as_array()?
            .iter()
            .filter_map(|x| x.as_str().map(str::to_owned))
            .collect(),
    )
}

/// Three machines running the docs' steps.
struct Machines {
    net: Net,
    dir: PathBuf,
    nodes: Vec<Child>,
}

impl Drop for Machines {
    fn drop(&mut self) {
        for c in &mut self.nodes {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Machines {
    fn start(name: &str) -> Machines {
        Self::start_on(name, 3)
    }

    /// The docs' steps for n1-n3 on machines 1-3; `machines` namespaces
    /// in all (the others are spare).
    fn start_on(name: &str, machines: usize) -> Machines {
        let net = Net::make(name, machines);
        let dir = temp_dir(&format!("multihost-{name}"));
        // Step 1: one cluster.toml with the machines' addresses.
        let mut text = format!("name = \"multihost-{name}\"\n\n");
        for (i, a) in IPS.iter().enumerate().take(3) {
            text += &format!(
                "[[nodes]]\nid = \"n{}\"\nhttp_addr = \"{a}:8080\"\npeer_addr = \"{a}:7080\"\ngossip_addr = \"{a}:7180\"\n\n",
                i + 1
            );
        }
        // Keys from the `user` query parameter (without rules,
        // consistent-hash spreads requests as sticky-round-robin).
        text += "[[rules]]\nname = \"user\"\nextract = [{ query = \"user\" }]\n";
        let config = dir.join("cluster.toml");
        std::fs::write(&config, &text).unwrap();
        // Step 2: check it.
        let out = Command::new(bin())
            .args(["check-config", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        assert!(out.status.success(), "check-config: {out:?}");
        // Step 3: certificates once, copied per machine.
        let out = Command::new(bin())
            .args(["certs", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        assert!(out.status.success(), "certs: {out:?}");
        // Each node's view, with the files it will read.
        for i in 1..=3 {
            let out = Command::new(bin())
                .args(["check-config", "--config"])
                .arg(&config)
                .args(["--node", &format!("n{i}")])
                .output()
                .unwrap();
            assert!(out.status.success(), "check-config: {out:?}");
        }
        let mut m = Machines {
            net,
            dir: dir.clone(),
            nodes: Vec::new(),
        };
        for i in 0..3 {
            let id = format!("n{}", i + 1);
            let home = dir.join(&id);
            std::fs::create_dir_all(home.join("certs")).unwrap();
            std::fs::copy(&config, home.join("cluster.toml")).unwrap();
            for f in [
                "ca.pem".to_owned(),
                format!("{id}.pem"),
                format!("{id}.key"),
                "gossip.keys".into(),
            ] {
                std::fs::copy(dir.join("certs").join(&f), home.join("certs").join(&f)).unwrap();
            }
            // Step 4: start it on its machine.
            let child = m.launch(i, &id, &[]);
            m.nodes.push(child);
        }
        // Step 5: each machine's own node lists every node.
        for i in 0..3 {
            let ok = poll(Duration::from_secs(30), || {
                m.net
                    .within(i, || serving_here().is_some_and(|s| s.len() == 3))
            });
            assert!(
                ok.is_some(),
                "n{} did not see 3 serving\n{}",
                i + 1,
                m.logs()
            );
        }
        m
    }

    /// Starts node `id` on machine `i` from its home directory (its
    /// `cluster.toml` and certificates), with `extra` flags; its log goes
    /// on at the end of `<id>.log`.
    fn launch(&self, i: usize, id: &str, extra: &[&str]) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{id}.log")))
            .unwrap();
        Command::new("ip")
            .args(["netns", "exec", &self.net.ns(i)])
            .arg(bin())
            .args(["node", "--config", "cluster.toml", "--node", id])
            .args(extra)
            .current_dir(self.dir.join(id))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    fn logs(&self) -> String {
        (1..=3)
            .map(|i| {
                let l =
                    std::fs::read_to_string(self.dir.join(format!("n{i}.log"))).unwrap_or_default();
                format!(
                    "--- n{i}:\n{}",
                    l.lines()
                        .rev()
                        .take(40)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect::<Vec<_>>()
                        .join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Polls `f` every 20 ms until it holds or `limit` passes: the time it
/// took, or `None`.
fn poll(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn entry(i: usize) -> SocketAddr {
    format!("{}:8080", IPS[i]).parse().unwrap()
}

#[test]
fn keys_have_one_owner_whichever_machine_they_enter() {
    if skip() {
        return;
    }
    let m = Machines::start("keys");
    // Each key asked twice at machine 1's entry, then at the others,
    // starting at a different machine per key (a rotation of any kind
    // would answer differently).
    let (owners, bad) = m.net.within(0, || {
        let (mut owners, mut bad) = (std::collections::BTreeSet::new(), Vec::new());
        for k in 0..60 {
            let path = format!("/hello?user=u{k}");
            let by: Vec<String> = [0, 0, 1 + k % 2, 2 - k % 2]
                .iter()
                .map(|&i| get(entry(i), &path).map(|r| r.1).unwrap_or_default())
                .collect();
            if by[0].is_empty() || by.iter().any(|b| *b != by[0]) {
                bad.push((k, by));
            } else {
                owners.insert(by[0].clone());
            }
        }
        (owners, bad)
    });
    assert!(
        bad.is_empty(),
        "keys with several owners: {bad:?}\n{}",
        m.logs()
    );
    assert_eq!(owners.len(), 3, "60 keys not spread over the 3 nodes");
}

/// Light load (about 50 req/s) from machine 1 to the entries of machines
/// 1 and 2 over keys u0..u199, counting requests sent and failed (not 200).
struct Load {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(m: &Machines) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let (sent, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let thread = {
            let (stop, sent, failed) = (stop.clone(), sent.clone(), failed.clone());
            let path = format!("/var/run/netns/{}", m.net.ns(0));
            std::thread::spawn(move || {
                enter(&path);
                let mut k = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let at = entry((k % 2) as usize);
                    let ok =
                        get(at, &format!("/hello?user=u{}", k % 200)).is_some_and(|r| r.0 == 200);
                    sent.fetch_add(1, Ordering::Relaxed);
                    if !ok {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    k += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        Load {
            stop,
            sent,
            failed,
            thread: Some(thread),
        }
    }

    fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Waits until `more` further requests were sent: traffic is counted,
    /// not timed.
    fn requests(&self, more: u64, m: &Machines) {
        let until = self.sent() + more;
        poll(Duration::from_secs(60), || self.sent() >= until)
            .unwrap_or_else(|| panic!("the load stopped\n{}", m.logs()));
    }

    /// Stops the load: (sent, failed).
    fn finish(mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        (self.sent(), self.failed.load(Ordering::Relaxed))
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Until neither n1 nor n2 routes to n3: the time it took.
fn n3_left(m: &Machines) -> Duration {
    poll(Duration::from_secs(10), || {
        (0..2).all(|i| {
            m.net.within(i, || {
                serving_here().is_some_and(|s| !s.iter().any(|x| x == "n3"))
            })
        })
    })
    .unwrap_or_else(|| panic!("n3 never left routing\n{}", m.logs()))
}

/// Until every node's view lists the three again: the time it took.
fn all_back(m: &Machines) -> Duration {
    poll(Duration::from_secs(20), || {
        (0..3).all(|i| {
            m.net
                .within(i, || serving_here().is_some_and(|s| s.len() == 3))
        })
    })
    .unwrap_or_else(|| panic!("views did not recover\n{}", m.logs()))
}

/// [`Load`] while `cut` isolates machine 3; `heal` undoes it. Returns
/// (requests, failed, time until n1 and n2 no longer route to n3, time
/// until every view lists 3 again after the heal).
fn partition(
    m: &Machines,
    cut: &dyn Fn() -> Result<(), String>,
    heal: &dyn Fn() -> Result<(), String>,
) -> (u64, u64, Duration, Duration) {
    let load = Load::start(m);
    // Some requests before the cut, a stretch of them during it, and some
    // after the heal.
    load.requests(20, m);
    cut().unwrap_or_else(|e| panic!("cut: {e}"));
    let left = n3_left(m);
    load.requests(100, m);
    heal().unwrap_or_else(|e| panic!("heal: {e}"));
    let back = all_back(m);
    load.requests(20, m);
    let (sent, failed) = load.finish();
    (sent, failed, left, back)
}

fn assert_bounds(
    what: &str,
    m: &Machines,
    (sent, failed, left, back): (u64, u64, Duration, Duration),
) {
    eprintln!(
        "{what}: {sent} requests, {failed} failed; n3 out of routing after {left:?}; views back {back:?} after the heal"
    );
    assert!(sent > 50, "{what}: too little load ({sent})");
    assert!(
        failed * 100 <= sent * FAILED_PER_100,
        "{what}: {failed} of {sent} failed\n{}",
        m.logs()
    );
    assert!(
        left <= LEAVE_WITHIN,
        "{what}: left routing after {left:?}\n{}",
        m.logs()
    );
    assert!(
        back <= RECOVER_WITHIN,
        "{what}: recovered after {back:?}\n{}",
        m.logs()
    );
}

#[test]
fn a_two_way_partition_leaves_routing_and_heals_within_the_documented_bounds() {
    if skip() {
        return;
    }
    let m = Machines::start("two");
    let v = format!("{}i", m.net.veth(2));
    let figures = partition(
        &m,
        &|| m.net.ip_in(2, &["link", "set", &v, "down"]),
        &|| m.net.ip_in(2, &["link", "set", &v, "up"]),
    );
    assert_bounds("two-way", &m, figures);
    // The operator's log lines: the cut peer leaves routing with its
    // reason, and returns.
    let n1 = std::fs::read_to_string(m.dir.join("n1.log")).unwrap();
    let left = n1
        .lines()
        .position(|l| {
            l.contains("peer left routing") && l.contains("peer=n3") && l.contains("reason=")
        })
        .unwrap_or_else(|| panic!("no `peer left routing` line for n3\n{}", m.logs()));
    assert!(
        n1.lines()
            .skip(left)
            .any(|l| l.contains("peer returned to routing") && l.contains("peer=n3")),
        "no `peer returned to routing` line for n3 after it left\n{}",
        m.logs()
    );
    // The cut node's chitchat warns for every peer every round (about 15
    // lines a second); rate limited, one line per call site per 10 s.
    let n3 = std::fs::read_to_string(m.dir.join("n3.log")).unwrap();
    let gossip_warnings = n3
        .lines()
        .filter(|l| l.contains("Failed to gossip"))
        .count();
    assert!(
        (1..=4).contains(&gossip_warnings),
        "{gossip_warnings} `Failed to gossip` lines on the cut node"
    );
}

#[test]
fn a_one_way_partition_leaves_routing_and_heals_within_the_documented_bounds() {
    if skip() {
        return;
    }
    let m = Machines::start("one");
    // Machine 3 can no longer send to 1 and 2; it still hears them.
    let net = &m.net;
    let route = |verb: &'static str| {
        move || -> Result<(), String> {
            for a in &IPS[..2] {
                net.ip_in(2, &["route", verb, "blackhole", &format!("{a}/32")])?;
            }
            Ok(())
        }
    };
    let figures = partition(&m, &route("add"), &route("del"));
    assert_bounds("one-way", &m, figures);
}

/// A link that flaps: machine 3 cut off (link down) and back five times
/// under load, each state held until the views followed it and for at
/// least 75 requests (about 1.5 s at 50 a second). Every cut and every
/// heal is followed within the documented bounds, no more requests fail
/// than a single cut allows, and each cut and return is logged once
/// (docs/operations.md, "Partitions between machines").
#[test]
fn a_flapping_link_is_followed_within_the_documented_bounds_on_every_cut_and_heal() {
    if skip() {
        return;
    }
    const CYCLES: usize = 5;
    const HOLD: u64 = 75;
    let m = Machines::start("flap");
    let v = format!("{}i", m.net.veth(2));
    let load = Load::start(&m);
    load.requests(20, &m);
    let mut cycles = Vec::new();
    for _ in 0..CYCLES {
        m.net.ip_in(2, &["link", "set", &v, "down"]).unwrap();
        let cut_at = load.sent();
        let left = n3_left(&m);
        load.requests((cut_at + HOLD).saturating_sub(load.sent()), &m);
        m.net.ip_in(2, &["link", "set", &v, "up"]).unwrap();
        let healed_at = load.sent();
        let back = all_back(&m);
        load.requests((healed_at + HOLD).saturating_sub(load.sent()), &m);
        cycles.push((left, back));
    }
    let (sent, failed) = load.finish();
    eprintln!(
        "flapping: {CYCLES} cycles, {sent} requests, {failed} failed; (out of routing, views back) per cycle: {cycles:?}"
    );
    assert!(sent >= 2 * HOLD * CYCLES as u64, "too little load ({sent})");
    assert!(
        failed * 100 <= sent * FAILED_PER_100,
        "{failed} of {sent} failed\n{}",
        m.logs()
    );
    for (i, (left, back)) in cycles.iter().enumerate() {
        assert!(
            *left <= LEAVE_WITHIN && *back <= RECOVER_WITHIN,
            "cycle {i}: left routing after {left:?}, back after {back:?}\n{}",
            m.logs()
        );
    }
    let n1 = std::fs::read_to_string(m.dir.join("n1.log")).unwrap();
    let count = |what: &str| {
        n1.lines()
            .filter(|l| l.contains(what) && l.contains("peer=n3"))
            .count()
    };
    let (left, returned) = (
        count("peer left routing"),
        count("peer returned to routing"),
    );
    // Once at start-up, then once per heal.
    assert!(
        left >= CYCLES && returned == left + 1,
        "n1 logged n3 leaving {left} times and returning {returned} times\n{}",
        m.logs()
    );
}

/// A key answered elsewhere than expected: (key, machine, status and
/// serving node).
type WrongOwner = (String, usize, Option<(u16, String)>);

/// A node restarted on another machine with the same id and certificate
/// and its new addresses (machine 3 dies; n3 starts on the spare machine
/// 4, 198.51.100.14, with the address flags): the others learn its
/// addresses by gossip, no view keeps its old address, a node whose
/// connection to it went quiet dials it at the new one, and the keys it
/// owned come back to it from every entry (docs/operations.md, "Moving a
/// node to another machine").
#[test]
fn a_node_restarted_on_another_machine_address_with_the_same_id_gets_its_keys_back_there() {
    if skip() {
        return;
    }
    let mut m = Machines::start_on("move", 4);
    let keys: Vec<String> = m.net.within(0, || {
        (0..60)
            .map(|k| format!("u{k}"))
            .filter(|u| {
                get(entry(0), &format!("/hello?user={u}"))
                    .is_some_and(|r| r.0 == 200 && r.1 == "n3")
            })
            .collect()
    });
    assert!(keys.len() >= 5, "n3 owns only {keys:?}\n{}", m.logs());
    // Machine 3 dies.
    let mut old = m.nodes.remove(2);
    let _ = old.kill();
    let _ = old.wait();
    let v = format!("{}i", m.net.veth(2));
    m.net.ip_in(2, &["link", "set", &v, "down"]).unwrap();
    // n3 starts on machine 4 at once, before the others' failure
    // detectors drop its old self: they update the address they hold for
    // it rather than forget it and learn it anew.
    // n3 starts on machine 4 with its certificate and its new addresses.
    let (a, old_ip) = (IPS[3], IPS[2]);
    let (http, peer, gossip) = (
        format!("{a}:8080"),
        format!("{a}:7080"),
        format!("{a}:7180"),
    );
    let started = Instant::now();
    let child = m.launch(
        3,
        "n3",
        &[
            "--http-addr",
            &http,
            "--peer-addr",
            &peer,
            "--gossip-addr",
            &gossip,
        ],
    );
    m.nodes.push(child);
    let moved = |v: &serde_json::Value| {
        let members = v["members"].as_array().cloned().unwrap_or_default();
        v["serving"].as_array().is_some_and(|s| s.len() == 3)
            && members.iter().any(|x| {
                x["id"] == "n3"
                    && x["peer_addr"] == peer.as_str()
                    && x["http_addr"] == http.as_str()
            })
            && !members.iter().any(|x| {
                [&x["peer_addr"], &x["http_addr"]].iter().any(|a| {
                    a.as_str()
                        .is_some_and(|a| a.starts_with(&format!("{old_ip}:")))
                })
            })
    };
    let mut last = Vec::new();
    poll(Duration::from_secs(30), || {
        last = [0, 1, 3]
            .iter()
            .map(|&i| m.net.within(i, status_here))
            .collect();
        last.iter().all(|v| v.as_ref().is_some_and(&moved))
    })
    .unwrap_or_else(|| {
        panic!(
            "the views did not take n3's new address: {last:?}\n{}",
            m.logs()
        )
    });
    eprintln!(
        "moved: n3 at {a} in every view {:?} after its start",
        started.elapsed()
    );
    // n1's connections end quietly (QUIC's idle timeout): its requests to
    // n3 must then dial, and only n3's new address answers.
    poll(Duration::from_secs(20), || {
        m.net.within(0, || {
            status_here().is_some_and(|v| v["peer_connections"] == 0)
        })
    })
    .unwrap_or_else(|| panic!("n1's peer connections did not go quiet\n{}", m.logs()));
    // Its keys are back on it, whichever machine they enter.
    let wrong: Vec<WrongOwner> = m.net.within(0, move || {
        let mut wrong = Vec::new();
        for u in &keys {
            for i in [0, 1, 3] {
                let r = get(entry(i), &format!("/hello?user={u}")).map(|r| (r.0, r.1));
                if r.as_ref().is_none_or(|r| *r != (200, "n3".to_owned())) {
                    wrong.push((u.clone(), i + 1, r));
                }
            }
        }
        wrong
    });
    assert!(
        wrong.is_empty(),
        "keys not back on n3 (key, machine, answer): {wrong:?}\n{}",
        m.logs()
    );
}

/// The `sh` block of docs/operations.md after the marker
/// `<!-- tests/multihost.rs runs this block as printed: <name> -->`.
fn docs_block(name: &str) -> String {
    block_of("docs/operations.md", name)
}

/// The `sh` block of `file` (in the repository) after the marker
/// `<!-- tests/multihost.rs runs this block as printed: <name> -->`.
fn block_of(file: &str, name: &str) -> String {
    let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
        .unwrap();
    let marker = format!("<!-- tests/multihost.rs runs this block as printed: {name} -->");
    let at = text
        .find(&marker)
        .unwrap_or_else(|| panic!("{file} has no `{marker}`"));
    let rest = text[at + marker.len()..]
        .trim_start()
        .strip_prefix("```sh\n")
        .unwrap_or_else(|| panic!("no sh block after `{marker}`"));
    rest[..rest.find("```").unwrap()].to_owned()
}

/// The example `cluster.toml` of docs/configuration.md ("Example: three
/// machines"), as printed: its addresses, 198.51.100.11-13
/// (TEST-NET-2), are this tier's.
fn docs_example_config() -> String {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .unwrap();
    let rest = &text[text.find("## Example: three machines").unwrap()..];
    let start = rest.find("```toml\n").unwrap() + "```toml\n".len();
    let end = start + rest[start..].find("```").unwrap();
    let toml = rest[start..end].to_owned();
    assert!(toml.contains("198.51.100.13:8080"), "{toml}");
    toml
}

/// Process groups started by [`sh_in`], killed on drop (with whatever
/// they left running, such as a `nohup`ed node).
#[derive(Default)]
struct Groups(Vec<i32>);

impl Drop for Groups {
    fn drop(&mut self) {
        for g in &self.0 {
            // SAFETY: kill(2) on a process group this test started.
            unsafe { libc::kill(-g, libc::SIGKILL) };
        }
    }
}

/// Runs `script` with `bash -euo pipefail` in `dir`, on machine `ns`
/// (the host when `None`), with the `peerlb` under test first on `PATH`
/// and `env` set; in a process group of its own, recorded in `groups`.
fn sh_in(
    groups: &mut Groups,
    ns: Option<&str>,
    dir: &std::path::Path,
    script: &str,
    env: &[(&str, &str)],
) -> std::process::Output {
    use std::os::unix::process::CommandExt as _;
    let bin_dir = std::path::Path::new(bin()).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "bash"]);
            c
        }
        None => Command::new("bash"),
    };
    cmd.args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("PATH", path)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let child = cmd.spawn().unwrap();
    groups.0.push(child.id() as i32);
    child.wait_with_output().unwrap()
}

/// docs/operations.md's "Nodes on several machines" as printed: its
/// three command blocks (issue certificates and bundles, start a node,
/// check it), read from the file, run on three network namespaces with
/// the example cluster.toml of docs/configuration.md. Only the copy of
/// each bundle to its machine is the test's own (the docs leave the
/// transport to the operator).
#[test]
fn the_docs_multi_machine_steps_run_as_printed() {
    if skip() {
        return;
    }
    for tool in ["curl", "jq", "tar"] {
        if support::skip::tool(
            &[tool],
            "PEERLB_REQUIRE_NETNS",
            &format!("apt-get install -y {tool} (used by the docs' steps)"),
        )
        .is_none()
        {
            return;
        }
    }
    let net = Net::make("docs", 3);
    let mut groups = Groups::default();
    let mut apps = Vec::new();
    let dir = temp_dir("multihost-docs");
    let issuer = dir.join("issuer");
    std::fs::create_dir_all(&issuer).unwrap();
    std::fs::write(issuer.join("cluster.toml"), docs_example_config()).unwrap();
    let out = sh_in(&mut groups, None, &issuer, &docs_block("issue"), &[]);
    assert!(out.status.success(), "the issue block: {out:?}");
    let ids = ["web-1", "web-2", "web-3"];
    for (i, id) in ids.iter().enumerate() {
        let home = dir.join(id);
        std::fs::create_dir_all(&home).unwrap();
        let bundle = format!("peerlb-{id}.tgz");
        std::fs::copy(issuer.join(&bundle), home.join(&bundle)).unwrap();
        // The example's app on the machine's port 9000.
        apps.push(KillOnDrop(
            Command::new("ip")
                .args(["netns", "exec", &net.ns(i)])
                .arg(bin())
                .args([
                    "app",
                    "--listen",
                    "127.0.0.1:9000",
                    "--name",
                    &format!("app-{id}"),
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        ));
        poll(Duration::from_secs(10), || {
            net.within(i, || std::net::TcpStream::connect("127.0.0.1:9000").is_ok())
        })
        .unwrap_or_else(|| panic!("the app on {id}'s machine did not listen"));
        let out = sh_in(
            &mut groups,
            Some(&net.ns(i)),
            &home,
            &docs_block("start"),
            &[("id", id)],
        );
        assert!(out.status.success(), "the start block on {id}: {out:?}");
    }
    let check = docs_block("check");
    let logs = || {
        ids.iter()
            .map(|id| {
                let l =
                    std::fs::read_to_string(dir.join(id).join("peerlb.log")).unwrap_or_default();
                format!("--- {id}:\n{l}")
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    for (i, id) in ids.iter().enumerate() {
        let mut said = String::new();
        poll(Duration::from_secs(30), || {
            let out = sh_in(&mut groups, Some(&net.ns(i)), &dir.join(id), &check, &[]);
            said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            said == "web-1 web-2 web-3"
        })
        .unwrap_or_else(|| panic!("the check block on {id} printed {said:?}\n{}", logs()));
    }
    // The example's rules hold across machines: a tenant's requests have
    // one owner whichever machine they enter.
    let owners: Vec<Option<(u16, String)>> = net.within(0, || {
        (0..3)
            .map(|i| get(entry(i), "/api/tenants/acme/orders").map(|r| (r.0, r.1)))
            .collect()
    });
    assert!(
        owners[0]
            .as_ref()
            .is_some_and(|o| o.0 == 200 && !o.1.is_empty())
            && owners.iter().all(|o| *o == owners[0]),
        "{owners:?}\n{}",
        logs()
    );
    drop(apps);
    drop(groups);
}

/// A child process killed (and reaped) on drop.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
