//! Data-centric rules (DCR): ordered rules that extract the hash key from a
//! request (SailFin CLB's data-centric rules; the extractor kinds follow its
//! `<request-uri parameter>`, `<header>` and `<cookie>` elements).
//!
//! Two layers: the serde model that mirrors `cluster.toml` ([`RuleSpec`]),
//! then [`Rules::compile`] into matchers with regexes and header names
//! validated. Example:
//!
//! ```toml
//! [[rules]]
//! name = "users"
//! when = { path_prefix = "/api/", header_absent = "x-internal" }
//! extract = [{ query = "user" }, { header = "x-user" }, { cookie = "session" },
//!            { path_regex = "^/users/([^/]+)", prefix = "u:" }]
//! ```
//!
//! Rules are tried in order; a rule whose conditions all hold tries its
//! extractors in order, and the first non-empty value wins. With no rule
//! yielding a key the router uses [`default_key`] (case H2).

use std::borrow::Cow;
use std::fmt;
use std::net::SocketAddr;

use http::header::{HOST, HeaderName};
use http::{HeaderMap, Method, Uri};
use regex::Regex;
use serde::{Deserialize, Serialize};

use super::sticky::{cookies, percent_decode};

/// One rule as written in `cluster.toml` (`[[rules]]`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// Optional name, shown in errors, logs and the admin API.
    #[serde(default)]
    pub name: Option<String>,
    /// Conditions that must all hold for the rule to apply; none = always.
    #[serde(default)]
    pub when: Condition,
    /// Key extractors, tried in order; the first non-empty value wins.
    /// Must not be empty.
    pub extract: Vec<ExtractorSpec>,
}

/// Conditions of a rule; every condition that is set must hold.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    /// The request method, exactly (methods are case-sensitive), e.g. `"GET"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The request host without port, ASCII case-insensitive, taken from the
    /// absolute-form request-target or else the `Host` header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The path (without query, as received: not percent-decoded) starts
    /// with this string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// The path (without query, not percent-decoded) matches this regex (Rust `regex` syntax,
    /// unanchored unless the pattern anchors itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_regex: Option<String>,
    /// A header of this name is present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_present: Option<String>,
    /// No header of this name is present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_absent: Option<String>,
    /// A cookie of this name is present (any value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie_present: Option<String>,
    /// No cookie of this name is present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie_absent: Option<String>,
}

/// One key extractor: exactly one source, plus an optional prefix.
///
/// In TOML a single-key inline table such as `{ query = "user" }` or
/// `{ path_regex = "^/users/([^/]+)", prefix = "u:" }`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ExtractorSpec {
    /// First value of this query parameter, percent-decoded (`+` = space).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// First value of this header, trimmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// Value of the first cookie of this name over all `Cookie` headers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<String>,
    /// First capture group of this regex, matched against the path (without
    /// query, not percent-decoded). The regex must have a capture group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_regex: Option<String>,
    /// First capture group of this regex, matched against the full
    /// request-target (path and query, or the absolute URI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_regex: Option<String>,
    /// Prepended to the extracted value (e.g. to keep key spaces apart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

/// A rule set that failed to compile: `path` names the field
/// (`rules[1].extract[0].path_regex`), `rule` the rule's name if it has one.
///
/// Shown as `"<path>: <cause>"`, with ` (rule "<name>")` appended for named
/// rules. Fix the named field in `cluster.toml`.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {kind}{}", NameSuffix(.rule))]
pub struct RuleError {
    /// Path of the offending field, e.g. `rules[0].extract[2]`.
    pub path: String,
    /// The rule's `name`, if set.
    pub rule: Option<String>,
    /// What is wrong.
    #[source]
    pub kind: RuleErrorKind,
}

struct NameSuffix<'a>(&'a Option<String>);

impl fmt::Display for NameSuffix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(n) => write!(f, " (rule {n:?})"),
            None => Ok(()),
        }
    }
}

/// The cause of a [`RuleError`].
#[derive(Debug, thiserror::Error)]
pub enum RuleErrorKind {
    /// The regex does not compile (note: this build's regex supports Perl
    /// classes but not Unicode case folding; use `(?i-u)` for ASCII-only
    /// case-insensitive matching).
    #[error("invalid regex: {0}")]
    InvalidRegex(#[source] regex::Error),
    /// An extractor regex without a capture group; the key is group 1.
    #[error("regex has no capture group (the key is the first capture group)")]
    NoCaptureGroup,
    /// An extractor with zero or several sources.
    #[error("exactly one of query, header, cookie, path_regex, target_regex")]
    ExtractorSource,
    /// A rule with an empty `extract` list.
    #[error("at least one extractor is required")]
    NoExtractors,
    /// An empty parameter, header, cookie or host name.
    #[error("must not be empty")]
    Empty,
    /// Not an HTTP method token.
    #[error("invalid HTTP method {0:?}")]
    InvalidMethod(String),
    /// Not a valid HTTP header name.
    #[error("invalid header name {0:?}")]
    InvalidHeaderName(String),
}

/// The parts of an incoming request the rules look at, borrowed from the
/// ingress's request without copying.
#[derive(Clone, Copy, Debug)]
pub struct RequestView<'a> {
    /// Request method.
    pub method: &'a Method,
    /// Request-target as received.
    pub uri: &'a Uri,
    /// Request headers (after the ingress stripped client-sent `peerlb-*`).
    pub headers: &'a HeaderMap,
    /// The client's address as seen by the entry node.
    pub client: SocketAddr,
}

/// The default hash key for HTTP when no rule yields one (case H2): the
/// client's remote host and port, formatted as a socket address (`1.2.3.4:5678`,
/// `[2001:db8::1]:5678`). IPv4-mapped IPv6 addresses are written as IPv4, so a
/// dual-stack listener and an IPv4 listener give the same key.
pub(crate) fn default_key(client: SocketAddr) -> String {
    SocketAddr::new(client.ip().to_canonical(), client.port()).to_string()
}

/// Compiled data-centric rules, ready to extract keys.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    rules: Vec<Rule>,
}

#[derive(Clone, Debug)]
struct Rule {
    name: Option<String>,
    when: When,
    extract: Vec<Extractor>,
}

#[derive(Clone, Debug, Default)]
struct When {
    method: Option<Method>,
    host: Option<String>,
    path_prefix: Option<String>,
    path_regex: Option<Regex>,
    header_present: Option<HeaderName>,
    header_absent: Option<HeaderName>,
    cookie_present: Option<String>,
    cookie_absent: Option<String>,
}

#[derive(Clone, Debug)]
struct Extractor {
    source: Source,
    prefix: String,
}

#[derive(Clone, Debug)]
enum Source {
    Query(String),
    Header(HeaderName),
    Cookie(String),
    PathRegex(Regex),
    TargetRegex(Regex),
}

impl Rules {
    /// Compiles and validates `specs`, in order.
    ///
    /// # Errors
    ///
    /// The first invalid field, as a `RuleError` naming it: an extractor
    /// without exactly one source, an empty `extract` list, an empty name, a
    /// regex that does not compile or (for extractors) has no capture group,
    /// an invalid method or header name.
    pub fn compile(specs: &[RuleSpec]) -> Result<Rules, RuleError> {
        let rules = specs
            .iter()
            .enumerate()
            .map(|(i, spec)| compile_rule(i, spec))
            .collect::<Result<_, _>>()?;
        Ok(Rules { rules })
    }

    /// True when no rules are configured (the router then uses sticky round
    /// robin for HTTP).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// The name of rule `index`, if it has one (for logs).
    pub fn name(&self, index: usize) -> Option<&str> {
        self.rules.get(index)?.name.as_deref()
    }

    /// Extracts the hash key: rules in order; the first rule whose
    /// conditions hold and one of whose extractors (in order) yields a
    /// non-empty value wins. Returns the rule's index and the key (prefix
    /// included), or `None` when no rule yields a key.
    pub fn extract(&self, req: &RequestView<'_>) -> Option<(usize, String)> {
        self.rules.iter().enumerate().find_map(|(i, rule)| {
            if !rule.when.holds(req) {
                return None;
            }
            rule.extract
                .iter()
                .find_map(|x| {
                    let v = x.source.value(req)?;
                    (!v.is_empty()).then(|| format!("{}{v}", x.prefix))
                })
                .map(|k| (i, k))
        })
    }
}

fn compile_rule(i: usize, spec: &RuleSpec) -> Result<Rule, RuleError> {
    let err = |field: String, kind| RuleError {
        path: format!("rules[{i}]{field}"),
        rule: spec.name.clone(),
        kind,
    };
    let re = |field: &str, pat: &str| {
        Regex::new(pat).map_err(|e| err(field.to_owned(), RuleErrorKind::InvalidRegex(e)))
    };
    let header = |field: &str, name: &str| {
        if name.is_empty() {
            return Err(err(field.to_owned(), RuleErrorKind::Empty));
        }
        HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            err(
                field.to_owned(),
                RuleErrorKind::InvalidHeaderName(name.to_owned()),
            )
        })
    };
    let nonempty = |field: &str, v: &str| {
        if v.is_empty() {
            Err(err(field.to_owned(), RuleErrorKind::Empty))
        } else {
            Ok(v.to_owned())
        }
    };

    let c = &spec.when;
    let when = When {
        method: c
            .method
            .as_deref()
            .map(|m| {
                Method::from_bytes(m.as_bytes()).map_err(|_| {
                    err(
                        ".when.method".into(),
                        RuleErrorKind::InvalidMethod(m.into()),
                    )
                })
            })
            .transpose()?,
        host: c
            .host
            .as_deref()
            .map(|h| nonempty(".when.host", h).map(|h| h.to_ascii_lowercase()))
            .transpose()?,
        path_prefix: c.path_prefix.clone(),
        path_regex: c
            .path_regex
            .as_deref()
            .map(|p| re(".when.path_regex", p))
            .transpose()?,
        header_present: c
            .header_present
            .as_deref()
            .map(|h| header(".when.header_present", h))
            .transpose()?,
        header_absent: c
            .header_absent
            .as_deref()
            .map(|h| header(".when.header_absent", h))
            .transpose()?,
        cookie_present: c
            .cookie_present
            .as_deref()
            .map(|v| nonempty(".when.cookie_present", v))
            .transpose()?,
        cookie_absent: c
            .cookie_absent
            .as_deref()
            .map(|v| nonempty(".when.cookie_absent", v))
            .transpose()?,
    };

    if spec.extract.is_empty() {
        return Err(err(".extract".into(), RuleErrorKind::NoExtractors));
    }
    let mut extract = Vec::with_capacity(spec.extract.len());
    for (j, x) in spec.extract.iter().enumerate() {
        let at = |f: &str| format!(".extract[{j}]{f}");
        let capture_re = |f: &str, p: &str| {
            let r = re(&at(f), p)?;
            if r.captures_len() < 2 {
                return Err(err(at(f), RuleErrorKind::NoCaptureGroup));
            }
            Ok(r)
        };
        let source = match (
            &x.query,
            &x.header,
            &x.cookie,
            &x.path_regex,
            &x.target_regex,
        ) {
            (Some(q), None, None, None, None) => Source::Query(nonempty(&at(".query"), q)?),
            (None, Some(h), None, None, None) => Source::Header(header(&at(".header"), h)?),
            (None, None, Some(c), None, None) => Source::Cookie(nonempty(&at(".cookie"), c)?),
            (None, None, None, Some(p), None) => Source::PathRegex(capture_re(".path_regex", p)?),
            (None, None, None, None, Some(p)) => {
                Source::TargetRegex(capture_re(".target_regex", p)?)
            }
            _ => return Err(err(at(""), RuleErrorKind::ExtractorSource)),
        };
        extract.push(Extractor {
            source,
            prefix: x.prefix.clone().unwrap_or_default(),
        });
    }
    Ok(Rule {
        name: spec.name.clone(),
        when,
        extract,
    })
}

impl When {
    fn holds(&self, req: &RequestView<'_>) -> bool {
        let path = req.uri.path();
        self.method.as_ref().is_none_or(|m| m == req.method)
            && self
                .host
                .as_deref()
                .is_none_or(|h| request_host(req).is_some_and(|rh| rh.eq_ignore_ascii_case(h)))
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|p| path.starts_with(p))
            && self.path_regex.as_ref().is_none_or(|r| r.is_match(path))
            && self
                .header_present
                .as_ref()
                .is_none_or(|h| req.headers.contains_key(h))
            && self
                .header_absent
                .as_ref()
                .is_none_or(|h| !req.headers.contains_key(h))
            && self
                .cookie_present
                .as_deref()
                .is_none_or(|c| cookies(req.headers).any(|(n, _)| n == c))
            && self
                .cookie_absent
                .as_deref()
                .is_none_or(|c| !cookies(req.headers).any(|(n, _)| n == c))
    }
}

/// The request's host without port: from an absolute-form target, else the
/// first `Host` header.
fn request_host<'a>(req: &RequestView<'a>) -> Option<&'a str> {
    if let Some(h) = req.uri.host() {
        return Some(h);
    }
    let v = req.headers.get(HOST)?.to_str().ok()?.trim();
    Some(match v.strip_prefix('[') {
        // IPv6 literal: keep the brackets as `Uri::host` does.
        Some(rest) => rest.find(']').map_or(v, |end| &v[..end + 2]),
        None => v.rsplit_once(':').map_or(v, |(h, _)| h),
    })
}

impl Source {
    fn value<'a>(&self, req: &RequestView<'a>) -> Option<Cow<'a, str>> {
        match self {
            Source::Query(name) => req.uri.query()?.split('&').find_map(|pair| {
                let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
                (percent_decode(n, true) == name.as_str()).then(|| percent_decode(v, true))
            }),
            Source::Header(name) => {
                let v = req.headers.get(name)?;
                Some(match String::from_utf8_lossy(v.as_bytes()) {
                    Cow::Borrowed(s) => Cow::Borrowed(s.trim()),
                    Cow::Owned(s) => Cow::Owned(s.trim().to_owned()),
                })
            }
            Source::Cookie(name) => cookies(req.headers)
                .find(|(n, _)| n == name)
                .map(|(_, v)| Cow::Borrowed(v)),
            Source::PathRegex(re) => {
                Some(Cow::Borrowed(re.captures(req.uri.path())?.get(1)?.as_str()))
            }
            Source::TargetRegex(re) => {
                let target = request_target(req.uri);
                let m = re.captures(&target)?.get(1)?;
                Some(match target {
                    Cow::Borrowed(t) => Cow::Borrowed(&t[m.range()]),
                    Cow::Owned(ref t) => Cow::Owned(t[m.range()].to_owned()),
                })
            }
        }
    }
}

/// The request-target as received: path and query for origin-form, the whole
/// URI for absolute-form, the authority for authority-form (CONNECT).
fn request_target(uri: &Uri) -> Cow<'_, str> {
    match (uri.scheme(), uri.path_and_query()) {
        (None, Some(pq)) => Cow::Borrowed(pq.as_str()),
        (None, None) => Cow::Borrowed(uri.authority().map_or("", |a| a.as_str())),
        _ => Cow::Owned(uri.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    struct Req {
        method: Method,
        uri: Uri,
        headers: HeaderMap,
        client: SocketAddr,
    }

    impl Req {
        fn new(method: &str, uri: &str, headers: &[(&str, &str)]) -> Req {
            let mut h = HeaderMap::new();
            for (n, v) in headers {
                h.append(
                    HeaderName::from_bytes(n.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            Req {
                method: method.parse().unwrap(),
                uri: uri.parse().unwrap(),
                headers: h,
                client: "192.0.2.7:40123".parse().unwrap(),
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

    fn rules(toml_src: &str) -> Rules {
        Rules::compile(&specs(toml_src)).unwrap()
    }

    fn specs(toml_src: &str) -> Vec<RuleSpec> {
        #[derive(Deserialize)]
        struct File {
            rules: Vec<RuleSpec>,
        }
        toml::from_str::<File>(toml_src).unwrap().rules
    }

    fn key(r: &Rules, req: &Req) -> Option<(usize, String)> {
        r.extract(&req.view())
    }

    fn compile_err(toml_src: &str) -> String {
        Rules::compile(&specs(toml_src)).unwrap_err().to_string()
    }

    const USERS: &str = r#"
        [[rules]]
        name = "users"
        extract = [{ query = "user" }, { header = "x-user" }, { cookie = "session" },
                   { path_regex = "^/users/([^/]+)", prefix = "u:" },
                   { target_regex = "[?&]t=([0-9]+)", prefix = "t:" }]
    "#;

    #[test]
    fn module_doc_example_parses() {
        let r = rules(
            r#"
            [[rules]]
            name = "users"
            when = { path_prefix = "/api/", header_absent = "x-internal" }
            extract = [{ query = "user" }, { header = "x-user" }, { cookie = "session" },
                       { path_regex = "^/users/([^/]+)", prefix = "u:" }]
            "#,
        );
        let req = Req::new("GET", "/api/x?user=ann", &[]);
        assert_eq!(key(&r, &req), Some((0, "ann".into())));
        let req = Req::new("GET", "/api/x?user=ann", &[("x-internal", "1")]);
        assert_eq!(key(&r, &req), None);
    }

    #[test]
    fn toml_model_parses() {
        let s = specs(USERS);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].name.as_deref(), Some("users"));
        assert_eq!(s[0].when, Condition::default());
        assert_eq!(
            s[0].extract[0],
            ExtractorSpec {
                query: Some("user".into()),
                ..Default::default()
            }
        );
        assert_eq!(
            s[0].extract[3],
            ExtractorSpec {
                path_regex: Some("^/users/([^/]+)".into()),
                prefix: Some("u:".into()),
                ..Default::default()
            }
        );
        #[derive(Deserialize, Debug)]
        #[allow(dead_code)]
        struct File {
            rules: Vec<RuleSpec>,
        }
        let unknown = toml::from_str::<File>("[[rules]]\nextract = [{ qurey = \"u\" }]");
        assert!(
            unknown
                .unwrap_err()
                .to_string()
                .contains("unknown field `qurey`")
        );
        let unknown = toml::from_str::<File>("[[rules]]\nextract = []\nwhen = { paht = \"/\" }");
        assert!(
            unknown
                .unwrap_err()
                .to_string()
                .contains("unknown field `paht`")
        );
    }

    /// (request-target, headers, expected key)
    type Case = (
        &'static str,
        &'static [(&'static str, &'static str)],
        Option<&'static str>,
    );

    #[test]
    fn each_extractor_kind() {
        let r = rules(USERS);
        assert!(!r.is_empty());
        assert_eq!(r.len(), 1);
        assert_eq!(r.name(0), Some("users"));
        let cases: [Case; 10] = [
            ("/x?a=1&user=al%20ice&user=bob", &[], Some("al ice")),
            ("/x?user=a+b", &[], Some("a b")),
            ("/x?us%65r=enc", &[], Some("enc")),
            ("/x?user=&other=1", &[("x-user", "  hdr  ")], Some("hdr")),
            ("/x", &[("x-user", "h1"), ("x-user", "h2")], Some("h1")),
            (
                "/x",
                &[("cookie", "a=1; session=s1"), ("cookie", "session=s2")],
                Some("s1"),
            ),
            ("/users/42/orders?x=1", &[], Some("u:42")),
            ("/other?x=1&t=99", &[], Some("t:99")),
            ("/users/?t=", &[("x-user", "   ")], None),
            ("/", &[("cookie", "session=")], None),
        ];
        for (uri, headers, want) in cases {
            let req = Req::new("GET", uri, headers);
            assert_eq!(
                key(&r, &req),
                want.map(|k| (0, k.to_owned())),
                "{uri} {headers:?}"
            );
        }
    }

    #[test]
    fn first_non_empty_rule_wins() {
        let r = rules(
            r#"
            [[rules]]
            when = { path_prefix = "/api/" }
            extract = [{ query = "id" }]
            [[rules]]
            extract = [{ header = "x-tenant" }]
            [[rules]]
            extract = [{ query = "id", prefix = "late:" }]
            "#,
        );
        // Rule 0 applies and yields.
        assert_eq!(
            key(&r, &Req::new("GET", "/api/x?id=7", &[("x-tenant", "t")])),
            Some((0, "7".into()))
        );
        // Rule 0 applies but is empty: rule 1.
        assert_eq!(
            key(&r, &Req::new("GET", "/api/x?id=", &[("x-tenant", "t")])),
            Some((1, "t".into()))
        );
        // Rule 0 does not apply, rule 1 empty: rule 2.
        assert_eq!(
            key(&r, &Req::new("GET", "/web?id=7", &[])),
            Some((2, "late:7".into()))
        );
        assert_eq!(key(&r, &Req::new("GET", "/web", &[])), None);
    }

    #[test]
    fn conditions_all_must_hold() {
        let r = rules(
            r#"
            [[rules]]
            extract = [{ header = "x-a" }]
            [rules.when]
            method = "POST"
            host = "Shop.Example"
            path_regex = "^/cart(/|$)"
            header_present = "x-a"
            header_absent = "x-b"
            cookie_present = "c1"
            cookie_absent = "c2"
            "#,
        );
        let ok: &[(&str, &str)] = &[
            ("host", "shop.example:8080"),
            ("x-a", "k"),
            ("cookie", "c1="),
        ];
        assert_eq!(
            key(&r, &Req::new("POST", "/cart/1", ok)),
            Some((0, "k".into()))
        );
        assert_eq!(
            key(&r, &Req::new("POST", "http://SHOP.example/cart", &ok[1..])),
            Some((0, "k".into()))
        );
        assert_eq!(key(&r, &Req::new("GET", "/cart/1", ok)), None);
        assert_eq!(key(&r, &Req::new("post", "/cart/1", ok)), None);
        assert_eq!(key(&r, &Req::new("POST", "/carts", ok)), None);
        assert_eq!(key(&r, &Req::new("POST", "/cart", &ok[1..])), None); // no host
        let other_host = [("host", "other.example"), ok[1], ok[2]];
        assert_eq!(key(&r, &Req::new("POST", "/cart", &other_host)), None);
        let with_b = [ok[0], ok[1], ok[2], ("x-b", "1")];
        assert_eq!(key(&r, &Req::new("POST", "/cart", &with_b)), None);
        let no_c1 = [ok[0], ok[1], ("cookie", "c3=1")];
        assert_eq!(key(&r, &Req::new("POST", "/cart", &no_c1)), None);
        let with_c2 = [ok[0], ok[1], ("cookie", "c1=1; c2=2")];
        assert_eq!(key(&r, &Req::new("POST", "/cart", &with_c2)), None);
    }

    #[test]
    fn ipv6_host_header() {
        let r = rules("[[rules]]\nwhen = { host = \"[::1]\" }\nextract = [{ header = \"x\" }]");
        let req = Req::new("GET", "/", &[("host", "[::1]:8080"), ("x", "v")]);
        assert_eq!(key(&r, &req), Some((0, "v".into())));
    }

    #[test]
    fn h2_default_key_is_remote_host_and_port() {
        assert_eq!(
            default_key("192.0.2.7:40123".parse().unwrap()),
            "192.0.2.7:40123"
        );
        assert_eq!(
            default_key("[2001:db8::1]:443".parse().unwrap()),
            "[2001:db8::1]:443"
        );
        assert_eq!(
            default_key("[::ffff:192.0.2.7]:40123".parse().unwrap()),
            "192.0.2.7:40123"
        );
        let r = rules("[[rules]]\nextract = [{ header = \"x-user\" }]");
        let req = Req::new("GET", "/", &[]);
        assert_eq!(key(&r, &req), None);
        assert_eq!(default_key(req.client), "192.0.2.7:40123");
    }

    #[test]
    fn empty_rules() {
        let r = Rules::compile(&[]).unwrap();
        assert!(r.is_empty());
        assert_eq!(key(&r, &Req::new("GET", "/?user=1", &[])), None);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                "[[rules]]\nextract = [{ query = \"a\" }]\n[[rules]]\nextract = [{ path_regex = \"(\" }]",
                "rules[1].extract[0].path_regex: invalid regex: ",
            ),
            (
                "[[rules]]\nextract = [{ query = \"a\" }, {}, { query = \"a\", cookie = \"b\" }]",
                "rules[0].extract[1]: exactly one of query, header, cookie, path_regex, target_regex",
            ),
            (
                "[[rules]]\nname = \"u\"\nextract = [{ query = \"a\", cookie = \"b\" }]",
                "rules[0].extract[0]: exactly one of query, header, cookie, path_regex, target_regex (rule \"u\")",
            ),
            (
                "[[rules]]\nextract = [{ prefix = \"p\" }]",
                "rules[0].extract[0]: exactly one of",
            ),
            (
                "[[rules]]\nextract = [{ target_regex = \"^/x\" }]",
                "rules[0].extract[0].target_regex: regex has no capture group (the key is the first capture group)",
            ),
            (
                "[[rules]]\nextract = []",
                "rules[0].extract: at least one extractor is required",
            ),
            (
                "[[rules]]\nextract = [{ query = \"\" }]",
                "rules[0].extract[0].query: must not be empty",
            ),
            (
                "[[rules]]\nextract = [{ header = \"bad header\" }]",
                "rules[0].extract[0].header: invalid header name \"bad header\"",
            ),
            (
                "[[rules]]\nwhen = { method = \"GE T\" }\nextract = [{ query = \"a\" }]",
                "rules[0].when.method: invalid HTTP method \"GE T\"",
            ),
            (
                "[[rules]]\nwhen = { path_regex = \"[\" }\nextract = [{ query = \"a\" }]",
                "rules[0].when.path_regex: invalid regex: ",
            ),
            (
                "[[rules]]\nwhen = { header_absent = \"\" }\nextract = [{ query = \"a\" }]",
                "rules[0].when.header_absent: must not be empty",
            ),
        ];
        for (src, want) in cases {
            let got = compile_err(src);
            assert!(got.starts_with(want), "got {got:?}, want {want:?}");
        }
        let e = Rules::compile(&specs(
            "[[rules]]\nname = \"r\"\nextract = [{ path_regex = \"(\" }]",
        ))
        .unwrap_err();
        assert_eq!(e.path, "rules[0].extract[0].path_regex");
        assert_eq!(e.rule.as_deref(), Some("r"));
        assert!(matches!(e.kind, RuleErrorKind::InvalidRegex(_)));
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn request_target_forms() {
        assert_eq!(request_target(&Uri::from_static("/a?b=1")), "/a?b=1");
        assert_eq!(
            request_target(&Uri::from_static("http://h/a?b=1")),
            "http://h/a?b=1"
        );
        assert_eq!(request_target(&Uri::from_static("h:443")), "h:443");
    }
}
