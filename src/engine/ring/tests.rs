//! Ring tests: cases C1-C4 with their exact assertions, the balance and
//! movement goals of the ring-quality issue, rebuilds, failover order, and
//! bounded loads.
//!
//! Case codes (C1, C2, C4, C6) name cases of `docs/cases.md`: the input, the
//! value peerlb must give, and where it is tested.

use super::*;
use proptest::prelude::*;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};

/// Random keys per sampling test, as in cases C1/C2 (about 1 s in debug).
const KEYS: usize = 1_000_000;

fn ids(names: &[&str]) -> Vec<(NodeId, u32)> {
    names.iter().map(|n| (NodeId::from(*n), 100)).collect()
}

fn named(n: usize, name: impl Fn(usize) -> String) -> Vec<(NodeId, u32)> {
    (0..n).map(|i| (NodeId::from(name(i)), 100)).collect()
}

fn ten() -> Vec<(NodeId, u32)> {
    named(10, |i| format!("node-{i}"))
}

fn without(nodes: &[(NodeId, u32)], id: &str) -> Vec<(NodeId, u32)> {
    nodes.iter().filter(|(n, _)| &**n != id).cloned().collect()
}

/// Counts owners of `n` random keys (fixed seed).
fn count_owners(ring: &Ring, n: usize, seed: u64) -> BTreeMap<NodeId, usize> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut counts = BTreeMap::new();
    for _ in 0..n {
        let key = format!("k{:016x}", rng.next_u64());
        *counts.entry(ring.owner(&key).unwrap().clone()).or_insert(0) += 1;
    }
    counts
}

/// The owner id of every slot.
fn owners(ring: &Ring) -> Vec<&str> {
    ring.table
        .iter()
        .map(|&o| &*ring.nodes[o as usize])
        .collect()
}

/// The first point of slot `s`.
fn point_of(ring: &Ring, s: usize) -> u64 {
    (s as u64) << (64 - ring.bits)
}

fn max_over_mean(ring: &Ring) -> f64 {
    let shares = ring.shares();
    let max = shares.iter().map(|s| s.1).fold(0.0, f64::max);
    max * shares.len() as f64
}

const C1_IDS: [&str; 6] = [
    "10.0.0.1:55",
    "10.0.0.1:555",
    "s1:1",
    "s1:11",
    "s2:2",
    "s2:5",
];

#[test]
fn c1_hash_inputs_per_node_and_slot_are_distinct() {
    // The node seed's input is `len ++ id`: injective, so the naive
    // `id ++ index` collision (`10.0.0.1:55` + `5` = `10.0.0.1:555`) cannot
    // happen, and a (node, slot) input is (seed, 4-byte slot).
    let (a, b) = (hrw::node_seed("10.0.0.1:55"), hrw::node_seed("10.0.0.1:5"));
    assert_ne!(a, b);
    assert_ne!(hrw::score(a, 5), hrw::score(b, 55));
    let seeds: BTreeSet<u64> = C1_IDS.iter().map(|id| hrw::node_seed(id)).collect();
    assert_eq!(seeds.len(), 6);
    let ring = Ring::build(&ids(&C1_IDS), 100);
    assert_eq!(ring.len(), 1 << 15);
    // No two nodes ever draw the same score for a slot.
    for s in 0..ring.len() as u32 {
        let us: BTreeSet<u64> = ring.keys.iter().map(|&k| hrw::score(k, s)).collect();
        assert_eq!(us.len(), 6, "slot {s}");
    }
}

#[test]
fn c1_shares_within_20_percent_of_mean() {
    let ring = Ring::build(&ids(&C1_IDS), 100);
    assert_eq!(ring.node_count(), 6);
    let n = KEYS;
    let counts = count_owners(&ring, n, 1);
    assert_eq!(counts.len(), 6);
    let mean = n as f64 / 6.0;
    for (id, c) in &counts {
        let r = *c as f64 / mean;
        assert!((0.8..=1.2).contains(&r), "{id}: {r:.3}");
    }
    // The exact shares agree.
    for (id, s) in ring.shares() {
        assert!((0.8..=1.2).contains(&(s * 6.0)), "{id}: {s:.4}");
    }
}

#[test]
fn c2_one_of_ten_leaves_only_its_keys_move() {
    let all = ten();
    let before = Ring::build(&all, DEFAULT_VNODES);
    let leaving: NodeId = NodeId::from("node-3");
    let after = Ring::build(&without(&all, "node-3"), DEFAULT_VNODES);
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(2);
    let n = KEYS;
    let (mut moved, mut wrongly_moved) = (0usize, 0usize);
    for _ in 0..n {
        let key = format!("k{:016x}", rng.next_u64());
        let (b, a) = (before.owner(&key).unwrap(), after.owner(&key).unwrap());
        if b != a {
            moved += 1;
            if *b != leaving {
                wrongly_moved += 1;
            }
        }
        assert_ne!(*a, leaving);
    }
    assert_eq!(wrongly_moved, 0);
    let frac = moved as f64 / n as f64;
    assert!((frac - 0.1).abs() <= 0.01, "moved {frac:.4}");
    // Exhaustively, over every slot: only node-3's slots changed owner.
    let (b, a) = (owners(&before), owners(&after));
    let changed = b.iter().zip(&a).filter(|(x, y)| x != y).count();
    assert!(b.iter().zip(&a).all(|(x, y)| x == y || *x == "node-3"));
    assert_eq!(changed, b.iter().filter(|x| **x == "node-3").count());
    assert!((changed as f64 / b.len() as f64 - 0.1).abs() <= 0.01);
}

#[test]
fn c3_a_joining_node_takes_about_one_nth_and_only_from_others() {
    let nine: Vec<_> = ten().into_iter().take(9).collect();
    let before = Ring::build(&nine, DEFAULT_VNODES);
    let after = Ring::build(&ten(), DEFAULT_VNODES);
    let share = after
        .shares()
        .into_iter()
        .find(|(id, _)| &**id == "node-9")
        .unwrap()
        .1;
    assert!((share - 0.1).abs() <= 0.01, "{share}");
    let (b, a) = (owners(&before), owners(&after));
    assert!(b.iter().zip(&a).all(|(x, y)| x == y || *y == "node-9"));
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(3);
    for _ in 0..20_000 {
        let key = format!("k{:016x}", rng.next_u64());
        let (b, a) = (before.owner(&key).unwrap(), after.owner(&key).unwrap());
        assert!(b == a || &**a == "node-9");
    }
}

#[test]
fn default_vnodes_balance_ten_equal_nodes() {
    let ring = Ring::build(&ten(), DEFAULT_VNODES);
    assert_eq!(ring.len(), 1 << 18);
    let total: f64 = ring.shares().iter().map(|s| s.1).sum();
    assert!((total - 1.0).abs() < 1e-9);
    // Change detector, not an independent check: the figure was read off
    // this code. It pins the exact share over all slots, which moves only if
    // the hash or the table size changes (the independent goal is the
    // sampled 1.03 below).
    assert_eq!(format!("{:.4}", max_over_mean(&ring)), GOLDEN_MAX_OVER_MEAN);
    // Sampled over 1M keys: the 1.03 goal.
    let counts = count_owners(&ring, KEYS, 1);
    let sampled = *counts.values().max().unwrap() as f64 / (KEYS as f64 / 10.0);
    assert!(sampled <= 1.03, "{sampled:.4}");
}

/// Change detector: max/mean of 10 equal nodes at the default size, as this
/// code computed it (not derived independently).
const GOLDEN_MAX_OVER_MEAN: &str = "1.0089";

#[test]
fn balance_holds_for_other_id_sets() {
    let sets: [fn(usize) -> String; 6] = [
        |i| format!("n{i}"),
        |i| format!("10.0.0.{i}:7000"),
        |i| format!("web-0{i}"),
        |i| format!("s{i}"),
        |i| format!("host{i}.example.com"),
        |i| format!("10.1.{i}.1:443"),
    ];
    for name in sets {
        let ring = Ring::build(&named(10, name), DEFAULT_VNODES);
        let r = max_over_mean(&ring);
        assert!(r <= 1.02, "{}: {r:.4}", name(0));
    }
}

#[test]
fn slot_count_follows_vnodes() {
    assert_eq!(slot_bits(1024), 18);
    assert_eq!(slot_bits(1000), 18);
    assert_eq!(slot_bits(100), 15);
    assert_eq!(slot_bits(4), 10);
    assert_eq!(slot_bits(1), 8);
    assert_eq!(slot_bits(0), 8);
    assert_eq!(slot_bits(4096), 20);
    assert_eq!(slot_bits(u32::MAX), 24);
    assert_eq!(Ring::build(&ids(&["a"]), 4).len(), 1024);
}

#[test]
fn weights_scale_shares() {
    let nodes = vec![
        (NodeId::from("a"), 50),
        (NodeId::from("b"), 100),
        (NodeId::from("c"), 100),
        (NodeId::from("z"), 0),
    ];
    let ring = Ring::build(&nodes, DEFAULT_VNODES);
    assert_eq!(ring.node_count(), 3);
    let counts = count_owners(&ring, KEYS / 4, 4);
    assert!(!counts.contains_key("z"));
    let a = counts["a"] as f64;
    for other in ["b", "c"] {
        let r = a / counts[other] as f64;
        assert!((0.45..=0.55).contains(&r), "a/{other} = {r:.3}");
    }
    // Exact shares of weights 1, 2, 3, 4 within 2 % of w / 10.
    let ring = Ring::build(
        &[
            ("w1".into(), 1),
            ("w2".into(), 2),
            ("w3".into(), 3),
            ("w4".into(), 4),
        ],
        DEFAULT_VNODES,
    );
    for ((id, s), w) in ring.shares().into_iter().zip([1.0, 2.0, 3.0, 4.0]) {
        let r = s / (w / 10.0);
        assert!((0.98..=1.02).contains(&r), "{id}: {r:.4}");
    }
}

#[test]
fn empty_ring() {
    let ring = Ring::build(&[], DEFAULT_VNODES);
    assert!(ring.is_empty());
    assert_eq!(ring.len(), 0);
    assert_eq!(ring.owner("x"), None);
    assert_eq!(ring.owner_of_point(0), None);
    assert_eq!(ring.candidates("x").count(), 0);
    assert_eq!(ring.candidates("x").len(), 0);
    assert!(ring.shares().is_empty());
    let zero = Ring::build(&[(NodeId::from("a"), 0)], DEFAULT_VNODES);
    assert!(zero.is_empty());
    assert_eq!(zero.node_count(), 0);
    assert_eq!(
        ring.rebuild(&ids(&["a"]), 16),
        Ring::build(&ids(&["a"]), 16)
    );
    assert_eq!(
        Ring::build(&ids(&["a"]), 16).rebuild(&[], 16),
        Ring::build(&[], 16)
    );
}

#[test]
fn duplicate_ids_keep_largest_weight() {
    let a = Ring::build(
        &[
            (NodeId::from("a"), 50),
            (NodeId::from("a"), 100),
            (NodeId::from("b"), 100),
        ],
        16,
    );
    let b = Ring::build(&[(NodeId::from("b"), 100), (NodeId::from("a"), 100)], 16);
    assert_eq!(a, b);
}

#[test]
fn the_table_holds_the_first_ranked_node_of_every_slot() {
    let nodes = vec![
        (NodeId::from("a"), 50),
        (NodeId::from("b"), 100),
        (NodeId::from("c"), 100),
        (NodeId::from("d"), 300),
    ];
    let ring = Ring::build(&nodes, 8);
    for s in 0..ring.len() as u32 {
        let best = (0..4)
            .map(|i| ring.contender(i, s))
            .min_by(|x, y| x.cmp_rank(y))
            .unwrap();
        assert_eq!(u32::from(ring.table[s as usize]), best.index, "slot {s}");
    }
}

#[test]
fn candidates_are_the_rank_order_of_the_slot() {
    let mixed = vec![
        (NodeId::from("a"), 50),
        (NodeId::from("b"), 100),
        (NodeId::from("c"), 100),
        (NodeId::from("d"), 300),
        (NodeId::from("e"), 100),
    ];
    for nodes in [mixed, ten()] {
        let ring = Ring::build(&nodes, 8);
        for s in (0..ring.len()).step_by(37) {
            let mut want: Vec<Contender> = (0..ring.node_count() as u32)
                .map(|i| ring.contender(i, s as u32))
                .collect();
            want.sort_by(|x, y| x.cmp_rank_exact(y));
            let want: Vec<&NodeId> = want.iter().map(|c| &ring.nodes[c.index as usize]).collect();
            let got: Vec<&NodeId> = ring.candidates_of_point(point_of(&ring, s)).collect();
            assert_eq!(got, want, "slot {s}");
        }
    }
}

#[test]
fn candidates_rank_nothing_until_asked_and_sort_only_past_the_scanned_ones() {
    let ring = Ring::build(&ten(), 8);
    let mut it = ring.candidates("k");
    // Owner and the scanned candidates: no ranking of the rest.
    for _ in 0..=SCANNED_CANDIDATES {
        assert!(it.next().is_some());
        assert!(it.rest.is_empty());
    }
    // The next one ranks the remaining nodes once.
    assert!(it.next().is_some());
    assert_eq!(it.rest.len(), 10 - SCANNED_CANDIDATES - 2);
    assert_eq!(it.count(), 10 - SCANNED_CANDIDATES - 2);
}

#[test]
fn candidates_are_distinct_owner_first_and_cover_all() {
    let ring = Ring::build(&ten(), 64);
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(5);
    for _ in 0..2_000 {
        let key = format!("k{}", rng.next_u64());
        let c: Vec<&NodeId> = ring.candidates(&key).collect();
        assert_eq!(c.len(), 10);
        assert_eq!(c[0], ring.owner(&key).unwrap());
        let set: BTreeSet<_> = c.iter().collect();
        assert_eq!(set.len(), 10);
        let mut it = ring.candidates(&key);
        assert_eq!(it.len(), 10);
        it.next();
        assert_eq!(it.len(), 9);
    }
}

#[test]
fn c6_the_next_candidate_is_the_owner_without_the_first() {
    // The property tests/cluster.rs C6 relies on: `candidates(key).nth(1)`
    // is the owner on the ring rebuilt without the owner, and the rest of
    // the order is kept, with equal and with mixed weights.
    let mixed: Vec<(NodeId, u32)> = ten()
        .into_iter()
        .enumerate()
        .map(|(i, (id, _))| (id, 50 + 25 * (i as u32 % 4)))
        .collect();
    for nodes in [ten(), mixed] {
        let ring = Ring::build(&nodes, 64);
        for key in ["alpha", "beta", "gamma", "delta", "u1", "u7"] {
            let c: Vec<NodeId> = ring.candidates(key).cloned().collect();
            let smaller = Ring::build(&without(&nodes, &c[0]), 64);
            assert_eq!(smaller.owner(key), Some(&c[1]));
            assert_eq!(ring.candidates(key).nth(1), Some(&c[1]));
            let rest: Vec<NodeId> = smaller.candidates(key).cloned().collect();
            assert_eq!(rest, c[1..].to_vec());
        }
    }
    // As in tests/cluster.rs C6: three nodes, default table, n3 dies.
    let three = ids(&["n1", "n2", "n3"]);
    let ring = Ring::build(&three, 1024);
    let after = Ring::build(&without(&three, "n3"), 1024);
    let mut checked = 0;
    for u in (0..200).map(|i| format!("u{i}")) {
        if &**ring.owner(&u).unwrap() == "n3" {
            assert_eq!(ring.candidates(&u).nth(1), after.owner(&u));
            checked += 1;
        }
    }
    assert!(checked > 20);
}

#[test]
fn candidates_on_large_rings_cover_all() {
    let many = named(300, |i| format!("n{i}"));
    let ring = Ring::build(&many, 1);
    let c: BTreeSet<_> = ring.candidates("k").collect();
    assert_eq!(c.len(), 300);
}

#[test]
fn c5_lookups_are_deterministic_golden() {
    // Change detectors: the golden values were recorded from this code, not
    // derived independently (`hash_key("")` is xxh3_64 of the empty input,
    // checkable against the xxh3 reference). They pin the hashes and the
    // table layout: changing either moves keys across a rolling upgrade,
    // which must be a deliberate decision.
    assert_eq!(hash_key(""), 0x2d06800538d394c2);
    assert_eq!(hrw::node_seed("n1"), xxh3_64(b"\x02\0\0\0\0\0\0\0n1"));
    let keys = ["a", "b", "c", "d", "e", "f", "g", "h"];
    let ring = Ring::build(&ids(&["n1", "n2", "n3"]), 160);
    let got: Vec<&str> = keys.iter().map(|k| &**ring.owner(k).unwrap()).collect();
    let again = Ring::build(&ids(&["n3", "n1", "n2"]), 160);
    let got2: Vec<&str> = keys.iter().map(|k| &**again.owner(k).unwrap()).collect();
    assert_eq!(got, got2);
    assert_eq!(got, GOLDEN_OWNERS);
    let order: Vec<&str> = ring.candidates("a").map(|n| &**n).collect();
    assert_eq!(order, GOLDEN_ORDER_A);
    let order: Vec<&str> = ring.candidates("b").map(|n| &**n).collect();
    assert_eq!(order, GOLDEN_ORDER_B);
}

/// Change detector (recorded from this code): owners of keys a..h.
const GOLDEN_OWNERS: [&str; 8] = ["n1", "n3", "n1", "n2", "n1", "n3", "n2", "n1"];
const GOLDEN_ORDER_A: [&str; 3] = ["n1", "n2", "n3"];
const GOLDEN_ORDER_B: [&str; 3] = ["n3", "n1", "n2"];

#[test]
fn rebuild_equals_build_for_joins_leaves_and_reweights() {
    let base = ten();
    let ring = Ring::build(&base, 64);
    let mut joined = base.clone();
    joined.push(("node-10".into(), 100));
    let mut reweighted = base.clone();
    reweighted[4].1 = 250;
    let mut mixed = without(&base, "node-2");
    mixed.push(("zz".into(), 70));
    let cases: Vec<(Vec<(NodeId, u32)>, u32)> = vec![
        (without(&base, "node-3"), 64),
        (joined, 64),
        (reweighted, 64),
        (mixed, 64),
        (base.clone(), 64),
        (base.clone(), 128),
        (base[..2].to_vec(), 64),
        (ids(&["x", "y"]), 64),
    ];
    for (nodes, vnodes) in cases {
        assert_eq!(ring.rebuild(&nodes, vnodes), Ring::build(&nodes, vnodes));
    }
}

fn loads_of<'a>(pairs: &'a [(&'a str, u64)]) -> impl Fn(&NodeId) -> u64 + 'a {
    move |id: &NodeId| pairs.iter().find(|p| p.0 == &**id).map_or(0, |p| p.1)
}

#[test]
fn bounded_load_passes_over_hot_nodes_in_ring_order() {
    let ring = Ring::build(&ids(&["n1", "n2", "n3"]), 64);
    let plain: Vec<NodeId> = ring.candidates("k").cloned().collect();
    let [first, second, third] = [&*plain[0], &*plain[1], &*plain[2]];
    // Balanced: 10 in flight total, c = 1.25: slots ceil(11 * 1.25) = 14,
    // split 4 / 5 / 5 by cumulative weight in id order.
    let even = [(first, 3), (second, 3), (third, 4)];
    let (c, skipped) = ring.bounded_candidates("k", 125, loads_of(&even));
    assert_eq!((c, skipped), (plain.clone(), 0));
    // The owner is hot: it is passed over for the next node on the ring.
    let hot = [(first, 9), (second, 1), (third, 0)];
    let (c, skipped) = ring.bounded_candidates("k", 125, loads_of(&hot));
    assert_eq!(skipped, 1);
    assert_eq!(c, [plain[1].clone(), plain[0].clone(), plain[2].clone()]);
    // Owner and successor hot: the third.
    let hot2 = [(first, 9), (second, 9), (third, 0)];
    let (c, skipped) = ring.bounded_candidates("k", 125, loads_of(&hot2));
    assert_eq!(skipped, 2);
    assert_eq!(c, [plain[2].clone(), plain[0].clone(), plain[1].clone()]);
    // A huge factor never passes over.
    let (c, _) = ring.bounded_candidates("k", 100_000, loads_of(&hot2));
    assert_eq!(c, plain);
    // Idle cluster: every node has at least one slot.
    let (c, _) = ring.bounded_candidates("k", 100, |_| 0);
    assert_eq!(c, plain);
    assert_eq!(
        Ring::build(&[], 8).bounded_candidates("k", 125, |_| 0),
        (vec![], 0)
    );
}

#[test]
fn bounded_load_keeps_every_node_within_c_times_average() {
    // 10 nodes, 20 000 keys placed one by one with their load counted
    // (nothing finishes): no node exceeds ceil(1.25 * average) + 1.
    let ring = Ring::build(&ten(), 64);
    let mut load: BTreeMap<NodeId, u64> = BTreeMap::new();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(9);
    let mut spilled = 0;
    for placed in 0..20_000u64 {
        let key = format!("k{:016x}", rng.next_u64());
        let (c, skipped) =
            ring.bounded_candidates(&key, 125, |id| load.get(id).copied().unwrap_or(0));
        spilled += usize::from(skipped > 0);
        *load.entry(c[0].clone()).or_insert(0) += 1;
        let max = *load.values().max().unwrap();
        assert!(
            max as f64 <= (1.25 * (placed + 1) as f64 / 10.0).ceil() + 1.0,
            "{max} after {placed}"
        );
    }
    assert!(spilled > 0);
}

fn arb_nodes(max: usize) -> impl Strategy<Value = Vec<(NodeId, u32)>> {
    proptest::collection::btree_map(
        "[a-z0-9.:]{1,8}",
        prop_oneof![Just(100u32), 1u32..300],
        1..max,
    )
    .prop_map(|m| m.into_iter().map(|(k, w)| (NodeId::from(k), w)).collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// C4: any permutation of the same members gives the same ring and
    /// the same owner and candidates for every key.
    #[test]
    fn c4_input_order_is_irrelevant(
        perm in Just((0..8usize).collect::<Vec<_>>()).prop_shuffle(),
        keys in proptest::collection::vec(".{0,12}", 1..20),
    ) {
        let base: Vec<(NodeId, u32)> = (0..8)
            .map(|i| (NodeId::from(format!("10.0.0.{i}:{}", 5000 + i)), 50 + 10 * i as u32))
            .collect();
        let shuffled: Vec<_> = perm.iter().map(|&i| base[i].clone()).collect();
        let a = Ring::build(&base, 32);
        let b = Ring::build(&shuffled, 32);
        prop_assert_eq!(&a, &b);
        for k in &keys {
            prop_assert_eq!(a.owner(k), b.owner(k));
            prop_assert!(a.candidates(k).eq(b.candidates(k)));
        }
    }

    /// Only the leaving node's slots move, each to its second candidate.
    #[test]
    fn only_the_leaving_nodes_keys_move(nodes in arb_nodes(12), pick in any::<usize>()) {
        prop_assume!(nodes.len() >= 2);
        let leaving = nodes[pick % nodes.len()].0.clone();
        let before = Ring::build(&nodes, 8);
        let after = Ring::build(&without(&nodes, &leaving), 8);
        for (s, (b, a)) in owners(&before).into_iter().zip(owners(&after)).enumerate() {
            prop_assert_ne!(a, &*leaving);
            if b == &*leaving {
                let next = before.candidates_of_point(point_of(&before, s)).nth(1);
                prop_assert_eq!(next.map(|n| &**n), Some(a));
            } else {
                prop_assert_eq!(a, b);
            }
        }
        prop_assert_eq!(before.rebuild(&without(&nodes, &leaving), 8), after);
    }

    /// A joining node takes slots only from others (no slot moves between
    /// two old nodes).
    #[test]
    fn a_joining_node_takes_keys_only_from_others(
        nodes in arb_nodes(12),
        weight in prop_oneof![Just(100u32), 1u32..300],
    ) {
        let joiner = NodeId::from("joiner-0");
        let before = Ring::build(&nodes, 8);
        let mut more = nodes.clone();
        more.push((joiner.clone(), weight));
        let after = Ring::build(&more, 8);
        let mut taken = 0usize;
        for (b, a) in owners(&before).into_iter().zip(owners(&after)) {
            if a != b {
                prop_assert_eq!(a, &*joiner);
                taken += 1;
            }
        }
        // The joiner wins each slot with probability w / (W + w), so it
        // may take none when its share is a few slots (weight 1 of 344
        // over 2,048 slots: about 6 expected, none in 1 of 400 draws).
        // Asked only where none would be a 1-in-e^20 event.
        let total: u32 = nodes.iter().map(|(_, w)| w).sum::<u32>() + weight;
        let expected = owners(&after).len() as f64 * f64::from(weight) / f64::from(total);
        if expected >= 20.0 {
            prop_assert!(taken > 0, "the joiner took no slot of {expected:.1} expected");
        }
        prop_assert_eq!(before.rebuild(&more, 8), after);
    }

    /// An incremental rebuild from any ring equals a full build.
    #[test]
    fn rebuild_from_any_previous_ring_equals_build(
        old in arb_nodes(10),
        new in arb_nodes(10),
        keep in proptest::collection::vec(any::<bool>(), 10),
    ) {
        // Overlap the two sets: some old nodes stay (some reweighted).
        let mut next = new.clone();
        for ((id, w), k) in old.iter().zip(&keep) {
            if *k {
                next.push((id.clone(), *w));
            }
        }
        let prev = Ring::build(&old, 8);
        prop_assert_eq!(prev.rebuild(&next, 8), Ring::build(&next, 8));
    }
}

/// HAProxy's `chash_server_is_eligible` (src/lb_chash.c), transliterated:
/// `tot_slots = ((served + 1) * hash_balance_factor + 99) / 100`, a whole
/// number of slots per weight unit plus the node's part of the remainder by
/// cumulative weight, at least 1; eligible while `served < slots`.
/// `nodes` is in the ring's (id) order: (weight, load). Kept literal (hence
/// the `+ 99) / 100` clippy would turn into `div_ceil`).
#[allow(clippy::manual_div_ceil)]
fn haproxy_eligible(nodes: &[(u32, u64)], factor: u32, i: usize) -> bool {
    let served: u64 = nodes.iter().map(|n| n.1).sum();
    let tot_weight: u64 = nodes.iter().map(|n| u64::from(n.0)).sum();
    let tot_slots = ((served + 1) * u64::from(factor) + 99) / 100;
    let (per_weight, remainder) = (tot_slots / tot_weight, tot_slots % tot_weight);
    let cumulative: u64 = nodes[..i].iter().map(|n| u64::from(n.0)).sum();
    let w = u64::from(nodes[i].0);
    let mut slots = w * per_weight + ((cumulative + w) * remainder) / tot_weight
        - (cumulative * remainder) / tot_weight;
    if slots == 0 {
        slots = 1;
    }
    nodes[i].1 < slots
}

/// Bounded loads at the bound: with weights 100/200/300 and 11 requests in
/// flight, c = 1.25 gives ceil(12 x 1.25) = 15 slots, split 2 / 5 / 8 by
/// cumulative weight (hand computed: 1500/600 = 2, 4500/600 - 2 = 5,
/// 15 - 7 = 8). A node exactly at its part is passed over; one below it
/// keeps the key.
#[test]
fn bounded_load_at_the_cap_passes_over_and_one_below_keeps_the_key() {
    let nodes = [("n1", 100), ("n2", 200), ("n3", 300)];
    let ring = Ring::build(&nodes.map(|(id, w)| (NodeId::from(id), w)), 64);
    let caps = [2u64, 5, 8];
    for (owner, cap) in nodes.iter().map(|n| n.0).zip(caps) {
        // A key this node owns.
        let key = (0..10_000)
            .map(|i| format!("k{i}"))
            .find(|k| &**ring.owner(k).unwrap() == owner)
            .unwrap();
        let plain: Vec<NodeId> = ring.candidates(&key).cloned().collect();
        for (load, passed_over) in [(cap, true), (cap - 1, false)] {
            // The owner at `load`; the other two share the rest of 11,
            // each below its own part so the next in order is eligible.
            let rest = 11 - load;
            let others: Vec<&str> = nodes
                .iter()
                .map(|n| n.0)
                .filter(|id| *id != owner)
                .collect();
            let other_caps: Vec<u64> = nodes
                .iter()
                .zip(caps)
                .filter(|(n, _)| n.0 != owner)
                .map(|(_, c)| c)
                .collect();
            let first = rest.min(other_caps[0] - 1);
            let second = rest - first;
            assert!(
                second < other_caps[1],
                "{owner} at {load}: no room below the caps"
            );
            let loads = [(owner, load), (others[0], first), (others[1], second)];
            let (c, skipped) = ring.bounded_candidates(&key, 125, loads_of(&loads));
            if passed_over {
                assert_eq!(skipped, 1, "{owner} at its cap {cap} is passed over");
                assert_eq!(c[0], plain[1]);
            } else {
                assert_eq!(
                    (skipped, &c),
                    (0, &plain),
                    "{owner} one below its cap keeps the key"
                );
            }
        }
    }
}

proptest! {
    /// Over uneven weights and small loads around the bound, the owner is
    /// the first node in the key's failover order that HAProxy's rule finds
    /// eligible.
    #[test]
    fn bounded_load_follows_haproxys_eligibility_rule(
        weights in proptest::collection::vec(1u32..=400, 2..=5),
        loads in proptest::collection::vec(0u64..12, 5),
        factor in 100u32..=300,
        key in "[a-z]{1,8}",
    ) {
        let ids: Vec<(NodeId, u32)> = weights
            .iter()
            .enumerate()
            .map(|(i, w)| (NodeId::from(format!("n{i}")), *w))
            .collect();
        let ring = Ring::build(&ids, 8);
        let table: Vec<(u32, u64)> = weights.iter().zip(&loads).map(|(w, l)| (*w, *l)).collect();
        let index = |id: &NodeId| ids.iter().position(|n| n.0 == *id).unwrap();
        let (c, skipped) =
            ring.bounded_candidates(&key, factor, |id| table[index(id)].1);
        let order: Vec<NodeId> = ring.candidates(&key).cloned().collect();
        let expected = order
            .iter()
            .position(|id| haproxy_eligible(&table, factor, index(id)))
            .expect("some node is always eligible");
        prop_assert_eq!(skipped, expected);
        prop_assert_eq!(&c[0], &order[expected]);
    }
}
