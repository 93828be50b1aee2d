//! Black-box tests of a real 3-node cluster over loopback: real `peerlb`
//! processes, real QUIC with mutual TLS, real gossip.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use peerlb::{NodeId, Ring};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_reaches_the_same_owner_from_every_entry_and_keys_cover_all_nodes() {
    let c = Cluster::start("owner", 3, "[ring]\nvnodes = 1024\n", USER_RULES);
    let r = ring(&["n1", "n2", "n3"], 1024);
    let mut owners = BTreeSet::new();
    for u in 0..30 {
        let user = format!("user{u}");
        for n in &c.nodes {
            let resp = get(n.http, &format!("/x?user={user}"), &[]).await;
            assert_eq!(resp.status, 200);
            assert_eq!(resp.header("peerlb-entry"), Some(n.id.as_str()));
            assert_eq!(resp.json()["key"], user.as_str());
            // Every entry agrees with the ring every node builds.
            assert_eq!(
                resp.served_by(),
                &**r.owner(&user).unwrap(),
                "user {user} via {}",
                n.id
            );
            assert_eq!(resp.json()["proxied"], resp.served_by() != n.id);
            owners.insert(resp.served_by().to_owned());
        }
    }
    assert_eq!(
        owners.len(),
        3,
        "30 keys must reach all 3 nodes: {owners:?}"
    );
    // The header rule and the cookie rule give the same key as the query rule.
    let by_header = get(c.nodes[0].http, "/x", &[("x-user", "user7")]).await;
    let by_cookie = get(c.nodes[1].http, "/x", &[("cookie", "session=user7")]).await;
    assert_eq!(by_header.served_by(), &**r.owner("user7").unwrap());
    assert_eq!(by_cookie.served_by(), &**r.owner("user7").unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_mib_request_and_response_bodies_cross_the_hop_intact() {
    let c = Cluster::start("body", 3, "[ring]\nvnodes = 1024\n", USER_RULES);
    let r = ring(&["n1", "n2", "n3"], 1024);
    let user = user_where(&r, |o| o != "n1");
    let owner = r.owner(&user).unwrap().to_string();
    let body: Bytes = (0..10 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(7) % 251) as u8)
        .collect::<Vec<_>>()
        .into();
    let mut conn = Conn::open(c.nodes[0].http).await.unwrap();
    let resp = conn
        .request("POST", &format!("/echo?user={user}"), &[], body.clone())
        .await
        .unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.served_by(), owner);
    assert_eq!(resp.body.len(), body.len());
    assert!(resp.body == body, "echoed body differs");
    let resp = conn
        .get(&format!("/bytes/10485760?user={user}"), &[])
        .await
        .unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.served_by(), owner);
    assert_eq!(resp.header("content-length"), Some("10485760"));
    assert!(
        resp.body
            .iter()
            .enumerate()
            .all(|(i, &b)| b == ((i % 65536) % 251) as u8)
    );
}

/// One request's outcome in a load run.
#[derive(Debug, Clone)]
struct Rec {
    at: Instant,
    /// The node the client's connection entered (last known).
    entry: String,
    served_by: Option<String>,
    error: Option<String>,
    /// Which client connection carried it: (client loop, connection number).
    conn: (usize, u32),
}

/// Per client loop of a load run: requests answered so far, and whether
/// the loop has ended (its node is gone). Tests wait on these counts
/// instead of sleeping for a fixed time.
#[derive(Default)]
struct Progress {
    done: Vec<std::sync::atomic::AtomicU64>,
    ended: Vec<AtomicBool>,
}

impl Progress {
    fn new(loops: usize) -> Arc<Progress> {
        Arc::new(Progress {
            done: (0..loops).map(|_| Default::default()).collect(),
            ended: (0..loops).map(|_| Default::default()).collect(),
        })
    }

    fn snapshot(&self) -> Vec<u64> {
        self.done
            .iter()
            .map(|d| d.load(Ordering::Relaxed))
            .collect()
    }

    /// Waits (up to 30 s) until every loop still running has had `n` more
    /// requests answered than in `from`.
    async fn advance(&self, from: &[u64], n: u64, what: &str) {
        eventually(Duration::from_secs(30), || {
            from.iter().enumerate().all(|(i, f)| {
                self.ended[i].load(Ordering::Relaxed)
                    || self.done[i].load(Ordering::Relaxed) >= f + n
            })
        })
        .await
        .unwrap_or_else(|_| panic!("traffic stalled: {what}"));
    }
}

/// Sends GETs on `conns` keep-alive connections to each address in `addrs`
/// until `stop`; a failed connection is recorded and reopened.
fn load(
    addrs: Vec<(String, std::net::SocketAddr)>,
    conns: usize,
    stop: Arc<AtomicBool>,
) -> (Vec<tokio::task::JoinHandle<Vec<Rec>>>, Arc<Progress>) {
    let progress = Progress::new(addrs.len() * conns);
    let mut tasks = Vec::new();
    for (label, addr) in addrs {
        for k in 0..conns {
            let stop = stop.clone();
            let label = label.clone();
            let loop_id = tasks.len();
            let progress = progress.clone();
            tasks.push(tokio::spawn(async move {
                let mut recs = Vec::new();
                let mut i = k * 1000;
                let mut conn: Option<Conn> = None;
                let mut conn_no = 0u32;
                let mut entry = label.clone();
                while !stop.load(Ordering::Relaxed) {
                    if conn.is_none() {
                        match Conn::open(addr).await {
                            Ok(c) => {
                                conn = Some(c);
                                conn_no += 1;
                            }
                            // The node behind this address is gone: no request
                            // was sent, so nothing is lost; this client stops.
                            Err(_) => break,
                        }
                    }
                    i += 1;
                    let target = format!("/x?user=u{}", i % 200);
                    match conn.as_mut().unwrap().get(&target, &[]).await {
                        Ok(r) if r.status == 200 => {
                            entry = r.header("peerlb-entry").unwrap_or("?").to_owned();
                            recs.push(Rec {
                                conn: (loop_id, conn_no),
                                at: Instant::now(),
                                entry: entry.clone(),
                                served_by: Some(r.served_by().to_owned()),
                                error: None,
                            });
                        }
                        Ok(r) => {
                            recs.push(Rec {
                                conn: (loop_id, conn_no),
                                at: Instant::now(),
                                entry: entry.clone(),
                                served_by: None,
                                error: Some(format!("status {} {:?}", r.status, r.body)),
                            });
                        }
                        // The server closed the idle connection (drain): the
                        // request was never sent; reconnect.
                        Err(e) if e.starts_with(NOT_SENT) => conn = None,
                        Err(e) => {
                            recs.push(Rec {
                                conn: (loop_id, conn_no),
                                at: Instant::now(),
                                entry: entry.clone(),
                                served_by: None,
                                error: Some(e),
                            });
                            conn = None;
                        }
                    }
                    progress.done[loop_id].fetch_add(1, Ordering::Relaxed);
                }
                progress.ended[loop_id].store(true, Ordering::Relaxed);
                recs
            }));
        }
    }
    (tasks, progress)
}

async fn collect(tasks: Vec<tokio::task::JoinHandle<Vec<Rec>>>) -> Vec<Rec> {
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

/// The assertions shared by the direct and the HAProxy kill tests.
/// `settled_at`: when every survivor's view had dropped the victim and
/// every client loop had finished a request since.
fn check_kill_run(
    recs: &[Rec],
    victim: &str,
    killed_at: Instant,
    settled_at: Instant,
    victim_conns: usize,
) {
    let ok = recs.iter().filter(|r| r.error.is_none()).count();
    assert!(ok > 300, "too little traffic to judge: {ok} ok");
    let failed_survivor: Vec<&Rec> = recs
        .iter()
        .filter(|r| r.error.is_some() && r.entry != victim)
        .collect();
    assert!(
        failed_survivor.is_empty(),
        "requests entering through a survivor failed: {failed_survivor:#?}"
    );
    // The only requests that may fail are those in flight on a client
    // connection to the killed node itself: at most one per connection
    // (counting connections the client opened while the node was dying).
    let failed_victim: Vec<&Rec> = recs
        .iter()
        .filter(|r| r.error.is_some() && r.entry == victim)
        .collect();
    let failed_conns: BTreeSet<(usize, u32)> = failed_victim.iter().map(|r| r.conn).collect();
    assert_eq!(
        failed_conns.len(),
        failed_victim.len(),
        "a connection to the killed node failed twice: {failed_victim:#?}"
    );
    let victim_loops: BTreeSet<usize> = failed_victim.iter().map(|r| r.conn.0).collect();
    assert!(
        victim_loops.len() <= victim_conns,
        "failures on more client connections than the {victim_conns} open to the killed node: {failed_victim:#?}"
    );
    let before: BTreeSet<&str> = recs
        .iter()
        .filter(|r| r.at < killed_at)
        .filter_map(|r| r.served_by.as_deref())
        .collect();
    assert!(
        before.contains(victim),
        "the victim served nothing before the kill"
    );
    let served_after: BTreeSet<&str> = recs
        .iter()
        .filter(|r| r.at > settled_at)
        .filter_map(|r| r.served_by.as_deref())
        .collect();
    assert_eq!(
        served_after.len(),
        2,
        "after the kill the two survivors serve everything: {served_after:?}"
    );
}

/// Waits (up to 20 s) until each address's view serves exactly `ids`.
async fn views_serve(addrs: &[std::net::SocketAddr], ids: &[&str]) {
    eventually(Duration::from_secs(20), || {
        addrs.iter().all(|a| serving(*a).is_some_and(|s| s == ids))
    })
    .await
    .unwrap_or_else(|_| panic!("views never settled on {ids:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_request_that_entered_through_a_survivor() {
    // The steady peer settings (support::STEADY): on the default 1 s idle
    // timeout a survivor stalled by the loaded machine loses its link to
    // the other survivor, and the failover counters move after the views
    // settled for that reason, not the kill. The dead node is still
    // ejected, by gossip's failure detector (support::gossip_detection)
    // if not by its link's loss first.
    let mut c = Cluster::start("kill", 3, STEADY, USER_RULES);
    let addrs: Vec<_> = c.nodes.iter().map(|n| (n.id.clone(), n.http)).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let conns = 2;
    let (tasks, progress) = load(addrs, conns, stop.clone());
    // Warm-up: every client loop has had 50 answers.
    progress.advance(&progress.snapshot(), 50, "warm-up").await;
    let (n1, n3) = (c.nodes[0].http, c.nodes[2].http);
    c.kill9("n2");
    let killed_at = Instant::now();
    // Once both survivors' views have dropped n2 and every client loop has
    // had an answer since (so no request sent before is still waiting on
    // n2), nothing is routed to the dead node: the failover counters stop.
    views_serve(&[n1, n3], &["n1", "n3"]).await;
    progress
        .advance(&progress.snapshot(), 1, "after the views settled")
        .await;
    let settled_at = Instant::now();
    let f1 = counter(n1, "failovers");
    let f3 = counter(n3, "failovers");
    progress
        .advance(&progress.snapshot(), 100, "after the kill")
        .await;
    stop.store(true, Ordering::Relaxed);
    let recs = collect(tasks).await;
    assert_eq!(
        counter(n1, "failovers"),
        f1,
        "n1 still tried the dead node after its view dropped it"
    );
    assert_eq!(
        counter(n3, "failovers"),
        f3,
        "n3 still tried the dead node after its view dropped it"
    );
    check_kill_run(&recs, "n2", killed_at, settled_at, conns);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_behind_haproxy_in_tcp_mode_loses_no_request_through_a_survivor() {
    let Some(haproxy) = support::skip::haproxy() else {
        return;
    };
    let mut c = Cluster::start("haproxy", 3, "", USER_RULES);
    let front = free_port();
    let mut cfg = format!(
        "global\n  maxconn 1000\ndefaults\n  mode tcp\n  timeout connect 1s\n  timeout client 30s\n  timeout server 30s\n  retries 3\n  option redispatch\n\
         frontend sprayer\n  bind 127.0.0.1:{front}\n  default_backend peers\nbackend peers\n  balance roundrobin\n"
    );
    for n in &c.nodes {
        cfg += &format!(
            "  server {} {} check inter 200ms fall 2 rise 2\n",
            n.id, n.http
        );
    }
    let cfg_path = write(&c.dir, "haproxy.cfg", &cfg);
    let mut hap = std::process::Command::new(haproxy)
        .arg("-f")
        .arg(&cfg_path)
        .arg("-db")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let front_addr: std::net::SocketAddr = format!("127.0.0.1:{front}").parse().unwrap();
    c.wait_until(Duration::from_secs(10), || {
        std::net::TcpStream::connect(front_addr).is_ok()
    })
    .expect("haproxy listens");
    let stop = Arc::new(AtomicBool::new(false));
    let conns = 6;
    let (tasks, progress) = load(vec![("haproxy".into(), front_addr)], conns, stop.clone());
    progress.advance(&progress.snapshot(), 50, "warm-up").await;
    c.kill9("n2");
    let killed_at = Instant::now();
    views_serve(&[c.nodes[0].http, c.nodes[2].http], &["n1", "n3"]).await;
    progress
        .advance(&progress.snapshot(), 1, "after the views settled")
        .await;
    let settled_at = Instant::now();
    progress
        .advance(&progress.snapshot(), 50, "after the kill")
        .await;
    stop.store(true, Ordering::Relaxed);
    let recs = collect(tasks).await;
    let _ = hap.kill();
    let _ = hap.wait();
    let entries: BTreeSet<&str> = recs
        .iter()
        .filter(|r| r.at < killed_at)
        .map(|r| r.entry.as_str())
        .collect();
    assert_eq!(
        entries.len(),
        3,
        "haproxy spread connections over every node: {entries:?}"
    );
    check_kill_run(&recs, "n2", killed_at, settled_at, conns);
}

// A request-target of 8192 bytes is served; 8193 gets 414 at the entry, unforwarded (case H1 in docs/cases.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h1_request_target_of_8192_is_served_and_8193_gets_414_and_is_not_forwarded() {
    let c = Cluster::start("h1", 3, "[ring]\nvnodes = 1024\n", USER_RULES);
    let r = ring(&["n1", "n2", "n3"], 1024);
    let user = user_where(&r, |o| o != "n1");
    let target = |len: usize| {
        let head = format!("/x?user={user}&pad=");
        format!("{head}{}", "a".repeat(len - head.len()))
    };
    let entry = c.nodes[0].http;
    let mut conn = Conn::open(entry).await.unwrap();
    let ok = conn.get(&target(8192), &[]).await.unwrap();
    assert_eq!(ok.status, 200);
    assert_eq!(ok.served_by(), &**r.owner(&user).unwrap());
    let forwarded = counter(entry, "forwarded");
    let too_long = conn.get(&target(8193), &[]).await.unwrap();
    assert_eq!(too_long.status, 414);
    assert_eq!(too_long.header("peerlb-entry"), Some("n1"));
    assert_eq!(
        counter(entry, "forwarded"),
        forwarded,
        "a 414 request was forwarded"
    );
    let owner = c.node(r.owner(&user).unwrap());
    assert_eq!(
        counter(owner.http, "served_local"),
        1,
        "the owner served only the 8192-byte request"
    );
}

// With rules and none matching, the hash key is the client's ip:port (case H2 in docs/cases.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_with_rules_and_none_matching_the_key_is_the_client_host_and_port() {
    let c = Cluster::start("h2", 3, "", USER_RULES);
    for n in &c.nodes {
        let mut conn = Conn::open(n.http).await.unwrap();
        let resp = conn
            .get("/no/key/here?other=1", &[("x-other", "v")])
            .await
            .unwrap();
        assert_eq!(resp.status, 200);
        assert_eq!(resp.json()["key"], conn.local.to_string().as_str());
    }
}

// Without rules, new clients go round robin and a session sticks to its node (case H3 in docs/cases.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h3_without_rules_new_clients_go_round_robin_and_sessions_stick() {
    let c = Cluster::start("h3", 3, "", "");
    // New clients (no cookie) are spread round robin by the entry node.
    let mut seen = Vec::new();
    for _ in 0..6 {
        seen.push(get(c.nodes[0].http, "/x", &[]).await.served_by().to_owned());
    }
    let distinct: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(distinct.len(), 3, "round robin over 3 nodes: {seen:?}");
    assert_eq!(seen[0..3], seen[3..6], "the rotation repeats: {seen:?}");
    // The app starts a session: the response carries the sticky route.
    let start = get(c.nodes[0].http, "/session", &[]).await;
    let node = start.served_by().to_owned();
    let cookies = start.set_cookies();
    assert!(
        cookies.iter().any(|c| c.starts_with("session=")),
        "{cookies:?}"
    );
    let route = format!("peerlb-route={node}");
    assert!(cookies.iter().any(|c| c.starts_with(&route)), "{cookies:?}");
    let session = cookies
        .iter()
        .find(|c| c.starts_with("session="))
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let cookie = format!("{route}; {session}");
    for i in 0..12 {
        let entry = &c.nodes[i % 3];
        let resp = get(entry.http, "/cart", &[("cookie", &cookie)]).await;
        assert_eq!(
            resp.served_by(),
            node,
            "request {i} via {} left its session's node",
            entry.id
        );
        assert!(
            resp.set_cookies().is_empty(),
            "a stuck request needs no new route"
        );
    }
}

// peerlb-* headers a client sends are stripped; a forged route pins nothing (case H4 in docs/cases.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h4_client_sent_peerlb_marks_are_stripped_and_a_forged_route_is_ignored() {
    let c = Cluster::start("h4", 3, "", "");
    let forged = [
        ("peerlb-entry", "n9"),
        ("peerlb-served-by", "n9"),
        ("peerlb-hops", "7"),
        ("peerlb-proxied", "1"),
        ("cookie", "peerlb-route=ghost"),
    ];
    let mut served = BTreeSet::new();
    for _ in 0..6 {
        let resp = get(c.nodes[1].http, "/x", &forged).await;
        assert_eq!(resp.status, 200);
        assert_eq!(resp.header("peerlb-entry"), Some("n2"));
        assert_eq!(
            resp.json()["peerlb_headers"],
            serde_json::json!([]),
            "the app saw a client's peerlb-* header"
        );
        served.insert(resp.served_by().to_owned());
    }
    assert_eq!(
        served.len(),
        3,
        "the forged route must not pin requests; they are balanced as usual: {served:?}"
    );
}

// When two nodes' rings disagree, a request is forwarded once and served there (case C5 in docs/cases.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c5_membership_skew_forwards_once_and_the_owner_serves() {
    // n1 and n2 build different rings (vnodes 4 vs 1024), so for some key
    // n1 believes n2 owns it while n2 believes another node does.
    let mut c = Cluster::start("c5", 3, "[ring]\nvnodes = 1024\n", USER_RULES);
    let skewed = std::fs::read_to_string(&c.config)
        .unwrap()
        .replace("vnodes = 1024", "vnodes = 4");
    let skewed_path = write(&c.dir, "skewed.toml", &skewed);
    c.kill9("n1");
    let original = std::mem::replace(&mut c.config, skewed_path);
    c.spawn(0);
    c.config = original;
    c.wait_same_view(3);
    let ids = ["n1", "n2", "n3"];
    let (small, big) = (ring(&ids, 4), ring(&ids, 1024));
    let user = (0..100_000)
        .map(|i| format!("k{i}"))
        .find(|k| &**small.owner(k).unwrap() == "n2" && &**big.owner(k).unwrap() != "n2")
        .unwrap();
    let before = counter(c.nodes[1].http, "proxied_disagree");
    let resp = get(c.nodes[0].http, &format!("/x?user={user}"), &[]).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.served_by(), "n2");
    assert_eq!(resp.json()["entry"], "n1");
    assert_eq!(counter(c.nodes[1].http, "proxied_disagree"), before + 1);
    assert_eq!(
        counter(c.nodes[1].http, "forwarded"),
        0,
        "the owner never forwards a proxied request"
    );
}

// A dead owner's keys go to the next node in their ring order (case C6 in docs/cases.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c6_when_the_owner_dies_its_keys_go_to_the_next_node_on_the_ring() {
    let mut c = Cluster::start("c6", 3, "[ring]\nvnodes = 1024\n", USER_RULES);
    let r = ring(&["n1", "n2", "n3"], 1024);
    let users: Vec<String> = (0..200)
        .map(|i| format!("u{i}"))
        .filter(|u| &**r.owner(u).unwrap() == "n3")
        .take(20)
        .collect();
    let next: BTreeMap<&String, String> = users
        .iter()
        .map(|u| (u, r.candidates(u).nth(1).unwrap().to_string()))
        .collect();
    c.kill9("n3");
    let entry = c.nodes[0].http;
    c.wait_until(Duration::from_secs(5), || {
        serving(entry).map(|s| s.len()) == Some(2)
    })
    .expect("n1 ejects the dead node");
    for u in &users {
        let resp = get(entry, &format!("/x?user={u}"), &[]).await;
        assert_eq!(resp.status, 200, "{u}");
        assert_eq!(
            resp.served_by(),
            next[u],
            "{u} goes to the next distinct node on the ring"
        );
    }
    let after = Ring::build(
        &[(NodeId::from("n1"), 100), (NodeId::from("n2"), 100)],
        1024,
    );
    for u in &users {
        assert_eq!(
            &**after.owner(u).unwrap(),
            next[u],
            "the successor is the owner on the ring without n3"
        );
    }
}

// A sticky session whose node died fails over once and its route is rewritten (case C7 in docs/cases.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c7_a_sticky_session_whose_node_died_fails_over_and_the_route_is_rewritten() {
    let mut c = Cluster::start("c7", 3, "", "");
    let start = get(c.nodes[0].http, "/session", &[]).await;
    let first = start.served_by().to_owned();
    let session = start
        .set_cookies()
        .into_iter()
        .find(|c| c.starts_with("session="))
        .unwrap();
    let session = session.split(';').next().unwrap().to_owned();
    c.kill9(&first);
    let survivor = c.nodes.iter().find(|n| n.id != first).unwrap().clone();
    c.wait_until(Duration::from_secs(5), || {
        serving(survivor.http).map(|s| s.len()) == Some(2)
    })
    .expect("the survivor ejects the dead node");
    let cookie = format!("peerlb-route={first}; {session}");
    let moved = get(survivor.http, "/cart", &[("cookie", &cookie)]).await;
    assert_eq!(moved.status, 200);
    let second = moved.served_by().to_owned();
    assert_ne!(second, first);
    let route = format!("peerlb-route={second}");
    assert!(
        moved.set_cookies().iter().any(|c| c.starts_with(&route)),
        "route rewritten: {:?}",
        moved.set_cookies()
    );
    let cookie = format!("{route}; {session}");
    for n in c.nodes.iter().filter(|n| n.id != first) {
        for _ in 0..3 {
            let resp = get(n.http, "/cart", &[("cookie", &cookie)]).await;
            assert_eq!(
                resp.served_by(),
                second,
                "the session sticks to its new node"
            );
        }
    }
}

// Without cookies the sticky route travels as a `;peerlb-route=` path parameter (case H5 in docs/cases.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h5_with_cookies_refused_the_route_travels_as_a_url_path_parameter() {
    let mut c = Cluster::start("h5", 3, "", "");
    // The session starts; the client keeps no cookies, only the route
    // parameter the response names.
    let start = get(c.nodes[0].http, "/session", &[]).await;
    let node = start.served_by().to_owned();
    assert_eq!(
        start.header("peerlb-route"),
        Some(format!(";peerlb-route={node}").as_str())
    );
    for i in 0..9 {
        let entry = &c.nodes[i % 3];
        let resp = get(
            entry.http,
            &format!("/cart;peerlb-route={node}?item={i}"),
            &[],
        )
        .await;
        assert_eq!(resp.status, 200);
        assert_eq!(resp.served_by(), node, "via {}", entry.id);
        assert_eq!(
            resp.json()["path"],
            "/cart",
            "the app never sees the route parameter"
        );
    }
    // Its node dies: the request fails over and names the new route.
    c.kill9(&node);
    let survivor = c.nodes.iter().find(|n| n.id != node).unwrap().clone();
    c.wait_until(Duration::from_secs(5), || {
        serving(survivor.http).map(|s| s.len()) == Some(2)
    })
    .expect("the survivor ejects the dead node");
    let moved = get(survivor.http, &format!("/cart;peerlb-route={node}"), &[]).await;
    assert_eq!(moved.status, 200);
    let second = moved.served_by().to_owned();
    assert_ne!(second, node);
    assert_eq!(
        moved.header("peerlb-route"),
        Some(format!(";peerlb-route={second}").as_str())
    );
    for n in c.nodes.iter().filter(|n| n.id != node) {
        let resp = get(n.http, &format!("/cart;peerlb-route={second}"), &[]).await;
        assert_eq!(
            resp.served_by(),
            second,
            "via {}: {} {:?}",
            n.id,
            resp.status,
            resp.body
        );
    }
}

/// `PUT /_peerlb/weight` body, on a fresh loopback connection: (status, JSON).
async fn put_weight(addr: std::net::SocketAddr, body: &str) -> (u16, serde_json::Value) {
    let mut conn = Conn::open(admin_of(addr)).await.unwrap();
    let r = conn
        .request("PUT", "/_peerlb/weight", &[], Bytes::from(body.to_owned()))
        .await
        .unwrap();
    (r.status, r.json())
}

/// The weight `at`'s view gives member `id` (None: unreachable or not in view).
fn weight_in_view(at: std::net::SocketAddr, id: &str) -> Option<u64> {
    status(at)?["members"]
        .as_array()?
        .iter()
        .find(|m| m["id"] == id)?["weight"]
        .as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weight_put_on_the_admin_api_reaches_every_ring_and_bad_weights_are_refused() {
    let c = Cluster::start(
        "weight",
        3,
        "[ring]\nvnodes = 1024\n",
        &format!("{STEADY}{USER_RULES}"),
    );
    let n1 = c.node("n1").http;
    // Bad input is refused with a 4xx naming the problem; nothing changes.
    let (status_code, v) = put_weight(n1, "heavy").await;
    assert_eq!(status_code, 400, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("decimal integer"),
        "{v}"
    );
    let (status_code, v) = put_weight(n1, "10001").await;
    assert_eq!(status_code, 422, "{v}");
    assert_eq!(v["error"], "weight 10001 is out of range 0..=10000");
    let (status_code, _) = put_weight(n1, &"9".repeat(100)).await;
    assert_eq!(status_code, 400, "a body over 64 bytes");
    let mut conn = Conn::open(admin_of(n1)).await.unwrap();
    let r = conn.get("/_peerlb/weight", &[]).await.unwrap();
    assert_eq!((r.status, r.header("allow")), (405, Some("PUT")));
    assert_eq!(status(n1).unwrap()["weight"], 100);

    // n1 to 3 shares: it says so at once, and every node's ring takes it.
    let (status_code, v) = put_weight(n1, "300\n").await;
    assert_eq!(status_code, 200, "{v}");
    assert_eq!(
        v,
        serde_json::json!({ "node": "n1", "weight": 300, "previous": 100 })
    );
    assert_eq!(status(n1).unwrap()["weight"], 300);
    c.wait_until(Duration::from_secs(10), || {
        c.nodes
            .iter()
            .all(|n| weight_in_view(n.http, "n1") == Some(300))
    })
    .expect("every node's view gives n1 weight 300");
    let mut versions = BTreeSet::new();
    c.wait_until(Duration::from_secs(20), || {
        versions = c
            .nodes
            .iter()
            .map(|n| status(n.http).map(|s| s["view_version"].to_string()))
            .collect();
        versions.len() == 1
    })
    .unwrap_or_else(|_| panic!("one view everywhere: {versions:?}"));
    // Keys the reweighted ring moves to n1 are served by n1 from every entry.
    let ids = ["n1", "n2", "n3"];
    let weighted = Ring::build(
        &ids.map(|id| (NodeId::from(id), if id == "n1" { 300 } else { 100 })),
        1024,
    );
    let equal = ring(&ids, 1024);
    let moved: Vec<String> = (0..2000)
        .map(|i| format!("u{i}"))
        .filter(|u| &**weighted.owner(u).unwrap() == "n1" && &**equal.owner(u).unwrap() != "n1")
        .take(5)
        .collect();
    assert_eq!(moved.len(), 5);
    for u in &moved {
        for n in &c.nodes {
            let resp = get(n.http, &format!("/x?user={u}"), &[]).await;
            assert_eq!(resp.served_by(), "n1", "user {u} via {}", n.id);
        }
    }

    // Weight 0 is allowed while another node keeps a share...
    for id in ["n2", "n3"] {
        let (status_code, v) = put_weight(c.node(id).http, "0").await;
        assert_eq!(status_code, 200, "{id}: {v}");
    }
    c.wait_until(Duration::from_secs(10), || {
        c.nodes.iter().all(|n| {
            weight_in_view(n.http, "n2") == Some(0) && weight_in_view(n.http, "n3") == Some(0)
        })
    })
    .expect("every node's view gives n2 and n3 weight 0");
    for u in 0..10 {
        let resp = get(c.node("n2").http, &format!("/x?user=z{u}"), &[]).await;
        assert_eq!(resp.served_by(), "n1", "only n1 has a share");
    }
    // ...but not when it would leave no node with a share.
    let (status_code, v) = put_weight(n1, "0").await;
    assert_eq!(status_code, 409, "{v}");
    assert!(v["error"].as_str().unwrap().contains("weight 0"), "{v}");
    assert_eq!(status(n1).unwrap()["weight"], 300);
}
