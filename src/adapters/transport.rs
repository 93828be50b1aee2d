//! The peer transport: the QUIC endpoint and the peer streams
//! ([`peer`]: links, dial, admission, the peer UDP socket) and the peer
//! wire's mutual TLS ([`tls`]).

pub(crate) mod peer;
pub(crate) mod tls;
