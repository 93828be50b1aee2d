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

#[path = "sharded_cache/store.rs"]
mod store;

use std::time::Duration;

use peerlb::config::{Overrides, Source};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(file), Some(id)) = (args.next(), args.next()) else {
        eprintln!("usage: sharded_cache CLUSTER.TOML NODE_ID");
        std::process::exit(64);
    };
    let src = Source::load(Some(std::path::Path::new(&file)))?;
    let config = src.parse()?.validate(&src, &id, &Overrides::default())?;
    // The node's own runtime: one thread, as `peerlb node` runs.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
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
