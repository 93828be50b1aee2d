//! Black-box test support, shared by every file in tests/: real `peerlb`
//! processes on loopback (certificates made by `peerlb certs`), free ports,
//! polling with a deadline, a small HTTP/1.1 client, raw-socket helpers and
//! an upstream app whose answers the test holds back.
//!
//! Past 800 lines: the cluster harness (start variants, logs, waits) is
//! one piece every test file uses; moving it to `support/cluster.rs` is
//! the planned split.
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
pub mod haproxy;
pub mod https;
pub mod skip;

/// Peer links that survive a loaded machine's stalls, for tests that are
/// not about failure detection: with the default 1 s QUIC idle timeout, a
/// process stalled for a second on a busy 2-core machine loses its links,
/// and a request held across the stall is replayed elsewhere.
pub const STEADY: &str = "[peer]\nkeep_alive_ms = 500\nidle_timeout_ms = 10000\n\n";

/// Gossip's phi threshold in test clusters: with 100 ms rounds the default
/// 8 marks a member dead after a stall of about 0.8 s, which a busy 2-core
/// machine produces, and views flap. 30 (about 3 s) keeps them steady; a
/// killed node is still ejected at once when its QUIC link is lost.
pub const PHI: u32 = 30;

/// Gossip's round interval in test clusters (`gossip.interval_ms`), ms.
pub const GOSSIP_INTERVAL_MS: u64 = 100;

thread_local! {
    /// Lines [`Cluster::start_gossip`] adds to the `[gossip]` table.
    static GOSSIP_LINES: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// How long gossip alone takes to mark a silent member dead in a cluster
/// started with phi threshold `phi`: chitchat's detector (0.13) declares a
/// member dead once the time since its last heartbeat exceeds `phi` times
/// the mean interval between its heartbeats, and a member's heartbeat
/// reaches each node about once per gossip round
/// ([`GOSSIP_INTERVAL_MS`]). A bound on a gossip-only detection adds its
/// margin to this.
pub fn gossip_detection(phi: u32) -> Duration {
    Duration::from_millis(u64::from(phi) * GOSSIP_INTERVAL_MS)
}

/// The ring resolution of a test cluster that sets no `[ring] vnodes`
/// (the config default).
pub fn default_vnodes() -> u32 {
    peerlb::config::RingSection::default().vnodes
}

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
///
/// Ports come from below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`, 32768 and up by default): a node binds
/// ephemeral sockets of its own (outgoing connections, the gossip
/// transport's loopback codec), and one of those could otherwise take a
/// port handed out here before the node meant for it binds it. Each test
/// process starts at an offset from its pid, so concurrent test binaries
/// rarely probe the same ports.
pub fn free_port() -> u16 {
    const LOW: u32 = 10_000;
    const HIGH: u32 = 32_000;
    static NEXT: std::sync::Mutex<Option<u32>> = std::sync::Mutex::new(None);
    let mut next = NEXT.lock().unwrap();
    let mut n = next.unwrap_or_else(|| LOW + (std::process::id() * 7919) % (HIGH - LOW));
    for _ in 0..(HIGH - LOW) {
        let port = n as u16;
        n = if n + 1 >= HIGH { LOW } else { n + 1 };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok()
        {
            *next = Some(n);
            return port;
        }
    }
    panic!("no free loopback port in {LOW}..{HIGH}");
}

/// One node's addresses.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    pub id: String,
    pub http: SocketAddr,
    pub peer: SocketAddr,
    pub gossip: SocketAddr,
    /// The node's admin API address (`admin_addr`).
    pub admin: SocketAddr,
    /// The node's SIP address (`sip_addr`, UDP and TCP); only in a
    /// cluster started with [`Cluster::start_sip`].
    pub sip: Option<SocketAddr>,
    /// The node's SIPS address (`sips_addr`, SIP over TLS); only in a
    /// cluster started with [`Cluster::start_sips`].
    pub sips: Option<SocketAddr>,
    /// The node's metrics address (`metrics_addr`); only in a cluster
    /// started with [`Cluster::start_metrics`].
    pub metrics: Option<SocketAddr>,
}

/// Client address -> admin address of every node a [`Cluster`] of this
/// test process configured.
static ADMIN_OF: std::sync::Mutex<BTreeMap<SocketAddr, SocketAddr>> =
    std::sync::Mutex::new(BTreeMap::new());

/// The admin API address of the node whose client address is `http`: the
/// one its [`Cluster`] configured, else the default of a `[[nodes]]` entry
/// without `admin_addr` (127.0.0.1 with the client port + 1000).
pub fn admin_of(http: SocketAddr) -> SocketAddr {
    if let Some(a) = ADMIN_OF.lock().unwrap().get(&http) {
        return *a;
    }
    peerlb::config::default_admin_addr(http).expect("a client port under 64536")
}

/// Which extra listeners a [`Cluster`]'s nodes have (SIP, metrics).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sip {
    /// None.
    No,
    /// Each its own `sip_addr`.
    Own,
    /// Each its own `sip_addr` and the shared SIP address.
    Shared,
    /// Each its own `sip_addr` and `sips_addr` (its certificate set by
    /// the test's TOML, `[sips]`).
    Tls,
    /// No SIP; each node its own `metrics_addr` (another TCP listener
    /// written into the `[[nodes]]` entry, as `sip_addr` is).
    Metrics,
}

/// A cluster of real `peerlb node` processes.
pub struct Cluster {
    pub dir: PathBuf,
    pub config: PathBuf,
    pub nodes: Vec<NodeInfo>,
    pub children: BTreeMap<String, Child>,
    pub shared: Option<SocketAddr>,
    /// The shared SIP address every node also listens on
    /// (`--shared-sip-listen`), from [`Cluster::start_sip_shared`].
    pub shared_sip: Option<SocketAddr>,
    /// The shared SIPS address every node also listens on
    /// (`--shared-sips-listen`), from [`Cluster::start_sips`].
    pub shared_sips: Option<SocketAddr>,
    /// Extra `peerlb` arguments every node starts with.
    pub args: Vec<String>,
    /// Sockets that keep a killed node's addresses taken until it is
    /// started again ([`Cluster::kill9`], [`Cluster::spawn`]): another
    /// process on this machine (a concurrent test binary probing for free
    /// ports) could otherwise take one meanwhile, and the restarted node
    /// would exit with "cannot bind".
    held: BTreeMap<String, Vec<socket2::Socket>>,
    /// The open file limit (soft and hard, `RLIMIT_NOFILE`) nodes are
    /// started with by [`Cluster::spawn`]; `None`: the test's own.
    pub nofile: Option<u64>,
}

impl Cluster {
    /// Writes a cluster.toml for `n` nodes (`n1`..) with `extra` TOML
    /// prepended (top-level keys and sections such as `[[rules]]` must come
    /// from `extra_tail`), creates certificates, starts every node and waits
    /// until each one's view has every node serving.
    pub fn start(tag: &str, n: usize, extra_head: &str, extra_tail: &str) -> Cluster {
        Self::start_with(tag, n, extra_head, extra_tail, false)
    }

    /// Like [`Cluster::start`], each node started with `args` added to
    /// its command line (e.g. `--log-format json`).
    pub fn start_args(
        tag: &str,
        n: usize,
        extra_head: &str,
        extra_tail: &str,
        args: &[&str],
    ) -> Cluster {
        Self::start_full(tag, n, extra_head, extra_tail, false, args, PHI, Sip::No)
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
        Self::start_full(tag, n, extra_head, extra_tail, shared, &[], PHI, Sip::No)
    }

    /// Like [`Cluster::start`], every node with a `sip_addr` too
    /// ([`NodeInfo::sip`]).
    pub fn start_sip(tag: &str, n: usize, extra_head: &str, extra_tail: &str) -> Cluster {
        Self::start_full(tag, n, extra_head, extra_tail, false, &[], PHI, Sip::Own)
    }

    /// Like [`Cluster::start_sip`], every node also on one shared SIP
    /// address with SO_REUSEPORT ([`Cluster::shared_sip`]), as `peerlb up`
    /// runs them with `sip_sprayer_addr`.
    pub fn start_sip_shared(tag: &str, n: usize, extra_head: &str, extra_tail: &str) -> Cluster {
        Self::start_full(tag, n, extra_head, extra_tail, false, &[], PHI, Sip::Shared)
    }

    /// Like [`Cluster::start_sip`], every node with a `sips_addr` too
    /// ([`NodeInfo::sips`]) and all on one shared SIPS address with
    /// SO_REUSEPORT ([`Cluster::shared_sips`]); `extra_head` or
    /// `extra_tail` gives `[sips]`.
    pub fn start_sips(tag: &str, n: usize, extra_head: &str, extra_tail: &str) -> Cluster {
        Self::start_full(tag, n, extra_head, extra_tail, false, &[], PHI, Sip::Tls)
    }

    /// Like [`Cluster::start`], every node with a `metrics_addr` too
    /// ([`NodeInfo::metrics`]).
    pub fn start_metrics(tag: &str, n: usize, extra_head: &str, extra_tail: &str) -> Cluster {
        Self::start_full(
            tag,
            n,
            extra_head,
            extra_tail,
            false,
            &[],
            PHI,
            Sip::Metrics,
        )
    }

    /// Like [`Cluster::start`] with gossip's phi threshold `phi` instead of
    /// [`PHI`]: a test that must keep a silent member in the views for a
    /// while (it lets a node die, or cuts its gossip) sets it high and
    /// relies on the QUIC path instead.
    pub fn start_phi(tag: &str, n: usize, phi: u32, extra_head: &str, extra_tail: &str) -> Cluster {
        Self::start_full(tag, n, extra_head, extra_tail, false, &[], phi, Sip::No)
    }

    /// Like [`Cluster::start`], with `gossip_lines` (`key = value` lines)
    /// added to the `[gossip]` table.
    pub fn start_gossip(tag: &str, n: usize, gossip_lines: &str) -> Cluster {
        GOSSIP_LINES.with(|g| *g.borrow_mut() = gossip_lines.to_owned());
        let c = Self::start_full(tag, n, "", "", false, &[], PHI, Sip::No);
        GOSSIP_LINES.with(|g| g.borrow_mut().clear());
        c
    }

    #[allow(clippy::too_many_arguments)]
    fn start_full(
        tag: &str,
        n: usize,
        extra_head: &str,
        extra_tail: &str,
        shared: bool,
        args: &[&str],
        phi: u32,
        sip: Sip,
    ) -> Cluster {
        let dir = temp_dir(tag);
        let nodes: Vec<NodeInfo> = (1..=n)
            .map(|i| NodeInfo {
                id: format!("n{i}"),
                http: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
                peer: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
                gossip: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
                admin: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
                sip: matches!(sip, Sip::Own | Sip::Shared | Sip::Tls)
                    .then(|| format!("127.0.0.1:{}", free_port()).parse().unwrap()),
                sips: (sip == Sip::Tls)
                    .then(|| format!("127.0.0.1:{}", free_port()).parse().unwrap()),
                metrics: (sip == Sip::Metrics)
                    .then(|| format!("127.0.0.1:{}", free_port()).parse().unwrap()),
            })
            .collect();
        ADMIN_OF
            .lock()
            .unwrap()
            .extend(nodes.iter().map(|n| (n.http, n.admin)));
        let gossip_lines = GOSSIP_LINES.with(|g| g.borrow().clone());
        let mut text = format!(
            "name = \"test-{tag}\"\n{extra_head}\n[gossip]\ninterval_ms = {GOSSIP_INTERVAL_MS}\nphi_threshold = {phi}\n{gossip_lines}\n\n"
        );
        for node in &nodes {
            text += &format!(
                "[[nodes]]\nid = \"{}\"\nhttp_addr = \"{}\"\npeer_addr = \"{}\"\ngossip_addr = \"{}\"\nadmin_addr = \"{}\"\n\n",
                node.id, node.http, node.peer, node.gossip, node.admin
            );
            if let Some(sip) = node.sip {
                text.insert_str(text.len() - 1, &format!("sip_addr = \"{sip}\"\n"));
            }
            if let Some(m) = node.metrics {
                text.insert_str(text.len() - 1, &format!("metrics_addr = \"{m}\"\n"));
            }
            if let Some(s) = node.sips {
                text.insert_str(text.len() - 1, &format!("sips_addr = \"{s}\"\n"));
            }
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
            shared_sip: (sip == Sip::Shared)
                .then(|| format!("127.0.0.1:{}", free_port()).parse().unwrap()),
            shared_sips: (sip == Sip::Tls)
                .then(|| format!("127.0.0.1:{}", free_port()).parse().unwrap()),
            args: args.iter().map(|a| a.to_string()).collect(),
            held: BTreeMap::new(),
            nofile: None,
        };
        for i in 0..n {
            c.spawn(i);
        }
        c.wait_converged(n);
        c
    }

    /// Starts node `i` (again).
    pub fn spawn(&mut self, i: usize) {
        // Released just before the node binds them.
        self.held.remove(&self.nodes[i].id);
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
        if let Some(s) = self.shared_sip {
            cmd.arg("--shared-sip-listen").arg(s.to_string());
        }
        if let Some(s) = self.shared_sips {
            cmd.arg("--shared-sips-listen").arg(s.to_string());
        }
        cmd.args(&self.args);
        if let Some(n) = self.nofile {
            use std::os::unix::process::CommandExt as _;
            let lim = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            // SAFETY: setrlimit(2) is async-signal-safe and reads one
            // rlimit from the pointer it is given, in the forked child.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
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

    /// Waits (up to 60 s: a deadline, not a delay) until every running node
    /// serves `n` members.
    pub fn wait_converged(&self, n: usize) {
        let running: Vec<NodeInfo> = self
            .nodes
            .iter()
            .filter(|x| self.children.contains_key(&x.id))
            .cloned()
            .collect();
        self.wait_until(Duration::from_secs(60), || {
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

    /// After a restart: waits (up to 60 s) until every running node serves
    /// `n` members and all have the same view (`view_version` covers the
    /// members' generations, so a peer's stale view of the node before its
    /// restart does not count).
    pub fn wait_same_view(&self, n: usize) {
        self.wait_converged(n);
        let running: Vec<SocketAddr> = self
            .nodes
            .iter()
            .filter(|x| self.children.contains_key(&x.id))
            .map(|x| x.http)
            .collect();
        let mut seen = Vec::new();
        self.wait_until(Duration::from_secs(60), || {
            seen = running
                .iter()
                .map(|a| status(*a).map(|s| (s["view_version"].to_string(), s["serving"].clone())))
                .collect();
            seen.iter().all(|v| v.is_some() && *v == seen[0])
        })
        .unwrap_or_else(|_| panic!("the nodes' views differ: {seen:?}"));
    }

    /// Polls `f` every 50 ms until it holds or `limit` passes (see [`poll`]).
    pub fn wait_until(&self, limit: Duration, f: impl FnMut() -> bool) -> Result<(), ()> {
        poll(limit, f)
    }

    /// `kill -9` of a node.
    pub fn kill9(&mut self, id: &str) {
        let mut c = self.children.remove(id).unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
        self.hold(id);
    }

    /// Takes a stopped node's addresses (best effort; its SIP address too): its TCP ports
    /// bound but not listening, so connections to them are still refused,
    /// and its UDP ports bound, so datagrams to them are dropped unread.
    fn hold(&mut self, id: &str) {
        use socket2::{Domain, Socket, Type};
        let node = self.node(id).clone();
        let mut held = Vec::new();
        for addr in [node.http, node.admin]
            .into_iter()
            .chain(node.sip)
            .chain(node.metrics)
        {
            let Ok(s) = Socket::new(Domain::for_address(addr), Type::STREAM, None) else {
                continue;
            };
            if s.set_reuse_address(true).is_ok() && s.bind(&addr.into()).is_ok() {
                held.push(s);
            }
        }
        for addr in [node.peer, node.gossip].into_iter().chain(node.sip) {
            if let Ok(s) = std::net::UdpSocket::bind(addr) {
                held.push(s.into());
            }
        }
        self.held.insert(id.to_owned(), held);
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

/// Polls `f` every 50 ms until it holds (`Ok`) or `limit` passes (`Err`):
/// the one way tests wait for a condition (never a fixed sleep). Blocking:
/// from async code prefer [`eventually`].
pub fn poll(limit: Duration, mut f: impl FnMut() -> bool) -> Result<(), ()> {
    let start = std::time::Instant::now();
    loop {
        if f() {
            return Ok(());
        }
        if start.elapsed() >= limit {
            return Err(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// [`poll`] for async tests: checks `f` every 50 ms on the runtime's timer
/// (blocking calls inside `f`, such as [`status`], are short).
pub async fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> Result<(), ()> {
    let start = std::time::Instant::now();
    loop {
        if f() {
            return Ok(());
        }
        if start.elapsed() >= limit {
            return Err(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The first executable called `name` on `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Reads a raw socket until the server closes it (or one read waits 20 s);
/// returns what it sent and whether it closed (EOF or reset).
pub fn read_until_closed(s: &mut std::net::TcpStream) -> (String, bool) {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (String::from_utf8_lossy(&out).into_owned(), true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return (String::from_utf8_lossy(&out).into_owned(), true);
            }
            Err(_) => return (String::from_utf8_lossy(&out).into_owned(), false),
        }
    }
}

/// The `Content-Length` of a raw HTTP/1.1 head (its lines as text), if
/// it has one that parses.
pub fn content_length(head: &str) -> Option<usize> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse().ok())?
    })
}

/// Writes `raw` (a whole request, as bytes on the wire) on a fresh
/// connection to `addr` and reads the answer until the server closes.
pub fn raw_exchange(addr: SocketAddr, raw: &[u8]) -> (String, bool) {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(raw).unwrap();
    read_until_closed(&mut s)
}

/// An upstream app in the test process (`app = "http://<addr>"`): answers
/// `app <method> <path and query> <body length>`; a path starting with
/// `/hold` is held (no response head) until [`GatedApp::release`]. It
/// counts requests by path and its TCP connections.
#[derive(Clone)]
pub struct GatedApp {
    pub addr: SocketAddr,
    gate: tokio::sync::watch::Sender<bool>,
    arrived: std::sync::Arc<std::sync::Mutex<BTreeMap<String, u64>>>,
    pub conns: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl GatedApp {
    /// Binds on loopback and serves until the test's runtime ends.
    pub async fn start() -> GatedApp {
        use hyper::service::service_fn;
        use std::sync::atomic::Ordering;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let app = GatedApp {
            addr: l.local_addr().unwrap(),
            gate: tokio::sync::watch::channel(false).0,
            arrived: Default::default(),
            conns: Default::default(),
        };
        let a = app.clone();
        tokio::spawn(async move {
            loop {
                let (s, _) = l.accept().await.unwrap();
                a.conns.fetch_add(1, Ordering::Relaxed);
                let a = a.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let a = a.clone();
                        async move {
                            let target = req.uri().to_string();
                            let method = req.method().to_string();
                            *a.arrived
                                .lock()
                                .unwrap()
                                .entry(req.uri().path().to_owned())
                                .or_default() += 1;
                            let len = match req.into_body().collect().await {
                                Ok(b) => b.to_bytes().len(),
                                Err(_) => return Err("body failed"),
                            };
                            if target.starts_with("/hold") {
                                let mut rx = a.gate.subscribe();
                                let _ = rx.wait_for(|open| *open).await;
                            }
                            Ok(http::Response::new(Full::new(Bytes::from(format!(
                                "app {method} {target} {len}"
                            )))))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        app
    }

    /// Lets every held request (and every later one) answer.
    pub fn release(&self) {
        self.gate.send_replace(true);
    }

    /// How many requests for `path` (without query) reached the app.
    pub fn arrived(&self, path: &str) -> u64 {
        self.arrived.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    /// How many requests reached the app, all paths.
    pub fn arrived_total(&self) -> u64 {
        self.arrived.lock().unwrap().values().sum()
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

/// `GET /_peerlb/status` of the node whose client address is `addr`, on
/// its admin address ([`admin_of`]) (blocking; None if unreachable).
pub fn status(addr: SocketAddr) -> Option<serde_json::Value> {
    use std::io::{Read, Write};
    let addr = admin_of(addr);
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /_peerlb/status HTTP/1.0\r\nhost: 127.0.0.1\r\n\r\n")
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

/// The counter `name` of the node whose client address is `addr`;
/// panics when the node does not answer or has no such counter (never 0
/// for a missing one).
pub fn counter(addr: std::net::SocketAddr, name: &str) -> u64 {
    let s = status(addr).unwrap_or_else(|| panic!("{addr} does not answer its status"));
    s["counters"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("{addr}: no counter {name} in {}", s["counters"]))
}
