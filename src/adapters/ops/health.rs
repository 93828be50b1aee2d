//! `GET /_peerlb/health`: whether a sprayer (HAProxy `option httpchk`, a
//! Kubernetes readiness probe, keepalived's `HTTP_GET`) should send this
//! node new connections. Unlike the rest of the admin API it answers any
//! client, since the sprayer checks from another host; it tells nothing but
//! the node's own state.
//!
//! | state | answer |
//! | --- | --- |
//! | serving (this node's own member is `serving` in its view and it accepts requests) | 200, body `serving` |
//! | draining, offline (an operator's `POST /_peerlb/state`, `peerlb drain`, the manager page), leaving (SIGTERM: published `leaving`, still answering during `drain_grace`) | 503, body the state |
//!
//! While a node starts it does not accept client connections at all: its
//! listeners open only once every live peer is connected (or after
//! `lifecycle.startup_wait`), so a check during start gets no answer (the
//! connection waits in the kernel's queue) and the sprayer's check times
//! out, which counts as down. `HEAD` answers the same status without a body.

use http::{HeaderValue, Method, Response, StatusCode, header};

use crate::adapters::body::{self, Body};
use crate::adapters::node_state::NodeState;
use crate::engine::membership::NodeStatus;

/// `GET /_peerlb/health`.
pub(crate) const PATH: &str = "/_peerlb/health";

/// The node's health as the sprayer sees it: `Ok(state)` when it should
/// get new connections (`"serving"`), `Err(state)` when not (`"draining"`,
/// `"offline"`, `"leaving"`, or `"stopping"` once it refuses proxied
/// requests).
pub(crate) fn health(state: &NodeState) -> Result<&'static str, &'static str> {
    // The status this node publishes counts at once; its own view takes it
    // only after a gossip round.
    let published = state.status();
    let view = state.view();
    let status = match published {
        NodeStatus::Serving => view
            .get(state.node_id())
            .map_or(NodeStatus::Leaving, |m| m.status),
        s => s,
    };
    match status {
        _ if !state.accepting() => Err("stopping"),
        NodeStatus::Serving => Ok(status.as_str()),
        s => Err(s.as_str()),
    }
}

/// Answers `GET` or `HEAD /_peerlb/health` (see the module doc): 200 or 503,
/// `text/plain` body the state and a newline, `Cache-Control: no-store`.
pub(crate) fn answer(state: &NodeState, method: &Method) -> Response<Body> {
    let (code, text) = match health(state) {
        Ok(s) => (StatusCode::OK, s),
        Err(s) => (StatusCode::SERVICE_UNAVAILABLE, s),
    };
    let mut r = if method == Method::HEAD {
        Response::new(body::empty())
    } else {
        Response::new(body::full(format!("{text}\n")))
    };
    *r.status_mut() = code;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}
