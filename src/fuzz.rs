//! Fuzz harness for every parser peerlb owns, on the stable toolchain:
//! peer wire heads, rules XML, rules TOML, the sticky route cookie and
//! path parameter, the request-target and Host checks, the app's
//! session id (passive routes), and SIP messages.
//!
//! Random but structure-aware inputs (proptest strategies: raw bytes,
//! valid encodings with bytes flipped, nested XML and TOML built from each
//! format's own vocabulary) go through each parser for as long as
//! `PEERLB_FUZZ_SECS` says (per target), in rounds of 500 cases, each
//! round on a fresh seed that is printed; a panic is shrunk by proptest and
//! reported with its smallest input, a stack overflow aborts the process
//! (the last printed seed replays it). Each target also checks what must
//! hold for every input (a decoded head re-encodes to the same bytes, a
//! stripped path has no route parameter left, a 2xx-free parse never
//! panics). Not coverage-guided (cargo-fuzz needs a nightly toolchain);
//! docs/operations.md, "Fuzzing", says how to run it and what the last
//! run found. Every target is `#[ignore]`d, so `cargo test` skips them;
//! `.ci/run` runs each for 3 s (`PEERLB_FUZZ_SECS=3`, `--ignored`).
//!
//! ```sh
//! PEERLB_FUZZ_SECS=120 cargo test --release --lib fuzz:: -- --ignored --nocapture --test-threads 1
//! ```

// Wall-clock time budgets the harness only; nothing here runs in a node.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderValue, Method, Uri};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use crate::adapters::front::client_input;
use crate::adapters::ops::admin::browser;
use crate::adapters::wire;
use crate::engine::rules::Rules;
use crate::engine::session_id::{SessionIdForm, SessionRoute};
use crate::engine::sticky;

/// Runs `check` on inputs from `strategy` for `PEERLB_FUZZ_SECS` seconds
/// (default 10) in rounds of fresh seeds; panics with the shrunk input on
/// the first failure. Prints the rounds, cases and seconds it ran.
fn fuzz<S: Strategy>(name: &str, strategy: S, check: impl Fn(S::Value))
where
    S::Value: std::fmt::Debug,
{
    let secs: u64 = std::env::var("PEERLB_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let start = Instant::now();
    let mut seed: u64 = std::env::var("PEERLB_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| u64::from(std::process::id()) << 20);
    let (mut rounds, mut cases) = (0u64, 0u64);
    while start.elapsed() < Duration::from_secs(secs) {
        eprintln!("fuzz {name}: round {rounds}, seed {seed}");
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        let config = Config {
            cases: 500,
            failure_persistence: None,
            ..Config::default()
        };
        let mut runner =
            TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
        if let Err(e) = runner.run(&strategy, |v| {
            check(v);
            Ok(())
        }) {
            panic!("fuzz {name}: seed {seed}: {e}");
        }
        rounds += 1;
        cases += 500;
        seed = seed.wrapping_add(1);
    }
    eprintln!(
        "fuzz {name}: {cases} cases in {rounds} rounds, {:.0} s, no failure",
        start.elapsed().as_secs_f64()
    );
}

/// Bytes with `flips` (position, value) written over them.
fn mutate(mut bytes: Vec<u8>, flips: &[(usize, u8)], cut: usize) -> Vec<u8> {
    for &(i, b) in flips {
        if !bytes.is_empty() {
            let n = bytes.len();
            bytes[i % n] = b;
        }
    }
    let keep = bytes.len().saturating_sub(cut % (bytes.len() + 1));
    bytes.truncate(keep);
    bytes
}

fn head_strategy() -> impl Strategy<Value = wire::RequestHead> {
    (
        any::<u128>(),
        "[a-z0-9.-]{0,12}",
        any::<u8>(),
        any::<u64>(),
        "[A-Z]{0,8}",
        "\\PC{0,40}",
        prop::collection::vec(
            ("[a-z-]{0,10}", prop::collection::vec(any::<u8>(), 0..20)),
            0..6,
        ),
        any::<std::net::SocketAddr>(),
        prop::option::of("\\PC{0,20}"),
        prop::option::of((
            prop::option::of("\\PC{0,20}"),
            any::<u16>(),
            prop::option::of(prop::collection::vec(any::<u8>(), 0..10)),
        )),
    )
        .prop_map(
            |(
                request_id,
                entry,
                hops,
                view_version,
                method,
                uri,
                headers,
                client,
                hash_key,
                tls,
            )| {
                wire::RequestHead {
                    request_id,
                    entry,
                    hops,
                    view_version,
                    method,
                    uri,
                    headers,
                    client,
                    hash_key,
                    tls: tls.map(|(sni, version, alpn)| wire::TlsFacts { sni, version, alpn }),
                }
            },
        )
}

#[test]
#[ignore = "fuzz harness: runs for PEERLB_FUZZ_SECS (see the module doc)"]
fn fuzz_peer_wire_heads() {
    let input = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300),
        (
            head_strategy(),
            prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
            any::<usize>()
        )
            .prop_map(|(h, flips, cut)| {
                let bytes = wire::encode(&h).expect("a small head encodes");
                // The length prefix, then the head.
                mutate(bytes[4..].to_vec(), &flips, cut % 4)
            }),
        // A `peerlb/3` frame: a kind's first byte (3 is none), then a head.
        (
            0u8..4,
            head_strategy(),
            prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
            any::<usize>()
        )
            .prop_map(|(kind, h, flips, cut)| {
                let mut bytes = vec![kind];
                bytes.extend_from_slice(&wire::encode(&h).expect("a small head encodes")[4..]);
                mutate(bytes, &flips, cut % 4)
            }),
        // A response head.
        (
            any::<u16>(),
            prop::collection::vec(
                ("[a-z-]{0,10}", prop::collection::vec(any::<u8>(), 0..20)),
                0..6,
            ),
            "[a-z0-9.-]{0,12}",
            prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
            any::<usize>()
        )
            .prop_map(|(status, headers, served_by, flips, cut)| {
                let h = wire::ResponseHead {
                    status,
                    headers,
                    served_by,
                };
                let bytes = wire::encode(&h).expect("a small head encodes");
                mutate(bytes[4..].to_vec(), &flips, cut % 4)
            }),
    ];
    fuzz("peer wire heads", input, |bytes| {
        let mut prefix = [0u8; 4];
        for (p, b) in prefix.iter_mut().zip(&bytes) {
            *p = *b;
        }
        let _ = wire::head_len(prefix);
        // The owner decodes in place: it accepts what the owned decoder
        // accepts, and besides only heads whose one fault is a header
        // name that is not UTF-8 (the view leaves names unchecked), a
        // name the owner then refuses as an HTTP field name.
        let view = wire::decode_view::<wire::RequestHeadView<'_>>(&bytes);
        let owned = wire::decode::<wire::RequestHead>(&bytes);
        match (&view, &owned) {
            (Ok(_), Ok(_)) | (Err(_), Err(_)) => {}
            (Ok(v), Err(_)) => assert!(
                v.headers
                    .iter()
                    .any(|(k, _)| std::str::from_utf8(k).is_err()
                        && http::HeaderName::from_bytes(k).is_err()),
                "{view:?} against {owned:?}"
            ),
            (Err(_), Ok(_)) => panic!("{view:?} against {owned:?}"),
        }
        // Both layouts of the request frame (`peerlb/2` marks, `peerlb/3`
        // the kind first) decode or fail without panicking; a `peerlb/2`
        // frame decodes exactly when its head does.
        assert_eq!(
            wire::decode_request(&bytes, wire::Version::V2).is_ok(),
            view.is_ok()
        );
        // A `peerlb/3` frame is the kind, then a `peerlb/2` head: with a
        // kind of one byte (`Http` 0, `Admin` 2) it decodes exactly when
        // the rest decodes as a head.
        let v3 = wire::decode_request(&bytes, wire::Version::V3);
        if let [0 | 2, rest @ ..] = bytes.as_slice() {
            let rest = wire::decode_view::<wire::RequestHeadView<'_>>(rest);
            assert_eq!(v3.is_ok(), rest.is_ok(), "{v3:?} against {rest:?}");
        }
        if let Ok(h) = owned {
            // What the owner does with a head (peer.rs `serve_stream`).
            let mut b = http::Request::builder()
                .method(h.method.as_str())
                .uri(h.uri.as_str());
            for (k, v) in &h.headers {
                b = b.header(k.as_str(), v.as_slice());
            }
            let _ = b.body(());
            // A head that decodes re-encodes to a head that decodes the same.
            let again = wire::encode(&h).expect("a decoded head encodes");
            assert_eq!(wire::decode::<wire::RequestHead>(&again[4..]).ok(), Some(h));
        }
        // The entry decodes response heads into a header map: it accepts
        // what the owned decoder accepts, with the same fields, and
        // besides only heads whose one fault is a header name that is not
        // UTF-8, which it drops as an invalid name (named lossily).
        let owned = wire::decode::<wire::ResponseHead>(&bytes);
        let decoded = wire::decode_response(&bytes::Bytes::from(bytes.clone()));
        match (&decoded, &owned) {
            (Ok(_), Ok(_)) | (Err(_), Err(_)) => {}
            (Ok(d), Err(_)) => assert!(
                d.dropped.iter().any(|n| n.contains('\u{FFFD}')),
                "{decoded:?} against {owned:?}"
            ),
            (Err(_), Ok(_)) => panic!("{decoded:?} against {owned:?}"),
        }
        if let (Ok(d), Ok(h)) = (decoded, owned) {
            assert_eq!((d.status, d.served_by()), (h.status, h.served_by.as_str()));
            assert_eq!(d.headers.len() + d.dropped.len(), h.headers.len());
        }
    });
}

/// XML made of the rules vocabulary, nested up to `depth`, with noise.
fn xml_strategy() -> impl Strategy<Value = String> {
    let names = prop::sample::select(vec![
        "data-centric-rules",
        "http-rules",
        "sip-rules",
        "request-rule",
        "user-centric-rules",
        "header",
        "cookie",
        "request-uri",
        "parameter",
        "or",
        "and",
        "if",
        "else",
        "equal",
        "contains",
        "exist",
        "match",
        "regex",
        "x",
    ]);
    let attr = (
        prop::sample::select(vec![
            "name", "value", "id", "variable", "pattern", "when", "to",
        ]),
        "[^\"<&]{0,12}",
    );
    let leaf = (
        names.clone(),
        prop::collection::vec(attr.clone(), 0..3),
        "[^<&]{0,10}",
    )
        .prop_map(|(n, attrs, text)| {
            let a: String = attrs.iter().map(|(k, v)| format!(" {k}=\"{v}\"")).collect();
            format!("<{n}{a}>{text}</{n}>")
        });
    let tree = leaf.prop_recursive(24, 200, 6, move |inner| {
        (
            names.clone(),
            prop::collection::vec(attr.clone(), 0..3),
            prop::collection::vec(inner, 0..6),
        )
            .prop_map(|(n, attrs, kids)| {
                let a: String = attrs.iter().map(|(k, v)| format!(" {k}=\"{v}\"")).collect();
                format!("<{n}{a}>{}</{n}>", kids.concat())
            })
    });
    prop_oneof![
        4 => tree.prop_map(|t| format!("<data-centric-rules><http-rules>{t}</http-rules></data-centric-rules>")),
        1 => (1usize..3000).prop_map(|n| format!("<data-centric-rules><http-rules><request-rule>{}{}</request-rule></http-rules></data-centric-rules>", "<or>".repeat(n), "</or>".repeat(n))),
        1 => "\\PC{0,200}",
        1 => (tree_noise(), any::<usize>()).prop_map(|(t, cut)| { let c = cut % (t.len() + 1); t.get(..c).unwrap_or(&t).to_owned() }),
    ]
}

fn tree_noise() -> impl Strategy<Value = String> {
    "<data-centric-rules>(<[a-z-]{1,10}( [a-z]{1,5}=\"[^\"]{0,5}\")?>){0,20}"
}

#[test]
#[ignore = "fuzz harness: runs for PEERLB_FUZZ_SECS (see the module doc)"]
fn fuzz_rules_xml() {
    fuzz("rules xml", xml_strategy(), |text| {
        let _ = Rules::from_xml(&text);
    });
}

/// `[[rules]]` tables from the TOML rules vocabulary, with noise.
fn toml_strategy() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec![
        "query", "header", "cookie", "path", "regex", "uri_user", "name", "key", "when", "any",
        "all", "if", "then", "else", "value", "prefix", "extract", "x",
    ]);
    let value = prop_oneof![
        "\"[^\"\\\\]{0,12}\"",
        Just("\"(\\\\w+)\"".to_owned()),
        Just("\"(a|b)*c{5000}\"".to_owned()),
        Just("{}".to_owned()),
        Just("[]".to_owned()),
        "[0-9]{1,4}",
        Just("true".to_owned()),
    ];
    let pair = (key.clone(), value).prop_map(|(k, v)| format!("{k} = {v}"));
    let inline = pair.clone().prop_recursive(6, 40, 4, move |inner| {
        (key.clone(), prop::collection::vec(inner, 0..4))
            .prop_map(|(k, kids)| format!("{k} = {{ {} }}", kids.join(", ")))
    });
    prop_oneof![
        4 => prop::collection::vec(prop::collection::vec(inline, 0..5), 0..4).prop_map(|rules| {
            rules
                .iter()
                .map(|r| format!("[[rules]]\n{}\n", r.join("\n")))
                .collect::<String>()
        }),
        1 => "\\PC{0,200}",
    ]
}

#[test]
#[ignore = "fuzz harness: runs for PEERLB_FUZZ_SECS (see the module doc)"]
fn fuzz_rules_toml() {
    fuzz("rules toml", toml_strategy(), |text| {
        if let Ok(file) = toml::from_str::<crate::config::ClusterFile>(&text) {
            let _ = Rules::compile(&file.rules);
        }
    });
}

fn cookie_text() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..80),
        "((peerlb-route|JSESSIONID|lb|x)=\"?[a-z0-9%!.\"; =+]{0,12}\"?; ?){0,6}"
            .prop_map(String::into_bytes),
    ]
}

fn path_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "(/[a-z%0-9;=!.+-]{0,10}){0,5}(\\?[a-z=&;]{0,10})?",
        "/[a-z]{0,5}(;(peerlb-route|jsessionid|x)(=[a-zA-Z0-9%!.~-]{0,10})?){0,4}",
        "\\PC{0,40}",
    ]
}

#[test]
#[ignore = "fuzz harness: runs for PEERLB_FUZZ_SECS (see the module doc)"]
fn fuzz_route_cookie_and_path_parameter() {
    let input = (
        prop::collection::vec(cookie_text(), 0..3),
        path_text(),
        "\\PC{0,20}",
    );
    fuzz(
        "route cookie and path parameter",
        input,
        |(cookies, path, node)| {
            let mut headers = HeaderMap::new();
            for c in &cookies {
                if let Ok(v) = HeaderValue::from_bytes(c) {
                    headers.append(http::header::COOKIE, v);
                }
            }
            let Ok(uri) = path.parse::<Uri>() else {
                return;
            };
            let _ =
                sticky::route_from_request(&headers, &uri, "peerlb-route", |r| r.len() % 2 == 0);
            let stripped = sticky::strip_route_param(uri.path());
            assert_eq!(sticky::strip_route_param(&stripped), stripped, "idempotent");
            let with = sticky::with_route_param(&path, &node);
            // The route written into a URL reads back as the same node.
            if let Ok(u) = with.parse::<Uri>()
                && u.path().ends_with(&sticky::encode_route_param(&node))
            {
                assert_eq!(
                    sticky::route_from_request(&HeaderMap::new(), &u, "peerlb-route", |_| true)
                        .as_deref(),
                    (!node.is_empty()).then_some(node.as_str())
                );
            }
            assert_eq!(
                sticky::percent_decode(&sticky::percent_encode(&node), false),
                node
            );
            let _ = sticky::percent_decode(&path, true);
        },
    );
}

#[test]
#[ignore = "fuzz harness: runs for PEERLB_FUZZ_SECS (see the module doc)"]
fn fuzz_request_target_and_host_checks() {
    let target = prop_oneof![
        path_text(),
        "(http|https|HTTP|ftp)://[a-zA-Z0-9.:@\\[\\]%-]{0,20}(/[a-z%._-]{0,8}){0,3}",
        "[a-z0-9.:\\[\\]]{0,20}",
        Just("*".to_owned()),
        "/(_|%5[fF]|\\.|%2[eE]|/){0,6}(_peerlb|_PEERLB|%5Fpeerlb)(/|%2[fF])[a-z]{0,8}",
    ];
    let host = prop::option::of(prop_oneof![
        prop::collection::vec(any::<u8>(), 0..30),
        "[a-zA-Z0-9.:@\\[\\] /%-]{0,25}".prop_map(String::into_bytes),
    ]);
    let method = prop::sample::select(vec!["GET", "OPTIONS", "CONNECT", "POST", "HEAD", "X"]);
    fuzz(
        "request-target and host checks",
        (method, target, host),
        |(method, target, host)| {
            let Ok(uri) = target.parse::<Uri>() else {
                return;
            };
            let mut headers = HeaderMap::new();
            if let Some(h) = host.and_then(|h| HeaderValue::from_bytes(&h).ok()) {
                headers.insert(http::header::HOST, h);
            }
            let method: Method = method.parse().expect("a valid method token");
            let _ = client_input::check_target_and_host(&method, &uri, &headers);
            let _ = client_input::classify_path(uri.path(), "/_peerlb/");
            let _ = client_input::host_from_authority(&uri, &mut headers);
            let _ = browser::check_admin_browser(&headers);
        },
    );
}

#[test]
#[ignore = "fuzz harness: runs for PEERLB_FUZZ_SECS (see the module doc)"]
fn fuzz_session_id_parsers() {
    let value = prop_oneof![
        "[a-zA-Z0-9!.:%-]{0,30}",
        "[a-z]{0,6}(![a-zA-Z0-9-]{0,8}){0,5}",
        "\\PC{0,40}",
    ];
    let regex = regex::Regex::new(r"^(?<primary>[^:]*):(?<secondary>[^:]*)?").expect("valid");
    let forms = [
        SessionIdForm::WebLogic,
        SessionIdForm::Httpd,
        SessionIdForm::Regex(regex),
    ];
    fuzz(
        "session id parsers",
        (value, cookie_text(), path_text()),
        |(value, cookie, path)| {
            for form in &forms {
                if let Some(n) = form.parse(&value) {
                    assert!(!n.primary.is_empty());
                    assert!(n.secondary.is_none_or(|s| !s.is_empty()));
                }
                let route = SessionRoute {
                    cookie: Some("JSESSIONID".into()),
                    path_param: Some("jsessionid".into()),
                    form: form.clone(),
                    servers: [("a".to_owned(), "n1".to_owned())].into(),
                };
                let mut headers = HeaderMap::new();
                if let Ok(v) = HeaderValue::from_bytes(&cookie) {
                    headers.append(http::header::COOKIE, v);
                }
                if let Ok(uri) = path.parse::<Uri>()
                    && let Some(p) = route.pick(&headers, &uri, |n| n.len() % 3 != 0)
                {
                    assert!(p.node.len() % 3 != 0, "only a serving node is picked");
                }
            }
        },
    );
}

/// SIP messages from the parser's own vocabulary: start lines, header
/// names (full and compact), values with tags, lists, folds and odd bytes.
fn sip_text() -> impl Strategy<Value = Vec<u8>> {
    let start = prop_oneof![
        "(INVITE|ACK|BYE|CANCEL|OPTIONS|REGISTER|MESSAGE|[A-Z]{1,8}) (sip|sips|tel|x):[a-z@.;=0-9]{0,20} SIP/2\\.0",
        "SIP/2\\.0 [0-9]{3} [A-Za-z ]{0,12}",
        "\\PC{0,30}",
    ];
    let name = prop_oneof![
        "(Via|v|From|f|To|t|Call-ID|i|CSeq|Route|Record-Route|Max-Forwards|Content-Length|l|Contact|m|Subject)",
        "[A-Za-z-]{1,10}",
    ];
    let value = prop_oneof![
        "SIP/2\\.0/(UDP|TCP) [a-z0-9.:\\[\\]]{1,20}(;branch=z9hG4bK[a-z0-9]{0,6})?(;rport)?(, SIP/2\\.0/UDP h)?",
        "(\"[A-Za-z ]{0,6}\" )?<sip:[a-z]{0,6}@h(;lr)?(;peerlb-owner=n[0-9])?(;peerlb-key=[a-z%0-9|]{0,8})?>(;tag=[a-z0-9]{0,6})?",
        "[0-9]{0,12} [A-Z]{0,8}",
        "[0-9-]{0,10}",
        "\\PC{0,24}",
    ];
    let header = (
        name,
        prop_oneof![Just(":"), Just(" : "), Just("")],
        value,
        prop_oneof![Just("\r\n"), Just("\r\n "), Just("\n")],
    )
        .prop_map(|(n, c, v, end)| format!("{n}{c}{v}{end}"));
    (
        start,
        proptest::collection::vec(header, 0..12),
        prop_oneof![Just("\r\n"), Just("")],
        proptest::collection::vec(any::<u8>(), 0..40),
        proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        any::<usize>(),
    )
        .prop_map(|(start, headers, blank, body, flips, cut)| {
            let mut b = format!("{start}\r\n{}{blank}", headers.concat()).into_bytes();
            b.extend_from_slice(&body);
            mutate(b, &flips, if cut % 4 == 0 { cut } else { 0 })
        })
}

#[test]
#[ignore = "fuzz harness: runs for PEERLB_FUZZ_SECS (see the module doc)"]
fn fuzz_sip_messages() {
    use crate::engine::sip;
    fuzz("sip messages", sip_text(), |bytes| {
        if let Ok(Some(n)) = sip::frame_len(&bytes) {
            assert!(n <= bytes.len() && n <= sip::MAX_MESSAGE);
        }
        match sip::parse(&bytes) {
            Ok(m) => {
                let again = sip::parse(&m.to_bytes()).expect("a parsed message re-encodes");
                assert_eq!(again, m);
                let _ =
                    sip::serve_uas(&m, "n1", "127.0.0.1:5060", &mut sip::DialogTable::default());
                let _ = sip::dialog_route(&m);
                let _ = sip::default_key(&m);
            }
            Err(e) => {
                // A 400 is a response a stream client can frame.
                if let Some(r) = sip::bad_request(&bytes, &e) {
                    assert!(matches!(
                        r.start,
                        sip::StartLine::Response { status: 400, .. }
                    ));
                    let out = r.to_bytes();
                    assert_eq!(sip::frame_len(&out), Ok(Some(out.len())));
                }
            }
        }
    });
}
