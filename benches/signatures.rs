//! The cost of signed gossip state (`gossip.state_signatures`), per
//! operation: a node signing its own state after a change, and a member
//! checking another node's state (the certificate's chain to the cluster
//! CA and its name, then the signature), the first time a certificate is
//! seen and again with the chain check remembered.
//!
//! Run: `cargo bench --bench signatures` (figures, and what they make at
//! 100 and 1,000 nodes, in `docs/performance.md`, section "Signed gossip
//! state"). The state is the size of a real one: a node's keys (status,
//! weight, load, inflight, addresses) and its certificate in base64, about
//! 1.1 KB, signed with a `peerlb certs` key (ECDSA P-256). Each benchmark
//! first asserts that its input verifies (or, for the forged one, fails),
//! so a change cannot silently make it measure an error path.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use peerlb::tls::{self, StateSignError, TlsMaterial};

/// A state of a real node's size: its keys and values, then its
/// certificate in base64 (what `canonical` covers).
fn state(cert: &[u8]) -> Vec<u8> {
    let mut s = Vec::new();
    for part in [
        "n2",
        "1",
        "status",
        "serving",
        "weight",
        "100",
        "load",
        "97",
        "inflight",
        "12",
        "peer_addr",
        "198.51.100.2:7001",
        "http_addr",
        "198.51.100.2:8080",
    ] {
        s.extend((part.len() as u32).to_le_bytes());
        s.extend(part.as_bytes());
    }
    // Base64 is 4/3 of the DER.
    s.extend(std::iter::repeat_n(b'A', cert.len() * 4 / 3));
    s
}

fn signatures(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("peerlb-bench-sign-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let certs = tls::generate(&dir, "bench", &["n1", "n2"]).expect("certificates");
    let material = |id: &str| {
        let (_, cert, key) = certs.nodes.iter().find(|(n, _, _)| n == id).unwrap();
        TlsMaterial::load(&certs.ca_cert, cert, key).expect("material")
    };
    let (n1, n2) = (material("n1"), material("n2"));
    let signer = n2.state_signer().expect("signer");
    let cert = signer.certificate().clone();
    let body = state(cert.as_ref());
    let sig = signer.sign(&body).expect("sign");

    // The paths measured: a good state verifies, a changed byte does not.
    let fresh = || n1.state_verifier();
    fresh()
        .verify("n2", &cert, &body, &sig)
        .expect("the state verifies");
    let mut forged = body.clone();
    forged[20] ^= 1;
    assert!(matches!(
        fresh().verify("n2", &cert, &forged, &sig),
        Err(StateSignError::BadSignature)
    ));

    let mut g = c.benchmark_group("signatures");
    g.bench_function("sign own state", |b| {
        b.iter(|| signer.sign(black_box(&body)).unwrap())
    });
    // A verifier that has never seen the certificate: chain, name, then
    // the signature.
    g.bench_function("verify, certificate first seen", |b| {
        b.iter_batched(
            fresh,
            |v| v.verify("n2", &cert, black_box(&body), &sig).unwrap(),
            criterion::BatchSize::SmallInput,
        )
    });
    // The common case: the member's next change, same certificate.
    let warm = fresh();
    warm.verify("n2", &cert, &body, &sig).unwrap();
    g.bench_function("verify, certificate seen", |b| {
        b.iter(|| warm.verify("n2", &cert, black_box(&body), &sig).unwrap())
    });
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, signatures);
criterion_main!(benches);
