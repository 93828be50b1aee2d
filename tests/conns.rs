//! The connection cap (`limits.max_connections`) is fair and closes idle
//! connections first: one source holding many connections does not lock
//! out another (per-source share), and at the cap the connection idle
//! longest is closed to admit a new one; status and the log say so. Real
//! `peerlb` processes; the two sources are loopback addresses 127.0.0.2
//! and 127.0.0.3.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A connection to `to` from `source` (any port).
async fn connect_from(source: &str, to: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(format!("{source}:0").parse().unwrap()).unwrap();
    s.connect(to).await.unwrap()
}

/// Sends one keep-alive GET on `s`; its status, or `None` when the
/// connection was closed or reset instead.
async fn exchange(s: &mut TcpStream, path: &str) -> Option<u16> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // The built-in app's answers are small JSON with a Content-Length.
        let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf);
        if let Some(end) = text.find("\r\n\r\n") {
            let len: usize = text[..end]
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return text.get(9..12)?.parse().ok();
            }
        }
    }
}

/// True once the peer has closed `s` (EOF or reset), waiting up to 20 s.
async fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    matches!(
        tokio::time::timeout(Duration::from_secs(20), s.read(&mut b)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_source_holding_its_share_does_not_lock_out_another() {
    // 20 connections in all, half of them per source.
    let c = Cluster::start(
        "conns-fair",
        1,
        &format!("[limits]\nmax_connections = 20\n{STEADY}"),
        "",
    );
    let entry = c.nodes[0].http;
    // Source A opens 20 connections and sends nothing (an idle hog).
    let mut a = Vec::new();
    for _ in 0..20 {
        a.push(connect_from("127.0.0.2", entry).await);
    }
    poll(Duration::from_secs(20), || {
        counter(entry, "connections_refused_source") == 10
    })
    .unwrap_or_else(|_| panic!("status: {:?}", status(entry)));
    assert_eq!(status(entry).unwrap()["client_connections"], 10);
    // A's connections beyond its share were closed at accept.
    for s in &mut a[10..] {
        assert!(closed(s).await);
    }
    // Source B is served, on several connections, none evicting A.
    for _ in 0..5 {
        let mut b = connect_from("127.0.0.3", entry).await;
        assert_eq!(exchange(&mut b, "/x").await, Some(200));
    }
    assert_eq!(counter(entry, "connections_closed_idle"), 0);
    // A's admitted connections still work.
    for s in &mut a[..10] {
        assert_eq!(exchange(s, "/y").await, Some(200));
    }
    assert!(
        c.log("n1").contains("per-source connection cap reached"),
        "{}",
        c.log("n1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_the_connection_idle_longest_is_closed_to_admit_a_new_one() {
    let c = Cluster::start(
        "conns-idle",
        1,
        &format!(
            "[limits]\nmax_connections = 4\nmax_connections_per_source_percent = 100\n{STEADY}"
        ),
        "",
    );
    let entry = c.nodes[0].http;
    // Four keep-alive connections, each served once, in order: the first
    // has been idle longest.
    let mut open = Vec::new();
    for i in 0..4 {
        let mut s = connect_from("127.0.0.2", entry).await;
        assert_eq!(exchange(&mut s, &format!("/k{i}")).await, Some(200));
        open.push(s);
    }
    // Use the last three again: the first stays the one idle longest.
    for s in &mut open[1..] {
        assert_eq!(exchange(s, "/again").await, Some(200));
    }
    // A fifth connection, from another source, is admitted and served.
    let mut fifth = connect_from("127.0.0.3", entry).await;
    assert_eq!(exchange(&mut fifth, "/new").await, Some(200));
    // The first was closed to make room; the others still work.
    assert!(closed(&mut open[0]).await);
    for s in &mut open[1..] {
        assert_eq!(exchange(s, "/still").await, Some(200));
    }
    assert_eq!(counter(entry, "connections_closed_idle"), 1);
    assert_eq!(counter(entry, "connections_refused"), 0);
    assert!(
        c.log("n1")
            .contains("closing the idle connection idle longest"),
        "{}",
        c.log("n1")
    );
}
