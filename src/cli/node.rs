//! `peerlb node`: run one node of the cluster until SIGTERM or SIGINT.

use std::path::PathBuf;

use clap::Args;
use peerlb::{Env, Node, Overrides, tls};

use super::{config_error, load, runtime, shutdown_signal};

/// The arguments of `peerlb node`.
#[derive(Args)]
pub(crate) struct NodeArgs {
    /// cluster.toml to use (default: the embedded local 3-node cluster).
    #[arg(long, env = "PEERLB_CONFIG")]
    config: Option<PathBuf>,
    /// This node's id.
    #[arg(long, env = "PEERLB_NODE")]
    node: String,
    /// Override this node's client HTTP address.
    #[arg(long, env = "PEERLB_HTTP_ADDR")]
    http_addr: Option<String>,
    /// Override this node's peer QUIC address.
    #[arg(long, env = "PEERLB_PEER_ADDR")]
    peer_addr: Option<String>,
    /// Override this node's gossip address.
    #[arg(long, env = "PEERLB_GOSSIP_ADDR")]
    gossip_addr: Option<String>,
    /// Override this node's admin API address (default 127.0.0.1 with the
    /// client port + 1000).
    #[arg(long, env = "PEERLB_ADMIN_ADDR")]
    admin_addr: Option<String>,
    /// Override this node's weight (100 = one share).
    #[arg(long, env = "PEERLB_WEIGHT")]
    weight: Option<u32>,
    /// Override the app ("builtin" or an http:// URL).
    #[arg(long, env = "PEERLB_APP")]
    app: Option<String>,
    /// Also accept clients on this address, shared with SO_REUSEPORT.
    #[arg(long, env = "PEERLB_SHARED_LISTEN")]
    shared_listen: Option<String>,
}

/// Validates the node's configuration and TLS files (exit 64 when they are
/// wrong, before any socket is bound), then runs the node; 0 once it has
/// left the cluster.
pub(crate) fn run(a: NodeArgs) -> anyhow::Result<u8> {
    let (src, file) = match load(a.config.as_deref()) {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let ov = Overrides {
        http_addr: a.http_addr,
        peer_addr: a.peer_addr,
        gossip_addr: a.gossip_addr,
        admin_addr: a.admin_addr,
        weight: a.weight,
        app: a.app,
        shared_listen: a.shared_listen,
    };
    let config = match file.validate(&src, &a.node, &ov) {
        Ok(c) => c,
        Err(e) => return Ok(config_error(e)),
    };
    // TLS files are configuration too: check them before binding anything.
    if let Err(e) = tls::TlsMaterial::load(&config.tls.ca, &config.tls.cert, &config.tls.key) {
        return Ok(config_error(format!(
            "tls: {e} (create the certificates with `peerlb certs`)"
        )));
    }
    let keyring = match peerlb::keyring::Keyring::load(&config.tls.gossip_keyring) {
        Ok(k) => k,
        Err(e) => return Ok(config_error(format!("tls.gossip_keyring: {e}"))),
    };
    let rt = runtime()?;
    rt.block_on(async move {
        let env = Env::bind(&config, keyring)?;
        let node = Node::build(config, env)?;
        node.run(shutdown_signal()).await?;
        anyhow::Ok(0)
    })
}
