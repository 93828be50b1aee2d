//! The I/O seam: everything a node takes from the outside world, bound and
//! read once, then handed to [`crate::Node::build`].
//!
//! Production binds real sockets with [`Env::bind`]; a simulation hands in
//! its own: client listeners ([`HttpListener`]) and optionally the admin
//! listener, the QUIC socket and the
//! runtime quinn drives it with (quinn's `AsyncUdpSocket` and `Runtime`,
//! for `Endpoint::new_with_abstract_socket`), the chitchat [`Transport`],
//! a wall [`Clock`], the generation, the seed and, optionally, TLS material
//! held in memory. The node reports what it does back through the same
//! seam: [`Env::observer`] receives typed [`NodeEvent`]s (production passes
//! [`NoObserver`]; the simulation asserts on them instead of on log text).

use std::net::SocketAddr;
use std::sync::Arc;

use chitchat::transport::Transport;

use crate::adapters::cluster::bounds::Bounds;
use crate::adapters::cluster::keyring::{GossipKeys, Keyring};
use crate::adapters::cluster::sealed::SealedUdpTransport;
use crate::adapters::transport::peer::udp::PeerUdpSocket;
use crate::adapters::transport::tls::TlsMaterial;
use crate::config::NodeConfig;
pub(crate) use crate::seam::ClockAdapter;
pub use crate::seam::{
    Accepted, Clock, Connection, HttpListener, NoObserver, NodeEvent, Observer, SystemClock,
};

/// Sockets, clock, generation and seed of one node.
pub struct Env {
    /// Client HTTP listeners (the node's `http_addr`, plus the shared
    /// SO_REUSEPORT address when configured).
    pub http_listeners: Vec<Box<dyn HttpListener>>,
    /// The admin API listener (the node's `admin_addr`); `None` serves
    /// no admin listener (a simulation reads the node's state directly).
    pub admin_listener: Option<Box<dyn HttpListener>>,
    /// The metrics listener (the node's `metrics_addr`): serves only the
    /// metrics; `None` without a `metrics_addr`.
    pub metrics_listener: Option<Box<dyn HttpListener>>,
    /// The SIP sockets on `sip_addr` (UDP and TCP on one port); `None`
    /// serves no SIP (no `sip_addr`, and always in a simulation).
    pub sip: Option<SipSockets>,
    /// The UDP socket of the QUIC endpoint.
    pub peer_socket: Arc<dyn quinn::AsyncUdpSocket>,
    /// The runtime quinn uses for timers, tasks and `now` (tokio's in
    /// production and in a simulation, whose tokio time is virtual).
    pub quic_runtime: Arc<dyn quinn::Runtime>,
    /// The gossip transport; chitchat opens its socket on `gossip_addr`
    /// when the node runs ([`Env::bind`] has checked the address is free).
    /// It seals every datagram with `gossip_keys`.
    pub gossip: Box<dyn Transport>,
    /// The gossip keyring the transport seals and opens with (the admin
    /// API rotates it) and the datagrams it dropped.
    pub gossip_keys: Arc<GossipKeys>,
    /// The wall clock.
    pub clock: Arc<dyn Clock>,
    /// This run's generation id: increases on every restart (ms since the
    /// Unix epoch when the process started).
    pub generation: u64,
    /// Seed for every random choice the node makes (and quinn's endpoint).
    pub seed: u64,
    /// TLS material held in memory; `None` reads the files the config's
    /// `[tls]` section names when the node is built.
    pub tls: Option<TlsMaterial>,
    /// The built-in app's `/delay/<ms>` work takes this many times `ms`:
    /// 1 in production; a simulation's slow-node fault raises it.
    pub app_slowdown: Arc<std::sync::atomic::AtomicU32>,
    /// Receives what the node does ([`NoObserver`] in production).
    pub observer: Arc<dyn Observer>,
}

/// The two sockets of a node's `sip_addr`, and of the shared SIP
/// address when it has one.
pub struct SipSockets {
    /// SIP over UDP.
    pub udp: tokio::net::UdpSocket,
    /// SIP over TCP, on the same port.
    pub tcp: Box<dyn HttpListener>,
    /// The shared SIP address (`--shared-sip-listen`), UDP and TCP, both
    /// bound with SO_REUSEPORT; `None` without one.
    pub shared: Option<(tokio::net::UdpSocket, Box<dyn HttpListener>)>,
    /// SIP over TLS on `sips_addr` (TCP); `None` without one.
    pub sips: Option<Box<dyn HttpListener>>,
    /// The shared SIPS address (`--shared-sips-listen`), TCP with
    /// SO_REUSEPORT; `None` without one.
    pub shared_sips: Option<Box<dyn HttpListener>>,
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
    /// generation and draws a seed from the OS; gossip is sealed with
    /// `keyring` (read from `tls.gossip_keyring` beforehand). Call it
    /// inside the tokio runtime the node will run on (the sockets register
    /// with it).
    ///
    /// # Errors
    /// [`BindError`] naming the socket that could not be bound.
    pub fn bind(config: &NodeConfig, keyring: Keyring) -> Result<Env, BindError> {
        let n = &config.node;
        // The sockets bind where `config.bind` says (the advertised
        // addresses unless `*_bind` or `--bind` moved them).
        let b = &config.bind;
        let err = |what, addr| move |source| BindError { what, addr, source };
        let listener = |addr, reuse_port, what| -> Result<Box<dyn HttpListener>, BindError> {
            let l = tcp_listener(addr, reuse_port).map_err(err(what, addr))?;
            let l = tokio::net::TcpListener::from_std(l).map_err(err(what, addr))?;
            Ok(Box::new(l))
        };
        let mut http_listeners = vec![listener(b.http, false, "http_addr")?];
        if let Some(shared) = config.shared_listen {
            http_listeners.push(listener(shared, true, "shared listen address")?);
        }
        let admin_listener = Some(listener(n.admin_addr, false, "admin_addr")?);
        let metrics_listener = n
            .metrics_addr
            .map(|a| listener(a, false, "metrics_addr"))
            .transpose()?;
        let sip = match n.sip_addr {
            Some(addr) => {
                let udp = udp_socket(addr, false).map_err(err("sip_addr", addr))?;
                let shared = match config.shared_sip_listen {
                    Some(s) => {
                        let what = "shared sip listen address";
                        let udp = udp_socket(s, true).map_err(err(what, s))?;
                        Some((
                            tokio::net::UdpSocket::from_std(udp).map_err(err(what, s))?,
                            listener(s, true, what)?,
                        ))
                    }
                    None => None,
                };
                Some(SipSockets {
                    udp: tokio::net::UdpSocket::from_std(udp).map_err(err("sip_addr", addr))?,
                    tcp: listener(addr, false, "sip_addr")?,
                    shared,
                    sips: n
                        .sips_addr
                        .map(|a| listener(a, false, "sips_addr"))
                        .transpose()?,
                    shared_sips: config
                        .shared_sips_listen
                        .map(|a| listener(a, true, "shared sips listen address"))
                        .transpose()?,
                })
            }
            None => None,
        };
        let peer_socket = std::net::UdpSocket::bind(b.peer).map_err(err("peer_addr", b.peer))?;
        peer_socket
            .set_nonblocking(true)
            .map_err(err("peer_addr", b.peer))?;
        size_socket_buffers(&peer_socket);
        // Registered for reads only: quinn's own tokio socket is woken by
        // every datagram it sent (crate::adapters::transport::peer::udp).
        let peer_socket: Arc<dyn quinn::AsyncUdpSocket> =
            PeerUdpSocket::wrap(peer_socket).map_err(err("peer_addr", b.peer))?;
        // chitchat's UDP transport binds its own socket (its envelope codec
        // is private, so a pre-bound socket cannot be handed in): check the
        // address now so a conflict is reported before the node starts.
        drop(std::net::UdpSocket::bind(b.gossip).map_err(err("gossip_addr", b.gossip))?);
        let clock = SystemClock;
        let generation = clock
            .now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_millis() as u64);
        let seed = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(generation);
            h.write_u32(std::process::id());
            h.finish()
        };
        let gossip_keys =
            Arc::new(GossipKeys::new(keyring).with_file(config.tls.gossip_keyring.clone()));
        let bounds = Arc::new(Bounds::new(
            &n.id,
            generation,
            config.gossip.max_members,
            config.gossip.interval,
        ));
        Ok(Env {
            http_listeners,
            admin_listener,
            metrics_listener,
            sip,
            peer_socket,
            quic_runtime: Arc::new(quinn::TokioRuntime),
            gossip: Box::new(SealedUdpTransport::new(
                gossip_keys.clone(),
                bounds,
                config.gossip.seeds.clone(),
            )),
            gossip_keys,
            clock: Arc::new(clock),
            generation,
            seed,
            tls: None,
            app_slowdown: Arc::new(std::sync::atomic::AtomicU32::new(1)),
            observer: Arc::new(NoObserver),
        })
    }
}

/// Requested size of the peer UDP socket's receive and send buffers.
const SOCKET_BUFFER: usize = 4 << 20;

/// Sizes the receive and send buffers of the peer UDP socket (before it
/// is handed to quinn). A node that is off the CPU for a few ms while a
/// peer streams to it must not drop datagrams: the Linux default, about
/// 208 KiB, overflows, quinn sees loss and its congestion window stays at
/// its minimum. The kernel caps the request at `net.core.rmem_max` /
/// `wmem_max`; a smaller buffer is logged, not an error.
fn size_socket_buffers(socket: &std::net::UdpSocket) {
    let sock = socket2::SockRef::from(socket);
    for (what, r) in [
        ("receive", sock.set_recv_buffer_size(SOCKET_BUFFER)),
        ("send", sock.set_send_buffer_size(SOCKET_BUFFER)),
    ] {
        if let Err(e) = r {
            tracing::warn!(error = %e, "cannot set the peer socket's {what} buffer size");
        }
    }
}

/// A non-blocking UDP socket bound to `addr`, with SO_REUSEPORT when
/// `reuse_port` (the kernel then spreads datagrams over every socket of
/// the group by a hash of their source and destination).
fn udp_socket(addr: SocketAddr, reuse_port: bool) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket as S, Type};
    let s = S::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if reuse_port {
        s.set_reuse_port(true)?;
    }
    s.bind(&addr.into())?;
    s.set_nonblocking(true)?;
    Ok(s.into())
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
