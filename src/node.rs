//! The composition root: [`Node::build`] wires the engine to the adapters;
//! [`Node::run`] serves until the shutdown future resolves, then drains.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::adapters::cluster::gossip::{self, GossipIdentity, Published};
use crate::adapters::cluster::pause::PauseWatch;
use crate::adapters::cluster::roster::Roster;
use crate::adapters::front::ingress::{self, Ingress, ListenerSetup};
use crate::adapters::front::sip::{self, SipApp, SipEntry, SipUpstream};
use crate::adapters::http::entry_tls;
use crate::adapters::node_state::NodeState;
use crate::adapters::ops::admin_server::{self, AdminServer};
use crate::adapters::serve::app::App;
use crate::adapters::serve::app::handle::{Forward, Handle};
use crate::adapters::serve::app::service::ErasedApp;
use crate::adapters::serve::owner::{KindHandlers, Owner};
use crate::adapters::transport::peer::{self, PeerLinks};
use crate::adapters::transport::tls::{self, TlsMaterial};
use crate::config::NodeConfig;
use crate::engine::balance::metric::{MetricSmoother, raw_metric};
use crate::engine::membership::{Member, MembershipView, NodeStatus};
use crate::engine::node_id::NodeId;
use crate::engine::route::Router;
use crate::engine::sip::upstream as sip_upstream;
use crate::engine::view_compose::ViewComposer;
use crate::env::{Env, NodeEvent, Observer};

mod routing_log;
use routing_log::{left_reason, log_routing_changes};

/// What a client listener configured by `l` does before HTTP: the PROXY
/// header it expects, and the TLS acceptor with its certificates.
///
/// # Errors
/// [`NodeError::EntryTls`] when a certificate or key cannot be used.
fn listener_setup(
    l: &crate::config::ListenerSettings,
    ingress: &crate::config::IngressSettings,
) -> Result<ListenerSetup, NodeError> {
    let tls = match &l.tls {
        Some(t) => {
            let certs = entry_tls::EntryCerts::load(t)?;
            let configs = crate::adapters::http::client_cert::EntryTls::new(certs.clone())?;
            Some((configs, certs))
        }
        None => None,
    };
    Ok(ListenerSetup {
        proxy_protocol: l.proxy_protocol,
        tls,
        handshake_timeout: ingress.header_read_timeout,
    })
}

/// A node could not be built or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// TLS material missing or invalid: run `peerlb certs` (or `peerlb up`).
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// The QUIC endpoint could not be set up.
    #[error(transparent)]
    Peer(#[from] peer::PeerSetupError),
    /// Gossip could not start.
    #[error(transparent)]
    Gossip(#[from] gossip::GossipError),
    /// The balancing options are invalid (config validation prevents this).
    #[error("balancing options: {0}")]
    Router(crate::engine::route::OptionsError),
    /// The metric history is out of range (config validation prevents this).
    #[error("metric history: {0}")]
    Metric(String),
    /// A listener could not be registered with the runtime.
    #[error("listener: {0}")]
    Listener(std::io::Error),
    /// A client listener's certificate or key cannot be used (`peerlb
    /// node` checks them before binding, so this is a file changed since).
    #[error(transparent)]
    EntryTls(#[from] entry_tls::EntryTlsError),
    /// A client listener's TLS configuration could not be made.
    #[error("listener tls: {0}")]
    EntryTlsConfig(rustls::Error),
    /// The trust of `sip_app = "tls:..."` cannot be used (`[sips]`).
    #[error(transparent)]
    SipUpstreamTls(#[from] sip::UpstreamTlsError),
}

/// One peerlb node, built but not running.
pub struct Node {
    config: NodeConfig,
    env: Env,
    tls: TlsMaterial,
    /// What each client listener does before HTTP, in the order of
    /// `env.http_listeners` (`http_addr`, then the shared address).
    setups: Vec<Arc<ListenerSetup>>,
    /// This node as the first view has it (alone, at slow start's first
    /// weight), and that view's channel: made here so the [`Handle`] exists
    /// before [`Node::run`].
    self_member: Member,
    view_tx: watch::Sender<Arc<MembershipView>>,
    handle: Handle,
    /// The local app (the config's, or the one the builder was given).
    app: App,
}

impl Node {
    /// Builds a node from a validated config and the bound sockets of `env`.
    /// Reads the TLS files; binds nothing.
    ///
    /// # Errors
    /// [`NodeError::Tls`] when the CA, certificate or key cannot be loaded.
    pub fn build(config: NodeConfig, env: Env) -> Result<Node, NodeError> {
        Node::build_with(config, env, None)
    }

    /// [`Node::build`] serving with `service` instead of the config's app.
    pub(crate) fn build_with(
        config: NodeConfig,
        mut env: Env,
        service: Option<ErasedApp>,
    ) -> Result<Node, NodeError> {
        let tls = match env.tls.take() {
            Some(m) => m,
            None => TlsMaterial::load(&config.tls.ca, &config.tls.cert, &config.tls.key)?,
        }
        .with_time_provider(Arc::new(crate::env::ClockAdapter(env.clock.clone())));
        // A node handed another node's files must not start under a false name.
        tls::verify_peer_is(tls.cert_chain(), &config.node.id)?;
        let mut setups = Vec::new();
        for i in 0..env.http_listeners.len() {
            let l = if i == 0 {
                &config.listener
            } else {
                &config.shared_listener
            };
            setups.push(Arc::new(listener_setup(l, &config.ingress)?));
        }
        let me = &config.node;
        let self_member = Member {
            id: me.id.clone(),
            generation: env.generation,
            peer_addr: me.peer_addr,
            http_addr: me.http_addr,
            weight: config
                .routing
                .slow_start
                .weight_at(me.weight, Duration::ZERO),
            status: NodeStatus::Serving,
            load: 100,
            inflight: 0,
        };
        let (view_tx, view_rx) = watch::channel(Arc::new(MembershipView::new(
            me.id.clone(),
            [self_member.clone()],
            config.routing.ring,
        )));
        let handle = Handle::new(me.id.clone(), view_rx);
        let app = match service {
            Some(s) => App::erased(s, handle.clone()),
            None => App::new(&config.app, env.app_slowdown.clone(), handle.clone()),
        }
        .with_observer(env.observer.clone());
        Ok(Node {
            config,
            env,
            tls,
            setups,
            self_member,
            view_tx,
            handle,
            app,
        })
    }

    /// The node's [`Handle`]: who owns a key, the serving members, the
    /// ring's changes. Valid before and while the node runs; after it
    /// stops, [`ViewChanges::changed`](crate::ViewChanges::changed) ends.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Serves until `shutdown` resolves, then drains: publishes `leaving`,
    /// keeps serving for `drain_grace` so every peer stops routing here,
    /// closes the listeners, waits (up to `drain_timeout`) for in-flight
    /// requests, and closes the peer links and gossip.
    ///
    /// # Errors
    /// [`NodeError`] when the endpoint, gossip or listeners cannot start.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), NodeError> {
        // Long: the composition root: every task of a node started in the order they depend on
        // each other, then the shutdown sequence; it is wiring, no decision.
        let Node {
            config,
            env,
            tls,
            setups,
            self_member,
            view_tx,
            handle,
            app,
        } = self;
        let me = config.node.clone();
        let settings = config.peer.clone();
        let (endpoint, client) = peer::endpoint(
            env.peer_socket,
            env.quic_runtime,
            &tls,
            &settings,
            env.seed,
            env.clock,
        )?;
        let observer = env.observer;
        // Slow start: the ramp begins as the node joins gossip, where the
        // others put it on their rings at the weight it publishes.
        let slow_start = config.routing.slow_start;
        let ramp_began = tokio::time::Instant::now();
        let first_weight = self_member.weight;
        let pause = Arc::new(PauseWatch::new(
            PauseWatch::threshold_for(settings.idle_timeout),
            PauseWatch::grace_for(settings.connect_timeout, config.gossip.interval),
        ));
        let pause_task = tokio::spawn(pause.clone().run(observer.clone()));
        let links = PeerLinks::new(
            me.id.clone(),
            endpoint,
            client,
            settings,
            observer.clone(),
            pause.clone(),
        );
        let gossip = gossip::start(
            &GossipIdentity {
                cluster: config.cluster.clone(),
                node_id: me.id.clone(),
                generation: env.generation,
                gossip_addr: me.gossip_addr,
                listen_addr: config.bind.gossip,
            },
            &config.gossip,
            &Published {
                peer_addr: me.peer_addr,
                http_addr: me.http_addr,
                weight: first_weight,
                status: NodeStatus::Serving,
            },
            &*env.gossip,
            env.gossip_keys.clone(),
            crate::adapters::transport::tls::state_signatures(
                config.gossip.state_signatures,
                &tls,
            )?,
        )
        .await?;

        let view_rx = view_tx.subscribe();
        // Beside the view, never read by routing: the members out of it.
        let roster = Arc::new(std::sync::Mutex::new(Roster::new(
            config.nodes.iter().map(|n| n.id.clone()),
            tokio::time::Instant::now(),
        )));
        let view_task = tokio::spawn(maintain_view(
            gossip.members(),
            links.clone(),
            view_tx,
            self_member,
            config.routing.ring,
            observer.clone(),
            pause,
            roster.clone(),
        ));

        let state = Arc::new(
            NodeState::new(
                me.id.clone(),
                view_rx,
                Router::with_options(
                    config.routing.policy,
                    config.routing.rules.clone(),
                    config.routing.router,
                )
                .map(|mut r| {
                    r.set_route_cookie(&config.ingress.route_cookie.name);
                    r.set_session_route(config.routing.session_route.clone());
                    r
                })
                .map_err(NodeError::Router)?,
                config.ingress.rules_source.clone(),
                gossip.publisher(),
                links.clone(),
            )
            .with_slow_start(slow_start, me.weight, ramp_began)
            .with_roster(roster),
        );
        state.metrics.set_start_time_ms(env.generation);
        let ramp_task = (!slow_start.is_off()).then(|| {
            let state = state.clone();
            tokio::spawn(async move { state.ramp_weight().await })
        });
        let sip_upstream = sip::upstream_of(&config)?.map(|transport_addr| {
            SipUpstream::new(
                transport_addr,
                (
                    sip_upstream::transaction_timeout(config.ingress.response_timeout),
                    config.ingress.sip_timer_c,
                ),
                me.id.as_str(),
                (state.clone(), Some(links.clone())),
            )
        });
        let sip_app = Arc::new(SipApp::new(me.id.clone(), me.sip_addr).with_upstream(sip_upstream));
        let owner = Arc::new(Owner::new(
            state.clone(),
            app,
            KindHandlers {
                sip: sip_app.clone(),
                admin: crate::adapters::ops::admin::members::answer_peer_boxed,
            },
        ));
        state
            .tunnels
            .set_idle_timeout(config.ingress.websocket_idle_timeout);
        let ingress = Arc::new(Ingress::new(
            state.clone(),
            owner.clone(),
            links.clone(),
            config.ingress.clone(),
            env.seed,
        ));
        // The app's own requests to a key's owner take the ingress's path.
        handle.set_forward(Arc::downgrade(&ingress) as std::sync::Weak<dyn Forward>);
        let peer_task = tokio::spawn(peer::serve(links.clone(), owner));

        // Accept clients only once every live peer is connected (or after
        // startup_wait): until then this node would own every key alone.
        // The kernel queues client connections meanwhile.
        let waited = wait_for_peers(
            &me.id,
            gossip.members(),
            links.connected(),
            config.gossip.interval * 3,
            config.lifecycle.startup_wait,
        )
        .await;
        if !waited {
            warn!(wait = ?config.lifecycle.startup_wait, "not every live peer is connected yet: accepting clients anyway");
        }

        let (stop_tx, stop_rx) = watch::channel(false);
        let mut listeners = Vec::new();
        let mut cert_watches = Vec::new();
        let mut entry_certs = Vec::new();
        for (l, setup) in env.http_listeners.into_iter().zip(setups) {
            let addr = l.local_addr().ok();
            if let Some(addr) = addr {
                info!(%addr, proxy_protocol = setup.proxy_protocol.is_some(), https = setup.tls.is_some(), "listening for clients");
            }
            if let Some((_, certs)) = &setup.tls {
                entry_certs.push(certs.clone());
                let st = state.clone();
                cert_watches.push(tokio::spawn(entry_tls::watch_files(
                    certs.clone(),
                    move |r| {
                        let c = &st.counters;
                        match r {
                            Ok(_) => c.tls_reloads.fetch_add(1, Ordering::Relaxed),
                            Err(_) => c.tls_reload_failures.fetch_add(1, Ordering::Relaxed),
                        };
                    },
                )));
            }
            listeners.push(tokio::spawn(ingress::serve(
                l,
                setup,
                ingress.clone(),
                stop_rx.clone(),
            )));
        }
        state.set_entry_certs(entry_certs);
        if let (Some(sockets), Some(addr)) = (env.sip, me.sip_addr) {
            let entry = Arc::new(SipEntry::new(
                state.clone(),
                sip_app,
                links.clone(),
                (
                    config.ingress.response_timeout,
                    config.ingress.header_read_timeout,
                    config.ingress.sip_timer_c,
                ),
                sip::TcpLimits {
                    conns: crate::adapters::http::Handler::conn_table(&*ingress).clone(),
                    idle_timeout: config.ingress.sip_idle_timeout,
                },
                config.ingress.sip_udp_rate,
            ));
            let shared = sockets
                .shared
                .zip(config.shared_sip_listen)
                .map(|((udp, tcp), a)| (udp, tcp, a));
            // SIPS wiring: the sips_addr listener, over TLS, on the TCP path.
            if let (Some(l), Some(local), Some(certs)) =
                (sockets.sips, me.sips_addr, &config.sips.certs)
            {
                let acceptor = sip::sips_acceptor(entry_tls::EntryCerts::load(certs)?)
                    .map_err(NodeError::EntryTlsConfig)?;
                let shared = sockets.shared_sips.zip(config.shared_sips_listen);
                for (l, local) in std::iter::once((l, local)).chain(shared) {
                    let tls = Some(acceptor.clone());
                    let serve = sip::serve_tcp(l, local, tls, entry.clone(), stop_rx.clone());
                    listeners.push(tokio::spawn(serve));
                }
            }
            for (udp, tcp, local) in std::iter::once((sockets.udp, sockets.tcp, addr)).chain(shared)
            {
                listeners.push(tokio::spawn(sip::serve_udp(
                    udp,
                    local,
                    entry.clone(),
                    stop_rx.clone(),
                )));
                listeners.push(tokio::spawn(sip::serve_tcp(
                    tcp,
                    local,
                    None,
                    entry.clone(),
                    stop_rx.clone(),
                )));
            }
        }
        // The admin listener serves through the drain (status stays
        // readable) and closes last.
        let (admin_stop_tx, admin_stop_rx) = watch::channel(false);
        // The metrics listener, when there is one, stops with the admin one.
        let metrics_task = env.metrics_listener.map(|l| {
            if let Ok(addr) = l.local_addr() {
                info!(%addr, "metrics listening");
            }
            tokio::spawn(admin_server::serve(
                l,
                Arc::new(AdminServer::metrics_only(
                    state.clone(),
                    config.ingress.header_read_timeout,
                    config.ingress.send_timeout,
                )),
                admin_stop_rx.clone(),
            ))
        });
        let admin_task = env.admin_listener.map(|l| {
            if let Ok(addr) = l.local_addr() {
                info!(%addr, "admin API listening");
            }
            tokio::spawn(admin_server::serve(
                l,
                Arc::new(AdminServer::new(
                    state.clone(),
                    config.ingress.header_read_timeout,
                    config.ingress.send_timeout,
                )),
                admin_stop_rx,
            ))
        });
        info!(node = %me.id, generation = env.generation, peer = %me.peer_addr, gossip = %me.gossip_addr, "node running");
        observer.observe(&NodeEvent::Running {
            generation: env.generation,
        });

        let rules_task = config
            .ingress
            .rules_source
            .as_ref()
            .and_then(|s| s.file())
            .map(|f| tokio::spawn(watch_rules(state.clone(), f.to_path_buf())));
        let load_task = tokio::spawn(publish_load(
            state.clone(),
            gossip.publisher(),
            MetricSmoother::new(config.metric.history)
                .map_err(|e| NodeError::Metric(e.to_string()))?,
            config.metric.capacity,
            config.gossip.interval,
        ));

        shutdown.await;
        info!(grace = ?config.lifecycle.drain_grace, "draining: published leaving, still serving");
        // From here every client answer says `Connection: close`.
        let _ = state.set_status(NodeStatus::Leaving).await;
        tokio::time::sleep(config.lifecycle.drain_grace).await;
        state.stop_accepting();
        let _ = stop_tx.send(true);
        for l in listeners {
            let _ = l.await;
        }
        // The stop signal also closed every client connection gracefully
        // (HTTP/1.1 after its request in flight, HTTP/2 with GOAWAY after
        // its open streams): wait for them, for the requests in flight,
        // and for the open WebSocket tunnels.
        let tunnels = |s: &NodeState| {
            s.tunnels.open(crate::adapters::tunnel::Role::Entry)
                + s.tunnels.open(crate::adapters::tunnel::Role::Owner)
        };
        let drained = tokio::time::timeout(config.lifecycle.drain_timeout, async {
            while state.inflight() > 0
                || state.counters.client_connections.load(Ordering::Relaxed) > 0
                || tunnels(&state) > 0
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        if drained.is_err() {
            warn!(
                inflight = state.inflight(),
                client_connections = state.counters.client_connections.load(Ordering::Relaxed),
                tunnels = tunnels(&state),
                "drain timeout: closing with requests, connections or tunnels open"
            );
        }
        state.tunnels.close_all();
        load_task.abort();
        if let Some(t) = ramp_task {
            t.abort();
        }
        if let Some(t) = rules_task {
            t.abort();
        }
        for t in cert_watches {
            t.abort();
        }
        view_task.abort();
        pause_task.abort();
        links.close().await;
        peer_task.abort();
        gossip.shutdown().await;
        let _ = admin_stop_tx.send(true);
        if let Some(t) = admin_task {
            let _ = t.await;
        }
        if let Some(t) = metrics_task {
            let _ = t.await;
        }
        info!("node stopped");
        Ok(())
    }
}

/// Polls the rules file every 2 s and reloads the rules when its
/// modification time or size changes; invalid new rules are logged and the
/// old ones stay in force.
async fn watch_rules(state: Arc<NodeState>, file: std::path::PathBuf) {
    let stamp = |m: std::fs::Metadata| (m.modified().ok(), m.len());
    let mut last = std::fs::metadata(&file).ok().map(stamp);
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tick.tick().await;
        let now = std::fs::metadata(&file).ok().map(stamp);
        if now.is_none() || now == last {
            continue;
        }
        last = now;
        if let Err(e) = state.reload_rules().await {
            warn!(file = %file.display(), error = %e, "rules file changed but is invalid: the old rules stay in force");
        }
    }
}

/// Every `interval`, computes this node's load metric (0..=100, 100 idle)
/// with mod_oc4j's conversion of the app processing time accrued since the
/// previous interval (seconds per second, `balance/metric.rs`), bounded by
/// the requests the app is serving, smooths it (mod_oc4j history) and
/// publishes it with the served count as gossip keys `load` and `inflight`
/// when they change. `inflight` counts the requests this node's app serves
/// (client requests served here plus proxied ones), never the requests it
/// only forwards: it is the load bounded-load hashing and `least-load`
/// compare, the same on every node. It also ends a drain whose timeout
/// has passed (`NodeState::end_timed_out_drain`).
async fn publish_load(
    state: Arc<NodeState>,
    publisher: gossip::Publisher,
    mut smoother: MetricSmoother,
    capacity: u32,
    interval: Duration,
) {
    let mut tick = tokio::time::interval(interval);
    let mut last = None;
    let mut last_busy_us = state.app_busy_us();
    loop {
        tick.tick().await;
        let busy_us = state.app_busy_us();
        let delta = (busy_us - last_busy_us) as f64 / 1e6 / interval.as_secs_f64();
        last_busy_us = busy_us;
        let serving = state.serving();
        let load = smoother.observe(raw_metric(serving, capacity, delta));
        state.end_timed_out_drain().await;
        if last != Some((load, serving)) {
            publisher.set_load(load, serving).await;
            last = Some((load, serving));
        }
    }
}

/// Waits until at least `settle` has passed (gossip has had a few rounds
/// with the seeds) and every live serving peer has an authenticated
/// connection; gives up after `limit`. True when the peers are connected.
async fn wait_for_peers(
    self_id: &NodeId,
    mut gossip: watch::Receiver<Vec<Member>>,
    mut connected: watch::Receiver<BTreeSet<NodeId>>,
    settle: Duration,
    limit: Duration,
) -> bool {
    let start = tokio::time::Instant::now();
    let settled_at = start + settle.min(limit);
    let all_connected = tokio::time::timeout(limit, async {
        loop {
            let missing = {
                let up = connected.borrow_and_update();
                gossip
                    .borrow_and_update()
                    .iter()
                    .filter(|m| m.id != *self_id && m.status == NodeStatus::Serving)
                    .any(|m| !up.contains(&m.id))
            };
            let settled = tokio::time::Instant::now() >= settled_at;
            if settled && !missing {
                return;
            }
            tokio::select! {
                r = gossip.changed() => if r.is_err() { return },
                r = connected.changed() => if r.is_err() { return },
                _ = tokio::time::sleep_until(settled_at), if !settled => {},
            }
        }
    })
    .await;
    all_connected.is_ok()
}

/// Rebuilds the membership view whenever gossip's live set or the set of
/// authenticated peer connections changes. The members are composed by
/// [`ViewComposer`]: a peer is routable only while gossip says it is live
/// AND its QUIC connection is up; this node is always in its own view. Each change is logged and reported to
/// `observer` ([`NodeEvent::ViewChanged`]).
///
/// Views are built at most once per [`VIEW_INTERVAL`]: changes that
/// arrive sooner are taken together at its end (a cluster of N nodes
/// forming sends each node about 2 N changes, each worth a view of N
/// members), so a dead peer leaves routing at most that much later.
///
/// A view's ring table is built when a request first routes with it
/// ([`MembershipView::ring`]); this task warms it off the request path
/// once the views stop changing for [`RING_WARM_QUIET`], and at the
/// latest [`RING_WARM_MAX`] after the first view left cold, so a burst of
/// views (a cluster forming: one view per member learned and per
/// handshake) costs one table, not one per view. Routing takes every view
/// at once, so a dead peer leaves routing as soon as before.
///
/// Just after a pause of this node's own ([`PauseWatch::suspected`]), a
/// peer that leaves gossip's live set or loses its connection stays in
/// the view (and supervised) until the grace ends: its silence is this
/// node's absence, and a request for a key it owns is forwarded to it
/// (dialled again) rather than served here. At the end of the grace the
/// view is rebuilt from what gossip and the peer links say then.
///
/// Every view built is also given to `roster`, which keeps the members
/// that left it (failed or left, with the [`left_reason`]) for the
/// operator's surfaces; routing never reads it.
#[allow(clippy::too_many_arguments)]
async fn maintain_view(
    mut gossip: watch::Receiver<Vec<Member>>,
    links: Arc<PeerLinks>,
    view_tx: watch::Sender<Arc<MembershipView>>,
    self_member: Member,
    ring: crate::engine::ring::RingSpec,
    observer: Arc<dyn Observer>,
    pause: Arc<PauseWatch>,
    roster: Arc<std::sync::Mutex<Roster>>,
) {
    let mut connected = links.connected();
    let mut composer = ViewComposer::new(self_member);
    // When to build the current view's ring if nothing has: the first
    // cold view's time plus RING_WARM_MAX, and the last change's plus
    // RING_WARM_QUIET.
    let mut cold_since: Option<tokio::time::Instant> = None;
    let mut warm_at = tokio::time::Instant::now();
    loop {
        let members = gossip.borrow_and_update().clone();
        let up: BTreeSet<_> = connected.borrow_and_update().clone();
        let holding = pause.suspected();
        let composed = composer.compose(members, up, holding);
        links.sync(&composed.supervised);
        let view = view_tx.borrow().with_members(composed.members, ring);
        let up = composer.up();
        let changed = view_tx.borrow().version() != view.version();
        if changed {
            log_routing_changes(
                view_tx.borrow().serving_ids(),
                view.serving_ids(),
                &gossip.borrow(),
                up,
            );
            let serving: Vec<(NodeId, u32)> = view
                .serving_ids()
                .iter()
                .filter_map(|id| view.get(id).map(|m| (id.clone(), m.weight)))
                .collect();
            // `weights`: `id=weight` of each serving member, in id order.
            let weights: Vec<String> = serving
                .iter()
                .map(|(id, weight)| format!("{id}={weight}"))
                .collect();
            info!(
                version = view.version(),
                serving = ?view.serving_ids(),
                weights = %weights.join(" "),
                "membership view changed"
            );
            observer.observe(&NodeEvent::ViewChanged {
                version: view.version(),
                serving: &serving,
            });
        }
        let now = tokio::time::Instant::now();
        roster
            .lock()
            .expect("roster lock")
            .observe(&view, now, |id| left_reason(id, &gossip.borrow(), up));
        let next_view_at = now + VIEW_INTERVAL;
        if view.ring_is_built() {
            cold_since = None;
        } else {
            let since = *cold_since.get_or_insert(now);
            warm_at = (now + RING_WARM_QUIET).min(since + RING_WARM_MAX);
        }
        view_tx.send_replace(Arc::new(view));
        loop {
            tokio::select! {
                r = gossip.changed() => if r.is_err() { return },
                r = connected.changed() => if r.is_err() { return },
                // Held peers are looked at again when the grace ends.
                _ = tokio::time::sleep_until(pause.look_again_at()), if holding => {}
                _ = tokio::time::sleep_until(warm_at), if cold_since.is_some() => {
                    view_tx.borrow().ring();
                    cold_since = None;
                    continue;
                }
            }
            break;
        }
        if tokio::time::Instant::now() < next_view_at {
            tokio::time::sleep_until(next_view_at).await;
        }
    }
}

/// Shortest time between two views built by [`maintain_view`].
const VIEW_INTERVAL: Duration = Duration::from_millis(20);

/// Quiet time after the last view change before its ring is built off
/// the request path ([`maintain_view`]): longer than a gossip round at
/// the default 200 ms, so the views of a cluster forming (changes a round
/// apart for a second or two) build one table, not one per round. At
/// 50 ms, a 100-node simulation spent a quarter of its CPU rebuilding
/// tables no request used (simulations/README.md, Speed).
const RING_WARM_QUIET: Duration = Duration::from_millis(250);

/// Longest time a view's ring is left for the request path to build
/// while views keep changing ([`maintain_view`]). A request in that time
/// builds it (a rebuild from the last table: about one score per slot
/// for each member that changed).
const RING_WARM_MAX: Duration = Duration::from_millis(1000);

/// Makes sure the certificates of every node listed in `config` exist
/// (used by `peerlb up`).
///
/// # Errors
/// [`tls::TlsError`] when they cannot be written.
pub fn ensure_local_certs(config: &NodeConfig) -> Result<(), tls::TlsError> {
    let ids: Vec<&str> = config.nodes.iter().map(|n| &*n.id).collect();
    tls::ensure_local(&config.tls.dir, &config.cluster, &ids).map(|_| ())
}
