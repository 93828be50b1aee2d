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
    /// Bind the client listener here rather than on the advertised
    /// http_addr (ip:port, or an IP for http_addr's port; 0.0.0.0 allowed).
    #[arg(long, env = "PEERLB_HTTP_BIND")]
    http_bind: Option<String>,
    /// Bind the QUIC socket here rather than on the advertised peer_addr
    /// (ip:port, or an IP for peer_addr's port; 0.0.0.0 allowed).
    #[arg(long, env = "PEERLB_PEER_BIND")]
    peer_bind: Option<String>,
    /// Bind the gossip socket here rather than on the advertised
    /// gossip_addr (ip:port, or an IP for gossip_addr's port).
    #[arg(long, env = "PEERLB_GOSSIP_BIND")]
    gossip_bind: Option<String>,
    /// Bind the client, peer and gossip sockets on this IP (e.g. 0.0.0.0 in
    /// a container), each with its advertised port, unless its own
    /// --*-bind is given.
    #[arg(long, env = "PEERLB_BIND")]
    bind: Option<String>,
    /// Override this node's weight (100 = one share).
    #[arg(long, env = "PEERLB_WEIGHT")]
    weight: Option<u32>,
    /// Override the app ("builtin" or an http:// URL).
    #[arg(long, env = "PEERLB_APP")]
    app: Option<String>,
    /// Also accept clients on this address, shared with SO_REUSEPORT.
    #[arg(long, env = "PEERLB_SHARED_LISTEN")]
    shared_listen: Option<String>,
    /// Also accept SIP (UDP and TCP) on this address, shared with
    /// SO_REUSEPORT (a node with a sip_addr only).
    #[arg(long, env = "PEERLB_SHARED_SIP_LISTEN")]
    shared_sip_listen: Option<String>,
    /// Also accept SIPS (SIP over TLS) on this address, shared with
    /// SO_REUSEPORT (a node with a sips_addr only).
    #[arg(long, env = "PEERLB_SHARED_SIPS_LISTEN")]
    shared_sips_listen: Option<String>,
    /// Serve HTTPS on every client listener with this PEM certificate
    /// chain (with --tls-key), replacing [listener.tls]'s default one.
    #[arg(long, env = "PEERLB_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<String>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "PEERLB_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<String>,
}

/// Validates the node's configuration and TLS files (exit 64 when they are
/// wrong, before any socket is bound), then runs the node; 0 once it has
/// left the cluster.
pub(crate) fn run(a: NodeArgs) -> anyhow::Result<u8> {
    let (src, file) = match load(a.config.as_deref()) {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    // Field by field: `Overrides` is `#[non_exhaustive]` (it grows with
    // the flags).
    let mut ov = Overrides::default();
    ov.http_addr = a.http_addr;
    ov.peer_addr = a.peer_addr;
    ov.gossip_addr = a.gossip_addr;
    ov.admin_addr = a.admin_addr;
    ov.http_bind = a.http_bind;
    ov.peer_bind = a.peer_bind;
    ov.gossip_bind = a.gossip_bind;
    ov.bind = a.bind;
    ov.weight = a.weight;
    ov.app = a.app;
    ov.shared_listen = a.shared_listen;
    ov.shared_sip_listen = a.shared_sip_listen;
    ov.shared_sips_listen = a.shared_sips_listen;
    ov.tls_cert = a.tls_cert.zip(a.tls_key);
    let mut config = match file.validate(&src, &a.node, &ov) {
        Ok(c) => c,
        Err(e) => return Ok(config_error(e)),
    };
    let files = raise_open_file_limit();
    config.ingress.max_connections = connection_cap(config.ingress.max_connections, files);
    let keyring = match read_files(&config) {
        Ok(k) => k,
        Err(code) => return Ok(code),
    };
    let rt = runtime()?;
    rt.block_on(async move {
        let env = Env::bind(&config, keyring)?;
        let node = Node::build(config, env)?;
        // Gives a spike's memory back to the OS once it has passed.
        let trim = tokio::spawn(super::memory::run());
        node.run(shutdown_signal()).await?;
        trim.abort();
        anyhow::Ok(0)
    })
}

/// Reads the files a node needs before it binds anything (they are
/// configuration too): its certificate, key and CA, the HTTPS listeners'
/// certificates, and the gossip keyring, which it returns. `Err` is exit
/// status 64, the error printed naming the field.
pub(crate) fn read_files(
    config: &peerlb::config::NodeConfig,
) -> Result<peerlb::keyring::Keyring, u8> {
    if let Err(e) = tls::TlsMaterial::load(&config.tls.ca, &config.tls.cert, &config.tls.key) {
        return Err(config_error(format!(
            "tls: {e} (create the certificates with `peerlb certs`)"
        )));
    }
    let sips = config.sips.certs.as_ref();
    for t in [&config.listener.tls, &config.shared_listener.tls]
        .into_iter()
        .flatten()
        .chain(sips)
    {
        if let Err(e) = tls::check_entry_files(t) {
            return Err(config_error(e));
        }
    }
    tls::check_sip_upstream(config).map_err(config_error)?;
    peerlb::keyring::Keyring::load(&config.tls.gossip_keyring)
        .map_err(|e| config_error(format!("tls.gossip_keyring: {e}")))
}

/// File descriptors kept out of the client connection cap: listeners, peer
/// and gossip sockets, app connections, the keyring and rules files.
const RESERVED_FDS: u64 = 256;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, as HAProxy and Go's
/// runtime do (the common soft 1024 locks a node out after about 1,000 idle
/// client connections), and logs it: the soft limit in force after, `None`
/// when it cannot be read.
// getrlimit(2) and setrlimit(2) through libc: std has no call for them.
#[allow(unsafe_code)]
fn raise_open_file_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit to the pointer it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "cannot read the open file limit");
        return None;
    }
    let (soft, hard) = (lim.rlim_cur, lim.rlim_max);
    if soft >= hard {
        tracing::info!(soft, hard, "open file limit");
        return Some(soft);
    }
    let raised = libc::rlimit {
        rlim_cur: hard,
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads one rlimit from the pointer it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        tracing::warn!(soft, hard, error = %std::io::Error::last_os_error(), "cannot raise the open file limit");
        return Some(soft);
    }
    tracing::info!(
        from = soft,
        to = hard,
        "open file limit raised to the hard limit"
    );
    Some(hard)
}

/// The client connection cap in force: `configured`
/// (`limits.max_connections`), lowered to the open file limit `files` less
/// [`RESERVED_FDS`] (at least 1) when that is smaller, with a warning.
fn connection_cap(configured: usize, files: Option<u64>) -> usize {
    let Some(files) = files else {
        return configured;
    };
    let room = usize::try_from(files.saturating_sub(RESERVED_FDS).max(1)).unwrap_or(usize::MAX);
    if room < configured {
        tracing::warn!(
            configured,
            open_file_limit = files,
            cap = room,
            "limits.max_connections lowered to fit the open file limit"
        );
        return room;
    }
    tracing::info!(max_connections = configured, "client connection cap");
    configured
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_fits_the_open_file_limit() {
        assert_eq!(connection_cap(10_000, Some(1_048_576)), 10_000);
        assert_eq!(connection_cap(10_000, Some(1024)), 768);
        assert_eq!(connection_cap(10_000, Some(100)), 1);
        assert_eq!(connection_cap(10_000, None), 10_000);
    }

    #[test]
    // getrlimit(2) through libc, to read the limit back.
    #[allow(unsafe_code)]
    fn the_soft_open_file_limit_is_raised_to_the_hard_one() {
        let after = raise_open_file_limit().expect("readable limit");
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit to the pointer it is given.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(lim.rlim_cur, lim.rlim_max);
        assert_eq!(after, lim.rlim_cur);
    }
}
