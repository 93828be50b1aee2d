//! HTTPS at the entry: the certificates a client listener serves and the
//! rustls server configuration around them.
//!
//! - One default certificate (`[listener.tls] cert` / `key`) and any
//!   number of SNI certificates (`[[listener.tls.sni]]`). A client's SNI
//!   name picks the certificate whose DNS names (subject alternative
//!   names) hold it, exactly or by a `*.` wildcard one label deep; any
//!   other name, or none, gets the default certificate.
//! - TLS 1.3 and 1.2 with the `ring` provider's cipher suites; rustls has
//!   no renegotiation. Resumption: a server session cache
//!   ([`SESSION_CACHE_ENTRIES`]) and stateless tickets (ring's ticketer,
//!   keys rotated every 6 hours).
//! - ALPN: [`ALPN`], the single list of what the entry speaks over TLS.
//! - Certificates are reloaded without a restart: [`EntryCerts::reload`]
//!   (the admin API's `POST /_peerlb/tls/reload`, and [`watch_files`] when
//!   a file's modification time or length changes). A reload that fails
//!   keeps the certificates in force and says why.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert, ServerSessionMemoryCache};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tracing::{info, warn};

use crate::config::{CertFiles, ListenerTls};

/// The tracing target of this module's events: its path before the
/// adapters were put in wings (`crate::adapters::REQUEST_PATH`).
const LOG: &str = "peerlb::adapters::tls::entry";

/// The ALPN protocols the entry offers over TLS, most preferred first:
/// HTTP/2, then HTTP/1.1 (a client that offers neither, or no ALPN at
/// all, gets HTTP/1.1). The negotiated one reaches the connection's server
/// as `wire::TlsFacts::alpn`, which picks the HTTP
/// server by it.
pub const ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];

/// Sessions the server-side cache keeps for resumption by session id.
pub const SESSION_CACHE_ENTRIES: usize = 4096;

/// A certificate or key file of a listener could not be used: the config
/// field at fault and why. At start the node exits 64 with it; on a reload
/// the certificates in force stay.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{field}: {message}")]
pub struct EntryTlsError {
    /// The field path (`listener.tls.cert`, `listener.tls.sni[0].key`,
    /// `--tls-cert`).
    pub field: String,
    /// What is wrong, naming the file.
    pub message: String,
}

/// The certificates one listener serves, in force now.
#[derive(Debug)]
struct CertSet {
    default: Arc<CertifiedKey>,
    /// Lowercase DNS names (a wildcard as `*.example.com`) -> certificate;
    /// the first pair that names a DNS name wins.
    by_name: BTreeMap<String, Arc<CertifiedKey>>,
    /// Each certificate's DNS names (lowercase, a wildcard as
    /// `*.example.com`), in file order.
    names: Vec<(Arc<CertifiedKey>, Arc<[String]>)>,
}

/// A file's modification time and length, to notice a replacement.
type Stamp = Option<(Option<std::time::SystemTime>, u64)>;

fn stamp(p: &Path) -> Stamp {
    std::fs::metadata(p)
        .ok()
        .map(|m| (m.modified().ok(), m.len()))
}

/// The certificates of one HTTPS listener: loaded from the files
/// `[listener.tls]` names, reloadable, and the rustls certificate resolver
/// of its server configuration.
#[derive(Debug)]
pub struct EntryCerts {
    files: ListenerTls,
    current: RwLock<Arc<CertSet>>,
    stamps: Mutex<Vec<Stamp>>,
}

impl EntryCerts {
    /// Loads every certificate and key `tls` names.
    ///
    /// # Errors
    /// [`EntryTlsError`] naming the first file that cannot be read, holds
    /// no certificate or key, or whose key does not match its certificate.
    pub fn load(tls: &ListenerTls) -> Result<Arc<EntryCerts>, EntryTlsError> {
        let stamps = file_stamps(tls);
        let set = load_set(tls)?;
        Ok(Arc::new(EntryCerts {
            files: tls.clone(),
            current: RwLock::new(Arc::new(set)),
            stamps: Mutex::new(stamps),
        }))
    }

    /// Reads every file again and puts the new certificates in force for
    /// new handshakes: the number of certificates. A failure keeps the
    /// certificates in force.
    ///
    /// # Errors
    /// As [`EntryCerts::load`].
    pub fn reload(&self) -> Result<usize, EntryTlsError> {
        let stamps = file_stamps(&self.files);
        let result = load_set(&self.files);
        // The stamps are taken before the read: a file replaced during the
        // read is read again at the next check.
        *self.stamps.lock().expect("stamps lock") = stamps;
        let set = result?;
        *self.current.write().expect("certs lock") = Arc::new(set);
        Ok(self.files.certs.len())
    }

    /// Whether a file changed since the last load or reload.
    fn changed(&self) -> bool {
        *self.stamps.lock().expect("stamps lock") != file_stamps(&self.files)
    }

    /// How often [`watch_files`] checks the files (zero: never).
    pub fn reload_interval(&self) -> Duration {
        self.files.reload_interval
    }

    /// The DNS names of the certificate a handshake with SNI name `sni`
    /// gets (lowercase, a wildcard as `*.example.com`): the names a
    /// request on that connection may be for ([`covers`]).
    pub(crate) fn names_for(&self, sni: Option<&str>) -> Arc<[String]> {
        let ck = self.pick(sni);
        let set = self.current.read().expect("certs lock").clone();
        set.names
            .iter()
            .find(|(c, _)| Arc::ptr_eq(c, &ck))
            .map_or_else(|| Arc::from(Vec::new()), |(_, n)| n.clone())
    }

    /// The files this listener serves (`[listener.tls]`).
    pub(crate) fn files(&self) -> &ListenerTls {
        &self.files
    }

    /// The index, in [`ListenerTls::certs`] order, of the certificate pair
    /// a handshake with SNI name `sni` gets (0, the default, when none
    /// names it).
    pub(crate) fn pair_index(&self, sni: Option<&str>) -> usize {
        let ck = self.pick(sni);
        let set = self.current.read().expect("certs lock").clone();
        set.names
            .iter()
            .position(|(c, _)| Arc::ptr_eq(c, &ck))
            .unwrap_or(0)
    }

    /// The certificate a handshake with SNI name `sni` gets.
    fn pick(&self, sni: Option<&str>) -> Arc<CertifiedKey> {
        let set = self.current.read().expect("certs lock").clone();
        if let Some(name) = sni {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            if let Some(ck) = set.by_name.get(&name) {
                return ck.clone();
            }
            if let Some((_, parent)) = name.split_once('.')
                && let Some(ck) = set.by_name.get(&format!("*.{parent}"))
            {
                return ck.clone();
            }
        }
        set.default.clone()
    }
}

/// Whether a certificate with DNS names `names` (as
/// [`EntryCerts::names_for`] gives them) is valid for `host` (lowercase,
/// no port, no trailing dot): an exact name, or a wildcard `*.parent`
/// for `label.parent` (one label, RFC 6125 section 6.4.3).
pub(crate) fn covers(names: &[String], host: &str) -> bool {
    names.iter().any(|n| match n.strip_prefix("*.") {
        Some(parent) => host
            .split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest == parent),
        None => n == host,
    })
}

impl ResolvesServerCert for EntryCerts {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.pick(hello.server_name()))
    }
}

fn file_stamps(tls: &ListenerTls) -> Vec<Stamp> {
    tls.certs
        .iter()
        .flat_map(|c| [stamp(&c.cert), stamp(&c.key)])
        .collect()
}

fn load_set(tls: &ListenerTls) -> Result<CertSet, EntryTlsError> {
    let mut default = None;
    let mut by_name = BTreeMap::new();
    let mut all = Vec::new();
    for files in &tls.certs {
        let (ck, names) = load_pair(files)?;
        let ck = Arc::new(ck);
        for n in &names {
            by_name.entry(n.clone()).or_insert_with(|| ck.clone());
        }
        all.push((ck.clone(), Arc::from(names)));
        default.get_or_insert(ck);
    }
    let default = default.ok_or_else(|| EntryTlsError {
        field: "listener.tls".into(),
        message: "no certificate".into(),
    })?;
    Ok(CertSet {
        default,
        by_name,
        names: all,
    })
}

/// Loads one certificate chain and key: the certified key and the leaf's
/// DNS names, lowercase.
fn load_pair(files: &CertFiles) -> Result<(CertifiedKey, Vec<String>), EntryTlsError> {
    let cert_err = |message: String| EntryTlsError {
        field: format!("{}.cert", files.field),
        message,
    };
    let key_err = |message: String| EntryTlsError {
        field: format!("{}.key", files.field),
        message,
    };
    let cert_text = std::fs::read(&files.cert)
        .map_err(|e| cert_err(format!("{}: {e}", files.cert.display())))?;
    let chain = CertificateDer::pem_slice_iter(&cert_text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| cert_err(format!("{}: {e}", files.cert.display())))?;
    let Some(leaf) = chain.first() else {
        return Err(cert_err(format!(
            "{}: no PEM certificate in the file",
            files.cert.display()
        )));
    };
    let end = webpki::EndEntityCert::try_from(leaf).map_err(|e| {
        cert_err(format!(
            "{}: the first certificate does not parse: {e}",
            files.cert.display()
        ))
    })?;
    let names: Vec<String> = end
        .valid_dns_names()
        .map(|n| n.trim_end_matches('.').to_ascii_lowercase())
        .collect();
    let key_text =
        std::fs::read(&files.key).map_err(|e| key_err(format!("{}: {e}", files.key.display())))?;
    let key = PrivateKeyDer::from_pem_slice(&key_text)
        .map_err(|e| key_err(format!("{}: no PEM private key: {e}", files.key.display())))?;
    let signing = rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| key_err(format!("{}: {e}", files.key.display())))?;
    let ck = CertifiedKey::new(chain, signing);
    ck.keys_match().map_err(|e| {
        key_err(format!(
            "{}: does not match the certificate {}: {e}",
            files.key.display(),
            files.cert.display()
        ))
    })?;
    Ok((ck, names))
}

/// The rustls server configuration of an HTTPS listener serving `certs`:
/// TLS 1.3 and 1.2 (ring), no client certificates, ALPN [`ALPN`], a
/// session cache and tickets for resumption.
///
/// # Errors
/// rustls' own error when the provider cannot make the configuration (the
/// ring provider always can).
pub fn server_config(certs: Arc<EntryCerts>) -> Result<Arc<ServerConfig>, rustls::Error> {
    server_config_with(certs, None)
}

/// [`server_config`] asking for client certificates with `verifier`
/// (`None`: none asked); its own session cache and ticket keys
/// (`client_cert.rs`: a session never resumes under another policy).
///
/// # Errors
/// As [`server_config`].
pub(crate) fn server_config_with(
    certs: Arc<EntryCerts>,
    verifier: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match verifier {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(certs);
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    config.session_storage = ServerSessionMemoryCache::new(SESSION_CACHE_ENTRIES);
    config.ticketer = rustls::crypto::ring::Ticketer::new()?;
    Ok(Arc::new(config))
}

/// Checks `certs`' files every [`EntryCerts::reload_interval`] and reloads
/// them when one changed, telling `report` each reload's result; runs
/// until the task is aborted (returns at once for a zero interval).
pub async fn watch_files(
    certs: Arc<EntryCerts>,
    report: impl Fn(&Result<usize, EntryTlsError>) + Send,
) {
    let every = certs.reload_interval();
    if every.is_zero() {
        return;
    }
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !certs.changed() {
            continue;
        }
        let result = certs.reload();
        report(&result);
        match result {
            Ok(n) => {
                info!(target: LOG, certificates = n, "listener certificates changed: reloaded")
            }
            Err(e) => {
                warn!(target: LOG, error = %e, "listener certificate files changed but cannot be used: the certificates in force stay")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_cert(dir: &Path, stem: &str, names: &[&str]) -> CertFiles {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.self_signed(&key).unwrap();
        let (c, k) = (
            dir.join(format!("{stem}.pem")),
            dir.join(format!("{stem}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        CertFiles {
            cert: c,
            key: k,
            field: format!("listener.tls.{stem}"),
            client_auth: None,
        }
    }

    fn dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("peerlb-entry-tls-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn leaf(ck: &CertifiedKey) -> Vec<u8> {
        ck.cert[0].to_vec()
    }

    #[test]
    fn sni_picks_by_exact_name_then_wildcard_then_default() {
        let d = dir("pick");
        let tls = ListenerTls {
            certs: vec![
                write_cert(&d, "default", &["localhost"]),
                write_cert(&d, "a", &["a.example"]),
                write_cert(&d, "w", &["*.b.example"]),
            ],
            reload_interval: Duration::ZERO,
        };
        let certs = EntryCerts::load(&tls).unwrap();
        let set = certs.current.read().unwrap().clone();
        let a = leaf(&set.by_name["a.example"]);
        let w = leaf(&set.by_name["*.b.example"]);
        let def = leaf(&set.default);
        assert_eq!(leaf(&certs.pick(Some("A.Example."))), a);
        assert_eq!(leaf(&certs.pick(Some("x.b.example"))), w);
        // A wildcard covers one label only.
        assert_eq!(leaf(&certs.pick(Some("y.x.b.example"))), def);
        assert_eq!(leaf(&certs.pick(Some("other.example"))), def);
        assert_eq!(leaf(&certs.pick(None)), def);
        // The names a connection's certificate serves, for 421.
        assert_eq!(&*certs.names_for(Some("a.example")), ["a.example"]);
        assert_eq!(&*certs.names_for(Some("x.b.example")), ["*.b.example"]);
        assert_eq!(&*certs.names_for(Some("other.example")), ["localhost"]);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_certificate_covers_its_names_and_one_label_under_a_wildcard() {
        let names = ["a.example".to_owned(), "*.b.example".to_owned()];
        assert!(covers(&names, "a.example"));
        assert!(covers(&names, "x.b.example"));
        assert!(!covers(&names, "b.example"));
        assert!(!covers(&names, "y.x.b.example"));
        assert!(!covers(&names, ".b.example"));
        assert!(!covers(&names, "c.example"));
    }

    #[test]
    fn bad_files_name_the_field() {
        let d = dir("bad");
        let good = write_cert(&d, "good", &["localhost"]);
        let missing = CertFiles {
            cert: d.join("nope.pem"),
            ..good.clone()
        };
        let e = EntryCerts::load(&ListenerTls {
            certs: vec![missing],
            reload_interval: Duration::ZERO,
        })
        .unwrap_err();
        assert_eq!(e.field, "listener.tls.good.cert");
        std::fs::write(d.join("junk.key"), "not a key").unwrap();
        let junk_key = CertFiles {
            key: d.join("junk.key"),
            ..good.clone()
        };
        let e = EntryCerts::load(&ListenerTls {
            certs: vec![junk_key],
            reload_interval: Duration::ZERO,
        })
        .unwrap_err();
        assert_eq!(e.field, "listener.tls.good.key");
        // Another certificate's key.
        let other = write_cert(&d, "other", &["localhost"]);
        let mismatched = CertFiles {
            key: other.key.clone(),
            ..good.clone()
        };
        let e = EntryCerts::load(&ListenerTls {
            certs: vec![mismatched],
            reload_interval: Duration::ZERO,
        })
        .unwrap_err();
        assert_eq!(e.field, "listener.tls.good.key");
        assert!(e.message.contains("does not match"), "{e}");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_bad_reload_keeps_the_certificate_in_force_and_a_good_one_replaces_it() {
        let d = dir("reload");
        let first = write_cert(&d, "site", &["localhost"]);
        let tls = ListenerTls {
            certs: vec![first.clone()],
            reload_interval: Duration::ZERO,
        };
        let certs = EntryCerts::load(&tls).unwrap();
        let before = leaf(&certs.pick(None));
        assert!(!certs.changed());
        std::fs::write(&first.cert, "garbage").unwrap();
        assert!(certs.changed());
        assert!(certs.reload().is_err());
        assert_eq!(leaf(&certs.pick(None)), before);
        assert!(
            !certs.changed(),
            "a failed reload is not retried until the files change again"
        );
        write_cert(&d, "site", &["localhost"]);
        assert_eq!(certs.reload(), Ok(1));
        assert_ne!(leaf(&certs.pick(None)), before);
        std::fs::remove_dir_all(d).unwrap();
    }

    /// One handshake of a client using `client` against `server` over an
    /// in-memory pipe: whether it resumed a session, and the ALPN
    /// protocol negotiated.
    async fn handshake(
        server: Arc<ServerConfig>,
        client: Arc<rustls::ClientConfig>,
    ) -> (rustls::HandshakeKind, Option<Vec<u8>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (a, b) = tokio::io::duplex(64 * 1024);
        let srv = tokio::spawn(async move {
            let mut s = tokio_rustls::TlsAcceptor::from(server)
                .accept(b)
                .await
                .unwrap();
            // The client reads one byte: TLS 1.3 tickets come after the
            // handshake, with the first data.
            s.write_all(b"x").await.unwrap();
            s.flush().await.unwrap();
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest).await;
        });
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let mut c = tokio_rustls::TlsConnector::from(client)
            .connect(name, a)
            .await
            .unwrap();
        let mut one = [0u8; 1];
        c.read_exact(&mut one).await.unwrap();
        let (_, conn) = c.get_ref();
        let out = (
            conn.handshake_kind().unwrap(),
            conn.alpn_protocol().map(<[u8]>::to_vec),
        );
        c.shutdown().await.unwrap();
        drop(c);
        srv.await.unwrap();
        out
    }

    #[tokio::test]
    async fn sessions_resume_over_tls_1_3_and_1_2_and_alpn_prefers_h2() {
        let d = dir("resume");
        let files = write_cert(&d, "site", &["localhost"]);
        let certs = EntryCerts::load(&ListenerTls {
            certs: vec![files.clone()],
            reload_interval: Duration::ZERO,
        })
        .unwrap();
        let server = server_config(certs).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(&files.cert).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
            let mut client = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_protocol_versions(&[version])
            .unwrap()
            .with_root_certificates(roots.clone())
            .with_no_client_auth();
            // A client offering both gets HTTP/2 ...
            let mut h1_only = client.clone();
            client.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            let client = Arc::new(client);
            let (first, alpn) = handshake(server.clone(), client.clone()).await;
            assert_eq!(first, rustls::HandshakeKind::Full, "{version:?}");
            assert_eq!(alpn.as_deref(), Some(&b"h2"[..]), "{version:?}");
            let (second, _) = handshake(server.clone(), client).await;
            assert_eq!(second, rustls::HandshakeKind::Resumed, "{version:?}");
            // ... one offering only HTTP/1.1 gets that.
            h1_only.alpn_protocols = vec![b"http/1.1".to_vec()];
            let (_, alpn) = handshake(server.clone(), Arc::new(h1_only)).await;
            assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]), "{version:?}");
        }
        std::fs::remove_dir_all(d).unwrap();
    }
}
