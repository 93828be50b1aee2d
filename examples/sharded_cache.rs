//! A sharded key-value cache embedded in peerlb: every process is a
//! cluster node and a shard of the store (`sharded_cache/store.rs`). A
//! key lives on its owner; a node that drains (Ctrl-C, SIGTERM) hands its
//! keys to their new owners before it leaves.
//!
//! ```sh
//! peerlb certs --config examples/sharded_cache.toml
//! cargo run --example sharded_cache -- examples/sharded_cache.toml n1 &
//! cargo run --example sharded_cache -- examples/sharded_cache.toml n2 &
//! cargo run --example sharded_cache -- examples/sharded_cache.toml n3 &
//! curl -X PUT --data-binary hello http://127.0.0.1:8201/kv/alice
//! curl http://127.0.0.1:8203/kv/alice
//! ```
//!
//! `sharded_cache CLUSTER.TOML NODE_ID --shared-listen ADDR` also listens
//! on `ADDR` with SO_REUSEPORT (as `peerlb up` starts its nodes);
//! `sharded_cache --standalone ADDR` serves the same store alone with
//! hyper, no cluster: the benchmark's counterpart behind HAProxy
//! (`bench/compare.py`, `peerlb-3-embedded`).

#[path = "sharded_cache/store.rs"]
mod store;

use std::time::Duration;

use peerlb::config::{Overrides, Source};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The node's own runtime: one thread, as `peerlb node` runs.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if let [flag, addr] = &args[..]
        && flag == "--standalone"
    {
        let addr: std::net::SocketAddr = addr.parse()?;
        return rt.block_on(standalone(addr));
    }
    let (file, id, mut overrides) = match &args[..] {
        [file, id] => (file, id, Overrides::default()),
        [file, id, flag, addr] if flag == "--shared-listen" => {
            let mut o = Overrides::default();
            o.shared_listen = Some(addr.clone());
            (file, id, o)
        }
        _ => {
            eprintln!(
                "usage: sharded_cache CLUSTER.TOML NODE_ID [--shared-listen ADDR]\n       sharded_cache --standalone ADDR"
            );
            std::process::exit(64);
        }
    };
    let src = Source::load(Some(std::path::Path::new(file)))?;
    let config = src
        .parse()?
        .validate(&src, id, &std::mem::take(&mut overrides))?;
    rt.block_on(async move {
        let cache = store::Cache::default();
        let node = peerlb::Node::builder(config).app(cache.clone()).build()?;
        tokio::spawn(cache.hand_over(node.handle(), Duration::from_secs(5)));
        node.run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
        Ok(())
    })
}

/// The store alone on `addr`: HTTP/1.1 with hyper, keep-alive, one
/// connection task each, until the process is killed.
async fn standalone(addr: std::net::SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let cache = store::Cache::default();
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let cache = cache.clone();
        let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
            use http_body_util::BodyExt;
            let req = req.map(|b| b.map_err(peerlb::body::BodyError::Client).boxed_unsync());
            // Always ready (`Cache::poll_ready`).
            tower::Service::call(&mut cache.clone(), req)
        });
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, svc)
                .await;
        });
    }
}
