//! Bind and advertise apart (`--bind`, `*_bind`): nodes that bind every
//! socket on `0.0.0.0` and advertise `127.0.0.1` form a cluster and
//! forward to each other, as a container binding its own interfaces and
//! advertising the address peers reach does.

// Real processes and sockets: wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::net::{SocketAddr, UdpSocket};

use support::*;

/// Whether `port` on 127.0.0.2 is taken for UDP: a socket bound on
/// `0.0.0.0:port` takes it on every local address, one on
/// `127.0.0.1:port` does not.
fn udp_taken_on_another_loopback_ip(port: u16) -> bool {
    UdpSocket::bind(SocketAddr::from(([127, 0, 0, 2], port)))
        .is_err_and(|e| e.kind() == std::io::ErrorKind::AddrInUse)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_bound_on_0_0_0_0_advertising_127_0_0_1_form_the_cluster_and_forward() {
    let c = Cluster::start_args(
        "bind-any",
        3,
        "",
        "[[rules]]\nextract = [{ query = \"user\" }]\n",
        &["--bind", "0.0.0.0"],
    );
    let n1 = c.node("n1").clone();
    // Every socket is on the wildcard address: the same ports answer, or
    // are taken, on another loopback IP.
    for n in &c.nodes {
        assert!(udp_taken_on_another_loopback_ip(n.peer.port()), "{}", n.id);
        assert!(
            udp_taken_on_another_loopback_ip(n.gossip.port()),
            "{}",
            n.id
        );
    }
    let other_ip = SocketAddr::from(([127, 0, 0, 2], n1.http.port()));
    assert_eq!(get(other_ip, "/x", &[]).await.status, 200);
    // What the members are told is the advertised address.
    let view = status(n1.http).expect("n1's status");
    for m in view["members"].as_array().unwrap() {
        let n = c.node(m["id"].as_str().unwrap());
        assert_eq!(m["peer_addr"], n.peer.to_string());
        assert_eq!(m["http_addr"], n.http.to_string());
    }
    // A key n2 owns, entering at n1, crosses the peer link.
    let user = user_where(
        &ring(
            &["n1", "n2", "n3"],
            peerlb::config::RingSection::default().vnodes,
        ),
        |o| o == "n2",
    );
    let r = get(n1.http, &format!("/x?user={user}"), &[]).await;
    assert_eq!((r.status, r.served_by()), (200, "n2"), "{}", c.log("n1"));
    assert_eq!(r.header("peerlb-entry"), Some("n1"));
}
