//! The harness's HTTP clients: client hosts sending keyed requests
//! through the sprayer (sticky-session users are in [`super::sessions`]),
//! and the sidecar beside each node that calls its admin API over loopback.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::mpsc;

use super::{HTTP_PORT, Record, Shared, SidecarCmd, WeightAnswers};
use crate::sim::scenario::{Keys, Traffic};
use crate::sim::trace::{self, Trace};

/// Inverse CDF table of a Zipf distribution over `n` ranks.
fn zipf_cdf(n: usize, s: f64) -> Vec<f64> {
    let mut acc = 0.0;
    let mut cdf: Vec<f64> = (1..=n)
        .map(|k| {
            acc += 1.0 / (k as f64).powf(s);
            acc
        })
        .collect();
    for c in &mut cdf {
        *c /= acc;
    }
    cdf
}

/// One client host: Poisson arrivals at `t.rate`, each request on its own
/// connection to an entry node the sprayer picks among the ready nodes.
pub(super) async fn client(
    name: String,
    t: Traffic,
    seed: u64,
    shared: Rc<RefCell<Shared>>,
    trace: Trace,
) -> turmoil::Result {
    trace.register_host(&name);
    let mut rng = SmallRng::seed_from_u64(seed);
    let cdf = (t.keys == Keys::Zipf).then(|| zipf_cdf(t.key_count, t.zipf_s));
    let at = virtual_instant();
    let mut next = t.start_s;
    let mut n = 0u64;
    let mut tasks = Vec::new();
    loop {
        let u: f64 = rng.random::<f64>().max(1e-12);
        next += -u.ln() / t.rate;
        if next >= t.stop_s {
            break;
        }
        tokio::time::sleep_until(at(next)).await;
        n += 1;
        let tag = format!("{name}-{n}");
        let key = match (&t.hot_key, rng.random::<f64>() < t.hot_fraction) {
            (Some(h), true) => h.clone(),
            _ => {
                let i = match &cdf {
                    Some(c) => {
                        let x: f64 = rng.random();
                        c.partition_point(|p| *p < x).min(t.key_count - 1)
                    }
                    None => rng.random_range(0..t.key_count),
                };
                format!("k{i}")
            }
        };
        let path = if t.delay_ms > 0 {
            format!("/delay/{}?user={key}&r={tag}", t.delay_ms)
        } else {
            format!("/k?user={key}&r={tag}")
        };
        let out = Outgoing {
            tag,
            key,
            method: t.method.clone(),
            path,
            session: None,
            cookie: None,
            route: None,
        };
        let Some((index, entry)) = begin(&shared, &trace, &name, &mut rng, &out) else {
            continue;
        };
        let (shared, trace, name) = (shared.clone(), trace.clone(), name.clone());
        tasks.push(tokio::task::spawn_local(async move {
            complete(&shared, &trace, &name, index, &entry, out).await;
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    Ok(())
}

/// Maps scenario seconds to tokio instants on the calling host (its clock
/// started when the host did, virtual time may have been later).
pub(super) fn virtual_instant() -> impl Fn(f64) -> tokio::time::Instant {
    let t0 = tokio::time::Instant::now();
    let v0 = trace::now();
    move |v: f64| t0 + Duration::from_secs_f64(v).saturating_sub(v0)
}

/// A request a client host is about to send.
pub(super) struct Outgoing {
    /// `c<client>-<n>` or `c<client>-s<j>-<n>`.
    pub(super) tag: String,
    /// Hash key (for a session: the session id).
    pub(super) key: String,
    /// Method.
    pub(super) method: String,
    /// Path and query (carries `r=<tag>` last).
    pub(super) path: String,
    /// The sticky session it belongs to.
    pub(super) session: Option<String>,
    /// The `Cookie` header to send.
    pub(super) cookie: Option<String>,
    /// The sticky route in `cookie`.
    pub(super) route: Option<String>,
}

/// What came back for one request.
pub(super) struct Answer {
    /// Status.
    pub(super) status: u16,
    /// `peerlb-served-by`.
    pub(super) served: String,
    /// `peerlb-entry`.
    pub(super) entry: String,
    /// Every `Set-Cookie` value.
    pub(super) set_cookies: Vec<String>,
}

/// The sprayer: picks the entry node among the ready ones and records the
/// request. `None` when no node is ready (recorded and traced as such).
pub(super) fn begin(
    shared: &RefCell<Shared>,
    trace: &Trace,
    client: &str,
    rng: &mut SmallRng,
    out: &Outgoing,
) -> Option<(usize, String)> {
    let entry = {
        let s = shared.borrow();
        let ready: Vec<&String> = s.ready.iter().collect();
        if ready.is_empty() {
            None
        } else {
            Some(ready[rng.random_range(0..ready.len())].clone())
        }
    };
    let index = {
        let mut s = shared.borrow_mut();
        s.records.push(Record {
            tag: out.tag.clone(),
            key: out.key.clone(),
            method: out.method.clone(),
            entry: entry.clone().unwrap_or_default(),
            start: trace::now(),
            end: None,
            result: None,
            session: out.session.clone(),
            route: out.route.clone(),
            set_route: None,
        });
        s.records.len() - 1
    };
    if entry.is_none() {
        trace.line(
            client,
            format_args!("request {} key={} no ready entry", out.tag, out.key),
        );
    }
    entry.map(|e| (index, e))
}

/// Sends a request [`begin`] recorded to its entry node, traces and records
/// the outcome; the answer (if any) for a session to take its cookies from.
pub(super) async fn complete(
    shared: &RefCell<Shared>,
    trace: &Trace,
    client: &str,
    index: usize,
    entry: &str,
    out: Outgoing,
) -> Option<Answer> {
    let ip: IpAddr = turmoil::lookup(entry);
    let r = send(
        SocketAddr::new(ip, HTTP_PORT),
        &out.method,
        &out.path,
        out.cookie.as_deref(),
    )
    .await;
    let end = trace::now();
    let mut s = shared.borrow_mut();
    let start = s.records[index].start;
    let (tag, key) = (&out.tag, &out.key);
    let set_route = r.as_ref().ok().and_then(|a| route_cookie(&a.set_cookies));
    match &r {
        Ok(a) => {
            let route = match (&out.route, &set_route) {
                (None, None) => String::new(),
                (sent, set) => format!(
                    " route={} set_route={}",
                    sent.as_deref().unwrap_or("-"),
                    set.as_deref().unwrap_or("-")
                ),
            };
            trace.line(
                client,
                format_args!(
                    "response {tag} entry={entry} key={key} status={} served_by={}{route} ms={}",
                    a.status,
                    a.served,
                    (end - start).as_millis()
                ),
            );
            if a.status < 500 && !a.served.is_empty() {
                s.last_owner.insert(key.clone(), a.served.clone());
            }
        }
        Err(e) => trace.line(
            client,
            format_args!("error {tag} entry={entry} key={key} error={e:?}"),
        ),
    }
    let rec = &mut s.records[index];
    rec.end = Some(end);
    rec.set_route = set_route;
    rec.result = Some(
        r.as_ref()
            .map(|a| (a.status, a.served.clone(), a.entry.clone()))
            .map_err(Clone::clone),
    );
    r.ok()
}

/// The sticky route a response set: the value of its `peerlb-route` cookie.
fn route_cookie(set_cookies: &[String]) -> Option<String> {
    set_cookies.iter().find_map(|c| {
        let (name, value) = c.split(';').next()?.split_once('=')?;
        (name.trim() == "peerlb-route").then(|| value.trim().to_owned())
    })
}

/// One request on a new connection, with `cookie` as its `Cookie` header.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    cookie: Option<&str>,
) -> Result<Answer, String> {
    let exchange = async {
        let stream = turmoil::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::task::spawn_local(async move {
            let _ = conn.await;
        });
        let body = if method == "POST" {
            Bytes::from_static(b"sim")
        } else {
            Bytes::new()
        };
        let mut req = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, addr.to_string())
            .header(http::header::CONTENT_LENGTH, body.len());
        if let Some(c) = cookie {
            req = req.header(http::header::COOKIE, c);
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| format!("request: {e}"))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("send: {e}"))?;
        let header = |n: &str| {
            resp.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let answer = Answer {
            status: resp.status().as_u16(),
            served: header("peerlb-served-by"),
            entry: header("peerlb-entry"),
            set_cookies: resp
                .headers()
                .get_all(http::header::SET_COOKIE)
                .iter()
                .filter_map(|v| v.to_str().ok().map(str::to_owned))
                .collect(),
        };
        resp.into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?;
        Ok(answer)
    };
    match tokio::time::timeout(Duration::from_secs(35), exchange).await {
        Ok(r) => r,
        Err(_) => Err("client timeout".to_owned()),
    }
}

/// Runs beside a node on its host and calls its admin API on the node's
/// admin address over loopback: `/_peerlb/status` into `probed`,
/// `PUT /_peerlb/weight` answers into `weights`.
pub(super) async fn sidecar(
    id: String,
    port: u16,
    mut cmds: mpsc::UnboundedReceiver<SidecarCmd>,
    probed: Rc<RefCell<BTreeMap<String, serde_json::Value>>>,
    weights: WeightAnswers,
    trace: Trace,
) {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    while let Some(cmd) = cmds.recv().await {
        match cmd {
            SidecarCmd::Probe => {
                if let Ok((200, body)) = http_call(addr, "GET", "/_peerlb/status", "").await
                    && let Ok(v) = serde_json::from_slice(&body)
                {
                    probed.borrow_mut().insert(id.clone(), v);
                }
            }
            SidecarCmd::Weight { fault, value } => {
                let r = http_call(addr, "PUT", "/_peerlb/weight", &value.to_string())
                    .await
                    .map(|(status, body)| {
                        (status, String::from_utf8_lossy(&body).trim().to_owned())
                    });
                match &r {
                    Ok((status, body)) => trace.line(
                        &id,
                        format_args!("admin PUT /_peerlb/weight {value}: {status} {body}"),
                    ),
                    Err(e) => trace.line(
                        &id,
                        format_args!("admin PUT /_peerlb/weight {value}: error {e}"),
                    ),
                }
                weights.borrow_mut().insert(fault, r);
            }
        }
    }
}

/// One request with a small body on a new connection: (status, body).
async fn http_call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, Bytes), String> {
    let stream = turmoil::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::task::spawn_local(async move {
        let _ = conn.await;
    });
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, addr.to_string())
        .body(Full::new(Bytes::from(body.to_owned())))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(5), sender.send_request(req))
        .await
        .map_err(|_| "timeout".to_owned())?
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, body))
}
