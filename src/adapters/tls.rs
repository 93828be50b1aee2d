//! Mutual TLS for the peer wire: certificate generation, loading, and the
//! rustls/quinn configurations both ends of a peer connection use.
//!
//! # Trust model
//!
//! - One cluster CA (`ca.pem`, `ca.key`) signs every node certificate. It is
//!   the only root either side trusts: no system roots, no other CA. The CA
//!   is created with a name constraint that limits it to `*.node.peerlb`
//!   names, so a `ca.pem` that leaks into some other trust store cannot vouch
//!   for anything else.
//! - A node's identity is the DNS subject alternative name
//!   `<node_id>.node.peerlb` ([`node_server_name`]) in its certificate. The
//!   common name is set to the id for humans only; nothing checks it.
//! - A client (the entry node) dials a peer with the server name of the member
//!   it means to reach, so a peer presenting another node's certificate fails
//!   the handshake ([`client_config`]).
//! - A server (the owner) requires a client certificate chaining to the
//!   cluster CA ([`server_config`]), then checks that it is valid for the node
//!   id the client claims in its request frame ([`verify_peer_is`]). A peer
//!   whose certificate does not match the member it claims to be is refused.
//! - Node ids are DNS labels inside that name, and DNS names compare without
//!   regard to ASCII case: `N1` and `n1` are the same identity to TLS.
//!
//! Only TLS 1.3 is offered (QUIC requires it), with the `ring` provider named
//! explicitly, and ALPN [`ALPN`].

use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    GeneralSubtree, IsCa, KeyPair, KeyUsagePurpose, NameConstraints,
};
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::time_provider::TimeProvider;
use rustls_pki_types::pem::{self, PemObject as _};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

/// The ALPN protocol id of the peer wire, offered and required by both ends.
pub const ALPN: &[u8] = b"peerlb/1";

/// Suffix appended to a node id to form its certificate's DNS name.
const NAME_SUFFIX: &str = ".node.peerlb";
/// The name constraint put on the cluster CA (covers every `*.node.peerlb`).
const NAME_CONSTRAINT: &str = "node.peerlb";
/// Longest node id, in bytes (one DNS label).
const MAX_NODE_ID_LEN: usize = 63;
/// File stem of the cluster CA in a certificate directory.
const CA_STEM: &str = "ca";
/// Validity of a generated CA certificate, in years from generation.
const CA_YEARS: i32 = 20;
/// Validity of a generated node certificate, in years from generation.
const NODE_YEARS: i32 = 10;

/// Errors of certificate generation, loading, config building and peer
/// identity checks. Messages name the file involved and include the cause.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A node id is not 1..=63 ASCII letters, digits, `-`, `_`, `.` forming
    /// valid DNS labels, or is the reserved `ca`. Rename the node in
    /// `cluster.toml`.
    #[error("invalid node id {id:?}: {reason}")]
    InvalidNodeId {
        /// The rejected id.
        id: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// The same node id (ignoring ASCII case) was given twice. Give every node
    /// a distinct id.
    #[error("node id {id:?} is given twice (ids are compared ignoring ASCII case)")]
    DuplicateNodeId {
        /// The repeated id.
        id: String,
    },
    /// The certificate directory could not be created. Check the parent
    /// directory exists and is writable, or pick another directory.
    #[error("creating directory {}: {error}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// A PEM file could not be read. Check the path in the config and the
    /// file's permissions; `peerlb certs` creates missing files.
    #[error("reading {}: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// A generated file could not be written (files are never overwritten, so
    /// this includes one appearing concurrently). Check permissions and space.
    #[error("writing {}: {error}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// A file is not well-formed PEM. Replace it with the PEM file
    /// `peerlb certs` wrote.
    #[error("{}: malformed PEM: {error}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        error: pem::Error,
    },
    /// A certificate file holds no `CERTIFICATE` block. Point the config at
    /// the `.pem` file, not the `.key` file.
    #[error("{}: no certificate found", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// A key file holds no private key block. Point the config at the `.key`
    /// file, not the `.pem` file.
    #[error("{}: no private key found", path.display())]
    NoPrivateKey {
        /// The file.
        path: PathBuf,
    },
    /// One file of a pair (certificate and key) exists without the other.
    /// Restore the missing file, or remove the remaining one to regenerate
    /// both (for the CA this invalidates every node certificate).
    #[error("{} exists but {} does not; restore it or remove both to regenerate", present.display(), missing.display())]
    IncompletePair {
        /// The file that exists.
        present: PathBuf,
        /// The file that is missing.
        missing: PathBuf,
    },
    /// rcgen could not create or load a key or certificate. The message says
    /// which; a key file rcgen cannot parse must be a PKCS#8 PEM key.
    #[error("{what}: {error}")]
    Generate {
        /// What was being created or loaded.
        what: String,
        /// The rcgen error.
        error: rcgen::Error,
    },
    /// The existing CA in the directory cannot issue certificates that chain
    /// to it: it was created for another cluster name, `ca.key` does not
    /// belong to `ca.pem`, or it has expired (the message says which). Use the
    /// original cluster name, or a new directory (a new CA for every node).
    #[error("{}: the existing CA does not match {cluster:?} or its key: {error}", path.display())]
    CaMismatch {
        /// The CA certificate file.
        path: PathBuf,
        /// The cluster name the new certificates were made for.
        cluster: String,
        /// Why the new certificate did not verify.
        error: rustls::Error,
    },
    /// A certificate in the CA file is not a usable trust anchor. Use the
    /// `ca.pem` `peerlb certs` wrote.
    #[error("{}: not a usable CA certificate: {error}", path.display())]
    BadCaCertificate {
        /// The CA file.
        path: PathBuf,
        /// Why rustls refused it.
        error: rustls::Error,
    },
    /// The private key does not belong to the certificate (or is not a key
    /// rustls supports). Use the `.key` written with that `.pem`.
    #[error("{} does not fit {}: {error}", key.display(), cert.display())]
    KeyMismatch {
        /// The key file.
        key: PathBuf,
        /// The certificate file.
        cert: PathBuf,
        /// The rustls error.
        error: rustls::Error,
    },
    /// The node certificate does not chain to the configured CA, is expired or
    /// not yet valid, or lacks client/server authentication usage. Regenerate
    /// it with the cluster CA (`peerlb certs`), or fix the CA path.
    #[error("{} is not trusted by {}: {error}", cert.display(), ca.display())]
    Untrusted {
        /// The node certificate file.
        cert: PathBuf,
        /// The CA file.
        ca: PathBuf,
        /// Why verification failed.
        error: rustls::Error,
    },
    /// rustls refused to build a configuration. This indicates a bug or an
    /// incompatible rustls build; report it.
    #[error("building the TLS configuration: {error}")]
    Config {
        /// The rustls error.
        error: rustls::Error,
    },
    /// The certificate verifier could not be built from the CA. Check the CA
    /// file.
    #[error("building the certificate verifier: {error}")]
    Verifier {
        /// The rustls error.
        error: rustls::server::VerifierBuilderError,
    },
    /// quinn refused the rustls configuration (no TLS 1.3 suite QUIC can use).
    /// This indicates a bug or an incompatible build; report it.
    #[error("building the QUIC crypto configuration: {error}")]
    Quic {
        /// The quinn error.
        error: quinn::crypto::rustls::NoInitialCipherSuite,
    },
    /// The peer presented no certificate. Cannot happen after a handshake
    /// with [`server_config`]; refuse the peer.
    #[error("peer presented no certificate")]
    NoPeerCertificate,
    /// The peer's end-entity certificate could not be parsed. Refuse the peer.
    #[error("peer certificate is malformed: {error}")]
    BadPeerCertificate {
        /// The webpki error.
        error: webpki::Error,
    },
    /// The peer's certificate is not valid for the node id it claims: it is
    /// another member (or an impostor). Refuse the request; check the peer's
    /// `node_id` and certificate files.
    #[error("peer certificate is not valid for node {claimed:?} ({name})")]
    PeerIdentityMismatch {
        /// The node id the peer claimed.
        claimed: String,
        /// The DNS name its certificate should have carried.
        name: String,
    },
}

/// Checks that `id` can be a node id.
///
/// A node id is 1..=63 ASCII letters, digits, `-`, `_` and `.`; it does not
/// start or end with `.` or `-`, has no empty `.`-separated part, and no part
/// starts or ends with `-` (each part is a DNS label of
/// [`node_server_name`]). `ca` (any case) is reserved for the CA files.
///
/// TLS compares names ignoring ASCII case, so configuration must also reject
/// two ids that differ only in case ([`generate`] does).
///
/// # Errors
///
/// [`TlsError::InvalidNodeId`] naming the broken rule.
pub fn validate_node_id(id: &str) -> Result<(), TlsError> {
    let fail = |reason| {
        Err(TlsError::InvalidNodeId {
            id: id.to_owned(),
            reason,
        })
    };
    if id.is_empty() {
        return fail("empty");
    }
    if id.len() > MAX_NODE_ID_LEN {
        return fail("longer than 63 characters");
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return fail("only ASCII letters, digits, '-', '_' and '.' are allowed");
    }
    if id.starts_with(['.', '-']) || id.ends_with(['.', '-']) {
        return fail("must not start or end with '.' or '-'");
    }
    for label in id.split('.') {
        if label.is_empty() {
            return fail("must not contain '..'");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return fail("a '-' must not be next to a '.'");
        }
    }
    if id.eq_ignore_ascii_case(CA_STEM) {
        return fail("'ca' is reserved for the cluster CA files");
    }
    // Belt and braces: the rules above are meant to imply this.
    if ServerName::try_from(node_server_name(id)).is_err() {
        return fail("not a valid DNS name");
    }
    Ok(())
}

/// The DNS name a node's certificate carries and that peers dial it with:
/// `<id>.node.peerlb`.
pub fn node_server_name(id: &str) -> String {
    format!("{id}{NAME_SUFFIX}")
}

/// The files [`generate`] and [`ensure_local`] leave in a certificate
/// directory. Paths are `dir` joined with the file name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedCerts {
    /// `ca.pem`: the cluster CA certificate (every node's trust root).
    pub ca_cert: PathBuf,
    /// `ca.key`: the CA private key (mode 0600; needed only to issue).
    pub ca_key: PathBuf,
    /// `(node id, <id>.pem, <id>.key)` for every requested node, in the order
    /// given.
    pub nodes: Vec<(String, PathBuf, PathBuf)>,
    /// The files this call created, in creation order; files that already
    /// existed were kept untouched and are not listed.
    pub created: Vec<PathBuf>,
}

/// Creates a cluster CA and node certificates in `dir`, keeping whatever
/// already exists.
///
/// `dir` is created (mode 0700) if missing. Files: `ca.pem`, `ca.key`,
/// `<id>.pem`, `<id>.key` (keys mode 0600), ECDSA P-256 keys in PKCS#8 PEM.
/// The CA is "peerlb `<cluster_name>` CA", valid 20 years, constrained to
/// issue `*.node.peerlb` names. A node certificate has CN `<id>`, DNS SAN
/// [`node_server_name`], server and client authentication usage, and is valid
/// 10 years from the day before generation.
///
/// If `ca.pem` and `ca.key` exist they are reused (the new node certificates
/// are verified against `ca.pem` before they are written). Existing node
/// files are never overwritten. Reads the system clock for validity dates.
///
/// # Errors
///
/// An invalid or duplicate node id (checked before anything is written);
/// I/O errors naming the path; [`TlsError::IncompletePair`] when only one of a
/// certificate/key pair exists; [`TlsError::CaMismatch`] when the existing CA
/// was made for another cluster name or its key does not match.
pub fn generate(
    dir: &Path,
    cluster_name: &str,
    node_ids: &[&str],
) -> Result<GeneratedCerts, TlsError> {
    let mut seen = BTreeSet::new();
    for id in node_ids {
        validate_node_id(id)?;
        if !seen.insert(id.to_ascii_lowercase()) {
            return Err(TlsError::DuplicateNodeId {
                id: (*id).to_owned(),
            });
        }
    }
    create_private_dir(dir)?;

    let ca_cert = dir.join(format!("{CA_STEM}.pem"));
    let ca_key = dir.join(format!("{CA_STEM}.key"));
    let mut out = GeneratedCerts {
        ca_cert,
        ca_key,
        nodes: Vec::with_capacity(node_ids.len()),
        created: Vec::new(),
    };
    let mut ca: Option<Ca> = None;
    if !pair_exists(&out.ca_cert, &out.ca_key)? {
        let key = new_key("generating the CA key")?;
        let cert =
            ca_params(cluster_name)
                .self_signed(&key)
                .map_err(|error| TlsError::Generate {
                    what: "signing the CA certificate".to_owned(),
                    error,
                })?;
        write_new(&out.ca_key, key.serialize_pem().as_bytes(), 0o600)?;
        out.created.push(out.ca_key.clone());
        write_new(&out.ca_cert, cert.pem().as_bytes(), 0o644)?;
        out.created.push(out.ca_cert.clone());
        ca = Some(Ca {
            key,
            cert,
            anchor: None,
        });
    }

    // The gossip keyring lives beside the CA (created once, mode 0600).
    let keyring = dir.join(crate::adapters::gossip::keyring::FILE_NAME);
    match crate::adapters::gossip::keyring::create_file(&keyring) {
        Ok(true) => out.created.push(keyring),
        Ok(false) => {}
        Err(e) => {
            return Err(TlsError::Write {
                path: keyring,
                error: std::io::Error::other(e.to_string()),
            });
        }
    }

    for id in node_ids {
        let cert_path = dir.join(format!("{id}.pem"));
        let key_path = dir.join(format!("{id}.key"));
        if !pair_exists(&cert_path, &key_path)? {
            let ca = match &mut ca {
                Some(ca) => ca,
                None => ca.insert(Ca::load(&out.ca_cert, &out.ca_key, cluster_name)?),
            };
            let (cert_pem, key_pem) = ca.issue(id, cluster_name, &out.ca_cert)?;
            write_new(&key_path, key_pem.as_bytes(), 0o600)?;
            out.created.push(key_path.clone());
            write_new(&cert_path, cert_pem.as_bytes(), 0o644)?;
            out.created.push(cert_path.clone());
            tracing::info!(node_id = %id, cert = %cert_path.display(), "node certificate created");
        }
        out.nodes.push(((*id).to_owned(), cert_path, key_path));
    }
    Ok(out)
}

/// Makes sure `dir` holds the CA and a certificate for each of `node_ids`,
/// creating only what is missing (what `peerlb up` calls before starting a
/// local cluster).
///
/// Same behaviour and errors as [`generate`]; when every file exists nothing
/// is written and the CA key is not read.
///
/// # Errors
///
/// As [`generate`].
pub fn ensure_local(
    dir: &Path,
    cluster_name: &str,
    node_ids: &[&str],
) -> Result<GeneratedCerts, TlsError> {
    generate(dir, cluster_name, node_ids)
}

/// A node's TLS identity and trust root, loaded and checked by
/// [`TlsMaterial::load`]: the cluster CA certificate(s), this node's
/// certificate chain and its private key.
pub struct TlsMaterial {
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    /// The clock certificate validity is checked against (the system clock
    /// unless [`TlsMaterial::with_time_provider`] set another).
    time: Arc<dyn TimeProvider>,
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
/// `ring` provider, ALPN [`ALPN`], presents this node's certificate and
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
    config.alpn_protocols = vec![ALPN.to_vec()];
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
/// provider, ALPN [`ALPN`], trusts the cluster CA only and presents this
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
    config.alpn_protocols = vec![ALPN.to_vec()];
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

/// Checks that a peer's certificate chain (end-entity first, as
/// `quinn::Connection::peer_identity()` yields it, downcast to
/// `Vec<CertificateDer<'static>>`) belongs to node `node_id`: the end-entity
/// certificate must be valid for [`node_server_name`]`(node_id)`.
///
/// Only the name is checked here: the chain to the cluster CA was verified
/// by the handshake ([`server_config`]). Names compare ignoring ASCII case.
///
/// # Errors
///
/// [`TlsError::InvalidNodeId`] if `node_id` is not a valid id,
/// [`TlsError::NoPeerCertificate`], [`TlsError::BadPeerCertificate`], or
/// [`TlsError::PeerIdentityMismatch`] when the certificate is another node's.
pub fn verify_peer_is(certs: &[CertificateDer<'_>], node_id: &str) -> Result<(), TlsError> {
    validate_node_id(node_id)?;
    let name = node_server_name(node_id);
    let server_name = ServerName::try_from(name.as_str()).map_err(|_| TlsError::InvalidNodeId {
        id: node_id.to_owned(),
        reason: "not a valid DNS name",
    })?;
    let end_entity = certs.first().ok_or(TlsError::NoPeerCertificate)?;
    let cert = webpki::EndEntityCert::try_from(end_entity)
        .map_err(|error| TlsError::BadPeerCertificate { error })?;
    cert.verify_is_valid_for_subject_name(&server_name)
        .map_err(|_| TlsError::PeerIdentityMismatch {
            claimed: node_id.to_owned(),
            name,
        })
}

/// The node id a peer certificate names, for logs and metrics: the single
/// `<id>.node.peerlb` DNS name in the end-entity certificate, with the
/// suffix removed, as presented (case preserved).
///
/// Never authorize with this: use [`verify_peer_is`] with the id the peer
/// claims. Returns `None` when the certificate cannot be parsed, names no
/// valid node id, or names more than one.
pub fn peer_node_id(certs: &[CertificateDer<'_>]) -> Option<String> {
    let cert = webpki::EndEntityCert::try_from(certs.first()?).ok()?;
    let mut found: Option<&str> = None;
    for name in cert.valid_dns_names() {
        let Some(cut) = name.len().checked_sub(NAME_SUFFIX.len()) else {
            continue;
        };
        let (id, suffix) = (name.get(..cut)?, name.get(cut..)?);
        if !suffix.eq_ignore_ascii_case(NAME_SUFFIX) || validate_node_id(id).is_err() {
            continue;
        }
        match found {
            Some(prev) if !prev.eq_ignore_ascii_case(id) => return None,
            _ => found = Some(id),
        }
    }
    found.map(str::to_owned)
}

// ---------------------------------------------------------------------------
// internals

/// The crypto provider of every configuration here.
fn provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// Verifies `chain` (end-entity first) against `roots` as a client
/// certificate (chain, validity now, clientAuth usage) and checks the
/// end-entity certificate has serverAuth usage too by verifying it for its own
/// server name when it names a node.
fn verify_chain(
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

/// The CA used to issue node certificates in one [`generate`] call.
struct Ca {
    key: KeyPair,
    /// An rcgen certificate with the CA's subject and key: the one written,
    /// or (for a reused CA) one re-derived from the cluster name, used only
    /// as the issuer of new certificates.
    cert: rcgen::Certificate,
    /// The CA as it is on disk, to verify new certificates against; `None`
    /// when the CA was created in this call.
    anchor: Option<Arc<RootCertStore>>,
}

impl Ca {
    /// Loads an existing CA. rcgen 0.13 can parse a CA certificate only with
    /// its `x509-parser` feature, so the issuer is re-derived from the
    /// cluster name and the key; [`Ca::issue`] then verifies each new
    /// certificate against the CA file, which catches a wrong cluster name
    /// or a key that does not belong to the certificate.
    fn load(cert_path: &Path, key_path: &Path, cluster_name: &str) -> Result<Ca, TlsError> {
        let mut roots = RootCertStore::empty();
        for der in read_certs(cert_path)? {
            roots.add(der).map_err(|error| TlsError::BadCaCertificate {
                path: cert_path.to_owned(),
                error,
            })?;
        }
        let pem = read_file(key_path)?;
        let pem = String::from_utf8(pem).map_err(|_| TlsError::NoPrivateKey {
            path: key_path.to_owned(),
        })?;
        let key = KeyPair::from_pem(&pem).map_err(|error| TlsError::Generate {
            what: format!("loading {}", key_path.display()),
            error,
        })?;
        let cert =
            ca_params(cluster_name)
                .self_signed(&key)
                .map_err(|error| TlsError::Generate {
                    what: format!("re-deriving the CA from {}", key_path.display()),
                    error,
                })?;
        Ok(Ca {
            key,
            cert,
            anchor: Some(Arc::new(roots)),
        })
    }

    /// Issues a certificate for node `id`; returns `(cert PEM, key PEM)`.
    fn issue(
        &self,
        id: &str,
        cluster_name: &str,
        ca_path: &Path,
    ) -> Result<(String, String), TlsError> {
        let generate_err = |what: &str, error| TlsError::Generate {
            what: format!("{what} for node {id}"),
            error,
        };
        let key = new_key(&format!("generating the key for node {id}"))?;
        let mut params = CertificateParams::new(vec![node_server_name(id)])
            .map_err(|e| generate_err("preparing the certificate", e))?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, id);
        params
            .distinguished_name
            .push(DnType::OrganizationName, format!("peerlb {cluster_name}"));
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, NODE_YEARS);
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .map_err(|e| generate_err("signing the certificate", e))?;
        if let Some(anchor) = &self.anchor {
            verify_chain(anchor, &[cert.der().clone()], &provider(), UnixTime::now()).map_err(
                |error| TlsError::CaMismatch {
                    path: ca_path.to_owned(),
                    cluster: cluster_name.to_owned(),
                    error,
                },
            )?;
        }
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// Parameters of the cluster CA. Deterministic in everything an issuer
/// contributes to a certificate it signs (subject, key identifier method),
/// so a reused CA can be re-derived from the cluster name and its key.
fn ca_params(cluster_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("peerlb {cluster_name} CA"));
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.name_constraints = Some(NameConstraints {
        permitted_subtrees: vec![GeneralSubtree::DnsName(NAME_CONSTRAINT.to_owned())],
        excluded_subtrees: Vec::new(),
    });
    set_validity(&mut params, CA_YEARS);
    params
}

/// A new ECDSA P-256 key.
fn new_key(what: &str) -> Result<KeyPair, TlsError> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|error| TlsError::Generate {
        what: what.to_owned(),
        error,
    })
}

/// Sets validity from yesterday (UTC, to absorb clock skew between nodes) to
/// `years` later. Reads the system clock: certificate generation is a CLI
/// step, never on a path the simulation runs.
#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
fn set_validity(params: &mut CertificateParams, years: i32) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0) - 1;
    let (y, m, d) = civil_from_days(days);
    params.not_before = rcgen::date_time_ymd(y, m, d);
    params.not_after = rcgen::date_time_ymd(y + years, m, d.min(28));
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day)
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i32, u8, u8) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // Ranges: month 1..=12, day 1..=31; the year fits i32 for any clock.
    (
        i32::try_from(year).unwrap_or(i32::MAX),
        u8::try_from(month).unwrap_or(1),
        u8::try_from(day).unwrap_or(1),
    )
}

/// Whether both files of a pair exist; an error if only one does.
fn pair_exists(cert: &Path, key: &Path) -> Result<bool, TlsError> {
    let exists = |p: &Path| {
        p.try_exists().map_err(|error| TlsError::Read {
            path: p.to_owned(),
            error,
        })
    };
    match (exists(cert)?, exists(key)?) {
        (true, true) => Ok(true),
        (false, false) => Ok(false),
        (true, false) => Err(TlsError::IncompletePair {
            present: cert.to_owned(),
            missing: key.to_owned(),
        }),
        (false, true) => Err(TlsError::IncompletePair {
            present: key.to_owned(),
            missing: cert.to_owned(),
        }),
    }
}

/// Creates `dir` and missing parents with mode 0700 (an existing directory is
/// left as it is).
fn create_private_dir(dir: &Path) -> Result<(), TlsError> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|error| TlsError::CreateDir {
        path: dir.to_owned(),
        error,
    })
}

/// Writes a new file with `mode` (Unix); fails if it exists.
fn write_new(path: &Path, contents: &[u8], mode: u32) -> Result<(), TlsError> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
    #[cfg(not(unix))]
    let _ = mode;
    options
        .open(path)
        .and_then(|mut file| {
            file.write_all(contents)?;
            file.sync_all()
        })
        .map_err(|error| TlsError::Write {
            path: path.to_owned(),
            error,
        })
}

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    fs::read(path).map_err(|error| TlsError::Read {
        path: path.to_owned(),
        error,
    })
}

/// All certificates in a PEM file, in order; at least one.
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    parse_certs(path, &read_file(path)?)
}

/// All certificates in PEM text (from `path`), in order; at least one.
fn parse_certs(path: &Path, bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
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
fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    parse_key(path, &read_file(path)?)
}

/// The first private key in PEM text (from `path`).
fn parse_key(path: &Path, bytes: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

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
            assert!(validate_node_id(ok).is_ok(), "{ok}");
            assert!(ServerName::try_from(node_server_name(ok)).is_ok(), "{ok}");
        }
        for bad in [
            "",
            &"x".repeat(64),
            ".a",
            "a.",
            "-a",
            "a-",
            "a..b",
            "a.-b",
            "a-.b",
            "a b",
            "a/b",
            "é",
            "a:1",
            "*",
            "ca",
            "CA",
        ] {
            assert!(
                matches!(validate_node_id(bad), Err(TlsError::InvalidNodeId { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(node_server_name("n1"), "n1.node.peerlb");
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(20_000), (2024, 10, 4));
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
}
