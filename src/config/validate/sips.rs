//! The rules of SIP over TLS: a node's `sips_addr` (port 5061 when the
//! file gives an IP alone) and `[sips]` (the listener's certificate, else
//! `[listener.tls]`'s; the trust of a `sip_app = "tls:..."` server).

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use super::super::model::{ClusterFile, SipsSection};
use super::super::settings::{CertFiles, ListenerTls, SipAppKind, SipsSettings};

/// The SIPS port a `sips_addr` without one listens on (RFC 3261 19.1.2).
pub(crate) const DEFAULT_SIPS_PORT: u16 = 5061;

/// `sips_addr` as written: `ip:port`, or an IP alone (`127.0.0.1`, `::1`,
/// `[::1]`) for port [`DEFAULT_SIPS_PORT`].
pub(super) fn parse_sips_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        if a.port() == 0 {
            return Err(format!("{a}: port 0 cannot be advertised to clients"));
        }
        return Ok(a);
    }
    let ip = s
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(s);
    ip.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, DEFAULT_SIPS_PORT))
        .map_err(|_| format!("{s:?} is neither an ip:port socket address nor an IP"))
}

/// `sip_sprayer_addr`'s own rules: an advertisable `ip:port` that is not
/// `sprayer_addr` (SIP over TCP would share its port). The message.
pub(super) fn check_sip_sprayer(file: &ClusterFile) -> Result<(), String> {
    let Some(s) = &file.sip_sprayer_addr else {
        return Ok(());
    };
    let a = super::addrs::parse_addr(s)?;
    super::addrs::shared_sip_problem(a)?;
    if file
        .sprayer_addr
        .as_deref()
        .and_then(|h| super::addrs::parse_addr(h).ok())
        == Some(a)
    {
        return Err(format!(
            "{a} is also sprayer_addr (SIP over TCP would share its port)"
        ));
    }
    Ok(())
}

/// `sips_sprayer_addr`'s own rules: as `sips_addr` (an IP alone for
/// port 5061), advertisable (not `0.0.0.0` or `::`), not `sprayer_addr`
/// nor `sip_sprayer_addr` (TCP would share the port), and some node has
/// a `sips_addr`. The message.
pub(super) fn check_sips_sprayer(file: &ClusterFile) -> Result<(), String> {
    let Some(s) = &file.sips_sprayer_addr else {
        return Ok(());
    };
    let a = parse_sips_addr(s)?;
    super::addrs::shared_sip_problem(a)?;
    let parsed = |v: &Option<String>| v.as_deref().and_then(|h| super::addrs::parse_addr(h).ok());
    for (k, v) in [
        ("sprayer_addr", &file.sprayer_addr),
        ("sip_sprayer_addr", &file.sip_sprayer_addr),
    ] {
        if parsed(v) == Some(a) {
            return Err(format!("{a} is also {k} (TCP would share its port)"));
        }
    }
    if file.nodes.iter().all(|n| n.sips_addr.is_none()) {
        return Err("no node has a sips_addr, so no node would listen there".into());
    }
    Ok(())
}

/// `--shared-sips-listen` of node `me` as given (`given`; an IP alone
/// for port 5061): only on a node with a `sips_addr`, advertisable, and
/// none of its own addresses nor `--shared-sip-listen`. The message.
pub(super) fn shared_listen(
    given: Option<&str>,
    me: &super::super::NodeAddrs,
    shared_sip: Option<SocketAddr>,
) -> Result<Option<SocketAddr>, String> {
    let Some(s) = given else {
        return Ok(None);
    };
    let a = parse_sips_addr(s)?;
    super::addrs::shared_sip_problem(a)?;
    if me.sips_addr.is_none() {
        return Err("this node has no sips_addr (only a node that serves SIPS joins the shared SIPS address)".into());
    }
    if let Some((_, k)) = super::addrs::used_by(std::slice::from_ref(me), a) {
        return Err(format!("{a} is this node's {k}"));
    }
    if shared_sip == Some(a) {
        return Err(format!("{a} is also --shared-sip-listen"));
    }
    Ok(Some(a))
}

/// The `[sips]` rules independent of the node that runs: `cert` and `key`
/// set together and not empty; with `sip_app = "tls:..."`, an
/// `upstream_ca`; with any `sips_addr`, a certificate (`[sips]`'s or
/// `[listener.tls]`'s). The first broken rule: (field, message).
pub(super) fn check(file: &ClusterFile, sip_app: SipAppKind) -> Result<(), (String, String)> {
    let s: &SipsSection = &file.sips;
    match (&s.cert, &s.key) {
        (Some(_), None) => return Err(("sips.key".into(), "is required with sips.cert".into())),
        (None, Some(_)) => return Err(("sips.cert".into(), "is required with sips.key".into())),
        (Some(c), Some(k)) => {
            for (f, v) in [("sips.cert", c), ("sips.key", k)] {
                if v.is_empty() {
                    return Err((f.into(), "must not be empty".into()));
                }
            }
        }
        (None, None) => {}
    }
    if matches!(sip_app, SipAppKind::Tls(_)) && s.upstream_ca.as_deref().is_none_or(str::is_empty) {
        return Err((
            "sips.upstream_ca".into(),
            "is required with sip_app = \"tls:...\" (the CA file its server's certificate must chain to)"
                .into(),
        ));
    }
    if s.upstream_server_name.as_deref() == Some("") {
        return Err((
            "sips.upstream_server_name".into(),
            "must not be empty".into(),
        ));
    }
    if let Some(i) = file
        .nodes
        .iter()
        .position(|n| n.sips_addr.is_some() && n.sip_addr.is_none())
    {
        return Err((
            format!("nodes[{i}].sips_addr"),
            "needs a sip_addr too (SIPS is served beside SIP over UDP and TCP)".into(),
        ));
    }
    let has_cert = s.cert.is_some() || file.listener.tls.is_some();
    if let Some(i) = file.nodes.iter().position(|n| n.sips_addr.is_some())
        && !has_cert
    {
        return Err((
            format!("nodes[{i}].sips_addr"),
            "needs a certificate: set [sips] cert and key, or [listener.tls]".into(),
        ));
    }
    Ok(())
}

/// The validated `[sips]` of a node whose SIPS address is `sips_addr`:
/// its listener's certificates when it has one (`listener` is the
/// node's `[listener.tls]`), paths joined to `base`.
pub(super) fn settings(
    s: &SipsSection,
    sips_addr: Option<SocketAddr>,
    listener: Option<&ListenerTls>,
    base: &Path,
) -> SipsSettings {
    let certs = sips_addr.and_then(|_| match (&s.cert, &s.key) {
        (Some(cert), Some(key)) => Some(ListenerTls {
            certs: vec![CertFiles {
                cert: base.join(cert),
                key: base.join(key),
                field: "sips".into(),
                client_auth: None,
            }],
            reload_interval: std::time::Duration::from_millis(
                super::super::model::DEFAULT_TLS_RELOAD_MS,
            ),
        }),
        _ => listener.map(|l| ListenerTls {
            certs: l
                .certs
                .iter()
                .map(|c| CertFiles {
                    client_auth: None,
                    ..c.clone()
                })
                .collect(),
            reload_interval: l.reload_interval,
        }),
    });
    SipsSettings {
        certs,
        upstream_ca: s.upstream_ca.as_ref().map(|p| base.join(p)),
        upstream_server_name: s.upstream_server_name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sips_addr_without_a_port_listens_on_5061() {
        assert_eq!(
            parse_sips_addr("127.0.0.1").unwrap(),
            "127.0.0.1:5061".parse().unwrap()
        );
        assert_eq!(
            parse_sips_addr("[::1]").unwrap(),
            "[::1]:5061".parse().unwrap()
        );
        assert_eq!(
            parse_sips_addr("::1").unwrap(),
            "[::1]:5061".parse().unwrap()
        );
        assert_eq!(
            parse_sips_addr("127.0.0.1:5071").unwrap(),
            "127.0.0.1:5071".parse().unwrap()
        );
        assert!(
            parse_sips_addr("127.0.0.1:0")
                .unwrap_err()
                .contains("port 0")
        );
        assert!(parse_sips_addr("nowhere").unwrap_err().contains("neither"));
    }
}
