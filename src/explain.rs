//! `peerlb route`: explains the decision the engine makes for one request
//! against a stated membership, without any network: the rule that matched,
//! the hash key, the owner, the failover order, and the sequence of picks
//! the policy would make for N such requests.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::engine::balance::{Policy, PolicyKind, metric};
use crate::engine::membership::{Member, MembershipView, NodeStatus};
use crate::engine::node_id::NodeId;
use crate::engine::ring::RingSpec;
use crate::engine::route::{Reason, Router, RouterOptions};
use crate::engine::rules::{RequestView, Rules};
use crate::engine::session_id::SessionRoute;

/// An error in the `route` command's arguments (exit status 64).
#[derive(Debug, thiserror::Error)]
#[error("{arg}: {message}")]
pub struct ArgError {
    /// The flag at fault (`--request`, `--members`, ...).
    pub arg: &'static str,
    /// What is wrong.
    pub message: String,
}

fn arg_err(arg: &'static str, message: impl Into<String>) -> ArgError {
    ArgError {
        arg,
        message: message.into(),
    }
}

/// Parses `--members`: comma-separated ids, each optionally followed by
/// `=` and `/`-separated attributes: `weight:N`, `load:N` (0..=100, 100
/// idle), `metric-delta:D` (the load from mod_oc4j's conversion of `D`
/// seconds of processing per second, `100 / (1 + ln(1 + D))` rounded; see
/// [`parse_members_with_deltas`]), `inflight:N`, `down` (left out),
/// `draining`, `leaving`, `offline`.
/// Example: `n1,n2=weight:200/load:40,n3=down`.
///
/// # Errors
/// [`ArgError`] naming the member and attribute.
pub fn parse_members(spec: &str) -> Result<Vec<Member>, ArgError> {
    parse_members_with_deltas(spec).map(|(members, _)| members)
}

/// [`parse_members`], and the `metric-delta` each member was given (for
/// [`Setup::metric_deltas`]).
///
/// # Errors
/// As [`parse_members`]; a `metric-delta` that is negative or not a finite
/// number.
pub fn parse_members_with_deltas(
    spec: &str,
) -> Result<(Vec<Member>, BTreeMap<NodeId, f64>), ArgError> {
    let mut deltas = BTreeMap::new();
    let mut out: Vec<Member> = Vec::new();
    for (i, item) in spec
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .enumerate()
    {
        let (id, attrs) = item.split_once('=').unwrap_or((item, ""));
        if id.is_empty() {
            return Err(arg_err("--members", format!("member {i} has no id")));
        }
        if out.iter().any(|m| &*m.id == id) {
            return Err(arg_err("--members", format!("{id:?} is listed twice")));
        }
        let mut m = Member {
            id: NodeId::from(id),
            generation: 1,
            peer_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            http_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            weight: 100,
            status: NodeStatus::Serving,
            load: 100,
            inflight: 0,
        };
        let mut down = false;
        for a in attrs.split('/').map(str::trim).filter(|s| !s.is_empty()) {
            let bad = |what: &str| arg_err("--members", format!("{id}: {what} in {a:?}"));
            match a.split_once(':') {
                Some(("weight", v)) => {
                    m.weight = v.parse().map_err(|_| bad("weight wants 0..=10000"))?
                }
                Some(("load", v)) => {
                    m.load = v
                        .parse()
                        .ok()
                        .filter(|l| *l <= 100)
                        .ok_or_else(|| bad("load wants 0..=100"))?;
                }
                Some(("inflight", v)) => {
                    m.inflight = v.parse().map_err(|_| bad("inflight wants a count"))?
                }
                Some(("metric-delta", v)) => {
                    let d: f64 = v
                        .parse()
                        .ok()
                        .filter(|d: &f64| d.is_finite() && *d >= 0.0)
                        .ok_or_else(|| bad("metric-delta wants seconds per second, >= 0"))?;
                    m.load = metric::raw_metric(0, 0, d);
                    deltas.insert(m.id.clone(), d);
                }
                None if a == "down" => down = true,
                None if a == "draining" => m.status = NodeStatus::Draining,
                None if a == "leaving" => m.status = NodeStatus::Leaving,
                None if a == "offline" => m.status = NodeStatus::Offline,
                _ => {
                    return Err(bad(
                        "unknown attribute (weight:N, load:N, metric-delta:D, inflight:N, down, draining, leaving, offline)",
                    ));
                }
            }
        }
        if m.weight > crate::config::MAX_WEIGHT {
            return Err(arg_err(
                "--members",
                format!("{id}: weight {} is out of range 0..=10000", m.weight),
            ));
        }
        if !down {
            out.push(m);
        } else {
            deltas.remove(&m.id);
        }
    }
    Ok((out, deltas))
}

/// The `metric` lines of an explanation: for each serving member of
/// weight > 0 (id order), the metric the `metric` policy uses (mod_oc4j's
/// conversion of its `metric-delta` when it was given one, else its
/// `load`) and its share of new requests, that metric over the sum (case
/// A6: 20, 40, 90 of every 150).
fn metric_lines(members: &[Member], deltas: &BTreeMap<NodeId, f64>) -> Vec<String> {
    let mut serving: Vec<&Member> = members
        .iter()
        .filter(|m| m.status == NodeStatus::Serving && m.weight > 0)
        .collect();
    serving.sort_by(|a, b| a.id.cmp(&b.id));
    let value = |m: &Member| u32::from(metric::effective_metric(m.load));
    let sum: u32 = serving.iter().map(|m| value(m)).sum();
    serving
        .iter()
        .map(|m| {
            let v = value(m);
            let share = if sum == 0 {
                0.0
            } else {
                f64::from(v) / f64::from(sum)
            };
            let source = match deltas.get(&m.id) {
                Some(&d) => format!(
                    "delta {d} -> 100 / (1 + ln(1 + {d})) = {:.2} -> {v}",
                    metric::oc4j_metric(d)
                ),
                None => format!("load {v}"),
            };
            format!("{}  {source}, share {v}/{sum} = {share:.3}", m.id)
        })
        .collect()
}

/// A request as `route` takes it: `METHOD TARGET`, headers `Name: value`,
/// cookies `name=value`.
///
/// # Errors
/// [`ArgError`] for a malformed request line, header or cookie.
pub fn parse_request(
    line: &str,
    headers: &[String],
    cookies: &[String],
) -> Result<http::Request<()>, ArgError> {
    let (method, target) = line
        .trim()
        .split_once(' ')
        .ok_or_else(|| arg_err("--request", format!("{line:?} is not \"METHOD /target\"")))?;
    let mut b = http::Request::builder()
        .method(method.trim())
        .uri(target.trim());
    for h in headers {
        let (k, v) = h
            .split_once(':')
            .ok_or_else(|| arg_err("--header", format!("{h:?} is not \"Name: value\"")))?;
        b = b.header(k.trim(), v.trim());
    }
    if !cookies.is_empty() {
        for c in cookies {
            if !c.contains('=') {
                return Err(arg_err("--cookie", format!("{c:?} is not name=value")));
            }
        }
        b = b.header(http::header::COOKIE, cookies.join("; "));
    }
    b.body(()).map_err(|e| arg_err("--request", e.to_string()))
}

/// What the engine decided, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Explanation {
    /// The policy in force.
    pub policy: String,
    /// Index of the data-centric rule that gave the key.
    pub rule: Option<usize>,
    /// That rule's name.
    pub rule_name: Option<String>,
    /// The hash key.
    pub key: Option<String>,
    /// Why the owner was chosen (`rule[0]`, `default-key`, `round-robin`, ...).
    pub reason: String,
    /// The owner.
    pub owner: String,
    /// Owner first, then the failover order.
    pub candidates: Vec<String>,
    /// Owners of `count` identical requests in a row (empty unless asked).
    pub picks: Vec<String>,
    /// Under the `metric` policy or when a member was given a
    /// `metric-delta`: each serving member's metric, where it came from
    /// (the conversion `100 / (1 + ln(1 + delta))`) and its share.
    pub metric: Vec<String>,
    /// With `[sticky.session]`: the session id values the request carries
    /// and the servers each names (`where value: primary -> node, secondary
    /// -> node`, or `names no server`).
    pub session_ids: Vec<String>,
}

/// What `route` is asked: the engine's configuration and the membership
/// to decide against.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The balancing policy.
    pub policy: Policy,
    /// The data-centric rules.
    pub rules: Rules,
    /// Router options (bounded load).
    pub options: RouterOptions,
    /// Ring resolution and assignment (`[ring] vnodes`, `assignment`).
    pub ring: RingSpec,
    /// The members in view.
    pub members: Vec<Member>,
    /// The `metric-delta` given to members ([`parse_members_with_deltas`]):
    /// explained as the mod_oc4j conversion in [`Explanation::metric`].
    pub metric_deltas: BTreeMap<NodeId, f64>,
    /// The entry node's id.
    pub entry: String,
    /// Randomness for random policies.
    pub seed: u64,
    /// The sticky route cookie's name (`[sticky] cookie`).
    pub route_cookie: String,
    /// Routing by the app's session id (`[sticky.session]`).
    pub session_route: Option<SessionRoute>,
}

/// Who sends the request to explain: the client's address as the entry
/// sees it and its connection's TLS facts (`--from`, `--tls`, `--sni`).
#[derive(Debug, Clone)]
pub struct ClientFacts {
    /// The client address (the default hash key's source).
    pub addr: SocketAddr,
    /// The connection is TLS (HTTPS at the entry); implied by `sni`.
    pub tls: bool,
    /// The SNI name of the TLS handshake.
    pub sni: Option<String>,
}

/// Decides `req` from `client` under `setup`, then `count` more times for
/// the sequence of picks.
///
/// `load_step` models the load a request adds while nothing completes
/// (`--load-step`): each of the `count` picks adds `load_step` to the
/// picked node's load figure for the later picks, as the entry's own
/// outstanding requests do in a node (`Router::decide_with_loads`), so
/// `least-load` and bounded-load hashing move on. With figures 20, 70, 80
/// (`inflight:N`) and `load_step` 10, `least-load` replays Citrix's custom
/// load example: `1 1 1 1 1 2 1 3`. 0 (the default): no load added.
///
/// # Errors
/// [`ArgError`] for `--policy` when the router options are invalid.
pub fn explain(
    setup: Setup,
    req: &http::Request<()>,
    client: &ClientFacts,
    count: usize,
    load_step: u32,
) -> Result<Explanation, ArgError> {
    let Setup {
        policy,
        rules,
        options,
        ring,
        members,
        metric_deltas,
        entry,
        seed,
        route_cookie,
        session_route,
    } = setup;
    let metric = if policy.kind() == PolicyKind::Metric || !metric_deltas.is_empty() {
        metric_lines(&members, &metric_deltas)
    } else {
        Vec::new()
    };
    let view = MembershipView::new(NodeId::from(entry.as_str()), members, ring);
    let new_router = |rules: Rules| {
        let mut r = Router::with_options(policy, rules, options)
            .map_err(|e| arg_err("--policy", e.to_string()))?;
        r.set_route_cookie(&route_cookie);
        r.set_session_route(session_route.clone());
        Ok::<_, ArgError>(r)
    };
    let mut router = new_router(rules)?;
    let mut rng = SmallRng::seed_from_u64(seed);
    let rv = RequestView {
        method: req.method(),
        uri: req.uri(),
        headers: req.headers(),
        client: client.addr,
        tls: client.tls || client.sni.is_some(),
        sni: client.sni.as_deref(),
    };
    let d = router.decide(&rv, &view, Duration::ZERO, &mut rng);
    let rule = match d.reason {
        Reason::Rule(i) => Some(i),
        Reason::BoundedLoad { rule } => rule,
        _ => None,
    };
    let mut picks = Vec::with_capacity(count);
    if count > 0 {
        // A fresh router: the sequence starts where a new node's would.
        let mut router = new_router(router.rules().clone())?;
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut added: BTreeMap<NodeId, u32> = BTreeMap::new();
        for i in 0..count {
            let now = Duration::from_millis(i as u64);
            let local = |id: &str| added.get(id).copied().unwrap_or(0);
            let d = router.decide_with_loads(&rv, &view, now, &mut rng, &local);
            if load_step > 0 {
                let l = added.entry(d.owner.clone()).or_insert(0);
                *l = l.saturating_add(load_step);
            }
            picks.push(d.owner.to_string());
        }
    }
    Ok(Explanation {
        policy: policy.to_string(),
        rule,
        rule_name: rule.and_then(|i| router.rules().name(i).map(str::to_owned)),
        key: d.key.clone(),
        reason: d.reason.to_string(),
        owner: d.owner.to_string(),
        candidates: d.candidates(&view).map(|c| c.to_string()).collect(),
        picks,
        metric,
        session_ids: session_route
            .as_ref()
            .map(|s| session_ids(s, req))
            .unwrap_or_default(),
    })
}

/// Decides the SIP message `message` (the bytes of one request, as a
/// client sends it) from `client` under `setup`: always consistent hash
/// (`engine::sip::decide`: the dialog's `Route`, then `<sip-rules>`, then
/// From tag + Call-ID). The policy shown is `consistent-hash (sip)`;
/// `picks` and `session_ids` stay empty.
///
/// # Errors
/// [`ArgError`] for `--sip-message` when the bytes are not a SIP request.
pub fn explain_sip(
    setup: Setup,
    message: &[u8],
    client: &ClientFacts,
) -> Result<Explanation, ArgError> {
    use crate::engine::sip;
    let msg = sip::parse(message).map_err(|e| arg_err("--sip-message", e.to_string()))?;
    if msg.method().is_none() {
        return Err(arg_err("--sip-message", "a response, not a request"));
    }
    let view = MembershipView::new(
        NodeId::from(setup.entry.as_str()),
        setup.members,
        setup.ring,
    );
    let d = sip::decide(&msg, client.addr, &setup.rules, &view);
    let rule = match d.reason {
        sip::SipReason::Rule(i) => Some(i),
        _ => None,
    };
    Ok(Explanation {
        policy: "consistent-hash (sip)".to_owned(),
        rule,
        rule_name: rule.and_then(|i| setup.rules.sip_name(i).map(str::to_owned)),
        key: Some(d.key.clone()),
        reason: match d.reason {
            sip::SipReason::Rule(i) => format!("sip-rule[{i}]"),
            r => r.as_str().to_owned(),
        },
        owner: d.owner.to_string(),
        candidates: d.candidates(&view).map(|c| c.to_string()).collect(),
        picks: Vec::new(),
        metric: Vec::new(),
        session_ids: Vec::new(),
    })
}

/// Each session id value `req` carries, and what it names under `s`.
fn session_ids(s: &SessionRoute, req: &http::Request<()>) -> Vec<String> {
    s.values(req.headers(), req.uri())
        .map(|v| match s.form.parse(&v) {
            Some(n) => {
                let secondary = n
                    .secondary
                    .map_or("none".to_owned(), |x| format!("{x} -> {}", s.node_of(x)));
                format!(
                    "{v}: primary {} -> {}, secondary {secondary}",
                    n.primary,
                    s.node_of(n.primary)
                )
            }
            None => format!("{v}: names no server"),
        })
        .collect()
}

impl std::fmt::Display for Explanation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "policy      {}", self.policy)?;
        match (self.rule, &self.rule_name) {
            (Some(i), Some(n)) => writeln!(f, "rule        rules[{i}] ({n})")?,
            (Some(i), None) => writeln!(f, "rule        rules[{i}]")?,
            (None, _) => writeln!(f, "rule        none matched")?,
        }
        writeln!(f, "hash key    {}", self.key.as_deref().unwrap_or("-"))?;
        for s in &self.session_ids {
            writeln!(f, "session id  {s}")?;
        }
        writeln!(f, "reason      {}", self.reason)?;
        writeln!(f, "owner       {}", self.owner)?;
        writeln!(f, "failover    {}", self.candidates.join(" -> "))?;
        if !self.picks.is_empty() {
            writeln!(f, "picks ({})  {}", self.picks.len(), self.picks.join(" "))?;
        }
        for m in &self.metric {
            writeln!(f, "metric      {m}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::balance::PolicyKind;

    fn run(policy: &str, members: &str, request: &str, count: usize) -> Explanation {
        let req = parse_request(request, &[], &[]).unwrap();
        explain(
            Setup {
                policy: policy.parse().unwrap(),
                rules: Rules::compile(&[]).unwrap(),
                options: RouterOptions::default(),
                ring: 1024.into(),
                metric_deltas: parse_members_with_deltas(members).unwrap().1,
                members: parse_members(members).unwrap(),
                entry: "a".into(),
                seed: 1,
                route_cookie: "peerlb-route".into(),
                session_route: None,
            },
            &req,
            &ClientFacts {
                addr: "10.1.2.3:5555".parse().unwrap(),
                tls: false,
                sni: None,
            },
            count,
            0,
        )
        .unwrap()
    }

    #[test]
    fn metric_delta_is_converted_the_mod_oc4j_way_and_shares_follow() {
        // delta 1 -> 100 / (1 + ln 2) = 59.06 -> 59; delta 10 -> 29.43 ->
        // 29; c reports 50. Shares: 59, 29, 50 of 138.
        let e = run(
            "metric",
            "a=metric-delta:1.0,b=metric-delta:10,c=load:50",
            "GET /",
            138,
        );
        assert_eq!(
            e.metric,
            [
                "a  delta 1 -> 100 / (1 + ln(1 + 1)) = 59.06 -> 59, share 59/138 = 0.428",
                "b  delta 10 -> 100 / (1 + ln(1 + 10)) = 29.43 -> 29, share 29/138 = 0.210",
                "c  load 50, share 50/138 = 0.362",
            ]
        );
        // The policy's picks over one round of 138 follow those shares.
        let count = |n: &str| e.picks.iter().filter(|p| *p == n).count();
        assert_eq!((count("a"), count("b"), count("c")), (59, 29, 50));
        assert!(e.to_string().contains("metric      a  delta 1 -> "));
        // Other policies print it only when a delta was given.
        assert!(run("round-robin", "a,b", "GET /", 0).metric.is_empty());
        assert_eq!(
            run("round-robin", "a=metric-delta:0,b", "GET /", 0)
                .metric
                .len(),
            2
        );
        for bad in [
            "a=metric-delta:-1",
            "a=metric-delta:x",
            "a=metric-delta:inf",
        ] {
            let err = parse_members(bad).unwrap_err();
            assert_eq!(err.arg, "--members");
            assert!(err.message.contains("metric-delta"), "{}", err.message);
        }
    }

    #[test]
    fn a3_weighted_round_robin_70_30_from_the_command_line() {
        let e = run(
            "weighted-round-robin",
            "a=weight:70,b=weight:30",
            "GET /",
            10,
        );
        assert_eq!(e.picks.join(" "), "a b a a a b a a b a");
        assert_eq!(e.reason, "weighted-round-robin");
    }

    #[test]
    fn a1_a_disabled_worker_is_skipped() {
        let e = run(
            "weighted-round-robin",
            "a=weight:25,b=weight:25/down,c=weight:25,d=weight:25",
            "GET /",
            6,
        );
        assert_eq!(e.picks.join(" "), "a c d a c d");
    }

    #[test]
    fn a6_metric_shares_20_40_90() {
        let e = run("metric", "a=load:20,b=load:40,c=load:90", "GET /", 150);
        let count = |n: &str| e.picks.iter().filter(|p| *p == n).count();
        assert_eq!((count("a"), count("b"), count("c")), (20, 40, 90));
    }

    #[test]
    fn consistent_hash_without_rules_is_sticky_round_robin() {
        let e = run("consistent-hash", "a,b,c", "GET /x", 3);
        assert_eq!(e.picks.join(" "), "a b c", "no rules: sticky round robin");
        assert_eq!(
            Policy::from(PolicyKind::ConsistentHash).to_string(),
            e.policy
        );
    }

    #[test]
    fn bad_members_and_requests_name_the_flag() {
        assert!(
            parse_members("a=weight:x")
                .unwrap_err()
                .to_string()
                .starts_with("--members: a: ")
        );
        assert!(parse_members("a,a").is_err());
        assert!(parse_members("a=fast").is_err());
        assert!(
            parse_request("GET", &[], &[])
                .unwrap_err()
                .to_string()
                .starts_with("--request")
        );
        assert!(parse_request("GET /", &["nocolon".into()], &[]).is_err());
    }

    #[test]
    fn the_sni_of_the_client_reaches_the_rules() {
        let specs: Vec<crate::engine::rules::RuleSpec> = vec![
            toml::from_str(
                "name = \"api\"\nwhen = { sni = \"api.example\" }\nextract = [{ query = \"user\", prefix = \"api:\" }]",
            )
            .unwrap(),
        ];
        let req = parse_request("GET /?user=ann", &[], &[]).unwrap();
        let go = |sni: Option<&str>| {
            explain(
                Setup {
                    policy: "consistent-hash".parse().unwrap(),
                    rules: Rules::compile(&specs).unwrap(),
                    options: RouterOptions::default(),
                    ring: 1024.into(),
                    metric_deltas: BTreeMap::new(),
                    members: parse_members("a,b").unwrap(),
                    entry: "a".into(),
                    seed: 1,
                    route_cookie: "peerlb-route".into(),
                    session_route: None,
                },
                &req,
                &ClientFacts {
                    addr: "10.1.2.3:5555".parse().unwrap(),
                    tls: false,
                    sni: sni.map(str::to_owned),
                },
                0,
                0,
            )
            .unwrap()
        };
        let e = go(Some("api.example"));
        assert_eq!(e.rule, Some(0));
        assert_eq!(e.key.as_deref(), Some("api:ann"));
        let e = go(None);
        assert_eq!(e.rule, None);
        assert_eq!(e.key.as_deref(), Some("10.1.2.3:5555"));
    }

    fn explain_with(
        setup_route: (&str, Option<SessionRoute>),
        members: &str,
        cookies: &[&str],
    ) -> Explanation {
        let cookies: Vec<String> = cookies.iter().map(|c| c.to_string()).collect();
        let req = parse_request("GET /cart", &[], &cookies).unwrap();
        explain(
            Setup {
                policy: "round-robin".parse().unwrap(),
                rules: Rules::compile(&[]).unwrap(),
                options: RouterOptions::default(),
                ring: 64.into(),
                metric_deltas: BTreeMap::new(),
                members: parse_members(members).unwrap(),
                entry: "a".into(),
                seed: 1,
                route_cookie: setup_route.0.into(),
                session_route: setup_route.1,
            },
            &req,
            &ClientFacts {
                addr: "10.1.2.3:5555".parse().unwrap(),
                tls: false,
                sni: None,
            },
            0,
            0,
        )
        .unwrap()
    }

    #[test]
    fn the_configured_route_cookie_name_is_read() {
        let e = explain_with(("lb", None), "a,b,c", &["peerlb-route=b", "lb=c"]);
        assert_eq!((e.owner.as_str(), e.reason.as_str()), ("c", "sticky-route"));
    }

    #[test]
    fn a_session_id_route_is_explained() {
        let route = SessionRoute {
            cookie: Some("JSESSIONID".into()),
            path_param: None,
            form: crate::engine::session_id::SessionIdForm::WebLogic,
            servers: [("ms2".to_owned(), "b".to_owned())].into(),
        };
        let e = explain_with(
            ("peerlb-route", Some(route.clone())),
            "a,b,c",
            &["JSESSIONID=xyz!ms2!c"],
        );
        assert_eq!(
            (e.owner.as_str(), e.reason.as_str()),
            ("b", "session-primary")
        );
        assert_eq!(e.candidates, ["b", "c", "a"]);
        assert_eq!(
            e.session_ids,
            ["xyz!ms2!c: primary ms2 -> b, secondary c -> c"]
        );
        assert!(
            e.to_string()
                .contains("session id  xyz!ms2!c: primary ms2 -> b")
        );
        let e = explain_with(
            ("peerlb-route", Some(route)),
            "a,b=down,c",
            &["JSESSIONID=xyz!ms2!c"],
        );
        assert_eq!(
            (e.owner.as_str(), e.reason.as_str()),
            ("c", "session-secondary")
        );
    }
}
