//! `peerlb route`: the owner the engine picks for one request, explained
//! (no network; the decision itself is in `peerlb::explain`).

use std::path::PathBuf;

use clap::Args;
use peerlb::config::EXIT_CONFIG;
use peerlb::explain;

use super::load_cluster;

/// The arguments of `peerlb route`.
#[derive(Args)]
pub(crate) struct RouteArgs {
    /// cluster.toml whose policy, rules and nodes to use (default: the embedded one).
    #[arg(long, env = "PEERLB_CONFIG")]
    config: Option<PathBuf>,
    /// The request: "METHOD /target", e.g. "GET /cart?user=alice".
    #[arg(long, required_unless_present = "sip_message")]
    request: Option<String>,
    /// A file holding one SIP request as a client sends it (CRLF line
    /// ends): explain its SIP routing instead of an HTTP request's.
    #[arg(long, conflicts_with_all = ["request", "headers", "cookies", "count"])]
    sip_message: Option<PathBuf>,
    /// A request header "Name: value" (repeatable).
    #[arg(short = 'H', long = "header")]
    headers: Vec<String>,
    /// A request cookie "name=value" (repeatable).
    #[arg(long = "cookie")]
    cookies: Vec<String>,
    /// The client address the entry node sees.
    #[arg(long, default_value = "127.0.0.1:40000")]
    from: std::net::SocketAddr,
    /// The request came over HTTPS (rules' `when = { tls = true }`).
    #[arg(long)]
    tls: bool,
    /// The SNI name of the client's TLS handshake (implies --tls; rules'
    /// `when = { sni = "..." }`).
    #[arg(long)]
    sni: Option<String>,
    /// The members in view: "n1,n2=weight:200/load:40/inflight:3,n3=down";
    /// "metric-delta:D" sets a member's load from D seconds of processing
    /// per second (mod_oc4j: 100 / (1 + ln(1 + D))) and prints the
    /// conversion and the metric shares (default: every node of the
    /// config, serving, with its weight).
    #[arg(long)]
    members: Option<String>,
    /// The entry node (default: the first member).
    #[arg(long)]
    entry: Option<String>,
    /// Override the config's policy, e.g. "weighted-round-robin".
    #[arg(long)]
    policy: Option<String>,
    /// Also print the owners of N such requests in a row.
    #[arg(long, default_value_t = 0)]
    count: usize,
    /// With --count: each pick adds N to its node's load figure (requests
    /// that stay in flight), so least-load and bounded loads move on.
    #[arg(long, default_value_t = 0)]
    load_step: u32,
    /// Seed for random policies.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Prints the explanation (text or JSON); 0, or 64 for a bad argument or
/// configuration.
pub(crate) fn run(a: RouteArgs) -> anyhow::Result<u8> {
    let (_, c) = match load_cluster(a.config.as_deref()) {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let usage = |e: &dyn std::fmt::Display| {
        eprintln!("peerlb route: {e}");
        EXIT_CONFIG as u8
    };
    let policy = match &a.policy {
        Some(p) => match p.parse() {
            Ok(p) => p,
            Err(e) => return Ok(usage(&format!("--policy: {p:?}: {e}"))),
        },
        None => c.routing.policy,
    };
    let (members, metric_deltas) = match &a.members {
        Some(spec) => match explain::parse_members_with_deltas(spec) {
            Ok(m) => m,
            Err(e) => return Ok(usage(&e)),
        },
        None => {
            let members = c
                .nodes
                .iter()
                .map(|n| {
                    let mut m = explain::parse_members(&n.id).expect("validated node id");
                    m[0].weight = n.weight;
                    m.remove(0)
                })
                .collect();
            (members, Default::default())
        }
    };
    let entry = a
        .entry
        .clone()
        .or_else(|| members.first().map(|m| m.id.to_string()))
        .unwrap_or_default();
    let setup = explain::Setup {
        policy,
        rules: c.routing.rules,
        options: c.routing.router,
        ring: c.routing.ring,
        members,
        metric_deltas,
        entry,
        seed: a.seed,
        route_cookie: c.ingress.route_cookie.name.clone(),
        session_route: c.routing.session_route.clone(),
    };
    let from = explain::ClientFacts {
        addr: a.from,
        tls: a.tls,
        sni: a.sni,
    };
    let explained = match (&a.sip_message, &a.request) {
        (Some(file), _) => match std::fs::read(file) {
            Ok(bytes) => explain::explain_sip(setup, &bytes, &from),
            Err(e) => return Ok(usage(&format!("--sip-message: {}: {e}", file.display()))),
        },
        (None, Some(line)) => match explain::parse_request(line, &a.headers, &a.cookies) {
            Ok(req) => explain::explain(setup, &req, &from, a.count, a.load_step),
            Err(e) => Err(e),
        },
        (None, None) => return Ok(usage(&"--request or --sip-message is required")),
    };
    let e = match explained {
        Ok(e) => e,
        Err(e) => return Ok(usage(&e)),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&e)?);
    } else {
        print!("{e}");
    }
    Ok(0)
}
