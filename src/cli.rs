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
pub(crate) mod json_log;
pub(crate) mod keyring;
pub(crate) mod log_limit;
pub(crate) mod members;
pub(crate) mod memory;
pub(crate) mod node;
pub(crate) mod route;
pub(crate) mod up;

/// How log lines are written (`--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable text, coloured on a terminal.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`,
    /// `message` and the event's fields at the top level (for log
    /// shippers: Loki, Elasticsearch, journald's JSON export).
    Json,
}

/// The log filter when `RUST_LOG` is not set: info, quiet dependencies.
const DEFAULT_FILTER: &str = "info,chitchat=warn,quinn=warn";

/// The access log's filter directive: on (info) with `--access-log`, off
/// otherwise, whatever `RUST_LOG` says (so `RUST_LOG=info` does not turn a
/// line per request on by surprise).
fn access_directive(access_log: bool) -> tracing_subscriber::filter::Directive {
    let level = if access_log { "info" } else { "off" };
    format!("peerlb::access={level}")
        .parse()
        .expect("a valid directive")
}

/// Logs to stderr in `format`, filtered by `RUST_LOG` (default:
/// [`DEFAULT_FILTER`]) with the access log on only with `access_log`
/// ([`access_directive`]), text coloured on a terminal, JSON one object a
/// line with lists as arrays ([`json_log`]); chitchat's repeated
/// warnings rate limited (`log_limit`).
pub(crate) fn init_tracing(format: LogFormat, access_log: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_FILTER))
        .add_directive(access_directive(access_log));
    match format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .finish()
            .with(log_limit::RateLimit::default())
            .init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .event_format(json_log::JsonLines)
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .finish()
            .with(log_limit::RateLimit::default())
            .init(),
    }
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

/// One admin request over HTTP/1.0 (`body` sent with a `Content-Length`):
/// (status, body). Connects within 2 s and reads the answer within 10 s.
///
/// # Errors
/// The connection or the read failed.
pub(crate) fn admin_request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> std::io::Result<(u16, String)> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    let b = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nhost: localhost\r\ncontent-length: {}\r\n\r\n{b}",
        b.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let text = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    Ok((status, text))
}
