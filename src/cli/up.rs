//! `peerlb up`: every node of the cluster as a child process on this host,
//! all sharing the sprayer address with SO_REUSEPORT (the kernel is the
//! sprayer), and every node with a `sip_addr` the SIP sprayer address
//! (`sip_sprayer_addr`) the same way. In order: certificates, [`spawn`] each node with its log
//! forwarded, [`wait_ready`] until every node sees every other, then
//! [`supervise`] each child until Ctrl-C or SIGTERM, which [`stop`] passes
//! on to the nodes so they drain.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use peerlb::config::NodeAddrs;
use peerlb::tls;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Child;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::{load_cluster, runtime};

mod status;

/// How long the nodes have to see each other before `up` warns.
const READY_WITHIN: Duration = Duration::from_secs(20);
/// Between two rounds of status reads while waiting for the cluster.
const READY_POLL: Duration = Duration::from_millis(200);
/// How long the nodes have to drain after SIGTERM before they are killed.
const DRAIN_WITHIN: Duration = Duration::from_secs(20);

/// The arguments of `peerlb up`.
#[derive(Args)]
pub(crate) struct UpArgs {
    /// cluster.toml to use (default: the embedded local 3-node cluster).
    #[arg(long, env = "PEERLB_CONFIG")]
    config: Option<PathBuf>,
    /// Serve clients over HTTPS with a self-signed certificate for
    /// localhost (`<tls dir>/entry.pem`, created when missing): every
    /// node's client listeners take it (`peerlb node --tls-cert`).
    #[arg(long)]
    https: bool,
}

/// One node started by `up`.
struct Started {
    spec: NodeAddrs,
    pid: u32,
    child: Child,
}

/// Runs the cluster until Ctrl-C or SIGTERM: 0 once every node was
/// stopped, 1 when a node exits before the cluster is ready or every node
/// has exited, 64 for an invalid configuration. Each node logs in
/// `log_format`, with the access log when `access_log` (the flags given to
/// `up` reach every node).
pub(crate) fn run(a: UpArgs, log_format: super::LogFormat, access_log: bool) -> anyhow::Result<u8> {
    let config = a.config.as_deref();
    let (file, c) = match load_cluster(config) {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let ids: Vec<&str> = c.nodes.iter().map(|n| &*n.id).collect();
    let g = tls::ensure_local(&c.tls.dir, &c.cluster, &ids)?;
    for p in &g.created {
        println!("created {}", p.display());
    }
    let https = if a.https {
        let (cert, key, created) = tls::ensure_local_https(&c.tls.dir)?;
        if created {
            println!("created {} and {}", cert.display(), key.display());
        }
        Some((cert, key))
    } else {
        None
    };
    let sprayer = file.sprayer_addr.clone();
    let sip_sprayer = file.sip_sprayer_addr.clone();
    let sips_sprayer = file.sips_sprayer_addr.clone();
    let exe = std::env::current_exe().context("locating the peerlb binary")?;
    runtime()?.block_on(async move {
        let mut started = Vec::new();
        for n in &c.nodes {
            started.push(spawn(
                &exe,
                config,
                (
                    sprayer.as_deref(),
                    sip_sprayer.as_deref(),
                    sips_sprayer.as_deref(),
                ),
                https.as_ref(),
                n,
                (log_format, access_log),
            )?);
        }
        print_table(&c.cluster, &started);
        let front = sprayer.unwrap_or_else(|| c.nodes[0].http_addr.to_string());
        let expected = started.len();
        match tokio::time::timeout(READY_WITHIN, wait_ready(&mut started)).await {
            Ok(Ok(())) => println!("\ncluster ready: every node sees {expected} serving members"),
            Ok(Err(why)) => {
                // Let the log forwarders print the node's last words.
                tokio::time::sleep(Duration::from_millis(300)).await;
                println!("\n{why}: see its log above; stopping the others");
                return anyhow::Ok(1);
            }
            Err(_) => {
                println!("\nwarning: the nodes do not all see each other yet (see the logs above)")
            }
        }
        match &https {
            Some((cert, _)) => print_https_hints(&front, cert),
            None => print_hints(&front, &started[0].spec),
        }
        if let Some(sip) = &sip_sprayer {
            println!("SIP (UDP and TCP) through the kernel sprayer: sip:{sip}\n");
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut waits = JoinSet::new();
        for s in started {
            let stop = stop_rx.clone();
            waits.spawn(async move {
                let st = supervise(s.child, stop).await;
                (s.spec.id.to_string(), s.pid, st)
            });
        }
        if !until_signal(&mut waits).await? {
            println!("every node has exited");
            return Ok(1);
        }
        stop(&stop_tx, &mut waits).await;
        Ok(0)
    })
}

/// Starts node `n` as a child (`peerlb node --node <id>`, with the same
/// config, the sprayer as shared listen address, the SIP sprayer as
/// shared SIP address when `n` has a `sip_addr`, and the HTTPS
/// certificate and key when `https` gives them) and forwards its stdout
/// and stderr, each line prefixed with `[<id>]`.
///
/// # Errors
/// The process could not be started.
fn spawn(
    exe: &Path,
    config: Option<&Path>,
    (sprayer, sip_sprayer, sips_sprayer): (Option<&str>, Option<&str>, Option<&str>),
    https: Option<&(PathBuf, PathBuf)>,
    n: &NodeAddrs,
    (log_format, access_log): (super::LogFormat, bool),
) -> anyhow::Result<Started> {
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("node").arg("--node").arg(&*n.id);
    if log_format == super::LogFormat::Json {
        cmd.arg("--log-format").arg("json");
    }
    if access_log {
        cmd.arg("--access-log");
    }
    if let Some(p) = config {
        cmd.arg("--config").arg(p);
    }
    if let Some(s) = sprayer {
        cmd.arg("--shared-listen").arg(s);
    }
    if let Some(s) = sip_sprayer.filter(|_| n.sip_addr.is_some()) {
        cmd.arg("--shared-sip-listen").arg(s);
    }
    if let Some(s) = sips_sprayer.filter(|_| n.sips_addr.is_some()) {
        cmd.arg("--shared-sips-listen").arg(s);
    }
    if let Some((cert, key)) = https {
        // Absolute: the node resolves relative paths against the config's
        // directory, `up` against the current one.
        let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_owned());
        cmd.arg("--tls-cert")
            .arg(abs(cert))
            .arg("--tls-key")
            .arg(abs(key));
    }
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting node {}", n.id))?;
    let pid = child.id().unwrap_or(0);
    let out = child
        .stdout
        .take()
        .map(|s| Box::new(s) as Box<dyn AsyncRead + Unpin + Send>);
    let err = child
        .stderr
        .take()
        .map(|s| Box::new(s) as Box<dyn AsyncRead + Unpin + Send>);
    for stream in [out, err].into_iter().flatten() {
        let prefix = format!("[{}]", n.id);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stream).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                println!("{prefix} {l}");
            }
        });
    }
    Ok(Started {
        spec: n.clone(),
        pid,
        child,
    })
}

/// The cluster's name and one line per node: id, pid and addresses.
fn print_table(cluster: &str, started: &[Started]) {
    println!();
    println!("peerlb cluster {cluster:?}: {} nodes", started.len());
    println!(
        "  {:<8} {:>7}  {:<21} {:<21} {:<21} {:<21}",
        "node", "pid", "http", "peer (quic)", "gossip", "admin"
    );
    for s in started {
        let n = &s.spec;
        println!(
            "  {:<8} {:>7}  {:<21} {:<21} {:<21} {:<21}",
            &*n.id, s.pid, n.http_addr, n.peer_addr, n.gossip_addr, n.admin_addr
        );
    }
}

/// Returns once every node answers its status endpoint as our own child
/// (its pid) and sees all of them serving; `Err` names the first node that
/// exited meanwhile. Unbounded: the caller puts a deadline on it.
async fn wait_ready(started: &mut [Started]) -> Result<(), String> {
    let expected = started.len();
    loop {
        for s in started.iter_mut() {
            if let Ok(Some(st)) = s.child.try_wait() {
                return Err(format!("node {} exited ({})", s.spec.id, describe(Ok(st))));
            }
        }
        let mut all = true;
        for s in started.iter() {
            // The answer must come from our own child: another cluster
            // already on these addresses does not count.
            all &= status::serving_count(s.spec.admin_addr).await == Some((s.pid, expected));
        }
        if all {
            return Ok(());
        }
        tokio::time::sleep(READY_POLL).await;
    }
}

/// What to try once the cluster runs.
fn print_hints(front: &str, first: &NodeAddrs) {
    println!("\ntry:");
    println!(
        "  curl -si 'http://{front}/hello?user=alice'    # same user, same owner, whichever node the sprayer picks"
    );
    println!("  curl -si 'http://{front}/hello?user=bob'");
    println!("  curl -si -H 'x-user: carol' http://{front}/hello");
    println!(
        "  curl -s http://{}/_peerlb/status            # one node's membership view (its admin address)",
        first.admin_addr
    );
    println!(
        "  kill -9 <pid of the node named in alice's peerlb-served-by>   # her requests fail over"
    );
    println!("press Ctrl-C to stop every node\n");
}

/// What to try once the cluster serves HTTPS (`up --https`).
fn print_https_hints(front: &str, cert: &Path) {
    let port = front.rsplit_once(':').map_or(front, |(_, p)| p);
    println!(
        "\ntry (HTTPS, the certificate {} trusted once):",
        cert.display()
    );
    println!(
        "  curl -si --cacert {} 'https://localhost:{port}/hello?user=alice'",
        cert.display()
    );
    println!(
        "  curl -sik 'https://localhost:{port}/hello?user=bob'   # -k: without checking the certificate"
    );
    println!("press Ctrl-C to stop every node\n");
}

/// What a supervising task returns: node id, pid, exit status.
type Exit = (String, u32, std::io::Result<ExitStatus>);

/// Reports each node that exits until Ctrl-C or SIGTERM (`true`) or until
/// every node has exited (`false`).
///
/// # Errors
/// The SIGTERM handler cannot be installed.
async fn until_signal(waits: &mut JoinSet<Exit>) -> anyhow::Result<bool> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(true),
            _ = term.recv() => return Ok(true),
            done = waits.join_next() => match done {
                Some(Ok((id, pid, st))) => println!("node {id} (pid {pid}) exited: {}", describe(st)),
                Some(Err(e)) => println!("waiting for a node failed: {e}"),
                None => return Ok(false),
            },
        }
    }
}

/// Asks every node still running to stop (SIGTERM, through its
/// [`supervise`] task) and waits [`DRAIN_WITHIN`] for them to drain and
/// exit; the ones still running then are killed.
async fn stop(stop: &watch::Sender<bool>, waits: &mut JoinSet<Exit>) {
    println!("stopping every node (SIGTERM); they drain, then exit");
    let _ = stop.send(true);
    let drained = tokio::time::timeout(DRAIN_WITHIN, async {
        while let Some(r) = waits.join_next().await {
            if let Ok((id, pid, st)) = r {
                println!("node {id} (pid {pid}) exited: {}", describe(st));
            }
        }
    })
    .await;
    if drained.is_err() {
        println!("nodes still running after 20 s: killing them");
        // Dropping a Child kills it (kill_on_drop) unless it was reaped.
        waits.abort_all();
    }
}

/// Waits for `child` to exit; once `stop` turns true, sends it SIGTERM
/// first (if it still runs) and waits for it to drain and exit.
///
/// The task that waits for the child is the only one that signals it, so
/// the pid cannot be stale: see [`signal_if_running`].
async fn supervise(
    mut child: Child,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<ExitStatus> {
    tokio::select! {
        st = child.wait() => return st,
        // A closed channel (the sender gone) stops the node too.
        _ = stop.wait_for(|s| *s) => {}
    }
    signal_if_running(&child, libc::SIGTERM);
    child.wait().await
}

/// Sends `sig` to `child` unless it has been reaped; `true` when sent.
///
/// Once a child is reaped its pid is free and the kernel may give it to
/// any new process, so signalling a pid remembered from the spawn could hit
/// a stranger. tokio reaps a `Child` only inside its own `wait`/`try_wait`
/// (orphans: only once dropped), and from then on `Child::id()` is `None`.
/// Holding `&Child` here, no wait of it can run between the check and
/// kill(2), so a `Some` pid still names our unreaped (possibly zombie)
/// child.
// kill(2) through libc: std has no call that sends a chosen signal.
#[allow(unsafe_code)]
fn signal_if_running(child: &Child, sig: libc::c_int) -> bool {
    let Some(pid) = child.id() else {
        return false;
    };
    // SAFETY: kill(2) on the pid of our own child, not yet reaped (above);
    // no memory is involved.
    unsafe { libc::kill(pid as libc::pid_t, sig) == 0 }
}

/// An exit status as `up` prints it: `status <code>` or `signal <number>`.
fn describe(st: std::io::Result<ExitStatus>) -> String {
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

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use super::*;

    fn sleeper() -> Child {
        tokio::process::Command::new("sleep")
            .arg("30")
            .kill_on_drop(true)
            .spawn()
            .expect("spawning sleep")
    }

    #[tokio::test]
    async fn a_reaped_child_is_never_signalled() {
        let mut child = tokio::process::Command::new("true").spawn().unwrap();
        let st = child.wait().await.unwrap();
        assert!(st.success());
        // Its pid may already belong to another process: no signal.
        assert_eq!(child.id(), None);
        assert!(!signal_if_running(&child, libc::SIGTERM));
    }

    #[tokio::test]
    async fn a_running_child_gets_the_signal() {
        let mut child = sleeper();
        assert!(signal_if_running(&child, libc::SIGTERM));
        let st = child.wait().await.unwrap();
        assert_eq!(st.signal(), Some(libc::SIGTERM));
    }

    #[tokio::test]
    async fn stop_sends_sigterm_and_returns_the_exit() {
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(supervise(sleeper(), rx));
        tx.send(true).unwrap();
        let st = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the child exits on SIGTERM")
            .unwrap()
            .unwrap();
        assert_eq!(st.signal(), Some(libc::SIGTERM));
    }

    #[tokio::test]
    async fn a_child_that_exits_alone_is_reported_without_a_stop() {
        let (_tx, rx) = watch::channel(false);
        let child = tokio::process::Command::new("sh")
            .args(["-c", "exit 3"])
            .spawn()
            .unwrap();
        let st = tokio::time::timeout(Duration::from_secs(10), supervise(child, rx))
            .await
            .expect("the child exits by itself")
            .unwrap();
        assert_eq!(st.code(), Some(3));
    }
}
