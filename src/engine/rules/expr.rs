//! The TOML form of nested rule expressions (`key = { any = [...] }`):
//! SailFin's `or` / `and` / `if` / `else` and its `header` / `cookie` /
//! `request-uri` tests, compiled into the same `tree::Expr` the DCR XML form
//! uses, so both forms evaluate identically.
//!
//! | TOML | DCR XML |
//! | --- | --- |
//! | `{ any = [e, ...] }` | `<or>` |
//! | `{ all = [e, ...] }` | `<and>` |
//! | `{ if = [e, ...], else = "VAR" }` | `<if> ... <else return="VAR"/></if>` |
//! | `{ header = "h" }` | `<header name="h"><exist/></header>` |
//! | `{ cookie = "c", absent = true }` | `<cookie name="c"><notexist/></cookie>` |
//! | `{ query = "p", return = "parameter.p" }` | `<request-uri parameter="p" return="parameter.p"><exist/></request-uri>` |
//! | `{ match = "RE", prefix = "u:" }` | `<request-uri><match prefix="u:">RE</match></request-uri>` |
//! | `{ query = "p", match = "RE" }` | `<request-uri parameter="p"><match>RE</match></request-uri>` |
//!
//! Extensions over the XML: `match` also applies to a `header` or `cookie`
//! value. Everything else (results, nulls, `return` variables) is as in
//! `rules::tree`.

use http::header::HeaderName;
use serde::{Deserialize, Serialize};

use super::bounds::{MAX_RULE_DEPTH, RegexBudget};
use super::tree::{Expr, Subject, Test, Var};
use super::{RuleError, RuleErrorKind};

/// One nested key expression in `cluster.toml` (a rule's `key`): exactly one
/// of `any`, `all`, `if` (with an optional `else`), or a test (`header`,
/// `cookie`, `query` and/or `match`, with `absent`, `prefix`, `return`).
///
/// Results follow SailFin's data-centric rules; a result that is null or
/// empty makes the rule yield no key:
///
/// - `any`: the first non-null result of its expressions (`or`).
/// - `all`: the last result when every result is non-null (`and`).
/// - `if`: its expressions combined as `all`; when that is null, the `else`
///   variable (if given).
/// - a test: when it holds, its `return` variable; without `return`, the
///   tested value (`exists`), the prefixed capture (`match`) or the empty
///   string (`absent = true`: a pure condition). Null when it fails.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ExprSpec {
    /// SailFin `or`: the first non-null result. Must not be empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub any: Option<Vec<ExprSpec>>,
    /// SailFin `and`: the last result when all are non-null. Must not be
    /// empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all: Option<Vec<ExprSpec>>,
    /// SailFin `if`: conditions combined as `all`. Must not be empty.
    #[serde(default, rename = "if", skip_serializing_if = "Option::is_none")]
    pub if_: Option<Vec<ExprSpec>>,
    /// SailFin `else` of an `if`: the variable returned when the
    /// conditions' result is null. Only with `if`; not `match`.
    #[serde(default, rename = "else", skip_serializing_if = "Option::is_none")]
    pub else_: Option<String>,
    /// Test a header (its first value, trimmed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// Test a cookie (the first of this name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<String>,
    /// Test a query parameter (its first value, percent-decoded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// The test is that the subject is absent (SailFin `notexist`) rather
    /// than present (`exist`, the default). Not with `match`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub absent: Option<bool>,
    /// The test is that this regex matches the subject, or the whole
    /// request-target when there is no `header`, `cookie` or `query`; its
    /// value is `prefix` + capture group 1 (the regex needs a group).
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_: Option<String>,
    /// Prepended to a `match` capture. Only with `match`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// What a test returns when it holds: `request.<header>`,
    /// `request.<header>.uri.user`, `parameter.<name>`, `cookie.<name>`, or
    /// `match` (with `match` only). Default: the tested value.
    #[serde(default, rename = "return", skip_serializing_if = "Option::is_none")]
    pub return_: Option<String>,
}

/// Compiles `spec`, at nesting `depth` (1 for a rule's `key`); `path` names
/// it in errors (`rules[0].key.any[2]`) and `rule` is the rule's name; its
/// regexes count against `budget`.
pub(super) fn compile(
    spec: &ExprSpec,
    path: &str,
    rule: &Option<String>,
    budget: &mut RegexBudget,
    depth: usize,
) -> Result<Expr, RuleError> {
    // Long: one arm per expression kind of the rules' TOML model, each a few lines.
    let err = |field: &str, kind| RuleError {
        path: format!("{path}{field}"),
        rule: rule.clone(),
        kind,
    };
    if depth > MAX_RULE_DEPTH {
        return Err(err("", RuleErrorKind::TooDeep(MAX_RULE_DEPTH)));
    }
    let structure = |field: &str, msg: &str| err(field, RuleErrorKind::Structure(msg.to_owned()));
    let mut list = |name: &str, items: &[ExprSpec]| -> Result<Vec<Expr>, RuleError> {
        if items.is_empty() {
            return Err(structure(
                &format!(".{name}"),
                "needs at least one expression",
            ));
        }
        items
            .iter()
            .enumerate()
            .map(|(i, e)| compile(e, &format!("{path}.{name}[{i}]"), rule, budget, depth + 1))
            .collect()
    };
    let is_test = spec.header.is_some()
        || spec.cookie.is_some()
        || spec.query.is_some()
        || spec.match_.is_some();
    let forms = [
        spec.any.is_some(),
        spec.all.is_some(),
        spec.if_.is_some(),
        is_test,
    ];
    if forms.iter().filter(|&&f| f).count() != 1 {
        return Err(structure(
            "",
            "exactly one of any, all, if, or a test (header, cookie, query, match)",
        ));
    }
    if spec.else_.is_some() && spec.if_.is_none() {
        return Err(structure(".else", "only in an `if`"));
    }
    if !is_test {
        for (set, field) in [
            (spec.absent.is_some(), ".absent"),
            (spec.prefix.is_some(), ".prefix"),
            (spec.return_.is_some(), ".return"),
        ] {
            if set {
                return Err(structure(
                    field,
                    "only in a test (header, cookie, query, match)",
                ));
            }
        }
    }
    if let Some(items) = &spec.any {
        return Ok(Expr::Or(list("any", items)?));
    }
    if let Some(items) = &spec.all {
        return Ok(Expr::And(list("all", items)?));
    }
    if let Some(items) = &spec.if_ {
        let cond = list("if", items)?;
        let otherwise = match &spec.else_ {
            None => None,
            Some(v) => match Var::parse(v) {
                Some(Var::Match) => {
                    return Err(structure(".else", "`match` is only a test's return"));
                }
                Some(var) => Some(var),
                None => return Err(err(".else", RuleErrorKind::InvalidReturn(v.clone()))),
            },
        };
        return Ok(Expr::If { cond, otherwise });
    }

    // A test.
    let subject = match (&spec.header, &spec.cookie, &spec.query) {
        (Some(h), None, None) => {
            if h.is_empty() {
                return Err(err(".header", RuleErrorKind::Empty));
            }
            Subject::Header(
                HeaderName::from_bytes(h.as_bytes())
                    .map_err(|_| err(".header", RuleErrorKind::InvalidHeaderName(h.clone())))?,
            )
        }
        (None, Some(c), None) => {
            if c.is_empty() {
                return Err(err(".cookie", RuleErrorKind::Empty));
            }
            Subject::Cookie(c.clone())
        }
        (None, None, Some(q)) => {
            if q.is_empty() {
                return Err(err(".query", RuleErrorKind::Empty));
            }
            Subject::Param(q.clone())
        }
        (None, None, None) => Subject::Target,
        _ => return Err(structure("", "at most one of header, cookie, query")),
    };
    if spec.prefix.is_some() && spec.match_.is_none() {
        return Err(structure(".prefix", "only with `match`"));
    }
    let test = match (&spec.match_, spec.absent) {
        (Some(_), Some(true)) => return Err(structure(".absent", "not with `match`")),
        (Some(pat), _) => {
            let re = budget.compile(pat).map_err(|kind| err(".match", kind))?;
            if re.captures_len() < 2 {
                return Err(err(".match", RuleErrorKind::NoCaptureGroup));
            }
            Test::Match {
                re,
                prefix: spec.prefix.clone().unwrap_or_default(),
            }
        }
        (None, Some(true)) => Test::NotExist,
        (None, _) => Test::Exist,
    };
    let ret = match &spec.return_ {
        None => None,
        Some(v) => match Var::parse(v) {
            Some(Var::Match) if !matches!(test, Test::Match { .. }) => {
                return Err(structure(".return", "`match` needs a `match` test"));
            }
            Some(var) => Some(var),
            None => return Err(err(".return", RuleErrorKind::InvalidReturn(v.clone()))),
        },
    };
    Ok(Expr::Test { subject, test, ret })
}
