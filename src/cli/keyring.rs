//! `peerlb keyring`: gossip key rotation from the command line, through the
//! admin API of each node (its `admin_addr`, loopback by default, so on
//! several machines run it on each with `--node`).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use peerlb::keyring::GossipKey;

/// `peerlb keyring` arguments.
#[derive(Args)]
pub(crate) struct KeyringArgs {
    /// cluster.toml naming the nodes (default: the embedded local cluster).
    #[arg(long, env = "PEERLB_CONFIG")]
    config: Option<PathBuf>,
    /// Nodes to act on (default: every node of the config). Repeatable.
    #[arg(long = "node")]
    nodes: Vec<String>,
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand)]
enum Action {
    /// Print a fresh random key (base64), to install.
    New,
    /// Print each node's key fingerprints, the sending key first.
    List,
    /// Add a key (base64) for opening on each node.
    Install {
        /// The key, as `peerlb keyring new` prints it.
        key: String,
    },
    /// Make the key with this fingerprint the sending key on each node.
    Use {
        /// The key's fingerprint (8 hex digits).
        fingerprint: String,
    },
    /// Remove the key with this fingerprint on each node.
    Remove {
        /// The key's fingerprint (8 hex digits).
        fingerprint: String,
    },
}

/// Runs `peerlb keyring`; the exit status (0 when every node answered 200).
pub(crate) fn run(a: KeyringArgs) -> anyhow::Result<u8> {
    let (path, body) = match &a.action {
        Action::New => {
            println!("{}", GossipKey::generate()?.to_base64());
            return Ok(0);
        }
        Action::List => ("/_peerlb/keyring", None),
        Action::Install { key } => {
            if let Err(e) = GossipKey::parse(key) {
                eprintln!("peerlb keyring: {e}");
                return Ok(peerlb::config::EXIT_CONFIG as u8);
            }
            ("/_peerlb/keyring/install", Some(key.as_str()))
        }
        Action::Use { fingerprint } => ("/_peerlb/keyring/use", Some(fingerprint.as_str())),
        Action::Remove { fingerprint } => ("/_peerlb/keyring/remove", Some(fingerprint.as_str())),
    };
    let (_, c) = match super::load_cluster(a.config.as_deref()) {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let mut code = 0;
    for n in &c.nodes {
        if !a.nodes.is_empty() && !a.nodes.iter().any(|x| **x == *n.id) {
            continue;
        }
        let method = if body.is_some() { "POST" } else { "GET" };
        match super::admin_request(n.admin_addr, method, path, body) {
            Ok((200, text)) => println!("{}: {}", n.id, text.trim()),
            Ok((status, text)) => {
                println!("{}: {status} {}", n.id, text.trim());
                code = 1;
            }
            Err(e) => {
                println!("{}: unreachable at {}: {e}", n.id, n.admin_addr);
                code = 1;
            }
        }
    }
    Ok(code)
}
