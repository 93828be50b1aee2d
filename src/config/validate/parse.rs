//! The values of single fields, parsed and checked on their own: the
//! client listener's settings, the sticky cookie, `app`, `sip_app` and
//! the policy name. Each error is the message; the caller adds the field.

use std::path::PathBuf;
use std::time::Duration;

use super::super::settings::MAX_UNIX_PATH;
use super::super::{
    AppAddr, AppKind, CertFiles, ListenerSection, ListenerSettings, ListenerTls, SipAppKind,
    StickySection, UpstreamApp,
};
use super::addrs::parse_addr;
use crate::engine::balance::Policy;
use crate::engine::{RouteCookie, SameSite};

/// The settings of the client listener `[name]` (`listener` or
/// `shared_listener`): paths relative to `base`; `--tls-cert` (`tls_cert`)
/// replaces the default certificate, or makes the listener HTTPS with it
/// alone.
pub(super) fn listener_settings(
    name: &str,
    l: &ListenerSection,
    tls_cert: Option<&(String, String)>,
    base: &std::path::Path,
) -> ListenerSettings {
    let pair = |cert: &str, key: &str, field: String| CertFiles {
        cert: base.join(cert),
        key: base.join(key),
        field,
    };
    let default = match (tls_cert, &l.tls) {
        (Some((cert, key)), _) => Some(pair(cert, key, "--tls-cert".into())),
        (None, Some(t)) => Some(pair(&t.cert, &t.key, format!("{name}.tls"))),
        (None, None) => None,
    };
    let tls = default.map(|d| {
        let sni = l.tls.iter().flat_map(|t| t.sni.iter()).enumerate();
        ListenerTls {
            certs: std::iter::once(d)
                .chain(sni.map(|(i, p)| pair(&p.cert, &p.key, format!("{name}.tls.sni[{i}]"))))
                .collect(),
            reload_interval: Duration::from_millis(
                l.tls
                    .as_ref()
                    .map_or(super::super::model::DEFAULT_TLS_RELOAD_MS, |t| {
                        t.reload_interval_ms
                    }),
            ),
        }
    });
    ListenerSettings {
        proxy_protocol: l
            .proxy_protocol
            .then(|| Duration::from_millis(l.proxy_protocol_timeout_ms)),
        tls,
    }
}

/// The `[sticky]` cookie, checked: the name an RFC 6265 token, the path
/// starting with `/` without `;` or control characters, `SameSite=None`
/// only with `Secure` (browsers drop it otherwise). Error: (field, message).
pub(super) fn route_cookie(s: &StickySection) -> Result<RouteCookie, (&'static str, String)> {
    let token = |c: char| c.is_ascii_graphic() && !"()<>@,;:\\\"/[]?={}".contains(c);
    if s.cookie.is_empty() || !s.cookie.chars().all(token) {
        return Err((
            "sticky.cookie",
            format!("{:?} is not a cookie name (an RFC 6265 token)", s.cookie),
        ));
    }
    if !s.cookie_path.starts_with('/')
        || s.cookie_path
            .chars()
            .any(|c| c == ';' || !(c.is_ascii_graphic() || c == ' '))
    {
        return Err((
            "sticky.cookie_path",
            format!(
                "{:?} must start with / and hold no ; or control characters",
                s.cookie_path
            ),
        ));
    }
    let same_site = match s.cookie_same_site.to_ascii_lowercase().as_str() {
        "strict" => SameSite::Strict,
        "lax" => SameSite::Lax,
        "none" => SameSite::None,
        _ => {
            return Err((
                "sticky.cookie_same_site",
                format!("{:?} is not Strict, Lax or None", s.cookie_same_site),
            ));
        }
    };
    if same_site == SameSite::None && !s.cookie_secure {
        return Err((
            "sticky.cookie_same_site",
            "None requires sticky.cookie_secure = true (browsers drop it otherwise)".into(),
        ));
    }
    Ok(RouteCookie {
        name: s.cookie.clone(),
        path: s.cookie_path.clone(),
        same_site,
        secure: s.cookie_secure,
    })
}

/// `sip_app`: `"builtin"` or `"udp:<ip>:<port>"` with a port other than 0
/// and an address a datagram can be sent to (not `0.0.0.0` or `::`).
pub(super) fn parse_sip_app(s: &str) -> Result<SipAppKind, String> {
    if s == "builtin" {
        return Ok(SipAppKind::Builtin);
    }
    let Some(addr) = s.strip_prefix("udp:") else {
        return Err(format!(
            "{s:?} is neither \"builtin\" nor udp:<ip>:<port> (the only upstream SIP transport is UDP)"
        ));
    };
    let addr = parse_addr(addr).map_err(|m| format!("{s:?}: {m}"))?;
    if addr.port() == 0 || addr.ip().is_unspecified() {
        return Err(format!("{s:?}: {addr} cannot be sent to"));
    }
    Ok(SipAppKind::Udp(addr))
}

pub(super) fn parse_policy(s: &str) -> Result<Policy, String> {
    s.parse::<Policy>().map_err(|e| format!("{s:?}: {e}"))
}

/// `app` (or `--app`): `builtin`, `http://host:port`, `h2c://host:port`
/// (HTTP/2 with prior knowledge), or `unix:/absolute/path.sock`; an
/// upstream app keeps idle connections `idle_timeout`.
pub(super) fn parse_app(s: &str, idle_timeout: Duration) -> Result<AppKind, String> {
    if s == "builtin" {
        return Ok(AppKind::Builtin);
    }
    let addr = match s.strip_prefix("unix:") {
        Some(path) => AppAddr::Unix(parse_unix_path(path).map_err(|m| format!("{s:?}: {m}"))?),
        None => {
            let uri: http::Uri = s.parse().map_err(|_| {
                format!("{s:?} is neither \"builtin\", an http:// or h2c:// URL nor unix:/path")
            })?;
            match (uri.scheme_str(), uri.authority().is_some()) {
                (Some("http"), true) => AppAddr::Http(uri),
                (Some("h2c"), true) => AppAddr::H2c(uri),
                _ => {
                    return Err(format!(
                        "{s:?} is neither \"builtin\", an http://host:port or h2c://host:port URL (HTTP/2 with prior knowledge) nor unix:/path (https upstreams are not supported)"
                    ));
                }
            }
        }
    };
    Ok(AppKind::Upstream(UpstreamApp { addr, idle_timeout }))
}

/// The path of a `unix:` app: absolute (the node may run from any
/// directory), without NUL, at most [`MAX_UNIX_PATH`] bytes. Whether a
/// socket is there is seen when the node connects (the app may start
/// later): a request then gets 502 naming the path.
pub(super) fn parse_unix_path(path: &str) -> Result<PathBuf, String> {
    if path.is_empty() {
        return Err("the socket path is empty (want unix:/absolute/path.sock)".into());
    }
    if !path.starts_with('/') {
        return Err("the socket path must be absolute (want unix:/absolute/path.sock)".into());
    }
    if path.contains('\0') {
        return Err("the socket path contains a NUL byte".into());
    }
    if path.len() > MAX_UNIX_PATH {
        return Err(format!(
            "the socket path is {} bytes, longer than the {MAX_UNIX_PATH} a Unix socket address holds",
            path.len()
        ));
    }
    if path.ends_with('/') {
        return Err("the socket path names a directory".into());
    }
    Ok(PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `h2c://` is an HTTP/2 app (prior knowledge); a scheme peerlb does
    /// not speak names both it knows.
    #[test]
    fn h2c_apps_are_http_2_and_other_schemes_are_refused_by_name() {
        let idle = Duration::from_secs(2);
        match parse_app("h2c://127.0.0.1:50051", idle).unwrap() {
            AppKind::Upstream(up) => {
                assert!(matches!(&up.addr, AppAddr::H2c(u) if u.port_u16() == Some(50051)));
                assert_eq!(up.addr.to_string(), "h2c://127.0.0.1:50051/");
            }
            AppKind::Builtin => panic!("an upstream app"),
        }
        assert!(matches!(
            parse_app("http://127.0.0.1:9000", idle).unwrap(),
            AppKind::Upstream(UpstreamApp {
                addr: AppAddr::Http(_),
                ..
            })
        ));
        for bad in ["h2://127.0.0.1:1", "https://a:1", "h2c:///x"] {
            let e = parse_app(bad, idle).unwrap_err();
            assert!(e.contains("h2c://"), "{bad}: {e}");
        }
    }
}
