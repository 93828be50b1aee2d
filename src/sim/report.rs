//! `--report out.svg`: requests served per node over virtual time, with a
//! marker per fault, so a reader sees the failover.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use super::harness::Outcome;

const W: f64 = 960.0;
const H: f64 = 420.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 120.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLORS: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// An SVG chart of `o`: one line per node (requests its app served per
/// bucket of virtual time, as requests per second), a dashed vertical line
/// per fault.
pub fn svg(o: &Outcome) -> String {
    let end = o.simulated.max(Duration::from_millis(1));
    let bucket = Duration::from_millis(((end.as_millis() as u64) / 120).max(100));
    let buckets = (end.as_millis() / bucket.as_millis()) as usize + 1;
    let mut series: BTreeMap<&str, Vec<u64>> = o
        .nodes
        .iter()
        .map(|n| (n.as_str(), vec![0; buckets]))
        .collect();
    for (at, node) in &o.serves {
        let i = (at.as_millis() / bucket.as_millis()) as usize;
        if let Some(v) = series.get_mut(node.as_str()) {
            v[i.min(buckets - 1)] += 1;
        }
    }
    let per_s = 1.0 / bucket.as_secs_f64();
    let max = series
        .values()
        .flat_map(|v| v.iter())
        .copied()
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * per_s;
    let x = |t: f64| LEFT + (W - LEFT - RIGHT) * t / end.as_secs_f64();
    let y = |v: f64| TOP + (H - TOP - BOTTOM) * (1.0 - v / max);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(
        s,
        r#"<rect width="{W}" height="{H}" fill="white"/><text x="{LEFT}" y="20" font-size="14">{} seed {} — requests served per node (req/s), faults dashed</text>"#,
        esc(&o.scenario),
        o.seed
    );
    // Axes and ticks.
    let _ = write!(
        s,
        r#"<line x1="{LEFT}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{}" stroke="black"/>"#,
        H - BOTTOM,
        W - RIGHT,
        H - BOTTOM,
        H - BOTTOM
    );
    let secs = end.as_secs_f64();
    let step = [1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0]
        .into_iter()
        .find(|s| secs / s <= 12.0)
        .unwrap_or(60.0);
    let mut t = 0.0;
    while t <= secs {
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{t}s</text>"#,
            x(t),
            H - BOTTOM + 16.0
        );
        t += step;
    }
    for i in 0..=4 {
        let v = max * f64::from(i) / 4.0;
        let _ = write!(
            s,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{v:.0}</text>"#,
            LEFT - 6.0,
            y(v) + 4.0
        );
    }
    for (i, (node, v)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<String> = v
            .iter()
            .enumerate()
            .map(|(b, c)| {
                let t = (b as f64 + 0.5) * bucket.as_secs_f64();
                format!("{:.1},{:.1}", x(t.min(secs)), y(*c as f64 * per_s))
            })
            .collect();
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/><text x="{}" y="{}" fill="{color}">{}</text>"#,
            points.join(" "),
            W - RIGHT + 10.0,
            TOP + 16.0 * i as f64,
            esc(node)
        );
    }
    for (i, f) in o.faults.iter().enumerate() {
        let fx = x(f.at.as_secs_f64());
        let _ = write!(
            s,
            r##"<line x1="{fx:.1}" y1="{TOP}" x2="{fx:.1}" y2="{}" stroke="#444" stroke-dasharray="4,3"/><text x="{:.1}" y="{}" fill="#444">{}</text>"##,
            H - BOTTOM,
            fx + 3.0,
            TOP + 12.0 + 14.0 * (i % 4) as f64,
            esc(&f.label)
        );
    }
    s.push_str("</svg>\n");
    s
}
