//! The validated configuration of one node ([`NodeConfig`]), grouped by the
//! part of the node that uses it: each adapter takes its group as it is
//! (`ingress`, `peer`, `gossip`), the composition root hands the rest to the
//! engine and to the node's own loops.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::RulesSource;
use crate::engine::balance::Policy;
use crate::engine::node_id::NodeId;
use crate::engine::route::RouterOptions;
use crate::engine::rules::Rules;
use crate::engine::slow_start::SlowStart;

/// The app a node serves requests with.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AppKind {
    /// The built-in demo app.
    Builtin,
    /// Proxy to a local upstream application.
    Upstream(UpstreamApp),
}

/// An upstream app and how the node keeps its connections to it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UpstreamApp {
    /// Where it listens (`app`, `--app`).
    pub addr: AppAddr,
    /// An idle keep-alive connection to it is closed after this long
    /// rather than reused; zero: never reused
    /// (`limits.upstream_idle_timeout_ms`).
    pub idle_timeout: Duration,
}

/// The server a node answers the SIP requests it owns with (`sip_app`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SipAppKind {
    /// The built-in demo user agent server (docs/architecture.md, "SIP").
    Builtin,
    /// `udp:<ip>:<port>`: an upstream SIP server over UDP; the owner
    /// forwards each request there and relays its answers.
    Udp(SocketAddr),
    /// `tcp:<ip>:<port>`: an upstream SIP server over TCP (one connection
    /// per node, opened on the first request and again after it closed).
    Tcp(SocketAddr),
    /// `tls:<ip>:<port>`: an upstream SIP server over TLS (as `Tcp`, the
    /// server's certificate checked against `[sips] upstream_ca`).
    Tls(SocketAddr),
}

/// Where an upstream app listens.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AppAddr {
    /// `http://host:port` (port 80 when not given), HTTP/1.1 over TCP.
    Http(http::Uri),
    /// `unix:/absolute/path.sock`: HTTP/1.1 over a Unix domain socket (a
    /// path of at most 107 bytes).
    Unix(PathBuf),
    /// `h2c://host:port` (port 80 when not given): HTTP/2 over TCP with
    /// prior knowledge (RFC 9113 section 3.3), one multiplexed connection
    /// (a gRPC server, for one).
    H2c(http::Uri),
}

/// Longest Unix socket path an app may have, in bytes: a socket address
/// holds 108 bytes (`sun_path` on Linux) with the terminating NUL.
pub(crate) const MAX_UNIX_PATH: usize = 107;

impl std::fmt::Display for AppAddr {
    /// As written in `app`: `http://127.0.0.1:9000/`, `unix:/run/app.sock`,
    /// `h2c://127.0.0.1:50051/`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppAddr::Http(uri) => write!(f, "{uri}"),
            AppAddr::Unix(path) => write!(f, "unix:{}", path.display()),
            AppAddr::H2c(uri) => write!(f, "{uri}"),
        }
    }
}

/// One node's validated view of a node entry.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeAddrs {
    /// Node id (checked by [`NodeId::new`]).
    pub id: NodeId,
    /// Client HTTP address.
    pub http_addr: SocketAddr,
    /// Peer QUIC address.
    pub peer_addr: SocketAddr,
    /// Gossip address.
    pub gossip_addr: SocketAddr,
    /// Admin API address (`admin_addr`, default [`default_admin_addr`]).
    pub admin_addr: SocketAddr,
    /// SIP address (`sip_addr`, UDP and TCP on the same port); `None`
    /// serves no SIP.
    pub sip_addr: Option<SocketAddr>,
    /// SIPS address (`sips_addr`, SIP over TLS; port 5061 when the file
    /// gives an IP alone); `None` serves no SIPS.
    pub sips_addr: Option<SocketAddr>,
    /// Metrics address (`metrics_addr`, TCP): serves only the metrics;
    /// `None` serves them on the admin address only.
    pub metrics_addr: Option<SocketAddr>,
    /// Weight (100 = one share).
    pub weight: u32,
}

/// Where one node binds the sockets whose address it advertises: by
/// default the advertised addresses themselves (`http_addr`, `peer_addr`,
/// `gossip_addr`); with `http_bind`, `peer_bind`, `gossip_bind` (or
/// `--bind`) another address, e.g. `0.0.0.0` in a container whose own IP
/// is not the one peers reach (Consul's `-bind` and `-advertise`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BindAddrs {
    /// The client listener's bound address (TCP).
    pub http: SocketAddr,
    /// The QUIC socket's bound address (UDP).
    pub peer: SocketAddr,
    /// The gossip socket's bound address (UDP).
    pub gossip: SocketAddr,
}

/// Offset of the default admin port from the client port.
pub const ADMIN_PORT_OFFSET: u16 = 1000;

/// The admin address of a node whose `[[nodes]]` entry gives none:
/// `127.0.0.1:<http port + 1000>` (`[::1]` when the client address is
/// IPv6), or `None` when that port would pass 65535 (the entry must then
/// give `admin_addr`).
pub fn default_admin_addr(http_addr: SocketAddr) -> Option<SocketAddr> {
    let port = http_addr.port().checked_add(ADMIN_PORT_OFFSET)?;
    let ip: std::net::IpAddr = if http_addr.is_ipv6() {
        std::net::Ipv6Addr::LOCALHOST.into()
    } else {
        std::net::Ipv4Addr::LOCALHOST.into()
    };
    Some(SocketAddr::new(ip, port))
}

/// Resolved TLS file paths.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsPaths {
    /// Directory of the cluster's certificates.
    pub dir: PathBuf,
    /// CA certificate.
    pub ca: PathBuf,
    /// This node's certificate.
    pub cert: PathBuf,
    /// This node's key.
    pub key: PathBuf,
    /// The gossip keyring (`tls.gossip_keyring`).
    pub gossip_keyring: PathBuf,
}

/// Everything one node needs, validated and typed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeConfig {
    /// Cluster name (`name`).
    pub cluster: String,
    /// This node (its advertised addresses).
    pub node: NodeAddrs,
    /// Where this node binds its client, peer and gossip sockets.
    pub bind: BindAddrs,
    /// Every node listed in the file (this one included, with overrides applied).
    pub nodes: Vec<NodeAddrs>,
    /// Extra client listener shared with SO_REUSEPORT, if any.
    pub shared_listen: Option<SocketAddr>,
    /// Extra SIP listener (UDP and TCP) shared with SO_REUSEPORT, if any
    /// (`--shared-sip-listen`); only on a node with a `sip_addr`.
    pub shared_sip_listen: Option<SocketAddr>,
    /// Extra SIPS listener (TCP) shared with SO_REUSEPORT, if any
    /// (`--shared-sips-listen`); only on a node with a `sips_addr`.
    pub shared_sips_listen: Option<SocketAddr>,
    /// The app (`app`, `--app`).
    pub app: AppKind,
    /// The SIP server the node answers the SIP requests it owns with
    /// (`sip_app`).
    pub sip_app: SipAppKind,
    /// SIP over TLS (`[sips]`, `[listener.tls]`).
    pub sips: SipsSettings,
    /// TLS paths (`[tls]`).
    pub tls: TlsPaths,
    /// What the engine decides with: policy, rules, ring resolution.
    pub routing: RoutingSettings,
    /// The load this node publishes (`[balance] metric_*`).
    pub metric: MetricSettings,
    /// The client side of the request path (`[limits]`, `[headers]`).
    pub ingress: IngressSettings,
    /// The listener on `http_addr` (`[listener]`).
    pub listener: ListenerSettings,
    /// The shared listener, if any (`[shared_listener]`, else `[listener]`).
    pub shared_listener: ListenerSettings,
    /// Peer links (`[peer]`, `limits.connect_timeout_ms`).
    pub peer: PeerSettings,
    /// Gossip (`seeds`, `[gossip]`).
    pub gossip: GossipSettings,
    /// Start-up and shutdown waits (`limits.startup_wait_ms`, `drain_*`).
    pub lifecycle: LifecycleSettings,
}

/// What the router decides with.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RoutingSettings {
    /// Balancing policy (`policy`).
    pub policy: Policy,
    /// Router options: bounded load (`balance.hash_balance_factor`).
    pub router: RouterOptions,
    /// Compiled data-centric rules (`[[rules]]` or `rules_file`).
    pub rules: Rules,
    /// Ring resolution and assignment (`ring.vnodes`, `ring.assignment`).
    pub ring: crate::engine::ring::RingSpec,
    /// The weight ramp of this node after it starts
    /// (`balance.slow_start_ms`, `balance.slow_start_steps`).
    pub slow_start: SlowStart,
    /// Routing by the app's own session id (`[sticky.session]`); `None`:
    /// off.
    pub session_route: Option<crate::engine::session_id::SessionRoute>,
}

/// The load metric a node publishes in gossip (mod_oc4j's metric with
/// smoothing; see `engine::balance::metric`).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct MetricSettings {
    /// Smoothing history `h`, in `0.0..1.0` (`balance.metric_history`).
    pub history: f64,
    /// Requests in service at which the metric is 0 (`balance.metric_capacity`).
    pub capacity: u32,
}

/// The ingress (client-facing) side of the request path.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct IngressSettings {
    /// Longest request-target in bytes (`limits.max_request_target`).
    pub max_request_target: usize,
    /// Most client connections open at once (`limits.max_connections`).
    pub max_connections: usize,
    /// Most client connections open at once from one IP address:
    /// `max_connections` x `limits.max_connections_per_source_percent` /
    /// 100, at least 1 (see [`IngressSettings::max_connections_per_source`]).
    pub max_connections_per_source_percent: u32,
    /// Longest wait for an owner's response head (`limits.response_timeout_ms`).
    pub response_timeout: Duration,
    /// Add `peerlb-served-by` (`headers.served_by`).
    pub header_served_by: bool,
    /// Add `peerlb-entry` (`headers.entry`).
    pub header_entry: bool,
    /// The sticky route cookie (`[sticky]`).
    pub route_cookie: crate::engine::RouteCookie,
    /// Keep client-sent `X-Forwarded-For`, `X-Real-IP` and `Forwarded`
    /// (`headers.trust_client_forwarded`); false drops them at the entry.
    pub trust_client_forwarded: bool,
    /// Where the rules come from, for reloads; `None` when they cannot
    /// change (the embedded default's `[[rules]]`).
    pub rules_source: Option<RulesSource>,
    /// Longest wait for a complete request head, idle keep-alive included
    /// (`limits.header_read_timeout_ms`).
    pub header_read_timeout: Duration,
    /// Longest wait between two reads of a request body
    /// (`limits.body_read_timeout_ms`).
    pub body_read_timeout: Duration,
    /// Longest a write to a client may make no progress
    /// (`limits.send_timeout_ms`).
    pub send_timeout: Duration,
    /// Most bytes of an unfinished request body read and discarded after
    /// an early answer, before the connection closes
    /// (`limits.early_answer_drain_bytes`).
    pub early_answer_drain_bytes: u64,
    /// Most open streams per HTTP/2 client connection
    /// (`limits.h2_max_concurrent_streams`).
    pub h2_max_concurrent_streams: u32,
    /// A WebSocket tunnel idle this long is closed
    /// (`limits.websocket_idle_timeout_ms`).
    pub websocket_idle_timeout: Duration,
    /// A SIP TCP connection idle this long is closed
    /// (`limits.sip_idle_timeout_ms`).
    pub sip_idle_timeout: Duration,
    /// RFC 3261 Timer C of an INVITE relayed to `sip_app`
    /// (`limits.sip_timer_c_ms`).
    pub sip_timer_c: Duration,
    /// Most SIP requests per source over UDP, and the interval they are
    /// counted over (`limits.sip_udp_requests_per_source`,
    /// `limits.sip_udp_rate_interval_ms`; 0 requests: no limit).
    pub sip_udp_rate: (u32, Duration),
    /// A tunnel idle this long is closable at the connection cap
    /// (`limits.tunnel_closable_after_ms`).
    pub tunnel_closable_after: Duration,
    /// The share of the connection cap open tunnels may hold, in percent
    /// (`limits.max_tunnels_percent`).
    pub max_tunnels_percent: u32,
    /// Most bytes of one forwarded response held for its client, the peer
    /// streams' receive window (`limits.response_buffer_bytes`).
    pub response_buffer_bytes: u64,
    /// Most bytes of responses held for clients at once, node-wide
    /// (`limits.response_budget_bytes`).
    pub response_budget_bytes: u64,
}

/// What one client listener expects before the HTTP request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ListenerSettings {
    /// Expect a PROXY protocol header, read within this time
    /// (`proxy_protocol`, `proxy_protocol_timeout_ms`); `None`: never read one.
    pub proxy_protocol: Option<Duration>,
    /// Serve HTTPS (`tls`); `None`: cleartext HTTP.
    pub tls: Option<ListenerTls>,
}

/// SIP over TLS, validated (`[sips]`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct SipsSettings {
    /// The certificates of this node's `sips_addr` listener: `[sips]`'s
    /// pair, else `[listener.tls]`'s (no client certificates asked);
    /// `None` exactly when the node has no `sips_addr`.
    pub certs: Option<ListenerTls>,
    /// The CA file a `sip_app = "tls:..."` server must chain to
    /// (`sips.upstream_ca`); set whenever `sip_app` is `tls:`.
    pub upstream_ca: Option<PathBuf>,
    /// The name that server's certificate is checked against
    /// (`sips.upstream_server_name`); `None`: its IP.
    pub upstream_server_name: Option<String>,
}

/// The certificates of an HTTPS listener.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListenerTls {
    /// The default certificate first, then the SNI ones, in order.
    pub certs: Vec<CertFiles>,
    /// How often the files are checked for changes; zero: never.
    pub reload_interval: Duration,
}

/// One certificate and key, and the config field that named them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CertFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// The field path of this pair (`listener.tls`, `listener.tls.sni[1]`,
    /// `--tls-cert`), for errors.
    pub field: String,
    /// Client certificates asked of a client whose SNI name picks this
    /// certificate; `None`: none asked.
    pub client_auth: Option<ClientAuth>,
}

/// Client certificates at the entry (`client_ca`, `client_auth` of
/// `[listener.tls]` and `[[listener.tls.sni]]`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub struct ClientAuth {
    /// PEM file of the CA certificates a client certificate must chain to.
    pub ca: PathBuf,
    /// A client without a certificate fails the handshake (`"required"`);
    /// else one is verified when sent (`"optional"`).
    pub required: bool,
    /// The field that named the CA file, for errors.
    pub field: String,
}

impl IngressSettings {
    /// The per-source connection cap: `max_connections` x
    /// `max_connections_per_source_percent` / 100, rounded down, at least 1.
    pub fn max_connections_per_source(&self) -> usize {
        let pct = self.max_connections_per_source_percent.clamp(1, 100) as usize;
        (self.max_connections.saturating_mul(pct) / 100).max(1)
    }
}

/// Peer link (QUIC) settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PeerSettings {
    /// Liveness ping interval while a connection is busy
    /// (`peer.keep_alive_ms`).
    pub keep_alive: Duration,
    /// A busy connection that hears nothing this long is closed and its
    /// peer ejected; a connection is busy while streams are open on it and
    /// for this long after the last one (`peer.idle_timeout_ms`).
    pub idle_timeout: Duration,
    /// Longest wait for a handshake or a stream to open
    /// (`limits.connect_timeout_ms`).
    pub connect_timeout: Duration,
    /// Speak only the previous peer protocol, `peerlb/1` (`peer.protocol
    /// = 1`): each node opens streams only on connections it dialled and
    /// serves them only on those it accepted (docs/operations.md, "Rolling
    /// upgrade").
    pub only_v1: bool,
    /// Offer ALPN `peerlb/3` (`peer.protocol = 3`, the default): false
    /// speaks `peerlb/2` at most, each stream's kind a header mark
    /// (docs/operations.md, "Rolling upgrade").
    pub offer_v3: bool,
    /// Most peers supervised (dialled and kept) at a time
    /// (`gossip.max_members`).
    pub max_peers: usize,
    /// Largest UDP payload sent, the upper bound of path MTU discovery
    /// (`peer.max_udp_payload`).
    pub max_udp_payload: u16,
    /// A member gossip announces is routable before any handshake and is
    /// dialled by the first request for it (`peer.dial = "on_demand"`);
    /// false: dialled at first sight, routable once the handshake
    /// succeeded.
    pub dial_on_demand: bool,
    /// Receive window of each peer stream, in bytes
    /// (`limits.response_buffer_bytes`): what a peer may send on one
    /// stream ahead of this node's reads.
    pub stream_window: u64,
}

/// Whether members' gossip state is signed and checked
/// (`gossip.state_signatures`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StateSignatures {
    /// Neither signed nor checked.
    Off,
    /// This node signs its state; members' are checked, and those that
    /// fail logged and taken anyway (a cluster being upgraded).
    Sign,
    /// Signed, and a member's state that fails the check is not taken
    /// (the default).
    #[default]
    Require,
}

/// Gossip (chitchat) settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GossipSettings {
    /// Seed addresses (`seeds`; every other node's `gossip_addr` when empty).
    pub seeds: Vec<String>,
    /// Gossip round interval (`gossip.interval_ms`).
    pub interval: Duration,
    /// Phi accrual failure-detector threshold (`gossip.phi_threshold`).
    pub phi_threshold: f64,
    /// How long dead members are kept (`gossip.dead_node_grace_ms`).
    pub dead_node_grace: Duration,
    /// Most members a gossip message may name (`gossip.max_members`).
    pub max_members: usize,
    /// Heartbeat intervals kept per member by the failure detector
    /// (`gossip.sample_window`).
    pub sample_window: usize,
    /// `gossip.state_signatures`.
    pub state_signatures: StateSignatures,
}

/// Start-up and shutdown waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LifecycleSettings {
    /// Longest wait for peer connections before accepting clients
    /// (`limits.startup_wait_ms`).
    pub startup_wait: Duration,
    /// Serve-after-leaving grace on SIGTERM (`limits.drain_grace_ms`).
    pub drain_grace: Duration,
    /// Longest wait for in-flight requests on SIGTERM
    /// (`limits.drain_timeout_ms`).
    pub drain_timeout: Duration,
}
