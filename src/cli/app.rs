//! `peerlb app`: the built-in demo app alone over plain HTTP/1.1 (no
//! cluster, no peers), a backend for benchmarks (bench/compare.sh) and for
//! an upstream on a Unix domain socket (`--listen unix:/path.sock`).

use anyhow::Context;
use clap::Args;
use peerlb::AppListener;

use super::{runtime, shutdown_signal};

/// The arguments of `peerlb app`.
#[derive(Args)]
pub(crate) struct AppArgs {
    /// Address to listen on: `ip:port`, or `unix:/path.sock` for a Unix
    /// domain socket (a stale socket file there is replaced, and removed
    /// on exit).
    #[arg(long, default_value = "127.0.0.1:9001")]
    listen: String,
    /// Name the app reports as serving node and entry.
    #[arg(long, default_value = "app")]
    name: String,
}

/// A parsed `--listen`.
enum Listen {
    Tcp(std::net::SocketAddr),
    Unix(std::path::PathBuf),
}

/// Serves until SIGTERM or SIGINT; 0 then.
pub(crate) fn run(a: AppArgs) -> anyhow::Result<u8> {
    let AppArgs { listen, name } = a;
    let at = match listen.strip_prefix("unix:") {
        Some(path) => Listen::Unix(path.into()),
        None => Listen::Tcp(
            listen
                .parse()
                .with_context(|| format!("--listen {listen:?}: want ip:port or unix:/path"))?,
        ),
    };
    runtime()?.block_on(async move {
        let l = match &at {
            Listen::Unix(path) => {
                remove_stale_socket(path)?;
                AppListener::Unix(
                    tokio::net::UnixListener::bind(path)
                        .with_context(|| format!("binding {listen}"))?,
                )
            }
            Listen::Tcp(addr) => AppListener::Tcp(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding {listen}"))?,
            ),
        };
        tracing::info!(addr = %listen, "serving the built-in app");
        tokio::select! {
            _ = peerlb::serve_app(l, name) => {}
            _ = shutdown_signal() => {}
        }
        if let Listen::Unix(path) = &at {
            let _ = std::fs::remove_file(path);
        }
        anyhow::Ok(0)
    })
}

/// Removes a socket file left at `path` by an app that did not exit
/// cleanly (binding would fail with "address in use"); anything else there
/// is left for the bind to report.
fn remove_stale_socket(path: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(m) = std::fs::symlink_metadata(path)
        && m.file_type().is_socket()
    {
        std::fs::remove_file(path).with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(())
}
