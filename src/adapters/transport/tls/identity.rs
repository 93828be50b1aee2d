//! A node's identity in TLS: the DNS name `<id>.node.peerlb` its
//! certificate carries ([`node_server_name`]), the check that a peer's
//! certificate belongs to the member it claims to be ([`verify_peer_is`]),
//! and the id a certificate names, for logs ([`peer_node_id`]).

use rustls_pki_types::{CertificateDer, ServerName};

use super::TlsError;
use crate::engine::node_id::{self, InvalidNodeId};

/// Suffix appended to a node id to form its certificate's DNS name.
pub(super) const NAME_SUFFIX: &str = ".node.peerlb";
/// The name constraint put on the cluster CA (covers every `*.node.peerlb`).
pub(super) const NAME_CONSTRAINT: &str = "node.peerlb";

/// The DNS name a node's certificate carries and that peers dial it with:
/// `<id>.node.peerlb`.
pub fn node_server_name(id: &str) -> String {
    format!("{id}{NAME_SUFFIX}")
}

/// Checks that a peer's certificate chain (end-entity first, as
/// `quinn::Connection::peer_identity()` yields it, downcast to
/// `Vec<CertificateDer<'static>>`) belongs to node `node_id`: the end-entity
/// certificate must be valid for [`node_server_name`]`(node_id)`.
///
/// Only the name is checked here: the chain to the cluster CA was verified
/// by the handshake ([`super::server_config`]). Names compare ignoring ASCII case.
///
/// # Errors
///
/// [`TlsError::InvalidNodeId`] if `node_id` is not a valid id,
/// [`TlsError::NoPeerCertificate`], [`TlsError::BadPeerCertificate`], or
/// [`TlsError::PeerIdentityMismatch`] when the certificate is another node's.
pub fn verify_peer_is(certs: &[CertificateDer<'_>], node_id: &str) -> Result<(), TlsError> {
    let server_name = checked_server_name(node_id)?;
    let name = node_server_name(node_id);
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
        if !suffix.eq_ignore_ascii_case(NAME_SUFFIX) || node_id::validate(id).is_err() {
            continue;
        }
        match found {
            Some(prev) if !prev.eq_ignore_ascii_case(id) => return None,
            _ => found = Some(id),
        }
    }
    found.map(str::to_owned)
}

/// The TLS server name of node `id`, after checking `id` is a node id.
///
/// The engine's naming rules are meant to imply a valid DNS name; the name
/// is parsed anyway, belt and braces, so an id that slipped through fails
/// here with [`TlsError::InvalidNodeId`] rather than somewhere in rustls.
///
/// # Errors
///
/// [`TlsError::InvalidNodeId`] naming the broken rule.
pub(super) fn checked_server_name(id: &str) -> Result<ServerName<'static>, TlsError> {
    node_id::validate(id)?;
    ServerName::try_from(node_server_name(id)).map_err(|_| {
        TlsError::from(InvalidNodeId {
            id: id.to_owned(),
            reason: "not a valid DNS name",
        })
    })
}
