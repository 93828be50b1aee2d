//! The values of single fields, parsed and checked on their own: the
//! client listener's settings, the sticky cookie, `app`, `sip_app` and
//! the policy name. Each error is the message; the caller adds the field.

use std::path::PathBuf;
use std::time::Duration;

use super::super::settings::MAX_UNIX_PATH;
use super::super::{
    AppAddr, AppKind, CertFiles, CertPairSpec, ClientAuth, ListenerSection, ListenerSettings,
    ListenerTls, SipAppKind, StickySection, UpstreamApp,
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
    let pair = |cert: &str, key: &str, field: String, client_auth: Option<ClientAuth>| CertFiles {
        cert: base.join(cert),
        key: base.join(key),
        field,
        client_auth,
    };
    // The listener's client certificates (checked by `check_client_auth`).
    let listener_auth = l.tls.as_ref().and_then(|t| {
        let ca = t.client_ca.as_ref()?;
        Some(ClientAuth {
            ca: base.join(ca),
            required: t.client_auth.as_deref() != Some("optional"),
            field: format!("{name}.tls.client_ca"),
        })
    });
    let sni_auth = |i: usize, p: &CertPairSpec| -> Option<ClientAuth> {
        if p.client_auth.as_deref() == Some("none") {
            return None;
        }
        let Some(ca) = &p.client_ca else {
            // This pair's mode over the listener's CA, or the listener's.
            return listener_auth.clone().map(|a| ClientAuth {
                required: p
                    .client_auth
                    .as_deref()
                    .map_or(a.required, |m| m == "required"),
                ..a
            });
        };
        Some(ClientAuth {
            ca: base.join(ca),
            required: p.client_auth.as_deref() != Some("optional"),
            field: format!("{name}.tls.sni[{i}].client_ca"),
        })
    };
    let default = match (tls_cert, &l.tls) {
        (Some((cert, key)), _) => Some(pair(cert, key, "--tls-cert".into(), listener_auth.clone())),
        (None, Some(t)) => Some(pair(
            &t.cert,
            &t.key,
            format!("{name}.tls"),
            listener_auth.clone(),
        )),
        (None, None) => None,
    };
    let tls = default.map(|d| {
        let sni = l.tls.iter().flat_map(|t| t.sni.iter()).enumerate();
        ListenerTls {
            certs: std::iter::once(d)
                .chain(sni.map(|(i, p)| {
                    pair(
                        &p.cert,
                        &p.key,
                        format!("{name}.tls.sni[{i}]"),
                        sni_auth(i, p),
                    )
                }))
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

/// Checks the client certificate fields of `[name.tls]` and its
/// `[[name.tls.sni]]`: `client_auth` one of `"optional"`, `"required"`
/// (and `"none"` on an SNI pair), and a mode other than `"none"` only
/// where a `client_ca` applies (the pair's or the listener's). Error:
/// (field, message).
pub(super) fn check_client_auth(name: &str, l: &ListenerSection) -> Result<(), (String, String)> {
    let Some(t) = &l.tls else { return Ok(()) };
    let bad =
        |field: String, v: &str, allowed: &str| Err((field, format!("{v:?} is none of {allowed}")));
    if let Some(m) = &t.client_auth {
        if !["optional", "required"].contains(&m.as_str()) {
            return bad(
                format!("{name}.tls.client_auth"),
                m,
                "\"optional\", \"required\"",
            );
        }
        if t.client_ca.is_none() {
            return Err((
                format!("{name}.tls.client_auth"),
                "needs client_ca: the CA file client certificates must chain to".into(),
            ));
        }
    }
    for (i, p) in t.sni.iter().enumerate() {
        if let Some(m) = &p.client_auth {
            let field = format!("{name}.tls.sni[{i}].client_auth");
            if !["none", "optional", "required"].contains(&m.as_str()) {
                return bad(field, m, "\"none\", \"optional\", \"required\"");
            }
            if m != "none" && p.client_ca.is_none() && t.client_ca.is_none() {
                return Err((
                    field,
                    "needs client_ca (here or in the listener's tls section)".into(),
                ));
            }
        }
    }
    Ok(())
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

/// `sip_app`: `"builtin"`, or `"udp:<ip>:<port>"` or `"tcp:<ip>:<port>"`
/// with a port other than 0 and an address a message can be sent to (not
/// `0.0.0.0` or `::`).
pub(super) fn parse_sip_app(s: &str) -> Result<SipAppKind, String> {
    if s == "builtin" {
        return Ok(SipAppKind::Builtin);
    }
    let (kind, addr): (fn(std::net::SocketAddr) -> SipAppKind, &str) =
        if let Some(a) = s.strip_prefix("udp:") {
            (SipAppKind::Udp, a)
        } else if let Some(a) = s.strip_prefix("tcp:") {
            (SipAppKind::Tcp, a)
        } else if let Some(a) = s.strip_prefix("tls:") {
            (SipAppKind::Tls, a)
        } else {
            return Err(format!(
                "{s:?} is none of \"builtin\", udp:<ip>:<port>, tcp:<ip>:<port>, tls:<ip>:<port>"
            ));
        };
    let addr = parse_addr(addr).map_err(|m| format!("{s:?}: {m}"))?;
    if addr.port() == 0 || addr.ip().is_unspecified() {
        return Err(format!("{s:?}: {addr} cannot be sent to"));
    }
    Ok(kind(addr))
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

    fn section(text: &str) -> ListenerSection {
        toml::from_str(text).unwrap()
    }

    const PAIR: &str = "cert = \"c.pem\"\nkey = \"c.key\"\n";

    /// Each pair's policy: the listener's CA and mode, a pair's own mode
    /// over it, `none`, or the pair's own CA (required unless it says).
    #[test]
    fn client_auth_resolves_per_certificate_pair() {
        let l = section(&format!(
            "[tls]\n{PAIR}client_ca = \"ca.pem\"\nsni = [\
             {{ cert = \"a.pem\", key = \"a.key\", client_auth = \"optional\" }}, \
             {{ cert = \"b.pem\", key = \"b.key\", client_auth = \"none\" }}, \
             {{ cert = \"d.pem\", key = \"d.key\", client_ca = \"other.pem\" }}]\n"
        ));
        check_client_auth("listener", &l).unwrap();
        let s = listener_settings("listener", &l, None, std::path::Path::new("/etc/p"));
        let auth: Vec<Option<(String, bool, String)>> = s
            .tls
            .unwrap()
            .certs
            .iter()
            .map(|c| {
                c.client_auth
                    .as_ref()
                    .map(|a| (a.ca.display().to_string(), a.required, a.field.clone()))
            })
            .collect();
        assert_eq!(
            auth,
            vec![
                Some((
                    "/etc/p/ca.pem".into(),
                    true,
                    "listener.tls.client_ca".into()
                )),
                Some((
                    "/etc/p/ca.pem".into(),
                    false,
                    "listener.tls.client_ca".into()
                )),
                None,
                Some((
                    "/etc/p/other.pem".into(),
                    true,
                    "listener.tls.sni[2].client_ca".into()
                )),
            ]
        );
    }

    /// A bad mode, or a mode with no CA to verify against, names its field.
    #[test]
    fn client_auth_without_a_ca_or_with_a_bad_mode_names_the_field() {
        for (text, field) in [
            (
                format!("[tls]\n{PAIR}client_auth = \"required\"\n"),
                "listener.tls.client_auth",
            ),
            (
                format!("[tls]\n{PAIR}client_ca = \"ca.pem\"\nclient_auth = \"none\"\n"),
                "listener.tls.client_auth",
            ),
            (
                format!(
                    "[tls]\n{PAIR}sni = [{{ {} , client_auth = \"optional\" }}]\n",
                    "cert = \"a.pem\", key = \"a.key\""
                ),
                "listener.tls.sni[0].client_auth",
            ),
            (
                format!(
                    "[tls]\n{PAIR}client_ca = \"ca.pem\"\nsni = [{{ {} , client_auth = \"maybe\" }}]\n",
                    "cert = \"a.pem\", key = \"a.key\""
                ),
                "listener.tls.sni[0].client_auth",
            ),
        ] {
            let (f, m) = check_client_auth("listener", &section(&text)).unwrap_err();
            assert_eq!(f, field, "{text}: {m}");
        }
    }

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
