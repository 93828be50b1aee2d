//! The QUIC transport settings of peer connections (both directions):
//! idle timeout, stream allowance, path MTU, ACK frequency and the
//! per-stream receive window that carries backpressure across the hop.

use std::sync::Arc;

use super::{FIRST_STREAMS, MAX_UDP_PAYLOAD, links};
use crate::config::PeerSettings;

pub(super) fn transport(s: &PeerSettings) -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    // No QUIC keep-alive: the link keeper pings only while busy. A node
    // speaking only `peerlb/1` keeps every connection alive, as releases
    // before one connection per pair did.
    t.keep_alive_interval(s.only_v1.then_some(s.keep_alive));
    t.max_idle_timeout(Some(
        quinn::IdleTimeout::try_from(links::quic_idle_timeout(s))
            .expect("idle timeout fits a QUIC varint"),
    ));
    t.datagram_receive_buffer_size(Some(links::DATAGRAM_BUFFER));
    t.max_concurrent_bidi_streams(FIRST_STREAMS.into());
    t.max_concurrent_uni_streams(0u32.into());
    // Path MTU discovery above Ethernet size: a bulk body then takes
    // about 4x fewer packets where the path allows it (loopback, jumbo
    // LANs), and each packet costs quinn about the same work whatever its
    // size. A path with a 1500-byte MTU stays at 1452 (discovery just
    // stops there); quinn documents any upper bound as safe.
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(s.max_udp_payload.min(MAX_UDP_PAYLOAD));
    t.mtu_discovery_config(Some(mtu));
    t.ack_frequency_config(Some(ack_frequency()));
    // A peer sends a stream's data only this far ahead of this node's
    // reads (`limits.response_buffer_bytes`): an entry whose client stops
    // reading a forwarded answer stops its owner within the window, and
    // the owner's body pump (awaiting `write_chunk`) stops reading its app.
    // quinn's default is 1.25 MB per stream, which an entry held for every
    // client that read nothing. The connection's window stays unbounded:
    // a bound there would let streams stalled by one client stop every
    // other stream on the connection; the node-wide response budget
    // (`adapters::http::relay`) bounds the sum instead.
    t.stream_receive_window(
        quinn::VarInt::from_u64(s.stream_window).expect("stream window is validated below 2^62"),
    );
    Arc::new(t)
}

/// How often the peer acknowledges: after [`ACK_ELICITING_THRESHOLD`] + 1
/// ack-eliciting packets at the latest (QUIC's default is every second
/// one), else within its `max_ack_delay` (25 ms). Requests and responses
/// carry each other's ACKs, so under load an owner that received two
/// requests no longer sends an ACK-only datagram before its answers, which
/// carry it anyway (draft-ietf-quic-ack-frequency; quinn negotiates it,
/// and a peer without it keeps acknowledging every second packet).
fn ack_frequency() -> quinn::AckFrequencyConfig {
    let mut a = quinn::AckFrequencyConfig::default();
    a.ack_eliciting_threshold(ACK_ELICITING_THRESHOLD.into());
    a
}

/// Ack-eliciting packets a peer may receive without acknowledging at once.
const ACK_ELICITING_THRESHOLD: u32 = 9;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Both sides ask for the ACK frequency extension with the threshold:
    /// without it, an owner acknowledges every second request at once in
    /// ACK-only datagrams (docs/performance.md, "The peer socket:
    /// datagrams and wakeups").
    #[test]
    fn transport_asks_peers_to_acknowledge_every_tenth_packet() {
        let t = transport(&PeerSettings {
            keep_alive: Duration::from_millis(200),
            idle_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
            only_v1: false,
            offer_v3: true,
            max_peers: 128,
            max_udp_payload: 6500,
            dial_on_demand: false,
            stream_window: 256 * 1024,
        });
        let debug = format!("{t:?}");
        let ack = &debug[debug
            .find("ack_frequency_config: Some(")
            .unwrap_or_else(|| panic!("no ACK frequency config: {debug}"))..];
        assert!(
            ack.contains(&format!(
                "ack_eliciting_threshold: {ACK_ELICITING_THRESHOLD}"
            )),
            "{ack}"
        );
    }

    /// A peer may send one stream's data only `limits.response_buffer_bytes`
    /// ahead of this node's reads, whatever quinn's default.
    #[test]
    fn a_peer_streams_receive_window_is_the_response_buffer() {
        let t = transport(&PeerSettings {
            keep_alive: Duration::from_millis(200),
            idle_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
            only_v1: false,
            offer_v3: true,
            max_peers: 128,
            max_udp_payload: 6500,
            dial_on_demand: false,
            stream_window: 100_000,
        });
        let debug = format!("{t:?}");
        assert!(debug.contains("stream_receive_window: 100000,"), "{debug}");
    }
}
