//! The admin API, answered by every node on its client listeners and never
//! routed to another node.
//!
//! | method and path | answer |
//! | --- | --- |
//! | `GET /_peerlb/status` | JSON: `node`, `view_version`, `members` (id, generation, status, weight, load, inflight of every member in this node's view), `serving` (ids on the ring), `inflight`, `counters` |

use std::sync::atomic::Ordering;

use http::{HeaderValue, Response, header};

use super::body::{self, Body};
use super::ingress::Ingress;

/// Path prefix reserved for the admin API.
pub const PREFIX: &str = "/_peerlb/";

/// `GET /_peerlb/status`.
pub const STATUS: &str = "/_peerlb/status";

/// Answers an admin request, or `None` when `path` is not an admin path.
pub fn answer(ingress: &Ingress, path: &str) -> Option<Response<Body>> {
    if !path.starts_with(PREFIX) {
        return None;
    }
    let (status, text) = if path == STATUS {
        (http::StatusCode::OK, status_json(ingress))
    } else {
        (
            http::StatusCode::NOT_FOUND,
            "{\"error\":\"unknown admin path\"}".to_owned(),
        )
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
