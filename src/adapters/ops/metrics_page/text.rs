//! The text encoders of the metrics page: Prometheus text format 0.0.4
//! and OpenMetrics 1.0 ([`Format`]), a [`Snapshot`] written family by
//! family (descriptors, samples, floats and label values escaped as each
//! format says).

use std::fmt::Write as _;

use super::{Format, Kind, PREFIX, Snapshot, Value};

/// `x` as the exposition writes a float: `+Inf`, `-Inf`, `NaN`, or the
/// shortest decimal that reads back as `x` (an integer keeps `.0` in
/// OpenMetrics, whose canonical `le` values have it).
fn float(out: &mut String, x: f64, format: Format) {
    if x.is_nan() {
        out.push_str("NaN");
    } else if x.is_infinite() {
        out.push_str(if x > 0.0 { "+Inf" } else { "-Inf" });
    } else if format == Format::OpenMetrics && x.fract() == 0.0 && x.abs() < 1e15 {
        let _ = write!(out, "{x:.1}");
    } else {
        let _ = write!(out, "{x}");
    }
}

/// `s` escaped as a label value (`\\`, `\"`, `\n`: both formats).
fn label_value(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// `s` escaped as `# HELP` text: `\\` and `\n`, and `\"` in OpenMetrics.
fn help_text(out: &mut String, s: &str, format: Format) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if format == Format::OpenMetrics => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

/// `# HELP` and `# TYPE` of the family named `name` in the exposition.
fn descriptor(out: &mut String, name: &str, help: &str, kind: &str, format: Format) {
    let _ = write!(out, "# HELP {name} ");
    help_text(out, help, format);
    let _ = writeln!(out, "\n# TYPE {name} {kind}");
}

/// One sample line: `name{labels} value`.
fn sample_line(
    out: &mut String,
    name: &str,
    labels: &[(&str, &str)],
    value: Value,
    format: Format,
) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{k}=\"");
            label_value(out, v);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    match value {
        Value::Counter(n) | Value::IntGauge(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Gauge(x) => float(out, x, format),
    }
    out.push('\n');
}

impl Snapshot {
    /// The exposition in `format` (see [`Format`]): histograms first, then
    /// the families in their order, each with its `# HELP` and `# TYPE`
    /// even when it has no sample yet.
    pub(super) fn encode(&self, format: Format) -> String {
        let mut out = String::with_capacity(16 * 1024);
        for (name, help, h) in &self.histograms {
            let name = format!("{PREFIX}{name}");
            descriptor(&mut out, &name, help, "histogram", format);
            let bucket = format!("{name}_bucket");
            let mut cumulative = 0u64;
            let mut le = String::new();
            for (bound, n) in &h.buckets {
                cumulative += n;
                le.clear();
                float(&mut le, *bound, format);
                sample_line(
                    &mut out,
                    &bucket,
                    &[("le", &le)],
                    Value::Counter(cumulative),
                    format,
                );
            }
            sample_line(
                &mut out,
                &format!("{name}_sum"),
                &[],
                Value::Gauge(h.sum),
                format,
            );
            sample_line(
                &mut out,
                &format!("{name}_count"),
                &[],
                Value::Counter(h.count),
                format,
            );
        }
        for f in &self.families {
            let family = format!("{PREFIX}{}", f.name);
            let (sample, kind) = match f.kind {
                Kind::Counter => (format!("{family}_total"), "counter"),
                Kind::Gauge => (family.clone(), "gauge"),
            };
            // 0.0.4 types the sample's name; OpenMetrics the family's.
            let typed = match format {
                Format::Text => &sample,
                Format::OpenMetrics => &family,
            };
            descriptor(&mut out, typed, f.help, kind, format);
            for (values, v) in &f.samples {
                let labels: Vec<(&str, &str)> = f
                    .labels
                    .iter()
                    .copied()
                    .zip(values.iter().map(String::as_str))
                    .collect();
                sample_line(&mut out, &sample, &labels, *v, format);
            }
        }
        if format == Format::OpenMetrics {
            out.push_str("# EOF\n");
        }
        out
    }
}
