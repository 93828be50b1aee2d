//! Prometheus metrics of one node, answered at `GET /_peerlb/metrics` (and
//! at `GET /metrics` on the node's `metrics_addr`, when it has one).
//!
//! **Formats.** The Prometheus text format 0.0.4 by default, written so
//! its parser reads every type: `# TYPE` names the sample of a counter
//! (`# TYPE peerlb_requests_total counter`), no `# EOF`. A scraper whose
//! `Accept` names `application/openmetrics-text` (Prometheus does) gets
//! OpenMetrics 1.0.0 instead: `# TYPE` names the family
//! (`# TYPE peerlb_requests counter`, sample `peerlb_requests_total`) and
//! the exposition ends with `# EOF`. Every family keeps its type whether it
//! has samples or not, so a family's type is the same on every scrape.
//! Counters and integer gauges are printed as exact integers. The encoder
//! is this module's own (`prometheus-client` writes OpenMetrics only).
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
//! | `peerlb_client_aborted_total` | counter | client requests cancelled because the client left before its answer |
//! | `peerlb_sip_requests_total` | counter | SIP requests received from clients (UDP and TCP) |
//! | `peerlb_sip_malformed_total` | counter | SIP messages from clients that did not parse (answered 400 or dropped) |
//! | `peerlb_sip_udp_rate_limited_total` | counter | SIP UDP datagrams dropped unanswered: their source was past `limits.sip_udp_requests_per_source` |
//! | `peerlb_sip_udp_answers_withheld_total` | counter | SIP UDP answers not sent: they would have passed twice the request's bytes |
//! | `peerlb_sip_acks_absorbed_total` | counter | callers' ACKs of a non-2xx answer the owner had ACKed to `sip_app` itself: absorbed, not relayed |
//! | `peerlb_sip_timer_c_cancels_total` | counter | INVITEs to `sip_app` CANCELled by the owner when Timer C fired (`limits.sip_timer_c_ms`) |
//! | `peerlb_sip_flow_requests_total` | counter | requests of `sip_app` toward a caller sent over the caller's own TCP or TLS connection (RFC 5923) |
//! | `peerlb_sip_flow_failed_total` | counter | requests of `sip_app` toward a caller whose connection was gone (a new connection, else `430`) |
//! | `peerlb_sip_tcp_timed_out_total` | counter | SIP TCP connections closed for an unfinished message (`limits.header_read_timeout_ms`) or idleness (`limits.sip_idle_timeout_ms`) |
//! | `peerlb_edge_client_errors_total` | counter | client requests answered 4xx by peerlb itself (its own checks: 400, 408, 414, 421, 431; hyper's 400 and 431), not by the app; the app's 4xx are `peerlb_responses_total` minus these |
//! | `peerlb_tunnels_refused_total` | counter | WebSocket upgrades answered 503 at `limits.max_tunnels_percent` of the connection cap |
//! | `peerlb_responses_cut_budget_total` | counter | responses cut at `limits.response_budget_bytes`: they held the most |
//! | `peerlb_responses_cut_stalled_total` | counter | responses cut: their client took no frame within `limits.send_timeout_ms` |
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
//! | `peerlb_gossip_dropped_datagrams_total{reason}` | counter | gossip datagrams dropped: `unauthenticated`, `out_of_bounds` (malformed or breaking a bound), `oversize` |
//! | `peerlb_view_version` | gauge | version of this node's membership view (a checksum that changes when the ring changes), printed as the exact integer |
//! | `peerlb_view_info{version}` | gauge | always 1; the view version as a label, exact after Prometheus stores it (its samples are 64-bit floats, which round a checksum) |
//! | `peerlb_build_info{version,commit}` | gauge | always 1; the crate version and the commit (`PEERLB_COMMIT` in the build's environment, else `unknown`) |
//! | `peerlb_process_start_time_seconds` | gauge | when the node's process started, seconds since the Unix epoch (its generation id / 1000) |
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
//!
//! The families are built here; `metrics_page/text.rs` writes them in
//! either format.

use std::sync::atomic::{AtomicU64, Ordering};

use http::{HeaderMap, HeaderValue, Response, StatusCode, header};

use crate::adapters::body::{self, Body};
use crate::adapters::metrics::{FIRST_CODE, HistogramSnapshot};
use crate::adapters::node_state::NodeState;
use crate::adapters::tunnel::Role;
use crate::engine::membership::NodeStatus;

/// `GET /_peerlb/metrics`.
pub(crate) const PATH: &str = "/_peerlb/metrics";

/// The content type of the Prometheus text format (version 0.0.4).
const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The content type of OpenMetrics (version 1.0.0).
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The two expositions a scrape can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// The Prometheus text format 0.0.4: `# TYPE` names the sample
    /// (`peerlb_requests_total counter`), no `# EOF`. The default.
    Text,
    /// OpenMetrics 1.0.0: `# TYPE` names the family (`peerlb_requests
    /// counter`, its sample `peerlb_requests_total`), ends with `# EOF`.
    OpenMetrics,
}

impl Format {
    /// The format a scraper's `Accept` headers ask for: OpenMetrics when
    /// one of them names `application/openmetrics-text` with a quality
    /// above 0 (Prometheus sends it first since 2.5); the text format
    /// otherwise, as Prometheus' own client libraries answer.
    pub(crate) fn negotiate(headers: &HeaderMap) -> Format {
        let wants = headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|range| {
                let mut parts = range.split(';').map(str::trim);
                parts
                    .next()
                    .is_some_and(|m| m.eq_ignore_ascii_case("application/openmetrics-text"))
                    && !parts.any(|p| {
                        p.strip_prefix("q=")
                            .and_then(|q| q.parse::<f64>().ok())
                            .is_some_and(|q| q <= 0.0)
                    })
            });
        if wants {
            Format::OpenMetrics
        } else {
            Format::Text
        }
    }

    /// The `Content-Type` of an exposition in this format.
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::Text => TEXT,
            Format::OpenMetrics => OPENMETRICS,
        }
    }
}

/// Answers `GET /_peerlb/metrics` (and `GET /metrics` on `metrics_addr`):
/// 200 with the exposition in the format `headers` ask for
/// ([`Format::negotiate`]).
pub(crate) fn answer(state: &NodeState, headers: &HeaderMap) -> Response<Body> {
    let format = Format::negotiate(headers);
    let mut r = Response::new(body::full(render(state, format)));
    *r.status_mut() = StatusCode::OK;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    r
}

/// The exposition of `state`'s metrics now, in `format`.
pub(crate) fn render(state: &NodeState, format: Format) -> String {
    Snapshot::of(state).encode(format)
}

/// What a family's samples count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
}

/// One sample's value: counters and integer gauges are printed as the
/// integers they are (a `u64` is not rounded to a float's 53 bits in the
/// text), real gauges as the shortest decimal that reads back the same.
#[derive(Debug, Clone, Copy)]
enum Value {
    Counter(u64),
    Gauge(f64),
    IntGauge(u64),
}

impl Value {
    fn kind(self) -> Kind {
        match self {
            Value::Counter(_) => Kind::Counter,
            Value::Gauge(_) | Value::IntGauge(_) => Kind::Gauge,
        }
    }
}

/// One metric family: its type (fixed, whether it has samples or not),
/// its label names and its samples, each with one value per label name.
#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    samples: Vec<(Vec<String>, Value)>,
}

impl Family {
    fn one(name: &'static str, help: &'static str, v: Value) -> Family {
        Family {
            name,
            help,
            kind: v.kind(),
            labels: &[],
            samples: vec![(Vec::new(), v)],
        }
    }

    /// A family with one label, typed `kind` even with no sample yet (a
    /// scraper sees the same type on every scrape).
    fn labelled(
        name: &'static str,
        help: &'static str,
        kind: Kind,
        label: &'static [&'static str; 1],
        samples: impl IntoIterator<Item = (String, Value)>,
    ) -> Family {
        let samples: Vec<(Vec<String>, Value)> =
            samples.into_iter().map(|(l, v)| (vec![l], v)).collect();
        debug_assert!(samples.iter().all(|(_, v)| v.kind() == kind), "{name}");
        Family {
            name,
            help,
            kind,
            labels: label,
            samples,
        }
    }
}

/// `peerlb_build_info{version,commit}`: the crate version and the commit
/// it was built from (`PEERLB_COMMIT` at build time, else `unknown`).
fn build_info() -> Family {
    Family {
        name: "build_info",
        help: "The build of this node: crate version and commit (PEERLB_COMMIT at build time), always 1",
        kind: Kind::Gauge,
        labels: &["version", "commit"],
        samples: vec![(
            vec![
                env!("CARGO_PKG_VERSION").to_owned(),
                option_env!("PEERLB_COMMIT").unwrap_or("unknown").to_owned(),
            ],
            Value::IntGauge(1),
        )],
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
        // Long: every family of the exposition, in its order, one entry each: a table read top
        // to bottom (docs/operations.md lists the same families in the same order).
        use Value::{Counter, Gauge, IntGauge};
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
            build_info(),
            Family::one(
                "process_start_time_seconds",
                "When this node's process started, in seconds since the Unix epoch",
                Gauge(m.start_time_ms() as f64 / 1000.0),
            ),
            Family::one(
                "requests",
                "Client requests received (admin requests excluded)",
                Counter(get(&c.requests)),
            ),
            Family::labelled(
                "responses",
                "Client requests answered by this entry, by status code",
                Kind::Counter,
                &["code"],
                responses,
            ),
            Family::labelled(
                "requests_by_owner",
                "Client requests answered by this entry, by the node that served them (the decision's owner when it failed)",
                Kind::Counter,
                &["owner"],
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
                "client_aborted",
                "Client requests cancelled because the client left before its answer",
                Counter(get(&c.client_aborted)),
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
                "sip_udp_rate_limited",
                "SIP UDP datagrams dropped: their source was past limits.sip_udp_requests_per_source",
                Counter(get(&c.sip_udp_rate_limited)),
            ),
            Family::one(
                "sip_udp_answers_withheld",
                "SIP UDP answers not sent: they would have passed twice the request's bytes",
                Counter(get(&c.sip_udp_answers_withheld)),
            ),
            Family::one(
                "sip_acks_absorbed",
                "SIP ACKs of a non-2xx answer the owner had ACKed to sip_app itself: absorbed, not relayed",
                Counter(get(&c.sip_acks_absorbed)),
            ),
            Family::one(
                "sip_timer_c_cancels",
                "SIP INVITEs to sip_app CANCELled by the owner when Timer C fired (limits.sip_timer_c_ms)",
                Counter(get(&c.sip_timer_c_cancels)),
            ),
            Family::one(
                "sip_flow_requests",
                "SIP requests of sip_app toward a caller sent over the caller's own TCP or TLS connection (RFC 5923)",
                Counter(get(&c.sip_flow_requests)),
            ),
            Family::one(
                "sip_flow_failed",
                "SIP requests of sip_app toward a caller whose connection was gone (a new connection, else 430)",
                Counter(get(&c.sip_flow_failed)),
            ),
            Family::one(
                "sip_tcp_timed_out",
                "SIP TCP connections closed: a message unfinished within limits.header_read_timeout_ms, or idle past limits.sip_idle_timeout_ms",
                Counter(get(&c.sip_tcp_timed_out)),
            ),
            Family::one(
                "edge_client_errors",
                "Client requests answered 4xx by peerlb itself (its own checks and hyper's 400 and 431), not by the app",
                Counter(get(&c.edge_client_errors)),
            ),
            Family::one(
                "tunnels_refused",
                "WebSocket upgrades answered 503: open tunnels held limits.max_tunnels_percent of the connection cap",
                Counter(get(&c.tunnels_refused)),
            ),
            Family::one(
                "responses_cut_budget",
                "Responses cut at limits.response_budget_bytes: they held the most",
                Counter(get(&c.response_cuts.budget)),
            ),
            Family::one(
                "responses_cut_stalled",
                "Responses cut: their client took no frame within limits.send_timeout_ms",
                Counter(get(&c.response_cuts.stalled)),
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
                Kind::Counter,
                &["reason"],
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
                Kind::Counter,
                &["result"],
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
                Kind::Gauge,
                &["state"],
                [
                    ("busy".to_owned(), Gauge(links.busy as f64)),
                    ("idle".to_owned(), Gauge(links.idle as f64)),
                    ("retired".to_owned(), Gauge(links.retired as f64)),
                ],
            ),
            Family::labelled(
                "peers",
                "Peers by state (up: routable; down: ejected or not yet connected)",
                Kind::Gauge,
                &["state"],
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
                Kind::Gauge,
                &["status"],
                members.map(|(st, n)| (st.as_str().to_owned(), Gauge(n as f64))),
            ),
            Family::labelled(
                "gossip_messages_sent",
                "Gossip messages sent by kind (syn: an exchange this node starts, one per peer a round picks)",
                Kind::Counter,
                &["kind"],
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
                Kind::Counter,
                &["reason"],
                [
                    ("unauthenticated", get(&g.unauthenticated)),
                    ("out_of_bounds", get(&g.out_of_bounds)),
                    ("oversize", get(&g.oversize)),
                ]
                .map(|(r, n)| (r.to_owned(), Counter(n))),
            ),
            Family::one(
                "view_version",
                "Version of this node's membership view (a checksum: compare it across nodes, do not add it)",
                IntGauge(view.version()),
            ),
            Family::labelled(
                "view_info",
                "This node's membership view version as a label (exact in Prometheus, whose samples are floats), always 1",
                Kind::Gauge,
                &["version"],
                [(view.version().to_string(), IntGauge(1))],
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
                Kind::Gauge,
                &["node"],
                per_member(|mb| f64::from(mb.weight)),
            ),
            Family::labelled(
                "member_load",
                "Each member's published load figure (0 to 100, 100 idle; 255 none)",
                Kind::Gauge,
                &["node"],
                per_member(|mb| f64::from(mb.load)),
            ),
            Family::labelled(
                "member_inflight",
                "Each member's published requests in flight",
                Kind::Gauge,
                &["node"],
                per_member(|mb| f64::from(mb.inflight)),
            ),
            Family::labelled(
                "member_up",
                "Each member this node has known: 1 in its view, 0 failed, left or never seen",
                Kind::Gauge,
                &["member"],
                roster.iter().map(|(id, st)| {
                    let up = *st == crate::adapters::cluster::roster::MemberState::Alive;
                    (id.clone(), Gauge(if up { 1.0 } else { 0.0 }))
                }),
            ),
            Family::labelled(
                "member_state",
                "Each member this node has known: 0 alive, 1 failed, 2 left, 3 never seen",
                Kind::Gauge,
                &["member"],
                roster
                    .iter()
                    .map(|(id, st)| (id.clone(), Gauge(f64::from(st.code())))),
            ),
            Family::labelled(
                "lbstatus",
                "weighted-round-robin: each node's lbstatus at this entry (mod_proxy_balancer byrequests)",
                Kind::Gauge,
                &["node"],
                lbstatus
                    .into_iter()
                    .map(|(id, v)| (id.to_string(), Gauge(v as f64))),
            ),
            Family::labelled(
                "by_traffic_bytes",
                "by-traffic: the bytes this entry counted per node (mod_proxy_balancer bytraffic)",
                Kind::Gauge,
                &["node"],
                traffic
                    .into_iter()
                    .map(|(id, v)| (id.to_string(), Gauge(v as f64))),
            ),
            Family::labelled(
                "rules_reloads",
                "Rules reloads, by result (error: the old rules stayed in force)",
                Kind::Counter,
                &["result"],
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

mod text;

/// The prefix of every metric name.
const PREFIX: &str = "peerlb_";

#[cfg(test)]
#[path = "metrics_page/tests.rs"]
mod tests;
