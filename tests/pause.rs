//! A node paused by something outside it (SIGSTOP here; a long GC pause
//! or a VM stall in production) and resumed: its peers went on without
//! it, and its own clock jumped. It must re-validate its peers before it
//! concludes they are dead, and must not serve, as the only member left
//! in its view, the requests that queued while it was stopped.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use support::*;

/// How long the node is stopped: above the peers' silence timeout
/// (`peer.idle_timeout_ms`, 1 s by default), so they close their busy
/// connections to it while it cannot answer.
const PAUSE: Duration = Duration::from_millis(2500);

fn signal(c: &Cluster, id: &str, sig: libc::c_int) {
    let pid = c.children[id].id() as libc::pid_t;
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "signal {sig} to {id}");
}

/// Sends `GET /x?user=<user>` on a fresh connection and leaves it to be
/// read: the kernel takes the connection and the request even while the
/// node is stopped.
fn queue_request(addr: SocketAddr, user: &str) -> std::net::TcpStream {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /x?user={user} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    s
}

/// (status, `peerlb-served-by`) of a raw answer.
fn parse(answer: &str) -> (u16, String) {
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let served = answer
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("peerlb-served-by")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    (status, served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_resumed_after_a_pause_forwards_its_queued_requests_to_their_owners() {
    let c = Cluster::start("pause", 3, "[ring]\nvnodes = 1024\n", USER_RULES);
    let ring = ring(&["n1", "n2", "n3"], 1024);
    let owner = |u: &str| ring.owner(u).unwrap().to_string();
    // Keys n1 (the paused node) does not own: half n2's, half n3's.
    let foreign: Vec<String> = (0..)
        .map(|i| format!("u{i}"))
        .filter(|u| owner(u) != "n1")
        .take(40)
        .collect();
    assert!(foreign.iter().any(|u| owner(u) == "n2") && foreign.iter().any(|u| owner(u) == "n3"));
    let n1 = c.node("n1").http;

    // Traffic through n1 to both owners, before, during and after the
    // pause: both of n1's peer connections are busy.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let stopped_at: Arc<std::sync::Mutex<Option<std::time::Instant>>> = Arc::default();
    let traffic = {
        let (stop, done, foreign) = (stop.clone(), done.clone(), foreign.clone());
        let owners: Vec<String> = foreign.iter().map(|u| owner(u)).collect();
        let stopped_at = stopped_at.clone();
        tokio::spawn(async move {
            let mut wrong = Vec::new();
            let mut conn = Conn::open(n1).await.unwrap();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let u = &foreign[i % foreign.len()];
                let sent = std::time::Instant::now();
                let r = conn.get(&format!("/x?user={u}"), &[]).await.unwrap();
                // The request in flight when n1 stopped may have reached
                // its owner over a connection the owner closed meanwhile:
                // it is replayed on the next candidate (replay rules), so
                // it only has to succeed. Every other one, sent before the
                // stop or queued during it, is served by its owner.
                let in_flight_at_stop = stopped_at.lock().unwrap().is_some_and(|t| sent <= t);
                let owner_served = r.served_by() == owners[i % foreign.len()];
                if r.status != 200 || !(owner_served || in_flight_at_stop) {
                    wrong.push((u.clone(), r.status, r.served_by().to_owned()));
                }
                done.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            wrong
        })
    };
    eventually(Duration::from_secs(20), || {
        done.load(Ordering::Relaxed) >= 50
    })
    .await
    .expect("traffic flows through n1");

    *stopped_at.lock().unwrap() = Some(std::time::Instant::now());
    signal(&c, "n1", libc::SIGSTOP);
    let stopped = std::time::Instant::now();
    let queued: Vec<(String, std::net::TcpStream)> = foreign
        .iter()
        .map(|u| (u.clone(), queue_request(n1, u)))
        .collect();
    // The pause itself (the fault's length, not a wait for a condition).
    tokio::time::sleep(PAUSE.saturating_sub(stopped.elapsed())).await;
    signal(&c, "n1", libc::SIGCONT);

    let answers = tokio::task::spawn_blocking(move || {
        queued
            .into_iter()
            .map(|(u, mut s)| {
                let (answer, _) = read_until_closed(&mut s);
                (u, parse(&answer))
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let after = done.load(Ordering::Relaxed);
    eventually(Duration::from_secs(20), || {
        done.load(Ordering::Relaxed) >= after + 50
    })
    .await
    .expect("traffic flows through n1 after the pause");
    stop.store(true, Ordering::Relaxed);
    let wrong = traffic.await.unwrap();

    let log = c.log("n1");
    let misplaced: Vec<_> = answers
        .iter()
        .filter(|(u, (status, served))| *status != 200 || *served != owner(u))
        .collect();
    assert!(
        misplaced.is_empty(),
        "requests queued during the pause answered wrongly (key, (status, served by)): {misplaced:?}\n{log}"
    );
    assert!(
        wrong.is_empty(),
        "requests on the busy connection answered wrongly (key, status, served by): {wrong:?}\n{log}"
    );
    // One line says n1 was paused, for about as long as it was (a loaded
    // machine may add short stalls of its own, under a second).
    let paused: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("this node was paused"))
        .filter_map(|l| {
            l.split("paused_ms=")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .filter(|ms| *ms >= 1_000)
        .collect();
    assert_eq!(paused.len(), 1, "one pause logged: {paused:?}\n{log}");
    assert!(
        (2_000..=4_000).contains(&paused[0]),
        "paused for {} ms\n{log}",
        paused[0]
    );
    assert!(
        !log.contains("peer left routing"),
        "n1 kept both peers in its view:\n{log}"
    );
    assert_eq!(serving(n1).map(|s| s.len()), Some(3), "{log}");
}
