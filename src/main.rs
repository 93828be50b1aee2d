//! The `peerlb` command line: `node`, `up`, `certs`, `check-config`, `route`, `app`, `keyring`.

mod keyring_cmd;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use peerlb::config::{EXIT_CONFIG, NodeConfig};
use peerlb::{ClusterFile, Env, Node, Overrides, Source, explain, tls};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// peerlb: a self-balancing peer cluster node.
#[derive(Parser)]
#[command(name = "peerlb", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one node of the cluster.
    Node(NodeArgs),
    /// Start every node of the cluster as a child process on this host,
    /// all sharing the sprayer address with SO_REUSEPORT.
    Up {
        /// cluster.toml to use (default: the embedded local 3-node cluster).
        #[arg(long, env = "PEERLB_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Create the cluster CA and node certificates (keeps existing files).
    Certs {
        /// cluster.toml to use (default: the embedded local 3-node cluster).
        #[arg(long, env = "PEERLB_CONFIG")]
        config: Option<PathBuf>,
        /// Output directory (default: the config's tls.dir).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Node ids (default: every node of the config). Repeatable.
        #[arg(long = "node")]
        nodes: Vec<String>,
    },
    /// Explain the owner the engine picks for one request (no network).
    Route(RouteArgs),
    /// Serve the built-in demo app alone over plain HTTP/1.1 (no cluster,
    /// no peers): a backend for benchmarks (bench/compare.sh).
    App {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:9001")]
        listen: std::net::SocketAddr,
        /// Name the app reports as serving node and entry.
        #[arg(long, default_value = "app")]
        name: String,
    },
    /// Gossip key rotation on the nodes of this host (admin API): new,
    /// list, install KEY, use FINGERPRINT, remove FINGERPRINT.
    Keyring(keyring_cmd::KeyringArgs),
    /// Validate cluster.toml and exit: 0 when valid, 64 when not.
    CheckConfig {
        /// cluster.toml to check (default: the embedded one).
        #[arg(long, env = "PEERLB_CONFIG")]
        config: Option<PathBuf>,
        /// Also validate the per-node view of this node id.
        #[arg(long, env = "PEERLB_NODE")]
        node: Option<String>,
    },
}

#[derive(Args)]
struct RouteArgs {
    /// cluster.toml whose policy, rules and nodes to use (default: the embedded one).
    #[arg(long, env = "PEERLB_CONFIG")]
    config: Option<PathBuf>,
    /// The request: "METHOD /target", e.g. "GET /cart?user=alice".
    #[arg(long)]
    request: String,
    /// A request header "Name: value" (repeatable).
    #[arg(short = 'H', long = "header")]
    headers: Vec<String>,
    /// A request cookie "name=value" (repeatable).
    #[arg(long = "cookie")]
    cookies: Vec<String>,
    /// The client address the entry node sees.
    #[arg(long, default_value = "127.0.0.1:40000")]
    from: std::net::SocketAddr,
    /// The members in view: "n1,n2=weight:200/load:40/inflight:3,n3=down"
    /// (default: every node of the config, serving, with its weight).
    #[arg(long)]
    members: Option<String>,
    /// The entry node (default: the first member).
    #[arg(long)]
    entry: Option<String>,
    /// Override the config's policy, e.g. "weighted-round-robin".
    #[arg(long)]
    policy: Option<String>,
    /// Also print the owners of N such requests in a row.
    #[arg(long, default_value_t = 0)]
    count: usize,
    /// Seed for random policies.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct NodeArgs {
    /// cluster.toml to use (default: the embedded local 3-node cluster).
    #[arg(long, env = "PEERLB_CONFIG")]
    config: Option<PathBuf>,
    /// This node's id.
    #[arg(long, env = "PEERLB_NODE")]
    node: String,
    /// Override this node's client HTTP address.
    #[arg(long, env = "PEERLB_HTTP_ADDR")]
    http_addr: Option<String>,
    /// Override this node's peer QUIC address.
    #[arg(long, env = "PEERLB_PEER_ADDR")]
    peer_addr: Option<String>,
    /// Override this node's gossip address.
    #[arg(long, env = "PEERLB_GOSSIP_ADDR")]
    gossip_addr: Option<String>,
    /// Override this node's weight (100 = one share).
    #[arg(long, env = "PEERLB_WEIGHT")]
    weight: Option<u32>,
    /// Override the app ("builtin" or an http:// URL).
    #[arg(long, env = "PEERLB_APP")]
    app: Option<String>,
    /// Also accept clients on this address, shared with SO_REUSEPORT.
    #[arg(long, env = "PEERLB_SHARED_LISTEN")]
    shared_listen: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.cmd, Cmd::Route(_) | Cmd::CheckConfig { .. }) {
        // Printing commands end quietly when their reader goes away
        // (`peerlb route ... | head`), like other Unix tools.
        // SAFETY: restoring the default disposition of one signal before
        // any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    init_tracing();
    let code = match cli.cmd {
        Cmd::Node(a) => run_node(a),
        Cmd::Up { config } => up(config.as_deref()),
        Cmd::Certs { config, dir, nodes } => certs(config.as_deref(), dir, nodes),
        Cmd::CheckConfig { config, node } => check_config(config.as_deref(), node.as_deref()),
        Cmd::Route(a) => route(a),
        Cmd::App { listen, name } => app(listen, name),
        Cmd::Keyring(a) => keyring_cmd::run(a),
    };
    match code {
        Ok(c) => ExitCode::from(c),
        Err(e) => {
            eprintln!("peerlb: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,chitchat=warn,quinn=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// A configuration error: printed with its field path, exit status 64.
fn config_error(e: impl std::fmt::Display) -> u8 {
    eprintln!("peerlb: invalid configuration: {e}");
    EXIT_CONFIG as u8
}

fn load(config: Option<&Path>) -> Result<(Source, ClusterFile), u8> {
    let src = Source::load(config).map_err(config_error)?;
    let file = src.parse().map_err(config_error)?;
    Ok((src, file))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    // One current_thread runtime: quinn then packs several requests per
    // datagram (DESIGN.md, performance notes).
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

fn run_node(a: NodeArgs) -> anyhow::Result<u8> {
    let (src, file) = match load(a.config.as_deref()) {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let ov = Overrides {
        http_addr: a.http_addr,
        peer_addr: a.peer_addr,
        gossip_addr: a.gossip_addr,
        weight: a.weight,
        app: a.app,
        shared_listen: a.shared_listen,
    };
    let config = match file.validate(&src, &a.node, &ov) {
        Ok(c) => c,
        Err(e) => return Ok(config_error(e)),
    };
    // TLS files are configuration too: check them before binding anything.
    if let Err(e) = tls::TlsMaterial::load(&config.tls.ca, &config.tls.cert, &config.tls.key) {
        return Ok(config_error(format!(
            "tls: {e} (create the certificates with `peerlb certs`)"
        )));
    }
    let keyring = match peerlb::keyring::Keyring::load(&config.tls.gossip_keyring) {
        Ok(k) => k,
        Err(e) => return Ok(config_error(format!("tls.gossip_keyring: {e}"))),
    };
    let rt = runtime()?;
    rt.block_on(async move {
        let env = Env::bind(&config, keyring)?;
        let node = Node::build(config, env)?;
        node.run(shutdown_signal()).await?;
        anyhow::Ok(0)
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: leaving the cluster"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: leaving the cluster"),
    }
}

fn app(listen: std::net::SocketAddr, name: String) -> anyhow::Result<u8> {
    runtime()?.block_on(async move {
        let l = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        tracing::info!(addr = %listen, "serving the built-in app");
        tokio::select! {
            _ = peerlb::serve_app(l, name) => {}
            _ = shutdown_signal() => {}
        }
        anyhow::Ok(0)
    })
}

fn route(a: RouteArgs) -> anyhow::Result<u8> {
    let (_, c) = match load_cluster(a.config.as_deref()) {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let usage = |e: &dyn std::fmt::Display| {
        eprintln!("peerlb route: {e}");
        EXIT_CONFIG as u8
    };
    let policy = match &a.policy {
        Some(p) => match p.parse() {
            Ok(p) => p,
            Err(e) => return Ok(usage(&format!("--policy: {p:?}: {e}"))),
        },
        None => c.policy,
    };
    let members = match &a.members {
        Some(spec) => match explain::parse_members(spec) {
            Ok(m) => m,
            Err(e) => return Ok(usage(&e)),
        },
        None => c
            .nodes
            .iter()
            .map(|n| {
                let mut m = explain::parse_members(&n.id).expect("validated node id");
                m[0].weight = n.weight;
                m.remove(0)
            })
            .collect(),
    };
    let entry = a
        .entry
        .clone()
        .or_else(|| members.first().map(|m| m.id.to_string()))
        .unwrap_or_default();
    let req = match explain::parse_request(&a.request, &a.headers, &a.cookies) {
        Ok(r) => r,
        Err(e) => return Ok(usage(&e)),
    };
    let setup = explain::Setup {
        policy,
        rules: c.rules,
        options: c.router,
        vnodes: c.vnodes,
        members,
        entry,
        seed: a.seed,
    };
    let e = match explain::explain(setup, &req, a.from, a.count) {
        Ok(e) => e,
        Err(e) => return Ok(usage(&e)),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&e)?);
    } else {
        print!("{e}");
    }
    Ok(0)
}

fn check_config(config: Option<&Path>, node: Option<&str>) -> anyhow::Result<u8> {
    let (src, file) = match load(config) {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let nodes = match file.check(&src) {
        Ok(n) => n,
        Err(e) => return Ok(config_error(e)),
    };
    if let Some(id) = node
        && let Err(e) = file.validate(&src, id, &Overrides::default())
    {
        return Ok(config_error(e));
    }
    let rules = match &file.rules_file {
        Some(f) => format!("rules from {f}"),
        None => format!("{} rules", file.rules.len()),
    };
    println!(
        "{}: valid: cluster {:?}, {} nodes, policy {}, {rules}",
        src.origin,
        file.name,
        nodes.len(),
        file.policy,
    );
    Ok(0)
}

/// The per-node config of the first node: the cluster-wide values (TLS
/// directory, node list) `up` and `certs` need.
fn first_node(src: &Source, file: &ClusterFile) -> Result<NodeConfig, u8> {
    let nodes = file.check(src).map_err(config_error)?;
    file.validate(src, &nodes[0].id, &Overrides::default())
        .map_err(config_error)
}

/// Loads the file and validates it for its first node (the cluster-wide
/// values); `Err` is the exit status, the error already printed.
fn load_cluster(config: Option<&Path>) -> Result<(ClusterFile, NodeConfig), u8> {
    let (src, file) = load(config)?;
    let c = first_node(&src, &file)?;
    Ok((file, c))
}

fn certs(config: Option<&Path>, dir: Option<PathBuf>, nodes: Vec<String>) -> anyhow::Result<u8> {
    let (_, c) = match load_cluster(config) {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let dir = dir.unwrap_or(c.tls.dir.clone());
    let ids: Vec<String> = if nodes.is_empty() {
        c.nodes.iter().map(|n| n.id.to_string()).collect()
    } else {
        nodes
    };
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let g = tls::generate(&dir, &c.cluster, &ids)?;
    for p in &g.created {
        println!("created {}", p.display());
    }
    if g.created.is_empty() {
        println!("all certificates already exist in {}", dir.display());
    }
    Ok(0)
}

fn up(config: Option<&Path>) -> anyhow::Result<u8> {
    let (file, c) = match load_cluster(config) {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let ids: Vec<&str> = c.nodes.iter().map(|n| &*n.id).collect();
    let g = tls::ensure_local(&c.tls.dir, &c.cluster, &ids)?;
    for p in &g.created {
        println!("created {}", p.display());
    }
    let sprayer = file.sprayer_addr.clone();
    let exe = std::env::current_exe().context("locating the peerlb binary")?;
    runtime()?.block_on(async move {
        let mut children = Vec::new();
        for n in &c.nodes {
            let mut cmd = tokio::process::Command::new(&exe);
            cmd.arg("node").arg("--node").arg(&*n.id);
            if let Some(p) = config {
                cmd.arg("--config").arg(p);
            }
            if let Some(s) = &sprayer {
                cmd.arg("--shared-listen").arg(s);
            }
            cmd.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true);
            let mut child = cmd
                .spawn()
                .with_context(|| format!("starting node {}", n.id))?;
            let pid = child.id().unwrap_or(0);
            for stream in [
                child.stdout.take().map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
                child.stderr.take().map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            ]
            .into_iter()
            .flatten()
            {
                let prefix = format!("[{}]", n.id);
                tokio::spawn(async move {
                    let mut lines = BufReader::new(stream).lines();
                    while let Ok(Some(l)) = lines.next_line().await {
                        println!("{prefix} {l}");
                    }
                });
            }
            children.push((n.clone(), pid, child));
        }
        println!();
        println!("peerlb cluster {:?}: {} nodes", c.cluster, children.len());
        println!("  {:<8} {:>7}  {:<21} {:<21} {:<21}", "node", "pid", "http", "peer (quic)", "gossip");
        for (n, pid, _) in &children {
            println!(
                "  {:<8} {:>7}  {:<21} {:<21} {:<21}",
                &*n.id, pid, n.http_addr, n.peer_addr, n.gossip_addr
            );
        }
        let front = sprayer.clone().unwrap_or_else(|| c.nodes[0].http_addr.to_string());
        let expected = children.len();
        let http_addrs: Vec<_> = children.iter().map(|(n, _, _)| n.http_addr).collect();
        let pids: Vec<u32> = children.iter().map(|(_, pid, _)| *pid).collect();
        let ready = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                for (n, _, child) in children.iter_mut() {
                    if let Ok(Some(st)) = child.try_wait() {
                        return Err(format!("node {} exited ({})", n.id, describe(Ok(st))));
                    }
                }
                let mut all = true;
                for (a, pid) in http_addrs.iter().zip(&pids) {
                    // The answer must come from our own child: another
                    // cluster already on these addresses does not count.
                    all &= serving_count(*a).await == Some((*pid, expected));
                }
                if all {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
        match ready {
            Ok(Ok(())) => println!("\ncluster ready: every node sees {expected} serving members"),
            Ok(Err(why)) => {
                // Let the log forwarders print the node's last words.
                tokio::time::sleep(Duration::from_millis(300)).await;
                println!("\n{why}: see its log above; stopping the others");
                return anyhow::Ok(1);
            }
            Err(_) => println!("\nwarning: the nodes do not all see each other yet (see the logs above)"),
        }
        println!("\ntry:");
        println!("  curl -si 'http://{front}/hello?user=alice'    # same user, same owner, whichever node the sprayer picks");
        println!("  curl -si 'http://{front}/hello?user=bob'");
        println!("  curl -si -H 'x-user: carol' http://{front}/hello");
        println!("  curl -s http://{}/_peerlb/status            # one node's membership view", http_addrs[0]);
        println!("  kill -9 <pid of the node named in alice's peerlb-served-by>   # her requests fail over");
        println!("press Ctrl-C to stop every node\n");

        let mut waits = tokio::task::JoinSet::new();
        for (n, pid, mut child) in children {
            waits.spawn(async move {
                let st = child.wait().await;
                (n.id.clone(), pid, st)
            });
        }
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
                done = waits.join_next() => match done {
                    Some(Ok((id, pid, st))) => println!("node {id} (pid {pid}) exited: {}", describe(st)),
                    Some(Err(e)) => println!("waiting for a node failed: {e}"),
                    None => {
                        println!("every node has exited");
                        return anyhow::Ok(1);
                    }
                },
            }
        }
        println!("stopping every node (SIGTERM); they drain, then exit");
        for pid in pids {
            // SAFETY: kill(2) with a pid of our own child; no memory is involved.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        }
        let drained = tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(r) = waits.join_next().await {
                if let Ok((id, pid, st)) = r {
                    println!("node {id} (pid {pid}) exited: {}", describe(st));
                }
            }
        })
        .await;
        if drained.is_err() {
            println!("nodes still running after 20 s: killing them");
            waits.abort_all(); // dropping a Child kills it (kill_on_drop)
        }
        Ok(0)
    })
}

fn describe(st: std::io::Result<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match st {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => format!("status {c}"),
            (_, Some(sig)) => format!("signal {sig}"),
            _ => "unknown".into(),
        },
        Err(e) => e.to_string(),
    }
}

/// The pid of the node answering on `addr` and the number of serving
/// members in its view, from its status endpoint.
async fn serving_count(addr: std::net::SocketAddr) -> Option<(u32, usize)> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(b"GET /_peerlb/status HTTP/1.0\r\nhost: x\r\n\r\n")
        .await
        .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf);
    let body = text.split("\r\n\r\n").nth(1)?;
    let v: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
    Some((v["pid"].as_u64()? as u32, v["serving"].as_array()?.len()))
}
