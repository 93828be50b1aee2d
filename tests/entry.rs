//! What the entry speaks before HTTP: the PROXY protocol from the sprayer
//! (HAProxy `send-proxy` / `send-proxy-v2` in TCP mode) and HTTPS with
//! rustls (certificates by SNI, reloads, bad files at start). Real `peerlb`
//! processes, HAProxy and curl on loopback.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use support::*;

/// HAProxy, or `None` (with the skip explained) on a developer machine
/// without it; CI (`PEERLB_REQUIRE_HAPROXY`) requires it.
fn haproxy() -> Option<PathBuf> {
    let h = which("haproxy");
    if h.is_none() {
        assert!(
            std::env::var_os("PEERLB_REQUIRE_HAPROXY").is_none()
                && std::env::var_os("CI").is_none(),
            "haproxy is missing but this run requires it (PEERLB_REQUIRE_HAPROXY or CI is set)"
        );
        eprintln!("SKIPPED: haproxy is not installed (apt-get install -y haproxy, or run .ci/run)");
    }
    h
}

/// Kills HAProxy when the test ends, passing or not.
struct Haproxy(std::process::Child);

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The JSON the built-in app answers `GET /` with, through `addr` on a
/// fresh connection: (our local address, the answer).
async fn builtin_through(addr: SocketAddr) -> (SocketAddr, Resp) {
    let mut conn = Conn::open(addr).await.unwrap();
    let local = conn.local;
    let r = conn.get("/", &[]).await.unwrap();
    (local, r)
}

// Behind HAProxy in TCP mode with send-proxy (v1) and send-proxy-v2, the
// app sees the real client's address (locally served and forwarded to
// the owner), and the default hash key is the client's host and port as
// on a direct connection, not HAProxy's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_v1_and_v2_from_haproxy_give_the_real_client_address_and_key() {
    let Some(haproxy) = haproxy() else { return };
    let c = Cluster::start("pp", 2, "[listener]\nproxy_protocol = true\n", USER_RULES);
    let (v1, v2) = (free_port(), free_port());
    let n1 = c.nodes[0].http;
    let cfg = format!(
        "global\n  maxconn 200\ndefaults\n  mode tcp\n  timeout connect 1s\n  timeout client 30s\n  timeout server 30s\n\
         frontend v1\n  bind 127.0.0.1:{v1}\n  default_backend v1\n\
         frontend v2\n  bind 127.0.0.1:{v2}\n  default_backend v2\n\
         backend v1\n  server n1 {n1} send-proxy\n\
         backend v2\n  server n1 {n1} send-proxy-v2\n"
    );
    let cfg_path = write(&c.dir, "haproxy.cfg", &cfg);
    let _hap = Haproxy(
        Command::new(haproxy)
            .arg("-f")
            .arg(&cfg_path)
            .arg("-db")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    for port in [v1, v2] {
        let front: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        poll(Duration::from_secs(10), || {
            std::net::TcpStream::connect(front).is_ok()
        })
        .expect("haproxy listens");
        // New connections (new client ports, so new keys) until both nodes
        // have served one: the local path and the forwarded one.
        let mut served_by = std::collections::BTreeSet::new();
        for _ in 0..40 {
            let (local, r) = builtin_through(front).await;
            assert_eq!(r.status, 200, "{:?}", r.body);
            let v = r.json();
            assert_eq!(v["entry"], "n1");
            assert_eq!(v["client"], local.to_string(), "port {port}: {v}");
            assert_eq!(v["key"], local.to_string(), "port {port}: {v}");
            served_by.insert(r.served_by().to_owned());
            if served_by.len() == 2 {
                break;
            }
        }
        assert_eq!(served_by.len(), 2, "port {port}: {served_by:?}");
    }
}

// A listener that expects the PROXY protocol closes a connection that
// starts without a header, answers one with a v1 header or a v2 LOCAL
// header (a sprayer's health check: the socket's own address stands).
#[test]
fn a_proxy_listener_refuses_a_bare_request_and_takes_v1_and_v2_local() {
    let c = Cluster::start("pp-raw", 1, "[listener]\nproxy_protocol = true\n", "");
    let entry = c.nodes[0].http;
    let (out, closed) = raw_exchange(entry, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(closed && out.is_empty(), "answered without a header: {out:?}");

    let (out, _) = raw_exchange(
        entry,
        b"PROXY TCP4 203.0.113.9 127.0.0.1 4000 80\r\nGET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("\"client\":\"203.0.113.9:4000\""), "{out}");

    let mut local = b"\r\n\r\n\0\r\nQUIT\n\x20\x00\x00\x00".to_vec();
    local.extend_from_slice(b"GET /_peerlb/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let (out, _) = raw_exchange(entry, &local);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
}

// A listener that does not expect the PROXY protocol never parses it: a
// forged header is an ordinary malformed request (400), so no client can
// choose its address.
#[test]
fn a_forged_proxy_header_on_a_plain_listener_is_a_bad_request() {
    let c = Cluster::start("pp-forged", 1, "", "");
    let (out, _) = raw_exchange(
        c.nodes[0].http,
        b"PROXY TCP4 203.0.113.9 127.0.0.1 4000 80\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert!(!out.contains("203.0.113.9"), "{out}");
}
