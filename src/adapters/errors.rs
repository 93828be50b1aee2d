//! Every error a node answers a client with, and the one function that makes
//! them HTTP answers: [`error_response`].
//!
//! Request-path errors ([`RequestError`]) become a `text/plain` body with
//! the cause and `peerlb-error-from: <node id>`; admin API errors
//! ([`AdminError`], wrapping [`ReloadError`], [`WeightError`] and
//! [`StateError`]) become a
//! JSON body `{"error": "<cause>"}`.

use crate::adapters::cluster::keyring::KeyringError;
use http::{HeaderValue, Response, StatusCode, header};

use crate::adapters::body::{self, Body, BodyError};
use crate::config::MAX_WEIGHT;

/// Response header naming the node that made an error answer.
pub(crate) const ERROR_FROM: &str = "peerlb-error-from";

/// [`ERROR_FROM`] as a header name, made once (a `&str` name is parsed
/// again on every lookup).
pub(crate) const ERROR_FROM_NAME: http::HeaderName = http::HeaderName::from_static(ERROR_FROM);

/// The upstream app could not be reached or failed before a response head.
#[derive(Debug, thiserror::Error)]
#[error("upstream app {uri}: {source}")]
pub(crate) struct AppError {
    /// The upstream base URI.
    pub uri: String,
    /// What failed.
    pub source: UpstreamError,
}

impl AppError {
    /// The client's own request body failed (malformed chunked encoding, a
    /// connection cut mid-body, stalled) while it was sent to the app: the
    /// client's fault, not the app's. That body error, if so.
    pub(crate) fn client_body(&self) -> Option<&BodyError> {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&self.source);
        while let Some(e) = cause {
            if let Some(b @ (BodyError::Client(_) | BodyError::ClientTimeout(_))) =
                e.downcast_ref::<BodyError>()
            {
                return Some(b);
            }
            cause = e.source();
        }
        None
    }
}

/// Why the app could not be asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    /// The connection failed (for a Unix socket: no such file, not a
    /// socket, or nothing listening on it).
    #[error("connecting: {0}")]
    Connect(std::io::Error),
    /// No connection within the given time (`serve/upstream.rs`'s
    /// `CONNECT_TIMEOUT`).
    #[error("connecting: no answer within {} s", .0.as_secs())]
    ConnectTimeout(std::time::Duration),
    /// The HTTP/1.1 connection could not be set up, or failed before a
    /// response head.
    #[error("{0}")]
    Http(#[from] hyper::Error),
    /// The request's body failed while it was read to be kept for a
    /// resend (the client's or the peer stream's fault, not the app's).
    #[error("request body: {0}")]
    RequestBody(#[source] BodyError),
    /// The request's body, kept for a resend, is longer than its
    /// `Content-Length` said (hyper refuses to send such a body too).
    #[error("request body longer than its content-length")]
    RequestBodyTooLong,
    /// The app answered `101 Switching Protocols` to a request that asked
    /// for no upgrade (peerlb removes `Upgrade` from every request but a
    /// WebSocket's): a broken app; the connection is closed.
    #[error("answered 101 Switching Protocols to a request that asked for no upgrade")]
    SwitchingProtocols,
    /// An embedded app's service returned this error instead of a
    /// response (502 Bad Gateway, as any app failure).
    #[error("embedded service: {0}")]
    Service(Box<dyn std::error::Error + Send + Sync>),
}

/// Why a request got no answer from an app: each maps to one status in
/// [`error_response`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum RequestError {
    /// The request-target is longer than `limits.max_request_target` (414).
    #[error("request-target of {len} bytes exceeds the {max}-byte limit")]
    UriTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The request head (target and headers) is larger than a peer frame
    /// carries (431).
    #[error("request head of {len} bytes exceeds the {max}-byte limit")]
    HeadTooLarge {
        /// Its size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The request is malformed (400).
    #[error("bad request: {0}")]
    BadRequest(&'static str),
    /// A method peerlb does not proxy: CONNECT (tunnels), over HTTP/1.1 or
    /// HTTP/2 without `:protocol` (501).
    #[error("{0} is not supported: peerlb proxies HTTP requests and WebSockets, not tunnels")]
    NotImplemented(http::Method),
    /// An HTTP/2 extended CONNECT (RFC 8441 section 4) whose `:protocol`
    /// (the value) is not `websocket`, the only one peerlb relays (501).
    #[error(
        "extended CONNECT for :protocol {0:?} is not supported: peerlb relays websocket only (RFC 8441)"
    )]
    UnsupportedProtocol(String),
    /// A WebSocket upgrade while open tunnels hold their share of the
    /// connection cap, this many (`limits.max_tunnels_percent`; 503).
    #[error("open tunnels hold their share of the connection cap ({0}): try again later")]
    TunnelsFull(usize),
    /// Over TLS, a request for a name the connection's certificate does
    /// not cover and that is not its SNI (421; `client_input::misdirected`).
    #[error(
        "misdirected request: this connection (SNI {sni}) does not serve {host}; open one for {host}"
    )]
    Misdirected {
        /// The connection's SNI name.
        sni: String,
        /// The request's host.
        host: String,
    },
    /// No candidate could be reached before anything was sent (503).
    #[error("no node could take the request: {0}")]
    NoNode(String),
    /// The owner failed after the request may have reached it, and the
    /// request cannot be safely retried (502).
    #[error("owner failed: {0}")]
    OwnerFailed(String),
    /// The owner sent no response head within the response timeout (504).
    #[error("owner timed out: {0}")]
    Timeout(String),
    /// The client's request body could not be read (400).
    #[error("reading the request body: {0}")]
    ClientBody(String),
    /// The client's request body stalled past `limits.body_read_timeout_ms` (408).
    #[error("reading the request body: {0}")]
    ClientTimeout(String),
    /// The local upstream app failed (502).
    #[error(transparent)]
    App(#[from] AppError),
}

impl RequestError {
    /// The status a client is answered with for this error (by
    /// [`error_response`]; the access log and the status counts read it
    /// too).
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            RequestError::UriTooLong { .. } => StatusCode::URI_TOO_LONG,
            RequestError::ClientBody(_) | RequestError::BadRequest(_) => StatusCode::BAD_REQUEST,
            RequestError::HeadTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            RequestError::NoNode(_) | RequestError::TunnelsFull(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            RequestError::OwnerFailed(_) | RequestError::App(_) => StatusCode::BAD_GATEWAY,
            RequestError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            RequestError::NotImplemented(_) | RequestError::UnsupportedProtocol(_) => {
                StatusCode::NOT_IMPLEMENTED
            }
            RequestError::ClientTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            RequestError::Misdirected { .. } => StatusCode::MISDIRECTED_REQUEST,
        }
    }

    /// The error for a client body that failed: 408 when it stalled, else 400.
    pub(crate) fn client_body(e: &body::BodyError) -> RequestError {
        match e {
            body::BodyError::ClientTimeout(_) => RequestError::ClientTimeout(e.to_string()),
            _ => RequestError::ClientBody(e.to_string()),
        }
    }
}

/// Rules could not be reloaded; the rules in force stay.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReloadError {
    /// The rules come from the embedded cluster.toml, which cannot change.
    #[error("the rules come from the embedded cluster.toml: nothing to reload")]
    Embedded,
    /// The new rules are invalid (the error names the file and field).
    #[error(transparent)]
    Invalid(crate::config::ConfigError),
}

/// A weight from `PUT /_peerlb/weight` was refused; the weight in force
/// stays.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WeightError {
    /// The body is not a decimal integer (the offending text, at most 64
    /// bytes, is quoted). Send digits only, e.g. `300`.
    #[error("the body must be a decimal integer weight 0..={MAX_WEIGHT}, got {0:?}")]
    NotANumber(String),
    /// The weight is above [`MAX_WEIGHT`], the limit config validation
    /// applies to `[[nodes]] weight` and `--weight`.
    #[error("weight {0} is out of range 0..={MAX_WEIGHT}")]
    OutOfRange(u64),
    /// Weight 0 while every other serving member in this node's view has
    /// weight 0: no node would receive keys (config validation refuses the
    /// same for `[[nodes]]`). Raise another node's weight first.
    #[error(
        "weight 0 refused: every other serving node has weight 0, so no node would receive requests"
    )]
    AllZero,
    /// The request body could not be read (too long: more than 64 bytes,
    /// or the connection failed).
    #[error("reading the body: {0}")]
    Body(String),
}

/// Why `POST /_peerlb/state` (or the manager page's drain, offline and
/// serve actions) was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StateError {
    /// The body is not a state an operator can set (400). Send `serving`,
    /// `draining` or `offline`; `leaving` is SIGTERM's.
    #[error("the body must be serving, draining or offline, got {0:?}")]
    NotAState(String),
    /// `timeout_ms` is not a decimal number of milliseconds, or comes with
    /// another state than `draining` (400).
    #[error("timeout_ms wants a decimal number of milliseconds and the state draining, got {0:?}")]
    BadTimeout(String),
    /// The node is leaving (SIGTERM): it stays leaving until it stops (409).
    #[error("the node is leaving (SIGTERM) and stays so until it stops")]
    Leaving,
    /// The request body could not be read (longer than 64 bytes, or the
    /// connection failed).
    #[error("reading the body: {0}")]
    Body(String),
}

/// Why the admin API refused a request.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdminError {
    /// An admin path asked on a client port, which answers none of the
    /// admin API but what `admin::client_port_serves` lets through (404,
    /// as for any unknown path: the admin API is invisible through the
    /// sprayer).
    #[error("the admin API answers on the node's admin_addr only")]
    ClientPort,
    /// The `Host` is not an IP literal or `localhost` (403): a browser
    /// page after DNS rebinding.
    #[error("the admin API takes an IP-literal or localhost Host only, got {0:?}")]
    ForeignHost(String),
    /// The `Origin` is not the admin API's own (403): a cross-site request
    /// from a browser page.
    #[error("the admin API refuses cross-origin requests, Origin {0:?}")]
    ForeignOrigin(String),
    /// No admin endpoint at this path (404).
    #[error("unknown admin path")]
    UnknownPath,
    /// The endpoint takes another method, `allow` (405 with `Allow`).
    #[error("method not allowed")]
    MethodNotAllowed {
        /// The method the endpoint takes.
        allow: &'static str,
    },
    /// `POST /_peerlb/rules/reload` failed (409 embedded, 422 invalid).
    #[error(transparent)]
    Reload(#[from] ReloadError),
    /// `PUT /_peerlb/weight` was refused (400 not a number, 422 out of
    /// range, 409 all zero).
    #[error(transparent)]
    Weight(#[from] WeightError),
    /// A keyring change was refused or failed (400 not a key or an
    /// unreadable body, 404 no such key, 409 the ring is full or the key
    /// is the sending key, 500 the keyring file cannot be written); the
    /// keyring in force stays.
    #[error(transparent)]
    Keyring(#[from] KeyringError),
    /// `POST /_peerlb/tls/reload`: a listener's certificate or key cannot
    /// be used (422); its certificates in force stay.
    #[error(transparent)]
    TlsReload(#[from] crate::adapters::http::entry_tls::EntryTlsError),
    /// `POST /_peerlb/state` was refused (400 not a state, 409 leaving).
    #[error(transparent)]
    State(#[from] StateError),
    /// `?node=` names no member of this node's view (404).
    #[error("no member {0:?} in this node's view")]
    UnknownMember(String),
    /// `POST /_peerlb/forget?node=ID` for a member in this node's view
    /// (409): only a failed, left or never seen member can be forgotten.
    #[error(
        "member {0:?} is in this node's view: only a failed, left or never seen member can be forgotten"
    )]
    ForgetAlive(String),
    /// `POST /_peerlb/forget` without `?node=ID` (400).
    #[error("name the member to forget: ?node=ID")]
    ForgetWhom,
    /// A change for another member could not be delivered over the peer
    /// link (no authenticated connection, or no answer in time) (502). The
    /// member's state is unknown: read its status.
    #[error("member {node}: the change could not be delivered over the peer link: {reason}")]
    Forward {
        /// The member the change was for.
        node: String,
        /// What failed.
        reason: String,
    },
    /// A manager page form without the page's token, or with another (403):
    /// a form that did not come from this node's page.
    #[error("the form's token does not match this node's manager page: reload the page")]
    Csrf,
    /// A manager page form that is not one of the page's actions (400).
    #[error("bad manager form: {0}")]
    BadForm(String),
}

/// Every error a node answers a client with: the input of
/// [`error_response`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpError {
    /// An error of the request path.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// An error of the admin API.
    #[error(transparent)]
    Admin(#[from] AdminError),
}

/// The one place where errors become HTTP answers. `node` is this node's id
/// (`peerlb-error-from` of request-path errors).
///
/// A request-path error answers its status with a `text/plain` body (the
/// cause and a newline) and `peerlb-error-from`; one for a broken or stalled
/// client body also says `Connection: close` (the rest of the body cannot
/// be skipped, so the connection ends with the answer). An admin error
/// answers a JSON body (`{"error": "<cause>"}` and a newline), with `Allow`
/// on a 405.
pub(crate) fn error_response(err: &HttpError, node: &str) -> Response<Body> {
    let status = match err {
        HttpError::Request(e) => e.status(),
        HttpError::Admin(e) => match e {
            AdminError::ClientPort | AdminError::UnknownPath => StatusCode::NOT_FOUND,
            AdminError::ForeignHost(_) | AdminError::ForeignOrigin(_) => StatusCode::FORBIDDEN,
            AdminError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            AdminError::Reload(ReloadError::Embedded) => StatusCode::CONFLICT,
            AdminError::Reload(ReloadError::Invalid(_)) => StatusCode::UNPROCESSABLE_ENTITY,
            AdminError::Weight(WeightError::NotANumber(_) | WeightError::Body(_)) => {
                StatusCode::BAD_REQUEST
            }
            AdminError::Weight(WeightError::OutOfRange(_)) => StatusCode::UNPROCESSABLE_ENTITY,
            AdminError::Weight(WeightError::AllZero) => StatusCode::CONFLICT,
            AdminError::TlsReload(_) => StatusCode::UNPROCESSABLE_ENTITY,
            AdminError::State(
                StateError::NotAState(_) | StateError::Body(_) | StateError::BadTimeout(_),
            )
            | AdminError::BadForm(_) => StatusCode::BAD_REQUEST,
            AdminError::State(StateError::Leaving) => StatusCode::CONFLICT,
            AdminError::UnknownMember(_) => StatusCode::NOT_FOUND,
            AdminError::ForgetAlive(_) => StatusCode::CONFLICT,
            AdminError::ForgetWhom => StatusCode::BAD_REQUEST,
            AdminError::Forward { .. } => StatusCode::BAD_GATEWAY,
            AdminError::Csrf => StatusCode::FORBIDDEN,
            AdminError::Keyring(k) => match k {
                KeyringError::BadKey { .. } => StatusCode::BAD_REQUEST,
                KeyringError::Unknown(_) => StatusCode::NOT_FOUND,
                KeyringError::TooMany(_) | KeyringError::RemoveSending(_) => StatusCode::CONFLICT,
                KeyringError::Read { .. }
                | KeyringError::Empty
                | KeyringError::Random
                | KeyringError::Write { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            },
        },
    };
    match err {
        HttpError::Request(e) => {
            let mut r = Response::new(body::full(format!("{e}\n")));
            *r.status_mut() = status;
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            if let Ok(v) = HeaderValue::from_str(node) {
                r.headers_mut().insert(ERROR_FROM_NAME, v);
            }
            if matches!(
                e,
                RequestError::ClientBody(_) | RequestError::ClientTimeout(_)
            ) {
                r.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            r
        }
        HttpError::Admin(e) => {
            let mut r = json_response(
                status,
                serde_json::json!({ "error": e.to_string() }).to_string(),
            );
            if let AdminError::MethodNotAllowed { allow } = e {
                r.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static(allow));
            }
            r
        }
    }
}

/// The status of an answer a peer sent (a response head's `status`), as
/// this node passes it on: the code itself, or `502 Bad Gateway` when it
/// is no HTTP status (outside 100..=999: a broken peer, whose answer
/// cannot be passed on as it is).
pub(crate) fn peer_status(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY)
}

/// The owner's answer on a peer's SIP stream (module doc of `wire`, a SIP
/// stream), with no body: what the entry reads from its status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SipStreamAnswer {
    /// `200 OK`: taken (the SIP answers, if any, are the body that
    /// follows; a flow's request was written on the caller's connection).
    Taken,
    /// `400 Bad Request`: the body is not one SIP message.
    NotSip,
    /// `410 Gone`: the caller's connection a flow request names is not
    /// open here (RFC 5923 reuse; the relay then falls back).
    FlowGone,
}

/// The empty answer `a` stands for on a peer's SIP stream.
pub(crate) fn sip_stream_answer(a: SipStreamAnswer) -> Response<Body> {
    let mut r = Response::new(body::empty());
    *r.status_mut() = match a {
        SipStreamAnswer::Taken => StatusCode::OK,
        SipStreamAnswer::NotSip => StatusCode::BAD_REQUEST,
        SipStreamAnswer::FlowGone => StatusCode::GONE,
    };
    r
}

/// An `application/json` answer: `text` and a newline.
pub(crate) fn json_response(status: StatusCode, text: String) -> Response<Body> {
    let mut r = Response::new(body::full(text + "\n"));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_sip_stream_answer_has_its_status_and_no_body() {
        use http_body::Body as _;
        for (a, want) in [
            (SipStreamAnswer::Taken, 200),
            (SipStreamAnswer::NotSip, 400),
            (SipStreamAnswer::FlowGone, 410),
        ] {
            let r = sip_stream_answer(a);
            assert_eq!(r.status().as_u16(), want, "{a:?}");
            assert!(r.body().is_end_stream(), "{a:?}");
        }
    }

    #[test]
    fn a_peer_status_passes_on_unless_it_is_no_http_status() {
        assert_eq!(peer_status(200), StatusCode::OK);
        assert_eq!(peer_status(103), StatusCode::EARLY_HINTS);
        assert_eq!(peer_status(599), StatusCode::from_u16(599).unwrap());
        for broken in [0, 99, 1000, u16::MAX] {
            assert_eq!(peer_status(broken), StatusCode::BAD_GATEWAY, "{broken}");
        }
    }

    fn status(e: impl Into<HttpError>) -> u16 {
        error_response(&e.into(), "n1").status().as_u16()
    }

    #[test]
    fn each_error_has_its_status() {
        for (e, s) in [
            (RequestError::UriTooLong { len: 9, max: 8 }, 414),
            (RequestError::NoNode("x".into()), 503),
            (RequestError::OwnerFailed("x".into()), 502),
            (RequestError::Timeout("x".into()), 504),
            (RequestError::ClientBody("x".into()), 400),
            (RequestError::ClientTimeout("x".into()), 408),
            (RequestError::BadRequest("x"), 400),
            (RequestError::NotImplemented(http::Method::CONNECT), 501),
            (RequestError::UnsupportedProtocol("connect-udp".into()), 501),
            (RequestError::HeadTooLarge { len: 9, max: 8 }, 431),
        ] {
            assert_eq!(status(e), s);
        }
    }

    #[test]
    fn each_admin_error_has_its_status() {
        for (e, s) in [
            (AdminError::ClientPort, 404),
            (AdminError::UnknownPath, 404),
            (AdminError::MethodNotAllowed { allow: "GET" }, 405),
            (AdminError::Reload(ReloadError::Embedded), 409),
            (
                AdminError::TlsReload(crate::adapters::http::entry_tls::EntryTlsError {
                    field: "listener.tls.cert".into(),
                    message: "x".into(),
                }),
                422,
            ),
            (AdminError::Weight(WeightError::NotANumber("x".into())), 400),
            (AdminError::Weight(WeightError::Body("x".into())), 400),
            (AdminError::Weight(WeightError::OutOfRange(10_001)), 422),
            (AdminError::Weight(WeightError::AllZero), 409),
            (AdminError::State(StateError::NotAState("x".into())), 400),
            (AdminError::State(StateError::Leaving), 409),
            (AdminError::State(StateError::BadTimeout("x".into())), 400),
            (AdminError::UnknownMember("x".into()), 404),
            (AdminError::ForgetAlive("x".into()), 409),
            (AdminError::ForgetWhom, 400),
            (
                AdminError::Forward {
                    node: "n2".into(),
                    reason: "x".into(),
                },
                502,
            ),
            (AdminError::Csrf, 403),
            (AdminError::BadForm("x".into()), 400),
            (
                AdminError::Keyring(KeyringError::BadKey {
                    line: 0,
                    reason: "x".into(),
                }),
                400,
            ),
            (AdminError::Keyring(KeyringError::Unknown("f".into())), 404),
            (AdminError::Keyring(KeyringError::TooMany(9)), 409),
            (
                AdminError::Keyring(KeyringError::RemoveSending("f".into())),
                409,
            ),
        ] {
            assert_eq!(status(e), s);
        }
    }

    #[test]
    fn request_errors_are_text_and_name_the_node() {
        let r = error_response(&RequestError::NoNode("x".into()).into(), "n1");
        assert_eq!(r.headers()[header::CONTENT_TYPE], "text/plain");
        assert_eq!(r.headers()[ERROR_FROM], "n1");
        assert!(r.headers().get(header::CONNECTION).is_none());
        let r = error_response(&RequestError::ClientTimeout("x".into()).into(), "n1");
        assert_eq!(r.headers()[header::CONNECTION], "close");
    }

    async fn text(r: Response<Body>) -> String {
        use http_body_util::BodyExt;
        let bytes = r.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn bodies_are_the_cause_as_text_or_json() {
        let r = error_response(&RequestError::NoNode("no candidate".into()).into(), "n1");
        assert_eq!(
            text(r).await,
            "no node could take the request: no candidate\n"
        );
        let r = error_response(&AdminError::ClientPort.into(), "n1");
        assert_eq!(
            text(r).await,
            "{\"error\":\"the admin API answers on the node's admin_addr only\"}\n"
        );
        let r = error_response(&AdminError::Reload(ReloadError::Embedded).into(), "n1");
        assert_eq!(
            text(r).await,
            "{\"error\":\"the rules come from the embedded cluster.toml: nothing to reload\"}\n"
        );
    }

    #[test]
    fn admin_errors_are_json_with_allow_on_a_405() {
        let r = error_response(&AdminError::MethodNotAllowed { allow: "PUT" }.into(), "n1");
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(r.headers()[header::ALLOW], "PUT");
        assert!(r.headers().get(ERROR_FROM).is_none());
        let r = error_response(&AdminError::UnknownPath.into(), "n1");
        assert!(r.headers().get(header::ALLOW).is_none());
    }
}
