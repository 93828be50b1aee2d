//! Limits and marks: the entry node's checks of a request head before
//! anything else looks at it, the `peerlb-*` marks a client must not send
//! (headers, the route parameter the app must not see), and the sticky
//! route marks a response announces.

use http::{HeaderValue, Request, Response, header};
use hyper::body::Incoming;

use crate::adapters::body::Body;
use crate::adapters::errors::RequestError;
use crate::adapters::front::client_input;
use crate::adapters::front::extended_connect::{self, Connect};
use crate::adapters::wire;
use crate::engine::sticky::{self, Announcement};

/// Response header carrying a new sticky route as a path parameter
/// (`;peerlb-route=<id>`), for clients that refuse cookies.
pub(crate) const ROUTE: &str = "peerlb-route";

/// Largest request head accepted, in bytes (request-target plus header
/// lines): it must fit a peer frame ([`wire::MAX_HEAD_LEN`]) with room for
/// the rest of the head.
pub(crate) const MAX_HEAD_BYTES: usize = wire::MAX_HEAD_LEN - 4096;

/// The entry node's limits, before anything else looks at the request:
/// request-target length over `max_request_target` bytes (414), head size
/// over [`MAX_HEAD_BYTES`] (431), CONNECT (501: HTTP/1.1, HTTP/2 without
/// `:protocol` or with another than `websocket`), not exactly one Host on
/// HTTP/1.1, a request-target form the method does not take or a Host that
/// is not `host[:port]` (400, [`client_input::check_target_and_host`]).
///
/// # Errors
/// The [`RequestError`] of the first limit the request breaks.
pub(super) fn check(
    req: &Request<Incoming>,
    max_request_target: usize,
) -> Result<(), RequestError> {
    let len = target_len(req.uri());
    if len > max_request_target {
        return Err(RequestError::UriTooLong {
            len,
            max: max_request_target,
        });
    }
    let head: usize = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum::<usize>()
        + len;
    if head > MAX_HEAD_BYTES {
        return Err(RequestError::HeadTooLarge {
            len: head,
            max: MAX_HEAD_BYTES,
        });
    }
    // A WebSocket's extended CONNECT has become a GET by now
    // (`Ingress::handle`); any CONNECT left is refused.
    let protocol = req.extensions().get::<hyper::ext::Protocol>();
    match extended_connect::classify(req.method(), protocol.map(|p| p.as_str())) {
        Connect::No => {}
        Connect::OtherProtocol(p) => return Err(RequestError::UnsupportedProtocol(p.to_owned())),
        Connect::Plain | Connect::WebSocket => {
            return Err(RequestError::NotImplemented(http::Method::CONNECT));
        }
    }
    // Hashed, not scanned: every request has one.
    let hosts = req.headers().get_all(header::HOST).iter().count();
    if hosts > 1 || (hosts == 0 && req.version() == http::Version::HTTP_11) {
        return Err(RequestError::BadRequest(
            "an HTTP/1.1 request needs exactly one Host header",
        ));
    }
    client_input::check_target_and_host(req.method(), req.uri(), req.headers())
}

/// Length of the request-target as received.
fn target_len(uri: &http::Uri) -> usize {
    match (uri.scheme(), uri.path_and_query()) {
        (None, Some(pq)) => pq.as_str().len(),
        _ => uri.to_string().len(),
    }
}

/// The request-target as received: path and query in origin form (no
/// copy), the whole URI in absolute form.
pub(super) fn request_target(uri: &http::Uri) -> std::borrow::Cow<'_, str> {
    match (uri.scheme(), uri.path_and_query()) {
        (None, Some(pq)) => std::borrow::Cow::Borrowed(pq.as_str()),
        _ => std::borrow::Cow::Owned(uri.to_string()),
    }
}

/// Removes every `peerlb-*` header a client sent (marks of proxied requests
/// and the like must not be forgeable).
pub(super) fn strip_peerlb_headers(h: &mut http::HeaderMap) {
    if !h.keys().any(|k| k.as_str().starts_with("peerlb-")) {
        return;
    }
    let names: Vec<http::HeaderName> = h
        .keys()
        .filter(|k| k.as_str().starts_with("peerlb-"))
        .cloned()
        .collect();
    for n in names {
        h.remove(n);
    }
}

/// Removes `;peerlb-route=` from the request-target's last path segment
/// (the engine's [`sticky::strip_route_param`]); true when there was one.
pub(super) fn strip_route_param(uri: &mut http::Uri) -> bool {
    let std::borrow::Cow::Owned(path) = sticky::strip_route_param(uri.path()) else {
        return false;
    };
    let pq = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    let mut parts = std::mem::take(uri).into_parts();
    parts.path_and_query = pq.parse().ok();
    *uri = http::Uri::from_parts(parts).unwrap_or_default();
    true
}

/// Tells the client its (new) sticky route `node`, as the engine's
/// `announcement` says: the route cookie `cookie`, the `peerlb-route`
/// response header, and, for a client that carries the route in the URL
/// (cookies refused), the route parameter on `Location`.
pub(super) fn set_route(
    resp: &mut Response<Body>,
    cookie: &sticky::RouteCookie,
    node: &str,
    announcement: Announcement,
) {
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&cookie.set_cookie_value(node)) {
        h.append(header::SET_COOKIE, v);
    }
    if let Ok(v) = HeaderValue::from_str(&sticky::encode_route_param(node)) {
        h.insert(ROUTE, v);
    }
    if announcement.in_location {
        let rewritten = h
            .get(header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .map(|l| sticky::with_route_param(l, node));
        if let Some(v) = rewritten.and_then(|l| HeaderValue::from_str(&l).ok()) {
            h.insert(header::LOCATION, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peerlb_headers_are_stripped_and_others_kept() {
        let mut h = http::HeaderMap::new();
        h.insert("peerlb-entry", HeaderValue::from_static("n9"));
        h.insert("peerlb-hops", HeaderValue::from_static("0"));
        h.insert("x-user", HeaderValue::from_static("a"));
        strip_peerlb_headers(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h["x-user"], "a");
    }

    #[test]
    fn route_param_is_stripped_from_the_request_target() {
        let mut u: http::Uri = "/cart;peerlb-route=n2?x=1".parse().unwrap();
        assert!(strip_route_param(&mut u));
        assert_eq!(u, "/cart?x=1");
        let mut u: http::Uri = "/cart;v=1".parse().unwrap();
        assert!(!strip_route_param(&mut u));
        assert_eq!(u, "/cart;v=1");
    }

    #[test]
    fn target_len_counts_the_request_target_as_sent() {
        assert_eq!(target_len(&"/a?b=c".parse().unwrap()), 6);
        assert_eq!(
            target_len(&"http://h:1/a".parse().unwrap()),
            "http://h:1/a".len()
        );
    }

    #[test]
    fn an_announced_route_sets_the_cookie_the_header_and_location_when_asked() {
        let resp = || {
            let mut r = Response::new(crate::adapters::body::empty());
            r.headers_mut()
                .insert(header::LOCATION, HeaderValue::from_static("/cart?x=1"));
            r
        };
        let mut r = resp();
        set_route(
            &mut r,
            &sticky::RouteCookie::default(),
            "n2",
            Announcement { in_location: false },
        );
        assert_eq!(
            r.headers()[header::SET_COOKIE],
            "peerlb-route=n2; Path=/; HttpOnly; SameSite=Lax"
        );
        assert_eq!(r.headers()[ROUTE], ";peerlb-route=n2");
        assert_eq!(r.headers()[header::LOCATION], "/cart?x=1");
        let mut r = resp();
        set_route(
            &mut r,
            &sticky::RouteCookie::default(),
            "n2",
            Announcement { in_location: true },
        );
        assert_eq!(r.headers()[header::LOCATION], "/cart;peerlb-route=n2?x=1");
    }
}
