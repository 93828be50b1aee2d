//! Bad answers from apps and bad files from operators cost an error answer,
//! never the node: stale keep-alive connections to the app, broken framing
//! (Content-Length beside Transfer-Encoding, a 101 nobody asked for),
//! bodiless answers framed the same on the local and the forwarded path,
//! an app on a Unix domain socket, and rules files that are too deep or
//! compile too big. Real `peerlb` processes on loopback; the apps are raw
//! HTTP/1.1 servers in the test process, so they can misbehave exactly.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How the raw app treats a keep-alive connection.
#[derive(Clone, Copy, PartialEq)]
enum Conns {
    /// Keeps it open.
    KeepAlive,
    /// Closes it right after each response, without `Connection: close`.
    CloseAfterEach,
    /// Closes it once it has been idle this long.
    IdleClose(Duration),
}

/// A raw HTTP/1.1 app: answers each request with `answer(method, path)`
/// (written as is), counts requests per path.
#[derive(Clone)]
struct RawApp {
    addr: SocketAddr,
    seen: Arc<Mutex<BTreeMap<String, u64>>>,
}

impl RawApp {
    async fn start(conns: Conns, answer: fn(&str, &str) -> String) -> RawApp {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let app = RawApp {
            addr: l.local_addr().unwrap(),
            seen: Arc::default(),
        };
        let seen = app.seen.clone();
        tokio::spawn(async move {
            loop {
                let (mut c, _) = l.accept().await.unwrap();
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 8192];
                    loop {
                        let read = c.read(&mut chunk);
                        let n = match conns {
                            Conns::IdleClose(d) if buf.is_empty() => {
                                match tokio::time::timeout(d, read).await {
                                    Ok(r) => r,
                                    Err(_) => return,
                                }
                            }
                            _ => read.await,
                        };
                        match n {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                            let len = content_length(&head).unwrap_or(0);
                            if buf.len() < end + 4 + len {
                                break;
                            }
                            buf.drain(..end + 4 + len);
                            let mut first = head.split_whitespace();
                            let method = first.next().unwrap_or("").to_owned();
                            let target = first.next().unwrap_or("");
                            let path = target.split('?').next().unwrap_or("").to_owned();
                            *seen.lock().unwrap().entry(path.clone()).or_default() += 1;
                            if c.write_all(answer(&method, &path).as_bytes())
                                .await
                                .is_err()
                            {
                                return;
                            }
                            if conns == Conns::CloseAfterEach {
                                return;
                            }
                        }
                    }
                });
            }
        });
        app
    }

    fn seen(&self, path: &str) -> u64 {
        self.seen.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

fn ok(_: &str, _: &str) -> String {
    "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".into()
}

/// A 2-node cluster keyed on `user`, both nodes serving with `app`; the
/// users n1 serves itself and forwards to n2.
fn cluster(tag: &str, app: &str) -> (Cluster, String, String) {
    let c = Cluster::start(
        tag,
        2,
        &format!("app = \"{app}\"\n[ring]\nvnodes = 1024\n{STEADY}"),
        USER_RULES,
    );
    let r = ring(&["n1", "n2"], 1024);
    let local = user_where(&r, |o| o == "n1");
    let remote = user_where(&r, |o| o == "n2");
    (c, local, remote)
}

/// An app that closes its connection right after each response without
/// saying so: 400 GETs on 4 keep-alive client connections, half served on
/// the entry and half forwarded, all answered 200, each reaching the app
/// once (the pool sends a request the app closed unanswered again, on a
/// new connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_closing_after_each_response_fails_no_get() {
    let app = RawApp::start(Conns::CloseAfterEach, ok).await;
    let (c, local, remote) = cluster("closeeach", &format!("http://{}", app.addr));
    let entry = c.nodes[0].http;
    let mut tasks = Vec::new();
    for i in 0..4 {
        let (local, remote) = (local.clone(), remote.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::open(entry).await.unwrap();
            let mut bad = Vec::new();
            for j in 0..100 {
                let user = if (i + j) % 2 == 0 { &local } else { &remote };
                match conn.get(&format!("/ok?user={user}"), &[]).await {
                    Ok(r) if r.status == 200 => {}
                    Ok(r) => bad.push(format!("{} {:?}", r.status, r.body)),
                    Err(e) => bad.push(e),
                }
            }
            bad
        }));
    }
    let mut bad = Vec::new();
    for t in tasks {
        bad.extend(t.await.unwrap());
    }
    assert!(
        bad.is_empty(),
        "{} failed: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    assert_eq!(app.seen("/ok"), 400, "each GET reached the app once");
}

/// An app that closes connections idle for 1 s (below peerlb's 2 s
/// default idle time): GETs spaced about 1 s apart, local and forwarded,
/// all answered 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_closing_idle_connections_after_a_second_fails_no_get() {
    let app = RawApp::start(Conns::IdleClose(Duration::from_millis(1000)), ok).await;
    let (c, local, remote) = cluster("idleclose", &format!("http://{}", app.addr));
    let entry = c.nodes[0].http;
    let mut conn = Conn::open(entry).await.unwrap();
    for round in 0..5 {
        for user in [&local, &remote] {
            let r = conn.get(&format!("/ok?user={user}"), &[]).await.unwrap();
            assert_eq!(r.status, 200, "round {round}: {:?}", r.body);
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
}

/// Raw answers of the framing app, by path.
fn framing(method: &str, path: &str) -> String {
    match (method, path) {
        (_, "/both") => "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".into(),
        (_, "/switch") => "HTTP/1.1 101 Switching Protocols\r\n\r\n".into(),
        ("HEAD", "/head-chunked") => "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".into(),
        ("HEAD", "/head-len") => "HTTP/1.1 200 OK\r\ncontent-length: 1234\r\n\r\n".into(),
        (_, "/no-content") => "HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n".into(),
        (_, "/not-modified") => "HTTP/1.1 304 Not Modified\r\netag: \"v1\"\r\n\r\n".into(),
        _ => ok(method, path),
    }
}

/// A raw answer's status, its header lines (lowercase, sorted, without
/// those that name a node or the time), and its body.
fn answer(entry: SocketAddr, method: &str, target: &str) -> (u16, Vec<String>, String) {
    let (text, _) = raw_exchange(
        entry,
        format!("{method} {target} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut lines: Vec<String> = head
        .lines()
        .skip(1)
        .map(str::to_ascii_lowercase)
        .filter(|l| {
            ![
                "date:",
                "peerlb-served-by:",
                "peerlb-entry:",
                "peerlb-error-from:",
            ]
            .iter()
            .any(|p| l.starts_with(p))
        })
        .collect();
    lines.sort();
    (status, lines, body.to_owned())
}

/// Framing faults of an app and bodiless answers, local and forwarded:
/// the forwarded path sends exactly what the local path sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_framing_is_answered_the_same_on_both_paths() {
    let app = RawApp::start(Conns::KeepAlive, framing).await;
    let (c, local, remote) = cluster("framing", &format!("http://{}", app.addr));
    let entry = c.nodes[0].http;
    let both = |method: &str, path: &str| {
        let l = answer(entry, method, &format!("{path}?user={local}"));
        let r = answer(entry, method, &format!("{path}?user={remote}"));
        assert_eq!(l, r, "{method} {path}: local then forwarded");
        l
    };
    // Content-Length beside Transfer-Encoding: the length is dropped.
    let (status, lines, body) = both("GET", "/both");
    assert_eq!(status, 200);
    assert!(
        !lines.iter().any(|l| l.starts_with("content-length")),
        "{lines:?}"
    );
    assert!(
        lines.contains(&"transfer-encoding: chunked".to_owned()),
        "{lines:?}"
    );
    assert!(body.contains("hello"), "{body:?}");
    // A 101 nobody asked for: 502 naming the cause.
    let (status, _, body) = both("GET", "/switch");
    assert_eq!(status, 502);
    assert!(body.contains("101 Switching Protocols"), "{body:?}");
    // HEAD of a chunked answer: no length invented.
    let (status, lines, _) = both("HEAD", "/head-chunked");
    assert_eq!(status, 200);
    assert!(
        !lines.iter().any(|l| l.starts_with("content-length")),
        "{lines:?}"
    );
    // HEAD with the app's length: kept.
    let (_, lines, _) = both("HEAD", "/head-len");
    assert!(
        lines.contains(&"content-length: 1234".to_owned()),
        "{lines:?}"
    );
    // 204 with a length: dropped; 304: none invented.
    let (status, lines, _) = both("GET", "/no-content");
    assert_eq!(status, 204);
    assert!(
        !lines.iter().any(|l| l.starts_with("content-length")),
        "{lines:?}"
    );
    let (status, lines, _) = both("GET", "/not-modified");
    assert_eq!(status, 304);
    assert!(
        !lines.iter().any(|l| l.starts_with("content-length")),
        "{lines:?}"
    );
    assert!(lines.contains(&"etag: \"v1\"".to_owned()), "{lines:?}");
    // The node still serves.
    assert_eq!(both("GET", "/ok").0, 200);
}

/// `peerlb app --listen unix:<path>`, waiting until the socket is there.
fn unix_app(path: &std::path::Path) -> std::process::Child {
    let child = Command::new(bin())
        .args(["app", "--name", "sock", "--listen"])
        .arg(format!("unix:{}", path.display()))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    poll(Duration::from_secs(20), || path.exists()).expect("the app's socket appears");
    child
}

/// An app on a Unix domain socket (`app = "unix:/path"`), served by the
/// built-in app listening there: JSON answers, bodies streamed both ways,
/// local and forwarded; a missing socket is a 502 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_on_a_unix_socket_is_served_and_streams_both_ways() {
    let dir = temp_dir("unixapp");
    let sock = dir.join("app.sock");
    let mut app = unix_app(&sock);
    let (mut c, local, remote) = cluster("unixapp", &format!("unix:{}", sock.display()));
    let entry = c.nodes[0].http;
    for user in [&local, &remote] {
        let r = get(entry, &format!("/x?user={user}"), &[]).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.json()["node"], "sock");
        // A streamed response body.
        let r = get(entry, &format!("/bytes/3000000?user={user}"), &[]).await;
        assert_eq!(r.body.len(), 3_000_000);
        // A streamed request body, echoed back.
        let sent: Vec<u8> = (0..2_000_000u32).map(|i| (i % 253) as u8).collect();
        let mut conn = Conn::open(entry).await.unwrap();
        let r = conn
            .request(
                "POST",
                &format!("/echo?user={user}"),
                &[],
                Bytes::from(sent.clone()),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        assert!(r.body == sent, "echoed {} bytes", r.body.len());
    }
    let _ = app.kill();
    let _ = app.wait();
    let _ = std::fs::remove_file(&sock);
    for user in [&local, &remote] {
        let r = get(entry, &format!("/x?user={user}"), &[]).await;
        assert_eq!(r.status, 502, "{:?}", r.body);
        let body = String::from_utf8_lossy(&r.body);
        assert!(
            body.contains(&format!("unix:{}", sock.display())) && body.contains("No such file"),
            "{body}"
        );
    }
    c.kill9("n2");
}

/// `peerlb check-config` on `text` (with `files` beside it): exit code
/// and stderr.
fn check_config(tag: &str, text: &str, files: &[(&str, &str)]) -> (i32, String) {
    let dir = temp_dir(tag);
    for (name, content) in files {
        write(&dir, name, content);
    }
    let cfg = write(&dir, "cluster.toml", text);
    let out = Command::new(bin())
        .args(["check-config", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const ONE_NODE: &str = "[[nodes]]\nid = \"n1\"\nhttp_addr = \"127.0.0.1:7001\"\npeer_addr = \"127.0.0.1:7101\"\ngossip_addr = \"127.0.0.1:7201\"\n";

#[test]
fn a_bad_unix_socket_path_is_a_config_error_naming_app() {
    let long = format!("unix:/{}", "s".repeat(120));
    for (app, want) in [
        ("unix:", "empty"),
        ("unix:run/app.sock", "absolute"),
        (long.as_str(), "longer than the 107"),
        ("unix:/run/", "directory"),
    ] {
        let (code, err) = check_config("badsock", &format!("app = \"{app}\"\n{ONE_NODE}"), &[]);
        assert_eq!(code, 64, "{app}: {err}");
        assert!(
            err.contains(": app: ") && err.contains(want),
            "{app}: {err}"
        );
    }
    let (code, err) = check_config(
        "goodsock",
        &format!("app = \"unix:/run/app.sock\"\n{ONE_NODE}"),
        &[],
    );
    assert_eq!(code, 0, "{err}");
}

fn xml_rules(body: &str) -> String {
    format!("<user-centric-rules><http-rules>\n{body}</http-rules></user-centric-rules>\n")
}

/// 5,200 nested `<or>` (a stack overflow, exit 134, before) and 40
/// regexes of `(\w{200})` (490 MB compiled, before): exit 64 with the
/// element named.
#[test]
fn check_config_refuses_deep_and_huge_rules_files_with_64() {
    let deep = xml_rules(&format!(
        "{}<header name=\"x\"><exist/></header>{}\n",
        "<or>".repeat(5_200),
        "</or>".repeat(5_200)
    ));
    let huge = xml_rules(&"<request-uri><match>(\\w{200})</match></request-uri>\n".repeat(40));
    for (name, text, want) in [
        ("deep.xml", deep.as_str(), "nested deeper than 64 levels"),
        ("huge.xml", huge.as_str(), "regex too big"),
    ] {
        let (code, err) = check_config(
            "badrules",
            &format!("rules_file = \"{name}\"\n{ONE_NODE}"),
            &[(name, text)],
        );
        assert_eq!(code, 64, "{name}: {err}");
        assert!(err.contains(want), "{name}: {err}");
    }
}

/// A live reload of a rules file that is too deep answers 422 and keeps
/// the rules in force; the node keeps serving and routing by them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_reload_of_a_bad_rules_file_keeps_the_old_rules() {
    let user_xml = xml_rules(
        "<request-uri parameter=\"user\" return=\"parameter.user\"><exist/></request-uri>\n",
    );
    let rules = write(&temp_dir("reloadrules"), "rules.xml", &user_xml);
    let c = Cluster::start(
        "reload",
        2,
        &format!(
            "rules_file = \"{}\"\n[ring]\nvnodes = 1024\n{STEADY}",
            rules.display()
        ),
        "",
    );
    let entry = c.nodes[0].http;
    let r = ring(&["n1", "n2"], 1024);
    let remote = user_where(&r, |o| o == "n2");
    let reload = || {
        raw_exchange(
            admin_of(entry),
            b"POST /_peerlb/rules/reload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .0
    };
    assert!(reload().starts_with("HTTP/1.1 200"), "good file");
    std::fs::write(
        &rules,
        xml_rules(&format!(
            "{}<header name=\"x\"><exist/></header>{}\n",
            "<or>".repeat(5_200),
            "</or>".repeat(5_200)
        )),
    )
    .unwrap();
    let text = reload();
    assert!(text.starts_with("HTTP/1.1 422"), "{text}");
    assert!(text.contains("nested deeper than 64 levels"), "{text}");
    // The user rule is still in force: routed to its owner.
    for _ in 0..3 {
        let r = get(entry, &format!("/x?user={remote}"), &[]).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["key"], remote.as_str());
        assert_eq!(r.served_by(), "n2");
    }
}
