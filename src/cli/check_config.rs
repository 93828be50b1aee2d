//! `peerlb check-config`: validate `cluster.toml` (and optionally one
//! node's view of it) and exit: 0 when valid, 64 when not.

use std::path::PathBuf;

use clap::Args;
use peerlb::Overrides;

use super::{config_error, load};

/// The arguments of `peerlb check-config`.
#[derive(Args)]
pub(crate) struct CheckConfigArgs {
    /// cluster.toml to check (default: the embedded one).
    #[arg(long, env = "PEERLB_CONFIG")]
    config: Option<PathBuf>,
    /// Also validate the per-node view of this node id.
    #[arg(long, env = "PEERLB_NODE")]
    node: Option<String>,
}

/// Prints a one-line summary of a valid file; 0, or 64 with the error.
pub(crate) fn run(a: CheckConfigArgs) -> anyhow::Result<u8> {
    let (src, file) = match load(a.config.as_deref()) {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let nodes = match file.check(&src) {
        Ok(n) => n,
        Err(e) => return Ok(config_error(e)),
    };
    let node = match a.node.as_deref() {
        None => None,
        Some(id) => match file.validate(&src, id, &Overrides::default()) {
            Ok(c) => Some(c),
            Err(e) => return Ok(config_error(e)),
        },
    };
    let rules = match &file.rules_file {
        Some(f) => format!("rules from {f}"),
        None => format!("{} rules", file.rules.len()),
    };
    println!(
        "{}: valid: cluster {:?}, {} nodes, policy {}, {rules}",
        src.origin,
        file.name,
        nodes.len(),
        file.policy,
    );
    // What the node's own view adds: its addresses, its seeds and the TLS
    // files it will read (their existence is `peerlb node`'s check).
    if let Some(c) = node {
        let n = &c.node;
        println!(
            "node {}: http {}, peer {}, gossip {}, admin {}, sip {}, weight {}; seeds {}; tls {}, {}, {} (files not read)",
            n.id,
            n.http_addr,
            n.peer_addr,
            n.gossip_addr,
            n.admin_addr,
            n.sip_addr
                .map_or_else(|| "none".to_owned(), |a| a.to_string()),
            n.weight,
            c.gossip.seeds.join(" "),
            c.tls.ca.display(),
            c.tls.cert.display(),
            c.tls.key.display(),
        );
    }
    Ok(0)
}
