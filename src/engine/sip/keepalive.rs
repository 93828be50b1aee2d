//! RFC 5626 keep-alives on a stream transport (section 3.5.1 and 4.4.1): a
//! client sends a double CRLF (the ping) between messages and the server
//! answers one CRLF (the pong), which keeps a NAT binding and the
//! connection open. Other CRLFs between messages are skipped (RFC 3261
//! section 7.5). Bytes in, counts out: the TCP listener writes the pongs.

/// The pong a server writes for each ping (RFC 5626 section 3.5.1).
pub(crate) const PONG: &[u8] = b"\r\n";

/// What the CRLFs at the start of a stream's buffer hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Keepalive {
    /// Bytes to skip (every CR and LF before a message).
    pub(crate) skip: usize,
    /// Pings found (double CRLFs): one pong each.
    pub(crate) pongs: usize,
    /// The buffer ended after half a ping (one CRLF, no message after it):
    /// the next bytes may finish it. Pass it to the next [`scan`].
    pub(crate) half: bool,
}

/// Scans the CRLFs at the start of `buf`; `half` is the previous scan's
/// [`Keepalive::half`] (a CRLF already skipped that may begin a ping). A
/// lone CR or LF breaks a ping and is skipped; a CR at the very end of
/// `buf` is kept for the next read (its LF may follow). A message that
/// starts after a single CRLF ends the pending half ping without a pong.
pub(crate) fn scan(buf: &[u8], half: bool) -> Keepalive {
    let mut crlfs = usize::from(half);
    let mut pongs = 0;
    let mut i = 0;
    while i < buf.len() {
        match (buf[i], buf.get(i + 1)) {
            (b'\r', Some(b'\n')) => {
                crlfs += 1;
                if crlfs == 2 {
                    pongs += 1;
                    crlfs = 0;
                }
                i += 2;
            }
            // Its LF may come with the next read.
            (b'\r', None) => break,
            (b'\r' | b'\n', _) => {
                crlfs = 0;
                i += 1;
            }
            _ => {
                crlfs = 0;
                break;
            }
        }
    }
    Keepalive {
        skip: i,
        pongs,
        half: crlfs == 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_double_crlf_is_a_ping_and_a_lone_crlf_is_skipped() {
        assert_eq!(
            scan(b"\r\n\r\n", false),
            Keepalive {
                skip: 4,
                pongs: 1,
                half: false
            }
        );
        assert_eq!(
            scan(b"\r\n\r\n\r\n\r\nINVITE", false),
            Keepalive {
                skip: 8,
                pongs: 2,
                half: false
            }
        );
        // A stray CRLF before a start line (RFC 3261 7.5): no pong.
        assert_eq!(
            scan(b"\r\nINVITE", false),
            Keepalive {
                skip: 2,
                pongs: 0,
                half: false
            }
        );
        assert_eq!(
            scan(b"INVITE", false),
            Keepalive {
                skip: 0,
                pongs: 0,
                half: false
            }
        );
        assert_eq!(
            scan(b"", false),
            Keepalive {
                skip: 0,
                pongs: 0,
                half: false
            }
        );
    }

    #[test]
    fn a_ping_split_across_reads_is_answered_once() {
        let first = scan(b"\r\n", false);
        assert_eq!((first.skip, first.pongs, first.half), (2, 0, true));
        let second = scan(b"\r\n", first.half);
        assert_eq!((second.skip, second.pongs, second.half), (2, 1, false));
        // Split inside a CRLF: the CR waits for its LF.
        let a = scan(b"\r\n\r", false);
        assert_eq!((a.skip, a.pongs, a.half), (2, 0, true));
        let b = scan(b"\r\n", a.half);
        assert_eq!((b.skip, b.pongs), (2, 1));
        // A message after half a ping ends it.
        assert!(!scan(b"OPTIONS", true).half);
        assert_eq!(scan(b"OPTIONS", true).pongs, 0);
    }

    #[test]
    fn lone_line_feeds_break_a_ping() {
        let k = scan(b"\r\n\n\r\nX", false);
        assert_eq!((k.skip, k.pongs), (5, 0));
        let k = scan(b"\n\n\n\n", false);
        assert_eq!((k.skip, k.pongs, k.half), (4, 0, false));
    }
}
