//! Passive sticky routes (`[sticky.session]`): an app that names the
//! server holding a session inside its own session id (WebLogic's
//! `JSESSIONID=id!primary!secondary`) keeps its sessions on that server
//! from every entry node, and on the secondary once the primary is gone.
//! peerlb reads the id and never rewrites it. Real `peerlb` processes on
//! loopback; the app is an HTTP server in the test process.

// Black-box tests of real processes: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use support::*;

/// The session id the app hands out: held by n2, replicated on n3.
const SESSION: &str = "A1b2C3!n2!n3";

/// An app whose `/login` starts a WebLogic-style session (`Set-Cookie:
/// JSESSIONID=A1b2C3!n2!n3; Path=/`, as a WebLogic cluster whose server n2
/// holds the session and n3 its replica); every path answers its own path
/// and the `Cookie` it received, so the test sees what reached the app.
async fn start_app() -> SocketAddr {
    use hyper::service::service_fn;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                let svc = service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                    let v = serde_json::json!({
                        "path": req.uri().path(),
                        "cookie": req.headers().get("cookie").map(|c| c.to_str().unwrap_or("")),
                    });
                    let mut resp = http::Response::builder();
                    if req.uri().path() == "/login" {
                        resp = resp.header("set-cookie", format!("JSESSIONID={SESSION}; Path=/"));
                    }
                    Ok::<_, std::convert::Infallible>(
                        resp.body(Full::new(Bytes::from(v.to_string()))).unwrap(),
                    )
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weblogic_session_id_keeps_its_node_from_every_entry_then_fails_over_to_the_secondary() {
    let app = start_app().await;
    let mut c = Cluster::start(
        "sessions-weblogic",
        3,
        &format!(
            "app = \"http://{app}\"\npolicy = \"round-robin\"\n[sticky.session]\ncookie = \"JSESSIONID\"\npath_param = \"jsessionid\"\nformat = \"weblogic\"\n{STEADY}"
        ),
        "",
    );
    // The app starts the session; peerlb passes its cookie on untouched.
    let login = get(c.nodes[0].http, "/login", &[]).await;
    assert_eq!(login.status, 200);
    assert_eq!(
        login.set_cookies(),
        [format!("JSESSIONID={SESSION}; Path=/")]
    );

    // From every entry, several times each (round robin would spread
    // them): the primary, n2. By cookie and by path parameter.
    let cookie = format!("JSESSIONID={SESSION}");
    let by_param = format!("/cart;jsessionid={SESSION}");
    for node in &c.nodes {
        for _ in 0..4 {
            let r = get(node.http, "/cart", &[("cookie", &cookie)]).await;
            assert_eq!((r.status, r.served_by()), (200, "n2"), "via {}", node.id);
            // The app sees its cookie as it set it.
            assert_eq!(r.json()["cookie"], cookie.as_str());
            let r = get(node.http, &by_param, &[]).await;
            assert_eq!((r.status, r.served_by()), (200, "n2"), "via {}", node.id);
            assert_eq!(r.json()["path"], by_param.as_str());
        }
    }

    // The primary dies: the secondary, n3, from both remaining entries.
    c.kill9("n2");
    c.wait_converged(2);
    for id in ["n1", "n3"] {
        let entry = c.node(id).http;
        for _ in 0..4 {
            let r = get(entry, "/cart", &[("cookie", &cookie)]).await;
            assert_eq!((r.status, r.served_by()), (200, "n3"), "via {id}");
            let r = get(entry, &by_param, &[]).await;
            assert_eq!((r.status, r.served_by()), (200, "n3"), "via {id}");
        }
    }
    // Without a session id the policy still spreads requests.
    let mut served = std::collections::BTreeSet::new();
    for _ in 0..4 {
        served.insert(
            get(c.node("n1").http, "/cart", &[])
                .await
                .served_by()
                .to_owned(),
        );
    }
    assert_eq!(served.len(), 2, "{served:?}");
}

#[test]
fn peerlb_route_explains_a_session_id_and_check_config_names_a_bad_regex() {
    let dir = temp_dir("sessions-cli");
    let nodes = "[[nodes]]\nid = \"n1\"\nhttp_addr = \"127.0.0.1:18001\"\npeer_addr = \"127.0.0.1:18101\"\ngossip_addr = \"127.0.0.1:18201\"\n\
                 [[nodes]]\nid = \"n2\"\nhttp_addr = \"127.0.0.1:18002\"\npeer_addr = \"127.0.0.1:18102\"\ngossip_addr = \"127.0.0.1:18202\"\n";
    let good = write(
        &dir,
        "good.toml",
        &format!(
            "policy = \"round-robin\"\n[sticky.session]\ncookie = \"SID\"\nformat = \"httpd\"\n{nodes}"
        ),
    );
    let out = std::process::Command::new(bin())
        .args([
            "route",
            "--request",
            "GET /a",
            "--cookie",
            "SID=f00.n2",
            "--config",
        ])
        .arg(&good)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("reason      session-primary"), "{text}");
    assert!(text.contains("owner       n2"), "{text}");
    assert!(
        text.contains("session id  f00.n2: primary n2 -> n2"),
        "{text}"
    );

    let bad = write(
        &dir,
        "bad.toml",
        &format!(
            "[sticky.session]\ncookie = \"SID\"\nformat = \"regex\"\nregex = \"!(\\\\w+)!\"\n{nodes}"
        ),
    );
    let out = std::process::Command::new(bin())
        .args(["check-config", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("sticky.session.regex"), "{err}");
    assert!(err.contains("primary"), "{err}");
}
