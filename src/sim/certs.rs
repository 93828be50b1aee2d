//! The simulation's cluster CA and node certificates, made in memory and
//! byte-identical for a given seed: Ed25519 keys derived from the seed
//! (Ed25519 signatures are deterministic and always 64 bytes, unlike
//! ECDSA's, whose DER length varies with the nonce), fixed serial numbers
//! and validity. The same trust model as `peerlb certs`: a CA constrained
//! to `node.peerlb`, one `<id>.node.peerlb` name per node, server and
//! client authentication.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    GeneralSubtree, IsCa, KeyPair, KeyUsagePurpose, NameConstraints, SerialNumber,
};
use rustls_pki_types::PrivatePkcs8KeyDer;

use crate::adapters::transport::tls::{self, TlsError, TlsMaterial};
use crate::engine::node_id::NodeId;

/// An Ed25519 key from a 32-byte seed, as PKCS#8 v1 (RFC 8410).
fn ed25519(seed: [u8; 32]) -> Result<KeyPair, rcgen::Error> {
    let mut der = vec![
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    der.extend_from_slice(&seed);
    KeyPair::from_pkcs8_der_and_sign_algo(&PrivatePkcs8KeyDer::from(der), &rcgen::PKCS_ED25519)
}

fn key_seed(seed: u64, n: u64) -> [u8; 32] {
    let mut out = [0u8; 32];
    let mut s = seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for chunk in out.chunks_mut(8) {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out
}

/// The simulation's gossip keyring: one key derived from the seed (as the
/// certificate keys are), so a seed gives the same sealed bytes.
pub fn gossip_keyring(seed: u64) -> crate::adapters::cluster::keyring::Keyring {
    use crate::adapters::cluster::keyring::{GossipKey, Keyring};
    Keyring::single(GossipKey::from_bytes(key_seed(seed, u64::MAX)))
}

/// PEM texts of one node's TLS identity.
#[derive(Clone)]
pub struct NodePem {
    /// The CA certificate.
    pub ca: String,
    /// The node certificate.
    pub cert: String,
    /// The node key.
    pub key: String,
}

impl NodePem {
    /// The node's [`TlsMaterial`], checked against `clock`.
    ///
    /// # Errors
    /// As [`TlsMaterial::from_pem`].
    pub fn material(&self, clock: Arc<dyn crate::env::Clock>) -> Result<TlsMaterial, TlsError> {
        TlsMaterial::from_pem(
            self.ca.as_bytes(),
            self.cert.as_bytes(),
            self.key.as_bytes(),
            Arc::new(crate::env::ClockAdapter(clock)),
        )
    }
}

/// Makes a CA for `cluster` and a certificate for each of `ids`, every key
/// derived from `seed`. Valid 2020-01-01 to 2100-01-01.
///
/// # Errors
/// rcgen's error (not expected) or an invalid node id.
pub fn generate(cluster: &str, ids: &[String], seed: u64) -> anyhow::Result<Vec<NodePem>> {
    let validity = |p: &mut CertificateParams| {
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2100, 1, 1);
    };
    let ca_key = ed25519(key_seed(seed, 0))?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name = DistinguishedName::new();
    ca.distinguished_name
        .push(DnType::CommonName, format!("peerlb {cluster} CA"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.name_constraints = Some(NameConstraints {
        permitted_subtrees: vec![GeneralSubtree::DnsName("node.peerlb".to_owned())],
        excluded_subtrees: Vec::new(),
    });
    ca.serial_number = Some(SerialNumber::from(1u64));
    validity(&mut ca);
    let ca_cert = ca.self_signed(&ca_key)?;
    let mut out = Vec::with_capacity(ids.len());
    for (i, id) in ids.iter().enumerate() {
        NodeId::new(id)?;
        let key = ed25519(key_seed(seed, i as u64 + 1))?;
        let mut p = CertificateParams::new(vec![tls::node_server_name(id)])?;
        p.distinguished_name = DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, id.as_str());
        p.distinguished_name
            .push(DnType::OrganizationName, format!("peerlb {cluster}"));
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        p.use_authority_key_identifier_extension = true;
        p.serial_number = Some(SerialNumber::from(i as u64 + 2));
        validity(&mut p);
        let cert = p.signed_by(&key, &ca_cert, &ca_key)?;
        out.push(NodePem {
            ca: ca_cert.pem(),
            cert: cert.pem(),
            key: key.serialize_pem(),
        });
    }
    Ok(out)
}
