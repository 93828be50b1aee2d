//! The sender and the owner's decode over real loopback endpoints: every
//! stream kind reaches the owner as the kind it was sent as, on a pair
//! that speaks `peerlb/3` and on a mixed pair (one node at
//! `peer.protocol = 2`), both ways.

use std::sync::Mutex;

use http_body_util::BodyExt as _;

use super::*;
use crate::adapters::cluster::pause::PauseWatch;
use crate::adapters::wire::SipTransport;

/// An owner that records the kind and header names of every stream it
/// serves, and answers `200` with the kind as its body.
struct Recorder {
    id: String,
    seen: Mutex<Vec<(StreamKind, Vec<String>)>>,
    /// The target and the `x-user` value of every request served, as the
    /// handler got them (built from the frame).
    requests: Mutex<Vec<(String, Option<String>)>>,
}

impl ProxiedHandler for Recorder {
    fn node_id(&self) -> &str {
        &self.id
    }
    fn accepting(&self) -> bool {
        true
    }
    fn may_send_informational(&self, _: StreamKind) -> bool {
        false
    }
    async fn serve(
        &self,
        kind: StreamKind,
        _: &NodeId,
        head: &RequestHeadView<'_>,
        req: Request<Body>,
    ) -> Response<Body> {
        let names = head
            .headers
            .iter()
            .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
            .collect();
        self.seen.lock().unwrap().push((kind, names));
        let user = req
            .headers()
            .get("x-user")
            .map(|v| v.to_str().unwrap().to_owned());
        self.requests
            .lock()
            .unwrap()
            .push((req.uri().to_string(), user));
        let sent = req.into_body().collect().await.unwrap().to_bytes();
        Response::new(body::full(format!("{kind:?} {}", sent.len())))
    }
    async fn relay(&self, _: BoxIo, _: Tunnel) {
        unreachable!("no tunnel is sent")
    }
}

/// A node on a real loopback endpoint serving with a [`Recorder`];
/// `v3`: offers `peerlb/3` (else `peer.protocol = 2`).
fn node(certs: &tls::GeneratedCerts, id: &str, v3: bool) -> (Arc<PeerLinks>, Arc<Recorder>) {
    let (_, cert, key) = certs.nodes.iter().find(|(n, ..)| n == id).unwrap();
    let material = TlsMaterial::load(&certs.ca_cert, cert, key).unwrap();
    let settings = PeerSettings {
        keep_alive: Duration::from_millis(200),
        idle_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(2),
        only_v1: false,
        offer_v3: v3,
        max_peers: 16,
        max_udp_payload: 6500,
        dial_on_demand: true,
        stream_window: 256 * 1024,
    };
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_nonblocking(true).unwrap();
    let socket = udp::PeerUdpSocket::wrap(socket).unwrap();
    let (endpoint, client) = endpoint(
        socket,
        Arc::new(quinn::TokioRuntime),
        &material,
        &settings,
        7,
        Arc::new(crate::seam::SystemClock),
    )
    .unwrap();
    let links = PeerLinks::new(
        NodeId::from(id),
        endpoint,
        client,
        settings,
        Arc::new(crate::seam::NoObserver),
        Arc::new(PauseWatch::new(Duration::from_secs(60), Duration::ZERO)),
    );
    let recorder = Arc::new(Recorder {
        id: id.to_owned(),
        seen: Mutex::new(Vec::new()),
        requests: Mutex::new(Vec::new()),
    });
    tokio::spawn(serve(links.clone(), recorder.clone()));
    (links, recorder)
}

/// A request head from the entry `me` (no hash key, no TLS).
fn head_of<'a>(
    me: &'a str,
    method: &'a str,
    uri: &'a str,
    headers: &'a http::HeaderMap,
) -> wire::RequestHeadRef<'a> {
    wire::RequestHeadRef {
        request_id: 1,
        entry: me,
        hops: 1,
        view_version: 0,
        method,
        uri,
        headers,
        client: "127.0.0.1:9".parse().unwrap(),
        hash_key: None,
        tls: None,
    }
}

/// Sends one stream of `kind` from `from` to `to` with a 3-byte body;
/// the owner's answer body.
async fn one(
    (from, me): (&Arc<PeerLinks>, &str),
    to: &str,
    kind: StreamKind,
) -> (wire::Version, String) {
    let headers =
        http::HeaderMap::from_iter([(http::header::CONTENT_LENGTH, HeaderValue::from_static("3"))]);
    let mut out = Outgoing::new(kind, head_of(me, "POST", "/", &headers), &[]);
    let to = NodeId::from(to);
    let ready = open(from, &to, &mut out).await.expect("a stream opens");
    let version = ready.stream.version;
    let (head, body) = ready
        .send(body::full("abc"), Duration::from_secs(5), None)
        .await
        .expect("the owner answers");
    assert_eq!(head.status, 200);
    let text = body.collect().await.unwrap().to_bytes();
    (version, String::from_utf8(text.to_vec()).unwrap())
}

const KINDS: [StreamKind; 4] = [
    StreamKind::Http,
    StreamKind::Sip(SipTransport::Udp),
    StreamKind::Sip(SipTransport::Tls),
    StreamKind::Admin,
];

/// Both ways between `a` and `b`: every kind is served as itself, on
/// connections of `version`; on `peerlb/2` the owner saw the kind's
/// mark among the head's lines, on `peerlb/3` only the request's own.
async fn every_kind_both_ways(v3: (bool, bool), version: wire::Version, tag: &str) {
    let dir = std::env::temp_dir().join(format!("peerlb-send-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let certs = tls::generate(&dir, "test", &["n1", "n2"]).unwrap();
    let (a, ra) = node(&certs, "n1", v3.0);
    let (b, rb) = node(&certs, "n2", v3.1);
    a.sync(&[(NodeId::from("n2"), b.endpoint().local_addr().unwrap(), 1)]);
    b.sync(&[(NodeId::from("n1"), a.endpoint().local_addr().unwrap(), 1)]);
    for (from, to, owner) in [((&a, "n1"), "n2", &rb), ((&b, "n2"), "n1", &ra)] {
        for kind in KINDS {
            assert_eq!(one(from, to, kind).await, (version, format!("{kind:?} 3")));
        }
        let seen = std::mem::take(&mut *owner.seen.lock().unwrap());
        let kinds: Vec<_> = seen.iter().map(|(k, _)| *k).collect();
        assert_eq!(kinds, KINDS);
        for (kind, names) in seen {
            let mark = match (version, kind) {
                (wire::Version::V2, StreamKind::Sip(_)) => Some(wire::SIP),
                (wire::Version::V2, StreamKind::Admin) => Some(wire::ADMIN),
                _ => None,
            };
            let mut want = vec!["content-length".to_owned()];
            want.extend(mark.map(str::to_owned));
            assert_eq!(names, want, "{kind:?} on {version:?}");
        }
    }
    a.close().await;
    b.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_pair_that_offers_peerlb_3_sends_every_kind_as_a_field() {
    every_kind_both_ways((true, true), wire::Version::V3, "v3").await;
}

#[tokio::test]
async fn a_mixed_pair_falls_back_to_peerlb_2_and_sends_every_kind_as_a_mark() {
    every_kind_both_ways((true, false), wire::Version::V2, "mixed").await;
    every_kind_both_ways((false, true), wire::Version::V2, "mixed-rev").await;
}

/// Sends one HTTP stream with `method`, `uri` and an `x-user: alice` line
/// from `from` to `to`: the owner's status and body, or why it failed.
async fn head_with(
    (from, me): (&Arc<PeerLinks>, &str),
    to: &str,
    method: &str,
    uri: &str,
) -> Result<(u16, String), String> {
    let headers = http::HeaderMap::from_iter([(
        http::HeaderName::from_static("x-user"),
        HeaderValue::from_static("alice"),
    )]);
    let mut out = Outgoing::new(StreamKind::Http, head_of(me, method, uri, &headers), &[]);
    let to = NodeId::from(to);
    let ready = open(from, &to, &mut out).await.map_err(|e| e.to_string())?;
    let (head, body) = ready
        .send(body::empty(), Duration::from_secs(5), None)
        .await
        .map_err(|e| e.to_string())?;
    let text = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((head.status, String::from_utf8(text.to_vec()).unwrap()))
}

/// The owner builds the request from the frame itself: its target and
/// header values are the ones sent. A head whose method or target HTTP
/// rejects resets that stream alone: the handler never sees it, and the
/// next stream on the same connection is served.
#[tokio::test]
async fn a_head_with_a_bad_method_or_target_resets_its_stream_and_the_next_is_served() {
    let dir = std::env::temp_dir().join(format!("peerlb-send-bad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let certs = tls::generate(&dir, "test", &["n1", "n2"]).unwrap();
    let (a, _) = node(&certs, "n1", true);
    let (b, rb) = node(&certs, "n2", true);
    a.sync(&[(NodeId::from("n2"), b.endpoint().local_addr().unwrap(), 1)]);
    b.sync(&[(NodeId::from("n1"), a.endpoint().local_addr().unwrap(), 1)]);
    let good = head_with((&a, "n1"), "n2", "GET", "/cart/7?user=alice").await;
    assert_eq!(good, Ok((200, "Http 0".to_owned())));
    for (method, uri) in [("GE T", "/"), ("GET", "/a b"), ("GET", "")] {
        let bad = head_with((&a, "n1"), "n2", method, uri).await;
        assert!(bad.is_err(), "{method:?} {uri:?}: {bad:?}");
        let next = head_with((&a, "n1"), "n2", "GET", "/next").await;
        assert_eq!(
            next,
            Ok((200, "Http 0".to_owned())),
            "after {method:?} {uri:?}"
        );
    }
    let served = std::mem::take(&mut *rb.requests.lock().unwrap());
    let alice = Some("alice".to_owned());
    let want: Vec<_> = ["/cart/7?user=alice", "/next", "/next", "/next"]
        .iter()
        .map(|u| ((*u).to_owned(), alice.clone()))
        .collect();
    assert_eq!(served, want);
    a.close().await;
    b.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}
