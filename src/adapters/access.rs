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
//! **Access log.** One INFO event per answer and per node that handled it,
//! at target [`ACCESS`] (`peerlb::access`), with the fields of HAProxy's
//! `option httplog` and Envoy's default format ([`Line::write`];
//! docs/operations.md "Logs" lists them): `node`, `request_id`, `role`
//! (`entry`, `owner`, `edge` for an answer before routing, `tunnel` for a
//! WebSocket tunnel when it closes), `client`, `entry`, `owner`, the
//! decision (`reason`, `rule`, `sticky`, `key`, `failover`, `retries`),
//! `method`, `host`, `path`, `protocol`, `status`, `bytes_in` (the
//! entry's count of the body bytes read, [`BodyBytes`]),
//! `bytes_out`, `ttfb_us` (to the response head) and `duration_us` (to the
//! last byte of the body: the line is written when the body ends). The
//! target is on only with `peerlb node --access-log` (whatever `RUST_LOG`
//! says): an event per request costs a few percent of a node's CPU, and
//! with the log off nothing is copied or measured for it ([`enabled`], one
//! cached check per request). With `--log-format json` each event is one
//! JSON object per line.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Response};
use tracing::info;

use crate::adapters::body::Body;
use crate::engine::node_id::NodeId;

/// The access log's tracing target.
pub(crate) const ACCESS: &str = "peerlb::access";

/// Request header carrying the request id to the app.
pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The id of a client request, as a `u128` (the wire's form); sets
/// `X-Request-Id` in `headers` to it. `random` is 16 bytes of the entry's
/// seeded RNG (a version 4 UUID is made of them); a client-sent UUID is
/// kept instead when `keep_client` holds (see the module doc).
pub(crate) fn request_id(headers: &mut HeaderMap, random: [u8; 16], keep_client: bool) -> u128 {
    // One lookup of the name for both the client's value and the new one.
    let entry = headers.entry(X_REQUEST_ID);
    if keep_client && let http::header::Entry::Occupied(o) = &entry {
        let mut sent = o.iter();
        if let (Some(v), None) = (sent.next(), sent.next())
            && let Ok(id) = uuid::Uuid::try_parse_ascii(v.as_bytes())
        {
            return id.as_u128();
        }
    }
    let id = uuid::Builder::from_random_bytes(random).into_uuid();
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    let text = id.hyphenated().encode_lower(&mut text);
    let value = HeaderValue::from_str(text).expect("a hyphenated UUID is a header value");
    // Every line the client sent is replaced.
    match entry {
        http::header::Entry::Occupied(mut o) => {
            o.insert(value);
        }
        http::header::Entry::Vacant(v) => {
            v.insert(value);
        }
    }
    id.as_u128()
}

/// The request body bytes an entry read from its client, counted as they
/// are read (a request extension the ingress sets when the access log is
/// on; `body::from_incoming_with_timeout` adds to it): the line's
/// `bytes_in`, the body as received, chunked or not.
#[derive(Clone, Debug, Default)]
pub(crate) struct BodyBytes(pub(crate) std::sync::Arc<std::sync::atomic::AtomicU64>);

/// True when the access log is on (`peerlb node --access-log`): a
/// callsite-cached check, so a node with the log off formats nothing and
/// measures nothing for it.
pub(crate) fn enabled() -> bool {
    tracing::enabled!(target: ACCESS, tracing::Level::INFO)
}

/// What the entry's router decided for a request, for its access line.
#[derive(Debug, Clone, Default)]
pub(crate) struct Routed {
    /// The request id (the wire's `u128`).
    pub(crate) request_id: u128,
    /// Who served it (the decision's owner when it failed).
    pub(crate) owner: Option<NodeId>,
    /// The routing reason (`rule`, `sticky-route`, `round-robin`, ...).
    pub(crate) reason: &'static str,
    /// The rule's index in `[[rules]]` when a rule decided.
    pub(crate) rule: Option<usize>,
    /// The request carried a sticky route (a sticky policy's cookie or
    /// URL parameter).
    pub(crate) sticky: bool,
    /// The hash key: the session id or the value a rule extracted.
    pub(crate) key: Option<String>,
    /// Another candidate than the decision's owner served it.
    pub(crate) failover: bool,
    /// Candidates tried after the first (0 when the first answered).
    pub(crate) retries: u32,
}

/// One access log line in the making: what the request said, taken when
/// it arrived (only when [`enabled`]), and what its answer did; written by
/// [`Line::write`] once the response body ends (or the connection drops
/// it), so `duration_us` runs to the last byte.
#[derive(Debug)]
pub(crate) struct Line {
    /// The node writing it.
    pub(crate) node: NodeId,
    /// `entry`, `owner`, `edge` (an answer before routing: 400, 408,
    /// 414, 431, 503 ...) or `tunnel` (a WebSocket tunnel that closed).
    pub(crate) role: &'static str,
    /// The client's address (the peer's for an owner line).
    pub(crate) client: Option<std::net::SocketAddr>,
    /// The entry node.
    pub(crate) entry: NodeId,
    /// The method, or `-` when no request head was read.
    pub(crate) method: String,
    /// The `Host` (or `:authority`), `-` when absent.
    pub(crate) host: String,
    /// The path and query as sent.
    pub(crate) path: String,
    /// `HTTP/1.1`, `HTTP/2.0`, ...
    pub(crate) protocol: &'static str,
    /// The request body's declared length (`Content-Length`), 0 without;
    /// the line writes the bytes counted in `body_read` instead when any
    /// were read.
    pub(crate) bytes_in: u64,
    /// The entry's count of the body bytes read from the client
    /// ([`BodyBytes`]); `None` on the owner and for edge answers.
    pub(crate) body_read: Option<BodyBytes>,
    /// The routing, at the entry.
    pub(crate) routed: Routed,
    /// The status answered.
    pub(crate) status: u16,
    /// Response body bytes written (the head excluded).
    pub(crate) bytes_out: u64,
    /// Arrival to the response head.
    pub(crate) ttfb: Duration,
    /// When the request arrived.
    pub(crate) start: tokio::time::Instant,
}

impl Line {
    /// A line for the head of `req`, which arrived at `start`.
    pub(crate) fn of<B>(
        node: &NodeId,
        role: &'static str,
        client: Option<std::net::SocketAddr>,
        entry: &NodeId,
        req: &http::Request<B>,
        start: tokio::time::Instant,
    ) -> Line {
        let (method, uri, headers) = (req.method(), req.uri(), req.headers());
        let host = uri
            .authority()
            .map(|a| a.as_str().to_owned())
            .or_else(|| {
                headers
                    .get(http::header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| "-".to_owned());
        Line {
            node: node.clone(),
            role,
            client,
            entry: entry.clone(),
            method: method.as_str().to_owned(),
            host,
            path: uri
                .path_and_query()
                .map_or_else(|| uri.path().to_owned(), |p| p.as_str().to_owned()),
            protocol: protocol(req.version()),
            bytes_in: headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(0),
            body_read: None,
            routed: Routed::default(),
            status: 0,
            bytes_out: 0,
            ttfb: Duration::ZERO,
            start,
        }
    }

    /// Writes the line (see the module doc), `duration_us` ending now.
    pub(crate) fn write(&self) {
        let r = &self.routed;
        info!(
            target: ACCESS,
            node = %self.node,
            request_id = %uuid::Uuid::from_u128(r.request_id),
            role = self.role,
            client = %self.client.map_or_else(|| "-".to_owned(), |c| c.to_string()),
            entry = %self.entry,
            owner = %r.owner.as_deref().unwrap_or("-"),
            reason = r.reason,
            rule = r.rule.map(|i| i as u64),
            sticky = r.sticky,
            key = r.key.as_deref(),
            failover = r.failover,
            retries = r.retries,
            method = %self.method,
            host = %self.host,
            path = %self.path,
            protocol = self.protocol,
            status = self.status,
            bytes_in = self.bytes_in(),
            bytes_out = self.bytes_out,
            ttfb_us = self.ttfb.as_micros() as u64,
            duration_us = self.start.elapsed().as_micros() as u64,
            "request"
        );
    }
}

impl Line {
    /// The line's `bytes_in`: the body bytes the entry read, or, when none
    /// was read (an app that answered without reading it; hyper discards
    /// it), the declared length.
    fn bytes_in(&self) -> u64 {
        match self
            .body_read
            .as_ref()
            .map(|b| b.0.load(std::sync::atomic::Ordering::Relaxed))
        {
            Some(read) if read > 0 => read,
            _ => self.bytes_in,
        }
    }
}

/// The protocol of a request as logged.
fn protocol(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_09 => "HTTP/0.9",
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_11 => "HTTP/1.1",
        http::Version::HTTP_2 => "HTTP/2.0",
        http::Version::HTTP_3 => "HTTP/3.0",
        _ => "-",
    }
}

/// A response body that counts its bytes and writes its request's access
/// line when it ends (its last frame, an error, or dropped unfinished).
struct LoggedBody {
    inner: Body,
    line: Line,
    written: bool,
}

impl LoggedBody {
    fn finish(&mut self) {
        if !self.written {
            self.written = true;
            self.line.write();
        }
    }
}

impl Drop for LoggedBody {
    fn drop(&mut self) {
        self.finish();
    }
}

impl http_body::Body for LoggedBody {
    type Data = bytes::Bytes;
    type Error = crate::adapters::body::BodyError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let this = &mut *self;
        let r = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        match &r {
            std::task::Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    this.line.bytes_out += d.len() as u64;
                }
                if this.inner.is_end_stream() {
                    this.finish();
                }
            }
            std::task::Poll::Ready(_) => this.finish(),
            std::task::Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Sets `line`'s status and time to first byte from `resp` and writes it
/// when `resp`'s body ends (at once for a body that is empty).
pub(crate) fn log_when_done(resp: Response<Body>, mut line: Line) -> Response<Body> {
    use http_body::Body as _;
    use http_body_util::BodyExt as _;
    line.status = resp.status().as_u16();
    line.ttfb = line.start.elapsed();
    if resp.body().is_end_stream() {
        line.write();
        return resp;
    }
    resp.map(|inner| {
        LoggedBody {
            inner,
            line,
            written: false,
        }
        .boxed_unsync()
    })
}

/// The status of an answer hyper gave before any request reached peerlb
/// (a head that did not parse: 400; one past the read buffer: 431), from
/// the connection's error, or 408 for a head begun and not finished
/// within `limits.header_read_timeout_ms`: hyper closes that connection
/// without writing an answer, and the line says 408 as HAProxy's does for
/// it. `None` for other errors. An idle keep-alive connection that times
/// out ends without an error, and a connection that sent nothing is
/// closed before hyper (the HTTP/2 preface wait): neither is logged
/// (HAProxy's `dontlognull`).
pub(crate) fn edge_status(e: &hyper::Error) -> Option<u16> {
    if e.is_parse_too_large() {
        Some(431)
    } else if e.is_parse() {
        Some(400)
    } else if e.is_timeout() {
        Some(408)
    } else {
        None
    }
}

/// Writes an `edge` line for an answer hyper gave on a connection from
/// `client` (see [`edge_status`]).
pub(crate) fn edge_line(node: &NodeId, client: std::net::SocketAddr, status: u16) {
    let line = Line {
        node: node.clone(),
        role: "edge",
        client: Some(client),
        entry: node.clone(),
        method: "-".to_owned(),
        host: "-".to_owned(),
        path: "-".to_owned(),
        protocol: "HTTP/1.1",
        bytes_in: 0,
        body_read: None,
        routed: Routed {
            reason: "edge",
            ..Routed::default()
        },
        status,
        bytes_out: 0,
        ttfb: Duration::ZERO,
        start: tokio::time::Instant::now(),
    };
    line.write();
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
