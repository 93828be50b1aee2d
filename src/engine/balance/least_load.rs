//! Least load with weights (the "custom load" balancing of SailFin's CLB and
//! WebLogic): each request goes to the node with the lowest
//! `Nw = N * (10000 / weight)`, where `N` is the node's load figure (by
//! default its in-flight requests); ties are broken round robin (A9).
//!
//! `Nw` is compared exactly (`N_a * w_b` against `N_b * w_a`), which is the
//! formula without the rounding of the integer division `10000 / weight`.
//! Nodes of weight 0 are not candidates.
//!
//! Ties (Citrix NetScaler "custom load": when services have the same load,
//! the appliance "goes back to round robin between them"): among the nodes
//! tied at the lowest `Nw`, the pick is the first id after the *rotation
//! position* (wrapping), as [`RoundRobin`] does over the whole set. The
//! position moves only when a tie is broken; a node that alone has the
//! lowest figure is picked without moving it. Until the first tie the
//! position is the last pick (so the first tie continues after the node
//! that took the requests so far). The reference's examples, each request
//! adding 10 to its service's figure, equal weights:
//!
//! - figures 20, 70, 80: requests 1-5 to service 1; then 1 and 2 tie at
//!   70 and request 6 goes to service 2; request 7 to service 1 (alone at
//!   70, the position stays on 2); then all three tie at 80 and request 8
//!   goes to service 3: `1 1 1 1 1 2 1 3`.
//! - figures 0, 10, 20: `1 2 1 3`.
//! - weights 4, 3, 2 with figures 20, 70, 80: requests 1-8 to service 1,
//!   request 9 to service 2.
//!
//! Case code (A9) names a case of `docs/cases.md`: the input, the
//! value peerlb must give, and where it is tested.

use std::cmp::Ordering;

use super::RoundRobin;
use crate::engine::node_id::NodeId;

/// The least-load state: the rotation position for ties.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LeastLoad {
    /// Its last pick is the rotation position.
    ties: RoundRobin,
    /// A tie has been broken: from now on only ties move the position.
    tie_broken: bool,
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
    /// The rotation position moves only when a tie is broken (module doc).
    pub(crate) fn pick(&mut self, nodes: &[(&NodeId, u32, u64)]) -> Option<usize> {
        let min = nodes
            .iter()
            .filter(|n| n.1 > 0)
            .map(|n| (n.2, n.1))
            .min_by(|a, b| cmp_nw(*a, *b))?;
        let is_tied = |n: &&(&NodeId, u32, u64)| n.1 > 0 && cmp_nw((n.2, n.1), min).is_eq();
        let mut tied = nodes.iter().enumerate().filter(|(_, n)| is_tied(n));
        let (first, _) = tied.next()?;
        if tied.next().is_none() {
            if !self.tie_broken {
                self.ties.pick(std::slice::from_ref(nodes[first].0));
            }
            return Some(first);
        }
        let tied: Vec<NodeId> = nodes.iter().filter(is_tied).map(|n| n.0.clone()).collect();
        self.tie_broken = true;
        let id = self.ties.pick(&tied)?;
        nodes.iter().position(|n| *n.0 == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replays `n` requests from `figures` (one per service, weights as
    /// given), each adding `step` to its service's figure; returns the
    /// 1-based service numbers picked.
    fn replay(weights: &[u32], figures: &[u64], step: u64, n: usize) -> Vec<usize> {
        let ids: Vec<NodeId> = (1..=figures.len())
            .map(|i| NodeId::from(format!("s{i}").as_str()))
            .collect();
        let mut load = figures.to_vec();
        let mut ll = LeastLoad::new();
        (0..n)
            .map(|_| {
                let nodes: Vec<(&NodeId, u32, u64)> = ids
                    .iter()
                    .zip(weights)
                    .zip(&load)
                    .map(|((id, w), l)| (id, *w, *l))
                    .collect();
                let i = ll.pick(&nodes).unwrap();
                load[i] += step;
                i + 1
            })
            .collect()
    }

    #[test]
    fn a9_lowest_figure_then_round_robin_only_among_ties() {
        // Citrix custom load: figures 20, 70, 80, +10 per request. Requests
        // 1-5 to service 1; 6 to service 2 (1 and 2 tie at 70); 7 to service
        // 1 (alone at 70: the tie position stays on 2); 8 to service 3 (all
        // three tie at 80, the rotation continues after 2).
        let got = replay(&[100; 3], &[20, 70, 80], 10, 12);
        assert_eq!(got[..8], [1, 1, 1, 1, 1, 2, 1, 3]);
        // Then: 80 80 90 -> tie 1,2 after 3: 1; 90 80 90 -> 2 alone;
        // 90 90 90 -> after 1: 2; 90 100 90 -> tie 1,3 after 2: 3.
        assert_eq!(got[8..], [1, 2, 2, 3]);
    }

    #[test]
    fn a9_smallest_example_moves_the_rotation_only_on_ties() {
        // 0, 10, 20: 1 alone; 1,2 tie -> 2; 1 alone; all tie -> 3. The
        // old rule (the rotation after every pick) gave 1 2 1 2.
        assert_eq!(replay(&[100; 3], &[0, 10, 20], 10, 4), [1, 2, 1, 3]);
        // Equal figures from the start: 1 (all tie), 2 (2 and 3 tie after
        // 1), 3 (alone: the position stays on 2), 3 (all tie, after 2), then
        // 1 and 2 (ties after 3 and after 1).
        assert_eq!(replay(&[100; 3], &[0, 0, 0], 10, 6), [1, 2, 3, 3, 1, 2]);
    }

    #[test]
    fn a9_weighted_example() {
        // Weights 4, 3, 2 with figures 20, 70, 80: Nw 50000, 233333,
        // 400000, and +25000 per request on service 1: requests 1-8 to
        // service 1 (figure 20..90 -> Nw 50000..225000 < 233333), request 9
        // to service 2.
        let got = replay(&[4, 3, 2], &[20, 70, 80], 10, 9);
        assert_eq!(got, [1, 1, 1, 1, 1, 1, 1, 1, 2]);
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
