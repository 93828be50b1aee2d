//! Checks of what a client sends that more than one stage relies on: the
//! request-target's form and the `Host` header (RFC 9112 section 3.2), the
//! admin path as a normalising app would resolve it, the admin API's
//! `Host` / `Origin` check against browsers, and the forwarding headers the
//! app receives (`X-Forwarded-For`).

use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri, header};

use crate::adapters::errors::RequestError;
pub(crate) use crate::adapters::serve::forwarded::{FORWARDED_PROTO, X_FORWARDED_FOR};
use crate::engine::header_scan::Scan as _;

/// Forwarding headers a client may forge, dropped at the entry when
/// `headers.trust_client_forwarded` is false.
pub(crate) const CLIENT_FORWARDING: [HeaderName; 3] = [
    X_FORWARDED_FOR,
    HeaderName::from_static("x-real-ip"),
    header::FORWARDED,
];

/// Checks the request-target's form and the `Host` value (RFC 9112
/// sections 3.2 and 3.2.1-3.2.4): authority-form is for CONNECT only (which
/// peerlb refuses before this), asterisk-form for OPTIONS only, absolute-form
/// takes `http` or `https`; a `Host` value must be a valid `uri-host [":"
/// port]` (RFC 3986 section 3.2.2), not empty.
///
/// # Errors
/// [`RequestError::BadRequest`] naming what is wrong (400).
pub(crate) fn check_target_and_host(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<(), RequestError> {
    match (uri.scheme_str(), uri.authority()) {
        (None, Some(_)) => {
            return Err(RequestError::BadRequest(
                "authority-form request-target is for CONNECT only",
            ));
        }
        (Some(s), _) if !s.eq_ignore_ascii_case("http") && !s.eq_ignore_ascii_case("https") => {
            return Err(RequestError::BadRequest(
                "absolute-form request-target must be http or https",
            ));
        }
        (Some(_), a) if a.is_none_or(|a| a.host().is_empty()) => {
            return Err(RequestError::BadRequest(
                "absolute-form request-target without a host",
            ));
        }
        _ => {}
    }
    if uri.path() == "*" && uri.scheme().is_none() && method != Method::OPTIONS {
        return Err(RequestError::BadRequest(
            "asterisk-form request-target is for OPTIONS only",
        ));
    }
    if let Some(h) = headers.first(&header::HOST)
        && !valid_host(h.as_bytes())
    {
        return Err(RequestError::BadRequest(
            "the Host header is not a valid host[:port]",
        ));
    }
    Ok(())
}

/// Whether `v` is `uri-host [":" port]` (RFC 3986 section 3.2.2 and 3.2.3):
/// an IP-literal in brackets or a non-empty reg-name / IPv4 address of
/// unreserved, sub-delims and `%XX`, then an optional port of digits.
fn valid_host(v: &[u8]) -> bool {
    let (host, port) = match v.first() {
        Some(b'[') => match v.iter().position(|&b| b == b']') {
            Some(end) => {
                let inner = &v[1..end];
                let ok = !inner.is_empty()
                    && inner
                        .iter()
                        .all(|b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'));
                if !ok {
                    return false;
                }
                (&v[..=end], &v[end + 1..])
            }
            None => return false,
        },
        _ => match v.iter().position(|&b| b == b':') {
            Some(i) => (&v[..i], &v[i..]),
            None => (v, &v[v.len()..]),
        },
    };
    let port_ok = match port.split_first() {
        None => true,
        Some((b':', digits)) => digits.len() <= 5 && digits.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    };
    let host_ok = host.first() == Some(&b'[') || { !host.is_empty() && valid_reg_name(host) };
    host_ok && port_ok
}

/// RFC 3986 reg-name: unreserved / pct-encoded / sub-delims.
fn valid_reg_name(h: &[u8]) -> bool {
    let mut i = 0;
    while i < h.len() {
        let b = h[i];
        if b == b'%' {
            if i + 2 >= h.len() || !(h[i + 1].is_ascii_hexdigit() && h[i + 2].is_ascii_hexdigit()) {
                return false;
            }
            i += 3;
            continue;
        }
        let ok = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
            );
        if !ok {
            return false;
        }
        i += 1;
    }
    true
}

/// Over TLS, whether a request is misdirected (RFC 9110 section 15.5.20,
/// RFC 9113 section 9.1.2): its authority (the absolute-form target's,
/// else `Host`, which an HTTP/2 `:authority` became) names another server than the
/// connection's SNI, and the certificate the handshake served
/// (`ConnInfo::cert_names`) does not cover it: a client reused a
/// connection for another name (connection coalescing) or sent a `Host`
/// the connection was not opened for; or the certificate covers it but
/// `sni_rules_differ(host)` says a rule keyed on `sni` would route it
/// otherwise as this connection's name (`Rules::sni_would_differ`).
/// `Some(host)`, answered 421 so the client opens a connection for that
/// name; `None` for cleartext, a client that sent no SNI, the SNI's own
/// name, a name the certificate covers that the rules route alike, and an
/// IP literal.
pub(crate) fn misdirected(
    sni: Option<&str>,
    cert_names: Option<&[String]>,
    uri: &Uri,
    headers: &HeaderMap,
    sni_rules_differ: impl FnOnce(&str) -> bool,
) -> Option<String> {
    let (sni, names) = (sni?, cert_names?);
    let host = match uri.authority() {
        Some(a) => a.as_str(),
        None => headers.first(&header::HOST)?.to_str().ok()?,
    };
    if host.starts_with('[') {
        return None;
    }
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    let host = host.trim_end_matches('.');
    // The common case, a request for the SNI's own name, allocates nothing.
    if host.eq_ignore_ascii_case(sni.trim_end_matches('.'))
        || host.parse::<std::net::Ipv4Addr>().is_ok()
    {
        return None;
    }
    let host = host.to_ascii_lowercase();
    if crate::adapters::http::entry_tls::covers(names, &host) && !sni_rules_differ(&host) {
        return None;
    }
    Some(host)
}

/// Absolute-form (RFC 9112 section 3.2.2): the request-target's authority
/// wins over the `Host` header, for the routing rules and for the app, so
/// `Host` is replaced by it. True when `Host` was changed.
pub(crate) fn host_from_authority(uri: &Uri, headers: &mut HeaderMap) -> bool {
    let Some(a) = uri.authority() else {
        return false;
    };
    if headers.first(&header::HOST).map(HeaderValue::as_bytes) == Some(a.as_str().as_bytes()) {
        return false;
    }
    match HeaderValue::from_str(a.as_str()) {
        Ok(v) => {
            headers.insert(header::HOST, v);
            true
        }
        Err(_) => false,
    }
}

/// An HTTP/2 request head in the HTTP/1.1 form the rest of the request
/// path checks, routes and forwards (RFC 9113 section 8.3.1): the
/// `:authority` becomes `Host` (it wins over a `Host` field, as an
/// absolute-form target does in HTTP/1.1), the target becomes origin-form
/// (`:path`), several `cookie` fields become one line joined by `"; "`
/// (section 8.2.3), and the version becomes HTTP/1.1, so a request with
/// neither `:authority` nor `Host` fails the HTTP/1.1 Host check (400).
/// HTTP/2 carries no connection-specific fields (section 8.2.2: the h2
/// crate refuses a request with any), so none is left to remove.
pub(crate) fn http2_as_http11(uri: &mut Uri, headers: &mut HeaderMap, version: &mut http::Version) {
    host_from_authority(uri, headers);
    if uri.scheme().is_some() || uri.authority().is_some() {
        *uri = uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"))
            .into();
    }
    let cookies = headers.all_of(&header::COOKIE).count();
    if cookies > 1 {
        let mut joined = Vec::new();
        for v in headers.get_all(header::COOKIE) {
            if !joined.is_empty() {
                joined.extend_from_slice(b"; ");
            }
            joined.extend_from_slice(v.as_bytes());
        }
        if let Ok(v) = HeaderValue::from_bytes(&joined) {
            headers.insert(header::COOKIE, v);
        }
    }
    *version = http::Version::HTTP_11;
}

/// What a request path is to the admin check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathClass {
    /// Not an admin path, however an app would normalise it.
    App,
    /// An admin path as written (`/_peerlb/...`).
    Admin,
    /// Not written as an admin path but resolving to one once normalised
    /// (`//_peerlb/status`, `/%5Fpeerlb/status`, `/x/../_peerlb/status`,
    /// `/_PEERLB/status`, `/_peerlb%2Fstatus`, ...): answered 400, never
    /// routed to the app.
    Disguised,
}

/// Classifies `path` (the raw path of the request-target) against the admin
/// prefix `prefix` (`/_peerlb/`), resolving it as the most lenient app
/// would: percent-decoding (repeatedly, so `%255F` counts), overlong UTF-8
/// and fullwidth forms of ASCII read as ASCII, `\` as `/`, control
/// characters and spaces dropped from a segment and its trailing dots
/// trimmed (`/_peerlb%00/`, `/_peerlb%20/`, `/_peerlb./` as Windows and
/// trimming routers read them), the path cut at a NUL (as a C string ends),
/// empty and `.` segments dropped, `..` resolved, `;` path parameters cut,
/// ASCII case ignored (nginx and Envoy normalise before matching too).
/// Only a path holding a `%` or the name in some case leaves the fast path
/// (no allocation for the others).
pub(crate) fn classify_path(path: &str, prefix: &str) -> PathClass {
    if path.starts_with(prefix) {
        return PathClass::Admin;
    }
    let name = prefix.trim_matches('/');
    // Fast path: no escape and no spelling of the name in any case.
    if !path.as_bytes().contains(&b'%') && !contains_ignore_case(path.as_bytes(), name.as_bytes()) {
        return PathClass::App;
    }
    let mut decoded = path.as_bytes().to_vec();
    for _ in 0..4 {
        let next = percent_decode_all(&decoded);
        if next == decoded {
            break;
        }
        decoded = next;
    }
    let decoded = fold_to_ascii(&decoded);
    let until_nul = decoded.split(|&b| b == 0).next().unwrap_or_default();
    if first_segment_is(&decoded, name.as_bytes()) || first_segment_is(until_nul, name.as_bytes()) {
        PathClass::Disguised
    } else {
        PathClass::App
    }
}

/// Whether the first segment of `path`, once resolved (see
/// [`classify_path`]), is `name` in any ASCII case.
fn first_segment_is(path: &[u8], name: &[u8]) -> bool {
    let mut segments: Vec<Vec<u8>> = Vec::new();
    for seg in path.split(|&b| b == b'/' || b == b'\\') {
        let seg = seg.split(|&b| b == b';').next().unwrap_or_default();
        let mut seg: Vec<u8> = seg
            .iter()
            .copied()
            .filter(|&b| b > b' ' && b != 0x7f)
            .collect();
        if seg.iter().any(|&b| b != b'.') {
            while seg.last() == Some(&b'.') {
                seg.pop();
            }
        }
        match seg.as_slice() {
            b"" | b"." => {}
            b".." => {
                segments.pop();
            }
            _ => segments.push(seg),
        }
    }
    segments
        .first()
        .is_some_and(|first| first.eq_ignore_ascii_case(name))
}

/// Reads overlong UTF-8 encodings of ASCII (`C1 9F` for `_`, the 3-byte
/// `E0 81 9F`) and the fullwidth forms U+FF01..U+FF5E (`＿` for `_`) as the
/// ASCII byte they stand for, as a decoder that is not strict or an app
/// that applies NFKC would; other bytes are kept.
fn fold_to_ascii(s: &[u8]) -> Vec<u8> {
    let cont = |i: usize| s.get(i).copied().filter(|b| b & 0xc0 == 0x80);
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let b = s[i];
        if matches!(b, 0xc0 | 0xc1)
            && let Some(c1) = cont(i + 1)
        {
            out.push(((b & 0x1f) << 6) | (c1 & 0x3f));
            i += 2;
            continue;
        }
        if matches!(b, 0xe0 | 0xef)
            && let (Some(c1), Some(c2)) = (cont(i + 1), cont(i + 2))
        {
            let cp =
                (u32::from(b & 0x0f) << 12) | (u32::from(c1 & 0x3f) << 6) | u32::from(c2 & 0x3f);
            let ascii = match cp {
                0..0x80 => Some(cp),
                0xff01..=0xff5e => Some(cp - 0xff01 + 0x21),
                _ => None,
            };
            if let Some(a) = ascii.and_then(|a| u8::try_from(a).ok()) {
                out.push(a);
                i += 3;
                continue;
            }
        }
        out.push(b);
        i += 1;
    }
    out
}

fn contains_ignore_case(hay: &[u8], needle: &[u8]) -> bool {
    // The first byte filters (a comparison of the whole needle at every
    // offset was most of a request's path check).
    let Some(first) = needle.first().map(u8::to_ascii_lowercase) else {
        return true;
    };
    hay.len() >= needle.len()
        && (0..=hay.len() - needle.len()).any(|i| {
            hay[i].to_ascii_lowercase() == first
                && hay[i..i + needle.len()].eq_ignore_ascii_case(needle)
        })
}

/// Decodes every valid `%XX` of `s` once.
fn percent_decode_all(s: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%'
            && i + 2 < s.len()
            && let (Some(h), Some(l)) = (hex(s[i + 1]), hex(s[i + 2]))
        {
            out.push(h << 4 | l);
            i += 3;
            continue;
        }
        out.push(s[i]);
        i += 1;
    }
    out
}

/// Drops the headers a client may not set because peerlb sets them: the
/// forwarding headers ([`CLIENT_FORWARDING`]) unless `keep_forwarding`
/// (`headers.trust_client_forwarded`), the scheme ([`FORWARDED_PROTO`])
/// and the client certificate's identity
/// (`X-Forwarded-Client-Cert`), every line of each.
pub(crate) fn drop_client_set(headers: &mut HeaderMap, keep_forwarding: bool) {
    use crate::adapters::http::client_cert::FORWARDED_CLIENT_CERT;
    let peerlbs = |k: &HeaderName| {
        *k == FORWARDED_PROTO
            || *k == FORWARDED_CLIENT_CERT
            || (!keep_forwarding && CLIENT_FORWARDING.contains(k))
    };
    // One pass over the names first: a request rarely carries any of
    // them, and a removal by name hashes the name (five per request).
    if !headers.keys().any(peerlbs) {
        return;
    }
    let names: Vec<HeaderName> = headers.keys().filter(|k| peerlbs(k)).cloned().collect();
    for name in names {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_request_for_a_name_its_tls_connection_does_not_serve_is_misdirected() {
        let names: Vec<String> = vec!["localhost".into(), "*.example.com".into()];
        let at = |host: &str, uri: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::HOST, HeaderValue::from_str(host).unwrap());
            misdirected(
                Some("localhost"),
                Some(&names),
                &uri.parse().unwrap(),
                &h,
                |_| false,
            )
        };
        // The SNI's own name, any port, any case, a trailing dot.
        assert_eq!(at("localhost:8443", "/"), None);
        assert_eq!(at("LocalHost.", "/"), None);
        // Another name the certificate covers (coalescing it allows).
        assert_eq!(at("api.example.com", "/"), None);
        // Names it does not cover.
        assert_eq!(at("other.example:8443", "/"), Some("other.example".into()));
        assert_eq!(at("a.b.example.com", "/"), Some("a.b.example.com".into()));
        // The absolute-form target's authority wins over Host.
        assert_eq!(
            at("localhost", "https://evil.example/x"),
            Some("evil.example".into())
        );
        // IP literals, cleartext and clients without SNI are not checked.
        assert_eq!(at("127.0.0.1:8443", "/"), None);
        assert_eq!(at("[::1]:8443", "/"), None);
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("other.example"));
        let uri: Uri = "/".parse().unwrap();
        assert_eq!(misdirected(None, Some(&names), &uri, &h, |_| true), None);
        assert_eq!(
            misdirected(Some("localhost"), None, &uri, &h, |_| true),
            None
        );
        // A covered name that a rule keyed on sni would route otherwise;
        // the rules are asked about that name only.
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("api.example.com"));
        let asked = std::cell::RefCell::new(Vec::new());
        let differ = |host: &str| {
            asked.borrow_mut().push(host.to_owned());
            true
        };
        assert_eq!(
            misdirected(Some("localhost"), Some(&names), &uri, &h, differ),
            Some("api.example.com".into())
        );
        assert_eq!(*asked.borrow(), ["api.example.com"]);
        h.insert(header::HOST, HeaderValue::from_static("localhost"));
        let never = |_: &str| panic!("asked about the SNI's own name");
        assert_eq!(
            misdirected(Some("localhost"), Some(&names), &uri, &h, never),
            None
        );
    }

    use super::*;

    fn req(method: Method, target: &str, host: Option<&str>) -> Result<(), RequestError> {
        let uri: Uri = target.parse().unwrap();
        let mut h = HeaderMap::new();
        if let Some(host) = host {
            h.insert(header::HOST, HeaderValue::from_str(host).unwrap());
        }
        check_target_and_host(&method, &uri, &h)
    }

    #[test]
    fn host_values_are_checked_as_rfc_3986_authorities() {
        for ok in [
            "example.com",
            "example.com:8080",
            "127.0.0.1:80",
            "[::1]:8081",
            "[::1]",
            "a-b_c~d.e",
            "xn--bcher-kva.example",
            "%41b",
        ] {
            assert!(req(Method::GET, "/", Some(ok)).is_ok(), "{ok}");
        }
        for bad in [
            "", "a b/c@d", "a b", "a/b", "u@h", "h:x", "h:123456", "[::1", "[zz]", ":80",
            "h:80:90", "%4", "%zz",
        ] {
            let e = req(Method::GET, "/", Some(bad)).unwrap_err();
            assert!(matches!(e, RequestError::BadRequest(_)), "{bad:?}");
        }
    }

    #[test]
    fn request_target_forms_follow_rfc_9112() {
        assert!(req(Method::GET, "host:80", Some("host:80")).is_err());
        assert!(req(Method::GET, "*", Some("h")).is_err());
        assert!(req(Method::OPTIONS, "*", Some("h")).is_ok());
        assert!(req(Method::GET, "http://h/x", Some("h")).is_ok());
        assert!(req(Method::GET, "ftp://h/x", Some("h")).is_err());
        assert!(req(Method::GET, "/x", Some("h")).is_ok());
    }

    #[test]
    fn absolute_form_authority_replaces_host() {
        let uri: Uri = "http://tenant-a.example/x?user=bob".parse().unwrap();
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("tenant-b.example"));
        assert!(host_from_authority(&uri, &mut h));
        assert_eq!(h[header::HOST], "tenant-a.example");
        assert!(!host_from_authority(&uri, &mut h));
        let origin: Uri = "/x".parse().unwrap();
        assert!(!host_from_authority(&origin, &mut h));
    }

    #[test]
    fn http2_heads_take_the_http11_form() {
        let mut uri: Uri = "https://example.com:8443/a/b?x=1".parse().unwrap();
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("other"));
        h.append(header::COOKIE, HeaderValue::from_static("a=1"));
        h.append(header::COOKIE, HeaderValue::from_static("peerlb-route=n2"));
        let mut v = http::Version::HTTP_2;
        http2_as_http11(&mut uri, &mut h, &mut v);
        assert_eq!(uri, "/a/b?x=1");
        assert_eq!(h[header::HOST], "example.com:8443");
        assert_eq!(h.get_all(header::COOKIE).iter().count(), 1);
        assert_eq!(h[header::COOKIE], "a=1; peerlb-route=n2");
        assert_eq!(v, http::Version::HTTP_11);
        // No :authority: the Host field stays (and is checked later).
        let mut uri: Uri = "/x".parse().unwrap();
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("h"));
        let mut v = http::Version::HTTP_2;
        http2_as_http11(&mut uri, &mut h, &mut v);
        assert_eq!(
            (uri.to_string().as_str(), &h[header::HOST]),
            ("/x", &HeaderValue::from_static("h"))
        );
    }

    #[test]
    fn disguised_admin_paths_are_caught() {
        let p = "/_peerlb/";
        assert_eq!(classify_path("/_peerlb/status", p), PathClass::Admin);
        for d in [
            "//_peerlb/status",
            "/%5Fpeerlb/status",
            "/%5fpeerlb/status",
            "/%255Fpeerlb/status",
            "/x/../_peerlb/status",
            "/./_peerlb/status",
            "/_PEERLB/status",
            "/_peerlb%2Fstatus",
            "/_peerlb",
            "\\_peerlb\\status",
            "/_peerlb;x=1/status",
            // Control characters and spaces, as a trimming app drops them,
            // and a NUL as a C string ends.
            "/_peerlb%00/status",
            "/_peerlb%20/status",
            "/_peerlb%09/status",
            "/_peerlb%0d%0a/status",
            "/_peerlb%7F/status",
            "/%00_peerlb/status",
            "/_peer%00lb/status",
            "/_peerlb%00x/status",
            "/_peerlb%2500/status",
            "/%20/_peerlb/status",
            "/_peerlb%00",
            // Trailing dots (Windows), overlong UTF-8, fullwidth forms.
            "/_peerlb./status",
            "/_peerlb%2e%2e%2e/status",
            "/%C1%9Fpeerlb/status",
            "/%E0%81%9Fpeerlb/status",
            "/%EF%BC%BFpeerlb/status",
            "/%EF%BC%BF%EF%BD%90eerlb/status",
        ] {
            assert_eq!(classify_path(d, p), PathClass::Disguised, "{d}");
        }
        for a in [
            "/",
            "/x",
            "/x/_peerlb/status",
            "/_peerlbx/status",
            "/a%20b",
            "/peerlb/status",
            "/../x",
            "/x%00y",
            "/peer%00lb",
            "/x/_peerlb%00/status",
            "/%C3%A9",
            "/..%2e/x",
        ] {
            assert_eq!(classify_path(a, p), PathClass::App, "{a}");
        }
    }

    /// Every line of each header peerlb sets goes (the forwarding ones
    /// only when they are not trusted); every other line stays.
    #[test]
    fn client_forwarding_headers_are_dropped() {
        use crate::adapters::http::client_cert::FORWARDED_CLIENT_CERT;
        let mut h = HeaderMap::new();
        h.insert("x-user", HeaderValue::from_static("a"));
        h.append(header::ACCEPT, HeaderValue::from_static("b"));
        let untouched = h.clone();
        drop_client_set(&mut h, false);
        assert_eq!(h, untouched);
        let forwarding = |h: &mut HeaderMap| {
            for n in CLIENT_FORWARDING {
                h.append(n.clone(), HeaderValue::from_static("10.0.0.1"));
                h.append(n, HeaderValue::from_static("10.0.0.2"));
            }
        };
        let own = |h: &mut HeaderMap| {
            h.append(FORWARDED_PROTO, HeaderValue::from_static("https"));
            h.append(FORWARDED_PROTO, HeaderValue::from_static("http"));
            h.append(FORWARDED_CLIENT_CERT, HeaderValue::from_static("Hash=1"));
        };
        let mut all = untouched.clone();
        forwarding(&mut all);
        own(&mut all);
        let mut dropped = all.clone();
        drop_client_set(&mut dropped, false);
        assert_eq!(dropped, untouched);
        let mut kept = all.clone();
        drop_client_set(&mut kept, true);
        let mut want = untouched.clone();
        forwarding(&mut want);
        assert_eq!(kept, want);
    }

    proptest::proptest! {
        /// The first-byte filter finds what comparing at every offset
        /// finds, in any ASCII case.
        #[test]
        fn contains_ignore_case_equals_comparing_every_window(
            hay in "[pPeElLbB/%a-z]{0,16}",
            needle in "[pPeElLbB]{1,6}",
        ) {
            let every = hay
                .as_bytes()
                .windows(needle.len())
                .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()));
            proptest::prop_assert_eq!(
                super::contains_ignore_case(hay.as_bytes(), needle.as_bytes()),
                every
            );
        }
    }
}
