//! The PROXY protocol (HAProxy's "PROXY protocol" specification, versions
//! 1 and 2) on a client listener that expects it: the sprayer (HAProxy
//! `send-proxy` / `send-proxy-v2`, an AWS NLB, ...) opens each connection
//! with a header carrying the client's own address, and peerlb takes that
//! address as the client's everywhere it uses one.
//!
//! Only a listener configured for it (`proxy_protocol = true`) reads a
//! header, and there a connection without a valid one is closed; a
//! listener that does not expect it never looks for one, so a client
//! cannot forge its address (a `PROXY ...` line there is an ordinary
//! malformed request).
//!
//! Forms:
//!
//! ```text
//! v1: "PROXY TCP4 <src ip> <dst ip> <src port> <dst port>\r\n"   (at most 107 bytes)
//!     "PROXY TCP6 ...\r\n", "PROXY UNKNOWN ...\r\n"
//! v2: 12-byte signature, ver/cmd, family/transport, u16 BE length, addresses, TLVs
//! ```
//!
//! A v2 `LOCAL` command (the sprayer's own health check), a v1 `UNKNOWN`
//! and a v2 header of an unspecified or Unix family carry no client
//! address: the connection's own peer address stands.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The v2 signature (section 2.2).
const V2_SIG: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// The v1 prefix.
const V1_PREFIX: &[u8] = b"PROXY ";
/// Longest v1 header, CRLF included (section 2.1).
const V1_MAX: usize = 107;
/// Length of the fixed part of a v2 header.
const V2_FIXED: usize = 16;

/// A PROXY header that was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProxyHeader {
    /// Bytes the header took (what follows is the client's own stream).
    pub len: usize,
    /// The client's address it carries; `None` for a v2 `LOCAL`, a v1
    /// `UNKNOWN`, or a family without an IP address (the connection's
    /// peer address stands).
    pub source: Option<SocketAddr>,
}

/// A connection's PROXY header is missing or malformed: the connection is
/// closed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ProxyError {
    /// The bytes start neither with `PROXY ` nor with the v2 signature.
    #[error("no PROXY protocol header (the listener expects one)")]
    Missing,
    /// A v1 line longer than 107 bytes or without CRLF.
    #[error("PROXY v1 header without CRLF within 107 bytes")]
    V1TooLong,
    /// A v1 line whose fields do not parse (the message names which).
    #[error("malformed PROXY v1 header: {0}")]
    V1(&'static str),
    /// A v2 header with a bad version, command, family or length.
    #[error("malformed PROXY v2 header: {0}")]
    V2(&'static str),
    /// The connection closed before the header was complete.
    #[error("connection closed inside the PROXY header")]
    Closed,
    /// No complete header within the listener's timeout.
    #[error("no complete PROXY header within {0:?}")]
    Timeout(Duration),
    /// Reading failed.
    #[error("reading the PROXY header: {0}")]
    Io(String),
}

/// Parses the PROXY header at the start of `buf`: `Ok(None)` while more
/// bytes are needed, the header once complete.
///
/// # Errors
/// [`ProxyError`] when `buf` cannot start a valid header.
pub(crate) fn parse(buf: &[u8]) -> Result<Option<ProxyHeader>, ProxyError> {
    let n = buf.len().min(V2_SIG.len());
    if buf[..n] == V2_SIG[..n] {
        return if buf.len() < V2_FIXED {
            Ok(None)
        } else {
            parse_v2(buf)
        };
    }
    let n = buf.len().min(V1_PREFIX.len());
    if buf[..n] == V1_PREFIX[..n] {
        return parse_v1(buf);
    }
    Err(ProxyError::Missing)
}

fn parse_v1(buf: &[u8]) -> Result<Option<ProxyHeader>, ProxyError> {
    let window = &buf[..buf.len().min(V1_MAX)];
    let Some(end) = window.windows(2).position(|w| w == b"\r\n") else {
        return if buf.len() >= V1_MAX {
            Err(ProxyError::V1TooLong)
        } else {
            Ok(None)
        };
    };
    let line =
        std::str::from_utf8(&buf[V1_PREFIX.len()..end]).map_err(|_| ProxyError::V1("not ASCII"))?;
    let len = end + 2;
    let mut fields = line.split(' ');
    let family = fields.next().unwrap_or_default();
    if family == "UNKNOWN" {
        // The receiver ignores everything after UNKNOWN (section 2.1).
        return Ok(Some(ProxyHeader { len, source: None }));
    }
    let v6 = match family {
        "TCP4" => false,
        "TCP6" => true,
        _ => return Err(ProxyError::V1("the protocol is not TCP4, TCP6 or UNKNOWN")),
    };
    let (Some(src), Some(dst), Some(sport), Some(dport), None) = (
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    ) else {
        return Err(ProxyError::V1("want 4 address fields"));
    };
    let ip = |s: &str| -> Result<IpAddr, ProxyError> {
        if v6 {
            s.parse::<Ipv6Addr>()
                .map(IpAddr::V6)
                .map_err(|_| ProxyError::V1("not an IPv6 address"))
        } else {
            s.parse::<Ipv4Addr>()
                .map(IpAddr::V4)
                .map_err(|_| ProxyError::V1("not an IPv4 address"))
        }
    };
    // Ports are 1 to 5 digits, no sign, no leading zero (section 2.1).
    let port = |s: &str| -> Result<u16, ProxyError> {
        let ok = !s.is_empty()
            && s.len() <= 5
            && s.bytes().all(|b| b.is_ascii_digit())
            && (s == "0" || !s.starts_with('0'));
        ok.then(|| s.parse::<u16>().ok())
            .flatten()
            .ok_or(ProxyError::V1("not a port number"))
    };
    let source = SocketAddr::new(ip(src)?, port(sport)?);
    ip(dst)?;
    port(dport)?;
    Ok(Some(ProxyHeader {
        len,
        source: Some(source),
    }))
}

fn parse_v2(buf: &[u8]) -> Result<Option<ProxyHeader>, ProxyError> {
    let ver_cmd = buf[12];
    if ver_cmd >> 4 != 2 {
        return Err(ProxyError::V2("version is not 2"));
    }
    let local = match ver_cmd & 0x0f {
        0 => true,
        1 => false,
        _ => return Err(ProxyError::V2("command is neither LOCAL nor PROXY")),
    };
    let fam = buf[13];
    let body_len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    let len = V2_FIXED + body_len;
    if buf.len() < len {
        return Ok(None);
    }
    let body = &buf[V2_FIXED..len];
    // LOCAL: the sprayer speaking for itself; addresses, if any, are ignored.
    if local {
        return Ok(Some(ProxyHeader { len, source: None }));
    }
    let source = match fam >> 4 {
        // AF_UNSPEC: unknown; the receiver uses the connection's address.
        0 => None,
        1 => {
            if body.len() < 12 {
                return Err(ProxyError::V2("an IPv4 header shorter than 12 bytes"));
            }
            let ip = Ipv4Addr::new(body[0], body[1], body[2], body[3]);
            Some(SocketAddr::new(
                ip.into(),
                u16::from_be_bytes([body[8], body[9]]),
            ))
        }
        2 => {
            if body.len() < 36 {
                return Err(ProxyError::V2("an IPv6 header shorter than 36 bytes"));
            }
            let mut a = [0u8; 16];
            a.copy_from_slice(&body[..16]);
            Some(SocketAddr::new(
                Ipv6Addr::from(a).into(),
                u16::from_be_bytes([body[32], body[33]]),
            ))
        }
        // AF_UNIX: no IP address to take.
        3 => None,
        _ => return Err(ProxyError::V2("unknown address family")),
    };
    if source.is_some() && fam & 0x0f != 1 && fam & 0x0f != 2 {
        return Err(ProxyError::V2("unknown transport protocol"));
    }
    Ok(Some(ProxyHeader { len, source }))
}

/// Reads a PROXY header from the start of `io` within `timeout`: the
/// header, and the bytes read past it (the start of the client's own
/// stream, to be read before `io`).
///
/// # Errors
/// [`ProxyError`]: missing, malformed, closed early, timed out.
pub(crate) async fn read_header<S: AsyncRead + Unpin>(
    io: &mut S,
    timeout: Duration,
) -> Result<(ProxyHeader, Bytes), ProxyError> {
    let read = async {
        let mut buf = BytesMut::with_capacity(512);
        loop {
            if let Some(h) = parse(&buf)? {
                let rest = buf.split_off(h.len).freeze();
                return Ok((h, rest));
            }
            // A v2 header may be up to 16 + 65535 bytes long.
            if buf.capacity() == buf.len() {
                buf.reserve(1024);
            }
            match io.read_buf(&mut buf).await {
                Ok(0) => return Err(ProxyError::Closed),
                Ok(_) => {}
                Err(e) => return Err(ProxyError::Io(e.to_string())),
            }
        }
    };
    tokio::time::timeout(timeout, read)
        .await
        .unwrap_or(Err(ProxyError::Timeout(timeout)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(cmd: u8, fam: u8, body: &[u8]) -> Vec<u8> {
        let mut h = V2_SIG.to_vec();
        h.push(0x20 | cmd);
        h.push(fam);
        h.extend_from_slice(&(body.len() as u16).to_be_bytes());
        h.extend_from_slice(body);
        h
    }

    #[test]
    fn v1_tcp4_gives_the_source_address_and_length() {
        let h = b"PROXY TCP4 203.0.113.7 192.0.2.1 56324 443\r\nGET / HTTP/1.1\r\n";
        let p = parse(h).unwrap().unwrap();
        assert_eq!(p.source, Some("203.0.113.7:56324".parse().unwrap()));
        assert_eq!(&h[p.len..p.len + 3], b"GET");
    }

    #[test]
    fn v1_tcp6_and_unknown() {
        let p = parse(b"PROXY TCP6 2001:db8::1 2001:db8::2 1 65535\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(p.source, Some("[2001:db8::1]:1".parse().unwrap()));
        let p = parse(b"PROXY UNKNOWN ffff::1 x y z\r\n").unwrap().unwrap();
        assert_eq!(p.source, None);
        assert_eq!(p.len, 29);
    }

    #[test]
    fn v1_incomplete_needs_more_then_completes() {
        let full = b"PROXY TCP4 10.0.0.1 10.0.0.2 1000 80\r\n";
        for cut in 0..full.len() {
            assert_eq!(parse(&full[..cut]), Ok(None), "cut at {cut}");
        }
        assert!(parse(full).unwrap().is_some());
    }

    #[test]
    fn v1_malformed_lines_are_refused() {
        for bad in [
            &b"PROXY TCP5 10.0.0.1 10.0.0.2 1000 80\r\n"[..],
            b"PROXY TCP4 10.0.0.1 10.0.0.2 1000\r\n",
            b"PROXY TCP4 10.0.0.1 10.0.0.2 1000 80 9\r\n",
            b"PROXY TCP4 2001:db8::1 10.0.0.2 1000 80\r\n",
            b"PROXY TCP6 10.0.0.1 10.0.0.2 1000 80\r\n",
            b"PROXY TCP4 10.0.0.1 10.0.0.2 65536 80\r\n",
            b"PROXY TCP4 10.0.0.1 10.0.0.2 +100 80\r\n",
            b"PROXY TCP4 10.0.0.1 10.0.0.2 0100 80\r\n",
            b"PROXY TCP4  10.0.0.1 10.0.0.2 100 80\r\n",
        ] {
            assert!(
                matches!(parse(bad), Err(ProxyError::V1(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = [b"PROXY UNKNOWN ".as_slice(), &[b'x'; 100]].concat();
        assert_eq!(parse(&long), Err(ProxyError::V1TooLong));
    }

    #[test]
    fn anything_else_is_missing_at_the_first_wrong_byte() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Err(ProxyError::Missing));
        assert_eq!(parse(b"\x16\x03\x01"), Err(ProxyError::Missing));
        assert_eq!(parse(b"PROXX"), Err(ProxyError::Missing));
        assert_eq!(parse(b"\r\n\r\n\0\r\nQUIX"), Err(ProxyError::Missing));
        assert_eq!(parse(b""), Ok(None));
    }

    #[test]
    fn v2_inet_and_inet6_give_the_source() {
        let body4 = [203, 0, 113, 7, 192, 0, 2, 1, 0xdc, 0x04, 0x01, 0xbb];
        let h = v2(1, 0x11, &body4);
        let p = parse(&h).unwrap().unwrap();
        assert_eq!(p.source, Some("203.0.113.7:56324".parse().unwrap()));
        assert_eq!(p.len, 28);
        let mut body6 = [0u8; 36];
        body6[..16].copy_from_slice(&"2001:db8::7".parse::<Ipv6Addr>().unwrap().octets());
        body6[32..34].copy_from_slice(&4242u16.to_be_bytes());
        let p = parse(&v2(1, 0x21, &body6)).unwrap().unwrap();
        assert_eq!(p.source, Some("[2001:db8::7]:4242".parse().unwrap()));
    }

    #[test]
    fn v2_tlvs_are_skipped_and_partial_headers_wait() {
        let mut body = vec![10, 0, 0, 1, 10, 0, 0, 2, 0, 80, 0, 81];
        // PP2_TYPE_ALPN TLV and a NOOP.
        body.extend_from_slice(&[0x01, 0x00, 0x02, b'h', b'2', 0x04, 0x00, 0x00]);
        let mut h = v2(1, 0x11, &body);
        for cut in 0..h.len() {
            assert_eq!(parse(&h[..cut]), Ok(None), "cut at {cut}");
        }
        h.extend_from_slice(b"rest");
        let p = parse(&h).unwrap().unwrap();
        assert_eq!(&h[p.len..], b"rest");
        assert_eq!(p.source, Some("10.0.0.1:80".parse().unwrap()));
    }

    #[test]
    fn v2_local_unspec_and_unix_keep_the_connection_address() {
        let body4 = [10, 0, 0, 1, 10, 0, 0, 2, 0, 80, 0, 81];
        assert_eq!(parse(&v2(0, 0x11, &body4)).unwrap().unwrap().source, None);
        assert_eq!(parse(&v2(0, 0x00, &[])).unwrap().unwrap().source, None);
        assert_eq!(parse(&v2(1, 0x00, &[])).unwrap().unwrap().source, None);
        assert_eq!(
            parse(&v2(1, 0x31, &[0u8; 216])).unwrap().unwrap().source,
            None
        );
    }

    #[test]
    fn v2_malformed_headers_are_refused() {
        let body4 = [10, 0, 0, 1, 10, 0, 0, 2, 0, 80, 0, 81];
        let mut bad_version = v2(1, 0x11, &body4);
        bad_version[12] = 0x11;
        assert!(matches!(parse(&bad_version), Err(ProxyError::V2(_))));
        assert!(matches!(
            parse(&v2(2, 0x11, &body4)),
            Err(ProxyError::V2(_))
        ));
        assert!(matches!(
            parse(&v2(1, 0x11, &[0; 11])),
            Err(ProxyError::V2(_))
        ));
        assert!(matches!(
            parse(&v2(1, 0x21, &[0; 35])),
            Err(ProxyError::V2(_))
        ));
        assert!(matches!(
            parse(&v2(1, 0x41, &body4)),
            Err(ProxyError::V2(_))
        ));
        assert!(matches!(
            parse(&v2(1, 0x13, &body4)),
            Err(ProxyError::V2(_))
        ));
    }

    #[tokio::test]
    async fn read_header_returns_the_bytes_after_it() {
        let (mut a, mut b) = tokio::io::duplex(64);
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            // Split across writes, the stream's first bytes in the last one.
            a.write_all(b"PROXY TCP4 1.2.3.4 5.6.7.8 ").await.unwrap();
            a.write_all(b"11 22\r\nHEL").await.unwrap();
            a.write_all(b"LO").await.unwrap();
        });
        let (h, rest) = read_header(&mut b, Duration::from_secs(5)).await.unwrap();
        assert_eq!(h.source, Some("1.2.3.4:11".parse().unwrap()));
        let mut all = rest.to_vec();
        b.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"HELLO");
    }

    #[tokio::test(start_paused = true)]
    async fn read_header_times_out_and_sees_an_early_close() {
        let (_a, mut b) = tokio::io::duplex(64);
        let e = read_header(&mut b, Duration::from_secs(3))
            .await
            .unwrap_err();
        assert_eq!(e, ProxyError::Timeout(Duration::from_secs(3)));
        let (a, mut b) = tokio::io::duplex(64);
        drop(a);
        let e = read_header(&mut b, Duration::from_secs(3))
            .await
            .unwrap_err();
        assert_eq!(e, ProxyError::Closed);
    }
}
