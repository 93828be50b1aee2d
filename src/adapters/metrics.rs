//! The metrics a node records as it runs (histograms, status and owner
//! counts, client byte counts): relaxed atomic adds on the hot path, no
//! lock and no allocation. The page that reads them at scrape time, with
//! the rest of the node's state, and the list of metric names is
//! `ops/metrics_page.rs`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use http::StatusCode;

use crate::engine::membership::MembershipView;
use crate::engine::node_id::NodeId;
use crate::engine::ring::Ring;

/// The smallest histogram bucket's upper bound, in nanoseconds (0.5 ms);
/// each next bound doubles it.
const FIRST_BOUND_NS: u64 = 500_000;

/// Finite histogram buckets: 0.5 ms doubling 16 times (to about 16 s), so
/// a local serve and a slow app both fall inside; a last `+Inf` bucket
/// follows.
const BUCKETS: usize = 16;

/// A classic Prometheus histogram of durations with fixed bounds (0.5 ms
/// x 2^i, `i < 16`, then `+Inf`), recorded with relaxed atomic adds only:
/// `prometheus-client`'s own histogram takes a lock per observation.
///
/// A scrape reads the buckets, the sum and the count one after the other,
/// so an observation in progress may be in one and not yet in another;
/// the next scrape sees it whole (counts never go back).
#[derive(Debug, Default)]
pub(crate) struct AtomicHistogram {
    /// Observations per bucket (not cumulative): `BUCKETS` finite ones,
    /// then `+Inf`.
    buckets: [AtomicU64; BUCKETS + 1],
    /// Sum of the observations, in nanoseconds.
    sum_ns: AtomicU64,
}

impl AtomicHistogram {
    /// The bucket of `ns`: the first whose bound is at least `ns`.
    fn bucket_of(ns: u64) -> usize {
        let q = ns.saturating_sub(1) / FIRST_BOUND_NS;
        ((u64::BITS - q.leading_zeros()) as usize).min(BUCKETS)
    }

    /// Records one duration.
    pub(crate) fn observe(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.buckets[Self::bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The sum, count and buckets now.
    pub(crate) fn snapshot(&self) -> HistogramSnapshot {
        let buckets: Vec<(f64, u64)> = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let bound = if i == BUCKETS {
                    f64::INFINITY
                } else {
                    (FIRST_BOUND_NS << i) as f64 / 1e9
                };
                (bound, c.load(Ordering::Relaxed))
            })
            .collect();
        let count = buckets.iter().map(|(_, c)| c).sum();
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        HistogramSnapshot {
            sum,
            count,
            buckets,
        }
    }
}

/// One reading of an [`AtomicHistogram`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HistogramSnapshot {
    /// Sum of the observations, in seconds.
    pub(crate) sum: f64,
    /// Observations.
    pub(crate) count: u64,
    /// (upper bound in seconds, observations) per bucket, not cumulative;
    /// the last bound is `+Inf`.
    pub(crate) buckets: Vec<(f64, u64)>,
}

/// Bytes read from and written to client connections (counted by the
/// connection wrapper, `http/send_timeout.rs`).
#[derive(Debug, Default)]
pub(crate) struct ByteCounts {
    received: AtomicU64,
    sent: AtomicU64,
}

impl ByteCounts {
    /// Counts `n` bytes read from a client.
    pub(crate) fn add_received(&self, n: usize) {
        self.received.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts `n` bytes written to a client.
    pub(crate) fn add_sent(&self, n: usize) {
        self.sent.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Bytes read from clients so far.
    pub(crate) fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Bytes written to clients so far.
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

/// Status codes counted one by one: `100..=599` (the codes `http` accepts
/// in a response; anything else would be counted at the nearest end).
pub(crate) const FIRST_CODE: u16 = 100;
const CODES: usize = 500;

/// The metrics a node records per request (the rest is read at scrape time).
#[derive(Debug)]
pub(crate) struct Metrics {
    /// Client requests at the entry: arrival to response head.
    pub(crate) request_seconds: AtomicHistogram,
    /// Forward attempts: head sent to the owner's response head.
    pub(crate) hop_seconds: AtomicHistogram,
    /// Client requests answered by this entry, per status code
    /// (`code - 100`).
    pub(crate) responses: Box<[AtomicU64]>,
    /// Client requests answered by this entry, per serving node.
    pub(crate) by_owner: RwLock<BTreeMap<NodeId, AtomicU64>>,
    /// Bytes of client connections.
    pub(crate) client_bytes: std::sync::Arc<ByteCounts>,
    /// Proxied requests received from entries.
    pub(crate) proxied_in: AtomicU64,
    /// Rules reloads that put new rules in force.
    pub(crate) rules_reloads: AtomicU64,
    /// Rules reloads refused (the rules in force stayed).
    pub(crate) rules_reload_failures: AtomicU64,
    /// This node's ring share for the view version it was computed for.
    ring_share: Mutex<Option<(u64, f64)>>,
    /// When the process started, ms since the Unix epoch (the generation
    /// id, [`Metrics::set_start_time_ms`]); 0 until set.
    start_time_ms: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            request_seconds: AtomicHistogram::default(),
            hop_seconds: AtomicHistogram::default(),
            responses: (0..CODES).map(|_| AtomicU64::new(0)).collect(),
            by_owner: RwLock::new(BTreeMap::new()),
            client_bytes: Default::default(),
            proxied_in: AtomicU64::new(0),
            rules_reloads: AtomicU64::new(0),
            rules_reload_failures: AtomicU64::new(0),
            ring_share: Mutex::new(None),
            start_time_ms: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// Sets the process start time, ms since the Unix epoch (the node's
    /// generation id, read from the wall clock when it was bound).
    pub(crate) fn set_start_time_ms(&self, ms: u64) {
        self.start_time_ms.store(ms, Ordering::Relaxed);
    }

    /// The process start time, ms since the Unix epoch (0 until set).
    pub(crate) fn start_time_ms(&self) -> u64 {
        self.start_time_ms.load(Ordering::Relaxed)
    }

    /// Records one client request's time to its response head.
    pub(crate) fn observe_request(&self, elapsed: Duration) {
        self.request_seconds.observe(elapsed);
    }

    /// Records one forward attempt's time to the owner's response head (or
    /// to its failure).
    pub(crate) fn observe_hop(&self, elapsed: Duration) {
        self.hop_seconds.observe(elapsed);
    }

    /// Counts one proxied request received from an entry.
    pub(crate) fn count_proxied_in(&self) {
        self.proxied_in.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one client request's answer by its `status` (every answer
    /// on a client port except the admin paths it serves).
    pub(crate) fn count_status(&self, status: StatusCode) {
        let code = status
            .as_u16()
            .clamp(FIRST_CODE, FIRST_CODE + CODES as u16 - 1);
        self.responses[usize::from(code - FIRST_CODE)].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one routed client request by the node that served it
    /// (`owner`; the decision's owner when it failed). A read lock and an
    /// atomic add; the write lock only the first time `owner` is seen.
    pub(crate) fn count_owner(&self, owner: &NodeId) {
        {
            let owners = self.by_owner.read().expect("owner counts lock");
            if let Some(c) = owners.get(owner) {
                c.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        self.by_owner
            .write()
            .expect("owner counts lock")
            .entry(owner.clone())
            .or_default()
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one rules reload: `ok` when the new rules are in force.
    pub(crate) fn count_reload(&self, ok: bool) {
        let c = if ok {
            &self.rules_reloads
        } else {
            &self.rules_reload_failures
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// This node's share of `view`'s ring, computed once per view version.
    pub(crate) fn ring_share(&self, view: &MembershipView, id: &str) -> f64 {
        let mut cached = self.ring_share.lock().expect("ring share lock");
        match *cached {
            Some((v, share)) if v == view.version() => share,
            _ => {
                let share = ring_share(view.ring(), id);
                *cached = Some((view.version(), share));
                share
            }
        }
    }
}

/// The share of `ring`'s slots `id` owns, `0..=1` (0 for an empty ring or a
/// node not on it). Cost: one table load per slot (`256 * vnodes` rounded
/// up to a power of two), paid once per view version
/// ([`Metrics::ring_share`] caches it).
fn ring_share(ring: &Ring, id: &str) -> f64 {
    let slots = ring.len();
    if slots == 0 {
        return 0.0;
    }
    let bits = slots.trailing_zeros();
    let owned = (0..slots as u64)
        .filter(|s| {
            let point = if bits == 0 { 0 } else { s << (64 - bits) };
            ring.owner_of_point(point).is_some_and(|o| &**o == id)
        })
        .count();
    owned as f64 / slots as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_match_the_bounds_and_sum_in_seconds() {
        let ms = |n: f64| Duration::from_secs_f64(n / 1000.0);
        assert_eq!(AtomicHistogram::bucket_of(0), 0);
        assert_eq!(AtomicHistogram::bucket_of(500_000), 0);
        assert_eq!(AtomicHistogram::bucket_of(500_001), 1);
        assert_eq!(AtomicHistogram::bucket_of(1_000_000), 1);
        assert_eq!(AtomicHistogram::bucket_of(1_000_001), 2);
        assert_eq!(AtomicHistogram::bucket_of(16_384_000_000), 15);
        assert_eq!(AtomicHistogram::bucket_of(16_384_000_001), 16);
        assert_eq!(AtomicHistogram::bucket_of(u64::MAX), 16);
        let h = AtomicHistogram::default();
        for d in [0.1, 0.5, 0.7, 3.0, 20_000.0] {
            h.observe(ms(d));
        }
        let HistogramSnapshot {
            sum,
            count,
            buckets,
        } = h.snapshot();
        assert_eq!(count, 5);
        assert!((sum - 20.0043).abs() < 1e-6, "{sum}");
        assert_eq!(buckets.len(), 17);
        assert_eq!(buckets[0], (0.0005, 2));
        assert_eq!(buckets[1], (0.001, 1));
        assert_eq!(buckets[3], (0.004, 1));
        assert_eq!(buckets[16], (f64::INFINITY, 1));
        // Every bound is the one prometheus-client's exponential buckets
        // give (the bounds the metric had before).
        let theirs: Vec<f64> =
            prometheus_client::metrics::histogram::exponential_buckets(0.000_5, 2.0, 16).collect();
        let ours: Vec<f64> = buckets[..16].iter().map(|(b, _)| *b).collect();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn status_and_owner_counts() {
        let m = Metrics::default();
        m.count_status(StatusCode::OK);
        m.count_status(StatusCode::OK);
        m.count_status(StatusCode::BAD_GATEWAY);
        m.count_owner(&NodeId::from("n2"));
        m.count_owner(&NodeId::from("n2"));
        m.count_owner(&NodeId::from("n1"));
        assert_eq!(m.responses[100].load(Ordering::Relaxed), 2);
        assert_eq!(m.responses[402].load(Ordering::Relaxed), 1);
        let owners = m.by_owner.read().unwrap();
        assert_eq!(owners["n2"].load(Ordering::Relaxed), 2);
        assert_eq!(owners["n1"].load(Ordering::Relaxed), 1);
    }

    #[test]
    fn ring_share_counts_the_slots_a_node_owns() {
        let ids = ["a", "b", "c"].map(NodeId::from);
        let ring = Ring::build(
            &[
                (ids[0].clone(), 100),
                (ids[1].clone(), 100),
                (ids[2].clone(), 200),
            ],
            16,
        );
        let shares: Vec<f64> = ids.iter().map(|id| ring_share(&ring, id)).collect();
        assert!(
            (shares.iter().sum::<f64>() - 1.0).abs() < 1e-9,
            "{shares:?}"
        );
        // Weight 200 owns about twice the slots of weight 100.
        assert!(shares[2] > 0.4 && shares[2] < 0.6, "{shares:?}");
        assert_eq!(ring_share(&ring, "z"), 0.0);
        assert_eq!(ring_share(&Ring::build(&[], 16), "a"), 0.0);
        // Against the ring's own owner lookup of keys.
        let n = 20_000;
        let a = (0..n)
            .filter(|i| &**ring.owner(&format!("k{i}")).unwrap() == "a")
            .count();
        assert!(
            (a as f64 / n as f64 - shares[0]).abs() < 0.02,
            "{a} {shares:?}"
        );
    }
}
