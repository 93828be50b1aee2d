//! The owner's relay to an upstream SIP server over UDP (`sip_app =
//! "udp:<ip>:<port>"`): one client transaction per request, all on one
//! ephemeral UDP socket per node, connected to the upstream (so the kernel
//! delivers only the upstream's datagrams and a closed port shows as a
//! refused receive), bound on the first request. One reader task hands
//! each answer to its transaction by the top `Via`'s branch and the
//! `CSeq` method. One socket, because a UAS may answer every request of a
//! dialog at the address its first request came from (SIPp's `uas` does).
//!
//! A request the upstream sends (the callee's BYE or re-INVITE) arrives
//! on that socket too, since a UAS such as SIPp's sends it where the
//! dialog's requests came from; one that reaches a SIP listener from the
//! upstream's address is taken the same way (`SipEntry`). Either is
//! relayed toward the caller ([`SipUpstream::relay_from_upstream`]): a
//! client transaction on an ephemeral socket connected to the caller's
//! target, whose answers go back to the upstream. What to send, when to
//! resend and what to relay is decided by `engine::sip::upstream`; this
//! file only sends and waits (tokio time).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::debug;

use super::Emit;
use crate::adapters::REQUEST_PATH;
use crate::adapters::node_state::NodeState;
use crate::engine::sip::proxy::{self, ClientTimers, Completed, Expired};
use crate::engine::sip::upstream::{self as up, Received};
use crate::engine::sip::{self as sipmsg, MAX_MESSAGE, SipMessage, StartLine};

mod flow;
mod link;

use super::flows::Flows;
use crate::adapters::transport::peer::PeerLinks;
use flow::{FlowReach, FlowSocket};
use link::{CallerSocket, Link};
pub(crate) use link::{Transport, UpstreamTls, UpstreamTlsError};

/// The tracing target of this module's events: its path before the
/// adapters were put in wings (`crate::adapters::REQUEST_PATH`).
const LOG: &str = "peerlb::adapters::sip::upstream";

/// How far a transaction in flight got: its last answer relayed so far
/// and whether that was its final one (a retransmission of the request
/// that joins it gets that answer at once, and the final one).
#[derive(Debug, Clone, Default)]
struct Progress {
    last: Option<SipMessage>,
    done: bool,
}

type Outcome = watch::Receiver<Progress>;

/// An upstream SIP server, how long a transaction with it may take, and
/// the transactions in flight.
pub(crate) struct SipUpstream {
    addr: SocketAddr,
    timeout: Duration,
    /// RFC 3261 Timer C (`limits.sip_timer_c_ms`).
    timer_c: Duration,
    /// INVITE transactions ended by a non-2xx answer the owner ACKed, on
    /// the clock of `epoch`.
    completed: Arc<Mutex<Completed>>,
    epoch: Instant,
    /// The node's counters (`sip_acks_absorbed`, `sip_timer_c_cancels`).
    state: Arc<NodeState>,
    /// Keyed by (owner branch, method): a CANCEL shares its INVITE's
    /// branch but is a transaction of its own (RFC 3261 9.1).
    inflight: Mutex<BTreeMap<(String, String), Outcome>>,
    /// `sip_app`'s transport.
    transport: Transport,
    /// The node's link to the upstream, opened on first use (and again
    /// after a TCP connection closed).
    link: tokio::sync::Mutex<Option<Arc<Link>>>,
    /// Transactions waiting for answers, by (owner branch, method).
    waiting: Arc<Waiting>,
    /// The relay of the requests the upstream sends.
    callee: Arc<CalleeRelay>,
}

/// Requests the upstream sent that are being relayed toward the caller
/// at most at once; more are dropped (the upstream retransmits).
const MAX_CALLEE_INFLIGHT: usize = 1_000;

/// The relay of requests from the upstream toward the caller, and the
/// ones in flight by (owner branch, method): a retransmission of one in
/// flight is absorbed (RFC 3261 17.2: the server transaction answers it
/// once the answer exists).
struct CalleeRelay {
    node: String,
    /// The callers' connections of the cluster (RFC 5923).
    reach: Arc<FlowReach>,
    /// Each relay's channel for the caller's answers that reached a
    /// listener instead of its socket (`SipUpstream::deliver`).
    inflight: Mutex<BTreeMap<(String, String), mpsc::UnboundedSender<SipMessage>>>,
}

/// What the reader task hands a transaction.
enum Datagram {
    /// An answer whose top `Via` carries the transaction's branch.
    Answer(SipMessage),
    /// The socket reported an error (the upstream's port is closed).
    Failed,
}

type Waiting = Mutex<BTreeMap<(String, String), mpsc::UnboundedSender<Datagram>>>;

impl SipUpstream {
    /// The server at `addr` (UDP) of node `node`; a request it has not
    /// answered at all within `timeout` (a non-INVITE: finally) is
    /// answered `408` by the owner; an INVITE it answered provisionally
    /// waits `timer_c` since the last provisional answer, then is
    /// CANCELled (`engine::sip::proxy::ClientTimers`).
    pub(crate) fn new(
        (transport, addr): (Transport, SocketAddr),
        (timeout, timer_c): (Duration, Duration),
        node: &str,
        (state, links): (Arc<NodeState>, Option<Arc<PeerLinks>>),
    ) -> SipUpstream {
        let reach = Arc::new(FlowReach {
            flows: Arc::default(),
            links,
            state: state.clone(),
            timeout,
        });
        SipUpstream {
            state,
            addr,
            timeout,
            timer_c,
            completed: Arc::new(Mutex::new(Completed::default())),
            epoch: Instant::now(),
            inflight: Mutex::new(BTreeMap::new()),
            transport,
            link: tokio::sync::Mutex::new(None),
            waiting: Arc::new(Mutex::new(BTreeMap::new())),
            callee: Arc::new(CalleeRelay {
                node: node.to_owned(),
                reach,
                inflight: Mutex::new(BTreeMap::new()),
            }),
        }
    }

    /// The upstream's address (`sip_app`).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// This node's callers' connections (RFC 5923), which the TCP and TLS
    /// listeners register.
    pub(crate) fn flows(&self) -> &Arc<Flows> {
        &self.callee.reach.flows
    }

    /// Relays `req`, a request the upstream sent, toward the caller and
    /// hands every answer for the upstream to `emit`, in order (see
    /// `CalleeRelay::relay`).
    pub(crate) async fn relay_from_upstream(&self, req: SipMessage, emit: &Emit<'_>) {
        self.callee.relay(req, emit).await;
    }

    /// Takes `resp`, a response of the upstream that reached a SIP
    /// listener (of this node, or of a peer that passed it on) instead of
    /// the node's socket toward the upstream, as if it had come there
    /// (`engine::sip::proxy::stray_response`).
    /// A caller's answer to a request relayed toward it (an owner's
    /// callee branch on top) goes to that relay, once; dropped when the
    /// relay has ended.
    pub(crate) async fn deliver(&self, resp: SipMessage) {
        let callee = resp
            .top_via()
            .and_then(|v| v.param("branch").map(str::to_owned))
            .filter(|b| up::node_of_callee_branch(b).is_some());
        if let Some(branch) = callee {
            let method = resp.cseq().map(|(_, m)| m.to_owned()).unwrap_or_default();
            let relays = self.callee.inflight.lock().expect("callee inflight lock");
            if let Some(tx) = relays.get(&(branch, method)) {
                let _ = tx.send(resp);
            }
            return;
        }
        let again = hand_over(resp, &self.waiting, (&self.completed, self.epoch));
        if let (Some(ack), Ok(link)) = (again, self.link().await) {
            let _ = link.send(&ack).await;
        }
    }

    /// The node's link to the upstream; the first call (and the first
    /// after a TCP connection closed) opens it and starts its reader.
    async fn link(&self) -> std::io::Result<Arc<Link>> {
        let mut held = self.link.lock().await;
        if let Some(l) = held.as_ref().filter(|l| l.is_open()) {
            return Ok(l.clone());
        }
        let readers = link::Readers {
            waiting: self.waiting.clone(),
            callee: self.callee.clone(),
            completed: self.completed.clone(),
            epoch: self.epoch,
        };
        let l = Arc::new(link::open(&self.transport, self.addr, self.timeout, readers).await?);
        *held = Some(l.clone());
        Ok(l)
    }

    /// [`Self::exchange`], except that a request whose transaction is
    /// already in flight (a client's retransmission: same owner branch and
    /// method) starts no second one: it joins that transaction, gets its
    /// last answer so far at once and its final answer when it comes (the
    /// client absorbs the duplicates, 17.1.3). So at most one transaction
    /// waits under a (branch, method) key of `waiting`, where a second
    /// would take the first one's answers. An `ACK` is sent, unless it
    /// acknowledges a non-2xx answer the owner ACKed itself: that one is
    /// absorbed here (17.1.1.3, `engine::sip::proxy::Completed`).
    pub(crate) async fn transact(&self, req: &SipMessage, node: &str, emit: &Emit<'_>) {
        let method = req.method().unwrap_or("");
        if method == "ACK" {
            let branch = up::branch(req, node);
            let now = self.epoch.elapsed();
            if self
                .completed
                .lock()
                .expect("completed lock")
                .absorbs(&branch, now)
            {
                self.state
                    .counters
                    .sip_acks_absorbed
                    .fetch_add(1, Ordering::Relaxed);
                debug!(target: REQUEST_PATH, %branch, "ack of a non-2xx answer the owner acked: absorbed");
                return;
            }
            return self.exchange(req, node, emit).await;
        }
        let key = (up::branch(req, node), method.to_owned());
        let waiting = {
            let mut map = self.inflight.lock().expect("inflight lock");
            match map.get(&key) {
                Some(rx) => Err(rx.clone()),
                None => {
                    let (tx, rx) = watch::channel(Progress::default());
                    map.insert(key.clone(), rx);
                    Ok(tx)
                }
            }
        };
        match waiting {
            Err(mut rx) => {
                let now = rx.borrow_and_update().clone();
                if let Some(m) = &now.last {
                    emit(m);
                }
                if now.done {
                    return;
                }
                // Err: the first one was dropped unfinished; the client
                // resends.
                if let Ok(p) = rx.wait_for(|p| p.done).await
                    && let Some(m) = &p.last
                {
                    emit(m);
                }
            }
            Ok(tx) => {
                let _entry = InflightEntry {
                    map: &self.inflight,
                    key,
                };
                let relay = |m: &SipMessage| {
                    emit(m);
                    tx.send_modify(|p| p.last = Some(m.clone()));
                };
                self.exchange(req, node, &relay).await;
                tx.send_modify(|p| p.done = true);
            }
        }
    }

    /// Sends `req` upstream as node `node` and hands `emit` the answers
    /// to relay as they arrive, the owner's `Via` removed: every
    /// provisional answer but `100`, then the final one. An `ACK` is sent
    /// once and has none. The deadlines are `engine::sip::proxy`
    /// `ClientTimers`': no answer at all within the timeout (a non-INVITE:
    /// no final one) gives `408 Request Timeout` (RFC 3261 16.7 step 1,
    /// 16.8); an INVITE with no provisional answer but `100` within Timer
    /// C is CANCELled on its branch (the CANCEL resent on Timer E until
    /// the final answer, the server's `487`, which is relayed), and `408`
    /// if that does not come within the timeout either. A transport error
    /// (the port is closed, the socket fails): `503 Service Unavailable`
    /// (16.9). Either generated answer carries `Peerlb-Served-By: <node>`.
    /// The owner ACKs a non-2xx final answer to an INVITE itself and
    /// keeps the transaction in `completed` (its caller's ACK is absorbed,
    /// [`Self::transact`]).
    async fn exchange(&self, req: &SipMessage, node: &str, emit: &Emit<'_>) {
        // Long: one client transaction toward the SIP server (RFC 3261 17.1: send, retransmit
        // on UDP, relay provisionals, Timer C, the final answer), one state machine read top to
        // bottom.
        let branch = up::branch(req, node);
        let generated = |status: u16, reason: &str| {
            let tag = up::generated_tag(&branch);
            let mut r = req.response(status, reason, Some(tag));
            r.headers
                .push((sipmsg::SERVED_BY.to_owned(), node.to_owned()));
            r
        };
        let method = req.method().unwrap_or("");
        let (invite, ack) = (method == "INVITE", method == "ACK");
        let unavailable = || {
            if !ack {
                emit(&generated(503, "Service Unavailable"));
            }
        };
        let socket = match self.link().await {
            Ok(s) => s,
            Err(e) => {
                debug!(target: REQUEST_PATH, upstream = %self.addr, error = %e, "sip upstream socket failed");
                return unavailable();
            }
        };
        let Ok(local) = socket.local_addr() else {
            return unavailable();
        };
        let sent = up::upstream_request_over(req, socket.via_name(), local, &branch);
        let reliable = socket.reliable();
        let bytes = sent.to_bytes();
        // Registered before the first send, so that no answer (nor the
        // error of a closed port) can come before the transaction waits.
        let (tx, mut rx) = mpsc::unbounded_channel();
        let _registered = (!ack).then(|| {
            let key = (branch.clone(), method.to_owned());
            self.waiting
                .lock()
                .expect("waiting lock")
                .insert(key.clone(), tx);
            Registered {
                map: &self.waiting,
                key,
            }
        });
        if let Err(e) = socket.send(&bytes).await {
            debug!(target: REQUEST_PATH, upstream = %self.addr, error = %e, "sip upstream send failed");
            return unavailable();
        }
        if ack {
            return;
        }
        let now = || self.epoch.elapsed();
        let mut timers = ClientTimers::new(invite, now(), self.timeout, self.timer_c);
        // The owner's CANCEL once Timer C fired: resent instead of the
        // INVITE until the final answer comes.
        let mut cancel: Option<Vec<u8>> = None;
        let mut transmissions = 1;
        // Nothing is resent over a reliable transport (17.1.1.2, 17.1.2.2).
        let mut resend = (!reliable).then(|| Instant::now() + up::retransmit_interval(invite, 1));
        loop {
            let deadline = self.epoch + timers.deadline();
            let wake = resend.map_or(deadline, |r| r.min(deadline));
            let got = tokio::select! {
                r = rx.recv() => Some(r.unwrap_or(Datagram::Failed)),
                _ = tokio::time::sleep_until(wake) => None,
            };
            match got {
                None if Instant::now() >= deadline => match timers.on_deadline(now()) {
                    Expired::Timeout => {
                        debug!(target: REQUEST_PATH, upstream = %self.addr, "sip upstream gave no final answer in time");
                        return emit(&generated(408, "Request Timeout"));
                    }
                    Expired::Cancel => {
                        self.state
                            .counters
                            .sip_timer_c_cancels
                            .fetch_add(1, Ordering::Relaxed);
                        debug!(target: REQUEST_PATH, upstream = %self.addr, %branch, "timer c fired: cancelling the branch");
                        let c = proxy::cancel_for(&sent).to_bytes();
                        let _ = socket.send(&c).await;
                        cancel = Some(c);
                        transmissions = 1;
                        resend =
                            (!reliable).then(|| Instant::now() + up::retransmit_interval(false, 1));
                    }
                },
                None => {
                    // A lost datagram is resent (RFC 3261 17.1.1.2, 17.1.2.2).
                    let (again, invite) = match &cancel {
                        Some(c) => (c, false),
                        None => (&bytes, invite),
                    };
                    let _ = socket.send(again).await;
                    transmissions += 1;
                    resend = Some(Instant::now() + up::retransmit_interval(invite, transmissions));
                }
                Some(Datagram::Failed) => {
                    debug!(target: REQUEST_PATH, upstream = %self.addr, "sip upstream transport error");
                    return emit(&generated(503, "Service Unavailable"));
                }
                Some(Datagram::Answer(msg)) => match up::receive(msg, &branch) {
                    Received::Ignore => {}
                    Received::Trying => {
                        timers.on_provisional(now(), 100);
                        if cancel.is_none() {
                            resend = (!invite && !reliable).then(|| Instant::now() + up::T2);
                        }
                    }
                    Received::Provisional(m) => {
                        if let StartLine::Response { status, .. } = m.start {
                            timers.on_provisional(now(), status);
                        }
                        if cancel.is_none() {
                            resend = (!invite && !reliable).then(|| Instant::now() + up::T2);
                        }
                        emit(&up::relayed_answer(m, method, node));
                    }
                    Received::Final(m) => {
                        if let Some(a) = up::owner_ack(&sent, &m) {
                            let _ = socket.send(&a.to_bytes()).await;
                            self.completed.lock().expect("completed lock").insert(
                                branch.clone(),
                                a,
                                now(),
                            );
                        }
                        return emit(&up::relayed_answer(m, method, node));
                    }
                },
            }
        }
    }
}

/// Hands `msg`, a response from the upstream, to the transaction its top
/// `Via` branch and `CSeq` method name; a retransmitted final answer of a
/// completed INVITE gives the ACK to send again; anything else is
/// dropped.
fn hand_over(
    msg: SipMessage,
    waiting: &Waiting,
    (completed, epoch): (&Mutex<Completed>, Instant),
) -> Option<Vec<u8>> {
    let key = match (msg.top_via().and_then(|v| v.param("branch")), msg.cseq()) {
        (Some(b), Some((_, m))) => (b.to_owned(), m.to_owned()),
        _ => return None,
    };
    let map = waiting.lock().expect("waiting lock");
    match map.get(&key) {
        Some(tx) => {
            let _ = tx.send(Datagram::Answer(msg));
            None
        }
        None if key.1 == "INVITE" => completed
            .lock()
            .expect("completed lock")
            .ack_of(&key.0, epoch.elapsed())
            .map(SipMessage::to_bytes),
        None => None,
    }
}

impl CalleeRelay {
    /// Relays `req`, sent by the upstream, toward the caller as a
    /// transaction-stateful proxy (RFC 3261 16): `engine::sip::upstream`
    /// `callee_request` prepares it (or refuses it: the refusal goes to
    /// `emit`); an INVITE is answered `100 Trying` at once (17.2.1); the
    /// request goes out over the caller's own connection when its dialog
    /// names one that is open (RFC 5923), else from an ephemeral socket
    /// connected to the target ([`Self::first_send`]), with the owner's
    /// `Via` naming that socket, and is resent on Timer A/E over UDP; the answers on that socket whose top `Via` has the owner's
    /// branch and whose `CSeq` method is the request's lose that `Via` and
    /// go to `emit` (`100` excepted) until the final one; a non-2xx final
    /// answer to an INVITE is ACKed by the owner (17.1.1.3). No final
    /// answer within Timer B (32 s): `408`; the caller's port closed or
    /// the socket failing: `503`; the caller's connection gone and no
    /// other way to it: `430` (RFC 5626 5.3). An ACK is sent once,
    /// unanswered.
    async fn relay(&self, req: SipMessage, emit: &Emit<'_>) {
        // Long: one request the server sends toward a caller, relayed and its answers brought
        // back (RFC 3261 16.6-16.7), one sequence read top to bottom.
        let method = req.method().unwrap_or("").to_owned();
        let (ack, invite) = (method == "ACK", method == "INVITE");
        let (out, target) = match up::callee_request(&req, &self.node) {
            Ok(x) => x,
            Err(refusal) => {
                if let Some(r) = refusal {
                    emit(&r);
                }
                return;
            }
        };
        let branch = up::callee_branch(&req, &self.node);
        let (stray_tx, mut strays) = mpsc::unbounded_channel::<SipMessage>();
        let _inflight = if ack {
            None
        } else {
            let key = (branch.clone(), method.clone());
            let mut set = self.inflight.lock().expect("callee inflight lock");
            if set.contains_key(&key) || set.len() >= MAX_CALLEE_INFLIGHT {
                return;
            }
            set.insert(key.clone(), stray_tx);
            Some(CalleeEntry {
                set: &self.inflight,
                key,
            })
        };
        let generated = |status: u16, reason: &str| refusal(&req, status, reason, &self.node);
        if invite {
            emit(&req.response(100, "Trying", None));
        }
        let (mut sock, sent) = match self.first_send(&req, out, target, &branch).await {
            Ok(x) => x,
            Err(refused) => {
                if let Some(r) = refused {
                    emit(&r);
                }
                return;
            }
        };
        let bytes = sent.to_bytes();
        if ack {
            return;
        }
        let start = Instant::now();
        let deadline = start + up::TIMER_B;
        let mut transmissions = 1;
        let reliable = sock.reliable();
        let mut resend = (!reliable).then(|| start + up::retransmit_interval(invite, 1));
        let mut buf = vec![0u8; MAX_MESSAGE + 1];
        loop {
            let wake = resend.map_or(deadline, |r| r.min(deadline));
            // The caller's answers come to the socket, or to a listener
            // (over the caller's own connection, say) and from there here.
            let got = tokio::select! {
                r = sock.recv(&mut buf) => Some(r.map(|n| sipmsg::parse(&buf[..n]).ok())),
                Some(m) = strays.recv() => Some(Ok(Some(m))),
                _ = tokio::time::sleep_until(wake) => None,
            };
            match got {
                None if Instant::now() >= deadline => {
                    debug!(target: REQUEST_PATH, %branch, "sip relay to the caller: no final answer in time");
                    emit(&generated(408, "Request Timeout"));
                    return;
                }
                None => {
                    let _ = sock.send(&bytes).await;
                    transmissions += 1;
                    resend = Some(Instant::now() + up::retransmit_interval(invite, transmissions));
                }
                Some(Err(e)) => {
                    debug!(target: REQUEST_PATH, %branch, error = %e, "sip relay to the caller: transport error");
                    emit(&generated(503, "Service Unavailable"));
                    return;
                }
                Some(Ok(parsed)) => {
                    let Some(msg) = parsed else {
                        continue;
                    };
                    if msg.cseq().map(|(_, m)| m) != Some(method.as_str()) {
                        continue;
                    }
                    match up::receive(msg, &branch) {
                        Received::Ignore => {}
                        Received::Trying => {
                            resend = (!invite && !reliable).then(|| Instant::now() + up::T2);
                        }
                        Received::Provisional(m) => {
                            resend = (!invite && !reliable).then(|| Instant::now() + up::T2);
                            emit(&m);
                        }
                        Received::Final(m) => {
                            if let Some(a) = up::owner_ack(&sent, &m) {
                                let _ = sock.send(&a.to_bytes()).await;
                            }
                            emit(&m);
                            return;
                        }
                    }
                }
            }
        }
    }
}

impl CalleeRelay {
    /// Sends `out`, the request `req` of the upstream made ready for the
    /// caller, with the owner's `Via` (`branch`) on top, the first time:
    /// over the caller's own connection when `target` names one and it is
    /// open (RFC 5923), else to `target.dest` from a new socket (UDP) or
    /// over a new TCP connection. Returns the socket and the request as
    /// sent.
    ///
    /// # Errors
    /// The answer for the upstream (none for an ACK): `430 Flow Failed`
    /// when the caller's connection is gone and no other way reaches it
    /// (RFC 5626 5.3), else `503` when no socket opens or the send fails.
    async fn first_send(
        &self,
        req: &SipMessage,
        out: SipMessage,
        target: up::Target,
        branch: &str,
    ) -> Result<(CallerSocket, SipMessage), Option<SipMessage>> {
        let ack = req.method() == Some("ACK");
        let mut flow_gone = false;
        if let Some(route) = target.flow {
            let (via, local) = up::flow_via(&route);
            let mut sock = CallerSocket::Flow(FlowSocket {
                route,
                reach: self.reach.clone(),
            });
            let sent = up::with_via(out.clone(), via, local, branch);
            match sock.send(&sent.to_bytes()).await {
                Ok(()) => {
                    let c = &self.reach.state.counters;
                    c.sip_flow_requests.fetch_add(1, Ordering::Relaxed);
                    return Ok((sock, sent));
                }
                Err(e) => {
                    debug!(target: REQUEST_PATH, error = %e, "sip relay to the caller: its connection is gone");
                    let c = &self.reach.state.counters;
                    c.sip_flow_failed.fetch_add(1, Ordering::Relaxed);
                    flow_gone = true;
                }
            }
        }
        let failed = || {
            if flow_gone {
                up::flow_failed(req, &self.node)
            } else {
                (!ack).then(|| refusal(req, 503, "Service Unavailable", &self.node))
            }
        };
        let Ok(dest) = target.dest else {
            return Err(failed());
        };
        let to = dest.addr;
        let opened = if dest.tcp {
            CallerSocket::tcp(to, up::T1 * 64).await
        } else {
            connected(to).await.map(CallerSocket::Udp)
        };
        let mut sock = match opened {
            Ok(s) => s,
            Err(e) => {
                debug!(target: REQUEST_PATH, %to, error = %e, "sip relay to the caller: no socket");
                return Err(failed());
            }
        };
        let Ok(local) = sock.local_addr() else {
            return Err(failed());
        };
        let sent = up::with_via(out, sock.via_name(), local, branch);
        if let Err(e) = sock.send(&sent.to_bytes()).await {
            debug!(target: REQUEST_PATH, %to, error = %e, "sip relay to the caller: send failed");
            return Err(failed());
        }
        Ok((sock, sent))
    }
}

/// The owner's own answer `status` to `req`, a request of its upstream
/// (its `Served-By` naming `node`).
fn refusal(req: &SipMessage, status: u16, reason: &str, node: &str) -> SipMessage {
    let mut r = req.response(status, reason, None);
    r.headers
        .push((sipmsg::SERVED_BY.to_owned(), node.to_owned()));
    r
}

/// A relayed request's place in `CalleeRelay::inflight`, removed when its
/// transaction ends.
struct CalleeEntry<'a> {
    set: &'a Mutex<BTreeMap<(String, String), mpsc::UnboundedSender<SipMessage>>>,
    key: (String, String),
}

impl Drop for CalleeEntry<'_> {
    fn drop(&mut self) {
        self.set
            .lock()
            .expect("callee inflight lock")
            .remove(&self.key);
    }
}

/// A transaction's place in `SipUpstream::waiting`, removed when it ends
/// or is dropped unfinished.
struct Registered<'a> {
    map: &'a Waiting,
    key: (String, String),
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.map.lock().expect("waiting lock").remove(&self.key);
    }
}

/// A transaction's place in `SipUpstream::inflight`, removed when the
/// transaction ends or is dropped unfinished.
struct InflightEntry<'a> {
    map: &'a Mutex<BTreeMap<(String, String), Outcome>>,
    key: (String, String),
}

impl Drop for InflightEntry<'_> {
    fn drop(&mut self) {
        self.map.lock().expect("inflight lock").remove(&self.key);
    }
}

/// A UDP socket on an ephemeral port, connected to `to`.
async fn connected(to: SocketAddr) -> std::io::Result<UdpSocket> {
    let any: SocketAddr = if to.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = UdpSocket::bind(any).await?;
    s.connect(to).await?;
    Ok(s)
}
