//! Unit tests of the gossip bounds: hand-built V0 datagrams against each bound.

use super::*;

/// V0 bytes built by hand from the format in the module doc.
struct W(Vec<u8>);

impl W {
    fn header(kind: u8) -> W {
        let mut v = 0xB053u16.to_le_bytes().to_vec();
        v.extend([0, kind]);
        W(v)
    }
    fn str(&mut self, s: &str) -> &mut W {
        self.0.extend((s.len() as u16).to_le_bytes());
        self.0.extend(s.as_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut W {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn id(&mut self, node: &str, generation: u64) -> &mut W {
        self.str(node).u64(generation);
        self.0.extend([4, 127, 0, 0, 1, 0x10, 0x27]);
        self
    }
}

/// (key, value, version).
type Kv = (String, String, u64);
/// (node id, generation, key-values).
type NodeOps<'a> = (&'a str, u64, Vec<Kv>);

/// A delta of `nodes` as one plain block.
fn delta(nodes: &[NodeOps<'_>]) -> Vec<u8> {
    let mut ops = W(Vec::new());
    for (node, generation, kvs) in nodes {
        ops.0.push(0);
        ops.id(node, *generation).u64(0).u64(0);
        for (k, v, version) in kvs {
            ops.0.push(1);
            ops.str(k).str(v).u64(*version);
            ops.0.push(0);
        }
    }
    let mut out = vec![2];
    out.extend((ops.0.len() as u16).to_le_bytes());
    out.extend(ops.0);
    out.push(0);
    out
}

fn ack(nodes: &[NodeOps<'_>]) -> Vec<u8> {
    let mut w = W::header(2);
    w.0.extend(delta(nodes));
    w.0
}

fn kv(k: &str, v: &str, version: u64) -> Kv {
    (k.to_owned(), v.to_owned(), version)
}

fn bounds() -> Bounds {
    Bounds::new("n1", 7, 4, INTERVAL)
}

/// This node's own max_version in these tests.
const OWN: u64 = 50;

impl Bounds {
    fn check_own(&self, d: &[u8]) -> Result<Option<(u64, u64)>, BoundsError> {
        self.check(d, OWN)
    }
    fn check_at_own(&self, d: &[u8], now: Instant) -> Result<Option<(u64, u64)>, BoundsError> {
        self.check_at(d, OWN, now)
    }
}

const INTERVAL: Duration = Duration::from_millis(100);

#[test]
fn honest_messages_pass() {
    let b = bounds();
    assert_eq!(
        b.check_own(&ack(&[("n2", 1, vec![kv("status", "serving", 3)])])),
        Ok(None)
    );
    let mut syn = W::header(0);
    syn.0.extend(1u16.to_le_bytes());
    syn.id("n2", 1).u64(5).u64(0).u64(9).str("cluster");
    assert_eq!(b.check_own(&syn.0), Ok(None));
    assert_eq!(b.check_own(&W::header(3).0), Ok(None));
    // An older generation of this node is another member.
    assert_eq!(
        b.check_own(&ack(&[("n1", 6, vec![kv("load", "1", 2)])])),
        Ok(None)
    );
}

#[test]
fn counters_past_2_pow_40_are_refused() {
    let b = bounds();
    for v in [MAX_COUNTER + 1, 1 << 62, u64::MAX] {
        let e = b
            .check_own(&ack(&[("n2", 1, vec![kv("load", "1", v)])]))
            .unwrap_err();
        assert!(
            matches!(
                e,
                BoundsError::TooLarge {
                    what: "version",
                    ..
                }
            ),
            "{e}"
        );
        let mut syn_ack = W::header(1);
        syn_ack.0.extend(1u16.to_le_bytes());
        syn_ack.id("n2", 1).u64(v).u64(0).u64(1);
        syn_ack.0.extend(delta(&[]));
        let e = b.check_own(&syn_ack.0).unwrap_err();
        assert!(
            matches!(
                e,
                BoundsError::TooLarge {
                    what: "heartbeat",
                    ..
                }
            ),
            "{e}"
        );
    }
    assert_eq!(
        b.check_own(&ack(&[("n2", 1, vec![kv("l", "1", MAX_COUNTER)])])),
        Ok(None)
    );
}

#[test]
fn lengths_and_counts_are_bounded() {
    let b = bounds();
    let long = |n| "x".repeat(n);
    let e = b.check_own(&ack(&[(&long(64), 1, vec![])])).unwrap_err();
    assert!(matches!(
        e,
        BoundsError::TooLarge {
            what: "node id length",
            ..
        }
    ));
    let e = b
        .check_own(&ack(&[("n2", 1, vec![kv(&long(65), "v", 1)])]))
        .unwrap_err();
    assert!(matches!(
        e,
        BoundsError::TooLarge {
            what: "key length",
            ..
        }
    ));
    let e = b
        .check_own(&ack(&[("n2", 1, vec![kv("k", &long(257), 1)])]))
        .unwrap_err();
    assert!(matches!(
        e,
        BoundsError::TooLarge {
            what: "value length",
            ..
        }
    ));
    let many: Vec<_> = (0..=MAX_KEYS_PER_NODE)
        .map(|i| kv(&format!("k{i}"), "v", 1))
        .collect();
    let e = b.check_own(&ack(&[("n2", 1, many)])).unwrap_err();
    assert!(matches!(
        e,
        BoundsError::TooLarge {
            what: "keys of a node",
            ..
        }
    ));
    let names: Vec<String> = (0..5).map(|i| format!("g{i}")).collect();
    let ghosts: Vec<_> = names.iter().map(|n| (n.as_str(), 1, vec![])).collect();
    let e = b.check_own(&ack(&ghosts)).unwrap_err();
    assert!(matches!(
        e,
        BoundsError::TooLarge {
            what: "members",
            ..
        }
    ));
    assert_eq!(b.check_own(&ack(&ghosts[..4])), Ok(None));
}

#[test]
fn a_delta_about_this_node_past_its_own_versions_is_refused_a_stale_one_passes() {
    let e = bounds()
        .check_own(&ack(&[("n1", 7, vec![kv("status", "leaving", OWN + 1)])]))
        .unwrap_err();
    assert_eq!(e, BoundsError::AboutSelf);
    // An honest peer answering a stale digest (chitchat rejects it).
    assert_eq!(
        bounds().check_own(&ack(&[("n1", 7, vec![kv("load", "3", OWN)])])),
        Ok(None)
    );
}

#[test]
fn malformed_bytes_are_refused_never_panic() {
    let b = bounds();
    let good = ack(&[("n2", 1, vec![kv("status", "serving", 3)])]);
    for n in 0..good.len() {
        assert!(b.check_own(&good[..n]).is_err(), "truncated at {n}");
    }
    let mut v1 = good.clone();
    v1[2] = 1;
    assert!(matches!(b.check_own(&v1), Err(BoundsError::Malformed(_))));
    let mut junk = good.clone();
    junk[4] = 9;
    assert!(b.check_own(&junk).is_err());
    // Arbitrary bytes: an error or Ok, never a panic.
    let mut x: u64 = 1;
    for _ in 0..2000 {
        let mut d = good.clone();
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let i = (x >> 33) as usize % d.len();
        d[i] = (x >> 17) as u8;
        let _ = b.check_own(&d);
    }
}

#[test]
fn compressed_blocks_are_read() {
    let plain = delta(&[("n2", 1, vec![kv("load", "1", u64::MAX)])]);
    // The ops of the plain block, recompressed as a zstd block.
    let ops = &plain[3..plain.len() - 1];
    let z = zstd::bulk::compress(ops, 1).unwrap();
    let mut m = W::header(2).0;
    m.push(1);
    m.extend((z.len() as u16).to_le_bytes());
    m.extend(z);
    m.push(0);
    let e = bounds().check_own(&m).unwrap_err();
    assert!(
        matches!(
            e,
            BoundsError::TooLarge {
                what: "version",
                ..
            }
        ),
        "{e}"
    );
}

/// A SynAck whose digest gives `node` of generation 1 `heartbeat` and
/// `max_version`.
fn syn_ack(node: &str, heartbeat: u64, max_version: u64) -> Vec<u8> {
    let mut w = W::header(1);
    w.0.extend(1u16.to_le_bytes());
    w.id(node, 1).u64(heartbeat).u64(0).u64(max_version);
    w.0.extend(delta(&[]));
    w.0
}

#[test]
fn a_known_members_heartbeat_or_version_jumping_ahead_is_refused() {
    let b = bounds();
    let t0 = Instant::now();
    // First sight: absolute bounds only.
    assert_eq!(b.check_at_own(&syn_ack("n2", 1000, 50), t0), Ok(None));
    let step = HEARTBEATS_PER_ROUND * SLACK_ROUNDS;
    // Within the allowance at once; a jump of 2^30 is refused.
    assert_eq!(
        b.check_at_own(&syn_ack("n2", 1000 + step, 50), t0),
        Ok(None)
    );
    let e = b
        .check_at_own(&syn_ack("n2", 1000 + step + (1 << 30), 50), t0)
        .unwrap_err();
    assert!(
        matches!(&e, BoundsError::Jump { what: "heartbeat", node, .. } if node == "n2"),
        "{e}"
    );
    // The allowance was spent: one step more at once is refused, and
    // passes once the rounds that earn it went by (a refused datagram
    // moved nothing).
    assert!(matches!(
        b.check_at_own(&syn_ack("n2", 1000 + 2 * step, 50), t0),
        Err(BoundsError::Jump {
            what: "heartbeat",
            ..
        })
    ));
    let t0 = t0 + INTERVAL * SLACK_ROUNDS as u32;
    assert_eq!(
        b.check_at_own(&syn_ack("n2", 1000 + 2 * step, 50), t0),
        Ok(None)
    );
    let e = b
        .check_at_own(&syn_ack("n2", 1000 + 2 * step, 50 + (1 << 30)), t0)
        .unwrap_err();
    assert!(
        matches!(
            e,
            BoundsError::Jump {
                what: "version",
                ..
            }
        ),
        "{e}"
    );
    // A delta's versions count as the member's versions.
    let e = b
        .check_at_own(&ack(&[("n2", 1, vec![kv("load", "1", 1 << 30)])]), t0)
        .unwrap_err();
    assert!(
        matches!(
            e,
            BoundsError::Jump {
                what: "version",
                ..
            }
        ),
        "{e}"
    );
    // Another generation is another member.
    assert_eq!(
        b.check_at_own(&ack(&[("n2", 2, vec![kv("load", "1", 1 << 30)])]), t0),
        Ok(None)
    );
    // Silence widens the allowance: a member cut off for 1,000 rounds
    // is taken back with what it did meanwhile.
    let later = t0 + INTERVAL * 1000;
    let h = 1000 + 2 * step + 1000 * HEARTBEATS_PER_ROUND;
    assert_eq!(
        b.check_at_own(&syn_ack("n2", h, 50 + 1000 * VERSIONS_PER_ROUND), later),
        Ok(None)
    );
}

#[test]
fn this_nodes_own_figures_in_a_digest_are_not_judged_but_handed_on() {
    let b = bounds();
    let t0 = Instant::now();
    let mut w = W::header(1);
    w.0.extend(1u16.to_le_bytes());
    w.id("n1", 7).u64(1 << 30).u64(0).u64(1 << 30);
    w.0.extend(delta(&[]));
    assert_eq!(b.check_at_own(&w.0, t0), Ok(Some((1 << 30, 1 << 30))));
    assert!(b.known.lock().unwrap().is_empty());
}

#[test]
fn the_memory_of_members_is_bounded() {
    let b = Bounds::new("n1", 7, DEFAULT_MAX_MEMBERS, INTERVAL);
    let cap = KNOWN_PER_MEMBER * DEFAULT_MAX_MEMBERS;
    let t0 = Instant::now();
    for i in 0..(cap + 10) {
        let at = t0 + Duration::from_millis(i as u64);
        assert_eq!(
            b.check_at_own(&syn_ack(&format!("g{i}"), 5, 5), at),
            Ok(None)
        );
    }
    {
        let known = b.known.lock().unwrap();
        assert_eq!(known.len(), cap);
        // Full of members heard lately: the newcomers were not remembered.
        assert!(known.contains_key(&("g0".to_owned(), 1)));
        assert!(!known.contains_key(&(format!("g{cap}"), 1)));
    }
    // Once the oldest went unheard for FORGET_AFTER_ROUNDS, a newcomer
    // takes its place.
    let later = t0 + INTERVAL * FORGET_AFTER_ROUNDS;
    assert_eq!(b.check_at_own(&syn_ack("new", 5, 5), later), Ok(None));
    let known = b.known.lock().unwrap();
    assert_eq!(known.len(), cap);
    assert!(!known.contains_key(&("g0".to_owned(), 1)));
    assert!(known.contains_key(&("new".to_owned(), 1)));
}

/// The attack of the review of issue 34: name 512 made-up members to make
/// this node forget a real one, then give the real one a heartbeat near
/// 2^40 (taken as a new member's, it froze the member for good). A member
/// named every round is never forgotten for made-up ones.
#[test]
fn a_flood_of_made_up_members_does_not_make_this_node_forget_a_real_one() {
    let b = Bounds::new("n1", 7, DEFAULT_MAX_MEMBERS, INTERVAL);
    let t0 = Instant::now();
    let mut at = t0;
    for round in 0..10u32 {
        at = t0 + INTERVAL * round;
        // The real member, named by honest digests every round ...
        assert_eq!(
            b.check_at_own(&syn_ack("n2", 100 + u64::from(round), 5), at),
            Ok(None)
        );
        // ... and 600 made-up ones a round, in datagrams of 120 heard
        // after it.
        for d in 0..5 {
            at += Duration::from_millis(1);
            let mut w = W::header(1);
            w.0.extend(120u16.to_le_bytes());
            for i in 0..120 {
                w.id(&format!("ghost-{round}-{d}-{i}"), 1)
                    .u64(5)
                    .u64(0)
                    .u64(5);
            }
            w.0.extend(delta(&[]));
            assert_eq!(b.check_at_own(&w.0, at), Ok(None));
        }
    }
    assert!(matches!(
        b.check_at_own(&syn_ack("n2", (1 << 40) - 1, 5), at),
        Err(BoundsError::Jump {
            what: "heartbeat",
            ..
        })
    ));
}

/// A key holder sending a datagram every tenth of a round for 100
/// rounds, each moving a live member's heartbeat as far ahead as it is
/// let, gains the budget of those 100 rounds, not one allowance per
/// datagram (1,000 of them before).
#[test]
fn a_key_holders_datagrams_share_one_budget_per_member() {
    let b = bounds();
    let per_round = heartbeats_per_round(4);
    let t0 = Instant::now();
    assert_eq!(b.check_at_own(&syn_ack("n2", 1000, 50), t0), Ok(None));
    let mut accepted = 1000;
    for tick in 1..=1000u32 {
        let at = t0 + INTERVAL / 10 * tick;
        // The largest lead taken: try a full allowance, then less.
        for lead in [per_round * SLACK_ROUNDS, per_round, per_round / 10] {
            if b.check_at_own(&syn_ack("n2", accepted + lead, 50), at)
                .is_ok()
            {
                accepted += lead;
                break;
            }
        }
    }
    let most = 1000 + per_round * (SLACK_ROUNDS + 100);
    assert!(accepted <= most, "moved to {accepted}, more than {most}");
    assert!(
        accepted >= 1000 + per_round * 90,
        "{accepted}: honest pace refused"
    );
}

#[test]
fn the_heartbeat_lead_grows_with_the_cap() {
    assert_eq!(
        heartbeats_per_round(DEFAULT_MAX_MEMBERS),
        HEARTBEATS_PER_ROUND
    );
    assert_eq!(heartbeats_per_round(2), HEARTBEATS_PER_ROUND);
    assert_eq!(heartbeats_per_round(1000), 2048);
}
