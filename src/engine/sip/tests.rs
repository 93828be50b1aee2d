//! The SIP engine's tests: parsing, framing, keys, the proxy steps and
//! the transactions, each on messages written out in full.
//!
//! Past 800 lines: the messages at the top (an INVITE, its answers) are
//! shared by every test; a split by part would copy them or hide them in
//! a third file.

use proptest::prelude::*;

use super::*;

const INVITE: &str = "INVITE sip:bob@example.com SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5070;branch=z9hG4bK776asdhds;rport\r\n\
Max-Forwards: 70\r\n\
To: Bob <sip:bob@example.com>\r\n\
From: Alice <sip:alice@example.com>;tag=1928301774\r\n\
Call-ID: a84b4c76e66710@pc33.example.com\r\n\
CSeq: 314159 INVITE\r\n\
Contact: <sip:alice@192.0.2.1:5070>\r\n\
Content-Type: application/sdp\r\n\
Content-Length: 4\r\n\
\r\n\
v=0\r\n";

fn msg(text: &str) -> SipMessage {
    parse(text.as_bytes()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn parses_request_line_headers_and_body() {
    let m = msg(INVITE);
    assert_eq!(
        m.start,
        StartLine::Request {
            method: "INVITE".into(),
            uri: "sip:bob@example.com".into()
        }
    );
    assert_eq!(m.call_id(), Some("a84b4c76e66710@pc33.example.com"));
    assert_eq!(m.tag_of_from(), Some("1928301774"));
    assert_eq!(m.tag_of_to(), None);
    assert_eq!(m.cseq(), Some((314159, "INVITE")));
    assert_eq!(m.body, b"v=0\r");
    let via = m.top_via().unwrap();
    assert_eq!(
        (via.transport, via.host, via.port),
        ("UDP", "192.0.2.1", Some(5070))
    );
    assert_eq!(via.param("branch"), Some("z9hG4bK776asdhds"));
    assert_eq!(via.param("rport"), Some(""));
}

#[test]
fn compact_forms_read_as_their_full_names() {
    let m = msg(
        "OPTIONS sip:x@h SIP/2.0\r\nv: SIP/2.0/TCP h:1;branch=z9hG4bKa\r\n\
                 f: <sip:a@h>;tag=ft\r\nt: <sip:x@h>\r\ni: cid\r\nCSeq: 1 OPTIONS\r\n\
                 m: <sip:a@h>\r\nl: 0\r\n\r\n",
    );
    assert_eq!(m.call_id(), Some("cid"));
    assert_eq!(m.tag_of_from(), Some("ft"));
    assert_eq!(m.header("Contact"), Some("<sip:a@h>"));
    assert_eq!(m.top_via().unwrap().transport, "TCP");
    assert_eq!(default_key(&m).as_deref(), Some("ft|cid"));
}

#[test]
fn folded_lines_spaces_around_slashes_and_leading_crlf_are_accepted() {
    // RFC 4475 3.1.1.1 (wsinv) style: folding, `SIP / 2.0 / UDP`.
    let m = msg(
        "\r\n\r\nOPTIONS sip:x@h SIP/2.0\r\nVia  : SIP / 2.0\r\n  / UDP h:5060;branch=z9hG4bKb\r\n\
                 From: <sip:a@h>\r\n ;tag=t1\r\nTo: <sip:x@h>\r\nCall-ID: c\r\nCSeq: 2 OPTIONS\r\n\r\n",
    );
    assert_eq!(m.tag_of_from(), Some("t1"));
    assert_eq!(m.top_via().unwrap().host, "h");
}

#[test]
fn responses_parse_and_tags_are_header_params_not_uri_params() {
    let m = msg(
        "SIP/2.0 180 Ringing\r\nVia: SIP/2.0/UDP h;branch=z9hG4bKc\r\n\
                 From: <sip:a@h;tag=inside>;tag=outside\r\nTo: sip:x@h;tag=tt\r\nCall-ID: c\r\nCSeq: 1 INVITE\r\n\r\n",
    );
    assert_eq!(
        m.start,
        StartLine::Response {
            status: 180,
            reason: "Ringing".into()
        }
    );
    assert_eq!(m.tag_of_from(), Some("outside"));
    assert_eq!(m.tag_of_to(), Some("tt"));
}

/// RFC 4475 section 3.1.2 style invalid messages: each is refused.
#[test]
fn torture_style_malformed_messages_are_refused() {
    let ok_tail = "Via: SIP/2.0/UDP h;branch=z9hG4bKd\r\nFrom: <sip:a@h>;tag=1\r\nTo: <sip:b@h>\r\nCall-ID: c\r\n";
    let cases: Vec<(String, ParseError)> = vec![
        // badinv01-like: no Via, no Call-ID.
        (
            "INVITE sip:b@h SIP/2.0\r\nFrom: <sip:a@h>;tag=1\r\nTo: <sip:b@h>\r\nCSeq: 1 INVITE\r\n\r\n".into(),
            ParseError::Mandatory("Via"),
        ),
        // CSeq method differs from the request's (cseq mismatch).
        (
            format!("INVITE sip:b@h SIP/2.0\r\n{ok_tail}CSeq: 1 BYE\r\n\r\n"),
            ParseError::Mandatory("CSeq"),
        ),
        // Non-numeric CSeq (ncl / scalar fields out of range).
        (
            format!("OPTIONS sip:b@h SIP/2.0\r\n{ok_tail}CSeq: -1 OPTIONS\r\n\r\n"),
            ParseError::Mandatory("CSeq"),
        ),
        (
            format!("OPTIONS sip:b@h SIP/2.0\r\n{ok_tail}CSeq: 99999999999 OPTIONS\r\n\r\n"),
            ParseError::Mandatory("CSeq"),
        ),
        // Negative Content-Length (ncl).
        (
            format!("OPTIONS sip:b@h SIP/2.0\r\n{ok_tail}CSeq: 1 OPTIONS\r\nContent-Length: -999\r\n\r\n"),
            ParseError::ContentLength,
        ),
        // Content-Length larger than the body (clerr).
        (
            format!("OPTIONS sip:b@h SIP/2.0\r\n{ok_tail}CSeq: 1 OPTIONS\r\nl: 9999\r\n\r\nabc"),
            ParseError::ContentLength,
        ),
        // Two differing Content-Lengths.
        (
            format!("OPTIONS sip:b@h SIP/2.0\r\n{ok_tail}CSeq: 1 OPTIONS\r\nl: 1\r\nContent-Length: 2\r\n\r\nab"),
            ParseError::ContentLength,
        ),
        // Max-Forwards out of range (scalar02).
        (
            format!("OPTIONS sip:b@h SIP/2.0\r\n{ok_tail}CSeq: 1 OPTIONS\r\nMax-Forwards: 300000\r\n\r\n"),
            ParseError::Mandatory("Max-Forwards"),
        ),
        // Unknown protocol version (badvers01).
        (
            format!("OPTIONS sip:b@h SIP/7.0\r\n{ok_tail}CSeq: 1 OPTIONS\r\n\r\n"),
            ParseError::StartLine,
        ),
        // Request-URI in angle brackets (lwsruri / ltgtruri).
        (
            format!("INVITE <sip:b@h> SIP/2.0\r\n{ok_tail}CSeq: 1 INVITE\r\n\r\n"),
            ParseError::StartLine,
        ),
        // Spaces inside the Request-URI (invut-like, lwsstart).
        (
            format!("INVITE sip:b @h SIP/2.0\r\n{ok_tail}CSeq: 1 INVITE\r\n\r\n"),
            ParseError::StartLine,
        ),
        // A status code out of range.
        (
            format!("SIP/2.0 999 Nope\r\n{ok_tail}CSeq: 1 INVITE\r\n\r\n"),
            ParseError::StartLine,
        ),
        // A header line with no colon.
        (
            format!("OPTIONS sip:b@h SIP/2.0\r\n{ok_tail}CSeq 1 OPTIONS\r\n\r\n"),
            ParseError::HeaderLine,
        ),
        // A continuation line with nothing to continue.
        (
            format!("OPTIONS sip:b@h SIP/2.0\r\n folded\r\n{ok_tail}CSeq: 1 OPTIONS\r\n\r\n"),
            ParseError::HeaderLine,
        ),
        // A Via without sent-by.
        (
            "OPTIONS sip:b@h SIP/2.0\r\nVia: SIP/2.0/UDP\r\nFrom: <sip:a@h>;tag=1\r\nTo: <sip:b@h>\r\nCall-ID: c\r\nCSeq: 1 OPTIONS\r\n\r\n".into(),
            ParseError::Mandatory("Via"),
        ),
        // No blank line: the head never ends.
        ("OPTIONS sip:b@h SIP/2.0\r\n".into(), ParseError::Incomplete),
    ];
    for (text, want) in cases {
        assert_eq!(parse(text.as_bytes()), Err(want), "{text}");
    }
    assert_eq!(
        parse(&[0xff, 0xfe, b'\r', b'\n', b'\r', b'\n']),
        Err(ParseError::NotUtf8)
    );
    assert_eq!(
        parse(&vec![b'a'; MAX_MESSAGE + 1]),
        Err(ParseError::TooLarge)
    );
    let many = format!(
        "OPTIONS sip:b@h SIP/2.0\r\n{ok_tail}CSeq: 1 OPTIONS\r\n{}\r\n",
        "X: y\r\n".repeat(MAX_HEADERS)
    );
    assert_eq!(parse(many.as_bytes()), Err(ParseError::TooLarge));
}

#[test]
fn stream_framing_needs_content_length_and_waits_for_the_body() {
    let whole = INVITE.as_bytes();
    assert_eq!(frame_len(whole), Ok(Some(whole.len() - 1)));
    assert_eq!(frame_len(&whole[..whole.len() - 3]), Ok(None));
    assert_eq!(frame_len(&whole[..40]), Ok(None));
    let no_cl = INVITE.replace("Content-Length: 4\r\n", "");
    assert_eq!(frame_len(no_cl.as_bytes()), Err(ParseError::ContentLength));
    assert_eq!(
        frame_len(&vec![b'a'; MAX_MESSAGE]),
        Err(ParseError::TooLarge)
    );
    let big = INVITE.replace("Content-Length: 4", "Content-Length: 99999");
    assert_eq!(frame_len(big.as_bytes()), Err(ParseError::TooLarge));
}

#[test]
fn to_bytes_round_trips_and_rewrites_content_length() {
    let m = msg(INVITE);
    let again = parse(&m.to_bytes()).unwrap();
    assert_eq!(again, m);
    assert!(String::from_utf8_lossy(&m.to_bytes()).contains("Content-Length: 4\r\n\r\nv=0\r"));
}

#[test]
fn via_and_route_lists_split_pop_and_push() {
    let mut m = msg(
        "BYE sip:b@h SIP/2.0\r\nVia: SIP/2.0/UDP p1;branch=z9hG4bK1, SIP/2.0/UDP p2;branch=z9hG4bK2\r\n\
         Route: <sip:10.0.0.1:5060;lr;peerlb-owner=n2;peerlb-key=t%7Cc>, <sip:p9;lr>\r\n\
         From: <sip:a@h>;tag=1\r\nTo: <sip:b@h>;tag=2\r\nCall-ID: c\r\nCSeq: 2 BYE\r\n\r\n",
    );
    assert_eq!(
        dialog_route(&m),
        Some(DialogRoute {
            owner: "n2".into(),
            key: "t|c".into()
        })
    );
    m.pop_route();
    assert_eq!(m.header_list("route"), vec!["<sip:p9;lr>"]);
    assert_eq!(dialog_route(&m), None);
    m.pop_via();
    assert_eq!(m.top_via().unwrap().host, "p2");
    m.push_front("Via", "SIP/2.0/UDP me:1;branch=z9hG4bKme".into());
    assert_eq!(m.top_via().unwrap().host, "me");
}

#[test]
fn a_tls_record_route_is_sips_for_a_sips_request_else_transport_tls() {
    let a = "10.0.0.1:5061".parse().unwrap();
    assert_eq!(
        record_route(a, Transport::Tls, true, ("n1", "k"), None),
        "<sips:10.0.0.1:5061;lr;peerlb-owner=n1;peerlb-key=k>"
    );
    assert_eq!(
        record_route(a, Transport::Tls, false, ("n1", "k"), None),
        "<sip:10.0.0.1:5061;transport=tls;lr;peerlb-owner=n1;peerlb-key=k>"
    );
    let sips = msg(&INVITE.replace("INVITE sip:bob", "INVITE SIPS:bob"));
    assert!(is_sips_request(&sips));
    assert!(!is_sips_request(&msg(INVITE)));
    // Either form is read back as this cluster's route.
    for rr in [
        record_route(a, Transport::Tls, true, ("n1", "k"), None),
        record_route(a, Transport::Tls, false, ("n1", "k"), None),
    ] {
        let m = msg(&format!(
            "ACK sips:b@h SIP/2.0\r\nVia: SIP/2.0/TLS p;branch=z9hG4bK1\r\nRoute: {rr}\r\n\
             From: <sip:a@h>;tag=1\r\nTo: <sip:b@h>;tag=2\r\nCall-ID: c\r\nCSeq: 1 ACK\r\n\r\n"
        ));
        assert_eq!(
            dialog_route(&m),
            Some(DialogRoute {
                owner: "n1".into(),
                key: "k".into()
            })
        );
    }
}

/// RFC 5923 / 5626 5.2: an entry's Record-Route over TCP or TLS names the
/// caller's connection (`peerlb-flow=<id>.<node>`), and a Route with it
/// reads back as that flow with the listener's address and transport;
/// one without it, or with a malformed token or a host name, is no flow.
#[test]
fn a_record_route_with_a_flow_token_reads_back_as_the_callers_flow() {
    let a: std::net::SocketAddr = "127.0.0.1:5061".parse().unwrap();
    let token = flow_token("00ab", "n-2.x");
    let tcp = record_route(a, Transport::Tcp, false, ("n1", "k"), Some(&token));
    assert_eq!(
        tcp,
        "<sip:127.0.0.1:5061;transport=tcp;lr;peerlb-owner=n1;peerlb-key=k;peerlb-flow=00ab.n-2.x>"
    );
    let flow = flow_of_route(&tcp).unwrap();
    assert_eq!(
        flow,
        FlowRoute {
            id: "00ab".into(),
            node: "n-2.x".into(),
            addr: a,
            tls: false
        }
    );
    for tls in [
        record_route(a, Transport::Tls, true, ("n1", "k"), Some(&token)),
        record_route(a, Transport::Tls, false, ("n1", "k"), Some(&token)),
    ] {
        assert!(flow_of_route(&tls).unwrap().tls, "{tls}");
    }
    for none in [
        record_route(a, Transport::Tcp, false, ("n1", "k"), None),
        "<sip:127.0.0.1:5061;lr;peerlb-flow=xyz.n1>".to_owned(),
        "<sip:127.0.0.1:5061;lr;peerlb-flow=00ab.>".to_owned(),
        "<sip:127.0.0.1:5061;lr;peerlb-flow=00ab>".to_owned(),
        "<sip:proxy.example;lr;peerlb-flow=00ab.n1>".to_owned(),
    ] {
        assert_eq!(flow_of_route(&none), None, "{none}");
    }
}

#[test]
fn record_route_names_owner_and_escaped_key_and_reads_back() {
    let rr = record_route(
        "10.0.0.1:5060".parse().unwrap(),
        Transport::Udp,
        false,
        ("n3", "alice|c@x; y"),
        None,
    );
    assert_eq!(
        rr,
        "<sip:10.0.0.1:5060;transport=udp;lr;peerlb-owner=n3;peerlb-key=alice%7Cc%40x%3B%20y>"
    );
    let m = msg(&format!(
        "ACK sip:b@h SIP/2.0\r\nVia: SIP/2.0/UDP p;branch=z9hG4bK1\r\nRoute: {rr}\r\n\
         From: <sip:a@h>;tag=1\r\nTo: <sip:b@h>;tag=2\r\nCall-ID: c\r\nCSeq: 1 ACK\r\n\r\n"
    ));
    assert_eq!(
        dialog_route(&m),
        Some(DialogRoute {
            owner: "n3".into(),
            key: "alice|c@x; y".into()
        })
    );
}

#[test]
fn request_uri_parameters_become_a_query() {
    assert_eq!(uri_params_as_query("sip:a@h;x=1;lr?subject=y"), "x=1&lr");
    assert_eq!(uri_params_as_query("sip:a@h"), "");
}

fn serve(req: &str, dialogs: &mut DialogTable) -> Vec<SipMessage> {
    super::serve_uas(&msg(req), "n1", "127.0.0.1:5060", dialogs)
}

fn statuses(out: &[SipMessage]) -> Vec<u16> {
    out.iter()
        .map(|m| match m.start {
            StartLine::Response { status, .. } => status,
            StartLine::Request { .. } => 0,
        })
        .collect()
}

#[test]
fn demo_server_invite_ack_bye_and_unknown_dialogs() {
    let mut d = DialogTable::default();
    let invite = INVITE.replace(
        "Contact:",
        "Record-Route: <sip:10.0.0.1;lr;peerlb-owner=n1;peerlb-key=k>\r\nContact:",
    );
    let out = serve(&invite, &mut d);
    assert_eq!(statuses(&out), vec![100, 180, 200]);
    assert_eq!(out[0].tag_of_to(), None, "100 Trying carries no tag");
    let tag = out[2].tag_of_to().unwrap().to_owned();
    assert_eq!(out[1].tag_of_to(), Some(tag.as_str()));
    assert!(
        out[2]
            .header("record-route")
            .unwrap()
            .contains("peerlb-owner=n1")
    );
    assert!(out[2].header("contact").unwrap().contains("127.0.0.1:5060"));
    assert!(out.iter().all(|m| m.header(uas::SERVED_BY) == Some("n1")));
    assert_eq!(d.len(), 1);
    let in_dialog = |method: &str, to_tag: &str| {
        INVITE
            .replace("INVITE sip", &format!("{method} sip"))
            .replace("314159 INVITE", &format!("314160 {method}"))
            .replace(
                "To: Bob <sip:bob@example.com>",
                &format!("To: Bob <sip:bob@example.com>;tag={to_tag}"),
            )
    };
    assert!(serve(&in_dialog("ACK", &tag), &mut d).is_empty());
    assert_eq!(
        statuses(&serve(&in_dialog("INVITE", &tag), &mut d)),
        vec![200]
    );
    assert_eq!(statuses(&serve(&in_dialog("BYE", &tag), &mut d)), vec![200]);
    assert_eq!(d.len(), 0);
    assert_eq!(statuses(&serve(&in_dialog("BYE", &tag), &mut d)), vec![481]);
    assert_eq!(
        statuses(&serve(&in_dialog("INVITE", "other"), &mut d)),
        vec![481]
    );
    assert_eq!(
        statuses(&serve(
            &in_dialog("CANCEL", "x").replace(";tag=x", ""),
            &mut d
        )),
        vec![481]
    );
}

#[test]
fn demo_server_options_register_message_and_others() {
    let mut d = DialogTable::default();
    let base = |m: &str| {
        format!(
            "{m} sip:h SIP/2.0\r\nVia: SIP/2.0/UDP p;branch=z9hG4bK1\r\nFrom: <sip:a@h>;tag=1\r\n\
             To: <sip:a@h>\r\nCall-ID: c\r\nCSeq: 1 {m}\r\nContact: <sip:a@192.0.2.9>;expires=60\r\n\r\n"
        )
    };
    let o = serve(&base("OPTIONS"), &mut d);
    assert_eq!(statuses(&o), vec![200]);
    assert_eq!(o[0].header("allow"), Some(uas::ALLOW));
    let r = serve(&base("REGISTER"), &mut d);
    assert_eq!(statuses(&r), vec![200]);
    assert_eq!(r[0].header("contact"), Some("<sip:a@192.0.2.9>;expires=60"));
    assert_eq!(statuses(&serve(&base("MESSAGE"), &mut d)), vec![200]);
    assert_eq!(statuses(&serve(&base("SUBSCRIBE"), &mut d)), vec![405]);
    let resp = msg(
        "SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP h;branch=z9hG4bKc\r\nFrom: <sip:a@h>;tag=1\r\nTo: <sip:x@h>\r\nCall-ID: c\r\nCSeq: 1 INVITE\r\n\r\n",
    );
    assert!(super::serve_uas(&resp, "n1", "h", &mut d).is_empty());
}

fn noisy_message() -> impl Strategy<Value = Vec<u8>> {
    let valid = prop_oneof![
        Just(INVITE.to_owned()),
        Just(INVITE.replace("Via", "v").replace("From", "f"))
    ];
    (
        valid,
        proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        any::<usize>(),
    )
        .prop_map(|(text, flips, cut)| {
            let mut b = text.into_bytes();
            for (i, v) in flips {
                let n = b.len();
                b[i % n] = v;
            }
            let n = b.len();
            b.truncate(n - cut % (n / 4));
            b
        })
}

/// A field value with a bare LF (here after a NUL) is refused: re-encoded
/// for the next hop it would be a line break of its own (the case
/// proptest found: `Content-Type: application/sdp\0\nContent-Length: 4`).
#[test]
fn control_characters_inside_a_line_are_refused() {
    let ok = "OPTIONS sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5070;branch=z9hG4bK1\r\nFrom: <sip:alice@example.com>;tag=1\r\nTo: <sip:bob@example.com>\r\nCall-ID: c1\r\nCSeq: 1 OPTIONS\r\n";
    assert!(parse(format!("{ok}Content-Length: 0\r\n\r\n").as_bytes()).is_ok());
    for bad in [
        "Content-Type: application/sdp\0\nContent-Length: 4\r\n",
        "Subject: a\nInjected: b\r\n",
        "Subject: a\rb\r\n",
        "Subject: a\x7fb\r\n",
    ] {
        let msg = format!("{ok}{bad}\r\nv=0\r\n");
        assert_eq!(
            parse(msg.as_bytes()).err(),
            Some(ParseError::HeaderLine),
            "{bad:?}"
        );
    }
    let start = "OPTIONS sip:bob@exa\nmple.com SIP/2.0\r\n";
    let msg = format!(
        "{start}{}Content-Length: 0\r\n\r\n",
        &ok[ok.find("\r\n").unwrap() + 2..]
    );
    assert_eq!(parse(msg.as_bytes()).err(), Some(ParseError::StartLine));
}

proptest! {
    /// Any bytes (raw, or a valid message with bytes flipped and cut):
    /// parsing and framing never panic, and whatever parses re-encodes
    /// to a message that parses to the same value.
    #[test]
    fn parse_and_frame_never_panic_and_round_trip(b in prop_oneof![proptest::collection::vec(any::<u8>(), 0..600), noisy_message()]) {
        let _ = frame_len(&b);
        if let Ok(m) = parse(&b) {
            let again = parse(&m.to_bytes()).expect("a parsed message re-encodes to a valid one");
            // Content-Length is written from the body (a UDP message may
            // have none): the other fields come back one for one.
            let fields = |m: &SipMessage| m.headers.iter().filter(|(n, _)| full_name(n) != "content-length").count();
            prop_assert_eq!(fields(&again), fields(&m));
            prop_assert_eq!(again.call_id(), m.call_id());
            let _ = super::serve_uas(&m, "n1", "h:1", &mut DialogTable::default());
            let _ = dialog_route(&m);
            let _ = default_key(&m);
        }
    }
}

mod routing {
    use super::*;
    use crate::engine::membership::NodeStatus::*;
    use crate::engine::membership::tests::view;
    use crate::engine::rules::Rules;

    const CLIENT: &str = "192.0.2.1:5070";

    fn invite(from: &str, call_id: &str) -> SipMessage {
        msg(&INVITE
            .replace("Alice <sip:alice@example.com>;tag=1928301774", from)
            .replace("a84b4c76e66710@pc33.example.com", call_id))
    }

    fn decide(
        m: &SipMessage,
        rules: &Rules,
        v: &crate::engine::membership::MembershipView,
    ) -> SipDecision {
        super::super::decide(m, CLIENT.parse().unwrap(), rules, v)
    }

    #[test]
    fn default_key_is_from_tag_and_call_id_and_any_entry_agrees() {
        let rules = Rules::default();
        for i in 0..50 {
            let m = invite(&format!("<sip:u{i}@h>;tag=t{i}"), &format!("c{i}"));
            let d1 = decide(
                &m,
                &rules,
                &view("n1", &[("n1", Serving), ("n2", Serving), ("n3", Serving)]),
            );
            let d3 = decide(
                &m,
                &rules,
                &view("n3", &[("n1", Serving), ("n2", Serving), ("n3", Serving)]),
            );
            assert_eq!(d1, d3);
            assert_eq!(d1.key, format!("t{i}|c{i}"));
            assert_eq!(d1.reason, SipReason::DefaultKey);
        }
        // CANCEL of an INVITE: same From tag and Call-ID, same key.
        let m = invite("<sip:a@h>;tag=x", "cc");
        let cancel = msg(&String::from_utf8(m.to_bytes())
            .unwrap()
            .replace("INVITE sip", "CANCEL sip")
            .replace("314159 INVITE", "314159 CANCEL"));
        let v = view("n1", &[("n1", Serving), ("n2", Serving), ("n3", Serving)]);
        assert_eq!(
            decide(&cancel, &rules, &v).owner,
            decide(&m, &rules, &v).owner
        );
    }

    #[test]
    fn sip_rules_key_on_the_from_user_like_an_http_rule_on_a_parameter() {
        let rules = Rules::from_xml(
            r#"<user-centric-rules>
              <http-rules><request-uri parameter="user" return="parameter.user"><exist/></request-uri></http-rules>
              <sip-rules><header name="From" return="request.From.uri.user"><exist/></header></sip-rules>
            </user-centric-rules>"#,
        )
        .unwrap();
        let v = view("n2", &[("n1", Serving), ("n2", Serving), ("n3", Serving)]);
        for user in ["alice", "bob", "carol", "dave", "erin"] {
            let d = decide(
                &invite(&format!("\"X\" <sip:{user}@example.com>;tag=9"), "c1"),
                &rules,
                &v,
            );
            assert_eq!((d.key.as_str(), d.reason), (user, SipReason::Rule(0)));
            let http = crate::engine::testing::TestRequest::get(&format!("/?user={user}"));
            let (_, key) = rules.extract(&http.view()).unwrap();
            assert_eq!(
                v.ring().owner(&key),
                Some(&d.owner),
                "{user}: HTTP and SIP on one owner"
            );
        }
        // Compact From, and a Request-URI parameter rule.
        let by_param = Rules::from_xml(
            r#"<user-centric-rules><sip-rules>
              <request-uri parameter="tenant" return="parameter.tenant"><exist/></request-uri>
            </sip-rules></user-centric-rules>"#,
        )
        .unwrap();
        let m = msg(&INVITE.replace(
            "sip:bob@example.com SIP",
            "sip:bob@example.com;tenant=t7 SIP",
        ));
        assert_eq!(decide(&m, &by_param, &v).key, "t7");
        // No rule matches: the default key.
        let m = msg(&INVITE.replace(
            "From: Alice <sip:alice@example.com>",
            "From: <sip:example.com>",
        ));
        assert_eq!(decide(&m, &rules, &v).reason, SipReason::DefaultKey);
    }

    #[test]
    fn dialog_route_reaches_its_owner_or_fails_over_on_the_dialogs_key() {
        let rules = Rules::default();
        let all = view("n1", &[("n1", Serving), ("n2", Serving), ("n3", Serving)]);
        let bye = |owner: &str| {
            msg(&format!(
                "BYE sip:b@h SIP/2.0\r\nVia: SIP/2.0/UDP p;branch=z9hG4bK1\r\nRoute: {}\r\n\
                 From: <sip:a@h>;tag=1\r\nTo: <sip:b@h>;tag=2\r\nCall-ID: other\r\nCSeq: 2 BYE\r\n\r\n",
                record_route(
                    "127.0.0.1:5060".parse().unwrap(),
                    Transport::Udp,
                    false,
                    (owner, "dialog-key"),
                    None,
                )
            ))
        };
        // Whatever the message's own key, the named owner serves.
        for owner in ["n1", "n2", "n3"] {
            let d = decide(&bye(owner), &rules, &all);
            assert_eq!((&*d.owner, d.reason), (owner, SipReason::DialogOwner));
            assert_eq!(d.key, "dialog-key");
        }
        // A draining owner finishes its dialogs.
        let draining = view("n1", &[("n1", Serving), ("n2", Draining), ("n3", Serving)]);
        let d = decide(&bye("n2"), &rules, &draining);
        assert_eq!((&*d.owner, d.reason), ("n2", SipReason::DialogOwner));
        // The owner is gone: the dialog key's owner on the ring of the rest,
        // which is the next node of the key's failover order.
        let key_owner = all.ring().owner("dialog-key").unwrap().clone();
        let next = all.ring().candidates("dialog-key").nth(1).unwrap().clone();
        let without: Vec<(&str, _)> = ["n1", "n2", "n3"]
            .into_iter()
            .map(|id| (id, if id == &*key_owner { Offline } else { Serving }))
            .collect();
        let v = view("n1", &without);
        let d = decide(&bye(&key_owner), &rules, &v);
        assert_eq!((&d.owner, d.reason), (&next, SipReason::DialogFailover));
        // Candidates: the owner first, each ring node once.
        let c: Vec<_> = d.candidates(&v).collect();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0], &next);
    }

    /// After a failover, a target refresh answered by the new owner names
    /// it in the Contact, so the Request-URI of later requests names it:
    /// it wins over the Route's owner, even once that one is back.
    #[test]
    fn the_request_uris_owner_wins_over_the_routes_and_falls_back_to_it() {
        let rules = Rules::default();
        let all = view("n1", &[("n1", Serving), ("n2", Serving), ("n3", Serving)]);
        let bye = |target: &str, route: bool| {
            let rr = record_route(
                "127.0.0.1:5060".parse().unwrap(),
                Transport::Udp,
                false,
                ("n1", "dialog-key"),
                None,
            );
            let route = if route {
                format!("Route: {rr}\r\n")
            } else {
                String::new()
            };
            msg(&format!(
                "BYE {target} SIP/2.0\r\nVia: SIP/2.0/UDP p;branch=z9hG4bK1\r\n{route}\
                 From: <sip:a@h>;tag=1\r\nTo: <sip:b@h>;tag=2\r\nCall-ID: other\r\nCSeq: 2 BYE\r\n\r\n"
            ))
        };
        let d = decide(
            &bye("sip:b@192.0.2.9:5070;peerlb-owner=n3", true),
            &rules,
            &all,
        );
        assert_eq!((&*d.owner, d.reason), ("n3", SipReason::TargetOwner));
        assert_eq!(d.key, "dialog-key");
        // Without a Route the key is the request's own.
        let d = decide(&bye("sip:b@192.0.2.9;peerlb-owner=n2", false), &rules, &all);
        assert_eq!((&*d.owner, d.key.as_str()), ("n2", "1|other"));
        // The target's owner is gone: the Route's owner, then the key's.
        let no_n3 = view("n1", &[("n1", Serving), ("n2", Serving), ("n3", Offline)]);
        let d = decide(
            &bye("sip:b@192.0.2.9;peerlb-owner=n3", true),
            &rules,
            &no_n3,
        );
        assert_eq!((&*d.owner, d.reason), ("n1", SipReason::DialogOwner));
        let only_n2 = view("n2", &[("n1", Offline), ("n2", Serving), ("n3", Offline)]);
        let d = decide(
            &bye("sip:b@192.0.2.9;peerlb-owner=n3", true),
            &rules,
            &only_n2,
        );
        assert_eq!((&*d.owner, d.reason), ("n2", SipReason::DialogFailover));
        // An empty parameter names no one.
        let d = decide(&bye("sip:b@192.0.2.9;peerlb-owner=", true), &rules, &all);
        assert_eq!((&*d.owner, d.reason), ("n1", SipReason::DialogOwner));
    }

    #[test]
    fn no_member_on_the_ring_leaves_the_request_to_the_entry() {
        let v = view("n1", &[("n1", Draining)]);
        let d = decide(&invite("<sip:a@h>;tag=1", "c"), &Rules::default(), &v);
        assert_eq!((&*d.owner, d.reason), ("n1", SipReason::NoMembers));
    }
}

#[test]
fn bad_requests_get_a_400_copying_what_they_have_and_responses_none() {
    let text = "INVITE sip:b@h SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.4:5071;branch=z9hG4bKx\r\nCall-ID: c\r\nCSeq: 1 BYE\r\n\r\n";
    let e = parse(text.as_bytes()).unwrap_err();
    let r = bad_request(text.as_bytes(), &e).unwrap();
    assert_eq!(
        r.start,
        StartLine::Response {
            status: 400,
            reason: format!("Bad Request ({e})")
        }
    );
    assert_eq!(r.call_id(), Some("c"));
    assert_eq!(r.top_via().unwrap().port, Some(5071));
    // A response, garbage, or a request without a readable Via: dropped.
    let resp = "SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP h;branch=z9hG4bKx\r\n\r\n";
    assert_eq!(bad_request(resp.as_bytes(), &ParseError::StartLine), None);
    assert_eq!(
        bad_request(b"\x00\x01garbage", &ParseError::StartLine),
        None
    );
    assert_eq!(
        bad_request(
            b"OPTIONS sip:h SIP/2.0\r\nCall-ID: c\r\n\r\n",
            &ParseError::StartLine
        ),
        None
    );
    // A head cut short still gets its answer.
    let cut = "OPTIONS sip:h SIP/2.0\r\nVia: SIP/2.0/TCP h:9;branch=z9hG4bKy\r\nFrom: <sip:a@h>;ta";
    assert!(bad_request(cut.as_bytes(), &ParseError::Incomplete).is_some());
}

#[test]
fn responses_go_to_the_source_ip_and_the_rport_or_via_port() {
    let src: std::net::SocketAddr = "198.51.100.7:40000".parse().unwrap();
    let via = |v: &str| {
        msg(&format!(
            "OPTIONS sip:h SIP/2.0\r\nVia: {v}\r\nFrom: <sip:a@h>;tag=1\r\nTo: <sip:h>\r\nCall-ID: c\r\nCSeq: 1 OPTIONS\r\n\r\n"
        ))
    };
    let dest = |v: &str| response_destination(&via(v).top_via().unwrap(), src);
    assert_eq!(dest("SIP/2.0/UDP 10.0.0.1:5080;branch=z9hG4bK1;rport"), src);
    assert_eq!(
        dest("SIP/2.0/UDP 10.0.0.1:5080;branch=z9hG4bK1"),
        "198.51.100.7:5080".parse().unwrap()
    );
    assert_eq!(
        dest("SIP/2.0/UDP host;branch=z9hG4bK1"),
        "198.51.100.7:5060".parse().unwrap()
    );
}

/// The owner's mark in a remote target: added to the URI of a `Contact`
/// (inside `<>`, before URI headers, replacing an older mark), read back
/// from a Request-URI, and removed before the upstream sees it.
#[test]
fn the_owner_mark_goes_into_the_contact_uri_and_out_of_the_request_uri() {
    use super::dialog::with_owner_param;
    assert_eq!(
        with_owner_param("<sip:bob@192.0.2.4:5070>", "n2").as_deref(),
        Some("<sip:bob@192.0.2.4:5070;peerlb-owner=n2>")
    );
    assert_eq!(
        with_owner_param(
            "\"Bob\" <sip:bob@h;transport=udp?Subject=x>;expires=60",
            "n2"
        )
        .as_deref(),
        Some("\"Bob\" <sip:bob@h;transport=udp;peerlb-owner=n2?Subject=x>;expires=60")
    );
    // An addr-spec's parameters are the header's: it is put in <>.
    assert_eq!(
        with_owner_param("sip:bob@h;expires=60", "n3").as_deref(),
        Some("<sip:bob@h;peerlb-owner=n3>;expires=60")
    );
    assert_eq!(
        with_owner_param("<sip:bob@h;peerlb-owner=n1;lr>", "n3").as_deref(),
        Some("<sip:bob@h;lr;peerlb-owner=n3>")
    );
    // A user part may hold ';' and '?' (RFC 3261 25.1 user-unreserved).
    assert_eq!(
        with_owner_param("<sip:a;b?c@h>", "n1").as_deref(),
        Some("<sip:a;b?c@h;peerlb-owner=n1>")
    );
    assert_eq!(with_owner_param("*", "n1"), None);
    assert_eq!(with_owner_param("<sip:a@h", "n1"), None);
    assert_eq!(
        strip_owner_param("sip:bob@h:5070;transport=udp;peerlb-owner=n2;x=1"),
        "sip:bob@h:5070;transport=udp;x=1"
    );
    assert_eq!(strip_owner_param("sip:bob@h;PEERLB-OWNER=n2"), "sip:bob@h");
    assert_eq!(strip_owner_param("sip:bob@h"), "sip:bob@h");
    let bye = msg(
        "BYE sip:bob@h;peerlb-owner=n2 SIP/2.0\r\nVia: SIP/2.0/UDP p;branch=z9hG4bK1\r\n\
        From: <sip:a@h>;tag=1\r\nTo: <sip:b@h>;tag=2\r\nCall-ID: c\r\nCSeq: 2 BYE\r\n\r\n",
    );
    assert_eq!(target_owner(&bye), Some("n2"));
    // Only a 101..=299 answer (or a request) of a method that sets the
    // remote target gets the mark; REGISTER's bindings never do.
    let invite = msg(INVITE);
    for (status, method, marked) in [
        (200, "INVITE", true),
        (180, "INVITE", true),
        (100, "INVITE", false),
        (302, "INVITE", false),
        (200, "UPDATE", true),
        (200, "REGISTER", false),
        (200, "BYE", false),
    ] {
        let mut r = invite.response(status, "X", Some("t"));
        r.headers
            .push(("Contact".into(), "<sip:bob@192.0.2.4>".into()));
        mark_contact(&mut r, method, "n2");
        assert_eq!(
            r.header("contact").unwrap().contains("peerlb-owner=n2"),
            marked,
            "{status} {method}"
        );
    }
    let mut two = invite.response(200, "OK", Some("t"));
    two.headers
        .push(("Contact".into(), "<sip:a@h>, <sip:b@h>".into()));
    mark_contact(&mut two, "INVITE", "n2");
    assert_eq!(two.header("contact"), Some("<sip:a@h>, <sip:b@h>"));
}

#[test]
fn a_request_notes_its_source_on_the_top_via_as_rfc_3581_says() {
    let with = |via: &str| {
        let text = format!(
            "OPTIONS sip:x@example.com SIP/2.0\r\nVia: {via}\r\nVia: SIP/2.0/UDP 10.9.9.9;branch=z9hG4bKlower\r\nFrom: <sip:a@example.com>;tag=1\r\nTo: <sip:x@example.com>\r\nCall-ID: c1\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
        );
        let mut m = parse(text.as_bytes()).unwrap();
        m.note_source("203.0.113.7:40123".parse().unwrap());
        m.header_list("via")
            .iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
    };
    // rport asked: both filled (section 4), the lower Via untouched.
    assert_eq!(
        with("SIP/2.0/UDP 192.0.2.1:5070;branch=z9hG4bK776;rport"),
        [
            "SIP/2.0/UDP 192.0.2.1:5070;branch=z9hG4bK776;received=203.0.113.7;rport=40123",
            "SIP/2.0/UDP 10.9.9.9;branch=z9hG4bKlower"
        ]
    );
    // No rport, another host: received only (RFC 3261 18.2.1).
    assert_eq!(
        with("SIP/2.0/UDP 192.0.2.1:5070;branch=z9hG4bK776")[0],
        "SIP/2.0/UDP 192.0.2.1:5070;branch=z9hG4bK776;received=203.0.113.7"
    );
    // No rport, the source's own address: unchanged.
    assert_eq!(
        with("SIP/2.0/UDP 203.0.113.7:40123;branch=z9hG4bK776")[0],
        "SIP/2.0/UDP 203.0.113.7:40123;branch=z9hG4bK776"
    );
    // A client's own received and rport values are replaced.
    assert_eq!(
        with("SIP/2.0/TCP h.example;rport=1;branch=z9hG4bK9;received=198.51.100.1")[0],
        "SIP/2.0/TCP h.example;branch=z9hG4bK9;received=203.0.113.7;rport=40123"
    );
    // The parsed Via reads them back.
    let text = "OPTIONS sip:x@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bK1;rport\r\nFrom: <sip:a@example.com>;tag=1\r\nTo: <sip:x@example.com>\r\nCall-ID: c1\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n";
    let mut m = parse(text.as_bytes()).unwrap();
    m.note_source("203.0.113.7:40123".parse().unwrap());
    let via = m.top_via().unwrap();
    assert_eq!(via.param("rport"), Some("40123"));
    assert_eq!(via.param("received"), Some("203.0.113.7"));
    assert_eq!(via.param("branch"), Some("z9hG4bK1"));
}
