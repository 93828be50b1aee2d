//! Validation of the file model into typed values: [`ClusterFile::check`]
//! (the whole file, whichever node runs) and [`ClusterFile::validate`] (one
//! node, with its overrides). Every error names the field path
//! (`nodes[1].peer_addr`) or the flag (`--peer-addr`) at fault.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::bind::{bind_problem, parse_bind};
use super::settings::MAX_UNIX_PATH;
use super::{
    AppAddr, AppKind, BindAddrs, CertFiles, ClusterFile, ConfigError, GossipSettings,
    IngressSettings, LifecycleSettings, ListenerSection, ListenerSettings, ListenerTls,
    MAX_DURATION_MS, MAX_WEIGHT, MetricSettings, NodeAddrs, NodeConfig, Overrides, PeerSettings,
    RoutingSettings, RulesSource, SipAppKind, Source, StickySection, TlsPaths, UpstreamApp,
};
use crate::engine::balance::Policy;
use crate::engine::gossip_budget as bounds;
use crate::engine::node_id::NodeId;
use crate::engine::route::RouterOptions;
use crate::engine::slow_start::SlowStart;
use crate::engine::{RouteCookie, SameSite};

impl ClusterFile {
    /// Checks the whole file (every node, every rule), independent of which
    /// node will run. Used by `peerlb check-config` and before [`Self::validate`].
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first offending field.
    pub fn check(&self, src: &Source) -> Result<Vec<NodeAddrs>, ConfigError> {
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
        parse_sip_app(&self.sip_app).map_err(|m| inv("sip_app", m))?;
        if let Some(s) = &self.sprayer_addr {
            parse_addr(s).map_err(|m| inv("sprayer_addr", m))?;
        }
        if let Some(s) = &self.sip_sprayer_addr {
            let a = parse_addr(s).map_err(|m| inv("sip_sprayer_addr", m))?;
            shared_sip_problem(a).map_err(|m| inv("sip_sprayer_addr", m))?;
            if self
                .sprayer_addr
                .as_deref()
                .and_then(|h| parse_addr(h).ok())
                == Some(a)
            {
                return Err(inv(
                    "sip_sprayer_addr",
                    format!("{a} is also sprayer_addr (SIP over TCP would share its port)"),
                ));
            }
        }
        if !(1..=4096).contains(&self.ring.vnodes) {
            return Err(inv(
                "ring.vnodes",
                format!("{} is out of range 1..=4096", self.ring.vnodes),
            ));
        }
        route_cookie(&self.sticky).map_err(|(f, m)| inv(f, m))?;
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
        if !matches!(self.peer.protocol, 1 | 2) {
            return Err(inv(
                "peer.protocol",
                format!("{} is not a peer protocol (1 or 2)", self.peer.protocol),
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
        Ok(NodeConfig {
            cluster: self.name.clone(),
            node: me,
            bind: binds,
            nodes,
            shared_listen,
            shared_sip_listen,
            app,
            sip_app: parse_sip_app(&self.sip_app).map_err(|m| inv("sip_app", m))?,
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
                h2_max_concurrent_streams: self.limits.h2_max_concurrent_streams,
                websocket_idle_timeout: ms(self.limits.websocket_idle_timeout_ms),
                sip_idle_timeout: ms(self.limits.sip_idle_timeout_ms),
                sip_udp_rate: (
                    self.limits.sip_udp_requests_per_source,
                    ms(self.limits.sip_udp_rate_interval_ms),
                ),
                tunnel_closable_after: ms(self.limits.tunnel_closable_after_ms),
                max_tunnels_percent: self.limits.max_tunnels_percent,
            },
            listener,
            shared_listener,
            peer: PeerSettings {
                keep_alive: ms(self.peer.keep_alive_ms),
                idle_timeout: ms(self.peer.idle_timeout_ms),
                connect_timeout: ms(self.limits.connect_timeout_ms),
                only_v1: self.peer.protocol == 1,
                max_peers: self.gossip.max_members as usize,
                max_udp_payload: self.peer.max_udp_payload,
                dial_on_demand: self.peer.dial == "on_demand",
            },
            gossip: GossipSettings {
                seeds,
                interval: ms(self.gossip.interval_ms),
                phi_threshold: self.gossip.phi_threshold,
                dead_node_grace: ms(self.gossip.dead_node_grace_ms),
                max_members: self.gossip.max_members as usize,
                sample_window: self.gossip.sample_window as usize,
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

/// The settings of the client listener `[name]` (`listener` or
/// `shared_listener`): paths relative to `base`; `--tls-cert` (`tls_cert`)
/// replaces the default certificate, or makes the listener HTTPS with it
/// alone.
fn listener_settings(
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
                    .map_or(super::model::DEFAULT_TLS_RELOAD_MS, |t| {
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
fn route_cookie(s: &StickySection) -> Result<RouteCookie, (&'static str, String)> {
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
fn parse_sip_app(s: &str) -> Result<SipAppKind, String> {
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

/// What a shared SIP address must be on its own: a port other than 0
/// and an IP clients can be told (it goes into `Record-Route`), not
/// `0.0.0.0` or `::`.
fn shared_sip_problem(a: SocketAddr) -> Result<(), String> {
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
fn metrics_addr_problem(a: &NodeAddrs) -> Option<(&'static str, String)> {
    let m = a.metrics_addr?;
    if m.port() == 0 {
        return Some(("metrics_addr", format!("{m}: port 0 cannot be scraped")));
    }
    [
        ("http_addr", Some(a.http_addr)),
        ("admin_addr", Some(a.admin_addr)),
        ("sip_addr", a.sip_addr),
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
fn used_by(nodes: &[NodeAddrs], a: SocketAddr) -> Option<(usize, &'static str)> {
    nodes.iter().enumerate().find_map(|(i, n)| {
        [
            ("http_addr", Some(n.http_addr)),
            ("peer_addr", Some(n.peer_addr)),
            ("gossip_addr", Some(n.gossip_addr)),
            ("admin_addr", Some(n.admin_addr)),
            ("sip_addr", n.sip_addr),
            ("metrics_addr", n.metrics_addr),
        ]
        .into_iter()
        .find(|(_, x)| *x == Some(a))
        .map(|(k, _)| (i, k))
    })
}

fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>()
        .map_err(|_| format!("{s:?} is not an ip:port socket address"))
}

/// `given`, else the default admin address of a node whose client address
/// is `http_addr` ([`super::default_admin_addr`]).
fn admin_or_default(
    given: Option<SocketAddr>,
    http_addr: SocketAddr,
) -> Result<SocketAddr, String> {
    given
        .or_else(|| super::default_admin_addr(http_addr))
        .ok_or_else(|| {
            format!(
                "the default (127.0.0.1:<http port + {}>) passes port 65535 for http_addr {http_addr}; give admin_addr",
                super::ADMIN_PORT_OFFSET
            )
        })
}

/// Whether two nodes may run on one host, judged by their client
/// addresses: the same IP, or either on loopback or the unspecified
/// address. Nodes on distinct routable IPs are taken to be on distinct
/// machines, so their loopback admin addresses do not clash.
fn may_share_host(a: &NodeAddrs, b: &NodeAddrs) -> bool {
    let local = |ip: std::net::IpAddr| ip.is_loopback() || ip.is_unspecified();
    a.http_addr.ip() == b.http_addr.ip() || local(a.http_addr.ip()) || local(b.http_addr.ip())
}

fn parse_policy(s: &str) -> Result<Policy, String> {
    s.parse::<Policy>().map_err(|e| format!("{s:?}: {e}"))
}

/// Longest `limits.upstream_idle_timeout_ms` (one hour).
const MAX_UPSTREAM_IDLE_MS: u64 = 3_600_000;

/// Longest slow-start ramp (`balance.slow_start_ms`): one hour.
const MAX_SLOW_START_MS: u64 = 3_600_000;

/// `app` (or `--app`): `builtin`, `http://host:port`, or
/// `unix:/absolute/path.sock`; an upstream app keeps idle connections
/// `idle_timeout`.
fn parse_app(s: &str, idle_timeout: Duration) -> Result<AppKind, String> {
    if s == "builtin" {
        return Ok(AppKind::Builtin);
    }
    let addr = match s.strip_prefix("unix:") {
        Some(path) => AppAddr::Unix(parse_unix_path(path).map_err(|m| format!("{s:?}: {m}"))?),
        None => {
            let uri: http::Uri = s.parse().map_err(|_| {
                format!("{s:?} is neither \"builtin\", an http:// URL nor unix:/path")
            })?;
            if uri.scheme_str() != Some("http") || uri.authority().is_none() {
                return Err(format!(
                    "{s:?} is neither \"builtin\", an http://host:port URL nor unix:/path (https upstreams are not supported)"
                ));
            }
            AppAddr::Http(uri)
        }
    };
    Ok(AppKind::Upstream(UpstreamApp { addr, idle_timeout }))
}

/// The path of a `unix:` app: absolute (the node may run from any
/// directory), without NUL, at most [`MAX_UNIX_PATH`] bytes. Whether a
/// socket is there is seen when the node connects (the app may start
/// later): a request then gets 502 naming the path.
fn parse_unix_path(path: &str) -> Result<PathBuf, String> {
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

/// The nodes checked so far, indexed by id (ASCII case folded) and by every
/// address they use, so that checking node `i` against the `i` before it
/// costs `O(log i)` instead of `O(i)`: every clash rule of
/// [`addr_problem`] between two nodes needs one address of one to equal one
/// address of the other, so the nodes sharing an address with `a` are the
/// only ones it can clash with. `O(N log N)` over a file of `N` nodes.
#[derive(Default)]
struct NodeIndex {
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
            a.metrics_addr,
        ]
        .into_iter()
        .flatten()
    }

    /// The index of the node indexed first whose id equals `a`'s ignoring
    /// ASCII case.
    fn id_of(&self, a: &NodeAddrs) -> Option<usize> {
        self.ids.get(&a.id.to_ascii_lowercase()).copied()
    }

    /// The indexes of the nodes using an address `a` uses, ascending and
    /// each once (so [`addr_problem`] reports the same first clash as
    /// against all nodes in order).
    fn sharing_an_addr(&self, a: &NodeAddrs) -> Vec<usize> {
        let mut found: Vec<usize> = Self::addrs(a)
            .filter_map(|x| self.addrs.get(&x))
            .flatten()
            .copied()
            .collect();
        found.sort_unstable();
        found.dedup();
        found
    }

    fn insert(&mut self, i: usize, a: &NodeAddrs) {
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
fn addr_problem<'a>(
    a: &NodeAddrs,
    others: impl IntoIterator<Item = (usize, &'a NodeAddrs)>,
) -> Option<(&'static str, String)> {
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
