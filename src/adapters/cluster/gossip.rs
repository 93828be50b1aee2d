//! Membership through chitchat gossip: publish this node's state, watch the
//! live set and turn it into [`Member`] values.
//!
//! Keys each node publishes: `peer_addr`, `http_addr`, `weight`, `status`
//! (`serving` | `draining` | `leaving`), `load` (0..=100, 100 idle),
//! `inflight`. chitchat's phi-accrual detector decides liveness; a member is
//! only considered once it has published `peer_addr`. Every datagram is
//! sealed with the cluster keyring ([`keyring`], `sealed`) and checked
//! against [`bounds`] before chitchat sees it. Gossip stays a hint: the
//! peer layer admits a member to routing only after an mTLS handshake
//! proves its identity.

use crate::adapters::cluster::{bounds, confirm, keyring, signed};

use std::net::SocketAddr;
use std::time::Duration;

use chitchat::transport::Transport;
use chitchat::{ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig, NodeState};
use tokio::sync::watch;
use tracing::warn;

use crate::config::GossipSettings;
use crate::engine::membership::{Member, NodeStatus};
use crate::engine::node_id::NodeId;

/// The tracing target of this module's events: its path before the
/// adapters were put in wings (`crate::adapters::REQUEST_PATH`).
const LOG: &str = "peerlb::adapters::gossip";

/// Who this node is in gossip (its chitchat id and cluster); the tunables
/// come from the config ([`GossipSettings`]).
#[derive(Debug, Clone)]
pub(crate) struct GossipIdentity {
    /// chitchat cluster id (the cluster name).
    pub cluster: String,
    /// This node's id.
    pub node_id: NodeId,
    /// This run's generation (increases on every restart).
    pub generation: u64,
    /// The address peers gossip to (advertised in this node's chitchat id).
    pub gossip_addr: SocketAddr,
    /// The address the transport binds (`gossip_bind`; by default
    /// `gossip_addr`).
    pub listen_addr: SocketAddr,
}

/// The state this node publishes.
#[derive(Debug, Clone)]
pub(crate) struct Published {
    /// Peer QUIC address.
    pub peer_addr: SocketAddr,
    /// Client HTTP address.
    pub http_addr: SocketAddr,
    /// Weight.
    pub weight: u32,
    /// Status.
    pub status: NodeStatus,
}

/// Gossip could not start.
#[derive(Debug, thiserror::Error)]
#[error("gossip on {addr}: {message}")]
pub struct GossipError {
    /// The gossip address.
    pub addr: SocketAddr,
    /// chitchat's message.
    pub message: String,
}

/// Publishes this node's keys (status, load, weight) into gossip, and
/// holds the keyring gossip is sealed with.
#[derive(Clone)]
pub(crate) struct Publisher(
    std::sync::Arc<tokio::sync::Mutex<chitchat::Chitchat>>,
    std::sync::Arc<keyring::GossipKeys>,
    Option<std::sync::Arc<signed::Signatures>>,
);

/// Signs this node's state again (`gossip.state_signatures`), then records
/// its `max_version`.
fn signed_own(
    c: &mut chitchat::Chitchat,
    signatures: Option<&signed::Signatures>,
    keys: &keyring::GossipKeys,
) {
    let id = c.self_chitchat_id().clone();
    let st = c.self_node_state();
    if let Some(s) = signatures {
        s.sign_own(&id, st);
    }
    keys.echo.set_own_version(st.max_version());
}

impl Publisher {
    /// The gossip keyring and drop counters.
    pub(crate) fn keys(&self) -> &std::sync::Arc<keyring::GossipKeys> {
        &self.1
    }

    /// Publishes a new status (e.g. `leaving` on SIGTERM).
    pub(crate) async fn set_status(&self, status: NodeStatus) {
        let mut c = self.0.lock().await;
        c.self_node_state().set("status", status.as_str());
        signed_own(&mut c, self.2.as_deref(), &self.1);
    }

    /// Publishes a new weight (gossip key `weight`, `0..=MAX_WEIGHT`; the
    /// caller checks the range).
    pub(crate) async fn set_weight(&self, weight: u32) {
        let mut c = self.0.lock().await;
        c.self_node_state().set("weight", weight);
        signed_own(&mut c, self.2.as_deref(), &self.1);
    }

    /// Publishes load figures: `load` 0..=100 (100 idle) and requests in flight.
    pub(crate) async fn set_load(&self, load: u8, inflight: u32) {
        let mut c = self.0.lock().await;
        let st = c.self_node_state();
        st.set("load", load.min(100));
        st.set("inflight", inflight);
        signed_own(&mut c, self.2.as_deref(), &self.1);
    }
}

/// A running gossip member.
pub(crate) struct Gossip {
    handle: ChitchatHandle,
    keys: std::sync::Arc<keyring::GossipKeys>,
    members: watch::Receiver<Vec<Member>>,
    republisher: tokio::task::JoinHandle<()>,
    signatures: Option<std::sync::Arc<signed::Signatures>>,
}

/// Starts gossip on `transport` (which opens the UDP socket and seals
/// with `keys`); with `signatures`, this node's state is signed and
/// members' states are checked ([`signed`]).
///
/// # Errors
/// [`GossipError`] when chitchat cannot open its socket.
pub(crate) async fn start(
    who: &GossipIdentity,
    s: &GossipSettings,
    me: &Published,
    transport: &dyn Transport,
    keys: std::sync::Arc<keyring::GossipKeys>,
    signatures: Option<signed::Signatures>,
) -> Result<Gossip, GossipError> {
    // Long: chitchat's configuration, its spawn and the watcher task that turns its live set
    // into members are one sequence, each step using the last; split, the pieces would pass
    // most of these locals to each other.
    let signatures = signatures.map(std::sync::Arc::new);
    let config = ChitchatConfig {
        chitchat_id: ChitchatId::new(who.node_id.to_string(), who.generation, who.gossip_addr),
        cluster_id: who.cluster.clone(),
        gossip_interval: s.interval,
        listen_addr: who.listen_addr,
        seed_nodes: s.seeds.clone(),
        failure_detector_config: FailureDetectorConfig {
            phi_threshold: s.phi_threshold,
            initial_interval: s.interval,
            dead_node_grace_period: s.dead_node_grace,
            sampling_window_size: s.sample_window,
            ..FailureDetectorConfig::default()
        },
        marked_for_deletion_grace_period: Duration::from_secs(3600),
        catchup_callback: None,
        extra_liveness_predicate: Some(Box::new(|st: &NodeState| st.get("peer_addr").is_some())),
        protocol_version: chitchat::ProtocolVersion::V0,
        // A burst of members announced by a key holder past the cap is
        // ignored (dead members make room first), so this node's digest
        // never names more than its peers' bounds take.
        max_nodes: Some(s.max_members),
    };
    let mut initial = vec![
        ("peer_addr".to_owned(), me.peer_addr.to_string()),
        ("http_addr".to_owned(), me.http_addr.to_string()),
        ("weight".to_owned(), me.weight.to_string()),
        ("status".to_owned(), me.status.as_str().to_owned()),
        ("load".to_owned(), "100".to_owned()),
        ("inflight".to_owned(), "0".to_owned()),
    ];
    if let Some(s) = &signatures {
        initial.extend(s.cert_keys());
    }
    let handle = chitchat::spawn_chitchat(config, initial, transport)
        .await
        .map_err(|e| GossipError {
            addr: who.listen_addr,
            message: format!("{e:#}"),
        })?;
    let mut live = {
        let chitchat = handle.chitchat();
        let mut c = chitchat.lock().await;
        signed_own(&mut c, signatures.as_deref(), &keys);
        c.live_nodes_watcher()
    };
    let self_id = ChitchatId::new(who.node_id.to_string(), who.generation, who.gossip_addr);
    let mut confirmed = keys.confirmed.subscribe();
    let mut verified = signed::Verified::default();
    let first = to_members(
        &live.borrow_and_update(),
        &self_id,
        &keys.confirmed,
        signatures.as_deref().map(|s| (s, &mut verified)),
    );
    let (tx, members) = watch::channel(first);
    let confirm_keys = keys.clone();
    let gated = keys.confirmed.is_gated();
    let check = signatures.clone();
    tokio::spawn(async move {
        loop {
            // A member's state held by the signature check's pace
            // (`signed::LOAD_CHECK_PACE`) is judged again when it is due,
            // though nothing else changed.
            let due = verified.next_due();
            let held = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            if gated {
                tokio::select! {
                    biased;
                    r = live.changed() => if r.is_err() { return },
                    // A member's gossip address was confirmed: it may be
                    // dialled now (no change of the live set says so).
                    _ = confirmed.changed() => {}
                    () = held => {}
                }
            } else {
                tokio::select! {
                    biased;
                    // Not gated (the simulation's transport): every address
                    // counts as confirmed.
                    r = live.changed() => if r.is_err() { return },
                    () = held => {}
                }
            }
            let m = to_members(
                &live.borrow_and_update(),
                &self_id,
                &confirm_keys.confirmed,
                check.as_deref().map(|s| (s, &mut verified)),
            );
            if tx.send(m).is_err() {
                return;
            }
        }
    });
    let republisher = tokio::spawn(republish_over_echoes(
        std::sync::Arc::downgrade(&handle.chitchat()),
        keys.clone(),
        s.interval * bounds::REPUBLISH_PAUSE_ROUNDS,
        signatures.clone(),
    ));
    Ok(Gossip {
        handle,
        keys,
        members,
        republisher,
        signatures,
    })
}

/// Whenever a peer's digest names this node with a heartbeat or version
/// above its own ([`bounds::SelfEcho`]: forged state about it that the
/// peer took), republishes over it (see [`republish`]), then waits
/// `pause` ([`bounds::REPUBLISH_PAUSE_ROUNDS`] gossip rounds) before the
/// next step, so its peers' budgets ([`bounds::Lead`]) take every step.
/// Ends with chitchat.
async fn republish_over_echoes(
    chitchat: std::sync::Weak<tokio::sync::Mutex<chitchat::Chitchat>>,
    keys: std::sync::Arc<keyring::GossipKeys>,
    pause: Duration,
    signatures: Option<std::sync::Arc<signed::Signatures>>,
) {
    loop {
        keys.echo.grown().await;
        let Some(chitchat) = chitchat.upgrade() else {
            return;
        };
        let (heartbeat, version) = keys.echo.take();
        let mut c = chitchat.lock().await;
        let republished = republish(&mut c, heartbeat, version);
        signed_own(&mut c, signatures.as_deref(), &keys);
        drop(c);
        drop(chitchat);
        if republished {
            warn!(target: LOG,
                heartbeat,
                version,
                "a peer holds forged gossip state about this node: republished this node's own state over it"
            );
            tokio::time::sleep(pause).await;
        }
    }
}

/// Moves this node's heartbeat past `heartbeat` and, when `version` is
/// above its `max_version`, sets every key again at a new version past
/// `version` (values unchanged), so that peers holding forged state about
/// this node (up to those figures) take its real state and heartbeats
/// again. One call moves at most [`bounds::REPUBLISH_HEARTBEAT_STEP`] and
/// [`bounds::REPUBLISH_VERSION_STEP`] ahead: peers take such a jump, and
/// a key holder's digest naming this node with 2^40 sent to it directly
/// cannot push its figures past the bounds (peers that really hold a
/// figure further ahead keep echoing it, and each echo moves one step
/// closer). True when something changed. chitchat offers no setter for a
/// key's version or a heartbeat value: the versions move through
/// `set_max_version` then a delete and set of each key (only the set, at
/// the newest version, is ever sent), the heartbeat through
/// `try_set_heartbeat` with a [`chitchat::Heartbeat`] built by its serde
/// form (a bare integer).
fn republish(c: &mut chitchat::Chitchat, heartbeat: u64, version: u64) -> bool {
    let st = c.self_node_state();
    let mut changed = false;
    // An honest peer echoes at most this node's own heartbeat (equal when
    // it answers before this node's next increment).
    let own_heartbeat = u64::from(st.heartbeat());
    if heartbeat > own_heartbeat {
        let target = heartbeat.min(own_heartbeat + bounds::REPUBLISH_HEARTBEAT_STEP - 1);
        let next = serde_json::Value::from(target + 1);
        if let Ok(h) = serde_json::from_value::<chitchat::Heartbeat>(next) {
            changed |= st.try_set_heartbeat(h);
        }
    }
    if version > st.max_version() {
        let version = version.min(st.max_version() + bounds::REPUBLISH_VERSION_STEP);
        let kvs: Vec<(String, String)> = st
            .key_values()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        st.set_max_version(version);
        for (k, v) in kvs {
            st.delete(&k);
            st.set(k, v);
        }
        changed = true;
    }
    changed
}

/// The live members to hand on: this node, and every other whose gossip
/// address is confirmed ([`confirm`]); a live member not confirmed is
/// asked to be probed, and left out until it answers (it would be
/// dialled: a ghost with a third party's peer address would turn every
/// node into a source of QUIC Initials aimed at that party).
fn to_members(
    live: &std::collections::BTreeMap<ChitchatId, NodeState>,
    self_id: &ChitchatId,
    confirmed: &confirm::Confirmed,
    mut signatures: Option<(&signed::Signatures, &mut signed::Verified)>,
) -> Vec<Member> {
    if let Some((_, verified)) = &mut signatures {
        verified.retain_live(live);
    }
    live.iter()
        .filter(|(id, _)| {
            let ok = *id == self_id || confirmed.is_confirmed(id.gossip_advertise_addr);
            if !ok {
                confirmed.want_probe(id.gossip_advertise_addr, tokio::time::Instant::now());
            }
            ok
        })
        .filter_map(|(id, st)| match member(id, st) {
            Ok(m) => match &mut signatures {
                // This node's own state is its own.
                Some((s, verified)) if id != self_id => {
                    verified.judge(s, id, st, m, tokio::time::Instant::now())
                }
                _ => Some(m),
            },
            Err(key) => {
                warn!(target: LOG, node = %id.node_id, key, "ignoring member with a missing or invalid key");
                None
            }
        })
        .collect()
}

fn member(id: &ChitchatId, st: &NodeState) -> Result<Member, &'static str> {
    fn get<T: std::str::FromStr>(st: &NodeState, key: &'static str) -> Result<T, &'static str> {
        st.get(key).and_then(|v| v.parse().ok()).ok_or(key)
    }
    Ok(Member {
        id: NodeId::from(&*id.node_id),
        generation: id.generation_id,
        peer_addr: get(st, "peer_addr")?,
        http_addr: get(st, "http_addr")?,
        weight: get(st, "weight")?,
        status: get(st, "status")?,
        load: get::<u8>(st, "load")?.min(100),
        inflight: get(st, "inflight")?,
    })
}

impl Gossip {
    /// The live members (this node included), updated on every change.
    pub(crate) fn members(&self) -> watch::Receiver<Vec<Member>> {
        self.members.clone()
    }

    /// A clonable handle that publishes this node's state.
    pub(crate) fn publisher(&self) -> Publisher {
        Publisher(
            self.handle.chitchat(),
            self.keys.clone(),
            self.signatures.clone(),
        )
    }

    /// Stops gossiping.
    pub(crate) async fn shutdown(self) {
        self.republisher.abort();
        if let Err(e) = self.handle.shutdown().await {
            warn!(target: LOG, error = %e, "gossip shutdown");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn chitchat() -> chitchat::Chitchat {
        let addr: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        let config = ChitchatConfig {
            chitchat_id: ChitchatId::new("n1".to_owned(), 1, addr),
            cluster_id: "c".into(),
            gossip_interval: Duration::from_millis(100),
            listen_addr: addr,
            seed_nodes: vec![],
            failure_detector_config: FailureDetectorConfig::default(),
            marked_for_deletion_grace_period: Duration::from_secs(3600),
            catchup_callback: None,
            extra_liveness_predicate: None,
            protocol_version: chitchat::ProtocolVersion::V0,
            max_nodes: None,
        };
        let (_, seeds) = watch::channel(HashSet::new());
        chitchat::Chitchat::with_chitchat_id_and_seeds(
            config,
            seeds,
            vec![
                ("status".into(), "serving".into()),
                ("load".into(), "7".into()),
            ],
        )
    }

    /// A V0 Syn of cluster `c` whose digest names `members` (node id,
    /// heartbeat), each of generation 1 at 127.0.0.1:9000.
    fn syn(members: &[(String, u64)]) -> Vec<u8> {
        let mut b = 0xB053u16.to_le_bytes().to_vec();
        b.extend([0, 0]);
        b.extend((members.len() as u16).to_le_bytes());
        for (node, heartbeat) in members {
            b.extend((node.len() as u16).to_le_bytes());
            b.extend(node.as_bytes());
            b.extend(1u64.to_le_bytes());
            b.extend([4, 127, 0, 0, 1]);
            b.extend(9000u16.to_le_bytes());
            b.extend(heartbeat.to_le_bytes());
            b.extend(0u64.to_le_bytes());
            b.extend(0u64.to_le_bytes());
        }
        b.extend(1u16.to_le_bytes());
        b.extend(b"c");
        b
    }

    /// A key holder announcing far more members than `gossip.max_members`
    /// (here 4) gets at most the free places (and dead members' places):
    /// this node's digest never names more than its peers' bounds take
    /// (they would refuse its every message: isolated for half an hour,
    /// the dead node grace), and a live member keeps its place through
    /// bursts.
    #[tokio::test]
    async fn a_burst_of_members_past_the_cap_leaves_the_digest_within_it_and_live_members_in() {
        // chitchat's own UDP transport (no seal) on a free loopback port.
        let addr = std::net::UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .unwrap();
        let transport = chitchat::transport::UdpTransport;
        let who = GossipIdentity {
            cluster: "c".into(),
            node_id: NodeId::from("n1"),
            generation: 1,
            gossip_addr: addr,
            listen_addr: addr,
        };
        let settings = GossipSettings {
            seeds: vec![],
            interval: Duration::from_millis(100),
            phi_threshold: 8.0,
            dead_node_grace: Duration::from_secs(3600),
            max_members: 4,
            sample_window: 100,
            state_signatures: crate::config::StateSignatures::Off,
        };
        let me = Published {
            peer_addr: "127.0.0.1:7001".parse().unwrap(),
            http_addr: "127.0.0.1:7002".parse().unwrap(),
            weight: 1,
            status: NodeStatus::Serving,
        };
        let keys = std::sync::Arc::new(keyring::GossipKeys::new(keyring::Keyring::single(
            keyring::GossipKey::from_bytes([1; 32]),
        )));
        let g = start(&who, &settings, &me, &transport, keys, None)
            .await
            .unwrap();
        let attacker = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        // Sends a Syn and returns how many members the answer (a SynAck)
        // names in its digest.
        let exchange = async |members: &[(String, u64)]| {
            attacker.send_to(&syn(members), addr).await.unwrap();
            let mut answer = vec![0u8; 65_536];
            let wait = Duration::from_secs(10);
            let (n, _) = tokio::time::timeout(wait, attacker.recv_from(&mut answer))
                .await
                .expect("a SynAck")
                .unwrap();
            assert!(n >= 6 && answer[3] == 1, "not a SynAck");
            usize::from(u16::from_le_bytes([answer[4], answer[5]]))
        };
        let m = |h| ("m".to_owned(), h);
        let burst = |h| -> Vec<(String, u64)> {
            std::iter::once(m(h))
                .chain((0..60).map(|i| (format!("ghost{i}"), 1)))
                .collect()
        };
        // `m` beats every round and is live; three more rounds of bursts.
        for h in 1..=6u64 {
            let members = if h <= 3 { vec![m(h)] } else { burst(h) };
            let named = exchange(&members).await;
            assert!(named <= 4, "the digest names {named} members");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let c = g.handle.chitchat();
        let c = c.lock().await;
        assert!(c.node_states().len() <= 4, "{:?}", c.node_states().keys());
        let m_id = ChitchatId::new("m".to_owned(), 1, "127.0.0.1:9000".parse().unwrap());
        assert!(
            c.node_state(&m_id).is_some(),
            "the live member was pushed out"
        );
        assert!(
            c.live_nodes().any(|id| *id == m_id),
            "the live member is not live"
        );
    }

    /// Three nodes on the sealed transport, `b` and `c` seeded with `a`
    /// only: `b` and `c` learn of each other from `a`, are not each
    /// other's seeds and have not heard from each other, so neither would
    /// send the other gossip or dial it; the probe ([`confirm`]) makes
    /// them confirm each other, and each hands the other on as a member.
    #[tokio::test]
    async fn members_that_are_not_seeds_of_each_other_confirm_each_other_by_probe() {
        use crate::adapters::cluster::sealed::SealedUdpTransport;
        let free = || {
            std::net::UdpSocket::bind("127.0.0.1:0")
                .and_then(|s| s.local_addr())
                .unwrap()
        };
        let (a, b, c) = (free(), free(), free());
        let mut nodes = Vec::new();
        for (name, addr, seeds) in [
            ("a", a, vec![]),
            ("b", b, vec![a.to_string()]),
            ("c", c, vec![a.to_string()]),
        ] {
            let who = GossipIdentity {
                cluster: "c".into(),
                node_id: NodeId::from(name),
                generation: 1,
                gossip_addr: addr,
                listen_addr: addr,
            };
            let settings = GossipSettings {
                seeds: seeds.clone(),
                interval: Duration::from_millis(50),
                phi_threshold: 8.0,
                dead_node_grace: Duration::from_secs(3600),
                max_members: 8,
                sample_window: 100,
                state_signatures: crate::config::StateSignatures::Off,
            };
            let me = Published {
                peer_addr: addr,
                http_addr: addr,
                weight: 1,
                status: NodeStatus::Serving,
            };
            let keys = std::sync::Arc::new(keyring::GossipKeys::new(keyring::Keyring::single(
                keyring::GossipKey::from_bytes([1; 32]),
            )));
            let bounds = std::sync::Arc::new(bounds::Bounds::new(name, 1, 8, settings.interval));
            let transport = SealedUdpTransport::new(keys.clone(), bounds, seeds);
            nodes.push(
                start(&who, &settings, &me, &transport, keys, None)
                    .await
                    .unwrap(),
            );
        }
        let ids = |g: &Gossip| -> Vec<String> {
            let mut v: Vec<String> = g
                .members()
                .borrow()
                .iter()
                .map(|m| m.id.to_string())
                .collect();
            v.sort();
            v
        };
        let all = vec!["a".to_owned(), "b".to_owned(), "c".to_owned()];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while nodes.iter().any(|g| ids(g) != all) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "members: {:?}",
                nodes.iter().map(ids).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for g in nodes {
            g.shutdown().await;
        }
    }

    /// Echoes of a forged heartbeat arriving many times a round move this
    /// node one step per pause, never faster than its peers' budgets
    /// ([`bounds::Lead`]) earn: a republish per echo would make them
    /// refuse this node's own datagrams.
    #[tokio::test(start_paused = true)]
    async fn republishing_steps_once_per_pause_however_many_echoes() {
        let c = std::sync::Arc::new(tokio::sync::Mutex::new(chitchat()));
        let keys = std::sync::Arc::new(keyring::GossipKeys::new(keyring::Keyring::single(
            keyring::GossipKey::from_bytes([1; 32]),
        )));
        let h0 = u64::from(c.lock().await.self_node_state().heartbeat());
        let pause = Duration::from_millis(400);
        let task = tokio::spawn(republish_over_echoes(
            std::sync::Arc::downgrade(&c),
            keys.clone(),
            pause,
            None,
        ));
        let heartbeat = async || u64::from(c.lock().await.self_node_state().heartbeat());
        for _ in 0..20 {
            keys.echo.see(1 << 30, 0);
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(pause / 4).await;
        assert_eq!(heartbeat().await, h0 + bounds::REPUBLISH_HEARTBEAT_STEP);
        keys.echo.see(1 << 30, 0);
        tokio::time::sleep(pause).await;
        assert_eq!(heartbeat().await, h0 + 2 * bounds::REPUBLISH_HEARTBEAT_STEP);
        task.abort();
    }

    #[test]
    fn republishing_moves_own_heartbeat_and_every_key_past_the_forged_figures() {
        let mut c = chitchat();
        let st = c.self_node_state();
        let (h0, v0) = (u64::from(st.heartbeat()), st.max_version());
        // Figures at or below its own change nothing (an honest echo).
        assert!(!republish(&mut c, h0, v0));
        assert!(!republish(&mut c, h0 - 1, v0 - 1));
        assert_eq!(c.self_node_state().max_version(), v0);
        assert!(republish(&mut c, h0 + 300, v0 + 1000));
        let st = c.self_node_state();
        assert_eq!(u64::from(st.heartbeat()), h0 + 301);
        let v1 = st.max_version();
        for key in ["status", "load"] {
            let v = st.get_versioned(key).unwrap();
            assert!(v.version > v0 + 1000, "{key} at {}", v.version);
            assert!(!v.is_deleted(), "{key}");
        }
        // A figure far ahead (a lie sent to this node directly) moves it
        // one step only, so its peers still take its figures.
        assert!(republish(&mut c, 1 << 40, 1 << 40));
        let st = c.self_node_state();
        assert_eq!(
            u64::from(st.heartbeat()),
            h0 + 301 + bounds::REPUBLISH_HEARTBEAT_STEP
        );
        let v2 = st.max_version();
        assert!(
            v2 > v1 + bounds::REPUBLISH_VERSION_STEP
                && v2 < v1 + bounds::REPUBLISH_VERSION_STEP + 10,
            "{v1} -> {v2}"
        );
        assert_eq!(st.get("status"), Some("serving"));
        assert_eq!(st.get("load"), Some("7"));
        assert_eq!(st.num_key_values(), 2);
    }
}
