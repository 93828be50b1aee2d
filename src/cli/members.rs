//! `peerlb status`, `peerlb drain`, `peerlb undrain`, `peerlb offline`,
//! `peerlb weight`, `peerlb reload-rules`: the cluster as one node sees
//! it, a member's state or weight changed, the rules read again, through
//! one node's admin API (its `admin_addr`, given as `host:port`). A change
//! for another member is forwarded by that node over the authenticated
//! peer link, so one reachable admin address is enough for the whole
//! cluster. Answers print as tables (as `status` prints members), `--json`
//! as the node sent them; a refusal prints the node's error as a sentence
//! and exits 1.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use super::admin_request;

/// Which node's admin API to ask.
#[derive(Args)]
pub(crate) struct Target {
    /// The admin address (`admin_addr`) of the node to ask, `host:port`
    /// (`127.0.0.1:9081`, `localhost:9081`); default: the first node of
    /// the config.
    #[arg(long = "node-addr", env = "PEERLB_NODE_ADDR")]
    node_addr: Option<String>,
    /// cluster.toml naming the nodes (default: the embedded local cluster).
    #[arg(long, env = "PEERLB_CONFIG")]
    config: Option<PathBuf>,
}

impl Target {
    /// The addresses to try, in order (a host name may resolve to
    /// several: `localhost` to `::1` and `127.0.0.1`); `Err` is the exit
    /// status (a bad `--node-addr` or config, already printed).
    fn addrs(&self) -> Result<Vec<SocketAddr>, u8> {
        use std::net::ToSocketAddrs as _;
        if let Some(a) = &self.node_addr {
            return match a.to_socket_addrs() {
                Ok(found) => {
                    let found: Vec<SocketAddr> = found.collect();
                    if found.is_empty() {
                        Err(super::config_error(format!(
                            "--node-addr: {a:?} resolves to no address"
                        )))
                    } else {
                        Ok(found)
                    }
                }
                Err(e) => Err(super::config_error(format!(
                    "--node-addr: {a:?} is not host:port ({e})"
                ))),
            };
        }
        let (_, c) = super::load_cluster(self.config.as_deref())?;
        Ok(vec![c.nodes[0].admin_addr])
    }

    /// One admin request to the first of [`Target::addrs`] that accepts a
    /// connection: (the address, status, body); `Err(code)` when the
    /// target is invalid (printed).
    fn ask(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<anyhow::Result<(SocketAddr, u16, String)>, u8> {
        let addrs = self.addrs()?;
        let mut last = None;
        for addr in &addrs {
            match admin_request(*addr, method, path, body) {
                Ok((code, text)) => return Ok(Ok((*addr, code, text))),
                Err(e) => last = Some((*addr, e)),
            }
        }
        let (addr, e) = last.expect("at least one address");
        Ok(Err(anyhow::Error::new(e).context(format!("asking {addr}"))))
    }

    /// [`Target::ask`] for a command that needs a 200: `Ok(Ok((address,
    /// body)))` on 200; `Ok(Err(1))` when the node answered otherwise
    /// (its error printed as `peerlb COMMAND: ADDR answered CODE: ERROR`),
    /// `Ok(Err(code))` for an invalid target (printed); `Err` when no
    /// address accepted the connection.
    fn ask_ok(
        &self,
        command: &str,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> anyhow::Result<Result<(SocketAddr, String), u8>> {
        let (addr, code, text) = match self.ask(method, path, body) {
            Ok(r) => r?,
            Err(code) => return Ok(Err(code)),
        };
        if code != 200 {
            eprintln!(
                "peerlb {command}: {addr} answered {code}: {}",
                error_of(&text)
            );
            return Ok(Err(1));
        }
        Ok(Ok((addr, text)))
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

/// `peerlb drain` arguments.
#[derive(Args)]
pub(crate) struct DrainArgs {
    /// The member to drain (its node id).
    #[arg(long)]
    node: String,
    /// Go offline by itself after this many milliseconds (the sessions
    /// bound to the member reach it until then).
    #[arg(long = "timeout-ms")]
    timeout_ms: Option<u64>,
    /// Print the node's JSON answer, not the table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    target: Target,
}

/// `peerlb undrain|offline` arguments.
#[derive(Args)]
pub(crate) struct ChangeArgs {
    /// The member to change (its node id).
    #[arg(long)]
    node: String,
    /// Print the node's JSON answer, not the table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    target: Target,
}

/// `peerlb weight` arguments.
#[derive(Args)]
pub(crate) struct WeightArgs {
    /// The member's new weight, 0..=10000 (100 is one share).
    weight: String,
    /// The member to change (its node id); default: the node asked.
    #[arg(long)]
    node: Option<String>,
    /// Print the node's JSON answer, not the table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    target: Target,
}

/// `peerlb reload-rules` arguments.
#[derive(Args)]
pub(crate) struct ReloadRulesArgs {
    /// Print the node's JSON answer, not the sentence.
    #[arg(long)]
    json: bool,
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

/// Runs `peerlb forget NODE`: 0 when the node asked forgot it, 1 when it
/// refused (the member is in its view, or unknown).
pub(crate) fn forget(a: ForgetArgs) -> anyhow::Result<u8> {
    let path = format!("/_peerlb/forget?node={}", query_value(&a.node));
    let (addr, text) = match a.target.ask_ok("forget", "POST", &path, Some(""))? {
        Ok(r) => r,
        Err(code) => return Ok(code),
    };
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    println!(
        "{}: {} member forgotten by {addr}",
        a.node,
        v["forgotten"].as_str().unwrap_or("?")
    );
    Ok(0)
}

/// Runs `peerlb status`: 0, or 1 when the node does not answer 200.
pub(crate) fn status(a: StatusArgs) -> anyhow::Result<u8> {
    let (_, text) = match a.target.ask_ok("status", "GET", "/_peerlb/status", None)? {
        Ok(r) => r,
        Err(code) => return Ok(code),
    };
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
    out += &align(&rows);
    out
}

/// `rows` as columns two spaces apart, each as wide as its widest cell.
fn align(rows: &[Vec<String>]) -> String {
    let mut out = String::new();
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

/// Runs `peerlb drain`.
pub(crate) fn drain(a: DrainArgs) -> anyhow::Result<u8> {
    let change = ChangeArgs {
        node: a.node,
        json: a.json,
        target: a.target,
    };
    change_state(change, "drain", "draining", a.timeout_ms)
}

/// Runs `peerlb undrain|offline` (`command`): asks the node to publish
/// `state` for member `--node`.
pub(crate) fn change(a: ChangeArgs, command: &str, state: &str) -> anyhow::Result<u8> {
    change_state(a, command, state, None)
}

/// Asks the node to publish `state` for member `--node` (going offline
/// after `timeout_ms` when draining); prints the member, its new state
/// and its previous one as a table (as `peerlb status` prints members);
/// 0 when it answered 200, 1 otherwise (`command` names the command in
/// the error).
fn change_state(
    a: ChangeArgs,
    command: &str,
    state: &str,
    timeout_ms: Option<u64>,
) -> anyhow::Result<u8> {
    let mut path = format!("/_peerlb/state?node={}", query_value(&a.node));
    if let Some(t) = timeout_ms {
        path += &format!("&timeout_ms={t}");
    }
    answer(
        &a.target,
        command,
        "POST",
        &path,
        Some(state),
        a.json,
        &[
            ("MEMBER", "node"),
            ("STATE", "state"),
            ("PREVIOUS", "previous"),
        ],
    )
}

/// Runs `peerlb weight`: `PUT /_peerlb/weight` for member `--node` (the
/// node asked without it); prints the member, its new weight and its
/// previous one as a table.
pub(crate) fn weight(a: WeightArgs) -> anyhow::Result<u8> {
    let path = match &a.node {
        Some(n) => format!("/_peerlb/weight?node={}", query_value(n)),
        None => "/_peerlb/weight".to_owned(),
    };
    answer(
        &a.target,
        "weight",
        "PUT",
        &path,
        Some(&a.weight),
        a.json,
        &[
            ("MEMBER", "node"),
            ("WEIGHT", "weight"),
            ("PREVIOUS", "previous"),
        ],
    )
}

/// Runs `peerlb reload-rules`: `POST /_peerlb/rules/reload` on the node
/// asked; prints how many rules are in force.
pub(crate) fn reload_rules(a: ReloadRulesArgs) -> anyhow::Result<u8> {
    let (addr, text) =
        match a
            .target
            .ask_ok("reload-rules", "POST", "/_peerlb/rules/reload", None)?
        {
            Ok(r) => r,
            Err(code) => return Ok(code),
        };
    if a.json {
        println!("{}", text.trim());
    } else {
        let v: serde_json::Value = serde_json::from_str(&text).context("reading the answer")?;
        println!("rules reloaded at {addr}: {} in force", v["rules"]);
    }
    Ok(0)
}

/// One change through the admin API: on 200 its JSON answer (`json`) or
/// a two-line table of `columns` (heading, answer field); otherwise the
/// node's error as a sentence on stderr and exit status 1.
fn answer(
    target: &Target,
    command: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    json: bool,
    columns: &[(&str, &str)],
) -> anyhow::Result<u8> {
    let (_, text) = match target.ask_ok(command, method, path, body)? {
        Ok(r) => r,
        Err(code) => return Ok(code),
    };
    if json {
        println!("{}", text.trim());
        return Ok(0);
    }
    let v: serde_json::Value = serde_json::from_str(&text).context("reading the answer")?;
    let cell = |x: &serde_json::Value| x.as_str().map_or_else(|| x.to_string(), str::to_owned);
    let rows = [
        columns
            .iter()
            .map(|(h, _)| (*h).to_owned())
            .collect::<Vec<_>>(),
        columns.iter().map(|(_, f)| cell(&v[*f])).collect(),
    ];
    print!("{}", align(&rows));
    Ok(0)
}

/// The `error` of an admin API error answer, else the answer itself.
fn error_of(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_owned))
        .unwrap_or_else(|| text.trim().to_owned())
}

/// `v` percent-encoded for a query string: every byte outside RFC 3986
/// unreserved.
fn query_value(v: &str) -> String {
    v.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
