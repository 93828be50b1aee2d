//! SIPS (SIP over TLS) through the cluster: real `peerlb` processes on
//! loopback, each with a `sips_addr` serving the `[sips]` certificate
//! (a test CA's, for 127.0.0.1), and the strict SIP server of
//! tests/sip_transactions.rs as `sip_app`. What is pinned: a call with a
//! `sips:` Request-URI through each node's TLS listener completes, with a
//! `sips:` Record-Route and the entry's `SIP/2.0/TLS` Via (RFC 3261 16.6
//! step 4, 26.2); a CANCEL over TLS through each node, on the INVITE's
//! own connection or through another node, gets 200 and its INVITE 487,
//! the server seeing one INVITE transaction (the Record-Route then
//! `sip:...;transport=tls`); an RFC 5626 ping inside TLS is answered;
//! calls through the shared SIPS address (SO_REUSEPORT) complete on more
//! than one entry;
//! `sip_app = "tls:<ip>:<port>"` reaches a server behind TLS that chains
//! to `[sips] upstream_ca`, and one that does not chain to it is not
//! reached (503); the config errors name their field.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

// The strict server and the callers' helpers; this file uses a part.
#[allow(dead_code)]
#[path = "sip_transactions/uas.rs"]
mod uas;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::*;
use uas::{status, *};

/// A test CA and a certificate it signed for 127.0.0.1 (an IP address
/// name) and `localhost`, in `dir`: (ca.pem, leaf.pem, leaf.key).
fn ca_and_leaf(dir: &Path, stem: &str) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, format!("{stem} test ca"));
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
        .unwrap()
        .signed_by(&key, &ca_cert, &ca_key)
        .unwrap();
    let paths = (
        dir.join(format!("{stem}-ca.pem")),
        dir.join(format!("{stem}.pem")),
        dir.join(format!("{stem}.key")),
    );
    std::fs::write(&paths.0, ca_cert.pem()).unwrap();
    std::fs::write(&paths.1, leaf.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

fn client_config(ca: &Path) -> Arc<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// A SIP client over TLS: messages framed by Content-Length.
struct TlsSip {
    tls: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
    local: SocketAddr,
    buf: Vec<u8>,
}

impl TlsSip {
    /// Connects to `to` and completes the handshake, checking the node's
    /// certificate for 127.0.0.1 against `ca`.
    fn connect(to: SocketAddr, ca: &Path) -> TlsSip {
        let tcp = TcpStream::connect(to).unwrap();
        let local = tcp.local_addr().unwrap();
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let conn = rustls::ClientConnection::new(client_config(ca), name).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock).expect("tls handshake");
        }
        TlsSip {
            tls,
            local,
            buf: Vec::new(),
        }
    }

    fn send(&mut self, text: &str) {
        self.tls.write_all(text.as_bytes()).unwrap();
        self.tls.flush().unwrap();
    }

    /// The raw bytes read within `limit` until `enough` holds for them.
    fn read_until(&mut self, limit: Duration, enough: impl Fn(&[u8]) -> bool) {
        let deadline = Instant::now() + limit;
        while !enough(&self.buf) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            self.tls.sock.set_read_timeout(Some(left)).unwrap();
            let mut chunk = [0u8; 16 * 1024];
            match self.tls.read(&mut chunk) {
                Ok(0) => return,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return,
            }
        }
    }

    /// The next SIP message within `limit`, or `None`.
    fn next(&mut self, limit: Duration) -> Option<String> {
        let whole = |b: &[u8]| frame(b).is_some();
        self.read_until(limit, whole);
        let n = frame(&self.buf)?;
        let msg: Vec<u8> = self.buf.drain(..n).collect();
        Some(String::from_utf8_lossy(&msg).into_owned())
    }
}

/// The length of the first whole message in `b`.
fn frame(b: &[u8]) -> Option<usize> {
    let end = b.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&b[..end]).into_owned();
    let len: usize = header(&format!("{head}\r\n\r\n"), "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (b.len() >= end + 4 + len).then_some(end + 4 + len)
}

/// A cluster of three nodes serving SIPS with the certificate `cert`/`key`
/// and `sip_app` as given (`more`: TOML lines of `[sips]`).
fn cluster(tag: &str, sip_app: &str, (cert, key): (&Path, &Path), more: &str) -> Cluster {
    Cluster::start_sips(
        tag,
        3,
        &format!("sip_app = \"{sip_app}\"\n"),
        &format!(
            "[sips]\ncert = \"{}\"\nkey = \"{}\"\n{more}",
            cert.display(),
            key.display()
        ),
    )
}

/// RFC 3261 16.6 step 4 and 26.2: a `sips:` call through each node's TLS
/// listener completes; its Record-Route is a SIPS URI naming the listener
/// it entered, and the server sees the entry's `SIP/2.0/TLS` Via.
#[test]
fn a_sips_call_through_each_node_completes_with_a_sips_record_route_and_a_tls_via() {
    let dir = temp_dir("sips-certs");
    let (ca, cert, key) = ca_and_leaf(&dir, "sips");
    let uas = StrictUas::start();
    let c = cluster("sips-call", &format!("udp:{}", uas.addr), (&cert, &key), "");
    for (i, node) in c.nodes.iter().enumerate() {
        let sips = node.sips.unwrap();
        let mut conn = TlsSip::connect(sips, &ca);
        // Calls on one connection until one is owned by another node (a
        // third of the keys are the entry's own): each checked the same.
        let mut forwarded = false;
        for j in 0..12 {
            let call = format!("sips-call{i}-{j}");
            let invite = request("INVITE", "bob", &call, 1, ("TLS", conn.local), &call, "")
                .replacen("INVITE sip:", "INVITE sips:", 1);
            conn.send(&invite);
            let mut codes = Vec::new();
            let mut ok = None;
            while let Some(a) = conn.next(Duration::from_secs(10)) {
                codes.push(status(&a));
                if status(&a) >= 200 {
                    ok = Some(a);
                    break;
                }
            }
            assert_eq!(codes, vec![100, 180, 200], "through n{}", i + 1);
            let ok = ok.unwrap();
            let rr = header(&ok, "record-route").expect("the entry's Record-Route");
            assert!(
                rr.starts_with(&format!("<sips:{sips};lr;peerlb-owner=")),
                "{rr}"
            );
            // The entry's Via is removed from what the caller gets.
            let vias = ok
                .lines()
                .filter(|l| l.to_ascii_lowercase().starts_with("via:"))
                .count();
            assert_eq!(vias, 1, "only the caller's Via: {ok}");
            let seen = uas.requests("INVITE", &call);
            assert_eq!(seen.len(), 1);
            // Forwarded to another owner, the request carries the entry's Via.
            let entry_via = format!("Via: SIP/2.0/TLS {sips};branch=z9hG4bK-plb");
            let owned_here = rr.contains(&format!("peerlb-owner={};", node.id));
            assert_eq!(seen[0].contains(&entry_via), !owned_here, "{}", seen[0]);
            if !owned_here {
                forwarded = true;
                break;
            }
        }
        assert!(
            forwarded,
            "no call through n{} went to another owner",
            i + 1
        );
        // An RFC 5626 ping inside TLS gets its pong.
        conn.send("\r\n\r\n");
        conn.read_until(Duration::from_secs(5), |b| b.starts_with(b"\r\n"));
        assert_eq!(conn.buf, b"\r\n", "the pong");
    }
}

/// SIPS through the shared address every node listens on (the kernel as
/// sprayer, as under `peerlb up` with `sips_sprayer_addr`): calls on new
/// connections complete, spread over more than one entry node, the
/// Record-Route naming the shared address.
#[test]
fn sips_calls_through_the_shared_address_complete_on_any_entry() {
    let dir = temp_dir("sips-shared-certs");
    let (ca, cert, key) = ca_and_leaf(&dir, "sips");
    let uas = StrictUas::start();
    let c = cluster(
        "sips-shared",
        &format!("udp:{}", uas.addr),
        (&cert, &key),
        "",
    );
    let shared = c.shared_sips.expect("a shared SIPS address");
    let entered = |c: &Cluster| -> Vec<u64> {
        c.nodes
            .iter()
            .map(|n| counter(n.http, "sip_requests"))
            .collect()
    };
    let before = entered(&c);
    for i in 0..24 {
        let mut conn = TlsSip::connect(shared, &ca);
        let call = format!("sips-shared{i}");
        let invite = request("INVITE", "bob", &call, 1, ("TLS", conn.local), &call, "").replacen(
            "INVITE sip:",
            "INVITE sips:",
            1,
        );
        conn.send(&invite);
        let mut last = None;
        while let Some(a) = conn.next(Duration::from_secs(10)) {
            if status(&a) >= 200 {
                last = Some(a);
                break;
            }
        }
        let ok = last.expect("a final answer");
        assert_eq!(status(&ok), 200, "{ok}");
        let rr = header(&ok, "record-route").unwrap();
        assert!(rr.starts_with(&format!("<sips:{shared};lr;")), "{rr}");
    }
    let after = entered(&c);
    let entries = before.iter().zip(&after).filter(|(b, a)| a > b).count();
    assert!(
        entries >= 2,
        "the kernel spread 24 connections over {entries} node(s)"
    );
}

/// The CANCEL of a ringing INVITE over TLS, on the INVITE's own
/// connection or on a TLS connection to another node, gets 200 and the
/// INVITE 487; the server sees one INVITE and answers no CANCEL 481.
#[test]
fn a_cancel_over_tls_through_each_node_gets_200_and_the_invite_487() {
    let dir = temp_dir("sips-cancel-certs");
    let (ca, cert, key) = ca_and_leaf(&dir, "sips");
    let uas = StrictUas::start();
    let c = cluster(
        "sips-cancel",
        &format!("udp:{}", uas.addr),
        (&cert, &key),
        "",
    );
    for (i, same) in [(0, true), (1, false), (2, true)] {
        let call = format!("sips-cancel{i}");
        let entry = c.nodes[i].sips.unwrap();
        let mut conn = TlsSip::connect(entry, &ca);
        let invite = request("INVITE", "ring", &call, 1, ("TLS", conn.local), &call, "");
        conn.send(&invite);
        let trying = conn.next(Duration::from_secs(10)).expect("100");
        assert_eq!(status(&trying), 100);
        let ringing = conn.next(Duration::from_secs(10)).expect("180");
        assert_eq!(status(&ringing), 180);
        let rr = header(&ringing, "record-route").expect("Record-Route");
        assert!(
            rr.starts_with(&format!("<sip:{entry};transport=tls;lr;")),
            "{rr}"
        );
        let cancel = cancel_of(&invite);
        let (cancel_answer, terminated) = if same {
            conn.send(&cancel);
            let a = conn.next(Duration::from_secs(10)).expect("an answer");
            let b = conn.next(Duration::from_secs(10)).expect("another answer");
            if cseq_method(&a) == "CANCEL" {
                (a, b)
            } else {
                (b, a)
            }
        } else {
            let mut other = TlsSip::connect(c.nodes[(i + 1) % 3].sips.unwrap(), &ca);
            other.send(&cancel);
            let a = other
                .next(Duration::from_secs(10))
                .expect("the CANCEL's answer");
            let b = conn
                .next(Duration::from_secs(10))
                .expect("the INVITE's final answer");
            (a, b)
        };
        assert_eq!(
            (cseq_method(&cancel_answer), status(&cancel_answer)),
            ("CANCEL", 200),
            "{cancel_answer}"
        );
        assert_eq!(
            (cseq_method(&terminated), status(&terminated)),
            ("INVITE", 487),
            "{terminated}"
        );
        assert_eq!(uas.requests("INVITE", &call).len(), 1);
        assert!(uas.sent(481, "CANCEL", &call).is_empty());
    }
}

/// A TLS front for `backend` (TCP): each connection's handshake with the
/// certificate `cert`/`key`, then its bytes relayed both ways, on a
/// runtime of its own. Its address.
fn tls_front(backend: SocketAddr, cert: &Path, key: &Path) -> SocketAddr {
    use rustls_pki_types::pem::PemObject as _;
    let chain: Vec<_> = rustls_pki_types::CertificateDer::pem_file_iter(cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = rustls_pki_types::PrivateKeyDer::from_pem_file(key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let addr = std_listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
            while let Ok((conn, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(conn).await else {
                        return;
                    };
                    let Ok(mut up) = tokio::net::TcpStream::connect(backend).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                });
            }
        });
    });
    addr
}

/// `sip_app = "tls:..."`: each owner reaches the server over TLS (its
/// certificate chains to `[sips] upstream_ca`, for the server's IP) with
/// its own `SIP/2.0/TLS` Via, and a call through each node completes.
#[test]
fn over_tls_to_the_server_a_call_through_each_node_completes() {
    let dir = temp_dir("sips-upstream-certs");
    let (ca, cert, key) = ca_and_leaf(&dir, "sips");
    let uas = StrictUas::start_tcp();
    let front = tls_front(uas.addr, &cert, &key);
    let c = cluster(
        "sips-upstream",
        &format!("tls:{front}"),
        (&cert, &key),
        &format!("upstream_ca = \"{}\"\n", ca.display()),
    );
    for (i, node) in c.nodes.iter().enumerate() {
        let mut conn = TlsSip::connect(node.sips.unwrap(), &ca);
        let call = format!("sips-up{i}");
        let invite = request("INVITE", "bob", &call, 1, ("TLS", conn.local), &call, "");
        conn.send(&invite);
        let mut codes = Vec::new();
        while let Some(a) = conn.next(Duration::from_secs(10)) {
            codes.push(status(&a));
            if status(&a) >= 200 {
                break;
            }
        }
        assert_eq!(codes, vec![100, 180, 200], "through n{}", i + 1);
        let seen = uas.requests("INVITE", &call);
        assert_eq!(seen.len(), 1);
        let top = seen[0]
            .lines()
            .find(|l| l.starts_with("Via: "))
            .unwrap()
            .to_owned();
        assert!(top.starts_with("Via: SIP/2.0/TLS 127.0.0.1:"), "{top}");
    }
}

/// A server whose certificate does not chain to `[sips] upstream_ca` is
/// never sent the request: the caller gets 503 and the server sees nothing.
#[test]
fn a_tls_server_outside_upstream_ca_is_not_reached() {
    let dir = temp_dir("sips-untrusted-certs");
    let (_, cert, key) = ca_and_leaf(&dir, "sips");
    let (other_ca, _, _) = ca_and_leaf(&dir, "other");
    let uas = StrictUas::start_tcp();
    let front = tls_front(uas.addr, &cert, &key);
    let c = Cluster::start_sip(
        "sips-untrusted",
        1,
        &format!("sip_app = \"tls:{front}\"\n"),
        &format!("[sips]\nupstream_ca = \"{}\"\n", other_ca.display()),
    );
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let me = client.local_addr().unwrap();
    let invite = request(
        "INVITE",
        "bob",
        "untrusted",
        1,
        ("UDP", me),
        "untrusted",
        "",
    );
    client
        .send_to(invite.as_bytes(), c.nodes[0].sip.unwrap())
        .unwrap();
    let answers = gather(&client, Duration::from_secs(20), |a| has_final(a, "INVITE"));
    assert_eq!(
        statuses(&answers, "INVITE").last(),
        Some(&503),
        "{answers:?}"
    );
    assert!(uas.requests("INVITE", "untrusted").is_empty());
}

/// `sips_addr` and `[sips]` errors exit 64 naming the field, before any
/// socket is bound.
#[test]
fn bad_sips_config_exits_64_naming_the_field() {
    let dir = temp_dir("sips-config");
    let node = |extra: &str| {
        format!(
            "[[nodes]]\nid = \"n1\"\nhttp_addr = \"127.0.0.1:{}\"\npeer_addr = \"127.0.0.1:{}\"\n\
             gossip_addr = \"127.0.0.1:{}\"\nsip_addr = \"127.0.0.1:{}\"\n{extra}",
            free_port(),
            free_port(),
            free_port(),
            free_port()
        )
    };
    for (text, says) in [
        (
            node("sips_addr = \"127.0.0.1\"\n"),
            "nodes[0].sips_addr: needs a certificate: set [sips] cert and key, or [listener.tls]",
        ),
        (
            node("sips_addr = \"127.0.0.1:0\"\n"),
            "nodes[0].sips_addr: 127.0.0.1:0: port 0",
        ),
        (
            node("sips_addr = \"nowhere\"\n"),
            "nodes[0].sips_addr: \"nowhere\" is neither an ip:port socket address nor an IP",
        ),
        (
            format!(
                "sip_app = \"tls:127.0.0.1:5061\"\n[sips]\nupstream_ca = \"no-such-dir/none-ca.pem\"\n{}",
                node("")
            ),
            "/no-such-dir/none-ca.pem: I/O error",
        ),
        (
            format!("sips_sprayer_addr = \"127.0.0.1\"\n{}", node("")),
            "sips_sprayer_addr: no node has a sips_addr, so no node would listen there",
        ),
        (
            format!("sips_sprayer_addr = \"0.0.0.0\"\n{}", node("")),
            "sips_sprayer_addr: 0.0.0.0:5061: clients are sent this address in Record-Route",
        ),
        (
            format!("[sips]\ncert = \"a.pem\"\n{}", node("")),
            "sips.key: is required with sips.cert",
        ),
        (
            format!("sip_app = \"tls:127.0.0.1:5061\"\n{}", node("")),
            "sips.upstream_ca: is required with sip_app = \"tls:...\"",
        ),
        (
            format!(
                "[sips]\ncert = \"missing.pem\"\nkey = \"missing.key\"\n{}",
                node("sips_addr = \"127.0.0.1\"\n")
            ),
            "missing.pem",
        ),
    ] {
        let file = dir.join("bad.toml");
        std::fs::write(&file, &text).unwrap();
        // The node's own certificates exist, so what fails is [sips]'s.
        let certs = std::process::Command::new(bin())
            .args(["certs", "--config"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(certs.status.success() || !says.contains(".pem"));
        let mut runs = vec![vec!["node", "--node", "n1", "--config"]];
        if !says.contains(".pem") {
            runs.push(vec!["check-config", "--config"]);
        }
        for args in runs {
            let out = std::process::Command::new(bin())
                .args(&args)
                .arg(&file)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(64), "{text} {args:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains(says), "{text} {args:?}: {err}");
        }
    }
}

/// RFC 5923 connection reuse over TLS: the server's BYE toward a caller
/// that called over TLS, sent to another node, reaches the caller inside
/// its own TLS connection (its Contact is a `sips:` URI where nothing
/// listens), the entry's `SIP/2.0/TLS` Via on top, and the caller's 200
/// reaches the server; a Route naming a TLS flow that is gone gets `430
/// Flow Failed` (RFC 5626 5.3: no new TLS connection toward a caller).
#[test]
fn a_bye_from_the_server_reaches_a_tls_caller_inside_its_own_connection() {
    let dir = temp_dir("sips-flow-certs");
    let (ca, cert, key) = ca_and_leaf(&dir, "sips");
    let uas = StrictUas::start();
    let c = cluster("sips-flow", &format!("udp:{}", uas.addr), (&cert, &key), "");
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let bye = |call: &str, route: &str, n: usize| {
        format!(
            "BYE sips:alice@{nowhere} SIP/2.0\r\n\
             Via: SIP/2.0/UDP {};branch=z9hG4bKtlsbye{n}\r\nRoute: {route}\r\nMax-Forwards: 70\r\n\
             From: <sip:bob@test>;tag=uas\r\nTo: <sip:alice@test>;tag=a{call}\r\nCall-ID: {call}\r\n\
             CSeq: 1 BYE\r\nContent-Length: 0\r\n\r\n",
            uas.addr
        )
    };
    for i in 0..3 {
        let call = format!("sips-flow{i}");
        let sips = c.nodes[i].sips.unwrap();
        let mut conn = TlsSip::connect(sips, &ca);
        let invite = request("INVITE", "bob", &call, 1, ("TLS", conn.local), &call, "")
            .replacen("INVITE sip:", "INVITE sips:", 1)
            .replace(
                &format!("Contact: <sip:alice@{}>", conn.local),
                &format!("Contact: <sips:alice@{nowhere}>"),
            );
        conn.send(&invite);
        let mut codes = Vec::new();
        while let Some(a) = conn.next(Duration::from_secs(10)) {
            codes.push(status(&a));
            if status(&a) >= 200 {
                break;
            }
        }
        assert_eq!(codes, [100, 180, 200]);
        let rr = header(&uas.requests("INVITE", &call)[0], "record-route")
            .unwrap()
            .to_owned();
        assert!(rr.contains(&format!(".n{}>", i + 1)), "{rr}");
        uas.send_to(&bye(&call, &rr, i), c.nodes[(i + 1) % 3].sip.unwrap());
        let got = conn
            .next(Duration::from_secs(10))
            .expect("the BYE inside the caller's TLS connection");
        assert!(got.starts_with("BYE sips:alice@"), "{got}");
        assert!(
            all_headers(&got, "via")[0]
                .starts_with(&format!("SIP/2.0/TLS {sips};branch=z9hG4bK-plbc-")),
            "{got}"
        );
        conn.send(&answer(&got, 200, conn.local));
        poll(Duration::from_secs(10), || {
            !uas.received(200, "BYE", &call).is_empty()
        })
        .expect("the caller's 200 reached the server");
    }
    let gone = format!(
        "<sips:{};lr;peerlb-owner=n1;peerlb-key=k;peerlb-flow=00000000deadbeef.n1>",
        c.nodes[0].sips.unwrap()
    );
    uas.send_to(&bye("sips-gone", &gone, 9), c.nodes[1].sip.unwrap());
    poll(Duration::from_secs(10), || {
        !uas.received(430, "BYE", "sips-gone").is_empty()
    })
    .expect("430 Flow Failed for a TLS flow that is gone");
    let sum = |name: &str| c.nodes.iter().map(|n| counter(n.http, name)).sum::<u64>();
    assert_eq!((sum("sip_flow_requests"), sum("sip_flow_failed")), (3, 1));
}
