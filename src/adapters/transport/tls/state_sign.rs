//! Signatures over a node's gossip state with the private key of its node
//! certificate, and their check against a certificate the cluster CA
//! vouches for (issue 34: a holder of the gossip key, without a node's
//! private key, must not be able to speak for that node).
//!
//! [`StateSigner::sign`] signs `DOMAIN || state` (the caller's canonical
//! bytes of the state; the domain keeps a state signature from ever
//! passing as a TLS handshake signature or the reverse) with a TLS 1.3
//! signature scheme the key supports ([`SCHEMES`]). [`StateVerifier::verify`]
//! checks that the certificate chains to the cluster CA (validity now,
//! client and server usage: as a peer handshake would), names the node
//! that the state is about (`<id>.node.peerlb`), and that the signature
//! over `DOMAIN || state` is its key's. A certificate from another CA, or
//! another node's, or a changed byte of the state, fails.
//!
//! Only the primitive lives here; carrying the signature and certificate
//! in gossip and checking them when a member's state is read is the
//! gossip layer's (`adapters/cluster`).

use std::sync::Arc;

use rustls::SignatureScheme;
use rustls::crypto::CryptoProvider;
use rustls::sign::Signer;
use rustls::time_provider::TimeProvider;
use rustls_pki_types::CertificateDer;

use super::configs::{TlsMaterial, provider, verify_chain};
use super::{TlsError, verify_peer_is};

/// Prefixed to every state signed.
pub const DOMAIN: &[u8] = b"peerlb gossip state v1\0";

/// The signature schemes a state may be signed with (TLS 1.3's), in the
/// signer's order of preference.
pub const SCHEMES: [SignatureScheme; 6] = [
    SignatureScheme::ED25519,
    SignatureScheme::ECDSA_NISTP256_SHA256,
    SignatureScheme::ECDSA_NISTP384_SHA384,
    SignatureScheme::RSA_PSS_SHA256,
    SignatureScheme::RSA_PSS_SHA384,
    SignatureScheme::RSA_PSS_SHA512,
];

pub use crate::adapters::cluster::signed::StateSignature;
use crate::adapters::cluster::signed::{CheckState, SignState, Signatures};
use crate::config::StateSignatures;

/// Why a state signature was not made or not accepted.
#[derive(Debug, thiserror::Error)]
pub enum StateSignError {
    /// The node's key supports none of [`SCHEMES`].
    #[error("the node key supports no TLS 1.3 signature scheme")]
    NoScheme,
    /// The key provider refused the key, or signing failed.
    #[error("signing: {0}")]
    Sign(rustls::Error),
    /// The certificate does not chain to the cluster CA, is not valid now,
    /// or lacks client or server usage.
    #[error("certificate not trusted: {0}")]
    Untrusted(rustls::Error),
    /// The certificate is not the node's the state is about.
    #[error(transparent)]
    NotTheNode(TlsError),
    /// The scheme is not one of [`SCHEMES`].
    #[error("signature scheme {0:#06x} not accepted")]
    Scheme(u16),
    /// The signature is not the certificate key's over this state.
    #[error("bad signature")]
    BadSignature,
}

/// Signs this node's gossip state with its certificate's key.
#[derive(Debug)]
pub struct StateSigner {
    signer: Box<dyn Signer>,
    cert: CertificateDer<'static>,
}

/// How long a certificate's chain check is remembered: a member's next
/// changes within it are checked for their signature only (one ECDSA
/// verification instead of two, `benches/signatures.rs`). A certificate
/// that expires is refused at most this long after.
pub(crate) const CHAIN_RECHECK: std::time::Duration = std::time::Duration::from_secs(60);

/// Checks members' state signatures against the cluster CA.
pub struct StateVerifier {
    roots: Arc<rustls::RootCertStore>,
    time: Arc<dyn TimeProvider>,
    provider: CryptoProvider,
    /// Per node id, the certificate whose chain and name last passed, and
    /// when (seconds of the material's clock). Entered only after a check
    /// passed, so it holds at most one entry per certificate the cluster
    /// CA issued.
    chains: std::sync::Mutex<std::collections::BTreeMap<String, (CertificateDer<'static>, u64)>>,
}

impl std::fmt::Debug for StateVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateVerifier")
            .field("roots", &self.roots.len())
            .finish()
    }
}

impl TlsMaterial {
    /// A signer with this node's key; [`StateSigner::certificate`] is its
    /// end-entity certificate, which verifiers check the signature against.
    ///
    /// # Errors
    /// [`StateSignError::Sign`] when the key provider refuses the key,
    /// [`StateSignError::NoScheme`] when it supports none of [`SCHEMES`].
    pub fn state_signer(&self) -> Result<StateSigner, StateSignError> {
        let key = provider()
            .key_provider
            .load_private_key(self.key.clone_key())
            .map_err(StateSignError::Sign)?;
        let signer = key
            .choose_scheme(&SCHEMES)
            .ok_or(StateSignError::NoScheme)?;
        let cert = self
            .chain
            .first()
            .cloned()
            .ok_or(StateSignError::Untrusted(
                rustls::Error::NoCertificatesPresented,
            ))?;
        Ok(StateSigner { signer, cert })
    }

    /// A verifier trusting this node's cluster CA, at this material's clock.
    pub fn state_verifier(&self) -> StateVerifier {
        StateVerifier {
            roots: self.roots.clone(),
            time: self.time.clone(),
            provider: provider(),
            chains: Default::default(),
        }
    }
}

impl StateSigner {
    /// Signs `DOMAIN || state`.
    ///
    /// # Errors
    /// [`StateSignError::Sign`] when the key fails to sign.
    pub fn sign(&self, state: &[u8]) -> Result<StateSignature, StateSignError> {
        let mut msg = Vec::with_capacity(DOMAIN.len() + state.len());
        msg.extend_from_slice(DOMAIN);
        msg.extend_from_slice(state);
        let bytes = self.signer.sign(&msg).map_err(StateSignError::Sign)?;
        Ok(StateSignature {
            scheme: u16::from(self.signer.scheme()),
            bytes,
        })
    }

    /// This node's end-entity certificate (DER).
    pub fn certificate(&self) -> &CertificateDer<'static> {
        &self.cert
    }
}

impl StateVerifier {
    /// Checks that `cert` chains to the cluster CA now and names node
    /// `node_id`, and that `sig` is its key's signature over
    /// `DOMAIN || state`. The chain and name check of a certificate is
    /// remembered for `CHAIN_RECHECK` (60 s) per node id.
    ///
    /// # Errors
    /// [`StateSignError::Untrusted`], [`StateSignError::NotTheNode`],
    /// [`StateSignError::Scheme`] or [`StateSignError::BadSignature`].
    pub fn verify(
        &self,
        node_id: &str,
        cert: &CertificateDer<'static>,
        state: &[u8],
        sig: &StateSignature,
    ) -> Result<(), StateSignError> {
        let now = self.time.current_time().ok_or(StateSignError::Untrusted(
            rustls::Error::FailedToGetCurrentTime,
        ))?;
        let remembered = self
            .chains
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(node_id)
            .is_some_and(|(c, at)| {
                c == cert && now.as_secs().saturating_sub(*at) < CHAIN_RECHECK.as_secs()
            });
        if !remembered {
            let chain = std::slice::from_ref(cert);
            verify_chain(&self.roots, chain, &self.provider, now)
                .map_err(StateSignError::Untrusted)?;
            verify_peer_is(chain, node_id).map_err(StateSignError::NotTheNode)?;
        }
        let scheme = SignatureScheme::from(sig.scheme);
        if !SCHEMES.contains(&scheme) {
            return Err(StateSignError::Scheme(sig.scheme));
        }
        let algs = self
            .provider
            .signature_verification_algorithms
            .mapping
            .iter()
            .find(|(s, _)| *s == scheme)
            .map(|(_, algs)| *algs)
            .ok_or(StateSignError::Scheme(sig.scheme))?;
        let ee = webpki::EndEntityCert::try_from(cert)
            .map_err(|error| StateSignError::NotTheNode(TlsError::BadPeerCertificate { error }))?;
        let mut msg = Vec::with_capacity(DOMAIN.len() + state.len());
        msg.extend_from_slice(DOMAIN);
        msg.extend_from_slice(state);
        if algs
            .iter()
            .any(|alg| ee.verify_signature(*alg, &msg, &sig.bytes).is_ok())
        {
            if !remembered {
                self.chains
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(node_id.to_owned(), (cert.clone(), now.as_secs()));
            }
            Ok(())
        } else {
            Err(StateSignError::BadSignature)
        }
    }
}

impl SignState for StateSigner {
    fn sign(&self, state: &[u8]) -> Result<StateSignature, String> {
        StateSigner::sign(self, state).map_err(|e| e.to_string())
    }

    fn certificate(&self) -> &[u8] {
        StateSigner::certificate(self).as_ref()
    }
}

impl CheckState for StateVerifier {
    fn verify(
        &self,
        node_id: &str,
        cert: &[u8],
        state: &[u8],
        sig: &StateSignature,
    ) -> Result<(), String> {
        let cert = CertificateDer::from(cert.to_vec());
        StateVerifier::verify(self, node_id, &cert, state, sig).map_err(|e| e.to_string())
    }
}

/// The gossip layer's [`Signatures`] for `mode` with this node's TLS
/// material; `None` when `mode` is off.
///
/// # Errors
/// [`TlsError::StateSign`] when the node key cannot sign.
pub(crate) fn state_signatures(
    mode: StateSignatures,
    material: &TlsMaterial,
) -> Result<Option<Signatures>, TlsError> {
    if mode == StateSignatures::Off {
        return Ok(None);
    }
    let signer = material
        .state_signer()
        .map_err(|error| TlsError::StateSign {
            error: Box::new(error),
        })?;
    Ok(Some(Signatures::new(
        Box::new(signer),
        Box::new(material.state_verifier()),
        mode == StateSignatures::Require,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::transport::tls::generate;

    /// A fresh directory under the system temp dir (removed first).
    fn dir(tag: &str) -> std::path::PathBuf {
        let d =
            std::env::temp_dir().join(format!("peerlb-state-sign-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn material(certs: &crate::adapters::transport::tls::GeneratedCerts, id: &str) -> TlsMaterial {
        let (_, cert, key) = certs.nodes.iter().find(|(n, _, _)| n == id).unwrap();
        TlsMaterial::load(&certs.ca_cert, cert, key).unwrap()
    }

    #[test]
    fn a_nodes_signature_verifies_for_it_and_nothing_else_does() {
        let d = dir("own");
        let certs = generate(&d, "c1", &["n1", "n2"]).unwrap();
        let (m1, m2) = (material(&certs, "n1"), material(&certs, "n2"));
        let verifier = m1.state_verifier();
        let n2 = m2.state_signer().unwrap();
        let state = b"n2\x001\x00status\x00serving\x007";
        let sig = n2.sign(state).unwrap();
        assert_eq!(
            sig.scheme,
            u16::from(SignatureScheme::ECDSA_NISTP256_SHA256)
        );
        verifier
            .verify("n2", n2.certificate(), state, &sig)
            .unwrap();
        // A changed byte of the state (a forged value).
        let forged = b"n2\x001\x00status\x00leaving\x007";
        assert!(matches!(
            verifier.verify("n2", n2.certificate(), forged, &sig),
            Err(StateSignError::BadSignature)
        ));
        // n1 (a key holder and a member, without n2's key) signing n2's
        // state: with its own certificate it is not n2; with n2's, the
        // signature is not n2's key's.
        let n1 = m1.state_signer().unwrap();
        let by_n1 = n1.sign(forged).unwrap();
        assert!(matches!(
            verifier.verify("n2", n1.certificate(), forged, &by_n1),
            Err(StateSignError::NotTheNode(_))
        ));
        assert!(matches!(
            verifier.verify("n2", n2.certificate(), forged, &by_n1),
            Err(StateSignError::BadSignature)
        ));
        // A scheme outside the list.
        let rsa15 = StateSignature {
            scheme: u16::from(SignatureScheme::RSA_PKCS1_SHA256),
            bytes: sig.bytes.clone(),
        };
        assert!(matches!(
            verifier.verify("n2", n2.certificate(), state, &rsa15),
            Err(StateSignError::Scheme(_))
        ));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_certificate_from_another_ca_cannot_sign_for_a_member() {
        let (d, f) = (dir("ca1"), dir("ca2"));
        let certs = generate(&d, "c1", &["n1", "n2"]).unwrap();
        let foreign = generate(&f, "c2", &["n2"]).unwrap();
        let verifier = material(&certs, "n1").state_verifier();
        // Another CA's "n2": a valid certificate for the name, under a CA
        // this cluster does not trust.
        let impostor = material(&foreign, "n2").state_signer().unwrap();
        let state = b"n2\x001\x00status\x00leaving\x009";
        let sig = impostor.sign(state).unwrap();
        assert!(matches!(
            verifier.verify("n2", impostor.certificate(), state, &sig),
            Err(StateSignError::Untrusted(_))
        ));
        // Still refused once the real n2's chain check is remembered: the
        // memory is of that certificate only.
        let n2 = material(&certs, "n2").state_signer().unwrap();
        verifier
            .verify("n2", n2.certificate(), state, &n2.sign(state).unwrap())
            .unwrap();
        assert!(matches!(
            verifier.verify("n2", impostor.certificate(), state, &sig),
            Err(StateSignError::Untrusted(_))
        ));
        // And n2's remembered certificate does not vouch for n1.
        assert!(matches!(
            verifier.verify("n1", n2.certificate(), state, &n2.sign(state).unwrap()),
            Err(StateSignError::NotTheNode(_))
        ));
        let _ = (std::fs::remove_dir_all(&d), std::fs::remove_dir_all(&f));
    }

    /// A remembered chain check is taken again only within
    /// [`CHAIN_RECHECK`] of the material's clock: past it, the chain is
    /// checked again (a certificate expired since is refused).
    #[test]
    fn a_chain_check_is_remembered_for_chain_recheck_only() {
        let d = dir("recheck");
        let certs = generate(&d, "c1", &["n1", "n2"]).unwrap();
        let verifier = material(&certs, "n1").state_verifier();
        let n2 = material(&certs, "n2").state_signer().unwrap();
        let state = b"n2\x001\x00status\x00serving\x007";
        let sig = n2.sign(state).unwrap();
        verifier
            .verify("n2", n2.certificate(), state, &sig)
            .unwrap();
        let at = |v: &StateVerifier| v.chains.lock().unwrap().get("n2").map(|(_, at)| *at);
        let first = at(&verifier).expect("remembered after a pass");
        // Age the memory past CHAIN_RECHECK: the next check is a full one
        // and remembers the new time.
        verifier.chains.lock().unwrap().get_mut("n2").unwrap().1 =
            first - CHAIN_RECHECK.as_secs() - 1;
        verifier
            .verify("n2", n2.certificate(), state, &sig)
            .unwrap();
        assert!(
            at(&verifier).unwrap() >= first,
            "the chain was not checked again"
        );
        // A bad signature is refused with the chain remembered.
        let mut bad = sig.clone();
        bad.bytes[10] ^= 1;
        assert!(matches!(
            verifier.verify("n2", n2.certificate(), state, &bad),
            Err(StateSignError::BadSignature)
        ));
        let _ = std::fs::remove_dir_all(&d);
    }
}
