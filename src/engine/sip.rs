//! SIP messages (RFC 3261) as far as the converged load balancer needs
//! them: parsing and framing (here), the hash key of a SIP request and the
//! dialog stickiness parameter (`sip/dialog`), which node serves a request
//! (`sip/route`), and the demo user agent server's answers (`sip/uas`). No I/O: bytes in, values and bytes out.
//!
//! What is parsed (RFC 3261 section 7 and 25): the start line (request
//! line `METHOD SP Request-URI SP SIP/2.0`, or status line `SIP/2.0 SP
//! 3DIGIT SP reason`), header fields with folded continuation lines
//! (7.3.1) and compact names (7.3.3, [`full_name`]), then the body framed
//! by `Content-Length` (18.3: required on a stream transport; on UDP it
//! may be absent, and a body shorter than it announces is an error). A
//! request must carry `Via`, `From`, `To`, `Call-ID` and `CSeq` (8.1.1),
//! and its `CSeq` method must be its own (RFC 4475 3.1.2.17-18; the RFC's
//! torture messages are checked in `sip/rfc4475.rs`).
//! Header values are kept as received; nothing else is interpreted until
//! asked for (`Via` branch, `From` tag, `Route` parameters).
//!
//! A message larger than [`MAX_MESSAGE`] is refused: a UDP datagram never
//! is, and a stream sender gets `400` and its connection closed.

use std::borrow::Cow;
use std::fmt::Write as _;

mod dialog;
pub(crate) mod forward;
pub(crate) mod keepalive;
pub(crate) mod proxy;
mod route;
mod uas;
pub(crate) mod udp_guard;
pub(crate) mod upstream;

#[cfg(test)]
pub(crate) use dialog::DialogRoute;
pub(crate) use dialog::{
    FlowRoute, Transport, default_key, dialog_route, flow_of_route, flow_token, is_sips_request,
    mark_contact, record_route, strip_owner_param, target_owner, uri_params_as_query,
};
pub(crate) use route::{SipDecision, SipReason, decide};
pub(crate) use uas::{DialogTable, SERVED_BY, serve as serve_uas};

/// Longest SIP message accepted, head and body, in bytes (64 KiB: the
/// largest UDP datagram; RFC 3261 18.1.1 expects larger ones on TCP, which
/// the demo server never needs).
pub(crate) const MAX_MESSAGE: usize = 64 * 1024;

/// Header fields accepted in one message (a torture case sends thousands).
pub(crate) const MAX_HEADERS: usize = 256;

/// Why bytes are not a SIP message (each is answered `400` when the
/// bytes were a request whose `Via` could be read, else dropped).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ParseError {
    /// No blank line ends the head within [`MAX_MESSAGE`] bytes (stream:
    /// more is needed only while below the limit).
    #[error("incomplete message head")]
    Incomplete,
    /// Longer than [`MAX_MESSAGE`], or more than [`MAX_HEADERS`] fields.
    #[error("message too large")]
    TooLarge,
    /// The head is not UTF-8.
    #[error("message head is not UTF-8")]
    NotUtf8,
    /// The start line is neither a request line nor a status line.
    #[error("bad start line")]
    StartLine,
    /// A header line without a name and a colon, or with a bad name.
    #[error("bad header line")]
    HeaderLine,
    /// A mandatory header (RFC 3261 8.1.1) is missing or malformed.
    #[error("missing or malformed {0}")]
    Mandatory(&'static str),
    /// `Content-Length` is not a number, repeated with other values, or
    /// larger than the bytes present (UDP), or missing on a stream.
    #[error("bad Content-Length")]
    ContentLength,
}

/// The first line of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StartLine {
    /// `METHOD SP Request-URI SP SIP/2.0`.
    Request {
        /// The method (case-sensitive token, RFC 3261 7.1).
        method: String,
        /// The Request-URI as received.
        uri: String,
    },
    /// `SIP/2.0 SP code SP reason`.
    Response {
        /// Status code, 100..=699.
        status: u16,
        /// Reason phrase (may be empty).
        reason: String,
    },
}

/// A parsed SIP message: start line, header fields in order (names as
/// received, values unfolded and trimmed), body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SipMessage {
    /// Request or status line.
    pub start: StartLine,
    /// `(name, value)` in order.
    pub headers: Vec<(String, String)>,
    /// The body (`Content-Length` bytes).
    pub body: Vec<u8>,
}

/// The full lowercase name of a header, compact forms expanded (RFC 3261
/// 7.3.3 and the IANA SIP parameters registry's compact forms).
pub(crate) fn full_name(name: &str) -> Cow<'static, str> {
    let full = match name.to_ascii_lowercase().as_str() {
        "i" => "call-id",
        "f" => "from",
        "t" => "to",
        "v" => "via",
        "m" => "contact",
        "l" => "content-length",
        "c" => "content-type",
        "e" => "content-encoding",
        "k" => "supported",
        "s" => "subject",
        "r" => "refer-to",
        "o" => "event",
        "u" => "allow-events",
        "b" => "referred-by",
        "x" => "session-expires",
        "a" => "accept-contact",
        "j" => "reject-contact",
        "d" => "request-disposition",
        "y" => "identity",
        "n" => "identity-info",
        other => return Cow::Owned(other.to_owned()),
    };
    Cow::Borrowed(full)
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.!%*_+`'~".contains(&b))
}

/// Skips the CRLFs a stream may carry between messages (RFC 3261 7.5 and
/// the RFC 5626 keep-alive); returns how many bytes to skip.
pub(crate) fn leading_crlf(buf: &[u8]) -> usize {
    buf.iter()
        .take_while(|b| **b == b'\r' || **b == b'\n')
        .count()
}

fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Stream framing (TCP): the length of the first whole message in `buf`
/// after [`leading_crlf`] bytes, or `Ok(None)` when more bytes are needed.
///
/// # Errors
/// [`ParseError::TooLarge`] past [`MAX_MESSAGE`]; any error of the head,
/// or [`ParseError::ContentLength`] when it is missing (RFC 3261 18.3).
pub(crate) fn frame_len(buf: &[u8]) -> Result<Option<usize>, ParseError> {
    let Some(end) = head_end(buf) else {
        return if buf.len() >= MAX_MESSAGE {
            Err(ParseError::TooLarge)
        } else {
            Ok(None)
        };
    };
    let (_, headers) = parse_head(&buf[..end])?;
    let len = content_length(&headers)?.ok_or(ParseError::ContentLength)?;
    let total = end.checked_add(len).ok_or(ParseError::TooLarge)?;
    if total > MAX_MESSAGE {
        return Err(ParseError::TooLarge);
    }
    Ok((buf.len() >= total).then_some(total))
}

fn content_length(headers: &[(String, String)]) -> Result<Option<usize>, ParseError> {
    let mut len = None;
    for (n, v) in headers {
        if full_name(n) == "content-length" {
            let v = v.trim();
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) || v.len() > 9 {
                return Err(ParseError::ContentLength);
            }
            let n: usize = v.parse().map_err(|_| ParseError::ContentLength)?;
            if len.is_some_and(|l| l != n) {
                return Err(ParseError::ContentLength);
            }
            len = Some(n);
        }
    }
    Ok(len)
}

fn parse_head(head: &[u8]) -> Result<(StartLine, Vec<(String, String)>), ParseError> {
    let text = std::str::from_utf8(head).map_err(|_| ParseError::NotUtf8)?;
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or("");
    if has_control(first) {
        return Err(ParseError::StartLine);
    }
    let start = parse_start(first)?;
    let mut headers: Vec<(String, String)> = Vec::new();
    for line in lines {
        if line.is_empty() {
            continue;
        }
        // A bare CR or LF, NUL or another control character inside a line
        // (RFC 3261 25.1: field values are text and LWS; lines end with
        // CRLF): refused, so that no value re-encoded for the next hop
        // can carry a line break of its own (header injection).
        if has_control(line) {
            return Err(ParseError::HeaderLine);
        }
        if line.starts_with([' ', '\t']) {
            // A folded continuation (RFC 3261 7.3.1): one space.
            let Some((_, v)) = headers.last_mut() else {
                return Err(ParseError::HeaderLine);
            };
            v.push(' ');
            v.push_str(line.trim());
            continue;
        }
        let (name, value) = line.split_once(':').ok_or(ParseError::HeaderLine)?;
        let name = name.trim_end_matches([' ', '\t']);
        if !is_token(name) {
            return Err(ParseError::HeaderLine);
        }
        if headers.len() == MAX_HEADERS {
            return Err(ParseError::TooLarge);
        }
        headers.push((name.to_owned(), value.trim().to_owned()));
    }
    Ok((start, headers))
}

/// True when `line` holds a control character other than HTAB (CR and LF
/// included: a line here is already cut at its CRLF).
fn has_control(line: &str) -> bool {
    line.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f)
}

fn parse_start(line: &str) -> Result<StartLine, ParseError> {
    if let Some(rest) = line.strip_prefix("SIP/2.0 ") {
        let (code, reason) = rest.split_once(' ').unwrap_or((rest, ""));
        if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ParseError::StartLine);
        }
        let status: u16 = code.parse().map_err(|_| ParseError::StartLine)?;
        if !(100..=699).contains(&status) {
            return Err(ParseError::StartLine);
        }
        return Ok(StartLine::Response {
            status,
            reason: reason.to_owned(),
        });
    }
    let mut parts = line.split(' ');
    let (Some(method), Some(uri), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ParseError::StartLine);
    };
    // The Request-URI is an absolute URI (RFC 3261 25.1): `scheme:rest`.
    let scheme_ok = uri.split_once(':').is_some_and(|(s, r)| {
        !r.is_empty()
            && s.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
    });
    if !is_token(method) || !scheme_ok || version != "SIP/2.0" || uri.contains(['<', '>']) {
        return Err(ParseError::StartLine);
    }
    Ok(StartLine::Request {
        method: method.to_owned(),
        uri: uri.to_owned(),
    })
}

/// Parses one whole message (a UDP datagram, or a frame [`frame_len`]
/// cut from a stream); leading CRLFs are skipped.
///
/// # Errors
/// Any [`ParseError`]; on UDP a missing `Content-Length` means the rest of
/// the datagram is the body (RFC 3261 18.3), one larger than the rest is
/// [`ParseError::ContentLength`].
pub(crate) fn parse(buf: &[u8]) -> Result<SipMessage, ParseError> {
    if buf.len() > MAX_MESSAGE {
        return Err(ParseError::TooLarge);
    }
    let buf = &buf[leading_crlf(buf)..];
    let end = head_end(buf).ok_or(ParseError::Incomplete)?;
    let (start, headers) = parse_head(&buf[..end])?;
    let rest = &buf[end..];
    let body = match content_length(&headers)? {
        Some(n) if n > rest.len() => return Err(ParseError::ContentLength),
        Some(n) => rest[..n].to_vec(),
        None => rest.to_vec(),
    };
    let msg = SipMessage {
        start,
        headers,
        body,
    };
    msg.check_mandatory()?;
    Ok(msg)
}

/// Whether `v` is a `Max-Forwards` value: `1*DIGIT` (RFC 3261 20.22;
/// leading zeros allowed, as in RFC 4475's `wsinv`, `0068`) of at most 255
/// (RFC 4475 3.1.2.4: 300 is invalid).
fn max_forwards_ok(v: &str) -> bool {
    let digits = v.trim_start_matches('0');
    !v.is_empty()
        && v.bytes().all(|b| b.is_ascii_digit())
        && digits.len() <= 3
        && digits
            .parse::<u16>()
            .map_or(digits.is_empty(), |n| n <= 255)
}

impl SipMessage {
    fn check_mandatory(&self) -> Result<(), ParseError> {
        for h in ["via", "from", "to", "call-id", "cseq"] {
            match self.header(h) {
                Some(v) if !v.is_empty() => {}
                _ => return Err(ParseError::Mandatory(h_name(h))),
            }
        }
        let (_, cseq_method) = self.cseq().ok_or(ParseError::Mandatory("CSeq"))?;
        if let StartLine::Request { method, .. } = &self.start
            && method != cseq_method
        {
            return Err(ParseError::Mandatory("CSeq"));
        }
        if let Some(mf) = self.header("max-forwards")
            && !max_forwards_ok(mf)
        {
            return Err(ParseError::Mandatory("Max-Forwards"));
        }
        if self.top_via().is_none() {
            return Err(ParseError::Mandatory("Via"));
        }
        Ok(())
    }

    /// The request's method, `None` for a response.
    pub(crate) fn method(&self) -> Option<&str> {
        match &self.start {
            StartLine::Request { method, .. } => Some(method),
            StartLine::Response { .. } => None,
        }
    }

    /// The first value of header `name` (full or compact, any case).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        let want = full_name(name);
        self.headers
            .iter()
            .find(|(n, _)| full_name(n) == want)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of header `name`, comma-separated lists split (for
    /// `Via`, `Route`, `Record-Route`, `Contact`: RFC 3261 7.3.1), in order.
    pub(crate) fn header_list(&self, name: &str) -> Vec<&str> {
        let want = full_name(name);
        self.headers
            .iter()
            .filter(|(n, _)| full_name(n) == want)
            .flat_map(|(_, v)| split_list(v))
            .collect()
    }

    /// `Call-ID`.
    pub(crate) fn call_id(&self) -> Option<&str> {
        self.header("call-id").filter(|v| !v.is_empty())
    }

    /// `CSeq` as `(number, method)`.
    pub(crate) fn cseq(&self) -> Option<(u32, &str)> {
        let v = self.header("cseq")?;
        let (n, m) = v.split_once([' ', '\t'])?;
        let m = m.trim();
        (is_token(m) && n.bytes().all(|b| b.is_ascii_digit()))
            .then(|| n.parse().ok().map(|n| (n, m)))
            .flatten()
    }

    /// The `tag` parameter of `From`.
    pub(crate) fn tag_of_from(&self) -> Option<&str> {
        param(self.header("from")?, "tag").filter(|t| !t.is_empty())
    }

    /// The `tag` parameter of `To`.
    pub(crate) fn tag_of_to(&self) -> Option<&str> {
        param(self.header("to")?, "tag").filter(|t| !t.is_empty())
    }

    /// The topmost `Via` value, if it is `SIP/2.0/<transport> <sent-by>`.
    pub(crate) fn top_via(&self) -> Option<Via<'_>> {
        Via::parse(self.header_list("via").first()?)
    }

    /// Removes the topmost `Via` value (the first of the first `Via`
    /// field): what a proxy does to a response (RFC 3261 16.7 step 3).
    pub(crate) fn pop_via(&mut self) {
        let Some(i) = self.headers.iter().position(|(n, _)| full_name(n) == "via") else {
            return;
        };
        let rest: Vec<&str> = split_list(&self.headers[i].1).into_iter().skip(1).collect();
        if rest.is_empty() {
            self.headers.remove(i);
        } else {
            self.headers[i].1 = rest.join(", ");
        }
    }

    /// What a server transaction records of where a request came from
    /// (RFC 3261 section 18.2.1 with RFC 3581 section 4), on the topmost
    /// `Via`: `received=<source IP>` when its sent-by host is not that
    /// address, or when it asks for `rport`; and `rport=<source port>`
    /// in place of an empty `rport`. The response then tells a client
    /// behind NAT its public address. Earlier `received` and `rport`
    /// values on that `Via` are replaced; nothing else changes.
    pub(crate) fn note_source(&mut self, source: std::net::SocketAddr) {
        let Some(i) = self.headers.iter().position(|(n, _)| full_name(n) == "via") else {
            return;
        };
        let values = split_list(&self.headers[i].1);
        let Some(first) = values.first() else {
            return;
        };
        let Some(via) = Via::parse(first) else {
            return;
        };
        let ip = source.ip().to_string();
        let host = via.host.trim_start_matches('[').trim_end_matches(']');
        let rport = via.param("rport").is_some();
        if !rport && host == ip {
            return;
        }
        let head = &first[..first.len() - via.params.len()];
        let mut params: Vec<String> = via
            .params
            .split(';')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .filter(|p| {
                let k = p.split_once('=').map_or(*p, |(k, _)| k).trim();
                !k.eq_ignore_ascii_case("received") && !k.eq_ignore_ascii_case("rport")
            })
            .map(str::to_owned)
            .collect();
        params.push(format!("received={ip}"));
        if rport {
            params.push(format!("rport={}", source.port()));
        }
        let head = head.trim_end_matches(';').trim_end();
        let top = format!("{head};{}", params.join(";"));
        let rest: Vec<&str> = values.iter().skip(1).copied().collect();
        self.headers[i].1 = std::iter::once(top.as_str())
            .chain(rest)
            .collect::<Vec<_>>()
            .join(", ");
    }

    /// Adds `name: value` above every other field (a proxy's `Via` and
    /// `Record-Route`, RFC 3261 16.6 steps 4 and 8).
    pub(crate) fn push_front(&mut self, name: &str, value: String) {
        self.headers.insert(0, (name.to_owned(), value));
    }

    /// Removes the topmost `Route` value (a loose router removing the entry
    /// naming itself, RFC 3261 16.4).
    pub(crate) fn pop_route(&mut self) {
        let Some(i) = self
            .headers
            .iter()
            .position(|(n, _)| full_name(n) == "route")
        else {
            return;
        };
        let rest: Vec<&str> = split_list(&self.headers[i].1).into_iter().skip(1).collect();
        if rest.is_empty() {
            self.headers.remove(i);
        } else {
            self.headers[i].1 = rest.join(", ");
        }
    }

    /// The message as bytes: start line, fields as held (a
    /// `Content-Length` is written last, from the body's length), blank
    /// line, body.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut s = String::with_capacity(512);
        match &self.start {
            StartLine::Request { method, uri } => {
                let _ = write!(s, "{method} {uri} SIP/2.0\r\n");
            }
            StartLine::Response { status, reason } => {
                let _ = write!(s, "SIP/2.0 {status} {reason}\r\n");
            }
        }
        for (n, v) in &self.headers {
            if full_name(n) != "content-length" {
                let _ = write!(s, "{n}: {v}\r\n");
            }
        }
        let _ = write!(s, "Content-Length: {}\r\n\r\n", self.body.len());
        let mut out = s.into_bytes();
        out.extend_from_slice(&self.body);
        out
    }

    /// A response to this request (RFC 3261 8.2.6.2): `Via` fields,
    /// `From`, `Call-ID`, `CSeq` copied; `To` copied, with `to_tag` added
    /// when it has no tag (every final and provisional response but `100`
    /// of a dialog-creating request carries one).
    pub(crate) fn response(&self, status: u16, reason: &str, to_tag: Option<&str>) -> SipMessage {
        let mut headers = Vec::new();
        for (n, v) in &self.headers {
            match full_name(n).as_ref() {
                "via" | "from" | "call-id" | "cseq" => headers.push((n.clone(), v.clone())),
                "to" => {
                    let mut v = v.clone();
                    if let Some(tag) = to_tag
                        && status != 100
                        && param(&v, "tag").is_none()
                    {
                        let _ = write!(v, ";tag={tag}");
                    }
                    headers.push((n.clone(), v));
                }
                _ => {}
            }
        }
        SipMessage {
            start: StartLine::Response {
                status,
                reason: reason.to_owned(),
            },
            headers,
            body: Vec::new(),
        }
    }
}

fn h_name(h: &str) -> &'static str {
    match h {
        "via" => "Via",
        "from" => "From",
        "to" => "To",
        "call-id" => "Call-ID",
        _ => "CSeq",
    }
}

/// Splits a header value on the commas that separate list entries,
/// leaving commas inside `"..."` and `<...>` alone; entries trimmed.
pub(crate) fn split_list(v: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut quoted, mut angle, mut start) = (false, false, 0);
    let b = v.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' if quoted => i += 1,
            b'"' => quoted = !quoted,
            b'<' if !quoted => angle = true,
            b'>' if !quoted => angle = false,
            b',' if !quoted && !angle => {
                out.push(v[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    out.push(v[start.min(v.len())..].trim());
    out.retain(|e| !e.is_empty());
    out
}

/// Parameter `name` (case-insensitive) of a header value: the `;name=value`
/// pairs after the `<...>` of a name-addr, or after the URI otherwise
/// (RFC 3261 20.10, 20.20: a URI's own parameters inside `<>` are not the
/// header's). `Some("")` for a parameter without a value.
pub(crate) fn param<'a>(value: &'a str, name: &str) -> Option<&'a str> {
    let params = match value.rfind('>') {
        Some(i) if value.contains('<') => &value[i + 1..],
        _ => value.split_once(';').map_or("", |(_, p)| p),
    };
    params_lookup(params, name)
}

/// Parameter `name` of a URI (`sip:host;lr;x=y`, with or without `<>`).
pub(crate) fn uri_param<'a>(value: &'a str, name: &str) -> Option<&'a str> {
    let uri = match (value.find('<'), value.rfind('>')) {
        (Some(a), Some(b)) if a < b => &value[a + 1..b],
        _ => value,
    };
    params_lookup(dialog::split_uri(uri).1.unwrap_or(""), name)
}

fn params_lookup<'a>(params: &'a str, name: &str) -> Option<&'a str> {
    params.split(';').find_map(|p| {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().trim_matches('"'))
    })
}

/// A `Via` value: `SIP/2.0/<transport> <host>[:<port>];params`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Via<'a> {
    /// `UDP`, `TCP`, ... as sent.
    pub transport: &'a str,
    /// The sent-by host (an IPv6 reference keeps its brackets).
    pub host: &'a str,
    /// The sent-by port, if given.
    pub port: Option<u16>,
    /// The parameters after the sent-by (`;branch=...;rport`).
    pub params: &'a str,
}

impl<'a> Via<'a> {
    /// Parses one `Via` value (one element of a `Via` field's list).
    pub(crate) fn parse_value(v: &'a str) -> Option<Via<'a>> {
        Via::parse(v)
    }

    fn parse(v: &'a str) -> Option<Via<'a>> {
        // `SIP / 2.0 / UDP` with spaces around the slashes is legal
        // (RFC 3261 25.1 `SLASH`; RFC 4475 3.1.1.1).
        let mut parts = v.splitn(3, '/');
        let (Some(name), Some(version), Some(rest)) = (parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        if name.trim() != "SIP" || version.trim() != "2.0" {
            return None;
        }
        let (transport, rest) = rest.trim_start().split_once([' ', '\t'])?;
        if !is_token(transport) {
            return None;
        }
        let rest = rest.trim_start();
        let (sent_by, params) = rest.split_once(';').unwrap_or((rest, ""));
        let sent_by = sent_by.trim();
        let (host, port) = if let Some(r) = sent_by.strip_prefix('[') {
            let (h, p) = r.split_once(']')?;
            (&sent_by[..h.len() + 2], p.strip_prefix(':'))
        } else {
            match sent_by.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (sent_by, None),
            }
        };
        if host.is_empty() || host.contains([' ', ',']) {
            return None;
        }
        let port = match port {
            Some(p) => Some(p.trim().parse().ok()?),
            None => None,
        };
        Some(Via {
            transport,
            host,
            port,
            params,
        })
    }

    /// Parameter `name` of this `Via` (`branch`, `rport`, `received`).
    pub(crate) fn param(&self, name: &str) -> Option<&'a str> {
        params_lookup(self.params, name)
    }
}

/// The `400 Bad Request` answer to bytes that do not parse as a SIP
/// message (RFC 3261 16.3 step 1, 21.4.1), when they are a request whose
/// head can be read: the reason names the problem, and whatever `Via`,
/// `From`, `To`, `Call-ID` and `CSeq` fields it has are copied. `None`
/// for a response or bytes with no request line (those are dropped).
pub(crate) fn bad_request(buf: &[u8], why: &ParseError) -> Option<SipMessage> {
    let buf = &buf[leading_crlf(buf)..];
    let end = head_end(buf).unwrap_or(buf.len().min(MAX_MESSAGE));
    // Cut at the last whole line of a head without its blank line.
    let head = &buf[..end];
    let head = match head_end(head) {
        Some(_) => head,
        None => {
            &head[..head
                .windows(2)
                .rposition(|w| w == b"\r\n")
                .map_or(0, |i| i + 2)]
        }
    };
    let text = String::from_utf8_lossy(head);
    let first = text.split("\r\n").next().unwrap_or("");
    let StartLine::Request { .. } = parse_start(first).ok()? else {
        return None;
    };
    let headers = parse_head(text.as_bytes())
        .map(|(_, h)| h)
        .unwrap_or_default();
    let req = SipMessage {
        start: parse_start(first).ok()?,
        headers,
        body: Vec::new(),
    };
    req.top_via()?;
    let reason = format!("Bad Request ({why})");
    Some(req.response(400, &reason, None))
}

/// Where a response to a request received over UDP from `source` goes
/// (RFC 3261 18.2.2 with RFC 3581): the source IP (what `received` would
/// say); the source port when the top `Via` has `rport`, else the `Via`'s
/// sent-by port, else 5060.
pub(crate) fn response_destination(
    via: &Via<'_>,
    source: std::net::SocketAddr,
) -> std::net::SocketAddr {
    let port = if via.param("rport").is_some() {
        source.port()
    } else {
        via.port.unwrap_or(5060)
    };
    std::net::SocketAddr::new(source.ip(), port)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod rfc4475;
