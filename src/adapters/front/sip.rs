//! The SIP front end: UDP and TCP listeners on the node's `sip_addr` (and
//! on the shared SIP address, SO_REUSEPORT, under `peerlb up`), the entry
//! node's routing and forwarding of SIP requests over the peer wire, and
//! the owner's built-in demo server ([`SipApp`]).
//!
//! Path of a request (docs/architecture.md, "SIP"):
//!
//! 1. Parse (`engine::sip`). Bytes that are not a SIP message get `400`
//!    when they are a request whose `Via` can be read, else are dropped; a
//!    response from a client is dropped (nothing on a listener waits for
//!    one: the answers to requests relayed toward a caller come to the
//!    relay's own socket). On TCP a framing error also closes the
//!    connection. A UDP request from the upstream SIP server's address is
//!    the callee's side of a dialog and is relayed toward the caller
//!    instead (`serve/sip/upstream.rs`).
//! 2. The proxy steps (`engine::sip::forward::entry_steps`):
//!    `Max-Forwards: 0` gets `483` (RFC 3261 16.3 step 3); otherwise it is
//!    decremented (16.6 step 3). A top `Route` carrying this cluster's
//!    dialog parameters is this cluster's own: it is removed (16.4).
//! 3. Route (`NodeState::decide_sip`): the dialog's owner (the
//!    Request-URI's, then the `Route`'s), else the key's owner on the
//!    ring. A dialog-creating `INVITE` gets a `Record-Route` naming the
//!    address the request reached, the owner and the key, and over TCP or
//!    TLS the caller's connection (`engine::sip::record_route`; the flow,
//!    RFC 5923, `serve/sip/flows.rs`).
//! 4. Serve locally, or forward to the owner (hop limit 1, a stream of
//!    kind `StreamKind::Sip`) with this node's `Via` on top
//!    (`engine::sip::forward::entry_via`); a candidate that cannot be
//!    reached or refuses the stream passes the request to the next ring
//!    node (`forward::next_candidate`). The owner's answers come back on the same stream; this node
//!    removes its `Via` and sends them to the client: over TCP on the same
//!    connection, over UDP to the address `engine::sip::response_destination`
//!    gives.
//!
//! With `sip_app = "udp:<ip>:<port>"` the owner forwards the request to
//! that upstream SIP server instead (`serve/sip/upstream.rs`) and its answers
//! take the same way back.
//!
//! The listeners run inside the node's runtime only in production: the
//! simulation binds no SIP sockets (`Env::sip` is `None` there).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http_body_util::BodyExt as _;
use tokio::net::UdpSocket;
use tokio::sync::watch;
use tracing::{Instrument as _, debug, debug_span, info};

use crate::adapters::REQUEST_PATH;
use crate::adapters::body;
use crate::adapters::node_state::NodeState;
use crate::adapters::transport::peer::{self, PeerLinks};
use crate::adapters::wire::{RequestHeadRef, StreamKind};
use crate::engine::node_id::NodeId;
use crate::engine::sip::forward::{self, ForwardFailure};
use crate::engine::sip::proxy::{self, EntryRelay, Stray};
use crate::engine::sip::udp_guard::{self, RateLimit, Verdict};
use crate::engine::sip::{
    self as sipmsg, MAX_MESSAGE, SipMessage, Transport, is_sips_request, record_route,
};

pub(crate) use crate::adapters::serve::sip::{
    Emit, SipApp, SipUpstream, UpstreamTlsError, upstream_of,
};
pub(crate) use tcp::{TcpLimits, serve_tcp, sips_acceptor};

mod tcp;

/// The tracing target of this module's events: its path before the
/// adapters were put in wings (`crate::adapters::REQUEST_PATH`).
const LOG: &str = "peerlb::adapters::sip";

/// UDP datagrams handled at once; more are dropped unread (their senders
/// retransmit, RFC 3261 17.1.1.2), so a flood cannot pile up tasks.
const MAX_UDP_INFLIGHT: usize = 10_000;

/// The entry side of SIP on one node.
pub(crate) struct SipEntry {
    state: Arc<NodeState>,
    app: Arc<SipApp>,
    links: Arc<PeerLinks>,
    response_timeout: Duration,
    /// The longest an owner's stream may go without an answer once it
    /// began: Timer C, plus `response_timeout` for the CANCEL's wait
    /// (the owner's own deadlines end the transaction before).
    answer_gap: Duration,
    read_timeout: Duration,
    tcp: TcpLimits,
    /// The per-source request rate over UDP, shared by the UDP listeners.
    udp_rate: std::sync::Mutex<RateLimit>,
    /// The clock of `udp_rate`.
    epoch: tokio::time::Instant,
}

impl SipEntry {
    /// The entry side of the node whose state is `state`; it serves with
    /// `app` when it owns a request. An owner's answer is awaited at most
    /// `response_timeout` for its head, then `timer_c` plus
    /// `response_timeout` between two answers (the owner's Timer C,
    /// `limits.sip_timer_c_ms`); a TCP message started but not finished
    /// within `read_timeout` closes its connection; TCP connections are
    /// held to `tcp`; over UDP a source may send `udp_rate.0` requests
    /// per `udp_rate.1` (0: no limit).
    pub(crate) fn new(
        state: Arc<NodeState>,
        app: Arc<SipApp>,
        links: Arc<PeerLinks>,
        (response_timeout, read_timeout, timer_c): (Duration, Duration, Duration),
        tcp: TcpLimits,
        udp_rate: (u32, Duration),
    ) -> SipEntry {
        SipEntry {
            state,
            app,
            links,
            response_timeout,
            answer_gap: timer_c.saturating_add(response_timeout),
            read_timeout,
            tcp,
            udp_rate: std::sync::Mutex::new(RateLimit::new(udp_rate.0, udp_rate.1)),
            epoch: tokio::time::Instant::now(),
        }
    }

    /// Whether a UDP request from `client` is within its source's rate
    /// (`limits.sip_udp_requests_per_source`); one past it is counted.
    /// The upstream SIP server (`sip_app`) is not limited.
    fn udp_admits(&self, client: SocketAddr) -> bool {
        if self.app.upstream().is_some_and(|up| up.addr() == client) {
            return true;
        }
        let now = self.epoch.elapsed();
        let verdict = self
            .udp_rate
            .lock()
            .expect("sip udp rate lock")
            .check(client.ip(), now);
        if verdict == Verdict::Drop {
            self.state
                .counters
                .sip_udp_rate_limited
                .fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Hands `emit` the answers to one message from `client` that reached
    /// the listener on `local` (the node's `sip_addr` or the shared sprayer
    /// address, named in this node's `Record-Route` and `Via`; see the
    /// module doc) as they come: for an INVITE `100 Trying` at once, then
    /// the owner's answers but its `100`, at most one final answer
    /// (`engine::sip::proxy::EntryRelay`). `flow` is the flow token of
    /// the caller's TCP or TLS connection (`serve/sip/flows.rs`), named in
    /// the `Record-Route` so that the server's requests toward the caller
    /// reach it over that connection (RFC 5923).
    async fn handle(
        &self,
        buf: &[u8],
        client: SocketAddr,
        (transport, local): (Transport, SocketAddr),
        flow: Option<&str>,
        emit: &Emit<'_>,
    ) {
        let mut msg = match sipmsg::parse(buf) {
            Ok(m) => m,
            Err(e) => {
                self.state
                    .counters
                    .sip_malformed
                    .fetch_add(1, Ordering::Relaxed);
                debug!(target: REQUEST_PATH, %client, error = %e, "malformed sip message");
                if let Some(r) = sipmsg::bad_request(buf, &e) {
                    emit(&r);
                }
                return;
            }
        };
        let Some(method) = msg.method().map(str::to_owned) else {
            return self.stray(msg, client, transport).await;
        };
        self.state
            .counters
            .sip_requests
            .fetch_add(1, Ordering::Relaxed);
        // RFC 3581 / RFC 3261 18.2.1: the top Via records the source
        // (`received`, and `rport` when asked), which every answer copies.
        msg.note_source(client);
        // Decided on the message as received (its Route still on top).
        let view = self.state.view();
        let decision = self.state.decide_sip(&msg, client, &view);
        // RFC 3261 16.3-16.6 (`engine::sip::forward`).
        let sips = is_sips_request(&msg);
        let rr = || {
            record_route(
                local,
                transport,
                sips,
                (&decision.owner, &decision.key),
                flow,
            )
        };
        if let Err(refusal) = forward::entry_steps(&mut msg, rr) {
            if let Some(r) = refusal {
                emit(&r);
            }
            return;
        }
        let me = self.state.node_id();
        let (relay, trying) = EntryRelay::new(&msg);
        if let Some(t) = &trying {
            emit(t);
        }
        let relay = std::sync::Mutex::new(relay);
        let pass = |m: &SipMessage| {
            let out = relay.lock().expect("sip relay lock").pass(m.clone());
            if let Some(m) = out {
                emit(&m);
            }
        };
        let span = debug_span!(target: REQUEST_PATH, "sip", %client, method = %method, owner = %decision.owner, reason = decision.reason.as_str());
        async {
            for cand in decision.candidates(&view) {
                if cand == me {
                    return self.app.answer(&msg, &pass).await;
                }
                match self.forward(cand, &msg, &method, (client, local), transport, &decision.key, view.version(), &pass).await {
                    Ok(()) => return,
                    Err((failure, why)) if forward::next_candidate(failure) => {
                        debug!(target: REQUEST_PATH, peer = %cand, %why, "sip owner not reachable: trying the next candidate");
                    }
                    Err((_, why)) => {
                        debug!(target: REQUEST_PATH, peer = %cand, %why, "sip forward failed");
                        break;
                    }
                }
            }
            let failed = relay.lock().expect("sip relay lock").on_failure(&msg);
            if let Some(r) = failed {
                emit(&r);
            }
        }
        .instrument(span)
        .await
    }

    /// Takes `resp`, a response that reached a listener from `client`: an
    /// answer of the upstream SIP server to an owner's transaction, sent
    /// to the wrong address (a server that answers where it thinks the
    /// request came from, not to the `Via`), goes to that transaction, on
    /// this node or, over the peer wire, once, on the owner its branch
    /// names (`engine::sip::proxy::stray_response`); anything else is
    /// dropped.
    async fn stray(&self, resp: SipMessage, client: SocketAddr, transport: Transport) {
        let Some(up) = self.app.upstream() else {
            debug!(target: REQUEST_PATH, %client, "sip response at a listener: dropped");
            return;
        };
        let me = self.state.node_id();
        let to = match proxy::stray_response(&resp, me.as_str(), client.ip() == up.addr().ip()) {
            Stray::Drop => {
                debug!(target: REQUEST_PATH, %client, "sip response at a listener, no transaction of this cluster's: dropped");
                return;
            }
            Stray::Mine => return up.deliver(resp).await,
            Stray::Peer(n) => NodeId::from(n),
        };
        let relayed = async {
            let bytes = resp.to_bytes();
            let mut headers = http::HeaderMap::new();
            headers.insert(http::header::CONTENT_LENGTH, bytes.len().into());
            let mut out = peer::Outgoing::new(
                StreamKind::Sip(transport.into()),
                RequestHeadRef {
                    request_id: xxhash_rust::xxh3::xxh3_128(&bytes),
                    entry: me,
                    hops: 1,
                    view_version: self.state.view().version(),
                    method: "SIP",
                    uri: "/",
                    headers: &headers,
                    client,
                    hash_key: None,
                    tls: None,
                },
                &[],
            );
            let (_, body) = peer::send(
                &self.links,
                &to,
                &mut out,
                body::full(bytes),
                self.response_timeout,
            )
            .await
            .map_err(|e| e.to_string())?;
            // Read to its end (an empty body), so the stream closes cleanly.
            body.collect().await.map_err(|e| e.to_string())?;
            Ok::<_, String>(())
        };
        if let Err(why) = relayed.await {
            debug!(target: REQUEST_PATH, peer = %to, %why, "sip response for a peer's transaction: not relayed");
        }
    }

    /// Forwards `msg` to `peer` and hands `emit` its answers as they come
    /// on the stream, this node's `Via` removed.
    #[allow(clippy::too_many_arguments)]
    async fn forward(
        &self,
        peer: &NodeId,
        msg: &SipMessage,
        method: &str,
        (client, local): (SocketAddr, SocketAddr),
        transport: Transport,
        key: &str,
        view_version: u64,
        emit: &Emit<'_>,
    ) -> Result<(), (ForwardFailure, String)> {
        use ForwardFailure::Failed;
        self.state
            .counters
            .sip_forwarded
            .fetch_add(1, Ordering::Relaxed);
        let out = forward::entry_via(msg, (transport, local), self.state.node_id().as_str());
        let bytes = out.to_bytes();
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::CONTENT_LENGTH, bytes.len().into());
        let request_id = xxhash_rust::xxh3::xxh3_128(&bytes);
        let mut outgoing = peer::Outgoing::new(
            StreamKind::Sip(transport.into()),
            RequestHeadRef {
                request_id,
                entry: self.state.node_id(),
                hops: 1,
                view_version,
                method,
                uri: "/",
                headers: &headers,
                client,
                hash_key: Some(key),
                tls: None,
            },
            &[],
        );
        let (head, body) = peer::send(
            &self.links,
            peer,
            &mut outgoing,
            body::full(bytes),
            self.response_timeout,
        )
        .await
        .map_err(failure_of)?;
        if head.status != 200 {
            return Err((Failed, format!("owner answered status {}", head.status)));
        }
        // The answers as they come, each framed by its Content-Length;
        // `buf` holds at most one message and the start of the next.
        let mut body = std::pin::pin!(body);
        let mut buf: Vec<u8> = Vec::new();
        loop {
            loop {
                let n = match sipmsg::frame_len(&buf) {
                    Ok(Some(n)) => n,
                    Ok(None) if buf.len() <= MAX_MESSAGE => break,
                    _ => return Err((Failed, "owner's answers do not frame as SIP".into())),
                };
                let m = sipmsg::parse(&buf[..n])
                    .map_err(|e| (Failed, format!("owner's answer: {e}")))?;
                buf.drain(..n);
                emit(&forward::from_owner(m));
            }
            let frame = tokio::time::timeout(self.answer_gap, body.as_mut().frame())
                .await
                .map_err(|_| (Failed, "no answer from the owner in time".to_owned()))?;
            match frame {
                None if buf.is_empty() => return Ok(()),
                None => return Err((Failed, "owner's answers end inside a message".into())),
                Some(Err(e)) => return Err((Failed, e.to_string())),
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

/// What a failed send to a candidate was, for the entry's retry rule
/// (`forward::next_candidate`): nothing reached it (no stream:
/// unreachable; the stream refused unread), or the owner may have taken
/// it.
fn failure_of(e: peer::SendError) -> (ForwardFailure, String) {
    let why = e.to_string();
    match e {
        peer::SendError::Open(_) => (ForwardFailure::Unreachable, why),
        peer::SendError::Exchange(peer::ExchangeError::Refused(_)) => {
            (ForwardFailure::Refused, why)
        }
        _ => (ForwardFailure::Failed, why),
    }
}

/// Serves SIP over UDP on `socket`, bound to `local` (the node's
/// `sip_addr`, or the shared sprayer address with SO_REUSEPORT), until
/// `stop` turns true: one task per datagram, answers sent from the same
/// socket, so a client sees them come from the address it sent to. A
/// request from the upstream SIP server's address (`sip_app`) is the
/// callee's side of a dialog: it is relayed toward the caller
/// (`SipUpstream::relay_from_upstream`) and the answers go back to the
/// upstream from this socket.
pub(crate) async fn serve_udp(
    socket: UdpSocket,
    local: SocketAddr,
    entry: Arc<SipEntry>,
    mut stop: watch::Receiver<bool>,
) {
    let socket = Arc::new(socket);
    info!(target: LOG, addr = %local, "listening for sip over udp");
    let mut buf = vec![0u8; MAX_MESSAGE + 1];
    let inflight = Arc::new(AtomicUsize::new(0));
    loop {
        let (n, client) = tokio::select! {
            r = socket.recv_from(&mut buf) => match r {
                Ok(r) => r,
                Err(e) => {
                    debug!(target: LOG, error = %e, "sip udp receive failed");
                    continue;
                }
            },
            _ = stop.wait_for(|s| *s) => return,
        };
        if inflight.load(Ordering::Relaxed) >= MAX_UDP_INFLIGHT {
            debug!(target: LOG, %client, "sip udp: too many datagrams in flight, dropped one");
            continue;
        }
        if !entry.udp_admits(client) {
            debug!(target: LOG, %client, "sip udp: source past its rate (limits.sip_udp_requests_per_source), dropped one");
            continue;
        }
        let datagram = buf[..n].to_vec();
        let (socket, entry) = (socket.clone(), entry.clone());
        inflight.fetch_add(1, Ordering::Relaxed);
        let guard = InflightGuard(inflight.clone());
        tokio::spawn(async move {
            let _guard = guard;
            if let Some(up) = entry.app.upstream()
                && up.addr() == client
                && let Ok(req) = sipmsg::parse(&datagram)
                && req.method().is_some()
            {
                let emit = |m: &SipMessage| {
                    if let Some(via) = m.top_via() {
                        let to = sipmsg::response_destination(&via, client);
                        let _ = socket.try_send_to(&m.to_bytes(), to);
                    }
                };
                up.relay_from_upstream(req, &emit).await;
                return;
            }
            // A UDP source may be forged: what it draws from the built-in
            // server or from this node (400, 483, 503) stays within twice
            // what it sent, final answers first: those answers come at
            // once, so they are gathered and then sent. An upstream SIP
            // server's answers are relayed as it gives them (a ringing
            // call's 180 long before its 200): authenticating its callers
            // is its part (docs/operations.md, "What to firewall").
            if entry.app.upstream().is_some() {
                let send = |m: &SipMessage| {
                    if let Some(via) = m.top_via() {
                        let to = sipmsg::response_destination(&via, client);
                        if let Err(e) = socket.try_send_to(&m.to_bytes(), to) {
                            debug!(target: LOG, error = %e, %to, "sip udp send failed");
                        }
                    }
                };
                entry
                    .handle(&datagram, client, (Transport::Udp, local), None, &send)
                    .await;
                return;
            }
            let gathered = std::sync::Mutex::new(Vec::new());
            let gather = |m: &SipMessage| {
                let bytes = m.to_bytes();
                gathered
                    .lock()
                    .expect("sip answers lock")
                    .push((m.clone(), bytes));
            };
            entry
                .handle(&datagram, client, (Transport::Udp, local), None, &gather)
                .await;
            let mut answers = gathered.into_inner().expect("sip answers lock");
            let mut keep = proxy::moot_trying(answers.iter().map(|(m, _)| m)).into_iter();
            answers.retain(|_| keep.next().unwrap_or(true));
            let sizes: Vec<(usize, bool)> = answers
                .iter()
                .map(|(m, b)| (b.len(), is_final(m)))
                .collect();
            let keep = udp_guard::answers_within_bound(datagram.len(), &sizes);
            for ((answer, bytes), keep) in answers.into_iter().zip(keep) {
                if !keep {
                    entry
                        .state
                        .counters
                        .sip_udp_answers_withheld
                        .fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let Some(via) = answer.top_via() else {
                    continue;
                };
                let to = sipmsg::response_destination(&via, client);
                if let Err(e) = socket.send_to(&bytes, to).await {
                    debug!(target: LOG, error = %e, %to, "sip udp send failed");
                }
            }
        });
    }
}

/// Whether `m` is a final response (status 200 or more, RFC 3261 section
/// 7.2); a request counts as final.
fn is_final(m: &SipMessage) -> bool {
    !matches!(m.start, sipmsg::StartLine::Response { status, .. } if status < 200)
}

/// Counts one datagram in flight until dropped.
struct InflightGuard(Arc<AtomicUsize>);

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INVITE: &str = "INVITE sip:bob@h SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.9:5060;branch=z9hG4bK-plb-1\r\n\
        Via: SIP/2.0/UDP 192.0.2.1:5070;branch=z9hG4bKc\r\nFrom: <sip:a@h>;tag=1\r\nTo: <sip:bob@h>\r\n\
        Call-ID: c\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n";

    /// The owner's side of the `peerlb-sip` exchange: every answer of the
    /// demo server in the body as it comes, each framed by its
    /// Content-Length; a body
    /// that is not a SIP request is a 400 with no body.
    #[tokio::test]
    async fn a_proxied_sip_request_is_answered_with_framed_sip_responses() {
        let app = Arc::new(SipApp::new(
            NodeId::from("n2"),
            Some("127.0.0.1:5062".parse().unwrap()),
        ));
        let r = app
            .clone()
            .serve_proxied(body::full(INVITE.as_bytes().to_vec()), ())
            .await;
        assert_eq!(r.status(), 200);
        let bytes = r.into_body().collect().await.unwrap().to_bytes();
        let mut rest = &bytes[..];
        let mut statuses = Vec::new();
        while !rest.is_empty() {
            let n = sipmsg::frame_len(rest).unwrap().unwrap();
            let m = sipmsg::parse(&rest[..n]).unwrap();
            // The entry's Via is still on top: the entry removes it.
            assert_eq!(m.top_via().unwrap().param("branch"), Some("z9hG4bK-plb-1"));
            if let sipmsg::StartLine::Response { status, .. } = m.start {
                statuses.push(status);
            }
            rest = &rest[n..];
        }
        assert_eq!(statuses, vec![100, 180, 200]);
        for junk in [&b"garbage"[..], b"SIP/2.0 200 OK\r\n\r\n"] {
            let r = app
                .clone()
                .serve_proxied(body::full(junk.to_vec()), ())
                .await;
            assert_eq!(r.status(), 400);
        }
    }
}
