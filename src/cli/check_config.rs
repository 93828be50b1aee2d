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
    /// Also validate the per-node view of this node id, and read the files
    /// it needs (certificate, key, CA, keyring, HTTPS certificates).
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
    // The files `peerlb node` reads before binding, read the same way: a
    // missing or unreadable one, or a key that does not fit its
    // certificate, exits 64 here too.
    if let Some(c) = &node
        && let Err(code) = super::node::read_files(c)
    {
        return Ok(code);
    }
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
    // What the node's own view adds: its addresses (and where it binds
    // them when that differs), its seeds and the files it read.
    match node {
        Some(c) => {
            let n = &c.node;
            let bound = |advertised: std::net::SocketAddr, bind: std::net::SocketAddr| {
                if bind == advertised {
                    advertised.to_string()
                } else {
                    format!("{advertised} (bound on {bind})")
                }
            };
            println!(
                "node {}: http {}, peer {}, gossip {}, admin {}, sip {}, weight {}; seeds {}; tls {}, {}, {}, keyring {} (read)",
                n.id,
                bound(n.http_addr, c.bind.http),
                bound(n.peer_addr, c.bind.peer),
                bound(n.gossip_addr, c.bind.gossip),
                n.admin_addr,
                n.sip_addr
                    .map_or_else(|| "none".to_owned(), |a| a.to_string()),
                n.weight,
                c.gossip.seeds.join(" "),
                c.tls.ca.display(),
                c.tls.cert.display(),
                c.tls.key.display(),
                c.tls.gossip_keyring.display(),
            );
        }
        None => {
            println!("certificates and keyring not read: `--node ID` reads the ones node ID needs")
        }
    }
    Ok(0)
}
