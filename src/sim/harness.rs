//! Runs one scenario with one seed: N real nodes on turmoil hosts, client
//! hosts generating traffic through a sprayer (keyed requests, or users
//! holding sticky sessions: `sessions`), the fault script, then the
//! invariants and figures.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tracing_subscriber::layer::SubscriberExt;

use super::certs::{self, NodePem};
use super::gossip::SimGossip;
use super::net::{SimClock, SimListener, SimUdp, sim_epoch};
use super::scenario::{Action, Scenario};
use super::trace::{self, NodeEvent, Trace, TraceLayer};
use crate::config::{ClusterFile, NodeConfig, Overrides, Source};
use crate::env::{Clock, Env};
use crate::{Node, NodeId, Ring};

mod clients;
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
    let filter = tracing_subscriber::EnvFilter::new("warn,peerlb=debug");
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
    views: BTreeMap<String, Vec<String>>,
    view_log: Vec<(Duration, String, Vec<String>)>,
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
    ring_vnodes: u32,
    /// The weight each node publishes now (config, or the last `weight`
    /// fault since it started).
    weights: BTreeMap<String, u32>,
    /// Per node: `id=weight` of the serving members of its latest view.
    view_weights: BTreeMap<String, BTreeMap<String, u32>>,
    /// Per node: when it logged `node running`.
    ups: BTreeMap<String, Vec<Duration>>,
    /// Per `weight` fault (script index): the node's answer to its `PUT
    /// /_peerlb/weight` (status and body, or the client error).
    weight_answers: WeightAnswers,
}

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

fn ids_in(debug: &str) -> Vec<String> {
    debug
        .split('"')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s.to_owned())
        .collect()
}

impl<'s> Run<'s> {
    fn new(scenario: &'s Scenario, seed: u64, trace: Trace) -> anyhow::Result<Run<'s>> {
        let ids = scenario.node_ids();
        // turmoil gives hosts 192.168.0.1, .2, ... in lookup order.
        let ips: Vec<IpAddr> = (1..=ids.len())
            .map(|i| IpAddr::from([192, 168, 0, i as u8]))
            .collect();
        let mut text = scenario.cluster.clone();
        text.insert_str(0, "name = \"sim\"\n");
        if !text.ends_with('\n') {
            text.push('\n');
        }
        for (id, ip) in ids.iter().zip(&ips) {
            text.push_str(&format!(
                "[[nodes]]\nid = \"{id}\"\nhttp_addr = \"{ip}:{HTTP_PORT}\"\npeer_addr = \"{ip}:{PEER_PORT}\"\ngossip_addr = \"{ip}:{GOSSIP_PORT}\"\n"
            ));
        }
        if !scenario.cluster.contains("[[rules]]") {
            text.push_str(DEFAULT_RULES);
        }
        let src = Source {
            origin: format!("scenario {} cluster", scenario.name),
            base_dir: ".".into(),
            path: None,
            text,
        };
        let file: ClusterFile = src.parse()?;
        let pems = certs::generate("sim", &ids, seed)?;
        let mut slots = Vec::new();
        let mut weights = BTreeMap::new();
        let mut ring_vnodes = 0;
        for ((id, ip), pem) in ids.iter().zip(&ips).zip(pems) {
            let config = file.validate(&src, id, &Overrides::default())?;
            ring_vnodes = config.vnodes;
            weights.insert(id.clone(), config.node.weight);
            slots.push(Rc::new(NodeSlot {
                id: id.clone(),
                ip: *ip,
                config,
                pem,
                drain: RefCell::new(None),
                sidecar: RefCell::new(None),
                slowdown: Arc::new(std::sync::atomic::AtomicU32::new(1)),
                registered: std::cell::Cell::new(false),
            }));
        }
        let converged = vec![None; scenario.faults.len() + 1];
        Ok(Run {
            scenario,
            seed,
            trace,
            slots,
            shared: Rc::default(),
            running: BTreeSet::new(),
            draining: BTreeSet::new(),
            views: BTreeMap::new(),
            view_log: Vec::new(),
            serves: Vec::new(),
            serves_by_tag: BTreeMap::new(),
            generations: BTreeMap::new(),
            applied: Vec::new(),
            downs: BTreeMap::new(),
            partitions: Vec::new(),
            net_faults: Vec::new(),
            converged,
            probed: Rc::default(),
            ring_vnodes,
            weights,
            view_weights: BTreeMap::new(),
            ups: BTreeMap::new(),
            weight_answers: Rc::default(),
        })
    }

    fn slot(&self, id: &str) -> Rc<NodeSlot> {
        self.slots
            .iter()
            .find(|s| s.id == id)
            .cloned()
            .expect("scenario nodes are checked")
    }

    fn register(&mut self, sim: &mut turmoil::Sim<'_>, id: &str, gossip: &SimGossip) {
        let slot = self.slot(id);
        let seed = self.seed;
        let trace = self.trace.clone();
        let gossip = gossip.clone();
        let s = slot.clone();
        let probed = self.probed.clone();
        let weight_answers = self.weight_answers.clone();
        sim.host(slot.ip, move || {
            let (tx, mut rx) = watch::channel(false);
            *s.drain.borrow_mut() = Some(tx);
            let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
            *s.sidecar.borrow_mut() = Some(cmd_tx);
            let probed = probed.clone();
            let weight_answers = weight_answers.clone();
            let config = s.config.clone();
            let pem = s.pem.clone();
            let gossip = gossip.clone();
            let id = s.id.clone();
            let slowdown = s.slowdown.clone();
            let trace = trace.clone();
            async move {
                trace.register_host(&id);
                let clock: Arc<dyn Clock> = Arc::new(SimClock { epoch: sim_epoch() });
                let generation = clock
                    .now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_millis() as u64);
                let config_port = config.node.http_addr.port();
                let listener = turmoil::net::TcpListener::bind(("0.0.0.0", config_port)).await?;
                let udp = SimUdp::bind(config.node.peer_addr).await?;
                let node_seed =
                    seed ^ generation.rotate_left(17) ^ xxhash_rust::xxh3::xxh3_64(id.as_bytes());
                let env = Env {
                    http_listeners: vec![Box::new(SimListener(listener))],
                    peer_socket: Arc::new(udp),
                    quic_runtime: Arc::new(quinn::TokioRuntime),
                    gossip: Box::new(gossip),
                    clock: clock.clone(),
                    generation,
                    seed: node_seed,
                    tls: Some(pem.material(clock)?),
                    app_slowdown: slowdown,
                };
                let node = Node::build(config, env)?;
                let port = config_port;
                let sidecar = tokio::task::spawn_local(clients::sidecar(
                    id,
                    port,
                    cmd_rx,
                    probed,
                    weight_answers,
                    trace.clone(),
                ));
                let r = node
                    .run(async move {
                        let _ = rx.wait_for(|d| *d).await;
                    })
                    .await;
                sidecar.abort();
                r?;
                Ok(())
            }
        });
        slot.registered.set(true);
        self.running.insert(id.to_owned());
    }

    fn go(mut self) -> anyhow::Result<Outcome> {
        anyhow::ensure!(
            cfg!(tokio_unstable),
            "build the simulation with RUSTFLAGS=\"--cfg tokio_unstable\" (simulations/peerlb-sim does): \
             otherwise tokio's select! is not seeded and runs are not reproducible"
        );
        #[allow(clippy::disallowed_methods, clippy::disallowed_types)]
        let wall_start = std::time::Instant::now();
        let scn = self.scenario;
        let tick = Duration::from_millis(scn.network.tick_ms);
        let duration = Duration::from_secs_f64(scn.duration_s);
        let mut sim = turmoil::Builder::new()
            .rng_seed(self.seed)
            .tick_duration(tick)
            .simulation_duration(duration + TAIL + Duration::from_secs(60))
            .epoch(sim_epoch())
            .min_message_latency(Duration::from_millis(scn.network.min_latency_ms))
            .max_message_latency(Duration::from_millis(scn.network.max_latency_ms))
            .tcp_capacity(1 << 16)
            .udp_capacity(1 << 16)
            .build();
        trace::set_now(Duration::ZERO);
        for s in &self.slots {
            let ip = sim.lookup(s.id.as_str());
            anyhow::ensure!(ip == s.ip, "turmoil gave {} the address {ip}", s.id);
        }
        self.trace.line(
            "sim",
            format_args!(
                "start scenario={} seed={} nodes={}",
                scn.name, self.seed, scn.nodes
            ),
        );
        let gossip = SimGossip::new();
        for id in scn.node_ids().into_iter().take(scn.nodes) {
            self.register(&mut sim, &id, &gossip);
        }
        let mut client_no = 0;
        for t in &scn.traffic {
            for _ in 0..t.clients {
                client_no += 1;
                let name = format!("c{client_no}");
                let seed = self.seed ^ (client_no as u64).wrapping_mul(0xa076_1d64_78bd_642f);
                let (shared, trace) = (self.shared.clone(), self.trace.clone());
                if t.sessions > 0 {
                    let fut = sessions::client(name.clone(), t.clone(), seed, shared, trace);
                    sim.client(name.as_str(), fut);
                } else {
                    let fut = clients::client(name.clone(), t.clone(), seed, shared, trace);
                    sim.client(name.as_str(), fut);
                }
            }
        }
        let mut next_fault = 0;
        let end = duration;
        while sim.elapsed() < end + TAIL {
            let now = sim.elapsed();
            trace::set_now(now);
            while next_fault < scn.faults.len()
                && Duration::from_secs_f64(scn.faults[next_fault].at_s) <= now
            {
                self.apply(&mut sim, next_fault, &gossip)?;
                next_fault += 1;
            }
            let clients_done = sim.step().map_err(|e| anyhow::anyhow!("simulation: {e}"))?;
            trace::set_now(sim.elapsed());
            self.absorb(&mut sim);
            self.check_convergence(next_fault);
            if now >= end && clients_done {
                break;
            }
        }
        let simulated = sim.elapsed();
        self.trace
            .line("sim", format_args!("end at={}ms", simulated.as_millis()));
        let probe = self.probe(&mut sim)?;
        #[allow(clippy::disallowed_methods, clippy::disallowed_types)]
        let wall = wall_start.elapsed();
        drop(sim);
        Ok(self.finish(simulated, wall, probe))
    }

    fn ips(&self, ids: &[String]) -> Vec<IpAddr> {
        ids.iter().map(|i| self.slot(i).ip).collect()
    }

    /// Resolves `owner:<key>`: the node that last served `key`, else the
    /// owner on the ring of the ready nodes.
    fn resolve(&self, node: &str) -> String {
        let Some(key) = node.strip_prefix("owner:") else {
            return node.to_owned();
        };
        if let Some(n) = self.shared.borrow().last_owner.get(key) {
            return n.clone();
        }
        let ready: Vec<(NodeId, u32)> = self
            .shared
            .borrow()
            .ready
            .iter()
            .map(|i| (NodeId::from(i.as_str()), self.weights[i]))
            .collect();
        Ring::build(&ready, self.ring_vnodes)
            .owner(key)
            .map_or_else(|| "n1".to_owned(), |o| o.to_string())
    }

    /// The ring the engine builds for the serving nodes `ids` with
    /// `weights` (weight-0 nodes are off the ring, as in a node's view).
    fn ring_of(&self, ids: &BTreeSet<String>, weights: &BTreeMap<String, u32>) -> Ring {
        let nodes: Vec<(NodeId, u32)> = ids
            .iter()
            .map(|i| (NodeId::from(i.as_str()), weights[i]))
            .filter(|(_, w)| *w > 0)
            .collect();
        Ring::build(&nodes, self.ring_vnodes)
    }

    fn apply(
        &mut self,
        sim: &mut turmoil::Sim<'_>,
        index: usize,
        gossip: &SimGossip,
    ) -> anyhow::Result<()> {
        let f = &self.scenario.faults[index];
        let now = sim.elapsed();
        let node = f.node.as_deref().map(|n| self.resolve(n));
        let label = match (&node, f.action) {
            (Some(n), Action::Slow) => format!("slow {n} x{}", f.factor),
            (Some(n), Action::Weight) => format!("weight {n} {}", f.value.unwrap_or_default()),
            (Some(n), a) => format!("{a:?} {n}").to_lowercase(),
            (None, Action::Heal) => "heal".to_owned(),
            (None, a) => format!("{a:?} {:?}|{:?}", f.a, f.b).to_lowercase(),
        };
        self.trace
            .line("sim", format_args!("fault {label} (script #{index})"));
        match f.action {
            Action::Kill => {
                let n = node.clone().expect("checked");
                if self.running.remove(&n) {
                    sim.crash(self.slot(&n).ip);
                }
                self.shared.borrow_mut().ready.remove(&n);
                self.draining.remove(&n);
                self.downs.entry(n).or_default().push(now);
            }
            Action::Restart => {
                let n = node.clone().expect("checked");
                let slot = self.slot(&n);
                // A new start publishes the configured weight again.
                self.weights.insert(n.clone(), slot.config.node.weight);
                if !slot.registered.get() {
                    self.register(sim, &n, gossip);
                } else if !self.running.contains(&n) {
                    sim.bounce(slot.ip);
                    self.running.insert(n);
                }
            }
            Action::Join => {
                let n = node.clone().expect("checked");
                if !self.slot(&n).registered.get() {
                    self.register(sim, &n, gossip);
                }
            }
            Action::Weight => {
                let n = node.clone().expect("checked");
                let value = f.value.expect("checked");
                let sent = self.running.contains(&n)
                    && self.slot(&n).sidecar.borrow().as_ref().is_some_and(|tx| {
                        tx.send(SidecarCmd::Weight {
                            fault: index,
                            value,
                        })
                        .is_ok()
                    });
                if sent {
                    self.weights.insert(n, value);
                } else {
                    self.weight_answers
                        .borrow_mut()
                        .insert(index, Err(format!("{n} is not running")));
                }
            }
            Action::Drain => {
                let n = node.clone().expect("checked");
                self.shared.borrow_mut().ready.remove(&n);
                if let Some(tx) = self.slot(&n).drain.borrow().as_ref() {
                    let _ = tx.send(true);
                }
                self.draining.insert(n.clone());
                self.downs.entry(n).or_default().push(now);
            }
            Action::Partition | Action::PartitionOneway => {
                self.net_faults.push((now, None));
                let oneway = f.action == Action::PartitionOneway;
                for a in self.ips(&f.a) {
                    for b in self.ips(&f.b) {
                        if oneway {
                            sim.partition_oneway(a, b);
                        } else {
                            sim.partition(a, b);
                        }
                        self.partitions.push((a, b, oneway));
                    }
                }
            }
            Action::Heal => {
                for f in &mut self.net_faults {
                    f.1.get_or_insert(now);
                }
                for (a, b, oneway) in std::mem::take(&mut self.partitions) {
                    if oneway {
                        sim.repair_oneway(a, b);
                    } else {
                        sim.repair(a, b);
                    }
                }
            }
            Action::Slow => {
                let n = node.clone().expect("checked");
                self.slot(&n)
                    .slowdown
                    .store(f.factor.max(1), std::sync::atomic::Ordering::Relaxed);
            }
            Action::Latency => {
                for a in self.ips(&f.a) {
                    for b in self.ips(&f.b) {
                        sim.set_link_latency(a, b, Duration::from_millis(f.ms));
                    }
                }
            }
            Action::Loss => {
                self.net_faults.push((now, None));
                for a in self.ips(&f.a) {
                    for b in self.ips(&f.b) {
                        sim.set_link_fail_rate(a, b, f.rate);
                    }
                }
            }
        }
        self.applied.push(Applied {
            at: now,
            action: f.action,
            node,
            label,
            value: f.value,
        });
        Ok(())
    }

    /// Takes the node events of the last step.
    fn absorb(&mut self, sim: &mut turmoil::Sim<'_>) {
        for ev in self.trace.take_events() {
            match ev {
                NodeEvent::View {
                    at,
                    host,
                    serving,
                    weights,
                } => {
                    let parsed = weights
                        .split_whitespace()
                        .filter_map(|p| p.split_once('='))
                        .filter_map(|(id, w)| Some((id.to_owned(), w.parse().ok()?)))
                        .collect();
                    self.view_weights.insert(host.clone(), parsed);
                    let ids = ids_in(&serving);
                    self.views.insert(host.clone(), ids.clone());
                    self.view_log.push((at, host, ids));
                }
                NodeEvent::Running {
                    at,
                    host,
                    generation,
                } => {
                    self.ups.entry(host.clone()).or_default().push(at);
                    self.generations.insert(host.clone(), generation);
                    if self.running.contains(&host) && !self.draining.contains(&host) {
                        self.shared.borrow_mut().ready.insert(host);
                    }
                }
                NodeEvent::AppServe { at, host, path } => {
                    if let Some(tag) = path.split("&r=").nth(1) {
                        self.serves_by_tag
                            .entry(tag.to_owned())
                            .or_default()
                            .push((at, host.clone()));
                    }
                    self.serves.push((at, host));
                }
            }
        }
        // Drained nodes whose software has returned.
        let finished: Vec<String> = self
            .draining
            .iter()
            .filter(|n| !sim.is_host_running(self.slot(n).ip))
            .cloned()
            .collect();
        for n in finished {
            self.trace.line("sim", format_args!("node {n} stopped"));
            self.draining.remove(&n);
            self.running.remove(&n);
            self.views.remove(&n);
            self.view_weights.remove(&n);
        }
    }

    /// The serving set every ready node should converge to.
    fn expected(&self) -> BTreeSet<String> {
        self.running.difference(&self.draining).cloned().collect()
    }

    fn check_convergence(&mut self, faults_applied: usize) {
        let slot = faults_applied;
        // While a partition stands there is no one ring to agree on.
        if self.converged[slot].is_some() || !self.partitions.is_empty() {
            return;
        }
        let expected = self.expected();
        let want: Vec<String> = expected.iter().cloned().collect();
        // Each view must also give every serving node the weight it publishes.
        let want_weights: BTreeMap<String, u32> =
            want.iter().map(|n| (n.clone(), self.weights[n])).collect();
        let ok = !expected.is_empty()
            && expected.iter().all(|n| {
                self.views
                    .get(n)
                    .map_or_else(|| want.len() == 1 && want[0] == *n, |v| *v == want)
                    && self.view_weights.get(n).is_none_or(|w| *w == want_weights)
            })
            && expected
                .iter()
                .all(|n| self.shared.borrow().ready.contains(n));
        if ok {
            let now = trace::now();
            let since = if slot == 0 {
                Duration::ZERO
            } else {
                self.applied[slot - 1].at
            };
            self.converged[slot] = Some(now - since);
            self.trace.line(
                "sim",
                format_args!(
                    "converged after={}ms ring={want:?} weights={want_weights:?}",
                    (now - since).as_millis()
                ),
            );
        }
    }

    /// Reads `/_peerlb/status` of every running node, through each node's
    /// sidecar on its own host (the admin API answers loopback clients only).
    fn probe(
        &mut self,
        sim: &mut turmoil::Sim<'_>,
    ) -> anyhow::Result<BTreeMap<String, serde_json::Value>> {
        let targets: Vec<String> = self.running.difference(&self.draining).cloned().collect();
        for n in &targets {
            if let Some(tx) = self.slot(n).sidecar.borrow().as_ref() {
                let _ = tx.send(SidecarCmd::Probe);
            }
        }
        for _ in 0..5000 {
            if self.probed.borrow().len() >= targets.len() {
                break;
            }
            trace::set_now(sim.elapsed());
            sim.step().map_err(|e| anyhow::anyhow!("simulation: {e}"))?;
        }
        let out = self.probed.borrow().clone();
        Ok(out)
    }

    fn finish(
        self,
        simulated: Duration,
        wall: Duration,
        probe: BTreeMap<String, serde_json::Value>,
    ) -> Outcome {
        let scn = self.scenario;
        let mut fig = Figures::default();
        let mut violations = Vec::new();
        let records = std::mem::take(&mut self.shared.borrow_mut().records);
        let downs = &self.downs;
        let down_between = |node: &str, a: Duration, b: Duration| {
            downs
                .get(node)
                .is_some_and(|ts| ts.iter().any(|t| *t >= a && *t <= b))
        };
        let net_faults = &self.net_faults;
        let net_fault_at = |t: Duration| {
            net_faults
                .iter()
                .any(|(a, b)| *a <= t && b.is_none_or(|b| t <= b))
        };
        let mut latencies = Vec::new();
        let mut by_node: BTreeMap<String, Vec<Duration>> = BTreeMap::new();
        let mut unanswered = 0;
        for r in &records {
            if r.entry.is_empty() {
                fig.no_entry += 1;
                continue;
            }
            fig.sent += 1;
            let end = r.end.unwrap_or(simulated);
            match &r.result {
                None => unanswered += 1,
                Some(Ok((status, _served, entry_hdr))) => {
                    if *status >= 500 {
                        fig.failed += 1;
                    } else {
                        fig.ok += 1;
                        latencies.push(end - r.start);
                        by_node
                            .entry(_served.clone())
                            .or_default()
                            .push(end - r.start);
                    }
                    if !entry_hdr.is_empty() && *entry_hdr != r.entry {
                        violations.push(format!(
                            "{}: entered at {} but answered as entry {entry_hdr}",
                            r.tag, r.entry
                        ));
                    }
                }
                Some(Err(_)) => {
                    if down_between(&r.entry, r.start, end) {
                        fig.entry_lost += 1;
                    } else {
                        fig.failed += 1;
                    }
                }
            }
        }
        if unanswered > 0 {
            violations.push(format!(
                "{unanswered} requests got neither a response nor an error"
            ));
        }
        latencies.sort();
        let pct = |p: f64| {
            latencies
                .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        fig.p50 = pct(0.5);
        fig.p99 = pct(0.99);
        for (n, mut l) in by_node {
            l.sort();
            let at = |p: f64| l[((l.len() as f64 * p) as usize).min(l.len() - 1)];
            fig.latency_by_node.insert(n, (at(0.5), at(0.99)));
        }
        for (_, host) in &self.serves {
            *fig.served.entry(host.clone()).or_default() += 1;
        }
        let methods: BTreeMap<&str, &str> = records
            .iter()
            .map(|r| (r.tag.as_str(), r.method.as_str()))
            .collect();
        for (tag, serves) in &self.serves_by_tag {
            if serves.len() < 2 {
                continue;
            }
            let (first_at, first) = &serves[0];
            // An idempotent request is replayed on the next candidate when
            // its answer could not come back: the owner died, or the
            // network between them failed. Never a POST; never a third time.
            let replay_ok = methods.get(tag.as_str()) == Some(&"GET")
                && serves.len() == 2
                && (down_between(first, *first_at, serves[1].0) || net_fault_at(*first_at));
            if replay_ok {
                fig.replayed += 1;
            } else {
                violations.push(format!(
                    "request {tag} ({}) served {} times: {serves:?}",
                    methods.get(tag.as_str()).unwrap_or(&"?"),
                    serves.len()
                ));
            }
        }
        if fig.failed > scn.expect.max_failed {
            violations.push(format!(
                "{} requests failed (at most {} allowed)",
                fig.failed, scn.expect.max_failed
            ));
        }
        let served_total: u64 = fig.served.values().sum();
        if served_total < scn.expect.min_served {
            violations.push(format!(
                "only {served_total} requests served (at least {} expected)",
                scn.expect.min_served
            ));
        }
        // Ejections: time from each kill until no other node's view held it.
        for a in self.applied.iter().filter(|a| a.action == Action::Kill) {
            let dead = a.node.clone().unwrap_or_default();
            let mut holding: BTreeSet<String> = BTreeSet::new();
            let mut views: BTreeMap<&str, &Vec<String>> = BTreeMap::new();
            let mut gone_at = None;
            for (at, host, ids) in &self.view_log {
                views.insert(host, ids);
                if *at < a.at {
                    continue;
                }
                holding = views
                    .iter()
                    .filter(|(h, v)| **h != dead && v.contains(&dead))
                    .map(|(h, _)| (*h).to_owned())
                    .collect();
                if holding.is_empty() {
                    gone_at = Some(*at - a.at);
                    break;
                }
            }
            if gone_at.is_none() {
                let still: Vec<_> = views
                    .iter()
                    .filter(|(h, v)| **h != dead && v.contains(&dead))
                    .map(|(h, _)| (*h).to_owned())
                    .collect();
                if still.is_empty() {
                    gone_at = Some(Duration::ZERO);
                } else {
                    holding = still.into_iter().collect();
                }
            }
            match gone_at {
                Some(d) if d.as_secs_f64() <= scn.expect.eject_within_s => {}
                Some(d) => violations.push(format!(
                    "{dead} left every ring {:.2}s after its kill (at most {}s)",
                    d.as_secs_f64(),
                    scn.expect.eject_within_s
                )),
                None => violations.push(format!(
                    "{dead} was never ejected after its kill: still in the ring of {holding:?}"
                )),
            }
            fig.ejections.push((dead, gone_at));
        }
        // Keys moved by kills, joins and weight changes.
        let keys: Vec<String> = scn
            .traffic
            .first()
            .map(|t| (0..t.key_count).map(|i| format!("k{i}")).collect())
            .unwrap_or_default();
        let mut members: BTreeSet<String> = scn.node_ids().into_iter().take(scn.nodes).collect();
        let configured: BTreeMap<String, u32> = self
            .slots
            .iter()
            .map(|s| (s.id.clone(), s.config.node.weight))
            .collect();
        let mut weights = configured.clone();
        for (i, a) in self.applied.iter().enumerate() {
            let Some(n) = &a.node else { continue };
            let (before, before_w) = (members.clone(), weights.clone());
            match a.action {
                Action::Kill | Action::Drain => {
                    members.remove(n);
                }
                Action::Join | Action::Restart => {
                    members.insert(n.clone());
                    weights.insert(n.clone(), configured[n]);
                }
                Action::Weight => {
                    weights.insert(n.clone(), a.value.unwrap_or_default());
                }
                _ => continue,
            }
            if a.action == Action::Weight {
                let answer = self.weight_answers.borrow().get(&i).cloned();
                match answer {
                    Some(Ok((200, _))) => {}
                    Some(Ok((status, body))) => {
                        violations.push(format!("{}: the node answered {status} {body}", a.label))
                    }
                    Some(Err(e)) => violations.push(format!("{}: {e}", a.label)),
                    None => violations.push(format!("{}: the node never answered", a.label)),
                }
                let ring = self.ring_of(&members, &weights);
                let window = (
                    self.converged[i + 1].map(|d| a.at + d),
                    self.applied.get(i + 1).map_or(simulated, |next| next.at),
                );
                match share(n, &ring, &members, &weights, &keys, &records, window) {
                    Some(mut s) => {
                        s.label = a.label.clone();
                        if s.requests == 0 {
                            violations.push(format!(
                                "{}: no request answered after the rings agreed",
                                a.label
                            ));
                        } else if (s.served - s.expected).abs() > scn.expect.share_tolerance {
                            violations.push(format!(
                                "{}: {n} served {:.3} of the requests after the rings agreed; the ring gives it {:.3} of their keys (tolerance {})",
                                a.label, s.served, s.expected, scn.expect.share_tolerance
                            ));
                        }
                        fig.shares.push(s);
                    }
                    None => violations.push(format!(
                        "{}: the rings never agreed on the new weight before the next fault",
                        a.label
                    )),
                }
            }
            if (before == members && before_w == weights)
                || keys.is_empty()
                || members.is_empty()
                || before.is_empty()
            {
                continue;
            }
            let (r0, r1) = (
                self.ring_of(&before, &before_w),
                self.ring_of(&members, &weights),
            );
            let moved = keys.iter().filter(|k| r0.owner(k) != r1.owner(k)).count();
            fig.keys_moved
                .push((a.label.clone(), moved as f64 / keys.len() as f64));
        }
        // Sticky sessions: stickiness holds unless its node died.
        let ups = &self.ups;
        let up = |node: &str, from: Duration, to: Duration| {
            ups.get(node)
                .and_then(|ts| ts.iter().filter(|t| **t <= from).max())
                .is_some_and(|since| !down_between(node, *since, to))
        };
        let (sticky, broken) = check_sticky(&records, up);
        fig.sticky = sticky;
        violations.extend(broken);
        // Convergence per fault.
        let labels: Vec<String> = std::iter::once("start".to_owned())
            .chain(self.applied.iter().map(|a| a.label.clone()))
            .collect();
        for (label, c) in labels.iter().zip(&self.converged) {
            fig.convergence.push((label.clone(), *c));
        }
        let last = self.converged.last().copied().flatten();
        let partitioned_at_end = !self.partitions.is_empty();
        if !partitioned_at_end {
            match last {
                Some(d) if d.as_secs_f64() <= scn.expect.converge_within_s => {}
                Some(d) => violations.push(format!(
                    "rings agreed {:.2}s after the last fault (at most {}s)",
                    d.as_secs_f64(),
                    scn.expect.converge_within_s
                )),
                None => violations.push(format!(
                    "rings never agreed after the last fault ({}); views: {:?}",
                    labels.last().map_or("", String::as_str),
                    self.views
                )),
            }
        }
        // No ghost: every probed node sees each member once, at its newest generation.
        for (node, status) in &probe {
            fig.disagree += status["counters"]["proxied_disagree"].as_u64().unwrap_or(0);
            let mut seen: BTreeMap<String, u64> = BTreeMap::new();
            for m in status["members"].as_array().into_iter().flatten() {
                let id = m["id"].as_str().unwrap_or_default().to_owned();
                let generation = m["generation"].as_u64().unwrap_or_default();
                if seen.insert(id.clone(), generation).is_some() {
                    violations.push(format!("{node} lists {id} twice"));
                }
                if let Some(newest) = self.generations.get(&id)
                    && generation != *newest
                    && self.running.contains(&id)
                {
                    violations.push(format!(
                            "{node} holds {id} at generation {generation}, not its newest {newest} (ghost)"
                        ));
                }
            }
        }
        if probe.is_empty() && !self.running.is_empty() {
            violations.push("no node answered the status probe".to_owned());
        }
        let summary = format!(
            "sent={} ok={} failed={} entry_lost={} replayed={} violations={}",
            fig.sent,
            fig.ok,
            fig.failed,
            fig.entry_lost,
            fig.replayed,
            violations.len()
        );
        self.trace.line("sim", format_args!("summary {summary}"));
        for v in &violations {
            self.trace.line("sim", format_args!("violation {v}"));
        }
        Outcome {
            scenario: scn.name.clone(),
            seed: self.seed,
            hash: self.trace.hash(),
            trace: self.trace.lines(),
            lines: self.trace.count(),
            simulated,
            wall,
            figures: fig,
            violations,
            faults: self.applied,
            serves: self.serves,
            nodes: scn.node_ids(),
        }
    }
}

/// The [`Share`] of `node` (label left empty) over the plain (non-session)
/// requests answered 2xx-4xx and sent inside `window` (`None` start: the
/// rings never agreed, and the result is `None`).
fn share(
    node: &str,
    ring: &Ring,
    members: &BTreeSet<String>,
    weights: &BTreeMap<String, u32>,
    keys: &[String],
    records: &[Record],
    window: (Option<Duration>, Duration),
) -> Option<Share> {
    let (from, to) = (window.0?, window.1);
    let owns = |k: &str| ring.owner(k).is_some_and(|o| &**o == node);
    let (mut requests, mut expected, mut served) = (0u64, 0u64, 0u64);
    for r in records {
        let Some(Ok((status, by, _))) = &r.result else {
            continue;
        };
        if r.session.is_some() || r.start < from || r.start >= to || *status >= 500 || by.is_empty()
        {
            continue;
        }
        requests += 1;
        expected += u64::from(owns(&r.key));
        served += u64::from(by == node);
    }
    let frac = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let total: u64 = members.iter().map(|m| u64::from(weights[m])).sum();
    Some(Share {
        label: String::new(),
        node: node.to_owned(),
        weight_share: frac(u64::from(weights[node]), total),
        ring_share: frac(
            keys.iter().filter(|k| owns(k)).count() as u64,
            keys.len() as u64,
        ),
        expected: frac(expected, requests),
        served: frac(served, requests),
        requests,
    })
}
