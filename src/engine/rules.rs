//! Data-centric rules (DCR): ordered rules that extract the hash key from a
//! request (SailFin CLB's data-centric rules; the extractor kinds follow its
//! `<request-uri parameter>`, `<header>` and `<cookie>` elements).
//!
//! Two layers: the serde model that mirrors `cluster.toml` ([`RuleSpec`]),
//! then [`Rules::compile`] into matchers with regexes and header names
//! validated. A rule has one of two bodies.
//!
//! Flat: conditions that must all hold, then extractors tried in order, the
//! first non-empty value winning:
//!
//! ```toml
//! [[rules]]
//! name = "users"
//! when = { path_prefix = "/api/", header_absent = "x-internal" }
//! extract = [{ query = "user" }, { header = "x-user" }, { cookie = "session" },
//!            { path_regex = "^/users/([^/]+)", prefix = "u:" }]
//! ```
//!
//! Nested (`key`, an [`ExprSpec`]): SailFin's `or` / `and` / `if` / `else`
//! as `any` / `all` / `if` / `else` around tests of a `header`, `cookie`,
//! `query` parameter or the request-target (`match`), compiled into the
//! same expression tree as the DCR XML form (`rules/expr`, `rules/tree`),
//! so the two forms extract the same keys:
//!
//! ```toml
//! [[rules]]
//! name = "tenant"
//! key = { all = [
//!   { header = "x-internal" },
//!   { if = [{ cookie = "tenant", return = "cookie.tenant" }], else = "parameter.tenant" },
//! ] }
//!
//! [[rules]]
//! name = "cart"
//! key = { all = [
//!   { cookie = "session", absent = true },
//!   { match = '[?&]cart=([0-9]+)', prefix = "cart:" },
//! ] }
//! ```
//!
//! Conditions (`when`) are the method, host, path prefix or regex, a
//! header or cookie present or absent, and the client connection's TLS
//! facts: `tls = true` (HTTPS at the entry) and `sni = "api.example.com"`.
//!
//! A nested rule may also have `when` conditions, checked first. Rules are
//! tried in order; the first rule yielding a non-empty key wins. With no
//! rule yielding a key the router uses [`default_key`] (case H2).
//!
//! Case code (H2) names a case of `docs/cases.md`: the input, the
//! value peerlb must give, and where it is tested.

use std::borrow::Cow;
use std::fmt;
use std::net::SocketAddr;

use http::header::{HOST, HeaderName};
use http::{HeaderMap, Method, Uri};
use regex::Regex;
use serde::{Deserialize, Serialize};

use super::sticky::{cookies, percent_decode, split_at_byte};

mod bounds;
mod expr;
mod tree;
mod xml;

pub(crate) use bounds::MAX_RULES_FILE_BYTES;
use bounds::RegexBudget;

pub(crate) use expr::ExprSpec;

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
    /// Either this (not empty) or `key` is required, not both.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extract: Vec<ExtractorSpec>,
    /// A nested key expression (`any` / `all` / `if` / tests), evaluated
    /// when `when` holds; its non-empty result is the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<ExprSpec>,
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
    /// The client connection is (true) or is not (false) TLS: HTTPS at the
    /// entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<bool>,
    /// The SNI name the client sent in its TLS handshake, ASCII
    /// case-insensitive (a trailing dot ignored); a cleartext connection
    /// or one without SNI never matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
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
    /// The user part of the URI in the first value of this header (SailFin's
    /// `request.<header>.uri.user`): `alice` from
    /// `"Alice" <sip:alice@example.com>;tag=1` or `sip:alice;x=y@host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_uri_user: Option<String>,
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
    /// A regex whose compiled automaton exceeds this many bytes (the
    /// per-regex limit, 2 MiB): a large repetition of a Unicode class such
    /// as `\w{200}`. Narrow the repetition or use an ASCII class
    /// (`(?-u:\w)`, `[A-Za-z0-9_]`).
    #[error(
        "regex too big: it compiles to more than {0} bytes (narrow its repetitions, or use an ASCII class such as (?-u:\\w) or [A-Za-z0-9_])"
    )]
    RegexTooBig(usize),
    /// The rule set's regexes together, with the smallest lazy-DFA cache
    /// each (8 KiB, three per regex), need more than this many bytes
    /// (64 MiB, `engine/rules/bounds.rs`). Use fewer or smaller regexes.
    #[error(
        "the rules' regexes together, with their matching caches, need more than {0} bytes: use fewer or smaller regexes"
    )]
    RegexBudget(usize),
    /// Expressions (or XML elements) nested deeper than this many levels.
    #[error("nested deeper than {0} levels")]
    TooDeep(usize),
    /// A rules file larger than this many bytes; it is not read.
    #[error("the file is larger than {0} bytes")]
    TooLarge(usize),
    /// An extractor regex without a capture group; the key is group 1.
    #[error("regex has no capture group (the key is the first capture group)")]
    NoCaptureGroup,
    /// An extractor with zero or several sources.
    #[error("exactly one of query, header, header_uri_user, cookie, path_regex, target_regex")]
    ExtractorSource,
    /// A rule with an empty `extract` list and no `key`.
    #[error("at least one extractor (or a `key` expression) is required")]
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
    /// DCR XML that is not well-formed (the parser's message).
    #[error("malformed XML: {0}")]
    Xml(String),
    /// A DCR XML element that is not allowed here; the message lists the
    /// allowed ones.
    #[error("unknown element <{element}> (expected {expected})")]
    UnknownElement {
        /// The element found.
        element: String,
        /// The elements allowed at this place.
        expected: &'static str,
    },
    /// A DCR XML attribute the element does not have.
    #[error("unknown attribute {0:?}")]
    UnknownAttribute(String),
    /// A required DCR XML attribute is missing.
    #[error("missing attribute {0:?}")]
    MissingAttribute(&'static str),
    /// A DCR `return` attribute that is not a known variable.
    #[error(
        "invalid return variable {0:?} (expected request.<header>, request.<header>.uri.user, parameter.<name>, cookie.<name> or match)"
    )]
    InvalidReturn(String),
    /// A DCR XML element with the wrong content (the message says what).
    #[error("{0}")]
    Structure(String),
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
    /// The client's address as seen by the entry node (the PROXY
    /// protocol's source address on a listener that expects one).
    pub client: SocketAddr,
    /// Whether the client's connection is TLS (HTTPS at the entry).
    pub tls: bool,
    /// The SNI name of the client's TLS handshake, if it sent one.
    pub sni: Option<&'a str>,
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
    /// The `<sip-rules>` of a DCR XML file, compiled like `http-rules`.
    sip: Vec<Rule>,
}

#[derive(Clone, Debug)]
struct Rule {
    name: Option<String>,
    body: Body,
}

/// A rule's logic: the flat TOML form (conditions, then extractors) or an
/// expression tree (`or` / `and` / `if` / tests) from the nested TOML form
/// or the SailFin DCR XML, behind conditions (always true for XML).
#[derive(Clone, Debug)]
enum Body {
    Flat { when: When, extract: Vec<Extractor> },
    Tree { when: When, expr: tree::Expr },
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
    tls: Option<bool>,
    /// Lowercase, without a trailing dot.
    sni: Option<String>,
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
    HeaderUriUser(HeaderName),
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
    /// without exactly one source, an empty `extract` list without `key` (or
    /// both), an empty name, a regex that does not compile or (for
    /// extractors and `match`) has no capture group, an invalid method or
    /// header name; in a `key` expression, a table that is not exactly one
    /// of `any` / `all` / `if` / a test, an empty list, a misplaced `else`,
    /// `absent`, `prefix` or `return`, or an invalid return variable.
    pub fn compile(specs: &[RuleSpec]) -> Result<Rules, RuleError> {
        bounds::fit(|budget| {
            let rules = specs
                .iter()
                .enumerate()
                .map(|(i, spec)| compile_rule(i, spec, budget))
                .collect::<Result<_, _>>()?;
            Ok(Rules {
                rules,
                sip: Vec::new(),
            })
        })
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
        extract(&self.rules, req)
    }

    /// Whether the rules would key `req` differently were its SNI name
    /// `host` (the request's own authority, lowercase): a request on a
    /// connection a client opened for another name and reused for this
    /// one (connection coalescing, RFC 9113 section 9.1.1), which a rule
    /// keyed on `sni` would route as that other name's. The entry answers
    /// it 421 (RFC 9110 section 15.5.20), so the client opens a connection
    /// for `host`. False when no rule reads `sni`, or when they read it to
    /// the same effect.
    pub fn sni_would_differ(&self, req: &RequestView<'_>, host: &str) -> bool {
        let as_host = RequestView {
            sni: Some(host),
            ..*req
        };
        self.extract(req) != self.extract(&as_host)
    }

    /// [`Rules::extract`] with the `<sip-rules>` of a DCR XML file, on the
    /// view of a SIP request (`engine::sip`): `request.<header>` reads its
    /// header fields (compact names expanded), `<request-uri parameter=...>`
    /// its Request-URI parameters. `None` when no SIP rule yields a key (or
    /// there are none).
    pub(crate) fn extract_sip(&self, req: &RequestView<'_>) -> Option<(usize, String)> {
        extract(&self.sip, req)
    }

    /// Number of `<sip-rules>` rules.
    pub(crate) fn sip_len(&self) -> usize {
        self.sip.len()
    }

    /// The name of `<sip-rules>` rule `index` (for `peerlb route`).
    pub(crate) fn sip_name(&self, index: usize) -> Option<&str> {
        self.sip.get(index)?.name.as_deref()
    }

    /// Parses SailFin's `data-centric-rules.xml` (root `user-centric-rules`)
    /// into rules: each child of `http-rules` is one rule, in order, evaluated
    /// with SailFin's semantics (see the `rules::xml` module doc) and yielding
    /// the key when its result is non-empty. Each child of `sip-rules` is
    /// one SIP rule the same way (`Rules::extract_sip`).
    ///
    /// # Errors
    ///
    /// A `RuleError` whose `path` names the element and its line
    /// (`<header> at line 7`): malformed XML, an unknown element or attribute,
    /// a missing `name`/`parameter`/`return`, an invalid return variable,
    /// header name or regex (a `match` regex needs a capture group).
    pub fn from_xml(text: &str) -> Result<Rules, RuleError> {
        xml::parse(text)
    }
}

/// The first rule of `rules` (in order) yielding a non-empty key.
fn extract(rules: &[Rule], req: &RequestView<'_>) -> Option<(usize, String)> {
    rules.iter().enumerate().find_map(|(i, rule)| {
        let key = match &rule.body {
            Body::Flat { when, extract } => {
                if !when.holds(req) {
                    return None;
                }
                extract.iter().find_map(|x| {
                    let v = x.source.value(req)?;
                    // Two pushes, not `format!`: this runs per request.
                    (!v.is_empty()).then(|| {
                        let mut k = String::with_capacity(x.prefix.len() + v.len());
                        k.push_str(&x.prefix);
                        k.push_str(&v);
                        k
                    })
                })
            }
            Body::Tree { when, expr } => {
                if !when.holds(req) {
                    return None;
                }
                expr.eval(req)
                    .filter(|k| !k.is_empty())
                    .map(|k| k.into_owned())
            }
        };
        key.map(|k| (i, k))
    })
}

fn compile_rule(i: usize, spec: &RuleSpec, budget: &mut RegexBudget) -> Result<Rule, RuleError> {
    // Long: one rule's fields compiled in the order its errors are reported, each naming its
    // field.
    let err = |field: String, kind| RuleError {
        path: format!("rules[{i}]{field}"),
        rule: spec.name.clone(),
        kind,
    };
    let re = |budget: &mut RegexBudget, field: &str, pat: &str| {
        budget
            .compile(pat)
            .map_err(|kind| err(field.to_owned(), kind))
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
            .map(|p| re(budget, ".when.path_regex", p))
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
        tls: c.tls,
        sni: c
            .sni
            .as_deref()
            .map(|v| nonempty(".when.sni", v.trim_end_matches('.')).map(|v| v.to_ascii_lowercase()))
            .transpose()?,
    };

    if let Some(key) = &spec.key {
        if !spec.extract.is_empty() {
            return Err(err(
                String::new(),
                RuleErrorKind::Structure("give either `extract` or `key`, not both".into()),
            ));
        }
        let expr = expr::compile(key, &format!("rules[{i}].key"), &spec.name, budget, 1)?;
        return Ok(Rule {
            name: spec.name.clone(),
            body: Body::Tree { when, expr },
        });
    }
    if spec.extract.is_empty() {
        return Err(err(".extract".into(), RuleErrorKind::NoExtractors));
    }
    let mut extract = Vec::with_capacity(spec.extract.len());
    for (j, x) in spec.extract.iter().enumerate() {
        let at = |f: &str| format!(".extract[{j}]{f}");
        let mut capture_re = |f: &str, p: &str| {
            let r = re(budget, &at(f), p)?;
            if r.captures_len() < 2 {
                return Err(err(at(f), RuleErrorKind::NoCaptureGroup));
            }
            Ok(r)
        };
        let source = match (
            &x.query,
            &x.header,
            &x.header_uri_user,
            &x.cookie,
            &x.path_regex,
            &x.target_regex,
        ) {
            (Some(q), None, None, None, None, None) => Source::Query(nonempty(&at(".query"), q)?),
            (None, Some(h), None, None, None, None) => Source::Header(header(&at(".header"), h)?),
            (None, None, Some(h), None, None, None) => {
                Source::HeaderUriUser(header(&at(".header_uri_user"), h)?)
            }
            (None, None, None, Some(c), None, None) => Source::Cookie(nonempty(&at(".cookie"), c)?),
            (None, None, None, None, Some(p), None) => {
                Source::PathRegex(capture_re(".path_regex", p)?)
            }
            (None, None, None, None, None, Some(p)) => {
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
        body: Body::Flat { when, extract },
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
            && self.tls.is_none_or(|t| t == req.tls)
            && self.sni.as_deref().is_none_or(|want| {
                req.sni
                    .is_some_and(|s| s.trim_end_matches('.').eq_ignore_ascii_case(want))
            })
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
            Source::Query(name) => query_param(req, name),
            Source::Header(name) => header_value(req, name),
            Source::HeaderUriUser(name) => uri_user_cow(header_value(req, name)?),
            Source::Cookie(name) => cookie_value(req, name),
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

/// First value of query parameter `name`, percent-decoded (`+` = space).
pub(crate) fn query_param<'a>(req: &RequestView<'a>, name: &str) -> Option<Cow<'a, str>> {
    split_at_byte(req.uri.query()?, b'&').find_map(|pair| {
        let (n, v) = match pair.bytes().position(|b| b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, ""),
        };
        (percent_decode(n, true) == name).then(|| percent_decode(v, true))
    })
}

/// First value of header `name`, trimmed (invalid UTF-8 replaced).
pub(crate) fn header_value<'a>(req: &RequestView<'a>, name: &HeaderName) -> Option<Cow<'a, str>> {
    let v = req.headers.get(name)?;
    Some(match String::from_utf8_lossy(v.as_bytes()) {
        Cow::Borrowed(s) => Cow::Borrowed(s.trim()),
        Cow::Owned(s) => Cow::Owned(s.trim().to_owned()),
    })
}

/// Value of the first cookie `name` over all `Cookie` headers.
pub(crate) fn cookie_value<'a>(req: &RequestView<'a>, name: &str) -> Option<Cow<'a, str>> {
    cookies(req.headers)
        .find(|(n, _)| *n == name)
        .map(|(_, v)| Cow::Borrowed(v))
}

/// The user part of a URI-valued header value (SIP `From` / `To` /
/// `P-Asserted-Identity` style): the URI is the part inside `<...>` if
/// present, else the whole value; a leading `scheme:` (and `//`) is dropped;
/// the user is what precedes `@`, cut at the first `;` or `:` (user
/// parameters, password). `None` without `@` or when the user is empty.
pub(crate) fn uri_user(value: &str) -> Option<&str> {
    let uri = match value.find('<') {
        Some(i) => {
            let rest = &value[i + 1..];
            &rest[..rest.find('>').unwrap_or(rest.len())]
        }
        None => value,
    };
    let uri = uri.trim();
    let after_scheme = match uri.find(':') {
        Some(i)
            if i > 0
                && uri[..i]
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b)) =>
        {
            &uri[i + 1..]
        }
        _ => uri,
    };
    let after_scheme = after_scheme.strip_prefix("//").unwrap_or(after_scheme);
    let userinfo = &after_scheme[..after_scheme.find('@')?];
    let user = &userinfo[..userinfo.find([';', ':']).unwrap_or(userinfo.len())];
    (!user.is_empty()).then_some(user)
}

fn uri_user_cow(v: Cow<'_, str>) -> Option<Cow<'_, str>> {
    match v {
        Cow::Borrowed(s) => uri_user(s).map(Cow::Borrowed),
        Cow::Owned(s) => uri_user(&s).map(|u| Cow::Owned(u.to_owned())),
    }
}

/// The request-target as received: path and query for origin-form, the whole
/// URI for absolute-form, the authority for authority-form (CONNECT).
pub(crate) fn request_target(uri: &Uri) -> Cow<'_, str> {
    match (uri.scheme(), uri.path_and_query()) {
        (None, Some(pq)) => Cow::Borrowed(pq.as_str()),
        (None, None) => Cow::Borrowed(uri.authority().map_or("", |a| a.as_str())),
        _ => Cow::Owned(uri.to_string()),
    }
}

#[cfg(test)]
mod tests;
