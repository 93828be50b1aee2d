//! Tests of the capped assignment: quotas within one slot of the weighted
//! share, the table holding exactly the quotas, stability (the property
//! that makes the assignment unique and so a function of the node set),
//! order independence, rebuilds, failover order, and the balance and
//! movement figures of `docs/performance.md` ("Ring balance").

use super::super::*;
use super::quotas;
use proptest::prelude::*;

const CAPPED: Assignment = Assignment::Capped;

fn spec(vnodes: u32) -> RingSpec {
    RingSpec {
        vnodes,
        assignment: CAPPED,
    }
}

fn named(n: usize, weight: impl Fn(usize) -> u32) -> Vec<(NodeId, u32)> {
    (0..n)
        .map(|i| (NodeId::from(format!("node-{i}")), weight(i)))
        .collect()
}

/// Weights 50, 100, 200 in turn.
fn mixed(i: usize) -> u32 {
    [50, 100, 200][i % 3]
}

fn counts(ring: &Ring) -> Vec<usize> {
    let mut c = vec![0; ring.node_count()];
    for &o in &ring.table {
        c[usize::from(o)] += 1;
    }
    c
}

/// Every node's slot count against its weighted share `M * w / W`: the
/// largest `|count - share|`, and max/avg of `count / share`.
fn deviation(ring: &Ring) -> (f64, f64) {
    let total: f64 = ring.weights.iter().map(|&w| f64::from(w)).sum();
    let m = ring.len() as f64;
    let mut worst: f64 = 0.0;
    let mut max_ratio: f64 = 0.0;
    for (c, &w) in counts(ring).into_iter().zip(&ring.weights) {
        let share = m * f64::from(w) / total;
        worst = worst.max((c as f64 - share).abs());
        max_ratio = max_ratio.max(c as f64 / share);
    }
    (worst, max_ratio)
}

/// Slots whose owner differs between `a` and `b`, and of those the ones
/// whose owners are both in both rings (moved between two nodes that stay).
fn moves(a: &Ring, b: &Ring) -> (usize, usize) {
    let (mut moved, mut between_stayers) = (0, 0);
    for (&x, &y) in a.table.iter().zip(&b.table) {
        let (x, y) = (&a.nodes[usize::from(x)], &b.nodes[usize::from(y)]);
        if x != y {
            moved += 1;
            if b.nodes.binary_search(x).is_ok() && a.nodes.binary_search(y).is_ok() {
                between_stayers += 1;
            }
        }
    }
    (moved, between_stayers)
}

/// No slot and node prefer each other to what they hold: for every slot,
/// each node the slot ranks above its owner holds only slots it ranks
/// better than this one (and is full: quotas are exact).
fn assert_stable(ring: &Ring) {
    let n = ring.node_count();
    // Each node's worst claim (smallest u, then the larger slot).
    let mut worst: Vec<Option<(u64, u32)>> = vec![None; n];
    for (s, &o) in ring.table.iter().enumerate() {
        let o = usize::from(o);
        let c = (hrw::score(ring.keys[o], s as u32), s as u32);
        let w = &mut worst[o];
        if w.is_none_or(|(wu, ws)| c.0 < wu || (c.0 == wu && c.1 > ws)) {
            *w = Some(c);
        }
    }
    for (s, &o) in ring.table.iter().enumerate() {
        let s = s as u32;
        let owner = ring.contender(u32::from(o), s);
        for k in 0..n as u32 {
            let c = ring.contender(k, s);
            // A node of quota 0 holds nothing and can take nothing: no pair.
            if worst[k as usize].is_none() && !ring.table.contains(&(k as u16)) {
                continue;
            }
            if c.cmp_rank(&owner).is_lt() {
                let (wu, ws) = worst[k as usize].expect("a preferred node holds slots");
                let better = wu > c.u || (wu == c.u && ws < s);
                assert!(better, "slot {s} and node {k} prefer each other");
            }
        }
    }
}

#[test]
fn quotas_are_the_largest_remainder_shares() {
    // 10 slots over weights 1, 1, 1: floors 3, 3, 3, one left over for the
    // largest node key.
    let keys = [5, 9, 7];
    assert_eq!(quotas(&[1, 1, 1], &keys, 10), vec![3, 4, 3]);
    // Weights 50, 100, 200 over 1024 slots: shares 146.3, 292.6, 585.1;
    // floors 146, 292, 585 (1023), the left-over slot to the largest
    // fraction (292.57).
    assert_eq!(quotas(&[50, 100, 200], &keys, 1024), vec![146, 293, 585]);
}

#[test]
fn default_table_balance_at_10_and_100_nodes() {
    for n in [10, 100] {
        for weight in [(|_| 100) as fn(usize) -> u32, mixed] {
            let ring = Ring::build(&named(n, weight), spec(DEFAULT_VNODES));
            assert_eq!(ring.len(), 1 << 18);
            let (worst, max_ratio) = deviation(&ring);
            assert!(worst < 1.0, "{n}: {worst}");
            assert!(max_ratio <= 1.005, "{n}: {max_ratio:.5}");
            assert_eq!(ring.first.len(), ring.len());
        }
    }
}

#[test]
fn a_thousand_nodes_hold_their_share_within_one_slot() {
    // A smaller table keeps this quick in debug builds (2^14 slots, about
    // 16 per node); the default table's figures come from the bench.
    let ring = Ring::build(&named(1000, mixed), spec(64));
    let (worst, _) = deviation(&ring);
    assert!(worst < 1.0, "{worst}");
    assert_stable(&ring);
}

#[test]
fn one_of_ten_leaving_or_joining_moves_within_1_02_of_the_ideal() {
    let all = named(10, |_| 100);
    let ring = Ring::build(&all, spec(DEFAULT_VNODES));
    let m = ring.len() as f64;
    for leaver in ["node-0", "node-3", "node-9"] {
        let rest: Vec<_> = all
            .iter()
            .filter(|(id, _)| &**id != leaver)
            .cloned()
            .collect();
        let after = ring.rebuild(&rest, spec(DEFAULT_VNODES));
        let (moved, stayers) = moves(&ring, &after);
        let ideal = m / 10.0;
        assert!(moved as f64 <= 1.02 * ideal, "{leaver}: {moved}");
        // Not zero (no balanced assignment of the node set alone can keep
        // that, module doc), but within 2 % of the ideal.
        assert!(stayers as f64 <= 0.02 * ideal, "{leaver}: {stayers}");
    }
    let mut more = all.clone();
    more.push((NodeId::from("node-10"), 100));
    let after = ring.rebuild(&more, spec(DEFAULT_VNODES));
    let (moved, _) = moves(&ring, &after);
    assert!(moved as f64 <= 1.02 * m / 11.0, "join: {moved}");
}

#[test]
fn candidates_are_the_owner_then_the_rank_order_without_it() {
    let ring = Ring::build(&named(12, mixed), spec(4));
    let mut not_first = 0;
    for s in 0..ring.len() as u32 {
        let owner = ring.table[s as usize];
        not_first += usize::from(owner != ring.first[s as usize]);
        let mut want: Vec<Contender> = (0..ring.node_count() as u32)
            .map(|i| ring.contender(i, s))
            .filter(|c| c.index != u32::from(owner))
            .collect();
        want.sort_by(|x, y| x.cmp_rank_exact(y));
        let mut want: Vec<&NodeId> = want.iter().map(|c| &ring.nodes[c.index as usize]).collect();
        want.insert(0, &ring.nodes[usize::from(owner)]);
        let point = (u64::from(s)) << (64 - ring.bits);
        let got: Vec<&NodeId> = ring.candidates_of_point(point).collect();
        assert_eq!(got, want, "slot {s}");
        assert_eq!(ring.owner_of_point(point), Some(want[0]));
    }
    // The quotas bind somewhere, so both branches were exercised.
    assert!(not_first > 0);
}

#[test]
fn rendezvous_and_capped_tables_share_the_first_ranked_nodes() {
    let nodes = named(7, mixed);
    let plain = Ring::build(&nodes, 16);
    let capped = Ring::build(&nodes, spec(16));
    assert_eq!(plain.table, capped.first);
    assert!(plain.first.is_empty());
    // Switching assignment is a rebuild like any other.
    assert_eq!(plain.rebuild(&nodes, spec(16)), capped);
    assert_eq!(capped.rebuild(&nodes, 16), plain);
}

fn arb_nodes(max: usize) -> impl Strategy<Value = Vec<(NodeId, u32)>> {
    proptest::collection::btree_map("[a-z]{1,6}", 1u32..=300, 1..=max)
        .prop_map(|m| m.into_iter().map(|(k, w)| (NodeId::from(k), w)).collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Quotas sum to the slot count and each is within one slot of the
    /// weighted share.
    #[test]
    fn quotas_sum_to_the_slots_within_one_of_the_share(
        weights in proptest::collection::vec(1u32..=10_000, 1..40),
        bits in 8u32..=18,
    ) {
        let keys: Vec<u64> = (0..weights.len() as u64).collect();
        let m = 1usize << bits;
        let q = quotas(&weights, &keys, m);
        prop_assert_eq!(q.iter().sum::<usize>(), m);
        let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
        for (q, &w) in q.iter().zip(&weights) {
            let share = m as f64 * f64::from(w) / total;
            prop_assert!((*q as f64 - share).abs() < 1.0);
        }
    }

    /// The table holds every node's quota exactly and is stable: the
    /// assignment the module doc defines (unique, so a function of the
    /// node set alone).
    #[test]
    fn the_table_holds_the_quotas_and_is_stable(nodes in arb_nodes(12), vnodes in 1u32..=8) {
        let ring = Ring::build(&nodes, spec(vnodes));
        let q = quotas(&ring.weights, &ring.keys, ring.len());
        prop_assert_eq!(counts(&ring), q);
        assert_stable(&ring);
    }

    /// Same owners on every node for the same membership: input order and
    /// the previous ring a rebuild starts from change nothing.
    #[test]
    fn input_order_and_history_are_irrelevant(
        nodes in arb_nodes(10),
        other in arb_nodes(10),
        rotate in any::<usize>(),
    ) {
        let want = Ring::build(&nodes, spec(4));
        let mut shuffled = nodes.clone();
        shuffled.reverse();
        let len = shuffled.len();
        shuffled.rotate_left(rotate % len);
        prop_assert_eq!(&Ring::build(&shuffled, spec(4)), &want);
        let before = Ring::build(&other, spec(4));
        prop_assert_eq!(&before.rebuild(&nodes, spec(4)), &want);
    }

    /// After a leave the rebuilt table is the one built for the rest, no
    /// slot is left with the leaver and every node that stays is at its new
    /// quota (how many slots move between stayers is measured, not bounded
    /// here: `one_of_ten_leaving_or_joining_moves_within_1_02_of_the_ideal`
    /// and `docs/performance.md`).
    #[test]
    fn a_leave_rehomes_the_leavers_slots_and_keeps_the_quotas(
        nodes in arb_nodes(12),
        pick in any::<usize>(),
    ) {
        prop_assume!(nodes.len() >= 2);
        let before = Ring::build(&nodes, spec(4));
        let leaver = nodes[pick % nodes.len()].0.clone();
        let rest: Vec<_> = nodes.iter().filter(|(id, _)| *id != leaver).cloned().collect();
        let after = before.rebuild(&rest, spec(4));
        prop_assert_eq!(&after, &Ring::build(&rest, spec(4)));
        prop_assert!(after.table.iter().all(|&o| after.nodes[usize::from(o)] != leaver));
        let q = quotas(&after.weights, &after.keys, after.len());
        prop_assert_eq!(counts(&after), q);
    }
}

/// Balance and movement of both assignments with the default table at 10,
/// 100 and 1,000 nodes, printed (the table of `docs/performance.md`,
/// "Ring balance"); asserts the capped goals that hold there.
#[test]
#[ignore = "a report, not a check of its own: full builds at 1,000 nodes take minutes unoptimised; \
            run with `cargo test --lib ring_figures -- --ignored --nocapture`"]
fn ring_figures() {
    for n in [10, 100, 1000] {
        for assignment in [Assignment::Rendezvous, CAPPED] {
            let spec = RingSpec {
                vnodes: DEFAULT_VNODES,
                assignment,
            };
            let all = named(n, |_| 100);
            let ring = Ring::build(&all, spec);
            let (_, balance) = deviation(&ring);
            let (_, mixed_balance) = deviation(&Ring::build(&named(n, mixed), spec));
            let rest: Vec<_> = all
                .iter()
                .filter(|(id, _)| &**id != "node-3")
                .cloned()
                .collect();
            let leaver = counts(&ring)[ring.nodes.binary_search(&NodeId::from("node-3")).unwrap()];
            let (leave, leave_stay) = moves(&ring, &ring.rebuild(&rest, spec));
            let mut more = all.clone();
            more.push((NodeId::from("joiner"), 100));
            let after = ring.rebuild(&more, spec);
            let joiner =
                counts(&after)[after.nodes.binary_search(&NodeId::from("joiner")).unwrap()];
            let (join, join_stay) = moves(&ring, &after);
            let ideal_join = ring.len() as f64 / (n + 1) as f64;
            println!(
                "{assignment:?} N={n}: max/share {balance:.4} (mixed {mixed_balance:.4}); \
                 leave {leave} slots = {:.3} x ideal ({leaver}), {leave_stay} between stayers; \
                 join {join} = {:.3} x ideal ({ideal_join:.0}; joiner holds {joiner}), {join_stay} between stayers",
                leave as f64 / leaver as f64,
                join as f64 / ideal_join,
            );
            if assignment == CAPPED {
                assert!(balance <= 1.005 && mixed_balance <= 1.005);
            } else {
                assert_eq!((leave_stay, join_stay), (0, 0));
            }
        }
    }
}
