//! A latency histogram without a lock: one atomic counter per bucket, an
//! atomic count and an atomic sum in nanoseconds. The request path records
//! one or two observations per request; `prometheus-client`'s `Histogram`
//! takes a mutex for each, this takes three relaxed atomic adds.
//!
//! A scrape reads the atomics one by one, so an observation that lands
//! during the read may show in the count but not yet in its bucket (or the
//! reverse); Prometheus tolerates that skew (it is the same in the Go
//! client's lock-free histogram) and the next scrape is consistent again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Finite bucket upper bounds of every [`DurationHistogram`], in
/// nanoseconds: 0.5 ms doubling 16 times (0.5 ms .. about 16 s), so a local
/// serve and a slow app both fall inside. A last bucket, `+Inf`, takes the
/// rest.
const BOUNDS_NS: [u64; 16] = {
    let mut b = [0u64; 16];
    let mut i = 0;
    while i < 16 {
        b[i] = 500_000 << i;
        i += 1;
    }
    b
};

/// A Prometheus classic histogram of durations (exposed in seconds) with
/// the [`BOUNDS_NS`] buckets. Clones share the counts (one is registered
/// per scrape).
#[derive(Debug, Default, Clone)]
pub(crate) struct DurationHistogram(Arc<Counts>);

#[derive(Debug, Default)]
struct Counts {
    /// Observations per bucket (not cumulative); the last is `+Inf`.
    buckets: [AtomicU64; BOUNDS_NS.len() + 1],
    count: AtomicU64,
    /// Sum of the observations in nanoseconds (wraps after 584 years).
    sum_ns: AtomicU64,
}

impl DurationHistogram {
    /// Records one observation.
    pub(crate) fn observe(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = BOUNDS_NS.partition_point(|b| *b < ns);
        let c = &self.0;
        c.buckets[i].fetch_add(1, Ordering::Relaxed);
        c.count.fetch_add(1, Ordering::Relaxed);
        c.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// (upper bound in seconds, observations in that bucket alone), the
    /// shape `prometheus-client`'s encoder takes (it accumulates them).
    fn snapshot(&self) -> [(f64, u64); BOUNDS_NS.len() + 1] {
        std::array::from_fn(|i| {
            let bound = BOUNDS_NS.get(i).map_or(f64::INFINITY, |ns| *ns as f64 / 1e9);
            (bound, self.0.buckets[i].load(Ordering::Relaxed))
        })
    }
}

impl TypedMetric for DurationHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for DurationHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let buckets = self.snapshot();
        let count = self.0.count.load(Ordering::Relaxed);
        let sum = self.0.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
    use prometheus_client::registry::Registry;

    fn text(register: impl FnOnce(&mut Registry)) -> String {
        let mut r = Registry::default();
        register(&mut r);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        out
    }

    /// The exposition equals that of `prometheus-client`'s own (locked)
    /// histogram with the same buckets fed the same observations, bounds
    /// included (an observation equal to a bound counts in that bucket).
    #[test]
    fn exposition_matches_prometheus_client_histogram() {
        let ours = DurationHistogram::default();
        let theirs = Histogram::new(exponential_buckets(0.000_5, 2.0, 16));
        let samples_us = [
            0u64, 1, 499, 500, 501, 1_000, 1_001, 3_000, 250_000, 16_384_000, 16_384_001,
            90_000_000,
        ];
        for us in samples_us {
            let d = Duration::from_micros(us);
            ours.observe(d);
            theirs.observe(d.as_secs_f64());
        }
        let a = text(|r| r.register("d", "h", theirs));
        let b = text(|r| r.register("d", "h", ours));
        // The sums differ in the last digits (f64 sum of seconds against
        // an integer sum of nanoseconds): compare them as numbers.
        let split = |t: &str| -> (Vec<String>, f64) {
            let mut sum = 0.0;
            let lines = t
                .lines()
                .filter(|l| {
                    if let Some(v) = l.strip_prefix("d_sum ") {
                        sum = v.parse().unwrap();
                        false
                    } else {
                        true
                    }
                })
                .map(String::from)
                .collect();
            (lines, sum)
        };
        let (la, sa) = split(&a);
        let (lb, sb) = split(&b);
        assert_eq!(la, lb, "\n{a}\n{b}");
        assert!((sa - sb).abs() < 1e-9, "{sa} {sb}");
        assert!(b.contains("d_count 12"), "{b}");
        assert!(b.contains("d_bucket{le=\"0.0005\"} 4"), "{b}");
        assert!(b.contains("d_bucket{le=\"+Inf\"} 12"), "{b}");
    }
}
