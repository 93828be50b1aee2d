//! The routing decision: `decide(request, membership view, now, rng)` gives
//! the owner of a request and the failover order ([`Decision`]).
//!
//! Order of precedence (docs/architecture.md, "What the policies mean exactly"):
//!
//! 1. No serving member at all: the entry node serves the request itself.
//! 2. The app's own session id (`[sticky.session]`, [`SessionRoute`]):
//!    its primary server while that serves, else its secondary; a value
//!    naming no serving node (malformed, or both down) falls through.
//!    Then a sticky route (cookie or `;peerlb-route=` parameter) naming a
//!    *serving* member wins; one naming an unknown or non-serving node is
//!    ignored (H4: forged routes gain nothing; C7: a dead node's sessions
//!    fail over).
//! 3. `consistent-hash`: the key from the first matching data-centric rule,
//!    else the default key (client host:port, H2), looked up on the ring,
//!    with bounded loads when [`RouterOptions::hash_balance_factor`] is set.
//!    With no rules configured at all it behaves as sticky round robin.
//! 4. A `:local` policy: the entry node itself when it is a candidate.
//! 5. The policy's pick (`balance`): round robin, random, weighted random,
//!    weighted round robin (byrequests), by-traffic, metric, least-load. A
//!    weighted policy whose serving members all have weight (or metric) 0
//!    falls back to round robin.
//!
//! # Load figures
//!
//! `least-load` and bounded-load hashing need each node's load. The engine
//! reads no counters: the figure of node `n` is [`load_estimate`] of
//! `Member::inflight` from the view (what `n` published in gossip: global
//! but up to a gossip interval old) and this entry's own requests to `n`
//! ([`OwnInflight`], a closure the ingress passes): the ones it has in
//! flight now (fresh, exact for its own share) and the ones it had when it
//! took in `n`'s published figure (already counted in it). The estimate is
//! the published figure with the entry's part then replaced by its part
//! now: other entries' requests as of the last report, its own exactly.
//! Bounded-load hashing applies HAProxy's eligibility rule
//! (`chash_server_is_eligible`) to those estimates, so one entry's burst
//! of requests for a hot key spreads at once instead of piling onto a node
//! until the next gossip round. [`Router::decide_with_loads`] takes the
//! own part now alone (nothing counted in the published figure: the sum);
//! [`Router::decide`] passes 0 for every node.
//!
//! Case codes (C7, H2, H4) name cases of `docs/cases.md`: the input, the
//! value peerlb must give, and where it is tested.

use std::cmp::Ordering;
use std::fmt;
use std::time::Duration;

use rand::Rng;

use super::balance::byrequests::ByRequests;
use super::balance::bytraffic::ByTraffic;
use super::balance::least_load::{LeastLoad, cmp_nw};
use super::balance::metric::effective_metric;
use super::balance::{
    Policy, PolicyKind, RoundRobin, random_pick, rotation_from, weighted_random_pick,
};
use super::membership::MembershipView;
use super::node_id::NodeId;
use super::ring::hash_key;
use super::rules::{RequestView, Rules, default_key};
use super::session_id::{SessionPick, SessionRoute};
use super::sticky::{Session, route_from_request};

/// Why a [`Decision`] picked its owner (for logs, metrics and the
/// `peerlb-reason` debug header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The request's sticky route named a serving member, or a draining
    /// one (it finishes its sessions).
    StickyRoute,
    /// The app's session id ([`SessionRoute`]) named this node as the
    /// primary server of the session, and it serves.
    SessionPrimary,
    /// The app's session id named this node as the secondary (replica)
    /// server of the session, and its primary does not serve.
    SessionSecondary,
    /// Consistent hash on the key from data-centric rule `n` (0-based).
    Rule(usize),
    /// Consistent hash on the default key (client host:port): rules are
    /// configured but none yielded a key.
    DefaultKey,
    /// Bounded-load consistent hash: the key's ring owner was above its
    /// capacity and was passed over for the next node on the ring. `rule` is
    /// the data-centric rule that gave the key (`None`: the default key).
    BoundedLoad {
        /// The rule index, as in [`Reason::Rule`]; `None` for the default key.
        rule: Option<usize>,
    },
    /// Round robin (including sticky round robin before a session exists,
    /// and the fallback of weighted policies when every weight is 0).
    RoundRobin,
    /// Random pick.
    Random,
    /// Weighted random pick (`weighted-random`).
    WeightedRandom,
    /// mod_proxy_balancer byrequests (`weighted-round-robin`).
    WeightedRoundRobin,
    /// mod_proxy_balancer bytraffic (`by-traffic`).
    ByTraffic,
    /// mod_oc4j metric shares (`metric`).
    Metric,
    /// Lowest `N * (10000 / weight)` (`least-load`).
    LeastLoad,
    /// A `:local` policy kept the request on the entry node.
    Local,
    /// No serving member: the entry node serves the request itself.
    NoMembers,
}

impl Reason {
    /// Stable lowercase name: `sticky-route`, `session-primary`,
    /// `session-secondary`, `rule`, `default-key`,
    /// `bounded-load`, `round-robin`, `random`, `weighted-random`,
    /// `weighted-round-robin`, `by-traffic`, `metric`, `least-load`, `local`,
    /// `no-members` (the rule index is in [`Reason::Rule`] and in `Display`,
    /// which writes `rule[n]` and `bounded-load[n]` / `bounded-load[default-key]`).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::StickyRoute => "sticky-route",
            Reason::SessionPrimary => "session-primary",
            Reason::SessionSecondary => "session-secondary",
            Reason::Rule(_) => "rule",
            Reason::DefaultKey => "default-key",
            Reason::BoundedLoad { .. } => "bounded-load",
            Reason::RoundRobin => "round-robin",
            Reason::Random => "random",
            Reason::WeightedRandom => "weighted-random",
            Reason::WeightedRoundRobin => "weighted-round-robin",
            Reason::ByTraffic => "by-traffic",
            Reason::Metric => "metric",
            Reason::LeastLoad => "least-load",
            Reason::Local => "local",
            Reason::NoMembers => "no-members",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Rule(n) => write!(f, "rule[{n}]"),
            Reason::BoundedLoad { rule: Some(n) } => write!(f, "bounded-load[{n}]"),
            Reason::BoundedLoad { rule: None } => f.write_str("bounded-load[default-key]"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// The outcome of routing one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The node that should serve the request (the first of
    /// [`Decision::candidates`]).
    pub owner: NodeId,
    /// How the failover order after the owner is computed, when it is asked
    /// for ([`Decision::candidates`]).
    failover: Failover,
    /// The hash key, when the policy hashed one.
    pub key: Option<String>,
    /// Why the owner was picked.
    pub reason: Reason,
}

/// The failover order of a [`Decision`], kept as the few values it is
/// computed from so that a decision costs the same at 10 and 1,000 nodes
/// (the order is produced only as far as a request fails over).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Failover {
    /// The key's ring order (the ring's rank order of the key's slot).
    Ring {
        /// The key's point ([`super::ring::hash_key`]).
        point: u64,
    },
    /// The serving ids after the owner, ascending, wrapping.
    Rotation,
    /// `next` (a session's serving secondary), then [`Failover::Rotation`]
    /// without it.
    Then {
        /// The first candidate after the owner.
        next: NodeId,
    },
    /// An order the policy ranked already (`least-load`: by load figure).
    Listed(Vec<NodeId>),
    /// No other candidate ([`Reason::NoMembers`]).
    Only,
}

impl Decision {
    /// The owner first, then the failover order: distinct nodes, each at
    /// most once, all serving in `view` (except the entry node itself under
    /// [`Reason::NoMembers`]); never empty. `view` is the view the decision
    /// was made with (with another view the order is that view's).
    ///
    /// Lazy: the owner costs nothing, and under `consistent-hash` each
    /// further candidate is computed when the iterator is advanced to it
    /// (`Ring::candidates`), so a request that never fails over never ranks
    /// the cluster.
    pub fn candidates<'a>(&'a self, view: &'a MembershipView) -> impl Iterator<Item = &'a NodeId> {
        let rest = match &self.failover {
            Failover::Ring { point } => Rest::Ring(view.ring().candidates_of_point(*point)),
            Failover::Rotation => {
                let serving = view.serving_ids();
                let start = serving.partition_point(|id| *id <= self.owner);
                Rest::Listed(serving[start..].iter().chain(&serving[..start]))
            }
            Failover::Then { next } => {
                let serving = view.serving_ids();
                let start = serving.partition_point(|id| *id <= self.owner);
                Rest::Then {
                    first: Some(next),
                    skip: next,
                    rest: serving[start..].iter().chain(&serving[..start]),
                }
            }
            Failover::Listed(order) => Rest::Listed(order.iter().chain(&[])),
            Failover::Only => Rest::Listed([].iter().chain(&[])),
        };
        std::iter::once(&self.owner).chain(rest.filter(move |id| **id != self.owner))
    }
}

/// The candidates after the owner (before the owner is filtered out).
enum Rest<'a> {
    Ring(super::ring::Candidates<'a>),
    Listed(std::iter::Chain<std::slice::Iter<'a, NodeId>, std::slice::Iter<'a, NodeId>>),
    /// `first` (until taken), then `rest` without `skip` (the same node).
    Then {
        first: Option<&'a NodeId>,
        skip: &'a NodeId,
        rest: std::iter::Chain<std::slice::Iter<'a, NodeId>, std::slice::Iter<'a, NodeId>>,
    },
}

impl<'a> Iterator for Rest<'a> {
    type Item = &'a NodeId;

    fn next(&mut self) -> Option<&'a NodeId> {
        match self {
            Rest::Ring(c) => c.next(),
            Rest::Listed(l) => l.next(),
            Rest::Then { first, skip, rest } => {
                first.take().or_else(|| rest.find(|id| *id != *skip))
            }
        }
    }
}

/// This entry node's own requests in flight to one node
/// ([`load_estimate`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct OwnInflight {
    /// In flight now (the entry's exact count).
    pub(crate) now: u32,
    /// In flight when the entry took in the node's current published
    /// `inflight` figure: the part of that figure that is this entry's.
    pub(crate) at_publish: u32,
}

/// An entry's best estimate of the requests node `n` has in flight now:
/// `n`'s published figure less this entry's part of it (`own.at_publish`,
/// at most the figure) plus this entry's count now (`own.now`). Exact for
/// the entry's own requests; other entries' as of `n`'s last report.
pub(crate) fn load_estimate(published: u32, own: OwnInflight) -> u64 {
    u64::from(published.saturating_sub(own.at_publish)) + u64::from(own.now)
}

/// What an entry node needs to route a client request and to answer it:
/// the [`Decision`], and under a sticky policy the request's sticky route
/// and what the response announces ([`Session::announce`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EntryDecision {
    /// The routing decision, as [`Router::decide_with_loads`] makes it.
    pub(crate) decision: Decision,
    /// Under a sticky policy ([`Router::is_sticky`]): the route the request
    /// carried; `None` under other policies.
    pub(crate) sticky: Option<Session>,
}

/// The weighted policies' state per node id ([`Router::balance_state`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct BalanceState {
    /// Each node's lbstatus (`weighted-round-robin`; else empty).
    pub(crate) lbstatus: Vec<(NodeId, i64)>,
    /// Each node's counted bytes (`by-traffic`; else empty).
    pub(crate) bytes: Vec<(NodeId, u64)>,
}

/// Tunables of a [`Router`] beyond the policy and the rules.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RouterOptions {
    /// Bounded-load factor `c` for `consistent-hash` (HAProxy
    /// `hash-balance-factor` / 100, Envoy `hash_balance_factor` / 100;
    /// Mirrokni et al.): a node whose load figure is at or above its share of
    /// `c x (total load + 1)` is passed over for the next node on the ring.
    /// `None` (the default): plain consistent hashing. Typical: 1.25. Must be
    /// finite and at least 1.0; it is used in hundredths (1.256 -> 126 %).
    pub hash_balance_factor: Option<f64>,
}

/// Invalid [`RouterOptions`].
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
pub enum OptionsError {
    /// `hash_balance_factor` is below 1.0, not finite, or above 1000.
    #[error("hash_balance_factor must be a number in 1.0..=1000.0 (got {0})")]
    BalanceFactor(f64),
}

/// The per-node routing state machine: the policy, the compiled rules, the
/// options and each policy's state (round-robin position, lbstatus, bytes).
/// One per entry node (or per runtime thread; each rotates independently).
#[derive(Debug)]
pub struct Router {
    policy: Policy,
    rules: Rules,
    balance_factor_pct: Option<u32>,
    rr: RoundRobin,
    byrequests: ByRequests,
    bytraffic: ByTraffic,
    least_load: LeastLoad,
    /// Name of the sticky route cookie read from requests.
    route_cookie: std::sync::Arc<str>,
    /// Where the app's session id names its servers (`[sticky.session]`).
    session_route: Option<std::sync::Arc<SessionRoute>>,
}

/// The policy as it actually runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Effective {
    Hash,
    Rotation,
    Random,
    WeightedRandom,
    WeightedRoundRobin,
    ByTraffic,
    Metric,
    LeastLoad,
}

impl Router {
    /// A router for `policy` (a [`PolicyKind`] or a `Policy`) with compiled
    /// `rules` and default `RouterOptions`.
    pub fn new(policy: impl Into<Policy>, rules: Rules) -> Router {
        Router {
            policy: policy.into(),
            rules,
            balance_factor_pct: None,
            rr: RoundRobin::new(),
            byrequests: ByRequests::new(),
            bytraffic: ByTraffic::new(),
            least_load: LeastLoad::new(),
            route_cookie: std::sync::Arc::from(super::sticky::ROUTE_COOKIE),
            session_route: None,
        }
    }

    /// Routes requests by the server ids in the app's own session id
    /// (`[sticky.session]`) from now on; `None` turns it off (the default).
    pub fn set_session_route(&mut self, route: Option<SessionRoute>) {
        self.session_route = route.map(std::sync::Arc::new);
    }

    /// The session-id routing in force ([`Router::set_session_route`]).
    pub fn session_route(&self) -> Option<&SessionRoute> {
        self.session_route.as_deref()
    }

    /// Reads sticky routes from the cookie `name` (`sticky.cookie`; default
    /// `peerlb-route`) from now on.
    pub fn set_route_cookie(&mut self, name: &str) {
        self.route_cookie = std::sync::Arc::from(name);
    }

    /// A router with explicit `options`.
    ///
    /// # Errors
    ///
    /// `OptionsError::BalanceFactor` for a factor outside 1.0..=1000.0.
    pub fn with_options(
        policy: impl Into<Policy>,
        rules: Rules,
        options: RouterOptions,
    ) -> Result<Router, OptionsError> {
        let mut r = Router::new(policy, rules);
        if let Some(c) = options.hash_balance_factor {
            if !(1.0..=1000.0).contains(&c) {
                return Err(OptionsError::BalanceFactor(c));
            }
            r.balance_factor_pct = Some((c * 100.0).round() as u32);
        }
        Ok(r)
    }

    /// The configured algorithm (without the `:local` suffix).
    pub fn policy(&self) -> PolicyKind {
        self.policy.kind()
    }

    /// The configured policy, including its `:local` affinity.
    pub fn policy_spec(&self) -> Policy {
        self.policy
    }

    /// The options in force (the factor as used, in hundredths).
    pub fn options(&self) -> RouterOptions {
        RouterOptions {
            hash_balance_factor: self.balance_factor_pct.map(|p| f64::from(p) / 100.0),
        }
    }

    /// The compiled data-centric rules.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// Replaces the rules (a reload); affects later decisions only. Policy
    /// state (round-robin position, lbstatus, bytes) is kept.
    pub fn set_rules(&mut self, rules: Rules) {
        self.rules = rules;
    }

    /// True when the effective policy is sticky round robin
    /// (`sticky-round-robin[:local]`, or `consistent-hash` with no rules):
    /// the ingress then sets the route cookie (or path parameter) when the app
    /// starts a session, and rewrites it after a failover (C7).
    pub fn is_sticky(&self) -> bool {
        match self.policy.kind() {
            PolicyKind::StickyRoundRobin => true,
            PolicyKind::ConsistentHash => self.rules.is_empty(),
            _ => false,
        }
    }

    /// Counts `bytes` (request body sent plus response received, in any
    /// number of calls) moved for node `node`; used by `by-traffic`
    /// (mod_proxy_balancer bytraffic) and ignored by the other policies.
    pub fn record_bytes(&mut self, node: &str, bytes: u64) {
        if self.policy.kind() == PolicyKind::ByTraffic {
            self.bytraffic.record(node, bytes);
        }
    }

    /// The policy's own state for member `node`, for operators (status,
    /// manager page): `("lbstatus", n)` under `weighted-round-robin` and
    /// `metric` (mod_proxy_balancer's lbstatus: the pick goes to the
    /// largest), `("bytes", n)` under `by-traffic` (bytes counted, before
    /// normalising by lbfactor); `None` for the policies that keep no
    /// per-member state.
    pub fn policy_figure(&self, node: &str) -> Option<(&'static str, i64)> {
        match self.effective() {
            Effective::WeightedRoundRobin | Effective::Metric => {
                Some(("lbstatus", self.byrequests.lbstatus(node)))
            }
            Effective::ByTraffic => Some((
                "bytes",
                i64::try_from(self.bytraffic.bytes(node)).unwrap_or(i64::MAX),
            )),
            _ => None,
        }
    }

    /// The balancing state of the weighted policies, per node id: each
    /// node's lbstatus under `weighted-round-robin` (mod_proxy_balancer
    /// byrequests) and its counted bytes under `by-traffic` (bytraffic);
    /// empty for the other policies. For the metrics (not the request
    /// path).
    pub(crate) fn balance_state(&self) -> BalanceState {
        let lbstatus = match self.policy.kind() {
            PolicyKind::WeightedRoundRobin => self
                .byrequests
                .all()
                .map(|(id, s)| (id.clone(), s))
                .collect(),
            _ => Vec::new(),
        };
        let bytes = match self.policy.kind() {
            PolicyKind::ByTraffic => self
                .bytraffic
                .all()
                .map(|(id, b)| (id.clone(), b))
                .collect(),
            _ => Vec::new(),
        };
        BalanceState { lbstatus, bytes }
    }

    /// Bytes [`Router::record_bytes`] counted for `node` (0 unless by-traffic).
    #[cfg(test)]
    pub(crate) fn recorded_bytes(&self, node: &str) -> u64 {
        self.bytraffic.bytes(node)
    }

    fn effective(&self) -> Effective {
        match self.policy.kind() {
            PolicyKind::ConsistentHash if !self.rules.is_empty() => Effective::Hash,
            PolicyKind::ConsistentHash | PolicyKind::StickyRoundRobin | PolicyKind::RoundRobin => {
                Effective::Rotation
            }
            PolicyKind::Random => Effective::Random,
            PolicyKind::WeightedRandom => Effective::WeightedRandom,
            PolicyKind::WeightedRoundRobin => Effective::WeightedRoundRobin,
            PolicyKind::ByTraffic => Effective::ByTraffic,
            PolicyKind::Metric => Effective::Metric,
            PolicyKind::LeastLoad => Effective::LeastLoad,
        }
    }

    /// Routes one request against `view`, with no entry-local load figures
    /// (see [`Router::decide_with_loads`]).
    ///
    /// `now` (time since an arbitrary epoch) is unused by the current
    /// policies and reserved for time-based ones; `rng` is drawn from only by
    /// `random` and `weighted-random` (once per request the policy decides).
    /// A request with a valid sticky route, or kept local by a `:local`
    /// policy, does not advance any policy state.
    pub fn decide(
        &mut self,
        req: &RequestView<'_>,
        view: &MembershipView,
        now: Duration,
        rng: &mut impl Rng,
    ) -> Decision {
        self.decide_with_loads(req, view, now, rng, &|_: &str| 0)
    }

    /// [`Router::decide`] with `local(node)`: the requests this entry node
    /// has in flight to `node` now, none of them counted in the published
    /// figures. A node's load figure (for `least-load` and bounded-load
    /// hashing) is `Member::inflight + local(node)` (see the module doc,
    /// "Load figures").
    pub fn decide_with_loads(
        &mut self,
        req: &RequestView<'_>,
        view: &MembershipView,
        now: Duration,
        rng: &mut impl Rng,
        local: &impl Fn(&str) -> u32,
    ) -> Decision {
        let own = |id: &str| OwnInflight {
            now: local(id),
            at_publish: 0,
        };
        self.decide_entry(req, view, now, rng, &own).decision
    }

    /// [`Router::decide_with_loads`] with the sticky-route part of the
    /// decision: the route the request carried (parsed here, once), for the
    /// announcement once the response is known.
    pub(crate) fn decide_entry(
        &mut self,
        req: &RequestView<'_>,
        view: &MembershipView,
        now: Duration,
        rng: &mut impl Rng,
        local: &impl Fn(&str) -> OwnInflight,
    ) -> EntryDecision {
        let route = route_from_request(req.headers, req.uri, &self.route_cookie, |r| {
            view.sticky_target(r).is_some()
        });
        let sticky = self.is_sticky().then(|| Session {
            route: route.clone(),
        });
        let session = self
            .session_route
            .as_ref()
            .and_then(|s| s.pick(req.headers, req.uri, |r| view.sticky_target(r).is_some()));
        let decision = match session.and_then(|p| session_decision(p, view)) {
            Some(d) => d,
            None => self.decide_routed(req, route.as_deref(), view, now, rng, local),
        };
        EntryDecision { decision, sticky }
    }

    /// The decision for a request whose sticky route is `route` (and whose
    /// session id, if any, named no serving node).
    fn decide_routed(
        &mut self,
        req: &RequestView<'_>,
        route: Option<&str>,
        view: &MembershipView,
        now: Duration,
        rng: &mut impl Rng,
        local: &impl Fn(&str) -> OwnInflight,
    ) -> Decision {
        // Long: the routing precedence step by step (sticky route, the policy's candidates,
        // bounded load, failover order); the steps share the candidate list, and one function
        // keeps the precedence in reading order.
        let _ = now;
        let serving = view.serving_ids();
        if serving.is_empty() {
            return Decision {
                owner: view.self_id().clone(),
                failover: Failover::Only,
                key: None,
                reason: Reason::NoMembers,
            };
        }
        let figure = |id: &str| {
            let published = view.get(id).map_or(0, |m| m.inflight);
            load_estimate(published, local(id))
        };
        // A route to a serving member, or to a draining one (its sessions
        // finish there: `MembershipView::sticky_target`).
        let sticky = route.and_then(|r| view.sticky_target(r));
        let effective = self.effective();

        if effective == Effective::Hash && !view.ring().is_empty() {
            let (key, rule) = match self.rules.extract(req) {
                Some((i, k)) => (k, Some(i)),
                None => (default_key(req.client), None),
            };
            let point = hash_key(&key);
            let ring = view.ring();
            let (owner, reason) = match (sticky, self.balance_factor_pct) {
                (Some(id), _) => (id, Reason::StickyRoute),
                (None, Some(pct)) => {
                    let (owner, skipped) = ring
                        .bounded_owner(point, pct, |id| figure(id))
                        .expect("the ring is not empty");
                    let reason = match skipped {
                        0 => rule.map_or(Reason::DefaultKey, Reason::Rule),
                        _ => Reason::BoundedLoad { rule },
                    };
                    (owner, reason)
                }
                (None, None) => (
                    ring.owner_of_point(point).expect("the ring is not empty"),
                    rule.map_or(Reason::DefaultKey, Reason::Rule),
                ),
            };
            return Decision {
                owner: owner.clone(),
                failover: Failover::Ring { point },
                key: Some(key),
                reason,
            };
        }

        let rotation = |i: usize| Decision {
            owner: serving[i].clone(),
            failover: Failover::Rotation,
            key: None,
            reason: Reason::RoundRobin,
        };
        let decision = |d: Decision, reason| Decision { reason, ..d };
        if let Some(id) = sticky {
            // Failover from a sticky owner goes on in id order, from
            // after it (a draining owner is not in `serving` itself).
            return Decision {
                owner: id.clone(),
                failover: Failover::Rotation,
                key: None,
                reason: Reason::StickyRoute,
            };
        }
        let weight = |id: &NodeId| view.get(id).map_or(0, |m| m.weight);
        let metric = |id: &NodeId| view.get(id).map_or(0, |m| effective_metric(m.load));
        if self.policy.is_local()
            && let Ok(i) = serving.binary_search(view.self_id())
        {
            let me = &serving[i];
            let candidate = match effective {
                Effective::WeightedRandom
                | Effective::WeightedRoundRobin
                | Effective::ByTraffic
                | Effective::LeastLoad => weight(me) > 0,
                Effective::Metric => metric(me) > 0,
                Effective::Hash | Effective::Rotation | Effective::Random => true,
            };
            if candidate {
                return decision(rotation(i), Reason::Local);
            }
        }

        let by_weight =
            || -> Vec<(&NodeId, u32)> { serving.iter().map(|id| (id, weight(id))).collect() };
        let picked: Option<(usize, Reason)> = match effective {
            Effective::Hash | Effective::Rotation => None,
            Effective::Random => {
                let id = random_pick(serving, rng).expect("serving is not empty");
                let i = serving.binary_search(&id).expect("picked from serving");
                Some((i, Reason::Random))
            }
            Effective::WeightedRandom => {
                let w: Vec<u32> = serving.iter().map(weight).collect();
                weighted_random_pick(&w, rng).map(|i| (i, Reason::WeightedRandom))
            }
            Effective::WeightedRoundRobin => self
                .byrequests
                .pick(&by_weight())
                .map(|i| (i, Reason::WeightedRoundRobin)),
            Effective::ByTraffic => self
                .bytraffic
                .pick(&by_weight())
                .map(|i| (i, Reason::ByTraffic)),
            Effective::Metric => {
                let mut m: Vec<(&NodeId, u32)> = serving
                    .iter()
                    .map(|id| (id, u32::from(metric(id))))
                    .collect();
                if m.iter().all(|(_, f)| *f == 0) {
                    // Every node reports fully busy: equal shares.
                    m.iter_mut().for_each(|e| e.1 = 1);
                }
                self.byrequests.pick(&m).map(|i| (i, Reason::Metric))
            }
            Effective::LeastLoad => {
                let nodes: Vec<(&NodeId, u32, u64)> = serving
                    .iter()
                    .map(|id| (id, weight(id), figure(id)))
                    .collect();
                let picked = self.least_load.pick(&nodes);
                if let Some(i) = picked {
                    // Failover: the others by Nw, ties in rotation order.
                    let mut rest: Vec<(usize, &(&NodeId, u32, u64))> = rotation_from(serving, i)
                        .skip(1)
                        .map(|id| {
                            let j = serving.binary_search(id).expect("from serving");
                            (j, &nodes[j])
                        })
                        .collect();
                    rest.sort_by(|(_, a), (_, b)| match (a.1, b.1) {
                        (0, 0) => Ordering::Equal,
                        (0, _) => Ordering::Greater,
                        (_, 0) => Ordering::Less,
                        _ => cmp_nw((a.2, a.1), (b.2, b.1)),
                    });
                    return Decision {
                        owner: serving[i].clone(),
                        failover: Failover::Listed(
                            rest.into_iter().map(|(j, _)| serving[j].clone()).collect(),
                        ),
                        key: None,
                        reason: Reason::LeastLoad,
                    };
                }
                None
            }
        };
        let (start, reason) = picked.unwrap_or_else(|| {
            // Rotation, a hash policy whose ring is empty because every
            // serving member has weight 0, or a weighted policy with no
            // positive weight.
            let i = self.rr.peek_index(serving).expect("serving is not empty");
            self.rr.pick(serving);
            (i, Reason::RoundRobin)
        });
        decision(rotation(start), reason)
    }
}

/// The decision for a request whose session id picked `pick` (a serving or
/// draining node, [`SessionRoute::pick`]): that node, then the session's
/// secondary, then the rotation. `None` if `pick` is neither serving nor
/// draining in `view` (it was checked against it).
fn session_decision(pick: SessionPick, view: &MembershipView) -> Option<Decision> {
    // Serving or draining: a draining node's sessions finish there, as
    // sticky routes do (`MembershipView::sticky_target`).
    let find = |id: &str| view.sticky_target(id).cloned();
    Some(Decision {
        owner: find(&pick.node)?,
        failover: match pick.next.as_deref().and_then(find) {
            Some(next) => Failover::Then { next },
            None => Failover::Rotation,
        },
        key: None,
        reason: if pick.secondary {
            Reason::SessionSecondary
        } else {
            Reason::SessionPrimary
        },
    })
}

#[cfg(test)]
mod tests;
