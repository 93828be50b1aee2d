//! The parser against the torture messages of RFC 4475 ("Session
//! Initiation Protocol (SIP) Torture Test Messages"), section 3.1: the
//! short tortuous INVITE (3.1.1.1, `wsinv`) and every invalid message of
//! 3.1.2 (3.1.2.1-3.1.2.19), each byte for byte as the RFC prints it (CRLF
//! line ends, its body included) in `rfc4475/<name>.sip`.
//!
//! Where a message's defect lies in what peerlb reads to route a request
//! (the start line, `Content-Length`, `CSeq` and its method,
//! `Max-Forwards`, the mandatory fields), it must be refused as the RFC
//! says. Where the defect lies in a field peerlb only carries (a display
//! name, a `Date`, `Contact`, escaped headers in a URI, empty `Via` or
//! `Contact` parameters after the sent-by), peerlb, which routes on the
//! `From` tag and `Call-ID` and forwards the rest unchanged, accepts it
//! and reads its key: the RFC leaves those to the element that interprets
//! the field (3.1.2.11-3.1.2.14 allow a proxy to forward), and for
//! `badinv01`, `quotbal` and `baddn` (which it says should get 400)
//! peerlb knowingly leaves the check to the user agent behind it.

use super::*;

/// A message of RFC 4475 by its name there.
fn message(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/src/engine/sip/rfc4475/{name}.sip",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// 3.1.1.1: line folding everywhere, LWS around colons and separators,
/// compact and long names mixed, odd name case, leading zeros in
/// Max-Forwards and CSeq, unknown fields: a well-formed request.
#[test]
fn wsinv_the_short_tortuous_invite_parses_and_yields_its_key() {
    let bytes = message("wsinv");
    let m = parse(&bytes).unwrap_or_else(|e| panic!("wsinv: {e}"));
    assert_eq!(m.method(), Some("INVITE"));
    assert_eq!(m.tag_of_from(), Some("98asjd8"));
    assert_eq!(m.call_id(), Some("wsinv.ndaksdj@192.0.2.1"));
    assert_eq!(m.cseq(), Some((9, "INVITE")));
    assert_eq!(m.header("max-forwards"), Some("0068"));
    let via = m.top_via().expect("a top Via");
    assert_eq!(via.param("branch"), Some("390skdjuw"));
    // Three Via values: one field, then `v:` with two, comma separated.
    assert_eq!(m.header_list("via").len(), 3);
    assert_eq!(m.body.len(), 150);
    // On a stream it frames to the whole message.
    assert_eq!(frame_len(&bytes), Ok(Some(bytes.len())));
}

/// 3.1.2: the invalid messages whose defect is in what peerlb reads:
/// refused, with a 400 for a request whose Via can be read and nothing
/// for a response.
#[test]
fn the_rfc_4475_invalid_messages_peerlb_reads_are_refused() {
    let cases = [
        // 3.1.2.2: Content-Length 9999, a body of 154 bytes.
        ("clerr", ParseError::ContentLength),
        // 3.1.2.3: Content-Length -999.
        ("ncl", ParseError::ContentLength),
        // 3.1.2.4: CSeq 36893488147419103232, Max-Forwards 300.
        ("scalar02", ParseError::Mandatory("CSeq")),
        // 3.1.2.5: a response with CSeq 9292394834772304023312.
        ("scalarlg", ParseError::Mandatory("CSeq")),
        // 3.1.2.7: the Request-URI in <>.
        ("ltgtruri", ParseError::StartLine),
        // 3.1.2.8: LWS inside the Request-URI.
        ("lwsruri", ParseError::StartLine),
        // 3.1.2.9: two SPs between the request line's elements.
        ("lwsstart", ParseError::StartLine),
        // 3.1.2.10: SPs after SIP/2.0.
        ("trws", ParseError::StartLine),
        // 3.1.2.16: SIP/7.0.
        ("badvers", ParseError::StartLine),
        // 3.1.2.17: OPTIONS with CSeq 8 INVITE.
        ("mismatch01", ParseError::Mandatory("CSeq")),
        // 3.1.2.18: NEWMETHOD with CSeq 8 INVITE.
        ("mismatch02", ParseError::Mandatory("CSeq")),
        // 3.1.2.19: status code 4294967301.
        ("bigcode", ParseError::StartLine),
    ];
    for (name, want) in cases {
        let bytes = message(name);
        assert_eq!(parse(&bytes).err(), Some(want.clone()), "{name}");
        let answer = bad_request(&bytes, &want);
        let is_request = !bytes.starts_with(b"SIP/2.0 ");
        let via_readable = !matches!(want, ParseError::StartLine);
        match answer {
            Some(r) => {
                assert!(is_request && via_readable, "{name}: answered {:?}", r.start);
                assert!(
                    matches!(r.start, StartLine::Response { status: 400, .. }),
                    "{name}: {:?}",
                    r.start
                );
                // The 400 goes back along the request's own Via.
                assert_eq!(
                    r.header("call-id"),
                    parse_call_id(&bytes).as_deref(),
                    "{name}"
                );
            }
            None => assert!(!(is_request && via_readable), "{name}: no 400"),
        }
    }
    // scalar02's Max-Forwards 300 alone is refused too (it is past 255).
    let mf = String::from_utf8(message("scalar02"))
        .unwrap()
        .replace("CSeq: 36893488147419103232 REGISTER", "CSeq: 1 REGISTER");
    assert_eq!(
        parse(mf.as_bytes()).err(),
        Some(ParseError::Mandatory("Max-Forwards"))
    );
}

/// The `Call-ID` line of raw bytes, as the test reads it.
fn parse_call_id(bytes: &[u8]) -> Option<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .find_map(|l| l.strip_prefix("Call-ID: ").map(str::to_owned))
}

/// 3.1.2: the invalid messages whose defect is in a field peerlb only
/// carries (see the module doc): accepted, their key read.
#[test]
fn the_rfc_4475_invalid_messages_in_fields_peerlb_carries_keep_their_key() {
    let cases = [
        // 3.1.2.1: `;;,;,,` after the Via's sent-by, `;;;;` after Contact.
        (
            "badinv01",
            "134161461246",
            "badinv01.0ha0isndaksdjasdf3234nas",
        ),
        // 3.1.2.6: an unterminated quoted display name in To.
        ("quotbal", "93334", "quotbal.aksdj"),
        // 3.1.2.11: escaped headers in the Request-URI.
        (
            "escruri",
            "341518",
            "escruri.23940-asdfhj-aje3br-234q098w-fawerh2q-h4n5",
        ),
        // 3.1.2.12: a Date in EST.
        (
            "baddate",
            "2234923",
            "baddate.239423mnsadf3j23lj42--sedfnm234",
        ),
        // 3.1.2.13: a Contact URI with `?` not in <>.
        ("regbadct", "998332", "regbadct.k345asrl3fdbv@10.0.0.1"),
        // 3.1.2.14: spaces inside To's <>.
        (
            "badaspec",
            "433423",
            "badaspec.sdf0234n2nds0a099u23h3hnnw009cdkne3",
        ),
        // 3.1.2.15: non-token display names, unquoted.
        ("baddn", "43", "baddn.31415@c.example.com"),
    ];
    for (name, tag, call_id) in cases {
        let m = parse(&message(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            (m.tag_of_from(), m.call_id()),
            (Some(tag), Some(call_id)),
            "{name}"
        );
    }
}
