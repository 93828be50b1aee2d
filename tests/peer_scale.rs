//! The peer layer at cluster scale, over loopback with real processes: one
//! QUIC connection per node pair used both ways, no peer traffic while a
//! pair is quiet, and a dead quiet peer handled by gossip and failover.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use support::*;

/// `peer_connections` of one node's status (None if unreachable).
fn peer_connections(addr: std::net::SocketAddr) -> Option<u64> {
    status(addr)?["peer_connections"].as_u64()
}

/// One request on a fresh connection; `Err` when it failed to connect.
async fn send(addr: std::net::SocketAddr, method: &str, target: &str) -> Result<Resp, String> {
    let mut c = Conn::open(addr).await.map_err(|e| e.to_string())?;
    c.request(method, target, &[], Bytes::new()).await
}

/// Waits until every node in `addrs` holds no peer connection: the pairs
/// are quiet (QUIC's idle timeout closed the start-up connections).
fn wait_quiet(c: &Cluster, addrs: &[std::net::SocketAddr]) {
    c.wait_until(Duration::from_secs(20), || {
        addrs.iter().all(|a| peer_connections(*a) == Some(0))
    })
    .unwrap_or_else(|_| {
        let now: Vec<_> = addrs.iter().map(|a| peer_connections(*a)).collect();
        panic!("peer connections never went quiet: {now:?}")
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_dialling_each_other_at_once_end_with_one_connection_and_serve_every_request() {
    let c = Cluster::start("dial-both", 2, "", USER_RULES);
    let (a, b) = (c.nodes[0].http, c.nodes[1].http);
    // After the start, the pair goes quiet and holds no connection.
    wait_quiet(&c, &[a, b]);
    let r = ring(&["n1", "n2"], default_vnodes());
    let to_n2 = user_where(&r, |o| o == "n2");
    let to_n1 = user_where(&r, |o| o == "n1");
    // Both entries forward to each other at the same moment: both dial.
    let burst = |entry, user: String| async move {
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let user = user.clone();
                tokio::spawn(
                    async move { send(entry, "POST", &format!("/x?user={user}&i={i}")).await },
                )
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    };
    let (from_a, from_b) = tokio::join!(burst(a, to_n2.clone()), burst(b, to_n1.clone()));
    for (entry, owner, results) in [("n1", "n2", from_a), ("n2", "n1", from_b)] {
        for r in results {
            let r = r.unwrap_or_else(|e| panic!("POST via {entry}: {e}"));
            assert_eq!(r.status, 200, "POST via {entry}");
            assert_eq!(r.served_by(), owner, "POST via {entry}");
        }
    }
    // With a trickle of requests both ways, the pair settles on one
    // connection: the one both nodes keep, the other ends once quiet.
    let start = Instant::now();
    let mut settled = false;
    while start.elapsed() < Duration::from_secs(20) {
        for (entry, user) in [(a, &to_n2), (b, &to_n1)] {
            let r = send(entry, "GET", &format!("/x?user={user}"))
                .await
                .unwrap();
            assert_eq!(r.status, 200);
        }
        if peer_connections(a) == Some(1) && peer_connections(b) == Some(1) {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        settled,
        "the pair did not settle on one connection: n1 {:?}, n2 {:?}\n{}\n{}",
        peer_connections(a),
        peer_connections(b),
        c.log("n1"),
        c.log("n2")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_peer_killed_leaves_every_ring_by_gossip_and_a_post_to_it_meanwhile_is_served_elsewhere()
 {
    let mut c = Cluster::start("idle-kill", 3, "", USER_RULES);
    let addrs: Vec<_> = c.nodes.iter().map(|n| n.http).collect();
    wait_quiet(&c, &addrs);
    // The key is picked on the ring the cluster runs (no `[ring]`: the
    // default resolution).
    let r = ring(&["n1", "n2", "n3"], default_vnodes());
    let user = user_where(&r, |o| o == "n3");
    let failovers = counter(addrs[0], "failovers");
    let killed = Instant::now();
    c.kill9("n3");
    // A POST for a key n3 owns, sent before gossip noticed: n1 has no
    // connection to n3, its dial fails (nothing reached n3), and the
    // request goes to the next candidate.
    let resp = send(addrs[0], "POST", &format!("/x?user={user}"))
        .await
        .expect("POST via n1");
    assert_eq!(resp.status, 200, "POST to a dead idle owner: {resp:?}");
    // n1 tried n3 first (its owner on n1's ring) and failed over.
    assert_eq!(
        counter(addrs[0], "failovers"),
        failovers + 1,
        "the POST did not fail over from n3: {resp:?}"
    );
    let next = r.candidates(&user).nth(1).unwrap().to_string();
    assert_eq!(resp.served_by(), next, "{resp:?}");
    // Gossip's failure detector takes n3 out of every ring; n2 never
    // talked to it. Bound: the detector's time at this cluster's settings
    // (phi PHI x the gossip interval, support::gossip_detection), doubled
    // (a member's heartbeat may reach a node every other round), plus a
    // second for the view to be rebuilt and polled on a loaded machine.
    let bound = gossip_detection(PHI) * 2 + Duration::from_secs(1);
    c.wait_until(bound, || {
        addrs[..2]
            .iter()
            .all(|a| serving(*a).is_some_and(|s| !s.iter().any(|id| id == "n3")))
    })
    .unwrap_or_else(|()| {
        panic!(
            "n3 still in a ring {:?} after its kill (bound {bound:?})",
            killed.elapsed()
        )
    });
}

/// Three nodes, n3 restarted at `peer.protocol = protocol` (an older
/// release's peer protocol; stopped cleanly first, so its peers close
/// their connections to it), once all three share a view again; and a
/// user key owned by each of n1, n2, n3 in that order, on their ring.
fn mixed_cluster(name: &str, protocol: u8) -> (Cluster, peerlb::Ring, Vec<String>) {
    let mut c = Cluster::start(
        name,
        3,
        "[ring]\nvnodes = 1024\n[limits]\nresponse_timeout_ms = 5000\n",
        USER_RULES,
    );
    let mut stopped = c.sigterm("n3");
    assert!(stopped.wait().unwrap().success());
    let current = c.config.clone();
    let old = c.dir.join(format!("protocol-{protocol}.toml"));
    let text =
        std::fs::read_to_string(&current).unwrap() + &format!("\n[peer]\nprotocol = {protocol}\n");
    std::fs::write(&old, text).unwrap();
    c.config = old;
    c.spawn(2);
    c.config = current;
    c.wait_same_view(3);
    let ring = ring(&["n1", "n2", "n3"], 1024);
    let users = ["n1", "n2", "n3"]
        .iter()
        .map(|o| user_where(&ring, |x| x == *o))
        .collect();
    (c, ring, users)
}

/// A rolling upgrade across the change to one connection per pair: a node
/// of the previous release (here `peer.protocol = 1`, which speaks only
/// ALPN `peerlb/1` and behaves as that release did: it opens streams only
/// on connections it dialled and serves them only on those it accepted)
/// in a cluster of current nodes. Every request, entering anywhere, is
/// served by its owner; the old node holds two connections per peer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_speaking_only_the_previous_peer_protocol_serves_and_is_served_in_a_current_cluster()
{
    // n3 comes back as a node of the previous release.
    let (c, ring, users) = mixed_cluster("rolling", 1);
    for round in 0..2 {
        for entry in &c.nodes {
            for u in &users {
                let r = send(entry.http, "GET", &format!("/x?user={u}"))
                    .await
                    .unwrap_or_else(|e| panic!("round {round} via {}: {u}: {e}", entry.id));
                assert_eq!(
                    (r.status, r.served_by()),
                    (200, &**ring.owner(u).unwrap()),
                    "round {round}, {u} entering at {}\n{}",
                    entry.id,
                    c.log(&entry.id)
                );
            }
        }
    }
    // The previous protocol: one connection dialled by each end of a pair.
    let n3 = c.node("n3").http;
    c.wait_until(Duration::from_secs(10), || peer_connections(n3) == Some(4))
        .unwrap_or_else(|_| panic!("n3 holds {:?} peer connections", peer_connections(n3)));
}

/// A pair's connection starts with a small stream allowance (quinn makes
/// state for every stream a peer may open) and the owner raises it as
/// streams fill it: 300 requests held at the owner at once, far past the
/// first 64 streams, are all forwarded to it and served there, none of
/// them waiting out `limits.connect_timeout_ms` (1 s) for a stream: a
/// request that did would have failed over (counted in n1's `failovers`)
/// and been served by n1. Counters, not wall time: a debug build on a
/// loaded machine takes its time to open 300 connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_requests_held_at_one_owner_at_once_all_get_a_stream() {
    let c = Cluster::start("streams", 2, "", USER_RULES);
    let a = c.nodes[0].http;
    let r = ring(&["n1", "n2"], default_vnodes());
    let to_n2 = user_where(&r, |o| o == "n2");
    let failovers = counter(a, "failovers");
    let tasks: Vec<_> = (0..300)
        .map(|i| {
            let user = to_n2.clone();
            tokio::spawn(
                async move { send(a, "GET", &format!("/delay/600?user={user}&i={i}")).await },
            )
        })
        .collect();
    for t in tasks {
        let r = t
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("GET via n1: {e}"));
        assert_eq!(r.status, 200);
        assert_eq!(r.served_by(), "n2");
    }
    assert_eq!(
        counter(a, "failovers"),
        failovers,
        "a request waited out its stream and failed over"
    );
}

/// `PUT /_peerlb/weight?node=ID` with `weight` at the admin listener of
/// the node whose client listener is `http`: the answer's text.
fn put_weight(http: std::net::SocketAddr, id: &str, weight: u32) -> String {
    let body = weight.to_string();
    let raw = format!(
        "PUT /_peerlb/weight?node={id} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    raw_exchange(admin_of(http), raw.as_bytes()).0
}

/// A rolling upgrade across the typed stream kind: a node speaking
/// `peerlb/2` at most (`peer.protocol = 2`, as the release before it) in a
/// cluster of current nodes, which fall back to `peerlb/2` with it (the
/// kind a header mark). Every HTTP request, entering anywhere, is served
/// by its owner, and an admin change crosses the mixed pair both ways (a
/// stream of the admin kind): n1 sets n3's weight, n3 sets n1's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_speaking_peerlb_2_serves_and_is_served_in_a_peerlb_3_cluster() {
    let (c, ring, users) = mixed_cluster("rolling-v2", 2);
    for entry in &c.nodes {
        for u in &users {
            let r = send(entry.http, "GET", &format!("/x?user={u}"))
                .await
                .unwrap_or_else(|e| panic!("{u} via {}: {e}", entry.id));
            assert_eq!(
                (r.status, r.served_by()),
                (200, &**ring.owner(u).unwrap()),
                "{u} entering at {}\n{}",
                entry.id,
                c.log(&entry.id)
            );
        }
    }
    let (n1, n3) = (c.node("n1").http, c.node("n3").http);
    for (via, member) in [(n1, "n3"), (n3, "n1")] {
        let answer = put_weight(via, member, 150);
        assert!(
            answer.split(' ').nth(1) == Some("200") && answer.contains("\"weight\":150"),
            "{member}'s weight via the other: {answer}"
        );
    }
}
