//! The simulation tier (CONTRIBUTING.md, "The tiers"): every scenario in `simulations/` on
//! its seeds, the determinism canaries, and what the harness's adapters
//! promise. Needs `--features sim` and `RUSTFLAGS="--cfg tokio_unstable"`
//! (see simulations/README.md): `simulations/peerlb-sim test`.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use peerlb::sim::harness::{self, Outcome, RunOptions};
use peerlb::sim::scenario::Scenario;

// Process randomness from the seed, in this test binary only.
peerlb::sim_os_overrides!();

fn scenario(name: &str) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("simulations")
        .join(format!("{name}.toml"));
    Scenario::load(&path).unwrap()
}

fn run(s: &Scenario, seed: u64) -> Outcome {
    let o = harness::run_isolated(s, seed, &RunOptions::default()).unwrap();
    assert!(
        o.violations.is_empty(),
        "{} seed {seed}: {:#?}\nfigures: {:#?}",
        s.name,
        o.violations,
        o.figures
    );
    o
}

/// Runs every seed of a scenario; returns the outcomes.
fn run_all(name: &str) -> Vec<Outcome> {
    let s = scenario(name);
    s.seeds.iter().map(|seed| run(&s, *seed)).collect()
}

fn served_after(o: &Outcome, node: &str, after: Duration) -> usize {
    o.serves
        .iter()
        .filter(|(t, n)| n == node && *t > after)
        .count()
}

#[test]
fn kill_owner_of_hot_key_under_load() {
    for o in run_all("kill-owner") {
        let kill = &o.faults[0];
        let dead = kill.node.clone().unwrap();
        let (_, eject) = &o.figures.ejections[0];
        let eject = eject.expect("ejected");
        assert!(eject <= Duration::from_secs(2), "{eject:?}");
        // Nothing is served by the dead node after its kill.
        assert_eq!(served_after(&o, &dead, kill.at), 0);
        assert_eq!(o.figures.failed, 0);
        // The survivors share its keys: about 1/5 moved.
        let (_, moved) = o.figures.keys_moved[0];
        assert!((0.1..0.35).contains(&moved), "{moved}");
    }
}

#[test]
fn partition_two_plus_one_then_heal() {
    for o in run_all("partition-heal") {
        let heal = o.figures.convergence.last().unwrap();
        assert_eq!(heal.0, "heal");
        assert!(heal.1.expect("converged after heal") <= Duration::from_secs(5));
        // The lone side kept serving during the partition.
        let (start, end) = (o.faults[0].at, o.faults[1].at);
        let n3 = o
            .serves
            .iter()
            .filter(|(t, n)| n == "n3" && *t > start + Duration::from_secs(2) && *t < end)
            .count();
        assert!(n3 > 50, "{n3}");
    }
}

#[test]
fn restart_with_the_same_id_leaves_no_ghost() {
    for o in run_all("restart-same-id") {
        // The restarted node serves again (new generation on every ring;
        // the probe found no old generation: no violation).
        assert!(served_after(&o, "n2", o.faults[1].at) > 20);
    }
}

#[test]
fn drain_finishes_in_flight_requests() {
    for o in run_all("drain") {
        assert_eq!(o.figures.failed, 0);
        assert_eq!(o.figures.entry_lost, 0);
        // n3 served until it left, then nothing.
        assert!(served_after(&o, "n3", o.faults[0].at) > 0);
        assert_eq!(
            served_after(&o, "n3", o.faults[0].at + Duration::from_secs(3)),
            0
        );
    }
}

#[test]
fn node_join_takes_about_a_quarter_of_the_keys() {
    for o in run_all("node-join") {
        let (_, moved) = o.figures.keys_moved[0];
        assert!((0.15..0.38).contains(&moved), "{moved}");
        let join = o.faults[0].at;
        assert!(served_after(&o, "n4", join + Duration::from_secs(4)) > 50);
    }
}

#[test]
fn slow_start_grows_a_joining_nodes_share_in_steps_moving_only_its_keys() {
    for o in run_all("slow-start") {
        assert_eq!(o.figures.failed, 0);
        // n4 joins at 25 (a membership change, counted in keys_moved),
        // then each step is a view change of its weight alone: 50, 75,
        // 100, each moving keys to n4 (and none between two other nodes:
        // a violation otherwise).
        let steps: Vec<(u32, f64)> = o
            .figures
            .ramp_steps
            .iter()
            .filter(|(n, _, _)| n == "n4")
            .map(|(_, w, f)| (*w, *f))
            .collect();
        let weights: Vec<u32> = steps.iter().map(|(w, _)| *w).collect();
        assert_eq!(weights, [50, 75, 100], "{steps:?}");
        // Its share of the keys: 25/325, 50/350, 75/375, 100/400 (7.7%,
        // 14.3%, 20%, 25%), so each step moves about 5-7% of the keys.
        assert!(
            steps.iter().all(|(_, f)| (0.02..0.12).contains(f)),
            "{steps:?}"
        );
        let total: f64 = steps.iter().map(|(_, f)| f).sum();
        assert!((0.11..0.24).contains(&total), "{total}");
        let join = o.faults[0].at;
        assert!(served_after(&o, "n4", join + Duration::from_secs(4)) > 50);
    }
}

#[test]
fn membership_skew_forwards_once_and_never_fails() {
    for o in run_all("membership-skew") {
        assert_eq!(o.figures.failed, 0);
        assert!(o.figures.ok > 500);
        // The skew happened: owners served requests their own view gave
        // to another node, and nothing looped (no violation).
        assert!(o.figures.disagree > 0, "{:?}", o.figures);
    }
}

#[test]
fn rolling_restart_of_every_node() {
    for o in run_all("rolling-restart") {
        let nodes: BTreeSet<&String> = o.serves.iter().map(|(_, n)| n).collect();
        assert_eq!(nodes.len(), 4);
        let last = o.faults.last().unwrap().at;
        assert!(served_after(&o, "n4", last + Duration::from_secs(1)) > 0);
    }
}

/// The harness learns what nodes do from their observers (typed events
/// through `Env`), not from their log text: with every node log line left
/// out of the trace, kill-owner still sees each view change, each request
/// served and each ejection, the same ones at the same times, and passes.
/// Were an invariant reading a log line again, this run would see no view
/// and fail its convergence and ejection checks.
#[test]
fn invariants_read_typed_events_not_log_lines() {
    let s = scenario("kill-owner");
    let logged = run(&s, 1);
    let opts = RunOptions {
        without_node_logs: true,
        ..RunOptions::default()
    };
    let silent = harness::run_isolated(&s, 1, &opts).unwrap();
    assert!(silent.violations.is_empty(), "{:#?}", silent.violations);
    assert!(
        silent.lines < logged.lines / 2,
        "{} {}",
        silent.lines,
        logged.lines
    );
    let dead = silent.faults[0].node.clone().unwrap();
    let kill = silent.faults[0].at;
    // Every survivor reported a view without the dead node after the kill,
    // and ejected it on its connection's loss.
    for n in silent.nodes.iter().filter(|n| **n != dead) {
        assert!(
            silent
                .views
                .iter()
                .any(|(at, h, ids)| h == n && *at > kill && !ids.contains(&dead)),
            "{n}: {:?}",
            silent.views
        );
    }
    assert!(
        silent
            .peer_events
            .iter()
            .any(|(at, _, peer, up)| *at > kill && *peer == dead && !up),
        "{:?}",
        silent.peer_events
    );
    assert_eq!(silent.views, logged.views);
    assert_eq!(silent.serves, logged.serves);
    assert_eq!(silent.figures.ejections, logged.figures.ejections);
}

/// Determinism canary: the same seed gives the same trace hash on two
/// threads of this process; another seed gives another hash. (`.ci/run`
/// also compares hashes across separate processes.)
#[test]
fn same_seed_same_trace_other_seed_other_trace() {
    let s = scenario("restart-same-id");
    let a = run(&s, 7);
    let b = run(&s, 7);
    let c = run(&s, 8);
    assert!(a.lines > 1000, "{}", a.lines);
    assert_eq!(a.hash, b.hash);
    assert_ne!(a.hash, c.hash);
}

/// Canary for the randomness sources decisions depend on: std's HashMap
/// keys and rand's thread RNG (getrandom 0.4) draw from the thread's seed.
#[test]
fn process_randomness_comes_from_the_seed() {
    fn draw(seed: u64) -> (u64, u64, u64) {
        std::thread::spawn(move || {
            use std::hash::BuildHasher;
            peerlb::sim::os::seed_thread(seed);
            let h = std::collections::hash_map::RandomState::new().hash_one(42u64);
            let r: u64 = rand::RngExt::random(&mut rand::rng());
            (h, r, peerlb::sim::os::drawn())
        })
        .join()
        .unwrap()
    }
    let (h1, r1, drawn) = draw(1);
    assert!(
        drawn >= 16,
        "the getrandom override is not linked: drew {drawn} bytes"
    );
    assert_eq!(draw(1).0, h1, "HashMap keys escape the seed");
    assert_eq!(draw(1).1, r1, "rand's thread RNG escapes the seed");
    assert_ne!(draw(2).0, h1);
    assert_ne!(draw(2).1, r1);
}

/// chitchat 0.13's failure detector reads `tokio::time::Instant`, so under
/// turmoil it runs on virtual time: 30 virtual seconds of a live peer never
/// mark it dead, and a crashed peer is marked dead within a few virtual
/// seconds. Only virtual time is asserted: a bound on wall time would
/// measure the machine's load, not the detector.
#[test]
fn chitchat_failure_detector_runs_on_virtual_time() {
    use chitchat::{ChitchatConfig, ChitchatId, FailureDetectorConfig};
    use std::cell::RefCell;
    use std::rc::Rc;

    std::thread::spawn(|| {
        peerlb::sim::os::seed_thread(3);
        let mut sim = turmoil::Builder::new()
            .rng_seed(3)
            .simulation_duration(Duration::from_secs(120))
            .min_message_latency(Duration::from_millis(1))
            .max_message_latency(Duration::from_millis(2))
            .build();
        let transport = peerlb::sim::gossip::SimGossip::new();
        let addr = |i: u8| std::net::SocketAddr::from(([192, 168, 0, i], 7100));
        let _ = (sim.lookup("g1"), sim.lookup("g2"));
        let live: Rc<RefCell<Vec<(Duration, usize)>>> = Rc::default();
        for (i, name) in [(1u8, "g1"), (2, "g2")] {
            let t = transport.clone();
            let live = live.clone();
            sim.host(name, move || {
                let t = t.clone();
                let live = live.clone();
                async move {
                    let config = ChitchatConfig {
                        chitchat_id: ChitchatId::new(name.to_owned(), 1, addr(i)),
                        cluster_id: "c".into(),
                        gossip_interval: Duration::from_millis(200),
                        listen_addr: addr(i),
                        seed_nodes: vec![addr(3 - i).to_string()],
                        failure_detector_config: FailureDetectorConfig {
                            initial_interval: Duration::from_millis(200),
                            ..FailureDetectorConfig::default()
                        },
                        marked_for_deletion_grace_period: Duration::from_secs(3600),
                        catchup_callback: None,
                        extra_liveness_predicate: None,
                        protocol_version: chitchat::ProtocolVersion::V0,
                    };
                    let h = chitchat::spawn_chitchat(config, Vec::new(), &t).await?;
                    let start = tokio::time::Instant::now();
                    loop {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        let n = h.chitchat().lock().await.live_nodes().count();
                        if i == 1 {
                            live.borrow_mut().push((start.elapsed(), n));
                        }
                    }
                }
            });
        }
        while sim.elapsed() < Duration::from_secs(35) {
            sim.step().unwrap();
        }
        sim.crash("g2");
        let crashed_at = sim.elapsed();
        while sim.elapsed() < Duration::from_secs(60) {
            sim.step().unwrap();
        }
        let live = live.borrow();
        // Both live from 3 s to the crash: never marked dead while alive.
        let before: Vec<usize> = live
            .iter()
            .filter(|(t, _)| {
                *t > Duration::from_secs(3) && *t < crashed_at - Duration::from_millis(200)
            })
            .map(|(_, n)| *n)
            .collect();
        assert!(
            before.len() > 250 && before.iter().all(|n| *n == 2),
            "{before:?}"
        );
        // Dead within 10 virtual seconds of the crash, and stays dead.
        let dead_at = live
            .iter()
            .find(|(t, n)| *t > crashed_at && *n == 1)
            .map(|(t, _)| *t - crashed_at)
            .expect("marked dead");
        assert!(dead_at < Duration::from_secs(10), "{dead_at:?}");
        assert!(
            live.iter()
                .filter(|(t, _)| *t > crashed_at + dead_at)
                .all(|(_, n)| *n == 1)
        );
    })
    .join()
    .unwrap();
}

#[test]
fn slow_node_does_not_convoy_the_others() {
    for o in run_all("slow-node") {
        let lat = &o.figures.latency_by_node;
        // n2 is slow (100 ms of work after the fault)...
        assert!(lat["n2"].1 >= Duration::from_millis(100), "{lat:?}");
        // ...and nobody else waits behind it.
        for n in ["n1", "n3", "n4"] {
            assert!(lat[n].1 < Duration::from_millis(40), "{n}: {lat:?}");
        }
        assert_eq!(o.figures.failed, 0);
    }
}

#[test]
fn sticky_sessions_fail_over_once_and_stick_to_their_new_node() {
    for o in run_all("sticky-failover") {
        let st = &o.figures.sticky;
        let kill = &o.faults[0];
        let dead = kill.node.clone().unwrap();
        // Every one of the 40 users started a session, with a route.
        assert_eq!(st.started, 40, "{st:?}");
        assert_eq!((st.violations, st.sessions_violated), (0, 0), "{st:?}");
        // The dead node held about a third of the sessions: each moved once
        // (one rewrite per session), and every other routed request was
        // served by the node its route named.
        assert!((8..=20).contains(&st.moved), "{st:?}");
        assert_eq!(st.rewrites, st.moved, "{st:?}");
        assert_eq!(st.stuck + st.rewrites, st.routed, "{st:?}");
        assert!(st.routed > 300, "{st:?}");
        let (_, eject) = &o.figures.ejections[0];
        assert!(eject.expect("ejected") <= Duration::from_secs(2));
        assert_eq!(served_after(&o, &dead, kill.at), 0);
        assert_eq!(o.figures.failed, 0);
    }
}

/// The sticky-session invariant catches a cluster that does not stick: the
/// same traffic under plain round robin (no route is ever set) breaks it
/// for every session.
#[test]
fn sessions_without_a_sticky_policy_break_the_invariant() {
    let mut s = scenario("sticky-failover");
    s.cluster = "policy = \"round-robin\"\n".to_owned();
    s.faults.clear();
    let o = harness::run_isolated(&s, 1, &RunOptions::default()).unwrap();
    assert_eq!(
        o.figures.sticky.sessions_violated, 40,
        "{:?}",
        o.figures.sticky
    );
    assert!(
        o.violations
            .iter()
            .any(|v| v.starts_with("sticky session c1-s0: ") && v.contains("set route None")),
        "{:#?}",
        o.violations
    );
}

#[test]
fn weight_change_reaches_every_ring_and_moves_the_share() {
    for o in run_all("weight-change") {
        // Every ring agreed on the new weight within 2 s (a violation
        // otherwise), and a share of keys moved to n1: 1/3 -> 3/5.
        let (label, converged) = o.figures.convergence.last().unwrap();
        assert_eq!(label, "weight n1 300");
        assert!(converged.expect("converged") <= Duration::from_secs(2));
        let (_, moved) = o.figures.keys_moved[0];
        assert!((0.2..0.34).contains(&moved), "{moved}");
        let share = &o.figures.shares[0];
        assert_eq!(share.node, "n1");
        assert!((share.weight_share - 0.6).abs() < 1e-9, "{share:?}");
        // The engine's ring gives n1 about 3/5 of the keys...
        assert!((share.ring_share - 0.6).abs() < 0.04, "{share:?}");
        // ...and n1 served that share of the requests once every ring
        // agreed (the harness checks it against the requests' own keys
        // within share_tolerance = 0.03).
        assert!(share.requests > 400, "{share:?}");
        assert!((share.served - 0.6).abs() < 0.07, "{share:?}");
        assert!((share.served - share.expected).abs() <= 0.03, "{share:?}");
        assert_eq!(o.figures.failed, 0);
    }
}

mod sticky_check {
    //! `check_sticky`, the sticky-session invariant, on hand-made records.

    use std::time::Duration;

    use peerlb::sim::harness::{Record, check_sticky};

    fn rec(tag: &str, at: u64, route: Option<&str>, served: &str, set: Option<&str>) -> Record {
        Record {
            tag: tag.to_owned(),
            key: "c1-s0".to_owned(),
            method: "GET".to_owned(),
            entry: "n1".to_owned(),
            start: Duration::from_millis(at),
            end: Some(Duration::from_millis(at + 5)),
            result: Some(Ok((200, served.to_owned(), "n1".to_owned()))),
            session: Some("c1-s0".to_owned()),
            route: route.map(str::to_owned),
            set_route: set.map(str::to_owned),
        }
    }

    /// n2 dies at 100 ms; every node is up before.
    fn up(node: &str, _from: Duration, to: Duration) -> bool {
        node != "n2" || to < Duration::from_millis(100)
    }

    #[test]
    fn a_session_that_moves_once_its_node_died_holds() {
        let records = [
            rec("a", 0, None, "n2", Some("n2")),
            rec("b", 10, Some("n2"), "n2", None),
            rec("c", 120, Some("n2"), "n3", Some("n3")),
            rec("d", 130, Some("n3"), "n3", None),
        ];
        let (fig, lines) = check_sticky(&records, up);
        assert!(lines.is_empty(), "{lines:?}");
        assert_eq!(
            (fig.started, fig.routed, fig.stuck, fig.moved, fig.rewrites),
            (1, 3, 2, 1, 1)
        );
    }

    #[test]
    fn every_way_to_break_stickiness_is_a_violation() {
        let cases = [
            // Served elsewhere while its node was up.
            rec("x", 10, Some("n2"), "n3", Some("n3")),
            // Failed over, but the route was not rewritten.
            rec("x", 120, Some("n2"), "n3", None),
            // A session started without a route.
            rec("x", 0, None, "n1", None),
            // An answer naming another node than the one that served it.
            rec("x", 10, Some("n1"), "n1", Some("n3")),
        ];
        for r in cases {
            let (fig, lines) = check_sticky(std::slice::from_ref(&r), up);
            assert_eq!(fig.violations, 1, "{r:?}");
            assert_eq!(fig.sessions_violated, 1);
            assert!(
                lines[0].starts_with("sticky session c1-s0: x: "),
                "{lines:?}"
            );
        }
    }

    #[test]
    fn failed_requests_and_plain_requests_are_not_judged() {
        let mut failed = rec("f", 10, Some("n2"), "", None);
        failed.result = Some(Err("connect: refused".to_owned()));
        let mut plain = rec("p", 10, Some("n2"), "n3", None);
        plain.session = None;
        let (fig, lines) = check_sticky(&[failed, plain], up);
        assert!(lines.is_empty());
        assert_eq!(fig.routed, 0);
    }
}

mod scenario_format {
    //! `Scenario::parse`: the weight fault, sessions, share_tolerance.

    use peerlb::sim::scenario::{Action, Scenario};

    const HEAD: &str = "nodes = 3\nduration_s = 9\n";

    fn parse(tail: &str) -> anyhow::Result<Scenario> {
        Scenario::parse(&format!("{HEAD}{tail}"), "t")
    }

    fn err(tail: &str) -> String {
        parse(tail).unwrap_err().to_string()
    }

    #[test]
    fn weight_fault_needs_a_node_and_a_value_in_range() {
        let ok = parse("[[fault]]\nat_s = 4\naction = \"weight\"\nnode = \"n1\"\nvalue = 300\n")
            .unwrap();
        assert_eq!(ok.faults[0].action, Action::Weight);
        assert_eq!(ok.faults[0].value, Some(300));
        assert_eq!(
            err("[[fault]]\nat_s = 4\naction = \"weight\"\nnode = \"n1\"\n"),
            "fault[0]: weight needs `value` (the new weight)"
        );
        assert_eq!(
            err("[[fault]]\nat_s = 4\naction = \"weight\"\nnode = \"n1\"\nvalue = 10001\n"),
            "fault[0].value 10001 is out of range 0..=10000"
        );
        assert_eq!(
            err("[[fault]]\nat_s = 4\naction = \"weight\"\nvalue = 5\n"),
            "fault[0]: Weight needs `node`"
        );
        assert_eq!(
            err("[[fault]]\nat_s = 4\naction = \"kill\"\nnode = \"n1\"\nvalue = 5\n"),
            "fault[0]: `value` applies to weight only"
        );
    }

    #[test]
    fn sessions_default_to_none_and_take_no_hot_key() {
        let s = parse("[[traffic]]\nsessions = 4\nrate = 10\nstop_s = 8\n").unwrap();
        assert_eq!(s.traffic[0].sessions, 4);
        let plain = parse("[[traffic]]\nrate = 10\nstop_s = 8\n").unwrap();
        assert_eq!(plain.traffic[0].sessions, 0);
        assert_eq!(
            err("[[traffic]]\nsessions = 4\nrate = 10\nstop_s = 8\nhot_key = \"h\"\n"),
            "traffic[0]: hot_key does not apply to sessions"
        );
    }

    #[test]
    fn share_tolerance_is_a_fraction() {
        assert_eq!(parse("").unwrap().expect.share_tolerance, 0.03);
        assert_eq!(
            err("[expect]\nshare_tolerance = 1.5\n"),
            "expect.share_tolerance must be in 0..=1"
        );
    }
}
