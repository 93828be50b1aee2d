//! The figures of a run: requests by outcome, latencies, app invocations
//! per node, and per membership change the keys that moved and the
//! reweighted node's share ([`share`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::super::scenario::Action;
use super::{Figures, Record, Run, Share};
use crate::{NodeId, Ring};

/// One change of the serving set or of a weight, as the fault script made
/// it: the members and weights before and after fault `index`.
pub(super) struct Step {
    /// Index of the fault in [`Run::applied`] (and in the script).
    pub(super) index: usize,
    /// The node the fault named.
    pub(super) node: String,
    /// Serving members and their weights before the fault.
    pub(super) before: (BTreeSet<String>, BTreeMap<String, u32>),
    /// Serving members and their weights after it.
    pub(super) after: (BTreeSet<String>, BTreeMap<String, u32>),
}

impl Run<'_> {
    /// Requests by outcome (`sent`, `ok`, `failed`, `entry_lost`,
    /// `no_entry`), latency percentiles overall and per serving node, and
    /// app invocations per node. A request still unanswered at the end
    /// counts as sent only (see `check_answers`).
    pub(super) fn count_requests(
        &self,
        records: &[Record],
        simulated: Duration,
        fig: &mut Figures,
    ) {
        let mut latencies = Vec::new();
        let mut by_node: BTreeMap<String, Vec<Duration>> = BTreeMap::new();
        let lost_with_owner = self.posts_lost_with_their_owner();
        for r in records {
            if r.entry.is_empty() {
                fig.no_entry += 1;
                continue;
            }
            fig.sent += 1;
            let end = r.end.unwrap_or(simulated);
            let failed = match &r.result {
                Some(Ok((status, _, _))) => *status >= 500,
                Some(Err(_)) => !self.down_between(&r.entry, r.start, end),
                None => false,
            };
            if failed && r.method == "POST" && lost_with_owner(&r.key, r.start, end) {
                fig.post_lost += 1;
                continue;
            }
            match &r.result {
                None => {}
                Some(Ok((status, served, _))) => {
                    if *status >= 500 {
                        fig.failed += 1;
                    } else {
                        fig.ok += 1;
                        latencies.push(end - r.start);
                        by_node
                            .entry(served.clone())
                            .or_default()
                            .push(end - r.start);
                    }
                }
                Some(Err(_)) => {
                    if self.down_between(&r.entry, r.start, end) {
                        fig.entry_lost += 1;
                    } else {
                        fig.failed += 1;
                    }
                }
            }
        }
        latencies.sort();
        let pct = |p: f64| {
            latencies
                .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        fig.p50 = pct(0.5);
        fig.p99 = pct(0.99);
        for (n, mut l) in by_node {
            l.sort();
            let at = |p: f64| l[((l.len() as f64 * p) as usize).min(l.len() - 1)];
            fig.latency_by_node.insert(n, (at(0.5), at(0.99)));
        }
        for (_, host) in &self.serves {
            *fig.served.entry(host.clone()).or_default() += 1;
        }
    }

    /// Whether a failed POST for `key` sent at `start` and ended at `end`
    /// was lost with its owner: the owner of `key` on the ring before a
    /// kill was the killed node, the request ended after the kill, and it
    /// was sent before every ring could have dropped the node
    /// (`expect.eject_within_s` after the kill). Such a POST may have
    /// reached its owner, so it is answered with an error and never
    /// replayed (README.md: 502 rather than running twice).
    fn posts_lost_with_their_owner(&self) -> impl Fn(&str, Duration, Duration) -> bool {
        let eject = Duration::from_secs_f64(self.scenario.expect.eject_within_s);
        let kills: Vec<(Duration, String, Ring)> = self
            .membership_steps()
            .into_iter()
            .filter(|s| self.applied[s.index].action == Action::Kill)
            .map(|s| {
                let (members, weights) = &s.before;
                (
                    self.applied[s.index].at,
                    s.node,
                    self.ring_of(members, weights),
                )
            })
            .collect();
        move |key, start, end| {
            kills.iter().any(|(at, dead, ring)| {
                end >= *at
                    && start <= *at + eject
                    && ring.owner(key).is_some_and(|o| o.as_str() == dead)
            })
        }
    }

    /// The scenario's keys: `k0..k<key_count>` of its first traffic block.
    pub(super) fn keys(&self) -> Vec<String> {
        self.scenario
            .traffic
            .first()
            .map(|t| (0..t.key_count).map(|i| format!("k{i}")).collect())
            .unwrap_or_default()
    }

    /// The serving set and weights through the applied faults that change
    /// them (kill, drain, join, restart, weight), one [`Step`] each, in
    /// order. Starts from the scenario's first `nodes` nodes at their
    /// configured weights; a restarted node publishes its configured
    /// weight again.
    pub(super) fn membership_steps(&self) -> Vec<Step> {
        let scn = self.scenario;
        let mut members: BTreeSet<String> = scn.node_ids().into_iter().take(scn.nodes).collect();
        let configured: BTreeMap<String, u32> = self
            .slots
            .iter()
            .map(|s| (s.id.clone(), s.config.node.weight))
            .collect();
        let mut weights = configured.clone();
        let mut steps = Vec::new();
        for (i, a) in self.applied.iter().enumerate() {
            let Some(n) = &a.node else { continue };
            let (before, before_w) = (members.clone(), weights.clone());
            match a.action {
                Action::Kill | Action::Drain => {
                    members.remove(n);
                }
                Action::Join | Action::Restart => {
                    members.insert(n.clone());
                    weights.insert(n.clone(), configured[n]);
                }
                Action::Weight => {
                    weights.insert(n.clone(), a.value.unwrap_or_default());
                }
                _ => continue,
            }
            steps.push(Step {
                index: i,
                node: n.clone(),
                before: (before, before_w),
                after: (members.clone(), weights.clone()),
            });
        }
        steps
    }

    /// Per step that changed the serving set or a weight: the fraction of
    /// the scenario's keys whose owner changed on the engine's ring.
    pub(super) fn count_keys_moved(&self, steps: &[Step], fig: &mut Figures) {
        let keys = self.keys();
        for s in steps {
            let ((before, before_w), (members, weights)) = (&s.before, &s.after);
            if (before == members && before_w == weights)
                || keys.is_empty()
                || members.is_empty()
                || before.is_empty()
            {
                continue;
            }
            let (r0, r1) = (
                self.ring_of(before, before_w),
                self.ring_of(members, weights),
            );
            let moved = keys.iter().filter(|k| r0.owner(k) != r1.owner(k)).count();
            fig.keys_moved.push((
                self.applied[s.index].label.clone(),
                moved as f64 / keys.len() as f64,
            ));
        }
    }

    /// Slow start (`balance.slow_start_ms`): every view change, on every
    /// node, in which the serving set stayed and only one node's weight
    /// changed is a ramp step (or a `weight` fault). On the engine's rings
    /// before and after it, no scenario key may move between two other
    /// nodes, and when the weight rose every moved key moves to that node.
    /// The steps the first node saw that are not its own go to
    /// [`Figures::ramp_steps`](super::Figures::ramp_steps).
    pub(super) fn check_ramp_steps(&self, fig: &mut Figures, violations: &mut Vec<String>) {
        let keys = self.keys();
        let observer = self.slots.first().map(|s| s.id.clone());
        let mut last: BTreeMap<&str, &BTreeMap<String, u32>> = BTreeMap::new();
        for (host, view) in &self.view_weight_log {
            let view: &BTreeMap<String, u32> = view;
            let Some(before) = last.insert(host.as_str(), view) else {
                continue;
            };
            let changed: Vec<&String> = view
                .iter()
                .filter(|(id, w)| before.get(*id).is_some_and(|b| b != *w))
                .map(|(id, _)| id)
                .collect();
            let same_set = before.keys().eq(view.keys());
            let [node] = changed[..] else { continue };
            if !same_set || keys.is_empty() {
                continue;
            }
            let ids: BTreeSet<String> = view.keys().cloned().collect();
            let (r0, r1) = (self.ring_of(&ids, before), self.ring_of(&ids, view));
            let rose = view[node] > before[node];
            let mut moved = 0;
            for k in &keys {
                let (a, b) = (r0.owner(k), r1.owner(k));
                if a == b {
                    continue;
                }
                moved += 1;
                let to_node = b.is_some_and(|b| **b == **node);
                let from_node = a.is_some_and(|a| **a == **node);
                // Only to the node, or (its weight fell) from it.
                if !to_node && (rose || !from_node) {
                    violations.push(format!(
                        "{host}: {node} {} -> {}: key {k} moved {a:?} -> {b:?}",
                        before[node], view[node]
                    ));
                    break;
                }
            }
            if observer.as_deref() == Some(host.as_str()) && node != host && rose {
                fig.ramp_steps
                    .push((node.clone(), view[node], moved as f64 / keys.len() as f64));
            }
        }
    }

    /// The ring the engine builds for the serving nodes `ids` with
    /// `weights` (weight-0 nodes are off the ring, as in a node's view).
    pub(super) fn ring_of(&self, ids: &BTreeSet<String>, weights: &BTreeMap<String, u32>) -> Ring {
        let nodes: Vec<(NodeId, u32)> = ids
            .iter()
            .map(|i| (NodeId::from(i.as_str()), weights[i]))
            .filter(|(_, w)| *w > 0)
            .collect();
        Ring::build(&nodes, self.ring_spec)
    }
}

/// The [`Share`] of `node` (label left empty) over the plain (non-session)
/// requests answered 2xx-4xx and sent inside `window` (`None` start: the
/// rings never agreed, and the result is `None`).
pub(super) fn share(
    node: &str,
    ring: &Ring,
    members: &BTreeSet<String>,
    weights: &BTreeMap<String, u32>,
    keys: &[String],
    records: &[Record],
    window: (Option<Duration>, Duration),
) -> Option<Share> {
    let (from, to) = (window.0?, window.1);
    let owns = |k: &str| ring.owner(k).is_some_and(|o| &**o == node);
    let (mut requests, mut expected, mut served) = (0u64, 0u64, 0u64);
    for r in records {
        let Some(Ok((status, by, _))) = &r.result else {
            continue;
        };
        if r.session.is_some() || r.start < from || r.start >= to || *status >= 500 || by.is_empty()
        {
            continue;
        }
        requests += 1;
        expected += u64::from(owns(&r.key));
        served += u64::from(by == node);
    }
    let frac = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let total: u64 = members.iter().map(|m| u64::from(weights[m])).sum();
    Some(Share {
        label: String::new(),
        node: node.to_owned(),
        weight_share: frac(u64::from(weights[node]), total),
        ring_share: frac(
            keys.iter().filter(|k| owns(k)).count() as u64,
            keys.len() as u64,
        ),
        expected: frac(expected, requests),
        served: frac(served, requests),
        requests,
    })
}
