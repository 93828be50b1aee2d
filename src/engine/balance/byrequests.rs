//! mod_proxy_balancer's `byrequests` scheduler (Apache httpd
//! `mod_lbmethod_byrequests`, "Request Counting Algorithm"): weighted round
//! robin with lbfactor / lbstatus.
//!
//! Each pick: every usable worker's `lbstatus += lbfactor`; the worker with
//! the largest `lbstatus` wins (ties: the first in configured order, here node
//! id order); the winner's `lbstatus -= total lbfactor of the usable workers`.
//! Over any `sum(lbfactor)` consecutive picks with unchanged factors each
//! worker is picked exactly `lbfactor` times, spread evenly (A1-A4), and the
//! schedule depends only on the ratios of the factors (A2).
//!
//! A worker that is not usable (down, draining, weight 0) keeps its lbstatus
//! unchanged while it is out, as in httpd (A1: b stays at 0), and resumes from
//! it; a worker never seen before starts at 0. Entries of workers absent
//! from the usable set are forgotten only once the table holds more than
//! twice the usable workers plus 16 (bounded memory under churn).
//!
//! Case codes (A1, A2, A4) name cases of `docs/cases.md`: the input, the
//! value peerlb must give, and where it is tested.

use std::collections::BTreeMap;

use crate::engine::node_id::NodeId;

/// The byrequests state: lbstatus per node id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ByRequests {
    lbstatus: BTreeMap<NodeId, i64>,
}

impl ByRequests {
    /// A scheduler with every lbstatus at 0.
    pub(crate) fn new() -> ByRequests {
        ByRequests::default()
    }

    /// Picks one of `workers` (`(id, lbfactor)`, sorted by id, distinct ids)
    /// and returns its index. Workers with lbfactor 0 are not usable. `None`
    /// (state unchanged) when no worker is usable.
    pub(crate) fn pick(&mut self, workers: &[(&NodeId, u32)]) -> Option<usize> {
        let total: i64 = workers.iter().map(|(_, f)| i64::from(*f)).sum();
        if total == 0 {
            return None;
        }
        if self.lbstatus.len() > 2 * workers.len() + 16 {
            self.lbstatus
                .retain(|id, _| workers.binary_search_by(|(w, _)| (**w).cmp(id)).is_ok());
        }
        let mut best: Option<(usize, i64)> = None;
        for (i, (id, factor)) in workers.iter().enumerate() {
            if *factor == 0 {
                continue;
            }
            let s = match self.lbstatus.get_mut(*id) {
                Some(s) => s,
                None => self.lbstatus.entry((*id).clone()).or_insert(0),
            };
            *s += i64::from(*factor);
            // Strictly greater: the first in configured order wins ties.
            if best.is_none_or(|(_, b)| *s > b) {
                best = Some((i, *s));
            }
        }
        let (i, _) = best?;
        *self
            .lbstatus
            .get_mut(workers[i].0)
            .expect("winner has an entry") -= total;
        Some(i)
    }

    /// The lbstatus of `id` (0 if never seen).
    pub(crate) fn lbstatus(&self, id: &str) -> i64 {
        self.lbstatus.get(id).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<NodeId> {
        names.iter().map(|n| NodeId::from(*n)).collect()
    }

    /// Runs `n` picks over `(id, factor)` and returns the picked ids.
    fn schedule(s: &mut ByRequests, ids: &[NodeId], factors: &[u32], n: usize) -> Vec<String> {
        let w: Vec<(&NodeId, u32)> = ids.iter().zip(factors.iter().copied()).collect();
        (0..n)
            .map(|_| ids[s.pick(&w).unwrap()].to_string())
            .collect()
    }

    fn status(s: &ByRequests, names: &[&str]) -> Vec<i64> {
        names.iter().map(|n| s.lbstatus(n)).collect()
    }

    #[test]
    fn a1_disabled_worker_and_lbstatus_trace() {
        // a, b, c, d at 25 each; b is disabled: it is not in the usable set.
        let names = ["a", "b", "c", "d"];
        let usable = ids(&["a", "c", "d"]);
        let mut s = ByRequests::new();
        assert_eq!(schedule(&mut s, &usable, &[25, 25, 25], 1), ["a"]);
        assert_eq!(status(&s, &names), [-50, 0, 25, 25]);
        assert_eq!(schedule(&mut s, &usable, &[25, 25, 25], 1), ["c"]);
        assert_eq!(status(&s, &names), [-25, 0, -25, 50]);
        assert_eq!(schedule(&mut s, &usable, &[25, 25, 25], 1), ["d"]);
        assert_eq!(status(&s, &names), [0, 0, 0, 0]);
    }

    #[test]
    fn a1_schedule_repeats_a_c_d() {
        let usable = ids(&["a", "c", "d"]);
        let mut s = ByRequests::new();
        let got = schedule(&mut s, &usable, &[25, 25, 25], 9);
        assert_eq!(got, ["a", "c", "d", "a", "c", "d", "a", "c", "d"]);
    }

    #[test]
    fn a2_factors_are_normalised() {
        let four = ids(&["a", "b", "c", "d"]);
        let big = schedule(&mut ByRequests::new(), &four, &[25, 25, 25, 25], 40);
        let small = schedule(&mut ByRequests::new(), &four, &[1, 1, 1, 1], 40);
        assert_eq!(big, small);
        let three = ids(&["a", "b", "c"]);
        assert_eq!(
            schedule(&mut ByRequests::new(), &three, &[70, 30, 50], 150),
            schedule(&mut ByRequests::new(), &three, &[7, 3, 5], 150)
        );
    }

    #[test]
    fn a3_seventy_thirty() {
        let ab = ids(&["a", "b"]);
        let mut s = ByRequests::new();
        let got = schedule(&mut s, &ab, &[70, 30], 10);
        assert_eq!(got, ["a", "b", "a", "a", "a", "b", "a", "a", "b", "a"]);
        assert_eq!(status(&s, &["a", "b"]), [0, 0]);
        assert_eq!(schedule(&mut s, &ab, &[70, 30], 10), got);
    }

    #[test]
    fn a4_one_four_one_over_600() {
        let abc = ids(&["a", "b", "c"]);
        let got = schedule(&mut ByRequests::new(), &abc, &[1, 4, 1], 600);
        let count = |n: &str| got.iter().filter(|g| *g == n).count();
        assert_eq!((count("a"), count("b"), count("c")), (100, 400, 100));
        // Spread evenly: every window of 6 picks holds b exactly 4 times.
        for w in got.chunks(6) {
            assert_eq!(w.iter().filter(|g| *g == "b").count(), 4, "{w:?}");
        }
    }

    #[test]
    fn a10_weight_50_gets_half_of_each_100() {
        let abc = ids(&["a", "b", "c"]);
        let got = schedule(&mut ByRequests::new(), &abc, &[50, 100, 100], 500);
        let count = |n: &str| got.iter().filter(|g| *g == n).count();
        assert_eq!((count("a"), count("b"), count("c")), (100, 200, 200));
        assert_eq!(got[..5], ["b", "c", "a", "b", "c"]);
    }

    #[test]
    fn zero_factors_and_empty() {
        let mut s = ByRequests::new();
        assert_eq!(s.pick(&[]), None);
        let ab = ids(&["a", "b"]);
        assert_eq!(s.pick(&[(&ab[0], 0), (&ab[1], 0)]), None);
        assert_eq!(s.pick(&[(&ab[0], 0), (&ab[1], 3)]), Some(1));
        assert_eq!(s.lbstatus("a"), 0);
        assert_eq!(s.lbstatus("b"), 0);
    }

    #[test]
    fn forgets_departed_workers_only_past_the_bound() {
        let mut s = ByRequests::new();
        let many: Vec<NodeId> = (0..40).map(|i| NodeId::from(format!("n{i:02}"))).collect();
        let w: Vec<(&NodeId, u32)> = many.iter().map(|id| (id, 1)).collect();
        s.pick(&w);
        assert_eq!(s.lbstatus.len(), 40);
        let one = [(&many[5], 1)];
        s.pick(&one);
        assert_eq!(s.lbstatus.len(), 1);
    }
}
