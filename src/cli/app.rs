//! `peerlb app`: the built-in demo app alone over plain HTTP/1.1 (no
//! cluster, no peers), a backend for benchmarks (bench/compare.sh).

use anyhow::Context;
use clap::Args;

use super::{runtime, shutdown_signal};

/// The arguments of `peerlb app`.
#[derive(Args)]
pub(crate) struct AppArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9001")]
    listen: std::net::SocketAddr,
    /// Name the app reports as serving node and entry.
    #[arg(long, default_value = "app")]
    name: String,
}

/// Serves until SIGTERM or SIGINT; 0 then.
pub(crate) fn run(a: AppArgs) -> anyhow::Result<u8> {
    let AppArgs { listen, name } = a;
    runtime()?.block_on(async move {
        let l = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        tracing::info!(addr = %listen, "serving the built-in app");
        tokio::select! {
            _ = peerlb::serve_app(l, name) => {}
            _ = shutdown_signal() => {}
        }
        anyhow::Ok(0)
    })
}
