//! Least load with weights (the "custom load" balancing of SailFin's CLB and
//! WebLogic): each request goes to the node with the lowest
//! `Nw = N * (10000 / weight)`, where `N` is the node's load figure (by
//! default its in-flight requests); ties are broken round robin (A9).
//!
//! `Nw` is compared exactly (`N_a * w_b` against `N_b * w_a`), which is the
//! formula without the rounding of the integer division `10000 / weight`.
//! Nodes of weight 0 are not candidates. Among the nodes tied at the lowest
//! `Nw`, the pick is the first id after the id of the previous pick
//! (wrapping), as [`RoundRobin`] does over the whole set.
//!
//! Case code (A9) names a case of `docs/cases.md`: the input, the
//! value peerlb must give, and where it is tested.

use std::cmp::Ordering;

use super::RoundRobin;
use crate::engine::node_id::NodeId;

/// The least-load state: the round-robin position for ties.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LeastLoad {
    ties: RoundRobin,
}

/// `a.load / a.weight` compared with `b.load / b.weight` (weights > 0).
pub(crate) fn cmp_nw(a: (u64, u32), b: (u64, u32)) -> Ordering {
    (u128::from(a.0) * u128::from(b.1)).cmp(&(u128::from(b.0) * u128::from(a.1)))
}

impl LeastLoad {
    /// A scheduler whose first tie goes to the smallest id.
    pub(crate) fn new() -> LeastLoad {
        LeastLoad::default()
    }

    /// Picks one of `nodes` (`(id, weight, load figure)`, sorted by id,
    /// distinct) and returns its index; `None` when every weight is 0.
    pub(crate) fn pick(&mut self, nodes: &[(&NodeId, u32, u64)]) -> Option<usize> {
        let min = nodes
            .iter()
            .filter(|n| n.1 > 0)
            .map(|n| (n.2, n.1))
            .min_by(|a, b| cmp_nw(*a, *b))?;
        let tied: Vec<NodeId> = nodes
            .iter()
            .filter(|n| n.1 > 0 && cmp_nw((n.2, n.1), min) == Ordering::Equal)
            .map(|n| n.0.clone())
            .collect();
        let id = self.ties.pick(&tied)?;
        nodes.iter().position(|n| *n.0 == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a9_lowest_figure_then_round_robin_ties() {
        let ids: Vec<NodeId> = ["s1", "s2", "s3"]
            .iter()
            .map(|s| NodeId::from(*s))
            .collect();
        let mut load = [20u64, 70, 80];
        let mut ll = LeastLoad::new();
        let mut got = Vec::new();
        for _ in 0..12 {
            let nodes: Vec<(&NodeId, u32, u64)> =
                ids.iter().zip(load).map(|(id, l)| (id, 100, l)).collect();
            let i = ll.pick(&nodes).unwrap();
            load[i] += 10;
            got.push(ids[i].to_string());
        }
        // Requests 1-5 go to the first service (20..60 < 70).
        assert_eq!(got[..5], ["s1"; 5]);
        // Then s1 and s2 tie at 70: round robin after the last pick (s1).
        assert_eq!(got[5..], ["s2", "s1", "s2", "s3", "s1", "s2", "s3"]);
    }

    #[test]
    fn weights_scale_the_figure() {
        let ids: Vec<NodeId> = ["a", "b", "c"].iter().map(|s| NodeId::from(*s)).collect();
        let mut ll = LeastLoad::new();
        // Nw: a 10 * 10000/50 = 2000, b 15 * 100 = 1500, c (weight 0) skipped.
        let nodes = [(&ids[0], 50, 10), (&ids[1], 100, 15), (&ids[2], 0, 0)];
        assert_eq!(ll.pick(&nodes), Some(1));
        // Exact comparison: 3/300 == 1/100 is a tie (integer division would
        // give 3 * 33 = 99 < 100).
        let nodes = [(&ids[0], 300, 3), (&ids[1], 100, 1)];
        assert_eq!(ll.pick(&nodes), Some(0));
        assert_eq!(ll.pick(&nodes), Some(1));
        assert_eq!(ll.pick(&[(&ids[0], 0, 1)]), None);
        assert_eq!(ll.pick(&[]), None);
    }
}
