use super::*;
use crate::adapters::metrics::AtomicHistogram;

/// A snapshot with one of each shape: a histogram, a counter, a labelled
/// counter family with no sample yet, a real gauge, an integer gauge past
/// 2^53 and the build info.
fn snapshot() -> Snapshot {
    let h = AtomicHistogram::default();
    h.observe(std::time::Duration::from_millis(1));
    Snapshot {
        histograms: [
            ("request_duration_seconds", "Requests", h.snapshot()),
            (
                "hop_duration_seconds",
                "Hops",
                AtomicHistogram::default().snapshot(),
            ),
        ],
        families: vec![
            build_info(),
            Family::one(
                "requests",
                "Client \"requests\"\\ received",
                Value::Counter(7),
            ),
            Family::labelled(
                "responses",
                "By code",
                Kind::Counter,
                &["code"],
                std::iter::empty(),
            ),
            Family::labelled(
                "peers",
                "Peers",
                Kind::Gauge,
                &["state"],
                [("a\"b\\c\nd".to_owned(), Value::Gauge(0.25))],
            ),
            Family::one("view_version", "View", Value::IntGauge(u64::MAX - 1)),
            Family::one("inf", "Inf", Value::Gauge(f64::INFINITY)),
        ],
    }
}

#[test]
fn text_format_types_the_sample_and_has_no_eof() {
    let t = snapshot().encode(Format::Text);
    assert!(!t.contains("# EOF"), "{t}");
    assert!(
        t.contains("# TYPE peerlb_requests_total counter\npeerlb_requests_total 7\n"),
        "{t}"
    );
    // A labelled counter family with no sample is still a counter.
    assert!(t.contains("# TYPE peerlb_responses_total counter\n"), "{t}");
    assert!(
        !t.lines().any(|l| l.starts_with("peerlb_responses_total")),
        "{t}"
    );
    assert!(
        t.contains("# TYPE peerlb_peers gauge\npeerlb_peers{state=\"a\\\"b\\\\c\\nd\"} 0.25\n"),
        "{t}"
    );
    // Exact, not a float rounded to 53 bits.
    assert!(
        t.contains("peerlb_view_version 18446744073709551614\n"),
        "{t}"
    );
    assert!(t.contains("peerlb_inf +Inf\n"), "{t}");
    // 0.0.4 help escapes only backslash and newline.
    assert!(
        t.contains("# HELP peerlb_requests_total Client \"requests\"\\\\ received\n"),
        "{t}"
    );
    assert!(t.contains(&format!(
        "peerlb_build_info{{version=\"{}\",commit=\"",
        env!("CARGO_PKG_VERSION")
    )));
    // Histogram buckets are cumulative and end with +Inf = count.
    assert!(
        t.contains("# TYPE peerlb_request_duration_seconds histogram\n"),
        "{t}"
    );
    assert!(
        t.contains("peerlb_request_duration_seconds_bucket{le=\"0.0005\"} 0\n"),
        "{t}"
    );
    assert!(
        t.contains("peerlb_request_duration_seconds_bucket{le=\"0.001\"} 1\n"),
        "{t}"
    );
    assert!(
        t.contains("peerlb_request_duration_seconds_bucket{le=\"16.384\"} 1\n"),
        "{t}"
    );
    assert!(
        t.contains("peerlb_request_duration_seconds_bucket{le=\"+Inf\"} 1\n"),
        "{t}"
    );
    assert!(
        t.contains("peerlb_request_duration_seconds_count 1\n"),
        "{t}"
    );
    assert!(
        t.contains("peerlb_request_duration_seconds_sum 0.001\n"),
        "{t}"
    );
    // Every sample line follows the `# TYPE` of its family in 0.0.4's
    // sense: the sample's name, or the histogram's base name.
    let mut typed = "";
    for l in t.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            typed = rest.split(' ').next().unwrap();
        } else if !l.starts_with('#') {
            let name = l.split(['{', ' ']).next().unwrap();
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            assert!(name == typed || base == typed, "{l} under {typed}");
        }
    }
}

#[test]
fn openmetrics_types_the_family_and_ends_with_eof() {
    let t = snapshot().encode(Format::OpenMetrics);
    assert!(t.ends_with("\n# EOF\n"), "{t}");
    assert!(
        t.contains("# TYPE peerlb_requests counter\npeerlb_requests_total 7\n"),
        "{t}"
    );
    assert!(t.contains("# TYPE peerlb_responses counter\n"), "{t}");
    assert!(
        t.contains("# HELP peerlb_requests Client \\\"requests\\\"\\\\ received\n"),
        "{t}"
    );
    assert!(
        t.contains("peerlb_request_duration_seconds_bucket{le=\"+Inf\"} 1\n"),
        "{t}"
    );
    assert!(
        t.contains("peerlb_view_version 18446744073709551614\n"),
        "{t}"
    );
    assert_eq!(t.matches("# EOF").count(), 1);
}

#[test]
fn openmetrics_only_when_the_scraper_asks() {
    let h = |v: &'static str| {
        let mut m = HeaderMap::new();
        m.insert(header::ACCEPT, HeaderValue::from_static(v));
        m
    };
    assert_eq!(Format::negotiate(&HeaderMap::new()), Format::Text);
    assert_eq!(Format::negotiate(&h("text/plain")), Format::Text);
    assert_eq!(Format::negotiate(&h("*/*")), Format::Text);
    // What Prometheus 2.42 sends.
    assert_eq!(
        Format::negotiate(&h(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        )),
        Format::OpenMetrics
    );
    assert_eq!(
        Format::negotiate(&h("text/plain, application/openmetrics-text; q=0")),
        Format::Text
    );
    assert_eq!(
        Format::OpenMetrics.content_type(),
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert_eq!(
        Format::Text.content_type(),
        "text/plain; version=0.0.4; charset=utf-8"
    );
}
