//! Connection management of the peer layer: one QUIC connection in use per
//! unordered node pair, liveness that costs nothing while a pair is quiet.
//!
//! - **One connection per pair, both ways.** A connection carries requests
//!   in both directions: the side that accepted it opens streams on it as
//!   the side that dialled it does. A node dials a peer only when it has no
//!   usable connection to it. When two connections to the same peer are
//!   usable (both nodes dialled at once), both nodes pick the one dialled
//!   by the smaller node id (`engine::peer_link::dialler_wins`) and open no new stream on
//!   the other, which still serves the streams already on it and then
//!   closes by itself once quiet. Nothing is closed under a stream, so no
//!   request is lost or sent twice while the pair settles.
//! - **Liveness only while busy.** While a connection has streams open, or
//!   had one less than `idle_timeout` ago, a keeper task wakes every
//!   `keep_alive`, sends a 1-byte QUIC DATAGRAM when nothing arrived since
//!   its last wake, and closes the connection when nothing arrived for
//!   `idle_timeout` (measured from the wake before the last packet seen, so
//!   the peer is ejected within `idle_timeout` of its last packet). A quiet
//!   connection sends nothing; QUIC's idle timeout (3 x `idle_timeout`)
//!   closes it silently, and the first request after the quiet spell dials
//!   again (one round trip). A connection is used for a new stream only
//!   within half that QUIC timeout of its last ping, so both ends still
//!   hold it.
//! - **The previous protocol.** A connection that negotiated ALPN
//!   `peerlb/1` (a node of a release before one connection per pair, or
//!   one configured with `peer.protocol = 1`) works as that release did:
//!   this node opens streams only on such a connection it dialled (usable
//!   while open: the `peerlb/1` end keeps it alive with QUIC keep-alives,
//!   so its idle timeout means the peer is gone) and serves streams only on
//!   one it accepted (retired from the start; it does not make the peer
//!   routable). Such a pair holds two connections.
//! - **Routable set.** A peer is routable once a handshake proved its
//!   identity (dialled or accepted), until it is ejected: its connection
//!   was lost while busy, the peer closed it, or a dial failed. A
//!   supervisor task per peer dials at first sight (the larger id first
//!   waits a moment for the smaller's dial) and re-dials an ejected peer
//!   with backoff. A dead quiet peer is removed by gossip's failure
//!   detector; a request sent to it before that finds no usable
//!   connection, its dial fails (not reached: the next candidate is tried)
//!   or, on a connection quiet for less than half the QUIC idle timeout,
//!   the keeper closes it within `idle_timeout` (maybe reached: replay
//!   rules).
//! - **Dialling on demand** (`peer.dial = "on_demand"`). A cluster of N
//!   nodes forming at first sight makes N (N - 1) / 2 mutual TLS
//!   handshakes, most of them for pairs that then fall quiet and close
//!   (499,500 at 1,000 nodes). On demand, a member gossip announces is
//!   routable at once, with no handshake, and the first request for it
//!   dials it (one round trip more, as after any quiet spell); a dial that
//!   fails ejects it (the request goes to the next candidate), and the
//!   supervisor re-dials it as above. Identity is still proved by every
//!   handshake; what is given up is proving it before the first request.
//!
//! Which connection carries a stream and which are retired is the
//! engine's choice (`engine::peer_link`: keep, dialler wins, pause
//! retirement, retire on accept); this file gathers each connection's
//! facts for it and applies its answer.
//!
//! `links/link.rs` holds one connection ([`Link`]), what holds it busy and
//! what its handshake proved; `links/slot.rs` what this node knows of one
//! peer; `links/tests.rs` the tests.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{Instrument, debug, info, info_span, warn};

use super::dial;
use super::{OpenError, PeerSettings};
use crate::adapters::cluster::pause::PauseWatch;
use crate::adapters::transport::tls;
use crate::engine::node_id::NodeId;
#[cfg(test)]
use crate::engine::peer_link::dialler_wins;
use crate::engine::peer_link::{self, LinkFacts, Windows};
use crate::seam::{NodeEvent, Observer};

/// The tracing target of this module's events: its path before the
/// adapters were put in wings (`crate::adapters::REQUEST_PATH`).
const LOG: &str = "peerlb::adapters::peer::links";

/// Application close code: the keeper heard nothing from a busy peer for
/// `idle_timeout`.
const CLOSE_SILENT: u32 = 3;

/// The keeper's ping: one DATAGRAM frame (ack-eliciting, so the peer's ACK
/// proves it alive). The receiver never reads it; quinn drops it once its
/// small datagram buffer ([`DATAGRAM_BUFFER`]) is full.
const PING: Bytes = Bytes::from_static(b"p");

/// Bytes of received DATAGRAM frames a connection buffers (they are pings,
/// never read).
pub(super) const DATAGRAM_BUFFER: usize = 1024;

/// QUIC idle timeout of a peer connection: `idle_timeout` x 3. A busy
/// connection's keeper closes it sooner; a quiet one ends after this.
pub(super) fn quic_idle_timeout(s: &PeerSettings) -> Duration {
    s.idle_timeout * 3
}

mod link;

pub(super) use link::Link;
use link::LinkState;
pub(crate) use link::{Busy, PeerBody, PeerStream};
use link::{dialler_id, negotiated_v1, negotiated_version};

mod slot;

use slot::Slot;

/// Connections to every known peer, and the set of routable peers.
pub(crate) struct PeerLinks {
    /// Told of every ejection and restore.
    observer: Arc<dyn Observer>,
    /// Holds failure decisions just after a pause of this node's own.
    pause: Arc<PauseWatch>,
    self_id: NodeId,
    endpoint: quinn::Endpoint,
    client: quinn::ClientConfig,
    settings: PeerSettings,
    slots: Mutex<BTreeMap<NodeId, Slot>>,
    routable: watch::Sender<BTreeSet<NodeId>>,
    /// Serves the streams a peer opens on a connection (dialled or
    /// accepted); until it is set, connections wait in `unserved`.
    server: Mutex<Server>,
    /// Peers ejected from routing since start (a failed dial or a lost
    /// connection), for the metrics.
    ejections: std::sync::atomic::AtomicU64,
    /// The origin of the times the link choice is given
    /// (`engine::peer_link`: durations since it).
    epoch: Instant,
}

/// The peer links by state, read at a scrape (`ops/metrics_page.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LinkCounts {
    /// Connections with streams open, or whose last stream ended less than
    /// the linger ago (the keeper pings them).
    pub busy: u64,
    /// Open connections that are quiet (no ping, nothing sent).
    pub idle: u64,
    /// Connections this node opens no new stream on (another won).
    pub retired: u64,
    /// Peers that proved their identity and were not ejected since.
    pub peers_up: u64,
    /// Peers gossip names that are not routable (ejected, or not yet
    /// connected).
    pub peers_down: u64,
}

/// Starts serving the streams a peer opens on one connection.
pub(super) type ServeConn = Arc<dyn Fn(NodeId, quinn::Connection, Arc<Link>) + Send + Sync>;

#[derive(Default)]
struct Server {
    serve: Option<ServeConn>,
    unserved: Vec<(NodeId, quinn::Connection, Arc<Link>)>,
}

impl PeerLinks {
    /// Creates the link table (no connections yet: see [`Self::sync`]).
    pub(crate) fn new(
        self_id: NodeId,
        endpoint: quinn::Endpoint,
        client: quinn::ClientConfig,
        settings: PeerSettings,
        observer: Arc<dyn Observer>,
        pause: Arc<PauseWatch>,
    ) -> Arc<PeerLinks> {
        Arc::new(PeerLinks {
            observer,
            pause,
            self_id,
            endpoint,
            client,
            settings,
            slots: Mutex::new(BTreeMap::new()),
            routable: watch::channel(BTreeSet::new()).0,
            server: Mutex::new(Server::default()),
            ejections: std::sync::atomic::AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    /// Peers ejected from routing since start.
    pub(crate) fn ejections(&self) -> u64 {
        self.ejections.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The connections and peers by state now (takes the slots lock and
    /// each link's lock once: for a scrape, not for the request path).
    pub(crate) fn counts(&self) -> LinkCounts {
        let now = Instant::now();
        let linger = self.linger();
        let mut c = LinkCounts::default();
        for slot in self.slots.lock().expect("peer slots lock").values() {
            if *slot.up.borrow() {
                c.peers_up += 1;
            } else {
                c.peers_down += 1;
            }
            for l in &slot.links {
                if l.state.lock().expect("link state lock").retired {
                    c.retired += 1;
                } else if l.busy(now, linger) {
                    c.busy += 1;
                } else {
                    c.idle += 1;
                }
            }
        }
        c
    }

    /// Peers that proved their identity and were not ejected since;
    /// changes on every ejection and restore.
    pub(crate) fn connected(&self) -> watch::Receiver<BTreeSet<NodeId>> {
        self.routable.subscribe()
    }

    /// Open QUIC connections to peers (dialled and accepted, including
    /// ones that lost a simultaneous dial and are ending).
    pub(crate) fn connection_count(&self) -> usize {
        self.slots
            .lock()
            .expect("peer slots lock")
            .values()
            .map(|s| s.links.len())
            .sum()
    }

    /// Sets what serves the streams peers open (on every connection,
    /// dialled or accepted, including those made before this call).
    pub(super) fn set_server(&self, serve: ServeConn) {
        let waiting = {
            let mut s = self.server.lock().expect("server lock");
            s.serve = Some(serve.clone());
            std::mem::take(&mut s.unserved)
        };
        for (id, conn, link) in waiting {
            serve(id, conn, link);
        }
    }

    /// The endpoint connections are dialled from and accepted on.
    pub(super) fn endpoint(&self) -> &quinn::Endpoint {
        &self.endpoint
    }

    fn linger(&self) -> Duration {
        self.settings.idle_timeout
    }

    fn usable_window(&self) -> Duration {
        quic_idle_timeout(&self.settings) / 2
    }

    /// Makes the supervised peer set equal to `peers` (id, peer address,
    /// generation; the largest generation of an id counts):
    /// starts supervisors for new peers and forgets the rest (their
    /// connections are retired, not closed). A new address is dialled on the next dial; a
    /// working authenticated connection is kept. A peer whose supervisor
    /// gave up ([`dial::GIVE_UP_AFTER`]) is dialled again once gossip
    /// announces it with another address or generation.
    pub(crate) fn sync(self: &Arc<Self>, peers: &[(NodeId, SocketAddr, u64)]) {
        let mut slots = self.slots.lock().expect("peer slots lock");
        let mut all: BTreeMap<&NodeId, (SocketAddr, u64)> = BTreeMap::new();
        for (id, a, generation) in peers.iter().filter(|(id, ..)| *id != self.self_id) {
            let e = all.entry(id).or_insert((*a, *generation));
            if *generation >= e.1 {
                *e = (*a, *generation);
            }
        }
        // At most `gossip.max_members` members are supervised (those already
        // supervised first), so a flood of members cannot make this node
        // dial without bound.
        let supervised = |id: &NodeId| slots.get(id).is_some_and(|s| s.watched);
        let chosen = dial::select(all.keys().copied(), supervised, self.settings.max_peers);
        let wanted: BTreeMap<&NodeId, (SocketAddr, u64)> =
            chosen.into_iter().map(|id| (id, all[id])).collect();
        let gone: Vec<NodeId> = slots
            .iter()
            .filter(|(id, s)| s.watched && !wanted.contains_key(id))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            if let Some(s) = slots.remove(&id) {
                if let Some(t) = s.task {
                    t.abort();
                }
                // Its connections are not closed: the peer may still be
                // live in its own view and use them (this node serves its
                // streams until they end by themselves, once quiet).
                for l in s.links {
                    l.state.lock().expect("link state lock").retired = true;
                }
                self.routable.send_if_modified(|set| set.remove(&id));
                debug!(target: LOG, peer = %id, "peer forgotten");
            }
        }
        for (id, (addr, generation)) in wanted {
            let slot = slots.entry(id.clone()).or_insert_with(|| Slot::new(addr));
            slot.addr = addr;
            slot.generation = generation;
            let mut sighted = !slot.watched;
            slot.watched = true;
            if slot.gave_up.is_some_and(|g| g != (addr, generation)) {
                // Announced anew: a finished supervisor, started again.
                slot.gave_up = None;
                slot.task = None;
                sighted = true;
            }
            if !self.settings.dial_on_demand {
                if slot.task.is_none() {
                    slot.task = Some(self.spawn_supervisor(id));
                }
            } else if sighted && !*slot.up.borrow() {
                // Routable on gossip's word: the first request dials it,
                // and its supervisor starts at its first ejection.
                slot.up.send_replace(true);
                if self.routable.send_if_modified(|set| set.insert(id.clone())) {
                    self.observer.observe(&NodeEvent::PeerRestored { peer: id });
                }
            }
        }
    }

    fn spawn_supervisor(self: &Arc<Self>, id: &NodeId) -> JoinHandle<()> {
        let me = Arc::clone(self);
        let peer = id.clone();
        tokio::spawn(
            async move { me.supervise(peer).await }
                .instrument(info_span!(target: LOG, "peer", peer = %id)),
        )
    }

    /// Dials `id` at first sight (unless `peer.dial = "on_demand"`: [`Self::sync`]
    /// made it routable, and a request dials it) and whenever it is
    /// ejected, with backoff.
    async fn supervise(self: Arc<Self>, id: NodeId) {
        let Some(mut routable) = self
            .slots
            .lock()
            .expect("peer slots lock")
            .get(&id)
            .map(|s| s.up.subscribe())
        else {
            return;
        };
        if self.self_id > id && !self.settings.dial_on_demand {
            // The smaller id dials first: one handshake per pair at start.
            let _ = tokio::time::timeout(
                self.settings.connect_timeout / 2,
                routable.wait_for(|up| *up),
            )
            .await;
        }
        let mut backoff = dial::FIRST;
        let mut failures = 0u32;
        // Restarted after a give-up because the peer connected: known.
        let mut ever_connected = self.pick(&id).is_some();
        loop {
            // Ends when the slot is forgotten (this task is aborted then).
            if routable.wait_for(|up| !*up).await.is_err() {
                return;
            }
            match self.dial(&id, false).await {
                Ok(_) => {
                    backoff = dial::FIRST;
                    failures = 0;
                    ever_connected = true;
                    continue;
                }
                Err(e) => {
                    failures += 1;
                    // A handshake refused for identity (wrong CA or name)
                    // is an alarm; a peer that is simply down is expected
                    // noise.
                    let identity = e.contains("certificate")
                        || e.contains("UnknownIssuer")
                        || e.contains("name");
                    if identity {
                        warn!(target: LOG, error = %e, "peer handshake refused: not routing to it");
                    } else if failures == 3 {
                        warn!(target: LOG, error = %e, "peer unreachable: retrying");
                    } else {
                        debug!(target: LOG, error = %e, "peer connect failed");
                    }
                    if dial::give_up(failures, ever_connected) {
                        let mut slots = self.slots.lock().expect("peer slots lock");
                        if let Some(s) = slots.get_mut(&id) {
                            warn!(target: LOG, addr = %s.addr, generation = s.generation, attempts = failures, "peer never completed a handshake: not dialling it again until gossip announces it with another address or generation");
                            s.gave_up = Some((s.addr, s.generation));
                        }
                        return;
                    }
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = dial::next_backoff(backoff, ever_connected);
        }
    }

    /// Dials `id` unless a usable connection appeared meanwhile; returns
    /// the connection to use. A failed dial ejects the peer. `on_demand`
    /// (a request's dial) gives up at once when the peer was ejected while
    /// it waited for another dial: requests queued behind a failed dial
    /// do not each wait for a dial of their own.
    async fn dial(self: &Arc<Self>, id: &NodeId, on_demand: bool) -> Result<Arc<Link>, String> {
        let lock = {
            let slots = self.slots.lock().expect("peer slots lock");
            slots.get(id).ok_or("peer forgotten")?.dial.clone()
        };
        let _one = lock.lock().await;
        if let Some(l) = self.pick(id) {
            return Ok(l);
        }
        let addr = {
            let slots = self.slots.lock().expect("peer slots lock");
            let s = slots.get(id).ok_or("peer forgotten")?;
            if on_demand && !*s.up.borrow() {
                return Err("ejected while waiting for a dial".to_owned());
            }
            s.addr
        };
        let server_name = tls::node_server_name(id);
        let attempt = async {
            // Its driver outside this task's span (`super::outside_spans`).
            let connecting = super::outside_spans(addr, || {
                self.endpoint
                    .connect_with(self.client.clone(), addr, &server_name)
            })
            .map_err(|e| e.to_string())?;
            connecting.await.map_err(|e| e.to_string())
        };
        match tokio::time::timeout(self.settings.connect_timeout, attempt).await {
            Ok(Ok(conn)) => {
                info!(target: LOG, %addr, "peer connected");
                Ok(self.register(id, conn, true))
            }
            Ok(Err(e)) => self.dial_failed(id, e),
            Err(_) => self.dial_failed(id, "timed out".to_owned()),
        }
    }

    /// After a failed dial to `id`: the connection the peer opened to this
    /// node meanwhile, if one is usable (a peer that restarted dials too;
    /// its handshake completed, so the peer is neither ejected nor given
    /// up on), else the peer is ejected and the error returned.
    fn dial_failed(self: &Arc<Self>, id: &NodeId, e: String) -> Result<Arc<Link>, String> {
        if let Some(l) = self.pick(id) {
            debug!(target: LOG, error = %e, "peer dial failed, but the peer connected to this node meanwhile");
            return Ok(l);
        }
        self.eject(id);
        Err(e)
    }

    fn eject(self: &Arc<Self>, id: &NodeId) {
        if let Some(s) = self.slots.lock().expect("peer slots lock").get_mut(id) {
            s.up.send_replace(false);
            if s.watched && s.task.is_none() {
                // `peer.dial = "on_demand"`: supervised from now on.
                s.task = Some(self.spawn_supervisor(id));
            }
        }
        if self.routable.send_if_modified(|set| set.remove(id)) {
            self.ejections
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.observer.observe(&NodeEvent::PeerEjected { peer: id });
        }
    }

    /// Records an authenticated connection with `id` (dialled by this node
    /// or accepted), marks the peer routable and starts its keeper. An
    /// accepted connection retires this node's quiet connections to the
    /// peer that are older than a dial: the peer dials only when it holds
    /// no usable connection (it restarted, or found ours quiet too long).
    fn register(
        self: &Arc<Self>,
        id: &NodeId,
        conn: quinn::Connection,
        dialled: bool,
    ) -> Arc<Link> {
        let now = Instant::now();
        let legacy = negotiated_v1(&conn);
        // The previous protocol: streams go out only on the connection
        // this node dialled, so one it accepted is retired from the start
        // (it is only served) and says nothing of the peer's routability.
        let accepted_v1 = legacy && !dialled;
        let version = negotiated_version(&conn);
        let link = Arc::new(Link {
            conn,
            dialled,
            legacy,
            version,
            established: now,
            state: Mutex::new(LinkState {
                streams: 0,
                last_busy: now,
                retired: accepted_v1,
                silent: false,
            }),
            wake: Notify::new(),
        });
        {
            let mut slots = self.slots.lock().expect("peer slots lock");
            let slot = slots
                .entry(id.clone())
                .or_insert_with(|| Slot::new(link.conn.remote_address()));
            if !dialled && !legacy {
                let facts: Vec<LinkFacts> = slot
                    .links
                    .iter()
                    .map(|l| l.facts(self.epoch, false))
                    .collect();
                let at = now.saturating_duration_since(self.epoch);
                let timeout = self.settings.connect_timeout;
                for i in peer_link::retire_on_register(&facts, true, at, timeout) {
                    slot.links[i].state.lock().expect("link state lock").retired = true;
                }
            }
            slot.links.push(link.clone());
            if !accepted_v1 {
                slot.up.send_replace(true);
            }
            if slot.gave_up.take().is_some() {
                // The peer completed a handshake after all (it dialled this
                // node): supervised again, as a member that connected once.
                slot.task = Some(self.spawn_supervisor(id));
            }
        }
        if !accepted_v1 && self.routable.send_if_modified(|set| set.insert(id.clone())) {
            self.observer.observe(&NodeEvent::PeerRestored { peer: id });
        }
        // A `peerlb/1` peer never opens streams on a connection it
        // accepted (and a node speaking only `peerlb/1` serves none on
        // one it dialled, as releases before one connection per pair).
        let serve_it = !(legacy && dialled);
        let serve = {
            let mut s = self.server.lock().expect("server lock");
            if s.serve.is_none() && serve_it {
                s.unserved
                    .push((id.clone(), link.conn.clone(), link.clone()));
            }
            s.serve.clone().filter(|_| serve_it)
        };
        if let Some(serve) = serve {
            serve(id.clone(), link.conn.clone(), link.clone());
        }
        let me = Arc::clone(self);
        let (peer, l) = (id.clone(), link.clone());
        tokio::spawn(
            async move { me.keep(peer, l).await }
                .instrument(info_span!(target: LOG, "peer_link", peer = %id, dialled)),
        );
        link
    }

    /// The connection for a new stream to `id`: among the usable ones,
    /// the one the pair keeps (`engine::peer_link::choose`), else the newest; the
    /// others are retired.
    fn pick(&self, id: &NodeId) -> Option<Arc<Link>> {
        let now = Instant::now();
        let slots = self.slots.lock().expect("peer slots lock");
        let slot = slots.get(id)?;
        // Just after a pause of this node's own, a connection from before
        // it is replaced by a new dial (its peer may have closed it while
        // this node was away): retired, it still serves its streams.
        let paused = self.pause.suspected_at(now);
        let facts = |l: &Link| {
            l.facts(
                self.epoch,
                paused && self.pause.predates_pause(l.established),
            )
        };
        let windows = Windows {
            linger: self.linger(),
            usable: self.usable_window(),
        };
        let now = now.saturating_duration_since(self.epoch);
        // The usual case, one connection to the peer: no list to gather.
        let choice = if let [only] = slot.links.as_slice() {
            peer_link::choose(&self.self_id, id, &[facts(only)], now, windows)
        } else {
            let all: Vec<LinkFacts> = slot.links.iter().map(|l| facts(l)).collect();
            peer_link::choose(&self.self_id, id, &all, now, windows)
        };
        for i in choice.retire {
            slot.links[i].state.lock().expect("link state lock").retired = true;
        }
        choice.chosen.map(|i| slot.links[i].clone())
    }

    /// Watches one connection: liveness pings while busy, and what its
    /// end means (a loss while busy, or a close by the peer, ejects it).
    async fn keep(self: Arc<Self>, id: NodeId, link: Arc<Link>) {
        let tick = self.settings.keep_alive;
        let silent_after = self.settings.idle_timeout;
        let linger = self.linger();
        let closed = link.conn.closed();
        tokio::pin!(closed);
        let mut seen = link.conn.stats().udp_rx.datagrams;
        let mut last_wake = Instant::now();
        // The wake before the last packet seen: a bound on when it came.
        let mut heard = last_wake;
        loop {
            let busy = link.busy(Instant::now(), linger);
            tokio::select! {
                why = &mut closed => {
                    self.ended(&id, &link, why);
                    return;
                }
                _ = link.wake.notified(), if !busy => {
                    last_wake = Instant::now();
                    heard = last_wake;
                    seen = link.conn.stats().udp_rx.datagrams;
                }
                _ = tokio::time::sleep(tick), if busy => {
                    let now = Instant::now();
                    let rx = link.conn.stats().udp_rx.datagrams;
                    if rx != seen {
                        seen = rx;
                        heard = last_wake;
                    } else if self.pause.suspected() {
                        // This node was stopped, not the peer silent:
                        // silence counts again from now.
                        heard = now;
                        let _ = link.conn.send_datagram(PING);
                    } else if now.duration_since(heard) >= silent_after {
                        link.state.lock().expect("link state lock").silent = true;
                        link.conn.close(CLOSE_SILENT.into(), b"peer silent");
                    } else {
                        let _ = link.conn.send_datagram(PING);
                    }
                    last_wake = now;
                }
            }
        }
    }

    /// A connection ended: forgets it, and ejects the peer when it was the
    /// connection in use and ended by a loss while busy, a silence, or the
    /// peer's close.
    fn ended(self: &Arc<Self>, id: &NodeId, link: &Arc<Link>, why: quinn::ConnectionError) {
        let busy = link.busy(Instant::now(), self.linger());
        let (retired, silent) = {
            let s = link.state.lock().expect("link state lock");
            (s.retired, s.silent)
        };
        let eject = !retired
            && match &why {
                quinn::ConnectionError::LocallyClosed => silent,
                // A `peerlb/1` connection is kept alive by its ends: its
                // idle timeout means the peer is gone.
                quinn::ConnectionError::TimedOut => busy || link.legacy,
                _ => true,
            };
        let mut slots = self.slots.lock().expect("peer slots lock");
        if let Some(slot) = slots.get_mut(id) {
            slot.links.retain(|l| !Arc::ptr_eq(l, link));
            if !slot.watched && slot.links.is_empty() {
                slots.remove(id);
            } else if eject {
                slot.up.send_replace(false);
                if slot.watched && slot.task.is_none() {
                    // `peer.dial = "on_demand"`: supervised from now on.
                    slot.task = Some(self.spawn_supervisor(id));
                }
            }
        }
        drop(slots);
        if eject {
            if silent {
                warn!(target: LOG,
                    reason = "silent",
                    "peer connection lost: ejected until it reconnects"
                );
            } else {
                warn!(target: LOG, reason = %why, "peer connection lost: ejected until it reconnects");
            }
            if self.routable.send_if_modified(|set| set.remove(id)) {
                self.ejections
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.observer.observe(&NodeEvent::PeerEjected { peer: id });
            }
        } else {
            debug!(target: LOG, reason = %why, "peer connection ended");
        }
    }

    /// Opens a request stream to `peer`, dialling it if no connection is
    /// usable (the first request after a quiet spell: one round trip).
    /// Nothing has reached the peer when this fails.
    ///
    /// # Errors
    /// [`OpenError`] when the peer is not routable, cannot be dialled, or
    /// no stream could be opened.
    pub(crate) async fn open(self: &Arc<Self>, peer: &NodeId) -> Result<PeerStream, OpenError> {
        let link = match self.pick(peer) {
            Some(l) => l,
            None => {
                let up = self
                    .slots
                    .lock()
                    .expect("peer slots lock")
                    .get(peer)
                    .is_some_and(|s| *s.up.borrow());
                // Just after a pause of this node's own, an ejected peer
                // is dialled again before any request gives up on it (its
                // connection most likely ended because this node was
                // away).
                let revalidate = !up && self.pause.suspected();
                if !up && !revalidate {
                    return Err(OpenError::NotConnected(peer.clone()));
                }
                self.dial(peer, !revalidate)
                    .await
                    .map_err(|reason| OpenError::Stream {
                        peer: peer.clone(),
                        reason,
                    })?
            }
        };
        let busy = link.enter();
        match tokio::time::timeout(self.settings.connect_timeout, link.conn.open_bi()).await {
            Ok(Ok((send, recv))) => Ok(PeerStream {
                send,
                recv,
                busy,
                version: link.version,
            }),
            Ok(Err(e)) => Err(OpenError::Stream {
                peer: peer.clone(),
                reason: e.to_string(),
            }),
            Err(_) => Err(OpenError::Stream {
                peer: peer.clone(),
                reason: "timed out waiting for stream credit".into(),
            }),
        }
    }

    /// Records an accepted connection: its client certificate names the
    /// dialler, whose connection is then used both ways (its streams are
    /// served by the [`Self::set_server`] function). Closes it when the
    /// certificate proves no single node id.
    pub(super) fn accepted(self: &Arc<Self>, conn: quinn::Connection) {
        if let Some(id) = dialler_id(&conn) {
            self.register(&id, conn, false);
        }
    }

    /// Closes every connection and the endpoint, and waits for the close
    /// frames to be sent.
    pub(crate) async fn close(&self) {
        for (_, s) in std::mem::take(&mut *self.slots.lock().expect("peer slots lock")) {
            if let Some(t) = s.task {
                t.abort();
            }
        }
        self.endpoint.close(0u32.into(), b"node stopping");
        let _ = tokio::time::timeout(Duration::from_secs(1), self.endpoint.wait_idle()).await;
    }
}

#[cfg(test)]
mod tests;
