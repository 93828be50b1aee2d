//! Bound addresses apart from advertised ones (`http_bind`,
//! `peer_bind`, `gossip_bind`, `--bind`; Consul's `-bind` beside
//! `-advertise`): how a node's [`BindAddrs`] are chosen and the rules they
//! keep. The advertised addresses' own rules are in `validate`.

use std::net::SocketAddr;

use super::{BindAddrs, ClusterFile, ConfigError, NodeAddrs, Overrides};

impl ClusterFile {
    /// Where node `me` (entry `pos` of `[[nodes]]`, if listed) binds: a
    /// `--*-bind` flag, else `--bind`'s IP with the advertised port, else
    /// the entry's `*_bind`, else the advertised address itself.
    pub(super) fn binds_of(
        &self,
        pos: Option<usize>,
        me: &NodeAddrs,
        ov: &Overrides,
        inv: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<BindAddrs, ConfigError> {
        let ip = ov
            .bind
            .as_deref()
            .map(|s| {
                parse_bind_ip(s).ok_or_else(|| inv("--bind", format!("{s:?} is not an IP address")))
            })
            .transpose()?;
        let spec = pos.map(|i| (i, &self.nodes[i]));
        // (flag, its value, field, the file's value, advertised address)
        let pick = |flag: &'static str,
                    given: &Option<String>,
                    field: &str,
                    file: Option<&Option<String>>,
                    advertised: SocketAddr|
         -> Result<(SocketAddr, String), ConfigError> {
            if let Some(s) = given {
                return Ok((
                    parse_bind(s, advertised).map_err(|m| inv(flag, m))?,
                    flag.to_owned(),
                ));
            }
            if let Some(ip) = ip {
                return Ok((SocketAddr::new(ip, advertised.port()), "--bind".to_owned()));
            }
            match (spec, file) {
                (Some((i, _)), Some(Some(s))) => {
                    let name = format!("nodes[{i}].{field}");
                    Ok((parse_bind(s, advertised).map_err(|m| inv(&name, m))?, name))
                }
                _ => Ok((advertised, String::new())),
            }
        };
        let (http, hf) = pick(
            "--http-bind",
            &ov.http_bind,
            "http_bind",
            spec.map(|(_, n)| &n.http_bind),
            me.http_addr,
        )?;
        let (peer, pf) = pick(
            "--peer-bind",
            &ov.peer_bind,
            "peer_bind",
            spec.map(|(_, n)| &n.peer_bind),
            me.peer_addr,
        )?;
        let (gossip, gf) = pick(
            "--gossip-bind",
            &ov.gossip_bind,
            "gossip_bind",
            spec.map(|(_, n)| &n.gossip_bind),
            me.gossip_addr,
        )?;
        let binds = BindAddrs { http, peer, gossip };
        if let Some((k, m)) = bind_problem(&binds, me.admin_addr) {
            // The side that was set names the clash (the gossip socket
            // first when both were).
            let by = match k {
                "http_bind" => hf,
                _ if gf.is_empty() => pf,
                _ => gf,
            };
            let field = if by.is_empty() { k.to_owned() } else { by };
            return Err(inv(&field, m));
        }
        Ok(binds)
    }
}

/// A bind address: `ip:port`, or an IP alone (`0.0.0.0`, `::`, `[::]`)
/// for the port of `advertised`. Any IP may be bound, the unspecified
/// address included; port 0 may not (peers dial the advertised port,
/// which must lead to a port known in advance).
pub(super) fn parse_bind(s: &str, advertised: SocketAddr) -> Result<SocketAddr, String> {
    let a = match s.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => SocketAddr::new(
            parse_bind_ip(s)
                .ok_or_else(|| format!("{s:?} is neither an ip:port socket address nor an IP"))?,
            advertised.port(),
        ),
    };
    if a.port() == 0 {
        return Err(format!("{a}: port 0 is not a port peers can be sent to"));
    }
    Ok(a)
}

/// An IP alone, IPv6 with or without brackets.
fn parse_bind_ip(s: &str) -> Option<std::net::IpAddr> {
    let bare = s
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(s);
    bare.parse().ok()
}

/// Whether two bound addresses of one transport collide on one host: the
/// same port on the same IP, or on any IP when either is unspecified.
fn binds_collide(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// The rules a node's bound addresses keep: the two UDP sockets (peer,
/// gossip) apart, and the client listener apart from the admin listener
/// (both TCP). The first broken rule: (field, message).
pub(super) fn bind_problem(
    b: &BindAddrs,
    admin_addr: SocketAddr,
) -> Option<(&'static str, String)> {
    if binds_collide(b.peer, b.gossip) {
        return Some((
            "gossip_bind",
            format!(
                "the gossip socket would bind {} over the peer socket's {} (both are UDP)",
                b.gossip, b.peer
            ),
        ));
    }
    if binds_collide(b.http, admin_addr) {
        return Some((
            "http_bind",
            format!(
                "the client listener would bind {} over admin_addr {admin_addr} (both are TCP)",
                b.http
            ),
        ));
    }
    None
}
