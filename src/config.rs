//! `cluster.toml`: the serde model of the file and its validation into a
//! [`NodeConfig`] for one node.
//!
//! Two layers (STYLE.md 6): [`ClusterFile`] mirrors the file exactly
//! (`deny_unknown_fields`, a `Default` per section, a doc per field); then
//! [`ClusterFile::validate`] turns it, plus per-node [`Overrides`] from flags
//! and environment variables, into typed values. Every error names the field
//! path (`nodes[1].peer_addr`) and is reported before any socket is bound;
//! `main` exits with status 64 ([`EXIT_CONFIG`]) on it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::adapters::tls;
use crate::engine::balance::Policy;
use crate::engine::membership::NodeId;
use crate::engine::route::RouterOptions;
use crate::engine::rules::{RuleSpec, Rules};

/// The embedded default `cluster.toml`: a local 3-node cluster on 127.0.0.1
/// with the built-in app, policy consistent-hash and the `user` rules.
pub const DEFAULT_CLUSTER_TOML: &str = include_str!("../cluster.toml");

/// Exit status for an invalid configuration (`EX_USAGE` from sysexits.h).
pub const EXIT_CONFIG: i32 = 64;

/// Largest node weight (`[[nodes]] weight`, `--weight`, and `PUT
/// /_peerlb/weight` at run time): weights are `0..=MAX_WEIGHT`, 100 is one
/// share, 0 receives no keys.
pub const MAX_WEIGHT: u32 = 10_000;

/// A configuration error: the field path and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read. Check the path given to `--config`.
    #[error("{path}: {source}")]
    Read {
        /// The file that could not be read.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not match the model (unknown field,
    /// wrong type). The message carries the line and the field.
    #[error("{origin}: {message}")]
    Parse {
        /// The file name, or `<embedded cluster.toml>`.
        origin: String,
        /// The TOML parser's message, with line and column.
        message: String,
    },
    /// A field has a value that is not allowed. Fix the named field.
    #[error("{origin}: {field}: {message}")]
    Invalid {
        /// The file name, or `<embedded cluster.toml>`.
        origin: String,
        /// The field path, e.g. `nodes[1].peer_addr`.
        field: String,
        /// What is wrong with the value.
        message: String,
    },
}

/// The whole `cluster.toml` as written (the serde model).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
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
    /// The app: `"builtin"` or the `http://host:port` URL of an upstream app.
    #[serde(default = "default_app")]
    pub app: String,
    /// The client-facing address the sprayer exposes; `peerlb up` binds every
    /// node there with SO_REUSEPORT. Optional for multi-machine clusters.
    #[serde(default)]
    pub sprayer_addr: Option<String>,
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
    /// Request limits and timeouts.
    #[serde(default)]
    pub limits: LimitsSection,
    /// Informational response headers.
    #[serde(default)]
    pub headers: HeadersSection,
    /// Gossip (chitchat) parameters.
    #[serde(default)]
    pub gossip: GossipSection,
    /// Peer (QUIC) link parameters.
    #[serde(default)]
    pub peer: PeerSection,
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
pub struct RingSection {
    /// Ring resolution (1..=4096): the ring is a slot table of `256 x vnodes`
    /// slots (rounded up to a power of two) filled by weighted rendezvous
    /// hashing; more slots, finer balance.
    pub vnodes: u32,
}

impl Default for RingSection {
    fn default() -> Self {
        Self {
            vnodes: crate::engine::ring::DEFAULT_VNODES,
        }
    }
}

/// `[balance]`: parameters of the balancing policies.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BalanceSection {
    /// Bounded-load factor `c` for consistent-hash (HAProxy
    /// `hash-balance-factor` / 100): a node at or above `c` x the average
    /// in-flight load is passed over for the next node on the ring. Unset:
    /// no bound. Range 1.0..=1000.0.
    pub hash_balance_factor: Option<f64>,
    /// History proportion `h` of the published load metric (mod_oc4j):
    /// `smoothed = (1 - h) * metric + h * previous`. Range 0.0..1.0 (default 0.3).
    pub metric_history: f64,
    /// In-flight requests at which a node's metric reaches 0 (fully busy), default 100.
    pub metric_capacity: u32,
    /// Mean serve time in ms at which a node's metric reaches 0, default
    /// 1000; 0 leaves latency out of the metric.
    pub metric_latency_limit_ms: u32,
}

impl Default for BalanceSection {
    fn default() -> Self {
        Self {
            hash_balance_factor: None,
            metric_history: 0.3,
            metric_capacity: 100,
            metric_latency_limit_ms: 1000,
        }
    }
}

/// `[tls]`. Paths are relative to the directory of the config file (the
/// current directory for the embedded default).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSection {
    /// Directory holding `ca.pem` and `<node id>.pem` / `<node id>.key`.
    pub dir: String,
    /// The cluster CA certificate; default `<dir>/ca.pem`.
    pub ca: Option<String>,
    /// This node's certificate; default `<dir>/<node id>.pem`.
    pub cert: Option<String>,
    /// This node's private key; default `<dir>/<node id>.key`.
    pub key: Option<String>,
}

impl Default for TlsSection {
    fn default() -> Self {
        Self {
            dir: "certs".to_owned(),
            ca: None,
            cert: None,
            key: None,
        }
    }
}

/// `[limits]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsSection {
    /// Longest request-target accepted, in bytes; longer gets 414 (default 8192).
    pub max_request_target: usize,
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
}

impl Default for LimitsSection {
    fn default() -> Self {
        Self {
            max_request_target: 8192,
            response_timeout_ms: 30_000,
            connect_timeout_ms: 1_000,
            drain_grace_ms: 1_500,
            drain_timeout_ms: 30_000,
            startup_wait_ms: 3_000,
            header_read_timeout_ms: 30_000,
            body_read_timeout_ms: 30_000,
            send_timeout_ms: 60_000,
        }
    }
}

/// `[headers]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HeadersSection {
    /// Add `peerlb-served-by: <node id>` to responses (default true).
    pub served_by: bool,
    /// Add `peerlb-entry: <node id>` to responses (default true).
    pub entry: bool,
}

impl Default for HeadersSection {
    fn default() -> Self {
        Self {
            served_by: true,
            entry: true,
        }
    }
}

/// `[gossip]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct GossipSection {
    /// Gossip round interval, in ms (default 200).
    pub interval_ms: u64,
    /// Phi-accrual threshold above which a member is considered dead (default 8.0).
    pub phi_threshold: f64,
    /// How long a dead member is kept before it is forgotten, in ms (default 3600000).
    pub dead_node_grace_ms: u64,
}

impl Default for GossipSection {
    fn default() -> Self {
        Self {
            interval_ms: 200,
            phi_threshold: 8.0,
            dead_node_grace_ms: 3_600_000,
        }
    }
}

/// `[peer]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PeerSection {
    /// Liveness ping interval on a busy peer connection, in ms (default
    /// 200); must be under `idle_timeout_ms`.
    pub keep_alive_ms: u64,
    /// A busy peer connection silent this long is closed and the peer
    /// ejected, in ms (default 1000); QUIC's idle timeout is 3x this.
    pub idle_timeout_ms: u64,
}

impl Default for PeerSection {
    fn default() -> Self {
        Self {
            keep_alive_ms: 200,
            idle_timeout_ms: 1_000,
        }
    }
}

/// One `[[nodes]]` entry.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// Stable node id (letters, digits, `-`, `_`, `.`; at most 63 bytes).
    pub id: String,
    /// The node's own client HTTP address (`ip:port`).
    pub http_addr: String,
    /// The node's peer QUIC address (`ip:port`, UDP).
    pub peer_addr: String,
    /// The node's gossip address (`ip:port`, UDP).
    pub gossip_addr: String,
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
pub struct Overrides {
    /// `--http-addr` / `PEERLB_HTTP_ADDR`.
    pub http_addr: Option<String>,
    /// `--peer-addr` / `PEERLB_PEER_ADDR`.
    pub peer_addr: Option<String>,
    /// `--gossip-addr` / `PEERLB_GOSSIP_ADDR`.
    pub gossip_addr: Option<String>,
    /// `--weight` / `PEERLB_WEIGHT`.
    pub weight: Option<u32>,
    /// `--app` / `PEERLB_APP`.
    pub app: Option<String>,
    /// `--shared-listen` / `PEERLB_SHARED_LISTEN`: also listen for clients on
    /// this address with SO_REUSEPORT (what `peerlb up` passes).
    pub shared_listen: Option<String>,
}

/// The app a node serves requests with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppKind {
    /// The built-in demo app.
    Builtin,
    /// Proxy to a local upstream application at this `http://` URL.
    Upstream(http::Uri),
}

/// One node's validated view of a node entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddrs {
    /// Node id.
    pub id: NodeId,
    /// Client HTTP address.
    pub http_addr: SocketAddr,
    /// Peer QUIC address.
    pub peer_addr: SocketAddr,
    /// Gossip address.
    pub gossip_addr: SocketAddr,
    /// Weight (100 = one share).
    pub weight: u32,
}

/// Resolved TLS file paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPaths {
    /// Directory of the cluster's certificates.
    pub dir: PathBuf,
    /// CA certificate.
    pub ca: PathBuf,
    /// This node's certificate.
    pub cert: PathBuf,
    /// This node's key.
    pub key: PathBuf,
}

/// Everything one node needs, validated and typed.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Cluster name.
    pub cluster: String,
    /// This node.
    pub node: NodeAddrs,
    /// Every node listed in the file (this one included, with overrides applied).
    pub nodes: Vec<NodeAddrs>,
    /// Extra client listener shared with SO_REUSEPORT, if any.
    pub shared_listen: Option<SocketAddr>,
    /// Gossip seeds.
    pub seeds: Vec<String>,
    /// Balancing policy.
    pub policy: Policy,
    /// Router options (bounded load).
    pub router: RouterOptions,
    /// Metric smoothing history `h`.
    pub metric_history: f64,
    /// In-flight requests at which the metric is 0.
    pub metric_capacity: u32,
    /// Serve time (ms) at which the metric is 0; 0 = ignore latency.
    pub metric_latency_limit_ms: u32,
    /// Where the rules come from, for reloads.
    pub rules_source: RulesSource,
    /// Compiled data-centric rules.
    pub rules: Rules,
    /// The app.
    pub app: AppKind,
    /// Ring resolution (`[ring] vnodes`).
    pub vnodes: u32,
    /// TLS paths.
    pub tls: TlsPaths,
    /// Longest request-target in bytes.
    pub max_request_target: usize,
    /// Wait for an owner's response head.
    pub response_timeout: Duration,
    /// Wait to open a peer stream.
    pub connect_timeout: Duration,
    /// Serve-after-leaving grace on SIGTERM.
    pub drain_grace: Duration,
    /// Longest wait for in-flight requests on SIGTERM.
    pub drain_timeout: Duration,
    /// Longest wait for peer connections before accepting clients.
    pub startup_wait: Duration,
    /// Longest wait for a client's complete request head.
    pub header_read_timeout: Duration,
    /// Longest wait between two reads of a client's request body.
    pub body_read_timeout: Duration,
    /// Longest a write to a client may make no progress.
    pub send_timeout: Duration,
    /// Add `peerlb-served-by`.
    pub header_served_by: bool,
    /// Add `peerlb-entry`.
    pub header_entry: bool,
    /// Gossip interval.
    pub gossip_interval: Duration,
    /// Phi threshold.
    pub phi_threshold: f64,
    /// Dead member retention.
    pub dead_node_grace: Duration,
    /// Liveness ping interval on a busy peer connection.
    pub keep_alive: Duration,
    /// Silence after which a busy peer connection is closed.
    pub idle_timeout: Duration,
}

/// Where a cluster file came from: its path, or the embedded default.
#[derive(Debug, Clone)]
pub struct Source {
    /// Display name used in errors.
    pub origin: String,
    /// Directory relative paths are resolved against.
    pub base_dir: PathBuf,
    /// The file, or `None` for the embedded default.
    pub path: Option<PathBuf>,
    /// The file's text.
    pub text: String,
}

impl Source {
    /// Reads `path`, or takes the embedded default when `path` is `None`.
    ///
    /// # Errors
    /// [`ConfigError::Read`] when the file cannot be read.
    pub fn load(path: Option<&Path>) -> Result<Source, ConfigError> {
        match path {
            None => Ok(Source {
                origin: "<embedded cluster.toml>".to_owned(),
                base_dir: PathBuf::from("."),
                path: None,
                text: DEFAULT_CLUSTER_TOML.to_owned(),
            }),
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.display().to_string(),
                    source,
                })?;
                let base_dir = p
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
                Ok(Source {
                    origin: p.display().to_string(),
                    base_dir,
                    path: Some(p.to_path_buf()),
                    text,
                })
            }
        }
    }

    /// Parses the text into the serde model.
    ///
    /// # Errors
    /// [`ConfigError::Parse`] with the TOML parser's message (line, field).
    pub fn parse(&self) -> Result<ClusterFile, ConfigError> {
        toml::from_str(&self.text).map_err(|e| ConfigError::Parse {
            origin: self.origin.clone(),
            message: e.to_string().trim_end().to_owned(),
        })
    }
}

impl ClusterFile {
    /// Checks the whole file (every node, every rule), independent of which
    /// node will run. Used by `peerlb check-config` and before [`Self::validate`].
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first offending field.
    pub fn check(&self, src: &Source) -> Result<Vec<NodeAddrs>, ConfigError> {
        let inv = |field: &str, message: String| ConfigError::Invalid {
            origin: src.origin.clone(),
            field: field.to_owned(),
            message,
        };
        if self.name.is_empty() {
            return Err(inv("name", "must not be empty".into()));
        }
        parse_policy(&self.policy).map_err(|m| inv("policy", m))?;
        parse_app(&self.app).map_err(|m| inv("app", m))?;
        if let Some(s) = &self.sprayer_addr {
            parse_addr(s).map_err(|m| inv("sprayer_addr", m))?;
        }
        if !(1..=4096).contains(&self.ring.vnodes) {
            return Err(inv(
                "ring.vnodes",
                format!("{} is out of range 1..=4096", self.ring.vnodes),
            ));
        }
        if self.tls.dir.is_empty() {
            return Err(inv("tls.dir", "must not be empty".into()));
        }
        let l = &self.limits;
        // hyper's HTTP/1 parser answers 414 itself past 65534 bytes.
        if !(64..=65_534).contains(&l.max_request_target) {
            return Err(inv(
                "limits.max_request_target",
                format!("{} is out of range 64..=65534", l.max_request_target),
            ));
        }
        for (name, v) in [
            ("limits.response_timeout_ms", l.response_timeout_ms),
            ("limits.connect_timeout_ms", l.connect_timeout_ms),
            ("limits.drain_timeout_ms", l.drain_timeout_ms),
            ("limits.header_read_timeout_ms", l.header_read_timeout_ms),
            ("limits.body_read_timeout_ms", l.body_read_timeout_ms),
            ("limits.send_timeout_ms", l.send_timeout_ms),
            ("gossip.interval_ms", self.gossip.interval_ms),
            ("gossip.dead_node_grace_ms", self.gossip.dead_node_grace_ms),
            ("peer.keep_alive_ms", self.peer.keep_alive_ms),
            ("peer.idle_timeout_ms", self.peer.idle_timeout_ms),
        ] {
            if v == 0 {
                return Err(inv(name, "must be greater than 0".into()));
            }
        }
        if self.peer.keep_alive_ms >= self.peer.idle_timeout_ms {
            return Err(inv(
                "peer.keep_alive_ms",
                format!(
                    "{} must be less than peer.idle_timeout_ms ({})",
                    self.peer.keep_alive_ms, self.peer.idle_timeout_ms
                ),
            ));
        }
        if !(self.gossip.phi_threshold.is_finite() && self.gossip.phi_threshold > 0.0) {
            return Err(inv(
                "gossip.phi_threshold",
                format!("{} must be a positive number", self.gossip.phi_threshold),
            ));
        }
        for (i, s) in self.seeds.iter().enumerate() {
            if s.is_empty() || !s.contains(':') {
                return Err(inv(
                    &format!("seeds[{i}]"),
                    format!("{s:?} is not host:port"),
                ));
            }
        }
        if self.nodes.is_empty() {
            return Err(inv(
                "nodes",
                "at least one [[nodes]] entry is required".into(),
            ));
        }
        let mut out: Vec<NodeAddrs> = Vec::with_capacity(self.nodes.len());
        for (i, n) in self.nodes.iter().enumerate() {
            let f = |k: &str| format!("nodes[{i}].{k}");
            tls::validate_node_id(&n.id).map_err(|e| inv(&f("id"), e.to_string()))?;
            let a = NodeAddrs {
                id: NodeId::from(n.id.as_str()),
                http_addr: parse_addr(&n.http_addr).map_err(|m| inv(&f("http_addr"), m))?,
                peer_addr: parse_addr(&n.peer_addr).map_err(|m| inv(&f("peer_addr"), m))?,
                gossip_addr: parse_addr(&n.gossip_addr).map_err(|m| inv(&f("gossip_addr"), m))?,
                weight: n.weight,
            };
            if n.weight > MAX_WEIGHT {
                return Err(inv(
                    &f("weight"),
                    format!("{} is out of range 0..={MAX_WEIGHT}", n.weight),
                ));
            }
            for (j, prev) in out.iter().enumerate() {
                if prev.id.eq_ignore_ascii_case(&a.id) {
                    return Err(inv(&f("id"), format!("{:?} is also nodes[{j}].id", n.id)));
                }
            }
            if let Some((k, m)) = addr_problem(&a, out.iter().enumerate()) {
                return Err(inv(&f(k), m));
            }
            out.push(a);
        }
        if out.iter().all(|n| n.weight == 0) {
            return Err(inv(
                "nodes",
                "every node has weight 0: no node would receive requests".into(),
            ));
        }
        if let Some(s) = self
            .sprayer_addr
            .as_deref()
            .and_then(|s| parse_addr(s).ok())
            && let Some(i) = out.iter().position(|n| n.http_addr == s)
        {
            return Err(inv(
                "sprayer_addr",
                format!("{s} is also nodes[{i}].http_addr; the shared address must be its own"),
            ));
        }
        let b = &self.balance;
        if let Some(c) = b.hash_balance_factor
            && !(1.0..=1000.0).contains(&c)
        {
            return Err(inv(
                "balance.hash_balance_factor",
                format!("{c} is out of range 1.0..=1000.0"),
            ));
        }
        if !(0.0..1.0).contains(&b.metric_history) {
            return Err(inv(
                "balance.metric_history",
                format!("{} is out of range 0.0..1.0", b.metric_history),
            ));
        }
        if b.metric_capacity == 0 {
            return Err(inv(
                "balance.metric_capacity",
                "must be greater than 0".into(),
            ));
        }
        self.rules_source(src)?.load().map_err(|e| match e {
            // A rules file that cannot be read is the `rules_file` field's fault.
            ConfigError::Read { path, source } if self.rules_file.is_some() => {
                inv("rules_file", format!("{path}: {source}"))
            }
            e => e,
        })?;
        Ok(out)
    }

    /// Validates the file for node `node_id` with `overrides` applied.
    /// A node id not listed in the file is accepted when the overrides give
    /// all three of its addresses (a node joining a running cluster).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first offending field (or flag).
    pub fn validate(
        &self,
        src: &Source,
        node_id: &str,
        ov: &Overrides,
    ) -> Result<NodeConfig, ConfigError> {
        let inv = |field: &str, message: String| ConfigError::Invalid {
            origin: src.origin.clone(),
            field: field.to_owned(),
            message,
        };
        let mut nodes = self.check(src)?;
        tls::validate_node_id(node_id).map_err(|e| inv("--node", e.to_string()))?;
        let pos = nodes.iter().position(|n| &*n.id == node_id);
        let addr_flag =
            |flag: &str, v: &Option<String>| -> Result<Option<SocketAddr>, ConfigError> {
                v.as_deref()
                    .map(|s| parse_addr(s).map_err(|m| inv(flag, m)))
                    .transpose()
            };
        let http = addr_flag("--http-addr", &ov.http_addr)?;
        let peer = addr_flag("--peer-addr", &ov.peer_addr)?;
        let gossip = addr_flag("--gossip-addr", &ov.gossip_addr)?;
        let me = match pos {
            Some(i) => {
                let n = &mut nodes[i];
                n.http_addr = http.unwrap_or(n.http_addr);
                n.peer_addr = peer.unwrap_or(n.peer_addr);
                n.gossip_addr = gossip.unwrap_or(n.gossip_addr);
                n.weight = ov.weight.unwrap_or(n.weight);
                n.clone()
            }
            None => {
                let (Some(http_addr), Some(peer_addr), Some(gossip_addr)) = (http, peer, gossip)
                else {
                    let known: Vec<&str> = nodes.iter().map(|n| &*n.id).collect();
                    return Err(inv(
                        "--node",
                        format!(
                            "{node_id:?} is not in [[nodes]] (known: {}); a new node needs \
                             --http-addr, --peer-addr and --gossip-addr",
                            known.join(", ")
                        ),
                    ));
                };
                let n = NodeAddrs {
                    id: NodeId::from(node_id),
                    http_addr,
                    peer_addr,
                    gossip_addr,
                    weight: ov.weight.unwrap_or(100),
                };
                nodes.push(n.clone());
                n
            }
        };
        // The flags get the same address rules as the file.
        if http.is_some() || peer.is_some() || gossip.is_some() {
            let others = nodes.iter().enumerate().filter(|(_, n)| n.id != me.id);
            if let Some((k, m)) = addr_problem(&me, others) {
                // Name the flag when this node's value came from one.
                let flag = match k {
                    "http_addr" if http.is_some() => "--http-addr",
                    "peer_addr" if peer.is_some() => "--peer-addr",
                    "gossip_addr" if gossip.is_some() => "--gossip-addr",
                    // gossip_addr == peer_addr: the one that was overridden.
                    "gossip_addr" if peer.is_some() => "--peer-addr",
                    _ => "--node",
                };
                return Err(inv(flag, format!("{m} (this node's {k})")));
            }
        }
        if me.weight > MAX_WEIGHT {
            return Err(inv(
                "--weight",
                format!("{} is out of range 0..={MAX_WEIGHT}", me.weight),
            ));
        }
        let app = parse_app(ov.app.as_deref().unwrap_or(&self.app))
            .map_err(|m| inv(if ov.app.is_some() { "--app" } else { "app" }, m))?;
        let shared_listen = addr_flag("--shared-listen", &ov.shared_listen)?;
        if shared_listen == Some(me.http_addr) {
            return Err(inv(
                "--shared-listen",
                format!("{} is this node's http_addr", me.http_addr),
            ));
        }
        let seeds = if self.seeds.is_empty() {
            nodes
                .iter()
                .filter(|n| n.id != me.id)
                .map(|n| n.gossip_addr.to_string())
                .collect()
        } else {
            self.seeds.clone()
        };
        let dir = src.base_dir.join(&self.tls.dir);
        let path_or = |p: &Option<String>, default: PathBuf| {
            p.as_ref().map_or(default, |p| src.base_dir.join(p))
        };
        let tls = TlsPaths {
            ca: path_or(&self.tls.ca, dir.join("ca.pem")),
            cert: path_or(&self.tls.cert, dir.join(format!("{node_id}.pem"))),
            key: path_or(&self.tls.key, dir.join(format!("{node_id}.key"))),
            dir,
        };
        let ms = Duration::from_millis;
        Ok(NodeConfig {
            cluster: self.name.clone(),
            node: me,
            nodes,
            shared_listen,
            seeds,
            policy: parse_policy(&self.policy).map_err(|m| inv("policy", m))?,
            rules: self.rules_source(src)?.load()?,
            rules_source: self.rules_source(src)?,
            router: RouterOptions {
                hash_balance_factor: self.balance.hash_balance_factor,
            },
            metric_history: self.balance.metric_history,
            metric_capacity: self.balance.metric_capacity,
            metric_latency_limit_ms: self.balance.metric_latency_limit_ms,
            app,
            vnodes: self.ring.vnodes,
            tls,
            max_request_target: self.limits.max_request_target,
            response_timeout: ms(self.limits.response_timeout_ms),
            connect_timeout: ms(self.limits.connect_timeout_ms),
            drain_grace: ms(self.limits.drain_grace_ms),
            drain_timeout: ms(self.limits.drain_timeout_ms),
            startup_wait: ms(self.limits.startup_wait_ms),
            header_read_timeout: ms(self.limits.header_read_timeout_ms),
            body_read_timeout: ms(self.limits.body_read_timeout_ms),
            send_timeout: ms(self.limits.send_timeout_ms),
            header_served_by: self.headers.served_by,
            header_entry: self.headers.entry,
            gossip_interval: ms(self.gossip.interval_ms),
            phi_threshold: self.gossip.phi_threshold,
            dead_node_grace: ms(self.gossip.dead_node_grace_ms),
            keep_alive: ms(self.peer.keep_alive_ms),
            idle_timeout: ms(self.peer.idle_timeout_ms),
        })
    }
}

/// Where a node's data-centric rules come from, so they can be reloaded.
#[derive(Debug, Clone)]
pub enum RulesSource {
    /// `[[rules]]` of a config text that is not a file (the embedded
    /// default): cannot change.
    Inline(Box<Source>),
    /// `[[rules]]` of this cluster file.
    Toml(PathBuf),
    /// A SailFin `data-centric-rules.xml` (`rules_file`).
    Xml(PathBuf),
}

impl ClusterFile {
    fn rules_source(&self, src: &Source) -> Result<RulesSource, ConfigError> {
        match (&self.rules_file, src.path.as_ref()) {
            (Some(_), _) if !self.rules.is_empty() => Err(ConfigError::Invalid {
                origin: src.origin.clone(),
                field: "rules_file".into(),
                message: "give either rules_file or [[rules]], not both".into(),
            }),
            (Some(f), _) => Ok(RulesSource::Xml(src.base_dir.join(f))),
            (None, Some(p)) => Ok(RulesSource::Toml(p.clone())),
            (None, None) => Ok(RulesSource::Inline(Box::new(src.clone()))),
        }
    }
}

impl RulesSource {
    /// Reads and compiles the rules (again).
    ///
    /// # Errors
    /// [`ConfigError`] naming the file and the rule or element at fault.
    pub fn load(&self) -> Result<Rules, ConfigError> {
        match self {
            RulesSource::Inline(s) => {
                Rules::compile(&s.parse()?.rules).map_err(|e| rule_error(s, e))
            }
            RulesSource::Toml(p) => {
                let s = Source::load(Some(p))?;
                Rules::compile(&s.parse()?.rules).map_err(|e| rule_error(&s, e))
            }
            RulesSource::Xml(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.display().to_string(),
                    source,
                })?;
                Rules::from_xml(&text).map_err(|e| ConfigError::Invalid {
                    origin: p.display().to_string(),
                    field: e.path.clone(),
                    message: e.kind.to_string(),
                })
            }
        }
    }

    /// The file to watch for changes, if any.
    pub fn file(&self) -> Option<&Path> {
        match self {
            RulesSource::Inline(_) => None,
            RulesSource::Toml(p) | RulesSource::Xml(p) => Some(p),
        }
    }
}

fn rule_error(src: &Source, e: crate::engine::rules::RuleError) -> ConfigError {
    ConfigError::Invalid {
        origin: src.origin.clone(),
        message: match &e.rule {
            Some(name) => format!("{} (rule {name:?})", e.kind),
            None => e.kind.to_string(),
        },
        field: e.path,
    }
}

fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>()
        .map_err(|_| format!("{s:?} is not an ip:port socket address"))
}

fn parse_policy(s: &str) -> Result<Policy, String> {
    s.parse::<Policy>().map_err(|e| format!("{s:?}: {e}"))
}

fn parse_app(s: &str) -> Result<AppKind, String> {
    if s == "builtin" {
        return Ok(AppKind::Builtin);
    }
    let uri: http::Uri = s
        .parse()
        .map_err(|_| format!("{s:?} is neither \"builtin\" nor an http:// URL"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(format!(
            "{s:?} is neither \"builtin\" nor an http://host:port URL (https upstreams are not supported)"
        ));
    }
    Ok(AppKind::Upstream(uri))
}

/// The address rules one node must keep, alone and against `others`
/// (index in `[[nodes]]`, node): every port advertisable, peer and gossip
/// addresses dialable (not 0.0.0.0 or ::), its two UDP addresses apart, its
/// TCP address apart from every other TCP address and its UDP addresses
/// from every other UDP address. The first broken rule: (field, message).
fn addr_problem<'a>(
    a: &NodeAddrs,
    others: impl IntoIterator<Item = (usize, &'a NodeAddrs)>,
) -> Option<(&'static str, String)> {
    for (k, addr) in [
        ("http_addr", a.http_addr),
        ("peer_addr", a.peer_addr),
        ("gossip_addr", a.gossip_addr),
    ] {
        if addr.port() == 0 {
            return Some((k, format!("{addr}: port 0 cannot be advertised to peers")));
        }
    }
    for (k, addr) in [("peer_addr", a.peer_addr), ("gossip_addr", a.gossip_addr)] {
        if addr.ip().is_unspecified() {
            return Some((
                k,
                format!(
                    "{addr}: peers dial this address; give the node's own IP, not 0.0.0.0 or ::"
                ),
            ));
        }
    }
    if a.peer_addr == a.gossip_addr {
        return Some((
            "gossip_addr",
            format!(
                "{} is also this node's peer_addr (both are UDP)",
                a.gossip_addr
            ),
        ));
    }
    for (j, other) in others {
        for (k, mine, theirs) in [
            ("http_addr", a.http_addr, other.http_addr),
            ("peer_addr", a.peer_addr, other.peer_addr),
            ("peer_addr", a.peer_addr, other.gossip_addr),
            ("gossip_addr", a.gossip_addr, other.gossip_addr),
            ("gossip_addr", a.gossip_addr, other.peer_addr),
        ] {
            if mine == theirs {
                return Some((k, format!("{mine} is also used by nodes[{j}]")));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(text: &str) -> Source {
        Source {
            origin: "test.toml".into(),
            base_dir: PathBuf::from("/etc/peerlb"),
            path: None,
            text: text.into(),
        }
    }

    fn validate(text: &str, node: &str) -> Result<NodeConfig, ConfigError> {
        let s = src(text);
        s.parse()?.validate(&s, node, &Overrides::default())
    }

    #[test]
    fn embedded_default_is_valid_three_nodes_on_loopback() {
        let s = Source::load(None).unwrap();
        let c = s
            .parse()
            .unwrap()
            .validate(&s, "n2", &Overrides::default())
            .unwrap();
        assert_eq!(c.nodes.len(), 3);
        assert_eq!(&*c.node.id, "n2");
        assert_eq!(c.node.http_addr, "127.0.0.1:8082".parse().unwrap());
        assert_eq!(
            c.policy,
            Policy::from(crate::engine::balance::PolicyKind::ConsistentHash)
        );
        assert_eq!(c.app, AppKind::Builtin);
        assert_eq!(c.max_request_target, 8192);
        assert_eq!(c.seeds, vec!["127.0.0.1:7181", "127.0.0.1:7183"]);
        assert_eq!(c.tls.cert, PathBuf::from("./certs/n2.pem"));
        assert!(!c.rules.is_empty());
        let f = s.parse().unwrap();
        assert_eq!(f.sprayer_addr.as_deref(), Some("127.0.0.1:8080"));
    }

    #[test]
    fn unknown_field_is_named() {
        let e = validate("name = \"x\"\nbogus = 1\n", "n1").unwrap_err();
        assert!(matches!(e, ConfigError::Parse { .. }));
        assert!(e.to_string().contains("bogus"), "{e}");
    }

    const ONE: &str = "[[nodes]]\nid = \"n1\"\nhttp_addr = \"127.0.0.1:1\"\npeer_addr = \"127.0.0.1:2\"\ngossip_addr = \"127.0.0.1:3\"\n";

    #[test]
    fn bad_address_names_the_field_path() {
        let text = format!(
            "{ONE}[[nodes]]\nid = \"n2\"\nhttp_addr = \"127.0.0.1:4\"\npeer_addr = \"nowhere\"\ngossip_addr = \"127.0.0.1:6\"\n"
        );
        let e = validate(&text, "n1").unwrap_err().to_string();
        assert!(e.starts_with("test.toml: nodes[1].peer_addr: "), "{e}");
    }

    #[test]
    fn duplicate_ids_and_addresses_are_refused() {
        let dup = format!("{ONE}{ONE}");
        let e = validate(&dup, "n1").unwrap_err().to_string();
        assert!(e.contains("nodes[1].id"), "{e}");
        let clash = format!(
            "{ONE}[[nodes]]\nid = \"n2\"\nhttp_addr = \"127.0.0.1:4\"\npeer_addr = \"127.0.0.1:2\"\ngossip_addr = \"127.0.0.1:6\"\n"
        );
        let e = validate(&clash, "n1").unwrap_err().to_string();
        assert!(e.contains("nodes[1].peer_addr"), "{e}");
    }

    #[test]
    fn bad_policy_app_vnodes_and_timeouts_are_named() {
        for (text, field) in [
            (format!("policy = \"fastest\"\n{ONE}"), "policy"),
            (format!("app = \"ftp://x\"\n{ONE}"), "app"),
            (format!("[ring]\nvnodes = 0\n{ONE}"), "ring.vnodes"),
            (
                format!("[peer]\nkeep_alive_ms = 2000\nidle_timeout_ms = 1000\n{ONE}"),
                "peer.keep_alive_ms",
            ),
            (
                format!("[limits]\nresponse_timeout_ms = 0\n{ONE}"),
                "limits.response_timeout_ms",
            ),
            (
                format!("[limits]\nbody_read_timeout_ms = 0\n{ONE}"),
                "limits.body_read_timeout_ms",
            ),
            (String::new(), "nodes"),
        ] {
            let e = validate(&text, "n1").unwrap_err().to_string();
            assert!(e.contains(&format!(": {field}: ")), "{field}: {e}");
        }
    }

    #[test]
    fn policies_with_local_affinity_and_balance_ranges() {
        let c = validate(&format!("policy = \"least-load:local\"\n{ONE}"), "n1").unwrap();
        assert_eq!(c.policy.to_string(), "least-load:local");
        for (text, field) in [
            (
                format!("policy = \"consistent-hash:local\"\n{ONE}"),
                "policy",
            ),
            (
                format!("[balance]\nhash_balance_factor = 0.5\n{ONE}"),
                "balance.hash_balance_factor",
            ),
            (
                format!("[balance]\nmetric_history = 1.0\n{ONE}"),
                "balance.metric_history",
            ),
            (
                format!("[balance]\nmetric_capacity = 0\n{ONE}"),
                "balance.metric_capacity",
            ),
            (
                format!(
                    "rules_file = \"r.xml\"\n{ONE}[[rules]]\nextract = [{{ query = \"u\" }}]\n"
                ),
                "rules_file",
            ),
        ] {
            let e = validate(&text, "n1").unwrap_err().to_string();
            assert!(e.contains(&format!(": {field}: ")), "{field}: {e}");
        }
        let c = validate(
            &format!("[balance]\nhash_balance_factor = 1.25\n{ONE}"),
            "n1",
        )
        .unwrap();
        assert_eq!(c.router.hash_balance_factor, Some(1.25));
    }

    #[test]
    fn a_missing_rules_file_names_the_file() {
        let e = validate(&format!("rules_file = \"nope.xml\"\n{ONE}"), "n1")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("test.toml: rules_file: /etc/peerlb/nope.xml: "),
            "{e}"
        );
    }

    #[test]
    fn addresses_that_cannot_work_are_refused() {
        let node = |i: u32, http: &str, peer: &str, gossip: &str| {
            format!(
                "[[nodes]]\nid = \"n{i}\"\nhttp_addr = \"{http}\"\npeer_addr = \"{peer}\"\ngossip_addr = \"{gossip}\"\n"
            )
        };
        for (text, field) in [
            (
                node(1, "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:2"),
                "nodes[0].gossip_addr",
            ),
            (
                node(1, "127.0.0.1:1", "127.0.0.1:0", "127.0.0.1:3"),
                "nodes[0].peer_addr",
            ),
            (
                node(1, "127.0.0.1:1", "0.0.0.0:2", "127.0.0.1:3"),
                "nodes[0].peer_addr",
            ),
            (
                node(1, "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")
                    + &node(2, "127.0.0.1:4", "127.0.0.1:3", "127.0.0.1:6"),
                "nodes[1].peer_addr",
            ),
            (
                format!("sprayer_addr = \"127.0.0.1:1\"\n{ONE}"),
                "sprayer_addr",
            ),
            (
                ONE.replace(
                    "gossip_addr = \"127.0.0.1:3\"",
                    "gossip_addr = \"127.0.0.1:3\"\nweight = 0",
                ),
                "nodes",
            ),
        ] {
            let e = validate(&text, "n1").unwrap_err().to_string();
            assert!(e.contains(&format!(": {field}: ")), "{field}: {e}");
        }
    }

    #[test]
    fn bad_rule_is_reported_under_rules() {
        let text = format!("{ONE}[[rules]]\nextract = [{{ path_regex = \"(\" }}]\n");
        let e = validate(&text, "n1").unwrap_err().to_string();
        assert!(
            e.starts_with("test.toml: rules[0].extract[0].path_regex: "),
            "{e}"
        );
    }

    #[test]
    fn unknown_node_needs_all_addresses() {
        let e = validate(ONE, "n9").unwrap_err().to_string();
        assert!(e.contains("--node") && e.contains("n1"), "{e}");
        let s = src(ONE);
        let ov = Overrides {
            http_addr: Some("127.0.0.1:11".into()),
            peer_addr: Some("127.0.0.1:12".into()),
            gossip_addr: Some("127.0.0.1:13".into()),
            weight: Some(50),
            ..Overrides::default()
        };
        let c = s.parse().unwrap().validate(&s, "n9", &ov).unwrap();
        assert_eq!(c.nodes.len(), 2);
        assert_eq!(c.node.weight, 50);
        assert_eq!(c.seeds, vec!["127.0.0.1:3"]);
    }

    #[test]
    fn overrides_replace_per_node_values() {
        let s = src(ONE);
        let ov = Overrides {
            http_addr: Some("127.0.0.1:9999".into()),
            app: Some("http://127.0.0.1:9000".into()),
            ..Overrides::default()
        };
        let c = s.parse().unwrap().validate(&s, "n1", &ov).unwrap();
        assert_eq!(c.node.http_addr, "127.0.0.1:9999".parse().unwrap());
        assert_eq!(c.nodes[0].http_addr, c.node.http_addr);
        assert!(matches!(c.app, AppKind::Upstream(_)));
        let bad = Overrides {
            gossip_addr: Some("x".into()),
            ..Overrides::default()
        };
        let e = s
            .parse()
            .unwrap()
            .validate(&s, "n1", &bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--gossip-addr"), "{e}");
    }

    #[test]
    fn address_flags_keep_the_file_rules() {
        let two = format!(
            "{ONE}[[nodes]]\nid = \"n2\"\nhttp_addr = \"127.0.0.1:4\"\npeer_addr = \"127.0.0.1:5\"\ngossip_addr = \"127.0.0.1:6\"\n"
        );
        let s = src(&two);
        let file = s.parse().unwrap();
        let flag = |http: Option<&str>, peer: Option<&str>, gossip: Option<&str>| Overrides {
            http_addr: http.map(Into::into),
            peer_addr: peer.map(Into::into),
            gossip_addr: gossip.map(Into::into),
            ..Overrides::default()
        };
        for (ov, node, field, says) in [
            (
                flag(Some("127.0.0.1:0"), None, None),
                "n1",
                "--http-addr",
                "port 0",
            ),
            (
                flag(None, Some("0.0.0.0:7"), None),
                "n1",
                "--peer-addr",
                "0.0.0.0",
            ),
            (
                flag(None, None, Some("127.0.0.1:0")),
                "n1",
                "--gossip-addr",
                "port 0",
            ),
            (
                flag(Some("127.0.0.1:4"), None, None),
                "n1",
                "--http-addr",
                "nodes[1]",
            ),
            (
                flag(None, Some("127.0.0.1:3"), None),
                "n1",
                "--peer-addr",
                "peer_addr",
            ),
            (
                flag(None, Some("127.0.0.1:6"), None),
                "n1",
                "--peer-addr",
                "nodes[1]",
            ),
            // A node joining with all three flags gets the same rules.
            (
                flag(
                    Some("127.0.0.1:8"),
                    Some("127.0.0.1:5"),
                    Some("127.0.0.1:9"),
                ),
                "n3",
                "--peer-addr",
                "nodes[1]",
            ),
        ] {
            let e = file.validate(&s, node, &ov).unwrap_err().to_string();
            assert!(
                e.contains(&format!(": {field}: ")) && e.contains(says),
                "{field}: {e}"
            );
        }
        // Values that keep the rules still pass.
        let ok = flag(
            Some("127.0.0.1:7"),
            Some("127.0.0.1:8"),
            Some("127.0.0.1:9"),
        );
        file.validate(&s, "n1", &ok).unwrap();
        file.validate(&s, "n3", &ok).unwrap();
    }

    #[test]
    fn tls_paths_are_relative_to_the_config_file() {
        let c = validate(ONE, "n1").unwrap();
        assert_eq!(c.tls.ca, PathBuf::from("/etc/peerlb/certs/ca.pem"));
        assert_eq!(c.tls.key, PathBuf::from("/etc/peerlb/certs/n1.key"));
    }
}
