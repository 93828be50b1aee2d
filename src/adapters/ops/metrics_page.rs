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
//! [`Counters`](crate::adapters::node_state::Counters) atomics, the membership view,
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
//! | `peerlb_member_up{member}` | gauge | each member this node has known (`cluster/roster.rs`): 1 in its view, 0 failed, left or never seen |
//! | `peerlb_member_state{member}` | gauge | the same members' state: 0 alive, 1 failed, 2 left, 3 never seen |
//! | `peerlb_lbstatus{node}` | gauge | `weighted-round-robin` only: each node's lbstatus (mod_proxy_balancer byrequests) at this entry |
//! | `peerlb_by_traffic_bytes{node}` | gauge | `by-traffic` only: the bytes this entry counted per node (bytraffic) |
//! | `peerlb_rules_reloads_total{result}` | counter | rules reloads: `ok`, `error` (the old rules stay) |
//! | `peerlb_connections_closed_before_http_total{reason}` | counter | client connections closed before HTTP: `proxy_header` (no valid PROXY header), `tls_handshake` (failed or timed out) |
//! | `peerlb_tls_reloads_total{result}` | counter | certificate reloads of the HTTPS listeners: `ok`, `error` (the old certificates stay) |

use std::sync::atomic::{AtomicU64, Ordering};

use http::{HeaderValue, Response, StatusCode, header};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::adapters::body::{self, Body};
use crate::adapters::errors::{AdminError, error_response};
use crate::adapters::metrics::{FIRST_CODE, HistogramSnapshot};
use crate::adapters::node_state::NodeState;
use crate::adapters::tunnel::Role;
use crate::engine::membership::NodeStatus;

/// `GET /_peerlb/metrics`.
pub(crate) const PATH: &str = "/_peerlb/metrics";

/// The content type of the text exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

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
        // Every member this node has known (the view's and the roster's).
        let roster: Vec<(String, crate::adapters::cluster::roster::MemberState)> = state
            .roster()
            .records()
            .map(|(id, r)| (id.to_string(), r.state))
            .collect();
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
                crate::adapters::cluster::keyring::GossipCounters::SENT_KINDS
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
                "member_up",
                "Each member this node has known: 1 in its view, 0 failed, left or never seen",
                "member",
                roster.iter().map(|(id, st)| {
                    let up = *st == crate::adapters::cluster::roster::MemberState::Alive;
                    (id.clone(), Gauge(if up { 1.0 } else { 0.0 }))
                }),
            ),
            Family::labelled(
                "member_state",
                "Each member this node has known: 0 alive, 1 failed, 2 left, 3 never seen",
                "member",
                roster
                    .iter()
                    .map(|(id, st)| (id.clone(), Gauge(f64::from(st.code())))),
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
