//! Slow start: the weight a node publishes while it ramps up after it
//! joins or returns (HAProxy `slowstart`, Envoy's slow start mode).
//!
//! A node that starts does not take its full share of the ring at once: it
//! publishes a fraction of its target weight and raises it in `steps` equal
//! steps over `duration`, so its share of the keys (and its share under the
//! weighted policies, which read the same published weight) grows step by
//! step while its caches and connection pools warm up.
//!
//! Who computes the ramp: the ramping node itself, and it publishes the
//! result as its gossip `weight`. Every node then builds its ring from the
//! same published weights, so every ring agrees at every step without
//! agreed clocks (a ramp computed by each node from a gossiped start time
//! would differ by the clock skew between nodes).
//!
//! Why only the ramping node's keys move: the ring is weighted rendezvous
//! hashing (`ring`), where a node's rank for a slot depends on that node's
//! weight only. Raising one node's weight can only make it win slots it
//! lost before; it never changes the order of two other nodes, so no key
//! moves between two other nodes at any step (tested below on every slot).
//!
//! Step `k` (1-based, `1..=steps`) starts at `duration * (k - 1) / steps`
//! after the ramp began and publishes `ceil(target * k / steps)`: the first
//! step is `1/steps` of the target (10% with the default 10 steps, Envoy's
//! default `min_weight_percent`), the last is the target itself, reached at
//! `duration * (steps - 1) / steps`; at `duration` the ramp is over.

use std::time::Duration;

/// Steps of a ramp when the config does not say (`balance.slow_start_steps`).
pub(crate) const DEFAULT_STEPS: u32 = 10;

/// Most steps a ramp may take: each step is one gossip publication and one
/// ring rebuild on every node.
pub(crate) const MAX_STEPS: u32 = 100;

/// A slow-start ramp: how long it lasts and in how many steps.
///
/// Invariant: `steps` is in `1..=MAX_STEPS`. A zero `duration` means no
/// slow start (the full weight at once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowStart {
    duration: Duration,
    steps: u32,
}

impl SlowStart {
    /// No ramp: a node publishes its full weight at once.
    pub const OFF: SlowStart = SlowStart {
        duration: Duration::ZERO,
        steps: 1,
    };

    /// A ramp over `duration` in `steps` steps (`steps` clamped to
    /// `1..=MAX_STEPS`; the config validates it first).
    pub fn new(duration: Duration, steps: u32) -> SlowStart {
        SlowStart {
            duration,
            steps: steps.clamp(1, MAX_STEPS),
        }
    }

    /// True when there is no ramp (`duration` 0).
    pub fn is_off(&self) -> bool {
        self.duration.is_zero()
    }

    /// The ramp's duration (`balance.slow_start_ms`).
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// The ramp's step count (`balance.slow_start_steps`).
    pub fn steps(&self) -> u32 {
        self.steps
    }

    /// The step in force `elapsed` after the ramp began: `1..=steps`, or
    /// `None` once the ramp is over (at and after `duration`, and always
    /// when slow start is off).
    pub fn step_at(&self, elapsed: Duration) -> Option<u32> {
        if self.is_off() || elapsed >= self.duration {
            return None;
        }
        // elapsed < duration, so the quotient is < steps.
        let k = elapsed.as_nanos() * u128::from(self.steps) / self.duration.as_nanos();
        Some(k as u32 + 1)
    }

    /// The weight to publish `elapsed` after the ramp began, for a node
    /// whose full weight is `target`: `ceil(target * k / steps)` at step
    /// `k`, `target` once the ramp is over. Never 0 for a positive target
    /// (a node of weight 0 would be off the ring), never above `target`,
    /// non-decreasing in `elapsed`.
    pub fn weight_at(&self, target: u32, elapsed: Duration) -> u32 {
        match self.step_at(elapsed) {
            None => target,
            Some(k) => {
                let w = (u64::from(target) * u64::from(k)).div_ceil(u64::from(self.steps));
                w as u32
            }
        }
    }

    /// When the next step starts, as time since the ramp began (the time
    /// the published weight changes next), or `None` when the ramp is over
    /// at `elapsed`. The last "step" is the end of the ramp at `duration`.
    pub fn next_change_at(&self, elapsed: Duration) -> Option<Duration> {
        let k = self.step_at(elapsed)?;
        let nanos = self.duration.as_nanos() * u128::from(k) / u128::from(self.steps);
        // A step boundary that rounds down to `elapsed` itself moves on one
        // nanosecond so a caller sleeping until it always makes progress.
        let at = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        Some(at.max(elapsed + Duration::from_nanos(1)))
    }

    /// Time left in the ramp `elapsed` after it began (zero once over).
    pub fn remaining(&self, elapsed: Duration) -> Duration {
        self.duration.saturating_sub(elapsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::node_id::NodeId;
    use crate::engine::ring::Ring;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn off_publishes_the_full_weight_at_once() {
        assert!(SlowStart::OFF.is_off());
        assert_eq!(SlowStart::OFF.weight_at(100, Duration::ZERO), 100);
        assert_eq!(SlowStart::OFF.step_at(Duration::ZERO), None);
        assert_eq!(SlowStart::OFF.next_change_at(Duration::ZERO), None);
    }

    #[test]
    fn ten_steps_over_ten_seconds_publish_ten_percent_more_each_second() {
        let s = SlowStart::new(ms(10_000), 10);
        let weights: Vec<u32> = (0..=11).map(|i| s.weight_at(100, ms(i * 1000))).collect();
        assert_eq!(weights, [10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 100, 100]);
        assert_eq!(s.step_at(ms(0)), Some(1));
        assert_eq!(s.step_at(ms(999)), Some(1));
        assert_eq!(s.step_at(ms(1000)), Some(2));
        assert_eq!(s.step_at(ms(9_999)), Some(10));
        assert_eq!(s.step_at(ms(10_000)), None);
        assert_eq!(s.next_change_at(ms(0)), Some(ms(1000)));
        assert_eq!(s.next_change_at(ms(1500)), Some(ms(2000)));
        assert_eq!(s.next_change_at(ms(9_500)), Some(ms(10_000)));
        assert_eq!(s.next_change_at(ms(10_000)), None);
        assert_eq!(s.remaining(ms(2500)), ms(7500));
        assert_eq!(s.remaining(ms(12_000)), Duration::ZERO);
    }

    #[test]
    fn ramp_weights_round_up_never_reach_zero_and_never_exceed_the_target() {
        let s = SlowStart::new(ms(1000), 3);
        assert_eq!(s.weight_at(1, ms(0)), 1);
        assert_eq!(s.weight_at(100, ms(0)), 34);
        assert_eq!(s.weight_at(100, ms(400)), 67);
        assert_eq!(s.weight_at(100, ms(700)), 100);
        assert_eq!(s.weight_at(0, ms(0)), 0);
        assert_eq!(s.weight_at(u32::MAX, ms(999)), u32::MAX);
        for target in [1, 7, 100, 10_000] {
            let mut last = 0;
            for t in (0..1200).step_by(7) {
                let w = s.weight_at(target, ms(t));
                assert!(w >= last && w <= target && w > 0, "{target} {t} {w}");
                last = w;
            }
            assert_eq!(last, target);
        }
        assert_eq!(SlowStart::new(ms(5), 0).steps(), 1);
        assert_eq!(SlowStart::new(ms(5), 1000).steps(), MAX_STEPS);
    }

    #[test]
    fn next_change_always_moves_forward_even_when_steps_are_nanoseconds() {
        let s = SlowStart::new(Duration::from_nanos(3), 100);
        let mut t = Duration::ZERO;
        let mut changes = 0;
        while let Some(next) = s.next_change_at(t) {
            assert!(next > t);
            t = next;
            changes += 1;
        }
        assert!(changes <= 100, "{changes}");
    }

    /// Every step of a ramp, applied to the ring: the ramping node's share
    /// grows at every step, and each slot that changes owner moves to the
    /// ramping node; no slot ever moves between two other nodes.
    #[test]
    fn each_ramp_step_moves_slots_only_to_the_ramping_node() {
        let others: Vec<(NodeId, u32)> = [("a", 100), ("b", 100), ("c", 200), ("d", 100)]
            .map(|(id, w)| (NodeId::from(id), w))
            .into();
        let ramping = NodeId::from("r");
        let s = SlowStart::new(ms(10_000), 10);
        let mut previous = Ring::build(&others, 64);
        let slots = previous.len();
        let owner = |ring: &Ring, slot: usize| -> NodeId {
            let bits = slots.trailing_zeros();
            ring.owner_of_point((slot as u64) << (64 - bits))
                .unwrap()
                .clone()
        };
        let mut last_share = 0.0;
        let mut step_weights = Vec::new();
        for step in 0..=10u64 {
            let w = s.weight_at(100, ms(step * 1000));
            let mut nodes = others.clone();
            nodes.push((ramping.clone(), w));
            // Incremental, as each node rebuilds on a view change; equal to
            // a full build (the ring's own tests), checked here once more.
            let ring = previous.rebuild(&nodes, 64);
            assert_eq!(ring, Ring::build(&nodes, 64));
            let mut moved = 0;
            for slot in 0..slots {
                let (before, after) = (owner(&previous, slot), owner(&ring, slot));
                if before != after {
                    assert_eq!(
                        after, ramping,
                        "step {step}: slot {slot} moved {before} -> {after}"
                    );
                    moved += 1;
                }
            }
            let share = ring
                .shares()
                .into_iter()
                .find(|(id, _)| *id == ramping)
                .unwrap()
                .1;
            if w > step_weights.last().copied().unwrap_or(0) {
                assert!(share > last_share && moved > 0, "step {step}: {share}");
            } else {
                assert_eq!(moved, 0, "step {step}: the weight did not change");
            }
            last_share = share;
            step_weights.push(w);
            previous = ring;
        }
        // Full weight 100 of 600 in total at the end.
        assert!((last_share - 100.0 / 600.0).abs() < 0.02, "{last_share}");
        assert_eq!(step_weights[0], 10);
    }
}
