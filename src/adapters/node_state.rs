//! A node's shared request state: request counters, requests in flight
//! (on this node, and outstanding per owner for the load-tracking
//! policies), the app's mean serve time, the published weight, and the
//! router with its rules. The ingress, the owner side and the admin API
//! read and change the node through it; it imports none of them.
//!
//! What keeps a request counted while it lasts (`Tracker`, `Outstanding`,
//! `Inflight`, the tracked response body) is in `node_state/tracking.rs`.

use crate::adapters::transport::peer::PeerLinks;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Response;
use rand::Rng;
use tokio::sync::watch;
use tracing::{debug, info};

use crate::adapters::REQUEST_PATH;
use crate::adapters::body::Body;
use crate::adapters::cluster::gossip::Publisher;
use crate::adapters::cluster::roster::Roster;
use crate::adapters::errors::{ReloadError, RequestError, StateError, WeightError, error_response};
use crate::config::RulesSource;
use crate::engine::balance::PolicyKind;
use crate::engine::membership::{MembershipView, NodeStatus};
use crate::engine::node_id::NodeId;
use crate::engine::operator;
use crate::engine::route::{EntryDecision, OwnInflight, Router};
use crate::engine::rules::RequestView;
use crate::engine::slow_start::SlowStart;

/// A slow-start ramp and the time it began.
#[derive(Debug)]
struct Ramp {
    slow_start: SlowStart,
    began: tokio::time::Instant,
}

/// Where a running slow start stands (status and metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlowStartProgress {
    /// The step in force, `1..=steps`.
    pub step: u32,
    /// The ramp's step count.
    pub steps: u32,
    /// Time left until the ramp ends (the full weight is published from
    /// the start of the last step on).
    pub remaining: Duration,
}

/// Request counters (monotonic).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Requests received from clients.
    pub requests: AtomicU64,
    /// Requests served by the local app (client or proxied).
    pub served_local: AtomicU64,
    /// Requests forwarded to an owner.
    pub forwarded: AtomicU64,
    /// Forward attempts that failed over to the next candidate.
    pub failovers: AtomicU64,
    /// Proxied requests received whose owner in this node's view is another node.
    pub proxied_disagree: AtomicU64,
    /// Client requests cancelled because the client left before its
    /// answer (an HTTP/1.1 connection closed or reset, an HTTP/2 stream
    /// reset or its connection lost): the app exchange, or the forwarded
    /// one and its owner's, ended.
    pub client_aborted: AtomicU64,
    /// Requests answered with an error status by this node.
    pub errors: AtomicU64,
    /// Client connections closed at accept because `limits.max_connections`
    /// were open and every one was busy.
    pub connections_refused: AtomicU64,
    /// Client connections closed at accept because their source address
    /// held its share (`limits.max_connections_per_source_percent`).
    pub connections_refused_source: AtomicU64,
    /// Idle client connections closed at the cap to admit a new one.
    pub connections_closed_idle: AtomicU64,
    /// Client connections open now (a gauge, not monotonic).
    pub client_connections: AtomicU64,
    /// HTTP/2 client connections accepted.
    pub h2_connections: AtomicU64,
    /// HTTP/2 client connections closed for a flood of streams the
    /// client reset before their answers (rapid reset).
    pub h2_reset_floods: AtomicU64,
    /// Client connections closed before HTTP on a listener that expects
    /// the PROXY protocol: no valid header in time.
    pub proxy_header_refused: AtomicU64,
    /// Client connections closed before HTTP on an HTTPS listener: the
    /// TLS handshake failed or timed out.
    pub tls_handshake_failed: AtomicU64,
    /// Certificate reloads of the HTTPS listeners that put new
    /// certificates in force (file change or `POST /_peerlb/tls/reload`).
    pub tls_reloads: AtomicU64,
    /// Certificate reloads refused (bad files: the old certificates stay).
    pub tls_reload_failures: AtomicU64,
    /// SIP requests received from clients (UDP and TCP).
    pub sip_requests: AtomicU64,
    /// SIP messages from clients that did not parse (answered 400 or
    /// dropped).
    pub sip_malformed: AtomicU64,
    /// SIP forward attempts to an owner (one per candidate tried).
    pub sip_forwarded: AtomicU64,
    /// SIP UDP datagrams dropped unread: their source was past
    /// `limits.sip_udp_requests_per_source` in its interval.
    pub sip_udp_rate_limited: AtomicU64,
    /// SIP answers over UDP not sent: they would have passed twice the
    /// bytes of the request (a forged source's reflection bound).
    pub sip_udp_answers_withheld: AtomicU64,
    /// Callers' ACKs of a non-2xx answer to an INVITE that the owner had
    /// ACKed to `sip_app` itself: absorbed, not relayed (RFC 3261
    /// 17.1.1.3).
    pub sip_acks_absorbed: AtomicU64,
    /// INVITEs relayed to `sip_app` whose Timer C fired
    /// (`limits.sip_timer_c_ms` with no provisional answer): the owner
    /// CANCELled the branch.
    pub sip_timer_c_cancels: AtomicU64,
    /// Requests of `sip_app` toward a caller that the owner sent over the
    /// caller's own TCP or TLS connection (RFC 5923), on this node or the
    /// one holding it.
    pub sip_flow_requests: AtomicU64,
    /// Requests of `sip_app` toward a caller whose connection was gone:
    /// sent over a new connection or datagram, else answered `430`.
    pub sip_flow_failed: AtomicU64,
    /// SIP TCP connections closed for a message not finished within
    /// `limits.header_read_timeout_ms` or idle past
    /// `limits.sip_idle_timeout_ms`.
    pub sip_tcp_timed_out: AtomicU64,
    /// WebSocket upgrades answered 503: open tunnels held
    /// `limits.max_tunnels_percent` of the connection cap.
    pub tunnels_refused: AtomicU64,
    /// Client requests answered 4xx by peerlb itself, not by the app: its
    /// own checks (400, 408, 414, 421, 431: answers that carry
    /// `peerlb-error-from`) and hyper's answers at the edge (400, 431
    /// before a request head was whole; a head that timed out is closed
    /// with nothing written and not counted).
    pub edge_client_errors: AtomicU64,
    /// Responses cut because their client took nothing in time, or at
    /// the response budget (counted by `http::relay`).
    pub response_cuts: Arc<crate::adapters::http::relay::CutCounts>,
}

/// Whether the router's policy reads load figures.
fn router_tracks_load(r: &Router) -> bool {
    matches!(r.policy(), PolicyKind::LeastLoad | PolicyKind::ByTraffic)
        || r.options().hash_balance_factor.is_some()
}

mod tracking;

pub(crate) use tracking::{Hold, Inflight, Outstanding, Tracker, track_body};

/// The state of one node that its client server, its peer server and its
/// admin API share.
pub(crate) struct NodeState {
    node_id: NodeId,
    view: watch::Receiver<Arc<MembershipView>>,
    router: Arc<Mutex<Router>>,
    /// Requests this entry has outstanding per node, when the policy needs
    /// load figures (least-load, by-traffic, bounded load).
    tracker: Option<Arc<Tracker>>,
    /// Where the rules come from, for reloads (`None`: the embedded config);
    /// held while a reload compiles, so reloads run one at a time and the
    /// last one reads the newest file.
    rules_source: Option<tokio::sync::Mutex<RulesSource>>,
    /// Cumulative time the local app took to return response heads, in µs
    /// (the measured value of the mod_oc4j metric, `balance/metric.rs`).
    busy_us: AtomicU64,
    /// Requests in flight on this node (client and proxied).
    inflight: Arc<AtomicU32>,
    /// Requests the local app is serving (client requests served here and
    /// proxied requests), until their response bodies end: the load this
    /// node publishes as `inflight`.
    serving: Arc<AtomicU32>,
    accepting: AtomicBool,
    /// The status this node publishes (`serving`, `draining`, `offline`,
    /// `leaving`): set at once by [`NodeState::set_status`], before gossip
    /// brings it back into this node's own view; with the time a drain
    /// turns `offline` by itself, if it was given a timeout.
    status: std::sync::Mutex<(NodeStatus, Option<tokio::time::Instant>)>,
    /// The status above is `serving` (read on every client answer without
    /// the lock: [`NodeState::closing`]).
    publishes_serving: AtomicBool,
    /// Ids of the admin changes this node forwards to peers.
    forwarded_changes: AtomicU64,
    /// The manager page's form token, made on the page's first request.
    manager_token: std::sync::OnceLock<String>,
    /// Publishes this node's state (`weight`) into gossip.
    publisher: Publisher,
    /// The peer links (their connection count, for the status).
    links: Arc<PeerLinks>,
    /// The weight this node ramps to and then publishes (config, or the
    /// last `PUT /_peerlb/weight`): its target under slow start.
    weight: AtomicU32,
    /// The slow-start ramp.
    ramp: Mutex<Ramp>,
    /// Held while a weight is computed and published, so ramp steps and
    /// weight changes publish in order.
    publishing: tokio::sync::Mutex<()>,
    /// The weight this node publishes now: [`NodeState::weight`] scaled by
    /// the slow-start step in force.
    published_weight: AtomicU32,
    /// The certificates of this node's HTTPS listeners, for `POST
    /// /_peerlb/tls/reload` (set once the listeners are made).
    entry_certs: std::sync::OnceLock<Vec<Arc<crate::adapters::http::entry_tls::EntryCerts>>>,
    /// Request counters.
    pub counters: Counters,
    /// Latency histograms and reload counters (`GET /_peerlb/metrics`).
    pub metrics: crate::adapters::metrics::Metrics,
    /// The WebSocket tunnels this node relays.
    pub tunnels: crate::adapters::tunnel::Tunnels,
    /// Every member this node has known, those out of its view included
    /// (fed by the view task; routing never reads it).
    roster: Arc<Mutex<Roster>>,
    /// When this node started (uptime in the status).
    started: tokio::time::Instant,
}

impl NodeState {
    /// The state of node `node_id`: `router` decides its requests,
    /// `rules_source` is read again on a reload (`None` for the embedded
    /// config), `publisher` serves [`NodeState::set_weight`]. The weight it
    /// publishes starts as its own member's weight in `view`.
    pub(crate) fn new(
        node_id: NodeId,
        view: watch::Receiver<Arc<MembershipView>>,
        router: Router,
        rules_source: Option<RulesSource>,
        publisher: Publisher,
        links: Arc<PeerLinks>,
    ) -> NodeState {
        let weight = view.borrow().get(&node_id).map_or(0, |m| m.weight);
        NodeState {
            links,
            publisher,
            weight: AtomicU32::new(weight),
            ramp: Mutex::new(Ramp {
                slow_start: SlowStart::OFF,
                began: tokio::time::Instant::now(),
            }),
            publishing: tokio::sync::Mutex::new(()),
            published_weight: AtomicU32::new(weight),
            node_id,
            view,
            tracker: router_tracks_load(&router).then(|| Arc::new(Tracker::for_router(&router))),
            router: Arc::new(Mutex::new(router)),
            rules_source: rules_source.map(tokio::sync::Mutex::new),
            busy_us: AtomicU64::new(0),
            inflight: Arc::new(AtomicU32::new(0)),
            serving: Arc::new(AtomicU32::new(0)),
            accepting: AtomicBool::new(true),
            entry_certs: std::sync::OnceLock::new(),
            status: std::sync::Mutex::new((NodeStatus::Serving, None)),
            publishes_serving: AtomicBool::new(true),
            forwarded_changes: AtomicU64::new(0),
            manager_token: std::sync::OnceLock::new(),
            counters: Counters::default(),
            metrics: crate::adapters::metrics::Metrics::default(),
            tunnels: crate::adapters::tunnel::Tunnels::default(),
            roster: Arc::default(),
            started: tokio::time::Instant::now(),
        }
    }

    /// This state with `roster` (shared with the view task that feeds it).
    pub(crate) fn with_roster(mut self, roster: Arc<Mutex<Roster>>) -> NodeState {
        self.roster = roster;
        self
    }

    /// The roster, locked (held briefly: no await while it is).
    pub(crate) fn roster(&self) -> std::sync::MutexGuard<'_, Roster> {
        self.roster.lock().expect("roster lock")
    }

    /// How long this node has run.
    pub(crate) fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// This state with a slow-start ramp that began at `began`, towards
    /// `target` (the configured weight; the view's own member holds the
    /// ramp's first step, published at start).
    pub(crate) fn with_slow_start(
        self,
        slow_start: SlowStart,
        target: u32,
        began: tokio::time::Instant,
    ) -> NodeState {
        self.weight.store(target, Ordering::Relaxed);
        self.published_weight.store(
            slow_start.weight_at(target, Duration::ZERO),
            Ordering::Relaxed,
        );
        *self.ramp.lock().expect("ramp lock") = Ramp { slow_start, began };
        self
    }

    /// The peer connections and peers by state (metrics).
    pub(crate) fn peer_link_counts(&self) -> crate::adapters::transport::peer::LinkCounts {
        self.links.counts()
    }

    /// Peers ejected from routing since start (metrics).
    pub(crate) fn peer_ejections(&self) -> u64 {
        self.links.ejections()
    }

    /// Records the certificates of this node's HTTPS listeners (once; a
    /// second call changes nothing).
    pub(crate) fn set_entry_certs(
        &self,
        certs: Vec<Arc<crate::adapters::http::entry_tls::EntryCerts>>,
    ) {
        let _ = self.entry_certs.set(certs);
    }

    /// Reloads the certificates of every HTTPS listener: how many were
    /// loaded. A listener whose files cannot be used keeps its certificates.
    ///
    /// # Errors
    /// The first listener's error (the others are still reloaded).
    pub(crate) fn reload_entry_certs(
        &self,
    ) -> Result<usize, crate::adapters::http::entry_tls::EntryTlsError> {
        let mut loaded = 0;
        let mut first_err = None;
        for c in self.entry_certs.get().into_iter().flatten() {
            match c.reload() {
                Ok(n) => {
                    loaded += n;
                    self.counters.tls_reloads.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    self.counters
                        .tls_reload_failures
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "listener certificates cannot be reloaded: the certificates in force stay");
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(loaded),
        }
    }

    /// Open QUIC connections to peers (`peer_connections` in the status).
    pub(crate) fn peer_connections(&self) -> usize {
        self.links.connection_count()
    }

    /// The gossip keyring and its drop counters (admin API).
    pub(crate) fn gossip_keys(&self) -> &Arc<crate::adapters::cluster::keyring::GossipKeys> {
        self.publisher.keys()
    }

    /// This node's id.
    pub(crate) fn node_id(&self) -> &NodeId {
        &self.node_id
    }

    /// The current membership view.
    pub(crate) fn view(&self) -> Arc<MembershipView> {
        self.view.borrow().clone()
    }

    /// Routes one client request against `view`, with this entry's
    /// outstanding requests per node as the load figures when the policy
    /// reads them. Takes the router lock (and the tracker's, inside it).
    pub(crate) fn decide(
        &self,
        req: &RequestView<'_>,
        view: &MembershipView,
        now: Duration,
        rng: &mut impl Rng,
    ) -> EntryDecision {
        let mut router = self.router.lock().expect("router lock");
        match &self.tracker {
            Some(t) => {
                let counts = t.counts.lock().expect("tracker lock");
                let seen = std::cell::RefCell::new(t.seen.lock().expect("tracker lock"));
                let local = |id: &str| {
                    let own_now = counts.get(id).copied().unwrap_or(0);
                    let published = view.get(id).map_or(0, |m| m.inflight);
                    let mut seen = seen.borrow_mut();
                    let at_publish = match seen.get(id) {
                        Some(&(p, own)) if p == published => own,
                        // A new figure: this entry's part of it is what it
                        // has in flight now (the figure is at most a gossip
                        // round old).
                        _ => {
                            seen.insert(NodeId::from(id), (published, own_now));
                            own_now
                        }
                    };
                    OwnInflight {
                        now: own_now,
                        at_publish,
                    }
                };
                router.decide_entry(req, view, now, rng, &local)
            }
            None => router.decide_entry(req, view, now, rng, &|_: &str| OwnInflight::default()),
        }
    }

    /// [`crate::engine::rules::Rules::sni_would_differ`] with the rules in
    /// force (takes the router lock: called only for a request whose
    /// authority is not its connection's SNI).
    pub(crate) fn sni_would_differ(&self, req: &RequestView<'_>, host: &str) -> bool {
        let router = self.router.lock().expect("router lock");
        router.rules().sni_would_differ(req, host)
    }

    /// Routes one SIP request from `client` against `view` with the
    /// router's current rules (their `<sip-rules>`): always consistent
    /// hash (`engine::sip::decide`). Takes the router lock.
    pub(crate) fn decide_sip(
        &self,
        msg: &crate::engine::sip::SipMessage,
        client: std::net::SocketAddr,
        view: &MembershipView,
    ) -> crate::engine::sip::SipDecision {
        let router = self.router.lock().expect("router lock");
        crate::engine::sip::decide(msg, client, router.rules(), view)
    }

    /// The weighted policies' state per node (lbstatus, by-traffic bytes;
    /// see `Router::balance_state`). Takes the router lock: for a scrape.
    pub(crate) fn balance_state(&self) -> crate::engine::route::BalanceState {
        self.router.lock().expect("router lock").balance_state()
    }

    /// Counts a request to `node` as outstanding, when the policy needs it.
    pub(crate) fn track(&self, node: &NodeId, request_bytes: u64) -> Option<Outstanding> {
        self.tracker
            .as_ref()
            .map(|t| Outstanding::new(t, &self.router, node.clone(), request_bytes))
    }

    /// Counts one request in flight on this node until the guard drops.
    pub(crate) fn enter(&self) -> Inflight {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        Inflight(self.inflight.clone(), None)
    }

    /// Counts one proxied request in flight and as served by the local app
    /// until the guard drops.
    pub(crate) fn enter_proxied(&self) -> Inflight {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        self.serving.fetch_add(1, Ordering::Relaxed);
        Inflight(self.inflight.clone(), Some(self.serving.clone()))
    }

    /// Counts one client request served by the local app until the guard
    /// drops (it is already counted in flight by [`NodeState::enter`]).
    pub(crate) fn enter_serving(&self) -> Inflight {
        self.serving.fetch_add(1, Ordering::Relaxed);
        Inflight(self.serving.clone(), None)
    }

    /// Requests in flight on this node (client and proxied).
    pub(crate) fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Requests the local app is serving now (client requests served here
    /// plus proxied requests; not the requests this entry forwards).
    pub(crate) fn serving(&self) -> u32 {
        self.serving.load(Ordering::Relaxed)
    }

    /// Counts a request answered with `e`, logs it, and answers it.
    pub(crate) fn failed(&self, e: RequestError) -> Response<Body> {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        debug!(target: REQUEST_PATH, error = %e, "request failed");
        error_response(&e.into(), &self.node_id)
    }

    /// Adds one local app serve time (to its response head) to the
    /// cumulative processing time of the load metric.
    pub(crate) fn observe_latency(&self, elapsed: Duration) {
        let us = elapsed.as_micros().min(u128::from(u32::MAX)) as u64;
        self.busy_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Cumulative time the local app took to return response heads, in µs
    /// (only grows; the load metric uses its change per interval).
    pub(crate) fn app_busy_us(&self) -> u64 {
        self.busy_us.load(Ordering::Relaxed)
    }

    /// False once the node stopped accepting proxied requests.
    pub(crate) fn accepting(&self) -> bool {
        self.accepting.load(Ordering::Relaxed)
    }

    /// Stops accepting proxied requests (they are refused, retryable):
    /// called when the node closes its listeners on shutdown.
    pub(crate) fn stop_accepting(&self) {
        self.accepting.store(false, Ordering::Relaxed);
    }

    /// The status this node publishes now.
    pub(crate) fn status(&self) -> NodeStatus {
        self.status.lock().expect("status lock").0
    }

    /// True while every answer to a client should say `Connection: close`:
    /// the node is draining, offline or leaving, or has stopped accepting,
    /// so kept-alive clients reconnect through the sprayer (which no longer
    /// picks this node) before its listener closes.
    pub(crate) fn closing(&self) -> bool {
        !self.publishes_serving.load(Ordering::Relaxed) || !self.accepting()
    }

    /// Publishes `to` as this node's status (gossip key `status`): every
    /// node's view, this one's included, takes it within about a gossip
    /// round per hop. `serving`, `draining` and `offline` are an operator's
    /// (`POST /_peerlb/state`); `leaving` is SIGTERM's, and once leaving the
    /// node stays so. Not persisted: a restart publishes `serving`. Returns
    /// the previous status.
    ///
    /// # Errors
    /// [`StateError::Leaving`] when the node is leaving and `to` is not.
    pub(crate) async fn set_status(&self, to: NodeStatus) -> Result<NodeStatus, StateError> {
        self.set_status_until(to, None).await
    }

    /// [`NodeState::set_status`]; with `offline_after` (only for
    /// `draining`), the drain ends by itself: the node turns `offline` once
    /// that long has passed, unless its status changed before
    /// ([`NodeState::end_timed_out_drain`], called every gossip interval).
    /// The sessions bound to a draining node reach it until then.
    ///
    /// # Errors
    /// As [`NodeState::set_status`].
    pub(crate) async fn set_status_until(
        &self,
        to: NodeStatus,
        offline_after: Option<Duration>,
    ) -> Result<NodeStatus, StateError> {
        let deadline = operator::drain_deadline(to, offline_after, tokio::time::Instant::now());
        let previous = {
            let mut s = self.status.lock().expect("status lock");
            operator::judge_status(s.0, to)
                .map_err(|operator::StatusRefused::Leaving| StateError::Leaving)?;
            self.publishes_serving
                .store(to == NodeStatus::Serving, Ordering::Relaxed);
            std::mem::replace(&mut *s, (to, deadline)).0
        };
        self.publisher.set_status(to).await;
        info!(target: REQUEST_PATH, status = %to, %previous, offline_after_ms = offline_after.map(|d| d.as_millis() as u64), "status changed: published in gossip");
        Ok(previous)
    }

    /// Takes a draining node whose drain timeout has passed offline; true
    /// when it did.
    pub(crate) async fn end_timed_out_drain(&self) -> bool {
        let due = {
            let s = self.status.lock().expect("status lock");
            operator::drain_ended(s.0, s.1, tokio::time::Instant::now())
        };
        if !due {
            return false;
        }
        info!(target: REQUEST_PATH, "drain timeout: going offline");
        self.set_status(NodeStatus::Offline).await.is_ok()
    }

    /// The balancing policy's name and its state per member of the view
    /// ([`Router::policy_figure`]): `{"name": "weighted-round-robin",
    /// "figure": "lbstatus", "members": {"n1": 100, ...}}`; `figure` is null
    /// and `members` empty for a policy that keeps no per-member state.
    pub(crate) fn policy_state(&self) -> serde_json::Value {
        let view = self.view();
        let router = self.router.lock().expect("router lock");
        let mut figure = None;
        let mut members = serde_json::Map::new();
        for m in view.members() {
            if let Some((name, v)) = router.policy_figure(&m.id) {
                figure = Some(name);
                members.insert(m.id.to_string(), v.into());
            }
        }
        serde_json::json!({
            "name": router.policy_spec().to_string(),
            "figure": figure,
            "members": members,
        })
    }

    /// The next id of an admin change forwarded to a peer.
    pub(crate) fn next_change_id(&self) -> u64 {
        self.forwarded_changes.fetch_add(1, Ordering::Relaxed)
    }

    /// The peer links (forwarding an admin change to another member).
    pub(crate) fn links(&self) -> &Arc<PeerLinks> {
        &self.links
    }

    /// The manager page's form token (`make` runs once, on the first call).
    pub(crate) fn manager_token(&self, make: impl FnOnce() -> String) -> &str {
        self.manager_token.get_or_init(make)
    }

    /// Reads and compiles the rules again and puts them in force for new
    /// requests. On error the rules in force stay. Returns the number of
    /// rules.
    ///
    /// Reading and compiling run on tokio's blocking pool, off the node's
    /// runtime thread: a large rules file (up to 1 MiB, with regexes up to
    /// 32 MiB compiled) takes its time there while the node keeps serving.
    ///
    /// # Errors
    /// [`ReloadError`].
    pub(crate) async fn reload_rules(&self) -> Result<usize, ReloadError> {
        let Some(src) = &self.rules_source else {
            return Err(ReloadError::Embedded);
        };
        let src = src.lock().await;
        let load = src.clone();
        let rules = match tokio::task::spawn_blocking(move || load.load()).await {
            Ok(loaded) => {
                self.metrics.count_reload(loaded.is_ok());
                loaded.map_err(ReloadError::Invalid)?
            }
            // Loading returns its errors: a panic in it is a bug, re-raised
            // here. A blocking task is only cancelled while the runtime
            // shuts down, when no task is polled to see it.
            Err(e) => std::panic::resume_unwind(
                e.try_into_panic()
                    .unwrap_or_else(|_| Box::new("rules reload cancelled by runtime shutdown")),
            ),
        };
        let n = rules.len();
        self.router.lock().expect("router lock").set_rules(rules);
        info!(target: REQUEST_PATH, rules = n, "data-centric rules reloaded");
        Ok(n)
    }

    /// The weight this node ramps to and publishes once its slow start is
    /// over (the configured weight, or the last `PUT /_peerlb/weight`).
    pub(crate) fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    /// The weight this node publishes in gossip now: [`NodeState::weight`]
    /// during a slow start's step, else the weight itself.
    pub(crate) fn published_weight(&self) -> u32 {
        self.published_weight.load(Ordering::Relaxed)
    }

    /// The slow start in progress: its step (`1..=steps`), its step count
    /// and the time left; `None` when no ramp is running (off or over).
    pub(crate) fn slow_start_progress(&self) -> Option<SlowStartProgress> {
        let (s, elapsed) = self.ramp_now();
        Some(SlowStartProgress {
            step: s.step_at(elapsed)?,
            steps: s.steps(),
            remaining: s.remaining(elapsed),
        })
    }

    /// The ramp and the time since it began.
    fn ramp_now(&self) -> (SlowStart, Duration) {
        let ramp = self.ramp.lock().expect("ramp lock");
        (ramp.slow_start, ramp.began.elapsed())
    }

    /// Publishes the weight of the slow-start step in force now (the
    /// target itself once the ramp is over) when it differs from the one
    /// published, and returns the time until the published weight changes
    /// next (`None`: the ramp is over).
    pub(crate) async fn publish_ramp_step(&self) -> Option<Duration> {
        let _publishing = self.publishing.lock().await;
        let (s, elapsed) = self.ramp_now();
        let target = self.weight();
        let w = s.weight_at(target, elapsed);
        if self.published_weight.swap(w, Ordering::Relaxed) != w {
            self.publisher.set_weight(w).await;
            if !s.is_off() {
                info!(
                    target: REQUEST_PATH,
                    weight = w,
                    target_weight = target,
                    step = s.step_at(elapsed),
                    steps = s.steps(),
                    "slow start: weight published"
                );
            }
        }
        s.next_change_at(elapsed).map(|next| next - elapsed)
    }

    /// Runs the slow-start ramp: publishes each step's weight when the
    /// step begins, until the ramp is over (the full weight published).
    pub(crate) async fn ramp_weight(&self) {
        while let Some(next) = self.publish_ramp_step().await {
            tokio::time::sleep(next).await;
        }
    }

    /// Publishes `weight` as this node's new weight (gossip key `weight`):
    /// every node, this one included, rebuilds its ring with it once gossip
    /// brings it (about one gossip interval per hop). Not persisted: a
    /// restart publishes the configured weight again. Returns the previous
    /// weight.
    ///
    /// # Errors
    /// [`WeightError::OutOfRange`] above [`crate::config::MAX_WEIGHT`];
    /// [`WeightError::AllZero`] for 0 when every other serving member in
    /// this node's view has weight 0 ([`operator::judge_weight`]). The weight
    /// in force stays.
    pub(crate) async fn set_weight(&self, weight: u64) -> Result<u32, WeightError> {
        let w =
            operator::judge_weight(weight, &self.node_id, &self.view()).map_err(|e| match e {
                operator::WeightRefused::OutOfRange(v) => WeightError::OutOfRange(v),
                operator::WeightRefused::AllZero => WeightError::AllZero,
            })?;
        let previous = self.weight.swap(w, Ordering::Relaxed);
        // During a slow start the new weight is the ramp's new target: the
        // step in force publishes its share of it.
        self.publish_ramp_step().await;
        info!(target: REQUEST_PATH, weight = w, previous, published = self.published_weight(), "weight changed: published in gossip");
        Ok(previous)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracked(policy: PolicyKind) -> (Arc<Mutex<Router>>, Arc<Tracker>, Outstanding) {
        let router = Arc::new(Mutex::new(Router::new(
            policy,
            crate::engine::rules::Rules::default(),
        )));
        let tracker = Arc::new(Tracker::for_router(&router.lock().unwrap()));
        let g = Outstanding::new(&tracker, &router, NodeId::from("a"), 10);
        (router, tracker, g)
    }

    #[test]
    fn least_load_ends_a_request_without_the_router_lock() {
        let (router, tracker, g) = tracked(PolicyKind::LeastLoad);
        // A decision in progress holds the router lock while the request
        // ends on another thread: the drop must not wait for it.
        let held = router.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            drop(g);
            tx.send(()).unwrap();
        });
        // A deadlock detector: it answers in microseconds unless the drop
        // waits for `held`.
        let done = rx.recv_timeout(std::time::Duration::from_secs(5)).is_ok();
        drop(held);
        t.join().unwrap();
        assert!(done, "the drop waited for the router lock");
        assert_eq!(*tracker.counts.lock().unwrap(), Default::default());
    }

    #[test]
    fn by_traffic_records_a_finished_requests_bytes() {
        let (router, tracker, mut g) = tracked(PolicyKind::ByTraffic);
        g.bytes += 90;
        drop(g);
        assert_eq!(router.lock().unwrap().recorded_bytes("a"), 100);
        assert_eq!(*tracker.counts.lock().unwrap(), Default::default());
    }
}
