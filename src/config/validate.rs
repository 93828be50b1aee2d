//! Validation of the file model into typed values: [`ClusterFile::check`]
//! (the whole file, whichever node runs) and [`ClusterFile::validate`] (one
//! node, with its overrides). Every error names the field path
//! (`nodes[1].peer_addr`) or the flag (`--peer-addr`) at fault.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::bind::{bind_problem, parse_bind};
use super::{
    BindAddrs, ClusterFile, ConfigError, GossipSettings, IngressSettings, LifecycleSettings,
    MAX_DURATION_MS, MAX_WEIGHT, MetricSettings, NodeAddrs, NodeConfig, Overrides, PeerSettings,
    RoutingSettings, RulesSource, Source, StateSignatures, TlsPaths,
};
use crate::engine::gossip_budget as bounds;
use crate::engine::node_id::NodeId;
use crate::engine::route::RouterOptions;
use crate::engine::slow_start::SlowStart;

mod addrs;
mod parse;
mod sips;

use addrs::{NodeIndex, addr_problem, admin_or_default, parse_addr, shared_sip_problem, used_by};
use parse::{listener_settings, parse_app, parse_policy, parse_sip_app, route_cookie};

impl ClusterFile {
    /// Checks the whole file (every node, every rule), independent of which
    /// node will run. Used by `peerlb check-config` and before [`Self::validate`].
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first offending field.
    pub fn check(&self, src: &Source) -> Result<Vec<NodeAddrs>, ConfigError> {
        // Long: one check per field, in the file's order: the first broken one is reported.
        let inv = |field: &str, message: String| ConfigError::Invalid {
            origin: src.origin.clone(),
            field: field.to_owned(),
            message,
        };
        if self.name.is_empty() {
            return Err(inv("name", "must not be empty".into()));
        }
        parse_policy(&self.policy).map_err(|m| inv("policy", m))?;
        parse_app(&self.app, Duration::ZERO).map_err(|m| inv("app", m))?;
        let sip_app = parse_sip_app(&self.sip_app).map_err(|m| inv("sip_app", m))?;
        if let Some(s) = &self.sprayer_addr {
            parse_addr(s).map_err(|m| inv("sprayer_addr", m))?;
        }
        sips::check_sip_sprayer(self).map_err(|m| inv("sip_sprayer_addr", m))?;
        sips::check_sips_sprayer(self).map_err(|m| inv("sips_sprayer_addr", m))?;
        if !(1..=4096).contains(&self.ring.vnodes) {
            return Err(inv(
                "ring.vnodes",
                format!("{} is out of range 1..=4096", self.ring.vnodes),
            ));
        }
        route_cookie(&self.sticky).map_err(|(f, m)| inv(f, m))?;
        for (name, l) in std::iter::once(("listener", &self.listener))
            .chain(self.shared_listener.iter().map(|l| ("shared_listener", l)))
        {
            parse::check_client_auth(name, l).map_err(|(f, m)| inv(&f, m))?;
        }
        super::session::session_route(&self.sticky).map_err(|(f, m)| inv(&f, m))?;
        if self.tls.dir.is_empty() {
            return Err(inv("tls.dir", "must not be empty".into()));
        }
        let l = &self.limits;
        // hyper's HTTP/1 parser answers 414 itself past 65534 bytes.
        if !(64..=65_534).contains(&l.max_request_target) {
            return Err(inv(
                "limits.max_request_target",
                format!("{} is out of range 64..=65534", l.max_request_target),
            ));
        }
        if !(1..=100).contains(&l.max_connections_per_source_percent) {
            return Err(inv(
                "limits.max_connections_per_source_percent",
                format!(
                    "{} is out of range 1..=100",
                    l.max_connections_per_source_percent
                ),
            ));
        }
        if !(1..=1_000_000).contains(&l.max_connections) {
            return Err(inv(
                "limits.max_connections",
                format!("{} is out of range 1..=1000000", l.max_connections),
            ));
        }
        for (name, v) in [
            ("limits.response_timeout_ms", l.response_timeout_ms),
            ("limits.connect_timeout_ms", l.connect_timeout_ms),
            ("limits.drain_timeout_ms", l.drain_timeout_ms),
            ("limits.header_read_timeout_ms", l.header_read_timeout_ms),
            ("limits.body_read_timeout_ms", l.body_read_timeout_ms),
            ("limits.send_timeout_ms", l.send_timeout_ms),
            (
                "limits.websocket_idle_timeout_ms",
                l.websocket_idle_timeout_ms,
            ),
            ("limits.sip_idle_timeout_ms", l.sip_idle_timeout_ms),
            ("limits.sip_timer_c_ms", l.sip_timer_c_ms),
            (
                "limits.sip_udp_rate_interval_ms",
                l.sip_udp_rate_interval_ms,
            ),
            (
                "limits.tunnel_closable_after_ms",
                l.tunnel_closable_after_ms,
            ),
            ("gossip.interval_ms", self.gossip.interval_ms),
            ("gossip.dead_node_grace_ms", self.gossip.dead_node_grace_ms),
            ("peer.keep_alive_ms", self.peer.keep_alive_ms),
            ("peer.idle_timeout_ms", self.peer.idle_timeout_ms),
        ] {
            if v == 0 {
                return Err(inv(name, "must be greater than 0".into()));
            }
        }
        for (name, v, range) in [
            (
                "limits.response_buffer_bytes",
                l.response_buffer_bytes,
                MIN_RESPONSE_BUFFER..=MAX_RESPONSE_BUFFER,
            ),
            (
                "limits.response_budget_bytes",
                l.response_budget_bytes,
                MIN_RESPONSE_BUDGET..=MAX_RESPONSE_BUDGET,
            ),
        ] {
            if !range.contains(&v) {
                return Err(inv(
                    name,
                    format!("{v} is out of range {}..={}", range.start(), range.end()),
                ));
            }
        }
        if !(1..=100).contains(&l.max_tunnels_percent) {
            return Err(inv(
                "limits.max_tunnels_percent",
                format!("{} is out of range 1..=100", l.max_tunnels_percent),
            ));
        }
        if !(1..=10_000).contains(&l.h2_max_concurrent_streams) {
            return Err(inv(
                "limits.h2_max_concurrent_streams",
                format!("{} is out of range 1..=10000", l.h2_max_concurrent_streams),
            ));
        }
        if l.upstream_idle_timeout_ms > MAX_UPSTREAM_IDLE_MS {
            return Err(inv(
                "limits.upstream_idle_timeout_ms",
                format!(
                    "{} is out of range 0..={MAX_UPSTREAM_IDLE_MS}",
                    l.upstream_idle_timeout_ms
                ),
            ));
        }
        // Every duration a node starts with is bounded: a timer deadline
        // `now + d` must not overflow, and QUIC's idle timeout is a varint.
        for (name, v) in [
            ("limits.response_timeout_ms", l.response_timeout_ms),
            ("limits.connect_timeout_ms", l.connect_timeout_ms),
            ("limits.drain_grace_ms", l.drain_grace_ms),
            ("limits.drain_timeout_ms", l.drain_timeout_ms),
            ("limits.startup_wait_ms", l.startup_wait_ms),
            ("limits.header_read_timeout_ms", l.header_read_timeout_ms),
            ("limits.body_read_timeout_ms", l.body_read_timeout_ms),
            ("limits.send_timeout_ms", l.send_timeout_ms),
            (
                "limits.websocket_idle_timeout_ms",
                l.websocket_idle_timeout_ms,
            ),
            ("limits.sip_idle_timeout_ms", l.sip_idle_timeout_ms),
            ("limits.sip_timer_c_ms", l.sip_timer_c_ms),
            (
                "limits.sip_udp_rate_interval_ms",
                l.sip_udp_rate_interval_ms,
            ),
            (
                "limits.tunnel_closable_after_ms",
                l.tunnel_closable_after_ms,
            ),
            ("gossip.interval_ms", self.gossip.interval_ms),
            ("gossip.dead_node_grace_ms", self.gossip.dead_node_grace_ms),
            ("peer.keep_alive_ms", self.peer.keep_alive_ms),
            ("peer.idle_timeout_ms", self.peer.idle_timeout_ms),
        ] {
            if v > MAX_DURATION_MS {
                return Err(inv(
                    name,
                    format!("{v} is out of range (at most {MAX_DURATION_MS} ms, 30 days)"),
                ));
            }
        }
        if !matches!(self.peer.protocol, 1..=3) {
            return Err(inv(
                "peer.protocol",
                format!("{} is not a peer protocol (1, 2 or 3)", self.peer.protocol),
            ));
        }
        for (name, l) in [
            ("listener", Some(&self.listener)),
            ("shared_listener", self.shared_listener.as_ref()),
        ] {
            let Some(l) = l else { continue };
            if !(1..=MAX_DURATION_MS).contains(&l.proxy_protocol_timeout_ms) {
                return Err(inv(
                    &format!("{name}.proxy_protocol_timeout_ms"),
                    format!(
                        "{} is out of range 1..={MAX_DURATION_MS}",
                        l.proxy_protocol_timeout_ms
                    ),
                ));
            }
            if let Some(t) = &l.tls {
                if t.reload_interval_ms > MAX_DURATION_MS {
                    return Err(inv(
                        &format!("{name}.tls.reload_interval_ms"),
                        format!(
                            "{} is out of range 0..={MAX_DURATION_MS}",
                            t.reload_interval_ms
                        ),
                    ));
                }
                let pairs = std::iter::once((format!("{name}.tls"), &t.cert, &t.key)).chain(
                    t.sni
                        .iter()
                        .enumerate()
                        .map(|(i, p)| (format!("{name}.tls.sni[{i}]"), &p.cert, &p.key)),
                );
                for (field, cert, key) in pairs {
                    if cert.is_empty() {
                        return Err(inv(&format!("{field}.cert"), "must not be empty".into()));
                    }
                    if key.is_empty() {
                        return Err(inv(&format!("{field}.key"), "must not be empty".into()));
                    }
                }
            }
        }
        if self.peer.keep_alive_ms >= self.peer.idle_timeout_ms {
            return Err(inv(
                "peer.keep_alive_ms",
                format!(
                    "{} must be less than peer.idle_timeout_ms ({})",
                    self.peer.keep_alive_ms, self.peer.idle_timeout_ms
                ),
            ));
        }
        if !(self.gossip.phi_threshold.is_finite() && self.gossip.phi_threshold > 0.0) {
            return Err(inv(
                "gossip.phi_threshold",
                format!("{} must be a positive number", self.gossip.phi_threshold),
            ));
        }
        for (i, s) in self.seeds.iter().enumerate() {
            if s.is_empty() || !s.contains(':') {
                return Err(inv(
                    &format!("seeds[{i}]"),
                    format!("{s:?} is not host:port"),
                ));
            }
        }
        if self.nodes.is_empty() {
            return Err(inv(
                "nodes",
                "at least one [[nodes]] entry is required".into(),
            ));
        }
        let mut out: Vec<NodeAddrs> = Vec::with_capacity(self.nodes.len());
        let mut index = NodeIndex::default();
        for (i, n) in self.nodes.iter().enumerate() {
            let f = |k: &str| format!("nodes[{i}].{k}");
            let id = NodeId::new(&n.id).map_err(|e| inv(&f("id"), e.to_string()))?;
            let http_addr = parse_addr(&n.http_addr).map_err(|m| inv(&f("http_addr"), m))?;
            let admin_addr = match &n.admin_addr {
                Some(s) => parse_addr(s).map_err(|m| inv(&f("admin_addr"), m))?,
                None => admin_or_default(None, http_addr).map_err(|m| inv(&f("admin_addr"), m))?,
            };
            let a = NodeAddrs {
                id,
                http_addr,
                peer_addr: parse_addr(&n.peer_addr).map_err(|m| inv(&f("peer_addr"), m))?,
                gossip_addr: parse_addr(&n.gossip_addr).map_err(|m| inv(&f("gossip_addr"), m))?,
                admin_addr,
                sip_addr: n
                    .sip_addr
                    .as_deref()
                    .map(|s| parse_addr(s).map_err(|m| inv(&f("sip_addr"), m)))
                    .transpose()?,
                sips_addr: n
                    .sips_addr
                    .as_deref()
                    .map(|s| sips::parse_sips_addr(s).map_err(|m| inv(&f("sips_addr"), m)))
                    .transpose()?,
                metrics_addr: n
                    .metrics_addr
                    .as_deref()
                    .map(|s| parse_addr(s).map_err(|m| inv(&f("metrics_addr"), m)))
                    .transpose()?,
                weight: n.weight,
            };
            if n.weight > MAX_WEIGHT {
                return Err(inv(
                    &f("weight"),
                    format!("{} is out of range 0..={MAX_WEIGHT}", n.weight),
                ));
            }
            if let Some(j) = index.id_of(&a) {
                return Err(inv(&f("id"), format!("{:?} is also nodes[{j}].id", n.id)));
            }
            let others = index.sharing_an_addr(&a).into_iter().map(|j| (j, &out[j]));
            if let Some((k, m)) = addr_problem(&a, others) {
                return Err(inv(&f(k), m));
            }
            let bind = |k: &str, v: &Option<String>, advertised| match v {
                Some(s) => parse_bind(s, advertised).map_err(|m| inv(&f(k), m)),
                None => Ok(advertised),
            };
            let binds = BindAddrs {
                http: bind("http_bind", &n.http_bind, a.http_addr)?,
                peer: bind("peer_bind", &n.peer_bind, a.peer_addr)?,
                gossip: bind("gossip_bind", &n.gossip_bind, a.gossip_addr)?,
            };
            if let Some((k, m)) = bind_problem(&binds, a.admin_addr) {
                return Err(inv(&f(k), m));
            }
            index.insert(i, &a);
            out.push(a);
        }
        if out.iter().all(|n| n.weight == 0) {
            return Err(inv(
                "nodes",
                "every node has weight 0: no node would receive requests".into(),
            ));
        }
        let g = &self.gossip;
        let max_members = g.max_members as usize;
        if !(2..=bounds::MAX_MAX_MEMBERS).contains(&max_members) {
            return Err(inv(
                "gossip.max_members",
                format!(
                    "{max_members} is out of range 2..={}",
                    bounds::MAX_MAX_MEMBERS
                ),
            ));
        }
        if max_members < out.len() {
            return Err(inv(
                "gossip.max_members",
                format!("{max_members} is less than the {} [[nodes]]", out.len()),
            ));
        }
        // A full digest of `max_members` members like the largest one
        // configured must fit in one datagram (bounds::DEFAULT_MAX_MEMBERS
        // says why); the default fits whatever the ids.
        if max_members > bounds::DEFAULT_MAX_MEMBERS {
            let entry = out
                .iter()
                .map(|n| bounds::digest_entry(n.id.len(), n.gossip_addr.is_ipv6()))
                .max()
                .unwrap_or(0);
            let budget = bounds::digest_budget(&self.name);
            if max_members * entry > budget {
                return Err(inv(
                    "gossip.max_members",
                    format!(
                        "{max_members} members of {entry} bytes each (the longest node id and \
                         address here) make a gossip digest of {} bytes, more than the {budget} \
                         one datagram has room for: use shorter node ids or at most {} members",
                        max_members * entry,
                        budget / entry.max(1)
                    ),
                ));
            }
        }
        if !["off", "sign", "require"].contains(&self.gossip.state_signatures.as_str()) {
            return Err(inv(
                "gossip.state_signatures",
                format!(
                    "{:?} is none of \"off\", \"sign\", \"require\"",
                    self.gossip.state_signatures
                ),
            ));
        }
        if !["at_sight", "on_demand"].contains(&self.peer.dial.as_str()) {
            return Err(inv(
                "peer.dial",
                format!(
                    "{:?} is neither \"at_sight\" nor \"on_demand\"",
                    self.peer.dial
                ),
            ));
        }
        if !(1200..=6500).contains(&self.peer.max_udp_payload) {
            return Err(inv(
                "peer.max_udp_payload",
                format!("{} is out of range 1200..=6500", self.peer.max_udp_payload),
            ));
        }
        if !(10..=1000).contains(&g.sample_window) {
            return Err(inv(
                "gossip.sample_window",
                format!("{} is out of range 10..=1000", g.sample_window),
            ));
        }
        if let Some(s) = self
            .sprayer_addr
            .as_deref()
            .and_then(|s| parse_addr(s).ok())
            && let Some(i) = out.iter().position(|n| n.http_addr == s)
        {
            return Err(inv(
                "sprayer_addr",
                format!("{s} is also nodes[{i}].http_addr; the shared address must be its own"),
            ));
        }
        if let Some(s) = self
            .sprayer_addr
            .as_deref()
            .and_then(|s| parse_addr(s).ok())
            && let Some(i) = out.iter().position(|n| n.admin_addr == s)
        {
            return Err(inv(
                "sprayer_addr",
                format!("{s} is also nodes[{i}].admin_addr; the shared address must be its own"),
            ));
        }
        if let Some(s) = self
            .sip_sprayer_addr
            .as_deref()
            .and_then(|s| parse_addr(s).ok())
        {
            if let Some((i, k)) = used_by(&out, s) {
                return Err(inv(
                    "sip_sprayer_addr",
                    format!("{s} is also nodes[{i}].{k}; the shared address must be its own"),
                ));
            }
            if out.iter().all(|n| n.sip_addr.is_none()) {
                return Err(inv(
                    "sip_sprayer_addr",
                    "no node has a sip_addr, so no node would listen there".into(),
                ));
            }
        }
        sips::check(self, sip_app).map_err(|(f, m)| inv(&f, m))?;
        let b = &self.balance;
        if let Some(c) = b.hash_balance_factor
            && !(1.0..=1000.0).contains(&c)
        {
            return Err(inv(
                "balance.hash_balance_factor",
                format!("{c} is out of range 1.0..=1000.0"),
            ));
        }
        if !(0.0..1.0).contains(&b.metric_history) {
            return Err(inv(
                "balance.metric_history",
                format!("{} is out of range 0.0..1.0", b.metric_history),
            ));
        }
        if b.metric_capacity == 0 {
            return Err(inv(
                "balance.metric_capacity",
                "must be greater than 0".into(),
            ));
        }
        if b.slow_start_ms > MAX_SLOW_START_MS {
            return Err(inv(
                "balance.slow_start_ms",
                format!(
                    "{} is out of range 0..={MAX_SLOW_START_MS} (one hour)",
                    b.slow_start_ms
                ),
            ));
        }
        if !(1..=crate::engine::slow_start::MAX_STEPS).contains(&b.slow_start_steps) {
            return Err(inv(
                "balance.slow_start_steps",
                format!(
                    "{} is out of range 1..={}",
                    b.slow_start_steps,
                    crate::engine::slow_start::MAX_STEPS
                ),
            ));
        }
        self.rules_source(src)?.load().map_err(|e| match e {
            // A rules file that cannot be read is the `rules_file` field's fault.
            ConfigError::Read { path, source } if self.rules_file.is_some() => {
                inv("rules_file", format!("{path}: {source}"))
            }
            e => e,
        })?;
        Ok(out)
    }

    /// Validates the file for node `node_id` with `overrides` applied.
    /// A node id not listed in the file is accepted when the overrides give
    /// all three of its addresses (a node joining a running cluster).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first offending field (or flag).
    pub fn validate(
        &self,
        src: &Source,
        node_id: &str,
        ov: &Overrides,
    ) -> Result<NodeConfig, ConfigError> {
        // Long: one node's settings field by field (file, then overrides), first error reported.
        let inv = |field: &str, message: String| ConfigError::Invalid {
            origin: src.origin.clone(),
            field: field.to_owned(),
            message,
        };
        let mut nodes = self.check(src)?;
        let id = NodeId::new(node_id).map_err(|e| inv("--node", e.to_string()))?;
        let pos = nodes.iter().position(|n| &*n.id == node_id);
        let addr_flag =
            |flag: &str, v: &Option<String>| -> Result<Option<SocketAddr>, ConfigError> {
                v.as_deref()
                    .map(|s| parse_addr(s).map_err(|m| inv(flag, m)))
                    .transpose()
            };
        let http = addr_flag("--http-addr", &ov.http_addr)?;
        let peer = addr_flag("--peer-addr", &ov.peer_addr)?;
        let gossip = addr_flag("--gossip-addr", &ov.gossip_addr)?;
        let admin = addr_flag("--admin-addr", &ov.admin_addr)?;
        let me = match pos {
            Some(i) => {
                let n = &mut nodes[i];
                // A node moved to another client port without an admin
                // address of its own takes the default of its new port.
                if http.is_some() && admin.is_none() && self.nodes[i].admin_addr.is_none() {
                    n.admin_addr = admin_or_default(None, http.unwrap_or(n.http_addr))
                        .map_err(|m| inv("--admin-addr", m))?;
                }
                n.http_addr = http.unwrap_or(n.http_addr);
                n.peer_addr = peer.unwrap_or(n.peer_addr);
                n.gossip_addr = gossip.unwrap_or(n.gossip_addr);
                n.admin_addr = admin.unwrap_or(n.admin_addr);
                n.weight = ov.weight.unwrap_or(n.weight);
                n.clone()
            }
            None => {
                let (Some(http_addr), Some(peer_addr), Some(gossip_addr)) = (http, peer, gossip)
                else {
                    let known: Vec<&str> = nodes.iter().map(|n| &*n.id).collect();
                    return Err(inv(
                        "--node",
                        format!(
                            "{node_id:?} is not in [[nodes]] (known: {}); a new node needs \
                             --http-addr, --peer-addr and --gossip-addr",
                            known.join(", ")
                        ),
                    ));
                };
                let n = NodeAddrs {
                    id,
                    http_addr,
                    peer_addr,
                    gossip_addr,
                    admin_addr: admin_or_default(admin, http_addr)
                        .map_err(|m| inv("--admin-addr", m))?,
                    sip_addr: None,
                    sips_addr: None,
                    metrics_addr: None,
                    weight: ov.weight.unwrap_or(100),
                };
                nodes.push(n.clone());
                n
            }
        };
        // The flags get the same address rules as the file.
        if http.is_some() || peer.is_some() || gossip.is_some() || admin.is_some() {
            let others = nodes.iter().enumerate().filter(|(_, n)| n.id != me.id);
            if let Some((k, m)) = addr_problem(&me, others) {
                // Name the flag when this node's value came from one.
                let flag = match k {
                    "http_addr" if http.is_some() => "--http-addr",
                    "peer_addr" if peer.is_some() => "--peer-addr",
                    "gossip_addr" if gossip.is_some() => "--gossip-addr",
                    // gossip_addr == peer_addr: the one that was overridden.
                    "gossip_addr" if peer.is_some() => "--peer-addr",
                    "admin_addr" if admin.is_some() => "--admin-addr",
                    // admin_addr == http_addr: the one that was overridden.
                    "admin_addr" if http.is_some() => "--http-addr",
                    _ => "--node",
                };
                return Err(inv(flag, format!("{m} (this node's {k})")));
            }
        }
        let binds = self.binds_of(pos, &me, ov, &inv)?;
        if me.weight > MAX_WEIGHT {
            return Err(inv(
                "--weight",
                format!("{} is out of range 0..={MAX_WEIGHT}", me.weight),
            ));
        }
        let app = parse_app(
            ov.app.as_deref().unwrap_or(&self.app),
            Duration::from_millis(self.limits.upstream_idle_timeout_ms),
        )
        .map_err(|m| inv(if ov.app.is_some() { "--app" } else { "app" }, m))?;
        let shared_listen = addr_flag("--shared-listen", &ov.shared_listen)?;
        if shared_listen == Some(me.admin_addr) {
            return Err(inv(
                "--shared-listen",
                format!("{} is this node's admin_addr", me.admin_addr),
            ));
        }
        if shared_listen == Some(me.http_addr) {
            return Err(inv(
                "--shared-listen",
                format!("{} is this node's http_addr", me.http_addr),
            ));
        }
        let shared_sip_listen = addr_flag("--shared-sip-listen", &ov.shared_sip_listen)?;
        if let Some(a) = shared_sip_listen {
            let mine = std::slice::from_ref(&me);
            let clash = shared_sip_problem(a)
                .err()
                .or_else(|| used_by(mine, a).map(|(_, k)| format!("{a} is this node's {k}")));
            let clash = clash.or_else(|| {
                (me.sip_addr.is_none()).then(|| {
                    "this node has no sip_addr (only a node that serves SIP joins the shared SIP address)"
                        .to_owned()
                })
            });
            let clash = clash.or_else(|| {
                (shared_listen == Some(a)).then(|| format!("{a} is also --shared-listen"))
            });
            if let Some(m) = clash {
                return Err(inv("--shared-sip-listen", m));
            }
        }
        let shared_sips_listen = ov.shared_sips_listen.as_deref();
        let shared_sips_listen = sips::shared_listen(shared_sips_listen, &me, shared_sip_listen)
            .map_err(|m| inv("--shared-sips-listen", m))?;
        let seeds = if self.seeds.is_empty() {
            nodes
                .iter()
                .filter(|n| n.id != me.id)
                .map(|n| n.gossip_addr.to_string())
                .collect()
        } else {
            self.seeds.clone()
        };
        let dir = src.base_dir.join(&self.tls.dir);
        let path_or = |p: &Option<String>, default: PathBuf| {
            p.as_ref().map_or(default, |p| src.base_dir.join(p))
        };
        let tls = TlsPaths {
            ca: path_or(&self.tls.ca, dir.join("ca.pem")),
            cert: path_or(&self.tls.cert, dir.join(format!("{node_id}.pem"))),
            key: path_or(&self.tls.key, dir.join(format!("{node_id}.key"))),
            gossip_keyring: path_or(&self.tls.gossip_keyring, dir.join("gossip.keys")),
            dir,
        };
        let ms = Duration::from_millis;
        let rules_source = self.rules_source(src)?;
        let tls_cert = ov.tls_cert.as_ref();
        let listener = listener_settings("listener", &self.listener, tls_cert, &src.base_dir);
        let shared_listener = match &self.shared_listener {
            Some(l) => listener_settings("shared_listener", l, tls_cert, &src.base_dir),
            None => listener.clone(),
        };
        let sips_addr = me.sips_addr;
        Ok(NodeConfig {
            cluster: self.name.clone(),
            node: me,
            bind: binds,
            nodes,
            shared_listen,
            shared_sip_listen,
            shared_sips_listen,
            app,
            sip_app: parse_sip_app(&self.sip_app).map_err(|m| inv("sip_app", m))?,
            sips: sips::settings(&self.sips, sips_addr, listener.tls.as_ref(), &src.base_dir),
            tls,
            routing: RoutingSettings {
                policy: parse_policy(&self.policy).map_err(|m| inv("policy", m))?,
                router: RouterOptions {
                    hash_balance_factor: self.balance.hash_balance_factor,
                },
                rules: rules_source.load()?,
                ring: crate::engine::ring::RingSpec {
                    vnodes: self.ring.vnodes,
                    assignment: self.ring.assignment.into(),
                },
                slow_start: SlowStart::new(
                    ms(self.balance.slow_start_ms),
                    self.balance.slow_start_steps,
                ),
                session_route: super::session::session_route(&self.sticky)
                    .map_err(|(f, m)| inv(&f, m))?,
            },
            metric: MetricSettings {
                history: self.balance.metric_history,
                capacity: self.balance.metric_capacity,
            },
            ingress: IngressSettings {
                max_request_target: self.limits.max_request_target,
                max_connections: self.limits.max_connections,
                max_connections_per_source_percent: self.limits.max_connections_per_source_percent,
                response_timeout: ms(self.limits.response_timeout_ms),
                header_served_by: self.headers.served_by,
                header_entry: self.headers.entry,
                trust_client_forwarded: self.headers.trust_client_forwarded,
                route_cookie: route_cookie(&self.sticky).map_err(|(f, m)| inv(f, m))?,
                rules_source: match rules_source {
                    RulesSource::Inline(_) => None,
                    s => Some(s),
                },
                header_read_timeout: ms(self.limits.header_read_timeout_ms),
                body_read_timeout: ms(self.limits.body_read_timeout_ms),
                send_timeout: ms(self.limits.send_timeout_ms),
                early_answer_drain_bytes: self.limits.early_answer_drain_bytes,
                h2_max_concurrent_streams: self.limits.h2_max_concurrent_streams,
                websocket_idle_timeout: ms(self.limits.websocket_idle_timeout_ms),
                sip_idle_timeout: ms(self.limits.sip_idle_timeout_ms),
                sip_timer_c: ms(self.limits.sip_timer_c_ms),
                sip_udp_rate: (
                    self.limits.sip_udp_requests_per_source,
                    ms(self.limits.sip_udp_rate_interval_ms),
                ),
                tunnel_closable_after: ms(self.limits.tunnel_closable_after_ms),
                max_tunnels_percent: self.limits.max_tunnels_percent,
                response_buffer_bytes: self.limits.response_buffer_bytes,
                response_budget_bytes: self.limits.response_budget_bytes,
            },
            listener,
            shared_listener,
            peer: PeerSettings {
                keep_alive: ms(self.peer.keep_alive_ms),
                idle_timeout: ms(self.peer.idle_timeout_ms),
                connect_timeout: ms(self.limits.connect_timeout_ms),
                only_v1: self.peer.protocol == 1,
                offer_v3: self.peer.protocol == 3,
                max_peers: self.gossip.max_members as usize,
                max_udp_payload: self.peer.max_udp_payload,
                dial_on_demand: self.peer.dial == "on_demand",
                stream_window: self.limits.response_buffer_bytes,
            },
            gossip: GossipSettings {
                seeds,
                interval: ms(self.gossip.interval_ms),
                phi_threshold: self.gossip.phi_threshold,
                dead_node_grace: ms(self.gossip.dead_node_grace_ms),
                max_members: self.gossip.max_members as usize,
                sample_window: self.gossip.sample_window as usize,
                state_signatures: match self.gossip.state_signatures.as_str() {
                    "sign" => StateSignatures::Sign,
                    "require" => StateSignatures::Require,
                    _ => StateSignatures::Off,
                },
            },
            lifecycle: LifecycleSettings {
                startup_wait: ms(self.limits.startup_wait_ms),
                drain_grace: ms(self.limits.drain_grace_ms),
                drain_timeout: ms(self.limits.drain_timeout_ms),
            },
        })
    }
}

impl ClusterFile {
    fn rules_source(&self, src: &Source) -> Result<RulesSource, ConfigError> {
        match (&self.rules_file, src.path.as_ref()) {
            (Some(_), _) if !self.rules.is_empty() => Err(ConfigError::Invalid {
                origin: src.origin.clone(),
                field: "rules_file".into(),
                message: "give either rules_file or [[rules]], not both".into(),
            }),
            (Some(f), _) => Ok(RulesSource::Xml(src.base_dir.join(f))),
            (None, Some(p)) => Ok(RulesSource::Toml(p.clone())),
            (None, None) => Ok(RulesSource::Inline(Box::new(src.clone()))),
        }
    }
}

/// Range of `limits.response_buffer_bytes`: a 16 KiB window at least (a
/// smaller one makes every forwarded answer a round trip per few
/// packets), 16 MiB at most.
const MIN_RESPONSE_BUFFER: u64 = 16 * 1024;
const MAX_RESPONSE_BUFFER: u64 = 16 * 1024 * 1024;

/// Range of `limits.response_budget_bytes`: 1 MiB to 1 TiB.
const MIN_RESPONSE_BUDGET: u64 = 1024 * 1024;
const MAX_RESPONSE_BUDGET: u64 = 1 << 40;

/// Longest `limits.upstream_idle_timeout_ms` (one hour).
const MAX_UPSTREAM_IDLE_MS: u64 = 3_600_000;

/// Longest slow-start ramp (`balance.slow_start_ms`): one hour.
const MAX_SLOW_START_MS: u64 = 3_600_000;
