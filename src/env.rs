//! The I/O seam: everything a node takes from the outside world, bound and
//! read once, then handed to [`crate::Node::build`].
//!
//! Production binds real sockets with [`Env::bind`]; a simulation hands in
//! its own sockets, clock-derived generation and seed.

use std::net::SocketAddr;

use chitchat::transport::{Transport, UdpTransport};

use crate::config::NodeConfig;

/// Sockets, generation and seed of one node.
pub struct Env {
    /// Client HTTP listeners (the node's `http_addr`, plus the shared
    /// SO_REUSEPORT address when configured), non-blocking.
    pub http_listeners: Vec<std::net::TcpListener>,
    /// The UDP socket for the QUIC endpoint, non-blocking.
    pub peer_socket: std::net::UdpSocket,
    /// The gossip transport; chitchat opens its socket on `gossip_addr`
    /// when the node runs ([`Env::bind`] has checked the address is free).
    pub gossip: Box<dyn Transport>,
    /// This run's generation id: increases on every restart (ms since the
    /// Unix epoch when the process started).
    pub generation: u64,
    /// Seed for every random choice the node makes.
    pub seed: u64,
}

/// A socket could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot bind {what} {addr}")]
pub struct BindError {
    /// Which socket (`http_addr`, `peer_addr`, ...).
    pub what: &'static str,
    /// The address.
    pub addr: SocketAddr,
    /// The OS error.
    pub source: std::io::Error,
}

impl Env {
    /// Binds every socket `config` names, reads the wall clock for the
    /// generation and draws a seed from the OS.
    ///
    /// # Errors
    /// [`BindError`] naming the socket that could not be bound.
    pub fn bind(config: &NodeConfig) -> Result<Env, BindError> {
        let n = &config.node;
        let err = |what, addr| move |source| BindError { what, addr, source };
        let mut http_listeners =
            vec![tcp_listener(n.http_addr, false).map_err(err("http_addr", n.http_addr))?];
        if let Some(shared) = config.shared_listen {
            http_listeners
                .push(tcp_listener(shared, true).map_err(err("shared listen address", shared))?);
        }
        let peer_socket =
            std::net::UdpSocket::bind(n.peer_addr).map_err(err("peer_addr", n.peer_addr))?;
        peer_socket
            .set_nonblocking(true)
            .map_err(err("peer_addr", n.peer_addr))?;
        // chitchat's UDP transport binds its own socket (its envelope codec
        // is private, so a pre-bound socket cannot be handed in): check the
        // address now so a conflict is reported before the node starts.
        drop(std::net::UdpSocket::bind(n.gossip_addr).map_err(err("gossip_addr", n.gossip_addr))?);
        #[allow(clippy::disallowed_methods, clippy::disallowed_types)]
        let generation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_millis() as u64);
        let seed = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(generation);
            h.write_u32(std::process::id());
            h.finish()
        };
        Ok(Env {
            http_listeners,
            peer_socket,
            gossip: Box::new(UdpTransport),
            generation,
            seed,
        })
    }
}

fn tcp_listener(addr: SocketAddr, reuse_port: bool) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket as S, Type};
    let s = S::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    if reuse_port {
        s.set_reuse_port(true)?;
    }
    s.set_nodelay(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}
