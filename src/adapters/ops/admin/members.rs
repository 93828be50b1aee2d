//! Changes to a member's state and weight, made on any node for any
//! member: `POST /_peerlb/state` and `PUT /_peerlb/weight`, with `?node=ID`
//! naming the member (default: the node asked). A change for another
//! member travels over the authenticated peer link (QUIC, mutual TLS) as a
//! stream of kind [`StreamKind::Admin`] (`wire`, "The stream's kind"); the
//! member applies it to itself ([`answer_peer`]) and its answer comes
//! back unchanged.
//!
//! Only a peer can send an admin stream (on a `peerlb/2` connection the
//! kind is the header mark `peerlb-admin`): an entry node strips every
//! client-sent `peerlb-*` header before it forwards a client request, and
//! the peer server admits only connections whose certificate the cluster
//! CA signed. What protects the entry point is the admin listener's reach
//! (`admin_addr`, loopback by default) and the browser checks.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, header};
use http_body_util::BodyExt;

use crate::adapters::body::{self, Body};
use crate::adapters::errors::{
    AdminError, StateError, WeightError, error_response, json_response, peer_status,
};
use crate::adapters::node_state::NodeState;
use crate::adapters::transport::peer;
use crate::adapters::wire::{RequestHeadRef, RequestHeadView, StreamKind};
use crate::engine::membership::NodeStatus;
use crate::engine::node_id::NodeId;

/// Longest body of a state or weight change, in bytes.
pub(crate) const BODY_LIMIT: usize = 64;

/// Longest wait for a member's answer to a forwarded change.
const FORWARD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A change to one member, as the admin API or the manager page asks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// Publish this status (`serving`, `draining` or `offline`); with a
    /// timeout (`draining` only), go offline once it has passed.
    Status(NodeStatus, Option<std::time::Duration>),
    /// Publish this weight (checked by [`NodeState::set_weight`]).
    Weight(u64),
}

impl Change {
    /// The admin request (method, path and query, body) that asks this
    /// change of a node.
    fn request(&self) -> (Method, String, String) {
        match self {
            Change::Status(s, None) => {
                (Method::POST, super::STATE.to_owned(), s.as_str().to_owned())
            }
            Change::Status(s, Some(t)) => (
                Method::POST,
                format!("{}?timeout_ms={}", super::STATE, t.as_millis()),
                s.as_str().to_owned(),
            ),
            Change::Weight(w) => (Method::PUT, super::WEIGHT.to_owned(), w.to_string()),
        }
    }
}

/// Parses a state body: `serving`, `draining` or `offline`, surrounding
/// ASCII whitespace allowed.
///
/// # Errors
/// [`StateError::NotAState`] for anything else (`leaving` included:
/// SIGTERM's alone).
pub(crate) fn parse_state(body: &[u8]) -> Result<NodeStatus, StateError> {
    let text = String::from_utf8_lossy(body);
    match text
        .trim_matches(|c: char| c.is_ascii_whitespace())
        .parse::<NodeStatus>()
    {
        Ok(s @ (NodeStatus::Serving | NodeStatus::Draining | NodeStatus::Offline)) => Ok(s),
        _ => Err(StateError::NotAState(text.into_owned())),
    }
}

/// Parses a weight body: ASCII digits, optionally surrounded by ASCII
/// whitespace. The range is checked by [`NodeState::set_weight`].
///
/// # Errors
/// [`WeightError::NotANumber`] quoting the body (lossy UTF-8).
pub(crate) fn parse_weight(body: &[u8]) -> Result<u64, WeightError> {
    let text = String::from_utf8_lossy(body);
    let t = text.trim_matches(|c: char| c.is_ascii_whitespace());
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(WeightError::NotANumber(text.into_owned()));
    }
    // Digits only: the one failure left is overflow, which is out of range.
    Ok(t.parse().unwrap_or(u64::MAX))
}

/// Parses a change asked as `path` (`STATE` or `WEIGHT`) with `query`
/// (`timeout_ms=N` for a drain that ends offline after N ms) and `body`.
///
/// # Errors
/// The parse error of that path, as an [`AdminError`].
pub(crate) fn parse_change(
    path: &str,
    query: Option<&str>,
    body: &[u8],
) -> Result<Change, AdminError> {
    if path != super::STATE {
        return Ok(Change::Weight(parse_weight(body)?));
    }
    let status = parse_state(body)?;
    let timeout = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| *k == "timeout_ms")
        .map(|(_, v)| {
            v.parse::<u64>()
                .ok()
                .filter(|_| status == NodeStatus::Draining)
                .map(std::time::Duration::from_millis)
                .ok_or_else(|| StateError::BadTimeout(v.to_owned()))
        })
        .transpose()?;
    Ok(Change::Status(status, timeout))
}

/// Applies `change` to this node: the JSON answer's text.
///
/// # Errors
/// [`AdminError::State`] or [`AdminError::Weight`].
pub(crate) async fn apply_local(state: &NodeState, change: &Change) -> Result<String, AdminError> {
    let me = &**state.node_id();
    match change {
        Change::Status(s, timeout) => {
            let previous = state.set_status_until(*s, *timeout).await?;
            Ok(serde_json::json!({ "node": me, "state": s.as_str(), "previous": previous.as_str() }).to_string())
        }
        Change::Weight(w) => {
            let previous = state.set_weight(*w).await?;
            Ok(
                serde_json::json!({ "node": me, "weight": state.weight(), "previous": previous })
                    .to_string(),
            )
        }
    }
}

/// Applies `change` to member `node` (this node or another, through the
/// peer link) and answers what the member answered.
pub(crate) async fn apply(
    state: &NodeState,
    node: Option<&str>,
    change: &Change,
) -> Response<Body> {
    let me = state.node_id();
    let target = match node {
        None => me.clone(),
        Some(id) if id == &**me => me.clone(),
        Some(id) => match state.view().get(id) {
            Some(m) => m.id.clone(),
            None => return error_response(&AdminError::UnknownMember(id.to_owned()).into(), me),
        },
    };
    if target == *me {
        return match apply_local(state, change).await {
            Ok(text) => json_response(StatusCode::OK, text),
            Err(e) => error_response(&e.into(), me),
        };
    }
    match forward(state, &target, change).await {
        Ok(r) => r,
        Err(reason) => error_response(
            &AdminError::Forward {
                node: target.to_string(),
                reason,
            }
            .into(),
            me,
        ),
    }
}

/// Sends `change` to `target` over the peer link: its answer (status and
/// JSON body), or why it could not be delivered.
async fn forward(
    state: &NodeState,
    target: &NodeId,
    change: &Change,
) -> Result<Response<Body>, String> {
    let (method, path, text) = change.request();
    let (status, bytes) = ask_peer(state, target, &method, &path, text, FORWARD_TIMEOUT).await?;
    let mut r = Response::new(body::full(bytes));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(r)
}

/// A member's own request counters, as it reports them over the peer link
/// (`GET` [`COUNTERS`]).
///
/// The fields after `errors` came later: a member of an older version
/// omits them and they read as 0 (empty `version`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(default)]
pub(crate) struct MemberCounters {
    /// Client requests the member received as entry.
    pub requests: u64,
    /// Requests its local app served (client or proxied in).
    pub served: u64,
    /// Requests it answered with an error status.
    pub errors: u64,
    /// Requests in flight on it (client and proxied).
    pub inflight: u32,
    /// Bytes read from its clients.
    pub bytes_in: u64,
    /// Bytes written to its clients.
    pub bytes_out: u64,
    /// Median of its client requests' time to response head since start,
    /// in µs: the upper bound of the histogram bucket holding it (0.5 ms
    /// doubling; `metrics.rs`); 0 before any request.
    pub p50_us: u64,
    /// The 99th percentile, as `p50_us`.
    pub p99_us: u64,
    /// Answers it gave its clients, by kind: 4xx (the app's and
    /// peerlb's own), 5xx other than the three below (the app's), 502,
    /// 503, 504.
    pub status_4xx: u64,
    /// The 4xx answers of `status_4xx` that peerlb gave itself at the
    /// edge, not the app (`Counters::edge_client_errors`: its own checks,
    /// 400, 408, 414, 421, 431, and hyper's 400 and 431).
    #[serde(default)]
    pub status_4xx_edge: u64,
    /// See `status_4xx`.
    pub status_5xx: u64,
    /// See `status_4xx`.
    pub status_502: u64,
    /// See `status_4xx`.
    pub status_503: u64,
    /// See `status_4xx`.
    pub status_504: u64,
    /// Its crate version.
    pub version: String,
    /// How long it has run, in ms.
    pub uptime_ms: u64,
}

/// The upper bound, in µs, of the bucket of `h` holding quantile `q`
/// (0 when empty; `u64::MAX` in the `+Inf` bucket).
fn quantile_us(h: &crate::adapters::metrics::HistogramSnapshot, q: f64) -> u64 {
    if h.count == 0 {
        return 0;
    }
    let rank = (q * h.count as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (bound, n) in &h.buckets {
        seen += n;
        if seen >= rank {
            return if bound.is_finite() {
                (bound * 1e6).round() as u64
            } else {
                u64::MAX
            };
        }
    }
    u64::MAX
}

/// The peer-only path a member answers its [`MemberCounters`] on.
pub(crate) const COUNTERS: &str = "/_peerlb/counters";

/// This node's [`MemberCounters`].
pub(crate) fn own_counters(state: &NodeState) -> MemberCounters {
    use std::sync::atomic::Ordering::Relaxed;
    let c = &state.counters;
    let m = &state.metrics;
    let code =
        |s: u16| m.responses[usize::from(s - crate::adapters::metrics::FIRST_CODE)].load(Relaxed);
    let range = |lo: u16, hi: u16| (lo..=hi).map(code).sum::<u64>();
    let h = m.request_seconds.snapshot();
    MemberCounters {
        requests: c.requests.load(Relaxed),
        served: c.served_local.load(Relaxed),
        errors: c.errors.load(Relaxed),
        inflight: state.inflight(),
        bytes_in: m.client_bytes.received(),
        bytes_out: m.client_bytes.sent(),
        p50_us: quantile_us(&h, 0.5),
        p99_us: quantile_us(&h, 0.99),
        status_4xx: range(400, 499),
        status_4xx_edge: c.edge_client_errors.load(Relaxed),
        status_5xx: range(500, 599) - code(502) - code(503) - code(504),
        status_502: code(502),
        status_503: code(503),
        status_504: code(504),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        uptime_ms: state.uptime().as_millis() as u64,
    }
}

/// Member `id`'s counters: this node's own, or asked over the peer link
/// (at most `timeout`); `None` when the member does not answer.
pub(crate) async fn counters_of(
    state: &NodeState,
    id: &NodeId,
    timeout: std::time::Duration,
) -> Option<MemberCounters> {
    if id == state.node_id() {
        return Some(own_counters(state));
    }
    let (status, bytes) = ask_peer(state, id, &Method::GET, COUNTERS, String::new(), timeout)
        .await
        .ok()?;
    (status == StatusCode::OK)
        .then(|| serde_json::from_slice(&bytes).ok())
        .flatten()
}

/// One admin request to `target` over the peer link (a stream of kind
/// [`StreamKind::Admin`]): its status and body (at most 64
/// KiB), or why it failed.
async fn ask_peer(
    state: &NodeState,
    target: &NodeId,
    method: &Method,
    path: &str,
    text: String,
    timeout: std::time::Duration,
) -> Result<(StatusCode, Bytes), String> {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(text.len()));
    let view = state.view();
    let mut out = peer::Outgoing::new(
        StreamKind::Admin,
        RequestHeadRef {
            // Admin requests count apart from client request ids: the top bit set.
            request_id: (1u128 << 127) | u128::from(state.next_change_id()),
            entry: state.node_id(),
            hops: 1,
            view_version: view.version(),
            method: method.as_str(),
            uri: path,
            headers: &headers,
            client: SocketAddr::from(([0, 0, 0, 0], 0)),
            hash_key: None,
            tls: None,
        },
        &[],
    );
    let b = if text.is_empty() {
        body::empty()
    } else {
        body::full(text)
    };
    let (rh, rb) = peer::send(state.links(), target, &mut out, b, timeout)
        .await
        .map_err(send_error)?;
    let bytes = tokio::time::timeout(
        timeout,
        http_body_util::Limited::new(rb, 64 * 1024).collect(),
    )
    .await
    .map_err(|_| "no answer in time".to_owned())?
    .map_err(|e| e.to_string())?
    .to_bytes();
    let status = peer_status(rh.status);
    Ok((status, bytes))
}

/// Why an admin request to a peer failed, as the admin answer says it
/// (every failure of the peer link alike: the member did not answer).
fn send_error(e: peer::SendError) -> String {
    e.to_string()
}

/// [`answer_peer`] boxed, as the owner's admin handler
/// (`serve::owner::AdminAnswer`) takes it.
pub(crate) fn answer_peer_boxed<'a>(
    state: &'a NodeState,
    head: &'a RequestHeadView<'a>,
    body: Body,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response<Body>> + Send + 'a>> {
    Box::pin(answer_peer(state, head, body))
}

/// Answers an admin request a peer forwarded (a stream of kind
/// [`StreamKind::Admin`]): a state or weight change, applied to this node, or `GET`
/// [`COUNTERS`]. 404 for any other path or method.
pub(crate) async fn answer_peer(
    state: &NodeState,
    head: &RequestHeadView<'_>,
    body: Body,
) -> Response<Body> {
    let me = state.node_id();
    let (path, query) = match head.uri.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (head.uri, None),
    };
    let known = matches!(
        (head.method, path),
        ("POST", super::STATE) | ("PUT", super::WEIGHT)
    );
    if (head.method, path) == ("GET", COUNTERS) {
        return json_response(
            StatusCode::OK,
            serde_json::to_string(&own_counters(state)).unwrap_or_default(),
        );
    }
    if !known {
        return error_response(&AdminError::UnknownPath.into(), me);
    }
    let bytes = match http_body_util::Limited::new(body, BODY_LIMIT)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return error_response(
                &AdminError::State(StateError::Body(e.to_string())).into(),
                me,
            );
        }
    };
    tracing::info!(target: crate::adapters::REQUEST_PATH, from = %head.entry, path, "admin change forwarded by a peer");
    let applied = match parse_change(path, query, &bytes) {
        Ok(c) => apply_local(state, &c).await,
        Err(e) => Err(e),
    };
    match applied {
        Ok(text) => json_response(StatusCode::OK, text),
        Err(e) => error_response(&e.into(), me),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_bodies() {
        assert_eq!(parse_state(b"draining").unwrap(), NodeStatus::Draining);
        assert_eq!(parse_state(b" offline\n").unwrap(), NodeStatus::Offline);
        assert_eq!(parse_state(b"serving\r\n").unwrap(), NodeStatus::Serving);
        for bad in [&b""[..], b"leaving", b"Draining", b"drain", b"serving x"] {
            assert!(
                matches!(parse_state(bad), Err(StateError::NotAState(_))),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse_state(b"leaving").unwrap_err().to_string(),
            "the body must be serving, draining or offline, got \"leaving\""
        );
    }

    #[test]
    fn weight_bodies() {
        assert_eq!(parse_weight(b"300").unwrap(), 300);
        assert_eq!(parse_weight(b" 0\n").unwrap(), 0);
        assert_eq!(parse_weight(b"10000\r\n").unwrap(), 10_000);
        // Digits beyond u64 are out of range, not "not a number".
        assert_eq!(parse_weight(b"99999999999999999999999").unwrap(), u64::MAX);
        for bad in [
            &b""[..],
            b"  ",
            b"-1",
            b"+5",
            b"1.5",
            b"3e2",
            b"abc",
            b"1 2",
            b"0x10",
        ] {
            let e = parse_weight(bad).unwrap_err();
            assert!(matches!(e, WeightError::NotANumber(_)), "{bad:?}");
        }
        assert_eq!(
            parse_weight(b"abc").unwrap_err().to_string(),
            "the body must be a decimal integer weight 0..=10000, got \"abc\""
        );
        assert_eq!(
            WeightError::OutOfRange(10_001).to_string(),
            "weight 10001 is out of range 0..=10000"
        );
    }

    #[test]
    fn a_change_asks_the_path_the_member_answers() {
        let split = |p: &str| -> (String, Option<String>) {
            match p.split_once('?') {
                Some((a, b)) => (a.to_owned(), Some(b.to_owned())),
                None => (p.to_owned(), None),
            }
        };
        for c in [
            Change::Status(NodeStatus::Draining, None),
            Change::Status(
                NodeStatus::Draining,
                Some(std::time::Duration::from_millis(1500)),
            ),
            Change::Status(NodeStatus::Offline, None),
            Change::Weight(250),
        ] {
            let (m, p, b) = c.request();
            let (path, query) = split(&p);
            assert_eq!(m == Method::PUT, path == super::super::WEIGHT, "{c:?}");
            assert_eq!(
                parse_change(&path, query.as_deref(), b.as_bytes()).unwrap(),
                c
            );
        }
    }

    #[test]
    fn only_a_drain_takes_a_timeout() {
        let state = super::super::STATE;
        assert!(matches!(
            parse_change(state, Some("timeout_ms=abc"), b"draining"),
            Err(AdminError::State(StateError::BadTimeout(_)))
        ));
        assert!(matches!(
            parse_change(state, Some("timeout_ms=100"), b"offline"),
            Err(AdminError::State(StateError::BadTimeout(_)))
        ));
        assert_eq!(
            parse_change(state, Some("node=n2&timeout_ms=100"), b"draining").unwrap(),
            Change::Status(
                NodeStatus::Draining,
                Some(std::time::Duration::from_millis(100))
            )
        );
    }
}
