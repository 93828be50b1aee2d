//! The sharded key-value store of `examples/sharded_cache.rs`, shared with
//! its test (`tests/embedded.rs` includes this file by path).
//!
//! Each key lives on its owner: the cluster's rule routes `/kv/<key>` by
//! `<key>`, so a request reaches the key's owner wherever it entered, and
//! the store only answers from its own map. When the ring changes, the
//! keys this node lost ([`peerlb::ViewChange::lost`]) are handed to their
//! new owner (`PUT` with `x-handover: 1`, sent with [`Handle::forward`]
//! over the peer link) before they are dropped here: on a drain nothing is
//! lost; a killed node's keys are lost with it. Served alone (no node, no
//! [`RequestInfo`]: `sharded_cache --standalone`), it stores every `PUT`.
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /kv/<key>` | 200 and the value, or 404 |
//! | `PUT /kv/<key>` (body: the value) | 204, `x-stored-on: <node>` (in a node); a handover for a key this node does not own: 421, nothing stored |
//! | `GET /keys` | the keys held here, one a line |

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use peerlb::body::{Body, empty, full};
use peerlb::{Handle, RequestInfo};

/// The data-centric rule that routes `/kv/<key>` by `<key>`: the same key
/// [`Handle::owner`] is asked with.
pub const RULES: &str =
    "[[rules]]\nname = \"kv\"\nextract = [{ path_regex = \"^/kv/([^/]+)$\" }]\n";

/// Marks a handover `PUT` (from the key's previous owner).
pub const HANDOVER: &str = "x-handover";

/// The values this node holds, by key: a `tower::Service` (`Clone`: the
/// clones share the map).
#[derive(Clone, Default)]
pub struct Cache {
    map: Arc<Mutex<BTreeMap<String, Bytes>>>,
}

impl Cache {
    /// The keys held here, in order.
    pub fn keys(&self) -> Vec<String> {
        self.map.lock().unwrap().keys().cloned().collect()
    }

    async fn answer(self, req: Request<Body>) -> Response<Body> {
        let path = req.uri().path().to_owned();
        if path == "/keys" {
            let mut text = self.keys().join("\n");
            text.push('\n');
            return Response::new(full(text));
        }
        let Some(key) = path.strip_prefix("/kv/").filter(|k| !k.is_empty()) else {
            return status(StatusCode::NOT_FOUND);
        };
        let key = key.to_owned();
        match *req.method() {
            http::Method::GET => match self.map.lock().unwrap().get(&key) {
                Some(v) => Response::new(full(v.clone())),
                None => status(StatusCode::NOT_FOUND),
            },
            http::Method::PUT => {
                let info = req.extensions().get::<RequestInfo>().cloned();
                let handover = req.headers().contains_key(HANDOVER);
                let Ok(value) = req.into_body().collect().await.map(|b| b.to_bytes()) else {
                    return status(StatusCode::BAD_REQUEST);
                };
                // A handover lands only on the key's owner as this node
                // sees it; the sender tries again until the views agree.
                if handover && info.as_ref().is_some_and(|i| !i.handle().is_local(&key)) {
                    return status(StatusCode::MISDIRECTED_REQUEST);
                }
                self.map.lock().unwrap().insert(key, value);
                let mut r = status(StatusCode::NO_CONTENT);
                if let Some(info) = info {
                    r.headers_mut()
                        .insert("x-stored-on", info.node().as_str().parse().unwrap());
                }
                r
            }
            _ => status(StatusCode::METHOD_NOT_ALLOWED),
        }
    }

    /// Hands the keys this node loses to their new owners, for every ring
    /// change `handle` reports, until the node stops. A key is dropped here
    /// once its new owner has stored it (or after `patience` of tries).
    pub async fn hand_over(self, handle: Handle, patience: Duration) {
        let mut changes = handle.watch();
        while let Some(change) = changes.changed().await {
            let lost: Vec<String> = self
                .keys()
                .into_iter()
                .filter(|k| change.lost_to(k).is_some())
                .collect();
            for key in lost {
                self.hand_over_key(&handle, &key, patience).await;
            }
        }
    }

    async fn hand_over_key(&self, handle: &Handle, key: &str, patience: Duration) {
        let deadline = tokio::time::Instant::now() + patience;
        while tokio::time::Instant::now() < deadline {
            // Asked again each try: the ring may have moved on.
            if handle.is_local(key) {
                return;
            }
            let Some(value) = self.map.lock().unwrap().get(key).cloned() else {
                return;
            };
            let req = Request::put(format!("/kv/{key}"))
                .header(HANDOVER, "1")
                .body(full(value))
                .unwrap();
            // Sent to the key's owner over the peer link; dropped here once
            // another node has stored it (a failover may have served it
            // here, on a ring that moved back).
            if let Ok(r) = handle.forward(key, req).await
                && r.status() == StatusCode::NO_CONTENT
                && r.headers()
                    .get("x-stored-on")
                    .is_some_and(|n| n.as_bytes() != handle.node_id().as_bytes())
            {
                self.map.lock().unwrap().remove(key);
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl tower::Service<Request<Body>> for Cache {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.answer(req).await) })
    }
}

fn status(s: StatusCode) -> Response<Body> {
    let mut r = Response::new(empty());
    *r.status_mut() = s;
    r
}

/// One request to a node's client listener at `addr` on a fresh
/// connection: `method /kv/<key>` with `value` as the body. The status and
/// the body.
///
/// # Errors
/// The connection or the exchange failed.
pub async fn send(
    addr: SocketAddr,
    method: http::Method,
    key: &str,
    value: Bytes,
) -> Result<(StatusCode, Bytes), Box<dyn std::error::Error + Send + Sync>> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri(format!("/kv/{key}"))
        .header(http::header::HOST, addr.to_string());
    let resp = tx.send_request(req.body(Full::new(value))?).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

/// `GET /kv/<key>` through the node at `addr`: the value, or `None` on 404.
///
/// # Errors
/// The exchange failed, or another status came back.
pub async fn get(
    addr: SocketAddr,
    key: &str,
) -> Result<Option<Bytes>, Box<dyn std::error::Error + Send + Sync>> {
    match send(addr, http::Method::GET, key, Bytes::new()).await? {
        (StatusCode::OK, b) => Ok(Some(b)),
        (StatusCode::NOT_FOUND, _) => Ok(None),
        (s, b) => Err(format!("GET {key}: {s} {}", String::from_utf8_lossy(&b)).into()),
    }
}

/// `PUT /kv/<key>` through the node at `addr`; the node that stored it.
///
/// # Errors
/// The exchange failed, or it was not stored.
pub async fn put(
    addr: SocketAddr,
    key: &str,
    value: &str,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    match send(addr, http::Method::PUT, key, Bytes::from(value.to_owned())).await? {
        (StatusCode::NO_CONTENT, _) => Ok(()),
        (s, b) => Err(format!("PUT {key}: {s} {}", String::from_utf8_lossy(&b)).into()),
    }
}
