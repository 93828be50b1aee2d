//! The admin API, answered by every node on its client listeners to clients
//! on the same host (loopback) only, and never routed to another node.
//! Other clients get 404 for `/_peerlb/...`.
//!
//! | method and path | answer |
//! | --- | --- |
//! | `GET /_peerlb/status` | JSON: `node`, `pid`, `view_version`, `members` (id, generation, status, weight, load, inflight, peer_addr, http_addr of every member in this node's view), `serving` (ids of the serving members), `inflight`, `counters` |
//! | `POST /_peerlb/rules/reload` | reads the data-centric rules again (`rules_file` or the config's `[[rules]]`) and puts them in force for new requests: 200 `{"rules": n}`; 422 with the error when the new rules are invalid (the old ones stay in force); 409 for the embedded config |

use std::sync::atomic::Ordering;

use http::{HeaderValue, Response, header};

use super::body::{self, Body};
use super::ingress::{Ingress, ReloadError};

/// Path prefix reserved for the admin API.
pub(crate) const PREFIX: &str = "/_peerlb/";

/// `GET /_peerlb/status`.
pub(crate) const STATUS: &str = "/_peerlb/status";

/// `POST /_peerlb/rules/reload`.
pub(crate) const RELOAD_RULES: &str = "/_peerlb/rules/reload";

/// Answers an admin request, or `None` when `path` is not an admin path.
pub(crate) fn answer<B>(
    ingress: &Ingress,
    req: &http::Request<B>,
    client: std::net::SocketAddr,
) -> Option<Response<Body>> {
    use http::StatusCode;
    let (method, path) = (req.method(), req.uri().path());
    if !path.starts_with(PREFIX) {
        return None;
    }
    let (status, text) = match (method, path) {
        // The admin API answers the node's own host only: clients that
        // reach the node through the sprayer get 404 as for any unknown path.
        _ if !client.ip().to_canonical().is_loopback() => (
            StatusCode::NOT_FOUND,
            "{\"error\":\"the admin API answers loopback clients only\"}".to_owned(),
        ),
        (&http::Method::GET, STATUS) => (StatusCode::OK, status_json(ingress)),
        (&http::Method::POST, RELOAD_RULES) => match ingress.reload_rules() {
            Ok(n) => (
                StatusCode::OK,
                serde_json::json!({ "rules": n }).to_string(),
            ),
            Err(e @ ReloadError::Embedded) => (
                StatusCode::CONFLICT,
                serde_json::json!({ "error": e.to_string() }).to_string(),
            ),
            Err(e @ ReloadError::Invalid(_)) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                serde_json::json!({ "error": e.to_string() }).to_string(),
            ),
        },
        (_, STATUS | RELOAD_RULES) => (
            StatusCode::METHOD_NOT_ALLOWED,
            "{\"error\":\"method not allowed\"}".to_owned(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "{\"error\":\"unknown admin path\"}".to_owned(),
        ),
    };
    let mut r = Response::new(body::full(text + "\n"));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Some(r)
}

fn status_json(ingress: &Ingress) -> String {
    let view = ingress.view();
    let c = &ingress.counters;
    let members: Vec<_> = view
        .members()
        .map(|m| {
            serde_json::json!({
                "id": &*m.id,
                "generation": m.generation,
                "status": m.status.as_str(),
                "weight": m.weight,
                "load": m.load,
                "inflight": m.inflight,
                "peer_addr": m.peer_addr.to_string(),
                "http_addr": m.http_addr.to_string(),
            })
        })
        .collect();
    let serving: Vec<&str> = view.serving_ids().iter().map(|id| &**id).collect();
    serde_json::json!({
        "node": ingress.node_id(),
        "pid": std::process::id(),
        "view_version": view.version(),
        "members": members,
        "serving": serving,
        "inflight": ingress.inflight(),
        "counters": {
            "requests": c.requests.load(Ordering::Relaxed),
            "served_local": c.served_local.load(Ordering::Relaxed),
            "forwarded": c.forwarded.load(Ordering::Relaxed),
            "failovers": c.failovers.load(Ordering::Relaxed),
            "proxied_disagree": c.proxied_disagree.load(Ordering::Relaxed),
            "errors": c.errors.load(Ordering::Relaxed),
        },
    })
    .to_string()
}
