//! Balancing policies as pure state machines: given the serving members (and,
//! for later policies, their weights and load), pick the owner of a request.
//!
//! Policies here: round robin (keyed on the last pick's node id, so it skips
//! members that are down and resumes them without a burst, case A11) and
//! uniform random. Weighted round robin (mod_proxy_balancer byrequests),
//! by-traffic, metric (mod_oc4j), least-load and the `:local` variants come
//! with later issues.

use std::fmt;
use std::str::FromStr;

use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};

use super::membership::NodeId;

/// The balancing policy (config `policy`, kebab-case).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// `consistent-hash`: hash the key from the data-centric rules (or the
    /// default key) on the ring. With no rules configured at all, HTTP uses
    /// sticky round robin.
    ConsistentHash,
    /// `sticky-round-robin`: new requests go round robin; requests carrying a
    /// sticky route go to that node while it serves.
    StickyRoundRobin,
    /// `round-robin`: each request goes to the next serving node by id.
    RoundRobin,
    /// `random`: a uniformly random serving node (caller-seeded RNG).
    Random,
}

impl PolicyKind {
    /// The config spelling, e.g. `"consistent-hash"`.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::ConsistentHash => "consistent-hash",
            PolicyKind::StickyRoundRobin => "sticky-round-robin",
            PolicyKind::RoundRobin => "round-robin",
            PolicyKind::Random => "random",
        }
    }

    /// Every policy, in declaration order (for help texts and errors).
    pub const ALL: [PolicyKind; 4] = [
        PolicyKind::ConsistentHash,
        PolicyKind::StickyRoundRobin,
        PolicyKind::RoundRobin,
        PolicyKind::Random,
    ];
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy name that is not one of [`PolicyKind::ALL`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown policy {0:?} (expected consistent-hash, sticky-round-robin, round-robin or random)"
)]
pub struct ParsePolicyError(pub String);

impl FromStr for PolicyKind {
    type Err = ParsePolicyError;

    /// Parses the exact kebab-case name.
    ///
    /// # Errors
    ///
    /// `ParsePolicyError` for any other string.
    fn from_str(s: &str) -> Result<PolicyKind, ParsePolicyError> {
        PolicyKind::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| ParsePolicyError(s.to_owned()))
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
        }
        assert_eq!(
            "sticky-round-robin".parse(),
            Ok(PolicyKind::StickyRoundRobin)
        );
        assert_eq!(
            "RoundRobin".parse::<PolicyKind>().unwrap_err().to_string(),
            "unknown policy \"RoundRobin\" (expected consistent-hash, sticky-round-robin, round-robin or random)"
        );
        #[derive(Deserialize)]
        struct C {
            policy: PolicyKind,
        }
        let c: C = toml::from_str("policy = \"consistent-hash\"").unwrap();
        assert_eq!(c.policy, PolicyKind::ConsistentHash);
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
