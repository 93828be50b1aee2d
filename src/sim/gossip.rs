//! chitchat's gossip over turmoil's simulated UDP.
//!
//! Every message is one real turmoil datagram holding the envelope's bytes
//! (so latency, loss, partitions and crashes apply to gossip exactly as to
//! QUIC). A node's transport ([`SimGossip::sealed`]) encodes, seals, opens,
//! checks the gossip bounds and decodes with the production functions
//! (`adapters/cluster/sealed.rs`: `seal_envelope`, `open_envelope`), nonces
//! from the node's seeded generator; only the UDP socket differs. What the
//! simulation leaves out is the production socket's send gate (gossip only
//! to seeds and to addresses heard from) and its probes: every simulated
//! member is real.

use std::net::SocketAddr;
use std::sync::Arc;

use chitchat::ChitchatEnvelope;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport};

use crate::adapters::cluster::bounds::Bounds;
use crate::adapters::cluster::keyring::GossipKeys;
use crate::adapters::cluster::sealed::{MAX_DATAGRAM, open_envelope, seal_envelope};

/// The gossip transport of one simulation: [`SimGossip::new`] sends plain
/// envelopes (chitchat alone, as a test of its own runs it);
/// [`SimGossip::sealed`] is one node's, sealed and bounded as in
/// production.
#[derive(Clone, Default)]
pub struct SimGossip {
    sealed: Option<(Arc<GossipKeys>, Arc<Bounds>)>,
}

impl SimGossip {
    /// A transport of plain (unsealed, unchecked) envelopes.
    pub fn new() -> SimGossip {
        SimGossip::default()
    }

    /// One node's transport, sealing with `keys` and checking what it
    /// receives against `bounds`.
    pub(crate) fn sealed(&self, keys: Arc<GossipKeys>, bounds: Arc<Bounds>) -> SimGossip {
        SimGossip {
            sealed: Some((keys, bounds)),
        }
    }
}

#[async_trait::async_trait]
impl Transport for SimGossip {
    async fn open(&self, listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let socket = turmoil::net::UdpSocket::bind(("0.0.0.0", listen_addr.port())).await?;
        Ok(Box::new(SimGossipSocket {
            socket,
            local: listen_addr,
            sealed: self.sealed.clone(),
            plain: Vec::new(),
            buf: vec![0u8; MAX_DATAGRAM + 1].into_boxed_slice(),
        }))
    }
}

struct SimGossipSocket {
    socket: turmoil::net::UdpSocket,
    local: SocketAddr,
    sealed: Option<(Arc<GossipKeys>, Arc<Bounds>)>,
    plain: Vec<u8>,
    buf: Box<[u8]>,
}

#[async_trait::async_trait]
impl Socket for SimGossipSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.local)
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        let bytes = match &self.sealed {
            Some((keys, _)) => seal_envelope(keys, &mut self.plain, &envelope)?,
            None => {
                let mut plain = Vec::new();
                envelope.serialize(&mut plain);
                plain
            }
        };
        let n = self.socket.send_to(&bytes, to).await?;
        Ok(SendOutcome { num_bytes_sent: n })
    }

    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        loop {
            let (n, from_addr) = self.socket.recv_from(&mut self.buf).await?;
            let datagram = &self.buf[..n];
            let envelope = match &self.sealed {
                Some((keys, bounds)) => open_envelope(keys, bounds, datagram, from_addr).ok(),
                None => ChitchatEnvelope::deserialize(&mut &datagram[..]).ok(),
            };
            if let Some(envelope) = envelope {
                return Ok(RecvOutcome {
                    from_addr,
                    envelope,
                    num_bytes_received: n,
                });
            }
        }
    }
}
