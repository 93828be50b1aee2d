//! Issuing certificates (`peerlb certs`, `peerlb up`): the cluster CA and
//! node certificates, their validity dates, and the files they are written
//! to (keys mode 0600, certificates 0644, the directory 0700, nothing ever
//! overwritten).

use std::collections::BTreeSet;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    GeneralSubtree, IsCa, KeyPair, KeyUsagePurpose, NameConstraints,
};
use rustls::RootCertStore;
use rustls_pki_types::UnixTime;
use time::{Date, OffsetDateTime};

use super::TlsError;
use super::configs::{provider, read_certs, read_file, verify_chain};
use super::identity::{NAME_CONSTRAINT, checked_server_name, node_server_name};

/// The tracing target of this module's events: its path before the
/// adapters were put in wings (`crate::adapters::REQUEST_PATH`).
const LOG: &str = "peerlb::adapters::tls::issuance";

/// File stem of the cluster CA in a certificate directory.
const CA_STEM: &str = crate::engine::node_id::RESERVED_NODE_ID;
/// Validity of a generated CA certificate, in years from generation.
const CA_YEARS: i32 = 20;
/// Validity of a generated node certificate, in years from generation.
const NODE_YEARS: i32 = 10;

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
        checked_server_name(id)?;
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
    let keyring = dir.join(crate::adapters::cluster::keyring::FILE_NAME);
    match crate::adapters::cluster::keyring::create_file(&keyring) {
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
            tracing::info!(target: LOG, node_id = %id, cert = %cert_path.display(), "node certificate created");
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

/// File stem of the self-signed HTTPS certificate `peerlb up --https`
/// serves clients with (`entry.pem`, `entry.key`).
pub const LOCAL_HTTPS_STEM: &str = "entry";
/// Validity of the local HTTPS certificate, in years from generation.
const LOCAL_HTTPS_YEARS: i32 = 1;

/// Makes sure `dir` holds a self-signed certificate for the client
/// listeners of a local cluster (`peerlb up --https`): `entry.pem` and
/// `entry.key`, valid for `localhost`, `127.0.0.1` and `::1`, created only
/// when missing (a client can trust `entry.pem` once, `curl --cacert`).
/// Returns (certificate, key, whether they were created now).
///
/// # Errors
/// [`TlsError`] when only one of the two files exists, or they cannot be
/// generated or written.
pub fn ensure_local_https(dir: &Path) -> Result<(PathBuf, PathBuf, bool), TlsError> {
    let cert_path = dir.join(format!("{LOCAL_HTTPS_STEM}.pem"));
    let key_path = dir.join(format!("{LOCAL_HTTPS_STEM}.key"));
    if pair_exists(&cert_path, &key_path)? {
        return Ok((cert_path, key_path, false));
    }
    create_private_dir(dir)?;
    let key = new_key("the local https key")?;
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).map_err(|error| {
        TlsError::Generate {
            what: "the local https certificate".into(),
            error,
        }
    })?;
    for ip in [
        std::net::IpAddr::from([127, 0, 0, 1]),
        std::net::Ipv6Addr::LOCALHOST.into(),
    ] {
        params.subject_alt_names.push(rcgen::SanType::IpAddress(ip));
    }
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "peerlb local https");
    params.distinguished_name = dn;
    set_validity(&mut params, LOCAL_HTTPS_YEARS);
    let cert = params
        .self_signed(&key)
        .map_err(|error| TlsError::Generate {
            what: "the local https certificate".into(),
            error,
        })?;
    write_new(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
    write_new(&cert_path, cert.pem().as_bytes(), 0o644)?;
    Ok((cert_path, key_path, true))
}

/// The CA used to issue node certificates in one [`generate`] call.
pub(super) struct Ca {
    pub(super) key: KeyPair,
    /// An rcgen certificate with the CA's subject and key: the one written,
    /// or (for a reused CA) one re-derived from the cluster name, used only
    /// as the issuer of new certificates.
    pub(super) cert: rcgen::Certificate,
    /// The CA as it is on disk, to verify new certificates against; `None`
    /// when the CA was created in this call.
    pub(super) anchor: Option<Arc<RootCertStore>>,
}

impl Ca {
    /// Loads an existing CA. rcgen 0.13 can parse a CA certificate only with
    /// its `x509-parser` feature, so the issuer is re-derived from the
    /// cluster name and the key; [`Ca::issue`] then verifies each new
    /// certificate against the CA file, which catches a wrong cluster name
    /// or a key that does not belong to the certificate.
    pub(super) fn load(
        cert_path: &Path,
        key_path: &Path,
        cluster_name: &str,
    ) -> Result<Ca, TlsError> {
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
    pub(super) fn issue(
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
pub(super) fn new_key(what: &str) -> Result<KeyPair, TlsError> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|error| TlsError::Generate {
        what: what.to_owned(),
        error,
    })
}

/// Sets validity from yesterday (UTC, to absorb clock skew between nodes) to
/// `years` later ([`validity`]). Reads the system clock: certificate
/// generation is a CLI step, never on a path the simulation runs.
fn set_validity(params: &mut CertificateParams, years: i32) {
    let (not_before, not_after) = validity(OffsetDateTime::now_utc().date(), years);
    params.not_before = not_before;
    params.not_after = not_after;
}

/// The validity period of a certificate issued on `today` (UTC) for `years`:
/// from midnight UTC of the day before `today` to midnight UTC of the same
/// month and day `years` later, the day capped at 28 so that the date exists
/// in every month (29 February then gives 28 February).
pub(super) fn validity(today: Date, years: i32) -> (OffsetDateTime, OffsetDateTime) {
    let start = today.previous_day().unwrap_or(today);
    let end = Date::from_calendar_date(start.year() + years, start.month(), start.day().min(28))
        .unwrap_or(Date::MAX);
    (start.midnight().assume_utc(), end.midnight().assume_utc())
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
