//! mod_proxy_balancer's `bytraffic` scheduler (Apache httpd
//! `mod_lbmethod_bytraffic`, "Weighted Traffic Counting Algorithm"): lbfactor
//! is how much traffic, in bytes, a worker should handle; each pick goes to
//! the usable worker with the lowest `(bytes sent + bytes received) /
//! lbfactor` (httpd's `find_best_bytraffic`), ties to the first in configured
//! order (node id order). The counts come from [`ByTraffic::record`], which the
//! ingress calls with the request and response bytes it moved for a node
//! (`Router::record_bytes`); a request's bytes count once they are known,
//! as in httpd.
//!
//! The comparison is exact (cross-multiplied in 128 bits), not httpd's integer
//! division. One addition to httpd, in the spirit of A11: a worker that joins
//! (or returns to) the usable set starts at the lowest traffic per lbfactor of
//! the workers already there instead of at its old (or zero) count, so it
//! takes its share from then on without a catch-up burst.
//!
//! Case code (A11) names a case of `docs/cases.md`: the input, the
//! value peerlb must give, and where it is tested.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use crate::engine::node_id::NodeId;

/// The bytraffic state: bytes per node id and the last usable set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ByTraffic {
    bytes: BTreeMap<NodeId, u64>,
    usable: Vec<NodeId>,
}

/// `a_bytes / a_factor` compared with `b_bytes / b_factor` (factors > 0).
fn cmp_norm(a: (u64, u32), b: (u64, u32)) -> Ordering {
    (u128::from(a.0) * u128::from(b.1)).cmp(&(u128::from(b.0) * u128::from(a.1)))
}

impl ByTraffic {
    /// A scheduler with no traffic counted.
    pub(crate) fn new() -> ByTraffic {
        ByTraffic::default()
    }

    /// Adds `bytes` (request and/or response bytes moved for `id`) to its count.
    pub(crate) fn record(&mut self, id: &str, bytes: u64) {
        match self.bytes.get_mut(id) {
            Some(b) => *b = b.saturating_add(bytes),
            None => {
                self.bytes.insert(NodeId::from(id), bytes);
            }
        }
    }

    /// Every node's counted bytes, by id.
    pub(crate) fn all(&self) -> impl Iterator<Item = (&NodeId, u64)> {
        self.bytes.iter().map(|(id, b)| (id, *b))
    }

    /// The bytes counted for `id`.
    pub(crate) fn bytes(&self, id: &str) -> u64 {
        self.bytes.get(id).copied().unwrap_or(0)
    }

    /// Picks one of `workers` (`(id, lbfactor)`, sorted by id, distinct ids;
    /// lbfactor 0 = not usable) and returns its index; `None` when none is
    /// usable.
    pub(crate) fn pick(&mut self, workers: &[(&NodeId, u32)]) -> Option<usize> {
        let usable: Vec<(&NodeId, u32)> = workers.iter().copied().filter(|w| w.1 > 0).collect();
        if usable.is_empty() {
            return None;
        }
        if usable.len() != self.usable.len()
            || usable.iter().zip(&self.usable).any(|(a, b)| a.0 != b)
        {
            self.rejoin(&usable);
        }
        let mut best: Option<(usize, (u64, u32))> = None;
        for (i, (id, f)) in workers.iter().enumerate() {
            if *f == 0 {
                continue;
            }
            let t = (self.bytes(id), *f);
            if best.is_none_or(|(_, b)| cmp_norm(t, b) == Ordering::Less) {
                best = Some((i, t));
            }
        }
        best.map(|(i, _)| i)
    }

    /// The usable set changed: floor newcomers at the lowest traffic per
    /// lbfactor among the workers that stayed, and forget departed counts.
    fn rejoin(&mut self, usable: &[(&NodeId, u32)]) {
        let stayed = |id: &NodeId| self.usable.binary_search(id).is_ok();
        let floor = usable
            .iter()
            .filter(|(id, _)| stayed(id))
            .map(|(id, f)| (self.bytes(id), *f))
            .min_by(|a, b| cmp_norm(*a, *b));
        let mut next = BTreeMap::new();
        for (id, f) in usable {
            let b = match floor {
                Some((fb, ff)) if !stayed(id) => {
                    // ceil(fb * f / ff): at least the floor's traffic per factor.
                    let want = (u128::from(fb) * u128::from(*f)).div_ceil(u128::from(ff));
                    let want = u64::try_from(want).unwrap_or(u64::MAX);
                    self.bytes(id).max(want)
                }
                _ => self.bytes(id),
            };
            next.insert((*id).clone(), b);
        }
        self.bytes = next;
        self.usable = usable.iter().map(|(id, _)| (*id).clone()).collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<NodeId> {
        names.iter().map(|n| NodeId::from(*n)).collect()
    }

    /// `n` picks; after each, records `size(id)` bytes for the pick.
    fn run(
        s: &mut ByTraffic,
        ids: &[NodeId],
        factors: &[u32],
        n: usize,
        size: impl Fn(&str) -> u64,
    ) -> Vec<String> {
        let w: Vec<(&NodeId, u32)> = ids.iter().zip(factors.iter().copied()).collect();
        (0..n)
            .map(|_| {
                let id = ids[s.pick(&w).unwrap()].to_string();
                s.record(&id, size(&id));
                id
            })
            .collect()
    }

    #[test]
    fn a5_twice_the_bytes_for_twice_the_factor() {
        let abc = ids(&["a", "b", "c"]);
        let mut s = ByTraffic::new();
        let got = run(&mut s, &abc, &[1, 2, 1], 8, |_| 1000);
        assert_eq!(got, ["a", "b", "c", "b", "a", "b", "c", "b"]);
        run(&mut s, &abc, &[1, 2, 1], 392, |_| 1000);
        assert_eq!(
            (s.bytes("a"), s.bytes("b"), s.bytes("c")),
            (100_000, 200_000, 100_000)
        );
    }

    #[test]
    fn a5_large_responses_get_fewer_requests() {
        let abc = ids(&["a", "b", "c"]);
        let mut s = ByTraffic::new();
        // b's responses are ten times larger (1 KiB request + 1 or 10 KiB response).
        let got = run(&mut s, &abc, &[1, 2, 1], 1200, |id| {
            if id == "b" {
                1024 + 10_240
            } else {
                1024 + 1024
            }
        });
        let count = |n: &str| got.iter().filter(|g| *g == n).count();
        let (a, b, c) = (count("a"), count("b"), count("c"));
        assert!(b < a, "a {a} b {b}");
        // Bytes still follow the factors: b carries about twice a's bytes.
        let ratio = s.bytes("b") as f64 / s.bytes("a") as f64;
        assert!((ratio - 2.0).abs() < 0.05, "{ratio}");
        // Analytically a : b : c = 1/2048 : 1/5632 : 1/2048 of 1200 = 507.7 : 184.6 : 507.7.
        assert_eq!((a, b, c), (508, 185, 507));
    }

    #[test]
    fn newcomer_starts_at_the_floor_without_a_burst() {
        let ab = ids(&["a", "b"]);
        let abc = ids(&["a", "b", "c"]);
        let mut s = ByTraffic::new();
        run(&mut s, &ab, &[1, 1], 100, |_| 10);
        assert_eq!((s.bytes("a"), s.bytes("b")), (500, 500));
        // c joins with weight 2: it starts at 2 x 500, not at 0.
        let got = run(&mut s, &abc, &[1, 1, 2], 8, |_| 10);
        assert_eq!(
            s.bytes("c"),
            1000 + 10 * got.iter().filter(|g| *g == "c").count() as u64
        );
        assert_eq!(got, ["a", "b", "c", "c", "a", "b", "c", "c"]);
    }

    #[test]
    fn zero_factor_and_empty() {
        let mut s = ByTraffic::new();
        assert_eq!(s.pick(&[]), None);
        let ab = ids(&["a", "b"]);
        assert_eq!(s.pick(&[(&ab[0], 0), (&ab[1], 0)]), None);
        s.record("a", 5);
        assert_eq!(s.pick(&[(&ab[0], 1), (&ab[1], 0)]), Some(0));
        s.record("a", u64::MAX);
        assert_eq!(s.bytes("a"), u64::MAX);
    }
}
