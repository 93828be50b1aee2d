//! Black-box test support: real `peerlb` processes on loopback and a small
//! HTTP/1.1 client.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use peerlb::{NodeId, Ring};

pub mod forge;

/// The default rules: query `user`, else header `x-user`, else cookie `session`.
pub const USER_RULES: &str = "[[rules]]\nname = \"user\"\nextract = [{ query = \"user\" }, { header = \"x-user\" }, { cookie = \"session\" }]\n";

/// The `peerlb` binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_peerlb")
}

/// A fresh directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "peerlb-test-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A free loopback port for TCP and UDP (bound then released), never one
/// this test process handed out before: the kernel may offer a released
/// port again, and two addresses of one cluster must differ.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let t = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = t.local_addr().unwrap().port();
        let mut given = GIVEN.lock().unwrap();
        if !given.contains(&port) && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
}

/// One node's addresses.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    pub id: String,
    pub http: SocketAddr,
    pub peer: SocketAddr,
    pub gossip: SocketAddr,
}

/// A cluster of real `peerlb node` processes.
pub struct Cluster {
    pub dir: PathBuf,
    pub config: PathBuf,
    pub nodes: Vec<NodeInfo>,
    pub children: BTreeMap<String, Child>,
    pub shared: Option<SocketAddr>,
}

impl Cluster {
    /// Writes a cluster.toml for `n` nodes (`n1`..) with `extra` TOML
    /// prepended (top-level keys and sections such as `[[rules]]` must come
    /// from `extra_tail`), creates certificates, starts every node and waits
    /// until each one's view has every node serving.
    pub fn start(tag: &str, n: usize, extra_head: &str, extra_tail: &str) -> Cluster {
        Self::start_with(tag, n, extra_head, extra_tail, false)
    }

    /// Like [`Cluster::start`]; with `shared`, every node also listens on one
    /// shared SO_REUSEPORT address (the kernel as sprayer).
    pub fn start_with(
        tag: &str,
        n: usize,
        extra_head: &str,
        extra_tail: &str,
        shared: bool,
    ) -> Cluster {
        let dir = temp_dir(tag);
        let nodes: Vec<NodeInfo> = (1..=n)
            .map(|i| NodeInfo {
                id: format!("n{i}"),
                http: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
                peer: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
                gossip: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
            })
            .collect();
        let mut text =
            format!("name = \"test-{tag}\"\n{extra_head}\n[gossip]\ninterval_ms = 100\n\n");
        for node in &nodes {
            text += &format!(
                "[[nodes]]\nid = \"{}\"\nhttp_addr = \"{}\"\npeer_addr = \"{}\"\ngossip_addr = \"{}\"\n\n",
                node.id, node.http, node.peer, node.gossip
            );
        }
        text += extra_tail;
        let config = dir.join("cluster.toml");
        std::fs::write(&config, text).unwrap();
        let out = Command::new(bin())
            .args(["certs", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "peerlb certs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let shared = shared.then(|| format!("127.0.0.1:{}", free_port()).parse().unwrap());
        let mut c = Cluster {
            dir,
            config,
            nodes,
            children: BTreeMap::new(),
            shared,
        };
        for i in 0..n {
            c.spawn(i);
        }
        c.wait_converged(n);
        c
    }

    /// Starts node `i` (again).
    pub fn spawn(&mut self, i: usize) {
        let node = &self.nodes[i];
        let log = std::fs::File::create(self.dir.join(format!("{}.log", node.id))).unwrap();
        let mut cmd = Command::new(bin());
        cmd.args(["node", "--node", &node.id, "--config"])
            .arg(&self.config)
            .env("RUST_LOG", "info,chitchat=warn,quinn=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(s) = self.shared {
            cmd.arg("--shared-listen").arg(s.to_string());
        }
        let child = cmd.spawn().unwrap();
        self.children.insert(node.id.clone(), child);
    }

    /// The node's log so far.
    pub fn log(&self, id: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{id}.log"))).unwrap_or_default()
    }

    pub fn node(&self, id: &str) -> &NodeInfo {
        self.nodes.iter().find(|n| n.id == id).unwrap()
    }

    /// Waits (up to 20 s) until every running node serves `n` members.
    pub fn wait_converged(&self, n: usize) {
        let running: Vec<NodeInfo> = self
            .nodes
            .iter()
            .filter(|x| self.children.contains_key(&x.id))
            .cloned()
            .collect();
        self.wait_until(Duration::from_secs(20), || {
            running
                .iter()
                .all(|x| serving(x.http).map(|s| s.len()) == Some(n))
        })
        .unwrap_or_else(|_| {
            let logs: Vec<String> = running
                .iter()
                .map(|x| format!("--- {}:\n{}", x.id, self.log(&x.id)))
                .collect();
            panic!(
                "cluster did not converge to {n} serving members\n{}",
                logs.join("\n")
            )
        });
    }

    /// Polls `f` every 50 ms until it holds or `limit` passes.
    pub fn wait_until(&self, limit: Duration, mut f: impl FnMut() -> bool) -> Result<(), ()> {
        let start = std::time::Instant::now();
        while start.elapsed() < limit {
            if f() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(())
    }

    /// `kill -9` of a node.
    pub fn kill9(&mut self, id: &str) {
        let mut c = self.children.remove(id).unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// SIGTERM to a node; returns its child handle to wait on.
    pub fn sigterm(&mut self, id: &str) -> Child {
        let c = self.children.remove(id).unwrap();
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        c
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in self.children.values_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The serving member ids in `addr`'s view (blocking; None if unreachable).
pub fn serving(addr: SocketAddr) -> Option<Vec<String>> {
    let v = status(addr)?;
    Some(
        v["serving"]
            .as_array()?
            .iter()
            .filter_map(|x| x.as_str().map(str::to_owned))
            .collect(),
    )
}

/// `GET /_peerlb/status` of one node (blocking; None if unreachable).
pub fn status(addr: SocketAddr) -> Option<serde_json::Value> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /_peerlb/status HTTP/1.0\r\nhost: t\r\n\r\n")
        .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf);
    let body = text.split("\r\n\r\n").nth(1)?;
    serde_json::from_str(body.trim()).ok()
}

/// A response as the tests see it.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn served_by(&self) -> &str {
        self.header("peerlb-served-by").unwrap_or("")
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {:?}", self.body))
    }
    /// Every Set-Cookie value.
    pub fn set_cookies(&self) -> Vec<String> {
        self.headers
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_owned))
            .collect()
    }
}

/// Error prefix for a request that was never sent (the server had closed
/// the connection before it).
pub const NOT_SENT: &str = "not sent";

/// One keep-alive HTTP/1.1 client connection.
pub struct Conn {
    pub addr: SocketAddr,
    pub local: SocketAddr,
    send: SendRequest<Full<Bytes>>,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let s = tokio::net::TcpStream::connect(addr).await?;
        let local = s.local_addr()?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(conn);
        Ok(Conn { addr, local, send })
    }

    /// Sends a request; `Err` when the connection failed.
    pub async fn request(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Resp, String> {
        self.send
            .ready()
            .await
            .map_err(|e| format!("{NOT_SENT}: {e}"))?;
        let mut b = http::Request::builder()
            .method(method)
            .uri(target)
            .header("host", self.addr.to_string());
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let resp = self
            .send
            .send_request(b.body(Full::new(body)).unwrap())
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(Resp {
            status,
            headers,
            body,
        })
    }

    pub async fn get(&mut self, target: &str, headers: &[(&str, &str)]) -> Result<Resp, String> {
        self.request("GET", target, headers, Bytes::new()).await
    }
}

/// One request on a fresh connection.
pub async fn get(addr: SocketAddr, target: &str, headers: &[(&str, &str)]) -> Resp {
    let mut c = Conn::open(addr)
        .await
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    c.get(target, headers)
        .await
        .unwrap_or_else(|e| panic!("GET {target} via {addr}: {e}"))
}

/// Path of the test's working directory for extra files.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// The ring every node builds for `ids` (equal weights) with `vnodes`.
pub fn ring(ids: &[&str], vnodes: u32) -> Ring {
    let nodes: Vec<(NodeId, u32)> = ids.iter().map(|id| (NodeId::from(*id), 100)).collect();
    Ring::build(&nodes, vnodes)
}

/// The first `user` value (u0, u1, ...) whose owner is `pred`.
pub fn user_where(ring: &Ring, pred: impl Fn(&str) -> bool) -> String {
    (0..10_000)
        .map(|i| format!("u{i}"))
        .find(|u| pred(ring.owner(u).unwrap()))
        .expect("some key matches")
}

pub fn counter(addr: std::net::SocketAddr, name: &str) -> u64 {
    status(addr).expect("status")["counters"][name]
        .as_u64()
        .unwrap()
}
