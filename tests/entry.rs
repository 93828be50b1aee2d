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

use peerlb::Ring;
use support::https::*;
use support::*;

/// HAProxy, or `None` after the skip (tests/support/skip.rs).
fn haproxy() -> Option<PathBuf> {
    support::skip::haproxy()
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
// starts without a header, answers one with a v1 header (the app's
// X-Forwarded-For and Forwarded name the header's address) or a v2 LOCAL
// header (a sprayer's health check: the socket's own address stands).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_listener_refuses_a_bare_request_and_takes_v1_and_v2_local() {
    let app = echo_app().await;
    let c = Cluster::start(
        "pp-raw",
        1,
        &format!("app = \"http://{app}\"\n[listener]\nproxy_protocol = true\n"),
        "",
    );
    let entry = c.nodes[0].http;
    let (out, closed) = raw_exchange(entry, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(
        closed && out.is_empty(),
        "answered without a header: {out:?}"
    );
    poll(Duration::from_secs(5), || {
        counter_of(entry, "proxy_header_refused") >= 1
    })
    .expect("the refused connection is counted");

    let (out, _) = raw_exchange(
        entry,
        b"PROXY TCP4 203.0.113.9 127.0.0.1 4000 80\r\nGET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        v["x-forwarded-for"],
        serde_json::json!(["203.0.113.9"]),
        "{v}"
    );
    assert_eq!(
        v["forwarded"],
        serde_json::json!(["for=203.0.113.9;proto=http"]),
        "{v}"
    );

    let mut local = b"\r\n\r\n\0\r\nQUIT\n\x20\x00\x00\x00".to_vec();
    local
        .extend_from_slice(b"GET /_peerlb/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
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

/// Counter `name` of the node whose client address is `addr` (its status
/// on the admin address), 0 when unreadable.
fn counter_of(addr: SocketAddr, name: &str) -> u64 {
    status(addr)
        .and_then(|s| s["counters"][name].as_u64())
        .unwrap_or(0)
}

// HTTPS at the entry: curl over HTTP/1.1 gets the default certificate for
// localhost and the SNI certificate for a.example (each trusted alone, so
// the other one fails); the SNI name reaches the rules (`when = { sni }`)
// and, in the forwarded head, the owner's app (`proto`, `sni`); a request
// for a name the connection's certificate does not cover gets 421.
#[test]
fn https_serves_the_certificate_sni_picks_and_tells_rules_and_owner() {
    let certs = temp_dir("https-certs");
    let (site, site_key) = self_signed(&certs, "site", &["localhost"]);
    let (a, a_key) = self_signed(&certs, "a", &["a.example"]);
    let head = format!(
        "[listener.tls]\ncert = {site:?}\nkey = {site_key:?}\nsni = [{{ cert = {a:?}, key = {a_key:?} }}]\n"
    );
    let rules = format!(
        "[[rules]]\nname = \"a-site\"\nwhen = {{ sni = \"a.example\" }}\nextract = [{{ query = \"user\", prefix = \"a:\" }}]\n\n{USER_RULES}"
    );
    let c = Cluster::start("https", 2, &head, &rules);
    let entry = c.nodes[0].http;
    let r: Ring = ring(&["n1", "n2"], peerlb::config::RingSection::default().vnodes);
    let user = user_where(&r, |o| o == "n2");
    let (status, head, body) =
        curl_https("localhost", entry, &format!("/?user={user}"), &site, &[]).unwrap();
    assert_eq!(status, 200, "{head}");
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("peerlb-served-by: n2"), "{head}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["proxied"], true, "{v}");
    assert_eq!(v["proto"], "https", "{v}");
    assert_eq!(v["sni"], "localhost", "{v}");
    assert_eq!(v["key"], user, "{v}");
    // A client offering HTTP/2 in ALPN gets it, and the same answer from
    // the same owner.
    let (status, head, body) = curl_https(
        "localhost",
        entry,
        &format!("/?user={user}"),
        &site,
        &["--http2"],
    )
    .unwrap();
    assert_eq!(status, 200, "{head}");
    assert!(head.starts_with("http/2 200"), "{head}");
    assert!(head.contains("peerlb-served-by: n2"), "{head}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["proto"].as_str(), v["key"].as_str()),
        (Some("https"), Some(user.as_str())),
        "{v}"
    );
    // The default certificate is not valid for a.example, and a.example's
    // is not the one localhost gets.
    let e = curl_https("a.example", entry, "/", &site, &[]).unwrap_err();
    assert_eq!(e.0, 60, "curl: {}", e.1);
    let e = curl_https("localhost", entry, "/", &a, &[]).unwrap_err();
    assert_eq!(e.0, 60, "curl: {}", e.1);
    let (status, _, body) = curl_https(
        "a.example",
        entry,
        &format!("/?user={user}"),
        &a,
        &["--tlsv1.2", "--tls-max", "1.2"],
    )
    .unwrap();
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["sni"], "a.example", "{v}");
    assert_eq!(v["tls_version"], "TLSv1.2", "{v}");
    assert_eq!(v["key"], format!("a:{user}"), "the sni rule: {v}");
    // A request for a.example on the connection made for localhost (whose
    // certificate does not cover it: a client that coalesced, or a
    // rule keyed on the SNI that would route it as localhost's) is
    // misdirected: 421, so the client opens a connection for a.example;
    // over HTTP/2 too (:authority). Its own name is served.
    for proto in ["--http1.1", "--http2"] {
        let (status, head, _) = curl_https(
            "localhost",
            entry,
            &format!("/?user={user}"),
            &site,
            &[proto, "-H", "host: a.example"],
        )
        .unwrap();
        assert_eq!(status, 421, "{proto}: {head}");
        assert!(head.contains("peerlb-error-from: n1"), "{head}");
    }
    // Cleartext on an HTTPS listener is not served as HTTP.
    let failed = counter_of(entry, "tls_handshake_failed");
    let (out, _) = raw_exchange(entry, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(!out.starts_with("HTTP/1.1 200"), "{out}");
    poll(Duration::from_secs(5), || {
        counter_of(entry, "tls_handshake_failed") > failed
    })
    .expect("the failed handshake is counted");
    std::fs::remove_dir_all(certs).ok();
}

// The app behind an HTTPS entry is told `X-Forwarded-Proto: https` and a
// `Forwarded` element with `proto=https`, on a forwarded request too; a
// client's own X-Forwarded-Proto never reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_sees_x_forwarded_proto_https_on_a_forwarded_request() {
    let app = echo_app().await;
    let certs = temp_dir("https-xfp-certs");
    let (site, site_key) = self_signed(&certs, "site", &["localhost"]);
    let head =
        format!("app = \"http://{app}\"\n[listener.tls]\ncert = {site:?}\nkey = {site_key:?}\n");
    let c = Cluster::start("https-xfp", 2, &head, USER_RULES);
    let entry = c.nodes[0].http;
    let r = ring(&["n1", "n2"], peerlb::config::RingSection::default().vnodes);
    for owner in ["n1", "n2"] {
        let user = user_where(&r, |o| o == owner);
        let (status, head, body) = tokio::task::spawn_blocking({
            let site = site.clone();
            move || {
                curl_https(
                    "localhost",
                    entry,
                    &format!("/?user={user}"),
                    &site,
                    &["-H", "X-Forwarded-Proto: gopher"],
                )
                .unwrap()
            }
        })
        .await
        .unwrap();
        assert_eq!(status, 200, "{head}");
        assert!(
            head.contains(&format!("peerlb-served-by: {owner}")),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["x-forwarded-proto"], serde_json::json!(["https"]), "{v}");
        assert_eq!(
            v["forwarded"],
            serde_json::json!(["for=127.0.0.1;proto=https"]),
            "{v}"
        );
    }
    std::fs::remove_dir_all(certs).ok();
}

/// Whether a TLS client trusting only `ca` completes a handshake with
/// `addr` for SNI `name` (and gets an answer): `ca` is the certificate
/// served.
fn served_cert_matches(name: &str, addr: SocketAddr, ca: &Path) -> bool {
    curl_https(name, addr, "/_peerlb/health", ca, &[]).is_ok()
}

// A certificate replaced on disk is served to new handshakes without a
// restart (the files are polled); one replaced by garbage keeps the one
// in force; `POST /_peerlb/tls/reload` reloads at once and names the
// field whose file is bad.
#[test]
fn a_replaced_certificate_is_served_without_a_restart() {
    let certs = temp_dir("https-reload-certs");
    let (site, site_key) = self_signed(&certs, "site", &["localhost"]);
    let first = std::fs::read(&site).unwrap();
    let trust = |tag: &str| -> PathBuf {
        let p = certs.join(format!("trust-{tag}.pem"));
        std::fs::copy(&site, &p).unwrap();
        p
    };
    let first_ca = trust("first");
    let head =
        format!("[listener.tls]\ncert = {site:?}\nkey = {site_key:?}\nreload_interval_ms = 200\n");
    let c = Cluster::start("https-reload", 1, &head, "");
    let entry = c.nodes[0].http;
    assert!(served_cert_matches("localhost", entry, &first_ca));

    self_signed(&certs, "site", &["localhost"]);
    assert_ne!(std::fs::read(&site).unwrap(), first);
    let second_ca = trust("second");
    poll(Duration::from_secs(15), || {
        served_cert_matches("localhost", entry, &second_ca)
    })
    .expect("the replaced certificate is served");
    assert!(!served_cert_matches("localhost", entry, &first_ca));

    // Garbage: the poll and the admin API both refuse it; the second
    // certificate stays.
    std::fs::write(&site, "not a certificate").unwrap();
    let admin = admin_of(entry);
    let (out, _) = raw_exchange(
        admin,
        b"POST /_peerlb/tls/reload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert!(out.starts_with("HTTP/1.1 422"), "{out}");
    assert!(out.contains("listener.tls.cert"), "{out}");
    assert!(served_cert_matches("localhost", entry, &second_ca));

    self_signed(&certs, "site", &["localhost"]);
    let third_ca = trust("third");
    let (out, _) = raw_exchange(
        admin,
        b"POST /_peerlb/tls/reload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("{\"certificates\":1}"), "{out}");
    assert!(served_cert_matches("localhost", entry, &third_ca));
    // The endpoint's refusal is logged with the field (the poll's own
    // refusal may come first or not at all: the endpoint's reload takes
    // the files' new stamps).
    let log = c.log("n1");
    assert!(
        log.lines().any(|l| l
            .contains("listener certificates cannot be reloaded: the certificates in force stay")
            && l.contains("listener.tls.cert")),
        "the refused reload is logged: {log}"
    );
    // At least the poll's reload of the second certificate and the
    // endpoint's of the third; at least the refused garbage. Lower bounds:
    // a certificate and its key are two files written one after the other,
    // and a poll between the writes may reload (or refuse) a half-written
    // pair once more.
    assert!(counter_of(entry, "tls_reloads") >= 2);
    assert!(counter_of(entry, "tls_reload_failures") >= 1);
    std::fs::remove_dir_all(certs).ok();
}

// A missing or bad certificate or key file is a configuration error: exit
// 64 naming the field, before any socket is bound.
#[test]
fn bad_or_missing_certificate_files_exit_64_naming_the_field() {
    let dir = temp_dir("https-bad");
    let (site, site_key) = self_signed(&dir, "site", &["localhost"]);
    let (_, other_key) = self_signed(&dir, "other", &["localhost"]);
    // The client port is taken while the node runs: a node that bound it
    // before reading its certificate files would fail on the bind instead,
    // and the error would not name the field. Bound here first (port 0),
    // so no other test's node can take it meanwhile.
    let held = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let http = held.local_addr().unwrap().port();
    let node = |tls: &str| {
        let text = format!(
            "{tls}\n[[nodes]]\nid = \"n1\"\nhttp_addr = \"127.0.0.1:{http}\"\npeer_addr = \"127.0.0.1:{}\"\ngossip_addr = \"127.0.0.1:{}\"\n",
            free_port(),
            free_port()
        );
        let config = write(&dir, "cluster.toml", &text);
        let out = Command::new(bin())
            .args(["certs", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        assert!(out.status.success());
        let out = Command::new(bin())
            .args(["node", "--node", "n1", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let missing = dir.join("missing.pem");
    for (tls, field) in [
        (
            format!("[listener.tls]\ncert = {missing:?}\nkey = {site_key:?}"),
            "listener.tls.cert",
        ),
        (
            format!("[listener.tls]\ncert = {site:?}\nkey = {other_key:?}"),
            "listener.tls.key",
        ),
        (
            format!(
                "[listener.tls]\ncert = {site:?}\nkey = {site_key:?}\nsni = [{{ cert = {site_key:?}, key = {site_key:?} }}]"
            ),
            "listener.tls.sni[0].cert",
        ),
        (
            format!("[listener.tls]\ncert = {site:?}\nkey = {site_key:?}\nclient_ca = {missing:?}"),
            "listener.tls.client_ca",
        ),
    ] {
        let (code, err) = node(&tls);
        assert_eq!(code, Some(64), "{tls}: {err}");
        assert!(err.contains(field), "{field}: {err}");
        assert!(!err.contains("bind"), "{field}: {err}");
    }
}

// `peerlb up --https` serves the local cluster over HTTPS with a generated
// certificate for localhost that a client trusts once (`--cacert`); every
// node's listener (its own and the shared one) serves it.
#[test]
fn up_https_serves_the_local_cluster_with_a_generated_certificate() {
    use std::io::{BufRead, BufReader};
    let dir = temp_dir("up-https");
    let sprayer: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut text =
        format!("name = \"up-https\"\nsprayer_addr = \"{sprayer}\"\n[gossip]\ninterval_ms = 100\n");
    let mut https = Vec::new();
    for i in 1..=2 {
        let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        https.push(http);
        text += &format!(
            "[[nodes]]\nid = \"n{i}\"\nhttp_addr = \"{http}\"\npeer_addr = \"127.0.0.1:{}\"\ngossip_addr = \"127.0.0.1:{}\"\n",
            free_port(),
            free_port()
        );
    }
    let cfg = write(&dir, "cluster.toml", &text);
    let mut up = Command::new(bin())
        .args(["up", "--https", "--config"])
        .arg(&cfg)
        .current_dir(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            // SAFETY: kill(2) on the `up` process this test started.
            unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
            let _ = self.0.wait();
        }
    }
    let stdout = up.stdout.take().unwrap();
    let _up = Stop(up);
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut hint = false;
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
            .expect("peerlb up reports the cluster ready within 30 s");
        hint |= line.contains("https://localhost:");
        if line.starts_with("press Ctrl-C") {
            break;
        }
    }
    assert!(hint, "up prints an https:// hint");
    let cert = dir.join("certs/entry.pem");
    assert!(cert.is_file(), "up --https creates certs/entry.pem");
    for addr in https.iter().chain([&sprayer]) {
        let (status, head, body) = curl_https("localhost", *addr, "/x", &cert, &[]).unwrap();
        assert_eq!(status, 200, "{addr}: {head}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["proto"], "https", "{v}");
    }
}

// A connection still waiting for its PROXY header when the node drains
// has no request to finish: the node exits after its drain grace, not
// after the header timeout (60 s here) or the drain timeout (30 s).
#[test]
fn a_connection_without_its_proxy_header_does_not_hold_up_a_drain() {
    let mut c = Cluster::start(
        "pp-drain",
        1,
        "[listener]\nproxy_protocol = true\nproxy_protocol_timeout_ms = 60000\n[limits]\ndrain_grace_ms = 200\n",
        "",
    );
    let entry = c.nodes[0].http;
    let _silent = std::net::TcpStream::connect(entry).unwrap();
    poll(Duration::from_secs(5), || {
        status(entry).is_some_and(|s| s["client_connections"].as_u64() == Some(1))
    })
    .expect("the silent connection is open");
    let started = std::time::Instant::now();
    let mut child = c.sigterm("n1");
    let exited = poll(Duration::from_secs(15), || {
        child.try_wait().ok().flatten().is_some()
    });
    let _ = child.kill();
    exited.unwrap_or_else(|()| panic!("still running {:?} after SIGTERM", started.elapsed()));
}
