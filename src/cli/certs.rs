//! `peerlb certs`: create the cluster CA and node certificates, keeping
//! files that already exist.

use std::path::PathBuf;

use clap::Args;
use peerlb::tls;

use super::load_cluster;

/// The arguments of `peerlb certs`.
#[derive(Args)]
pub(crate) struct CertsArgs {
    /// cluster.toml to use (default: the embedded local 3-node cluster).
    #[arg(long, env = "PEERLB_CONFIG")]
    config: Option<PathBuf>,
    /// Output directory (default: the config's tls.dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Node ids (default: every node of the config). Repeatable.
    #[arg(long = "node")]
    nodes: Vec<String>,
}

/// Creates what is missing in the output directory and prints each file
/// created; 0 on success, 64 for an invalid configuration.
pub(crate) fn run(a: CertsArgs) -> anyhow::Result<u8> {
    let CertsArgs { config, dir, nodes } = a;
    let (_, c) = match load_cluster(config.as_deref()) {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let dir = dir.unwrap_or(c.tls.dir.clone());
    let ids: Vec<String> = if nodes.is_empty() {
        c.nodes.iter().map(|n| n.id.to_string()).collect()
    } else {
        nodes
    };
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let g = tls::generate(&dir, &c.cluster, &ids)?;
    for p in &g.created {
        println!("created {}", p.display());
    }
    if g.created.is_empty() {
        println!("all certificates already exist in {}", dir.display());
    }
    Ok(0)
}
