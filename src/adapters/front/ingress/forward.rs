//! Forward with failover and replay: the engine decides the owner and the
//! candidates, and the replay plan ([`ReplayPlan`]) says how the body is
//! sent and whether the next candidate is tried after a failure; this file
//! reads the body, serves locally or opens the peer streams, and applies
//! the sticky route the engine announces.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderValue, Request, Response, header};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tracing::{Instrument, debug, debug_span, warn};

use super::limits::{request_target, set_route, strip_peerlb_headers, strip_route_param};
use crate::adapters::REQUEST_PATH;
use crate::adapters::access;
use crate::adapters::body::{self, Body};
use crate::adapters::errors::{self, RequestError};
use crate::adapters::http::ConnInfo;
use crate::adapters::http::relay::Answer;
use crate::adapters::node_state::{Hold, NodeState, track_body};
use crate::adapters::serve::app::ServeCtx;
use crate::adapters::serve::forwarded;
use crate::adapters::serve::owner::Owner;
use crate::adapters::transport::peer::{self, ExchangeError, PeerLinks, TunnelAnswer};
use crate::adapters::tunnel::{self, Tunnel};
use crate::adapters::wire::{self, DecodedResponseHead, RequestHeadRef, StreamKind};
use crate::engine::RouteCookie;
use crate::engine::failover::{AfterFailure, BodyPlan, Failure, REPLAY_LIMIT, ReplayPlan};
use crate::engine::header_scan::Scan as _;
use crate::engine::membership::MembershipView;
use crate::engine::node_id::NodeId;
use crate::engine::ownership;
use crate::engine::route::{Decision, EntryDecision};
use crate::engine::rules::RequestView;
use crate::engine::sticky::Session;

/// Response header naming the node that served the request.
pub(crate) const SERVED_BY: &str = "peerlb-served-by";

/// [`SERVED_BY`] as a header name, made once (a `&str` name is parsed
/// again on every insert).
const SERVED_BY_NAME: http::HeaderName = http::HeaderName::from_static(SERVED_BY);

/// A request's answer from the candidate loop.
struct Served {
    resp: Response<Body>,
    /// Who served it.
    by: NodeId,
    /// [`Served::by`] as the `peerlb-served-by` value, when the answer
    /// brought it (a peer's head: a slice of its frame, no copy).
    by_value: Option<HeaderValue>,
    /// Keeps it outstanding to its server, and counted as served by the
    /// local app when it was, until its body ends.
    hold: Hold,
    /// Its body is read from a peer stream (`relay::Answer::from_peer`).
    from_peer: bool,
}

fn content_length(h: &http::HeaderMap) -> Option<u64> {
    h.first(&header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// A request body the candidate loop takes: a client's (read under
/// `limits.body_read_timeout_ms`, counted for the access line) or an app's
/// own ([`Forwarder::forward_app`]: as it is).
pub(super) trait Inbound: http_body::Body {
    /// The body as the loop sends it.
    fn into_sent(
        self,
        idle: Duration,
        counted: Option<Arc<std::sync::atomic::AtomicU64>>,
        end: Option<body::BodyEnd>,
    ) -> Body;
}

impl Inbound for Incoming {
    fn into_sent(
        self,
        idle: Duration,
        counted: Option<Arc<std::sync::atomic::AtomicU64>>,
        end: Option<body::BodyEnd>,
    ) -> Body {
        body::from_incoming_with_timeout(self, idle, counted, end)
    }
}

impl Inbound for Body {
    fn into_sent(
        self,
        _: Duration,
        _: Option<Arc<std::sync::atomic::AtomicU64>>,
        _: Option<body::BodyEnd>,
    ) -> Body {
        self
    }
}

/// Settings of routing and forwarding.
#[derive(Debug, Clone, Copy)]
pub(super) struct ForwardSettings {
    /// Longest wait for an owner's response head.
    pub(super) response_timeout: Duration,
    /// Longest wait between two reads of a request body.
    pub(super) body_read_timeout: Duration,
    /// Add `peerlb-served-by`.
    pub(super) header_served_by: bool,
    /// Keep a client-sent `X-Request-Id` that is a UUID
    /// (`headers.trust_client_forwarded`).
    pub(super) keep_client_request_id: bool,
}

/// Routes client requests and serves them: locally through the owner side,
/// or forwarded to a peer with failover and replay.
pub(super) struct Forwarder {
    state: Arc<NodeState>,
    /// Serves the requests this node is the first candidate for.
    owner: Arc<Owner>,
    links: Arc<PeerLinks>,
    rng: Mutex<SmallRng>,
    epoch: tokio::time::Instant,
    settings: ForwardSettings,
    /// This node's id as a header value (`peerlb-served-by`), made once.
    id_header: Option<HeaderValue>,
    /// The sticky route cookie's name and attributes (`[sticky]`).
    route_cookie: RouteCookie,
}

impl Forwarder {
    /// A forwarder for the node whose state is `state`; `seed` seeds
    /// request ids and random picks.
    pub(super) fn new(
        state: Arc<NodeState>,
        owner: Arc<Owner>,
        links: Arc<PeerLinks>,
        settings: ForwardSettings,
        route_cookie: RouteCookie,
        seed: u64,
    ) -> Forwarder {
        Forwarder {
            route_cookie,
            id_header: HeaderValue::from_str(state.node_id()).ok(),
            state,
            owner,
            links,
            rng: Mutex::new(SmallRng::seed_from_u64(seed)),
            epoch: tokio::time::Instant::now(),
            settings,
        }
    }

    /// 16 bytes from the forwarder's seeded RNG: the nonce of a
    /// `Sec-WebSocket-Key` the entry makes (RFC 6455 section 4.1).
    pub(super) fn nonce(&self) -> [u8; 16] {
        self.rng.lock().expect("rng lock").random()
    }

    /// Routes a client request that passed the limits and serves it: the
    /// response, and the guards that keep it outstanding to its server
    /// (and served by the local app) until its body ends;
    /// `Err` is the error answer (already counted). Either way the request
    /// is counted by owner, and the decision set in `routed` (the access
    /// line's, when the access log is on: `access::Line`).
    pub(super) async fn route_and_serve(
        &self,
        mut req: Request<Incoming>,
        conn: &ConnInfo,
        routed: Option<&mut access::Routed>,
    ) -> Result<(Answer<Body>, Hold), Response<Body>> {
        strip_peerlb_headers(req.headers_mut());
        let client = conn.client;
        let view = self.state.view();
        let now = self.epoch.elapsed();
        let (EntryDecision { decision, sticky }, random_id) = {
            let rv = RequestView {
                method: req.method(),
                uri: req.uri(),
                headers: req.headers(),
                client,
                tls: conn.tls.is_some(),
                sni: conn.tls.as_ref().and_then(|t| t.sni.as_deref()),
            };
            let mut rng = self.rng.lock().expect("rng lock");
            let d = self.state.decide(&rv, &view, now, &mut *rng);
            (d, rng.random::<[u8; 16]>())
        };
        let request_id = access::request_id(
            req.headers_mut(),
            random_id,
            self.settings.keep_client_request_id,
        );
        let mut tries = 0u32;
        let logged = routed.map(|r| {
            r.request_id = request_id;
            r.reason = decision.reason.as_str();
            r.rule = match decision.reason {
                crate::engine::route::Reason::Rule(i) => Some(i),
                _ => None,
            };
            r.sticky = sticky.is_some();
            r.key.clone_from(&decision.key);
            (r, decision.owner.clone())
        });
        let served = self
            .serve_decided(req, conn, &view, decision, sticky, request_id, &mut tries)
            .await;
        let owner = match &served {
            Ok(Served { by: owner, .. }) | Err((_, owner)) => owner,
        };
        self.state.metrics.count_owner(owner);
        if let Some((r, decided)) = logged {
            r.failover = *owner != decided;
            r.retries = tries.saturating_sub(1);
            r.owner = Some(owner.clone());
        }
        match served {
            Ok(s) => Ok((
                Answer {
                    response: s.resp,
                    from_peer: s.from_peer,
                },
                s.hold,
            )),
            Err((e, _)) => Err(self.state.failed(e)),
        }
    }

    /// Sends an app's own request for `key` (`Handle::forward`) down the
    /// candidate loop a client request takes: the key's candidates in the
    /// current view (`ownership::candidates_of`, the router's order for a
    /// hashed request), failover and replay by the same plan, served here
    /// by the app when this node is the candidate. The response's body
    /// keeps the request counted in flight (and outstanding to its server)
    /// until it ends.
    pub(super) async fn forward_app(
        &self,
        key: &str,
        mut req: Request<Body>,
    ) -> Result<Response<Body>, RequestError> {
        strip_peerlb_headers(req.headers_mut());
        // A body of known length is announced, as a client's would be, so
        // a small one is kept for a replay (`ReplayPlan`).
        let h = req.headers();
        if !req.body().is_end_stream()
            && !h.has(&header::CONTENT_LENGTH)
            && !h.has(&header::TRANSFER_ENCODING)
            && let Some(n) = req.body().size_hint().exact()
        {
            req.headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
        let view = self.state.view();
        let random_id = self.rng.lock().expect("rng lock").random::<[u8; 16]>();
        let request_id = access::request_id(req.headers_mut(), random_id, false);
        // The app is the client: the owner's `RequestInfo::client` is this
        // node's client listener.
        let me = self.state.node_id();
        let here = view
            .get(me)
            .map_or(std::net::SocketAddr::from(([0, 0, 0, 0], 0)), |m| {
                m.http_addr
            });
        let conn = ConnInfo {
            client: here,
            peer: here,
            tls: None,
            cert_names: None,
            client_cert: None,
            forwarded: Default::default(),
            informational: Default::default(),
        };
        let inflight = self.state.enter();
        let mut tries = 0;
        let Served { resp, hold, .. } = Box::pin(self.serve_candidates(
            req,
            &conn,
            ownership::candidates_of(&view, key),
            Some(key),
            request_id,
            view.version(),
            &mut tries,
        ))
        .await?;
        Ok(track_body(resp, hold, inflight))
    }

    /// Serves a decided request: the response, its outstanding guard and
    /// who served it; or the error and the owner the decision picked.
    #[allow(clippy::too_many_arguments)]
    async fn serve_decided(
        &self,
        mut req: Request<Incoming>,
        conn: &ConnInfo,
        view: &MembershipView,
        decision: Decision,
        sticky: Option<Session>,
        request_id: u128,
        tries: &mut u32,
    ) -> Result<Served, (RequestError, NodeId)> {
        // The route parameter is peerlb's own mark: the app never sees it.
        let route_in_url = strip_route_param(req.uri_mut());
        // Per-request spans are debug level: at info, creating and closing
        // one (fields formatted into the registry) costs several percent of
        // a node's CPU per hop (docs/performance.md). Events that matter at
        // info carry the request id themselves.
        let span = debug_span!(target: REQUEST_PATH, "request", id = %uuid::Uuid::from_u128(request_id), owner = %decision.owner, reason = decision.reason.as_str());
        // Boxed: an awaited future is laid out inside the one awaiting it,
        // and every level above this one (hyper's slot for the service's
        // future, `Ingress::handle`, `route_and_serve`, this one) is moved
        // at least once per request. Unboxed, this future (2.6 KB: the
        // local app's call, the exchange, the attempt's state) made each of
        // them 2.6 KB larger, about 16 KB of copies per request; boxed,
        // one allocation and one copy.
        let mut served = Box::pin(self.serve_candidates(
            req,
            conn,
            decision.candidates(view),
            decision.key.as_deref(),
            request_id,
            view.version(),
            tries,
        ))
        .instrument(span)
        .await
        .map_err(|e| (e, decision.owner.clone()))?;
        let (resp, served_by) = (&mut served.resp, &served.by);
        let announcement = sticky.as_ref().and_then(|s| {
            let sets_cookie = resp.headers().contains_key(header::SET_COOKIE);
            s.announce(served_by, sets_cookie, route_in_url)
        });
        if let Some(a) = announcement {
            set_route(resp, &self.route_cookie, served_by, a);
        }
        if self.settings.header_served_by {
            let v = if *served_by == *self.state.node_id() {
                self.id_header.clone()
            } else {
                // A peer's answer brought the value (no copy); another
                // answer is this node's or made here.
                served
                    .by_value
                    .take()
                    .or_else(|| HeaderValue::from_str(served_by).ok())
            };
            if let Some(v) = v {
                resp.headers_mut().insert(SERVED_BY_NAME, v);
            }
        }
        Ok(served)
    }

    /// Tries each candidate in order; returns the response, who served it,
    /// and whether its body comes from a peer.
    #[allow(clippy::too_many_arguments)]
    async fn serve_candidates(
        &self,
        req: Request<impl Inbound>,
        conn: &ConnInfo,
        candidates: impl Iterator<Item = &NodeId>,
        key: Option<&str>,
        request_id: u128,
        view_version: u64,
        tries: &mut u32,
    ) -> Result<Served, RequestError> {
        // Long: the forwarding loop over the candidates: try one (local or over the peer wire),
        // judge the failure (engine/failover.rs), replay or answer; the attempts share the kept
        // body and the access line, one loop keeps their order in sight.
        let me = self.state.node_id();
        let (mut parts, incoming) = req.into_parts();
        // A WebSocket request: its stream to a peer is a tunnel (`wire`).
        let tunnel = tunnel::wants_websocket(&parts.method, parts.version, &parts.headers);
        let declared = content_length(&parts.headers);
        let request_bytes = declared.unwrap_or(0);
        let plan = ReplayPlan::new(&parts.method, incoming.is_end_stream(), declared);
        // A small body of an idempotent request is kept so the request can
        // be replayed on the next candidate; other bodies stream once.
        let counted = parts
            .extensions
            .get::<access::BodyBytes>()
            .map(|b| b.0.clone());
        // A request without a body is sent with an ended one: no read
        // timeout to arm, nothing to count, no wrapper to allocate.
        let (replay, mut body) = match plan.body() {
            BodyPlan::Empty => (None, Some(body::empty())),
            kept => {
                let timed = incoming.into_sent(
                    self.settings.body_read_timeout,
                    counted,
                    parts.extensions.get::<body::BodyEnd>().cloned(),
                );
                if kept == BodyPlan::Buffer {
                    let collected = http_body_util::Limited::new(timed, REPLAY_LIMIT as usize)
                        .collect()
                        .await
                        .map_err(|e| match e.downcast_ref::<body::BodyError>() {
                            Some(b) => RequestError::client_body(b),
                            None => RequestError::ClientBody(e.to_string()),
                        })?;
                    (Some(collected.to_bytes()), None)
                } else {
                    (None, Some(timed))
                }
            }
        };
        let empty_body = plan.body() == BodyPlan::Empty;
        // Where the app's 1xx answers go, when the client can take them
        // (`informational`): an HTTP/2 stream's sink rides in the request,
        // an HTTP/1.1 connection's is made here, once per request.
        let info = match parts
            .extensions
            .get::<crate::adapters::informational::Informational>()
        {
            Some(sink) => Some(sink.clone()),
            None => conn.informational.sink(parts.version),
        };
        // Trailers across the hop (`body::framed`): the response's when the
        // client takes them, the request's when it may have some (HTTP/2,
        // or an HTTP/1.1 body that names them in `Trailer`).
        // (An HTTP/2 request is in HTTP/1.1 form by now: `Http2Client`.)
        let h2 = parts.extensions.get::<body::Http2Client>().is_some();
        let frame_request = !tunnel
            && plan.body() == BodyPlan::Stream
            && (h2 || parts.headers.has(&http::header::TRAILER));
        let version = if h2 {
            http::Version::HTTP_2
        } else {
            parts.version
        };
        let trailers_mark = match (
            !tunnel && crate::adapters::serve::app::takes_trailers(version, &parts.headers),
            frame_request,
        ) {
            (true, true) => Some("te, framed"),
            (true, false) => Some("te"),
            (false, true) => Some("framed"),
            (false, false) => None,
        };
        let mut last_err: Option<RequestError> = None;
        // peerlb's marks travel after the request's own header lines, not
        // through its map (`MarkedRequestHead`).
        let mut marks = [("", ""); 2];
        let mut n = 0;
        if tunnel {
            marks[n] = (wire::TUNNEL, "websocket");
            n += 1;
        } else if info.is_some() {
            marks[n] = (wire::INFORMATIONAL, "1");
            n += 1;
        }
        if let Some(mark) = trailers_mark {
            marks[n] = (wire::TRAILERS, mark);
            n += 1;
        }
        let uri = request_target(&parts.uri);
        // The head is encoded at the first peer attempt, straight from the
        // request parts, and shared by every later one.
        let mut out = peer::Outgoing::new(
            StreamKind::Http,
            RequestHeadRef {
                request_id,
                entry: me,
                hops: 1,
                view_version,
                method: parts.method.as_str(),
                uri: &uri,
                headers: &parts.headers,
                client: conn.client,
                hash_key: key,
                tls: conn.tls.as_ref(),
            },
            &marks[..n],
        );
        for cand in candidates {
            *tries += 1;
            if cand == me {
                let b = match &replay {
                    Some(bytes) => body::full(bytes.clone()),
                    None => body.take().unwrap_or_else(body::empty),
                };
                let ctx = ServeCtx {
                    node: me,
                    entry: me,
                    key,
                    client: conn.client,
                    tls: conn.tls.as_ref(),
                    forwarded: Some(conn.forwarded.get_or_init(|| {
                        forwarded::connection_values(conn.client.ip(), conn.tls.is_some())
                    })),
                };
                self.state
                    .counters
                    .served_local
                    .fetch_add(1, Ordering::Relaxed);
                let guard = self.state.track(cand, request_bytes);
                let serving = self.state.enter_serving();
                // The app's 1xx answers go to the client through the
                // request's extension (the upstream pool reads it); an app
                // that never sends one (the built-in) is given none.
                if let Some(sink) = &info
                    && self.owner.app_may_send_informational()
                    && parts
                        .extensions
                        .get::<crate::adapters::informational::Informational>()
                        .is_none()
                {
                    parts.extensions.insert(sink.clone());
                }
                // The app exchange is boxed inside `App::serve` (an awaited
                // future is laid out inside the one awaiting it: unboxed,
                // the pooled exchange made this request's future 39 KB).
                let resp = self
                    .owner
                    .serve_app(Request::from_parts(parts, b), ctx)
                    .await
                    .map_err(|e| match e.client_body() {
                        Some(b) => RequestError::client_body(b),
                        None => RequestError::App(e),
                    })?;
                // Counted as served until its body ends, by the body
                // wrapper the entry puts on every answer (one, not two).
                return Ok(Served {
                    resp,
                    by: me.clone(),
                    by_value: None,
                    hold: Hold {
                        guard,
                        serving: Some(serving),
                    },
                    from_peer: false,
                });
            }
            let ready = match peer::open(&self.links, cand, &mut out).await {
                Ok(r) => r,
                Err(e) => {
                    let (failure, after, err) = judge(e, &plan, cand, request_id, conn.client);
                    if after == AfterFailure::Fail {
                        return Err(err);
                    }
                    if failure == Failure::Unreachable {
                        self.state
                            .counters
                            .failovers
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    last_err = Some(err);
                    continue;
                }
            };
            let b = match (&replay, empty_body) {
                (Some(bytes), _) => body::full(bytes.clone()),
                (None, true) => body::empty(),
                (None, false) => match body.take() {
                    Some(b) if frame_request => body::framed(b),
                    Some(b) => b,
                    None => break,
                },
            };
            self.state
                .counters
                .forwarded
                .fetch_add(1, Ordering::Relaxed);
            let guard = self.state.track(cand, request_bytes);
            let sent = tokio::time::Instant::now();
            let exchanged = if tunnel {
                ready.send_tunnel(self.settings.response_timeout).await
            } else {
                ready
                    .send(b, self.settings.response_timeout, info.as_ref())
                    .await
                    .map(|(rh, qb)| (rh, TunnelAnswer::Body(qb)))
            }
            .map_err(peer::SendError::Exchange);
            self.state.metrics.observe_hop(sent.elapsed());
            match exchanged {
                Ok((rh, TunnelAnswer::Tunnel(io))) => {
                    let served = served_by(&rh, cand);
                    let by_value = rh.served_by_value();
                    let mut resp = response_from_head(rh, body::empty(), cand, conn.client);
                    resp.extensions_mut().insert(Tunnel::ready(io));
                    return Ok(Served {
                        resp,
                        by: served,
                        by_value,
                        hold: Hold {
                            guard,
                            serving: None,
                        },
                        from_peer: false,
                    });
                }
                Ok((rh, TunnelAnswer::Body(mut qb))) => {
                    let served = served_by(&rh, cand);
                    let by_value = rh.served_by_value();
                    let status = errors::peer_status(rh.status);
                    // A bodiless answer gets an ended body, as the app's
                    // does on the local path (`framing`); the owner sent
                    // none and its FIN usually came with the head: taken
                    // if it is here, so the stream ends read to its end.
                    let marked = rh.headers.has(&wire::TRAILERS_NAME);
                    let body = if crate::adapters::framing::bodiless(parts.method.as_str(), status)
                    {
                        let _ = std::future::poll_fn(|cx| {
                            std::task::Poll::Ready(std::pin::Pin::new(&mut qb).poll_frame(cx))
                        })
                        .await;
                        body::empty()
                    } else if marked {
                        body::unframed(qb.boxed_unsync())
                    } else {
                        qb.boxed_unsync()
                    };
                    let mut resp = response_from_head(rh, body, cand, conn.client);
                    if marked {
                        resp.headers_mut().remove(wire::TRAILERS_NAME);
                    }
                    // Its peer window fills while the client is slow: the
                    // response budget charges it (`http::relay`).
                    return Ok(Served {
                        resp,
                        by: served,
                        by_value,
                        hold: Hold {
                            guard,
                            serving: None,
                        },
                        from_peer: true,
                    });
                }
                Err(e) => {
                    let (_, after, err) = judge(e, &plan, cand, request_id, conn.client);
                    let retry = after == AfterFailure::NextCandidate;
                    if !retry {
                        return Err(err);
                    }
                    self.state
                        .counters
                        .failovers
                        .fetch_add(1, Ordering::Relaxed);
                    last_err = Some(err);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| RequestError::NoNode("no candidate".into())))
    }
}

/// The tracing target of [`response_from_head`]'s events: the peer
/// layer's, where the function was until statuses came from `errors`
/// (trace lines include the target).
const PEER_LOG: &str = "peerlb::adapters::peer";

/// Turns a response head from `peer` into an HTTP response with `body`.
/// Header lines that are not valid HTTP were dropped by the decode; they
/// are logged here, with the peer and the `client` the answer is for.
fn response_from_head(
    head: DecodedResponseHead,
    body: Body,
    peer: &NodeId,
    client: std::net::SocketAddr,
) -> Response<Body> {
    for k in &head.dropped {
        warn!(target: PEER_LOG, header = %k, %peer, %client, "dropping invalid header from peer");
    }
    let mut resp = Response::new(body);
    *resp.status_mut() = errors::peer_status(head.status);
    *resp.headers_mut() = head.headers;
    resp
}

/// A failed send to `cand` as the failover plan judges it: the failure,
/// what the plan does after it, and the error the client gets if nothing
/// else serves it. The one place the ingress maps the peer sender's
/// errors ([`peer::SendError`]); its warning names `client` (the client
/// connection's span is at debug level: `server::Handler::conn_span_at_info`).
fn judge(
    e: peer::SendError,
    plan: &ReplayPlan,
    cand: &NodeId,
    request_id: u128,
    client: std::net::SocketAddr,
) -> (Failure, AfterFailure, RequestError) {
    let (failure, err) = match e {
        peer::SendError::Open(e) => {
            debug!(target: REQUEST_PATH, error = %e, "owner not reachable: trying the next candidate");
            (Failure::Unreachable, RequestError::NoNode(e.to_string()))
        }
        // A head too large for the wire: no peer can take it; the entry
        // itself still may.
        peer::SendError::Head(e) => (
            Failure::HeadTooLarge,
            RequestError::OwnerFailed(format!("peer {cand}: {e}")),
        ),
        peer::SendError::Exchange(e) => {
            let failure = match &e {
                ExchangeError::Refused(_) => Failure::Refused,
                ExchangeError::Failed { .. } => Failure::Lost,
                ExchangeError::Timeout(_) => Failure::Timeout,
                ExchangeError::ClientBody(_) => Failure::ClientBody,
            };
            let retry = plan.after(failure) == AfterFailure::NextCandidate;
            let err = match e {
                ExchangeError::Timeout(p) => RequestError::Timeout(p.to_string()),
                // The client's body broke before the owner answered: the
                // client's fault.
                ExchangeError::ClientBody(b) => RequestError::client_body(&b),
                e => {
                    warn!(target: REQUEST_PATH, id = %uuid::Uuid::from_u128(request_id), %client, peer = %cand, error = %e, retry, "forward failed after the request was sent");
                    RequestError::OwnerFailed(e.to_string())
                }
            };
            (failure, err)
        }
    };
    (failure, plan.after(failure), err)
}

/// The id of the node that served a forwarded request, as its response
/// head names it: the candidate's own id (no allocation) when it is the
/// one, as it always is for a node of this release (hop limit 1).
/// The node a response head names as its server: `cand` itself when the
/// names' bytes match (the usual case: no UTF-8 check, no allocation).
fn served_by(rh: &DecodedResponseHead, cand: &NodeId) -> NodeId {
    if rh.served_by_bytes() == cand.as_bytes() {
        cand.clone()
    } else {
        NodeId::from(rh.served_by())
    }
}
