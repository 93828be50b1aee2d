//! The hop's floor: the smallest program of peerlb's design, the
//! `hop-floor` contender of `bench/compare.py` (docs/performance.md, "The
//! floor"). An entry process serves HTTP/1.1 with hyper on one
//! `current_thread` runtime and, for every request, opens one quinn
//! bidirectional stream to an owner process, writes the method and the
//! target, finishes the stream and reads the answer to its end; the owner
//! answers every stream with a fixed 200-byte body. TLS 1.3 on the QUIC
//! connection (an rcgen certificate, one handshake); no routing, headers,
//! metrics or logs. Every peerlb hop figure is read against it.
//!
//! ```text
//! hop_floor certs DIR                          # DIR/cert.der, DIR/key.der
//! hop_floor owner DIR PEER_ADDR                # QUIC server on PEER_ADDR
//! hop_floor entry DIR HTTP_ADDR PEER_ADDR      # HTTP/1.1 on HTTP_ADDR
//! ```
//!
//! Built by `bench/compare.sh` (`cargo build --release --bench hop_floor`);
//! run by `cargo bench` it prints this usage and exits.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The owner's answer to every stream.
const BODY: [u8; 200] = [b'x'; 200];
/// Streams a peer may open at once (quinn's default is 100: the 128
/// connections of the benchmark's sweep would wait for one).
const STREAMS: u32 = 1024;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match args.as_slice() {
        ["certs", dir] => certs(Path::new(dir)),
        ["owner", dir, peer] => rt.block_on(owner(Path::new(dir), parse(peer))),
        ["entry", dir, http, peer] => rt.block_on(entry(Path::new(dir), parse(http), parse(peer))),
        _ => eprintln!(
            "usage: hop_floor certs DIR | owner DIR PEER_ADDR | entry DIR HTTP_ADDR PEER_ADDR"
        ),
    }
}

fn parse(addr: &str) -> SocketAddr {
    addr.parse().expect("an address (IP:PORT)")
}

fn files(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("cert.der"), dir.join("key.der"))
}

/// A self-signed certificate for `localhost`, which the owner serves and
/// the entry trusts.
fn certs(dir: &Path) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("certificate");
    let (cert, key) = files(dir);
    std::fs::create_dir_all(dir).expect("certificate directory");
    std::fs::write(cert, ck.cert.der()).expect("write cert.der");
    std::fs::write(key, ck.key_pair.serialize_der()).expect("write key.der");
}

fn transport() -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_bidi_streams(STREAMS.into());
    // Kept alive while idle: in a full `bench/compare.py` run the other
    // contenders' measurements leave the floor idle for longer than
    // quinn's 30 s idle timeout, and the entry, which dials once, then
    // answered every later request with an error. A ping every 5 s costs
    // nothing per request.
    t.keep_alive_interval(Some(std::time::Duration::from_secs(5)));
    Arc::new(t)
}

fn tls13() -> rustls::ConfigBuilder<rustls::ServerConfig, rustls::WantsVerifier> {
    rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
}

async fn owner(dir: &Path, addr: SocketAddr) {
    let (cert, key) = files(dir);
    let cert = CertificateDer::from(std::fs::read(cert).expect("cert.der"));
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        std::fs::read(key).expect("key.der"),
    ));
    let tls = tls13()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .expect("server TLS");
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(
        quinn::crypto::rustls::QuicServerConfig::try_from(tls).expect("QUIC TLS"),
    ));
    config.transport_config(transport());
    let endpoint = quinn::Endpoint::server(config, addr).expect("bind the owner");
    while let Some(incoming) = endpoint.accept().await {
        tokio::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                tokio::spawn(async move {
                    if recv.read_to_end(64 * 1024).await.is_ok() {
                        let _ = send.write_all(&BODY).await;
                        let _ = send.finish();
                    }
                });
            }
        });
    }
}

async fn entry(dir: &Path, http: SocketAddr, peer: SocketAddr) {
    let mut roots = rustls::RootCertStore::empty();
    let cert = std::fs::read(files(dir).0).expect("cert.der");
    roots.add(CertificateDer::from(cert)).expect("root");
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .expect("TLS 1.3")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut config = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("QUIC TLS"),
    ));
    config.transport_config(transport());
    let mut endpoint =
        quinn::Endpoint::client("127.0.0.1:0".parse().expect("address")).expect("bind the entry");
    endpoint.set_default_client_config(config);
    // The owner may start after the entry: one connection, once it answers.
    let conn = loop {
        match endpoint.connect(peer, "localhost").expect("connect").await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let listener = tokio::net::TcpListener::bind(http)
        .await
        .expect("bind HTTP");
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let conn = conn.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let conn = conn.clone();
                async move { forward(&conn, req).await }
            });
            let io = hyper_util::rt::TokioIo::new(tcp);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
}

/// One request over one stream: the method and the target out, the
/// owner's answer read to its end and returned as a 200.
async fn forward(
    conn: &quinn::Connection,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, quinn::ConnectionError> {
    let (mut send, mut recv) = conn.open_bi().await?;
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let head = format!("{} {}", req.method(), target);
    let answer = async {
        send.write_all(head.as_bytes()).await.ok()?;
        send.finish().ok()?;
        recv.read_to_end(64 * 1024).await.ok()
    };
    let status = |s: u16| Response::builder().status(s);
    Ok(match answer.await {
        Some(body) => status(200).body(Full::new(Bytes::from(body))),
        None => status(502).body(Full::new(Bytes::new())),
    }
    .expect("a response"))
}
