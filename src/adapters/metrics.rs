//! Prometheus metrics of one node, answered at `GET /_peerlb/metrics` in the
//! Prometheus text exposition format (version 0.0.4) by `prometheus-client`.
//!
//! The hot path pays only relaxed atomic adds, no lock and no allocation:
//! two histogram observations per forwarded request (the whole request at
//! the entry, and the hop), one status count and one owner count per
//! client request (the owner count takes a read lock, and a write lock the
//! first time an owner is seen), and one add per read or write call on a
//! client connection for the byte counts. Everything else is read at scrape
//! time from state the node keeps anyway (the
//! [`Counters`](super::node_state::Counters) atomics, the membership view,
//! the peer links, the gossip counters, the router's policy state). The
//! ring share is computed once per view version. Names follow the
//! Prometheus conventions: `peerlb_` prefix, counters end in `_total`,
//! durations in `_seconds`, sizes in `_bytes`.
//!
//! | metric | type | meaning |
//! | --- | --- | --- |
//! | `peerlb_requests_total` | counter | client requests received (admin requests excluded) |
//! | `peerlb_responses_total{code}` | counter | client requests answered by this entry, by status code (`200`, `414`, `502`, ...; limit refusals included, the health check excluded) |
//! | `peerlb_requests_by_owner_total{owner}` | counter | client requests answered by this entry, by the node that served them (the decision's owner when it failed) |
//! | `peerlb_served_local_total` | counter | requests the local app served (client or proxied in) |
//! | `peerlb_proxied_in_total` | counter | proxied requests this node received from entries |
//! | `peerlb_forwarded_total` | counter | forward attempts to an owner (one per candidate tried) |
//! | `peerlb_failovers_total` | counter | forward attempts that failed over to the next candidate |
//! | `peerlb_proxied_disagree_total` | counter | proxied requests whose owner in this node's view is another node |
//! | `peerlb_sip_requests_total` | counter | SIP requests received from clients (UDP and TCP) |
//! | `peerlb_sip_malformed_total` | counter | SIP messages from clients that did not parse (answered 400 or dropped) |
//! | `peerlb_sip_forwarded_total` | counter | SIP forward attempts to an owner (one per candidate tried) |
//! | `peerlb_errors_total` | counter | requests this node answered with an error status |
//! | `peerlb_client_connections_refused_total` | counter | client connections closed at accept (`limits.max_connections`) |
//! | `peerlb_client_received_bytes_total` | counter | bytes read from client connections (heads and bodies) |
//! | `peerlb_client_sent_bytes_total` | counter | bytes written to client connections (heads and bodies) |
//! | `peerlb_websockets_total` | counter | WebSocket tunnels opened at this entry (the app answered 101; over HTTP/1.1 or HTTP/2) |
//! | `peerlb_websockets_proxied_total` | counter | WebSocket tunnels relayed as a forwarded owner (peer stream to app) |
//! | `peerlb_websocket_idle_closed_total` | counter | tunnels closed after `limits.websocket_idle_timeout_ms` without a byte |
//! | `peerlb_h2_connections_total` | counter | HTTP/2 client connections accepted |
//! | `peerlb_h2_reset_floods_total` | counter | HTTP/2 connections closed for a rapid-reset flood |
//! | `peerlb_websockets_open` | gauge | WebSocket tunnels open at this entry |
//! | `peerlb_websockets_proxied_open` | gauge | WebSocket tunnels open as a forwarded owner |
//! | `peerlb_request_duration_seconds` | histogram | client request at the entry, arrival to response head |
//! | `peerlb_hop_duration_seconds` | histogram | one forward attempt, sending the head to the owner's response head |
//! | `peerlb_inflight_requests` | gauge | requests in flight on this node (client and proxied) |
//! | `peerlb_serving_requests` | gauge | requests the local app is serving (the load this node publishes) |
//! | `peerlb_client_connections` | gauge | open client connections |
//! | `peerlb_peer_connections` | gauge | open QUIC connections to peers (all states) |
//! | `peerlb_peer_connections_by_state{state}` | gauge | open QUIC connections by state: `busy` (streams open or recently), `idle`, `retired` |
//! | `peerlb_peers{state}` | gauge | peers by state: `up` (routable), `down` (ejected or not yet connected) |
//! | `peerlb_peer_ejections_total` | counter | peers ejected from routing (failed dial, lost connection) |
//! | `peerlb_members{status}` | gauge | members in this node's view by status (`serving`, `draining`, `offline`, `leaving`) |
//! | `peerlb_gossip_messages_sent_total{kind}` | counter | gossip messages sent: `syn` (an exchange this node starts; a round starts one per peer it picks), `synack`, `ack`, `other` |
//! | `peerlb_gossip_received_datagrams_total` | counter | gossip datagrams authenticated, in bounds and handed to chitchat |
//! | `peerlb_gossip_dropped_datagrams_total{reason}` | counter | gossip datagrams dropped: `unauthenticated`, `out_of_bounds` (malformed or breaking a bound), `oversize`, `codec_busy` |
//! | `peerlb_view_version` | gauge | version of this node's membership view (changes when the ring changes) |
//! | `peerlb_ring_share_ratio` | gauge | share of the ring's slots this node owns, `0..=1` |
//! | `peerlb_weight` | gauge | the weight this node publishes now (its ring weight; a slow start's step) |
//! | `peerlb_target_weight` | gauge | the weight it ramps to and publishes once a slow start is over |
//! | `peerlb_slow_start_step` | gauge | the slow-start step in force, `1..=steps`; 0 when no ramp runs |
//! | `peerlb_slow_start_remaining_seconds` | gauge | time left in the slow-start ramp, 0 when none runs |
//! | `peerlb_member_weight{node}` | gauge | each member's published weight |
//! | `peerlb_member_load{node}` | gauge | each member's published load figure (the `metric` policy's 0..=100, 100 idle; 255 none) |
//! | `peerlb_member_inflight{node}` | gauge | each member's published requests in flight |
//! | `peerlb_lbstatus{node}` | gauge | `weighted-round-robin` only: each node's lbstatus (mod_proxy_balancer byrequests) at this entry |
//! | `peerlb_by_traffic_bytes{node}` | gauge | `by-traffic` only: the bytes this entry counted per node (bytraffic) |
//! | `peerlb_rules_reloads_total{result}` | counter | rules reloads: `ok`, `error` (the old rules stay) |
//! | `peerlb_connections_closed_before_http_total{reason}` | counter | client connections closed before HTTP: `proxy_header` (no valid PROXY header), `tls_handshake` (failed or timed out) |
//! | `peerlb_tls_reloads_total{result}` | counter | certificate reloads of the HTTPS listeners: `ok`, `error` (the old certificates stay) |

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use http::{HeaderValue, Response, StatusCode, header};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use super::body::{self, Body};
use super::errors::{AdminError, error_response};
use super::node_state::NodeState;
use super::tunnel::Role;
use crate::engine::membership::{MembershipView, NodeStatus};
use crate::engine::node_id::NodeId;
use crate::engine::ring::Ring;

/// `GET /_peerlb/metrics`.
pub(crate) const PATH: &str = "/_peerlb/metrics";

/// The content type of the text exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The smallest histogram bucket's upper bound, in nanoseconds (0.5 ms);
/// each next bound doubles it.
const FIRST_BOUND_NS: u64 = 500_000;

/// Finite histogram buckets: 0.5 ms doubling 16 times (to about 16 s), so
/// a local serve and a slow app both fall inside; a last `+Inf` bucket
/// follows.
const BUCKETS: usize = 16;

/// A classic Prometheus histogram of durations with fixed bounds (0.5 ms
/// x 2^i, `i < 16`, then `+Inf`), recorded with relaxed atomic adds only:
/// `prometheus-client`'s own histogram takes a lock per observation.
///
/// A scrape reads the buckets, the sum and the count one after the other,
/// so an observation in progress may be in one and not yet in another;
/// the next scrape sees it whole (counts never go back).
#[derive(Debug, Default)]
pub(crate) struct AtomicHistogram {
    /// Observations per bucket (not cumulative): `BUCKETS` finite ones,
    /// then `+Inf`.
    buckets: [AtomicU64; BUCKETS + 1],
    /// Sum of the observations, in nanoseconds.
    sum_ns: AtomicU64,
}

impl AtomicHistogram {
    /// The bucket of `ns`: the first whose bound is at least `ns`.
    fn bucket_of(ns: u64) -> usize {
        let q = ns.saturating_sub(1) / FIRST_BOUND_NS;
        ((u64::BITS - q.leading_zeros()) as usize).min(BUCKETS)
    }

    /// Records one duration.
    pub(crate) fn observe(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.buckets[Self::bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The sum, count and buckets now.
    fn snapshot(&self) -> HistogramSnapshot {
        let buckets: Vec<(f64, u64)> = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let bound = if i == BUCKETS {
                    f64::INFINITY
                } else {
                    (FIRST_BOUND_NS << i) as f64 / 1e9
                };
                (bound, c.load(Ordering::Relaxed))
            })
            .collect();
        let count = buckets.iter().map(|(_, c)| c).sum();
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        HistogramSnapshot {
            sum,
            count,
            buckets,
        }
    }
}

/// One reading of an [`AtomicHistogram`].
#[derive(Debug, Clone, PartialEq)]
struct HistogramSnapshot {
    /// Sum of the observations, in seconds.
    sum: f64,
    /// Observations.
    count: u64,
    /// (upper bound in seconds, observations) per bucket, not cumulative;
    /// the last bound is `+Inf`.
    buckets: Vec<(f64, u64)>,
}

/// Bytes read from and written to client connections (counted by the
/// connection wrapper, `send_timeout.rs`).
#[derive(Debug, Default)]
pub(crate) struct ByteCounts {
    received: AtomicU64,
    sent: AtomicU64,
}

impl ByteCounts {
    /// Counts `n` bytes read from a client.
    pub(crate) fn add_received(&self, n: usize) {
        self.received.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts `n` bytes written to a client.
    pub(crate) fn add_sent(&self, n: usize) {
        self.sent.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Bytes read from clients so far.
    pub(crate) fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Bytes written to clients so far.
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

/// Status codes counted one by one: `100..=599` (the codes `http` accepts
/// in a response; anything else would be counted at the nearest end).
const FIRST_CODE: u16 = 100;
const CODES: usize = 500;

/// The metrics a node records per request (the rest is read at scrape time).
#[derive(Debug)]
pub(crate) struct Metrics {
    /// Client requests at the entry: arrival to response head.
    request_seconds: AtomicHistogram,
    /// Forward attempts: head sent to the owner's response head.
    hop_seconds: AtomicHistogram,
    /// Client requests answered by this entry, per status code
    /// (`code - 100`).
    responses: Box<[AtomicU64]>,
    /// Client requests answered by this entry, per serving node.
    by_owner: RwLock<BTreeMap<NodeId, AtomicU64>>,
    /// Bytes of client connections.
    pub(crate) client_bytes: std::sync::Arc<ByteCounts>,
    /// Proxied requests received from entries.
    proxied_in: AtomicU64,
    /// Rules reloads that put new rules in force.
    rules_reloads: AtomicU64,
    /// Rules reloads refused (the rules in force stayed).
    rules_reload_failures: AtomicU64,
    /// This node's ring share for the view version it was computed for.
    ring_share: Mutex<Option<(u64, f64)>>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            request_seconds: AtomicHistogram::default(),
            hop_seconds: AtomicHistogram::default(),
            responses: (0..CODES).map(|_| AtomicU64::new(0)).collect(),
            by_owner: RwLock::new(BTreeMap::new()),
            client_bytes: Default::default(),
            proxied_in: AtomicU64::new(0),
            rules_reloads: AtomicU64::new(0),
            rules_reload_failures: AtomicU64::new(0),
            ring_share: Mutex::new(None),
        }
    }
}

impl Metrics {
    /// Records one client request's time to its response head.
    pub(crate) fn observe_request(&self, elapsed: Duration) {
        self.request_seconds.observe(elapsed);
    }

    /// Records one forward attempt's time to the owner's response head (or
    /// to its failure).
    pub(crate) fn observe_hop(&self, elapsed: Duration) {
        self.hop_seconds.observe(elapsed);
    }

    /// Counts one proxied request received from an entry.
    pub(crate) fn count_proxied_in(&self) {
        self.proxied_in.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one client request's answer by its `status` (every answer
    /// on a client port except the admin paths it serves).
    pub(crate) fn count_status(&self, status: StatusCode) {
        let code = status
            .as_u16()
            .clamp(FIRST_CODE, FIRST_CODE + CODES as u16 - 1);
        self.responses[usize::from(code - FIRST_CODE)].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one routed client request by the node that served it
    /// (`owner`; the decision's owner when it failed). A read lock and an
    /// atomic add; the write lock only the first time `owner` is seen.
    pub(crate) fn count_owner(&self, owner: &NodeId) {
        {
            let owners = self.by_owner.read().expect("owner counts lock");
            if let Some(c) = owners.get(owner) {
                c.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        self.by_owner
            .write()
            .expect("owner counts lock")
            .entry(owner.clone())
            .or_default()
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one rules reload: `ok` when the new rules are in force.
    pub(crate) fn count_reload(&self, ok: bool) {
        let c = if ok {
            &self.rules_reloads
        } else {
            &self.rules_reload_failures
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// This node's share of `view`'s ring, computed once per view version.
    fn ring_share(&self, view: &MembershipView, id: &str) -> f64 {
        let mut cached = self.ring_share.lock().expect("ring share lock");
        match *cached {
            Some((v, share)) if v == view.version() => share,
            _ => {
                let share = ring_share(view.ring(), id);
                *cached = Some((view.version(), share));
                share
            }
        }
    }
}

/// Answers `GET /_peerlb/metrics`: 200 with the text exposition; 500
/// ([`AdminError::Metrics`]) if the encoder refuses a metric.
pub(crate) fn answer(state: &NodeState) -> Response<Body> {
    match render(state) {
        Ok(text) => {
            let mut r = Response::new(body::full(text));
            *r.status_mut() = StatusCode::OK;
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
            r
        }
        Err(e) => error_response(&AdminError::Metrics(e).into(), state.node_id()),
    }
}

/// The text exposition of `state`'s metrics now.
///
/// # Errors
/// [`std::fmt::Error`] when the encoder refuses a metric (it does not for
/// the classic histograms and constant metrics used here).
pub(crate) fn render(state: &NodeState) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::with_prefix("peerlb");
    registry.register_collector(Box::new(Snapshot::of(state)));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

/// The share of `ring`'s slots `id` owns, `0..=1` (0 for an empty ring or a
/// node not on it). Cost: one table load per slot (`256 * vnodes` rounded
/// up to a power of two), paid once per view version
/// ([`Metrics::ring_share`] caches it).
fn ring_share(ring: &Ring, id: &str) -> f64 {
    let slots = ring.len();
    if slots == 0 {
        return 0.0;
    }
    let bits = slots.trailing_zeros();
    let owned = (0..slots as u64)
        .filter(|s| {
            let point = if bits == 0 { 0 } else { s << (64 - bits) };
            ring.owner_of_point(point).is_some_and(|o| &**o == id)
        })
        .count();
    owned as f64 / slots as f64
}

/// One sample's value: counters are integers, gauges reals.
#[derive(Debug, Clone, Copy)]
enum Value {
    Counter(u64),
    Gauge(f64),
}

/// One metric family: its samples, each with its label value (`None`:
/// the family has no label).
#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    label: Option<&'static str>,
    samples: Vec<(Option<String>, Value)>,
}

impl Family {
    fn one(name: &'static str, help: &'static str, v: Value) -> Family {
        Family {
            name,
            help,
            label: None,
            samples: vec![(None, v)],
        }
    }

    fn labelled(
        name: &'static str,
        help: &'static str,
        label: &'static str,
        samples: impl IntoIterator<Item = (String, Value)>,
    ) -> Family {
        Family {
            name,
            help,
            label: Some(label),
            samples: samples.into_iter().map(|(l, v)| (Some(l), v)).collect(),
        }
    }

    fn metric_type(&self) -> MetricType {
        match self.samples.first() {
            Some((_, Value::Counter(_))) => MetricType::Counter,
            _ => MetricType::Gauge,
        }
    }
}

/// The values read at scrape time, taken at once so one exposition is
/// consistent with itself (up to updates racing the read).
#[derive(Debug)]
struct Snapshot {
    histograms: [(&'static str, &'static str, HistogramSnapshot); 2],
    families: Vec<Family>,
}

impl Snapshot {
    fn of(state: &NodeState) -> Snapshot {
        use Value::{Counter, Gauge};
        let c = &state.counters;
        let m = &state.metrics;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let view = state.view();
        let g = &state.gossip_keys().counters;
        let links = state.peer_link_counts();
        let mut members = NodeStatus::ALL.map(|s| (s, 0u64));
        for mb in view.members() {
            if let Some(slot) = members.iter_mut().find(|(s, _)| *s == mb.status) {
                slot.1 += 1;
            }
        }
        let responses = m.responses.iter().enumerate().filter_map(|(i, n)| {
            let n = n.load(Ordering::Relaxed);
            (n > 0).then(|| ((FIRST_CODE as usize + i).to_string(), Counter(n)))
        });
        let by_owner: Vec<(String, Value)> = m
            .by_owner
            .read()
            .expect("owner counts lock")
            .iter()
            .map(|(id, n)| (id.to_string(), Counter(n.load(Ordering::Relaxed))))
            .collect();
        let per_member = |f: fn(&crate::engine::membership::Member) -> f64| {
            view.members()
                .map(|mb| (mb.id.to_string(), Gauge(f(mb))))
                .collect::<Vec<_>>()
        };
        let crate::engine::route::BalanceState {
            lbstatus,
            bytes: traffic,
        } = state.balance_state();
        let progress = state.slow_start_progress();
        let families = vec![
            Family::one(
                "requests",
                "Client requests received (admin requests excluded)",
                Counter(get(&c.requests)),
            ),
            Family::labelled(
                "responses",
                "Client requests answered by this entry, by status code",
                "code",
                responses,
            ),
            Family::labelled(
                "requests_by_owner",
                "Client requests answered by this entry, by the node that served them (the decision's owner when it failed)",
                "owner",
                by_owner,
            ),
            Family::one(
                "served_local",
                "Requests the local app served (client or proxied in)",
                Counter(get(&c.served_local)),
            ),
            Family::one(
                "proxied_in",
                "Proxied requests received from entry nodes",
                Counter(get(&m.proxied_in)),
            ),
            Family::one(
                "forwarded",
                "Forward attempts to an owner (one per candidate tried)",
                Counter(get(&c.forwarded)),
            ),
            Family::one(
                "failovers",
                "Forward attempts that failed over to the next candidate",
                Counter(get(&c.failovers)),
            ),
            Family::one(
                "proxied_disagree",
                "Proxied requests whose owner in this node's view is another node",
                Counter(get(&c.proxied_disagree)),
            ),
            Family::one(
                "errors",
                "Requests this node answered with an error status",
                Counter(get(&c.errors)),
            ),
            Family::one(
                "sip_requests",
                "SIP requests received from clients (UDP and TCP)",
                Counter(get(&c.sip_requests)),
            ),
            Family::one(
                "sip_malformed",
                "SIP messages from clients that did not parse (answered 400 or dropped)",
                Counter(get(&c.sip_malformed)),
            ),
            Family::one(
                "sip_forwarded",
                "SIP forward attempts to an owner (one per candidate tried)",
                Counter(get(&c.sip_forwarded)),
            ),
            Family::one(
                "client_connections_refused",
                "Client connections closed at accept (limits.max_connections)",
                Counter(get(&c.connections_refused)),
            ),
            Family::one(
                "client_received_bytes",
                "Bytes read from client connections (heads and bodies)",
                Counter(m.client_bytes.received()),
            ),
            Family::one(
                "client_sent_bytes",
                "Bytes written to client connections (heads and bodies)",
                Counter(m.client_bytes.sent()),
            ),
            Family::one(
                "websockets",
                "WebSocket tunnels opened at this entry (clients whose upgrade an app accepted)",
                Counter(state.tunnels.opened(Role::Entry)),
            ),
            Family::one(
                "websockets_proxied",
                "WebSocket tunnels this node relayed as a forwarded owner (peer stream to app)",
                Counter(state.tunnels.opened(Role::Owner)),
            ),
            Family::one(
                "websocket_idle_closed",
                "WebSocket tunnels closed after limits.websocket_idle_timeout_ms without a byte",
                Counter(state.tunnels.idle_closed()),
            ),
            Family::one(
                "h2_connections",
                "HTTP/2 client connections accepted",
                Counter(get(&c.h2_connections)),
            ),
            Family::one(
                "h2_reset_floods",
                "HTTP/2 client connections closed for resetting most of their streams before an answer (rapid reset)",
                Counter(get(&c.h2_reset_floods)),
            ),
            Family::one(
                "websockets_open",
                "WebSocket tunnels open at this entry",
                Gauge(state.tunnels.open(Role::Entry) as f64),
            ),
            Family::one(
                "websockets_proxied_open",
                "WebSocket tunnels open on this node as a forwarded owner",
                Gauge(state.tunnels.open(Role::Owner) as f64),
            ),
            Family::labelled(
                "connections_closed_before_http",
                "Client connections closed before HTTP, by reason",
                "reason",
                [
                    (
                        "proxy_header".to_owned(),
                        Counter(get(&c.proxy_header_refused)),
                    ),
                    (
                        "tls_handshake".to_owned(),
                        Counter(get(&c.tls_handshake_failed)),
                    ),
                ],
            ),
            Family::labelled(
                "tls_reloads",
                "Certificate reloads of the HTTPS listeners, by result (error: the old certificates stayed)",
                "result",
                [
                    ("ok".to_owned(), Counter(get(&c.tls_reloads))),
                    ("error".to_owned(), Counter(get(&c.tls_reload_failures))),
                ],
            ),
            Family::one(
                "inflight_requests",
                "Requests in flight on this node (client and proxied)",
                Gauge(f64::from(state.inflight())),
            ),
            Family::one(
                "serving_requests",
                "Requests the local app is serving (the load this node publishes)",
                Gauge(f64::from(state.serving())),
            ),
            Family::one(
                "client_connections",
                "Open client connections",
                Gauge(get(&c.client_connections) as f64),
            ),
            Family::one(
                "peer_connections",
                "Open QUIC connections to peers",
                Gauge((links.busy + links.idle + links.retired) as f64),
            ),
            Family::labelled(
                "peer_connections_by_state",
                "Open QUIC connections to peers by state (busy: streams open or recently; idle; retired: another connection won)",
                "state",
                [
                    ("busy".to_owned(), Gauge(links.busy as f64)),
                    ("idle".to_owned(), Gauge(links.idle as f64)),
                    ("retired".to_owned(), Gauge(links.retired as f64)),
                ],
            ),
            Family::labelled(
                "peers",
                "Peers by state (up: routable; down: ejected or not yet connected)",
                "state",
                [
                    ("up".to_owned(), Gauge(links.peers_up as f64)),
                    ("down".to_owned(), Gauge(links.peers_down as f64)),
                ],
            ),
            Family::one(
                "peer_ejections",
                "Peers ejected from routing (failed dial, lost connection)",
                Counter(state.peer_ejections()),
            ),
            Family::labelled(
                "members",
                "Members in this node's view by status",
                "status",
                members.map(|(st, n)| (st.as_str().to_owned(), Gauge(n as f64))),
            ),
            Family::labelled(
                "gossip_messages_sent",
                "Gossip messages sent by kind (syn: an exchange this node starts, one per peer a round picks)",
                "kind",
                crate::adapters::gossip::keyring::GossipCounters::SENT_KINDS
                    .iter()
                    .zip(&g.sent)
                    .map(|(k, n)| ((*k).to_owned(), Counter(get(n)))),
            ),
            Family::one(
                "gossip_received_datagrams",
                "Gossip datagrams authenticated, in bounds and handed to chitchat",
                Counter(get(&g.received)),
            ),
            Family::labelled(
                "gossip_dropped_datagrams",
                "Gossip datagrams dropped, by reason",
                "reason",
                [
                    ("unauthenticated", get(&g.unauthenticated)),
                    ("out_of_bounds", get(&g.out_of_bounds)),
                    ("oversize", get(&g.oversize)),
                    ("codec_busy", get(&g.codec_busy)),
                ]
                .map(|(r, n)| (r.to_owned(), Counter(n))),
            ),
            Family::one(
                "view_version",
                "Version of this node's membership view",
                Gauge(view.version() as f64),
            ),
            Family::one(
                "ring_share_ratio",
                "Share of the ring's slots this node owns (0 to 1)",
                Gauge(m.ring_share(&view, state.node_id())),
            ),
            Family::one(
                "weight",
                "The weight this node publishes now (a slow start's step while it ramps)",
                Gauge(f64::from(state.published_weight())),
            ),
            Family::one(
                "target_weight",
                "The weight this node ramps to and publishes once a slow start is over",
                Gauge(f64::from(state.weight())),
            ),
            Family::one(
                "slow_start_step",
                "The slow-start step in force (1 to steps), 0 when no ramp runs",
                Gauge(progress.map_or(0.0, |p| f64::from(p.step))),
            ),
            Family::one(
                "slow_start_remaining_seconds",
                "Time left in the slow-start ramp, 0 when none runs",
                Gauge(progress.map_or(0.0, |p| p.remaining.as_secs_f64())),
            ),
            Family::labelled(
                "member_weight",
                "Each member's published weight",
                "node",
                per_member(|mb| f64::from(mb.weight)),
            ),
            Family::labelled(
                "member_load",
                "Each member's published load figure (0 to 100, 100 idle; 255 none)",
                "node",
                per_member(|mb| f64::from(mb.load)),
            ),
            Family::labelled(
                "member_inflight",
                "Each member's published requests in flight",
                "node",
                per_member(|mb| f64::from(mb.inflight)),
            ),
            Family::labelled(
                "lbstatus",
                "weighted-round-robin: each node's lbstatus at this entry (mod_proxy_balancer byrequests)",
                "node",
                lbstatus
                    .into_iter()
                    .map(|(id, v)| (id.to_string(), Gauge(v as f64))),
            ),
            Family::labelled(
                "by_traffic_bytes",
                "by-traffic: the bytes this entry counted per node (mod_proxy_balancer bytraffic)",
                "node",
                traffic
                    .into_iter()
                    .map(|(id, v)| (id.to_string(), Gauge(v as f64))),
            ),
            Family::labelled(
                "rules_reloads",
                "Rules reloads, by result (error: the old rules stayed in force)",
                "result",
                [
                    ("ok".to_owned(), Counter(get(&m.rules_reloads))),
                    ("error".to_owned(), Counter(get(&m.rules_reload_failures))),
                ],
            ),
        ];
        Snapshot {
            histograms: [
                (
                    "request_duration_seconds",
                    "Client requests at the entry, from arrival to the response head, in seconds",
                    m.request_seconds.snapshot(),
                ),
                (
                    "hop_duration_seconds",
                    "Forward attempts to an owner, from sending the head to the owner's response head or failure, in seconds",
                    m.hop_seconds.snapshot(),
                ),
            ],
            families,
        }
    }
}

/// Encodes one sample.
fn encode_value(v: Value, e: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
    match v {
        Value::Counter(n) => ConstCounter::new(n).encode(e),
        Value::Gauge(x) => ConstGauge::new(x).encode(e),
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, h) in &self.histograms {
            let mut e = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
            e.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                h.sum, h.count, &h.buckets, None,
            )?;
        }
        for f in &self.families {
            let mut family = encoder.encode_descriptor(f.name, f.help, None, f.metric_type())?;
            match f.label {
                None => {
                    if let Some((_, v)) = f.samples.first() {
                        encode_value(*v, family)?;
                    }
                }
                Some(key) => {
                    for (value, v) in &f.samples {
                        let value = value.as_deref().unwrap_or_default();
                        encode_value(*v, family.encode_family(&[(key, value)])?)?;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_match_the_bounds_and_sum_in_seconds() {
        let ms = |n: f64| Duration::from_secs_f64(n / 1000.0);
        assert_eq!(AtomicHistogram::bucket_of(0), 0);
        assert_eq!(AtomicHistogram::bucket_of(500_000), 0);
        assert_eq!(AtomicHistogram::bucket_of(500_001), 1);
        assert_eq!(AtomicHistogram::bucket_of(1_000_000), 1);
        assert_eq!(AtomicHistogram::bucket_of(1_000_001), 2);
        assert_eq!(AtomicHistogram::bucket_of(16_384_000_000), 15);
        assert_eq!(AtomicHistogram::bucket_of(16_384_000_001), 16);
        assert_eq!(AtomicHistogram::bucket_of(u64::MAX), 16);
        let h = AtomicHistogram::default();
        for d in [0.1, 0.5, 0.7, 3.0, 20_000.0] {
            h.observe(ms(d));
        }
        let HistogramSnapshot {
            sum,
            count,
            buckets,
        } = h.snapshot();
        assert_eq!(count, 5);
        assert!((sum - 20.0043).abs() < 1e-6, "{sum}");
        assert_eq!(buckets.len(), 17);
        assert_eq!(buckets[0], (0.0005, 2));
        assert_eq!(buckets[1], (0.001, 1));
        assert_eq!(buckets[3], (0.004, 1));
        assert_eq!(buckets[16], (f64::INFINITY, 1));
        // Every bound is the one prometheus-client's exponential buckets
        // give (the bounds the metric had before).
        let theirs: Vec<f64> =
            prometheus_client::metrics::histogram::exponential_buckets(0.000_5, 2.0, 16).collect();
        let ours: Vec<f64> = buckets[..16].iter().map(|(b, _)| *b).collect();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn status_and_owner_counts() {
        let m = Metrics::default();
        m.count_status(StatusCode::OK);
        m.count_status(StatusCode::OK);
        m.count_status(StatusCode::BAD_GATEWAY);
        m.count_owner(&NodeId::from("n2"));
        m.count_owner(&NodeId::from("n2"));
        m.count_owner(&NodeId::from("n1"));
        assert_eq!(m.responses[100].load(Ordering::Relaxed), 2);
        assert_eq!(m.responses[402].load(Ordering::Relaxed), 1);
        let owners = m.by_owner.read().unwrap();
        assert_eq!(owners["n2"].load(Ordering::Relaxed), 2);
        assert_eq!(owners["n1"].load(Ordering::Relaxed), 1);
    }

    #[test]
    fn ring_share_counts_the_slots_a_node_owns() {
        let ids = ["a", "b", "c"].map(NodeId::from);
        let ring = Ring::build(
            &[
                (ids[0].clone(), 100),
                (ids[1].clone(), 100),
                (ids[2].clone(), 200),
            ],
            16,
        );
        let shares: Vec<f64> = ids.iter().map(|id| ring_share(&ring, id)).collect();
        assert!(
            (shares.iter().sum::<f64>() - 1.0).abs() < 1e-9,
            "{shares:?}"
        );
        // Weight 200 owns about twice the slots of weight 100.
        assert!(shares[2] > 0.4 && shares[2] < 0.6, "{shares:?}");
        assert_eq!(ring_share(&ring, "z"), 0.0);
        assert_eq!(ring_share(&Ring::build(&[], 16), "a"), 0.0);
        // Against the ring's own owner lookup of keys.
        let n = 20_000;
        let a = (0..n)
            .filter(|i| &**ring.owner(&format!("k{i}")).unwrap() == "a")
            .count();
        assert!(
            (a as f64 / n as f64 - shares[0]).abs() < 0.02,
            "{a} {shares:?}"
        );
    }
}
