//! The admin API, answered by every node on its own admin listener
//! (`admin_addr`, `ops/admin_server.rs`) and never routed to another node. The
//! client listeners answer only the paths [`client_port_serves`] lets
//! through, 404 for the rest of `/_peerlb/...`. What protects the API is
//! who can reach `admin_addr` (loopback by default): docs/operations.md.
//!
//! | method and path | answer |
//! | --- | --- |
//! | `GET /_peerlb/status` | JSON: `node`, `pid`, `state` (the status this node publishes), `policy` (`name`, `figure`: `lbstatus`, `bytes` or null, `members`: that figure per member), `weight` (the weight this node publishes now), `target_weight` (its configured or last `PUT` weight, which a slow start ramps to), `slow_start` (`null`, or `step`, `steps`, `remaining_ms` of the ramp in progress), `view_version`, `members` (id, generation, status, weight, load, inflight, ring_share, peer_addr, http_addr of every member in this node's view), `roster` (every member this node has known, the failed, left and never seen ones included: `roster_json`), `version` (the crate's), `uptime_ms`, `serving` (ids of the serving members), `inflight`, `app_inflight` (requests its app is serving now: client requests served here and proxied ones; the figure it publishes as its load, read now), `peer_connections` (open QUIC connections to peers: one per peer in use, more only briefly), `client_connections` (open client connections), `h2` (`connections`: HTTP/2 client connections accepted, `reset_floods`: those closed for a rapid-reset flood), `websockets` (`open`, `total`: tunnels at this entry, HTTP/1.1 and HTTP/2 (RFC 8441) ones; `proxied_open`, `proxied_total`: tunnels relayed as a forwarded owner; `idle_closed`), `counters` (with `connections_refused`: client connections closed at accept at `limits.max_connections` with every connection busy; `connections_refused_source`: closed at accept because their source address held its share, `limits.max_connections_per_source_percent`; `connections_closed_idle`: idle connections closed at the cap to admit a new one; `proxy_header_refused` and `tls_handshake_failed`: client connections closed before HTTP for want of a valid PROXY header or a TLS handshake; `tls_reloads` and `tls_reload_failures`: certificate reloads of the HTTPS listeners), `gossip` (`keys`: fingerprints of the gossip keyring, the sending key first; `dropped`: `unauthenticated`, `out_of_bounds`, `oversize` datagram counts) |
//! | `GET /_peerlb/metrics` | Prometheus text exposition (`ops/metrics_page.rs` lists every metric) |
//! | `GET`/`HEAD /_peerlb/health` | also answered on the client ports (the sprayer's check, `client_port_serves`): 200 `serving`, 503 `draining`, `offline`, `leaving` or `stopping` (`ops/health.rs`) |
//! | `POST /_peerlb/rules/reload` | reads the data-centric rules again (`rules_file` or the config's `[[rules]]`) and puts them in force for new requests: 200 `{"rules": n}`; 422 with the error when the new rules are invalid (the old ones stay in force); 409 for the embedded config |
//! | `POST /_peerlb/tls/reload` | reads the certificate and key files of the HTTPS client listeners again and serves them to new handshakes: 200 `{"certificates": n}` (0 without HTTPS listeners); 422 naming the field whose file cannot be used (that listener keeps its certificates) |
//! | `GET /_peerlb/keyring`, `POST /_peerlb/keyring/{install,use,remove}` | gossip key rotation (`ops/keyring_admin.rs`): body a base64 key (install) or a key fingerprint (use, remove); 200 `{"keys": [...]}`; 400 not a key, 404 no such key, 409 ring full or the sending key, 500 the keyring file cannot be written |
//! | `POST /_peerlb/state` | body `serving`, `draining` or `offline`; `?node=ID` for another member (`members.rs`: forwarded over the peer link), `?timeout_ms=N` with `draining` to go offline after N ms. Publishes it in gossip: 200 `{"node", "state", "previous"}`; 400 another body or a bad timeout, 409 the node is leaving, 404 no such member, 502 the member is unreachable |
//! | `GET /_peerlb/manager`, `POST /_peerlb/manager` | the balancer-manager page and its forms (`manager.rs`) |
//! | `GET /_peerlb/manager/data` | the manager page's rows as JSON, refreshed by the page every second (`manager::data`) |
//! | `POST /_peerlb/forget?node=ID` | removes a failed, left or never seen member from this node's roster: 200 `{"node", "forgotten": state}`; 404 no such member, 409 the member is in the view, 400 no `node` |
//! | `PUT /_peerlb/weight` | `?node=ID` for another member, as for the state. Body: the member's new weight, a decimal integer `0..=10000` (`MAX_WEIGHT`, the range config validation applies; surrounding whitespace allowed). Publishes it in gossip, so every node's ring takes it within about a gossip round per hop: 200 `{"node": id, "weight": new, "previous": old}`; 400 when the body is not a decimal integer (or longer than 64 bytes), 422 when it is out of range, 409 for 0 when every other serving node has weight 0 (the weight in force stays). Not persisted: a restart publishes the configured weight |

use std::sync::atomic::Ordering;

use http::{Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::adapters::body::Body;
use crate::adapters::errors::{AdminError, StateError, WeightError, error_response, json_response};
use crate::adapters::node_state::NodeState;
use crate::engine::sticky::percent_decode;

pub(crate) mod browser;
pub(crate) mod manager;
pub(crate) mod members;

/// Path prefix reserved for the admin API.
pub(crate) const PREFIX: &str = "/_peerlb/";

/// `GET /_peerlb/status`.
pub(crate) const STATUS: &str = "/_peerlb/status";

/// `POST /_peerlb/rules/reload`.
pub(crate) const RELOAD_RULES: &str = "/_peerlb/rules/reload";

/// `POST /_peerlb/tls/reload`.
pub(crate) const RELOAD_TLS: &str = "/_peerlb/tls/reload";

/// `PUT /_peerlb/weight`.
pub(crate) const WEIGHT: &str = "/_peerlb/weight";

/// `POST /_peerlb/state`.
pub(crate) const STATE: &str = "/_peerlb/state";

/// `GET`/`POST /_peerlb/manager`.
pub(crate) const MANAGER: &str = "/_peerlb/manager";

/// `GET /_peerlb/manager/data`: the manager page's rows as JSON (what its
/// script refreshes the table from).
pub(crate) const MANAGER_DATA: &str = "/_peerlb/manager/data";

/// `POST /_peerlb/forget?node=ID`: removes a failed, left or never seen
/// member from this node's roster.
pub(crate) const FORGET: &str = "/_peerlb/forget";

/// The member a state or weight change is for: the query's `node`
/// parameter (percent-decoded), `None` for this node.
fn target_node(uri: &Uri) -> Option<String> {
    uri.query()?
        .split('&')
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| *k == "node")
        .map(|(_, v)| percent_decode(v, true).into_owned())
        .filter(|v| !v.is_empty())
}

/// Reads a change's body (at most [`members::BODY_LIMIT`] bytes).
async fn read_small(body: Incoming) -> Result<bytes::Bytes, String> {
    http_body_util::Limited::new(body, members::BODY_LIMIT)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| e.to_string())
}

/// True when `path` belongs to the admin API (answered by [`answer`], never
/// routed).
pub(crate) fn is_admin(path: &str) -> bool {
    path.starts_with(PREFIX)
}

/// The admin paths a client port answers too: what a sprayer or a client
/// needs (a health check), never what reads or changes the node's state.
/// The hook the health endpoint joins.
const CLIENT_PORT_PATHS: &[&str] = &[crate::adapters::ops::health::PATH];

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
        (&http::Method::GET | &http::Method::HEAD, crate::adapters::ops::health::PATH) => {
            return crate::adapters::ops::health::answer(state, &method);
        }
        (&http::Method::GET, crate::adapters::ops::metrics_page::PATH)
            if crate::adapters::ops::admin::browser::check_admin_browser(req.headers()).is_ok() =>
        {
            return crate::adapters::ops::metrics_page::answer(state, req.headers());
        }
        _ => {}
    }
    let browser = crate::adapters::ops::admin::browser::check_admin_browser(req.headers());
    let answered: Result<String, AdminError> = match (&method, path.as_str()) {
        // Browsers: a foreign Host (DNS rebinding) or Origin (CSRF).
        _ if browser.is_err() => browser.map(|()| String::new()),
        (&http::Method::GET, STATUS) => Ok(status_json(state)),
        (&http::Method::POST, RELOAD_RULES) => state
            .reload_rules()
            .await
            .map(|n| serde_json::json!({ "rules": n }).to_string())
            .map_err(AdminError::Reload),
        (&http::Method::POST, RELOAD_TLS) => state
            .reload_entry_certs()
            .map(|n| serde_json::json!({ "certificates": n }).to_string())
            .map_err(AdminError::TlsReload),
        (&http::Method::PUT, WEIGHT) | (&http::Method::POST, STATE) => {
            let node = target_node(req.uri());
            let query = req.uri().query().map(str::to_owned);
            let change = match read_small(req.into_body()).await {
                Ok(bytes) => members::parse_change(&path, query.as_deref(), &bytes),
                Err(e) if path == WEIGHT => Err(WeightError::Body(e).into()),
                Err(e) => Err(StateError::Body(e).into()),
            };
            return match change {
                Ok(c) => members::apply(state, node.as_deref(), &c).await,
                Err(e) => error_response(&e.into(), state.node_id()),
            };
        }
        (&http::Method::GET, MANAGER) => return manager::page(state, req.uri()).await,
        (&http::Method::GET, manager::SCRIPT_PATH) => return manager::script(),
        (&http::Method::GET, MANAGER_DATA) => Ok(manager::data(state).await.to_string()),
        (&http::Method::POST, FORGET) => forget(state, target_node(req.uri())),
        (&http::Method::POST, MANAGER) => return manager::act(state, req).await,
        (m, p) if crate::adapters::ops::keyring_admin::is_keyring(p) => {
            crate::adapters::ops::keyring_admin::answer(state.gossip_keys(), m, p, req.into_body())
                .await
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
        STATUS | MANAGER_DATA | crate::adapters::ops::metrics_page::PATH => Some("GET"),
        crate::adapters::ops::health::PATH => Some("GET, HEAD"),
        RELOAD_RULES | RELOAD_TLS | STATE | FORGET => Some("POST"),
        WEIGHT => Some("PUT"),
        MANAGER => Some("GET, POST"),
        _ => None,
    }
}

/// `POST /_peerlb/forget?node=ID`: `{"node", "forgotten": state}`.
fn forget(state: &NodeState, node: Option<String>) -> Result<String, AdminError> {
    let id = node.ok_or(AdminError::ForgetWhom)?;
    let was = state.roster().forget(&id).map_err(|e| match e {
        Some(_) => AdminError::ForgetAlive(id.clone()),
        None => AdminError::UnknownMember(id.clone()),
    })?;
    tracing::info!(target: crate::adapters::REQUEST_PATH, member = %id, was = was.as_str(), "member forgotten by an operator");
    Ok(serde_json::json!({ "node": id, "forgotten": was.as_str() }).to_string())
}

/// The roster's records as JSON (`roster` in the status): every member
/// this node has known, with `state` (`alive`, `failed`, `left`, `never
/// seen`), `since_ms` (time in that state: a failed member's downtime),
/// `last_heard_ms_ago` (`null`: never in the view), `reason` (why it left
/// the view), and its last known `status`, `generation`, `weight`,
/// `http_addr` (`null` when never seen).
pub(crate) fn roster_json(state: &NodeState) -> Vec<serde_json::Value> {
    let now = tokio::time::Instant::now();
    state
        .roster()
        .records()
        .map(|(id, r)| {
            let last = r.last.as_ref();
            serde_json::json!({
                "id": &**id,
                "state": r.state.as_str(),
                "since_ms": now.saturating_duration_since(r.since).as_millis() as u64,
                "last_heard_ms_ago": r.last_heard.map(|t| now.saturating_duration_since(t).as_millis() as u64),
                "reason": r.reason,
                "status": last.map(|m| m.status.as_str()),
                "generation": last.map(|m| m.generation),
                "weight": last.map(|m| m.weight),
                "http_addr": last.map(|m| m.http_addr.to_string()),
            })
        })
        .collect()
}

fn status_json(state: &NodeState) -> String {
    let view = state.view();
    let shares = view.ring_shares();
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
                "ring_share": shares.get(&m.id).copied().unwrap_or(0.0),
                "peer_addr": m.peer_addr.to_string(),
                "http_addr": m.http_addr.to_string(),
            })
        })
        .collect();
    let serving: Vec<&str> = view.serving_ids().iter().map(|id| &**id).collect();
    // Apart: one json! of it all passes the macro's recursion limit.
    let counters = serde_json::json!({
        "requests": c.requests.load(Ordering::Relaxed),
        "served_local": c.served_local.load(Ordering::Relaxed),
        "forwarded": c.forwarded.load(Ordering::Relaxed),
        "failovers": c.failovers.load(Ordering::Relaxed),
        "proxied_disagree": c.proxied_disagree.load(Ordering::Relaxed),
        "errors": c.errors.load(Ordering::Relaxed),
        "connections_refused": c.connections_refused.load(Ordering::Relaxed),
        "proxy_header_refused": c.proxy_header_refused.load(Ordering::Relaxed),
        "tls_handshake_failed": c.tls_handshake_failed.load(Ordering::Relaxed),
        "tls_reloads": c.tls_reloads.load(Ordering::Relaxed),
        "tls_reload_failures": c.tls_reload_failures.load(Ordering::Relaxed),
        "connections_refused_source": c.connections_refused_source.load(Ordering::Relaxed),
        "connections_closed_idle": c.connections_closed_idle.load(Ordering::Relaxed),
        "sip_requests": c.sip_requests.load(Ordering::Relaxed),
        "sip_malformed": c.sip_malformed.load(Ordering::Relaxed),
        "sip_forwarded": c.sip_forwarded.load(Ordering::Relaxed),
        "sip_udp_rate_limited": c.sip_udp_rate_limited.load(Ordering::Relaxed),
        "sip_udp_answers_withheld": c.sip_udp_answers_withheld.load(Ordering::Relaxed),
        "sip_acks_absorbed": c.sip_acks_absorbed.load(Ordering::Relaxed),
        "sip_timer_c_cancels": c.sip_timer_c_cancels.load(Ordering::Relaxed),
        "sip_flow_requests": c.sip_flow_requests.load(Ordering::Relaxed),
        "sip_flow_failed": c.sip_flow_failed.load(Ordering::Relaxed),
        "sip_tcp_timed_out": c.sip_tcp_timed_out.load(Ordering::Relaxed),
        "tunnels_refused": c.tunnels_refused.load(Ordering::Relaxed),
        "edge_client_errors": c.edge_client_errors.load(Ordering::Relaxed),
        "responses_cut_budget": c.response_cuts.budget.load(Ordering::Relaxed),
        "responses_cut_stalled": c.response_cuts.stalled.load(Ordering::Relaxed),
    });
    let mut status = serde_json::json!({
        "node": &**state.node_id(),
        "pid": std::process::id(),
        "state": state.status().as_str(),
        "policy": state.policy_state(),
        "weight": state.published_weight(),
        "target_weight": state.weight(),
        "slow_start": state.slow_start_progress().map(|p| serde_json::json!({
            "step": p.step,
            "steps": p.steps,
            "remaining_ms": p.remaining.as_millis() as u64,
        })),
        "view_version": view.version(),
        // jq 1.6 reads numbers as doubles: compare this text instead.
        "view_version_text": view.version().to_string(),
        "members": members,
        "roster": roster_json(state),
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_ms": state.uptime().as_millis() as u64,
        "serving": serving,
        "inflight": state.inflight(),
        "app_inflight": state.serving(),
        "peer_connections": state.peer_connections(),
        "counters": counters,
        "client_connections": c.client_connections.load(Ordering::Relaxed),
        "h2": {
            "connections": c.h2_connections.load(Ordering::Relaxed),
            "reset_floods": c.h2_reset_floods.load(Ordering::Relaxed),
        },
        "websockets": {
            "open": state.tunnels.open(crate::adapters::tunnel::Role::Entry),
            "total": state.tunnels.opened(crate::adapters::tunnel::Role::Entry),
            "proxied_open": state.tunnels.open(crate::adapters::tunnel::Role::Owner),
            "proxied_total": state.tunnels.opened(crate::adapters::tunnel::Role::Owner),
            "idle_closed": state.tunnels.idle_closed(),
        },
        "gossip": crate::adapters::ops::keyring_admin::status(state.gossip_keys()),
    });
    // Set after: one more line in the macro passes its recursion limit.
    status["counters"]["client_aborted"] = c.client_aborted.load(Ordering::Relaxed).into();
    status.to_string()
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
            STATE,
            MANAGER,
            "/_peerlb/keyring",
            "/_peerlb/nope",
        ] {
            assert!(!client_port_serves(p), "{p}");
        }
    }

    #[test]
    fn the_member_a_change_is_for_comes_from_the_query() {
        let q = |uri: &str| target_node(&uri.parse().unwrap());
        assert_eq!(q("/_peerlb/state"), None);
        assert_eq!(q("/_peerlb/state?node=n2").as_deref(), Some("n2"));
        assert_eq!(q("/_peerlb/state?x=1&node=a%2Fb").as_deref(), Some("a/b"));
        assert_eq!(q("/_peerlb/state?node="), None);
    }
}
