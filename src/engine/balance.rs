//! Balancing policies as pure state machines: given the serving members
//! (their ids, weights, load figures and metrics) pick the owner of a request.
//! No I/O, no clock; randomness only through a caller-seeded RNG.
//!
//! - [`RoundRobin`]: the next serving id after the last pick (A11).
//! - [`random_pick`] / [`weighted_random_pick`]: uniform or weight-proportional.
//! - [`byrequests::ByRequests`]: mod_proxy_balancer `byrequests` (lbfactor /
//!   lbstatus), the scheduler of `weighted-round-robin` and `metric`.
//! - [`bytraffic::ByTraffic`]: mod_proxy_balancer `bytraffic`.
//! - [`metric`]: the mod_oc4j load metric: effective values, smoothing, and
//!   how a node computes its own metric.
//! - [`least_load::LeastLoad`]: lowest `N * (10000 / weight)`, ties round robin.
//!
//! "Configured order" (the tie-break of the reference schedulers) is node id
//! order: peerlb has no list order that every node agrees on (members come
//! from gossip, in any order), and a position is never an identity, so ids
//! sorted ascending are the only order that gives every entry node the same
//! schedule.
//!
//! Case codes (A1, A4, A5, A6, A8, A9, A10, A11) name cases of `docs/cases.md`: the input, the
//! value peerlb must give, and where it is tested.

use std::fmt;
use std::str::FromStr;

use rand::{Rng, RngExt};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::node_id::NodeId;

pub(crate) mod byrequests;
pub(crate) mod bytraffic;
pub(crate) mod least_load;
pub(crate) mod metric;

/// The balancing algorithm (config `policy`, kebab-case). The `:local`
/// affinity suffix is part of `Policy`, not of the kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// `consistent-hash`: hash the key from the data-centric rules (or the
    /// default key) on the ring, optionally with bounded loads. With no rules
    /// configured at all, HTTP uses sticky round robin.
    ConsistentHash,
    /// `sticky-round-robin`: new requests go round robin; requests carrying a
    /// sticky route go to that node while it serves.
    StickyRoundRobin,
    /// `round-robin`: each request goes to the next serving node by id;
    /// members that are down are skipped and rejoin without a burst (A11).
    RoundRobin,
    /// `random`: a uniformly random serving node (caller-seeded RNG).
    Random,
    /// `weighted-random`: a random serving node with probability
    /// `weight / sum of weights` (WebLogic's weight-based selection, A10).
    WeightedRandom,
    /// `weighted-round-robin`: mod_proxy_balancer `byrequests` with lbfactor =
    /// the member's weight (A1-A4, A10).
    WeightedRoundRobin,
    /// `by-traffic`: mod_proxy_balancer `bytraffic`: the node with the fewest
    /// bytes per unit of weight (A5). Bytes come from
    /// `Router::record_bytes`.
    ByTraffic,
    /// `metric`: mod_oc4j's metric routing: each node's share is its load
    /// metric (0..=100, 100 = idle; unreported = 50) over the sum (A6-A8).
    Metric,
    /// `least-load`: the lowest `N * (10000 / weight)` with `N` the node's
    /// load figure (in-flight requests); ties round robin (A9).
    LeastLoad,
}

impl PolicyKind {
    /// The config spelling, e.g. `"consistent-hash"`.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::ConsistentHash => "consistent-hash",
            PolicyKind::StickyRoundRobin => "sticky-round-robin",
            PolicyKind::RoundRobin => "round-robin",
            PolicyKind::Random => "random",
            PolicyKind::WeightedRandom => "weighted-random",
            PolicyKind::WeightedRoundRobin => "weighted-round-robin",
            PolicyKind::ByTraffic => "by-traffic",
            PolicyKind::Metric => "metric",
            PolicyKind::LeastLoad => "least-load",
        }
    }

    /// Every policy, in declaration order (for help texts and errors).
    pub const ALL: [PolicyKind; 9] = [
        PolicyKind::ConsistentHash,
        PolicyKind::StickyRoundRobin,
        PolicyKind::RoundRobin,
        PolicyKind::Random,
        PolicyKind::WeightedRandom,
        PolicyKind::WeightedRoundRobin,
        PolicyKind::ByTraffic,
        PolicyKind::Metric,
        PolicyKind::LeastLoad,
    ];

    /// True when the policy has a `:local` variant. Every policy has one
    /// except `consistent-hash`: serving a keyed request on the entry node
    /// would defeat the key's ownership (and its cache locality) on every
    /// node at once.
    pub fn has_local_variant(self) -> bool {
        self != PolicyKind::ConsistentHash
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy name that is not one of [`PolicyKind::ALL`] (optionally with
/// `:local`), or `consistent-hash:local`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParsePolicyError {
    /// Not a policy name.
    #[error(
        "unknown policy {0:?} (expected consistent-hash, sticky-round-robin, round-robin, random, weighted-random, weighted-round-robin, by-traffic, metric or least-load, optionally with :local)"
    )]
    Unknown(String),
    /// `consistent-hash:local`: a keyed policy has no local variant; use
    /// `consistent-hash`, or a rotation policy with `:local`.
    #[error("policy {0:?} has no :local variant (the key decides the owner)")]
    NoLocalVariant(String),
}

impl FromStr for PolicyKind {
    type Err = ParsePolicyError;

    /// Parses the exact kebab-case name (no `:local` suffix; see `Policy`).
    ///
    /// # Errors
    ///
    /// `ParsePolicyError::Unknown` for any other string.
    fn from_str(s: &str) -> Result<PolicyKind, ParsePolicyError> {
        PolicyKind::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| ParsePolicyError::Unknown(s.to_owned()))
    }
}

/// A configured policy: the algorithm and whether it has local affinity.
///
/// Spelled `"<kind>"` or `"<kind>:local"` (e.g. `"least-load:local"`), as
/// mod_oc4j's `Oc4jSelectMethod` spells `metric:local`. With local affinity
/// the entry node serves a request itself whenever it is serving (and, for the
/// weighted policies, has a weight above 0); otherwise the algorithm decides.
/// A sticky route still wins over local affinity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Policy {
    kind: PolicyKind,
    local: bool,
}

impl Policy {
    /// The policy `kind` without local affinity.
    pub fn new(kind: PolicyKind) -> Policy {
        Policy { kind, local: false }
    }

    /// The `:local` variant of `kind`.
    ///
    /// # Errors
    ///
    /// `ParsePolicyError::NoLocalVariant` for `consistent-hash`.
    pub fn local(kind: PolicyKind) -> Result<Policy, ParsePolicyError> {
        if !kind.has_local_variant() {
            return Err(ParsePolicyError::NoLocalVariant(format!("{kind}:local")));
        }
        Ok(Policy { kind, local: true })
    }

    /// The algorithm.
    pub fn kind(self) -> PolicyKind {
        self.kind
    }

    /// True for a `:local` variant.
    pub fn is_local(self) -> bool {
        self.local
    }
}

impl From<PolicyKind> for Policy {
    fn from(kind: PolicyKind) -> Policy {
        Policy::new(kind)
    }
}

impl PartialEq<PolicyKind> for Policy {
    /// A policy equals a kind when it is that kind without `:local`.
    fn eq(&self, other: &PolicyKind) -> bool {
        !self.local && self.kind == *other
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.as_str())?;
        if self.local {
            f.write_str(":local")?;
        }
        Ok(())
    }
}

impl FromStr for Policy {
    type Err = ParsePolicyError;

    /// Parses `"<kind>"` or `"<kind>:local"`.
    ///
    /// # Errors
    ///
    /// `Unknown` for a name that is not a policy; `NoLocalVariant` for
    /// `consistent-hash:local`.
    fn from_str(s: &str) -> Result<Policy, ParsePolicyError> {
        match s.strip_suffix(":local") {
            Some(kind) => {
                let kind = kind
                    .parse::<PolicyKind>()
                    .map_err(|_| ParsePolicyError::Unknown(s.to_owned()))?;
                Policy::local(kind)
            }
            None => s.parse::<PolicyKind>().map(Policy::new),
        }
    }
}

impl Serialize for Policy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Policy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Policy, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Round robin over the serving members, keyed on the id of the last pick.
///
/// Each pick is the first serving id strictly greater than the last pick,
/// wrapping to the smallest. A member that is down is simply not in the list;
/// when it returns it is picked when the rotation reaches its position, once,
/// with no catch-up burst (A11: n1 n2 n3 with n2 down gives n1 n3 n1 n3 ...).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RoundRobin {
    last: Option<NodeId>,
}

impl RoundRobin {
    /// A rotation that starts at the smallest id.
    pub(crate) fn new() -> RoundRobin {
        RoundRobin::default()
    }

    /// Picks the next id from `serving` (sorted ascending, distinct) and
    /// remembers it. `None` when `serving` is empty (state unchanged).
    pub(crate) fn pick(&mut self, serving: &[NodeId]) -> Option<NodeId> {
        let i = self.peek_index(serving)?;
        let id = serving[i].clone();
        self.last = Some(id.clone());
        Some(id)
    }

    /// The index in `serving` of the id [`RoundRobin::pick`] would return.
    pub(crate) fn peek_index(&self, serving: &[NodeId]) -> Option<usize> {
        if serving.is_empty() {
            return None;
        }
        let i = match &self.last {
            Some(last) => serving.partition_point(|id| id <= last),
            None => 0,
        };
        Some(if i == serving.len() { 0 } else { i })
    }

    /// The id of the last pick, if any.
    #[cfg(test)]
    pub(crate) fn last(&self) -> Option<&NodeId> {
        self.last.as_ref()
    }
}

/// A uniformly random id from `serving`; `None` when it is empty. Uses one
/// draw of `rng` (the caller seeds it; simulations print the seed).
pub(crate) fn random_pick(serving: &[NodeId], rng: &mut impl Rng) -> Option<NodeId> {
    if serving.is_empty() {
        return None;
    }
    Some(serving[rng.random_range(0..serving.len())].clone())
}

/// Weight-proportional random choice (WebLogic's weight-based load
/// balancing): index `i` with probability `weights[i] / sum`. Uses one draw
/// of `rng` in `0..sum` and walks the cumulative weights in order. `None` when
/// the slice is empty or every weight is 0.
pub(crate) fn weighted_random_pick(weights: &[u32], rng: &mut impl Rng) -> Option<usize> {
    let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
    if total == 0 {
        return None;
    }
    let mut r = rng.random_range(0..total);
    weights.iter().position(|&w| {
        let w = u64::from(w);
        if r < w {
            true
        } else {
            r -= w;
            false
        }
    })
}

/// `serving` in rotation order starting at index `start`: `serving[start..]`
/// then `serving[..start]` (the failover order of the rotation policies).
pub(crate) fn rotation_from(serving: &[NodeId], start: usize) -> impl Iterator<Item = &NodeId> {
    let start = start.min(serving.len());
    serving[start..].iter().chain(&serving[..start])
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::Xoshiro256PlusPlus;

    fn ids(names: &[&str]) -> Vec<NodeId> {
        names.iter().map(|n| NodeId::from(*n)).collect()
    }

    fn picks(rr: &mut RoundRobin, serving: &[NodeId], n: usize) -> Vec<String> {
        (0..n)
            .map(|_| rr.pick(serving).unwrap().to_string())
            .collect()
    }

    #[test]
    fn policy_names_roundtrip() {
        for p in PolicyKind::ALL {
            assert_eq!(p.to_string().parse::<PolicyKind>(), Ok(p));
            assert_eq!(p.to_string().parse::<Policy>(), Ok(Policy::new(p)));
            if p.has_local_variant() {
                let local = format!("{p}:local").parse::<Policy>().unwrap();
                assert_eq!((local.kind(), local.is_local()), (p, true));
                assert_eq!(local.to_string(), format!("{p}:local"));
                assert_ne!(local, p);
            }
        }
        assert_eq!(
            "sticky-round-robin".parse(),
            Ok(PolicyKind::StickyRoundRobin)
        );
        assert_eq!(
            "RoundRobin".parse::<PolicyKind>().unwrap_err().to_string(),
            "unknown policy \"RoundRobin\" (expected consistent-hash, sticky-round-robin, round-robin, random, weighted-random, weighted-round-robin, by-traffic, metric or least-load, optionally with :local)"
        );
        assert_eq!(
            "least-load:local".parse::<PolicyKind>(),
            Err(ParsePolicyError::Unknown("least-load:local".into()))
        );
        assert_eq!(
            "consistent-hash:local"
                .parse::<Policy>()
                .unwrap_err()
                .to_string(),
            "policy \"consistent-hash:local\" has no :local variant (the key decides the owner)"
        );
        assert_eq!(
            "metric:remote".parse::<Policy>(),
            Err(ParsePolicyError::Unknown("metric:remote".into()))
        );
        assert_eq!(
            "nope:local".parse::<Policy>(),
            Err(ParsePolicyError::Unknown("nope:local".into()))
        );
        #[derive(Deserialize)]
        struct C {
            policy: PolicyKind,
        }
        let c: C = toml::from_str("policy = \"consistent-hash\"").unwrap();
        assert_eq!(c.policy, PolicyKind::ConsistentHash);
        #[derive(Deserialize, Debug)]
        struct P {
            policy: Policy,
        }
        let c: P = toml::from_str("policy = \"metric:local\"").unwrap();
        assert_eq!(c.policy, Policy::local(PolicyKind::Metric).unwrap());
        assert_eq!(Policy::from(PolicyKind::Metric), PolicyKind::Metric);
        let bad = toml::from_str::<P>("policy = \"consistent-hash:local\"");
        assert!(bad.unwrap_err().to_string().contains("no :local variant"));
    }

    #[test]
    fn a10_weighted_random_shares_follow_weights() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(10);
        let mut counts = [0u32; 3];
        for _ in 0..50_000 {
            counts[weighted_random_pick(&[50, 100, 100], &mut rng).unwrap()] += 1;
        }
        // Expected 10 000 / 20 000 / 20 000.
        for (c, want) in counts.iter().zip([10_000.0, 20_000.0, 20_000.0]) {
            assert!((f64::from(*c) / want - 1.0).abs() < 0.03, "{counts:?}");
        }
        assert_eq!(weighted_random_pick(&[0, 0], &mut rng), None);
        assert_eq!(weighted_random_pick(&[], &mut rng), None);
        assert_eq!(weighted_random_pick(&[0, 7, 0], &mut rng), Some(1));
    }

    #[test]
    fn a11_round_robin_skips_down_member_and_rejoins_without_burst() {
        let all = ids(&["n1", "n2", "n3"]);
        let without_n2 = ids(&["n1", "n3"]);
        let mut rr = RoundRobin::new();
        assert_eq!(picks(&mut rr, &all, 4), ["n1", "n2", "n3", "n1"]);
        // n2 goes down.
        assert_eq!(
            picks(&mut rr, &without_n2, 5),
            ["n3", "n1", "n3", "n1", "n3"]
        );
        // n2 returns: it is picked at its position, once per round.
        assert_eq!(
            picks(&mut rr, &all, 6),
            ["n1", "n2", "n3", "n1", "n2", "n3"]
        );
    }

    #[test]
    fn round_robin_survives_the_last_pick_leaving() {
        let mut rr = RoundRobin::new();
        assert_eq!(picks(&mut rr, &ids(&["a", "b", "c"]), 2), ["a", "b"]);
        // b (the last pick) is gone: the rotation continues after its position.
        assert_eq!(picks(&mut rr, &ids(&["a", "c"]), 3), ["c", "a", "c"]);
        assert_eq!(rr.pick(&[]), None);
        assert_eq!(rr.last().map(|s| &**s), Some("c"));
        assert_eq!(picks(&mut rr, &ids(&["b"]), 2), ["b", "b"]);
    }

    #[test]
    fn rotation_order() {
        let s = ids(&["a", "b", "c", "d"]);
        let r: Vec<&str> = rotation_from(&s, 2).map(|s| &**s).collect();
        assert_eq!(r, ["c", "d", "a", "b"]);
        assert_eq!(rotation_from(&s, 9).count(), 4);
        assert_eq!(rotation_from(&[], 0).count(), 0);
    }

    #[test]
    fn random_pick_is_seeded_and_uniform() {
        let s = ids(&["a", "b", "c", "d"]);
        let mut r1 = Xoshiro256PlusPlus::seed_from_u64(7);
        let mut r2 = Xoshiro256PlusPlus::seed_from_u64(7);
        let a: Vec<_> = (0..50).map(|_| random_pick(&s, &mut r1)).collect();
        let b: Vec<_> = (0..50).map(|_| random_pick(&s, &mut r2)).collect();
        assert_eq!(a, b);
        let mut counts = std::collections::BTreeMap::new();
        for _ in 0..40_000 {
            *counts.entry(random_pick(&s, &mut r1).unwrap()).or_insert(0) += 1;
        }
        for (id, c) in counts {
            assert!((9_000..=11_000).contains(&c), "{id}: {c}");
        }
        assert_eq!(random_pick(&[], &mut r1), None);
    }
}
