//! The gossip budget: how many members a cluster may have so that a full
//! chitchat digest fits in one datagram, and the datagram and seal sizes
//! that arithmetic rests on. Pure arithmetic, shared by the config's
//! validation (`config/validate.rs`, `gossip.max_members`) and the gossip
//! adapters (`adapters/cluster/`: the sealed transport's datagram limit,
//! the keyring's seal, the bounds on what a datagram may say).

/// The largest UDP payload over IPv4 (65,535 - 8 - 20), which chitchat
/// also takes as its datagram limit.
pub(crate) const MAX_DATAGRAM: usize = 65_507;

/// Bytes sealing adds to a gossip datagram: format byte, 12-byte nonce
/// and 16-byte tag (ChaCha20-Poly1305). `adapters/cluster/keyring.rs`
/// checks at compile time that its seal is this long.
pub(crate) const SEAL_OVERHEAD: usize = 1 + 12 + 16;

/// Default `gossip.max_members`: the most members (dead ones included) a
/// digest or delta may name, and (`adapters/transport/peer/dial.rs`) the most a node
/// supervises. At 128 a full digest fits in one datagram whatever the ids
/// and addresses: at most 116 bytes a member ([`DIGEST_ENTRY_OVERHEAD`]
/// plus a 63-byte id), 14.8 KB.
///
/// Why a full digest must fit: chitchat sends its digest in full in every
/// Syn and SynAck (it cannot split one) and fills what is left of the
/// datagram with the SynAck's delta. A digest that outgrows a datagram
/// (65,507 bytes) makes the sealed Syn too large to send: the transport
/// counts it (`oversize`) and refuses it, chitchat logs "failed to gossip"
/// and the node is no longer heard, so every peer declares it dead. As a
/// digest nears that size, a SynAck has less room for its delta, and a
/// joining node takes longer to learn the cluster's state. So
/// `gossip.max_members` above this default is accepted only when that
/// many members with the cluster's longest configured id and address
/// family fit in [`digest_budget`] (see `config/validate.rs`): 1,024
/// members with ids up to 12 bytes over IPv4, for example.
pub(crate) const DEFAULT_MAX_MEMBERS: usize = 128;
/// Largest `gossip.max_members`.
pub(crate) const MAX_MAX_MEMBERS: usize = 4096;
/// Bytes of one digest entry besides its node id's bytes: the id's length
/// (u16), generation (u64), address (family byte, 16 octets for IPv6 or 4
/// for IPv4, port u16), heartbeat, last_gc_version and max_version (u64).
pub(crate) const DIGEST_ENTRY_OVERHEAD: usize = 2 + 8 + (1 + 16 + 2) + 3 * 8;
/// Room kept in a SynAck for its delta, beside a full digest: a joining
/// node learns about 8 KB of the cluster's state per exchange at least.
const DELTA_ROOM: usize = 8 * 1024;

/// Bytes a full digest may take in one datagram for a cluster named
/// `cluster` (chitchat's cluster id, sent in every Syn): the datagram
/// (65,507 bytes) less the seal, the envelope's header and message type,
/// the cluster id and [`DELTA_ROOM`].
pub(crate) fn digest_budget(cluster: &str) -> usize {
    MAX_DATAGRAM.saturating_sub(SEAL_OVERHEAD + 16 + 2 + cluster.len() + DELTA_ROOM)
}

/// One digest entry's bytes for a member with an id of `id_len` bytes and
/// an IPv6 (`v6`) or IPv4 gossip address.
pub(crate) fn digest_entry(id_len: usize, v6: bool) -> usize {
    DIGEST_ENTRY_OVERHEAD + id_len - if v6 { 0 } else { 12 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_member_cap_fits_any_digest() {
        // 128 members with 63-byte ids over IPv6, in the longest cluster
        // name a datagram leaves room for.
        assert!(DEFAULT_MAX_MEMBERS * digest_entry(63, true) <= digest_budget(&"c".repeat(1000)));
        assert_eq!(digest_entry(5, false), 46);
    }
}
