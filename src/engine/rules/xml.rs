//! SailFin's `data-centric-rules.xml` (the Converged Load Balancer's DCR
//! file), parsed with quick-xml into the same [`Rules`] as the TOML form.
//!
//! Grammar (children in any order unless said otherwise):
//!
//! ```text
//! user-centric-rules        root; only xmlns / xmlns:* / xsi:* attributes
//!   http-rules              at most once; each child is one rule, in order
//!   sip-rules               at most once; each child is one SIP rule, in order
//! expression =
//!   or                      first non-null result              (1+ children)
//!   and                     last result when all are non-null  (1+ children)
//!   if                      1+ conditions, then optionally <else return="VAR"/>
//!   header name= [return=]  holding <exist/> or <notexist/>
//!   cookie name= [return=]  holding <exist/> or <notexist/>
//!   request-uri [parameter=] [return=]
//!                           holding <exist/> or <notexist/> (need parameter=),
//!                           or <match [prefix=]>REGEX</match>: the regex on
//!                           the parameter's value, or without parameter= on
//!                           the request-target; value = prefix + group 1
//! VAR = request.<header> | request.<header>.uri.user | parameter.<name>
//!     | cookie.<name> | match (only in an element whose test is <match>)
//! ```
//!
//! Evaluation is in `rules::tree`. Unknown elements and attributes are
//! errors naming the element and its line, as are malformed XML, a missing
//! required attribute, an invalid variable, header name or regex.

use quick_xml::events::Event;
use quick_xml::{Reader, XmlVersion};

use super::bounds::{MAX_RULE_DEPTH, MAX_RULES_FILE_BYTES, MAX_XML_ATTRIBUTES, RegexBudget};
use super::tree::{Expr, Subject, Test, Var};
use super::{Body, Rule, RuleError, RuleErrorKind, Rules};
use http::header::HeaderName;

/// One element of a DCR XML file as parsed (name, attributes in document
/// order, child elements, text content, 1-based line of its start tag).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct XmlElement {
    /// The element name (with its namespace prefix, if any).
    pub(crate) name: String,
    /// Attributes as `(name, value)`, values unescaped.
    pub(crate) attrs: Vec<(String, String)>,
    /// Child elements in document order.
    pub(crate) children: Vec<XmlElement>,
    /// The concatenated text and CDATA content, unescaped, untrimmed.
    pub(crate) text: String,
    /// Line of the start tag (1-based).
    pub(crate) line: u32,
}

/// 1-based line numbers of byte offsets in a text, counted as the reader
/// moves forward: offsets asked for in increasing order cost one pass over
/// the text in all, so a file is parsed in time linear in its size. An
/// offset before the last one asked for recounts from the start (only an
/// error's position can be one, once).
struct Lines<'t> {
    text: &'t [u8],
    /// The offset counted up to.
    pos: usize,
    /// The line `pos` is on.
    line: u32,
    /// Bytes scanned so far (to check the counting stays linear).
    #[cfg(test)]
    scanned: usize,
}

impl<'t> Lines<'t> {
    fn new(text: &'t str) -> Self {
        Lines {
            text: text.as_bytes(),
            pos: 0,
            line: 1,
            #[cfg(test)]
            scanned: 0,
        }
    }

    /// The line of byte offset `pos` (clamped to the text).
    fn at(&mut self, pos: usize) -> u32 {
        let pos = pos.min(self.text.len());
        if pos < self.pos {
            self.pos = 0;
            self.line = 1;
        }
        let newlines = self.text[self.pos..pos]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        #[cfg(test)]
        {
            self.scanned += pos - self.pos;
        }
        self.line = self
            .line
            .saturating_add(u32::try_from(newlines).unwrap_or(u32::MAX));
        self.pos = pos;
        self.line
    }
}

fn xml_error(lines: &mut Lines<'_>, pos: u64, msg: impl std::fmt::Display) -> RuleError {
    let pos = usize::try_from(pos).unwrap_or(usize::MAX);
    RuleError {
        path: format!("line {}", lines.at(pos)),
        rule: None,
        kind: RuleErrorKind::Xml(msg.to_string()),
    }
}

/// Parses `text` into its root element, in time linear in its length.
///
/// # Errors
/// Malformed XML; an element nested more than [`MAX_RULE_DEPTH`] below the
/// root; an element with more than [`MAX_XML_ATTRIBUTES`] attributes.
fn read_tree(text: &str) -> Result<XmlElement, RuleError> {
    // Long: one loop over quick-xml's events, one arm per event kind, with the depth and
    // attribute bounds checked where each element opens.
    let mut reader = Reader::from_str(text);
    let mut lines = Lines::new(text);
    let mut stack: Vec<XmlElement> = Vec::new();
    let mut root: Option<XmlElement> = None;
    loop {
        let before = reader.buffer_position() as usize;
        let event = match reader.read_event() {
            Ok(ev) => ev,
            Err(e) => return Err(xml_error(&mut lines, reader.error_position(), e)),
        };
        match event {
            Event::Start(e) | Event::Empty(e) if root.is_some() => {
                return Err(xml_error(
                    &mut lines,
                    before as u64,
                    format!("element <{}> after the root element", e.name().as_ref()),
                ));
            }
            Event::Start(ref e) | Event::Empty(ref e) => {
                let at = text[before.min(text.len())..]
                    .find('<')
                    .map_or(before, |i| before + i);
                let mut el = XmlElement {
                    name: e.name().as_ref().to_owned(),
                    attrs: Vec::new(),
                    children: Vec::new(),
                    text: String::new(),
                    line: lines.at(at),
                };
                if stack.len() > MAX_RULE_DEPTH {
                    return Err(err(&el, RuleErrorKind::TooDeep(MAX_RULE_DEPTH)));
                }
                for (n, a) in e.attributes().enumerate() {
                    if n == MAX_XML_ATTRIBUTES {
                        return Err(err(
                            &el,
                            RuleErrorKind::Structure(format!(
                                "more than {MAX_XML_ATTRIBUTES} attributes"
                            )),
                        ));
                    }
                    let a = a.map_err(|e| xml_error(&mut lines, before as u64, e))?;
                    let v = a
                        .normalized_value(XmlVersion::Implicit1_0)
                        .map_err(|e| xml_error(&mut lines, before as u64, e))?;
                    el.attrs.push((a.key.as_ref().to_owned(), v.into_owned()));
                }
                if matches!(event, Event::Start(_)) {
                    stack.push(el);
                } else {
                    close(el, &mut stack, &mut root);
                }
            }
            Event::End(_) => {
                let el = stack.pop().expect("quick-xml checks end names");
                close(el, &mut stack, &mut root);
            }
            Event::Text(t) => {
                let s = t.xml10_content();
                match stack.last_mut() {
                    Some(el) => el.text.push_str(&s),
                    None if s.trim().is_empty() => {}
                    None => {
                        return Err(xml_error(
                            &mut lines,
                            before as u64,
                            "text outside the root element",
                        ));
                    }
                }
            }
            Event::CData(t) => match stack.last_mut() {
                Some(el) => el.text.push_str(&t.xml10_content()),
                None => {
                    return Err(xml_error(
                        &mut lines,
                        before as u64,
                        "CDATA outside the root element",
                    ));
                }
            },
            Event::GeneralRef(r) => {
                let resolved = match r.resolve_char_ref() {
                    Ok(Some(c)) => c.to_string(),
                    Ok(None) => match quick_xml::escape::resolve_predefined_entity(&r) {
                        Some(s) => s.to_owned(),
                        None => {
                            return Err(xml_error(
                                &mut lines,
                                before as u64,
                                format!("unknown entity &{};", &*r),
                            ));
                        }
                    },
                    Err(e) => return Err(xml_error(&mut lines, before as u64, e)),
                };
                match stack.last_mut() {
                    Some(el) => el.text.push_str(&resolved),
                    None => {
                        return Err(xml_error(
                            &mut lines,
                            before as u64,
                            "text outside the root element",
                        ));
                    }
                }
            }
            Event::Decl(_) | Event::Comment(_) | Event::PI(_) | Event::DocType(_) => {}
            Event::Eof => break,
        }
    }
    if let Some(open) = stack.last() {
        return Err(RuleError {
            path: format!("<{}> at line {}", open.name, open.line),
            rule: None,
            kind: RuleErrorKind::Xml("element is not closed".into()),
        });
    }
    root.ok_or_else(|| xml_error(&mut lines, 0, "no root element"))
}

fn close(el: XmlElement, stack: &mut [XmlElement], root: &mut Option<XmlElement>) {
    match stack.last_mut() {
        Some(parent) => parent.children.push(el),
        None => *root = Some(el),
    }
}

/// An error about element `el`.
fn err(el: &XmlElement, kind: RuleErrorKind) -> RuleError {
    RuleError {
        path: format!("<{}> at line {}", el.name, el.line),
        rule: None,
        kind,
    }
}

/// Checks `el`'s attributes against `allowed`; returns them by name.
fn attrs<'e, const N: usize>(
    el: &'e XmlElement,
    allowed: [&'static str; N],
) -> Result<[Option<&'e str>; N], RuleError> {
    let mut out = [None; N];
    for (k, v) in &el.attrs {
        match allowed.iter().position(|a| a == k) {
            Some(i) => out[i] = Some(v.as_str()),
            None => return Err(err(el, RuleErrorKind::UnknownAttribute(k.clone()))),
        }
    }
    Ok(out)
}

fn no_text(el: &XmlElement) -> Result<(), RuleError> {
    if el.text.trim().is_empty() {
        Ok(())
    } else {
        Err(err(
            el,
            RuleErrorKind::Structure(format!("unexpected text {:?}", el.text.trim())),
        ))
    }
}

/// Parses a DCR XML document into rules (see the module doc).
pub(super) fn parse(text: &str) -> Result<Rules, RuleError> {
    if text.len() > MAX_RULES_FILE_BYTES {
        return Err(RuleError {
            path: "file".into(),
            rule: None,
            kind: RuleErrorKind::TooLarge(MAX_RULES_FILE_BYTES),
        });
    }
    let root = read_tree(text)?;
    if root.name != "user-centric-rules" {
        return Err(err(
            &root,
            RuleErrorKind::UnknownElement {
                element: root.name.clone(),
                expected: "user-centric-rules",
            },
        ));
    }
    for (k, _) in &root.attrs {
        if !(k == "xmlns" || k.starts_with("xmlns:") || k.starts_with("xsi:")) {
            return Err(err(&root, RuleErrorKind::UnknownAttribute(k.clone())));
        }
    }
    no_text(&root)?;
    let mut http: Option<&XmlElement> = None;
    let mut sip: Option<&XmlElement> = None;
    for child in &root.children {
        let slot = match child.name.as_str() {
            "http-rules" => &mut http,
            "sip-rules" => &mut sip,
            other => {
                return Err(err(
                    child,
                    RuleErrorKind::UnknownElement {
                        element: other.to_owned(),
                        expected: "http-rules or sip-rules",
                    },
                ));
            }
        };
        if slot.is_some() {
            return Err(err(
                child,
                RuleErrorKind::Structure(format!("<{}> appears twice", child.name)),
            ));
        }
        *slot = Some(child);
    }
    super::bounds::fit(|budget| {
        let mut rules = Vec::new();
        if let Some(http) = http {
            attrs(http, [])?;
            no_text(http)?;
            for child in &http.children {
                rules.push(Rule {
                    name: Some(format!("<{}> at line {}", child.name, child.line)),
                    body: Body::Tree {
                        when: Default::default(),
                        expr: expr(child, budget)?,
                    },
                });
            }
        }
        let mut sip_rules = Vec::new();
        if let Some(sip) = sip {
            attrs(sip, [])?;
            no_text(sip)?;
            for child in &sip.children {
                sip_rules.push(Rule {
                    name: Some(format!("<{}> at line {}", child.name, child.line)),
                    body: Body::Tree {
                        when: Default::default(),
                        expr: expr(child, budget)?,
                    },
                });
            }
        }
        Ok(Rules {
            rules,
            sip: sip_rules,
        })
    })
}

const EXPRESSIONS: &str = "or, and, if, header, cookie or request-uri";

fn expr(el: &XmlElement, budget: &mut RegexBudget) -> Result<Expr, RuleError> {
    no_text(el)?;
    match el.name.as_str() {
        "or" | "and" => {
            attrs(el, [])?;
            if el.children.is_empty() {
                return Err(err(
                    el,
                    RuleErrorKind::Structure("needs at least one child element".into()),
                ));
            }
            let children = el
                .children
                .iter()
                .map(|c| expr(c, budget))
                .collect::<Result<_, _>>()?;
            Ok(if el.name == "or" {
                Expr::Or(children)
            } else {
                Expr::And(children)
            })
        }
        "if" => {
            attrs(el, [])?;
            let (conds, otherwise) = match el.children.split_last() {
                Some((last, rest)) if last.name == "else" => (rest, Some(last)),
                _ => (&el.children[..], None),
            };
            if conds.is_empty() {
                return Err(err(
                    el,
                    RuleErrorKind::Structure("needs at least one condition element".into()),
                ));
            }
            let cond = conds
                .iter()
                .map(|c| {
                    if c.name == "else" {
                        Err(err(
                            c,
                            RuleErrorKind::Structure(
                                "<else> must be the last child of <if>".into(),
                            ),
                        ))
                    } else {
                        expr(c, budget)
                    }
                })
                .collect::<Result<_, _>>()?;
            let otherwise = match otherwise {
                Some(e) => {
                    let [ret] = attrs(e, ["return"])?;
                    no_text(e)?;
                    if let Some(c) = e.children.first() {
                        return Err(err(
                            c,
                            RuleErrorKind::UnknownElement {
                                element: c.name.clone(),
                                expected: "no child elements in <else>",
                            },
                        ));
                    }
                    let ret =
                        ret.ok_or_else(|| err(e, RuleErrorKind::MissingAttribute("return")))?;
                    let var = var(e, ret)?;
                    if var == Var::Match {
                        return Err(err(
                            e,
                            RuleErrorKind::Structure(
                                "return=\"match\" needs a <match> test".into(),
                            ),
                        ));
                    }
                    Some(var)
                }
                None => None,
            };
            Ok(Expr::If { cond, otherwise })
        }
        "header" | "cookie" => {
            let [name, ret] = attrs(el, ["name", "return"])?;
            let name = name
                .filter(|n| !n.is_empty())
                .ok_or_else(|| err(el, RuleErrorKind::MissingAttribute("name")))?;
            let subject = if el.name == "header" {
                Subject::Header(
                    HeaderName::from_bytes(name.as_bytes())
                        .map_err(|_| err(el, RuleErrorKind::InvalidHeaderName(name.to_owned())))?,
                )
            } else {
                Subject::Cookie(name.to_owned())
            };
            test_element(el, subject, ret, false, budget)
        }
        "request-uri" => {
            let [param, ret] = attrs(el, ["parameter", "return"])?;
            let subject = match param {
                Some("") => return Err(err(el, RuleErrorKind::Empty)),
                Some(p) => Subject::Param(p.to_owned()),
                None => Subject::Target,
            };
            test_element(el, subject, ret, true, budget)
        }
        other => Err(err(
            el,
            RuleErrorKind::UnknownElement {
                element: other.to_owned(),
                expected: EXPRESSIONS,
            },
        )),
    }
}

/// The test child and return variable of `header`, `cookie`, `request-uri`.
fn test_element(
    el: &XmlElement,
    subject: Subject,
    ret: Option<&str>,
    allow_match: bool,
    budget: &mut RegexBudget,
) -> Result<Expr, RuleError> {
    let expected = if allow_match {
        "exactly one of <exist/>, <notexist/>, <match>"
    } else {
        "exactly one of <exist/>, <notexist/>"
    };
    let [t] = el.children.as_slice() else {
        return Err(err(
            el,
            RuleErrorKind::Structure(format!("needs {expected}")),
        ));
    };
    let test = match t.name.as_str() {
        "exist" | "notexist" => {
            attrs(t, [])?;
            no_text(t)?;
            if let Some(c) = t.children.first() {
                return Err(err(
                    c,
                    RuleErrorKind::UnknownElement {
                        element: c.name.clone(),
                        expected: "no child elements",
                    },
                ));
            }
            if matches!(subject, Subject::Target) {
                return Err(err(el, RuleErrorKind::MissingAttribute("parameter")));
            }
            if t.name == "exist" {
                Test::Exist
            } else {
                Test::NotExist
            }
        }
        "match" if allow_match => {
            let [prefix] = attrs(t, ["prefix"])?;
            if let Some(c) = t.children.first() {
                return Err(err(
                    c,
                    RuleErrorKind::UnknownElement {
                        element: c.name.clone(),
                        expected: "a regex as text",
                    },
                ));
            }
            let re = budget.compile(t.text.trim()).map_err(|kind| err(t, kind))?;
            if re.captures_len() < 2 {
                return Err(err(t, RuleErrorKind::NoCaptureGroup));
            }
            Test::Match {
                re,
                prefix: prefix.unwrap_or("").to_owned(),
            }
        }
        other => {
            return Err(err(
                t,
                RuleErrorKind::UnknownElement {
                    element: other.to_owned(),
                    expected,
                },
            ));
        }
    };
    let ret = ret.map(|r| var(el, r)).transpose()?;
    if ret == Some(Var::Match) && !matches!(test, Test::Match { .. }) {
        return Err(err(
            el,
            RuleErrorKind::Structure("return=\"match\" needs a <match> test".into()),
        ));
    }
    Ok(Expr::Test { subject, test, ret })
}

fn var(el: &XmlElement, s: &str) -> Result<Var, RuleError> {
    Var::parse(s).ok_or_else(|| err(el, RuleErrorKind::InvalidReturn(s.to_owned())))
}

#[cfg(test)]
mod bounds_tests;
#[cfg(test)]
mod tests;
