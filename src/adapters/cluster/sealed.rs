//! chitchat's gossip over UDP, every datagram sealed with the cluster
//! keyring ([`super::keyring`]).
//!
//! The vendored chitchat makes its envelope codec public
//! (`ChitchatEnvelope::serialize` / `deserialize`, vendor/README.md), so a
//! [`SealedSocket`] encodes and seals in place, one socket per node:
//!
//! ```text
//! send: envelope -> encode -> seal -> gossip socket -> peer
//! recv: peer -> gossip socket -> open, bounds -> decode -> envelope
//! ```
//!
//! A datagram no key of the ring opens, or whose content breaks a bound
//! ([`super::bounds`]) or does not decode, is dropped and counted before
//! chitchat sees it ([`open_envelope`], which the simulation's transport
//! calls too, so both apply the same bounds to the same bytes).
//!
//! A datagram is sent only to a seed (resolved when the socket opens) or
//! to an address an authenticated datagram came from (the last
//! [`HEARD_PER_MEMBER`] x `gossip.max_members` of them, kept in
//! [`super::confirm::Confirmed`]): chitchat gossips to every member's
//! claimed gossip address, and a member announced by a key holder with a
//! third party's address would otherwise draw a Syn from every node every
//! few rounds, as long as it stays in the state. A real member is heard
//! from within a round or two of joining (it gossips to its seeds and to
//! the members it learns of), and is then gossiped to. A live member not
//! heard from (two non-seeds) gets a probe, at the pace
//! [`super::confirm`] sets: a sealed Syn with an empty digest, sent before
//! one of chitchat's own datagrams, which a real member answers.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::Context as _;
use chitchat::ChitchatEnvelope;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport};
use tracing::{debug, warn};

use super::bounds::Bounds;
use super::keyring::GossipKeys;

/// The tracing target of this module's events: its path before the
/// adapters were put in wings (`crate::adapters::REQUEST_PATH`).
const LOG: &str = "peerlb::adapters::gossip::sealed";

/// The largest UDP payload over IPv4, chitchat's datagram limit
/// (`engine::gossip_budget`).
pub(crate) use crate::engine::gossip_budget::MAX_DATAGRAM;

// chitchat fills a SynAck's or Ack's delta up to its datagram limit less
// `TRANSPORT_RESERVED_LEN` (a change of the vendored copy, vendor/README.md):
// the seal must fit in that room, or a full delta (a joining node's
// catch-up from a cluster of a few hundred members) would be too large to
// send, every time.
const _: () = assert!(super::keyring::SEAL_OVERHEAD <= chitchat::TRANSPORT_RESERVED_LEN);

/// Addresses authenticated datagrams came from that are remembered, per
/// member allowed (`gossip.max_members`); the oldest is forgotten first.
pub(crate) const HEARD_PER_MEMBER: usize = 4;

/// The production gossip transport: UDP on the gossip address, sealed.
pub(crate) struct SealedUdpTransport {
    keys: Arc<GossipKeys>,
    bounds: Arc<Bounds>,
    seeds: Vec<String>,
}

impl SealedUdpTransport {
    /// A transport sealing with `keys`, checking what it receives against
    /// `bounds` and sending only to `seeds` (`host:port`) and to addresses
    /// it heard from (see the module doc).
    pub(crate) fn new(
        keys: Arc<GossipKeys>,
        bounds: Arc<Bounds>,
        seeds: Vec<String>,
    ) -> SealedUdpTransport {
        SealedUdpTransport {
            keys,
            bounds,
            seeds,
        }
    }
}

#[async_trait::async_trait]
impl Transport for SealedUdpTransport {
    async fn open(&self, listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let outer = tokio::net::UdpSocket::bind(listen_addr)
            .await
            .with_context(|| format!("failed to bind to {listen_addr}/UDP for gossip"))?;
        let mut socket = SealedSocket::new(outer, self.keys.clone(), self.bounds.clone());
        for seed in &self.seeds {
            match tokio::net::lookup_host(seed).await {
                Ok(addrs) => addrs.for_each(|a| socket.add_seed(a)),
                Err(e) => warn!(target: LOG, %seed, error = %e, "gossip seed does not resolve"),
            }
        }
        Ok(Box::new(socket))
    }
}

/// A bound gossip socket that seals what chitchat sends and opens what it
/// receives (see the module doc).
pub(crate) struct SealedSocket {
    outer: tokio::net::UdpSocket,
    /// The receive buffer (one datagram, and a byte to see one too large).
    buf: Box<[u8]>,
    /// The encode buffer of the envelope being sent.
    plain: Vec<u8>,
    keys: Arc<GossipKeys>,
    bounds: Arc<Bounds>,
    /// This node's cluster id, from the first Syn chitchat sends (for
    /// probes).
    cluster_id: Option<String>,
}

impl SealedSocket {
    /// Wraps the bound gossip socket `outer`.
    pub(crate) fn new(
        outer: tokio::net::UdpSocket,
        keys: Arc<GossipKeys>,
        bounds: Arc<Bounds>,
    ) -> SealedSocket {
        keys.confirmed.gate(HEARD_PER_MEMBER * bounds.max_members());
        SealedSocket {
            outer,
            buf: vec![0u8; MAX_DATAGRAM + 1].into_boxed_slice(),
            plain: Vec::with_capacity(MAX_DATAGRAM),
            keys,
            bounds,
            cluster_id: None,
        }
    }

    /// Sends to `seed` even before hearing from it.
    pub(crate) fn add_seed(&mut self, seed: SocketAddr) {
        self.keys.confirmed.add_seed(seed);
    }

    /// Remembers that an authenticated datagram came from `from`.
    fn heard_from(&mut self, from: SocketAddr) {
        self.keys.confirmed.heard(from);
    }

    /// True when gossip may be sent to `to`.
    fn may_send(&self, to: SocketAddr) -> bool {
        self.keys.confirmed.may_send(to)
    }

    /// Sends the probes due now, if any ([`super::confirm`]): sealed V0
    /// Syns of this node's cluster with an empty digest.
    async fn probe(&mut self) {
        let Some(cluster) = self.cluster_id.clone() else {
            return;
        };
        while let Some(to) = self
            .keys
            .confirmed
            .next_probe(tokio::time::Instant::now(), self.bounds.interval())
        {
            self.probe_one(&cluster, to).await;
        }
    }

    /// Sends one probe to `to`.
    async fn probe_one(&mut self, cluster: &str, to: SocketAddr) {
        let mut syn = 0xB053u16.to_le_bytes().to_vec();
        syn.extend([0, 0]);
        syn.extend(0u16.to_le_bytes());
        let len = u16::try_from(cluster.len()).unwrap_or(u16::MAX);
        syn.extend(len.to_le_bytes());
        syn.extend(&cluster.as_bytes()[..usize::from(len)]);
        let Some(sealed) = self.keys.seal(&syn) else {
            return;
        };
        match self.outer.send_to(&sealed, to).await {
            Ok(_) => {
                self.keys.counters.sent[0].fetch_add(1, Ordering::Relaxed);
                debug!(target: LOG, %to, "gossip probe sent to a member not heard from yet");
            }
            Err(e) => debug!(target: LOG, %to, error = %e, "gossip probe not sent"),
        }
    }
}

/// Why [`open_envelope`] dropped a datagram (each is counted in
/// [`GossipKeys::counters`] before it returns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dropped {
    /// No key of the ring opens it: forged, or this node's ring is out of
    /// date.
    Unauthenticated,
    /// Sealed by a key holder, but it breaks a bound or is no envelope.
    Refused,
}

/// Encodes `envelope` into `plain` (cleared first) and seals it: the bytes
/// of one gossip datagram, the same in production and in the simulation.
///
/// # Errors
/// When no nonce can be drawn, or the sealed datagram would exceed
/// [`MAX_DATAGRAM`] (counted as `oversize`).
pub(crate) fn seal_envelope(
    keys: &GossipKeys,
    plain: &mut Vec<u8>,
    envelope: &ChitchatEnvelope,
) -> anyhow::Result<Vec<u8>> {
    plain.clear();
    envelope.serialize(plain);
    let Some(sealed) = keys.seal(plain) else {
        anyhow::bail!("no nonce: the operating system's random generator failed");
    };
    if sealed.len() > MAX_DATAGRAM {
        keys.counters.oversize.fetch_add(1, Ordering::Relaxed);
        anyhow::bail!(
            "sealed gossip datagram of {} bytes is too large",
            sealed.len()
        );
    }
    Ok(sealed)
}

/// Opens one received gossip datagram from `from`, checks it against
/// `bounds` and decodes it; or drops it, counted (and logged once in a
/// thousand), saying why.
///
/// # Errors
/// [`Dropped`]: unauthenticated, or refused (out of bounds, or a sealed
/// datagram that is no chitchat envelope; both counted `out_of_bounds`).
pub(crate) fn open_envelope(
    keys: &GossipKeys,
    bounds: &Bounds,
    datagram: &[u8],
    from: SocketAddr,
) -> Result<ChitchatEnvelope, Dropped> {
    let Some(plain) = keys.open(datagram) else {
        let count = keys.counters.unauthenticated.load(Ordering::Relaxed);
        if count % 1000 == 1 {
            // Forged, or this node's ring is out of date (it was down
            // during a key rotation): say which, once in a while.
            warn!(target: LOG, %from, dropped = count, file = "tls.gossip_keyring", "gossip datagram dropped: no key of this node's ring opens it (forged, or this node's keyring lacks the cluster's current key)");
        }
        debug!(target: LOG, %from, len = datagram.len(), "gossip datagram dropped: no key of the ring opens it");
        return Err(Dropped::Unauthenticated);
    };
    let refused = |e: &dyn std::fmt::Display| {
        let count = 1 + keys.counters.out_of_bounds.fetch_add(1, Ordering::Relaxed);
        if count % 1000 == 1 {
            // Sealed, so sent by a holder of the gossip key: say so once
            // in a while.
            warn!(target: LOG, %from, error = %e, dropped = count, "gossip datagram dropped: out of bounds");
        } else {
            debug!(target: LOG, %from, error = %e, "gossip datagram dropped: out of bounds");
        }
        Dropped::Refused
    };
    match bounds.check(&plain, keys.echo.own_version()) {
        Ok(Some((heartbeat, version))) => keys.echo.see(heartbeat, version),
        Ok(None) => {}
        Err(e) => return Err(refused(&e)),
    }
    let envelope = ChitchatEnvelope::deserialize(&mut plain.as_slice()).map_err(|e| refused(&e))?;
    keys.counters.received.fetch_add(1, Ordering::Relaxed);
    Ok(envelope)
}

#[async_trait::async_trait]
impl Socket for SealedSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.outer
            .local_addr()
            .context("failed to get UDP socket address")
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        if let chitchat::ChitchatMessage::Syn { cluster_id, .. } = &envelope.message
            && self.cluster_id.is_none()
        {
            self.cluster_id = Some(cluster_id.clone());
        }
        self.probe().await;
        if !self.may_send(to) {
            debug!(target: LOG, %to, "gossip not sent: no authenticated datagram came from this address yet");
            return Ok(SendOutcome { num_bytes_sent: 0 });
        }
        let kind = match envelope.message {
            chitchat::ChitchatMessage::Syn { .. } => 0,
            chitchat::ChitchatMessage::SynAck { .. } => 1,
            chitchat::ChitchatMessage::Ack { .. } => 2,
            _ => 3,
        };
        let sealed = seal_envelope(&self.keys, &mut self.plain, &envelope)?;
        let num_bytes_sent = self
            .outer
            .send_to(&sealed, to)
            .await
            .context("failed to send chitchat message to peer")?;
        self.keys.counters.sent[kind].fetch_add(1, Ordering::Relaxed);
        Ok(SendOutcome { num_bytes_sent })
    }

    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        loop {
            // Cancel safe (chitchat cancels recv every gossip round): a
            // datagram is taken whole or not at all.
            match self.outer.recv_from(&mut self.buf).await {
                Ok((n, from)) => {
                    match open_envelope(&self.keys, &self.bounds, &self.buf[..n], from) {
                        Ok(envelope) => {
                            self.heard_from(from);
                            return Ok(RecvOutcome {
                                from_addr: from,
                                envelope,
                                num_bytes_received: n,
                            });
                        }
                        // Authenticated: whoever holds the key at that
                        // address hears back, even when its content is
                        // refused.
                        Err(Dropped::Refused) => self.heard_from(from),
                        Err(Dropped::Unauthenticated) => {}
                    }
                }
                Err(e) if is_transient(&e) => {
                    debug!(target: LOG, error = %e, "transient gossip recv error")
                }
                Err(e) => return Err(e).context("fatal UDP recv error"),
            }
        }
    }
}

/// Errors after which the socket keeps working (as chitchat's own UDP
/// transport treats them).
fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::OutOfMemory
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
    )
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use chitchat::{ChitchatMessage, ProtocolVersion};

    use super::*;
    use crate::adapters::cluster::keyring::{GossipKey, Keyring};

    fn transport(key: u8) -> (SealedUdpTransport, Arc<GossipKeys>) {
        let keys = Arc::new(GossipKeys::new(Keyring::single(GossipKey::from_bytes(
            [key; 32],
        ))));
        let bounds = Arc::new(Bounds::new(
            "self",
            1,
            8,
            std::time::Duration::from_millis(100),
        ));
        (SealedUdpTransport::new(keys.clone(), bounds, vec![]), keys)
    }

    fn bad_cluster() -> ChitchatEnvelope {
        ChitchatEnvelope {
            version: ProtocolVersion::V0,
            message: ChitchatMessage::BadCluster,
        }
    }

    #[tokio::test]
    async fn envelopes_cross_sealed_and_forgeries_are_dropped_and_counted() {
        let lo: SocketAddr = (Ipv4Addr::LOCALHOST, 0).into();
        let (ta, _) = transport(1);
        let (tb, kb) = transport(1);
        let (tc, _) = transport(2);
        let mut b = tb.open(lo).await.unwrap();
        let b_addr = b.local_addr().unwrap();
        let seeded = |t: SealedUdpTransport| SealedUdpTransport {
            seeds: vec![b_addr.to_string()],
            ..t
        };
        let mut a = seeded(ta).open(lo).await.unwrap();
        let mut c = seeded(tc).open(lo).await.unwrap();
        let a_addr = a.local_addr().unwrap();
        // b never heard from an authenticated a yet: nothing is sent.
        assert_eq!(
            b.send(a_addr, bad_cluster()).await.unwrap().num_bytes_sent,
            0
        );
        // Unsealed chitchat bytes (a BadCluster), then a datagram sealed
        // with another key, then the real one: only the last arrives,
        // with its real sender.
        let raw = tokio::net::UdpSocket::bind(lo).await.unwrap();
        raw.send_to(&[0x53, 0xb0, 0, 3], b_addr).await.unwrap();
        c.send(b_addr, bad_cluster()).await.unwrap();
        let sent = a.send(b_addr, bad_cluster()).await.unwrap();
        assert_eq!(
            sent.num_bytes_sent,
            4 + crate::adapters::cluster::keyring::SEAL_OVERHEAD
        );
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), b.recv())
            .await
            .expect("the sealed envelope arrives")
            .unwrap();
        assert_eq!(got.from_addr, a_addr);
        assert_eq!(got.envelope, bad_cluster());
        assert_eq!(kb.counters.unauthenticated.load(Ordering::Relaxed), 2);
        // The answer goes back sealed too.
        b.send(a_addr, bad_cluster()).await.unwrap();
        let back = tokio::time::timeout(std::time::Duration::from_secs(5), a.recv())
            .await
            .expect("the answer arrives")
            .unwrap();
        assert_eq!(back.from_addr, b_addr);
    }

    /// Two members that are not each other's seeds: `b` knows of `a` from
    /// gossip only. It probes `a` (a sealed empty-digest Syn of its
    /// cluster, sent before one of chitchat's datagrams), at most once a
    /// round and once per address per PROBE_AGAIN; `a` answering confirms
    /// it at `b`, and `a` heard `b` through the probe.
    #[tokio::test]
    async fn a_member_not_heard_from_is_probed_at_a_pace_and_confirmed_by_its_answer() {
        let lo: SocketAddr = (Ipv4Addr::LOCALHOST, 0).into();
        let (ta, ka) = transport(1);
        let (tb, kb) = transport(1);
        let mut a = ta.open(lo).await.unwrap();
        let mut b = tb.open(lo).await.unwrap();
        let (a_addr, b_addr) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        let trap = tokio::net::UdpSocket::bind(lo).await.unwrap();
        let trap_addr = trap.local_addr().unwrap();
        assert!(!kb.confirmed.is_confirmed(a_addr));
        let now = tokio::time::Instant::now();
        kb.confirmed.want_probe(a_addr, now);
        kb.confirmed.want_probe(trap_addr, now);
        // chitchat's first Syn gives the cluster id; it is not sent (no
        // one heard), the probe is.
        let syn = ChitchatEnvelope {
            version: ProtocolVersion::V0,
            message: ChitchatMessage::Syn {
                cluster_id: "c".into(),
                digest: Default::default(),
            },
        };
        assert_eq!(b.send(a_addr, syn).await.unwrap().num_bytes_sent, 0);
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), a.recv())
            .await
            .expect("the probe arrives")
            .unwrap();
        assert_eq!(got.from_addr, b_addr);
        assert!(
            matches!(&got.envelope.message, ChitchatMessage::Syn { cluster_id, .. } if cluster_id == "c"),
            "{:?}",
            got.envelope
        );
        assert!(ka.confirmed.may_send(b_addr), "a did not hear b");
        // The trap was probed in the same call; asked again, it gets
        // nothing more within PROBE_AGAIN.
        let mut buf = [0u8; 64];
        let (n, from) =
            tokio::time::timeout(std::time::Duration::from_secs(5), trap.recv_from(&mut buf))
                .await
                .expect("the trap is probed")
                .unwrap();
        assert_eq!(from, b_addr);
        assert!(n < 64, "a probe of {n} bytes");
        kb.confirmed
            .want_probe(trap_addr, tokio::time::Instant::now());
        b.send(a_addr, bad_cluster()).await.unwrap();
        assert!(trap.try_recv_from(&mut buf).is_err());
        // a answers: confirmed at b.
        a.send(b_addr, bad_cluster()).await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), b.recv())
            .await
            .expect("the answer arrives")
            .unwrap();
        assert!(kb.confirmed.is_confirmed(a_addr));
    }

    /// What both transports deliver: a sealed envelope opens to itself; a
    /// datagram sealed with another key is unauthenticated; sealed bytes
    /// that are no envelope are refused (counted out of bounds); a
    /// datagram over the limit is never built.
    #[test]
    fn sealed_envelopes_open_to_themselves_and_the_rest_is_dropped_and_counted() {
        let from: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let (_, ka) = transport(1);
        let (_, kc) = transport(2);
        let bounds = Bounds::new("self", 1, 8, std::time::Duration::from_millis(100));
        let mut plain = Vec::new();
        let sealed = seal_envelope(&ka, &mut plain, &bad_cluster()).unwrap();
        assert_eq!(
            open_envelope(&ka, &bounds, &sealed, from),
            Ok(bad_cluster())
        );
        assert_eq!(ka.counters.received.load(Ordering::Relaxed), 1);
        let other = seal_envelope(&kc, &mut plain, &bad_cluster()).unwrap();
        assert_eq!(
            open_envelope(&ka, &bounds, &other, from),
            Err(Dropped::Unauthenticated)
        );
        assert_eq!(ka.counters.unauthenticated.load(Ordering::Relaxed), 1);
        // The right magic and version, an unknown message type.
        let junk = ka.seal(&[0x53, 0xb0, 0, 9]).unwrap();
        assert_eq!(
            open_envelope(&ka, &bounds, &junk, from),
            Err(Dropped::Refused)
        );
        assert_eq!(ka.counters.out_of_bounds.load(Ordering::Relaxed), 1);
        assert_eq!(ka.counters.received.load(Ordering::Relaxed), 1);
        let huge = ChitchatEnvelope {
            version: ProtocolVersion::V0,
            message: ChitchatMessage::Syn {
                cluster_id: "c".repeat(MAX_DATAGRAM),
                digest: Default::default(),
            },
        };
        assert!(seal_envelope(&ka, &mut plain, &huge).is_err());
        assert_eq!(ka.counters.oversize.load(Ordering::Relaxed), 1);
    }
}
