//! The answers peerlb makes itself, as a client sees them: each status with
//! `peerlb-entry`, `peerlb-error-from` and a text/plain cause (so peerlb's
//! own answer is told apart from hyper's bare one), the `errors` and
//! `requests` counters, the `[headers]` switches, the admin API's 404s and
//! an owner dying mid-response. Real `peerlb` processes on loopback.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use support::*;

/// The head of a raw answer: (status, lowercase header lines).
fn head_of(text: &str) -> (u16, String) {
    let head = text
        .split("\r\n\r\n")
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head)
}

/// Asserts the marks of an error peerlb made at `node`.
fn assert_peerlb_error(what: &str, status: u16, want: u16, head: &str, node: &str) {
    assert_eq!(status, want, "{what}: {head}");
    for line in [
        format!("peerlb-entry: {node}"),
        format!("peerlb-error-from: {node}"),
        "content-type: text/plain".to_owned(),
    ] {
        assert!(
            head.lines().any(|l| l == line),
            "{what}: no `{line}` in {head}"
        );
    }
    assert!(
        !head.contains("peerlb-served-by"),
        "{what}: an error the entry makes names no serving node: {head}"
    );
}

/// Every error status the entry makes carries its marks, counts in
/// `errors`, and counts in `requests` only once the request was routed
/// (docs/architecture.md, "Response headers" and step 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_the_entry_makes_carries_its_marks_and_counts_in_errors() {
    let c = Cluster::start(
        "errors",
        2,
        "[ring]\nvnodes = 1024\n[limits]\nresponse_timeout_ms = 400\nbody_read_timeout_ms = 300\n",
        USER_RULES,
    );
    let entry = c.nodes[0].http;
    let r = ring(&["n1", "n2"], 1024);
    let remote = user_where(&r, |o| o == "n2");
    let (errors0, requests0) = (counter(entry, "errors"), counter(entry, "requests"));

    // Refused at the head checks: counted in errors, not in requests.
    let long_target = format!("/x?user={remote}&pad={}", "a".repeat(8200));
    let big_header = "v".repeat(62_000);
    let checks: Vec<(&str, String, u16)> = vec![
        (
            "414 target too long",
            format!("GET {long_target} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),
            414,
        ),
        (
            "431 head too large",
            format!(
                "GET /x?user={remote} HTTP/1.1\r\nHost: a\r\nx-big: {big_header}\r\nConnection: close\r\n\r\n"
            ),
            431,
        ),
        (
            "400 without Host",
            "GET /x HTTP/1.1\r\nConnection: close\r\n\r\n".to_owned(),
            400,
        ),
        (
            "501 CONNECT",
            format!(
                "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nx-user: {remote}\r\nConnection: close\r\n\r\n"
            ),
            501,
        ),
    ];
    for (what, raw, want) in &checks {
        let (text, _) = raw_exchange(entry, raw.as_bytes());
        let (status, head) = head_of(&text);
        assert_peerlb_error(what, status, *want, &head, "n1");
    }
    assert_eq!(counter(entry, "errors"), errors0 + 4);
    assert_eq!(
        counter(entry, "requests"),
        requests0,
        "refused heads are not requests"
    );

    // Routed, then failed: counted in both.
    // 408: a small PUT body that stalls (read whole before any attempt).
    let (text, closed) = raw_exchange(
        entry,
        format!("PUT /x?user={remote} HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc")
            .as_bytes(),
    );
    let (status, head) = head_of(&text);
    assert_peerlb_error("408 stalled body", status, 408, &head, "n1");
    assert!(closed && head.contains("connection: close"), "{head}");
    // 504: the owner sends no response head within response_timeout_ms;
    // not retried (the entry's own app, the next candidate, serves nothing).
    let local_before = counter(entry, "served_local");
    let resp = get(entry, &format!("/delay/5000?user={remote}"), &[]).await;
    assert_eq!(resp.status, 504, "{:?}", resp.body);
    assert_eq!(resp.header("peerlb-entry"), Some("n1"));
    assert_eq!(resp.header("peerlb-error-from"), Some("n1"));
    assert_eq!(resp.header("content-type"), Some("text/plain"));
    assert_eq!(resp.header("peerlb-served-by"), None);
    assert_eq!(
        counter(entry, "served_local"),
        local_before,
        "a 504 is not retried"
    );
    assert_eq!(counter(entry, "errors"), errors0 + 6);
    assert_eq!(counter(entry, "requests"), requests0 + 2);

    // An app answer counts in requests only; admin answers in neither.
    let ok = get(entry, &format!("/x?user={remote}"), &[]).await;
    assert_eq!((ok.status, ok.served_by()), (200, "n2"));
    assert_eq!(ok.header("peerlb-error-from"), None);
    assert_eq!(counter(entry, "errors"), errors0 + 6);
    assert_eq!(counter(entry, "requests"), requests0 + 3);
}

/// A proxied owner's 502 for an unreachable upstream app is the owner's
/// error: `peerlb-error-from` and `peerlb-served-by` name the owner,
/// `peerlb-entry` the entry, and it counts in the owner's `errors`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owners_502_names_the_owner_as_its_maker() {
    let dead = free_port();
    let c = Cluster::start(
        "owner502",
        2,
        &format!("app = \"http://127.0.0.1:{dead}\"\n[ring]\nvnodes = 1024\n"),
        USER_RULES,
    );
    let r = ring(&["n1", "n2"], 1024);
    let user = user_where(&r, |o| o == "n2");
    let owner_errors = counter(c.nodes[1].http, "errors");
    let resp = get(c.nodes[0].http, &format!("/x?user={user}"), &[]).await;
    assert_eq!(resp.status, 502);
    assert_eq!(resp.header("peerlb-entry"), Some("n1"));
    assert_eq!(resp.header("peerlb-error-from"), Some("n2"));
    assert_eq!(resp.header("peerlb-served-by"), Some("n2"));
    assert!(String::from_utf8_lossy(&resp.body).contains(&dead.to_string()));
    assert_eq!(counter(c.nodes[1].http, "errors"), owner_errors + 1);
}

/// `[headers] served_by = false, entry = false` leave both marks off app
/// answers, and `peerlb-entry` off errors (which keep `peerlb-error-from`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_headers_switches_turn_the_marks_off() {
    let c = Cluster::start(
        "noheaders",
        2,
        "[ring]\nvnodes = 1024\n",
        &format!("[headers]\nserved_by = false\nentry = false\n\n{USER_RULES}"),
    );
    let r = ring(&["n1", "n2"], 1024);
    for owner in ["n1", "n2"] {
        let user = user_where(&r, |o| o == owner);
        let resp = get(c.nodes[0].http, &format!("/x?user={user}"), &[]).await;
        assert_eq!(resp.status, 200);
        assert_eq!(
            resp.json()["node"],
            owner,
            "the app still serves at the owner"
        );
        assert_eq!(resp.header("peerlb-served-by"), None, "owner {owner}");
        assert_eq!(resp.header("peerlb-entry"), None, "owner {owner}");
    }
    let long = format!("/x?pad={}", "a".repeat(8200));
    let resp = get(c.nodes[0].http, &long, &[]).await;
    assert_eq!(resp.status, 414);
    assert_eq!(resp.header("peerlb-entry"), None);
    assert_eq!(resp.header("peerlb-error-from"), Some("n1"));
    // The defaults (both on) are what every other test sees.
    let admin = get(c.nodes[0].http, "/_peerlb/status", &[]).await;
    assert_eq!(admin.header("peerlb-entry"), None);
}

/// The admin API lives on the node's admin address only: its client port
/// answers 404 to every admin path, even to a loopback client (the same
/// host's proxy connects from 127.0.0.1), with `peerlb-entry` and without
/// routing; the admin address answers the API, 404 for an unknown admin
/// path and for any path outside it (nothing is routed there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_paths_are_404_on_the_client_port_and_answered_on_the_admin_address() {
    let c = Cluster::start("admin404", 2, "", USER_RULES);
    let entry = c.nodes[0].http;
    for path in [
        "/_peerlb/status",
        "/_peerlb/keyring",
        "/_peerlb/weight",
        "/_peerlb/nope",
    ] {
        let resp = get(entry, path, &[]).await;
        assert_eq!(resp.status, 404, "{path}: {resp:?}");
        assert_eq!(
            resp.json()["error"],
            "the admin API answers on the node's admin_addr only",
            "{path}"
        );
        assert_eq!(resp.header("peerlb-entry"), Some("n1"), "{path}");
        assert_eq!(resp.header("peerlb-served-by"), None, "{path}: not routed");
    }
    let admin = c.nodes[0].admin;
    let ok = get(admin, "/_peerlb/status", &[]).await;
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(ok.json()["node"], "n1");
    let resp = get(admin, "/_peerlb/nope", &[]).await;
    assert_eq!(resp.status, 404);
    assert_eq!(resp.json()["error"], "unknown admin path");
    let resp = get(admin, "/hello?user=alice", &[]).await;
    assert_eq!(resp.status, 404, "the admin address routes nothing");
    assert_eq!(resp.header("peerlb-served-by"), None);
}

/// The owner dies after the response head went out: the entry cuts the
/// client's connection, so the answer is visibly short of its
/// Content-Length (never a truncated body that looks complete).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_dying_mid_response_cuts_the_clients_connection() {
    let mut c = Cluster::start("midresp", 2, "[ring]\nvnodes = 1024\n", USER_RULES);
    let r = ring(&["n1", "n2"], 1024);
    let user = user_where(&r, |o| o == "n2");
    let entry = c.nodes[0].http;
    let mut s = TcpStream::connect(entry).unwrap();
    write!(
        s,
        "GET /bytes/1073741824?user={user} HTTP/1.1\r\nHost: a\r\n\r\n"
    )
    .unwrap();
    // Read until the head and some body arrived, then kill the owner.
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    while got.len() < 200_000 {
        let n = std::io::Read::read(&mut s, &mut buf).unwrap();
        assert!(n > 0, "closed before the body started");
        got.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&got[..got.len().min(512)]).into_owned();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("content-length: 1073741824"), "{head}");
    c.kill9("n2");
    // The client keeps reading: the connection ends, far short of 1 GiB.
    let (rest, closed) = tokio::task::spawn_blocking(move || read_until_closed(&mut s))
        .await
        .unwrap();
    assert!(
        closed,
        "the client's connection stays open after the owner died"
    );
    assert!(
        got.len() + rest.len() < 1 << 30,
        "the whole body arrived from a dead owner"
    );
    // The entry still serves (its own keys and, with n2 gone, all keys).
    let ok = get(entry, &format!("/x?user={user}"), &[]).await;
    assert_eq!(ok.status, 200);
}

/// 503: no candidate of the request could be reached before anything was
/// sent. n1 drains (a long grace: it still takes clients but is no
/// candidate of its own view), and n2, the only other node, dies while its
/// connection with n1 is quiet (ended by QUIC's idle timeout, which ejects
/// nobody) and gossip (phi 1000) still lists it: the request's only
/// candidate is n2, its dial fails, and n1 answers 503 with its marks
/// (docs/architecture.md, "Failover and replay": unreachable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_whose_every_candidate_is_unreachable_answers_503_with_its_marks() {
    let mut c = Cluster::start_phi(
        "errors503",
        2,
        1000,
        "[limits]\ndrain_grace_ms = 60000\nconnect_timeout_ms = 500\n[peer]\nkeep_alive_ms = 100\nidle_timeout_ms = 300\n",
        USER_RULES,
    );
    let entry = c.nodes[0].http;
    let remote = user_where(&ring(&["n1", "n2"], 1024), |o| o == "n2");
    // The pair's connection ends quietly (3 x idle_timeout_ms of no
    // traffic): n2 stays routable, and the next request to it must dial.
    c.wait_until(Duration::from_secs(30), || {
        status(entry).is_some_and(|s| {
            s["peer_connections"] == 0 && s["serving"] == serde_json::json!(["n1", "n2"])
        })
    })
    .unwrap_or_else(|_| {
        panic!(
            "n1's quiet connection to n2 did not end: {:?}",
            status(entry)
        )
    });
    c.kill9("n2");
    let mut draining = c.sigterm("n1");
    c.wait_until(Duration::from_secs(10), || {
        serving(entry).is_some_and(|s| s == ["n2"])
    })
    .unwrap_or_else(|_| panic!("n1 did not leave its own view: {:?}", status(entry)));
    let (errors0, requests0, failovers0) = (
        counter(entry, "errors"),
        counter(entry, "requests"),
        counter(entry, "failovers"),
    );
    let (text, _) = raw_exchange(
        entry,
        format!("GET /x?user={remote} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    let (status_code, head) = head_of(&text);
    assert_peerlb_error("503 no reachable candidate", status_code, 503, &head, "n1");
    assert_eq!(counter(entry, "errors"), errors0 + 1);
    assert_eq!(counter(entry, "requests"), requests0 + 1);
    assert_eq!(
        counter(entry, "failovers"),
        failovers0 + 1,
        "the dial to n2 failed: one failover, then no candidate left"
    );
    let _ = draining.kill();
    let _ = draining.wait();
}
