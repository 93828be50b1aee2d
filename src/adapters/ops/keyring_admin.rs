//! The gossip part of the admin API: the keyring's fingerprints and the
//! datagrams gossip dropped (in `GET /_peerlb/status`), and key rotation
//! without downtime, as Serf's `keys -install / -use / -remove`:
//!
//! | method and path | answer |
//! | --- | --- |
//! | `GET /_peerlb/keyring` | `{"keys": [fingerprint, ...]}`, the sending key first |
//! | `POST /_peerlb/keyring/install` | body: a base64 key (32 bytes). Adds it for opening: 200 with the keys; 400 not a key; 409 the ring is full |
//! | `POST /_peerlb/keyring/use` | body: a fingerprint. Makes that key the sending key: 200; 404 unknown |
//! | `POST /_peerlb/keyring/remove` | body: a fingerprint. Removes the key: 200; 404 unknown; 409 the sending key |
//!
//! Every change is written to the node's keyring file (`tls.gossip_keyring`)
//! before it is in force (500 when it cannot be), so a restart keeps it.

use std::sync::atomic::Ordering;

use http::Method;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;

use crate::adapters::cluster::keyring::{GossipKey, GossipKeys, KeyringError};
use crate::adapters::errors::AdminError;

/// The tracing target of this module's events: its path before the
/// adapters were put in wings (`crate::adapters::REQUEST_PATH`).
const LOG: &str = "peerlb::adapters::gossip::admin";

/// `GET /_peerlb/keyring`, and the prefix of the rotation paths.
pub(crate) const KEYRING: &str = "/_peerlb/keyring";

/// Longest body read (a base64 key is 44 bytes).
const BODY_LIMIT: usize = 256;

/// The `gossip` object of `GET /_peerlb/status`: `keys` (fingerprints, the
/// sending key first) and `dropped` (`unauthenticated`, `out_of_bounds`,
/// `oversize` datagram counts since start).
pub(crate) fn status(keys: &GossipKeys) -> serde_json::Value {
    let c = &keys.counters;
    serde_json::json!({
        "keys": keys.ring().fingerprints(),
        "dropped": {
            "unauthenticated": c.unauthenticated.load(Ordering::Relaxed),
            "out_of_bounds": c.out_of_bounds.load(Ordering::Relaxed),
            "oversize": c.oversize.load(Ordering::Relaxed),
        },
    })
}

/// True for the keyring paths ([`answer`] takes them).
pub(crate) fn is_keyring(path: &str) -> bool {
    path == KEYRING || path.starts_with("/_peerlb/keyring/")
}

/// Answers a keyring request: the JSON body of a 200, or the error that
/// `errors::error_response` (the one place errors become HTTP answers)
/// turns into 400/404/405/409/500.
///
/// # Errors
/// [`AdminError::UnknownPath`], [`AdminError::MethodNotAllowed`], and
/// [`AdminError::Keyring`] when the body is not a key, the key is unknown,
/// the ring is full, the key is the sending key, or the file cannot be
/// written.
pub(crate) async fn answer(
    keys: &GossipKeys,
    method: &Method,
    path: &str,
    body: Incoming,
) -> Result<String, AdminError> {
    let op = path.strip_prefix(KEYRING).unwrap_or_default();
    let (allowed, allow) = match op {
        "" => (Method::GET, "GET"),
        "/install" | "/use" | "/remove" => (Method::POST, "POST"),
        _ => return Err(AdminError::UnknownPath),
    };
    if *method != allowed {
        return Err(AdminError::MethodNotAllowed { allow });
    }
    if op.is_empty() {
        return Ok(keys_json(&keys.ring().fingerprints()));
    }
    let text = match http_body_util::Limited::new(body, BODY_LIMIT)
        .collect()
        .await
    {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).trim().to_owned(),
        Err(e) => {
            return Err(AdminError::Keyring(KeyringError::BadKey {
                line: 0,
                reason: format!("reading the body: {e}"),
            }));
        }
    };
    let r = match op {
        "/install" => match GossipKey::parse(&text) {
            Ok(k) => keys.update(|r| r.install(k)),
            Err(e) => Err(e),
        },
        "/use" => keys.update(|r| r.use_key(&text)),
        _ => keys.update(|r| r.remove(&text)),
    };
    let ring = r?;
    tracing::info!(target: LOG, keys = ?ring.fingerprints(), "gossip keyring changed");
    Ok(keys_json(&ring.fingerprints()))
}

fn keys_json(keys: &[String]) -> String {
    serde_json::json!({ "keys": keys }).to_string()
}
