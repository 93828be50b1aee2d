//! The balancer-manager page (`GET /_peerlb/manager` on the admin address)
//! in a real browser: headless Chromium, driven over the Chrome DevTools
//! Protocol (a WebSocket on `--remote-debugging-port`), loads the page of
//! a running 3-node cluster, clicks a member's drain button (the page's own
//! form, with its token, posted by the browser), sees the new state on the
//! page and in every node's status, saves a screenshot under `target/tmp/`
//! for review, then sets another member's weight and puts the drained one
//! back to serving through the page. Also the page's CSRF defence, without a
//! browser.
//!
//! Without Chromium the browser test is skipped with a `SKIPPED` line,
//! unless `CI` or `PEERLB_REQUIRE_CHROMIUM` is set (`.ci/run` sets them and
//! installs Debian's `chromium`; tests/support/skip.rs).

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// `method path` on a fresh connection to `addr` with extra header lines
/// and `body`: (status, head, body).
fn raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n{headers}content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_owned(), body.to_owned())
}

/// The value of the hidden `token` field of the page's forms.
fn token_of(page: &str) -> String {
    let at = page.find("name=\"token\" value=\"").expect("a token field") + 20;
    page[at..].split('"').next().unwrap().to_owned()
}

/// Member `id`'s status in every node's view.
fn statuses_of(c: &Cluster, id: &str) -> Vec<Option<String>> {
    c.nodes
        .iter()
        .map(|n| {
            status(n.http).and_then(|v| {
                v["members"]
                    .as_array()?
                    .iter()
                    .find(|m| m["id"] == id)
                    .and_then(|m| m["status"].as_str().map(str::to_owned))
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_forms_need_the_pages_token_and_origin() {
    let c = Cluster::start("manager-csrf", 2, STEADY, "");
    let a1 = c.nodes[0].admin;
    let (code, head, page) = raw(a1, "GET", "/_peerlb/manager", "", "");
    assert_eq!(code, 200, "{page}");
    assert!(head.contains("text/html"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("x-frame-options: deny"),
        "{head}"
    );
    for id in ["n1", "n2"] {
        assert!(page.contains(&format!("id=\"member-{id}\"")), "{page}");
        assert!(page.contains(&format!("id=\"drain-{id}\"")), "{page}");
    }
    let token = token_of(&page);
    assert_eq!(token.len(), 32);
    let form = |t: &str| format!("token={t}&node=n2&action=draining");
    let ct = "content-type: application/x-www-form-urlencoded\r\n";
    // No token, a wrong one, a foreign Origin: refused, n2 untouched.
    let (code, _, body) = raw(
        a1,
        "POST",
        "/_peerlb/manager",
        ct,
        "node=n2&action=draining",
    );
    assert_eq!(code, 403, "{body}");
    let (code, _, _) = raw(a1, "POST", "/_peerlb/manager", ct, &form(&"0".repeat(32)));
    assert_eq!(code, 403);
    let evil = format!("{ct}origin: http://evil.example\r\n");
    let (code, _, _) = raw(a1, "POST", "/_peerlb/manager", &evil, &form(&token));
    assert_eq!(code, 403);
    let (code, _, body) = raw(
        a1,
        "POST",
        "/_peerlb/manager",
        ct,
        &format!("token={token}&node=n2&action=leaving"),
    );
    assert_eq!(code, 400, "{body}");
    assert_eq!(
        statuses_of(&c, "n2"),
        [Some("serving".into()), Some("serving".into())]
    );
    // The page's own token from its own origin: applied, then a redirect
    // back to the page with the outcome.
    let same = format!("{ct}origin: http://{a1}\r\n");
    let (code, head, _) = raw(a1, "POST", "/_peerlb/manager", &same, &form(&token));
    assert_eq!(code, 303, "{head}");
    assert!(
        head.contains("location: /_peerlb/manager?msg=n2%3A%20draining"),
        "{head}"
    );
    poll(Duration::from_secs(20), || {
        statuses_of(&c, "n2")
            .iter()
            .all(|s| s.as_deref() == Some("draining"))
    })
    .expect("n2 draining everywhere");
    // Another node's page has its own token.
    let (_, _, page2) = raw(c.nodes[1].admin, "GET", "/_peerlb/manager", "", "");
    assert_ne!(token_of(&page2), token);
    // The page is not on the client ports.
    assert_eq!(
        raw(c.nodes[0].http, "GET", "/_peerlb/manager", "", "").0,
        404
    );
}

/// Headless Chromium with the DevTools protocol on an ephemeral port.
struct Browser {
    child: Child,
    profile: std::path::PathBuf,
    ws: tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

impl Drop for Browser {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group of our own child.
        unsafe { libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL) };
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// A browser process until [`Browser`] takes it over.
struct Started(Option<Child>, std::path::PathBuf);

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            // SAFETY: kill(2) on the process group of our own child.
            unsafe { libc::kill(-(c.id() as libc::pid_t), libc::SIGKILL) };
            let _ = c.wait();
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }
}

impl Browser {
    /// Starts Chromium and connects to its first page.
    fn start(exe: &std::path::Path) -> Browser {
        let profile = temp_dir("manager-chromium");
        use std::os::unix::process::CommandExt as _;
        let mut child = Command::new(exe)
            // Its own process group: the browser's helper processes end
            // with it (`Drop`).
            .process_group(0)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--window-size=1400,700",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting chromium");
        let stderr = child.stderr.take().unwrap();
        // Ends the browser if the start fails half way.
        let mut guard = Started(Some(child), profile);
        // "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/..."
        let mut lines = BufReader::new(stderr).lines();
        let port: u16 = loop {
            let line = lines
                .next()
                .expect("chromium ended before its DevTools address")
                .unwrap();
            if let Some(url) = line.strip_prefix("DevTools listening on ws://") {
                break url
                    .split('/')
                    .next()
                    .and_then(|hp| hp.rsplit(':').next())
                    .and_then(|p| p.parse().ok())
                    .expect("a DevTools port");
            }
        };
        // Keep reading chromium's stderr so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        let devtools: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut page_ws = None;
        poll(Duration::from_secs(30), || {
            let Ok(mut s) = TcpStream::connect(devtools) else {
                return false;
            };
            // HTTP/1.1: Chromium's DevTools server answers HTTP/1.0 with
            // nothing.
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = write!(
                s,
                "GET /json/list HTTP/1.1\r\nhost: {devtools}\r\nconnection: close\r\n\r\n"
            );
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            let Some((_, body)) = out.split_once("\r\n\r\n") else {
                return false;
            };
            let targets: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
            page_ws = targets.as_array().and_then(|ts| {
                ts.iter()
                    .find(|t| t["type"] == "page")
                    .and_then(|t| t["webSocketDebuggerUrl"].as_str().map(str::to_owned))
            });
            page_ws.is_some()
        })
        .expect("chromium lists its page");
        let (ws, _) = tungstenite::connect(page_ws.unwrap()).expect("the page's DevTools socket");
        if let tungstenite::stream::MaybeTlsStream::Plain(s) = ws.get_ref() {
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        }
        let child = guard.0.take().unwrap();
        let profile = guard.1.clone();
        let mut b = Browser {
            child,
            profile,
            ws,
            next_id: 0,
        };
        b.call("Page.enable", serde_json::json!({}));
        b
    }

    /// Sends a DevTools command and waits for its result (events before it
    /// are dropped).
    fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        self.next_id += 1;
        let id = self.next_id;
        let msg = serde_json::json!({ "id": id, "method": method, "params": params });
        self.ws
            .send(tungstenite::Message::text(msg.to_string()))
            .unwrap();
        loop {
            let m = self.read();
            if m["id"] == id {
                assert!(m["error"].is_null(), "{method}: {m}");
                return m["result"].clone();
            }
        }
    }

    fn read(&mut self) -> serde_json::Value {
        loop {
            match self.ws.read().expect("a DevTools message") {
                tungstenite::Message::Text(t) => return serde_json::from_str(&t).unwrap(),
                _ => continue,
            }
        }
    }

    /// Waits for the page's next `load` event.
    fn wait_load(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self.read()["method"] == "Page.loadEventFired" {
                return;
            }
        }
        panic!("the page did not load");
    }

    /// Navigates to `url` and waits until it has loaded.
    fn open(&mut self, url: &str) {
        self.call("Page.navigate", serde_json::json!({ "url": url }));
        self.wait_load();
    }

    /// Evaluates `js` in the page: its value.
    fn eval(&mut self, js: &str) -> serde_json::Value {
        let r = self.call(
            "Runtime.evaluate",
            serde_json::json!({ "expression": js, "returnByValue": true, "awaitPromise": true }),
        );
        r["result"]["value"].clone()
    }

    /// The text of the first element `selector` matches (null if none).
    fn text(&mut self, selector: &str) -> serde_json::Value {
        self.eval(&format!(
            "(e => e ? e.textContent : null)(document.querySelector({}))",
            serde_json::Value::from(selector)
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manager_page_drains_a_member_in_headless_chromium() {
    let Some(exe) = support::skip::tool(
        &["chromium", "chromium-browser"],
        "PEERLB_REQUIRE_CHROMIUM",
        "apt-get install -y chromium",
    ) else {
        return;
    };
    let c = Cluster::start("manager-page", 3, STEADY, "");
    // Some traffic, so the served counters (asked of each member over the
    // peer link) are not all zero.
    for i in 0..9 {
        assert_eq!(
            get(c.nodes[i % 3].http, &format!("/warm{i}"), &[])
                .await
                .status,
            200
        );
    }
    let url = format!("http://{}/_peerlb/manager", c.nodes[0].admin);
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("manager-drained.png");
    let c_ref = &c;
    // The browser is blocking: run it off the runtime's threads.
    let (before, after, msg, served, shot_len) = tokio::task::spawn_blocking({
        let shot = shot.clone();
        let exe = exe.clone();
        let statuses: Box<dyn Fn() -> Vec<Option<String>> + Send> = {
            let nodes = c_ref.nodes.clone();
            Box::new(move || {
                nodes
                    .iter()
                    .map(|n| {
                        status(n.http).and_then(|v| {
                            v["members"]
                                .as_array()?
                                .iter()
                                .find(|m| m["id"] == "n2")
                                .and_then(|m| m["status"].as_str().map(str::to_owned))
                        })
                    })
                    .collect()
            })
        };
        let weights_of_n3 = {
            let nodes = c_ref.nodes.clone();
            move || -> Vec<Option<u64>> {
                nodes
                    .iter()
                    .map(|n| {
                        status(n.http).and_then(|v| {
                            v["members"]
                                .as_array()?
                                .iter()
                                .find(|m| m["id"] == "n3")
                                .and_then(|m| m["weight"].as_u64())
                        })
                    })
                    .collect()
            }
        };
        move || {
            let mut b = Browser::start(&exe);
            b.open(&url);
            let before = b.text("#member-n2 td.state");
            let served = b.eval(
                "[...document.querySelectorAll('#members td.served')].map(e => e.textContent)",
            );
            // The script runs: the page says it is live. A marker set now
            // would be lost by any reload.
            poll(Duration::from_secs(10), || {
                b.text("#live")
                    .as_str()
                    .is_some_and(|t| t.starts_with("Live"))
            })
            .expect("the page's script refreshes it");
            b.eval("window.peerlbMarker = 42");
            // Click n2's drain button: the script posts the page's form and
            // the row shows the state asked at once, before gossip.
            assert_eq!(
                b.eval("document.querySelector('#drain-n2 button').click(); 'clicked'"),
                "clicked"
            );
            let clicked = Instant::now();
            poll(Duration::from_secs(5), || {
                b.text("#member-n2 td.note") == "n2: draining"
            })
            .unwrap_or_else(|()| panic!("no outcome in n2's row: {}", b.text("#member-n2")));
            let msg = b.text("#member-n2 td.note");
            let after = b.text("#member-n2 td.state");
            let shown_in = clicked.elapsed();
            poll(Duration::from_secs(20), || {
                statuses().iter().all(|s| s.as_deref() == Some("draining"))
            })
            .unwrap_or_else(|()| panic!("not every node sees n2 draining: {:?}", statuses()));
            // Once gossip brings it back, the row says so from the data itself.
            poll(Duration::from_secs(10), || {
                b.text("#member-n2 td.state") == "draining"
                    && b.eval("document.querySelector('#member-n2').dataset.status") == "draining"
            })
            .expect("n2's row draining from the data");
            let png = b.call(
                "Page.captureScreenshot",
                serde_json::json!({ "format": "png" }),
            );
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(png["data"].as_str().unwrap())
                .unwrap();
            std::fs::write(&shot, &bytes).unwrap();
            // The weight form: n3 to 200, asked of n1, applied by n3.
            assert_eq!(
                b.eval(
                    "document.querySelector('#weight-n3 input[name=weight]').value = '200'; \
                     document.querySelector('#weight-n3 button').click(); 'clicked'"
                ),
                "clicked"
            );
            poll(Duration::from_secs(5), || {
                b.text("#member-n3 td.note") == "n3: weight 200"
            })
            .unwrap_or_else(|()| panic!("no outcome in n3's row: {}", b.text("#member-n3")));
            poll(Duration::from_secs(20), || {
                weights_of_n3().iter().all(|w| *w == Some(200))
            })
            .unwrap_or_else(|()| panic!("n3's weight everywhere: {:?}", weights_of_n3()));
            // A refused change: a sentence in the row, not JSON.
            assert_eq!(
                b.eval(
                    // Past the field's own max (which the browser checks), as
                    // a stale page or another client could send it.
                    "document.querySelector('#weight-n3 input[name=weight]').removeAttribute('max'); \
                     document.querySelector('#weight-n3 input[name=weight]').value = '20000'; \
                     document.querySelector('#weight-n3 button').click(); 'clicked'"
                ),
                "clicked"
            );
            poll(Duration::from_secs(5), || {
                b.text("#member-n3 td.note")
                    == "n3 refused the change (422): Weight 20000 is out of range 0..=10000."
            })
            .unwrap_or_else(|()| panic!("no refusal in n3's row: {}", b.text("#member-n3")));
            // And n2 back to serving.
            assert_eq!(
                b.eval("document.querySelector('#serve-n2 button').click(); 'clicked'"),
                "clicked"
            );
            poll(Duration::from_secs(5), || {
                b.text("#member-n2 td.note") == "n2: serving"
            })
            .unwrap_or_else(|()| panic!("no outcome in n2's row: {}", b.text("#member-n2")));
            poll(Duration::from_secs(20), || {
                statuses().iter().all(|s| s.as_deref() == Some("serving"))
            })
            .unwrap_or_else(|()| panic!("n2 back to serving everywhere: {:?}", statuses()));
            // Never reloaded.
            assert_eq!(b.eval("window.peerlbMarker"), 42);
            assert!(
                shown_in < Duration::from_secs(2),
                "the row took {shown_in:?}"
            );
            (before, after, msg, served, bytes.len())
        }
    })
    .await
    .unwrap();
    assert_eq!(before, "serving");
    assert_eq!(msg, "n2: draining");
    assert!(
        after.as_str().is_some_and(|a| a.starts_with("draining")),
        "{after}"
    );
    // Every member's own counters reached the page: no "?".
    let served: Vec<u64> = served
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().parse().expect("a count, not '?'"))
        .collect();
    assert_eq!(served.len(), 3);
    assert_eq!(served.iter().sum::<u64>(), 9);
    assert!(shot_len > 1000, "screenshot of {shot_len} bytes");
    eprintln!("screenshot: {}", shot.display());
}

/// Peer links that notice a dead member in well under a second (keep-alive
/// 100 ms, idle timeout 600 ms), so the 2 s the page is given measure the
/// page, not the failure detector.
const QUICK: &str = "[peer]\nkeep_alive_ms = 100\nidle_timeout_ms = 600\n\n";

/// After `kill -9` of a member, the open page turns its row red (`failed`,
/// with its downtime) within 2 s, without a reload; the page's JSON
/// matches the status API (the view's members and the roster); the
/// metrics and `peerlb status` show it failed; forgetting it on the page
/// removes the row. The screenshot of the red row is the one in docs/.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_member_turns_red_on_the_open_page() {
    let Some(exe) = which("chromium").or_else(|| which("chromium-browser")) else {
        assert!(
            std::env::var_os("PEERLB_REQUIRE_CHROMIUM").is_none(),
            "chromium is missing but this run requires it (PEERLB_REQUIRE_CHROMIUM is set)"
        );
        eprintln!(
            "SKIPPED: chromium is not installed (apt-get install -y chromium, or run .ci/run)"
        );
        return;
    };
    let mut c = Cluster::start("manager-kill", 3, QUICK, "");
    for i in 0..6 {
        assert_eq!(
            get(c.nodes[i % 3].http, &format!("/k{i}"), &[])
                .await
                .status,
            200
        );
    }
    let admin = c.nodes[0].admin;
    let url = format!("http://{admin}/_peerlb/manager");
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("manager-failed-member.png");
    let mut b = tokio::task::spawn_blocking({
        let exe = exe.clone();
        move || {
            let mut b = Browser::start(&exe);
            b.open(&url);
            poll(Duration::from_secs(10), || {
                b.text("#live")
                    .as_str()
                    .is_some_and(|t| t.starts_with("Live"))
            })
            .expect("the page's script refreshes it");
            // The request rate's chart: a line of one point per refresh,
            // drawn once two rates are known (a refresh a second).
            poll(Duration::from_secs(10), || {
                b.eval(
                    "(document.querySelector('#member-n1 td.rate svg polyline')?.getAttribute('points') || '').split(' ').filter(p => p).length",
                )
                .as_u64()
                .is_some_and(|n| n >= 2)
            })
            .expect("n1's rate chart drawn");
            b.eval("window.peerlbMarker = 7");
            b
        }
    })
    .await
    .unwrap();
    c.kill9("n3");
    let killed = Instant::now();
    let (b2, red_after, state_text) = tokio::task::spawn_blocking(move || {
        let mut red_after = None;
        while killed.elapsed() < Duration::from_secs(10) {
            if b.eval("document.querySelector('#member-n3').className") == "failed" {
                red_after = Some(killed.elapsed());
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let text = b.text("#member-n3 td.state");
        (b, red_after, text)
    })
    .await
    .unwrap();
    b = b2;
    let red_after =
        red_after.unwrap_or_else(|| panic!("n3's row never turned failed: {state_text}"));
    assert!(
        state_text
            .as_str()
            .is_some_and(|t| t.starts_with("failed, down ")),
        "{state_text}"
    );
    assert!(
        red_after <= Duration::from_secs(2),
        "n3's row turned red {red_after:?} after the kill"
    );
    // Red, as the legend says: the row's background.
    let bg = tokio::task::block_in_place(|| {
        b.eval("getComputedStyle(document.querySelector('#member-n3')).backgroundColor")
    });
    assert_eq!(bg, "rgb(248, 200, 200)");
    // The page's own JSON (fetched by the page) against the status API.
    let matches = |b: &mut Browser| -> Result<(), String> {
        let data = b.eval(
            "fetch('/_peerlb/manager/data').then(r => r.json()).then(d => d.members.map(m => [m.id, m.state, m.status, m.weight]))",
        );
        let st = status(c.nodes[0].http).ok_or("no status")?;
        let mut want: Vec<serde_json::Value> = st["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| serde_json::json!([m["id"], "alive", m["status"], m["weight"]]))
            .collect();
        want.extend(
            st["roster"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["state"] != "alive")
                .map(|r| serde_json::json!([r["id"], r["state"], r["status"], r["weight"]])),
        );
        (data == serde_json::Value::from(want.clone()))
            .then_some(())
            .ok_or_else(|| format!("page {data} vs status {want:?}"))
    };
    let mut last = Err(String::new());
    let compared = tokio::task::block_in_place(|| {
        poll(Duration::from_secs(5), || {
            last = matches(&mut b);
            last.is_ok()
        })
    });
    compared.unwrap_or_else(|()| panic!("{last:?}"));
    let st = status(c.nodes[0].http).unwrap();
    let n3 = st["roster"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "n3")
        .unwrap()
        .clone();
    assert_eq!(n3["state"], "failed", "{n3}");
    assert!(n3["reason"].as_str().is_some_and(|r| !r.is_empty()), "{n3}");
    assert!(n3["last_heard_ms_ago"].as_u64().is_some(), "{n3}");
    assert!(!st["serving"].as_array().unwrap().contains(&"n3".into()));
    // The metrics and the CLI's table.
    let (_, _, metrics) = raw(admin, "GET", "/_peerlb/metrics", "", "");
    assert!(
        metrics.contains("peerlb_member_up{member=\"n3\"} 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("peerlb_member_up{member=\"n1\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("peerlb_member_state{member=\"n3\"} 1"),
        "{metrics}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_peerlb"))
        .args(["status", "--node-addr", &admin.to_string()])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("n3 ") && l.contains("FAILED")),
        "{table}"
    );
    // The screenshot of the red row, then forget n3 from the page.
    tokio::task::block_in_place(|| {
        let png = b.call(
            "Page.captureScreenshot",
            serde_json::json!({ "format": "png" }),
        );
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png["data"].as_str().unwrap())
            .unwrap();
        std::fs::write(&shot, &bytes).unwrap();
        assert_eq!(
            b.eval("document.querySelector('#forget-n3 button').click(); 'clicked'"),
            "clicked"
        );
        poll(Duration::from_secs(5), || {
            b.eval("document.querySelector('#member-n3') === null") == true
        })
        .expect("n3's row gone once forgotten");
        assert_eq!(b.eval("window.peerlbMarker"), 7, "the page reloaded");
    });
    eprintln!(
        "n3's row red {red_after:?} after the kill; screenshot: {}",
        shot.display()
    );
    let st = status(c.nodes[0].http).unwrap();
    assert!(
        !st["roster"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["id"] == "n3"),
        "{st}"
    );
}
