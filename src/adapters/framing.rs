//! How a response's length crosses the peer hop, so a forwarded response
//! reaches the client framed exactly as the same response served on the
//! entry itself (the local path, where hyper frames the app's response).
//!
//! hyper frames a response from its headers and its body: a body known to
//! be empty (ended) gets no `Content-Length` on a bodiless response and
//! `content-length: 0` on others, a body of known size `n` gets
//! `content-length: n`, one of unknown size is chunked; an app's
//! `Content-Length` on a response that cannot have content is dropped,
//! except on a HEAD answer. Across the hop the entry sees the owner's
//! headers and a stream of unknown size, so:
//!
//! - the owner adds `Content-Length` only where hyper would have written
//!   one on the local path ([`length_to_carry`]): never on a bodiless
//!   answer whose body is ended, or beside `Transfer-Encoding`;
//! - the entry gives hyper an ended body for a bodiless answer
//!   ([`bodiless`]), as the app's client gives it on the local path.
//!
//! The wire's bytes are unchanged: the length travels as the
//! `content-length` line of the header list, as it always did.

use http::{Method, StatusCode, header};

/// True for a response that has no content whatever its headers say
/// (RFC 9110 section 6.4.1): one to a HEAD request, a 1xx, a 204 or a 304.
pub(crate) fn bodiless(method: &str, status: StatusCode) -> bool {
    method == Method::HEAD.as_str()
        || status.is_informational()
        || matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED)
}

/// The `Content-Length` the owner adds to the app's response before the
/// hop, if any: the body's exact size when hyper would have written it on
/// the local path (no `Content-Length` or `Transfer-Encoding` from the
/// app, a status that can carry a length, and not an ended body on a HEAD
/// answer). `ended` is the body's `is_end_stream`, `exact` its exact size
/// hint.
pub(crate) fn length_to_carry(
    method: &str,
    status: StatusCode,
    headers: &http::HeaderMap,
    ended: bool,
    exact: Option<u64>,
) -> Option<u64> {
    if headers.contains_key(header::CONTENT_LENGTH)
        || headers.contains_key(header::TRANSFER_ENCODING)
    {
        return None;
    }
    let can_have_length = !(status.is_informational()
        || matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED)
        || (method == Method::CONNECT.as_str() && status.is_success()));
    if !can_have_length || (ended && method == Method::HEAD.as_str()) {
        return None;
    }
    exact
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    fn with(name: &'static str, value: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, http::HeaderValue::from_static(value));
        h
    }

    #[test]
    fn bodiless_answers() {
        assert!(bodiless("HEAD", StatusCode::OK));
        assert!(bodiless("GET", StatusCode::NO_CONTENT));
        assert!(bodiless("GET", StatusCode::NOT_MODIFIED));
        assert!(bodiless("GET", StatusCode::CONTINUE));
        assert!(!bodiless("GET", StatusCode::OK));
        assert!(!bodiless("POST", StatusCode::NOT_FOUND));
    }

    #[test]
    fn a_known_body_keeps_its_length_across_the_hop() {
        let none = HeaderMap::new();
        assert_eq!(
            length_to_carry("GET", StatusCode::OK, &none, false, Some(5)),
            Some(5)
        );
        // An empty body: hyper writes content-length: 0 on the local path.
        assert_eq!(
            length_to_carry("GET", StatusCode::OK, &none, true, Some(0)),
            Some(0)
        );
        // The built-in app's HEAD answer: a body of the GET's size.
        assert_eq!(
            length_to_carry("HEAD", StatusCode::OK, &none, false, Some(40)),
            Some(40)
        );
        // Unknown size: chunked, as on the local path.
        assert_eq!(
            length_to_carry("GET", StatusCode::OK, &none, false, None),
            None
        );
    }

    #[test]
    fn no_length_is_invented_for_bodiless_answers() {
        let none = HeaderMap::new();
        // An upstream app's HEAD answer without a length: its body is ended.
        assert_eq!(
            length_to_carry("HEAD", StatusCode::OK, &none, true, Some(0)),
            None
        );
        assert_eq!(
            length_to_carry("GET", StatusCode::NO_CONTENT, &none, true, Some(0)),
            None
        );
        assert_eq!(
            length_to_carry("GET", StatusCode::NOT_MODIFIED, &none, true, Some(0)),
            None
        );
        assert_eq!(
            length_to_carry("CONNECT", StatusCode::OK, &none, true, Some(0)),
            None
        );
    }

    #[test]
    fn the_apps_own_framing_is_kept() {
        let chunked = with("transfer-encoding", "chunked");
        assert_eq!(
            length_to_carry("HEAD", StatusCode::OK, &chunked, true, Some(0)),
            None
        );
        assert_eq!(
            length_to_carry("GET", StatusCode::OK, &chunked, false, None),
            None
        );
        let len = with("content-length", "7");
        assert_eq!(
            length_to_carry("GET", StatusCode::OK, &len, false, Some(7)),
            None
        );
    }
}
