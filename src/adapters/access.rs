//! The request id and the access log.
//!
//! **Request id.** The entry node gives every client request an id: a
//! random UUID (version 4) drawn from the entry's seeded RNG, the one it
//! already draws per request (no clock, no extra system call). The id
//! travels to the owner in the peer request head (`RequestHead::request_id`,
//! a `u128` that has been on the wire since its first version: no frame
//! change), so the entry's and the owner's access log lines of one request
//! carry the same `request_id`. The app receives it as `X-Request-Id`
//! (lowercase hyphenated UUID), on the local path and on the owner alike.
//!
//! A client-sent `X-Request-Id` is handled as Envoy does at an edge that
//! trusts the proxy in front of it (`preserve_external_request_id`): with
//! `headers.trust_client_forwarded` (the default: peerlb runs behind a
//! sprayer or a proxy) a client-sent id that is a UUID is kept, so a trace
//! begun in front of peerlb goes on through it; any other value, and any
//! client-sent id when `trust_client_forwarded = false`, is replaced by the
//! entry's own.
//!
//! **Access log.** One INFO event per request and per node that handled it,
//! at target [`ACCESS`] (`peerlb::access`), with the fields operators
//! filter on: `node`, `request_id`, `role` (`entry` or `owner`), `entry`,
//! `owner` (who served it; the decision's owner when it failed), `status`,
//! `duration_us` (arrival to response head at that node), `reason` (the
//! routing reason at the entry, `proxied` at the owner) and `method`. The
//! target is on only with `peerlb node --access-log` (whatever `RUST_LOG`
//! says): an event per request costs a few percent of a node's CPU. With
//! `--log-format json` each event is one JSON object per line.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use tracing::info;

/// The access log's tracing target.
pub(crate) const ACCESS: &str = "peerlb::access";

/// Request header carrying the request id to the app.
pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The id of a client request, as a `u128` (the wire's form); sets
/// `X-Request-Id` in `headers` to it. `random` is 16 bytes of the entry's
/// seeded RNG (a version 4 UUID is made of them); a client-sent UUID is
/// kept instead when `keep_client` holds (see the module doc).
pub(crate) fn request_id(headers: &mut HeaderMap, random: [u8; 16], keep_client: bool) -> u128 {
    if keep_client {
        let mut sent = headers.get_all(&X_REQUEST_ID).iter();
        if let (Some(v), None) = (sent.next(), sent.next())
            && let Ok(id) = uuid::Uuid::try_parse_ascii(v.as_bytes())
        {
            return id.as_u128();
        }
    }
    let id = uuid::Builder::from_random_bytes(random).into_uuid();
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    let text = id.hyphenated().encode_lower(&mut text);
    headers.insert(
        X_REQUEST_ID,
        HeaderValue::from_str(text).expect("a hyphenated UUID is a header value"),
    );
    id.as_u128()
}

/// Writes one access log line (see the module doc) for a request `node`
/// handled as `role`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn access_log(
    node: &str,
    role: &'static str,
    request_id: u128,
    entry: &str,
    owner: &str,
    status: u16,
    duration: Duration,
    reason: &'static str,
    method: &Method,
) {
    info!(
        target: ACCESS,
        node,
        request_id = %uuid::Uuid::from_u128(request_id),
        role,
        entry,
        owner,
        status,
        duration_us = duration.as_micros() as u64,
        reason,
        method = method.as_str(),
        "request"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANDOM: [u8; 16] = [7; 16];

    #[test]
    fn the_entry_sets_a_version_4_uuid() {
        let mut h = HeaderMap::new();
        let id = request_id(&mut h, RANDOM, true);
        let u = uuid::Uuid::from_u128(id);
        assert_eq!(u.get_version_num(), 4);
        assert_eq!(h[&X_REQUEST_ID], u.hyphenated().to_string().as_str());
    }

    #[test]
    fn a_client_uuid_is_kept_only_when_trusted() {
        let sent = "0f8fad5b-d9cb-469f-a165-70867728950e";
        let mut h = HeaderMap::new();
        h.insert(X_REQUEST_ID, HeaderValue::from_static(sent));
        let id = request_id(&mut h, RANDOM, true);
        assert_eq!(uuid::Uuid::from_u128(id).to_string(), sent);
        assert_eq!(h[&X_REQUEST_ID], sent);
        let id = request_id(&mut h, RANDOM, false);
        assert_ne!(uuid::Uuid::from_u128(id).to_string(), sent);
        assert_eq!(h.get_all(X_REQUEST_ID).iter().count(), 1);
        assert_ne!(h[X_REQUEST_ID], sent);
    }

    #[test]
    fn a_client_id_that_is_no_uuid_or_sent_twice_is_replaced() {
        for sent in [&["abc"][..], &["0f8fad5b-d9cb-469f-a165-70867728950e"; 2]] {
            let mut h = HeaderMap::new();
            for v in sent {
                h.append(X_REQUEST_ID, HeaderValue::from_static(v));
            }
            let id = request_id(&mut h, RANDOM, true);
            assert_eq!(uuid::Uuid::from_u128(id).get_version_num(), 4);
            assert_eq!(h.get_all(X_REQUEST_ID).iter().count(), 1);
            assert_eq!(
                h[X_REQUEST_ID],
                uuid::Uuid::from_u128(id).to_string().as_str()
            );
        }
    }
}
