//! chitchat's gossip over turmoil's simulated UDP.
//!
//! chitchat 0.13 keeps its envelope codec crate-private, so a transport of
//! our own cannot put a `ChitchatEnvelope` into bytes. This transport sends
//! a real turmoil datagram per message (so latency, loss, partitions and
//! crashes apply to gossip exactly as to QUIC), carrying an 8-byte ticket;
//! the envelope itself waits in a mailbox shared by the simulation and is
//! taken by the receiver of the ticket. The ticket is sealed with the
//! node's gossip keyring (as production seals the envelope bytes), nonces
//! from a seeded generator; the bounds production applies to envelope
//! bytes are not applied here (there are no bytes to read).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use chitchat::ChitchatEnvelope;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport};

use crate::adapters::cluster::keyring::GossipKeys;

/// Envelopes in flight; beyond this many the oldest half is dropped (their
/// tickets were lost on partitioned or crashed links).
const MAILBOX_LIMIT: usize = 100_000;

#[derive(Default)]
struct Mailbox {
    next: u64,
    letters: BTreeMap<u64, ChitchatEnvelope>,
}

/// The gossip transport of one simulation (clone it into every node).
#[derive(Clone, Default)]
pub struct SimGossip {
    mailbox: Arc<Mutex<Mailbox>>,
    keys: Option<Arc<GossipKeys>>,
}

impl SimGossip {
    /// A transport with an empty mailbox.
    pub fn new() -> SimGossip {
        SimGossip::default()
    }

    /// This transport for one node, sealing its tickets with `keys`.
    pub fn sealed(&self, keys: Arc<GossipKeys>) -> SimGossip {
        SimGossip {
            mailbox: self.mailbox.clone(),
            keys: Some(keys),
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
            mailbox: self.mailbox.clone(),
            keys: self.keys.clone(),
        }))
    }
}

struct SimGossipSocket {
    socket: turmoil::net::UdpSocket,
    local: SocketAddr,
    mailbox: Arc<Mutex<Mailbox>>,
    keys: Option<Arc<GossipKeys>>,
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
        let ticket = {
            let mut m = self.mailbox.lock().expect("mailbox lock");
            let t = m.next;
            m.next += 1;
            m.letters.insert(t, envelope);
            if m.letters.len() > MAILBOX_LIMIT {
                let keep = m.letters.split_off(&(t - (MAILBOX_LIMIT as u64) / 2));
                m.letters = keep;
            }
            t
        };
        let bytes = match &self.keys {
            Some(k) => k
                .seal(&ticket.to_le_bytes())
                .ok_or_else(|| anyhow::anyhow!("no nonce"))?,
            None => ticket.to_le_bytes().to_vec(),
        };
        let n = match self.socket.send_to(&bytes, to).await {
            Ok(n) => n,
            Err(e) => {
                // Never sent (no such host yet: a node that has not
                // started): nobody will take the letter.
                self.mailbox
                    .lock()
                    .expect("mailbox lock")
                    .letters
                    .remove(&ticket);
                return Err(e.into());
            }
        };
        Ok(SendOutcome { num_bytes_sent: n })
    }

    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        loop {
            let mut buf = [0u8; 64];
            let (n, from_addr) = self.socket.recv_from(&mut buf).await?;
            let opened = match &self.keys {
                Some(k) => k.open(&buf[..n]),
                None => Some(buf[..n].to_vec()),
            };
            let Some(Ok(ticket)) = opened.map(|t| <[u8; 8]>::try_from(t.as_slice())) else {
                continue;
            };
            let ticket = u64::from_le_bytes(ticket);
            let letter = self
                .mailbox
                .lock()
                .expect("mailbox lock")
                .letters
                .remove(&ticket);
            if let Some(envelope) = letter {
                return Ok(RecvOutcome {
                    from_addr,
                    envelope,
                    num_bytes_received: n,
                });
            }
        }
    }
}
