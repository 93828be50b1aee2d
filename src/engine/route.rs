//! The routing decision: `decide(request, membership view, now, rng)` gives
//! the owner of a request and the failover order ([`Decision`]).
//!
//! Order of precedence (DESIGN.md, "What the seeds' algorithms mean exactly"):
//!
//! 1. A sticky route (cookie or `;peerlb-route=` parameter) naming a
//!    *serving* member wins; one naming an unknown or non-serving node is
//!    ignored (H4: forged routes gain nothing; C7: a dead node's sessions
//!    fail over).
//! 2. `consistent-hash`: the key from the first matching data-centric rule,
//!    else the default key (client host:port, H2), looked up on the ring.
//!    With no rules configured at all it behaves as sticky round robin.
//! 3. `sticky-round-robin`, `round-robin`: the next serving node by id.
//! 4. `random`: a uniformly random serving node.
//! 5. No serving member at all: the entry node serves the request itself.

use std::fmt;
use std::time::Duration;

use rand::Rng;

use super::balance::{PolicyKind, RoundRobin, random_pick, rotation_from};
use super::membership::{MembershipView, NodeId};
use super::rules::{RequestView, Rules, default_key};
use super::sticky::route_from_request;

/// Why a [`Decision`] picked its owner (for logs, metrics and the
/// `peerlb-reason` debug header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The request's sticky route named a serving member.
    StickyRoute,
    /// Consistent hash on the key from data-centric rule `n` (0-based).
    Rule(usize),
    /// Consistent hash on the default key (client host:port): rules are
    /// configured but none yielded a key.
    DefaultKey,
    /// Round robin (including sticky round robin before a session exists).
    RoundRobin,
    /// Random pick.
    Random,
    /// No serving member: the entry node serves the request itself.
    NoMembers,
}

impl Reason {
    /// Stable lowercase name: `sticky-route`, `rule`, `default-key`,
    /// `round-robin`, `random`, `no-members` (the rule index is in
    /// [`Reason::Rule`] and in `Display`, which writes `rule[n]`).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::StickyRoute => "sticky-route",
            Reason::Rule(_) => "rule",
            Reason::DefaultKey => "default-key",
            Reason::RoundRobin => "round-robin",
            Reason::Random => "random",
            Reason::NoMembers => "no-members",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Rule(n) => write!(f, "rule[{n}]"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// The outcome of routing one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The node that should serve the request (`candidates[0]`).
    pub owner: NodeId,
    /// The owner first, then the failover order: distinct nodes, each at most
    /// once, all serving in the view (except the entry node itself under
    /// [`Reason::NoMembers`]). Never empty.
    pub candidates: Vec<NodeId>,
    /// The hash key, when the policy hashed one.
    pub key: Option<String>,
    /// Why the owner was picked.
    pub reason: Reason,
}

/// The per-node routing state machine: the policy, the compiled rules and the
/// round-robin position. One per entry node (or per runtime thread; each
/// rotates independently).
#[derive(Debug)]
pub struct Router {
    policy: PolicyKind,
    rules: Rules,
    rr: RoundRobin,
}

/// The policy as it actually runs.
enum Effective {
    Hash,
    Rotation,
    Random,
}

impl Router {
    /// A router for `policy` with compiled `rules`.
    pub fn new(policy: PolicyKind, rules: Rules) -> Router {
        Router {
            policy,
            rules,
            rr: RoundRobin::new(),
        }
    }

    /// The configured policy.
    pub fn policy(&self) -> PolicyKind {
        self.policy
    }

    /// The compiled data-centric rules.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// True when the effective policy is sticky round robin
    /// (`sticky-round-robin`, or `consistent-hash` with no rules): the ingress
    /// then sets the route cookie (or path parameter) when the app starts a
    /// session, and rewrites it after a failover (C7).
    pub fn is_sticky(&self) -> bool {
        match self.policy {
            PolicyKind::StickyRoundRobin => true,
            PolicyKind::ConsistentHash => self.rules.is_empty(),
            PolicyKind::RoundRobin | PolicyKind::Random => false,
        }
    }

    fn effective(&self) -> Effective {
        match self.policy {
            PolicyKind::ConsistentHash if !self.rules.is_empty() => Effective::Hash,
            PolicyKind::ConsistentHash | PolicyKind::StickyRoundRobin | PolicyKind::RoundRobin => {
                Effective::Rotation
            }
            PolicyKind::Random => Effective::Random,
        }
    }

    /// Routes one request against `view`.
    ///
    /// `now` (time since an arbitrary epoch) is unused by the current
    /// policies and reserved for time-based ones; `rng` is drawn from only by
    /// `random` (once per request without a valid sticky route). A request
    /// with a valid sticky route does not advance the round-robin position.
    pub fn decide(
        &mut self,
        req: &RequestView<'_>,
        view: &MembershipView,
        now: Duration,
        rng: &mut impl Rng,
    ) -> Decision {
        let _ = now;
        let serving = view.serving_ids();
        if serving.is_empty() {
            return Decision {
                owner: view.self_id().clone(),
                candidates: vec![view.self_id().clone()],
                key: None,
                reason: Reason::NoMembers,
            };
        }
        let sticky = route_from_request(req.headers, req.uri)
            .and_then(|r| serving.binary_search_by(|id| (**id).cmp(r.as_str())).ok());
        let rotation = |i: usize| rotation_from(serving, i).cloned().collect::<Vec<_>>();

        match self.effective() {
            Effective::Hash if !view.ring().is_empty() => {
                let (key, reason) = match self.rules.extract(req) {
                    Some((i, k)) => (k, Reason::Rule(i)),
                    None => (default_key(req.client), Reason::DefaultKey),
                };
                let ring = view.ring().candidates(&key);
                let (candidates, reason) = match sticky {
                    Some(i) => {
                        let owner = &serving[i];
                        let mut c = Vec::with_capacity(ring.len() + 1);
                        c.push(owner.clone());
                        c.extend(ring.filter(|id| *id != owner).cloned());
                        (c, Reason::StickyRoute)
                    }
                    None => (ring.cloned().collect(), reason),
                };
                Decision {
                    owner: candidates[0].clone(),
                    candidates,
                    key: Some(key),
                    reason,
                }
            }
            effective => {
                let (start, reason) = match (sticky, effective) {
                    (Some(i), _) => (i, Reason::StickyRoute),
                    (None, Effective::Random) => {
                        let id = random_pick(serving, rng).expect("serving is not empty");
                        let i = serving.binary_search(&id).expect("picked from serving");
                        (i, Reason::Random)
                    }
                    // Rotation, or a hash policy whose ring is empty because
                    // every serving member has weight 0.
                    (None, _) => {
                        let i = self.rr.peek_index(serving).expect("serving is not empty");
                        self.rr.pick(serving);
                        (i, Reason::RoundRobin)
                    }
                };
                let candidates = rotation(start);
                Decision {
                    owner: candidates[0].clone(),
                    candidates,
                    key: None,
                    reason,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::membership::NodeStatus::{self, *};
    use crate::engine::membership::tests::{member, view};
    use crate::engine::rules::RuleSpec;
    use crate::engine::sticky::encode_route_param;
    use http::header::COOKIE;
    use http::{HeaderMap, HeaderValue, Method, Uri};
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::Xoshiro256PlusPlus;
    use std::net::SocketAddr;

    const T0: Duration = Duration::ZERO;

    struct Req {
        method: Method,
        uri: Uri,
        headers: HeaderMap,
        client: SocketAddr,
    }

    impl Req {
        fn new(uri: &str, cookie: Option<&str>, client: &str) -> Req {
            let mut headers = HeaderMap::new();
            if let Some(c) = cookie {
                headers.insert(COOKIE, HeaderValue::from_str(c).unwrap());
            }
            Req {
                method: Method::GET,
                uri: uri.parse().unwrap(),
                headers,
                client: client.parse().unwrap(),
            }
        }

        fn view(&self) -> RequestView<'_> {
            RequestView {
                method: &self.method,
                uri: &self.uri,
                headers: &self.headers,
                client: self.client,
            }
        }
    }

    fn rng() -> Xoshiro256PlusPlus {
        Xoshiro256PlusPlus::seed_from_u64(42)
    }

    fn user_rules() -> Rules {
        Rules::compile(&[RuleSpec {
            name: None,
            when: Default::default(),
            extract: vec![crate::engine::rules::ExtractorSpec {
                query: Some("user".into()),
                ..Default::default()
            }],
        }])
        .unwrap()
    }

    fn three() -> MembershipView {
        view("n1", &[("n1", Serving), ("n2", Serving), ("n3", Serving)])
    }

    fn ids(d: &Decision) -> Vec<&str> {
        d.candidates.iter().map(|s| &**s).collect()
    }

    fn decide(router: &mut Router, req: &Req, v: &MembershipView) -> Decision {
        router.decide(&req.view(), v, T0, &mut rng())
    }

    #[test]
    fn reason_names() {
        assert_eq!(Reason::Rule(3).as_str(), "rule");
        assert_eq!(Reason::Rule(3).to_string(), "rule[3]");
        assert_eq!(Reason::StickyRoute.to_string(), "sticky-route");
        assert_eq!(Reason::NoMembers.as_str(), "no-members");
    }

    #[test]
    fn consistent_hash_rule_key() {
        let mut r = Router::new(PolicyKind::ConsistentHash, user_rules());
        assert!(!r.is_sticky());
        let v = three();
        let d = decide(
            &mut r,
            &Req::new("/x?user=alice", None, "192.0.2.1:1000"),
            &v,
        );
        assert_eq!(d.key.as_deref(), Some("alice"));
        assert_eq!(d.reason, Reason::Rule(0));
        assert_eq!(Some(&d.owner), v.ring().owner("alice"));
        let want: Vec<NodeId> = v.ring().candidates("alice").cloned().collect();
        assert_eq!(d.candidates, want);
        // Same key from another client: same owner.
        let d2 = decide(
            &mut r,
            &Req::new("/y?user=alice", None, "192.0.2.9:2000"),
            &v,
        );
        assert_eq!(d2.candidates, d.candidates);
    }

    #[test]
    fn h2_no_rule_matching_uses_client_host_and_port() {
        let mut r = Router::new(PolicyKind::ConsistentHash, user_rules());
        let v = three();
        let d = decide(&mut r, &Req::new("/x", None, "192.0.2.1:1000"), &v);
        assert_eq!(d.key.as_deref(), Some("192.0.2.1:1000"));
        assert_eq!(d.reason, Reason::DefaultKey);
        assert_eq!(Some(&d.owner), v.ring().owner("192.0.2.1:1000"));
    }

    #[test]
    fn h3_no_rules_means_sticky_round_robin() {
        let mut r = Router::new(PolicyKind::ConsistentHash, Rules::default());
        assert!(r.is_sticky());
        let v = three();
        let req = Req::new("/", None, "192.0.2.1:1000");
        let want = [
            ["n1", "n2", "n3"],
            ["n2", "n3", "n1"],
            ["n3", "n1", "n2"],
            ["n1", "n2", "n3"],
        ];
        for w in want {
            let d = decide(&mut r, &req, &v);
            assert_eq!((d.reason, d.key.as_deref()), (Reason::RoundRobin, None));
            assert_eq!(&*d.owner, w[0]);
            assert_eq!(ids(&d), w);
        }
        // Once the session exists, the route sticks, and does not advance
        // the rotation.
        let sticky = Req::new("/", Some("peerlb-route=n3"), "192.0.2.1:1000");
        for _ in 0..3 {
            let d = decide(&mut r, &sticky, &v);
            assert_eq!(ids(&d), ["n3", "n1", "n2"]);
            assert_eq!(d.reason, Reason::StickyRoute);
        }
        assert_eq!(&*decide(&mut r, &req, &v).owner, "n2");
    }

    #[test]
    fn a11_round_robin_policy_over_views() {
        let mut r = Router::new(PolicyKind::RoundRobin, Rules::default());
        assert!(!r.is_sticky());
        let req = Req::new("/", None, "192.0.2.1:1000");
        let down = view("n1", &[("n1", Serving), ("n2", Leaving), ("n3", Serving)]);
        let owners: Vec<String> = (0..4)
            .map(|_| decide(&mut r, &req, &down).owner.to_string())
            .collect();
        assert_eq!(owners, ["n1", "n3", "n1", "n3"]);
        let d = decide(&mut r, &req, &down);
        assert_eq!(ids(&d), ["n1", "n3"]);
        let owners: Vec<String> = (0..3)
            .map(|_| decide(&mut r, &req, &three()).owner.to_string())
            .collect();
        assert_eq!(owners, ["n2", "n3", "n1"]);
    }

    #[test]
    fn sticky_route_wins_under_consistent_hash() {
        let mut r = Router::new(PolicyKind::ConsistentHash, user_rules());
        let v = three();
        let plain = decide(
            &mut r,
            &Req::new("/x?user=alice", None, "192.0.2.1:1000"),
            &v,
        );
        let other = plain.candidates[2].clone();
        let req = Req::new(
            "/x?user=alice",
            Some(&format!("peerlb-route={other}")),
            "192.0.2.1:1000",
        );
        let d = decide(&mut r, &req, &v);
        assert_eq!(d.reason, Reason::StickyRoute);
        assert_eq!(d.owner, other);
        assert_eq!(d.key.as_deref(), Some("alice"));
        let want = vec![
            plain.candidates[2].clone(),
            plain.candidates[0].clone(),
            plain.candidates[1].clone(),
        ];
        assert_eq!(d.candidates, want);
    }

    #[test]
    fn h4_forged_or_non_serving_route_is_ignored() {
        let v = view("n1", &[("n1", Serving), ("n2", Draining), ("n3", Serving)]);
        for policy in PolicyKind::ALL {
            for route in ["ghost", "n2", "", "n1%00"] {
                let rules = if policy == PolicyKind::ConsistentHash {
                    user_rules()
                } else {
                    Rules::default()
                };
                let (mut a, mut b) = (
                    Router::new(policy, rules.clone()),
                    Router::new(policy, rules),
                );
                let honest = Req::new("/x?user=u", None, "192.0.2.1:1000");
                let forged_cookie = Req::new(
                    "/x?user=u",
                    Some(&format!("peerlb-route={route}")),
                    "192.0.2.1:1000",
                );
                let forged_param = Req::new(
                    &format!("/x{}?user=u", encode_route_param(route)),
                    None,
                    "192.0.2.1:1000",
                );
                for forged in [&forged_cookie, &forged_param] {
                    let want = decide(&mut a, &honest, &v);
                    let got = decide(&mut b, forged, &v);
                    assert_eq!(got, want, "{policy} {route:?}");
                    assert_ne!(got.reason, Reason::StickyRoute);
                    assert!(!got.candidates.iter().any(|c| &**c == "n2"));
                }
            }
        }
    }

    #[test]
    fn c7_dead_sticky_node_fails_over_to_a_serving_node() {
        let mut r = Router::new(PolicyKind::StickyRoundRobin, Rules::default());
        assert!(r.is_sticky());
        let req = Req::new("/cart", Some("peerlb-route=n2"), "192.0.2.1:1000");
        assert_eq!(&*decide(&mut r, &req, &three()).owner, "n2");
        // n2 died (gone from the view) or is leaving: the route is ignored.
        for v in [
            view("n1", &[("n1", Serving), ("n3", Serving)]),
            view("n1", &[("n1", Serving), ("n2", Leaving), ("n3", Serving)]),
        ] {
            let d = decide(&mut r, &req, &v);
            assert_ne!(&*d.owner, "n2");
            assert_eq!(d.reason, Reason::RoundRobin);
            assert!(d.candidates.iter().all(|c| v.is_serving(c)));
            // The ingress rewrites the cookie to d.owner; the next request sticks.
            let next = Req::new(
                "/cart",
                Some(&format!("peerlb-route={}", d.owner)),
                "192.0.2.1:1000",
            );
            let d2 = decide(&mut r, &next, &v);
            assert_eq!((d2.owner, d2.reason), (d.owner, Reason::StickyRoute));
        }
    }

    #[test]
    fn c6_dead_owner_next_node_on_ring_takes_over() {
        let mut r = Router::new(PolicyKind::ConsistentHash, user_rules());
        let req = Req::new("/x?user=bob", None, "192.0.2.1:1000");
        let v = three();
        let before = decide(&mut r, &req, &v);
        let dead = before.owner.to_string();
        let members: Vec<(&str, NodeStatus)> = ["n1", "n2", "n3"]
            .into_iter()
            .map(|id| (id, if id == dead { Leaving } else { Serving }))
            .collect();
        let after = decide(&mut r, &req, &view("n1", &members));
        assert_eq!(after.candidates, before.candidates[1..]);
    }

    #[test]
    fn c4_views_from_any_order_decide_alike() {
        let ms: Vec<_> = ["d", "a", "c", "b"]
            .iter()
            .map(|id| member(id, 1, Serving))
            .collect();
        let mut rev = ms.clone();
        rev.reverse();
        let va = MembershipView::new("a".into(), ms, 160);
        let vb = MembershipView::new("b".into(), rev, 160);
        let mut ra = Router::new(PolicyKind::ConsistentHash, user_rules());
        let mut rb = Router::new(PolicyKind::ConsistentHash, user_rules());
        for u in 0..200 {
            let req = Req::new(&format!("/?user=u{u}"), None, "192.0.2.1:1000");
            assert_eq!(decide(&mut ra, &req, &va), decide(&mut rb, &req, &vb));
        }
    }

    #[test]
    fn random_is_seeded() {
        let v = view(
            "n1",
            &[
                ("n1", Serving),
                ("n2", Serving),
                ("n3", Serving),
                ("n4", Serving),
            ],
        );
        let req = Req::new("/", None, "192.0.2.1:1000");
        let run = |seed: u64| {
            let mut r = Router::new(PolicyKind::Random, Rules::default());
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
            (0..20)
                .map(|_| r.decide(&req.view(), &v, T0, &mut rng))
                .collect::<Vec<_>>()
        };
        let a = run(1);
        assert_eq!(a, run(1));
        assert_ne!(a, run(2));
        for d in &a {
            assert_eq!(d.reason, Reason::Random);
            let i = v
                .serving_ids()
                .iter()
                .position(|id| *id == d.owner)
                .unwrap();
            let want: Vec<NodeId> = rotation_from(v.serving_ids(), i).cloned().collect();
            assert_eq!(d.candidates, want);
        }
    }

    #[test]
    fn no_serving_members_the_entry_serves_itself() {
        let v = view("self", &[("self", Draining), ("n2", Leaving)]);
        let empty = MembershipView::new("self".into(), [], 160);
        for v in [v, empty] {
            for policy in PolicyKind::ALL {
                let mut r = Router::new(policy, user_rules());
                let d = decide(
                    &mut r,
                    &Req::new("/?user=a", Some("peerlb-route=n2"), "192.0.2.1:1"),
                    &v,
                );
                assert_eq!(
                    d,
                    Decision {
                        owner: "self".into(),
                        candidates: vec!["self".into()],
                        key: None,
                        reason: Reason::NoMembers
                    }
                );
            }
        }
    }

    #[test]
    fn hash_with_all_weights_zero_falls_back_to_rotation() {
        let mut m = vec![member("a", 1, Serving), member("b", 1, Serving)];
        for x in &mut m {
            x.weight = 0;
        }
        let v = MembershipView::new("a".into(), m, 160);
        let mut r = Router::new(PolicyKind::ConsistentHash, user_rules());
        let d = decide(&mut r, &Req::new("/?user=x", None, "192.0.2.1:1"), &v);
        assert_eq!((ids(&d), d.reason), (vec!["a", "b"], Reason::RoundRobin));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Every decision: owner first, candidates distinct and serving.
        #[test]
        fn candidates_are_distinct_and_serving(
            statuses in proptest::collection::vec(0u8..3, 1..8),
            policy in 0usize..4,
            user in "[a-z]{0,4}",
            route in 0usize..10,
            seed in any::<u64>(),
        ) {
            let names: Vec<String> = (0..statuses.len()).map(|i| format!("n{i}")).collect();
            let members: Vec<(&str, NodeStatus)> = names.iter().zip(&statuses)
                .map(|(n, s)| (n.as_str(), [Serving, Draining, Leaving][*s as usize]))
                .collect();
            let v = view("n0", &members);
            let policy = PolicyKind::ALL[policy];
            let mut r = Router::new(policy, user_rules());
            let req = Req::new(&format!("/?user={user}"), Some(&format!("peerlb-route=n{route}")), "192.0.2.1:1");
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
            let d = r.decide(&req.view(), &v, T0, &mut rng);
            prop_assert_eq!(&d.candidates[0], &d.owner);
            let set: std::collections::BTreeSet<_> = d.candidates.iter().collect();
            prop_assert_eq!(set.len(), d.candidates.len());
            if d.reason == Reason::NoMembers {
                prop_assert!(v.serving_ids().is_empty());
            } else {
                prop_assert_eq!(d.candidates.len(), v.serving_ids().len());
                prop_assert!(d.candidates.iter().all(|c| v.is_serving(c)));
            }
        }
    }
}
