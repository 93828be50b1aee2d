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
//!
//! # Layout
//!
//! - `identity`: node id ↔ certificate name (`<id>.node.peerlb`), and the
//!   checks of a peer's certificate against the member it claims to be.
//! - `issuance`: the cluster CA and node certificates `peerlb certs` writes
//!   (validity dates, file modes, reuse of existing files).
//! - `configs`: loading a node's PEM files into [`TlsMaterial`] and the
//!   rustls/quinn client and server configurations built from it.
//! - `entry`: HTTPS at the entry (client listeners), apart from the peer
//!   wire's trust model: certificates by SNI, reloads, ALPN.
//!
//! The node-id naming rules themselves are the engine's
//! ([`crate::NodeId::new`]); every function here that takes an id checks it
//! with them.

use std::io;
use std::path::PathBuf;

use rustls_pki_types::pem;

use crate::engine::node_id::InvalidNodeId;
#[cfg(doc)]
use crate::engine::node_id::NodeId;

mod configs;
mod identity;
mod issuance;
mod state_sign;
#[cfg(test)]
mod tests;

pub use configs::{
    TlsMaterial, client_config, quinn_client_config, quinn_server_config, server_config,
};
pub use identity::{node_server_name, peer_node_id, verify_peer_is};
pub use issuance::{GeneratedCerts, LOCAL_HTTPS_STEM, ensure_local, ensure_local_https, generate};
pub(crate) use state_sign::state_signatures;
pub use state_sign::{
    DOMAIN as STATE_SIGNATURE_DOMAIN, SCHEMES as STATE_SIGNATURE_SCHEMES, StateSignError,
    StateSignature, StateSigner, StateVerifier,
};

/// The ALPN protocol id of the peer wire: one connection per node pair,
/// carrying requests both ways, each stream's kind a field of its request
/// frame. Offered first by both ends.
pub const ALPN: &[u8] = b"peerlb/3";

/// The ALPN protocol id of the peer wire before the typed stream kind
/// (the kind is a header mark; otherwise as [`ALPN`]). Offered and
/// accepted after [`ALPN`], so a node of an older release can join
/// during a rolling upgrade.
pub const ALPN_V2: &[u8] = b"peerlb/2";

/// The ALPN protocol id of the previous peer wire (releases before one
/// connection per pair): each node opens streams only on connections it
/// dialled. Offered and accepted after [`ALPN_V2`], so a node of an older
/// release can join during a rolling upgrade.
pub const ALPN_V1: &[u8] = b"peerlb/1";

/// Errors of certificate generation, loading, config building and peer
/// identity checks. Messages name the file involved and include the cause.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A node id breaks the naming rules of [`NodeId::new`]. Rename the
    /// node in `cluster.toml`.
    #[error(transparent)]
    InvalidNodeId(#[from] InvalidNodeId),
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
    /// This node's key cannot sign its gossip state
    /// (`gossip.state_signatures`): it supports no TLS 1.3 signature
    /// scheme, or the key provider refused it. Use an ECDSA, Ed25519 or
    /// RSA node key (`peerlb certs` makes ECDSA P-256 ones).
    #[error("the node key cannot sign gossip state: {error}")]
    StateSign {
        /// Why.
        error: Box<StateSignError>,
    },
}
