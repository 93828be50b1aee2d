//! The examples of README.md and docs/operations.md that run on one
//! machine, run as printed: each `peerlb up` on a machine of its own (a
//! network namespace, so the documented fixed ports are free), every
//! block marked `<!-- tests/multihost.rs runs this block as printed:
//! <name> -->`.

// Real processes in real namespaces: wall-clock time and blocking sleeps.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::time::Duration;

use super::{Groups, Net, block_of, poll, sh_in, skip};
use crate::support::{self, temp_dir};

/// The README's and docs/operations.md's examples that run on one
/// machine, as printed, against `peerlb up --config cluster.toml` (the
/// repository's file) on a machine of its own, so the documented ports
/// (8080-8083, admin 9081-9083) are free: the operations guide's admin
/// API, drain and keyring rotation blocks, then the README's route
/// explanations, its "What to try" block (which kills alice's owner) and
/// its restart command. `cargo run --release --` is the `peerlb` under
/// test. Not run here: blocks that need files of the reader's own (the
/// HTTPS listener's certificates, `RUST_LOG` examples that run a node in
/// the foreground) and the SIP quick start (`nc`).
#[test]
fn the_docs_one_machine_examples_run_as_printed() {
    if skip() {
        return;
    }
    for tool in ["curl", "jq"] {
        if support::skip::tool(
            &[tool],
            "PEERLB_REQUIRE_NETNS",
            &format!("apt-get install -y {tool}"),
        )
        .is_none()
        {
            return;
        }
    }
    let net = Net::make("one", 1);
    let ns = net.ns(0);
    let mut groups = Groups::default();
    let dir = temp_dir("docs-one-machine");
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/cluster.toml"),
        dir.join("cluster.toml"),
    )
    .unwrap();
    let printed =
        |file: &str, name: &str| block_of(file, name).replace("cargo run --release --", "peerlb");
    let run = |groups: &mut Groups, script: &str| {
        let out = sh_in(groups, Some(&ns), &dir, script, &[]);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{script}\n{out:?}\n{}",
            std::fs::read_to_string(dir.join("up.log")).unwrap_or_default()
        );
        stdout
    };
    // The first terminal: `peerlb up`, until it says the cluster is ready.
    run(
        &mut groups,
        "nohup peerlb up --config cluster.toml > up.log 2>&1 &",
    );
    poll(Duration::from_secs(60), || {
        std::fs::read_to_string(dir.join("up.log"))
            .is_ok_and(|l| l.contains("cluster ready: every node sees 3 serving members"))
    })
    .unwrap_or_else(|| {
        panic!(
            "peerlb up did not get ready\n{}",
            std::fs::read_to_string(dir.join("up.log")).unwrap_or_default()
        )
    });
    // n1's serving list; empty while n1 does not answer (it is alice's
    // owner on some runs, so the README's kill takes it down and its
    // restart brings it back while this polls).
    let serving = |groups: &mut Groups| {
        let out = sh_in(
            groups,
            Some(&ns),
            &dir,
            "curl -s http://127.0.0.1:9081/_peerlb/status | jq -r '.serving | join(\" \")'",
            &[],
        );
        if out.status.success() {
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        } else {
            String::new()
        }
    };
    // docs/operations.md, Admin API.
    let said = run(&mut groups, &printed("docs/operations.md", "admin"));
    assert!(said.contains("\"node\": \"n1\""), "{said}");
    assert!(said.contains("{\"rules\":1}"), "{said}");
    assert!(said.contains("\"weight\":300"), "{said}");
    assert!(
        said.contains("rules reloaded at 127.0.0.1:9081: 1 in force"),
        "{said}"
    );
    let rows: Vec<Vec<&str>> = said
        .lines()
        .rev()
        .take(2)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        [
            vec!["n1", "100", "300"],
            vec!["MEMBER", "WEIGHT", "PREVIOUS"]
        ],
        "{said}"
    );
    // Drain and offline without stopping.
    let said = run(&mut groups, &printed("docs/operations.md", "drain"));
    let changes: Vec<Vec<&str>> = said
        .lines()
        .filter(|l| l.starts_with("n2 ") && !l.starts_with("n2 *"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        changes,
        [
            ["n2", "draining", "serving"],
            ["n2", "offline", "draining"],
            ["n2", "serving", "offline"]
        ],
        "{said}"
    );
    // The status asked by host name (n2's own state at once; its row as
    // gossip has brought it back), then the serving list as n1 sees it.
    assert!(said.contains("node n2 (serving)"), "{said}");
    let last = said.trim_end().lines().last().unwrap();
    assert!(last.starts_with("n1 ") && last.ends_with("n3"), "{said}");
    // The keyring rotation: every node ends with the new key alone, and
    // the cluster stays whole.
    let before = run(&mut groups, "curl -s http://127.0.0.1:9081/_peerlb/keyring");
    let said = run(&mut groups, &printed("docs/operations.md", "keyring"));
    let keys = |port: u16, groups: &mut Groups| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_str(&run(
            groups,
            &format!("curl -s http://127.0.0.1:{port}/_peerlb/keyring"),
        ))
        .unwrap();
        v["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_owned())
            .collect()
    };
    let after = keys(9081, &mut groups);
    assert_eq!(after.len(), 1, "{said}");
    assert!(!before.contains(&after[0]), "{before} -> {after:?}");
    for port in [9082, 9083] {
        assert_eq!(keys(port, &mut groups), after, "{said}");
    }
    poll(Duration::from_secs(20), || {
        serving(&mut groups) == "n1 n2 n3"
    })
    .expect("every node serving after the rotation");
    // HTTP/2 with prior knowledge: one connection, both owners (with a
    // curl that reuses such a connection: 8.0 and later).
    let curl_major: u32 = std::process::Command::new("curl")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.split('.').next()?.parse().ok())
        })
        .unwrap_or(0);
    if curl_major >= 8 {
        let said = run(&mut groups, &printed("README.md", "h2"));
        let nodes: std::collections::BTreeSet<String> = said
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["node"].to_string())
            .collect();
        assert_eq!(said.lines().count(), 2, "{said}");
        assert_eq!(nodes.len(), 2, "alice and bob have two owners: {said}");
    } else {
        eprintln!(
            "not run: the README's HTTP/2 block (curl {curl_major}.x reuses no prior-knowledge connection)"
        );
    }
    // The README: a decision explained.
    let said = run(&mut groups, &printed("README.md", "route"));
    assert!(said.contains("picks (10)  a b a a a b a a b a"), "{said}");
    assert!(said.contains("hash key    alice"), "{said}");
    // "What to try", which kills alice's owner, then the restart command
    // in the same terminal (it runs until the test ends).
    let script = format!(
        "{}\n(\n{}\n) > restart.log 2>&1 &\necho \"owner=$owner\"\n",
        printed("README.md", "try"),
        printed("README.md", "restart").trim()
    );
    let said = run(&mut groups, &script);
    assert!(said.contains("intact"), "{said}");
    let owner = said
        .lines()
        .find_map(|l| l.strip_prefix("owner="))
        .unwrap()
        .to_owned();
    let served: Vec<&str> = said
        .lines()
        .filter_map(|l| l.strip_prefix("peerlb-served-by: "))
        .collect();
    // 5 before the kill, 20 after; after it, never the killed node.
    assert_eq!(served.len(), 25, "{said}");
    assert!(served[5..].iter().all(|s| s.trim() != owner), "{said}");
    // The restarted node rejoins, on the shared address too.
    poll(Duration::from_secs(60), || {
        serving(&mut groups) == "n1 n2 n3"
    })
    .unwrap_or_else(|| {
        panic!(
            "{owner} did not rejoin\n{}",
            std::fs::read_to_string(dir.join("restart.log")).unwrap_or_default()
        )
    });
    let entries: std::collections::BTreeSet<String> = (0..30)
        .map(|_| {
            run(
                &mut groups,
                "curl -s -D- -o/dev/null http://127.0.0.1:8080/x | sed -n 's/^peerlb-entry: \\(.*\\)\\r$/\\1/p'",
            )
            .trim()
            .to_owned()
        })
        .collect();
    assert!(
        entries.contains(&owner),
        "{owner} is not on the shared address: {entries:?}"
    );
    drop(groups);
}

/// The README's HTTPS and SIP quick starts as printed, each `peerlb up`
/// on a machine of its own (its documented ports free): the HTTPS
/// request answered over TLS with the certificate `up --https` made, the
/// three SIP clients' OPTIONS answered by one owner (with `nc`). The
/// README's SIPp run is `tests/sipp.rs`'s (through the shared SIP address
/// of a 3-node cluster, and each node's), not repeated here: its calls
/// fail when the machine answers an INVITE later than SIPp's 500 ms
/// retransmission timer.
#[test]
fn the_readme_quick_starts_run_as_printed() {
    if skip() {
        return;
    }
    if support::skip::tool(&["curl"], "PEERLB_REQUIRE_NETNS", "apt-get install -y curl").is_none() {
        return;
    }
    let net = Net::make("qs", 2);
    let mut groups = Groups::default();
    let printed =
        |name: &str| block_of("README.md", name).replace("cargo run --release --", "peerlb");
    let home = |i: usize| {
        let d = temp_dir(&format!("readme-quick-{i}"));
        std::fs::copy(
            concat!(env!("CARGO_MANIFEST_DIR"), "/cluster.toml"),
            d.join("cluster.toml"),
        )
        .unwrap();
        d
    };
    let run = |groups: &mut Groups, i: usize, dir: &std::path::Path, script: &str| {
        let out = sh_in(groups, Some(&net.ns(i)), dir, script, &[]);
        assert!(
            out.status.success(),
            "{script}\n{out:?}\n{}",
            std::fs::read_to_string(dir.join("up.log")).unwrap_or_default()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let up = |groups: &mut Groups, i: usize, dir: &std::path::Path, block: &str| {
        run(
            groups,
            i,
            dir,
            &format!("(\n{}\n) > up.log 2>&1 &", block.trim()),
        );
        poll(Duration::from_secs(60), || {
            std::fs::read_to_string(dir.join("up.log"))
                .is_ok_and(|l| l.contains("cluster ready: every node sees 3 serving members"))
        })
        .unwrap_or_else(|| {
            panic!(
                "{block}: not ready\n{}",
                std::fs::read_to_string(dir.join("up.log")).unwrap_or_default()
            )
        });
    };
    // HTTPS.
    let https = home(0);
    up(&mut groups, 0, &https, &printed("https"));
    let said = run(&mut groups, 0, &https, &printed("https-try"));
    let v: serde_json::Value =
        serde_json::from_str(said.trim()).unwrap_or_else(|e| panic!("{e}: {said}"));
    assert_eq!(v["proto"], "https", "{said}");
    assert_eq!(v["key"], "alice", "{said}");
    // SIP.
    let sip = home(1);
    up(&mut groups, 1, &sip, &printed("sip-up"));
    if support::which("nc").is_some() {
        let said = run(&mut groups, 1, &sip, &printed("sip-send"));
        let owners: Vec<&str> = said
            .lines()
            .filter_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("peerlb-served-by")
                    .then(|| value.trim())
            })
            .collect();
        assert_eq!(said.matches("SIP/2.0 200 OK").count(), 3, "{said}");
        assert_eq!(owners.len(), 3, "{said}");
        assert!(owners.iter().all(|o| *o == owners[0]), "{said}");
    } else {
        support::skip::skip(
            "PEERLB_REQUIRE_NETNS",
            "the README's SIP clients not run: `nc` is not installed",
            "apt-get install -y netcat-openbsd",
        );
    }
    drop(groups);
}
