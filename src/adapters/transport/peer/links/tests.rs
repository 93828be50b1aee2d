//! Tests of the peer links (`links.rs`).

use super::*;

#[test]
fn both_nodes_of_a_pair_keep_the_same_connection() {
    let (a, b) = (NodeId::from("n1"), NodeId::from("n2"));
    // At n1: its own dial (dialler n1) against n2's (accepted).
    let n1_keeps_own = dialler_wins(&a, &b);
    // At n2: its own dial (dialler n2) against n1's (accepted).
    let n2_keeps_own = dialler_wins(&b, &a);
    assert!(n1_keeps_own);
    assert!(!n2_keeps_own, "n2 must keep n1's dial too");
}

/// A node on real loopback endpoints, its accepted connections
/// registered as `peer::serve` does (no handler: nothing is served).
fn node(certs: &tls::GeneratedCerts, id: &str, settings: &PeerSettings) -> Arc<PeerLinks> {
    let (_, cert, key) = certs.nodes.iter().find(|(n, ..)| n == id).unwrap();
    let material = tls::TlsMaterial::load(&certs.ca_cert, cert, key).unwrap();
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_nonblocking(true).unwrap();
    let runtime: Arc<dyn quinn::Runtime> = Arc::new(quinn::TokioRuntime);
    let socket = super::super::udp::PeerUdpSocket::wrap(socket).unwrap();
    let (endpoint, client) = super::super::endpoint(
        socket,
        runtime,
        &material,
        settings,
        7,
        Arc::new(crate::seam::SystemClock),
    )
    .unwrap();
    let pause = Arc::new(PauseWatch::new(Duration::from_secs(60), Duration::ZERO));
    let links = PeerLinks::new(
        NodeId::from(id),
        endpoint,
        client,
        settings.clone(),
        Arc::new(crate::seam::NoObserver),
        pause,
    );
    let l = links.clone();
    tokio::spawn(async move {
        while let Some(incoming) = l.endpoint.accept().await {
            if let Ok(conn) = incoming.await {
                l.accepted(conn);
            }
        }
    });
    links
}

/// Loopback test settings: a 600 ms connect timeout, a busy link
/// closed after 5 s of silence; `peer.dial = "on_demand"` or not.
fn test_settings(dial_on_demand: bool) -> PeerSettings {
    PeerSettings {
        keep_alive: Duration::from_millis(200),
        idle_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_millis(600),
        only_v1: false,
        offer_v3: true,
        max_peers: 128,
        max_udp_payload: 6500,
        dial_on_demand,
        stream_window: 256 * 1024,
    }
}

/// A dial that fails while the peer's own connection to this node
/// completed (a peer that restarted under load dials too) leaves the
/// peer routable: it is neither ejected nor given up on. Before, the
/// failed dial ejected it, and three of them gave it up for good.
#[tokio::test]
async fn a_failed_dial_keeps_a_peer_that_connected_meanwhile() {
    let dir = std::env::temp_dir().join(format!("peerlb-links-dial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let certs = tls::generate(&dir, "test", &["n1", "n2"]).unwrap();
    let settings = test_settings(false);
    let (n1, n2) = (node(&certs, "n1", &settings), node(&certs, "n2", &settings));
    // n1 is told n2 lives at an address that never answers: its dials
    // (the smaller id dials first) time out after `connect_timeout`.
    let black_hole = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let n1_addr = n1.endpoint.local_addr().unwrap();
    n1.sync(&[(NodeId::from("n2"), black_hole.local_addr().unwrap(), 1)]);
    // n2 knows n1's real address and dials it after half a connect
    // timeout: while n1's own dial is still waiting.
    n2.sync(&[(NodeId::from("n1"), n1_addr, 1)]);
    let mut routable = n1.connected();
    tokio::time::timeout(
        Duration::from_secs(5),
        routable.wait_for(|s| s.contains(&NodeId::from("n2"))),
    )
    .await
    .expect("n2's connection reaches n1")
    .unwrap();
    // n1's dial has a hard deadline of one connect timeout from the
    // start; past three of them every attempt it made has ended.
    tokio::time::sleep(settings.connect_timeout * 3).await;
    assert!(
        n1.connected().borrow().contains(&NodeId::from("n2")),
        "n1 dropped n2, which is connected to it"
    );
    assert_eq!(
        n1.ejections(),
        0,
        "n1's failed dial ejected a connected peer"
    );
    n1.close().await;
    n2.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `peer.dial = "on_demand"`: a member gossip announces is routable at
/// once with no connection; the first stream to it dials it, and the
/// next reuses that connection. A member at an address that never
/// answers stays routable until a request's dial fails: the request
/// gets an error before anything reached the member (the caller tries
/// the next candidate) and the member is ejected.
#[tokio::test]
async fn on_demand_members_are_routable_at_sight_and_dialled_by_the_first_request() {
    let dir = std::env::temp_dir().join(format!("peerlb-links-on-demand-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let certs = tls::generate(&dir, "test", &["n1", "n2", "n3"]).unwrap();
    let settings = test_settings(true);
    let (n1, n2) = (node(&certs, "n1", &settings), node(&certs, "n2", &settings));
    let black_hole = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let (id2, id3) = (NodeId::from("n2"), NodeId::from("n3"));
    n1.sync(&[
        (id2.clone(), n2.endpoint.local_addr().unwrap(), 1),
        (id3.clone(), black_hole.local_addr().unwrap(), 1),
    ]);
    assert_eq!(
        *n1.connected().borrow(),
        BTreeSet::from([id2.clone(), id3.clone()]),
        "members are routable at sight"
    );
    assert_eq!(n1.connection_count(), 0, "nothing is dialled at sight");
    let first = n1.open(&id2).await.expect("the first request dials n2");
    assert_eq!(n1.connection_count(), 1);
    let second = n1.open(&id2).await.expect("the next request reuses it");
    assert_eq!(n1.connection_count(), 1, "one connection for both requests");
    drop((first, second));
    match n1.open(&id3).await {
        Err(OpenError::Stream { peer, .. }) => assert_eq!(peer, id3),
        Err(e) => panic!("unexpected error for a dead member: {e}"),
        Ok(_) => panic!("a stream opened to an address that never answers"),
    }
    assert!(
        !n1.connected().borrow().contains(&id3),
        "a failed dial ejects the member"
    );
    assert!(n1.connected().borrow().contains(&id2));
    assert_eq!(n1.ejections(), 1);
    n1.close().await;
    n2.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}
