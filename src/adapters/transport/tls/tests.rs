//! Certificate issuance, loading and mutual TLS over real quinn endpoints
//! on loopback.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{CertificateParams, ExtendedKeyUsagePurpose};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use time::{Date, Month};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::configs::{provider, read_certs, read_key, verify_chain};
use super::issuance::{Ca, new_key};
use super::*;

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("peerlb-tls-{tag}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn material(certs: &GeneratedCerts, id: &str) -> TlsMaterial {
    let (_, cert, key) = certs.nodes.iter().find(|(n, _, _)| n == id).unwrap();
    TlsMaterial::load(&certs.ca_cert, cert, key).unwrap()
}

fn server(m: &TlsMaterial) -> quinn::Endpoint {
    quinn::Endpoint::server(
        quinn_server_config(m).unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .unwrap()
}

fn client(m: &TlsMaterial) -> quinn::Endpoint {
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(quinn_client_config(m).unwrap());
    endpoint
}

const LIMIT: Duration = Duration::from_secs(10);

/// Every valid node id makes a valid certificate name, and an invalid one is
/// refused before any name is made (the rules are the engine's).
#[test]
fn node_ids() {
    for ok in [
        "n1",
        "node-a",
        "web.3",
        "web_1",
        "_x",
        "A",
        "a-b.c_d",
        &"x".repeat(63),
    ] {
        assert!(identity::checked_server_name(ok).is_ok(), "{ok}");
        assert!(ServerName::try_from(node_server_name(ok)).is_ok(), "{ok}");
    }
    for bad in ["", &"x".repeat(64), "a..b", "a:1", "*", "ca", "CA"] {
        assert!(
            matches!(
                identity::checked_server_name(bad),
                Err(TlsError::InvalidNodeId(_))
            ),
            "{bad:?}"
        );
    }
    assert_eq!(node_server_name("n1"), "n1.node.peerlb");
}

/// Validity starts at midnight UTC the day before issue and ends `years`
/// later on the same month and day, capped at the 28th (what the former
/// hand-written calendar gave for the same days).
#[test]
fn validity_dates() {
    let date = |y, m, d| Date::from_calendar_date(y, Month::try_from(m).unwrap(), d).unwrap();
    let at = |y, m, d| rcgen::date_time_ymd(y, m, d);
    // Issued 1970-01-02 (day 1): from 1970-01-01.
    assert_eq!(
        issuance::validity(date(1970, 1, 2), 20),
        (at(1970, 1, 1), at(1990, 1, 1))
    );
    // Issued 1970-01-01: from 1969-12-31, to the 28th.
    assert_eq!(
        issuance::validity(date(1970, 1, 1), 10),
        (at(1969, 12, 31), at(1979, 12, 28))
    );
    // Issued 2024-03-01: from the leap day, to 28 February.
    assert_eq!(
        issuance::validity(date(2024, 3, 1), 20),
        (at(2024, 2, 29), at(2044, 2, 28))
    );
    // Issued 2024-10-05 (day 20,001): from 2024-10-04.
    assert_eq!(
        issuance::validity(date(2024, 10, 5), 10),
        (at(2024, 10, 4), at(2034, 10, 4))
    );
}

#[test]
fn generate_twice_keeps_existing_files() {
    let dir = TempDir::new("twice");
    let first = generate(&dir.0, "c1", &["n1", "n2"]).unwrap();
    // CA pair, gossip keyring, two node pairs.
    assert_eq!(first.created.len(), 7);
    assert!(first.created.contains(&dir.0.join("gossip.keys")));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.0), 0o700);
        assert_eq!(mode(&first.ca_key), 0o600);
        assert_eq!(mode(&first.nodes[0].2), 0o600);
    }
    let before: Vec<Vec<u8>> = [&first.ca_cert, &first.ca_key, &first.nodes[0].1]
        .iter()
        .map(|p| fs::read(p).unwrap())
        .collect();

    let second = ensure_local(&dir.0, "c1", &["n1", "n2", "web_3"]).unwrap();
    assert_eq!(
        second.created,
        vec![second.nodes[2].2.clone(), second.nodes[2].1.clone()]
    );
    let after: Vec<Vec<u8>> = [&second.ca_cert, &second.ca_key, &second.nodes[0].1]
        .iter()
        .map(|p| fs::read(p).unwrap())
        .collect();
    assert_eq!(before, after);

    // The node issued by the reused CA loads (so chains to ca.pem) and
    // carries its identity.
    let m = material(&second, "web_3");
    verify_peer_is(m.cert_chain(), "web_3").unwrap();
    assert_eq!(peer_node_id(m.cert_chain()).as_deref(), Some("web_3"));
    assert!(matches!(
        verify_peer_is(m.cert_chain(), "n1"),
        Err(TlsError::PeerIdentityMismatch { .. })
    ));

    // Nothing missing: nothing written.
    let third = generate(&dir.0, "c1", &["n1"]).unwrap();
    assert!(third.created.is_empty());
}

#[test]
fn generate_refuses_mismatches() {
    let dir = TempDir::new("mismatch");
    generate(&dir.0, "c1", &["n1"]).unwrap();
    // Another cluster name cannot reuse this CA.
    let err = generate(&dir.0, "other", &["n2"]).unwrap_err();
    assert!(matches!(err, TlsError::CaMismatch { .. }), "{err}");
    assert!(!dir.0.join("n2.pem").exists());
    // Half a pair is reported, not overwritten.
    fs::remove_file(dir.0.join("n1.key")).unwrap();
    let err = generate(&dir.0, "c1", &["n1"]).unwrap_err();
    assert!(matches!(err, TlsError::IncompletePair { .. }), "{err}");
    assert!(err.to_string().contains("n1.key"), "{err}");
    // Duplicate ids (ignoring case) are refused before anything is written.
    let err = generate(&dir.0, "c1", &["n9", "N9"]).unwrap_err();
    assert!(matches!(err, TlsError::DuplicateNodeId { .. }), "{err}");
    assert!(!dir.0.join("n9.pem").exists());
}

#[test]
fn ca_only_vouches_for_node_names() {
    let dir = TempDir::new("constraint");
    let certs = generate(&dir.0, "c1", &[]).unwrap();
    let ca = Ca::load(&certs.ca_cert, &certs.ca_key, "c1").unwrap();
    let key = new_key("test").unwrap();
    let mut params = CertificateParams::new(vec!["www.example.com".to_owned()]).unwrap();
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&key, &ca.cert, &ca.key).unwrap();
    let anchor = ca.anchor.as_ref().unwrap();
    let err =
        verify_chain(anchor, &[cert.der().clone()], &provider(), UnixTime::now()).unwrap_err();
    assert!(
        format!("{err:?}").contains("NameConstraintViolation"),
        "{err:?}"
    );
    // The same CA does issue node names.
    let (pem, _) = ca.issue("n1", "c1", &certs.ca_cert).unwrap();
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
    verify_chain(anchor, &[der], &provider(), UnixTime::now()).unwrap();
}

#[test]
fn load_errors_name_the_file() {
    let dir = TempDir::new("load");
    let certs = generate(&dir.0, "c1", &["n1"]).unwrap();
    let (_, cert, key) = &certs.nodes[0];

    let missing = dir.0.join("nope.pem");
    let err = TlsMaterial::load(&certs.ca_cert, &missing, key).unwrap_err();
    assert!(matches!(err, TlsError::Read { .. }));
    assert!(
        err.to_string()
            .starts_with(&format!("reading {}: ", missing.display())),
        "{err}"
    );

    // Certificate and key swapped.
    let err = TlsMaterial::load(&certs.ca_cert, cert, cert).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{}: no private key found", cert.display())
    );
    let err = TlsMaterial::load(&certs.ca_cert, key, key).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{}: no certificate found", key.display())
    );

    // A key from another node.
    let other = generate(&dir.0, "c1", &["n2"]).unwrap();
    let err = TlsMaterial::load(&certs.ca_cert, cert, &other.nodes[0].2).unwrap_err();
    assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");

    // A certificate from another cluster's CA.
    let foreign = TempDir::new("load-foreign");
    let f = generate(&foreign.0, "c2", &["n1"]).unwrap();
    let err = TlsMaterial::load(&certs.ca_cert, &f.nodes[0].1, &f.nodes[0].2).unwrap_err();
    assert!(matches!(err, TlsError::Untrusted { .. }), "{err}");
    assert!(
        err.to_string().contains(&*f.nodes[0].1.to_string_lossy()),
        "{err}"
    );

    let garbage = dir.0.join("garbage.pem");
    fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nnot base64!\n").unwrap();
    let err = TlsMaterial::load(&garbage, cert, key).unwrap_err();
    assert!(matches!(err, TlsError::Pem { .. }), "{err}");
    assert!(err.to_string().contains("garbage.pem"), "{err}");
}

#[tokio::test]
async fn mutual_tls_handshake_and_identity() {
    let dir = TempDir::new("handshake");
    let certs = generate(&dir.0, "c1", &["n1", "n2"]).unwrap();
    let (n1, n2) = (material(&certs, "n1"), material(&certs, "n2"));
    server_config(&n2).unwrap();
    client_config(&n1).unwrap();
    let server = server(&n2);
    let addr = server.local_addr().unwrap();

    let accept = tokio::spawn(async move {
        let conn = server.accept().await.unwrap().await.unwrap();
        let certs = conn
            .peer_identity()
            .unwrap()
            .downcast::<Vec<CertificateDer<'static>>>()
            .unwrap();
        let alpn = conn
            .handshake_data()
            .unwrap()
            .downcast::<quinn::crypto::rustls::HandshakeData>()
            .unwrap()
            .protocol;
        let (mut send, _recv) = conn.accept_bi().await.unwrap();
        send.write_all(b"ok").await.unwrap();
        send.finish().unwrap();
        send.stopped().await.unwrap();
        (*certs, alpn)
    });

    let client = client(&n1);
    let conn = tokio::time::timeout(
        LIMIT,
        client.connect(addr, &node_server_name("n2")).unwrap(),
    )
    .await
    .unwrap()
    .unwrap();
    let alpn = conn
        .handshake_data()
        .unwrap()
        .downcast::<quinn::crypto::rustls::HandshakeData>()
        .unwrap()
        .protocol;
    assert_eq!(alpn.as_deref(), Some(ALPN));
    // The server side proves who it is to the client as well.
    let server_certs = conn
        .peer_identity()
        .unwrap()
        .downcast::<Vec<CertificateDer<'static>>>()
        .unwrap();
    verify_peer_is(&server_certs, "n2").unwrap();

    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(b"hi").await.unwrap();
    let reply = tokio::time::timeout(LIMIT, recv.read_to_end(16))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reply, b"ok");

    let (peer_certs, server_alpn) = tokio::time::timeout(LIMIT, accept).await.unwrap().unwrap();
    assert_eq!(server_alpn.as_deref(), Some(ALPN));
    verify_peer_is(&peer_certs, "n1").unwrap();
    verify_peer_is(&peer_certs, "N1").unwrap();
    let err = verify_peer_is(&peer_certs, "n3").unwrap_err();
    assert!(
        matches!(err, TlsError::PeerIdentityMismatch { .. }),
        "{err}"
    );
    assert!(matches!(
        verify_peer_is(&[], "n1"),
        Err(TlsError::NoPeerCertificate)
    ));
    assert_eq!(peer_node_id(&peer_certs).as_deref(), Some("n1"));
    conn.close(0u32.into(), b"done");
    client.wait_idle().await;
}

#[tokio::test]
async fn wrong_server_identity_is_refused() {
    let dir = TempDir::new("wrong-name");
    let certs = generate(&dir.0, "c1", &["n1", "n2", "n3"]).unwrap();
    let server = server(&material(&certs, "n2"));
    let addr = server.local_addr().unwrap();
    tokio::spawn(async move {
        while let Some(incoming) = server.accept().await {
            let _ = incoming.await;
        }
    });
    let client = client(&material(&certs, "n1"));
    let result = tokio::time::timeout(
        LIMIT,
        client.connect(addr, &node_server_name("n3")).unwrap(),
    )
    .await
    .unwrap();
    let err = result.unwrap_err();
    assert!(err.to_string().contains("not valid for name"), "{err}");
    assert!(
        matches!(err, quinn::ConnectionError::TransportError(_)),
        "{err:?}"
    );
}

#[tokio::test]
async fn client_from_another_ca_is_refused() {
    let dir = TempDir::new("foreign-ours");
    let ours = generate(&dir.0, "c1", &["n1", "n2"]).unwrap();
    let foreign_dir = TempDir::new("foreign-theirs");
    let theirs = generate(&foreign_dir.0, "c2", &["n1"]).unwrap();
    let n2 = material(&ours, "n2");
    // The intruder trusts our CA (so it accepts our server) but its own
    // certificate is from another CA.
    let (_, cert, key) = &theirs.nodes[0];
    let intruder = TlsMaterial {
        roots: n2.roots.clone(),
        chain: read_certs(cert).unwrap(),
        key: read_key(key).unwrap(),
        time: Arc::new(rustls::time_provider::DefaultTimeProvider),
    };

    let server = server(&n2);
    let addr = server.local_addr().unwrap();
    let accept = tokio::spawn(async move { server.accept().await.unwrap().await });

    let client = client(&intruder);
    let refused = match tokio::time::timeout(
        LIMIT,
        client.connect(addr, &node_server_name("n2")).unwrap(),
    )
    .await
    .unwrap()
    {
        Err(_) => true,
        // TLS 1.3: the client may finish before the server has checked its
        // certificate; the connection is then closed under it.
        Ok(conn) => {
            let stream = async {
                let (mut send, mut recv) = conn.open_bi().await?;
                send.write_all(b"hi").await?;
                send.finish()?;
                recv.read_to_end(16).await?;
                Ok::<_, Box<dyn std::error::Error>>(())
            };
            tokio::time::timeout(LIMIT, stream).await.unwrap().is_err()
        }
    };
    assert!(refused);
    let server_side = tokio::time::timeout(LIMIT, accept).await.unwrap().unwrap();
    let err = server_side.unwrap_err();
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
}
