//! Client certificates at the entry (`client_ca`, `client_auth` per SNI
//! name, `X-Forwarded-Client-Cert`) and connection coalescing against
//! rules on the TLS name (421). Real `peerlb` processes and curl on
//! loopback.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::path::{Path, PathBuf};

use support::https::*;
use support::*;

/// A CA for client certificates (`<stem>-ca.pem` in `dir`) and a client
/// certificate it issued (CN `cn`, URI SAN `spiffe://example/<cn>`) as
/// one PEM of certificate and key, as curl's `--cert` takes it.
fn client_ca_and_cert(dir: &Path, stem: &str, cn: &str) -> (PathBuf, PathBuf) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, format!("{stem} client CA"));
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params.subject_alt_names.push(rcgen::SanType::URI(
        format!("spiffe://example/{cn}").try_into().unwrap(),
    ));
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &ca_cert, &ca_key).unwrap();
    let (ca_path, client) = (
        dir.join(format!("{stem}-ca.pem")),
        dir.join(format!("{stem}-{cn}.pem")),
    );
    std::fs::write(&ca_path, ca_cert.pem()).unwrap();
    std::fs::write(&client, format!("{}{}", cert.pem(), key.serialize_pem())).unwrap();
    (ca_path, client)
}

// Client certificates at the entry, per SNI name: localhost requires one
// from the client CA, a.example takes one when sent, b.example asks none.
// The verified identity reaches the app in X-Forwarded-Client-Cert (hash,
// subject, URI SAN) on the local path and across the hop; a client's own
// X-Forwarded-Client-Cert never does; no certificate, or one of another
// CA, fails the handshake where one is required.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_verified_per_sni_and_their_identity_reaches_the_app() {
    let app = echo_app().await;
    let certs = temp_dir("https-mtls-certs");
    let (site, site_key) = self_signed(&certs, "site", &["localhost"]);
    let (a, a_key) = self_signed(&certs, "a", &["a.example"]);
    let (b, b_key) = self_signed(&certs, "b", &["b.example"]);
    let (ca, alice) = client_ca_and_cert(&certs, "ours", "alice");
    let (_, mallory) = client_ca_and_cert(&certs, "theirs", "mallory");
    let head = format!(
        "app = \"http://{app}\"\n[listener.tls]\ncert = {site:?}\nkey = {site_key:?}\nclient_ca = {ca:?}\nsni = [{{ cert = {a:?}, key = {a_key:?}, client_auth = \"optional\" }}, {{ cert = {b:?}, key = {b_key:?}, client_auth = \"none\" }}]\n"
    );
    let c = Cluster::start("https-mtls", 2, &head, USER_RULES);
    let entry = c.nodes[0].http;
    let r = ring(&["n1", "n2"], peerlb::config::RingSection::default().vnodes);
    let call = |name: &'static str, site: PathBuf, user: String, extra: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            curl_https(name, entry, &format!("/?user={user}"), &site, &extra)
        })
    };
    let forged = [
        "-H".to_owned(),
        "X-Forwarded-Client-Cert: Hash=00;Subject=\"CN=root\"".to_owned(),
    ];
    let with = |cert: &Path| {
        let mut v = vec!["--cert".to_owned(), cert.display().to_string()];
        v.extend(forged.iter().cloned());
        v
    };
    for owner in ["n1", "n2"] {
        let user = user_where(&r, |o| o == owner);
        // Required: alice's certificate verifies, and the app gets her
        // identity alone (the client's own header dropped).
        let (status, head, body) = call("localhost", site.clone(), user.clone(), with(&alice))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status, 200, "{head}");
        assert!(
            head.contains(&format!("peerlb-served-by: {owner}")),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let xfcc = v["x-forwarded-client-cert"].as_array().unwrap();
        assert_eq!(xfcc.len(), 1, "{v}");
        let xfcc = xfcc[0].as_str().unwrap();
        assert!(xfcc.starts_with("Hash="), "{xfcc}");
        assert!(xfcc.contains(";Subject=\"CN=alice\""), "{xfcc}");
        assert!(xfcc.contains(";URI=spiffe://example/alice"), "{xfcc}");
        assert!(!xfcc.contains("root"), "{xfcc}");
        // Optional on a.example: without a certificate it is served, and
        // the forged header does not reach the app; with one, it does.
        let (status, _, body) = call("a.example", a.clone(), user.clone(), forged.to_vec())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status, 200);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["x-forwarded-client-cert"], serde_json::json!([]), "{v}");
        let (_, _, body) = call("a.example", a.clone(), user.clone(), with(&alice))
            .await
            .unwrap()
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(
            v["x-forwarded-client-cert"][0]
                .as_str()
                .unwrap()
                .contains("CN=alice"),
            "{v}"
        );
        // b.example asks for none: a certificate offered is not sent.
        let (status, _, body) = call("b.example", b.clone(), user.clone(), with(&alice))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status, 200);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["x-forwarded-client-cert"], serde_json::json!([]), "{v}");
    }
    // Required: no certificate, or one of another CA, is refused.
    let user = user_where(&r, |o| o == "n2");
    for extra in [forged.to_vec(), with(&mallory)] {
        let e = call("localhost", site.clone(), user.clone(), extra.clone())
            .await
            .unwrap()
            .unwrap_err();
        assert_ne!(e.0, 0, "{extra:?}: {}", e.1);
    }
    // Optional: a certificate of another CA is refused too (optional
    // means "when sent, verified").
    let e = call("a.example", a.clone(), user, with(&mallory))
        .await
        .unwrap()
        .unwrap_err();
    assert_ne!(e.0, 0, "{}", e.1);
    std::fs::remove_dir_all(certs).ok();
}

// Connection coalescing against a rule on the TLS name: one certificate
// covers localhost and a.example, and a rule keys a.example's requests
// by SNI. A request for a.example on the connection made for localhost
// (as a browser reuses it) would be routed as localhost's: 421, so the
// client opens a connection for a.example. A name the rules route alike
// (b.example, no rule of its own) is served on the coalesced connection.
#[test]
fn a_coalesced_request_that_an_sni_rule_would_route_otherwise_is_misdirected() {
    let certs = temp_dir("https-coalesce");
    let (both, key) = self_signed(&certs, "both", &["localhost", "a.example", "b.example"]);
    let head = format!("[listener.tls]\ncert = {both:?}\nkey = {key:?}\n");
    let rules = format!(
        "[[rules]]\nname = \"a-site\"\nwhen = {{ sni = \"a.example\" }}\nextract = [{{ query = \"user\", prefix = \"a:\" }}]\n\n{USER_RULES}"
    );
    let c = Cluster::start("https-coalesce", 1, &head, &rules);
    let entry = c.nodes[0].http;
    for proto in ["--http1.1", "--http2"] {
        let on_localhost = |host: &str| {
            curl_https(
                "localhost",
                entry,
                "/?user=u1",
                &both,
                &[proto, "-H", &format!("host: {host}")],
            )
            .unwrap()
        };
        let (status, head, _) = on_localhost("a.example");
        assert_eq!(status, 421, "{proto}: {head}");
        let (status, _, body) = on_localhost("b.example");
        assert_eq!(status, 200, "{proto}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["key"], "u1", "{v}");
        // On its own connection, a.example is keyed by its rule.
        let (status, _, body) =
            curl_https("a.example", entry, "/?user=u1", &both, &[proto]).unwrap();
        assert_eq!(status, 200);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["key"], "a:u1", "{v}");
    }
    std::fs::remove_dir_all(certs).ok();
}
