//! The load metric of mod_oc4j's metric-based routing (Oracle HTTP Server
//! `Oc4jSelectMethod metric`): each node reports a metric 0..=100, 100 = idle;
//! a node's share of new requests is its metric over the sum of the serving
//! nodes' metrics (A6); a node that reports nothing counts as 50 (A7).
//! Reported values are smoothed with a history proportion `h`:
//! `smoothed = (1 - h) * metric + h * previous` (A8).
//!
//! Where each step runs:
//!
//! 1. The node computes its own raw metric every gossip interval with
//!    [`raw_metric`] from its in-flight requests and its recent latency.
//! 2. It smooths it with its [`MetricSmoother`] (history `h`, default
//!    [`DEFAULT_METRIC_HISTORY`]) and publishes the smoothed value as gossip
//!    key `load` (`Member::load`). Smoothing happens at the publisher because
//!    gossip carries a key only when its value changes: a receiver cannot
//!    tell a repeated report from no report, so it could not smooth.
//! 3. An entry node under `metric` uses [`effective_metric`] of each serving
//!    member as its lbfactor in the `byrequests` scheduler, so that of every
//!    `sum` requests exactly `metric` go to each node while the metrics hold
//!    (A6: 20, 40, 90 of every 150), evenly spread.
//!
//! Case codes (A6, A7, A8) name cases of `docs/cases.md`: the input, the
//! value peerlb must give, and where it is tested.

use crate::engine::membership::NO_METRIC;

/// Default history proportion `h` of [`MetricSmoother`] (0.3).
pub(crate) const DEFAULT_METRIC_HISTORY: f64 = 0.3;

/// The metric a node that reports nothing counts as (A7).
pub(crate) const MISSING_METRIC: u8 = 50;

/// The metric used for routing: the published value (clamped to 100), or
/// [`MISSING_METRIC`] when the member published none ([`NO_METRIC`]).
pub(crate) fn effective_metric(load: u8) -> u8 {
    if load == NO_METRIC {
        MISSING_METRIC
    } else {
        load.min(100)
    }
}

/// A node's raw metric, 0..=100 (100 = idle): `100 * (1 - busy)` rounded,
/// where `busy = max(inflight / capacity, latency_ms / latency_limit_ms)`
/// clamped to 0..=1. `capacity` is the number of in-flight requests at which
/// the node counts as fully busy; `latency_ms` the recent mean (or p50) time
/// to serve a request and `latency_limit_ms` the latency at which it counts as
/// fully busy. A limit of 0 disables that term.
pub(crate) fn raw_metric(
    inflight: u32,
    capacity: u32,
    latency_ms: u32,
    latency_limit_ms: u32,
) -> u8 {
    let frac = |v: u32, limit: u32| {
        if limit == 0 {
            0.0
        } else {
            (f64::from(v) / f64::from(limit)).min(1.0)
        }
    };
    let busy = frac(inflight, capacity).max(frac(latency_ms, latency_limit_ms));
    (100.0 * (1.0 - busy)).round() as u8
}

/// Exponential smoothing of a node's own metric before it is published:
/// `smoothed = (1 - h) * metric + h * previous` (mod_oc4j; A8). The first
/// previous value is [`MISSING_METRIC`] (50), what peers assumed before the
/// node reported anything.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct MetricSmoother {
    history: f64,
    previous: f64,
}

/// A history proportion outside `0.0..1.0`.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error("metric history must be in 0.0..1.0 (got {0})")]
pub(crate) struct HistoryError(pub(crate) f64);

impl MetricSmoother {
    /// A smoother with history proportion `history`.
    ///
    /// # Errors
    ///
    /// `HistoryError` unless `0.0 <= history < 1.0` (1.0 would never move).
    pub(crate) fn new(history: f64) -> Result<MetricSmoother, HistoryError> {
        if !(0.0..1.0).contains(&history) {
            return Err(HistoryError(history));
        }
        Ok(MetricSmoother {
            history,
            previous: f64::from(MISSING_METRIC),
        })
    }

    /// Feeds one raw metric (clamped to 100) and returns the smoothed value to
    /// publish, rounded to the nearest integer. The unrounded value is kept
    /// as the next `previous`.
    pub(crate) fn observe(&mut self, metric: u8) -> u8 {
        let m = f64::from(metric.min(100));
        self.previous = (1.0 - self.history) * m + self.history * self.previous;
        self.previous.round() as u8
    }

    /// The current smoothed value, unrounded.
    #[cfg(test)]
    pub(crate) fn value(&self) -> f64 {
        self.previous
    }
}

impl Default for MetricSmoother {
    /// History [`DEFAULT_METRIC_HISTORY`].
    fn default() -> MetricSmoother {
        MetricSmoother::new(DEFAULT_METRIC_HISTORY).expect("default history is valid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a7_missing_counts_as_50() {
        assert_eq!(effective_metric(NO_METRIC), 50);
        assert_eq!(effective_metric(0), 0);
        assert_eq!(effective_metric(100), 100);
        assert_eq!(effective_metric(101), 100);
    }

    #[test]
    fn a8_smoothing() {
        let mut s = MetricSmoother::default();
        assert_eq!(s.value(), 50.0);
        assert_eq!(s.observe(100), 85);
        // Next: 0.7 * 100 + 0.3 * 85 = 95.5 -> 96; then 98.65 -> 99.
        assert_eq!(s.observe(100), 96);
        assert!((s.value() - 95.5).abs() < 1e-9);
        assert_eq!(s.observe(100), 99);
        let mut none = MetricSmoother::new(0.0).unwrap();
        assert_eq!(none.observe(20), 20);
        assert_eq!(MetricSmoother::new(1.0), Err(HistoryError(1.0)));
        assert!(MetricSmoother::new(-0.1).is_err());
        assert!(MetricSmoother::new(f64::NAN).is_err());
        assert_eq!(
            HistoryError(1.5).to_string(),
            "metric history must be in 0.0..1.0 (got 1.5)"
        );
    }

    #[test]
    fn raw_metric_from_inflight_and_latency() {
        assert_eq!(raw_metric(0, 64, 0, 0), 100);
        assert_eq!(raw_metric(16, 64, 0, 0), 75);
        assert_eq!(raw_metric(64, 64, 0, 0), 0);
        assert_eq!(raw_metric(500, 64, 0, 0), 0);
        // Latency dominates when it is the busier term.
        assert_eq!(raw_metric(16, 64, 400, 1000), 60);
        assert_eq!(raw_metric(0, 0, 0, 0), 100);
    }
}
