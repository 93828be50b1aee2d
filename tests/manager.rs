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
            serde_json::json!({ "expression": js, "returnByValue": true }),
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
            // Click n2's drain button: the browser posts the page's form.
            assert_eq!(
                b.eval("document.querySelector('#drain-n2 button').click(); 'clicked'"),
                "clicked"
            );
            b.wait_load();
            let msg = b.text("#msg");
            // The state spreads by gossip: reload until the page shows it.
            let mut after = b.text("#member-n2 td.state");
            let deadline = Instant::now() + Duration::from_secs(20);
            while after != "draining" && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(200));
                b.open(&url);
                after = b.text("#member-n2 td.state");
            }
            poll(Duration::from_secs(20), || {
                statuses().iter().all(|s| s.as_deref() == Some("draining"))
            })
            .unwrap_or_else(|()| panic!("not every node sees n2 draining: {:?}", statuses()));
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
            b.wait_load();
            assert_eq!(b.text("#msg"), "n3: weight 200");
            poll(Duration::from_secs(20), || {
                weights_of_n3().iter().all(|w| *w == Some(200))
            })
            .unwrap_or_else(|()| panic!("n3's weight everywhere: {:?}", weights_of_n3()));
            // And n2 back to serving.
            assert_eq!(
                b.eval("document.querySelector('#serve-n2 button').click(); 'clicked'"),
                "clicked"
            );
            b.wait_load();
            assert_eq!(b.text("#msg"), "n2: serving");
            poll(Duration::from_secs(20), || {
                statuses().iter().all(|s| s.as_deref() == Some("serving"))
            })
            .unwrap_or_else(|()| panic!("n2 back to serving everywhere: {:?}", statuses()));
            (before, after, msg, served, bytes.len())
        }
    })
    .await
    .unwrap();
    assert_eq!(before, "serving");
    assert_eq!(msg, "n2: draining");
    assert_eq!(after, "draining");
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
