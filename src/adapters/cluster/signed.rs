//! Signed gossip state (`gossip.state_signatures`): each node signs its
//! own state with the private key of its node certificate (a
//! [`SignState`]: the TLS layer's `StateSigner`) and publishes the signature and the certificate
//! as keys of that state; a member's state is taken only when the
//! signature is the key's of a certificate the cluster CA vouches for and
//! that names the member (a [`CheckState`]: the TLS layer's
//! `StateVerifier`, handed in by the node, so this wing does not reach up
//! into the transport's). A holder of the gossip
//! key without a node's private key cannot then speak for that node.
//!
//! Fitting chitchat's model (versioned key-values per node, sent as
//! deltas): the signature is one more key, [`SIG_KEY`], over
//! [`canonical`] bytes of the node's id, generation and every other live
//! key with its value and version; it is set again after every change,
//! so it is always the node's newest key and a delta carries it after the
//! keys it covers (chitchat sends a node's keys in version order). The
//! certificate is DER in base64 over the keys `cert.0`, `cert.1`, ...
//! ([`MAX_CERT_KEYS`] at most, each at most [`CERT_CHUNK`] characters:
//! the gossip bounds' longest value). A receiver checks a member's state
//! whenever its `max_version` changed ([`Verified`]; a change of its load
//! figures alone at most once per [`LOAD_CHECK_PACE_PER_MEMBER`] per
//! member of the cluster, since every busy node republishes them each
//! gossip interval): a state that fails
//! (forged, or caught mid-delta) keeps the member as it was last verified
//! (`require`) or is taken with a warning (`sign`, for a rolling upgrade).
//! Heartbeats are not signed (chitchat carries them in digests, not in a
//! node's keys): liveness stays with the gossip bounds.

use std::collections::BTreeMap;

use base64::Engine as _;
use chitchat::{ChitchatId, NodeState};
use tracing::{debug, warn};

use crate::engine::membership::Member;

/// The tracing target of this module's events (rate limited with the
/// gossip layer's, `cli/log_limit.rs`).
const LOG: &str = "peerlb::adapters::gossip::signed";

/// The key holding a node's signature over its other keys.
pub(crate) const SIG_KEY: &str = "sig";
/// The prefix of the keys holding its certificate (`cert.0`, ...).
const CERT_PREFIX: &str = "cert.";
/// Most certificate keys read.
pub(crate) const MAX_CERT_KEYS: usize = 8;
/// Characters of base64 per certificate key.
pub(crate) const CERT_CHUNK: usize = 256;

/// A signature over a state: the scheme (its TLS `SignatureScheme` code
/// point) and the bytes (DER for ECDSA).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateSignature {
    /// The TLS `SignatureScheme` code point.
    pub scheme: u16,
    /// The signature bytes.
    pub bytes: Vec<u8>,
}

/// Signs this node's state: the node certificate's key
/// (`transport::tls::StateSigner`).
pub(crate) trait SignState: Send + Sync + std::fmt::Debug {
    /// The signature over `state`.
    ///
    /// # Errors
    /// Why the key did not sign, for the log.
    fn sign(&self, state: &[u8]) -> Result<StateSignature, String>;
    /// This node's end-entity certificate (DER), published with the state.
    fn certificate(&self) -> &[u8];
}

/// Checks a member's state signature against the cluster CA
/// (`transport::tls::StateVerifier`).
pub(crate) trait CheckState: Send + Sync + std::fmt::Debug {
    /// Whether `cert` (DER) chains to the cluster CA, names `node_id`, and
    /// its key made `sig` over `state`.
    ///
    /// # Errors
    /// What is wrong, for the log.
    fn verify(
        &self,
        node_id: &str,
        cert: &[u8],
        state: &[u8],
        sig: &StateSignature,
    ) -> Result<(), String>;
}

/// This node's signer and the check of members' signatures.
#[derive(Debug)]
pub(crate) struct Signatures {
    signer: Box<dyn SignState>,
    verifier: Box<dyn CheckState>,
    require: bool,
}

impl Signatures {
    /// This node's `signer` and the `verifier` of members' states;
    /// `require`: a state that fails is not taken (`gossip.state_signatures
    /// = "require"`), else it is taken with a warning (`"sign"`).
    pub(crate) fn new(
        signer: Box<dyn SignState>,
        verifier: Box<dyn CheckState>,
        require: bool,
    ) -> Signatures {
        Signatures {
            signer,
            verifier,
            require,
        }
    }

    /// The certificate keys of this node's state (`cert.0`, ...).
    pub(crate) fn cert_keys(&self) -> Vec<(String, String)> {
        let b64 = base64::engine::general_purpose::STANDARD.encode(self.signer.certificate());
        b64.as_bytes()
            .chunks(CERT_CHUNK)
            .enumerate()
            .map(|(i, c)| {
                (
                    format!("{CERT_PREFIX}{i}"),
                    String::from_utf8_lossy(c).into_owned(),
                )
            })
            .collect()
    }

    /// Signs this node's state `st` (its id `id`) again: sets [`SIG_KEY`].
    pub(crate) fn sign_own(&self, id: &ChitchatId, st: &mut NodeState) {
        match self.signer.sign(&canonical(id, st)) {
            Ok(sig) => st.set(SIG_KEY, encode(&sig)),
            Err(e) => warn!(target: LOG, error = %e, "gossip state not signed"),
        }
    }

    /// Checks member `id`'s state `st`.
    ///
    /// # Errors
    /// What is missing or wrong, for the log.
    pub(crate) fn verify(&self, id: &ChitchatId, st: &NodeState) -> Result<(), String> {
        let mut b64 = String::new();
        for i in 0..MAX_CERT_KEYS {
            match st.get(&format!("{CERT_PREFIX}{i}")) {
                Some(c) => b64.push_str(c),
                None => break,
            }
        }
        if b64.is_empty() {
            return Err("no certificate".into());
        }
        let der = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| "certificate not base64")?;
        let sig = st
            .get(SIG_KEY)
            .and_then(decode)
            .ok_or("no signature, or a malformed one")?;
        self.verifier
            .verify(&id.node_id, &der, &canonical(id, st), &sig)
    }
}

/// The bytes a state signature covers: the node id, its generation, then
/// every live key but [`SIG_KEY`] in key order with its value and version
/// (strings as a u32 length and the bytes, integers little-endian).
pub(crate) fn canonical(id: &ChitchatId, st: &NodeState) -> Vec<u8> {
    fn put(b: &mut Vec<u8>, s: &str) {
        b.extend((s.len() as u32).to_le_bytes());
        b.extend(s.as_bytes());
    }
    let mut b = Vec::new();
    put(&mut b, &id.node_id);
    b.extend(id.generation_id.to_le_bytes());
    let mut kvs: Vec<(&str, &str, u64)> = st
        .key_values()
        .filter(|(k, _)| *k != SIG_KEY)
        .map(|(k, v)| (k, v, st.get_versioned(k).map_or(0, |vv| vv.version)))
        .collect();
    kvs.sort_unstable();
    for (k, v, version) in kvs {
        put(&mut b, k);
        put(&mut b, v);
        b.extend(version.to_le_bytes());
    }
    b
}

/// True when a key of `st` is newer than its signature (or it has none).
fn incomplete(st: &NodeState) -> bool {
    let Some(sig) = st.get_versioned(SIG_KEY).filter(|v| !v.is_deleted()) else {
        return true;
    };
    st.key_values()
        .any(|(k, _)| k != SIG_KEY && st.get_versioned(k).is_some_and(|v| v.version > sig.version))
}

fn encode(sig: &StateSignature) -> String {
    format!(
        "{:04x}:{}",
        sig.scheme,
        base64::engine::general_purpose::STANDARD.encode(&sig.bytes)
    )
}

fn decode(v: &str) -> Option<StateSignature> {
    let (scheme, b64) = v.split_once(':')?;
    Some(StateSignature {
        scheme: u16::from_str_radix(scheme, 16).ok()?,
        bytes: base64::engine::general_purpose::STANDARD.decode(b64).ok()?,
    })
}

/// How often a member's state is checked when only its load figures
/// (`load`, `inflight`) changed, per member of the cluster: at most once
/// per `members x` this. Every node republishes its load figures each
/// gossip interval under load, and a check costs one ECDSA verification
/// (about 85 us, `benches/signatures.rs`), so checking every change would
/// cost a node `N` checks per interval in a busy cluster of `N` (at 1,000
/// nodes, 5,000 checks a second: 43 % of a core). Paced so, a node makes
/// at most 200 load checks a second whatever `N` (1.7 % of a core), and a
/// small cluster is not paced at all (3 members: 15 ms, under the gossip
/// interval); a member's load figures are then up to `N x 5 ms` old (0.5 s
/// at 100 nodes, 5 s at 1,000). A change of anything else (status,
/// weight, addresses, generation) is checked at once; a load change within
/// the pace is held as last verified (under `require`) and checked when
/// the pace allows ([`Verified::next_due`]).
pub(crate) const LOAD_CHECK_PACE_PER_MEMBER: std::time::Duration =
    std::time::Duration::from_millis(5);

/// One member as last judged.
#[derive(Debug)]
struct Judged {
    /// The `max_version` its state had when judged.
    version: u64,
    /// The member as last verified (`None`: never).
    member: Option<Member>,
    /// When its state was last checked.
    checked: tokio::time::Instant,
    /// A newer state, held for the pace, is waiting to be checked.
    pending: bool,
}

/// Members as last verified, each with the `max_version` its state had
/// when judged (a `BTreeMap`: no hash keys drawn, see `confirm.rs`), and
/// the pace of load checks ([`LOAD_CHECK_PACE_PER_MEMBER`] times the live
/// members at the last [`Verified::retain_live`]).
#[derive(Debug, Default)]
pub(crate) struct Verified {
    judged: BTreeMap<ChitchatId, Judged>,
    pace: std::time::Duration,
}

/// Whether `a` and `b` differ in their load figures only.
fn load_only(a: &Member, b: &Member) -> bool {
    Member {
        load: b.load,
        inflight: b.inflight,
        ..a.clone()
    } == *b
}

impl Verified {
    /// The member to hand on for `id` whose state is `st` and would give
    /// `member`, at `now`: `member` when the state verifies (checked once
    /// per `max_version`, and a change of the load figures alone at most
    /// once per pace, [`LOAD_CHECK_PACE_PER_MEMBER`] per live member); otherwise, under `require`, the
    /// member as last verified (none if never), and under `sign` `member`
    /// anyway.
    pub(crate) fn judge(
        &mut self,
        s: &Signatures,
        id: &ChitchatId,
        st: &NodeState,
        member: Member,
        now: tokio::time::Instant,
    ) -> Option<Member> {
        let version = st.max_version();
        let pace = self.pace;
        if let Some(j) = self.judged.get_mut(id) {
            if j.version == version && !j.pending {
                return if s.require {
                    j.member.clone()
                } else {
                    Some(member)
                };
            }
            let paced = j
                .member
                .as_ref()
                .is_some_and(|last| load_only(last, &member))
                && now < j.checked + pace;
            if paced {
                j.version = version;
                j.pending = true;
                return if s.require {
                    j.member.clone()
                } else {
                    Some(member)
                };
            }
        }
        let last = self.judged.get(id).and_then(|j| j.member.clone());
        let (taken, verified) = match s.verify(id, st) {
            Ok(()) => (Some(member.clone()), Some(member)),
            Err(why) if incomplete(st) => {
                // A key newer than the signature: the rest of an honest
                // delta is on its way (or a forgery without a signature:
                // taken no more than an incomplete one).
                debug!(target: LOG, node = %id.node_id, version, why, require = s.require,
                    "a member's gossip state is not signed yet");
                (
                    if s.require {
                        last.clone()
                    } else {
                        Some(member)
                    },
                    last,
                )
            }
            Err(why) => {
                warn!(target: LOG, node = %id.node_id, version, why, require = s.require,
                    "a member's gossip state is not signed by its certificate's key: forged");
                (
                    if s.require {
                        last.clone()
                    } else {
                        Some(member)
                    },
                    last,
                )
            }
        };
        self.judged.insert(
            id.clone(),
            Judged {
                version,
                member: verified,
                checked: now,
                pending: false,
            },
        );
        taken
    }

    /// When the earliest held state may be checked (`None`: none is held);
    /// the gossip task judges again then.
    pub(crate) fn next_due(&self) -> Option<tokio::time::Instant> {
        self.judged
            .values()
            .filter(|j| j.pending)
            .map(|j| j.checked + self.pace)
            .min()
    }

    /// Forgets members not in `live`, and paces load checks for as many
    /// members as `live` holds.
    pub(crate) fn retain_live(&mut self, live: &BTreeMap<ChitchatId, NodeState>) {
        self.judged.retain(|id, _| live.contains_key(id));
        self.pace = LOAD_CHECK_PACE_PER_MEMBER * u32::try_from(live.len()).unwrap_or(u32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::net::SocketAddr;
    use std::time::Duration;

    use chitchat::{ChitchatConfig, FailureDetectorConfig};
    use tokio::sync::watch;

    use super::*;
    use crate::adapters::transport::tls;
    use crate::config::StateSignatures;
    use crate::engine::membership::NodeStatus;
    use crate::engine::node_id::NodeId;

    fn material(certs: &tls::GeneratedCerts, id: &str) -> tls::TlsMaterial {
        let (_, cert, key) = certs.nodes.iter().find(|(n, _, _)| n == id).unwrap();
        tls::TlsMaterial::load(&certs.ca_cert, cert, key).unwrap()
    }

    /// Node `id`'s own chitchat state after it signed it with `s`.
    fn signed_state(id: &ChitchatId, s: &Signatures) -> NodeState {
        let config = ChitchatConfig {
            chitchat_id: id.clone(),
            cluster_id: "c".into(),
            gossip_interval: Duration::from_millis(100),
            listen_addr: id.gossip_advertise_addr,
            seed_nodes: vec![],
            failure_detector_config: FailureDetectorConfig::default(),
            marked_for_deletion_grace_period: Duration::from_secs(3600),
            catchup_callback: None,
            extra_liveness_predicate: None,
            protocol_version: chitchat::ProtocolVersion::V0,
            max_nodes: None,
        };
        let (_, seeds) = watch::channel(HashSet::new());
        let mut kvs = vec![
            ("status".to_owned(), "serving".to_owned()),
            ("load".to_owned(), "100".to_owned()),
        ];
        kvs.extend(s.cert_keys());
        let mut c = chitchat::Chitchat::with_chitchat_id_and_seeds(config, seeds, kvs);
        let st = c.self_node_state();
        s.sign_own(id, st);
        st.clone()
    }

    fn member(st: &NodeState) -> Member {
        Member {
            id: NodeId::from("n2"),
            generation: 1,
            peer_addr: "127.0.0.1:1".parse().unwrap(),
            http_addr: "127.0.0.1:2".parse().unwrap(),
            weight: 100,
            status: st.get("status").unwrap().parse().unwrap(),
            load: 100,
            inflight: 0,
        }
    }

    /// A key holder's forged state for n2 (a value changed, as its delta
    /// would set it: a new version, no valid signature) is refused under
    /// `require`, n2 staying as last verified; n1's key cannot sign for
    /// n2, nor can a certificate of another CA naming n2.
    #[test]
    fn a_members_signed_state_is_taken_and_forged_or_foreign_state_is_not() {
        let dir = std::env::temp_dir().join(format!("peerlb-signed-{}", std::process::id()));
        let foreign_dir = dir.join("foreign");
        let _ = std::fs::remove_dir_all(&dir);
        let certs = tls::generate(&dir, "c1", &["n1", "n2"]).unwrap();
        let foreign = tls::generate(&foreign_dir, "c2", &["n2"]).unwrap();
        let mode = StateSignatures::Require;
        let n1 = tls::state_signatures(mode, &material(&certs, "n1"))
            .unwrap()
            .unwrap();
        let n2 = tls::state_signatures(mode, &material(&certs, "n2"))
            .unwrap()
            .unwrap();
        let impostor = tls::state_signatures(mode, &material(&foreign, "n2"))
            .unwrap()
            .unwrap();
        let addr: SocketAddr = "127.0.0.1:7002".parse().unwrap();
        let id = ChitchatId::new("n2".to_owned(), 1, addr);

        let t0 = tokio::time::Instant::now();
        let st = signed_state(&id, &n2);
        n1.verify(&id, &st).unwrap();
        let mut seen = Verified::default();
        let first = seen.judge(&n1, &id, &st, member(&st), t0).unwrap();
        assert_eq!(first.status, NodeStatus::Serving);

        // Forged: n2 leaving, at a new version, the old signature.
        let mut forged = st.clone();
        forged.set("status", "leaving");
        assert!(n1.verify(&id, &forged).is_err());
        let kept = seen.judge(&n1, &id, &forged, member(&forged), t0).unwrap();
        assert_eq!(
            kept.status,
            NodeStatus::Serving,
            "the forged state was taken"
        );
        // Signed again with n1's key (a member and key holder): refused.
        n1.sign_own(&id, &mut forged);
        assert!(n1.verify(&id, &forged).is_err());
        // n2's own later change, signed: taken.
        let mut real = st.clone();
        real.set("status", "draining");
        n2.sign_own(&id, &mut real);
        let later = seen.judge(&n1, &id, &real, member(&real), t0).unwrap();
        assert_eq!(later.status, NodeStatus::Draining);

        // Another CA's "n2", never verified: not taken at all.
        let other = signed_state(&id, &impostor);
        let e = n1.verify(&id, &other).unwrap_err();
        assert!(e.contains("not trusted"), "{e}");
        let mut fresh = Verified::default();
        assert_eq!(fresh.judge(&n1, &id, &other, member(&other), t0), None);
        // Unsigned state: not taken under `require`, taken under `sign`.
        let mut bare = st.clone();
        bare.delete(SIG_KEY);
        assert_eq!(fresh.judge(&n1, &id, &bare, member(&bare), t0), None);
        let lenient = tls::state_signatures(StateSignatures::Sign, &material(&certs, "n1"))
            .unwrap()
            .unwrap();
        assert!(
            Verified::default()
                .judge(&lenient, &id, &bare, member(&bare), t0)
                .is_some()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A change of a member's load figures alone is checked at most once
    /// per pace ([`LOAD_CHECK_PACE_PER_MEMBER`] per live member: 1 s at
    /// 200): held as last verified before it (and [`Verified::next_due`]
    /// says when), taken once checked; a change of status is checked at
    /// once. With 3 members the pace is 15 ms.
    #[test]
    fn a_load_change_is_checked_at_the_pace_and_a_status_change_at_once() {
        let dir = std::env::temp_dir().join(format!("peerlb-paced-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let certs = tls::generate(&dir, "c1", &["n1", "n2"]).unwrap();
        let mode = StateSignatures::Require;
        let n1 = tls::state_signatures(mode, &material(&certs, "n1"))
            .unwrap()
            .unwrap();
        let n2 = tls::state_signatures(mode, &material(&certs, "n2"))
            .unwrap()
            .unwrap();
        let id = ChitchatId::new("n2".to_owned(), 1, "127.0.0.1:7002".parse().unwrap());
        let with_load = |st: &NodeState| Member {
            load: st.get("load").unwrap().parse().unwrap(),
            ..member(st)
        };
        let t0 = tokio::time::Instant::now();
        let mut seen = Verified::default();
        // 200 live members: n2 and 199 others (the pace counts them).
        let live: BTreeMap<ChitchatId, NodeState> = std::iter::once(id.clone())
            .chain((0..199u16).map(|i| {
                let a = SocketAddr::from(([127, 0, 0, 1], 10_000 + i));
                ChitchatId::new(format!("m{i}"), 1, a)
            }))
            .map(|m| (m, NodeState::for_test()))
            .collect();
        seen.retain_live(&live);
        let pace = Duration::from_secs(1);
        let mut st = signed_state(&id, &n2);
        assert_eq!(
            seen.judge(&n1, &id, &st, with_load(&st), t0).unwrap().load,
            100
        );
        assert_eq!(seen.next_due(), None);

        // n2's load changes, signed, 0.2 s later: held at 100 for the pace.
        st.set("load", "40");
        n2.sign_own(&id, &mut st);
        let soon = t0 + Duration::from_millis(200);
        assert_eq!(
            seen.judge(&n1, &id, &st, with_load(&st), soon)
                .unwrap()
                .load,
            100
        );
        assert_eq!(seen.next_due(), Some(t0 + pace));
        // Due: checked and taken, nothing held.
        let due = t0 + pace;
        assert_eq!(
            seen.judge(&n1, &id, &st, with_load(&st), due).unwrap().load,
            40
        );
        assert_eq!(seen.next_due(), None);

        // A forged load after the pace is refused when checked.
        let mut forged = st.clone();
        forged.set("load", "0");
        let later = due + pace;
        assert_eq!(
            seen.judge(&n1, &id, &forged, with_load(&forged), later)
                .unwrap()
                .load,
            40
        );
        // A status change right after is checked at once (no pace).
        let mut draining = st.clone();
        draining.set("status", "draining");
        n2.sign_own(&id, &mut draining);
        let next = later + Duration::from_millis(10);
        let m = seen
            .judge(&n1, &id, &draining, with_load(&draining), next)
            .unwrap();
        assert_eq!(m.status, NodeStatus::Draining);

        // Three members: a load change 20 ms after the last check is
        // past the pace (15 ms) and taken at once.
        let three: BTreeMap<ChitchatId, NodeState> = live
            .into_iter()
            .filter(|(m, _)| *m == id || matches!(&*m.node_id, "m0" | "m1"))
            .collect();
        assert_eq!(three.len(), 3);
        seen.retain_live(&three);
        let mut st = draining;
        st.set("load", "70");
        n2.sign_own(&id, &mut st);
        let m = seen
            .judge(
                &n1,
                &id,
                &st,
                with_load(&st),
                next + Duration::from_millis(20),
            )
            .unwrap();
        assert_eq!(m.load, 70);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
