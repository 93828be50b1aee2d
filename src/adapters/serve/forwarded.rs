//! The forwarding headers the serving node writes for the app:
//! `X-Forwarded-For`, `X-Forwarded-Proto` and `Forwarded` (RFC 7239). The
//! entry drops the client-sent ones first (`front/client_input.rs`,
//! `headers.trust_client_forwarded`).

use std::io::Write as _;

use http::{HeaderMap, HeaderName, HeaderValue, header};

/// `X-Forwarded-For`: the client addresses a request came through, the
/// client's own last ([`append_forwarded_for`]).
pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// `X-Forwarded-Proto`: the scheme the client used, as peerlb tells the
/// app (`http` or `https`); a client-sent one is dropped at the entry.
pub(crate) const FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Adds the client address `ip` to `X-Forwarded-For` as one combined line
/// (RFC 9110 section 5.3: a recipient may combine field lines into one,
/// comma-separated, in order): a client-sent `X-Forwarded-For: 10.0.0.1`
/// becomes `X-Forwarded-For: 10.0.0.1, 127.0.0.1`, so an app that reads only
/// the first line still sees peerlb's entry last. The rightmost value is the
/// one peerlb vouches for.
pub(crate) fn append_forwarded_for(headers: &mut HeaderMap, ip: std::net::IpAddr) {
    // One allocation: the earlier values, then the address written in
    // place (no intermediate string), handed to the header as is.
    let mut combined: Vec<u8> = Vec::with_capacity(48);
    for v in headers.get_all(&X_FORWARDED_FOR) {
        let v = v.as_bytes().trim_ascii();
        if v.is_empty() {
            continue;
        }
        combined.extend_from_slice(v);
        combined.extend_from_slice(b", ");
    }
    write_ip(&mut combined, ip);
    // Made of header values and an IP address: always a valid value.
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(combined)) {
        headers.insert(X_FORWARDED_FOR, v);
    }
}

/// Tells the app the scheme the client used: `X-Forwarded-Proto` set to
/// `https` or `http` (replacing any value), and a `Forwarded` element
/// (RFC 7239) `for=<client>;proto=<scheme>` appended as the last one, so
/// an app reading the last element reads peerlb's (client-sent elements,
/// when `headers.trust_client_forwarded` keeps them, come before it).
pub(crate) fn set_forwarded_proto(headers: &mut HeaderMap, client: std::net::IpAddr, tls: bool) {
    let proto = if tls { "https" } else { "http" };
    headers.insert(FORWARDED_PROTO, HeaderValue::from_static(proto));
    let mut combined: Vec<u8> = Vec::with_capacity(64);
    for v in headers.get_all(header::FORWARDED) {
        let v = v.as_bytes().trim_ascii();
        if v.is_empty() {
            continue;
        }
        combined.extend_from_slice(v);
        combined.extend_from_slice(b", ");
    }
    // RFC 7239 section 6: an IPv6 address is bracketed and quoted.
    match client.to_canonical() {
        ip @ std::net::IpAddr::V4(_) => {
            combined.extend_from_slice(b"for=");
            write_ip(&mut combined, ip);
        }
        std::net::IpAddr::V6(ip) => {
            write!(combined, "for=\"[{ip}]\"").expect("writing to a Vec does not fail")
        }
    }
    combined.extend_from_slice(b";proto=");
    combined.extend_from_slice(proto.as_bytes());
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(combined)) {
        headers.insert(header::FORWARDED, v);
    }
}

/// The `X-Forwarded-For` and `Forwarded` values of a request from `client`
/// over a connection with (`tls`) or without TLS that carries no such
/// headers of its own: what [`append_forwarded_for`] and
/// [`set_forwarded_proto`] write on such a request, made once for every
/// request of one client connection (`ConnInfo::forwarded`).
pub(crate) fn connection_values(client: std::net::IpAddr, tls: bool) -> [HeaderValue; 2] {
    let mut h = HeaderMap::new();
    append_forwarded_for(&mut h, client);
    set_forwarded_proto(&mut h, client, tls);
    let value = |name| h.get(name).cloned().expect("both are written");
    [value(&X_FORWARDED_FOR), value(&header::FORWARDED)]
}

/// Writes the forwarded headers of a request from `client` (scheme by
/// `tls`): [`append_forwarded_for`] and [`set_forwarded_proto`]. `made`,
/// the connection's [`connection_values`], is taken as it is when the
/// request carries neither `X-Forwarded-For` nor `Forwarded` (the
/// common case: they are stripped unless `headers.trust_client_forwarded`
/// keeps them), so no value is written anew per request.
pub(crate) fn set_all(
    headers: &mut HeaderMap,
    client: std::net::IpAddr,
    tls: bool,
    made: Option<&[HeaderValue; 2]>,
) {
    // One pass over the names, not two lookups that each hash a name.
    let carried = |k: &HeaderName| *k == X_FORWARDED_FOR || *k == header::FORWARDED;
    if let Some([xff, fwd]) = made
        && !headers.keys().any(carried)
    {
        headers.insert(X_FORWARDED_FOR, xff.clone());
        let proto = if tls { "https" } else { "http" };
        headers.insert(FORWARDED_PROTO, HeaderValue::from_static(proto));
        headers.insert(header::FORWARDED, fwd.clone());
        return;
    }
    append_forwarded_for(headers, client);
    set_forwarded_proto(headers, client, tls);
}

/// Appends `ip` as text (an IPv4 address digit by digit: `Display` goes
/// through the formatter for each octet, several hundred instructions per
/// address, on every request).
fn write_ip(out: &mut Vec<u8>, ip: std::net::IpAddr) {
    match ip {
        std::net::IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                if octet >= 100 {
                    out.push(b'0' + octet / 100);
                }
                if octet >= 10 {
                    out.push(b'0' + octet / 10 % 10);
                }
                out.push(b'0' + octet % 10);
            }
        }
        std::net::IpAddr::V6(v6) => write!(out, "{v6}").expect("writing to a Vec does not fail"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The connection's values give the same headers as writing them per
    /// request, for IPv4 and IPv6 clients over either scheme; a request
    /// that carries its own (kept by `trust_client_forwarded`: either or
    /// both) gets them combined as before.
    #[test]
    fn values_made_per_connection_write_what_each_request_would() {
        // `carried`: bit 0 an `X-Forwarded-For`, bit 1 a `Forwarded`.
        let own = |h: &mut HeaderMap, carried: u8| {
            h.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
            if carried & 1 != 0 {
                h.insert(X_FORWARDED_FOR, HeaderValue::from_static("192.0.2.1"));
            }
            if carried & 2 != 0 {
                h.insert(header::FORWARDED, HeaderValue::from_static("for=192.0.2.1"));
            }
        };
        for (ip, tls) in [
            ("127.0.0.1", false),
            ("2001:db8::7", true),
            ("::ffff:192.0.2.9", true),
        ] {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            let made = connection_values(ip, tls);
            for carried in 0..4 {
                let mut want = HeaderMap::new();
                let mut got = HeaderMap::new();
                own(&mut want, carried);
                own(&mut got, carried);
                append_forwarded_for(&mut want, ip);
                set_forwarded_proto(&mut want, ip, tls);
                set_all(&mut got, ip, tls, Some(&made));
                assert_eq!(got, want, "{ip} tls={tls} carried={carried}");
                let mut none = HeaderMap::new();
                own(&mut none, carried);
                set_all(&mut none, ip, tls, None);
                assert_eq!(none, want, "{ip} tls={tls} carried={carried}, nothing made");
            }
        }
    }

    #[test]
    fn forwarded_for_is_one_combined_line() {
        let ip: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let mut h = HeaderMap::new();
        append_forwarded_for(&mut h, ip);
        assert_eq!(h["x-forwarded-for"], "127.0.0.1");
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        h.append(
            "x-forwarded-for",
            HeaderValue::from_static("10.0.0.2, 10.0.0.3"),
        );
        append_forwarded_for(&mut h, ip);
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(
            h["x-forwarded-for"],
            "10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.1"
        );
    }

    #[test]
    fn forwarded_names_the_client_and_scheme_last_rfc_7239() {
        let mut h = HeaderMap::new();
        set_forwarded_proto(&mut h, "127.0.0.1".parse().unwrap(), false);
        assert_eq!(h[&FORWARDED_PROTO], "http");
        assert_eq!(h[header::FORWARDED], "for=127.0.0.1;proto=http");
        // Section 6: an IPv6 node is bracketed and quoted; a v4-mapped
        // address is written as the IPv4 address it is.
        let mut h = HeaderMap::new();
        set_forwarded_proto(&mut h, "2001:db8::7".parse().unwrap(), true);
        assert_eq!(h[&FORWARDED_PROTO], "https");
        assert_eq!(h[header::FORWARDED], "for=\"[2001:db8::7]\";proto=https");
        let mut h = HeaderMap::new();
        set_forwarded_proto(&mut h, "::ffff:192.0.2.9".parse().unwrap(), false);
        assert_eq!(h[header::FORWARDED], "for=192.0.2.9;proto=http");
        // Elements already there (kept by trust_client_forwarded) come
        // first, in one field; the scheme replaces the client's.
        let mut h = HeaderMap::new();
        h.append(
            header::FORWARDED,
            HeaderValue::from_static("for=198.51.100.1"),
        );
        h.append(header::FORWARDED, HeaderValue::from_static(" "));
        h.insert(FORWARDED_PROTO, HeaderValue::from_static("gopher"));
        set_forwarded_proto(&mut h, "127.0.0.1".parse().unwrap(), true);
        assert_eq!(h.get_all(header::FORWARDED).iter().count(), 1);
        assert_eq!(
            h[header::FORWARDED],
            "for=198.51.100.1, for=127.0.0.1;proto=https"
        );
        assert_eq!(h[&FORWARDED_PROTO], "https");
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for ip in [
            "0.0.0.0",
            "9.10.99.100",
            "127.0.0.1",
            "255.255.255.255",
            "198.51.100.7",
            "::1",
            "2001:db8::7",
        ] {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            let mut out = Vec::new();
            write_ip(&mut out, ip);
            assert_eq!(out, ip.to_string().into_bytes());
        }
        for o in 0..=255u8 {
            let ip = std::net::IpAddr::from([o, 255 - o, o / 2, 0]);
            let mut out = Vec::new();
            write_ip(&mut out, ip);
            assert_eq!(out, ip.to_string().into_bytes());
        }
    }
}
