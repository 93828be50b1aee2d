//! The stream's kind (module doc of `wire`, "The stream's kind"): what a
//! peer stream carries, the first field of a `peerlb/3` request frame and
//! a header mark on `peerlb/2`, and the frame layout a connection speaks.
//! A pure move out of `wire.rs`, which re-exports every item.

use serde::{Deserialize, Serialize};

use super::{ADMIN, SIP};

/// The frame layout a peer connection speaks, from its ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    /// `peerlb/2` and `peerlb/1` (the same frames): the stream's kind is a
    /// header mark.
    V2,
    /// `peerlb/3`: the stream's kind is the request frame's first field.
    V3,
}

/// What a peer stream carries: the first field of a `peerlb/3` request
/// frame, a header mark on `peerlb/2` (module doc, "The stream's kind").
/// The variants' order is the wire's: append, never reorder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum StreamKind {
    /// An HTTP request for the owner's app.
    Http,
    /// A SIP message, and the transport it reached the entry over.
    Sip(SipTransport),
    /// An admin action for the owner member (a state or weight change, or
    /// a read of its counters).
    Admin,
}

/// The transport a SIP message reached the entry over, as a
/// [`StreamKind::Sip`] carries it. The variants' order is the wire's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum SipTransport {
    /// UDP.
    Udp,
    /// TCP.
    Tcp,
    /// TLS over TCP (SIPS).
    Tls,
}

impl SipTransport {
    /// The [`SIP`] mark's value (`udp`, `tcp`, `tls`).
    pub(super) fn mark(self) -> &'static str {
        match self {
            SipTransport::Udp => "udp",
            SipTransport::Tcp => "tcp",
            SipTransport::Tls => "tls",
        }
    }
}

impl From<crate::engine::sip::Transport> for SipTransport {
    fn from(t: crate::engine::sip::Transport) -> SipTransport {
        use crate::engine::sip::Transport;
        match t {
            Transport::Udp => SipTransport::Udp,
            Transport::Tcp => SipTransport::Tcp,
            Transport::Tls => SipTransport::Tls,
        }
    }
}

impl StreamKind {
    /// The header mark that says this kind on `peerlb/2`: none for HTTP.
    pub(super) fn mark(self) -> Option<(&'static str, &'static str)> {
        match self {
            StreamKind::Http => None,
            StreamKind::Sip(t) => Some((SIP, t.mark())),
            StreamKind::Admin => Some((ADMIN, "change")),
        }
    }

    /// The kind a `peerlb/2` head's marks say, from one scan of its header
    /// names (only those with peerlb's prefix are compared): [`ADMIN`]
    /// wins over [`SIP`]; neither is HTTP. A SIP mark's unknown value is
    /// read as UDP (the owner does not use it).
    pub(crate) fn of_marks(headers: &[(&[u8], &[u8])]) -> StreamKind {
        let mut kind = StreamKind::Http;
        for &(k, v) in headers {
            if !k.starts_with(b"peerlb-") {
                continue;
            }
            if k == ADMIN.as_bytes() {
                return StreamKind::Admin;
            }
            if k == SIP.as_bytes() {
                kind = StreamKind::Sip(match v {
                    b"tcp" => SipTransport::Tcp,
                    b"tls" => SipTransport::Tls,
                    _ => SipTransport::Udp,
                });
            }
        }
        kind
    }
}
