//! `peerlb-sim`: runs a simulation scenario (simulations/README.md).
//!
//! ```text
//! peerlb-sim simulations/<scenario>.toml [--seed N | --seeds A..B] [--report out.svg] [--trace out.txt]
//! ```
//!
//! Prints the seed, a summary (requests per node, failures, failover and
//! ring convergence times) and, as its last line, the trace hash. Exits 1
//! when an invariant did not hold. Build it with `--cfg tokio_unstable`
//! (the `simulations/peerlb-sim` wrapper does).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use peerlb::sim::harness::{self, Outcome, RunOptions};
use peerlb::sim::scenario::Scenario;

// Process randomness comes from the simulation's seed in this binary only.
peerlb::sim_os_overrides!();

/// Runs a peerlb cluster simulation scenario.
#[derive(Parser)]
#[command(name = "peerlb-sim", version, about)]
struct Args {
    /// The scenario file (simulations/*.toml).
    scenario: PathBuf,
    /// Run with this seed (default: the scenario's first seed).
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Run every seed of the range A..B (B excluded).
    #[arg(long, value_parser = parse_range)]
    seeds: Option<(u64, u64)>,
    /// Write an SVG chart of per-node load with fault markers (single seed).
    #[arg(long)]
    report: Option<PathBuf>,
    /// Write the full event trace (single seed).
    #[arg(long)]
    trace: Option<PathBuf>,
}

fn parse_range(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s.split_once("..").ok_or("want A..B")?;
    let a = a.parse().map_err(|_| "A is not a number")?;
    let b = b.parse().map_err(|_| "B is not a number")?;
    if a >= b {
        return Err("want A < B".into());
    }
    Ok((a, b))
}

fn ms(d: std::time::Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

fn print_summary(o: &Outcome) {
    let f = &o.figures;
    println!(
        "scenario {}: simulated {} in {} wall ({:.0}x)",
        o.scenario,
        ms(o.simulated),
        ms(o.wall),
        o.simulated.as_secs_f64() / o.wall.as_secs_f64().max(1e-9)
    );
    println!(
        "requests: sent {} ok {} failed {} entry-lost {} post-lost {} no-entry {} replayed {}; latency p50 {} p99 {}",
        f.sent,
        f.ok,
        f.failed,
        f.entry_lost,
        f.post_lost,
        f.no_entry,
        f.replayed,
        ms(f.p50),
        ms(f.p99)
    );
    let per: Vec<String> = f.served.iter().map(|(n, c)| format!("{n}={c}")).collect();
    println!("served per node: {}", per.join(" "));
    let lat: Vec<String> = f
        .latency_by_node
        .iter()
        .map(|(n, (a, b))| format!("{n}={}/{}", ms(*a), ms(*b)))
        .collect();
    println!("latency p50/p99 by serving node: {}", lat.join(" "));
    if let Some((over, samples)) = f.inflight_over {
        println!(
            "in flight: the busiest node above the bound in {over} of {samples} samples ({:.1} %)",
            100.0 * over as f64 / samples.max(1) as f64
        );
    }
    for (n, d) in &f.ejections {
        println!(
            "failover: {n} out of every ring {} after its kill",
            d.map_or_else(|| "never".to_owned(), ms)
        );
    }
    for (label, d) in &f.convergence {
        println!(
            "ring convergence after {label}: {}",
            d.map_or_else(|| "not reached (or partitioned)".to_owned(), ms)
        );
    }
    println!(
        "membership skew: {} proxied requests served by a node whose own view named another owner",
        f.disagree
    );
    for (label, frac) in &f.keys_moved {
        println!("keys moved by {label}: {:.1}%", frac * 100.0);
    }
    for (node, weight, frac) in &f.ramp_steps {
        println!(
            "slow start step: {node} at weight {weight}, {:.1}% of the keys moved to it",
            frac * 100.0
        );
    }
    for s in &f.shares {
        println!(
            "share after {}: {} served {:.1}% of {} requests; the new ring gives it {:.1}% of their keys, {:.1}% of all keys (weight share {:.1}%)",
            s.label,
            s.node,
            s.served * 100.0,
            s.requests,
            s.expected * 100.0,
            s.ring_share * 100.0,
            s.weight_share * 100.0
        );
    }
    let st = &f.sticky;
    if st.started > 0 {
        println!(
            "sticky sessions: {} started, {} requests with a route ({} served by it), {} sessions moved off a dead node ({} route rewrites), {} violations in {} sessions",
            st.started,
            st.routed,
            st.stuck,
            st.moved,
            st.rewrites,
            st.violations,
            st.sessions_violated
        );
    }
    for v in &o.violations {
        println!("VIOLATION: {v}");
    }
}

fn main() -> ExitCode {
    match real_main() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("peerlb-sim: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Prints the peer-layer datagrams each node sent per second: while the
/// scenario runs (from 3 s, after the start-up handshakes, to its end) and
/// in the quiet tail after it (from 5 s after its end).
fn print_peer_datagrams(o: &Outcome, scenario: &Scenario) {
    let per_s = &o.figures.peer_datagrams;
    let nodes = o.nodes.len().max(1) as f64;
    // Seconds past the last one counted sent nothing.
    let rate = |from: usize, to: usize| {
        (to > from).then(|| {
            let sent: u64 = per_s.iter().take(to).skip(from).sum();
            (sent as f64 / nodes / (to - from) as f64, from, to)
        })
    };
    let end = scenario.duration_s.ceil() as usize;
    let total: u64 = per_s.iter().sum();
    let show = |r: Option<(f64, usize, usize)>| {
        r.map_or_else(
            || "-".to_owned(),
            |(r, a, b)| format!("{r:.1} per node per second over {a}..{b} s"),
        )
    };
    if std::env::var_os("PEERLB_SIM_DATAGRAMS").is_some() {
        println!("peer datagrams per second: {per_s:?}");
    }
    println!(
        "peer datagrams: {total} sent; running {}; quiet tail {}",
        show(rate(3, end)),
        show(rate(end + 5, o.simulated.as_secs() as usize))
    );
}

fn real_main() -> anyhow::Result<bool> {
    let args = Args::parse();
    let scenario = Scenario::load(&args.scenario)?;
    let seeds: Vec<u64> = match (args.seed, args.seeds) {
        (Some(s), _) => vec![s],
        (None, Some((a, b))) => (a..b).collect(),
        (None, None) => vec![scenario.seeds.first().copied().unwrap_or(1)],
    };
    let single = seeds.len() == 1;
    let opts = RunOptions {
        keep_trace: single && args.trace.is_some(),
        ..RunOptions::default()
    };
    let mut all_ok = true;
    let mut hashes = Vec::new();
    for seed in &seeds {
        println!("seed: {seed}");
        let o = harness::run_isolated(&scenario, *seed, &opts)
            .with_context(|| format!("seed {seed}"))?;
        if single {
            print_summary(&o);
            print_peer_datagrams(&o, &scenario);
        } else {
            println!(
                "seed {seed}: hash {} sent {} failed {} violations {} ({} simulated in {})",
                o.hash,
                o.figures.sent,
                o.figures.failed,
                o.violations.len(),
                ms(o.simulated),
                ms(o.wall)
            );
            for v in &o.violations {
                println!("VIOLATION (seed {seed}): {v}");
            }
        }
        all_ok &= o.violations.is_empty();
        if let (true, Some(p)) = (single, &args.report) {
            std::fs::write(p, peerlb::sim::report::svg(&o))
                .with_context(|| format!("writing {}", p.display()))?;
            println!("report: {}", p.display());
        }
        if let (true, Some(p)) = (single, &args.trace) {
            std::fs::write(p, o.trace.join("\n") + "\n")
                .with_context(|| format!("writing {}", p.display()))?;
            println!("trace: {} ({} lines)", p.display(), o.lines);
        }
        hashes.push(o.hash);
    }
    if single {
        println!("trace-hash: {}", hashes[0]);
    } else {
        let all = xxhash_rust::xxh3::xxh3_64(hashes.join("\n").as_bytes());
        println!("trace-hash: {all:016x} (over {} seeds)", hashes.len());
    }
    Ok(all_ok)
}
