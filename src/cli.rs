//! What the commands share: loading and validating `cluster.toml` (an
//! invalid file is printed with its field path and exits 64), the runtime,
//! the shutdown signal and the log subscriber.
//!
//! A command returns `Ok(exit status)`; `Err` is an operational failure
//! (printed by `main`, exit status 1).

use std::path::Path;

use anyhow::Context;
use peerlb::config::{EXIT_CONFIG, NodeConfig};
use peerlb::{ClusterFile, Overrides, Source};

pub(crate) mod app;
pub(crate) mod certs;
pub(crate) mod check_config;
pub(crate) mod keyring;
pub(crate) mod log_limit;
pub(crate) mod memory;
pub(crate) mod node;
pub(crate) mod route;
pub(crate) mod up;

/// Logs to stderr, filtered by `RUST_LOG` (default: info, quiet
/// dependencies), coloured on a terminal; chitchat's repeated warnings
/// rate limited (`log_limit`).
pub(crate) fn init_tracing() {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,chitchat=warn,quinn=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .finish()
        .with(log_limit::RateLimit::default())
        .init();
}

/// A configuration error: printed with its field path, exit status 64.
pub(crate) fn config_error(e: impl std::fmt::Display) -> u8 {
    eprintln!("peerlb: invalid configuration: {e}");
    EXIT_CONFIG as u8
}

/// Reads and parses `config` (default: the embedded `cluster.toml`);
/// `Err` is the exit status, the error already printed.
pub(crate) fn load(config: Option<&Path>) -> Result<(Source, ClusterFile), u8> {
    let src = Source::load(config).map_err(config_error)?;
    let file = src.parse().map_err(config_error)?;
    Ok((src, file))
}

/// The per-node config of the first node: the cluster-wide values (TLS
/// directory, node list) `up`, `certs` and `route` need.
fn first_node(src: &Source, file: &ClusterFile) -> Result<NodeConfig, u8> {
    let nodes = file.check(src).map_err(config_error)?;
    file.validate(src, &nodes[0].id, &Overrides::default())
        .map_err(config_error)
}

/// Loads the file and validates it for its first node (the cluster-wide
/// values); `Err` is the exit status, the error already printed.
pub(crate) fn load_cluster(config: Option<&Path>) -> Result<(ClusterFile, NodeConfig), u8> {
    let (src, file) = load(config)?;
    let c = first_node(&src, &file)?;
    Ok((file, c))
}

/// One `current_thread` runtime: quinn then packs several requests per
/// datagram (docs/architecture.md, "Design decisions", one runtime per
/// core).
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

/// Resolves on the first SIGTERM or SIGINT.
///
/// # Panics
/// When the SIGTERM handler cannot be installed (no signal driver).
pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: leaving the cluster"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: leaving the cluster"),
    }
}
