//! What the peer port spends before a peer proves who it is: caps on
//! half-open handshakes and their buffers, and QUIC address validation
//! (Retry, RFC 9000 §8.1) once handshakes pile up, as nginx's
//! `quic_retry` and quinn's `Incoming::retry` do. A spoofed source then
//! gets one Retry packet and costs no connection state.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Most connection attempts quinn holds before `accept` takes them
/// (quinn's default is 2^16); beyond it quinn refuses them.
pub(crate) const MAX_INCOMING: usize = 256;

/// Bytes quinn buffers for one connection attempt not yet accepted (its
/// Initial and 0-RTT packets; quinn's default is 10 MiB).
pub(crate) const INCOMING_BUFFER: u64 = 16 << 10;

/// Bytes quinn buffers for all attempts not yet accepted (quinn's
/// default is 100 MiB).
pub(crate) const INCOMING_BUFFER_TOTAL: u64 = 1 << 20;

/// Handshakes in progress above which a new attempt from an address that
/// has not proved it receives packets gets a Retry instead of state. A
/// cluster's peers connect once each, so a handful is normal.
pub(crate) const RETRY_ABOVE: usize = 16;

/// Handshakes in progress at which new attempts are ignored outright,
/// even validated ones (a validated address still costs a handshake).
pub(crate) const MAX_HALF_OPEN: usize = 256;

/// Applies the caps above to a server config.
pub(crate) fn limit_server(server: &mut quinn::ServerConfig) {
    server
        .max_incoming(MAX_INCOMING)
        .incoming_buffer_size(INCOMING_BUFFER)
        .incoming_buffer_size_total(INCOMING_BUFFER_TOTAL);
}

/// What to do with a connection attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Start the handshake.
    Accept,
    /// Answer with a Retry: the peer must echo the token from its real
    /// address before it costs state.
    Retry,
    /// Drop the attempt silently.
    Ignore,
}

/// Decides for one attempt, given the handshakes in progress, whether its
/// address is already validated (it echoed a Retry token) and whether
/// quinn may still send it a Retry.
pub(crate) fn admit(half_open: usize, validated: bool, may_retry: bool) -> Admit {
    if half_open >= MAX_HALF_OPEN {
        Admit::Ignore
    } else if validated || half_open < RETRY_ABOVE {
        Admit::Accept
    } else if may_retry {
        Admit::Retry
    } else {
        Admit::Ignore
    }
}

/// Counts one handshake in progress while it lives.
pub(crate) struct HalfOpen(Arc<AtomicUsize>);

impl HalfOpen {
    /// Counts one more handshake on `n`.
    pub(crate) fn start(n: &Arc<AtomicUsize>) -> HalfOpen {
        n.fetch_add(1, Ordering::Relaxed);
        HalfOpen(n.clone())
    }
}

impl Drop for HalfOpen {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_only_when_handshakes_pile_up_and_ignore_at_the_cap() {
        assert_eq!(admit(0, false, true), Admit::Accept);
        assert_eq!(admit(RETRY_ABOVE - 1, false, true), Admit::Accept);
        assert_eq!(admit(RETRY_ABOVE, false, true), Admit::Retry);
        assert_eq!(admit(RETRY_ABOVE, true, false), Admit::Accept);
        assert_eq!(admit(RETRY_ABOVE, false, false), Admit::Ignore);
        assert_eq!(admit(MAX_HALF_OPEN, true, true), Admit::Ignore);
    }

    #[test]
    fn half_open_counts_while_alive() {
        let n = Arc::new(AtomicUsize::new(0));
        let a = HalfOpen::start(&n);
        let b = HalfOpen::start(&n);
        assert_eq!(n.load(Ordering::Relaxed), 2);
        drop(a);
        drop(b);
        assert_eq!(n.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn server_limits_apply_to_a_config() {
        // The config builder takes the values (quinn panics on none of
        // them); the constants stay far below quinn's defaults.
        const { assert!(MAX_INCOMING < 1 << 16) };
        const { assert!(INCOMING_BUFFER_TOTAL < 100 << 20) };
        const { assert!(RETRY_ABOVE < MAX_HALF_OPEN) };
    }
}
