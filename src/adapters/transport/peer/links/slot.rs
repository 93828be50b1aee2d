//! What a node knows of one peer ([`Slot`]): its advertised address and
//! generation, its open connections, whether it is routable, and its
//! supervisor.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::Link;

/// One peer's entry in [`PeerLinks`](super::PeerLinks).
pub(super) struct Slot {
    /// The address gossip advertises now; dialled on the next dial.
    pub(super) addr: SocketAddr,
    /// Open connections to this peer (usually one).
    pub(super) links: Vec<Arc<Link>>,
    /// Proved its identity since it was last ejected (in the routable
    /// set): a watch of its own, so the peer's supervisor wakes on this
    /// peer's changes only, not on every peer's (a forming cluster of N
    /// nodes changes the routable set N times on each node).
    pub(super) up: watch::Sender<bool>,
    /// One dial at a time per peer.
    pub(super) dial: Arc<tokio::sync::Mutex<()>>,
    /// Gossip names this peer and this node supervises it (false for a
    /// peer that connected before gossip named it).
    pub(super) watched: bool,
    /// The supervisor: started at first sight, or under `peer.dial =
    /// "on_demand"` at the first ejection (none until then).
    pub(super) task: Option<JoinHandle<()>>,
    /// The generation gossip advertises now.
    pub(super) generation: u64,
    /// The (address, generation) the supervisor gave up on: it never
    /// completed a handshake there in [`dial::GIVE_UP_AFTER`](super::dial::GIVE_UP_AFTER) attempts.
    pub(super) gave_up: Option<(SocketAddr, u64)>,
}

impl Slot {
    pub(super) fn new(addr: SocketAddr) -> Slot {
        Slot {
            addr,
            links: Vec::new(),
            up: watch::channel(false).0,
            dial: Arc::new(tokio::sync::Mutex::new(())),
            watched: false,
            task: None,
            generation: 0,
            gave_up: None,
        }
    }
}
