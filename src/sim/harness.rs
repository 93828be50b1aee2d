//! Runs one scenario with one seed: N real nodes on turmoil hosts, client
//! hosts generating traffic through a sprayer (keyed requests, or users
//! holding sticky sessions: `sessions`), the fault script, then the
//! invariants and figures.
//!
//! This file holds what a run produces ([`Outcome`], [`Figures`]) and the
//! run's state; the parts: `run` (hosts and the step loop), `faults` (the
//! script applied), `figures` (counts, latencies, keys moved, shares),
//! `invariants` (what must hold, in a fixed order: it reaches the trace),
//! `clients` and `sessions` (the client hosts).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tracing_subscriber::layer::SubscriberExt;

use super::certs::NodePem;
use super::scenario::{Action, Scenario};
use super::trace::{Trace, TraceLayer};
use crate::config::NodeConfig;

mod clients;
mod faults;
mod figures;
mod invariants;
mod run;
mod sessions;

pub use sessions::{StickyFigures, check_sticky};

/// Client HTTP port of every node.
const HTTP_PORT: u16 = 8080;
/// QUIC port of every node.
const PEER_PORT: u16 = 7000;
/// Gossip port of every node.
const GOSSIP_PORT: u16 = 7100;
/// Virtual time the run goes on after `duration_s` to let the last requests end.
const TAIL: Duration = Duration::from_secs(40);

/// The default cluster text a scenario's `cluster` is merged into.
const DEFAULT_RULES: &str = "[[rules]]\nname = \"user\"\nextract = [{ query = \"user\" }, { header = \"x-user\" }, { cookie = \"session\" }]\n";

/// How to run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Keep every trace line in [`Outcome::trace`].
    pub keep_trace: bool,
    /// Leave the nodes' own log lines out of the trace (only the harness's
    /// lines remain; the hash then differs from a normal run's). The
    /// invariants do not read log lines, so a run passes or fails the same.
    pub without_node_logs: bool,
}

/// One client request and what became of it.
#[derive(Debug, Clone)]
pub struct Record {
    /// `c<client>-<n>`.
    pub tag: String,
    /// Hash key.
    pub key: String,
    /// Method.
    pub method: String,
    /// Entry node chosen by the sprayer.
    pub entry: String,
    /// Sent at.
    pub start: Duration,
    /// Answered (or failed) at.
    pub end: Option<Duration>,
    /// Status, `peerlb-served-by` and `peerlb-entry`, or the client-side
    /// error.
    pub result: Option<Result<(u16, String, String), String>>,
    /// The sticky session it belongs to (`c<client>-s<j>`), if any.
    pub session: Option<String>,
    /// The sticky route it carried (its `peerlb-route` cookie).
    pub route: Option<String>,
    /// The sticky route its response set (`Set-Cookie: peerlb-route=`).
    pub set_route: Option<String>,
}

/// A fault as it was applied.
#[derive(Debug, Clone)]
pub struct Applied {
    /// Virtual time.
    pub at: Duration,
    /// Action.
    pub action: Action,
    /// Resolved node (kill, restart, drain, join).
    pub node: Option<String>,
    /// Label for summaries and the report.
    pub label: String,
    /// The new weight (`weight`).
    pub value: Option<u32>,
}

/// Figures of one run.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    /// Requests sent.
    pub sent: u64,
    /// Requests answered 2xx-4xx.
    pub ok: u64,
    /// Requests failed (5xx, or a broken connection to a ready entry).
    pub failed: u64,
    /// Requests whose entry node was killed or drained under them.
    pub entry_lost: u64,
    /// POSTs that failed because their owner was killed while they were
    /// in flight or before every ring dropped it: never replayed (they
    /// may have reached it), so not counted in `failed`.
    pub post_lost: u64,
    /// Requests with no ready entry node to send to.
    pub no_entry: u64,
    /// GET requests the app served twice (replayed after their owner died).
    pub replayed: u64,
    /// Requests served per node (app invocations).
    pub served: BTreeMap<String, u64>,
    /// Median latency of answered requests.
    pub p50: Duration,
    /// 99th percentile latency of answered requests.
    pub p99: Duration,
    /// Per serving node: (p50, p99) latency of the requests it served.
    pub latency_by_node: BTreeMap<String, (Duration, Duration)>,
    /// Per kill: node, time from the kill until no live node routed to it.
    pub ejections: Vec<(String, Option<Duration>)>,
    /// Per fault: time from the fault until every ready node's ring agreed
    /// and held exactly the ready nodes.
    pub convergence: Vec<(String, Option<Duration>)>,
    /// Per kill or join: fraction of the scenario's keys whose owner changed.
    pub keys_moved: Vec<(String, f64)>,
    /// Proxied requests whose owner, in the owner's own view, was another
    /// node (membership skew, served anyway: hop limit 1), summed over the
    /// nodes' `proxied_disagree` counters at the end.
    pub disagree: u64,
    /// Sticky sessions (`[[traffic]] sessions`): started, moved, violations.
    pub sticky: StickyFigures,
    /// Per `weight` fault: the reweighted node's share of the requests
    /// served once the rings agreed, against its share on the ring.
    pub shares: Vec<Share>,
    /// Slow start, as the first node that is not ramping saw it: one entry
    /// per view change in which only one node's weight rose (a ramp step):
    /// the node, its new weight, and the fraction of the scenario's keys
    /// that moved to it (every moved key moves to it: checked).
    pub ramp_steps: Vec<(String, u32, f64)>,
    /// With `expect.inflight_factor`: samples in which the busiest node
    /// held more than the bound, and samples taken
    /// ([`Expect::inflight_factor`](crate::sim::scenario::Expect)).
    pub inflight_over: Option<(u64, u64)>,
    /// Peer-layer (QUIC) datagrams sent by all nodes, per virtual second
    /// (`[s]` counts `[s, s + 1)` s; counted by the simulated network).
    pub peer_datagrams: Vec<u64>,
}

/// After a `weight` fault: the reweighted node's share of the requests
/// served from the moment every ring agreed until the next fault (or the
/// end), and what the engine's ring with the new weights gives it.
#[derive(Debug, Clone, Default)]
pub struct Share {
    /// The fault's label (`weight n1 300`).
    pub label: String,
    /// The reweighted node.
    pub node: String,
    /// Its new weight over the sum of the serving nodes' weights.
    pub weight_share: f64,
    /// Its share of the scenario's key space (`k0..k<key_count>`) on the
    /// new ring.
    pub ring_share: f64,
    /// Its share, on the new ring, of the keys of the requests counted.
    pub expected: f64,
    /// Its share of those requests as served (`peerlb-served-by`).
    pub served: f64,
    /// Requests counted (answered 2xx-4xx, sent after the rings agreed).
    pub requests: u64,
}

/// The result of one run.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Scenario name.
    pub scenario: String,
    /// The seed.
    pub seed: u64,
    /// Trace hash (16 hex digits).
    pub hash: String,
    /// Trace lines (when kept).
    pub trace: Vec<String>,
    /// Lines in the trace.
    pub lines: u64,
    /// Virtual time simulated.
    pub simulated: Duration,
    /// Wall time it took.
    pub wall: Duration,
    /// Figures.
    pub figures: Figures,
    /// Invariants that did not hold (empty: the run passed).
    pub violations: Vec<String>,
    /// The faults as applied.
    pub faults: Vec<Applied>,
    /// App invocations: (time, node).
    pub serves: Vec<(Duration, String)>,
    /// Node ids of the scenario.
    pub nodes: Vec<String>,
    /// Every membership view change the nodes reported (their observers,
    /// not their logs): (time, node, serving ids in id order).
    pub views: Vec<(Duration, String, Arc<[String]>)>,
    /// Every peer ejection (`false`) and restore (`true`) the nodes
    /// reported: (time, node, peer, routable again).
    pub peer_events: Vec<(Duration, String, String, bool)>,
}

/// Runs `scenario` with `seed` on a fresh thread seeded with it (see
/// [`super::os`]), so the run draws no randomness it did not get from
/// the seed.
///
/// # Errors
/// The scenario's cluster is invalid, a node failed to start, or the
/// simulation thread panicked.
pub fn run_isolated(scenario: &Scenario, seed: u64, opts: &RunOptions) -> anyhow::Result<Outcome> {
    let scenario = scenario.clone();
    let opts = opts.clone();
    std::thread::Builder::new()
        .name(format!("sim-{}-{seed}", scenario.name))
        .stack_size(64 << 20)
        .spawn(move || {
            super::os::seed_thread(seed);
            run(&scenario, seed, &opts)
        })?
        .join()
        .map_err(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            anyhow::anyhow!("simulation thread panicked: {msg}")
        })?
}

/// Runs `scenario` with `seed` on this thread. Deterministic only on a
/// thread seeded with [`super::os::seed_thread`] before anything else ran
/// on it ([`run_isolated`] does that).
///
/// # Errors
/// As [`run_isolated`].
pub fn run(scenario: &Scenario, seed: u64, opts: &RunOptions) -> anyhow::Result<Outcome> {
    let trace = Trace::new(opts.keep_trace);
    let filter = tracing_subscriber::EnvFilter::new(if opts.without_node_logs {
        "off"
    } else {
        "warn,peerlb=debug"
    });
    let subscriber = tracing_subscriber::registry()
        .with(filter)
        .with(TraceLayer(trace.clone()));
    super::net::take_peer_datagrams();
    let mut outcome =
        tracing::subscriber::with_default(subscriber, || Run::new(scenario, seed, trace)?.go())?;
    outcome.figures.peer_datagrams = super::net::take_peer_datagrams();
    Ok(outcome)
}

struct NodeSlot {
    id: String,
    ip: IpAddr,
    config: NodeConfig,
    pem: NodePem,
    drain: RefCell<Option<watch::Sender<bool>>>,
    /// Commands for the node's sidecar, which calls the admin API from the
    /// node's own host (it answers loopback only).
    sidecar: RefCell<Option<mpsc::UnboundedSender<SidecarCmd>>>,
    /// The app's slowdown factor, kept across restarts.
    slowdown: Arc<std::sync::atomic::AtomicU32>,
    registered: std::cell::Cell<bool>,
    /// The gossip keys of each start of the node (their drop counters are
    /// checked after the run).
    gossip_keys: RefCell<Vec<Arc<crate::adapters::cluster::keyring::GossipKeys>>>,
}

/// Harness state shared with client hosts (one thread: `Rc<RefCell>`).
#[derive(Default)]
struct Shared {
    /// Nodes the sprayer sends to: logged `node running`, not killed or drained since.
    ready: BTreeSet<String>,
    records: Vec<Record>,
    /// Most recent node that served each key (from responses).
    last_owner: BTreeMap<String, String>,
}

struct Run<'s> {
    scenario: &'s Scenario,
    seed: u64,
    trace: Trace,
    slots: Vec<Rc<NodeSlot>>,
    shared: Rc<RefCell<Shared>>,
    /// Nodes whose software runs.
    running: BTreeSet<String>,
    draining: BTreeSet<String>,
    views: BTreeMap<String, Arc<[String]>>,
    /// Every view change: (time, node, serving ids).
    view_log: Vec<(Duration, String, Arc<[String]>)>,
    /// A node event or a fault since the last convergence check (the
    /// check runs only then: nothing else changes its answer).
    dirty: bool,
    /// Every ejection (false) and restore (true): (time, node, peer, up).
    peer_events: Vec<(Duration, String, String, bool)>,
    serves: Vec<(Duration, String)>,
    serves_by_tag: BTreeMap<String, Vec<(Duration, String)>>,
    generations: BTreeMap<String, u64>,
    applied: Vec<Applied>,
    /// Killed or drained at: node -> times.
    downs: BTreeMap<String, Vec<Duration>>,
    partitions: Vec<(IpAddr, IpAddr, bool)>,
    /// Intervals with a partition or loss in force (end `None`: still on).
    net_faults: Vec<(Duration, Option<Duration>)>,
    converged: Vec<Option<Duration>>,
    probed: Rc<RefCell<BTreeMap<String, serde_json::Value>>>,
    ring_spec: crate::engine::ring::RingSpec,
    /// The weight each node publishes now (config, or the last `weight`
    /// fault since it started).
    weights: BTreeMap<String, u32>,
    /// Per node: `id=weight` of the serving members of its latest view.
    view_weights: BTreeMap<String, Arc<BTreeMap<String, u32>>>,
    /// Every view change with its weights: (node, `id=weight` of the
    /// serving members), in order; read by the slow-start check.
    view_weight_log: Vec<(String, Arc<BTreeMap<String, u32>>)>,
    /// Every distinct view reported, by the hash of its serving members
    /// and weights ([`Run::intern_view`]).
    distinct_views: BTreeMap<u64, Vec<InternedView>>,
    /// Per node: when it logged `node running`.
    ups: BTreeMap<String, Vec<Duration>>,
    /// Per `weight` fault (script index): the node's answer to its `PUT
    /// /_peerlb/weight` (status and body, or the client error).
    weight_answers: WeightAnswers,
}

/// One distinct view: its serving ids, and `id=weight` of each.
type InternedView = (Arc<[String]>, Arc<BTreeMap<String, u32>>);

/// Per `weight` fault (script index): the node's answer to `PUT
/// /_peerlb/weight` (status and body), or why there was none.
type WeightAnswers = Rc<RefCell<BTreeMap<usize, Result<(u16, String), String>>>>;

/// What a node's sidecar does on its host.
enum SidecarCmd {
    /// `GET /_peerlb/status` into the run's probe results.
    Probe,
    /// `PUT /_peerlb/weight` with this weight, for fault number `fault`.
    Weight { fault: usize, value: u32 },
}
