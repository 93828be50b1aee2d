//! What the composition root logs when a peer leaves or returns to this
//! node's routing, and why it left (moved out of `node.rs` as it was).

use std::collections::BTreeSet;

use tracing::{info, warn};

use crate::engine::membership::{Member, NodeStatus};
use crate::engine::node_id::NodeId;

/// Why a peer that was serving in this node's view is no longer: the first
/// of gossip no longer listing it live (dead or gone: `gossip`), a status
/// it published (`drain: leaving` / `drain: draining`), no authenticated
/// QUIC connection to it (`quic`).
pub(super) fn left_reason(id: &NodeId, gossip: &[Member], up: &BTreeSet<NodeId>) -> &'static str {
    match gossip
        .iter()
        .filter(|m| m.id == *id)
        .max_by_key(|m| m.generation)
    {
        None => "gossip: no longer live",
        Some(m) if m.status == NodeStatus::Leaving => "drain: leaving",
        Some(m) if m.status == NodeStatus::Draining => "drain: draining",
        Some(_) if !up.contains(id) => "quic: no connection",
        Some(_) => "not serving",
    }
}

/// One WARN line per peer that leaves this node's routing (with its
/// [`left_reason`]) and one INFO line per peer that returns, so an
/// operator sees a partition and its heal without reading view diffs.
pub(super) fn log_routing_changes(
    before: &[NodeId],
    after: &[NodeId],
    gossip: &[Member],
    up: &BTreeSet<NodeId>,
) {
    for id in before.iter().filter(|id| !after.contains(id)) {
        warn!(peer = %id, reason = left_reason(id, gossip, up), "peer left routing");
    }
    for id in after.iter().filter(|id| !before.contains(id)) {
        info!(peer = %id, "peer returned to routing");
    }
}
