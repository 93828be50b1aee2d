//! The run itself: the nodes on their turmoil hosts (each with a sidecar
//! for the admin API), the client hosts, the step loop that applies the
//! fault script ([`super::faults`]), takes the nodes' events and notes when
//! the rings agree, and the closing status probe.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash as _, Hasher as _};
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::super::certs;
use super::super::gossip::SimGossip;
use super::super::net::{SimClock, SimListener, SimUdp, sim_epoch};
use super::super::scenario::Scenario;
use super::super::trace::{self, NodeEvent, SimObserver, Trace};
use super::{
    DEFAULT_RULES, GOSSIP_PORT, HTTP_PORT, NodeSlot, Outcome, PEER_PORT, Run, SidecarCmd, TAIL,
    clients, sessions,
};
use crate::Node;
use crate::adapters::cluster::keyring::GossipKeys;
use crate::config::{ClusterFile, Overrides, Source};
use crate::env::{Clock, Env};

impl<'s> Run<'s> {
    pub(super) fn new(scenario: &'s Scenario, seed: u64, trace: Trace) -> anyhow::Result<Run<'s>> {
        let ids = scenario.node_ids();
        // turmoil gives the i-th host looked up (from 1) 192.168.(i / 256).(i % 256).
        anyhow::ensure!(ids.len() < 1 << 16, "at most 65,535 nodes");
        let ips: Vec<IpAddr> = (1..=ids.len())
            .map(|i| IpAddr::from([192, 168, (i >> 8) as u8, i as u8]))
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
        let mut ring_spec = crate::engine::ring::RingSpec::from(0);
        for ((id, ip), pem) in ids.iter().zip(&ips).zip(pems) {
            let mut config = file.validate(&src, id, &Overrides::default())?;
            // The simulated network is an Ethernet path (see `net.rs`), so
            // the nodes are set up as on one: path MTU discovery stops at
            // its size instead of probing past it.
            config.peer.max_udp_payload = super::super::net::PATH_MTU_PAYLOAD as u16;
            ring_spec = config.routing.ring;
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
                gossip_keys: RefCell::default(),
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
            dirty: true,
            peer_events: Vec::new(),
            serves: Vec::new(),
            serves_by_tag: BTreeMap::new(),
            generations: BTreeMap::new(),
            applied: Vec::new(),
            downs: BTreeMap::new(),
            partitions: Vec::new(),
            net_faults: Vec::new(),
            converged,
            probed: Rc::default(),
            ring_spec,
            weights,
            view_weights: BTreeMap::new(),
            view_weight_log: Vec::new(),
            distinct_views: BTreeMap::new(),
            ups: BTreeMap::new(),
            weight_answers: Rc::default(),
        })
    }

    pub(super) fn slot(&self, id: &str) -> Rc<NodeSlot> {
        self.slots
            .iter()
            .find(|s| s.id == id)
            .cloned()
            .expect("scenario nodes are checked")
    }

    pub(super) fn register(&mut self, sim: &mut turmoil::Sim<'_>, id: &str, gossip: &SimGossip) {
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
            let slot = s.clone();
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
                // The admin API on its own listener, as in production (the
                // sidecar probes status and sets weights there).
                let admin_port = config.node.admin_addr.port();
                let admin = turmoil::net::TcpListener::bind(("0.0.0.0", admin_port)).await?;
                let udp = SimUdp::bind(config.node.peer_addr).await?;
                let node_seed =
                    seed ^ generation.rotate_left(17) ^ xxhash_rust::xxh3::xxh3_64(id.as_bytes());
                let gossip_keys =
                    Arc::new(GossipKeys::seeded(certs::gossip_keyring(seed), node_seed));
                slot.gossip_keys.borrow_mut().push(gossip_keys.clone());
                // The bounds production checks every datagram against
                // (`Env::bind`), for this node.
                let bounds = Arc::new(crate::adapters::cluster::bounds::Bounds::new(
                    &id,
                    generation,
                    config.gossip.max_members,
                    config.gossip.interval,
                ));
                let env = Env {
                    http_listeners: vec![Box::new(SimListener(listener))],
                    admin_listener: Some(Box::new(SimListener(admin))),
                    metrics_listener: None,
                    // The simulation serves no SIP (turmoil sockets are not
                    // wired to the SIP listeners).
                    sip: None,
                    peer_socket: Arc::new(udp),
                    quic_runtime: Arc::new(quinn::TokioRuntime),
                    gossip: Box::new(gossip.sealed(gossip_keys.clone(), bounds)),
                    gossip_keys,
                    clock: clock.clone(),
                    generation,
                    seed: node_seed,
                    tls: Some(pem.material(clock)?),
                    app_slowdown: slowdown,
                    observer: Arc::new(SimObserver {
                        host: id.clone(),
                        trace: trace.clone(),
                    }),
                };
                let node = Node::build(config, env)?;
                let port = admin_port;
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

    pub(super) fn go(mut self) -> anyhow::Result<Outcome> {
        anyhow::ensure!(
            cfg!(tokio_unstable),
            "build the simulation with RUSTFLAGS=\"--cfg tokio_unstable\" (simulations/peerlb-sim does): \
             otherwise tokio's select! is not seeded and runs are not reproducible"
        );
        // The run's wall time, reported beside the simulated time; no node
        // reads it.
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
        // (start time, node) of the nodes not started yet, last first.
        let mut starts: Vec<(Duration, String)> = scn
            .node_ids()
            .into_iter()
            .take(scn.nodes)
            .enumerate()
            .map(|(i, id)| {
                let at = scn.start_spread_s * i as f64 / scn.nodes as f64;
                (Duration::from_secs_f64(at), id)
            })
            .rev()
            .collect();
        while starts.last().is_some_and(|(at, _)| at.is_zero()) {
            let (_, id) = starts.pop().expect("not empty");
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
            while starts.last().is_some_and(|(at, _)| *at <= now) {
                let (_, id) = starts.pop().expect("not empty");
                self.trace.line("sim", format_args!("start {id}"));
                self.register(&mut sim, &id, &gossip);
                self.dirty = true;
            }
            while next_fault < scn.faults.len()
                && Duration::from_secs_f64(scn.faults[next_fault].at_s) <= now
            {
                self.apply(&mut sim, next_fault, &gossip)?;
                next_fault += 1;
                self.dirty = true;
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
        // The run's wall time (above).
        #[allow(clippy::disallowed_methods, clippy::disallowed_types)]
        let wall = wall_start.elapsed();
        drop(sim);
        Ok(self.finish(simulated, wall, probe))
    }

    /// Takes the node events of the last step.
    fn absorb(&mut self, sim: &mut turmoil::Sim<'_>) {
        let events = self.trace.take_events();
        self.dirty |= !events.is_empty();
        for ev in events {
            match ev {
                NodeEvent::View { at, host, serving } => {
                    let (ids, weights) = self.intern_view(serving);
                    self.view_weight_log.push((host.clone(), weights.clone()));
                    self.view_weights.insert(host.clone(), weights);
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
                NodeEvent::PeerEjected { at, host, peer } => {
                    self.peer_events.push((at, host, peer, false));
                }
                NodeEvent::PeerRestored { at, host, peer } => {
                    self.peer_events.push((at, host, peer, true));
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
            self.dirty = true;
            self.trace.line("sim", format_args!("node {n} stopped"));
            self.draining.remove(&n);
            self.running.remove(&n);
            self.views.remove(&n);
            self.view_weights.remove(&n);
        }
    }

    /// The one copy of a view (serving ids, and `id=weight`) that every
    /// node reporting the same serving members and weights shares: a
    /// cluster of N nodes reports about N views per member that joins,
    /// mostly the same ones, and each copy holds N ids (1,000 nodes
    /// forming would keep gigabytes of copies).
    fn intern_view(
        &mut self,
        serving: Vec<(String, u32)>,
    ) -> (Arc<[String]>, Arc<BTreeMap<String, u32>>) {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        serving.hash(&mut h);
        let same = self.distinct_views.entry(h.finish()).or_default();
        if let Some(v) = same.iter().find(|(_, w)| {
            w.len() == serving.len() && w.iter().eq(serving.iter().map(|(id, w)| (id, w)))
        }) {
            return v.clone();
        }
        let ids: Arc<[String]> = serving.iter().map(|(id, _)| id.clone()).collect();
        let weights: Arc<BTreeMap<String, u32>> = Arc::new(serving.into_iter().collect());
        same.push((ids.clone(), weights.clone()));
        (ids, weights)
    }

    /// The serving set every ready node should converge to.
    fn expected(&self) -> BTreeSet<String> {
        self.running.difference(&self.draining).cloned().collect()
    }

    fn check_convergence(&mut self, faults_applied: usize) {
        let slot = faults_applied;
        // While a partition stands there is no one ring to agree on.
        if self.converged[slot].is_some() || !self.partitions.is_empty() || !self.dirty {
            return;
        }
        self.dirty = false;
        let expected = self.expected();
        let want: Vec<String> = expected.iter().cloned().collect();
        // Each view must also give every serving node the weight it publishes.
        let want_weights: BTreeMap<String, u32> =
            want.iter().map(|n| (n.clone(), self.weights[n])).collect();
        let ok = !expected.is_empty()
            && expected.iter().all(|n| {
                self.views
                    .get(n)
                    .map_or_else(|| want.len() == 1 && want[0] == *n, |v| v[..] == want[..])
                    && self.view_weights.get(n).is_none_or(|w| **w == want_weights)
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
    /// sidecar on its own host (on the node's admin address, over loopback).
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
}
