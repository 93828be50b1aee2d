//! The load metric of mod_oc4j's metric-based routing (Oracle HTTP Server
//! `Oc4jSelectMethod metric`): each node reports a metric 0..=100, 100 = idle;
//! a node's share of new requests is its metric over the sum of the serving
//! nodes' metrics (A6); a node that reports nothing counts as 50 (A7).
//! Reported values are smoothed with a history proportion `h`:
//! `smoothed = (1 - h) * metric + h * previous` (A8).
//!
//! # The conversion (mod_oc4j)
//!
//! mod_oc4j turns an unbounded measured value into the 0..=100 metric with
//! `metric = 100 / (1 + ln(1 + delta))` ([`oc4j_metric`]), where `delta` is
//! the change of the measured value since the previous measurement; the
//! measured value is the instance's request processing time. peerlb
//! measures the same quantity: the node's *cumulative* app processing time
//! (the sum, over every request its app served, of the time from handing
//! the request to the app to the app's response head), sampled every gossip
//! interval. `delta` is its increase since the previous sample **in seconds
//! of processing per second of interval**: the reference's seconds at a 1 s
//! measurement interval, and the same value whatever `gossip.interval_ms`
//! is (by Little's law, the mean number of requests the app was busy with).
//! An idle node accrues nothing: `delta = 0`, metric 100. `delta` 1, 10,
//! 100 give 59, 29, 18: the metric falls ever more slowly and never
//! reaches 0, so a busy node keeps a share.
//!
//! # Addition: the in-flight bound
//!
//! Processing time is added when a response head returns, so it lags by up
//! to an interval and says nothing of requests that have not answered yet.
//! peerlb therefore also bounds the metric by the requests the app is
//! serving now: `raw = min(oc4j_metric(delta), 100 * (1 - serving /
//! capacity))` ([`raw_metric`]). This term is peerlb's own, not mod_oc4j's;
//! only a node at `capacity` requests in service reports 0.
//!
//! Where each step runs:
//!
//! 1. The node computes its own raw metric every gossip interval with
//!    [`raw_metric`] from its requests in service and the processing time
//!    accrued since the previous interval.
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

/// mod_oc4j's conversion of a measured change into the metric:
/// `100 / (1 + ln(1 + delta))`, in `0.0..=100.0` (100 at `delta = 0`, 59.06
/// at 1, 29.43 at 10, 17.81 at 100; never 0). `delta` is the processing
/// time accrued since the previous measurement, in seconds per second of
/// interval (module doc); a negative or NaN `delta` counts as 0.
pub(crate) fn oc4j_metric(delta: f64) -> f64 {
    let delta = if delta > 0.0 { delta } else { 0.0 };
    100.0 / (1.0 + delta.ln_1p())
}

/// A node's raw metric, 0..=100 (100 = idle): the mod_oc4j conversion of
/// `busy_delta` (app processing seconds accrued per second since the
/// previous measurement, see [`oc4j_metric`]), bounded by peerlb's
/// in-flight term `100 * (1 - serving / capacity)` (`serving`: requests the
/// node's app is serving now; `capacity` 0 disables the term), rounded.
pub(crate) fn raw_metric(serving: u32, capacity: u32, busy_delta: f64) -> u8 {
    let inflight_term = if capacity == 0 {
        100.0
    } else {
        100.0 * (1.0 - (f64::from(serving) / f64::from(capacity)).min(1.0))
    };
    oc4j_metric(busy_delta).min(inflight_term).round() as u8
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
    fn oc4j_conversion_at_reference_points() {
        // 100 / (1 + ln(1 + delta)).
        assert_eq!(oc4j_metric(0.0), 100.0);
        assert!(
            (oc4j_metric(1.0) - 59.06).abs() < 0.01,
            "{}",
            oc4j_metric(1.0)
        );
        assert!((oc4j_metric(10.0) - 29.43).abs() < 0.01);
        assert!((oc4j_metric(100.0) - 17.81).abs() < 0.01);
        // Never 0, however busy.
        assert!(oc4j_metric(1e12) > 3.0);
        assert_eq!(oc4j_metric(-1.0), 100.0);
        assert_eq!(oc4j_metric(f64::NAN), 100.0);
        let raw = |d| raw_metric(0, 100, d);
        assert_eq!(
            [raw(0.0), raw(1.0), raw(10.0), raw(100.0)],
            [100, 59, 29, 18]
        );
    }

    #[test]
    fn raw_metric_in_flight_term_is_an_upper_bound() {
        assert_eq!(raw_metric(25, 100, 0.0), 75);
        // The lower of the two terms: 59 (oc4j) under 75 (in flight).
        assert_eq!(raw_metric(25, 100, 1.0), 59);
        assert_eq!(raw_metric(90, 100, 1.0), 10);
        assert_eq!(raw_metric(100, 100, 0.0), 0);
        assert_eq!(raw_metric(500, 100, 0.0), 0);
        // capacity 0: no in-flight term.
        assert_eq!(raw_metric(500, 0, 10.0), 29);
    }

    #[test]
    fn a8_smoothing_of_converted_values() {
        // An idle node (first previous 50), then one second busy per second.
        let mut s = MetricSmoother::default();
        assert_eq!(s.observe(raw_metric(0, 100, 0.0)), 85);
        // 0.7 * 59 + 0.3 * 85 = 66.8 -> 67.
        assert_eq!(s.observe(raw_metric(0, 100, 1.0)), 67);
    }
}
