//! The serde model of `cluster.toml`: [`ClusterFile`] mirrors the file
//! (`deny_unknown_fields`, a `Default` per section, a doc per field), and
//! [`Overrides`] holds the per-node values flags and environment variables
//! replace. Nothing here checks a value; `validate` does.

use serde::{Deserialize, Serialize};

use crate::engine::rules::RuleSpec;

/// The whole `cluster.toml` as written (the serde model).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ClusterFile {
    /// Cluster name: the chitchat cluster id; nodes of other clusters are ignored.
    #[serde(default = "default_name")]
    pub name: String,
    /// Balancing policy: a kebab-case name, optionally with `:local`
    /// affinity (e.g. `consistent-hash`, `least-load:local`).
    #[serde(default = "default_policy")]
    pub policy: String,
    /// SailFin `data-centric-rules.xml` to take the rules from, relative to
    /// this file; exclusive with `[[rules]]`. Reloaded when it changes.
    #[serde(default)]
    pub rules_file: Option<String>,
    /// The app: `"builtin"`, the `http://host:port` URL of an upstream app,
    /// or `"unix:/absolute/path.sock"` for one on a Unix domain socket.
    #[serde(default = "default_app")]
    pub app: String,
    /// The SIP server of every owner: `"builtin"` (the demo server),
    /// `"udp:<ip>:<port>"`, `"tcp:<ip>:<port>"` or `"tls:<ip>:<port>"` of
    /// an upstream SIP server (TLS: trusted through `[sips] upstream_ca`).
    #[serde(default = "default_app")]
    pub sip_app: String,
    /// The client-facing address the sprayer exposes; `peerlb up` binds every
    /// node there with SO_REUSEPORT. Optional for multi-machine clusters.
    #[serde(default)]
    pub sprayer_addr: Option<String>,
    /// The SIP address the sprayer exposes (`ip:port`, UDP and TCP); `peerlb
    /// up` binds every node that has a `sip_addr` there too, with
    /// SO_REUSEPORT (`--shared-sip-listen`). Entry nodes name it in the
    /// `Record-Route` of the dialogs that enter through it.
    #[serde(default)]
    pub sip_sprayer_addr: Option<String>,
    /// The SIPS address the sprayer exposes (`ip:port`, or an IP for port
    /// 5061; TCP); `peerlb up` binds every node that has a `sips_addr`
    /// there too, with SO_REUSEPORT (`--shared-sips-listen`).
    #[serde(default)]
    pub sips_sprayer_addr: Option<String>,
    /// Gossip seed addresses (`host:port`); empty means every node's `gossip_addr`.
    #[serde(default)]
    pub seeds: Vec<String>,
    /// Ring parameters.
    #[serde(default)]
    pub ring: RingSection,
    /// Policy parameters.
    #[serde(default)]
    pub balance: BalanceSection,
    /// TLS material for the peer links.
    #[serde(default)]
    pub tls: TlsSection,
    /// SIP over TLS (`[sips]`): the certificate of the nodes' `sips_addr`
    /// listeners and the trust of a `sip_app = "tls:..."` server.
    #[serde(default)]
    pub sips: SipsSection,
    /// Request limits and timeouts.
    #[serde(default)]
    pub limits: LimitsSection,
    /// Informational response headers.
    #[serde(default)]
    pub headers: HeadersSection,
    /// The sticky route cookie.
    #[serde(default)]
    pub sticky: StickySection,
    /// Gossip (chitchat) parameters.
    #[serde(default)]
    pub gossip: GossipSection,
    /// Peer (QUIC) link parameters.
    #[serde(default)]
    pub peer: PeerSection,
    /// The client listener on each node's `http_addr`: PROXY protocol and
    /// HTTPS.
    #[serde(default)]
    pub listener: ListenerSection,
    /// The shared client listener (`--shared-listen`, what `peerlb up`
    /// binds on `sprayer_addr`); default: the same as `[listener]`.
    #[serde(default)]
    pub shared_listener: Option<ListenerSection>,
    /// The nodes of the cluster.
    #[serde(default)]
    pub nodes: Vec<NodeSpec>,
    /// Data-centric rules, in order; the first non-empty key wins.
    #[serde(default)]
    pub rules: Vec<RuleSpec>,
}

fn default_name() -> String {
    "peerlb".to_owned()
}
fn default_policy() -> String {
    "consistent-hash".to_owned()
}
fn default_app() -> String {
    "builtin".to_owned()
}

/// `[ring]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct RingSection {
    /// Ring resolution (1..=4096): the ring is a slot table of `256 x vnodes`
    /// slots (rounded up to a power of two) filled by weighted rendezvous
    /// hashing; more slots, finer balance.
    pub vnodes: u32,
    /// How slots go to nodes: `rendezvous` (the default: each slot to its
    /// first-ranked node; a leave or join moves only the keys it must) or
    /// `capped` (every node within one slot of its weighted share; a leave
    /// or join also moves a few keys between nodes that stay).
    pub assignment: RingAssignment,
}

/// `ring.assignment`: see [`crate::engine::ring::Assignment`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum RingAssignment {
    /// Each slot to its first-ranked node.
    #[default]
    Rendezvous,
    /// Each node within one slot of its weighted share.
    Capped,
}

impl From<RingAssignment> for crate::engine::ring::Assignment {
    fn from(a: RingAssignment) -> Self {
        match a {
            RingAssignment::Rendezvous => Self::Rendezvous,
            RingAssignment::Capped => Self::Capped,
        }
    }
}

impl Default for RingSection {
    fn default() -> Self {
        Self {
            vnodes: crate::engine::ring::DEFAULT_VNODES,
            assignment: RingAssignment::Rendezvous,
        }
    }
}

/// `[balance]`: parameters of the balancing policies.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct BalanceSection {
    /// Bounded-load factor `c` for consistent-hash (HAProxy
    /// `hash-balance-factor` / 100): a node at or above `c` x the average
    /// in-flight load is passed over for the next node on the ring. Unset:
    /// no bound. Range 1.0..=1000.0.
    pub hash_balance_factor: Option<f64>,
    /// History proportion `h` of the published load metric (mod_oc4j):
    /// `smoothed = (1 - h) * metric + h * previous`. Range 0.0..1.0 (default 0.3).
    pub metric_history: f64,
    /// Requests in service on this node's app at which its metric reaches
    /// 0 (peerlb's bound on the mod_oc4j metric), default 100.
    pub metric_capacity: u32,
    /// Slow start (HAProxy `slowstart`): a node that starts ramps the
    /// weight it publishes from `1/slow_start_steps` of its weight to its
    /// full weight over this many milliseconds. 0 (the default): no ramp.
    /// At most 3,600,000 (one hour).
    pub slow_start_ms: u64,
    /// Steps of the slow-start ramp, `1..=100` (default 10): each step is
    /// one gossip publication and one ring rebuild on every node.
    pub slow_start_steps: u32,
}

impl Default for BalanceSection {
    fn default() -> Self {
        Self {
            hash_balance_factor: None,
            metric_history: 0.3,
            metric_capacity: 100,
            slow_start_ms: 0,
            slow_start_steps: crate::engine::slow_start::DEFAULT_STEPS,
        }
    }
}

/// `[tls]`. Paths are relative to the directory of the config file (the
/// current directory for the embedded default).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct TlsSection {
    /// Directory holding `ca.pem` and `<node id>.pem` / `<node id>.key`.
    pub dir: String,
    /// The cluster CA certificate; default `<dir>/ca.pem`.
    pub ca: Option<String>,
    /// This node's certificate; default `<dir>/<node id>.pem`.
    pub cert: Option<String>,
    /// This node's private key; default `<dir>/<node id>.key`.
    pub key: Option<String>,
    /// The gossip keyring (one base64 key a line, the first seals; made by
    /// `peerlb certs`); default `<dir>/gossip.keys`.
    pub gossip_keyring: Option<String>,
}

impl Default for TlsSection {
    fn default() -> Self {
        Self {
            dir: "certs".to_owned(),
            ca: None,
            cert: None,
            key: None,
            gossip_keyring: None,
        }
    }
}

/// `[limits]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct LimitsSection {
    /// Longest request-target accepted, in bytes; longer gets 414 (default 8192).
    pub max_request_target: usize,
    /// Most client connections open at once per node (default 10000, at
    /// most 1000000; nginx's `worker_connections`, HAProxy's `maxconn`).
    /// At the cap the connection idle longest is closed to admit a new
    /// one; with every connection busy the new one is closed at once.
    /// Lowered at start to the open file limit less 256 when that is
    /// smaller.
    pub max_connections: usize,
    /// The share of `max_connections` one client IP address may hold, in
    /// percent (default 50, 1..=100; 100: no per-source cap). A source at
    /// its share gets new connections closed at accept (nginx `limit_conn`,
    /// HAProxy `src_conn_cur`). Set 100 when every client arrives from one
    /// address (a sprayer that does not keep client addresses).
    pub max_connections_per_source_percent: u32,
    /// Time to wait for an owner's response head, in ms (default 30000); 504 after.
    pub response_timeout_ms: u64,
    /// Time to open a peer stream before trying the next candidate, in ms (default 1000).
    pub connect_timeout_ms: u64,
    /// On SIGTERM, how long a node keeps serving after publishing `leaving`
    /// so every peer sees it before listeners close, in ms (default 1500).
    pub drain_grace_ms: u64,
    /// On SIGTERM, the longest wait for in-flight requests, in ms (default 30000).
    pub drain_timeout_ms: u64,
    /// At start, the longest wait for authenticated connections to every
    /// live peer before accepting clients, in ms (default 3000). Until then
    /// a new node would own every key alone.
    pub startup_wait_ms: u64,
    /// Longest wait for a client's complete request head, idle keep-alive
    /// time included, in ms (default 30000); the connection is closed after.
    pub header_read_timeout_ms: u64,
    /// Longest wait between two reads of a client's request body, in ms
    /// (default 30000; nginx's `client_body_timeout`); the request gets 408
    /// when it has no answer yet, else the connection is cut.
    pub body_read_timeout_ms: u64,
    /// Longest a write to a client may make no progress (the client reads
    /// nothing), in ms (default 60000; nginx's `send_timeout`); the
    /// connection is closed after.
    pub send_timeout_ms: u64,
    /// After a final answer to a request whose body the client is still
    /// sending (an app's 413), the most bytes of it read and discarded
    /// before the connection is closed, so a client that writes its whole
    /// body before it reads gets the answer instead of a reset (default
    /// 1048576; 0: close at once).
    pub early_answer_drain_bytes: u64,
    /// An idle keep-alive connection to the upstream app is closed after
    /// this long rather than reused, in ms (default 2000; 0: never reused;
    /// at most 3600000). Keep it below the app's own keep-alive timeout
    /// (5 s in uvicorn, Node.js and Apache), so peerlb closes an idle
    /// connection before the app does.
    pub upstream_idle_timeout_ms: u64,
    /// Most streams one HTTP/2 client connection may have open at once
    /// (default 100, as nginx and HAProxy; 1..=10000); a client that opens
    /// more waits for a stream to end (HTTP/2 flow control, RFC 9113
    /// section 5.1.2).
    pub h2_max_concurrent_streams: u32,
    /// A WebSocket tunnel that moves no byte either way this long is
    /// closed, in ms (default 300000; nginx's `proxy_read_timeout`,
    /// HAProxy's `timeout tunnel`).
    pub websocket_idle_timeout_ms: u64,
    /// A SIP TCP connection that carries no byte either way this long is
    /// closed, in ms (default 180000: above RFC 5626's 120 s keep-alive
    /// interval for connection-oriented transports, so a client that
    /// pings keeps it; at most 30 days).
    pub sip_idle_timeout_ms: u64,
    /// Most SIP requests one source address may send over UDP per
    /// `sip_udp_rate_interval_ms` (default 1000; 0: no limit); beyond it
    /// they are dropped unanswered (Kamailio's `pike` module).
    pub sip_udp_requests_per_source: u32,
    /// The interval of `sip_udp_requests_per_source`, in ms (default 1000).
    pub sip_udp_rate_interval_ms: u64,
    /// RFC 3261 Timer C, in ms (default 180000: the RFC's "larger than 3
    /// minutes"): an owner relaying an INVITE to `sip_app` that has had
    /// no provisional answer but `100` this long CANCELs the branch
    /// (16.8); each provisional answer restarts it. At most 30 days.
    pub sip_timer_c_ms: u64,
    /// A WebSocket or other tunnel that moved no byte either way this long
    /// may be closed to admit a new connection at `max_connections`, as
    /// an idle keep-alive connection is, in ms (default 60000).
    pub tunnel_closable_after_ms: u64,
    /// The share of `max_connections` that open tunnels may hold, in
    /// percent (default 75, 1..=100): a tunnel opened beyond it gets 503,
    /// so the rest of the cap stays for new clients.
    pub max_tunnels_percent: u32,
    /// Most bytes of one response an entry holds for its client, in bytes
    /// (default 262144, 16384..=16777216): the receive window of each
    /// peer stream (QUIC `initial_max_stream_data`), so an owner sends a
    /// forwarded answer only as fast as the entry's client takes it, and
    /// the owner's read of its app stops within the same bound. One frame
    /// of at most 64 KiB handed to the client connection comes on top.
    pub response_buffer_bytes: u64,
    /// Most bytes of responses a node holds for its clients at once, all
    /// responses together, in bytes (default 33554432, 1048576..=2^40;
    /// Envoy's overload manager). Past it the responses that hold the
    /// most are cut first (an HTTP/2 stream reset, an HTTP/1.1 connection
    /// closed); new requests are still admitted.
    pub response_budget_bytes: u64,
}

impl Default for LimitsSection {
    fn default() -> Self {
        Self {
            max_request_target: 8192,
            max_connections: 10_000,
            max_connections_per_source_percent: 50,
            response_timeout_ms: 30_000,
            connect_timeout_ms: 1_000,
            drain_grace_ms: 1_500,
            drain_timeout_ms: 30_000,
            startup_wait_ms: 3_000,
            header_read_timeout_ms: 30_000,
            body_read_timeout_ms: 30_000,
            send_timeout_ms: 60_000,
            early_answer_drain_bytes: 1024 * 1024,
            upstream_idle_timeout_ms: 2_000,
            h2_max_concurrent_streams: 100,
            websocket_idle_timeout_ms: 300_000,
            sip_idle_timeout_ms: 180_000,
            sip_udp_requests_per_source: 1_000,
            sip_udp_rate_interval_ms: 1_000,
            sip_timer_c_ms: crate::engine::sip::proxy::TIMER_C.as_millis() as u64,
            tunnel_closable_after_ms: 60_000,
            max_tunnels_percent: 75,
            response_buffer_bytes: 256 * 1024,
            response_budget_bytes: 32 * 1024 * 1024,
        }
    }
}

/// `[listener]` / `[shared_listener]`: what a client listener expects
/// before the HTTP request.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct ListenerSection {
    /// Every connection starts with a PROXY protocol header (v1 or v2)
    /// from the sprayer, whose address is then the client's (default
    /// false). A connection without a valid header is closed; a listener
    /// without this setting never reads one.
    pub proxy_protocol: bool,
    /// Longest wait for a connection's complete PROXY header, in ms
    /// (default 5000).
    pub proxy_protocol_timeout_ms: u64,
    /// Serve HTTPS on this listener (`[listener.tls]`); unset: cleartext.
    pub tls: Option<ListenerTlsSection>,
}

impl Default for ListenerSection {
    fn default() -> Self {
        Self {
            proxy_protocol: false,
            proxy_protocol_timeout_ms: 5_000,
            tls: None,
        }
    }
}

/// `[listener.tls]`: the certificates a client listener serves. Paths are
/// relative to the directory of the config file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ListenerTlsSection {
    /// The default certificate: a PEM file with the leaf certificate
    /// first, then its chain.
    pub cert: String,
    /// The default certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: String,
    /// More certificates, chosen by the client's SNI name among each
    /// certificate's DNS names (subject alternative names, `*.` wildcards
    /// included); a name none of them has gets the default certificate.
    #[serde(default)]
    pub sni: Vec<CertPairSpec>,
    /// How often the certificate and key files are checked for changes,
    /// in ms (default 5000; 0: only `POST /_peerlb/tls/reload` reloads).
    #[serde(default = "default_tls_reload_ms")]
    pub reload_interval_ms: u64,
    /// Client certificates: a PEM file of the CA certificates a client's
    /// certificate must chain to (unset: no client certificates asked).
    #[serde(default)]
    pub client_ca: Option<String>,
    /// `"required"` (default when `client_ca` is set: a client without a
    /// certificate that chains to `client_ca` fails the handshake) or
    /// `"optional"` (one is asked for and verified when sent).
    #[serde(default)]
    pub client_auth: Option<String>,
}

/// Default `reload_interval_ms` of `[listener.tls]`.
pub(crate) const DEFAULT_TLS_RELOAD_MS: u64 = 5_000;

fn default_tls_reload_ms() -> u64 {
    DEFAULT_TLS_RELOAD_MS
}

/// One certificate and its key (`[[listener.tls.sni]]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct CertPairSpec {
    /// PEM certificate chain, leaf first.
    pub cert: String,
    /// PEM private key.
    pub key: String,
    /// Client certificates for this certificate's names: the CA file
    /// (unset: the listener's `client_ca`).
    #[serde(default)]
    pub client_ca: Option<String>,
    /// `"none"`, `"optional"` or `"required"` for this certificate's names
    /// (unset: the listener's `client_auth`, or `"required"` when this
    /// pair sets `client_ca`).
    #[serde(default)]
    pub client_auth: Option<String>,
}

/// `[sips]`: SIP over TLS. Paths are relative to the directory of the
/// config file.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct SipsSection {
    /// The PEM certificate chain (leaf first) the `sips_addr` listeners
    /// serve; unset: `[listener.tls]`'s certificates (its SNI pairs too,
    /// without its client certificates). Set with `key`.
    pub cert: Option<String>,
    /// The PEM private key of `cert`.
    pub key: Option<String>,
    /// A PEM file of the CA certificates the server of
    /// `sip_app = "tls:<ip>:<port>"` must chain to (required with it; no
    /// system roots are used).
    pub upstream_ca: Option<String>,
    /// The name the server of `sip_app = "tls:..."` is checked against
    /// (and sent as SNI when a DNS name); default: its IP, which the
    /// certificate must then hold as an IP address name.
    pub upstream_server_name: Option<String>,
}

/// `[headers]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct HeadersSection {
    /// Add `peerlb-served-by: <node id>` to responses (default true).
    pub served_by: bool,
    /// Add `peerlb-entry: <node id>` to responses (default true).
    pub entry: bool,
    /// Pass the forwarding headers a client sent (`X-Forwarded-For`,
    /// `X-Real-IP`, `Forwarded`) on to the app (default true; the client's
    /// `X-Forwarded-For` values then come before the address peerlb
    /// adds). False drops them at the entry, for an edge no trusted proxy
    /// stands in front of (Envoy's `xff_num_trusted_hops = 0`).
    pub trust_client_forwarded: bool,
}

impl Default for HeadersSection {
    fn default() -> Self {
        Self {
            served_by: true,
            entry: true,
            trust_client_forwarded: true,
        }
    }
}

/// `[sticky]`: the sticky route cookie (policies with sticky routes).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct StickySection {
    /// Cookie name, an RFC 6265 token (default `peerlb-route`).
    pub cookie: String,
    /// The cookie's `Path` (default `/`).
    pub cookie_path: String,
    /// The cookie's `SameSite`: `Strict`, `Lax` (default) or `None` (sent
    /// on cross-site POSTs, as SAML and OIDC `form_post` logins need;
    /// requires `cookie_secure`).
    pub cookie_same_site: String,
    /// Mark the cookie `Secure` (default false): set it when clients reach
    /// peerlb through HTTPS terminated in front of it.
    pub cookie_secure: bool,
    /// `[sticky.session]`: route by the servers named inside the app's own
    /// session id (passive routes; absent: off).
    pub session: Option<SessionSection>,
}

/// `[sticky.session]`: where the app's session id is read and how it names
/// the servers holding the session (WebLogic, httpd mod_proxy_balancer
/// `stickysession`, or a regex). peerlb never rewrites it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SessionSection {
    /// The app's session cookie, e.g. `JSESSIONID` (an RFC 6265 token).
    #[serde(default)]
    pub cookie: Option<String>,
    /// The path parameter of the last path segment, e.g. `jsessionid` for
    /// `;jsessionid=...` (a token). At least one of `cookie` and
    /// `path_param` is required.
    #[serde(default)]
    pub path_param: Option<String>,
    /// `weblogic` (`id!primary!secondary`), `httpd` (`id.route`) or
    /// `regex` (named captures `primary` and optional `secondary`).
    pub format: String,
    /// With `format = "regex"`: the regex (Rust `regex` syntax), with a
    /// named capture `primary`.
    #[serde(default)]
    pub regex: Option<String>,
    /// Server id (as written in the session id) -> node id, for app servers
    /// not named like their nodes; an id not listed is the node id itself.
    #[serde(default)]
    pub servers: std::collections::BTreeMap<String, String>,
}

impl Default for StickySection {
    fn default() -> Self {
        Self {
            cookie: "peerlb-route".to_owned(),
            cookie_path: "/".to_owned(),
            cookie_same_site: "Lax".to_owned(),
            cookie_secure: false,
            session: None,
        }
    }
}

/// `[gossip]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct GossipSection {
    /// Gossip round interval, in ms (default 200).
    pub interval_ms: u64,
    /// Phi-accrual threshold above which a member is considered dead (default 8.0).
    pub phi_threshold: f64,
    /// How long a dead member is kept before it is forgotten, in ms (default 3600000).
    pub dead_node_grace_ms: u64,
    /// Most members (dead ones included) a gossip message may name and a
    /// node supervises (default 128, 2..=4096). Above 128 the cluster's
    /// full gossip digest must fit in one datagram with the longest
    /// configured node id (docs/configuration.md).
    pub max_members: u32,
    /// Heartbeat intervals the failure detector keeps per member to
    /// estimate their mean (default 1000, 10..=1000): 8 bytes each, per
    /// member, on every node.
    pub sample_window: u32,
    /// Signatures of members' gossip state with their node certificate's
    /// key: `"require"` (default: a member's state that fails is not
    /// taken), `"sign"` (sign this node's state, check others' and log
    /// those that fail, take them anyway: for a rolling upgrade from a
    /// release without signatures) or `"off"`.
    pub state_signatures: String,
}

impl Default for GossipSection {
    fn default() -> Self {
        Self {
            interval_ms: 200,
            phi_threshold: 8.0,
            dead_node_grace_ms: 3_600_000,
            max_members: 128,
            sample_window: 1000,
            state_signatures: "require".to_owned(),
        }
    }
}

/// `[peer]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct PeerSection {
    /// Liveness ping interval on a busy peer connection, in ms (default
    /// 200); must be under `idle_timeout_ms`.
    pub keep_alive_ms: u64,
    /// A busy peer connection silent this long is closed and the peer
    /// ejected, in ms (default 1000); QUIC's idle timeout is 3x this.
    pub idle_timeout_ms: u64,
    /// Peer wire protocol this node speaks (default 3). 3: ALPN
    /// `peerlb/3` (each stream's kind a field of its request frame), and
    /// with a node that does not offer it `peerlb/2` or `peerlb/1`. 2:
    /// `peerlb/2` at most, the protocol of releases before the typed
    /// stream kind (the kind is a header mark): one connection per node
    /// pair carrying requests both ways, and `peerlb/1` with a node that
    /// offers only that. 1: only `peerlb/1`, the protocol of releases
    /// before one connection per pair (each node opens streams on the
    /// connection it dialled and serves them on the one it accepted; QUIC
    /// keep-alive every `keep_alive_ms` on every connection). 1 and 2
    /// are for rolling an upgrade back in steps.
    pub protocol: u8,
    /// Largest UDP payload the peer layer sends, in bytes (default 6500,
    /// 1200..=6500): the upper bound of QUIC's path MTU discovery.
    pub max_udp_payload: u16,
    /// When a node first connects to a member gossip announces (default
    /// `at_sight`). `at_sight`: it dials the member at once and routes to
    /// it only once the handshake proved its identity (N (N - 1) / 2
    /// handshakes as a cluster of N forms). `on_demand`: the member is
    /// routable on gossip's word (gossip is sealed with the cluster key)
    /// and is dialled by the first request for it; a dial that fails
    /// ejects it, as a failed dial does under `at_sight`. Any other value
    /// is a config error.
    pub dial: String,
}

impl Default for PeerSection {
    fn default() -> Self {
        Self {
            keep_alive_ms: 200,
            idle_timeout_ms: 1_000,
            protocol: 3,
            max_udp_payload: 6500,
            dial: "at_sight".into(),
        }
    }
}

/// One `[[nodes]]` entry.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct NodeSpec {
    /// Stable node id (letters, digits, `-`, `_`, `.`; at most 63 bytes).
    pub id: String,
    /// The node's own client HTTP address (`ip:port`).
    pub http_addr: String,
    /// The node's peer QUIC address (`ip:port`, UDP).
    pub peer_addr: String,
    /// The node's gossip address (`ip:port`, UDP).
    pub gossip_addr: String,
    /// Where the node binds its client listener, when not on `http_addr`
    /// (`ip:port`, or an IP alone for the port of `http_addr`; may be
    /// `0.0.0.0` or `::`). Default: `http_addr`.
    #[serde(default)]
    pub http_bind: Option<String>,
    /// Where the node binds its QUIC socket, when not on `peer_addr`
    /// (`ip:port` or an IP alone, as `http_bind`): `peer_addr` is then
    /// only advertised (published in gossip and dialled by peers), as
    /// Consul's `-bind` and `-advertise`. Default: `peer_addr`.
    #[serde(default)]
    pub peer_bind: Option<String>,
    /// Where the node binds its gossip socket, when not on `gossip_addr`
    /// (`ip:port` or an IP alone, as `http_bind`); `gossip_addr` is then
    /// only advertised. Default: `gossip_addr`.
    #[serde(default)]
    pub gossip_bind: Option<String>,
    /// The node's admin API address (`ip:port`, TCP); default
    /// `127.0.0.1:<http port + 1000>`. Only the admin API answers there;
    /// what can reach this address is what protects the admin API.
    #[serde(default)]
    pub admin_addr: Option<String>,
    /// The node's SIP address (`ip:port`, UDP and TCP on the same port);
    /// none (the default) serves no SIP.
    #[serde(default)]
    pub sip_addr: Option<String>,
    /// The node's SIPS address: SIP over TLS (`ip:port`, TCP; an IP alone
    /// listens on port 5061); none (the default) serves no SIPS. Its
    /// certificate is `[sips]`'s, else `[listener.tls]`'s.
    #[serde(default)]
    pub sips_addr: Option<String>,
    /// The node's metrics address (`ip:port`, TCP); none (the default)
    /// serves the metrics on `admin_addr` only. Only `GET /metrics` (and
    /// `GET /_peerlb/metrics`) answer there, so a scraper can reach the
    /// metrics without reaching the admin API.
    #[serde(default)]
    pub metrics_addr: Option<String>,
    /// Relative weight; 100 is one share (default 100; 0 receives no keys).
    #[serde(default = "default_weight")]
    pub weight: u32,
}

fn default_weight() -> u32 {
    100
}

/// Per-node values that flags or environment variables override, so N
/// machines can share one file.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Overrides {
    /// `--http-addr` / `PEERLB_HTTP_ADDR`.
    pub http_addr: Option<String>,
    /// `--peer-addr` / `PEERLB_PEER_ADDR`.
    pub peer_addr: Option<String>,
    /// `--gossip-addr` / `PEERLB_GOSSIP_ADDR`.
    pub gossip_addr: Option<String>,
    /// `--admin-addr` / `PEERLB_ADMIN_ADDR`.
    pub admin_addr: Option<String>,
    /// `--http-bind` / `PEERLB_HTTP_BIND`: where the client listener
    /// binds (`ip:port`, or an IP for the port of `http_addr`).
    pub http_bind: Option<String>,
    /// `--peer-bind` / `PEERLB_PEER_BIND`: where the QUIC socket binds.
    pub peer_bind: Option<String>,
    /// `--gossip-bind` / `PEERLB_GOSSIP_BIND`: where the gossip socket binds.
    pub gossip_bind: Option<String>,
    /// `--bind` / `PEERLB_BIND`: an IP every one of the three sockets
    /// above binds on, each with the port of its advertised address,
    /// unless its own `--*-bind` is given (Consul's `-bind`).
    pub bind: Option<String>,
    /// `--weight` / `PEERLB_WEIGHT`.
    pub weight: Option<u32>,
    /// `--app` / `PEERLB_APP`.
    pub app: Option<String>,
    /// `--shared-listen` / `PEERLB_SHARED_LISTEN`: also listen for clients on
    /// this address with SO_REUSEPORT (what `peerlb up` passes).
    pub shared_listen: Option<String>,
    /// `--shared-sip-listen` / `PEERLB_SHARED_SIP_LISTEN`: also listen for
    /// SIP (UDP and TCP) on this address with SO_REUSEPORT (what `peerlb
    /// up` passes a node with a `sip_addr`: `sip_sprayer_addr`).
    pub shared_sip_listen: Option<String>,
    /// `--shared-sips-listen` / `PEERLB_SHARED_SIPS_LISTEN`: also listen
    /// for SIPS on this address with SO_REUSEPORT (what `peerlb up`
    /// passes a node with a `sips_addr`: `sips_sprayer_addr`).
    pub shared_sips_listen: Option<String>,
    /// `--tls-cert` / `PEERLB_TLS_CERT` with `--tls-key` /
    /// `PEERLB_TLS_KEY`: serve HTTPS with this certificate and key on every
    /// client listener (what `peerlb up --https` passes), replacing
    /// `[listener.tls]`'s default certificate.
    pub tls_cert: Option<(String, String)>,
}
