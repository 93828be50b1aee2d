//! Prometheus metrics of one node, answered at `GET /_peerlb/metrics` in the
//! Prometheus text exposition format (version 0.0.4) by `prometheus-client`.
//!
//! The hot path pays for two histogram observations per request (the whole
//! request at the entry, and the hop to another node when it forwards);
//! everything else is read at scrape time from state the node keeps anyway
//! (the [`Counters`](super::node_state::Counters) atomics, the membership
//! view, the gossip drop counters). Names follow the Prometheus conventions:
//! `peerlb_` prefix, counters end in `_total`, durations in `_seconds`.
//!
//! | metric | type | meaning |
//! | --- | --- | --- |
//! | `peerlb_requests_total` | counter | client requests received (admin requests excluded) |
//! | `peerlb_served_local_total` | counter | requests the local app served (client or proxied in) |
//! | `peerlb_forwarded_total` | counter | forward attempts to an owner (one per candidate tried) |
//! | `peerlb_failovers_total` | counter | forward attempts that failed over to the next candidate |
//! | `peerlb_proxied_disagree_total` | counter | proxied requests whose owner in this node's view is another node |
//! | `peerlb_errors_total` | counter | requests this node answered with an error status |
//! | `peerlb_request_duration_seconds` | histogram | client request at the entry, arrival to response head |
//! | `peerlb_hop_duration_seconds` | histogram | one forward attempt, sending the head to the owner's response head |
//! | `peerlb_inflight_requests` | gauge | requests in flight on this node (client and proxied) |
//! | `peerlb_serving_requests` | gauge | requests the local app is serving (the load this node publishes) |
//! | `peerlb_peer_connections` | gauge | open QUIC connections to peers |
//! | `peerlb_members{status}` | gauge | members in this node's view by status (`serving`, `draining`, `offline`, `leaving`) |
//! | `peerlb_gossip_dropped_datagrams_total{reason}` | counter | gossip datagrams dropped: `unauthenticated`, `out_of_bounds`, `oversize` |
//! | `peerlb_view_version` | gauge | version of this node's membership view (changes when the ring changes) |
//! | `peerlb_ring_share_ratio` | gauge | share of the ring's slots this node owns, `0..=1` |
//! | `peerlb_weight` | gauge | the weight this node publishes |
//! | `peerlb_member_load{node}` | gauge | each member's published load figure (the policy's metric) |
//! | `peerlb_member_inflight{node}` | gauge | each member's published requests in flight |
//! | `peerlb_rules_reloads_total{result}` | counter | rules reloads: `ok`, `error` (the old rules stay) |
//! | `peerlb_connections_closed_before_http_total{reason}` | counter | client connections closed before HTTP: `proxy_header` (no valid PROXY header), `tls_handshake` (failed or timed out) |
//! | `peerlb_tls_reloads_total{result}` | counter | certificate reloads of the HTTPS listeners: `ok`, `error` (the old certificates stay) |

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::{HeaderValue, Response, StatusCode, header};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::body::{self, Body};
use super::errors::{AdminError, error_response};
use super::node_state::NodeState;
use crate::engine::membership::NodeStatus;
use crate::engine::ring::Ring;

/// `GET /_peerlb/metrics`.
pub(crate) const PATH: &str = "/_peerlb/metrics";

/// The content type of the text exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Histogram bucket upper bounds, in seconds: 0.5 ms doubling 16 times (to
/// about 16 s), so a local serve and a slow app both fall inside.
fn duration_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.000_5, 2.0, 16)
}

/// The metrics a node records per request (the rest is read at scrape time).
#[derive(Debug)]
pub(crate) struct Metrics {
    /// Client requests at the entry: arrival to response head.
    request_seconds: Histogram,
    /// Forward attempts: head sent to the owner's response head.
    hop_seconds: Histogram,
    /// Rules reloads that put new rules in force.
    rules_reloads: AtomicU64,
    /// Rules reloads refused (the rules in force stayed).
    rules_reload_failures: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            request_seconds: Histogram::new(duration_buckets()),
            hop_seconds: Histogram::new(duration_buckets()),
            rules_reloads: AtomicU64::new(0),
            rules_reload_failures: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// Records one client request's time to its response head.
    pub(crate) fn observe_request(&self, elapsed: Duration) {
        self.request_seconds.observe(elapsed.as_secs_f64());
    }

    /// Records one forward attempt's time to the owner's response head (or
    /// to its failure).
    pub(crate) fn observe_hop(&self, elapsed: Duration) {
        self.hop_seconds.observe(elapsed.as_secs_f64());
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
    let m = &state.metrics;
    registry.register(
        "request_duration_seconds",
        "Client requests at the entry, from arrival to the response head, in seconds",
        m.request_seconds.clone(),
    );
    registry.register(
        "hop_duration_seconds",
        "Forward attempts to an owner, from sending the head to the owner's response head or failure, in seconds",
        m.hop_seconds.clone(),
    );
    registry.register_collector(Box::new(Snapshot::of(state)));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

/// The share of `ring`'s slots `id` owns, `0..=1` (0 for an empty ring or a
/// node not on it). Cost: one table load per slot (`256 * vnodes` rounded
/// up to a power of two), paid per scrape.
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

/// The values read at scrape time, taken at once so one exposition is
/// consistent with itself.
#[derive(Debug)]
struct Snapshot {
    counters: [(&'static str, &'static str, u64); 6],
    gauges: [(&'static str, &'static str, f64); 6],
    members: [(NodeStatus, u64); NodeStatus::ALL.len()],
    dropped: [(&'static str, u64); 3],
    reloads: [(&'static str, u64); 2],
    /// Client connections closed before HTTP, by reason.
    before_http: [(&'static str, u64); 2],
    /// Certificate reloads of the HTTPS listeners, by result.
    tls_reloads: [(&'static str, u64); 2],
    /// (node id, load, inflight) of every member.
    per_member: Vec<(String, f64, f64)>,
}

impl Snapshot {
    fn of(state: &NodeState) -> Snapshot {
        let c = &state.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let view = state.view();
        let g = &state.gossip_keys().counters;
        let mut members = NodeStatus::ALL.map(|s| (s, 0));
        for m in view.members() {
            if let Some(slot) = members.iter_mut().find(|(s, _)| *s == m.status) {
                slot.1 += 1;
            }
        }
        Snapshot {
            counters: [
                (
                    "requests",
                    "Client requests received (admin requests excluded)",
                    get(&c.requests),
                ),
                (
                    "served_local",
                    "Requests the local app served (client or proxied in)",
                    get(&c.served_local),
                ),
                (
                    "forwarded",
                    "Forward attempts to an owner (one per candidate tried)",
                    get(&c.forwarded),
                ),
                (
                    "failovers",
                    "Forward attempts that failed over to the next candidate",
                    get(&c.failovers),
                ),
                (
                    "proxied_disagree",
                    "Proxied requests whose owner in this node's view is another node",
                    get(&c.proxied_disagree),
                ),
                (
                    "errors",
                    "Requests this node answered with an error status",
                    get(&c.errors),
                ),
            ],
            gauges: [
                (
                    "inflight_requests",
                    "Requests in flight on this node (client and proxied)",
                    f64::from(state.inflight()),
                ),
                (
                    "serving_requests",
                    "Requests the local app is serving (the load this node publishes)",
                    f64::from(state.serving()),
                ),
                (
                    "peer_connections",
                    "Open QUIC connections to peers",
                    state.peer_connections() as f64,
                ),
                (
                    "view_version",
                    "Version of this node's membership view",
                    view.version() as f64,
                ),
                (
                    "ring_share_ratio",
                    "Share of the ring's slots this node owns (0 to 1)",
                    ring_share(view.ring(), state.node_id()),
                ),
                (
                    "weight",
                    "The weight this node publishes",
                    f64::from(state.weight()),
                ),
            ],
            members,
            dropped: [
                ("unauthenticated", get(&g.unauthenticated)),
                ("out_of_bounds", get(&g.out_of_bounds)),
                ("oversize", get(&g.oversize)),
            ],
            reloads: [
                ("ok", get(&state.metrics.rules_reloads)),
                ("error", get(&state.metrics.rules_reload_failures)),
            ],
            before_http: [
                ("proxy_header", get(&c.proxy_header_refused)),
                ("tls_handshake", get(&c.tls_handshake_failed)),
            ],
            tls_reloads: [
                ("ok", get(&c.tls_reloads)),
                ("error", get(&c.tls_reload_failures)),
            ],
            per_member: view
                .members()
                .map(|m| (m.id.to_string(), f64::from(m.load), f64::from(m.inflight)))
                .collect(),
        }
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, v) in &self.counters {
            let c = ConstCounter::new(*v);
            c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        for (name, help, v) in &self.gauges {
            let g = ConstGauge::new(*v);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        let gauge_type = ConstGauge::new(0.0).metric_type();
        let counter_type = ConstCounter::new(0u64).metric_type();
        {
            let mut family = encoder.encode_descriptor(
                "members",
                "Members in this node's view by status",
                None,
                gauge_type,
            )?;
            for (status, n) in &self.members {
                ConstGauge::new(*n as f64)
                    .encode(family.encode_family(&[("status", status.as_str())])?)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "gossip_dropped_datagrams",
                "Gossip datagrams dropped, by reason",
                None,
                counter_type,
            )?;
            for (reason, n) in &self.dropped {
                ConstCounter::new(*n).encode(family.encode_family(&[("reason", *reason)])?)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "rules_reloads",
                "Rules reloads, by result (error: the old rules stayed in force)",
                None,
                counter_type,
            )?;
            for (result, n) in &self.reloads {
                ConstCounter::new(*n).encode(family.encode_family(&[("result", *result)])?)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "connections_closed_before_http",
                "Client connections closed before HTTP, by reason",
                None,
                counter_type,
            )?;
            for (reason, n) in &self.before_http {
                ConstCounter::new(*n).encode(family.encode_family(&[("reason", *reason)])?)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "tls_reloads",
                "Certificate reloads of the HTTPS listeners, by result (error: the old certificates stayed)",
                None,
                counter_type,
            )?;
            for (result, n) in &self.tls_reloads {
                ConstCounter::new(*n).encode(family.encode_family(&[("result", *result)])?)?;
            }
        }
        for (name, help, pick) in [
            ("member_load", "Each member's published load figure", 0usize),
            (
                "member_inflight",
                "Each member's published requests in flight",
                1,
            ),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, gauge_type)?;
            for (id, load, inflight) in &self.per_member {
                let v = if pick == 0 { *load } else { *inflight };
                ConstGauge::new(v).encode(family.encode_family(&[("node", id.as_str())])?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::node_id::NodeId;

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
