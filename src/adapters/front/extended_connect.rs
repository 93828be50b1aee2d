//! WebSocket over HTTP/2 (RFC 8441): the extended CONNECT an HTTP/2
//! client sends (`:method CONNECT`, `:protocol websocket`) becomes, at the
//! entry, the HTTP/1.1 opening handshake (RFC 6455 section 4.1) that the
//! rest of the request path, the owner and the app already speak; the
//! app's answer is turned back into the HTTP/2 one.
//!
//! RFC 8441 section 5: the HTTP/2 client sends no `Sec-WebSocket-Key` and
//! gets no `Sec-WebSocket-Accept` (the stream itself proves the server
//! understood). The entry is the HTTP/1.1 hop's client, so it makes the key
//! (16 random bytes, base64) and checks the app's accept as RFC 6455
//! section 4.1 asks a client to. `Sec-WebSocket-Version`,
//! `Sec-WebSocket-Protocol`, `Sec-WebSocket-Extensions` and `Origin` pass
//! as they are, both ways.

use base64::Engine as _;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};

/// The only `:protocol` peerlb relays (RFC 8441 section 4; the Upgrade
/// token of RFC 6455 section 4.1).
pub(crate) const WEBSOCKET: &str = "websocket";

/// What an HTTP/2 request's method and `:protocol` (hyper's
/// [`hyper::ext::Protocol`] extension) ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Connect<'a> {
    /// Not CONNECT: an ordinary request.
    No,
    /// Extended CONNECT with `:protocol websocket` (any ASCII case): a
    /// WebSocket, translated by [`websocket_as_http11`].
    WebSocket,
    /// Extended CONNECT with another `:protocol` (the value): refused
    /// with 501, never routed.
    OtherProtocol(&'a str),
    /// CONNECT without `:protocol` (a TCP tunnel, RFC 9113 section 8.5):
    /// refused with 501, never routed, as an HTTP/1.1 CONNECT is.
    Plain,
}

/// Classifies a request by its method and `:protocol` (`None`: no
/// `:protocol` pseudo-header).
pub(crate) fn classify<'a>(method: &Method, protocol: Option<&'a str>) -> Connect<'a> {
    match (method == Method::CONNECT, protocol) {
        (false, _) => Connect::No,
        (true, None) => Connect::Plain,
        (true, Some(p)) if p.eq_ignore_ascii_case(WEBSOCKET) => Connect::WebSocket,
        (true, Some(p)) => Connect::OtherProtocol(p),
    }
}

/// The HTTP/1.1 side of one translated handshake: what the app's 101 must
/// carry in `Sec-WebSocket-Accept`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Handshake {
    accept: String,
}

/// Turns an extended CONNECT for a WebSocket (already in the HTTP/1.1
/// form of [`crate::adapters::front::client_input::http2_as_http11`]: origin-form
/// target, `Host` from `:authority`) into the HTTP/1.1 opening handshake
/// (RFC 8441 section 5, RFC 6455 section 4.1): the method becomes `GET`,
/// `Connection: Upgrade` and `Upgrade: websocket` are set, and
/// `Sec-WebSocket-Key` is the base64 of `nonce` (16 bytes from the node's
/// seeded RNG), replacing any the client sent. The returned [`Handshake`]
/// checks the app's answer.
pub(crate) fn websocket_as_http11(
    method: &mut Method,
    headers: &mut HeaderMap,
    nonce: [u8; 16],
) -> Handshake {
    let key = base64::engine::general_purpose::STANDARD.encode(nonce);
    *method = Method::GET;
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static(WEBSOCKET));
    headers.remove(header::SEC_WEBSOCKET_ACCEPT);
    let accept = crate::adapters::tunnel::accept_key(key.as_bytes());
    headers.insert(
        header::SEC_WEBSOCKET_KEY,
        HeaderValue::from_str(&key).expect("base64 is a header value"),
    );
    Handshake { accept }
}

/// Why an app's answer cannot be passed to an HTTP/2 WebSocket client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AnswerError {
    /// The app answered 101 without the `Sec-WebSocket-Accept` the key
    /// asks for (RFC 6455 section 4.1: the client fails the connection).
    #[error("the app's 101 carries no valid Sec-WebSocket-Accept for the key peerlb sent")]
    BadAccept,
    /// The app answered a WebSocket opening with a 2xx status, not 101:
    /// to an HTTP/2 client a 2xx means the WebSocket is open (RFC 8441
    /// section 5), and it is not.
    #[error("the app answered the WebSocket opening with {0}, not 101 Switching Protocols")]
    NotSwitched(StatusCode),
}

impl Handshake {
    /// Turns the app's answer into the HTTP/2 client's (RFC 8441 section
    /// 5): a `101` whose `Sec-WebSocket-Accept` matches becomes `200`
    /// without `Sec-WebSocket-Accept`, `Upgrade` and `Connection`; any
    /// other non-2xx status is left as it is (relayed as an ordinary
    /// response). Ok(true) when the answer opens the WebSocket.
    ///
    /// # Errors
    /// [`AnswerError`] when the answer must not reach the client as it is
    /// (the caller answers 502 instead).
    pub(crate) fn answer_as_h2(
        &self,
        status: &mut StatusCode,
        headers: &mut HeaderMap,
    ) -> Result<bool, AnswerError> {
        if *status == StatusCode::SWITCHING_PROTOCOLS {
            let accepted = headers
                .get(header::SEC_WEBSOCKET_ACCEPT)
                .is_some_and(|v| v.as_bytes() == self.accept.as_bytes());
            if !accepted {
                return Err(AnswerError::BadAccept);
            }
            for name in [
                header::SEC_WEBSOCKET_ACCEPT,
                header::UPGRADE,
                header::CONNECTION,
            ] {
                headers.remove(name);
            }
            *status = StatusCode::OK;
            return Ok(true);
        }
        if status.is_success() {
            return Err(AnswerError::NotSwitched(*status));
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_connect_with_websocket_is_a_websocket() {
        assert_eq!(classify(&Method::GET, None), Connect::No);
        assert_eq!(classify(&Method::CONNECT, None), Connect::Plain);
        assert_eq!(
            classify(&Method::CONNECT, Some("websocket")),
            Connect::WebSocket
        );
        assert_eq!(
            classify(&Method::CONNECT, Some("WebSocket")),
            Connect::WebSocket
        );
        assert_eq!(
            classify(&Method::CONNECT, Some("connect-udp")),
            Connect::OtherProtocol("connect-udp")
        );
    }

    #[test]
    fn the_extended_connect_becomes_an_http11_opening_handshake() {
        let mut method = Method::CONNECT;
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("example.com"));
        h.insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
        h.insert(
            header::SEC_WEBSOCKET_KEY,
            HeaderValue::from_static("forged"),
        );
        // RFC 6455 section 1.3's example nonce, "the sample nonce".
        let hs = websocket_as_http11(&mut method, &mut h, *b"the sample nonce");
        assert_eq!(method, Method::GET);
        assert!(crate::adapters::tunnel::wants_websocket(
            &method,
            http::Version::HTTP_11,
            &h
        ));
        assert_eq!(h[header::SEC_WEBSOCKET_KEY], "dGhlIHNhbXBsZSBub25jZQ==");
        assert_eq!(h[header::SEC_WEBSOCKET_VERSION], "13");
        assert_eq!(hs.accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    fn answer(
        hs: &Handshake,
        status: u16,
        pairs: &[(&str, &str)],
    ) -> (Result<bool, AnswerError>, StatusCode, HeaderMap) {
        let mut s = StatusCode::from_u16(status).unwrap();
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let r = hs.answer_as_h2(&mut s, &mut h);
        (r, s, h)
    }

    #[test]
    fn a_101_with_the_right_accept_becomes_200_without_handshake_fields() {
        let mut m = Method::CONNECT;
        let hs = websocket_as_http11(&mut m, &mut HeaderMap::new(), *b"the sample nonce");
        let (r, s, h) = answer(
            &hs,
            101,
            &[
                ("upgrade", "websocket"),
                ("connection", "Upgrade"),
                ("sec-websocket-accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
                ("sec-websocket-protocol", "chat"),
                ("set-cookie", "s=1"),
            ],
        );
        assert_eq!(r, Ok(true));
        assert_eq!(s, StatusCode::OK);
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h["sec-websocket-protocol"], "chat");
        assert_eq!(h["set-cookie"], "s=1");
    }

    #[test]
    fn a_wrong_accept_or_a_2xx_is_refused_and_other_answers_pass() {
        let mut m = Method::CONNECT;
        let hs = websocket_as_http11(&mut m, &mut HeaderMap::new(), *b"the sample nonce");
        let bad = [("sec-websocket-accept", "AAAAAAAAAAAAAAAAAAAAAAAAAAA=")];
        assert_eq!(answer(&hs, 101, &bad).0, Err(AnswerError::BadAccept));
        assert_eq!(answer(&hs, 101, &[]).0, Err(AnswerError::BadAccept));
        assert_eq!(
            answer(&hs, 200, &[]).0,
            Err(AnswerError::NotSwitched(StatusCode::OK))
        );
        for status in [400, 403, 426, 502] {
            let (r, s, _) = answer(&hs, status, &[("sec-websocket-version", "13")]);
            assert_eq!((r, s.as_u16()), (Ok(false), status));
        }
    }
}
