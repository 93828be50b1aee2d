//! Frames on a peer stream. All encoding lives here so the codec can be
//! swapped in one file.
//!
//! One bidirectional QUIC stream carries one request:
//!
//! ```text
//! entry -> owner: [u32 BE length][StreamKind][RequestHead, bincode 2 (serde)]  body bytes ...  FIN
//! owner -> entry: [u32 BE length][ResponseHead, bincode 2 (serde)]             body bytes ...  FIN
//! ```
//!
//! (`[StreamKind]` on `peerlb/3` only: see "The stream's kind" below.)
//!
//! Bodies are the raw bytes after the head, ended by the stream's FIN; they
//! stream both ways and are never buffered whole. A body that fails midway
//! resets the stream ([`RESET_BODY_FAILED`]), so the other side sees an error,
//! never a truncated body that looks complete. A head longer than
//! [`MAX_HEAD_LEN`] or one that does not decode closes that stream only.
//!
//! Informational answers (1xx but 100 and 101) come first when the entry
//! asked ([`INFORMATIONAL`]), a `ResponseHead` frame each, in order:
//! `[ResponseHead 103] [ResponseHead 102] [ResponseHead 200] body ... FIN`.
//! Bodies that may carry trailers are framed ([`TRAILERS`], `body::framed`).
//!
//! A WebSocket request (a tunnel) is marked by the header [`TUNNEL`] in its
//! request head (the entry strips every client-sent `peerlb-*` header
//! first, so no client can set it; the owner removes it before the app).
//! On such a stream the entry does not end its direction after the head:
//!
//! ```text
//! entry -> owner: [head with peerlb-tunnel] ........ tunnel bytes ... FIN
//! owner -> entry: [ResponseHead 101] tunnel bytes ........... FIN
//! ```
//!
//! If the owner's head is `101`, both directions carry the tunnel's raw
//! bytes after the heads, each ended by its FIN (a side that closes) or a
//! reset (a side that fails); otherwise the exchange is an ordinary one:
//! the entry ends its direction (the request has no body) and the response
//! body follows the head as usual. A node that does not know the mark
//! passes it to its app as an ordinary header and never answers 101
//! (its upstream client refuses one), so the client gets the app's answer
//! or a 502.
//!
//! # The stream's kind
//!
//! A stream carries one of three things ([`StreamKind`]): an HTTP request
//! for the owner's app, a SIP message, or an admin action for the owner
//! member. How the head says which depends on the connection's ALPN
//! ([`Version`]):
//!
//! ```text
//! peerlb/3:          [u32 BE length][StreamKind][RequestHead fields ...]
//! peerlb/2, /1:      [u32 BE length][RequestHead fields ...]   (kind as a header mark)
//! ```
//!
//! On `peerlb/3` the kind is the frame's first field, bincode like the
//! rest (an enum: its variant index as a varint, one byte, then the
//! variant's data: `Http` 0; `Sip` 1 and the client's transport, 0 `udp`,
//! 1 `tcp`, 2 `tls`; `Admin` 2), followed by the head's fields exactly as
//! on `peerlb/2`, so both versions decode the head with the same code. On
//! `peerlb/2` (an older peer) the kind is a header line after the
//! request's own: none for HTTP, [`SIP`] (value: the transport) or
//! [`ADMIN`] (value `change`); the admin mark wins when both are present.
//! A `peerlb/3` owner reads only the field: a mark's name in its header
//! lines is an ordinary header (no client can send one: the entry strips
//! every client-sent `peerlb-*` header).
//!
//! A SIP request has the SIP method as the head's method, `/` as its
//! URI, a `content-length` and the whole SIP message (as the entry
//! forwards it: its own `Via` on top, a `Record-Route` added) as the
//! body. The owner answers a `ResponseHead` `200` whose body is the SIP
//! responses its demo server sends, one after the other, each framed by
//! its own `Content-Length` (none for an `ACK`); any other status means
//! the owner could not serve it. Like every proxied request it is never
//! forwarded again (hop limit 1).
//!
//! ```text
//! entry -> owner: [head Sip(udp) INVITE /] SIP request bytes        FIN
//! owner -> entry: [ResponseHead 200] SIP 100 | SIP 180 | SIP 200    FIN
//! ```
//!
//! An admin action has the admin path as its URI and the change as its
//! body; the owner member answers it with its admin API's status and
//! JSON body.
//!
//! A node of a release before the kinds passes a SIP mark to its HTTP
//! app; the entry gets an HTTP answer whose body does not frame as SIP
//! and drops it (the client retransmits, RFC 3261 17.1).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// Longest encoded head accepted, in bytes (64 KiB).
pub(crate) const MAX_HEAD_LEN: usize = 64 * 1024;

/// Stream reset code: the sender's body source failed midway.
pub(crate) const RESET_BODY_FAILED: u32 = 1;
/// Stream reset code: the owner refused the request before processing it
/// (it is shutting down); the entry may retry it on another node.
pub(crate) const RESET_REFUSED: u32 = 2;
/// Stream reset / stop code: a frame could not be decoded.
pub(crate) const RESET_BAD_FRAME: u32 = 3;

/// Request head header marking a tunnel (a WebSocket request): see the
/// module doc. Its value names the protocol (`websocket`).
pub(crate) const TUNNEL: &str = "peerlb-tunnel";

/// Request head header (value `1`) asking for the app's 1xx answers,
/// each a [`ResponseHead`] frame before the final one (module doc); never
/// sent to an entry that did not ask. Removed before the app.
pub(crate) const INFORMATIONAL: &str = "peerlb-informational";

/// Head header of bodies that may carry trailers (`body::framed`): in a
/// request head, tokens `te` (the client takes trailers: a response of
/// unknown length comes framed) and `framed` (the request body is); in a
/// response head, `framed`. Removed before the app and the client.
pub(crate) const TRAILERS: &str = "peerlb-trailers";

/// [`TRAILERS`] as a header name, made once: a map lookup by the `&str`
/// parses and lowercases the name on every request (about 400
/// instructions for a name HTTP has no constant for).
pub(crate) const TRAILERS_NAME: http::HeaderName = http::HeaderName::from_static(TRAILERS);

/// Request head header marking a SIP message on a `peerlb/2` connection
/// (module doc, "The stream's kind"). Its value is the client's
/// transport (`udp`, `tcp` or `tls`).
pub(crate) const SIP: &str = "peerlb-sip";

/// Request head header, beside [`SIP`], marking a request of the SIP
/// server toward a caller that the receiving node is to write on the
/// caller's connection it holds (RFC 5923 connection reuse): its value is
/// the flow id (`peerlb-flow=<id>.<node>` in the dialog's `Route`). The
/// node answers `200` (written) or `410` (no such connection), no body.
pub(crate) const SIP_FLOW: &str = "peerlb-sip-flow";

/// Request head header marking an admin action on a `peerlb/2`
/// connection (module doc, "The stream's kind"); its value is `change`.
pub(crate) const ADMIN: &str = "peerlb-admin";

mod kind;
pub(crate) use kind::{SipTransport, StreamKind, Version};

/// The head of a proxied request (entry -> owner), in its owned form: the
/// reference for the layout. The entry encodes [`RequestHeadRef`] and the
/// owner decodes [`RequestHeadView`], the same bytes; tests and the fuzz
/// harness build this one.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RequestHead {
    /// Request id (UUID as u128), the same in both nodes' logs.
    pub request_id: u128,
    /// Node id of the entry node; the owner checks it against the peer's certificate.
    pub entry: String,
    /// Hops taken so far: 1 on a proxied request. An owner never forwards again.
    pub hops: u8,
    /// The entry's membership view version when it routed the request.
    pub view_version: u64,
    /// HTTP method.
    pub method: String,
    /// Request-target (path and query, as received).
    pub uri: String,
    /// Header fields in order, names lowercase; values as raw bytes.
    #[serde(with = "header_list")]
    pub headers: Vec<(String, Vec<u8>)>,
    /// The client's address as the entry saw it.
    pub client: SocketAddr,
    /// The hash key the entry routed on, if any.
    pub hash_key: Option<String>,
    /// The client connection's TLS facts; `None` for cleartext HTTP.
    pub tls: Option<TlsFacts>,
}

/// What the entry knows of a client's TLS connection: forwarded to the
/// owner in [`RequestHead::tls`], told to the app (`X-Forwarded-Proto`)
/// and seen by the rules (`when = { tls = true, sni = "..." }`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TlsFacts {
    /// The SNI name the client sent, as sent.
    pub sni: Option<String>,
    /// The protocol version's code point (0x0303 TLS 1.2, 0x0304 TLS 1.3).
    pub version: u16,
    /// The ALPN protocol negotiated, if any (`http/1.1`).
    pub alpn: Option<Vec<u8>>,
}

impl TlsFacts {
    /// The version as OpenSSL and nginx write it (`TLSv1.3`), or `TLS`
    /// for a code point peerlb does not offer.
    pub(crate) fn version_name(&self) -> &'static str {
        match self.version {
            0x0304 => "TLSv1.3",
            0x0303 => "TLSv1.2",
            _ => "TLS",
        }
    }
}

/// The head of a proxied response (owner -> entry), in its owned form:
/// the reference for the layout. The owner encodes [`ResponseHeadRef`]
/// and the entry decodes [`DecodedResponseHead`] ([`decode_response`]),
/// the same bytes; tests and the fuzz harness build this one.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ResponseHead {
    /// HTTP status code.
    pub status: u16,
    /// Header fields in order; values as raw bytes.
    #[serde(with = "header_list")]
    pub headers: Vec<(String, Vec<u8>)>,
    /// Node id of the node that served the request.
    pub served_by: String,
}

/// A [`ResponseHead`] decoded for the entry ([`decode_response`]): the
/// header lines straight into an `http::HeaderMap` (sized from the
/// frame's count), each value a slice of the frame's `Bytes` rather than a
/// copy, so a header line costs no allocation when its name is a standard
/// one. Same bytes on the wire as [`ResponseHead`].
#[derive(Debug)]
pub(crate) struct DecodedResponseHead {
    /// See [`ResponseHead::status`].
    pub status: u16,
    /// The valid header lines of [`ResponseHead::headers`], in order.
    pub headers: http::HeaderMap,
    /// The names of the lines that are not valid HTTP and were left out
    /// (empty, without an allocation, for every well-formed head).
    pub dropped: Vec<String>,
    /// [`ResponseHead::served_by`]'s bytes (UTF-8, checked by the decode).
    served_by: bytes::Bytes,
}

impl DecodedResponseHead {
    /// See [`ResponseHead::served_by`].
    pub(crate) fn served_by(&self) -> &str {
        // Decoded as a `&str`, so this check cannot fail.
        std::str::from_utf8(&self.served_by).unwrap_or_default()
    }

    /// [`ResponseHead::served_by`]'s bytes (UTF-8: the decode checked).
    pub(crate) fn served_by_bytes(&self) -> &[u8] {
        &self.served_by
    }

    /// [`ResponseHead::served_by`] as a header value sharing the frame's
    /// buffer (no copy); `None` for a name that is not a valid value.
    pub(crate) fn served_by_value(&self) -> Option<http::HeaderValue> {
        http::HeaderValue::from_maybe_shared(self.served_by.clone()).ok()
    }

    /// The body length the head announces (`content-length`), if any.
    pub(crate) fn content_length(&self) -> Option<u64> {
        // Hashed, not scanned: most answers carry one.
        self.headers
            .get(http::header::CONTENT_LENGTH)?
            .to_str()
            .ok()?
            .parse()
            .ok()
    }
}

/// A [`RequestHead`] decoded in place (the owner's serve path): the
/// strings and header values borrow the frame's bytes instead of being
/// copied into an allocation each (two per header line). Same bytes on
/// the wire; [`decode_view`] reads it.
#[derive(Debug, PartialEq, Eq, Deserialize)]
pub(crate) struct RequestHeadView<'a> {
    /// See [`RequestHead::request_id`].
    pub request_id: u128,
    /// See [`RequestHead::entry`].
    pub entry: &'a str,
    /// See [`RequestHead::hops`].
    pub hops: u8,
    /// See [`RequestHead::view_version`].
    pub view_version: u64,
    /// See [`RequestHead::method`].
    pub method: &'a str,
    /// See [`RequestHead::uri`].
    pub uri: &'a str,
    /// See [`RequestHead::headers`], each name's bytes as sent: not
    /// checked as UTF-8 here, as the owned form's `String` is, since the
    /// owner checks every name as an HTTP field name (ASCII) when it
    /// builds the request, and resets the stream for one that is not
    /// (a bad header rather than a malformed frame: the same code,
    /// [`RESET_BAD_FRAME`]).
    #[serde(borrow)]
    pub headers: Vec<(&'a [u8], &'a [u8])>,
    /// See [`RequestHead::client`].
    pub client: SocketAddr,
    /// See [`RequestHead::hash_key`].
    #[serde(borrow)]
    pub hash_key: Option<&'a str>,
    /// See [`RequestHead::tls`].
    pub tls: Option<TlsFacts>,
}

/// A [`RequestHead`] encoded straight from borrowed parts: the same bytes,
/// without copying the method, target, headers or key into owned fields
/// first (the entry's forward path).
#[derive(Debug, Serialize)]
pub(crate) struct RequestHeadRef<'a> {
    /// See [`RequestHead::request_id`].
    pub request_id: u128,
    /// See [`RequestHead::entry`].
    pub entry: &'a str,
    /// See [`RequestHead::hops`].
    pub hops: u8,
    /// See [`RequestHead::view_version`].
    pub view_version: u64,
    /// See [`RequestHead::method`].
    pub method: &'a str,
    /// See [`RequestHead::uri`].
    pub uri: &'a str,
    /// See [`RequestHead::headers`]: the header map itself, in its order.
    #[serde(serialize_with = "header_list::serialize_map")]
    pub headers: &'a http::HeaderMap,
    /// See [`RequestHead::client`].
    pub client: SocketAddr,
    /// See [`RequestHead::hash_key`].
    pub hash_key: Option<&'a str>,
    /// See [`RequestHead::tls`].
    pub tls: Option<&'a TlsFacts>,
}

/// A [`RequestHeadRef`] with peerlb's own marks ([`TUNNEL`],
/// [`INFORMATIONAL`], [`TRAILERS`]: `(name, value)`) after its header
/// lines: the bytes of the head whose map had the marks inserted last,
/// without inserting them into the request's map and removing them again
/// (a name HTTP has no constant for is parsed and hashed each time).
/// Sent as a [`RequestFrame`] ([`encode_request`]); [`encode`] gives its
/// `peerlb/2` bytes without a kind mark (an HTTP request's).
#[derive(Debug)]
pub(crate) struct MarkedRequestHead<'a> {
    /// The head, its headers as the request has them.
    pub head: RequestHeadRef<'a>,
    /// The marks, as header lines after the request's own.
    pub marks: &'a [(&'static str, &'static str)],
}

impl Serialize for MarkedRequestHead<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serialize_marked(&self.head, self.marks, None, s)
    }
}

/// The bytes of `head` with `marks`, then `kind_mark`, after its header
/// lines (a [`MarkedRequestHead`]; the kind's mark on `peerlb/2`).
fn serialize_marked<S: serde::Serializer>(
    h: &RequestHeadRef<'_>,
    marks: &[(&'static str, &'static str)],
    kind_mark: Option<(&'static str, &'static str)>,
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::{SerializeSeq, SerializeStruct};
    struct Lines<'b>(
        &'b http::HeaderMap,
        &'b [(&'static str, &'static str)],
        Option<(&'static str, &'static str)>,
    );
    impl Serialize for Lines<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let n = self.0.len() + self.1.len() + usize::from(self.2.is_some());
            let mut seq = s.serialize_seq(Some(n))?;
            for (k, v) in self.0.iter() {
                seq.serialize_element(&(k.as_str(), header_list::Raw(v.as_bytes())))?;
            }
            for &(k, v) in self.1.iter().chain(self.2.as_ref()) {
                seq.serialize_element(&(k, header_list::Raw(v.as_bytes())))?;
            }
            seq.end()
        }
    }
    // The fields of `RequestHeadRef`, in its order (a test pins the
    // bytes against it).
    let mut st = s.serialize_struct("RequestHeadRef", 10)?;
    st.serialize_field("request_id", &h.request_id)?;
    st.serialize_field("entry", h.entry)?;
    st.serialize_field("hops", &h.hops)?;
    st.serialize_field("view_version", &h.view_version)?;
    st.serialize_field("method", h.method)?;
    st.serialize_field("uri", h.uri)?;
    st.serialize_field("headers", &Lines(h.headers, marks, kind_mark))?;
    st.serialize_field("client", &h.client)?;
    st.serialize_field("hash_key", &h.hash_key)?;
    st.serialize_field("tls", &h.tls)?;
    st.end()
}

/// A request to send on a peer stream: its kind and its head (with
/// peerlb's own marks), encoded for the stream's connection by
/// [`encode_request`].
#[derive(Debug)]
pub(crate) struct RequestFrame<'a> {
    /// What the stream carries.
    pub kind: StreamKind,
    /// The head.
    pub head: MarkedRequestHead<'a>,
}

/// The bytes of a `peerlb/2` frame: the head, the kind's mark last.
struct KindMarked<'b>(
    &'b MarkedRequestHead<'b>,
    Option<(&'static str, &'static str)>,
);

impl Serialize for KindMarked<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serialize_marked(&self.0.head, self.0.marks, self.1, s)
    }
}

/// Encodes `frame` as a length-prefixed request frame for a connection
/// that speaks `version` (module doc, "The stream's kind"): on
/// [`Version::V3`] the kind then the head, on [`Version::V2`] the head
/// with the kind's mark after its header lines.
///
/// # Errors
/// As [`encode`].
pub(crate) fn encode_request(
    frame: &RequestFrame<'_>,
    version: Version,
) -> Result<Vec<u8>, WireError> {
    match version {
        Version::V3 => encode(&(frame.kind, &frame.head)),
        Version::V2 => encode(&KindMarked(&frame.head, frame.kind.mark())),
    }
}

/// Decodes a request frame (exactly the bytes after the length prefix)
/// from a connection that speaks `version`: the stream's kind (the first
/// field on [`Version::V3`], the marks on [`Version::V2`]) and the head,
/// borrowing from `bytes`.
///
/// # Errors
/// [`WireError::Decode`] when the bytes are not one complete frame.
pub(crate) fn decode_request(
    bytes: &[u8],
    version: Version,
) -> Result<(StreamKind, RequestHeadView<'_>), WireError> {
    match version {
        // One decode of the kind and the head's fields after it.
        Version::V3 => decode_view(bytes),
        Version::V2 => {
            let head: RequestHeadView<'_> = decode_view(bytes)?;
            Ok((StreamKind::of_marks(&head.headers), head))
        }
    }
}

/// A [`ResponseHead`] encoded straight from borrowed parts (the owner's
/// answer path): the same bytes as the owned form.
#[derive(Debug)]
pub(crate) struct ResponseHeadRef<'a> {
    /// See [`ResponseHead::status`].
    pub status: u16,
    /// See [`ResponseHead::headers`].
    pub headers: &'a http::HeaderMap,
    /// A `content-length` line after the map's, in decimal: the length the
    /// owner carries for a body hyper would have framed itself
    /// (`framing::length_to_carry`), written without a header value made
    /// and inserted into the map for it. `None`: no line of its own
    /// (the map must not have one when it is `Some`).
    pub content_length: Option<u64>,
    /// See [`ResponseHead::served_by`].
    pub served_by: &'a str,
}

impl Serialize for ResponseHeadRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeSeq, SerializeStruct};
        struct Lines<'b>(&'b http::HeaderMap, Option<u64>);
        impl Serialize for Lines<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let n = self.0.len() + usize::from(self.1.is_some());
                let mut seq = s.serialize_seq(Some(n))?;
                for (k, v) in self.0.iter() {
                    seq.serialize_element(&(k.as_str(), header_list::Raw(v.as_bytes())))?;
                }
                if let Some(len) = self.1 {
                    let mut digits = itoa::Buffer::new();
                    let line = (
                        "content-length",
                        header_list::Raw(digits.format(len).as_bytes()),
                    );
                    seq.serialize_element(&line)?;
                }
                seq.end()
            }
        }
        // The fields of `ResponseHead`, in its order (a test pins the
        // bytes against it).
        let mut st = s.serialize_struct("ResponseHeadRef", 3)?;
        st.serialize_field("status", &self.status)?;
        st.serialize_field("headers", &Lines(self.headers, self.content_length))?;
        st.serialize_field("served_by", self.served_by)?;
        st.end()
    }
}

/// Header lists on the wire: a sequence of `(name, value)` pairs, each
/// value as length-prefixed raw bytes. The byte layout is bincode's for
/// `Vec<(String, Vec<u8>)>`; values go through `serialize_bytes` /
/// `deserialize_byte_buf` so they are copied whole, not byte by byte.
mod header_list {
    use serde::de::{SeqAccess, Visitor};
    use serde::ser::SerializeSeq;
    use serde::{Deserializer, Serialize, Serializer};

    pub(super) struct Raw<'a>(pub(super) &'a [u8]);

    impl Serialize for Raw<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }

    pub(super) fn serialize<S: Serializer>(
        list: &[(String, Vec<u8>)],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(list.len()))?;
        for (k, v) in list {
            seq.serialize_element(&(k.as_str(), Raw(v)))?;
        }
        seq.end()
    }

    pub(super) fn serialize_map<S: Serializer>(
        map: &&http::HeaderMap,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(map.len()))?;
        for (k, v) in map.iter() {
            seq.serialize_element(&(k.as_str(), Raw(v.as_bytes())))?;
        }
        seq.end()
    }

    struct ByteBuf(Vec<u8>);

    impl<'de> serde::Deserialize<'de> for ByteBuf {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = ByteBuf;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("header value bytes")
                }
                fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<ByteBuf, E> {
                    Ok(ByteBuf(v.to_vec()))
                }
                fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<ByteBuf, E> {
                    Ok(ByteBuf(v))
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<ByteBuf, A::Error> {
                    let mut v = Vec::with_capacity(a.size_hint().unwrap_or(0).min(4096));
                    while let Some(b) = a.next_element::<u8>()? {
                        v.push(b);
                    }
                    Ok(ByteBuf(v))
                }
            }
            d.deserialize_byte_buf(V)
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Vec<(String, Vec<u8>)>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Vec<(String, Vec<u8>)>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a header list")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(a.size_hint().unwrap_or(0).min(256));
                while let Some((k, ByteBuf(v))) = a.next_element::<(String, ByteBuf)>()? {
                    out.push((k, v));
                }
                Ok(out)
            }
        }
        d.deserialize_seq(V)
    }
}

/// A frame that could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WireError {
    /// The announced head length exceeds [`MAX_HEAD_LEN`]: the peer is broken
    /// or hostile; the stream is closed.
    #[error("head of {0} bytes exceeds the {MAX_HEAD_LEN}-byte limit")]
    TooLong(usize),
    /// The head bytes are not a valid frame of this version.
    #[error("malformed head: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    /// The head could not be encoded (a value bincode cannot represent).
    #[error("cannot encode head: {0}")]
    Encode(#[from] bincode::error::EncodeError),
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_HEAD_LEN>()
}

/// Bytes reserved for a frame before encoding it: more than most heads
/// (a browser's request head is 300-700 bytes, a response head less); a
/// larger one grows as a `Vec` does.
const ENCODE_CAPACITY: usize = 768;

/// Encodes `head` as a length-prefixed frame: `[u32 BE len][bincode]`.
///
/// # Errors
/// [`WireError::Encode`] if bincode fails, [`WireError::TooLong`] past [`MAX_HEAD_LEN`].
pub(crate) fn encode<T: Serialize>(head: &T) -> Result<Vec<u8>, WireError> {
    // Room for a usual head at once: grown from the prefix's 4 bytes, the
    // buffer was reallocated (and copied) seven times on its way to 300.
    let mut buf = Vec::with_capacity(ENCODE_CAPACITY);
    buf.extend_from_slice(&[0u8; 4]);
    bincode::serde::encode_into_std_write(head, &mut buf, config())?;
    let len = buf.len() - 4;
    if len > MAX_HEAD_LEN {
        return Err(WireError::TooLong(len));
    }
    buf[..4].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(buf)
}

/// Reads the 4-byte length prefix; checks it against [`MAX_HEAD_LEN`].
///
/// # Errors
/// [`WireError::TooLong`].
pub(crate) fn head_len(prefix: [u8; 4]) -> Result<usize, WireError> {
    let len = u32::from_be_bytes(prefix) as usize;
    if len > MAX_HEAD_LEN {
        return Err(WireError::TooLong(len));
    }
    Ok(len)
}

/// Decodes a head from exactly the bytes after the length prefix, in its
/// owned form (tests and the fuzz harness: the nodes decode in place).
///
/// # Errors
/// [`WireError::Decode`] when the bytes are not one complete head.
#[cfg(test)]
pub(crate) fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    decode_view(bytes)
}

/// Decodes a head borrowing from `bytes` (exactly the bytes after the
/// length prefix), such as [`RequestHeadView`].
///
/// # Errors
/// [`WireError::Decode`] when the bytes are not one complete head.
pub(crate) fn decode_view<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, WireError> {
    let (v, used) = bincode::serde::borrow_decode_from_slice(bytes, config())?;
    if used != bytes.len() {
        return Err(WireError::Decode(bincode::error::DecodeError::OtherString(
            format!("{} trailing bytes after the head", bytes.len() - used),
        )));
    }
    Ok(v)
}

/// Decodes a [`ResponseHead`] frame (exactly the bytes after the length
/// prefix) into a [`DecodedResponseHead`] whose header values share
/// `frame`'s buffer. Accepts the frames `decode::<ResponseHead>` accepts,
/// and those whose names are not all UTF-8 (a name is not checked as
/// UTF-8 first); a line whose name or value is not valid HTTP is left out
/// and named, lossily, in [`DecodedResponseHead::dropped`].
///
/// # Errors
/// [`WireError::Decode`] when the bytes are not one complete head.
pub(crate) fn decode_response(frame: &bytes::Bytes) -> Result<DecodedResponseHead, WireError> {
    let (v, used) =
        bincode::serde::seed_decode_from_slice(response_seed::Head(frame), frame, config())?;
    if used != frame.len() {
        return Err(WireError::Decode(bincode::error::DecodeError::OtherString(
            format!("{} trailing bytes after the head", frame.len() - used),
        )));
    }
    Ok(v)
}

/// The serde seeds of [`decode_response`]: the layout of
/// [`ResponseHead`] (a struct is its fields in order; the header list a
/// sequence of `(name, value bytes)` pairs), each borrowed piece of the
/// input turned into a slice of the frame's `Bytes`.
mod response_seed {
    use bytes::Bytes;
    use http::{HeaderMap, HeaderName, HeaderValue};
    use serde::de::{DeserializeSeed, Deserializer, Error, SeqAccess, Visitor};

    use super::DecodedResponseHead;

    /// Header slots reserved up front: the head's lines and two for the
    /// entry's own (`peerlb-served-by`, a route cookie), at least the 6 a
    /// map's first insert would make room for (fewer made the entry's
    /// inserts grow the map: a second allocation and a rehash), at most
    /// 64 (a hostile head must not size the map).
    const MIN_RESERVED: usize = 6;
    const MAX_RESERVED: usize = 64;

    pub(super) struct Head<'f>(pub(super) &'f Bytes);

    impl<'de> DeserializeSeed<'de> for Head<'_> {
        type Value = DecodedResponseHead;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_struct("ResponseHead", &["status", "headers", "served_by"], self)
        }
    }

    impl<'de> Visitor<'de> for Head<'_> {
        type Value = DecodedResponseHead;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a response head")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
            let status: u16 = a
                .next_element()?
                .ok_or_else(|| A::Error::invalid_length(0, &self))?;
            let (headers, dropped) = a
                .next_element_seed(Lines(self.0))?
                .ok_or_else(|| A::Error::invalid_length(1, &self))?;
            let served_by: &'de str = a
                .next_element()?
                .ok_or_else(|| A::Error::invalid_length(2, &self))?;
            Ok(DecodedResponseHead {
                status,
                headers,
                dropped,
                served_by: self.0.slice_ref(served_by.as_bytes()),
            })
        }
    }

    struct Lines<'f>(&'f Bytes);

    impl<'de> DeserializeSeed<'de> for Lines<'_> {
        type Value = (HeaderMap, Vec<String>);
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_seq(self)
        }
    }

    impl<'de> Visitor<'de> for Lines<'_> {
        type Value = (HeaderMap, Vec<String>);
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a header list")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
            let lines = a.size_hint().unwrap_or(0);
            let mut map = HeaderMap::with_capacity((lines + 2).clamp(MIN_RESERVED, MAX_RESERVED));
            let mut dropped = Vec::new();
            // A name's bytes are not checked as UTF-8 first: a field name
            // is ASCII, and one that is not a valid name is dropped (named
            // in `dropped`, lossily) as any other invalid one.
            while let Some((k, v)) = a.next_element::<(&'de [u8], &'de [u8])>()? {
                match (
                    HeaderName::from_bytes(k),
                    HeaderValue::from_maybe_shared(self.0.slice_ref(v)),
                ) {
                    (Ok(k), Ok(v)) => {
                        map.append(k, v);
                    }
                    _ => dropped.push(String::from_utf8_lossy(k).into_owned()),
                }
            }
            Ok((map, dropped))
        }
    }
}

#[cfg(test)]
mod tests;
