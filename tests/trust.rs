//! The cluster's trust boundary over loopback: gossip datagrams that no
//! key of the cluster's keyring seals are dropped and counted before
//! chitchat sees them, so forged state, heartbeats, version overflows and
//! ghost members have no effect; sealed datagrams that break a bound are
//! dropped too. The forger builds chitchat V0 datagrams by hand
//! (`support::forge`).
//!
//! Past 800 lines: every test here drives the same forger and cluster
//! helpers (top of the file); a split by surface (gossip, peer port) is
//! planned.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use peerlb::keyring::{GossipKey, Keyring};
use support::forge::{self, Id};
use support::{Cluster, USER_RULES, admin_of, ring, serving, status, user_where};

/// The gossip identity of `id` as `observer` sees it (polled: a member
/// may flap out of a view for a moment on a loaded machine).
fn gossip_id(c: &Cluster, observer: &str, id: &str) -> Id {
    let mut generation = None;
    c.wait_until(Duration::from_secs(10), || {
        generation = status(c.node(observer).http).and_then(|v| {
            v["members"].as_array()?.iter().find(|m| m["id"] == id)?["generation"].as_u64()
        });
        generation.is_some()
    })
    .unwrap_or_else(|_| panic!("{observer} does not see {id}"));
    Id {
        node: id.to_owned(),
        generation: generation.unwrap(),
        gossip: c.node(id).gossip,
    }
}

/// A gossip drop counter of the node at `id` (`unauthenticated`,
/// `out_of_bounds`).
/// Panics when the node does not answer or its status lacks the field (a
/// renamed counter must fail the test, not read as 0).
fn dropped(c: &Cluster, id: &str, what: &str) -> u64 {
    let v = status(c.node(id).http).unwrap_or_else(|| panic!("{id} does not answer its status"));
    v["gossip"]["dropped"][what]
        .as_u64()
        .unwrap_or_else(|| panic!("{id}: no gossip.dropped.{what} in {v}"))
}

/// Every node's view: (member id, status) pairs.
fn views(c: &Cluster) -> Vec<Vec<(String, String)>> {
    c.nodes
        .iter()
        .map(|n| {
            let v = status(n.http).unwrap();
            v["members"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    (
                        m["id"].as_str().unwrap().to_owned(),
                        m["status"].as_str().unwrap().to_owned(),
                    )
                })
                .collect()
        })
        .collect()
}

fn all_serving(c: &Cluster) -> bool {
    views(c)
        .iter()
        .all(|v| v.len() == 3 && v.iter().all(|(_, s)| s == "serving"))
}

/// Waits until `id` has counted `n` datagrams as `what`.
fn wait_dropped(c: &Cluster, id: &str, what: &str, n: u64) {
    c.wait_until(Duration::from_secs(10), || dropped(c, id, what) >= n)
        .unwrap_or_else(|_| {
            panic!(
                "{id} counted {} {what} datagrams, expected {n}",
                dropped(c, id, what)
            )
        });
}

/// Asserts every view stays whole for ten gossip rounds. A forged value is
/// applied the moment a node reads it (before its drop is counted, which
/// the caller waited for) and spreads within a few rounds (100 ms each in
/// test clusters), so the condition must hold on every poll of the window.
/// A member may flap out of a view for a moment on a loaded machine (phi
/// accrual at 100 ms rounds), so absence is judged at the end: every view
/// must be whole again, which a forged heartbeat (a member dead for good)
/// or forged status (leaving for good) would prevent.
fn settle(c: &Cluster) {
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        for v in views(c) {
            assert!(
                v.iter()
                    .all(|(id, s)| s == "serving" && ["n1", "n2", "n3"].contains(&&**id)),
                "a view changed: {v:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    c.wait_until(Duration::from_secs(10), || all_serving(c))
        .unwrap_or_else(|_| panic!("views did not come back whole: {:?}", views(c)));
}

#[test]
fn forged_state_heartbeat_and_overflow_without_the_key_are_dropped_counted_and_change_no_view() {
    let c = Cluster::start("trust-forged", 3, "", "");
    let (n1, n2, n3) = (
        gossip_id(&c, "n1", "n1"),
        gossip_id(&c, "n1", "n2"),
        gossip_id(&c, "n1", "n3"),
    );
    let before = dropped(&c, "n1", "unauthenticated");
    // 1. Forged state: n2 leaving at version 2^40, sent to n1.
    forge::send(
        n1.gossip,
        &forge::ack(&n2, &[("status", "leaving", 1 << 40)]),
    );
    // 2. Forged heartbeat: n3 at 2^62, sent to n1.
    forge::send(n1.gossip, &forge::syn_ack(&n3, 1 << 62, 1, &[]));
    // 3. Version overflow: a key of n1 at 2^64 - 1, sent to n2 (and n1).
    forge::send(n2.gossip, &forge::ack(&n1, &[("load", "100", u64::MAX)]));
    forge::send(
        n1.gossip,
        &forge::ack(&n1, &[("status", "leaving", u64::MAX)]),
    );
    wait_dropped(&c, "n1", "unauthenticated", before + 3);
    wait_dropped(&c, "n2", "unauthenticated", 1);
    settle(&c);
    // The cluster's own sealed gossip is never refused by the bounds.
    for n in ["n1", "n2", "n3"] {
        assert_eq!(dropped(&c, n, "out_of_bounds"), 0, "{n}:\n{}", c.log(n));
    }
    // The node whose version was forged still publishes (an overflow
    // inside chitchat would have stopped it): a weight change reaches n2.
    assert!(put_weight(c.node("n1").http, 3).contains("\"weight\":3"));
    c.wait_until(Duration::from_secs(10), || {
        let v = status(c.node("n2").http).unwrap();
        v["members"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == "n1" && m["weight"] == 3)
    })
    .expect("n1's new weight did not reach n2");
}

/// `PUT /_peerlb/weight` on a node; the raw answer.
fn put_weight(addr: std::net::SocketAddr, w: u32) -> String {
    admin(addr, "PUT", "/_peerlb/weight", &w.to_string())
}

/// One admin request over HTTP/1.0; the raw answer (status line first).
fn admin(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(admin_of(addr)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nhost: 127.0.0.1\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn ghosts_and_state_requests_without_the_key_get_no_answer_and_no_dial() {
    let c = Cluster::start("trust-ghost", 3, "", "");
    let n1 = gossip_id(&c, "n1", "n1");
    // A listener standing in for the attacker's chosen address: nobody
    // may send it a single byte (no QUIC Initial, no gossip).
    let trap = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    trap.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    let ghost = Id {
        node: "ghost".into(),
        generation: 1,
        gossip: trap.local_addr().unwrap(),
    };
    let trap_addr = trap.local_addr().unwrap().to_string();
    let kvs = [
        ("peer_addr", trap_addr.as_str(), 1),
        ("http_addr", trap_addr.as_str(), 2),
        ("weight", "1", 3),
        ("status", "serving", 4),
        ("load", "100", 5),
        ("inflight", "0", 6),
    ];
    forge::send(n1.gossip, &forge::syn_ack(&ghost, 10, 6, &kvs));
    // 6. An empty SynAck asks for the whole cluster state: no answer.
    assert_eq!(
        forge::ask(
            n1.gossip,
            &forge::empty_syn_ack(),
            Duration::from_millis(800)
        ),
        None,
        "an unauthenticated SynAck was answered"
    );
    wait_dropped(&c, "n1", "unauthenticated", 2);
    let mut buf = [0u8; 2048];
    assert!(
        trap.recv_from(&mut buf).is_err(),
        "a node sent bytes to the ghost's address"
    );
    assert!(all_serving(&c), "{:?}", views(&c));
}

#[test]
fn sealed_datagrams_past_a_bound_and_datagrams_under_a_foreign_key_are_dropped() {
    let c = Cluster::start("trust-sealed", 3, "", "");
    let ring = Keyring::load(&c.dir.join("certs").join("gossip.keys")).unwrap();
    let (n1, n2) = (gossip_id(&c, "n1", "n1"), gossip_id(&c, "n1", "n2"));
    let seal = |r: &Keyring, d: &[u8]| r.seal(d, [9; 12]);
    // The cluster's own key opens it: the version overflow is then refused
    // by the bounds, and so is a delta about the receiving node itself.
    forge::send(
        n1.gossip,
        &seal(&ring, &forge::ack(&n2, &[("load", "1", u64::MAX)])),
    );
    forge::send(
        n1.gossip,
        &seal(&ring, &forge::ack(&n1, &[("status", "leaving", 99)])),
    );
    let long = "x".repeat(300);
    forge::send(
        n1.gossip,
        &seal(&ring, &forge::ack(&n2, &[("status", &long, 7)])),
    );
    wait_dropped(&c, "n1", "out_of_bounds", 3);
    assert_eq!(dropped(&c, "n1", "unauthenticated"), 0);
    // A key that is not (or no longer) in the ring: dropped unopened.
    let foreign = Keyring::single(GossipKey::from_bytes([7; 32]));
    forge::send(
        n1.gossip,
        &seal(
            &foreign,
            &forge::ack(&n2, &[("status", "leaving", 1 << 30)]),
        ),
    );
    wait_dropped(&c, "n1", "unauthenticated", 1);
    settle(&c);
}

#[test]
fn a_key_holders_heartbeat_jump_is_dropped_counted_and_the_member_stays_live() {
    let c = Cluster::start("trust-jump", 3, "", "");
    let ring = Keyring::load(&c.dir.join("certs").join("gossip.keys")).unwrap();
    let (n1, n2) = (gossip_id(&c, "n1", "n1"), gossip_id(&c, "n1", "n2"));
    // n2's real id with a heartbeat 2^30 ahead (under the absolute bound
    // 2^40): taken, it would freeze n2 in n1's view, then everywhere.
    forge::send(
        n1.gossip,
        &ring.seal(&forge::syn_ack(&n2, 1 << 30, 1, &[]), [3; 12]),
    );
    wait_dropped(&c, "n1", "out_of_bounds", 1);
    assert_eq!(dropped(&c, "n1", "unauthenticated"), 0);
    settle(&c);
}

/// A burst of forged heartbeat jumps for n2 sent to n1 (20 sealed
/// SynAcks in 100 ms, each as far ahead as n1 lets it: they share one
/// budget per member, `gossip::bounds`), then silence: n1 holds a
/// heartbeat for n2 above n2's own, so n2's real heartbeats do not count
/// there until n2, seeing the figure echoed, republishes over it. The
/// test measures how long after the burst n1 counts n2's own heartbeats
/// again (n2's heartbeat at n1 passes the forged one) and requires a few
/// gossip rounds, with n2 serving in every view. The figures are printed.
#[test]
fn a_burst_of_forged_heartbeat_jumps_heals_a_few_rounds_after_it_stops() {
    let c = Cluster::start("trust-burst", 3, "", "");
    let ring = Keyring::load(&c.dir.join("certs").join("gossip.keys")).unwrap();
    let (n1, n2) = (gossip_id(&c, "n1", "n1"), gossip_id(&c, "n1", "n2"));
    let nonce = std::cell::Cell::new(0u64);
    let seal = |d: &[u8]| {
        nonce.set(nonce.get() + 1);
        let mut n = [9u8; 12];
        n[..8].copy_from_slice(&nonce.get().to_le_bytes());
        ring.seal(d, n)
    };
    // n2's heartbeat as n1 holds it, from n1's answer to an empty Syn.
    let held = || -> u64 {
        let syn = seal(&forge::syn("test-trust-burst"));
        let answer = forge::ask(n1.gossip, &syn, Duration::from_secs(2)).expect("n1 answers");
        let plain = ring.open(&answer).expect("sealed answer");
        forge::digest_heartbeat(&plain, "n2").expect("n1 names n2")
    };
    let h0 = held();
    // Leads of 1,000 (within a full budget) then 50 more every 5 ms (a
    // round's worth every 10 ms, faster than the budget earns): the first
    // is taken, most of the rest refused.
    for i in 0..20u64 {
        let d = seal(&forge::syn_ack(&n2, h0 + 1000 + 50 * i, 1, &[]));
        forge::send(n1.gossip, &d);
        std::thread::sleep(Duration::from_millis(5));
    }
    let stopped = std::time::Instant::now();
    let forged = held();
    assert!(forged >= h0 + 1000, "n1 took no jump: {h0} -> {forged}");
    assert!(
        dropped(&c, "n1", "out_of_bounds") > 0,
        "n1 took every datagram of the burst"
    );
    c.wait_until(Duration::from_secs(10), || held() > forged)
        .unwrap_or_else(|_| panic!("n2's heartbeat at n1 stayed at or below the forged {forged}"));
    let healed = stopped.elapsed();
    println!(
        "forged lead {} heartbeats (n2 at {h0}); n1 counts n2's own heartbeats again {:.2} s ({:.0} rounds) after the burst",
        forged - h0,
        healed.as_secs_f64(),
        healed.as_secs_f64() * 1000.0 / 100.0,
    );
    assert!(healed < Duration::from_secs(3), "healed after {healed:?}");
    c.wait_until(Duration::from_secs(10), || all_serving(&c))
        .unwrap_or_else(|_| panic!("views: {:?}", views(&c)));
}

#[test]
fn forged_state_about_a_node_taken_by_its_peers_is_republished_over_by_the_node() {
    let c = Cluster::start("trust-republish", 3, "", "");
    let ring = Keyring::load(&c.dir.join("certs").join("gossip.keys")).unwrap();
    let n1 = gossip_id(&c, "n1", "n1");
    // A key holder marks n1 leaving at a version a little ahead of n1's
    // own (within the bounds), sent to n2 and n3, which take it. n1 learns
    // of it from their digests and republishes its state above that
    // version: every view shows n1 serving again, for good.
    let forged = forge::ack(&n1, &[("status", "leaving", 1000)]);
    for (peer, nonce) in [("n2", 4), ("n3", 5)] {
        forge::send(c.node(peer).gossip, &ring.seal(&forged, [nonce; 12]));
    }
    c.wait_until(Duration::from_secs(10), || {
        c.log("n1").contains("republished this node's own state")
    })
    .unwrap_or_else(|_| panic!("n1 did not republish:\n{}", c.log("n1")));
    c.wait_until(Duration::from_secs(10), || all_serving(&c))
        .unwrap_or_else(|_| panic!("n1 stayed leaving: {:?}", views(&c)));
    settle(&c);
}

/// `gossip.state_signatures = "require"`: every node signs its state with
/// its node certificate's key. A key holder's forged state for n2 (status
/// leaving and a signature it cannot make, at versions within the
/// bounds), sent to n1 and n3, is refused there (logged), the views show
/// n2 serving (checked after the refusal and at the end), and n2's own
/// later state is taken.
#[test]
fn with_state_signatures_a_key_holders_forged_state_for_another_node_is_refused() {
    let c = Cluster::start_gossip("trust-signed", 3, "state_signatures = \"require\"");
    settle(&c);
    let ring = Keyring::load(&c.dir.join("certs").join("gossip.keys")).unwrap();
    let n2 = gossip_id(&c, "n1", "n2");
    // n2's max_version as n1 holds it (n1's answer to an empty Syn); the
    // forgery goes a little past it, within the bounds.
    let mut nonce = 0u8;
    let mut seal = |d: &[u8]| {
        nonce += 1;
        ring.seal(d, [nonce; 12])
    };
    let mut version = None;
    c.wait_until(Duration::from_secs(10), || {
        let syn = seal(&forge::syn("test-trust-signed"));
        version = forge::ask(c.node("n1").gossip, &syn, Duration::from_secs(1))
            .and_then(|a| ring.open(&a))
            .and_then(|plain| forge::digest_entry(&plain, "n2"))
            .map(|(_, v)| v);
        version.is_some()
    })
    .expect("n1 answers with a digest naming n2");
    let version = version.unwrap();
    let forged = forge::ack(
        &n2,
        &[
            ("status", "leaving", version + 500),
            ("sig", "0403:AAAA", version + 501),
        ],
    );
    // Sent again until a node logged the refusal (a datagram may be lost
    // on a loaded machine). Not both: a node reads a member's state once
    // a gossip round, and n2's own state republished over the forgery
    // (`SelfEcho`) may reach it first, so it never sees the forgery at
    // all (1 run in 4 for n3); the unit test in signed.rs judges a
    // forgery deterministically.
    c.wait_until(Duration::from_secs(10), || {
        for peer in ["n1", "n3"] {
            forge::send(c.node(peer).gossip, &seal(&forged));
        }
        std::thread::sleep(Duration::from_millis(100));
        ["n1", "n3"].iter().any(|n| {
            c.log(n)
                .contains("not signed by its certificate's key: forged")
        })
    })
    .unwrap_or_else(|_| {
        panic!(
            "no refusal logged: n1 {}, n3 {}; views {:?}; n1 dropped out_of_bounds {}:\n{}",
            c.log("n1").contains("forged node"),
            c.log("n3").contains("forged node"),
            views(&c),
            dropped(&c, "n1", "out_of_bounds"),
            c.log("n1")
        )
    });
    assert!(all_serving(&c), "views: {:?}", views(&c));
    // n2 changes its own state (a weight): signed, taken by the others.
    assert!(put_weight(c.node("n2").http, 3).contains("\"weight\":3"));
    c.wait_until(Duration::from_secs(10), || {
        ["n1", "n3"].iter().all(|n| {
            let v = status(c.node(n).http).unwrap();
            v["members"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["id"] == "n2" && m["weight"] == 3)
        })
    })
    .expect("n2's own change was not taken");
    assert!(all_serving(&c), "views: {:?}", views(&c));
}

/// The review of issue 34: ghost members a key holder announces with
/// third parties' addresses drew 30 times the announcement's bytes in
/// QUIC Initials (every node dialled every ghost's peer address, three
/// attempts of about 2.4 KB each). Now a member is dialled only once its
/// gossip address is confirmed (a seed, or an authenticated datagram came
/// from it), and a live member not confirmed gets a probe (a sealed
/// empty-digest Syn, about 60 bytes) at most 16 a round per node and
/// once a minute per address. Here 40 ghosts, each with its own trap
/// addresses, are announced in one sealed SynAck a round for 10 rounds
/// and then left; the traps are watched 3 s more. No QUIC byte may reach
/// a peer trap, and what the gossip traps get (probes, from every node
/// the ghosts spread to) must stay under the bytes announced. The figures
/// are printed (docs/operations.md, Security).
#[test]
fn ghosts_announced_by_a_key_holder_get_fewer_bytes_than_announced_them() {
    let c = Cluster::start("trust-ghost-bytes", 3, "", "");
    let ring = Keyring::load(&c.dir.join("certs").join("gossip.keys")).unwrap();
    let n1 = gossip_id(&c, "n1", "n1");
    let trap = || {
        let t = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        t.set_nonblocking(true).unwrap();
        t
    };
    let ghosts: Vec<(Id, std::net::UdpSocket, std::net::UdpSocket)> = (0..40)
        .map(|i| {
            let (quic, gossip) = (trap(), trap());
            let id = Id {
                node: format!("ghost{i}"),
                generation: 1,
                gossip: gossip.local_addr().unwrap(),
            };
            (id, quic, gossip)
        })
        .collect();
    let drain = |t: &std::net::UdpSocket| {
        let mut buf = [0u8; 65_536];
        let mut n = 0;
        while let Ok((k, _)) = t.recv_from(&mut buf) {
            n += k;
        }
        n
    };
    let (mut announced, mut quic, mut gossip) = (0usize, 0usize, 0usize);
    let start = std::time::Instant::now();
    for heartbeat in 10..20u64 {
        let nodes: Vec<_> = ghosts
            .iter()
            .map(|(id, q, _)| {
                let peer = q.local_addr().unwrap().to_string();
                let kvs = [
                    ("peer_addr", peer.as_str()),
                    ("http_addr", peer.as_str()),
                    ("weight", "1"),
                    ("status", "serving"),
                    ("load", "100"),
                    ("inflight", "0"),
                ]
                .iter()
                .zip(1u64..)
                .map(|((k, v), version)| (k.to_string(), v.to_string(), version))
                .collect();
                (id.clone(), heartbeat, 6, kvs)
            })
            .collect();
        let mut nonce = [0u8; 12];
        nonce[..8].copy_from_slice(&heartbeat.to_le_bytes());
        let d = ring.seal(&forge::syn_ack_many(&nodes), nonce);
        announced += d.len();
        forge::send(n1.gossip, &d);
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(3));
    let mut probers = std::collections::BTreeSet::new();
    for (_, q, g) in &ghosts {
        quic += drain(q);
        let mut buf = [0u8; 65_536];
        while let Ok((k, from)) = g.recv_from(&mut buf) {
            gossip += k;
            probers.insert(from);
        }
    }
    println!(
        "40 ghosts over {:.1} s: announced with {announced} bytes; peer traps got {quic} bytes of QUIC ({:.2}x), gossip traps {gossip} bytes of probes ({:.3}x) from {} nodes",
        start.elapsed().as_secs_f64(),
        quic as f64 / announced as f64,
        gossip as f64 / announced as f64,
        probers.len(),
    );
    assert_eq!(quic, 0, "a node dialled a ghost that never answered");
    assert!(gossip > 0, "no node probed a ghost: the test saw nothing");
    assert!(
        quic + gossip <= announced,
        "{} bytes sent to the ghosts, {announced} bytes announced them",
        quic + gossip
    );
}

/// A joining node asks for the whole state with an empty digest, and the
/// answer's delta fills a datagram. chitchat 0.13.0 filled it up to
/// 65,507 bytes, and when its last compressed block left less than the
/// seal's 29 bytes free, the sealed datagram was too large to send: the
/// transport dropped it (counted `oversize`) every round, and a node
/// joining a cluster whose state outgrows one datagram never caught up
/// from that peer. The vendored chitchat leaves 64 bytes to the transport
/// (`sealed.rs` checks at compile time that the seal fits). Which states
/// hit the last 29 bytes depends on how zstd packs the last block, so this
/// test checks the path end to end rather than that edge: the node learns
/// 120 members of four 250-byte keys each (about 120 KB, partly
/// compressible), then must answer a sealed empty-digest Syn with a sealed
/// SynAck that fills most of a datagram, and count no oversize datagram.
#[test]
fn a_joiners_full_catch_up_delta_is_sent_sealed() {
    let c = Cluster::start("trust-catch-up", 1, "", "");
    let ring = Keyring::load(&c.dir.join("certs").join("gossip.keys")).unwrap();
    let n1 = c.node("n1").gossip;
    // Values a compressor cannot shrink much: 64 symbols from xorshift.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut value = || -> String {
        (0..250)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(
                    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
                        [(x % 64) as usize],
                )
            })
            .collect()
    };
    for g in 0..120u64 {
        let ghost = Id {
            node: format!("g{g}"),
            generation: 1,
            gossip: "127.0.0.1:9".parse().unwrap(),
        };
        let vals: Vec<String> = (0..4).map(|_| value()).collect();
        let kvs: Vec<(&str, &str, u64)> = vec![
            ("k0", &vals[0], 1),
            ("k1", &vals[1], 2),
            ("k2", &vals[2], 3),
            ("k3", &vals[3], 4),
        ];
        let mut nonce = [7u8; 12];
        nonce[..8].copy_from_slice(&g.to_le_bytes());
        // A SynAck: its digest makes the member known (chitchat applies
        // a delta only to members it knows), its delta sets the keys. The
        // node answers with an Ack once it took it (one at a time, as a
        // member gossips).
        let d = ring.seal(&forge::syn_ack(&ghost, 1, 4, &kvs), nonce);
        assert!(
            (0..5).any(|_| forge::ask(n1, &d, Duration::from_secs(1)).is_some()),
            "n1 did not take member g{g}"
        );
    }
    // Ask until a full answer comes back.
    let mut largest = 0;
    let start = std::time::Instant::now();
    let mut nonce = 1u64 << 40;
    while start.elapsed() < Duration::from_secs(15) {
        nonce += 1;
        let mut n = [8u8; 12];
        n[..8].copy_from_slice(&nonce.to_le_bytes());
        let syn = ring.seal(&forge::syn("test-trust-catch-up"), n);
        if let Some(answer) = forge::ask(n1, &syn, Duration::from_millis(500)) {
            assert!(answer.len() <= 65_507);
            let plain = ring
                .open(&answer)
                .expect("the answer is sealed with the cluster key");
            if plain[3] != 1 {
                // An Ack to an earlier forged SynAck, whose sender's port
                // this socket reuses: not the answer.
                continue;
            }
            largest = largest.max(answer.len());
            if answer.len() > 60_000 {
                break;
            }
        }
    }
    assert!(
        largest > 60_000,
        "no full catch-up answer: the largest was {largest} bytes; n1 counted {} oversize datagrams",
        dropped(&c, "n1", "oversize")
    );
    assert_eq!(dropped(&c, "n1", "oversize"), 0);
    assert_eq!(dropped(&c, "n1", "out_of_bounds"), 0);
}

#[test]
fn key_rotation_keeps_the_cluster_whole_drops_the_removed_key_and_a_node_down_meanwhile_rejoins() {
    let mut c = Cluster::start("trust-rotate", 3, "", "");
    let file = c.dir.join("certs").join("gossip.keys");
    let old = Keyring::load(&file).unwrap();
    let old_fp = old.keys()[0].fingerprint();
    let (n1, n2) = (gossip_id(&c, "n1", "n1"), gossip_id(&c, "n1", "n2"));
    c.kill9("n3");
    c.wait_converged(2);
    let new = GossipKey::from_bytes([42; 32]);
    let live = ["n1", "n2"];
    // Install everywhere, then use everywhere, then remove everywhere:
    // `peerlb keyring` on n1 and n2, the admin API underneath.
    for (op, arg) in [
        ("install", new.to_base64()),
        ("use", new.fingerprint()),
        ("remove", old_fp.clone()),
    ] {
        let out = std::process::Command::new(support::bin())
            .args(["keyring", "--config"])
            .arg(&c.config)
            .args(["--node", live[0], "--node", live[1], op, &arg])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "keyring {op}: {text}");
        assert_eq!(text.lines().count(), 2, "{text}");
    }
    let r = admin(c.node("n1").http, "GET", "/_peerlb/keyring", "");
    assert!(
        r.contains(&new.fingerprint()) && !r.contains(&old_fp),
        "{r}"
    );
    // Every change is in the file the nodes read at start.
    assert_eq!(Keyring::load(&file).unwrap(), Keyring::single(new.clone()));
    let r = admin(
        c.node("n1").http,
        "POST",
        "/_peerlb/keyring/remove",
        &new.fingerprint(),
    );
    assert!(r.starts_with("HTTP/1.0 409"), "{r}");
    let r = admin(
        c.node("n1").http,
        "POST",
        "/_peerlb/keyring/install",
        "not a key",
    );
    assert!(r.starts_with("HTTP/1.0 400"), "{r}");
    // n1 and n2 still gossip (a weight change crosses under the new key).
    assert!(put_weight(c.node("n2").http, 4).contains("\"weight\":4"));
    c.wait_until(Duration::from_secs(10), || {
        let v = status(c.node("n1").http).unwrap();
        v["members"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == "n2" && m["weight"] == 4)
    })
    .expect("n2's weight did not reach n1 after the rotation");
    // A datagram sealed with the removed key is dropped unopened; one
    // sealed with the new key is opened (and refused by the bounds).
    let unauth = dropped(&c, "n1", "unauthenticated");
    let oob = dropped(&c, "n1", "out_of_bounds");
    let removed = old.seal(&forge::ack(&n2, &[("status", "leaving", 1 << 30)]), [5; 12]);
    forge::send(n1.gossip, &removed);
    wait_dropped(&c, "n1", "unauthenticated", unauth + 1);
    let current = Keyring::single(new.clone());
    forge::send(
        n1.gossip,
        &current.seal(&forge::ack(&n2, &[("l", "1", u64::MAX)]), [6; 12]),
    );
    wait_dropped(&c, "n1", "out_of_bounds", oob + 1);
    // n3 comes back with the old keyring: it cannot join and says why.
    std::fs::write(&file, old.to_file_text()).unwrap();
    c.spawn(2);
    c.wait_until(Duration::from_secs(10), || {
        c.log("n3").contains("no key of this node's ring opens it")
    })
    .unwrap_or_else(|_| panic!("n3 did not report its stale keyring:\n{}", c.log("n3")));
    assert_eq!(serving(c.node("n1").http).map(|s| s.len()), Some(2));
    assert_eq!(serving(c.node("n3").http).map(|s| s.len()), Some(1));
    // With the cluster's current file it rejoins.
    std::fs::write(&file, current.to_file_text()).unwrap();
    c.kill9("n3");
    c.spawn(2);
    c.wait_converged(3);
    settle(&c);
}

#[test]
fn a_missing_or_bad_keyring_is_a_config_error_naming_the_field_exit_64_before_binding() {
    let dir = support::temp_dir("trust-keyring");
    // The node's own addresses are taken while it runs: a node that bound
    // any of them before checking its keyring would fail on the bind
    // instead ("before binding" is then what the exit status shows). Bound
    // here first (port 0), so no other test's node can take one meanwhile.
    let held = (
        std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap(),
        std::net::UdpSocket::bind(("127.0.0.1", 0)).unwrap(),
        std::net::UdpSocket::bind(("127.0.0.1", 0)).unwrap(),
    );
    let (http, peer, gossip) = (
        held.0.local_addr().unwrap().port(),
        held.1.local_addr().unwrap().port(),
        held.2.local_addr().unwrap().port(),
    );
    let cfg = support::write(
        &dir,
        "c.toml",
        &format!(
            "[[nodes]]\nid = \"n1\"\nhttp_addr = \"127.0.0.1:{http}\"\npeer_addr = \"127.0.0.1:{peer}\"\ngossip_addr = \"127.0.0.1:{gossip}\"\n",
        ),
    );
    let out = std::process::Command::new(support::bin())
        .args(["certs", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(out.status.success());
    let keys = dir.join("certs").join("gossip.keys");
    assert!(String::from_utf8_lossy(&out.stdout).contains("gossip.keys"));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&keys).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    assert_eq!(Keyring::load(&keys).unwrap().keys().len(), 1);
    for (what, text) in [
        ("missing", None),
        ("bad", Some("not base64\n")),
        ("empty", Some("# nothing\n")),
    ] {
        match text {
            None => std::fs::remove_file(&keys).unwrap(),
            Some(t) => std::fs::write(&keys, t).unwrap(),
        }
        let out = std::process::Command::new(support::bin())
            .args(["node", "--node", "n1", "--config"])
            .arg(&cfg)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{what}: {err}");
        assert!(err.contains("tls.gossip_keyring"), "{what}: {err}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Resident set size of a process, in KiB (Linux `/proc/<pid>/status`).
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A client socket that sends and never hears back: an attacker that
/// sends QUIC Initials and never continues a handshake (as with spoofed
/// sources).
#[derive(Debug)]
struct Deaf(Arc<dyn quinn::AsyncUdpSocket>);

impl quinn::AsyncUdpSocket for Deaf {
    fn create_io_poller(self: Arc<Self>) -> std::pin::Pin<Box<dyn quinn::UdpPoller>> {
        self.0.clone().create_io_poller()
    }
    fn try_send(&self, t: &quinn::udp::Transmit) -> std::io::Result<()> {
        self.0.try_send(t)
    }
    fn poll_recv(
        &self,
        _: &mut std::task::Context,
        _: &mut [std::io::IoSliceMut<'_>],
        _: &mut [quinn::udp::RecvMeta],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Pending
    }
    fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.0.local_addr()
    }
}

/// 4,000 QUIC Initials, each a new connection, never continued: the peer
/// port answers past a few half-open handshakes with stateless Retry
/// packets, so the node's memory grows by at most 32 MiB (the figure is
/// printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_quic_handshakes_cost_the_peer_port_little_memory() {
    use quinn::Runtime as _;
    const INITIALS: usize = 4000;
    let c = Cluster::start("trust-initials", 1, "", "");
    let pid = c.children["n1"].id();
    let certs = c.dir.join("certs");
    let m = peerlb::tls::TlsMaterial::load(
        &certs.join("ca.pem"),
        &certs.join("n1.pem"),
        &certs.join("n1.key"),
    )
    .unwrap();
    let client = peerlb::tls::quinn_client_config(&m).unwrap();
    let peer = c.node("n1").peer;
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let socket = quinn::TokioRuntime.wrap_udp_socket(socket).unwrap();
    let ep = quinn::Endpoint::new_with_abstract_socket(
        quinn::EndpointConfig::default(),
        None,
        Arc::new(Deaf(socket)),
        Arc::new(quinn::TokioRuntime),
    )
    .unwrap();
    let before = rss_kib(pid);
    let mut peak = before;
    let mut pending = Vec::with_capacity(INITIALS);
    for i in 0..INITIALS {
        pending.push(
            ep.connect_with(client.clone(), peer, "n1.node.peerlb")
                .unwrap(),
        );
        if i % 100 == 99 {
            // Let the endpoint driver send what was queued.
            tokio::time::sleep(Duration::from_millis(2)).await;
            peak = peak.max(rss_kib(pid));
        }
    }
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        peak = peak.max(rss_kib(pid));
    }
    let grown = peak.saturating_sub(before);
    println!(
        "{INITIALS} Initials: RSS {before} KiB -> peak {peak} KiB (+{grown} KiB, {} bytes per Initial)",
        grown * 1024 / INITIALS as u64
    );
    assert!(grown <= 32 * 1024, "RSS grew by {grown} KiB");
    // The node still serves.
    assert_eq!(serving(c.node("n1").http).map(|s| s.len()), Some(1));
    drop(pending);
}

/// A request frame as docs/architecture.md ("Peer wire") documents it
/// for ALPN `peerlb/3`: the stream's kind, then the head's fields, bincode
/// 2 (`config::standard()`) through serde, behind a u32 big-endian
/// length. Written here from the documentation, not from the crate's own
/// types.
#[derive(serde::Serialize)]
struct WireRequestHead {
    kind: WireKind,
    request_id: u128,
    entry: String,
    hops: u8,
    view_version: u64,
    method: String,
    uri: String,
    headers: Vec<(String, Vec<u8>)>,
    client: std::net::SocketAddr,
    hash_key: Option<String>,
    /// The client's TLS facts: SNI, version code point, ALPN (`None`:
    /// cleartext).
    tls: Option<(Option<String>, u16, Option<Vec<u8>>)>,
}

/// The stream's kind, as documented: an enum, the variants in this order.
#[derive(serde::Serialize)]
#[allow(dead_code)]
enum WireKind {
    Http,
    Sip(u8),
    Admin,
}

/// A response head, as documented beside the request head.
#[derive(serde::Deserialize, Debug)]
struct WireResponseHead {
    status: u16,
    #[allow(dead_code)]
    headers: Vec<(String, Vec<u8>)>,
    served_by: String,
}

/// Sends one proxied request claiming `entry` on a new stream of `conn`;
/// the owner's response head, or the error that ended the stream.
async fn claim(
    conn: &quinn::Connection,
    entry: &str,
    path: &str,
) -> Result<WireResponseHead, String> {
    let head = WireRequestHead {
        kind: WireKind::Http,
        request_id: 7,
        entry: entry.to_owned(),
        hops: 1,
        view_version: 0,
        method: "GET".into(),
        uri: path.into(),
        headers: vec![("host".into(), b"peerlb".to_vec())],
        client: "127.0.0.1:9".parse().unwrap(),
        hash_key: None,
        tls: None,
    };
    let body = bincode::serde::encode_to_vec(&head, bincode::config::standard()).unwrap();
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend(body);
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
    send.write_all(&frame).await.map_err(|e| e.to_string())?;
    let _ = send.finish();
    let mut len = [0u8; 4];
    recv.read_exact(&mut len).await.map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; u32::from_be_bytes(len) as usize];
    recv.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
    let (head, _) = bincode::serde::decode_from_slice(&buf, bincode::config::standard())
        .map_err(|e| e.to_string())?;
    Ok(head)
}

/// A node with a valid cluster certificate (n3's) that claims to be
/// another entry (n2) in a request head: the owner (n1) closes the whole
/// connection with close code 2, logs it, and its app serves nothing for
/// it. The same connection claiming its own id is served, so the frame
/// itself is sound (docs/architecture.md, "Peer wire": close code 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_closes_a_peer_connection_whose_certificate_is_not_the_entry_it_claims() {
    let app = support::GatedApp::start().await;
    let c = Cluster::start(
        "trust-claim",
        3,
        &format!("app = \"http://{}\"\n", app.addr),
        USER_RULES,
    );
    let certs = c.dir.join("certs");
    let rogue = peerlb::tls::TlsMaterial::load(
        &certs.join("ca.pem"),
        &certs.join("n3.pem"),
        &certs.join("n3.key"),
    )
    .unwrap();
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(peerlb::tls::quinn_client_config(&rogue).unwrap());
    let conn = ep
        .connect(c.node("n1").peer, "n1.node.peerlb")
        .unwrap()
        .await
        .expect("n3's certificate is a valid cluster certificate");

    // Claiming its own id: served.
    let ok = claim(&conn, "n3", "/honest").await.expect("served");
    assert_eq!((ok.status, ok.served_by.as_str()), (200, "n1"));
    assert_eq!(app.arrived("/honest"), 1);

    // Claiming n2: the connection is closed, nothing is served.
    let forged = claim(&conn, "n2", "/forged").await;
    assert!(forged.is_err(), "a forged entry was answered: {forged:?}");
    match conn.closed().await {
        quinn::ConnectionError::ApplicationClosed(close) => {
            assert_eq!(close.error_code, quinn::VarInt::from_u32(2), "{close:?}");
            assert_eq!(
                &close.reason[..],
                b"certificate does not match entry node id"
            );
        }
        other => panic!("the connection ended otherwise: {other:?}"),
    }
    assert_eq!(
        app.arrived("/forged"),
        0,
        "the owner served a forged request"
    );
    let log = c.log("n1");
    assert!(
        log.lines().any(
            |l| l.contains("peer certificate does not match the entry it claims")
                && l.contains("claimed=n2")
                && l.contains("proved=n3")
        ),
        "{log}"
    );
    // The node itself is unharmed: a real entry still forwards to it.
    let r = ring(&["n1", "n2", "n3"], 1024);
    let user = user_where(&r, |o| o == "n1");
    let resp = support::get(c.node("n2").http, &format!("/after?user={user}"), &[]).await;
    assert_eq!((resp.status, resp.served_by()), (200, "n1"));
    ep.wait_idle().await;
}
