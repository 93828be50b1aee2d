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
//! - the lazy DFA's cache: a regex builds its lazy DFA while it matches,
//!   so a request can make it grow after the file was accepted (1,000 rules
//!   whose DFAs explode, plus one 8 KB request, took a node from 40 MB to
//!   1.18 GB). Each regex's cache is capped (the regex crate's
//!   `dfa_size_limit`), and the caps are counted in the rule set's budget:
//!   a file whose regexes do not fit at the largest cap
//!   ([`REGEX_DFA_SIZE_LIMIT`]) is compiled again with the budget's share
//!   per regex ([`fit`]), and one that does not fit even at the smallest
//!   ([`MIN_REGEX_DFA_SIZE`]) is refused, naming the rule. A regex whose
//!   cache fills is matched more slowly (the regex crate clears the cache,
//!   and gives the lazy DFA up for its slower engines), never wrongly.
//!
//! Not counted: the bounded backtracker's visited set, which the regex
//! crate caps at 256 KiB per regex and fills only over a match's span.

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
/// `RegexBuilder::dfa_size_limit` (its default is 2 MiB), given to every
/// regex of a rule set whose budget allows it.
pub(crate) const REGEX_DFA_SIZE_LIMIT: usize = 1 << 20;

/// Smallest lazy-DFA cache a regex is given, in bytes (8 KiB): a rule set
/// whose regexes do not fit the budget with this much each is refused.
pub(crate) const MIN_REGEX_DFA_SIZE: usize = 8 << 10;

/// Lazy DFAs one regex may hold a cache for: the forward and the reverse
/// one, and a third for the regex crate's reverse-suffix and reverse-inner
/// strategies.
pub(crate) const LAZY_DFAS_PER_REGEX: usize = 3;

/// Most memory a rule set's regexes may hold in all, in bytes (64 MiB):
/// each regex counted as its measured compiled size, its matcher's first
/// cache (measured) plus [`REGEX_OVERHEAD`], and [`LAZY_DFAS_PER_REGEX`]
/// lazy-DFA caches at their cap. Every node matches on one thread, so each
/// regex has one cache.
pub(crate) const RULES_REGEX_BUDGET: usize = 64 << 20;

/// What each regex is counted for on top of its compiled automata and its
/// first cache, in bytes: the matcher's pool and its boxes.
pub(crate) const REGEX_OVERHEAD: usize = 4 << 10;

/// The regexes of one rule set and what they cost so far.
#[derive(Debug)]
pub(super) struct RegexBudget {
    /// Bytes counted so far, the lazy-DFA caches left out (compiled sizes,
    /// first caches and [`REGEX_OVERHEAD`]).
    spent: usize,
    /// Bytes that may be counted in all.
    limit: usize,
    /// The lazy-DFA cache cap each regex is built with.
    dfa_limit: usize,
    /// Regexes compiled so far.
    regexes: usize,
}

impl Default for RegexBudget {
    fn default() -> Self {
        RegexBudget::with_dfa_limit(REGEX_DFA_SIZE_LIMIT)
    }
}

/// Compiles a rule set with `compile`, which compiles every regex through
/// the [`RegexBudget`] it is given: first with [`REGEX_DFA_SIZE_LIMIT`] per
/// regex, then, when the lazy-DFA caches at that cap would pass
/// [`RULES_REGEX_BUDGET`], once more with every regex's cache capped at an
/// equal share of what is left (at least [`MIN_REGEX_DFA_SIZE`], which the
/// first pass checks). Deterministic: one file always gets one cap.
///
/// # Errors
/// The first error of `compile` (a regex over the budget is
/// [`RuleErrorKind::RegexBudget`], named by the caller).
pub(super) fn fit<T, E>(mut compile: impl FnMut(&mut RegexBudget) -> Result<T, E>) -> Result<T, E> {
    let mut first = RegexBudget::default();
    let out = compile(&mut first)?;
    if first.total() <= first.limit {
        return Ok(out);
    }
    let mut second = RegexBudget::with_dfa_limit(first.dfa_share());
    compile(&mut second)
}

impl RegexBudget {
    fn with_dfa_limit(dfa_limit: usize) -> RegexBudget {
        RegexBudget {
            spent: 0,
            limit: RULES_REGEX_BUDGET,
            dfa_limit,
            regexes: 0,
        }
    }

    /// Compiles `pattern` (Rust `regex` syntax) with the per-regex bounds,
    /// and counts its compiled size and first cache against the rule set's
    /// budget, with room for [`MIN_REGEX_DFA_SIZE`] of lazy-DFA cache for
    /// it and every regex before it.
    ///
    /// The sizes are measured on the same automata the regex crate builds
    /// (regex-automata's meta regex, configured as `RegexBuilder` configures
    /// it), so compiling costs twice; both are bounded by
    /// [`REGEX_SIZE_LIMIT`].
    ///
    /// # Errors
    /// [`RuleErrorKind::InvalidRegex`] for a pattern that does not parse,
    /// [`RuleErrorKind::RegexTooBig`] for one whose automaton exceeds
    /// [`REGEX_SIZE_LIMIT`], [`RuleErrorKind::RegexBudget`] when the rule
    /// set's regexes together do not fit [`RULES_REGEX_BUDGET`].
    pub(super) fn compile(&mut self, pattern: &str) -> Result<Regex, RuleErrorKind> {
        let re = regex::RegexBuilder::new(pattern)
            .size_limit(REGEX_SIZE_LIMIT)
            .dfa_size_limit(self.dfa_limit)
            .build()
            .map_err(|e| match e {
                regex::Error::CompiledTooBig(limit) => RuleErrorKind::RegexTooBig(limit),
                e => RuleErrorKind::InvalidRegex(e),
            })?;
        let measured = measure(pattern, self.dfa_limit).unwrap_or(REGEX_SIZE_LIMIT);
        self.spent = self.spent.saturating_add(measured + REGEX_OVERHEAD);
        self.regexes += 1;
        let least = self
            .spent
            .saturating_add(self.regexes * LAZY_DFAS_PER_REGEX * MIN_REGEX_DFA_SIZE);
        if least > self.limit {
            return Err(RuleErrorKind::RegexBudget(self.limit));
        }
        Ok(re)
    }

    /// Everything counted, the lazy-DFA caches at their cap included.
    fn total(&self) -> usize {
        self.spent.saturating_add(
            self.regexes
                .saturating_mul(LAZY_DFAS_PER_REGEX)
                .saturating_mul(self.dfa_limit),
        )
    }

    /// The lazy-DFA cap that fits every regex counted so far: an equal share
    /// of what the rest leaves (less 1 % against a measure that differs
    /// between two compilations), between [`MIN_REGEX_DFA_SIZE`] and
    /// [`REGEX_DFA_SIZE_LIMIT`].
    fn dfa_share(&self) -> usize {
        let left = self.limit.saturating_sub(self.spent) / 100 * 99;
        (left / (self.regexes.max(1) * LAZY_DFAS_PER_REGEX))
            .clamp(MIN_REGEX_DFA_SIZE, REGEX_DFA_SIZE_LIMIT)
    }

    /// Bytes counted so far, the lazy-DFA caches left out.
    #[cfg(test)]
    pub(super) fn spent(&self) -> usize {
        self.spent
    }
}

/// The meta regex `regex::RegexBuilder::build` makes for `pattern` with a
/// lazy-DFA cap of `dfa_limit` (regex 1.x, builders.rs `build_one_string`).
fn meta_regex(pattern: &str, dfa_limit: usize) -> Option<meta::Regex> {
    meta::Builder::new()
        .configure(
            meta::Config::new()
                .nfa_size_limit(Some(REGEX_SIZE_LIMIT))
                .hybrid_cache_capacity(dfa_limit)
                .match_kind(regex_automata::MatchKind::LeftmostFirst)
                .utf8_empty(true),
        )
        .syntax(syntax::Config::new().utf8(true))
        .build(pattern)
        .ok()
}

/// The compiled size of `pattern` and of its first cache, in bytes.
fn measure(pattern: &str, dfa_limit: usize) -> Option<usize> {
    let m = meta_regex(pattern, dfa_limit)?;
    Some(m.memory_usage() + m.create_cache().memory_usage())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_regex_costs_its_measured_size() {
        let mut b = RegexBudget::default();
        b.compile("^/users/([^/]+)").unwrap();
        let one = b.spent();
        // Its automata and first cache are a few KiB on top of the fixed
        // overhead.
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
            limit: 4 << 20,
            ..RegexBudget::default()
        };
        // Each about 0.6 MiB compiled plus its first cache (the PikeVM's
        // state sets, about as large): the fifth passes 4 MiB.
        let mut n = 0;
        let err = loop {
            match b.compile(r"(\w{10})") {
                Ok(_) => n += 1,
                Err(e) => break e,
            }
        };
        assert!(matches!(err, RuleErrorKind::RegexBudget(l) if l == 4 << 20));
        assert!((3..=9).contains(&n), "{n} regexes fit");
        assert!(b.spent() > 4 << 20);
    }

    /// A pattern whose lazy DFA explodes on a haystack of 0s and 1s
    /// (the regex crate's own example: the DFA needs 2^k states).
    fn exploding(i: usize) -> String {
        format!("^/r{i}/[01]*1[01]{{{}}}(x)", 10 + i % 8)
    }

    /// 8 KiB of pseudo-random 0s and 1s after `/r<i>/`.
    fn haystack(i: usize) -> String {
        let mut x = 0x9e37_79b9_7f4a_7c15_u64 ^ i as u64;
        let bits: String = (0..8192)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if x & 1 == 1 { '1' } else { '0' }
            })
            .collect();
        format!("/r{i}/{bits}")
    }

    /// The memory the regexes hold after every one matched its haystack
    /// with a lazy-DFA cap of `dfa_limit`: compiled sizes, caches, overhead.
    fn held_after_matching(n: usize, dfa_limit: usize) -> usize {
        (0..n)
            .map(|i| {
                let m = meta_regex(&exploding(i), dfa_limit).unwrap();
                let mut cache = m.create_cache();
                let h = haystack(i);
                // Twice: a cache cleared once may grow again.
                for _ in 0..2 {
                    let _ = m.search_with(&mut cache, &regex_automata::Input::new(&h));
                }
                m.memory_usage() + cache.memory_usage() + REGEX_OVERHEAD
            })
            .sum()
    }

    #[test]
    fn a_big_rule_set_gets_a_share_of_the_budget_and_its_lazy_dfas_stay_within_it() {
        // 300 regexes whose lazy DFAs explode: at the largest cap they
        // would be counted for about 900 MiB, so each gets a share.
        let n = 300;
        let mut caps = Vec::new();
        let regexes = fit(|b| {
            caps.push(b.dfa_limit);
            (0..n)
                .map(|i| b.compile(&exploding(i)))
                .collect::<Result<Vec<_>, _>>()
        })
        .unwrap();
        assert_eq!(regexes.len(), n);
        assert_eq!(caps.len(), 2, "{caps:?}");
        let share = caps[1];
        assert!(
            (MIN_REGEX_DFA_SIZE..REGEX_DFA_SIZE_LIMIT).contains(&share),
            "{share}"
        );
        // The regexes match as they would at any cap.
        for (i, re) in regexes.iter().enumerate().take(20) {
            let h = haystack(i);
            let want = meta_regex(&exploding(i), REGEX_DFA_SIZE_LIMIT)
                .unwrap()
                .is_match(h.as_str());
            assert_eq!(re.is_match(&h), want, "{i}");
        }
        // What they hold after matching their worst haystacks, measured
        // on the same engine: within the budget at the share, and past it
        // at the largest cap (the way 1,000 rules reached 1.18 GB).
        let held = held_after_matching(n, share);
        let uncapped = held_after_matching(n, REGEX_DFA_SIZE_LIMIT);
        assert!(held <= RULES_REGEX_BUDGET, "{held} bytes held");
        assert!(uncapped > held, "{uncapped} <= {held}");
        eprintln!(
            "{n} exploding regexes: {:.1} MiB held at a {share}-byte cap, {:.1} MiB at {REGEX_DFA_SIZE_LIMIT} (budget {} MiB)",
            held as f64 / f64::from(1 << 20),
            uncapped as f64 / f64::from(1 << 20),
            RULES_REGEX_BUDGET >> 20
        );
    }

    #[test]
    fn a_rule_set_that_cannot_fit_at_the_smallest_cache_is_refused() {
        // Each regex needs at least 3 x 8 KiB of cache plus its automata:
        // a few thousand small ones pass 64 MiB.
        let err = fit(|b| {
            (0..5_000)
                .map(|i| b.compile(&format!("^/t{i}/(?-u:[a-z]+)")))
                .collect::<Result<Vec<_>, _>>()
        })
        .unwrap_err();
        assert!(matches!(
            err,
            RuleErrorKind::RegexBudget(RULES_REGEX_BUDGET)
        ));
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
