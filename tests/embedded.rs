//! peerlb embedded in a Rust service (issue 33): the sharded cache of
//! `examples/sharded_cache.rs` (its store included by path), three nodes
//! in this one test binary, each on its own runtime thread with its own
//! `Env` (the builder's default: real sockets on loopback). Puts and gets
//! through every node; a drain that hands the drained node's keys over
//! with nothing lost; a kill that loses only the dead node's keys. And
//! `Handle::forward`: an app's own request to a key's owner, its answer
//! and its failover when the owner dies.

// Real nodes on loopback: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

#[path = "../examples/sharded_cache/store.rs"]
mod store;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use peerlb::body::{Body, full};
use peerlb::config::{Overrides, Source};
use peerlb::{ForwardError, Handle, NodeId, RequestInfo};
use store::Cache;
use support::{eventually, free_port, temp_dir};
use tokio::sync::oneshot;

/// One embedded node on its own thread and runtime.
struct Embedded {
    http: SocketAddr,
    cache: Cache,
    handle: Handle,
    /// The node's runtime (`Embedded::forward` runs there).
    rt: tokio::runtime::Handle,
    drain: Option<oneshot::Sender<()>>,
    kill: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Embedded {
    /// Starts node `id` of the cluster file `file` serving the sharded
    /// cache, with its handover task, and waits until it is built.
    fn start(file: &Path, id: &str, http: SocketAddr) -> Embedded {
        let cache = Cache::default();
        let c = cache.clone();
        let mut e = Embedded::start_with(file, id, http, move |b| {
            let node = b.app(c.clone()).build().unwrap();
            tokio::spawn(c.hand_over(node.handle(), Duration::from_secs(5)));
            node
        });
        e.cache = cache;
        e
    }

    /// Starts node `id` built by `build` (inside the node's runtime) and
    /// waits until it is built.
    fn start_with(
        file: &Path,
        id: &str,
        http: SocketAddr,
        build: impl FnOnce(peerlb::NodeBuilder) -> peerlb::Node + Send + 'static,
    ) -> Embedded {
        let (tx, rx) = std::sync::mpsc::channel();
        let file = file.to_path_buf();
        let id = id.to_owned();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let rt_handle = rt.handle().clone();
            rt.block_on(async move {
                let src = Source::load(Some(&file)).unwrap();
                let config = src
                    .parse()
                    .unwrap()
                    .validate(&src, &id, &Overrides::default())
                    .unwrap();
                let node = build(peerlb::Node::builder(config));
                let (drain_tx, drain_rx) = oneshot::channel::<()>();
                let (kill_tx, kill_rx) = oneshot::channel::<()>();
                tx.send((node.handle(), rt_handle, drain_tx, kill_tx))
                    .unwrap();
                tokio::select! {
                    r = node.run(async { let _ = drain_rx.await; }) => r.unwrap(),
                    // A kill: the node's future and then, as the runtime
                    // is dropped, every task and socket of it go at once.
                    _ = kill_rx => {}
                }
            });
        });
        let (handle, rt, drain, kill) = rx.recv().unwrap();
        Embedded {
            http,
            cache: Cache::default(),
            handle,
            rt,
            drain: Some(drain),
            kill: Some(kill),
            thread: Some(thread),
        }
    }

    /// `handle.forward(key, req)` run on this node's runtime, as its app
    /// would run it.
    async fn forward(
        &self,
        key: &str,
        req: Request<Body>,
    ) -> Result<(String, Bytes), ForwardError> {
        let (h, key) = (self.handle.clone(), key.to_owned());
        self.rt
            .spawn(async move {
                let resp = h.forward(&key, req).await?;
                let status = resp.status().to_string();
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                Ok((status, body))
            })
            .await
            .unwrap()
    }

    fn stop(&mut self, tx: Option<oneshot::Sender<()>>) {
        tx.unwrap().send(()).unwrap();
        self.thread.take().unwrap().join().unwrap();
    }
}

fn cluster_file(dir: &Path, n: usize) -> (std::path::PathBuf, Vec<SocketAddr>) {
    cluster_file_with(dir, n, "")
}

/// The cluster file of `n` nodes, with `extra` (sections) added.
fn cluster_file_with(dir: &Path, n: usize, extra: &str) -> (std::path::PathBuf, Vec<SocketAddr>) {
    let mut text = format!(
        "name = \"embedded\"\npolicy = \"consistent-hash\"\n\n[gossip]\ninterval_ms = {}\nphi_threshold = {}\n\n[limits]\ndrain_grace_ms = 3000\n\n{extra}{}\n",
        support::GOSSIP_INTERVAL_MS,
        support::PHI,
        store::RULES
    );
    let mut https = Vec::new();
    for i in 1..=n {
        let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        https.push(http);
        text += &format!(
            "[[nodes]]\nid = \"n{i}\"\nhttp_addr = \"{http}\"\npeer_addr = \"127.0.0.1:{}\"\ngossip_addr = \"127.0.0.1:{}\"\n\n",
            free_port(),
            free_port()
        );
    }
    let file = dir.join("cluster.toml");
    std::fs::write(&file, text).unwrap();
    let out = Command::new(support::bin())
        .args(["certs", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (file, https)
}

fn ids(handle: &Handle) -> Vec<String> {
    handle.members().iter().map(|m| m.to_string()).collect()
}

const LIMIT: Duration = Duration::from_secs(20);

#[test]
fn sharded_cache_keys_live_on_their_owner_a_drain_hands_them_over_a_kill_loses_only_its_own() {
    let dir = temp_dir("embedded");
    let (file, https) = cluster_file(&dir, 3);
    let mut nodes: Vec<Embedded> = (0..3)
        .map(|i| Embedded::start(&file, &format!("n{}", i + 1), https[i]))
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        eventually(LIMIT, || {
            nodes.iter().all(|n| n.handle.members().len() == 3)
        })
        .await
        .expect("three members in every view");
        let keys: Vec<String> = (0..60).map(|i| format!("key{i}")).collect();
        // Puts through every node in turn, gets through every node.
        for (i, k) in keys.iter().enumerate() {
            store::put(nodes[i % 3].http, k, &format!("v-{k}"))
                .await
                .unwrap();
        }
        for n in &nodes {
            for k in &keys {
                let v = store::get(n.http, k).await.unwrap();
                assert_eq!(v.as_deref(), Some(format!("v-{k}").as_bytes()), "{k}");
            }
        }
        // Each key lives on its owner, and every node names the same one.
        for k in &keys {
            let owner = nodes[0].handle.owner(k);
            assert!(nodes.iter().all(|n| n.handle.owner(k) == owner), "{k}");
            for n in &nodes {
                let here = n.cache.keys().contains(k);
                assert_eq!(
                    here,
                    n.handle.node_id() == &owner,
                    "{k} on {}",
                    n.handle.node_id()
                );
                assert_eq!(n.handle.is_local(k), here);
            }
        }
        let on_n3 = nodes[2].cache.keys();
        assert!(!on_n3.is_empty(), "n3 owns some of 60 keys");

        // Drain n3: its keys are handed over before it leaves.
        let mut watch = nodes[0].handle.watch();
        let drain = nodes[2].drain.take();
        nodes[2].stop(drain);
        let change = watch.changed().await.expect("n1 sees n3 leave");
        assert!(
            !change.members.iter().any(|m| m.as_str() == "n3"),
            "{change:?}"
        );
        assert!(change.lost.is_empty(), "n1 loses nothing when n3 leaves");
        eventually(LIMIT, || {
            nodes[..2].iter().all(|n| ids(&n.handle) == ["n1", "n2"])
        })
        .await
        .expect("n3 out of every view");
        for n in &nodes[..2] {
            for k in &keys {
                let v = store::get(n.http, k).await.unwrap();
                assert_eq!(
                    v.as_deref(),
                    Some(format!("v-{k}").as_bytes()),
                    "{k} after the drain"
                );
            }
        }
        for k in &on_n3 {
            let owner = nodes[0].handle.owner(k);
            let holder = nodes[..2]
                .iter()
                .find(|n| n.handle.node_id() == &owner)
                .unwrap();
            assert!(holder.cache.keys().contains(k), "{k} handed to {owner}");
        }

        // Kill n2: only its keys are lost.
        let on_n2 = nodes[1].cache.keys();
        assert!(!on_n2.is_empty());
        let kill = nodes[1].kill.take();
        nodes[1].stop(kill);
        eventually(LIMIT, || ids(&nodes[0].handle) == ["n1"])
            .await
            .expect("n2 out of n1's view");
        let n1 = NodeId::from("n1");
        for k in &keys {
            assert_eq!(nodes[0].handle.owner(k), n1);
            let v = store::get(nodes[0].http, k).await.unwrap();
            if on_n2.contains(k) {
                assert_eq!(v, None, "{k} died with n2");
            } else {
                assert_eq!(v.as_deref(), Some(format!("v-{k}").as_bytes()), "{k} kept");
            }
        }
    });
    let drain = nodes[0].drain.take();
    nodes[0].stop(drain);
}

/// The requests the forward test's apps received: (node, method, path).
static ARRIVED: Mutex<Vec<(String, String, String)>> = Mutex::new(Vec::new());

fn arrived(node: &str, path: &str) -> usize {
    ARRIVED
        .lock()
        .unwrap()
        .iter()
        .filter(|(n, _, p)| n == node && p == path)
        .count()
}

/// The forward test's app: answers `node entry proxied key method path
/// body-length`; on n2, `/hold/*` is received and never answered (the
/// owner dies with the request in it).
async fn echo(req: Request<Body>) -> Result<Response<Body>, std::convert::Infallible> {
    let info = req.extensions().get::<RequestInfo>().unwrap().clone();
    let (method, path) = (req.method().to_string(), req.uri().path().to_owned());
    ARRIVED
        .lock()
        .unwrap()
        .push((info.node().to_string(), method.clone(), path.clone()));
    if info.node().as_str() == "n2" && path.starts_with("/hold/") {
        std::future::pending::<()>().await;
    }
    let len = req.into_body().collect().await.unwrap().to_bytes().len();
    let text = format!(
        "{} entry={} proxied={} key={} {method} {path} {len}",
        info.node(),
        info.entry(),
        info.proxied(),
        info.key().unwrap_or("-")
    );
    Ok::<_, std::convert::Infallible>(Response::new(full(text)))
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(peerlb::body::empty()).unwrap()
}

#[test]
fn forward_reaches_the_keys_owner_and_fails_over_by_the_client_rules_when_it_dies() {
    let dir = temp_dir("embedded-forward");
    // The kill is seen when n1's link to n2 idles out (as in
    // tests/failover.rs: 4 s rides out a loaded machine's stalls).
    let (file, https) = cluster_file_with(
        &dir,
        3,
        "[peer]\nkeep_alive_ms = 300\nidle_timeout_ms = 4000\n\n",
    );
    let mut nodes: Vec<Embedded> = (0..3)
        .map(|i| {
            Embedded::start_with(&file, &format!("n{}", i + 1), https[i], |b| {
                b.app(tower::service_fn(echo)).build().unwrap()
            })
        })
        .collect();
    let kill = nodes[1].kill.take();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        eventually(LIMIT, || {
            nodes.iter().all(|n| n.handle.members().len() == 3)
        })
        .await
        .expect("three members in every view");
        let n1 = &nodes[0].handle;
        let keys = (0..).map(|i| format!("key{i}"));
        let on_n2 = keys.clone().find(|k| n1.owner(k).as_str() == "n2").unwrap();
        let on_n1 = keys.clone().find(|k| n1.is_local(k)).unwrap();

        // The owner's answer, marked proxied from n1, with the key.
        let (status, body) = nodes[0].forward(&on_n2, get("/who")).await.unwrap();
        assert_eq!(status, "200 OK");
        assert_eq!(
            body,
            format!("n2 entry=n1 proxied=true key={on_n2} GET /who 0")
        );
        // A body is carried.
        let put = Request::put("/who").body(full("state")).unwrap();
        let (_, body) = nodes[0].forward(&on_n2, put).await.unwrap();
        assert!(body.ends_with(b"PUT /who 5"), "{body:?}");
        // A key this node owns is served here, by the app.
        let (_, body) = nodes[0].forward(&on_n1, get("/who")).await.unwrap();
        assert_eq!(
            body,
            format!("n1 entry=n1 proxied=false key={on_n1} GET /who 0")
        );

        // n2 dies holding a GET, a PUT with a small body (its length
        // known from the body: kept for a replay) and a POST with a body:
        // the GET and the PUT move to the key's next candidate, the POST
        // (it may have run) is not replayed.
        let view = n1.view().unwrap();
        let next = view.ring().candidates(&on_n2).nth(1).unwrap().to_string();
        let k = on_n2.clone();
        let post = Request::post("/hold/post").body(full("state")).unwrap();
        let put = Request::put("/hold/put").body(full("state")).unwrap();
        let n1_node = &nodes[0];
        let held = async {
            tokio::join!(
                n1_node.forward(&k, get("/hold/get")),
                n1_node.forward(&k, put),
                n1_node.forward(&k, post)
            )
        };
        let waited = async {
            eventually(LIMIT, || {
                ["/hold/get", "/hold/put", "/hold/post"]
                    .iter()
                    .all(|p| arrived("n2", p) == 1)
            })
            .await
            .expect("the three requests reached n2's app");
        };
        let ((got, put, posted), ()) = tokio::join!(held, async {
            waited.await;
            // A kill: the runtime goes with every socket, no close sent.
            kill.unwrap().send(()).unwrap();
        });
        let (status, body) = got.expect("the GET is replayed");
        assert_eq!(status, "200 OK");
        assert_eq!(
            body,
            format!(
                "{next} entry=n1 proxied={} key={on_n2} GET /hold/get 0",
                next != "n1"
            )
        );
        assert_eq!(arrived(&next, "/hold/get"), 1, "replayed once, on {next}");
        let (status, body) = put.expect("the PUT is replayed");
        assert_eq!(status, "200 OK");
        assert_eq!(
            body,
            format!(
                "{next} entry=n1 proxied={} key={on_n2} PUT /hold/put 5",
                next != "n1"
            )
        );
        match posted {
            Err(ForwardError::PeerFailed(why)) => assert!(why.contains("n2"), "{why}"),
            other => panic!("a POST that may have run is not replayed: {other:?}"),
        }
        assert_eq!(arrived("n2", "/hold/post"), 1);
        for other in ["n1", "n3"] {
            assert_eq!(arrived(other, "/hold/post"), 0, "{other}");
        }
    });
    nodes[1].thread.take().unwrap().join().unwrap();
    for i in [0, 2] {
        let drain = nodes[i].drain.take();
        nodes[i].stop(drain);
    }
}
