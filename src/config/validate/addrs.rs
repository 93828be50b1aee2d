//! The address rules of `[[nodes]]`: each node's own addresses, and its
//! clashes with the other nodes', found through an index of the nodes
//! checked so far (`O(N log N)` over a file of `N` nodes).

use std::net::SocketAddr;

use super::super::NodeAddrs;

/// What a shared SIP address must be on its own: a port other than 0
/// and an IP clients can be told (it goes into `Record-Route`), not
/// `0.0.0.0` or `::`.
pub(super) fn shared_sip_problem(a: SocketAddr) -> Result<(), String> {
    if a.port() == 0 {
        return Err(format!("{a}: port 0 cannot be advertised to clients"));
    }
    if a.ip().is_unspecified() {
        return Err(format!(
            "{a}: clients are sent this address in Record-Route; give an IP they reach, not 0.0.0.0 or ::"
        ));
    }
    Ok(())
}

/// The rules of one node's `metrics_addr`: a port, and apart from the
/// node's other TCP addresses (`http_addr`, `admin_addr`, `sip_addr`).
pub(super) fn metrics_addr_problem(a: &NodeAddrs) -> Option<(&'static str, String)> {
    let m = a.metrics_addr?;
    if m.port() == 0 {
        return Some(("metrics_addr", format!("{m}: port 0 cannot be scraped")));
    }
    [
        ("http_addr", Some(a.http_addr)),
        ("admin_addr", Some(a.admin_addr)),
        ("sip_addr", a.sip_addr),
        ("sips_addr", a.sips_addr),
    ]
    .into_iter()
    .find(|(_, x)| *x == Some(m))
    .map(|(k, _)| {
        (
            "metrics_addr",
            format!("{m} is also this node's {k}; the metrics need their own address"),
        )
    })
}

/// The first node of `nodes` with an address equal to `a` (index, field).
pub(super) fn used_by(nodes: &[NodeAddrs], a: SocketAddr) -> Option<(usize, &'static str)> {
    nodes.iter().enumerate().find_map(|(i, n)| {
        [
            ("http_addr", Some(n.http_addr)),
            ("peer_addr", Some(n.peer_addr)),
            ("gossip_addr", Some(n.gossip_addr)),
            ("admin_addr", Some(n.admin_addr)),
            ("sip_addr", n.sip_addr),
            ("sips_addr", n.sips_addr),
            ("metrics_addr", n.metrics_addr),
        ]
        .into_iter()
        .find(|(_, x)| *x == Some(a))
        .map(|(k, _)| (i, k))
    })
}

pub(super) fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>()
        .map_err(|_| format!("{s:?} is not an ip:port socket address"))
}

/// `given`, else the default admin address of a node whose client address
/// is `http_addr` ([`super::super::default_admin_addr`]).
pub(super) fn admin_or_default(
    given: Option<SocketAddr>,
    http_addr: SocketAddr,
) -> Result<SocketAddr, String> {
    given
        .or_else(|| super::super::default_admin_addr(http_addr))
        .ok_or_else(|| {
            format!(
                "the default (127.0.0.1:<http port + {}>) passes port 65535 for http_addr {http_addr}; give admin_addr",
                super::super::ADMIN_PORT_OFFSET
            )
        })
}

/// Whether two nodes may run on one host, judged by their client
/// addresses: the same IP, or either on loopback or the unspecified
/// address. Nodes on distinct routable IPs are taken to be on distinct
/// machines, so their loopback admin addresses do not clash.
pub(super) fn may_share_host(a: &NodeAddrs, b: &NodeAddrs) -> bool {
    let local = |ip: std::net::IpAddr| ip.is_loopback() || ip.is_unspecified();
    a.http_addr.ip() == b.http_addr.ip() || local(a.http_addr.ip()) || local(b.http_addr.ip())
}

/// The nodes checked so far, indexed by id (ASCII case folded) and by every
/// address they use, so that checking node `i` against the `i` before it
/// costs `O(log i)` instead of `O(i)`: every clash rule of
/// [`addr_problem`] between two nodes needs one address of one to equal one
/// address of the other, so the nodes sharing an address with `a` are the
/// only ones it can clash with. `O(N log N)` over a file of `N` nodes.
#[derive(Default)]
pub(super) struct NodeIndex {
    ids: std::collections::BTreeMap<String, usize>,
    addrs: std::collections::BTreeMap<SocketAddr, Vec<usize>>,
}

impl NodeIndex {
    /// The addresses a node uses (the fields [`addr_problem`] compares).
    fn addrs(a: &NodeAddrs) -> impl Iterator<Item = SocketAddr> {
        [
            Some(a.http_addr),
            Some(a.peer_addr),
            Some(a.gossip_addr),
            Some(a.admin_addr),
            a.sip_addr,
            a.sips_addr,
            a.metrics_addr,
        ]
        .into_iter()
        .flatten()
    }

    /// The index of the node indexed first whose id equals `a`'s ignoring
    /// ASCII case.
    pub(super) fn id_of(&self, a: &NodeAddrs) -> Option<usize> {
        self.ids.get(&a.id.to_ascii_lowercase()).copied()
    }

    /// The indexes of the nodes using an address `a` uses, ascending and
    /// each once (so [`addr_problem`] reports the same first clash as
    /// against all nodes in order).
    pub(super) fn sharing_an_addr(&self, a: &NodeAddrs) -> Vec<usize> {
        let mut found: Vec<usize> = Self::addrs(a)
            .filter_map(|x| self.addrs.get(&x))
            .flatten()
            .copied()
            .collect();
        found.sort_unstable();
        found.dedup();
        found
    }

    pub(super) fn insert(&mut self, i: usize, a: &NodeAddrs) {
        self.ids.entry(a.id.to_ascii_lowercase()).or_insert(i);
        for x in Self::addrs(a) {
            let users = self.addrs.entry(x).or_default();
            if users.last() != Some(&i) {
                users.push(i);
            }
        }
    }
}

/// The address rules one node must keep, alone and against `others`
/// (index in `[[nodes]]`, node): every port advertisable, peer and gossip
/// addresses dialable (not 0.0.0.0 or ::), its two UDP addresses apart, its
/// TCP address apart from every other TCP address and its UDP addresses
/// from every other UDP address. The first broken rule: (field, message).
pub(super) fn addr_problem<'a>(
    a: &NodeAddrs,
    others: impl IntoIterator<Item = (usize, &'a NodeAddrs)>,
) -> Option<(&'static str, String)> {
    // Long: the address rules in the order their errors are reported, each a few lines; one
    // function keeps that order in one place.
    for (k, addr) in [
        ("http_addr", a.http_addr),
        ("peer_addr", a.peer_addr),
        ("gossip_addr", a.gossip_addr),
        ("admin_addr", a.admin_addr),
    ] {
        if addr.port() == 0 {
            return Some((k, format!("{addr}: port 0 cannot be advertised to peers")));
        }
    }
    for (k, addr, bind) in [
        ("http_addr", a.http_addr, "http_bind"),
        ("peer_addr", a.peer_addr, "peer_bind"),
        ("gossip_addr", a.gossip_addr, "gossip_bind"),
    ] {
        if addr.ip().is_unspecified() {
            let what = if k == "http_addr" {
                "peers are told this address"
            } else {
                "peers dial this address"
            };
            return Some((
                k,
                format!(
                    "{addr}: {what}; give the node's own IP, not 0.0.0.0 or :: (to listen on \
                     every address, set {bind} = \"{ip}\", or run the node with --bind {ip})",
                    ip = addr.ip()
                ),
            ));
        }
    }
    if let Some(sip) = a.sip_addr {
        if sip.port() == 0 {
            return Some((
                "sip_addr",
                format!("{sip}: port 0 cannot be advertised to clients"),
            ));
        }
        // UDP and TCP on one port: it clashes with every other address.
        for (k, addr) in [
            ("http_addr", a.http_addr),
            ("peer_addr", a.peer_addr),
            ("gossip_addr", a.gossip_addr),
            ("admin_addr", a.admin_addr),
        ] {
            if sip == addr {
                return Some(("sip_addr", format!("{sip} is also this node's {k}")));
            }
        }
    }
    if let Some(sips) = a.sips_addr
        && let Some((k, _)) = [
            ("http_addr", Some(a.http_addr)),
            ("admin_addr", Some(a.admin_addr)),
            ("sip_addr", a.sip_addr),
        ]
        .into_iter()
        .find(|(_, x)| *x == Some(sips))
    {
        return Some(("sips_addr", format!("{sips} is also this node's {k}")));
    }
    if let Some(problem) = metrics_addr_problem(a) {
        return Some(problem);
    }
    if a.peer_addr == a.gossip_addr {
        return Some((
            "gossip_addr",
            format!(
                "{} is also this node's peer_addr (both are UDP)",
                a.gossip_addr
            ),
        ));
    }
    if a.admin_addr == a.http_addr {
        return Some((
            "admin_addr",
            format!(
                "{} is also this node's http_addr; the admin API needs its own address",
                a.admin_addr
            ),
        ));
    }
    for (j, other) in others {
        // A SIPS address is TCP: apart from every other node's TCP address.
        let tcp_of = |n: &NodeAddrs| {
            [
                Some(n.http_addr),
                Some(n.admin_addr),
                n.sip_addr,
                n.sips_addr,
                n.metrics_addr,
            ]
        };
        if let Some(sips) = a.sips_addr
            && tcp_of(other).contains(&Some(sips))
        {
            return Some(("sips_addr", format!("{sips} is also used by nodes[{j}]")));
        }
        if let Some(theirs) = other.sips_addr
            && let Some(k) = ["http_addr", "admin_addr", "sip_addr"]
                .into_iter()
                .zip(tcp_of(a))
                .find_map(|(k, x)| (x == Some(theirs)).then_some(k))
        {
            return Some((k, format!("{theirs} is also nodes[{j}].sips_addr")));
        }
        // Two nodes on one client address: said of the address the user
        // wrote, before the admin addresses that default from it clash.
        if a.http_addr == other.http_addr {
            return Some((
                "http_addr",
                format!("{} is also used by nodes[{j}]", a.http_addr),
            ));
        }
        // A metrics address is TCP like the admin address: a loopback (or
        // wildcard) one clashes only with a node that may share the host.
        if let Some(m) = a.metrics_addr {
            let local = m.ip().is_loopback() || m.ip().is_unspecified();
            if (!local || may_share_host(a, other))
                && [
                    Some(other.http_addr),
                    Some(other.admin_addr),
                    other.sip_addr,
                    other.metrics_addr,
                ]
                .contains(&Some(m))
            {
                return Some(("metrics_addr", format!("{m} is also used by nodes[{j}]")));
            }
        }
        if let Some(m) = other.metrics_addr
            && let Some((k, mine)) = [
                ("http_addr", Some(a.http_addr)),
                ("admin_addr", Some(a.admin_addr)),
                ("sip_addr", a.sip_addr),
            ]
            .into_iter()
            .find(|(_, x)| *x == Some(m))
            && (!(m.ip().is_loopback() || m.ip().is_unspecified()) || may_share_host(a, other))
        {
            let mine = mine.expect("found by equality with Some");
            return Some((k, format!("{mine} is also nodes[{j}].metrics_addr")));
        }
        // Admin addresses are TCP like http_addr; a loopback (or wildcard)
        // one clashes only with a node that may share the host.
        let admin_ip = a.admin_addr.ip();
        let local = admin_ip.is_loopback() || admin_ip.is_unspecified();
        if (!local || may_share_host(a, other))
            && (a.admin_addr == other.admin_addr || a.admin_addr == other.http_addr)
        {
            return Some((
                "admin_addr",
                format!("{} is also used by nodes[{j}]", a.admin_addr),
            ));
        }
        if a.http_addr == other.admin_addr
            && (!(other.admin_addr.ip().is_loopback() || other.admin_addr.ip().is_unspecified())
                || may_share_host(a, other))
        {
            return Some((
                "http_addr",
                format!("{} is also nodes[{j}].admin_addr", a.http_addr),
            ));
        }
        if let Some(sip) = a.sip_addr
            && [
                Some(other.http_addr),
                Some(other.peer_addr),
                Some(other.gossip_addr),
                Some(other.admin_addr),
                other.sip_addr,
            ]
            .contains(&Some(sip))
        {
            return Some(("sip_addr", format!("{sip} is also used by nodes[{j}]")));
        }
        for (k, mine) in [
            ("http_addr", a.http_addr),
            ("peer_addr", a.peer_addr),
            ("gossip_addr", a.gossip_addr),
            ("admin_addr", a.admin_addr),
        ] {
            if other.sip_addr == Some(mine) {
                return Some((k, format!("{mine} is also nodes[{j}].sip_addr")));
            }
        }
        for (k, mine, theirs) in [
            ("peer_addr", a.peer_addr, other.peer_addr),
            ("peer_addr", a.peer_addr, other.gossip_addr),
            ("gossip_addr", a.gossip_addr, other.gossip_addr),
            ("gossip_addr", a.gossip_addr, other.peer_addr),
        ] {
            if mine == theirs {
                return Some((k, format!("{mine} is also used by nodes[{j}]")));
            }
        }
    }
    None
}

#[cfg(test)]
mod node_index_tests {
    use super::*;
    use crate::engine::node_id::NodeId;
    use proptest::prelude::*;

    fn addr(ip: u8, port: u16) -> SocketAddr {
        let ip = match ip % 3 {
            0 => [127, 0, 0, 1],
            1 => [10, 0, 0, 1],
            _ => [10, 0, 0, 2],
        };
        SocketAddr::from((ip, port))
    }

    proptest! {
        /// Through the index, each node of a file meets the same first clash
        /// (field and message) as against every node before it in order.
        #[test]
        fn the_index_finds_the_same_first_clash_as_every_pair(
            nodes in proptest::collection::vec(
                (0u8..3, proptest::collection::vec(1u16..7, 6), any::<bool>(), 0u8..4),
                1..14,
            ),
        ) {
            let nodes: Vec<NodeAddrs> = nodes
                .into_iter()
                .enumerate()
                .map(|(i, (ip, p, sip, case))| NodeAddrs {
                    id: NodeId::new(&if case == 0 { format!("N{}", i / 2) } else { format!("n{}", i / 2) })
                        .unwrap(),
                    http_addr: addr(ip, p[0]),
                    peer_addr: addr(ip, p[1]),
                    gossip_addr: addr(ip, p[2]),
                    admin_addr: addr(ip + case, p[3]),
                    sip_addr: sip.then(|| addr(ip, p[4])),
                    sips_addr: None,
                    metrics_addr: (case >= 2).then(|| addr(ip, p[5])),
                    weight: 100,
                })
                .collect();
            let mut index = NodeIndex::default();
            for (i, a) in nodes.iter().enumerate() {
                let want_id = nodes[..i].iter().position(|p| p.id.eq_ignore_ascii_case(&a.id));
                prop_assert_eq!(index.id_of(a), want_id);
                let all = addr_problem(a, nodes[..i].iter().enumerate());
                let some = index.sharing_an_addr(a).into_iter().map(|j| (j, &nodes[j]));
                prop_assert_eq!(addr_problem(a, some), all);
                index.insert(i, a);
            }
        }
    }
}
