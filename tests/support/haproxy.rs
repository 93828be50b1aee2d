//! HAProxy in TCP mode as the sprayer, configured from the example of
//! docs/operations.md, with its state read from the stats socket.

use super::NodeInfo;

/// The HAProxy example of docs/operations.md (the sprayer section), with
/// its `bind` and `server` lines pointed at `nodes` and a stats socket.
pub fn haproxy_example(front: u16, nodes: &[NodeInfo], socket: &std::path::Path) -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .unwrap();
    let block = doc
        .split_once("HAProxy in TCP mode")
        .and_then(|(_, rest)| rest.split("```").nth(1))
        .expect("the HAProxy example in docs/operations.md");
    assert!(block.contains("option httpchk") && block.contains("/_peerlb/health"));
    let mut cfg = String::new();
    for line in block.lines() {
        let t = line.trim();
        if t.starts_with("server ") {
            continue;
        }
        if t.starts_with("bind ") {
            cfg += &format!("  bind 127.0.0.1:{front}\n");
        } else if t.starts_with("maxconn ") {
            // maxconn 10000 needs about 20,000 file descriptors, more than
            // a test machine may allow.
            cfg += "  maxconn 1000\n";
        } else {
            cfg += line;
            cfg += "\n";
        }
        if t == "global" {
            cfg += &format!("  stats socket {} level admin\n", socket.display());
        }
    }
    for n in nodes {
        cfg += &format!(
            "  server {} {} check inter 200ms fall 2 rise 2\n",
            n.id, n.http
        );
    }
    cfg
}

/// Each server's status (`UP`, `DOWN`, ...) in HAProxy's `show stat`.
pub fn haproxy_status(
    socket: &std::path::Path,
) -> Option<std::collections::BTreeMap<String, String>> {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket).ok()?;
    s.write_all(b"show stat\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next()?.trim_start_matches("# ").split(',').collect();
    let (sv, st) = (
        header.iter().position(|h| *h == "svname")?,
        header.iter().position(|h| *h == "status")?,
    );
    Some(
        lines
            .map(|l| l.split(',').collect::<Vec<_>>())
            .filter(|f| f.len() > st && f[sv] != "FRONTEND" && f[sv] != "BACKEND")
            .map(|f| (f[sv].to_owned(), f[st].to_owned()))
            .collect(),
    )
}
