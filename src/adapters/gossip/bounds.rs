//! Bounds on what an opened gossip datagram may say, checked before
//! chitchat sees it, so that even a holder of the gossip key cannot
//! overflow, freeze, bloat or panic a node.
//!
//! The check reads chitchat's protocol V0 wire format (the only version
//! peerlb speaks): magic `0xB053` (u16 LE), version byte `0`, message type
//! (0 Syn, 1 SynAck, 2 Ack, 3 BadCluster); a digest is a u16 count of
//! `(ChitchatId, heartbeat u64, last_gc_version u64, max_version u64)`; a
//! delta is a block stream (block type 0 end, 1 zstd-compressed, 2 plain,
//! each with a u16 length) of operations: 0 node `(ChitchatId,
//! last_gc_version u64, from_version u64)`, 1 key-value `(key, value,
//! version u64, status u8 0..=2)`, 2 set-max-version `(u64)`. Strings are
//! a u16 length and UTF-8; a ChitchatId is `(node id, generation u64,
//! address: 4|6, octets, port u16)`; integers little-endian.
//!
//! A datagram is refused (and counted) when it does not parse, or:
//! - a node id is longer than 63 bytes, a key than [`MAX_KEY_LEN`], a value
//!   than [`MAX_VALUE_LEN`];
//! - a digest or delta names more than `max_members` nodes, or a node
//!   carries more than [`MAX_KEYS_PER_NODE`] keys;
//! - a heartbeat or version exceeds [`MAX_COUNTER`] (2^40): chitchat adds
//!   one to versions and heartbeats, so 2^64 - 1 would overflow and panic,
//!   and 2^62 would freeze a member's real heartbeats for good; an honest
//!   node reaches 2^40 after 35,000 years at one update a millisecond;
//! - a delta carries state about this very node (its id and generation):
//!   only this node writes its own state, so such a delta is forged or
//!   replayed and would otherwise replace this node's values.

use std::fmt;

/// Most members (dead ones included) a digest or delta may name, and
/// (`peer/dial.rs`) the most a node supervises: above the 100 nodes a
/// cluster is simulated with (`simulations/scale-100.toml`), and a full
/// digest (about 110 bytes a member, 14 KB) stays inside one datagram.
pub(crate) const MAX_MEMBERS: usize = 128;
/// Longest key, in bytes.
pub(crate) const MAX_KEY_LEN: usize = 64;
/// Longest value, in bytes.
pub(crate) const MAX_VALUE_LEN: usize = 256;
/// Most keys one node's delta may carry.
pub(crate) const MAX_KEYS_PER_NODE: usize = 32;
/// Largest heartbeat, version or garbage-collection version accepted.
pub(crate) const MAX_COUNTER: u64 = 1 << 40;
/// Longest node id (as certificate names allow).
const MAX_NODE_ID_LEN: usize = 63;
/// Largest decompressed delta block (chitchat's own limit).
const MAX_BLOCK: usize = u16::MAX as usize;

/// Why a datagram was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BoundsError {
    /// The bytes are not a V0 chitchat message.
    #[error("malformed: {0}")]
    Malformed(&'static str),
    /// A length or count bound is broken.
    #[error("{what} {got} over the bound {max}")]
    TooLarge {
        /// What (node id, key, value, members, ...).
        what: &'static str,
        /// The value found.
        got: u64,
        /// The bound.
        max: u64,
    },
    /// A delta writes this node's own state.
    #[error("a delta about this node itself")]
    AboutSelf,
}

/// The bounds one node applies (see the module doc).
pub(crate) struct Bounds {
    self_id: String,
    self_generation: u64,
    max_members: usize,
}

impl fmt::Debug for Bounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bounds")
            .field("self_id", &self.self_id)
            .field("max_members", &self.max_members)
            .finish()
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], BoundsError> {
        if self.0.len() < n {
            return Err(BoundsError::Malformed("truncated"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, BoundsError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, BoundsError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, BoundsError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn str(&mut self, what: &'static str, max: usize) -> Result<&'a str, BoundsError> {
        let n = usize::from(self.u16()?);
        let s = self.take(n)?;
        if n > max {
            return Err(too_large(what, n as u64, max as u64));
        }
        std::str::from_utf8(s).map_err(|_| BoundsError::Malformed("string not UTF-8"))
    }
    /// A ChitchatId: (node id, generation).
    fn id(&mut self) -> Result<(&'a str, u64), BoundsError> {
        let node = self.str("node id length", MAX_NODE_ID_LEN)?;
        let generation = self.u64()?;
        match self.u8()? {
            4 => drop(self.take(4)?),
            6 => drop(self.take(16)?),
            _ => return Err(BoundsError::Malformed("address family")),
        }
        self.u16()?;
        Ok((node, generation))
    }
}

fn too_large(what: &'static str, got: u64, max: u64) -> BoundsError {
    BoundsError::TooLarge { what, got, max }
}

fn counter(what: &'static str, v: u64) -> Result<(), BoundsError> {
    if v > MAX_COUNTER {
        return Err(too_large(what, v, MAX_COUNTER));
    }
    Ok(())
}

impl Bounds {
    /// Bounds for the node `self_id` of generation `self_generation` in a
    /// cluster of at most `max_members` members (dead ones included).
    pub(crate) fn new(self_id: &str, self_generation: u64, max_members: usize) -> Bounds {
        Bounds {
            self_id: self_id.to_owned(),
            self_generation,
            max_members,
        }
    }

    /// Checks an opened datagram.
    ///
    /// # Errors
    /// [`BoundsError`] naming the first broken bound.
    pub(crate) fn check(&self, datagram: &[u8]) -> Result<(), BoundsError> {
        let mut r = Reader(datagram);
        if r.u16()? != 0xB053 {
            return Err(BoundsError::Malformed("magic"));
        }
        if r.u8()? != 0 {
            return Err(BoundsError::Malformed("protocol version other than V0"));
        }
        match r.u8()? {
            0 => {
                self.digest(&mut r)?;
                // Compared, never stored: any length a datagram holds.
                r.str("cluster id length", usize::from(u16::MAX))?;
            }
            1 => {
                self.digest(&mut r)?;
                self.delta(&mut r)?;
            }
            2 => self.delta(&mut r)?,
            3 => {}
            _ => return Err(BoundsError::Malformed("message type")),
        }
        Ok(())
    }

    fn members(&self, n: usize) -> Result<(), BoundsError> {
        if n > self.max_members {
            return Err(too_large("members", n as u64, self.max_members as u64));
        }
        Ok(())
    }

    fn digest(&self, r: &mut Reader<'_>) -> Result<(), BoundsError> {
        let n = usize::from(r.u16()?);
        self.members(n)?;
        for _ in 0..n {
            r.id()?;
            counter("heartbeat", r.u64()?)?;
            counter("last_gc_version", r.u64()?)?;
            counter("max_version", r.u64()?)?;
        }
        Ok(())
    }

    fn delta(&self, r: &mut Reader<'_>) -> Result<(), BoundsError> {
        let mut ops = Vec::new();
        loop {
            match r.u8()? {
                0 => break,
                1 => {
                    let len = usize::from(r.u16()?);
                    let block = r.take(len)?;
                    let mut out = vec![0u8; MAX_BLOCK];
                    let n = zstd::bulk::decompress_to_buffer(block, &mut out[..])
                        .map_err(|_| BoundsError::Malformed("compressed block"))?;
                    ops.extend_from_slice(&out[..n]);
                }
                2 => {
                    let len = usize::from(r.u16()?);
                    ops.extend_from_slice(r.take(len)?);
                }
                _ => return Err(BoundsError::Malformed("block type")),
            }
            if ops.len() > 16 * MAX_BLOCK {
                return Err(too_large(
                    "delta bytes",
                    ops.len() as u64,
                    16 * MAX_BLOCK as u64,
                ));
            }
        }
        let mut r = Reader(&ops);
        let (mut nodes, mut keys) = (0usize, 0usize);
        while !r.0.is_empty() {
            match r.u8()? {
                0 => {
                    let (id, generation) = r.id()?;
                    if id == self.self_id && generation == self.self_generation {
                        return Err(BoundsError::AboutSelf);
                    }
                    nodes += 1;
                    self.members(nodes)?;
                    keys = 0;
                    counter("last_gc_version", r.u64()?)?;
                    counter("from_version", r.u64()?)?;
                }
                1 if nodes > 0 => {
                    r.str("key length", MAX_KEY_LEN)?;
                    r.str("value length", MAX_VALUE_LEN)?;
                    counter("version", r.u64()?)?;
                    if r.u8()? > 2 {
                        return Err(BoundsError::Malformed("deletion status"));
                    }
                    keys += 1;
                    if keys > MAX_KEYS_PER_NODE {
                        return Err(too_large(
                            "keys of a node",
                            keys as u64,
                            MAX_KEYS_PER_NODE as u64,
                        ));
                    }
                }
                2 if nodes > 0 => counter("max_version", r.u64()?)?,
                _ => return Err(BoundsError::Malformed("delta operation")),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// V0 bytes built by hand from the format in the module doc.
    struct W(Vec<u8>);

    impl W {
        fn header(kind: u8) -> W {
            let mut v = 0xB053u16.to_le_bytes().to_vec();
            v.extend([0, kind]);
            W(v)
        }
        fn str(&mut self, s: &str) -> &mut W {
            self.0.extend((s.len() as u16).to_le_bytes());
            self.0.extend(s.as_bytes());
            self
        }
        fn u64(&mut self, v: u64) -> &mut W {
            self.0.extend(v.to_le_bytes());
            self
        }
        fn id(&mut self, node: &str, generation: u64) -> &mut W {
            self.str(node).u64(generation);
            self.0.extend([4, 127, 0, 0, 1, 0x10, 0x27]);
            self
        }
    }

    /// (key, value, version).
    type Kv = (String, String, u64);
    /// (node id, generation, key-values).
    type NodeOps<'a> = (&'a str, u64, Vec<Kv>);

    /// A delta of `nodes` as one plain block.
    fn delta(nodes: &[NodeOps<'_>]) -> Vec<u8> {
        let mut ops = W(Vec::new());
        for (node, generation, kvs) in nodes {
            ops.0.push(0);
            ops.id(node, *generation).u64(0).u64(0);
            for (k, v, version) in kvs {
                ops.0.push(1);
                ops.str(k).str(v).u64(*version);
                ops.0.push(0);
            }
        }
        let mut out = vec![2];
        out.extend((ops.0.len() as u16).to_le_bytes());
        out.extend(ops.0);
        out.push(0);
        out
    }

    fn ack(nodes: &[NodeOps<'_>]) -> Vec<u8> {
        let mut w = W::header(2);
        w.0.extend(delta(nodes));
        w.0
    }

    fn kv(k: &str, v: &str, version: u64) -> Kv {
        (k.to_owned(), v.to_owned(), version)
    }

    fn bounds() -> Bounds {
        Bounds::new("n1", 7, 4)
    }

    #[test]
    fn honest_messages_pass() {
        let b = bounds();
        assert_eq!(
            b.check(&ack(&[("n2", 1, vec![kv("status", "serving", 3)])])),
            Ok(())
        );
        let mut syn = W::header(0);
        syn.0.extend(1u16.to_le_bytes());
        syn.id("n2", 1).u64(5).u64(0).u64(9).str("cluster");
        assert_eq!(b.check(&syn.0), Ok(()));
        assert_eq!(b.check(&W::header(3).0), Ok(()));
        // An older generation of this node is another member.
        assert_eq!(
            b.check(&ack(&[("n1", 6, vec![kv("load", "1", 2)])])),
            Ok(())
        );
    }

    #[test]
    fn counters_past_2_pow_40_are_refused() {
        let b = bounds();
        for v in [MAX_COUNTER + 1, 1 << 62, u64::MAX] {
            let e = b
                .check(&ack(&[("n2", 1, vec![kv("load", "1", v)])]))
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    BoundsError::TooLarge {
                        what: "version",
                        ..
                    }
                ),
                "{e}"
            );
            let mut syn_ack = W::header(1);
            syn_ack.0.extend(1u16.to_le_bytes());
            syn_ack.id("n2", 1).u64(v).u64(0).u64(1);
            syn_ack.0.extend(delta(&[]));
            let e = b.check(&syn_ack.0).unwrap_err();
            assert!(
                matches!(
                    e,
                    BoundsError::TooLarge {
                        what: "heartbeat",
                        ..
                    }
                ),
                "{e}"
            );
        }
        assert_eq!(
            b.check(&ack(&[("n2", 1, vec![kv("l", "1", MAX_COUNTER)])])),
            Ok(())
        );
    }

    #[test]
    fn lengths_and_counts_are_bounded() {
        let b = bounds();
        let long = |n| "x".repeat(n);
        let e = b.check(&ack(&[(&long(64), 1, vec![])])).unwrap_err();
        assert!(matches!(
            e,
            BoundsError::TooLarge {
                what: "node id length",
                ..
            }
        ));
        let e = b
            .check(&ack(&[("n2", 1, vec![kv(&long(65), "v", 1)])]))
            .unwrap_err();
        assert!(matches!(
            e,
            BoundsError::TooLarge {
                what: "key length",
                ..
            }
        ));
        let e = b
            .check(&ack(&[("n2", 1, vec![kv("k", &long(257), 1)])]))
            .unwrap_err();
        assert!(matches!(
            e,
            BoundsError::TooLarge {
                what: "value length",
                ..
            }
        ));
        let many: Vec<_> = (0..=MAX_KEYS_PER_NODE)
            .map(|i| kv(&format!("k{i}"), "v", 1))
            .collect();
        let e = b.check(&ack(&[("n2", 1, many)])).unwrap_err();
        assert!(matches!(
            e,
            BoundsError::TooLarge {
                what: "keys of a node",
                ..
            }
        ));
        let names: Vec<String> = (0..5).map(|i| format!("g{i}")).collect();
        let ghosts: Vec<_> = names.iter().map(|n| (n.as_str(), 1, vec![])).collect();
        let e = b.check(&ack(&ghosts)).unwrap_err();
        assert!(matches!(
            e,
            BoundsError::TooLarge {
                what: "members",
                ..
            }
        ));
        assert_eq!(b.check(&ack(&ghosts[..4])), Ok(()));
    }

    #[test]
    fn a_delta_about_this_node_is_refused() {
        let e = bounds()
            .check(&ack(&[("n1", 7, vec![kv("status", "leaving", 9)])]))
            .unwrap_err();
        assert_eq!(e, BoundsError::AboutSelf);
    }

    #[test]
    fn malformed_bytes_are_refused_never_panic() {
        let b = bounds();
        let good = ack(&[("n2", 1, vec![kv("status", "serving", 3)])]);
        for n in 0..good.len() {
            assert!(b.check(&good[..n]).is_err(), "truncated at {n}");
        }
        let mut v1 = good.clone();
        v1[2] = 1;
        assert!(matches!(b.check(&v1), Err(BoundsError::Malformed(_))));
        let mut junk = good.clone();
        junk[4] = 9;
        assert!(b.check(&junk).is_err());
        // Arbitrary bytes: an error or Ok, never a panic.
        let mut x: u64 = 1;
        for _ in 0..2000 {
            let mut d = good.clone();
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let i = (x >> 33) as usize % d.len();
            d[i] = (x >> 17) as u8;
            let _ = b.check(&d);
        }
    }

    #[test]
    fn compressed_blocks_are_read() {
        let plain = delta(&[("n2", 1, vec![kv("load", "1", u64::MAX)])]);
        // The ops of the plain block, recompressed as a zstd block.
        let ops = &plain[3..plain.len() - 1];
        let z = zstd::bulk::compress(ops, 1).unwrap();
        let mut m = W::header(2).0;
        m.push(1);
        m.extend((z.len() as u16).to_le_bytes());
        m.extend(z);
        m.push(0);
        let e = bounds().check(&m).unwrap_err();
        assert!(
            matches!(
                e,
                BoundsError::TooLarge {
                    what: "version",
                    ..
                }
            ),
            "{e}"
        );
    }
}
