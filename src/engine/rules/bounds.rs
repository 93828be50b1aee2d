//! What a rule set may cost to read and compile, so that a rules file, which
//! every node reloads at run time, costs an error message and never the node:
//! its size, the nesting of its expressions, and the memory its regexes
//! compile to.
//!
//! Why each bound exists (each was a way to stop a node):
//!
//! - nesting: the XML reader, the compiler and the evaluator recurse once per
//!   level of `<or>` / `<and>` / `<if>` (or `any` / `all` / `if`), so a few
//!   thousand levels overflow the stack and abort the process.
//! - size: a rules file is read into memory and parsed whole; a bound keeps
//!   a wrong path (a log file, a disk image) from being read at all.
//! - regex memory: a regex's compiled form grows with its repetitions times
//!   the size of its classes, and Unicode classes are large: one
//!   `(\w{200})` compiles to about 11 MiB, so 40 of them (a 3 KB file) to
//!   about 450 MiB. Each regex is bounded on its own (the regex crate's
//!   `size_limit`, on its compiled automaton) and all the regexes of a
//!   rule set together (their measured compiled size).
//!
//! The lazy DFA a regex builds while it matches is bounded per regex too
//! (the regex crate's `dfa_size_limit`); it is allocated on first use and
//! not counted in the rule set's total.

use regex::Regex;
use regex_automata::meta;
use regex_automata::util::syntax;

use super::RuleErrorKind;

/// Largest rules file, in bytes (1 MiB): the XML `rules_file` is refused
/// above it, unread. A rule set of thousands of rules stays far below.
pub(crate) const MAX_RULES_FILE_BYTES: usize = 1 << 20;

/// Deepest nesting of rule expressions (an XML rule's elements below
/// `<http-rules>`, or a TOML `key`'s `any` / `all` / `if` levels), and of
/// XML elements in a rules file (64 below its root).
pub(crate) const MAX_RULE_DEPTH: usize = 64;

/// Most attributes one XML element may have (quick-xml checks each
/// attribute's name against the element's earlier ones, so the count is
/// bounded before that check can grow with the square of it).
pub(crate) const MAX_XML_ATTRIBUTES: usize = 32;

/// Largest compiled automaton of one regex, in bytes (2 MiB): the regex
/// crate's `RegexBuilder::size_limit` (its default is 10 MiB), which it
/// checks on each automaton while building it. `(\w{40})` fits (about 2.2
/// MiB compiled in all), `(\w{50})` does not; an ASCII class such as
/// `(?-u:\w)` or `[A-Za-z0-9_]` is some hundred times smaller.
pub(crate) const REGEX_SIZE_LIMIT: usize = 2 << 20;

/// Largest lazy-DFA cache of one regex, in bytes (1 MiB): the regex crate's
/// `RegexBuilder::dfa_size_limit` (its default is 2 MiB). A regex whose
/// cache fills is matched more slowly, never wrongly.
pub(crate) const REGEX_DFA_SIZE_LIMIT: usize = 1 << 20;

/// Largest total compiled size of a rule set's regexes, in bytes (32 MiB),
/// each counted as its measured compiled size plus [`REGEX_OVERHEAD`].
pub(crate) const RULES_REGEX_BUDGET: usize = 32 << 20;

/// What each regex is counted for on top of its compiled automata, in bytes:
/// the matcher's pool and first search state, about 10 KiB measured per
/// small regex (regex 1.13, x86-64).
pub(crate) const REGEX_OVERHEAD: usize = 16 << 10;

/// The regexes of one rule set and what they cost so far.
#[derive(Debug)]
pub(super) struct RegexBudget {
    /// Bytes counted so far (compiled sizes plus [`REGEX_OVERHEAD`] each).
    spent: usize,
    /// Bytes that may be counted in all.
    limit: usize,
}

impl Default for RegexBudget {
    fn default() -> Self {
        RegexBudget {
            spent: 0,
            limit: RULES_REGEX_BUDGET,
        }
    }
}

impl RegexBudget {
    /// Compiles `pattern` (Rust `regex` syntax) with the per-regex bounds,
    /// and counts its compiled size against the rule set's total.
    ///
    /// The size is measured on the same automata the regex crate builds
    /// (regex-automata's meta regex, configured as `RegexBuilder` configures
    /// it), so compiling costs twice; both are bounded by
    /// [`REGEX_SIZE_LIMIT`].
    ///
    /// # Errors
    /// [`RuleErrorKind::InvalidRegex`] for a pattern that does not parse,
    /// [`RuleErrorKind::RegexTooBig`] for one whose automaton exceeds
    /// [`REGEX_SIZE_LIMIT`], [`RuleErrorKind::RegexBudget`] when the rule
    /// set's regexes together exceed [`RULES_REGEX_BUDGET`].
    pub(super) fn compile(&mut self, pattern: &str) -> Result<Regex, RuleErrorKind> {
        let re = regex::RegexBuilder::new(pattern)
            .size_limit(REGEX_SIZE_LIMIT)
            .dfa_size_limit(REGEX_DFA_SIZE_LIMIT)
            .build()
            .map_err(|e| match e {
                regex::Error::CompiledTooBig(limit) => RuleErrorKind::RegexTooBig(limit),
                e => RuleErrorKind::InvalidRegex(e),
            })?;
        // The configuration `regex::RegexBuilder::build` gives its meta
        // regex (regex 1.x, builders.rs `build_one_string`).
        let measured = meta::Builder::new()
            .configure(
                meta::Config::new()
                    .nfa_size_limit(Some(REGEX_SIZE_LIMIT))
                    .hybrid_cache_capacity(REGEX_DFA_SIZE_LIMIT)
                    .match_kind(regex_automata::MatchKind::LeftmostFirst)
                    .utf8_empty(true),
            )
            .syntax(syntax::Config::new().utf8(true))
            .build(pattern)
            .map_or(REGEX_SIZE_LIMIT, |m| m.memory_usage());
        self.spent = self.spent.saturating_add(measured + REGEX_OVERHEAD);
        if self.spent > self.limit {
            return Err(RuleErrorKind::RegexBudget(self.limit));
        }
        Ok(re)
    }

    /// Bytes counted so far.
    #[cfg(test)]
    pub(super) fn spent(&self) -> usize {
        self.spent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_regex_costs_its_measured_size() {
        let mut b = RegexBudget::default();
        b.compile("^/users/([^/]+)").unwrap();
        let one = b.spent();
        // Its automata are a few KiB (about 7 KiB measured) on top of the
        // fixed overhead.
        assert!(
            (REGEX_OVERHEAD + 1_000..REGEX_OVERHEAD + 64_000).contains(&one),
            "{one}"
        );
        b.compile("^/users/([^/]+)").unwrap();
        assert_eq!(b.spent(), 2 * one);
    }

    #[test]
    fn a_regex_over_its_own_limit_is_refused_before_it_is_built() {
        let mut b = RegexBudget::default();
        match b.compile(r"(\w{200})") {
            Err(RuleErrorKind::RegexTooBig(limit)) => assert_eq!(limit, REGEX_SIZE_LIMIT),
            other => panic!("{other:?}"),
        }
        assert_eq!(b.spent(), 0);
        // The ASCII class of the same length is small.
        b.compile(r"((?-u:\w){200})").unwrap();
    }

    #[test]
    fn regexes_together_over_the_budget_are_refused() {
        // A smaller budget than a rule set's, to keep the test quick (the
        // real one is tested on an XML file in `xml/bounds_tests.rs`).
        let mut b = RegexBudget {
            spent: 0,
            limit: 4 << 20,
        };
        // Each about 0.6 MiB compiled: the seventh passes 4 MiB.
        let mut n = 0;
        let err = loop {
            match b.compile(r"(\w{10})") {
                Ok(_) => n += 1,
                Err(e) => break e,
            }
        };
        assert!(matches!(err, RuleErrorKind::RegexBudget(l) if l == 4 << 20));
        assert!((5..=9).contains(&n), "{n} regexes fit");
        assert!(b.spent() > 4 << 20);
    }

    #[test]
    fn syntax_errors_stay_regex_errors() {
        let mut b = RegexBudget::default();
        assert!(matches!(
            b.compile("(unclosed"),
            Err(RuleErrorKind::InvalidRegex(_))
        ));
    }
}
