//! Client certificates at the entry (`client_ca`, `client_auth` of
//! `[listener.tls]` and `[[listener.tls.sni]]`, docs/configuration.md).
//!
//! - **Per SNI name.** Each certificate pair of a listener carries its own
//!   policy (none, optional, required, and the CA file a client
//!   certificate must chain to). [`EntryTls::config_for`] gives the rustls
//!   server configuration of the pair a client's SNI name picks (the same
//!   choice as the certificate's, [`EntryCerts::pair_index`]); the
//!   connection reads the ClientHello first (`LazyConfigAcceptor`), then
//!   handshakes with that configuration.
//! - **Resumption never skips the check.** Pairs with the same policy share
//!   one configuration, and each configuration has its own session cache
//!   and ticket keys, so a session made under one policy (a ticket issued
//!   without a certificate) cannot resume under another: the client makes
//!   a full handshake, and the certificate is asked for.
//! - **The verified identity reaches the app** in `X-Forwarded-Client-Cert`
//!   ([`forwarded_client_cert`]), in Envoy's format: `Hash` (SHA-256 of the
//!   certificate, hex), `Subject` (RFC 4514), then every `URI` and `DNS`
//!   subject alternative name. The entry removes the header from every
//!   client request and sets it only from a verified certificate; across
//!   the hop it travels as a request header.

use std::collections::BTreeMap;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use x509_cert::der::Decode;

use super::entry_tls::{EntryCerts, EntryTlsError, server_config_with};
use crate::config::{ClientAuth, ListenerTls};

/// Checks every file an HTTPS listener `tls` needs, as the node reads them
/// at start: the certificates and keys ([`EntryCerts::load`]) and the
/// client CA files (`client_ca`).
///
/// # Errors
/// [`EntryTlsError`] naming the field of the first file that cannot be
/// used.
pub fn check_files(tls: &ListenerTls) -> Result<(), EntryTlsError> {
    EntryTls::new(EntryCerts::load(tls)?).map(|_| ())
}

/// The header carrying a verified client certificate's identity to the app.
pub(crate) const FORWARDED_CLIENT_CERT: http::HeaderName =
    http::HeaderName::from_static("x-forwarded-client-cert");

/// An HTTPS listener's server configurations: one per client certificate
/// policy among its certificate pairs.
#[derive(Debug)]
pub(crate) struct EntryTls {
    certs: Arc<EntryCerts>,
    /// The configuration of each certificate pair, in file order.
    by_pair: Vec<Arc<ServerConfig>>,
}

impl EntryTls {
    /// The configurations of the listener serving `certs`: a client
    /// certificate verifier over each policy's CA file.
    ///
    /// # Errors
    /// [`EntryTlsError`] naming the `client_ca` field whose file cannot be
    /// read or holds no usable CA certificate.
    pub(crate) fn new(certs: Arc<EntryCerts>) -> Result<Arc<EntryTls>, EntryTlsError> {
        let mut by_policy: BTreeMap<Option<ClientAuth>, Arc<ServerConfig>> = BTreeMap::new();
        let mut by_pair = Vec::new();
        for pair in &certs.files().certs {
            // The field names the pair's own CA; pairs with the same CA and
            // mode share one configuration whichever field named it.
            let key = pair.client_auth.clone().map(|a| ClientAuth {
                field: String::new(),
                ..a
            });
            let config = match by_policy.get(&key) {
                Some(c) => c.clone(),
                None => {
                    let verifier = match &pair.client_auth {
                        Some(auth) => Some(verifier(auth)?),
                        None => None,
                    };
                    let c =
                        server_config_with(certs.clone(), verifier).map_err(|e| EntryTlsError {
                            field: pair.field.clone(),
                            message: e.to_string(),
                        })?;
                    by_policy.insert(key, c.clone());
                    c
                }
            };
            by_pair.push(config);
        }
        Ok(Arc::new(EntryTls { certs, by_pair }))
    }

    /// The configuration a handshake with SNI name `sni` takes.
    pub(crate) fn config_for(&self, sni: Option<&str>) -> Arc<ServerConfig> {
        let i = self.certs.pair_index(sni);
        self.by_pair
            .get(i)
            .or(self.by_pair.first())
            .expect("a listener has a certificate")
            .clone()
    }
}

/// The client certificate verifier of `auth`: certificates that chain to
/// its CA file, required or optional.
fn verifier(
    auth: &ClientAuth,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, EntryTlsError> {
    let err = |message: String| EntryTlsError {
        field: auth.field.clone(),
        message,
    };
    let text = std::fs::read(&auth.ca).map_err(|e| err(format!("{}: {e}", auth.ca.display())))?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&text) {
        let c = c.map_err(|e| err(format!("{}: {e}", auth.ca.display())))?;
        roots
            .add(c)
            .map_err(|e| err(format!("{}: not a CA certificate: {e}", auth.ca.display())))?;
    }
    if roots.is_empty() {
        return Err(err(format!(
            "{}: no PEM certificate in the file",
            auth.ca.display()
        )));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
    let builder = if auth.required {
        builder
    } else {
        builder.allow_unauthenticated()
    };
    builder
        .build()
        .map_err(|e| err(format!("{}: {e}", auth.ca.display())))
}

/// The `X-Forwarded-Client-Cert` value of a verified client certificate
/// (Envoy's format): `Hash=<SHA-256 of the DER, lowercase hex>`, then
/// `Subject="<RFC 4514>"` when the subject parses, then `URI=<uri>` and
/// `DNS=<name>` for each such subject alternative name, joined by `;`.
/// A quote or backslash inside a quoted value is escaped with a backslash.
pub(crate) fn forwarded_client_cert(der: &CertificateDer<'_>) -> String {
    use std::fmt::Write as _;
    let digest = ring::digest::digest(&ring::digest::SHA256, der.as_ref());
    let mut out = String::from("Hash=");
    for b in digest.as_ref() {
        let _ = write!(out, "{b:02x}");
    }
    if let Ok(cert) = x509_cert::Certificate::from_der(der.as_ref()) {
        let subject = cert.tbs_certificate.subject.to_string();
        out.push_str(";Subject=\"");
        for c in subject.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
    }
    if let Ok(ee) = webpki::EndEntityCert::try_from(der) {
        for uri in ee.valid_uri_names() {
            let _ = write!(out, ";URI={uri}");
        }
        for dns in ee.valid_dns_names() {
            let _ = write!(out, ";DNS={dns}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forwarded_value_gives_hash_subject_uri_and_dns() {
        let mut params = rcgen::CertificateParams::new(vec!["client.example".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "alice \"the\" client");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Example");
        params.subject_alt_names.push(rcgen::SanType::URI(
            "spiffe://example/alice".try_into().unwrap(),
        ));
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let der = cert.der().clone();
        let v = forwarded_client_cert(&der);
        let digest = ring::digest::digest(&ring::digest::SHA256, der.as_ref());
        let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        // The subject as RFC 4514 writes it (`CN=alice \"the\" client`),
        // then quoted for the header: its backslashes and quotes escaped.
        let subject = r#"O=Example,CN=alice \\\"the\\\" client"#;
        assert_eq!(
            v,
            format!(
                "Hash={hex};Subject=\"{subject}\";URI=spiffe://example/alice;DNS=client.example"
            )
        );
    }

    /// Writes a self-signed certificate for `name` and its key in `dir`.
    fn pair(
        dir: &std::path::Path,
        name: &str,
        auth: Option<ClientAuth>,
    ) -> crate::config::CertFiles {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (c, k) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        crate::config::CertFiles {
            cert: c,
            key: k,
            field: format!("listener.tls.{name}"),
            client_auth: auth,
        }
    }

    /// Names with one client policy share a configuration (so a session
    /// resumes across them); another policy has its own configuration,
    /// session cache and ticket keys (so a session made without a
    /// certificate never resumes where one is required); a name picks its
    /// certificate's configuration; a CA file with no certificate names
    /// its field.
    #[test]
    fn each_client_policy_has_its_own_configuration_and_session_keys() {
        let dir = std::env::temp_dir().join(format!("peerlb-client-cert-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_pem = dir.join("ca.pem");
        std::fs::write(&ca_pem, ca.self_signed(&ca_key).unwrap().pem()).unwrap();
        let required = |field: &str| ClientAuth {
            ca: ca_pem.clone(),
            required: true,
            field: field.to_owned(),
        };
        let tls = crate::config::ListenerTls {
            certs: vec![
                pair(&dir, "localhost", Some(required("listener.tls.client_ca"))),
                pair(
                    &dir,
                    "a.example",
                    Some(required("listener.tls.sni[0].client_ca")),
                ),
                pair(&dir, "b.example", None),
            ],
            reload_interval: std::time::Duration::ZERO,
        };
        let t = EntryTls::new(EntryCerts::load(&tls).unwrap()).unwrap();
        let (l, a, b) = (
            t.config_for(Some("localhost")),
            t.config_for(Some("a.example")),
            t.config_for(Some("b.example")),
        );
        assert!(Arc::ptr_eq(&l, &a), "one policy, one configuration");
        assert!(!Arc::ptr_eq(&l, &b));
        assert!(!Arc::ptr_eq(&l.ticketer, &b.ticketer), "ticket keys shared");
        assert!(!Arc::ptr_eq(&l.session_storage, &b.session_storage));
        assert!(
            Arc::ptr_eq(&t.config_for(None), &l),
            "no SNI: the default's"
        );
        // A CA file without a certificate.
        std::fs::write(&ca_pem, "not a certificate\n").unwrap();
        let e = EntryTls::new(EntryCerts::load(&tls).unwrap()).unwrap_err();
        assert_eq!(e.field, "listener.tls.client_ca", "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
