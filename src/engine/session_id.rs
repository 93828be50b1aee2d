//! Passive sticky routes: the node named inside the app's own session id
//! (`[sticky.session]` in the config).
//!
//! Servlet containers name the server that holds a session in the session
//! id itself, and the load balancers in front of them read it there instead
//! of setting a cookie of their own:
//!
//! - **WebLogic** (its proxy plug-ins): `sessionid!primary!secondary`, where
//!   `primary` is the server holding the session and `secondary` the server
//!   holding its replica, `NONE` (or absent) when the session is not
//!   replicated. WebLogic appends `!creation_time` in some versions; fields
//!   after the third are ignored.
//! - **httpd** (mod_proxy_balancer `stickysession=JSESSIONID|jsessionid`,
//!   Tomcat's `jvmRoute`): `sessionid.route`, the route after the first `.`
//!   (as mod_proxy_balancer reads it); no secondary.
//! - **A regex** with the named captures `primary` (required) and
//!   `secondary` (optional; a capture that did not take part or is empty
//!   means none), matched against the whole value as written (anchor it
//!   with `^...$` to match all of it).
//!
//! The value is read from a configured cookie and/or path parameter of the
//! last path segment (`;jsessionid=...`, the servlet URL-rewriting form);
//! a path parameter is percent-decoded (a client may send `!` as `%21`), a
//! cookie value is taken as written (its surrounding double quotes
//! removed). Every such value is tried in order (cookies in header order,
//! then path parameters): the first that names a serving node wins.
//!
//! A server id maps to a node id through [`SessionRoute::servers`]; an id
//! not listed there is taken as the node id itself (identity), so a cluster
//! whose app servers are named like its nodes needs no map. WebLogic writes
//! a hash of each server's JVM id rather than its name, so a WebLogic
//! cluster lists those hashes.
//!
//! peerlb only reads the value: it never rewrites the app's cookie or URL.
//! What the router does with it is in `route` (the request goes to the
//! primary while it serves, else to the secondary, else to the policy).

use std::collections::BTreeMap;

use http::HeaderMap;

use super::sticky::{cookies, percent_decode};

/// How the server ids are written inside the session id.
#[derive(Clone, Debug)]
pub enum SessionIdForm {
    /// WebLogic: `sessionid!primary!secondary` (secondary `NONE` or absent
    /// when not replicated; later `!` fields ignored).
    WebLogic,
    /// httpd mod_proxy_balancer / Tomcat `jvmRoute`: `sessionid.route`.
    Httpd,
    /// A regex with the named captures `primary` and, optionally,
    /// `secondary` (checked by config validation).
    Regex(regex::Regex),
}

impl PartialEq for SessionIdForm {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (SessionIdForm::WebLogic, SessionIdForm::WebLogic)
            | (SessionIdForm::Httpd, SessionIdForm::Httpd) => true,
            (SessionIdForm::Regex(a), SessionIdForm::Regex(b)) => a.as_str() == b.as_str(),
            _ => false,
        }
    }
}

/// The server ids one session id names (before mapping to node ids).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedServers<'a> {
    /// The server holding the session.
    pub primary: &'a str,
    /// The server holding its replica, if any.
    pub secondary: Option<&'a str>,
}

impl SessionIdForm {
    /// The server ids `value` names, or `None` when it names none (a
    /// malformed value: no separator, an empty primary, a regex that does
    /// not match): the request then goes to the policy.
    pub fn parse<'a>(&self, value: &'a str) -> Option<NamedServers<'a>> {
        let some = |s: &'a str| (!s.is_empty()).then_some(s);
        match self {
            SessionIdForm::WebLogic => {
                let mut fields = value.split('!').skip(1);
                let primary = some(fields.next()?)?;
                let secondary = fields.next().and_then(some).filter(|s| *s != "NONE");
                Some(NamedServers { primary, secondary })
            }
            SessionIdForm::Httpd => {
                let (_, route) = value.split_once('.')?;
                Some(NamedServers {
                    primary: some(route)?,
                    secondary: None,
                })
            }
            SessionIdForm::Regex(re) => {
                let caps = re.captures(value)?;
                let primary = some(caps.name("primary")?.as_str())?;
                let secondary = caps.name("secondary").map(|m| m.as_str()).and_then(some);
                Some(NamedServers { primary, secondary })
            }
        }
    }
}

/// Where the app's session id is read and how it names servers
/// (`[sticky.session]`).
#[derive(Clone, Debug, PartialEq)]
pub struct SessionRoute {
    /// The session cookie's name (e.g. `JSESSIONID`); `None`: no cookie.
    pub cookie: Option<String>,
    /// The last path segment's parameter name (e.g. `jsessionid` for
    /// `;jsessionid=...`); `None`: no path parameter.
    pub path_param: Option<String>,
    /// How the value names its servers.
    pub form: SessionIdForm,
    /// Server id -> node id; a server id not listed is the node id itself.
    pub servers: BTreeMap<String, String>,
}

/// The node a session id sends a request to ([`SessionRoute::pick`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionPick {
    /// The serving node to send the request to.
    pub node: String,
    /// True when `node` is the secondary (the primary is not serving).
    pub secondary: bool,
    /// With the primary picked: the serving secondary, the first node to
    /// fail over to.
    pub next: Option<String>,
}

impl SessionRoute {
    /// The node id a server id maps to ([`SessionRoute::servers`], else
    /// the id itself).
    pub fn node_of<'a>(&'a self, server: &'a str) -> &'a str {
        self.servers.get(server).map_or(server, String::as_str)
    }

    /// The session id values a request carries, in the order they are
    /// tried: the configured cookie over all `Cookie` headers, then the
    /// configured parameter of the last path segment (percent-decoded).
    /// Empty values are skipped.
    pub fn values<'a>(
        &'a self,
        headers: &'a HeaderMap,
        uri: &'a http::Uri,
    ) -> impl Iterator<Item = std::borrow::Cow<'a, str>> + 'a {
        let from_cookies = self.cookie.iter().flat_map(move |name| {
            cookies(headers)
                .filter(move |(n, _)| n == name)
                .map(|(_, v)| std::borrow::Cow::Borrowed(v))
        });
        let path = uri.path();
        let last = &path[path.rfind('/').map_or(0, |i| i + 1)..];
        let from_path = self.path_param.iter().flat_map(move |name| {
            last.split(';')
                .skip(1)
                .filter_map(|p| p.split_once('='))
                .filter(move |(n, _)| n == name)
                .map(|(_, v)| percent_decode(v, false))
        });
        from_cookies.chain(from_path).filter(|v| !v.is_empty())
    }

    /// The node the request's session id sends it to: for the first value
    /// ([`SessionRoute::values`]) whose primary or secondary maps to a node
    /// for which `serving` holds, the primary while it serves (with the
    /// serving secondary as `next`), else the secondary. `None` when no
    /// value names a serving node (none carried, malformed, or every named
    /// node down): the policy decides.
    pub fn pick(
        &self,
        headers: &HeaderMap,
        uri: &http::Uri,
        serving: impl Fn(&str) -> bool,
    ) -> Option<SessionPick> {
        for value in self.values(headers, uri) {
            let Some(named) = self.form.parse(&value) else {
                continue;
            };
            let primary = self.node_of(named.primary);
            let secondary = named
                .secondary
                .map(|s| self.node_of(s))
                .filter(|s| *s != primary && serving(s));
            if serving(primary) {
                return Some(SessionPick {
                    node: primary.to_owned(),
                    secondary: false,
                    next: secondary.map(str::to_owned),
                });
            }
            if let Some(s) = secondary {
                return Some(SessionPick {
                    node: s.to_owned(),
                    secondary: true,
                    next: None,
                });
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Uri;
    use http::header::{COOKIE, HeaderValue};

    fn regex(p: &str) -> SessionIdForm {
        SessionIdForm::Regex(regex::Regex::new(p).unwrap())
    }

    fn named<'a>(p: &'a str, s: Option<&'a str>) -> Option<NamedServers<'a>> {
        Some(NamedServers {
            primary: p,
            secondary: s,
        })
    }

    #[test]
    fn weblogic_names_primary_and_secondary() {
        let f = SessionIdForm::WebLogic;
        assert_eq!(f.parse("abc!n1!n2"), named("n1", Some("n2")));
        assert_eq!(f.parse("abc!n1!NONE"), named("n1", None));
        assert_eq!(f.parse("abc!n1"), named("n1", None));
        assert_eq!(f.parse("abc!n1!"), named("n1", None));
        // WebLogic's JVM-id hashes and the creation time it may append.
        assert_eq!(
            f.parse("Xy7z!-1503376427!1294721354!1700000000000"),
            named("-1503376427", Some("1294721354"))
        );
    }

    #[test]
    fn malformed_weblogic_values_name_no_server() {
        let f = SessionIdForm::WebLogic;
        for v in ["abc", "", "!", "abc!!n2", "abc.n1", "!!"] {
            assert_eq!(f.parse(v), None, "{v:?}");
        }
    }

    #[test]
    fn httpd_names_the_route_after_the_first_dot() {
        let f = SessionIdForm::Httpd;
        assert_eq!(f.parse("8E3B5C.n2"), named("n2", None));
        // mod_proxy_balancer takes everything after the first dot.
        assert_eq!(f.parse("8E3B5C.n2.x"), named("n2.x", None));
        for v in ["8E3B5C", "8E3B5C.", "", "abc!n1!n2"] {
            assert_eq!(f.parse(v), None, "{v:?}");
        }
    }

    #[test]
    fn a_regex_names_servers_by_its_named_captures() {
        let f = regex(r"^(?<primary>[a-z0-9]+):(?<secondary>[a-z0-9]*):");
        assert_eq!(f.parse("n1:n3:sess"), named("n1", Some("n3")));
        assert_eq!(f.parse("n1::sess"), named("n1", None));
        assert_eq!(f.parse("sess"), None);
        let only_primary = regex(r"-(?<primary>\w+)$");
        assert_eq!(only_primary.parse("abc-n2"), named("n2", None));
        // An optional secondary that did not take part.
        let opt = regex(r"^(?<primary>\w+)(?:/(?<secondary>\w+))?$");
        assert_eq!(opt.parse("n1"), named("n1", None));
        assert_eq!(opt.parse("n1/n2"), named("n1", Some("n2")));
    }

    fn weblogic() -> SessionRoute {
        SessionRoute {
            cookie: Some("JSESSIONID".into()),
            path_param: Some("jsessionid".into()),
            form: SessionIdForm::WebLogic,
            servers: BTreeMap::new(),
        }
    }

    fn with_cookie(c: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.append(COOKIE, HeaderValue::from_str(c).unwrap());
        h
    }

    fn all_up(_: &str) -> bool {
        true
    }

    #[test]
    fn the_primary_serves_while_it_is_up_with_the_secondary_next() {
        let s = weblogic();
        let uri = Uri::from_static("/cart");
        assert_eq!(
            s.pick(&with_cookie("JSESSIONID=abc!n2!n3"), &uri, all_up),
            Some(SessionPick {
                node: "n2".into(),
                secondary: false,
                next: Some("n3".into()),
            })
        );
        // The primary is down: the secondary.
        assert_eq!(
            s.pick(&with_cookie("JSESSIONID=abc!n2!n3"), &uri, |n| n != "n2"),
            Some(SessionPick {
                node: "n3".into(),
                secondary: true,
                next: None,
            })
        );
        // Both down, not replicated, malformed, or absent: the policy.
        assert_eq!(
            s.pick(&with_cookie("JSESSIONID=abc!n2!n3"), &uri, |n| n == "n1"),
            None
        );
        assert_eq!(
            s.pick(&with_cookie("JSESSIONID=abc!n2!NONE"), &uri, |n| n != "n2"),
            None
        );
        assert_eq!(s.pick(&with_cookie("JSESSIONID=abc"), &uri, all_up), None);
        assert_eq!(s.pick(&with_cookie("other=abc!n2"), &uri, all_up), None);
        assert_eq!(s.pick(&HeaderMap::new(), &uri, all_up), None);
    }

    #[test]
    fn the_path_parameter_is_read_when_cookies_are_off() {
        let s = weblogic();
        let uri = Uri::from_static("/shop/cart;jsessionid=abc%21n3%21n1?x=1");
        assert_eq!(
            s.pick(&HeaderMap::new(), &uri, all_up).map(|p| p.node),
            Some("n3".into())
        );
        // Only on the last segment.
        let uri = Uri::from_static("/shop;jsessionid=abc!n3/cart");
        assert_eq!(s.pick(&HeaderMap::new(), &uri, all_up), None);
        // A stale cookie does not hide a valid parameter.
        let uri = Uri::from_static("/cart;jsessionid=abc!n1");
        assert_eq!(
            s.pick(&with_cookie("JSESSIONID=old!gone"), &uri, |n| n != "gone")
                .map(|p| p.node),
            Some("n1".into())
        );
    }

    #[test]
    fn server_ids_map_to_node_ids_else_identity() {
        let mut s = weblogic();
        s.servers.insert("-1503376427".into(), "n1".into());
        s.servers.insert("1294721354".into(), "n2".into());
        let uri = Uri::from_static("/");
        let p = s
            .pick(
                &with_cookie("JSESSIONID=x!-1503376427!1294721354"),
                &uri,
                all_up,
            )
            .unwrap();
        assert_eq!((p.node.as_str(), p.next.as_deref()), ("n1", Some("n2")));
        let p = s
            .pick(&with_cookie("JSESSIONID=x!n3"), &uri, all_up)
            .unwrap();
        assert_eq!(p.node, "n3");
    }

    #[test]
    fn a_secondary_equal_to_the_primary_is_no_failover_target() {
        let s = weblogic();
        let uri = Uri::from_static("/");
        let p = s
            .pick(&with_cookie("JSESSIONID=x!n1!n1"), &uri, all_up)
            .unwrap();
        assert_eq!(p.next, None);
    }
}

/// The router's use of a session id: its precedence over the sticky route
/// cookie and the policy, and the failover order it gives.
#[cfg(test)]
mod router_tests {
    use super::*;
    use crate::engine::balance::PolicyKind;
    use crate::engine::membership::NodeStatus::*;
    use crate::engine::membership::tests::view;
    use crate::engine::route::{Reason, Router};
    use crate::engine::rules::Rules;
    use crate::engine::testing::{TestRequest, user_rules};
    use rand::SeedableRng;
    use rand::rngs::Xoshiro256PlusPlus;
    use std::time::Duration;

    fn router(policy: PolicyKind, rules: Rules) -> Router {
        let mut r = Router::new(policy, rules);
        r.set_session_route(Some(SessionRoute {
            cookie: Some("JSESSIONID".into()),
            path_param: Some("jsessionid".into()),
            form: SessionIdForm::WebLogic,
            servers: BTreeMap::new(),
        }));
        r
    }

    /// (owner, reason, candidates) of `req` on `v`.
    fn decide(
        r: &mut Router,
        req: &TestRequest,
        v: &crate::engine::membership::MembershipView,
    ) -> (String, Reason, Vec<String>) {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
        let d = r.decide(&req.view(), v, Duration::ZERO, &mut rng);
        let c = d.candidates(v).map(|c| c.to_string()).collect();
        (d.owner.to_string(), d.reason, c)
    }

    #[test]
    fn the_session_primary_wins_over_the_route_cookie_and_the_rules() {
        let v = view(
            "n1",
            &[
                ("n1", Serving),
                ("n2", Serving),
                ("n3", Serving),
                ("n4", Serving),
            ],
        );
        let req =
            TestRequest::get("/cart?user=alice").cookie("peerlb-route=n1; JSESSIONID=abc!n3!n2");
        for policy in [
            PolicyKind::ConsistentHash,
            PolicyKind::RoundRobin,
            PolicyKind::LeastLoad,
        ] {
            let mut r = router(policy, user_rules());
            let (owner, reason, cands) = decide(&mut r, &req, &v);
            assert_eq!((owner.as_str(), reason), ("n3", Reason::SessionPrimary));
            // The secondary first, then the rotation after the owner.
            assert_eq!(cands, ["n3", "n2", "n4", "n1"], "{policy:?}");
        }
    }

    #[test]
    fn a_primary_that_is_down_sends_the_request_to_the_secondary() {
        let v = view("n1", &[("n1", Serving), ("n2", Serving), ("n3", Leaving)]);
        let req = TestRequest::get("/cart").cookie("JSESSIONID=abc!n3!n2");
        let mut r = router(PolicyKind::RoundRobin, Rules::default());
        let (owner, reason, cands) = decide(&mut r, &req, &v);
        assert_eq!((owner.as_str(), reason), ("n2", Reason::SessionSecondary));
        assert_eq!(cands, ["n2", "n1"]);
        // The same through the path parameter.
        let req = TestRequest::get("/cart;jsessionid=abc!n3!n2");
        assert_eq!(decide(&mut r, &req, &v).0, "n2");
    }

    #[test]
    fn a_malformed_or_dead_session_id_goes_to_the_policy() {
        let v = view("n1", &[("n1", Serving), ("n2", Serving), ("n3", Leaving)]);
        for cookie in [
            "JSESSIONID=abc",
            "JSESSIONID=abc!n3!NONE",
            "JSESSIONID=abc!!n2",
        ] {
            let mut r = router(PolicyKind::StickyRoundRobin, Rules::default());
            let req = TestRequest::get("/").cookie(cookie);
            let (_, reason, _) = decide(&mut r, &req, &v);
            assert_eq!(reason, Reason::RoundRobin, "{cookie}");
        }
        // With no session id, the route cookie still counts.
        let mut r = router(PolicyKind::StickyRoundRobin, Rules::default());
        let req = TestRequest::get("/").cookie("peerlb-route=n2; JSESSIONID=abc!n3");
        let (owner, reason, _) = decide(&mut r, &req, &v);
        assert_eq!((owner.as_str(), reason), ("n2", Reason::StickyRoute));
    }

    #[test]
    fn without_a_session_route_the_app_cookie_is_ignored() {
        let v = view("n1", &[("n1", Serving), ("n2", Serving), ("n3", Serving)]);
        let mut r = Router::new(PolicyKind::RoundRobin, Rules::default());
        let req = TestRequest::get("/").cookie("JSESSIONID=abc!n3!n2");
        assert_eq!(decide(&mut r, &req, &v).1, Reason::RoundRobin);
    }
}
