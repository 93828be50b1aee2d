//! The admin API's check against browsers (CSRF and DNS rebinding),
//! applied on every listener that serves the admin API.

use http::{HeaderMap, HeaderValue, header};

use crate::adapters::errors::AdminError;

/// The admin API's check against browsers (CSRF and DNS rebinding): `Host`
/// (when sent) must be an IP literal or `localhost`, with any port, and an
/// `Origin` (when sent) must be the same origin, `http://` or `https://`
/// followed by exactly the `Host` value. More than one `Host` or `Origin`
/// field is refused: which one a check reads and which one a browser or
/// proxy meant cannot be known (RFC 6454 section 7.3 allows one `Origin`;
/// RFC 9112 section 3.2 one `Host`). Command-line clients send no `Origin`
/// and an IP or `localhost` Host, so they pass.
///
/// # Errors
/// [`AdminError::ForeignHost`] or [`AdminError::ForeignOrigin`] (403).
pub(crate) fn check_admin_browser(headers: &HeaderMap) -> Result<(), AdminError> {
    let mut hosts = headers.get_all(header::HOST).iter();
    if let (Some(_), Some(second)) = (hosts.next(), hosts.next()) {
        return Err(AdminError::ForeignHost(format!(
            "more than one Host field ({})",
            String::from_utf8_lossy(second.as_bytes())
        )));
    }
    let mut origins = headers.get_all(header::ORIGIN).iter();
    if let (Some(_), Some(second)) = (origins.next(), origins.next()) {
        return Err(AdminError::ForeignOrigin(format!(
            "more than one Origin field ({})",
            String::from_utf8_lossy(second.as_bytes())
        )));
    }
    let host = headers.get(header::HOST).map(HeaderValue::as_bytes);
    if let Some(h) = host
        && !local_host(h)
    {
        return Err(AdminError::ForeignHost(
            String::from_utf8_lossy(h).into_owned(),
        ));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let o = origin.as_bytes();
        let same = host.is_some_and(|h| {
            [&b"http://"[..], b"https://"].iter().any(|scheme| {
                o.len() == scheme.len() + h.len()
                    && o[..scheme.len()].eq_ignore_ascii_case(scheme)
                    && o[scheme.len()..].eq_ignore_ascii_case(h)
            })
        });
        if !same {
            return Err(AdminError::ForeignOrigin(
                String::from_utf8_lossy(o).into_owned(),
            ));
        }
    }
    Ok(())
}

/// `localhost`, an IPv4 address or a bracketed IPv6 address, with an
/// optional port.
fn local_host(v: &[u8]) -> bool {
    let Ok(s) = std::str::from_utf8(v) else {
        return false;
    };
    if let Some(rest) = s.strip_prefix('[') {
        let Some((ip, port)) = rest.split_once(']') else {
            return false;
        };
        return ip.parse::<std::net::Ipv6Addr>().is_ok() && port_ok(port);
    }
    let (host, port) = match s.split_once(':') {
        Some((h, _)) => (h, &s[h.len()..]),
        None => (s, ""),
    };
    (host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::Ipv4Addr>().is_ok())
        && port_ok(port)
}

/// "" or `:` and 1 to 5 digits.
fn port_ok(p: &str) -> bool {
    match p.strip_prefix(':') {
        None => p.is_empty(),
        Some(d) => !d.is_empty() && d.len() <= 5 && d.bytes().all(|b| b.is_ascii_digit()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admin(host: Option<&str>, origin: Option<&str>) -> Result<(), AdminError> {
        let mut h = HeaderMap::new();
        if let Some(v) = host {
            h.insert(header::HOST, HeaderValue::from_str(v).unwrap());
        }
        if let Some(v) = origin {
            h.insert(header::ORIGIN, HeaderValue::from_str(v).unwrap());
        }
        check_admin_browser(&h)
    }

    #[test]
    fn admin_takes_local_hosts_and_same_origins_only() {
        for ok in [
            "127.0.0.1:8081",
            "127.0.0.1",
            "localhost:8081",
            "LOCALHOST",
            "[::1]:8081",
        ] {
            assert!(admin(Some(ok), None).is_ok(), "{ok}");
        }
        assert!(admin(None, None).is_ok());
        for bad in [
            "evil.example",
            "evil.example:8081",
            "127.0.0.1.nip.io",
            "localhost.evil",
            "[::1]x",
        ] {
            assert!(
                matches!(admin(Some(bad), None), Err(AdminError::ForeignHost(_))),
                "{bad}"
            );
        }
        assert!(admin(Some("127.0.0.1:8081"), Some("http://127.0.0.1:8081")).is_ok());
        for bad in [
            "http://evil.example",
            "http://127.0.0.1:3000",
            "null",
            "http://127.0.0.1:8081.evil",
        ] {
            assert!(
                matches!(
                    admin(Some("127.0.0.1:8081"), Some(bad)),
                    Err(AdminError::ForeignOrigin(_))
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            admin(None, Some("http://127.0.0.1:8081")),
            Err(AdminError::ForeignOrigin(_))
        ));
    }

    #[test]
    fn admin_refuses_a_second_origin_or_host_field_even_when_the_first_is_same_site() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8081"));
        h.append(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8081"),
        );
        assert!(check_admin_browser(&h).is_ok());
        h.append(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(matches!(
            check_admin_browser(&h),
            Err(AdminError::ForeignOrigin(_))
        ));
        // Two same-site values are refused too: the count is the rule.
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8081"));
        for _ in 0..2 {
            h.append(
                header::ORIGIN,
                HeaderValue::from_static("http://127.0.0.1:8081"),
            );
        }
        assert!(matches!(
            check_admin_browser(&h),
            Err(AdminError::ForeignOrigin(_))
        ));
        let mut h = HeaderMap::new();
        h.append(header::HOST, HeaderValue::from_static("127.0.0.1:8081"));
        h.append(header::HOST, HeaderValue::from_static("evil.example"));
        assert!(matches!(
            check_admin_browser(&h),
            Err(AdminError::ForeignHost(_))
        ));
    }
}
