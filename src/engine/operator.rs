//! The operator's rules for this node's own state, as pure judgements: what
//! `POST /_peerlb/state`, `PUT /_peerlb/weight`, the manager page and
//! SIGTERM may change, and when a timed drain ends. The node state
//! (`adapters/node_state.rs`) applies what these allow and publishes it in
//! gossip; `adapters/errors.rs` turns a refusal into the admin API's answer.
//!
//! - **Leaving is final**: once SIGTERM set `leaving`, no other status is
//!   taken until the process stops (a node shutting down never turns back
//!   to `serving` under the sprayer).
//! - **Weight 0 needs a weighted peer**: a weight of 0 is refused while
//!   every other serving member of the view has weight 0, so some node
//!   always receives keys (config validation refuses the same for
//!   `[[nodes]]`). Weights above [`MAX_WEIGHT`] are refused.
//! - **A timed drain** (`draining` with `timeout_ms`) ends when its deadline
//!   has passed and the node is still draining; the node then goes
//!   `offline`. Only `draining` takes a deadline.
//!
//! Time comes in as a value (`now`, any ordered instant type), as the rest
//! of the engine takes it.

use std::ops::Add;
use std::time::Duration;

use super::membership::{MembershipView, NodeStatus};
use super::node_id::NodeId;

/// Largest node weight (`[[nodes]] weight`, `--weight`, and `PUT
/// /_peerlb/weight` at run time): weights are `0..=MAX_WEIGHT`, 100 is one
/// share, 0 receives no keys.
pub const MAX_WEIGHT: u32 = 10_000;

/// Why a status change was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatusRefused {
    /// The node is leaving (SIGTERM) and stays so.
    Leaving,
}

/// Why a weight was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WeightRefused {
    /// Above [`MAX_WEIGHT`] (the value asked).
    OutOfRange(u64),
    /// 0 while every other serving member has weight 0.
    AllZero,
}

/// Whether this node, now `current`, may take status `to`.
///
/// # Errors
/// [`StatusRefused::Leaving`] when `current` is leaving and `to` is not.
pub(crate) fn judge_status(current: NodeStatus, to: NodeStatus) -> Result<(), StatusRefused> {
    if current == NodeStatus::Leaving && to != NodeStatus::Leaving {
        return Err(StatusRefused::Leaving);
    }
    Ok(())
}

/// The deadline of a status change made at `now`: `now + offline_after`
/// for `draining` with a timeout, else none.
pub(crate) fn drain_deadline<T: Add<Duration, Output = T>>(
    to: NodeStatus,
    offline_after: Option<Duration>,
    now: T,
) -> Option<T> {
    offline_after
        .filter(|_| to == NodeStatus::Draining)
        .map(|d| now + d)
}

/// Whether a node in `status` with drain `deadline` should go offline at
/// `now`: still draining, and the deadline reached.
pub(crate) fn drain_ended<T: Ord>(status: NodeStatus, deadline: Option<T>, now: T) -> bool {
    status == NodeStatus::Draining && deadline.is_some_and(|d| now >= d)
}

/// The weight `requested` for node `me`, judged against `view`.
///
/// # Errors
/// [`WeightRefused::OutOfRange`] above [`MAX_WEIGHT`];
/// [`WeightRefused::AllZero`] for 0 when every other serving member of
/// `view` has weight 0 (none serving counts as all zero).
pub(crate) fn judge_weight(
    requested: u64,
    me: &NodeId,
    view: &MembershipView,
) -> Result<u32, WeightRefused> {
    let w = u32::try_from(requested)
        .ok()
        .filter(|w| *w <= MAX_WEIGHT)
        .ok_or(WeightRefused::OutOfRange(requested))?;
    if w == 0
        && view
            .members()
            .filter(|m| m.id != *me && view.is_serving(&m.id))
            .all(|m| m.weight == 0)
    {
        return Err(WeightRefused::AllZero);
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::membership::tests::member;
    use NodeStatus::*;

    fn view(members: &[(&str, NodeStatus, u32)]) -> MembershipView {
        let ms = members.iter().map(|&(id, status, weight)| {
            let mut m = member(id, 1, status);
            m.weight = weight;
            m
        });
        MembershipView::new(NodeId::from("a"), ms, 64)
    }

    #[test]
    fn leaving_is_final_and_every_other_change_is_allowed() {
        for to in NodeStatus::ALL {
            assert_eq!(
                judge_status(Leaving, to),
                if to == Leaving {
                    Ok(())
                } else {
                    Err(StatusRefused::Leaving)
                }
            );
            for from in [Serving, Draining, Offline] {
                assert_eq!(judge_status(from, to), Ok(()), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn only_a_drain_with_a_timeout_has_a_deadline_and_it_ends_only_while_draining() {
        let t = Duration::from_secs(10);
        let ms = Duration::from_millis;
        assert_eq!(
            drain_deadline(Draining, Some(ms(500)), t),
            Some(t + ms(500))
        );
        assert_eq!(drain_deadline(Draining, None, t), None);
        assert_eq!(drain_deadline(Offline, Some(ms(500)), t), None);
        assert_eq!(drain_deadline(Serving, Some(ms(500)), t), None);
        let d = Some(t + ms(500));
        assert!(!drain_ended(Draining, d, t + ms(499)));
        assert!(drain_ended(Draining, d, t + ms(500)));
        assert!(drain_ended(Draining, d, t + ms(501)));
        // Changed since (served again, or offline already): the deadline
        // is void.
        assert!(!drain_ended(Serving, d, t + ms(501)));
        assert!(!drain_ended(Offline, d, t + ms(501)));
        assert!(!drain_ended(Draining, None, t + ms(501)));
    }

    #[test]
    fn weight_zero_needs_another_serving_member_with_weight() {
        let me = NodeId::from("a");
        let v = view(&[("a", Serving, 100), ("b", Serving, 0), ("c", Draining, 50)]);
        // b is at 0 and c, the one with weight, is not serving.
        assert_eq!(judge_weight(0, &me, &v), Err(WeightRefused::AllZero));
        assert_eq!(judge_weight(1, &me, &v), Ok(1));
        let v = view(&[("a", Serving, 100), ("b", Serving, 0), ("c", Serving, 50)]);
        assert_eq!(judge_weight(0, &me, &v), Ok(0));
        // Alone in its view: 0 would leave no node.
        let v = view(&[("a", Serving, 100)]);
        assert_eq!(judge_weight(0, &me, &v), Err(WeightRefused::AllZero));
    }

    #[test]
    fn weights_above_the_limit_are_refused_with_the_value_asked() {
        let me = NodeId::from("a");
        let v = view(&[("a", Serving, 100)]);
        let max = u64::from(MAX_WEIGHT);
        assert_eq!(judge_weight(max, &me, &v), Ok(MAX_WEIGHT));
        assert_eq!(
            judge_weight(max + 1, &me, &v),
            Err(WeightRefused::OutOfRange(max + 1))
        );
        assert_eq!(
            judge_weight(u64::MAX, &me, &v),
            Err(WeightRefused::OutOfRange(u64::MAX))
        );
    }
}
