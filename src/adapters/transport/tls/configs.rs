//! A node's TLS material ([`TlsMaterial`]: the cluster CA, its certificate
//! chain and key, loaded from PEM and checked) and the rustls/quinn client
//! and server configurations both ends of a peer connection use: TLS 1.3
//! only, the `ring` provider named explicitly, ALPN [`ALPN`], [`ALPN_V2`] then [`ALPN_V1`].

use std::fmt;
use std::fs;
use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::time_provider::TimeProvider;
use rustls_pki_types::pem::{self, PemObject as _};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

use super::identity::{node_server_name, peer_node_id};
#[cfg(doc)]
use super::verify_peer_is;
use super::{ALPN, ALPN_V1, ALPN_V2, TlsError};

/// A node's TLS identity and trust root, loaded and checked by
/// [`TlsMaterial::load`]: the cluster CA certificate(s), this node's
/// certificate chain and its private key.
pub struct TlsMaterial {
    pub(super) roots: Arc<RootCertStore>,
    pub(super) chain: Vec<CertificateDer<'static>>,
    pub(super) key: PrivateKeyDer<'static>,
    /// The clock certificate validity is checked against (the system clock
    /// unless [`TlsMaterial::with_time_provider`] set another).
    pub(super) time: Arc<dyn TimeProvider>,
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("roots", &self.roots.len())
            .field("chain", &self.chain.len())
            .field("key", &"<redacted>")
            .finish()
    }
}

impl TlsMaterial {
    /// Loads PEM files: `ca` (one or more CA certificates, all trusted; more
    /// than one only while rotating the CA), `cert` (this node's certificate,
    /// optionally followed by intermediates) and `key` (its private key,
    /// PKCS#8, PKCS#1 or SEC1).
    ///
    /// Also checks that the key belongs to the certificate and that the
    /// certificate chains to the CA, is currently valid and allows both
    /// client and server authentication, so a misconfigured node fails at
    /// start-up rather than at its first peer handshake. Reads the system
    /// clock.
    ///
    /// # Errors
    ///
    /// Every error names the file: [`TlsError::Read`], [`TlsError::Pem`],
    /// [`TlsError::NoCertificate`], [`TlsError::NoPrivateKey`],
    /// [`TlsError::BadCaCertificate`], [`TlsError::KeyMismatch`],
    /// [`TlsError::Untrusted`].
    pub fn load(ca: &Path, cert: &Path, key: &Path) -> Result<TlsMaterial, TlsError> {
        let ca_certs = read_certs(ca)?;
        let chain = read_certs(cert)?;
        let private = read_key(key)?;
        Self::from_parts(
            (ca, ca_certs),
            (cert, chain),
            (key, private),
            Arc::new(rustls::time_provider::DefaultTimeProvider),
        )
    }

    /// Like [`TlsMaterial::load`], from PEM text held in memory (a
    /// simulation's generated certificates), checked at the time `time`
    /// gives, which then also checks peer certificates. Errors name the
    /// files as `<ca>`, `<cert>` and `<key>`.
    ///
    /// # Errors
    ///
    /// As [`TlsMaterial::load`], except [`TlsError::Read`].
    pub fn from_pem(
        ca: &[u8],
        cert: &[u8],
        key: &[u8],
        time: Arc<dyn TimeProvider>,
    ) -> Result<TlsMaterial, TlsError> {
        let (ca_path, cert_path, key_path) =
            (Path::new("<ca>"), Path::new("<cert>"), Path::new("<key>"));
        let ca_certs = parse_certs(ca_path, ca)?;
        let chain = parse_certs(cert_path, cert)?;
        let private = parse_key(key_path, key)?;
        Self::from_parts(
            (ca_path, ca_certs),
            (cert_path, chain),
            (key_path, private),
            time,
        )
    }

    /// Replaces the clock peer certificates are checked against.
    #[must_use]
    pub fn with_time_provider(mut self, time: Arc<dyn TimeProvider>) -> TlsMaterial {
        self.time = time;
        self
    }

    fn from_parts(
        (ca, ca_certs): (&Path, Vec<CertificateDer<'static>>),
        (cert, chain): (&Path, Vec<CertificateDer<'static>>),
        (key, private): (&Path, PrivateKeyDer<'static>),
        time: Arc<dyn TimeProvider>,
    ) -> Result<TlsMaterial, TlsError> {
        let mut roots = RootCertStore::empty();
        for der in ca_certs {
            roots.add(der).map_err(|error| TlsError::BadCaCertificate {
                path: ca.to_owned(),
                error,
            })?;
        }
        let roots = Arc::new(roots);
        let provider = provider();
        rustls::sign::CertifiedKey::from_der(chain.clone(), private.clone_key(), &provider)
            .map_err(|error| TlsError::KeyMismatch {
                key: key.to_owned(),
                cert: cert.to_owned(),
                error,
            })?;
        // The same certificate serves both ends of peer connections.
        let now = time.current_time().ok_or_else(|| TlsError::Untrusted {
            cert: cert.to_owned(),
            ca: ca.to_owned(),
            error: rustls::Error::FailedToGetCurrentTime,
        })?;
        verify_chain(&roots, &chain, &provider, now).map_err(|error| TlsError::Untrusted {
            cert: cert.to_owned(),
            ca: ca.to_owned(),
            error,
        })?;
        Ok(TlsMaterial {
            roots,
            chain,
            key: private,
            time,
        })
    }

    /// This node's certificate chain, end-entity first. Pass it to
    /// [`verify_peer_is`] with the configured node id to check at start-up
    /// that the files belong to this node.
    pub fn cert_chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }
}

/// The rustls server configuration of a node's peer endpoint: TLS 1.3 only,
/// `ring` provider, ALPN [`ALPN`], [`ALPN_V2`] then [`ALPN_V1`], presents this node's certificate and
/// requires a client certificate chaining to the cluster CA. Which node the
/// client is remains to be checked with [`verify_peer_is`].
///
/// # Errors
///
/// [`TlsError::Verifier`] or [`TlsError::Config`] (neither expected for
/// material [`TlsMaterial::load`] accepted).
pub fn server_config(m: &TlsMaterial) -> Result<rustls::ServerConfig, TlsError> {
    let provider = Arc::new(provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(m.roots.clone(), provider.clone())
        .build()
        .map_err(|error| TlsError::Verifier { error })?;
    let mut config = rustls::ServerConfig::builder_with_details(provider, m.time.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|error| TlsError::Config { error })?
        .with_client_cert_verifier(verifier)
        .with_single_cert(m.chain.clone(), m.key.clone_key())
        .map_err(|error| TlsError::Config { error })?;
    config.alpn_protocols = vec![ALPN.to_vec(), ALPN_V2.to_vec(), ALPN_V1.to_vec()];
    Ok(config)
}

/// [`server_config`] wrapped for `quinn::Endpoint::server`.
///
/// # Errors
///
/// As [`server_config`], and [`TlsError::Quic`].
pub fn quinn_server_config(m: &TlsMaterial) -> Result<quinn::ServerConfig, TlsError> {
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(server_config(m)?)
        .map_err(|error| TlsError::Quic { error })?;
    Ok(quinn::ServerConfig::with_crypto(Arc::new(crypto)))
}

/// The rustls client configuration for dialing peers: TLS 1.3 only, `ring`
/// provider, ALPN [`ALPN`], [`ALPN_V2`] then [`ALPN_V1`], trusts the cluster CA only and presents this
/// node's certificate. Dial with `node_server_name(owner_id)` as the server
/// name so only that member's certificate is accepted.
///
/// # Errors
///
/// [`TlsError::Verifier`] or [`TlsError::Config`] (neither expected for
/// material [`TlsMaterial::load`] accepted).
pub fn client_config(m: &TlsMaterial) -> Result<rustls::ClientConfig, TlsError> {
    let provider = Arc::new(provider());
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        m.roots.clone(),
        provider.clone(),
    )
    .build()
    .map_err(|error| TlsError::Verifier { error })?;
    let mut config = rustls::ClientConfig::builder_with_details(provider, m.time.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|error| TlsError::Config { error })?
        .with_webpki_verifier(verifier)
        .with_client_auth_cert(m.chain.clone(), m.key.clone_key())
        .map_err(|error| TlsError::Config { error })?;
    config.alpn_protocols = vec![ALPN.to_vec(), ALPN_V2.to_vec(), ALPN_V1.to_vec()];
    Ok(config)
}

/// [`client_config`] wrapped for `quinn::Endpoint::set_default_client_config`
/// or `connect_with`.
///
/// # Errors
///
/// As [`client_config`], and [`TlsError::Quic`].
pub fn quinn_client_config(m: &TlsMaterial) -> Result<quinn::ClientConfig, TlsError> {
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(client_config(m)?)
        .map_err(|error| TlsError::Quic { error })?;
    Ok(quinn::ClientConfig::new(Arc::new(crypto)))
}

/// The crypto provider of every configuration here.
pub(super) fn provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// Verifies `chain` (end-entity first) against `roots` as a client
/// certificate (chain, validity now, clientAuth usage) and checks the
/// end-entity certificate has serverAuth usage too by verifying it for its own
/// server name when it names a node.
pub(super) fn verify_chain(
    roots: &Arc<RootCertStore>,
    chain: &[CertificateDer<'static>],
    provider: &CryptoProvider,
    now: UnixTime,
) -> Result<(), rustls::Error> {
    let (end_entity, intermediates) = chain
        .split_first()
        .ok_or(rustls::Error::NoCertificatesPresented)?;
    let provider = Arc::new(provider.clone());
    let client = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
        .build()
        .map_err(|e| rustls::Error::General(e.to_string()))?;
    client.verify_client_cert(end_entity, intermediates, now)?;
    if let Some(id) = peer_node_id(chain) {
        let server =
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots.clone(), provider)
                .build()
                .map_err(|e| rustls::Error::General(e.to_string()))?;
        let name = ServerName::try_from(node_server_name(&id))
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        rustls::client::danger::ServerCertVerifier::verify_server_cert(
            server.as_ref(),
            end_entity,
            intermediates,
            &name,
            &[],
            now,
        )?;
    }
    Ok(())
}

/// The bytes of `path`.
pub(super) fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    fs::read(path).map_err(|error| TlsError::Read {
        path: path.to_owned(),
        error,
    })
}

/// All certificates in a PEM file, in order; at least one.
pub(super) fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    parse_certs(path, &read_file(path)?)
}

/// All certificates in PEM text (from `path`), in order; at least one.
pub(super) fn parse_certs(
    path: &Path,
    bytes: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| TlsError::Pem {
            path: path.to_owned(),
            error,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// The first private key in a PEM file.
pub(super) fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    parse_key(path, &read_file(path)?)
}

/// The first private key in PEM text (from `path`).
pub(super) fn parse_key(path: &Path, bytes: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(bytes).map_err(|error| match error {
        pem::Error::NoItemsFound => TlsError::NoPrivateKey {
            path: path.to_owned(),
        },
        error => TlsError::Pem {
            path: path.to_owned(),
            error,
        },
    })
}
