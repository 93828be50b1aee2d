//! Scenario files (`simulations/*.toml`): the cluster, the traffic, the
//! fault script and the invariants a run must hold. See
//! `simulations/README.md` for the format.

use std::path::Path;

use serde::Deserialize;

/// One scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name (defaults to the file stem).
    #[serde(default)]
    pub name: String,
    /// What it shows.
    #[serde(default)]
    pub description: String,
    /// Nodes started at time zero: `n1` ..= `n<nodes>`.
    pub nodes: usize,
    /// Nodes that exist in the cluster file but start only on a `join`
    /// fault: `n<nodes+1>` ...
    #[serde(default)]
    pub spare_nodes: usize,
    /// The `nodes` start one after another over this many virtual seconds
    /// (`n<i>` at `(i - 1) x start_spread_s / nodes`), not all at time
    /// zero: a large cluster's start-up handshakes then do not all hold a
    /// connection at once (default 0).
    #[serde(default)]
    pub start_spread_s: f64,
    /// Virtual seconds the run lasts.
    pub duration_s: f64,
    /// Seeds `cargo test` runs this scenario with.
    #[serde(default = "default_seeds")]
    pub seeds: Vec<u64>,
    /// Short enough for CI's many-seed sweep.
    #[serde(default)]
    pub short: bool,
    /// Seeds CI's sweep runs a `short` scenario with, when fewer than its
    /// default (a large cluster, whose seed costs many small ones'):
    /// `.ci/run` reads this line.
    #[serde(default)]
    pub sweep_seeds: Option<u32>,
    /// Extra `cluster.toml` text (top-level keys and sections such as
    /// `policy`, `[gossip]`, `[peer]`, `[limits]`); the harness appends the
    /// `[[nodes]]` and, unless given here, the default `user` rules.
    #[serde(default)]
    pub cluster: String,
    /// Simulated network.
    #[serde(default)]
    pub network: Network,
    /// Client traffic.
    #[serde(default)]
    pub traffic: Vec<Traffic>,
    /// The fault script, in time order.
    #[serde(default, rename = "fault")]
    pub faults: Vec<Fault>,
    /// Invariants beyond the ones every run checks.
    #[serde(default)]
    pub expect: Expect,
}

fn default_seeds() -> Vec<u64> {
    vec![1, 2]
}

/// `[network]`: turmoil's link model.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Network {
    /// Smallest one-way message latency, ms.
    pub min_latency_ms: u64,
    /// Largest one-way message latency, ms.
    pub max_latency_ms: u64,
    /// Simulation step, ms (message delivery granularity).
    pub tick_ms: u64,
}

impl Default for Network {
    fn default() -> Self {
        Network {
            min_latency_ms: 1,
            max_latency_ms: 3,
            tick_ms: 1,
        }
    }
}

/// Key distribution of a traffic source.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Keys {
    /// Uniform over `key_count` keys.
    Uniform,
    /// Zipf over `key_count` keys with exponent `zipf_s`.
    Zipf,
}

/// One `[[traffic]]` source: `clients` client hosts, each sending `rate`
/// requests per virtual second (Poisson arrivals) between `start_s` and
/// `stop_s` to an entry node the sprayer picks among the ready nodes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Traffic {
    /// Client hosts.
    #[serde(default = "one")]
    pub clients: usize,
    /// Requests per second per client.
    pub rate: f64,
    /// Start, virtual s.
    #[serde(default)]
    pub start_s: f64,
    /// Stop, virtual s.
    pub stop_s: f64,
    /// Key distribution.
    #[serde(default = "uniform")]
    pub keys: Keys,
    /// Distinct keys.
    #[serde(default = "thousand")]
    pub key_count: usize,
    /// Zipf exponent.
    #[serde(default = "zipf_s")]
    pub zipf_s: f64,
    /// A hot key and the fraction of requests that carry it.
    #[serde(default)]
    pub hot_key: Option<String>,
    /// Fraction of requests for `hot_key`.
    #[serde(default)]
    pub hot_fraction: f64,
    /// HTTP method (`GET` is retried on failover; `POST` is not).
    #[serde(default = "get")]
    pub method: String,
    /// App delay per request, ms (the built-in app's `/delay/<ms>`).
    #[serde(default)]
    pub delay_ms: u64,
    /// Sticky sessions each client holds (0: none, plain keyed requests).
    /// With `sessions = N` a client runs N sessions, each a user sending
    /// one request at a time (Poisson, `rate / N` per second per session):
    /// the first starts the session (`/session`, the built-in app sets a
    /// `session` cookie, the node its `peerlb-route` cookie); the client
    /// keeps the cookies each response sets and sends them back, so its
    /// requests carry the sticky route. `keys`, `key_count` and `hot_key`
    /// do not apply. Needs a sticky policy in `cluster`
    /// (`sticky-round-robin`, or `consistent-hash` with no `[[rules]]`).
    #[serde(default)]
    pub sessions: usize,
}

fn one() -> usize {
    1
}
fn uniform() -> Keys {
    Keys::Uniform
}
fn thousand() -> usize {
    1000
}
fn zipf_s() -> f64 {
    1.1
}
fn get() -> String {
    "GET".to_owned()
}

/// One `[[fault]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// When, virtual s.
    pub at_s: f64,
    /// What.
    pub action: Action,
    /// The node (`n3`), or `owner:<key>` for the node that last served
    /// that key (a session id such as `c1-s0`: the node holding that
    /// session), else its owner on the ring of the ready nodes.
    #[serde(default)]
    pub node: Option<String>,
    /// One side of a partition or link change (node ids).
    #[serde(default)]
    pub a: Vec<String>,
    /// The other side.
    #[serde(default)]
    pub b: Vec<String>,
    /// Latency for `latency`, ms.
    #[serde(default)]
    pub ms: u64,
    /// Loss rate for `loss`, 0..=1.
    #[serde(default)]
    pub rate: f64,
    /// For `slow`: the node's app works this many times slower (1: normal).
    #[serde(default = "twenty")]
    pub factor: u32,
    /// For `weight`: the node's new weight, `0..=MAX_WEIGHT`
    /// ([`crate::config::MAX_WEIGHT`]; 100 is one share).
    #[serde(default)]
    pub value: Option<u32>,
}

fn twenty() -> u32 {
    20
}

/// Fault kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Crash the node (kill -9): its sockets vanish.
    Kill,
    /// Start a killed or drained node again: same node id, new generation.
    Restart,
    /// SIGTERM: the node drains and leaves.
    Drain,
    /// Start a spare node.
    Join,
    /// Drop every message between `a` and `b`, both ways.
    Partition,
    /// Drop messages from `a` to `b` only.
    PartitionOneway,
    /// Undo every partition.
    Heal,
    /// Fixed latency `ms` on links between `a` and `b`.
    Latency,
    /// Message loss `rate` on links between `a` and `b`.
    Loss,
    /// The node's app works `factor` times slower (`/delay` requests).
    Slow,
    /// The node publishes weight `value`: `PUT /_peerlb/weight` on its
    /// own host (the admin API answers loopback only), as an operator would.
    Weight,
}

/// `[expect]`: invariants and limits of a scenario.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Expect {
    /// Most requests allowed to fail (5xx or a broken connection to a
    /// ready entry node). Requests whose entry node itself was killed
    /// under them are counted apart (`entry_lost`): the sprayer's loss; so
    /// are POSTs whose owner was killed under them or before every ring
    /// dropped it (`post_lost`: never replayed, they may have reached it).
    pub max_failed: u64,
    /// After the last fault, every ready node's ring must agree with every
    /// other and hold exactly the ready nodes within this many virtual s.
    pub converge_within_s: f64,
    /// Every killed node must leave every live node's ring within this
    /// many virtual s.
    pub eject_within_s: f64,
    /// Requests that must have been served (sanity: the traffic ran).
    pub min_served: u64,
    /// After each `weight` fault, once the rings agree: the largest allowed
    /// difference between the reweighted node's share of the requests
    /// served (until the next fault or the end) and its share of those
    /// requests' keys on the ring the engine builds with the new weights.
    pub share_tolerance: f64,
    /// Bounded load in total: the busiest node served at most this many
    /// times the mean of the requests served per node. Unset: not checked.
    pub served_factor: Option<f64>,
    /// Bounded load at every instant: with `inflight_factor = c`, the
    /// requests in flight at each serving node are sampled every
    /// `inflight_sample_ms` while traffic runs (from 1 s after the first
    /// source starts to the last one's stop), and the samples in which the
    /// busiest node's count passes `c x mean + 1` (mean: all in flight
    /// over the nodes) are counted (`Figures::inflight_over`, in the
    /// summary). A request is in flight at the node named in its
    /// `peerlb-served-by` from the app's call to the answer's arrival at
    /// the client less the way there. Unset: not measured.
    pub inflight_factor: Option<f64>,
    /// The sampling period of `inflight_factor`, ms (default 50).
    pub inflight_sample_ms: u64,
    /// The largest fraction of samples allowed over the bound; unset:
    /// measured and reported, not checked.
    pub inflight_over_max: Option<f64>,
}

impl Default for Expect {
    fn default() -> Self {
        Expect {
            max_failed: 0,
            converge_within_s: 10.0,
            eject_within_s: 5.0,
            min_served: 1,
            share_tolerance: 0.03,
            served_factor: None,
            inflight_factor: None,
            inflight_sample_ms: 50,
            inflight_over_max: None,
        }
    }
}

impl Scenario {
    /// Reads and checks a scenario file.
    ///
    /// # Errors
    /// The file cannot be read, is not valid TOML for this model, or names
    /// an unknown node or an impossible time.
    pub fn load(path: &Path) -> anyhow::Result<Scenario> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let stem = path
            .file_stem()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        Scenario::parse(&text, &stem).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// Parses and checks a scenario's text; `name` is used when the text
    /// names none.
    ///
    /// # Errors
    /// As [`Scenario::load`], without the file's path.
    pub fn parse(text: &str, name: &str) -> anyhow::Result<Scenario> {
        let mut s: Scenario = toml::from_str(text)?;
        if s.name.is_empty() {
            s.name = name.to_owned();
        }
        s.check()?;
        Ok(s)
    }

    /// Node ids: started ones first, then spares.
    pub fn node_ids(&self) -> Vec<String> {
        (1..=self.nodes + self.spare_nodes)
            .map(|i| format!("n{i}"))
            .collect()
    }

    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.nodes >= 1, "nodes must be at least 1");
        anyhow::ensure!(self.duration_s > 0.0, "duration_s must be positive");
        anyhow::ensure!(
            self.start_spread_s >= 0.0 && self.start_spread_s < self.duration_s,
            "start_spread_s must be in 0..duration_s"
        );
        anyhow::ensure!(
            self.network.tick_ms >= 1,
            "network.tick_ms must be at least 1"
        );
        anyhow::ensure!(
            self.network.min_latency_ms <= self.network.max_latency_ms,
            "network.min_latency_ms exceeds max_latency_ms"
        );
        let ids = self.node_ids();
        let known = |n: &str| ids.iter().any(|i| i == n);
        let mut last = 0.0;
        for (i, f) in self.faults.iter().enumerate() {
            anyhow::ensure!(
                f.at_s >= last && f.at_s < self.duration_s,
                "fault[{i}].at_s must be in time order and inside the run"
            );
            last = f.at_s;
            if let Some(n) = &f.node {
                anyhow::ensure!(
                    known(n) || n.starts_with("owner:"),
                    "fault[{i}].node {n:?} is not a node of this scenario"
                );
            }
            for n in f.a.iter().chain(&f.b) {
                anyhow::ensure!(known(n), "fault[{i}]: {n:?} is not a node of this scenario");
            }
            let needs_node = matches!(
                f.action,
                Action::Kill
                    | Action::Restart
                    | Action::Drain
                    | Action::Join
                    | Action::Slow
                    | Action::Weight
            );
            anyhow::ensure!(
                !needs_node || f.node.is_some(),
                "fault[{i}]: {:?} needs `node`",
                f.action
            );
            match (f.action, f.value) {
                (Action::Weight, None) => {
                    anyhow::bail!("fault[{i}]: weight needs `value` (the new weight)")
                }
                (Action::Weight, Some(v)) => anyhow::ensure!(
                    v <= crate::config::MAX_WEIGHT,
                    "fault[{i}].value {v} is out of range 0..={}",
                    crate::config::MAX_WEIGHT
                ),
                (_, Some(_)) => anyhow::bail!("fault[{i}]: `value` applies to weight only"),
                (_, None) => {}
            }
        }
        for (i, t) in self.traffic.iter().enumerate() {
            anyhow::ensure!(t.rate > 0.0, "traffic[{i}].rate must be positive");
            anyhow::ensure!(
                t.key_count >= 1,
                "traffic[{i}].key_count must be at least 1"
            );
            anyhow::ensure!(
                t.start_s < t.stop_s && t.stop_s <= self.duration_s,
                "traffic[{i}]: start_s < stop_s <= duration_s"
            );
            anyhow::ensure!(
                t.method == "GET" || t.method == "POST",
                "traffic[{i}].method must be GET or POST"
            );
            anyhow::ensure!(
                t.sessions == 0 || t.hot_key.is_none(),
                "traffic[{i}]: hot_key does not apply to sessions"
            );
        }
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.expect.share_tolerance),
            "expect.share_tolerance must be in 0..=1"
        );
        Ok(())
    }
}
