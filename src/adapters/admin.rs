//! The admin API, answered by every node on its own admin listener
//! (`admin_addr`, `admin_server.rs`) and never routed to another node. The
//! client listeners answer only the paths [`client_port_serves`] lets
//! through, 404 for the rest of `/_peerlb/...`. What protects the API is
//! who can reach `admin_addr` (loopback by default): docs/operations.md.
//!
//! | method and path | answer |
//! | --- | --- |
//! | `GET /_peerlb/status` | JSON: `node`, `pid`, `weight` (the weight this node publishes), `view_version`, `members` (id, generation, status, weight, load, inflight, peer_addr, http_addr of every member in this node's view), `serving` (ids of the serving members), `inflight`, `peer_connections` (open QUIC connections to peers: one per peer in use, more only briefly), `client_connections` (open client connections), `counters` (with `connections_refused`: client connections closed at accept at `limits.max_connections` with every connection busy; `connections_refused_source`: closed at accept because their source address held its share, `limits.max_connections_per_source_percent`; `connections_closed_idle`: idle connections closed at the cap to admit a new one), `gossip` (`keys`: fingerprints of the gossip keyring, the sending key first; `dropped`: `unauthenticated`, `out_of_bounds`, `oversize` datagram counts) |
//! | `GET /_peerlb/metrics` | Prometheus text exposition (`metrics.rs` lists every metric) |
//! | `GET`/`HEAD /_peerlb/health` | also answered on the client ports (the sprayer's check, `client_port_serves`): 200 `serving`, 503 `draining`, `leaving` or `stopping` (`health.rs`) |
//! | `POST /_peerlb/rules/reload` | reads the data-centric rules again (`rules_file` or the config's `[[rules]]`) and puts them in force for new requests: 200 `{"rules": n}`; 422 with the error when the new rules are invalid (the old ones stay in force); 409 for the embedded config |
//! | `GET /_peerlb/keyring`, `POST /_peerlb/keyring/{install,use,remove}` | gossip key rotation (`gossip/admin.rs`): body a base64 key (install) or a key fingerprint (use, remove); 200 `{"keys": [...]}`; 400 not a key, 404 no such key, 409 ring full or the sending key, 500 the keyring file cannot be written |
//! | `PUT /_peerlb/weight` | body: the node's new weight, a decimal integer `0..=10000` (`MAX_WEIGHT`, the range config validation applies; surrounding whitespace allowed). Publishes it in gossip, so every node's ring takes it within about a gossip round per hop: 200 `{"weight": new, "previous": old}`; 400 when the body is not a decimal integer (or longer than 64 bytes), 422 when it is out of range, 409 for 0 when every other serving node has weight 0 (the weight in force stays). Not persisted: a restart publishes the configured weight |

use std::sync::atomic::Ordering;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::body::Body;
use super::errors::{AdminError, WeightError, error_response, json_response};
use super::node_state::NodeState;

/// Path prefix reserved for the admin API.
pub(crate) const PREFIX: &str = "/_peerlb/";

/// `GET /_peerlb/status`.
pub(crate) const STATUS: &str = "/_peerlb/status";

/// `POST /_peerlb/rules/reload`.
pub(crate) const RELOAD_RULES: &str = "/_peerlb/rules/reload";

/// `PUT /_peerlb/weight`.
pub(crate) const WEIGHT: &str = "/_peerlb/weight";

/// Longest `PUT /_peerlb/weight` body read, in bytes.
const WEIGHT_BODY_LIMIT: usize = 64;

/// True when `path` belongs to the admin API (answered by [`answer`], never
/// routed).
pub(crate) fn is_admin(path: &str) -> bool {
    path.starts_with(PREFIX)
}

/// The admin paths a client port answers too: what a sprayer or a client
/// needs (a health check), never what reads or changes the node's state.
/// The hook the health endpoint joins.
const CLIENT_PORT_PATHS: &[&str] = &[super::health::PATH];

/// Whether a client listener answers the admin path `path` (else 404).
pub(crate) fn client_port_serves(path: &str) -> bool {
    CLIENT_PORT_PATHS.contains(&path)
}

/// Answers an admin path asked on a client listener: [`answer`] for the
/// paths [`client_port_serves`] lets through, 404 for the rest.
pub(crate) async fn answer_client_port(
    state: &NodeState,
    req: Request<Incoming>,
) -> Response<Body> {
    if client_port_serves(req.uri().path()) {
        answer(state, req).await
    } else {
        error_response(&AdminError::ClientPort.into(), state.node_id())
    }
}

/// Answers an admin request (a path for which [`is_admin`] holds); errors
/// are answered by [`error_response`].
pub(crate) async fn answer(state: &NodeState, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    match (&method, path.as_str()) {
        // The sprayer checks health on the client port (or here): no
        // browser checks, it reads nothing and changes nothing.
        (&http::Method::GET | &http::Method::HEAD, super::health::PATH) => {
            return super::health::answer(state, &method);
        }
        (&http::Method::GET, super::metrics::PATH)
            if super::client_input::check_admin_browser(req.headers()).is_ok() =>
        {
            return super::metrics::answer(state);
        }
        _ => {}
    }
    let browser = super::client_input::check_admin_browser(req.headers());
    let answered: Result<String, AdminError> = match (&method, path.as_str()) {
        // Browsers: a foreign Host (DNS rebinding) or Origin (CSRF).
        _ if browser.is_err() => browser.map(|()| String::new()),
        (&http::Method::GET, STATUS) => Ok(status_json(state)),
        (&http::Method::POST, RELOAD_RULES) => state
            .reload_rules()
            .await
            .map(|n| serde_json::json!({ "rules": n }).to_string())
            .map_err(AdminError::Reload),
        (&http::Method::PUT, WEIGHT) => put_weight(state, req.into_body())
            .await
            .map(|(weight, previous)| {
                serde_json::json!({ "weight": weight, "previous": previous }).to_string()
            })
            .map_err(AdminError::Weight),
        (m, p) if super::gossip::admin::is_keyring(p) => {
            super::gossip::admin::answer(state.gossip_keys(), m, p, req.into_body()).await
        }
        _ => Err(match allowed_method(&path) {
            Some(allow) => AdminError::MethodNotAllowed { allow },
            None => AdminError::UnknownPath,
        }),
    };
    match answered {
        Ok(text) => json_response(StatusCode::OK, text),
        Err(e) => error_response(&e.into(), state.node_id()),
    }
}

/// The method an admin path takes (the `Allow` header of a 405).
fn allowed_method(path: &str) -> Option<&'static str> {
    match path {
        STATUS | super::metrics::PATH => Some("GET"),
        super::health::PATH => Some("GET, HEAD"),
        RELOAD_RULES => Some("POST"),
        WEIGHT => Some("PUT"),
        _ => None,
    }
}

/// Reads the new weight from `body` (a decimal integer, surrounding ASCII
/// whitespace allowed, at most [`WEIGHT_BODY_LIMIT`] bytes) and puts it in
/// force: (new, previous).
async fn put_weight(state: &NodeState, body: Incoming) -> Result<(u32, u32), WeightError> {
    let bytes = http_body_util::Limited::new(body, WEIGHT_BODY_LIMIT)
        .collect()
        .await
        .map_err(|e| WeightError::Body(e.to_string()))?
        .to_bytes();
    let weight = parse_weight(&bytes)?;
    let previous = state.set_weight(weight).await?;
    Ok((state.weight(), previous))
}

/// Parses a weight body: ASCII digits, optionally surrounded by ASCII
/// whitespace. The range is checked by [`NodeState::set_weight`].
///
/// # Errors
/// [`WeightError::NotANumber`] quoting the body (lossy UTF-8).
fn parse_weight(body: &[u8]) -> Result<u64, WeightError> {
    let text = String::from_utf8_lossy(body);
    let t = text.trim_matches(|c: char| c.is_ascii_whitespace());
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(WeightError::NotANumber(text.into_owned()));
    }
    // Digits only: the one failure left is overflow, which is out of range.
    Ok(t.parse().unwrap_or(u64::MAX))
}

fn status_json(state: &NodeState) -> String {
    let view = state.view();
    let c = &state.counters;
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
        "node": &**state.node_id(),
        "pid": std::process::id(),
        "weight": state.weight(),
        "view_version": view.version(),
        // jq 1.6 reads numbers as doubles: compare this text instead.
        "view_version_text": view.version().to_string(),
        "members": members,
        "serving": serving,
        "inflight": state.inflight(),
        "peer_connections": state.peer_connections(),
        "counters": {
            "requests": c.requests.load(Ordering::Relaxed),
            "served_local": c.served_local.load(Ordering::Relaxed),
            "forwarded": c.forwarded.load(Ordering::Relaxed),
            "failovers": c.failovers.load(Ordering::Relaxed),
            "proxied_disagree": c.proxied_disagree.load(Ordering::Relaxed),
            "errors": c.errors.load(Ordering::Relaxed),
            "connections_refused": c.connections_refused.load(Ordering::Relaxed),
            "connections_refused_source": c.connections_refused_source.load(Ordering::Relaxed),
            "connections_closed_idle": c.connections_closed_idle.load(Ordering::Relaxed),
        },
        "client_connections": c.client_connections.load(Ordering::Relaxed),
        "gossip": super::gossip::admin::status(state.gossip_keys()),
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ports_answer_no_state_path() {
        for p in [
            STATUS,
            RELOAD_RULES,
            WEIGHT,
            "/_peerlb/keyring",
            "/_peerlb/nope",
        ] {
            assert!(!client_port_serves(p), "{p}");
        }
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
}
