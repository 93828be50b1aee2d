//! What must hold after a run, each check adding its violations (in this
//! order, which the trace records): every request answered, as entered;
//! no request served twice unless an idempotent one was replayed after a
//! fault; the scenario's bounds on failures and served requests; a killed
//! node leaves every ring in time; a reweighted node gets its new share;
//! a slow start's steps move keys only to the ramping node; sticky
//! sessions stick unless their node died; the rings agree after the
//! last fault; no node holds a ghost (an old generation) or a member twice;
//! no gossip datagram of the (honest) cluster is dropped.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::super::scenario::Action;
use super::figures::{Step, share};
use super::{Figures, Outcome, Record, Run, check_sticky};

impl Run<'_> {
    /// Counts the figures and checks the invariants of the finished run,
    /// then writes the summary and each violation to the trace.
    pub(super) fn finish(
        self,
        simulated: Duration,
        wall: Duration,
        probe: BTreeMap<String, serde_json::Value>,
    ) -> Outcome {
        let mut fig = Figures::default();
        let mut violations = Vec::new();
        let records = std::mem::take(&mut self.shared.borrow_mut().records);
        self.count_requests(&records, simulated, &mut fig);
        self.check_answers(&records, &mut violations);
        self.check_replays(&records, &mut fig, &mut violations);
        self.check_bounds(&fig, &mut violations);
        self.check_ejections(&mut fig, &mut violations);
        let steps = self.membership_steps();
        self.check_weights(&steps, &records, simulated, &mut fig, &mut violations);
        self.count_keys_moved(&steps, &mut fig);
        self.check_ramp_steps(&mut fig, &mut violations);
        self.check_sessions(&records, &mut fig, &mut violations);
        self.check_inflight_bound(&records, &mut fig, &mut violations);
        self.check_convergence_at_end(&mut fig, &mut violations);
        self.check_members(&probe, &mut fig, &mut violations);
        self.check_gossip_drops(&mut violations);
        self.outcome(simulated, wall, fig, violations)
    }

    /// Whether `node` was killed or drained between `a` and `b` (inclusive).
    pub(super) fn down_between(&self, node: &str, a: Duration, b: Duration) -> bool {
        self.downs
            .get(node)
            .is_some_and(|ts| ts.iter().any(|t| *t >= a && *t <= b))
    }

    /// Whether a partition or loss was in force at `t`.
    fn net_fault_at(&self, t: Duration) -> bool {
        self.net_faults
            .iter()
            .any(|(a, b)| *a <= t && b.is_none_or(|b| t <= b))
    }

    /// Every request sent to an entry got a response or an error, and a
    /// response names the entry it was sent to.
    fn check_answers(&self, records: &[Record], violations: &mut Vec<String>) {
        let mut unanswered = 0;
        for r in records.iter().filter(|r| !r.entry.is_empty()) {
            match &r.result {
                None => unanswered += 1,
                Some(Ok((_, _, entry_hdr))) => {
                    if !entry_hdr.is_empty() && *entry_hdr != r.entry {
                        violations.push(format!(
                            "{}: entered at {} but answered as entry {entry_hdr}",
                            r.tag, r.entry
                        ));
                    }
                }
                Some(Err(_)) => {}
            }
        }
        if unanswered > 0 {
            violations.push(format!(
                "{unanswered} requests got neither a response nor an error"
            ));
        }
    }

    /// A request the app served more than once must be a GET served twice,
    /// the first time on a node that then died or across a network fault
    /// (counted in `replayed`).
    fn check_replays(&self, records: &[Record], fig: &mut Figures, violations: &mut Vec<String>) {
        let methods: BTreeMap<&str, &str> = records
            .iter()
            .map(|r| (r.tag.as_str(), r.method.as_str()))
            .collect();
        for (tag, serves) in &self.serves_by_tag {
            if serves.len() < 2 {
                continue;
            }
            let (first_at, first) = &serves[0];
            // An idempotent request is replayed on the next candidate when
            // its answer could not come back: the owner died, or the
            // network between them failed. Never a POST; never a third time.
            let replay_ok = methods.get(tag.as_str()) == Some(&"GET")
                && serves.len() == 2
                && (self.down_between(first, *first_at, serves[1].0)
                    || self.net_fault_at(*first_at));
            if replay_ok {
                fig.replayed += 1;
            } else {
                violations.push(format!(
                    "request {tag} ({}) served {} times: {serves:?}",
                    methods.get(tag.as_str()).unwrap_or(&"?"),
                    serves.len()
                ));
            }
        }
    }

    /// The scenario's `expect.max_failed` and `expect.min_served`.
    fn check_bounds(&self, fig: &Figures, violations: &mut Vec<String>) {
        let expect = &self.scenario.expect;
        if fig.failed > expect.max_failed {
            violations.push(format!(
                "{} requests failed (at most {} allowed)",
                fig.failed, expect.max_failed
            ));
        }
        let served_total: u64 = fig.served.values().sum();
        if served_total < expect.min_served {
            violations.push(format!(
                "only {served_total} requests served (at least {} expected)",
                expect.min_served
            ));
        }
    }

    /// `expect.served_factor`: the busiest node served at most that many
    /// times the mean of the requests served. `expect.inflight_factor`:
    /// the busiest node's requests in flight, sampled, and above the bound
    /// in at most `expect.inflight_over_max` of the samples when that is
    /// set (see [`Expect`](crate::sim::scenario::Expect)).
    fn check_inflight_bound(
        &self,
        records: &[Record],
        fig: &mut Figures,
        violations: &mut Vec<String>,
    ) {
        let expect = &self.scenario.expect;
        if let Some(factor) = expect.served_factor {
            let served: Vec<u64> = fig.served.values().copied().collect();
            let mean = served.iter().sum::<u64>() as f64 / self.scenario.nodes.max(1) as f64;
            let busiest = served.iter().copied().max().unwrap_or(0) as f64;
            if busiest > factor * mean {
                violations.push(format!(
                    "the busiest node served {:.3} x the mean (at most {factor})",
                    busiest / mean.max(1.0)
                ));
            }
        }
        let Some(factor) = expect.inflight_factor else {
            return;
        };
        let traffic = &self.scenario.traffic;
        let from = traffic.iter().map(|t| t.start_s).fold(f64::MAX, f64::min) + 1.0;
        let to = traffic.iter().map(|t| t.stop_s).fold(0.0, f64::max);
        // Each answered request's interval at the node that served it:
        // from the app's call (the last one, which answered) to the
        // answer's arrival less the way there (the way back is taken to
        // be as long).
        let mut spans: BTreeMap<&str, Vec<(Duration, Duration)>> = BTreeMap::new();
        for r in records {
            if let (Some(Ok((_, served, _))), Some(end)) = (&r.result, r.end)
                && let Some((at, _)) = self.serves_by_tag.get(&r.tag).and_then(|s| s.last())
                && !served.is_empty()
            {
                let back = at.saturating_sub(r.start);
                spans
                    .entry(served)
                    .or_default()
                    .push((*at, end.saturating_sub(back).max(*at)));
            }
        }
        let nodes = self.scenario.nodes.max(1) as f64;
        let step = Duration::from_millis(expect.inflight_sample_ms.max(1));
        let (mut over, mut samples) = (0u64, 0u64);
        let mut t = Duration::from_secs_f64(from.max(0.0));
        while t.as_secs_f64() <= to {
            let counts: Vec<u64> = spans
                .values()
                .map(|v| v.iter().filter(|(a, b)| *a <= t && t < *b).count() as u64)
                .collect();
            let total: u64 = counts.iter().sum();
            let busiest = counts.iter().copied().max().unwrap_or(0);
            if busiest as f64 > factor * (total as f64 / nodes) + 1.0 {
                over += 1;
            }
            samples += 1;
            t += step;
        }
        fig.inflight_over = Some((over, samples));
        if let Some(max) = expect.inflight_over_max
            && samples > 0
            && over as f64 > max * samples as f64
        {
            violations.push(format!(
                "the busiest node held more than {factor} x mean + 1 requests in flight in {over} of {samples} samples ({:.1} %; at most {:.1} % allowed)",
                100.0 * over as f64 / samples as f64,
                100.0 * max
            ));
        }
    }

    /// Ejections: time from each kill until no other node's view held the
    /// killed node, at most `expect.eject_within_s`.
    fn check_ejections(&self, fig: &mut Figures, violations: &mut Vec<String>) {
        let scn = self.scenario;
        for a in self.applied.iter().filter(|a| a.action == Action::Kill) {
            let dead = a.node.clone().unwrap_or_default();
            let mut holding: BTreeSet<String> = BTreeSet::new();
            let mut views: BTreeMap<&str, &[String]> = BTreeMap::new();
            let mut gone_at = None;
            for (at, host, ids) in &self.view_log {
                views.insert(host, ids);
                if *at < a.at {
                    continue;
                }
                holding = views
                    .iter()
                    .filter(|(h, v)| **h != dead && v.contains(&dead))
                    .map(|(h, _)| (*h).to_owned())
                    .collect();
                if holding.is_empty() {
                    gone_at = Some(*at - a.at);
                    break;
                }
            }
            if gone_at.is_none() {
                let still: Vec<_> = views
                    .iter()
                    .filter(|(h, v)| **h != dead && v.contains(&dead))
                    .map(|(h, _)| (*h).to_owned())
                    .collect();
                if still.is_empty() {
                    gone_at = Some(Duration::ZERO);
                } else {
                    holding = still.into_iter().collect();
                }
            }
            match gone_at {
                Some(d) if d.as_secs_f64() <= scn.expect.eject_within_s => {}
                Some(d) => violations.push(format!(
                    "{dead} left every ring {:.2}s after its kill (at most {}s)",
                    d.as_secs_f64(),
                    scn.expect.eject_within_s
                )),
                None => violations.push(format!(
                    "{dead} was never ejected after its kill: still in the ring of {holding:?}"
                )),
            }
            fig.ejections.push((dead, gone_at));
        }
    }

    /// Per `weight` fault: the node accepted the new weight (200), and
    /// once every ring agreed it served, until the next fault, the share of
    /// the requests its new ring gives it, within `expect.share_tolerance`
    /// (the [`super::Share`] goes into the figures).
    fn check_weights(
        &self,
        steps: &[Step],
        records: &[Record],
        simulated: Duration,
        fig: &mut Figures,
        violations: &mut Vec<String>,
    ) {
        let scn = self.scenario;
        let keys = self.keys();
        for s in steps {
            let (i, n) = (s.index, &s.node);
            let a = &self.applied[i];
            if a.action != Action::Weight {
                continue;
            }
            let (members, weights) = &s.after;
            let answer = self.weight_answers.borrow().get(&i).cloned();
            match answer {
                Some(Ok((200, _))) => {}
                Some(Ok((status, body))) => {
                    violations.push(format!("{}: the node answered {status} {body}", a.label))
                }
                Some(Err(e)) => violations.push(format!("{}: {e}", a.label)),
                None => violations.push(format!("{}: the node never answered", a.label)),
            }
            let ring = self.ring_of(members, weights);
            let window = (
                self.converged[i + 1].map(|d| a.at + d),
                self.applied.get(i + 1).map_or(simulated, |next| next.at),
            );
            match share(n, &ring, members, weights, &keys, records, window) {
                Some(mut s) => {
                    s.label = a.label.clone();
                    if s.requests == 0 {
                        violations.push(format!(
                            "{}: no request answered after the rings agreed",
                            a.label
                        ));
                    } else if (s.served - s.expected).abs() > scn.expect.share_tolerance {
                        violations.push(format!(
                            "{}: {n} served {:.3} of the requests after the rings agreed; the ring gives it {:.3} of their keys (tolerance {})",
                            a.label, s.served, s.expected, scn.expect.share_tolerance
                        ));
                    }
                    fig.shares.push(s);
                }
                None => violations.push(format!(
                    "{}: the rings never agreed on the new weight before the next fault",
                    a.label
                )),
            }
        }
    }

    /// Sticky sessions: stickiness holds unless its node died (the rules
    /// are in `sessions`).
    fn check_sessions(&self, records: &[Record], fig: &mut Figures, violations: &mut Vec<String>) {
        let ups = &self.ups;
        let up = |node: &str, from: Duration, to: Duration| {
            ups.get(node)
                .and_then(|ts| ts.iter().filter(|t| **t <= from).max())
                .is_some_and(|since| !self.down_between(node, *since, to))
        };
        let (sticky, broken) = check_sticky(records, up);
        fig.sticky = sticky;
        violations.extend(broken);
    }

    /// Convergence per fault (figures), and, unless a partition still
    /// stands, the rings agreed within `expect.converge_within_s` of the
    /// last fault.
    fn check_convergence_at_end(&self, fig: &mut Figures, violations: &mut Vec<String>) {
        let scn = self.scenario;
        let labels: Vec<String> = std::iter::once("start".to_owned())
            .chain(self.applied.iter().map(|a| a.label.clone()))
            .collect();
        for (label, c) in labels.iter().zip(&self.converged) {
            fig.convergence.push((label.clone(), *c));
        }
        let last = self.converged.last().copied().flatten();
        let partitioned_at_end = !self.partitions.is_empty();
        if !partitioned_at_end {
            match last {
                Some(d) if d.as_secs_f64() <= scn.expect.converge_within_s => {}
                Some(d) => violations.push(format!(
                    "rings agreed {:.2}s after the last fault (at most {}s)",
                    d.as_secs_f64(),
                    scn.expect.converge_within_s
                )),
                None => violations.push(format!(
                    "rings never agreed after the last fault ({}); views: {:?}",
                    labels.last().map_or("", String::as_str),
                    self.views
                )),
            }
        }
    }

    /// Every gossip datagram of the simulated cluster (all of its members
    /// honest, sealed with one key) opened and passed the bounds
    /// production applies: a drop means a bound refuses honest gossip.
    fn check_gossip_drops(&self, violations: &mut Vec<String>) {
        use std::sync::atomic::Ordering::Relaxed;
        for slot in &self.slots {
            for keys in slot.gossip_keys.borrow().iter() {
                let c = &keys.counters;
                let (forged, refused, oversize) = (
                    c.unauthenticated.load(Relaxed),
                    c.out_of_bounds.load(Relaxed),
                    c.oversize.load(Relaxed),
                );
                if forged + refused + oversize > 0 {
                    violations.push(format!(
                        "{}: gossip datagrams dropped: {forged} unauthenticated, {refused} out of bounds, {oversize} oversize",
                        slot.id
                    ));
                }
            }
        }
    }

    /// No ghost: every probed node sees each member once, at its newest
    /// generation; sums the nodes' `proxied_disagree` counters.
    fn check_members(
        &self,
        probe: &BTreeMap<String, serde_json::Value>,
        fig: &mut Figures,
        violations: &mut Vec<String>,
    ) {
        for (node, status) in probe {
            fig.disagree += status["counters"]["proxied_disagree"].as_u64().unwrap_or(0);
            let mut seen: BTreeMap<String, u64> = BTreeMap::new();
            for m in status["members"].as_array().into_iter().flatten() {
                let id = m["id"].as_str().unwrap_or_default().to_owned();
                let generation = m["generation"].as_u64().unwrap_or_default();
                if seen.insert(id.clone(), generation).is_some() {
                    violations.push(format!("{node} lists {id} twice"));
                }
                if let Some(newest) = self.generations.get(&id)
                    && generation != *newest
                    && self.running.contains(&id)
                {
                    violations.push(format!(
                        "{node} holds {id} at generation {generation}, not its newest {newest} (ghost)"
                    ));
                }
            }
        }
        if probe.is_empty() && !self.running.is_empty() {
            violations.push("no node answered the status probe".to_owned());
        }
    }

    /// Writes the summary and the violations to the trace, then the
    /// [`Outcome`] with the trace's hash.
    fn outcome(
        self,
        simulated: Duration,
        wall: Duration,
        fig: Figures,
        violations: Vec<String>,
    ) -> Outcome {
        let scn = self.scenario;
        let mut summary = format!(
            "sent={} ok={} failed={} entry_lost={} replayed={} violations={}",
            fig.sent,
            fig.ok,
            fig.failed,
            fig.entry_lost,
            fig.replayed,
            violations.len()
        );
        // Only where there were any: the other scenarios' traces (and
        // hashes) stay as they were.
        if fig.post_lost > 0 {
            summary += &format!(" post_lost={}", fig.post_lost);
        }
        if let Some((over, samples)) = fig.inflight_over {
            summary += &format!(" inflight_over={over}/{samples}");
        }
        self.trace.line("sim", format_args!("summary {summary}"));
        for v in &violations {
            self.trace.line("sim", format_args!("violation {v}"));
        }
        Outcome {
            scenario: scn.name.clone(),
            seed: self.seed,
            hash: self.trace.hash(),
            trace: self.trace.lines(),
            lines: self.trace.count(),
            simulated,
            wall,
            figures: fig,
            violations,
            faults: self.applied,
            serves: self.serves,
            nodes: scn.node_ids(),
            views: self.view_log,
            peer_events: self.peer_events,
        }
    }
}
