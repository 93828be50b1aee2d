use super::*;

/// The view of `head`'s frame, checked field by field against it.
fn assert_view_matches(frame_body: &[u8], head: &RequestHead) {
    let v: RequestHeadView<'_> = decode_view(frame_body).unwrap();
    assert_eq!(v.request_id, head.request_id);
    assert_eq!(v.entry, head.entry);
    assert_eq!(v.hops, head.hops);
    assert_eq!(v.view_version, head.view_version);
    assert_eq!(v.method, head.method);
    assert_eq!(v.uri, head.uri);
    let headers: Vec<(&[u8], &[u8])> = head
        .headers
        .iter()
        .map(|(k, v)| (k.as_bytes(), v.as_slice()))
        .collect();
    assert_eq!(v.headers, headers);
    assert_eq!(v.client, head.client);
    assert_eq!(v.hash_key, head.hash_key.as_deref());
    assert_eq!(v.tls, head.tls);
}

fn head() -> RequestHead {
    RequestHead {
        request_id: 0x1234_5678_9abc_def0_1122_3344_5566_7788,
        entry: "n1".into(),
        hops: 1,
        view_version: 42,
        method: "POST".into(),
        uri: "/a?user=x".into(),
        headers: vec![("x-user".into(), b"\xffbin".to_vec())],
        client: "127.0.0.1:5555".parse().unwrap(),
        hash_key: Some("x".into()),
        tls: Some(TlsFacts {
            sni: Some("a.example".into()),
            version: 0x0304,
            alpn: Some(b"http/1.1".to_vec()),
        }),
    }
}

#[test]
fn request_head_round_trips_with_its_length_prefix() {
    let buf = encode(&head()).unwrap();
    let len = head_len(buf[..4].try_into().unwrap()).unwrap();
    assert_eq!(len, buf.len() - 4);
    let back: RequestHead = decode(&buf[4..]).unwrap();
    assert_eq!(back, head());
}

/// Golden frame, written by hand from the format (bincode 2 standard
/// config: integers above u8 as varints, 0..=250 in one byte, 251 +
/// u16 LE, 254 + u128 LE; strings and byte strings as varint length +
/// bytes; `Option` as 0/1 + value; serde's `SocketAddr` as variant
/// index (0 = V4), four octets, port), not from `encode`: a change to
/// the bytes peers exchange fails here, whatever the round trips say.
#[test]
fn request_head_frame_matches_the_hand_written_golden_bytes() {
    let head = RequestHead {
        request_id: 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10,
        entry: "n1".into(),
        hops: 1,
        view_version: 300,
        method: "GET".into(),
        uri: "/a?user=x".into(),
        headers: vec![("x-user".into(), b"\xffbin".to_vec())],
        client: "127.0.0.1:5555".parse().unwrap(),
        hash_key: Some("x".into()),
        tls: Some(TlsFacts {
            sni: Some("a".into()),
            version: 0x0304,
            alpn: None,
        }),
    };
    #[rustfmt::skip]
    let body: &[u8] = &[
        // request_id: u128 varint, tag 254 then 16 bytes little endian
        0xfe, 0x10, 0x0f, 0x0e, 0x0d, 0x0c, 0x0b, 0x0a, 0x09,
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,
        // entry "n1"
        0x02, b'n', b'1',
        // hops: u8, one raw byte
        0x01,
        // view_version 300: tag 251 then u16 LE
        0xfb, 0x2c, 0x01,
        // method "GET"
        0x03, b'G', b'E', b'T',
        // uri "/a?user=x"
        0x09, b'/', b'a', b'?', b'u', b's', b'e', b'r', b'=', b'x',
        // headers: one pair, name "x-user", value 4 raw bytes
        0x01,
        0x06, b'x', b'-', b'u', b's', b'e', b'r',
        0x04, 0xff, b'b', b'i', b'n',
        // client: SocketAddr::V4 (variant 0), 127.0.0.1, port 5555 (251, u16 LE)
        0x00, 0x7f, 0x00, 0x00, 0x01, 0xfb, 0xb3, 0x15,
        // hash_key: Some("x")
        0x01, 0x01, b'x',
        // tls: Some { sni: Some("a"), version 0x0304 (251, u16 LE), alpn: None }
        0x01, 0x01, 0x01, b'a', 0xfb, 0x04, 0x03, 0x00,
    ];
    let mut golden = (body.len() as u32).to_be_bytes().to_vec();
    golden.extend_from_slice(body);
    assert_eq!(encode(&head).unwrap(), golden);
    assert_eq!(decode::<RequestHead>(body).unwrap(), head);
    assert_view_matches(body, &head);
}

#[test]
fn response_head_round_trips() {
    let h = ResponseHead {
        status: 201,
        headers: vec![("set-cookie".into(), b"a=b".to_vec())],
        served_by: "n3".into(),
    };
    let buf = encode(&h).unwrap();
    assert_eq!(decode::<ResponseHead>(&buf[4..]).unwrap(), h);
}

/// The entry's decode of a response head: the owned decode's fields,
/// its valid lines in order in the map (values sharing the frame's
/// buffer), the invalid ones named and left out; the same frames
/// refused.
#[test]
fn response_heads_decode_into_a_header_map_sharing_the_frame() {
    let h = ResponseHead {
        status: 201,
        headers: vec![
            ("content-length".into(), b"3".to_vec()),
            ("set-cookie".into(), b"a=b".to_vec()),
            ("bad name".into(), b"x".to_vec()),
            ("set-cookie".into(), b"c=d".to_vec()),
            ("x-bad-value".into(), b"a\nb".to_vec()),
            ("x-empty".into(), Vec::new()),
        ],
        served_by: "n3".into(),
    };
    let frame = bytes::Bytes::from(encode(&h).unwrap()).slice(4..);
    let d = decode_response(&frame).unwrap();
    assert_eq!(d.status, 201);
    assert_eq!(d.served_by(), "n3");
    assert_eq!(d.content_length(), Some(3));
    assert_eq!(d.dropped, ["bad name", "x-bad-value"]);
    let lines: Vec<(&str, &[u8])> = d
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_bytes()))
        .collect();
    let want: Vec<(&str, &[u8])> = vec![
        ("content-length", b"3"),
        ("set-cookie", b"a=b"),
        ("set-cookie", b"c=d"),
        ("x-empty", b""),
    ];
    assert_eq!(lines, want);
    let cookie = d.headers.get("set-cookie").unwrap().as_bytes().as_ptr() as usize;
    let start = frame.as_ptr() as usize;
    assert!((start..start + frame.len()).contains(&cookie), "a copy");
    // The served-by value too (the entry's `peerlb-served-by`).
    let by = d.served_by_value().unwrap();
    assert_eq!(by, "n3");
    let at = by.as_bytes().as_ptr() as usize;
    assert!((start..start + frame.len()).contains(&at), "a copy");

    let buf = bytes::Bytes::from(encode(&h).unwrap());
    assert!(decode_response(&buf.slice(4..buf.len() - 1)).is_err());
    let mut long = buf[4..].to_vec();
    long.push(0);
    assert!(decode_response(&bytes::Bytes::from(long)).is_err());
    assert!(decode_response(&bytes::Bytes::from_static(&[0xff; 7])).is_err());
}

#[test]
fn borrowed_heads_encode_to_the_same_bytes_as_owned_ones() {
    let mut map = http::HeaderMap::new();
    map.append("x-user", http::HeaderValue::from_bytes(b"\xffbin").unwrap());
    map.append("accept", http::HeaderValue::from_static("a"));
    map.append("accept", http::HeaderValue::from_static("b"));
    let owned = RequestHead {
        headers: vec![
            ("x-user".into(), b"\xffbin".to_vec()),
            ("accept".into(), b"a".to_vec()),
            ("accept".into(), b"b".to_vec()),
        ],
        ..head()
    };
    let h = head();
    let borrowed = RequestHeadRef {
        request_id: h.request_id,
        entry: &h.entry,
        hops: h.hops,
        view_version: h.view_version,
        method: &h.method,
        uri: &h.uri,
        headers: &map,
        client: h.client,
        hash_key: h.hash_key.as_deref(),
        tls: h.tls.as_ref(),
    };
    let frame = encode(&borrowed).unwrap();
    assert_eq!(frame, encode(&owned).unwrap());
    assert_eq!(decode::<RequestHead>(&frame[4..]).unwrap(), owned);
    assert_view_matches(&frame[4..], &owned);

    let rh = ResponseHeadRef {
        status: 200,
        headers: &map,
        content_length: None,
        served_by: "n3",
    };
    let back: ResponseHead = decode(&encode(&rh).unwrap()[4..]).unwrap();
    assert_eq!(back.headers, owned.headers);
    assert_eq!(back.served_by, "n3");
}

#[test]
fn a_carried_length_is_the_last_line_of_the_owned_heads_bytes() {
    // The owner writes the length it carries as a line after the map's,
    // not inserted into the map: the bytes are those of the owned head
    // with that line last, and the entry reads it as the body's length.
    let mut map = http::HeaderMap::new();
    map.insert("content-type", http::HeaderValue::from_static("text/plain"));
    for len in [0, 7, 1234, u64::MAX] {
        let rh = ResponseHeadRef {
            status: 200,
            headers: &map,
            content_length: Some(len),
            served_by: "n3",
        };
        let owned = ResponseHead {
            status: 200,
            headers: vec![
                ("content-type".into(), b"text/plain".to_vec()),
                ("content-length".into(), len.to_string().into_bytes()),
            ],
            served_by: "n3".into(),
        };
        let frame = encode(&rh).unwrap();
        assert_eq!(frame, encode(&owned).unwrap(), "length {len}");
        let decoded = decode_response(&bytes::Bytes::copy_from_slice(&frame[4..])).unwrap();
        assert_eq!(decoded.content_length(), Some(len));
    }
}

#[test]
fn header_values_keep_the_layout_of_a_plain_byte_vector() {
    // The wire layout of `Vec<(String, Vec<u8>)>` with plain serde
    // derive: what nodes built before the custom (de)serializer send.
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Plain {
        headers: Vec<(String, Vec<u8>)>,
    }
    let plain = Plain {
        headers: vec![("a".into(), vec![0, 1, 255]), ("b".into(), vec![])],
    };
    let r = ResponseHead {
        status: 1,
        headers: plain.headers.clone(),
        served_by: String::new(),
    };
    let ours = encode(&r).unwrap();
    let theirs = encode(&(1u16, &plain, "")).unwrap();
    assert_eq!(ours, theirs);
}

#[test]
fn oversized_length_prefix_is_refused() {
    let e = head_len(((MAX_HEAD_LEN + 1) as u32).to_be_bytes()).unwrap_err();
    assert!(matches!(e, WireError::TooLong(n) if n == MAX_HEAD_LEN + 1));
}

#[test]
fn garbage_and_truncated_heads_are_decode_errors() {
    assert!(matches!(
        decode::<RequestHead>(&[0xff; 7]),
        Err(WireError::Decode(_))
    ));
    assert!(matches!(
        decode_view::<RequestHeadView<'_>>(&[0xff; 7]),
        Err(WireError::Decode(_))
    ));
    let buf = encode(&head()).unwrap();
    assert!(decode::<RequestHead>(&buf[4..buf.len() - 1]).is_err());
    assert!(decode_view::<RequestHeadView<'_>>(&buf[4..buf.len() - 1]).is_err());
    let mut long = buf[4..].to_vec();
    long.push(0);
    assert!(decode::<RequestHead>(&long).is_err());
    assert!(decode_view::<RequestHeadView<'_>>(&long).is_err());
}

/// The entry's marks encoded after the request's header lines give the
/// bytes of the head whose map had them inserted (what the entry did
/// before `MarkedRequestHead`), and none gives `RequestHeadRef`'s own.
#[test]
fn marked_heads_encode_as_if_the_marks_were_inserted_last() {
    let h = head();
    let mut map = http::HeaderMap::new();
    map.append("x-user", http::HeaderValue::from_static("u1"));
    map.append("accept", http::HeaderValue::from_static("a"));
    let at = |headers| RequestHeadRef {
        request_id: h.request_id,
        entry: &h.entry,
        hops: h.hops,
        view_version: h.view_version,
        method: &h.method,
        uri: &h.uri,
        headers,
        client: h.client,
        hash_key: h.hash_key.as_deref(),
        tls: h.tls.as_ref(),
    };
    let plain = encode(&at(&map)).unwrap();
    let unmarked = MarkedRequestHead {
        head: at(&map),
        marks: &[],
    };
    assert_eq!(encode(&unmarked).unwrap(), plain);

    let marks = [(INFORMATIONAL, "1"), (TRAILERS, "te")];
    let mut inserted = map.clone();
    for (k, v) in marks {
        inserted.insert(k, http::HeaderValue::from_static(v));
    }
    let marked = MarkedRequestHead {
        head: at(&map),
        marks: &marks,
    };
    let frame = encode(&marked).unwrap();
    assert_eq!(frame, encode(&at(&inserted)).unwrap());
    let v: RequestHeadView<'_> = decode_view(&frame[4..]).unwrap();
    assert_eq!(
        v.headers,
        vec![
            (&b"x-user"[..], &b"u1"[..]),
            (b"accept", b"a"),
            (INFORMATIONAL.as_bytes(), b"1"),
            (TRAILERS.as_bytes(), b"te")
        ]
    );
}

/// The request frame of `kind` over `map` (`head()`'s other fields).
fn frame_of(kind: StreamKind, map: &http::HeaderMap, version: Version) -> Vec<u8> {
    let h = head();
    let marked = MarkedRequestHead {
        head: RequestHeadRef {
            request_id: h.request_id,
            entry: &h.entry,
            hops: h.hops,
            view_version: h.view_version,
            method: &h.method,
            uri: &h.uri,
            headers: map,
            client: h.client,
            hash_key: h.hash_key.as_deref(),
            tls: h.tls.as_ref(),
        },
        marks: &[(TRAILERS, "te")],
    };
    encode_request(&RequestFrame { kind, head: marked }, version).unwrap()
}

/// A `peerlb/3` frame is the kind (bincode's enum: variant index, one
/// byte, then its data) followed by exactly the `peerlb/2` head's bytes
/// without a mark; golden kind bytes written by hand from the layout.
#[test]
fn a_v3_frame_is_the_kind_then_the_unmarked_v2_head() {
    let mut map = http::HeaderMap::new();
    map.append("x-user", http::HeaderValue::from_static("u1"));
    let plain = frame_of(StreamKind::Http, &map, Version::V2);
    for (kind, golden) in [
        (StreamKind::Http, &[0u8][..]),
        (StreamKind::Sip(SipTransport::Udp), &[1, 0]),
        (StreamKind::Sip(SipTransport::Tcp), &[1, 1]),
        (StreamKind::Sip(SipTransport::Tls), &[1, 2]),
        (StreamKind::Admin, &[2]),
    ] {
        let v3 = frame_of(kind, &map, Version::V3);
        assert_eq!(head_len(v3[..4].try_into().unwrap()).unwrap(), v3.len() - 4);
        assert_eq!(&v3[4..4 + golden.len()], golden, "{kind:?}");
        assert_eq!(&v3[4 + golden.len()..], &plain[4..], "{kind:?}");
        let (back, view) = decode_request(&v3[4..], Version::V3).unwrap();
        assert_eq!(back, kind);
        assert_eq!(
            view,
            decode_view::<RequestHeadView<'_>>(&plain[4..]).unwrap()
        );
    }
}

/// On `peerlb/2` the kind is a mark after the head's lines (none for
/// HTTP: the bytes of today's head), read back by `decode_request`; the
/// admin mark wins over a SIP one.
#[test]
fn a_v2_frame_says_the_kind_with_a_mark_and_decodes_back() {
    let map = http::HeaderMap::new();
    for kind in [
        StreamKind::Http,
        StreamKind::Sip(SipTransport::Udp),
        StreamKind::Sip(SipTransport::Tcp),
        StreamKind::Sip(SipTransport::Tls),
        StreamKind::Admin,
    ] {
        let v2 = frame_of(kind, &map, Version::V2);
        let (back, view) = decode_request(&v2[4..], Version::V2).unwrap();
        assert_eq!(back, kind);
        let want: Vec<(&[u8], &[u8])> = match kind {
            StreamKind::Http => vec![(TRAILERS.as_bytes(), b"te")],
            StreamKind::Sip(t) => vec![
                (TRAILERS.as_bytes(), b"te"),
                (SIP.as_bytes(), t.mark().as_bytes()),
            ],
            StreamKind::Admin => vec![(TRAILERS.as_bytes(), b"te"), (ADMIN.as_bytes(), b"change")],
        };
        assert_eq!(view.headers, want, "{kind:?}");
    }
    let both: Vec<(&[u8], &[u8])> = vec![(SIP.as_bytes(), b"tcp"), (ADMIN.as_bytes(), b"change")];
    assert_eq!(StreamKind::of_marks(&both), StreamKind::Admin);
}

/// A `peerlb/3` owner takes the kind from the field alone: a mark's name
/// among the header lines changes nothing.
#[test]
fn a_v3_frame_ignores_marks_in_its_header_lines() {
    let mut map = http::HeaderMap::new();
    map.append(ADMIN, http::HeaderValue::from_static("change"));
    let v3 = frame_of(StreamKind::Http, &map, Version::V3);
    assert_eq!(
        decode_request(&v3[4..], Version::V3).unwrap().0,
        StreamKind::Http
    );
    // And a peerlb/2 frame read as peerlb/3 (or the reverse) fails or
    // misreads: the layouts differ in their first byte.
    let v2 = frame_of(StreamKind::Http, &map, Version::V2);
    assert_ne!(v2[4..], v3[4..]);
}

/// The in-place decoders leave header names unchecked as UTF-8 (the
/// owned ones' `String` checks them): a name that is not UTF-8 decodes,
/// and is then refused where it is checked as an HTTP field name: the
/// owner's request build (`HeaderName::from_bytes`), the entry's response
/// map (dropped, named lossily).
#[test]
fn a_header_name_that_is_not_utf8_is_left_to_the_field_name_check() {
    // The frame of a head with the name `zz-name`, its first byte made 0xff.
    fn broken(frame: &[u8]) -> Vec<u8> {
        let mut body = frame[4..].to_vec();
        let at = body
            .windows(7)
            .position(|w| w == b"zz-name")
            .expect("the name is in the frame");
        body[at] = 0xff;
        body
    }
    let mut h = head();
    h.headers.push(("zz-name".into(), b"v".to_vec()));
    let req = broken(&encode(&h).unwrap());
    assert!(decode::<RequestHead>(&req).is_err());
    let view: RequestHeadView<'_> = decode_view(&req).unwrap();
    let (name, _) = *view.headers.last().unwrap();
    assert_eq!(name, b"\xffz-name");
    assert!(http::HeaderName::from_bytes(name).is_err());

    let resp = ResponseHead {
        status: 200,
        headers: vec![
            ("content-type".into(), b"text/plain".to_vec()),
            ("zz-name".into(), b"v".to_vec()),
        ],
        served_by: "n3".into(),
    };
    let frame = broken(&encode(&resp).unwrap());
    assert!(decode::<ResponseHead>(&frame).is_err());
    let d = decode_response(&bytes::Bytes::from(frame)).unwrap();
    assert_eq!(d.headers.len(), 1);
    assert_eq!(d.dropped, vec!["\u{FFFD}z-name".to_owned()]);
}
