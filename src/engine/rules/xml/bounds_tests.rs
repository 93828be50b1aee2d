//! A rules file costs an error, never the node: deep nesting, regexes that
//! compile to hundreds of MiB, oversized files and elements, and parse time
//! that grows with the square of the file's size.

use super::super::bounds::{MAX_RULE_DEPTH, MAX_RULES_FILE_BYTES, REGEX_SIZE_LIMIT};
use super::super::{RuleErrorKind, Rules};
use super::Lines;

fn http_rules(body: &str) -> String {
    format!("<user-centric-rules>\n<http-rules>\n{body}</http-rules>\n</user-centric-rules>\n")
}

/// `n` nested `<or>` around one header test.
fn nested_or(n: usize) -> String {
    http_rules(&format!(
        "{}<header name=\"x-user\"><exist/></header>{}\n",
        "<or>".repeat(n),
        "</or>".repeat(n)
    ))
}

#[test]
fn thousands_of_nested_ors_are_an_error_not_a_stack_overflow() {
    // 5,200 levels overflowed the stack (check-config aborted, a reload
    // killed the node); the test thread's stack is smaller still.
    let e = Rules::from_xml(&nested_or(5_200)).unwrap_err();
    assert!(
        matches!(e.kind, RuleErrorKind::TooDeep(MAX_RULE_DEPTH)),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        format!("<or> at line 3: nested deeper than {MAX_RULE_DEPTH} levels")
    );
}

#[test]
fn nesting_up_to_the_bound_is_kept() {
    // Root and <http-rules> are two levels; the header test and its <exist/>
    // two more.
    let deepest = MAX_RULE_DEPTH - 3;
    let r = Rules::from_xml(&nested_or(deepest)).unwrap();
    assert_eq!(r.len(), 1);
    let e = Rules::from_xml(&nested_or(deepest + 1)).unwrap_err();
    assert!(matches!(e.kind, RuleErrorKind::TooDeep(_)), "{e}");
}

#[test]
fn forty_huge_regexes_are_refused_by_the_per_regex_limit() {
    // A 3 KB file that compiled to about 490 MB.
    let rule = "<request-uri><match>(\\w{200})</match></request-uri>\n";
    let text = http_rules(&rule.repeat(40));
    assert!(text.len() < 3_000);
    let e = Rules::from_xml(&text).unwrap_err();
    assert!(
        matches!(e.kind, RuleErrorKind::RegexTooBig(REGEX_SIZE_LIMIT)),
        "{e}"
    );
    assert!(
        e.to_string()
            .starts_with("<match> at line 3: regex too big"),
        "{e}"
    );
}

#[test]
fn regexes_under_their_own_limit_are_refused_together_past_the_budget() {
    // Each about 2.2 MiB compiled: some thirty pass the 64 MiB of a rule
    // set; the error names the rule that did not fit.
    let rule = "<request-uri><match>(\\w{40})</match></request-uri>\n";
    let e = Rules::from_xml(&http_rules(&rule.repeat(40))).unwrap_err();
    assert!(matches!(e.kind, RuleErrorKind::RegexBudget(_)), "{e}");
    let text = e.to_string();
    assert!(
        text.starts_with("<match> at line ") && text.contains("matching caches"),
        "{text}"
    );
    // Three are fine.
    assert_eq!(
        Rules::from_xml(&http_rules(&rule.repeat(3))).unwrap().len(),
        3
    );
}

#[test]
fn a_file_over_the_size_bound_is_refused_before_it_is_parsed() {
    let mut text = http_rules("<header name=\"x\"><exist/></header>\n");
    text.push_str(&" ".repeat(MAX_RULES_FILE_BYTES));
    let e = Rules::from_xml(&text).unwrap_err();
    assert!(
        matches!(e.kind, RuleErrorKind::TooLarge(MAX_RULES_FILE_BYTES)),
        "{e}"
    );
}

#[test]
fn an_element_with_too_many_attributes_is_refused() {
    let attrs: String = (0..10_000).map(|i| format!(" a{i}=\"\"")).collect();
    let e =
        Rules::from_xml(&http_rules(&format!("<header{attrs}><exist/></header>\n"))).unwrap_err();
    assert_eq!(e.to_string(), "<header> at line 3: more than 32 attributes");
}

#[test]
fn line_numbers_scan_each_byte_once() {
    let text = "a\nbb\n\nccc\nd".repeat(1_000);
    let mut lines = Lines::new(&text);
    let mut want = 1;
    for (pos, b) in text.bytes().enumerate() {
        assert_eq!(lines.at(pos), want, "offset {pos}");
        if b == b'\n' {
            want += 1;
        }
    }
    assert_eq!(lines.at(text.len()), want);
    // One pass over the text in all: the old count from the start for
    // every offset scanned about len^2 / 2 bytes.
    assert_eq!(lines.scanned, text.len());
    // An earlier offset recounts from the start, and is still right.
    assert_eq!(lines.at(2), 2);
    assert_eq!(lines.scanned, text.len() + 2);
}

#[test]
fn a_600_kb_file_parses_with_its_line_numbers() {
    // About 10,000 rules; the old parser recounted lines from the start for
    // every element (about 28 s for such a file on a loaded node).
    let rule = "<or>\n  <header name=\"x-user\" return=\"request.x-user\"><exist/></header>\n  <cookie name=\"session\"><exist/></cookie>\n</or>\n";
    let n = 600_000 / rule.len();
    let text = http_rules(&rule.repeat(n));
    assert!(text.len() >= 590_000, "{}", text.len());
    let r = Rules::from_xml(&text).unwrap();
    assert_eq!(r.len(), n);
    // Rule i starts on line 3 + 4 i.
    assert_eq!(
        r.name(n - 1),
        Some(format!("<or> at line {}", 3 + 4 * (n - 1)).as_str())
    );
}
