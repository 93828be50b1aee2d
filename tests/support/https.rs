//! HTTPS helpers of the entry tests (tests/entry.rs, tests/client_certs.rs):
//! self-signed certificates, curl over HTTPS, an app that echoes the
//! forwarding headers it got.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;

use super::which;

/// Writes a self-signed certificate for `names` and its key as
/// `<stem>.pem` / `<stem>.key` in `dir`: (cert, key).
pub fn self_signed(dir: &Path, stem: &str, names: &[&str]) -> (PathBuf, PathBuf) {
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    let cert = params.self_signed(&key).unwrap();
    let (c, k) = (
        dir.join(format!("{stem}.pem")),
        dir.join(format!("{stem}.key")),
    );
    // Written beside and renamed, as a certificate manager replaces files:
    // a reader never sees half a file.
    for (path, text) in [(&c, cert.pem()), (&k, key.serialize_pem())] {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }
    (c, k)
}

/// curl, or a panic saying how to get it (.ci/run installs it).
pub fn curl() -> PathBuf {
    which("curl").expect("curl is needed for the HTTPS tests (apt-get install -y curl)")
}

/// `curl https://<name>:<port><target>` resolved to 127.0.0.1 and trusting
/// only `ca`: Ok((status, headers text, body)) or Err(curl's exit code and
/// message).
pub fn curl_https(
    name: &str,
    addr: SocketAddr,
    target: &str,
    ca: &Path,
    extra: &[&str],
) -> Result<(u16, String, String), (i32, String)> {
    let out = Command::new(curl())
        .args([
            "-sS",
            "--http1.1",
            "--max-time",
            "10",
            "-D",
            "-",
            "--resolve",
        ])
        .arg(format!("{name}:{}:127.0.0.1", addr.port()))
        .arg("--cacert")
        .arg(ca)
        .args(extra)
        .arg(format!("https://{name}:{}{target}", addr.port()))
        .output()
        .unwrap();
    if !out.status.success() {
        return Err((
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, head.to_ascii_lowercase(), body.to_owned()))
}

/// An upstream app answering, as JSON, the forwarding headers it got.
pub async fn echo_app() -> SocketAddr {
    use hyper::service::service_fn;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                let svc = service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                    let lines = |n: &str| -> Vec<String> {
                        req.headers()
                            .get_all(n)
                            .iter()
                            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                            .collect()
                    };
                    let v = serde_json::json!({
                        "x-forwarded-proto": lines("x-forwarded-proto"),
                        "forwarded": lines("forwarded"),
                        "x-forwarded-for": lines("x-forwarded-for"),
                        "x-forwarded-client-cert": lines("x-forwarded-client-cert"),
                    });
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from(
                        v.to_string(),
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}
