//! The simulation harness's own checks and what it relies on, apart from
//! the scenario runs of tests/simulation.rs: process randomness drawn from
//! the seed, chitchat's failure detector on virtual time, the sticky-session
//! invariant on hand-made records, and the scenario file format. Needs
//! `--features sim` and `RUSTFLAGS="--cfg tokio_unstable"`
//! (`simulations/peerlb-sim test` runs it with tests/simulation.rs).

use std::time::Duration;

// Process randomness from the seed, in this test binary only.
peerlb::sim_os_overrides!();

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
                        max_nodes: None,
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
