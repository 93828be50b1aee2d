//! A gossip forger: chitchat protocol V0 datagrams built by hand, as an
//! attacker on the network would, from the wire format (magic 0xB053 as a
//! u16 little-endian, version byte 0, message type 0 Syn / 1 SynAck / 2 Ack
//! / 3 BadCluster; a digest is a u16 count of (ChitchatId, heartbeat u64,
//! last_gc_version u64, max_version u64); a delta is a stream of blocks
//! (type 2 = plain, u16 length; type 0 ends it) of operations: 0 node
//! (ChitchatId, last_gc_version u64, from_version u64), 1 key-value (key,
//! value, version u64, status u8), 2 set-max-version (u64)). A ChitchatId is
//! (node id: u16 length + bytes, generation u64, address: 4 + octets + port
//! u16). Integers are little-endian.
#![allow(dead_code)]

use std::net::SocketAddr;

/// One node's identity in gossip.
#[derive(Clone, Debug)]
pub struct Id {
    pub node: String,
    pub generation: u64,
    pub gossip: SocketAddr,
}

fn str16(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u16).to_le_bytes());
    out.extend(s.as_bytes());
}

fn id(out: &mut Vec<u8>, id: &Id) {
    str16(out, &id.node);
    out.extend(id.generation.to_le_bytes());
    match id.gossip {
        SocketAddr::V4(a) => {
            out.push(4);
            out.extend(a.ip().octets());
        }
        SocketAddr::V6(a) => {
            out.push(6);
            out.extend(a.ip().octets());
        }
    }
    out.extend(id.gossip.port().to_le_bytes());
}

fn header(kind: u8) -> Vec<u8> {
    let mut out = 0xB053u16.to_le_bytes().to_vec();
    out.push(0);
    out.push(kind);
    out
}

/// A delta setting `kvs` (key, value, version) of node `who`.
fn delta(out: &mut Vec<u8>, who: &Id, kvs: &[(&str, &str, u64)]) {
    let mut ops = vec![0u8];
    id(&mut ops, who);
    ops.extend(0u64.to_le_bytes()); // last_gc_version
    ops.extend(0u64.to_le_bytes()); // from_version_excluded
    for (k, v, version) in kvs {
        ops.push(1);
        str16(&mut ops, k);
        str16(&mut ops, v);
        ops.extend(version.to_le_bytes());
        ops.push(0); // set
    }
    out.push(2);
    out.extend((ops.len() as u16).to_le_bytes());
    out.extend(ops);
    out.push(0);
}

/// An Ack whose delta sets `kvs` of `who`.
pub fn ack(who: &Id, kvs: &[(&str, &str, u64)]) -> Vec<u8> {
    let mut out = header(2);
    delta(&mut out, who, kvs);
    out
}

/// A SynAck whose digest gives `who` the heartbeat `heartbeat` (and
/// max_version `max_version`) and whose delta sets `kvs` of `who`.
pub fn syn_ack(who: &Id, heartbeat: u64, max_version: u64, kvs: &[(&str, &str, u64)]) -> Vec<u8> {
    let mut out = header(1);
    out.extend(1u16.to_le_bytes());
    id(&mut out, who);
    out.extend(heartbeat.to_le_bytes());
    out.extend(0u64.to_le_bytes());
    out.extend(max_version.to_le_bytes());
    delta(&mut out, who, kvs);
    out
}

/// One node a forged message announces: (id, heartbeat, max_version,
/// key-values (key, value, version)).
pub type Announced = (Id, u64, u64, Vec<(String, String, u64)>);

/// A SynAck whose digest gives each of `nodes` (id, heartbeat,
/// max_version, key-values) its heartbeat and max_version, and whose delta
/// (one plain block, so at most 64 KiB of operations) sets its key-values.
pub fn syn_ack_many(nodes: &[Announced]) -> Vec<u8> {
    let mut out = header(1);
    out.extend((nodes.len() as u16).to_le_bytes());
    for (who, heartbeat, max_version, _) in nodes {
        id(&mut out, who);
        out.extend(heartbeat.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        out.extend(max_version.to_le_bytes());
    }
    let mut ops = Vec::new();
    for (who, _, _, kvs) in nodes {
        ops.push(0u8);
        id(&mut ops, who);
        ops.extend(0u64.to_le_bytes());
        ops.extend(0u64.to_le_bytes());
        for (k, v, version) in kvs {
            ops.push(1);
            str16(&mut ops, k);
            str16(&mut ops, v);
            ops.extend(version.to_le_bytes());
            ops.push(0);
        }
    }
    out.push(2);
    out.extend((ops.len() as u16).to_le_bytes());
    out.extend(ops);
    out.push(0);
    out
}

/// A Syn of cluster `cluster` with an empty digest: a node that knows
/// nothing yet, asking for the whole state (the answer is a SynAck whose
/// delta is as large as a datagram allows).
pub fn syn(cluster: &str) -> Vec<u8> {
    let mut out = header(0);
    out.extend(0u16.to_le_bytes());
    str16(&mut out, cluster);
    out
}

/// A SynAck with an empty digest and delta (asks for the whole state).
pub fn empty_syn_ack() -> Vec<u8> {
    let mut out = header(1);
    out.extend(0u16.to_le_bytes());
    out.push(0);
    out
}

/// The heartbeat a Syn's or SynAck's digest gives node `node` (any
/// generation), if it names it.
pub fn digest_heartbeat(message: &[u8], node: &str) -> Option<u64> {
    digest_entry(message, node).map(|(h, _)| h)
}

/// The (heartbeat, max_version) a Syn's or SynAck's digest gives node
/// `node` (any generation), if it names it.
pub fn digest_entry(message: &[u8], node: &str) -> Option<(u64, u64)> {
    let mut r = message;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (a, b) = r.split_at_checked(n)?;
        r = b;
        Some(a)
    };
    let head = take(4)?;
    if head[..3] != [0x53, 0xB0, 0] || !matches!(head[3], 0 | 1) {
        return None;
    }
    let count = u16::from_le_bytes(take(2)?.try_into().ok()?);
    for _ in 0..count {
        let len = usize::from(u16::from_le_bytes(take(2)?.try_into().ok()?));
        let id = take(len)?.to_vec();
        take(8)?; // generation
        let family = take(1)?[0];
        take(if family == 4 { 4 } else { 16 })?;
        take(2)?; // port
        let heartbeat = u64::from_le_bytes(take(8)?.try_into().ok()?);
        take(8)?; // last_gc_version
        let max_version = u64::from_le_bytes(take(8)?.try_into().ok()?);
        if id == node.as_bytes() {
            return Some((heartbeat, max_version));
        }
    }
    None
}

/// Sends `datagram` from a fresh loopback socket to `to`.
pub fn send(to: SocketAddr, datagram: &[u8]) {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.send_to(datagram, to).unwrap();
}

/// Sends `datagram` from a fresh socket and returns any answer within
/// `wait` (None when nothing comes back).
pub fn ask(to: SocketAddr, datagram: &[u8], wait: std::time::Duration) -> Option<Vec<u8>> {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    s.send_to(datagram, to).unwrap();
    let mut buf = vec![0u8; 65_536];
    let (n, _) = s.recv_from(&mut buf).ok()?;
    Some(buf[..n].to_vec())
}
