//! The compiled form of SailFin DCR expressions and their evaluation.
//!
//! A result is `Option<Cow<str>>`: `None` is SailFin's null. Every element
//! returns a result:
//!
//! - `Or`: the first non-null child result (children after it are not
//!   evaluated); null if all are null.
//! - `And`: the last child's result when every child's result is non-null;
//!   else null.
//! - `If`: the condition children combined as `And`; when that is null and an
//!   `else` is present, the `else`'s return variable; else null.
//! - `Test` (`header`, `cookie`, `request-uri`): when its test holds, the
//!   element's `return` variable; without `return`, the tested value
//!   (`exist`), the prefixed capture (`match`) or the empty string
//!   (`notexist`: a pure condition, non-null). Null when the test fails.
//!
//! A return variable that resolves to an empty string resolves to null, so
//! an empty header, cookie or parameter never becomes a key and an `or`
//! moves on to its next child, as an empty value makes the TOML form try its
//! next extractor.

use std::borrow::Cow;

use http::header::HeaderName;
use regex::Regex;

use super::{RequestView, cookie_value, header_value, query_param, request_target, uri_user};

/// One DCR expression.
#[derive(Clone, Debug)]
pub(super) enum Expr {
    /// `<or>`: first non-null result.
    Or(Vec<Expr>),
    /// `<and>`: last result when all are non-null.
    And(Vec<Expr>),
    /// `<if>`: conditions (as `and`), optional `<else return=.../>`.
    If {
        cond: Vec<Expr>,
        otherwise: Option<Var>,
    },
    /// `<header>`, `<cookie>`, `<request-uri>` with their test.
    Test {
        subject: Subject,
        test: Test,
        ret: Option<Var>,
    },
}

/// What a test element looks at.
#[derive(Clone, Debug)]
pub(super) enum Subject {
    /// `<header name=...>`: the first value, trimmed.
    Header(HeaderName),
    /// `<cookie name=...>`: the cookie's value.
    Cookie(String),
    /// `<request-uri parameter=...>`: the query parameter's value.
    Param(String),
    /// `<request-uri>` without `parameter`: the whole request-target.
    Target,
}

/// The test inside a test element.
#[derive(Clone, Debug)]
pub(super) enum Test {
    /// `<exist/>`: the subject is present (possibly empty).
    Exist,
    /// `<notexist/>`: the subject is absent.
    NotExist,
    /// `<match prefix=...>REGEX</match>`: the regex matches the subject; the
    /// value is `prefix` + the first capture group.
    Match { re: Regex, prefix: String },
}

/// A `return` variable.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Var {
    /// `request.<header>`.
    Header(HeaderName),
    /// `request.<header>.uri.user`.
    HeaderUriUser(HeaderName),
    /// `parameter.<name>`.
    Param(String),
    /// `cookie.<name>`.
    Cookie(String),
    /// `match`: the enclosing `<match>`'s prefixed capture.
    Match,
}

impl Var {
    /// Parses a `return` attribute; `None` if it is not a known variable.
    pub(super) fn parse(s: &str) -> Option<Var> {
        let header = |h: &str| HeaderName::from_bytes(h.as_bytes()).ok();
        if s == "match" {
            return Some(Var::Match);
        }
        if let Some(name) = s.strip_prefix("parameter.") {
            return (!name.is_empty()).then(|| Var::Param(name.to_owned()));
        }
        if let Some(name) = s.strip_prefix("cookie.") {
            return (!name.is_empty()).then(|| Var::Cookie(name.to_owned()));
        }
        let rest = s.strip_prefix("request.")?;
        match rest.strip_suffix(".uri.user") {
            Some(h) => header(h).map(Var::HeaderUriUser),
            None => header(rest).map(Var::Header),
        }
    }

    fn resolve<'a>(&self, req: &RequestView<'a>, matched: Option<&str>) -> Option<Cow<'a, str>> {
        let v = match self {
            Var::Header(h) => header_value(req, h),
            Var::HeaderUriUser(h) => match header_value(req, h)? {
                Cow::Borrowed(s) => uri_user(s).map(Cow::Borrowed),
                Cow::Owned(s) => uri_user(&s).map(|u| Cow::Owned(u.to_owned())),
            },
            Var::Param(p) => query_param(req, p),
            Var::Cookie(c) => cookie_value(req, c),
            Var::Match => matched.map(|m| Cow::Owned(m.to_owned())),
        };
        v.filter(|v| !v.is_empty())
    }
}

impl Subject {
    fn value<'a>(&self, req: &RequestView<'a>) -> Option<Cow<'a, str>> {
        match self {
            Subject::Header(h) => header_value(req, h),
            Subject::Cookie(c) => cookie_value(req, c),
            Subject::Param(p) => query_param(req, p),
            Subject::Target => Some(request_target(req.uri)),
        }
    }
}

impl Expr {
    /// Evaluates the expression against `req` (see the module doc).
    pub(super) fn eval<'a>(&self, req: &RequestView<'a>) -> Option<Cow<'a, str>> {
        match self {
            Expr::Or(children) => children.iter().find_map(|c| c.eval(req)),
            Expr::And(children) => all(children, req),
            Expr::If { cond, otherwise } => {
                all(cond, req).or_else(|| otherwise.as_ref()?.resolve(req, None))
            }
            Expr::Test { subject, test, ret } => {
                let value = subject.value(req);
                let matched: Option<String> = match test {
                    Test::Exist => {
                        value.as_ref()?;
                        None
                    }
                    Test::NotExist => {
                        if value.is_some() {
                            return None;
                        }
                        None
                    }
                    Test::Match { re, prefix } => {
                        let v = value.as_ref()?;
                        let g = re.captures(v)?.get(1)?;
                        Some(format!("{prefix}{}", g.as_str()))
                    }
                };
                match (ret, test) {
                    (Some(var), _) => var.resolve(req, matched.as_deref()),
                    (None, Test::Exist) => value,
                    (None, Test::Match { .. }) => matched.map(Cow::Owned),
                    (None, Test::NotExist) => Some(Cow::Borrowed("")),
                }
            }
        }
    }
}

/// `and`: the last result when every result is non-null.
fn all<'a>(children: &[Expr], req: &RequestView<'a>) -> Option<Cow<'a, str>> {
    let mut last = None;
    for c in children {
        last = Some(c.eval(req)?);
    }
    last
}
