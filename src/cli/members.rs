//! `peerlb status`, `peerlb drain`, `peerlb undrain`, `peerlb offline`:
//! the cluster as one node sees it, and a member's state changed, through
//! one node's admin API (its `admin_addr`). A change for another member is
//! forwarded by that node over the authenticated peer link, so one
//! reachable admin address is enough for the whole cluster.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use super::admin_request;

/// Which node's admin API to ask.
#[derive(Args)]
pub(crate) struct Target {
    /// The admin address (`admin_addr`) of the node to ask (default: the
    /// first node of the config).
    #[arg(long = "node-addr", env = "PEERLB_NODE_ADDR")]
    node_addr: Option<SocketAddr>,
    /// cluster.toml naming the nodes (default: the embedded local cluster).
    #[arg(long, env = "PEERLB_CONFIG")]
    config: Option<PathBuf>,
}

impl Target {
    /// The admin address to ask; `Err` is the exit status (a bad config,
    /// already printed).
    fn addr(&self) -> Result<SocketAddr, u8> {
        if let Some(a) = self.node_addr {
            return Ok(a);
        }
        let (_, c) = super::load_cluster(self.config.as_deref())?;
        Ok(c.nodes[0].admin_addr)
    }
}

/// `peerlb status` arguments.
#[derive(Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    target: Target,
    /// Print the node's JSON status as it answers it, not the table.
    #[arg(long)]
    json: bool,
}

/// `peerlb drain|undrain|offline` arguments.
#[derive(Args)]
pub(crate) struct ChangeArgs {
    /// The member to change (its node id).
    #[arg(long)]
    node: String,
    /// `drain` only: go offline by itself after this many milliseconds
    /// (the sessions bound to the member reach it until then).
    #[arg(long = "timeout-ms")]
    timeout_ms: Option<u64>,
    #[command(flatten)]
    target: Target,
}

/// `peerlb forget` arguments.
#[derive(Args)]
pub(crate) struct ForgetArgs {
    /// The member to forget (its node id): failed, left or never seen.
    node: String,
    #[command(flatten)]
    target: Target,
}

/// The bytes of `s` outside RFC 3986 unreserved, percent-encoded.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Runs `peerlb forget NODE`: 0 when the node asked forgot it, 1 when it
/// refused (the member is in its view, or unknown).
pub(crate) fn forget(a: ForgetArgs) -> anyhow::Result<u8> {
    let addr = match a.target.addr() {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let path = format!("/_peerlb/forget?node={}", encode(&a.node));
    let (code, text) =
        admin_request(addr, "POST", &path, Some("")).with_context(|| format!("asking {addr}"))?;
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    if code == 200 {
        println!(
            "{}: {} member forgotten by {addr}",
            a.node,
            v["forgotten"].as_str().unwrap_or("?")
        );
        Ok(0)
    } else {
        eprintln!(
            "peerlb forget: {addr} answered {code}: {}",
            v["error"].as_str().unwrap_or(text.trim())
        );
        Ok(1)
    }
}

/// Runs `peerlb status`: 0, or 1 when the node does not answer 200.
pub(crate) fn status(a: StatusArgs) -> anyhow::Result<u8> {
    let addr = match a.target.addr() {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let (code, text) = admin_request(addr, "GET", "/_peerlb/status", None)
        .with_context(|| format!("asking {addr}"))?;
    if code != 200 {
        eprintln!("peerlb status: {addr} answered {code}: {}", text.trim());
        return Ok(1);
    }
    if a.json {
        println!("{}", text.trim());
        return Ok(0);
    }
    let v: serde_json::Value = serde_json::from_str(&text).context("reading the status JSON")?;
    print!("{}", table(&v));
    Ok(0)
}

/// The status JSON of `GET /_peerlb/status` as a terminal table: a line
/// about the node asked, then one row per member (the node asked marked
/// `*`).
pub(crate) fn table(v: &serde_json::Value) -> String {
    let me = v["node"].as_str().unwrap_or("?");
    let policy = &v["policy"];
    let figure = policy["figure"].as_str();
    let mut out = format!(
        "node {me} ({}), policy {}, view version {}, {} peer connections\n",
        v["state"].as_str().unwrap_or("?"),
        policy["name"].as_str().unwrap_or("?"),
        v["view_version_text"].as_str().unwrap_or("?"),
        v["peer_connections"],
    );
    let mut rows = vec![vec![
        "MEMBER".to_owned(),
        "STATUS".to_owned(),
        "WEIGHT".to_owned(),
        "LOAD".to_owned(),
        "INFLIGHT".to_owned(),
        "RING SHARE".to_owned(),
        figure.unwrap_or("").to_uppercase(),
        "HTTP".to_owned(),
    ]];
    for m in v["members"].as_array().into_iter().flatten() {
        let id = m["id"].as_str().unwrap_or("?");
        let load = m["load"].as_u64().filter(|l| *l <= 100);
        rows.push(vec![
            if id == me {
                format!("{id} *")
            } else {
                id.to_owned()
            },
            m["status"].as_str().unwrap_or("?").to_owned(),
            m["weight"].to_string(),
            load.map_or("-".to_owned(), |l| l.to_string()),
            m["inflight"].to_string(),
            format!("{:.1}%", m["ring_share"].as_f64().unwrap_or(0.0) * 100.0),
            policy["members"][id]
                .as_i64()
                .map_or(String::new(), |x| x.to_string()),
            m["http_addr"].as_str().unwrap_or("").to_owned(),
        ]);
    }
    // The members out of the view: failed, left, never seen.
    for m in v["roster"].as_array().into_iter().flatten() {
        let state = m["state"].as_str().unwrap_or("?");
        if state == "alive" {
            continue;
        }
        let ago = |k: &str| {
            m[k].as_u64()
                .map_or(String::new(), |ms| format!("{}s", ms / 1000))
        };
        let status = match state {
            "failed" => format!(
                "FAILED {} ago ({})",
                ago("since_ms"),
                m["reason"].as_str().unwrap_or("")
            ),
            "left" => format!("left {} ago", ago("since_ms")),
            s => s.to_owned(),
        };
        rows.push(vec![
            m["id"].as_str().unwrap_or("?").to_owned(),
            status,
            m["weight"]
                .as_u64()
                .map_or("-".to_owned(), |w| w.to_string()),
            "-".to_owned(),
            "-".to_owned(),
            "-".to_owned(),
            String::new(),
            m["http_addr"].as_str().unwrap_or("").to_owned(),
        ]);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out += line.join("  ").trim_end();
        out.push('\n');
    }
    out
}

/// Runs `peerlb drain|undrain|offline`: asks the node to publish `state`
/// for member `--node`; 0 when it answered 200, 1 otherwise.
pub(crate) fn change(a: ChangeArgs, state: &str) -> anyhow::Result<u8> {
    let addr = match a.target.addr() {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    // Every byte outside RFC 3986 unreserved is percent-encoded.
    let node: String = a
        .node
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let mut path = format!("/_peerlb/state?node={node}");
    if let Some(t) = a.timeout_ms {
        path += &format!("&timeout_ms={t}");
    }
    let (code, text) = admin_request(addr, "POST", &path, Some(state))
        .with_context(|| format!("asking {addr}"))?;
    if code == 200 {
        println!("{}", text.trim());
        Ok(0)
    } else {
        eprintln!("peerlb: {addr} answered {code}: {}", text.trim());
        Ok(1)
    }
}
