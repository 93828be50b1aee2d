//! peerlb embedded in a Rust service (issue 33): the sharded cache of
//! `examples/sharded_cache.rs` (its store included by path), three nodes
//! in this one test binary, each on its own runtime thread with its own
//! `Env` (the builder's default: real sockets on loopback). Puts and gets
//! through every node; a drain that hands the drained node's keys over
//! with nothing lost; a kill that loses only the dead node's keys.

// Real nodes on loopback: they run on wall-clock time.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

#[path = "../examples/sharded_cache/store.rs"]
mod store;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use peerlb::config::{Overrides, Source};
use peerlb::{Handle, NodeId};
use store::Cache;
use support::{eventually, free_port, temp_dir};
use tokio::sync::oneshot;

/// One embedded node on its own thread and runtime.
struct Embedded {
    http: SocketAddr,
    cache: Cache,
    handle: Handle,
    drain: Option<oneshot::Sender<()>>,
    kill: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Embedded {
    /// Starts node `id` of the cluster file `file` and waits until it is
    /// built.
    fn start(file: &Path, id: &str, http: SocketAddr) -> Embedded {
        let (tx, rx) = std::sync::mpsc::channel();
        let file = file.to_path_buf();
        let id = id.to_owned();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let src = Source::load(Some(&file)).unwrap();
                let config = src
                    .parse()
                    .unwrap()
                    .validate(&src, &id, &Overrides::default())
                    .unwrap();
                let cache = Cache::default();
                let node = peerlb::Node::builder(config)
                    .app(cache.clone())
                    .build()
                    .unwrap();
                tokio::spawn(
                    cache
                        .clone()
                        .hand_over(node.handle(), Duration::from_secs(5)),
                );
                let (drain_tx, drain_rx) = oneshot::channel::<()>();
                let (kill_tx, kill_rx) = oneshot::channel::<()>();
                tx.send((cache, node.handle(), drain_tx, kill_tx)).unwrap();
                tokio::select! {
                    r = node.run(async { let _ = drain_rx.await; }) => r.unwrap(),
                    // A kill: the node's future and then, as the runtime
                    // is dropped, every task and socket of it go at once.
                    _ = kill_rx => {}
                }
            });
        });
        let (cache, handle, drain, kill) = rx.recv().unwrap();
        Embedded {
            http,
            cache,
            handle,
            drain: Some(drain),
            kill: Some(kill),
            thread: Some(thread),
        }
    }

    fn stop(&mut self, tx: Option<oneshot::Sender<()>>) {
        tx.unwrap().send(()).unwrap();
        self.thread.take().unwrap().join().unwrap();
    }
}

fn cluster_file(dir: &Path, n: usize) -> (std::path::PathBuf, Vec<SocketAddr>) {
    let mut text = format!(
        "name = \"embedded\"\npolicy = \"consistent-hash\"\n\n[gossip]\ninterval_ms = {}\nphi_threshold = {}\n\n[limits]\ndrain_grace_ms = 3000\n\n{}\n",
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
