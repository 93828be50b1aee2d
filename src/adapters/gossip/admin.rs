//! The gossip part of the admin API: the keyring's fingerprints and the
//! datagrams gossip dropped (in `GET /_peerlb/status`).

use std::sync::atomic::Ordering;

use super::keyring::GossipKeys;

/// The `gossip` object of `GET /_peerlb/status`: `keys` (fingerprints, the
/// sending key first) and `dropped` (`unauthenticated`, `out_of_bounds`,
/// `oversize` datagram counts since start).
pub(crate) fn status(keys: &GossipKeys) -> serde_json::Value {
    let c = &keys.counters;
    serde_json::json!({
        "keys": keys.ring().fingerprints(),
        "dropped": {
            "unauthenticated": c.unauthenticated.load(Ordering::Relaxed),
            "out_of_bounds": c.out_of_bounds.load(Ordering::Relaxed),
            "oversize": c.oversize.load(Ordering::Relaxed),
        },
    })
}
