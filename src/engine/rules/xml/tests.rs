//! DCR XML tests: the shipped example against its TOML twin, SailFin
//! semantics, and errors naming element and line.

use super::super::{RuleSpec, Rules, uri_user};
use crate::engine::testing::TestRequest;
use serde::Deserialize;

const EXAMPLE: &str = include_str!("../../../../docs/data-centric-rules.xml");

/// The TOML form of docs/data-centric-rules.xml (also in its comment).
const EXAMPLE_TOML: &str = r#"
    [[rules]]
    when = { header_present = "x-internal" }
    extract = [{ cookie = "tenant" }, { query = "tenant" }]

    [[rules]]
    extract = [{ query = "user" }, { header = "x-user" },
               { header_uri_user = "x-from" }, { cookie = "session" },
               { target_regex = "^/users/([^/?]+)", prefix = "u:" }]

    [[rules]]
    when = { cookie_absent = "session" }
    extract = [{ target_regex = "[?&]cart=([0-9]+)", prefix = "cart:" }]
"#;

/// The nested TOML form of docs/data-centric-rules.xml: the same `or` /
/// `and` / `if` / `else` tree, element for element (also in
/// docs/configuration.md).
const EXAMPLE_NESTED_TOML: &str = r#"
    # rule 0: internal clients are keyed by tenant (cookie, else parameter)
    [[rules]]
    key = { all = [
      { header = "x-internal" },
      { if = [{ cookie = "tenant", return = "cookie.tenant" }], else = "parameter.tenant" },
    ] }

    # rule 1: the user, from the first place that names one
    [[rules]]
    key = { any = [
      { query = "user", return = "parameter.user" },
      { header = "x-user", return = "request.x-user" },
      { header = "x-from", return = "request.x-from.uri.user" },
      { cookie = "session", return = "cookie.session" },
      { match = '^/users/([^/?]+)', prefix = "u:", return = "match" },
    ] }

    # rule 2: anonymous carts (no session cookie) by cart id
    [[rules]]
    key = { all = [
      { cookie = "session", absent = true },
      { match = '[?&]cart=([0-9]+)', prefix = "cart:", return = "match" },
    ] }
"#;

/// `GET uri` with `headers`, from 192.0.2.1:4000.
fn request(uri: &str, headers: &[(&str, &str)]) -> TestRequest {
    TestRequest::get(uri)
        .headers(headers)
        .client("192.0.2.1:4000")
}

fn toml_rules(src: &str) -> Rules {
    #[derive(Deserialize)]
    struct File {
        rules: Vec<RuleSpec>,
    }
    Rules::compile(&toml::from_str::<File>(src).unwrap().rules).unwrap()
}

fn key(rules: &Rules, uri: &str, headers: &[(&str, &str)]) -> Option<(usize, String)> {
    rules.extract(&request(uri, headers).view())
}

/// (request-target, headers, key from the example)
type Case = (
    &'static str,
    &'static [(&'static str, &'static str)],
    Option<(usize, &'static str)>,
);

const CASES: [Case; 22] = [
    ("/", &[], None),
    ("/?user=ann", &[], Some((1, "ann"))),
    ("/?user=", &[("x-user", "bob")], Some((1, "bob"))),
    ("/?user=a%20b+c", &[], Some((1, "a b c"))),
    ("/", &[("x-user", "  ")], None),
    ("/", &[("x-user", " carl ")], Some((1, "carl"))),
    (
        "/",
        &[("x-from", "\"Alice\" <sip:alice@example.com>;tag=1")],
        Some((1, "alice")),
    ),
    ("/", &[("x-from", "sip:example.com")], None),
    ("/", &[("cookie", "a=1; session=s-9")], Some((1, "s-9"))),
    ("/", &[("cookie", "session=")], None),
    ("/users/42/orders", &[], Some((1, "u:42"))),
    (
        "/users/42?x=1",
        &[("cookie", "session=s1")],
        Some((1, "s1")),
    ),
    ("/users/", &[], None),
    ("/shop?cart=123", &[], Some((2, "cart:123"))),
    ("/shop?a=1&cart=77&cart=8", &[], Some((2, "cart:77"))),
    ("/shop?cart=123", &[("cookie", "session=")], None),
    ("/shop?cart=x1", &[], None),
    (
        "/?tenant=t1&user=u",
        &[("x-internal", "1")],
        Some((0, "t1")),
    ),
    (
        "/?tenant=t1",
        &[("x-internal", ""), ("cookie", "tenant=t2")],
        Some((0, "t2")),
    ),
    (
        "/?tenant=t1",
        &[("x-internal", "1"), ("cookie", "tenant=")],
        Some((0, "t1")),
    ),
    ("/?user=u", &[("x-internal", "1")], Some((1, "u"))),
    ("/?tenant=t1&user=u", &[], Some((1, "u"))),
];

#[test]
fn shipped_example_and_its_toml_twin_extract_the_same_keys() {
    let xml = Rules::from_xml(EXAMPLE).unwrap();
    let toml = toml_rules(EXAMPLE_TOML);
    let nested = toml_rules(EXAMPLE_NESTED_TOML);
    assert_eq!((xml.len(), toml.len(), nested.len()), (3, 3, 3));
    assert_eq!(xml.name(1), Some("<or> at line 42"));
    for (uri, headers, want) in CASES {
        let req = request(uri, headers);
        let got = xml.extract(&req.view());
        assert_eq!(
            got,
            want.map(|(i, k)| (i, k.to_owned())),
            "{uri} {headers:?}"
        );
        assert_eq!(toml.extract(&req.view()), got, "toml: {uri} {headers:?}");
        assert_eq!(
            nested.extract(&req.view()),
            got,
            "nested toml: {uri} {headers:?}"
        );
    }
    // The <sip-rules> rule: the user part of the From URI.
    assert_eq!(
        (xml.sip_len(), xml.sip_name(0)),
        (1, Some("<or> at line 60"))
    );
    let invite = request("/", &[("from", "\"Alice\" <sip:alice@example.com>;tag=9")]);
    assert_eq!(xml.extract_sip(&invite.view()), Some((0, "alice".into())));
    assert_eq!(xml.extract_sip(&request("/", &[]).view()), None);
    assert_eq!(toml.sip_len(), 0);
}

#[test]
fn or_and_if_semantics() {
    let r = Rules::from_xml(
        r#"<user-centric-rules xmlns="urn:x" xmlns:xsi="urn:y" xsi:schemaLocation="z">
          <http-rules>
            <if>
              <header name="x-a" return="request.x-b"><exist/></header>
              <header name="x-c"><notexist/></header>
              <else return="cookie.fallback"/>
            </if>
            <and>
              <request-uri parameter="p"><exist/></request-uri>
              <request-uri parameter="id" return="match"><match prefix="id-">^([a-z]+)-[0-9]+$</match></request-uri>
            </and>
            <header name="x-d"><exist/></header>
          </http-rules>
        </user-centric-rules>"#,
    )
    .unwrap();
    // if: both conditions hold: the last result, which is "" (notexist
    // without return) -> empty key -> next rule.
    assert_eq!(key(&r, "/", &[("x-a", "1"), ("x-b", "B")]), None);
    // if: condition fails (x-c present): the else variable.
    assert_eq!(
        key(
            &r,
            "/",
            &[("x-a", "1"), ("x-c", "1"), ("cookie", "fallback=F")]
        ),
        Some((0, "F".into()))
    );
    // and: all non-null -> last; the match is on the decoded parameter.
    assert_eq!(
        key(&r, "/?p=&id=ab%2D12", &[("x-c", "1")]),
        Some((1, "id-ab".into()))
    );
    assert_eq!(key(&r, "/?id=ab-12", &[("x-c", "1")]), None);
    // exist without return: the tested value.
    assert_eq!(
        key(&r, "/", &[("x-c", "1"), ("x-d", "D")]),
        Some((2, "D".into()))
    );
    assert_eq!(r.sip_len(), 0);
}

#[test]
fn entities_cdata_and_comments_in_regexes() {
    let r = Rules::from_xml(
        "<user-centric-rules><http-rules><!-- c -->\
         <request-uri return=\"match\"><match prefix=\"&lt;&#x41;&gt;\">\
         <![CDATA[[?&]k=([^&]+)]]></match></request-uri></http-rules></user-centric-rules>",
    )
    .unwrap();
    assert_eq!(key(&r, "/?a=1&k=v", &[]), Some((0, "<A>v".into())));
    let empty = Rules::from_xml("<user-centric-rules/>").unwrap();
    assert!(empty.is_empty());
}

#[test]
fn errors_name_the_element_and_line() {
    let cases: &[(&str, &str)] = &[
        (
            "<user-centric-rules>\n<http-rules>\n  <xor/>\n</http-rules>\n</user-centric-rules>",
            "<xor> at line 3: unknown element <xor> (expected or, and, if, header, cookie or request-uri)",
        ),
        (
            "<user-centric-rules>\n<http-rules>\n<or>\n<header nme=\"x\"><exist/></header></or></http-rules></user-centric-rules>",
            "<header> at line 4: unknown attribute \"nme\"",
        ),
        (
            "<user-centric-rules><http-rules><cookie return=\"cookie.a\"><exist/></cookie></http-rules></user-centric-rules>",
            "<cookie> at line 1: missing attribute \"name\"",
        ),
        (
            "<user-centric-rules><http-rules>\n<header name=\"a\" return=\"req.a\"><exist/></header></http-rules></user-centric-rules>",
            "<header> at line 2: invalid return variable \"req.a\" (expected request.<header>, request.<header>.uri.user, parameter.<name>, cookie.<name> or match)",
        ),
        (
            "<user-centric-rules><http-rules><header name=\"a\" return=\"match\"><exist/></header></http-rules></user-centric-rules>",
            "<header> at line 1: return=\"match\" needs a <match> test",
        ),
        (
            "<user-centric-rules><http-rules><header name=\"a\"><match>(x)</match></header></http-rules></user-centric-rules>",
            "<match> at line 1: unknown element <match> (expected exactly one of <exist/>, <notexist/>)",
        ),
        (
            "<user-centric-rules><http-rules><header name=\"a\"/></http-rules></user-centric-rules>",
            "<header> at line 1: needs exactly one of <exist/>, <notexist/>",
        ),
        (
            "<user-centric-rules><http-rules>\n\n<request-uri><match>x</match></request-uri></http-rules></user-centric-rules>",
            "<match> at line 3: regex has no capture group",
        ),
        (
            "<user-centric-rules><http-rules><request-uri><match>(</match></request-uri></http-rules></user-centric-rules>",
            "<match> at line 1: invalid regex: ",
        ),
        (
            "<user-centric-rules><http-rules><request-uri><exist/></request-uri></http-rules></user-centric-rules>",
            "<request-uri> at line 1: missing attribute \"parameter\"",
        ),
        (
            "<user-centric-rules><http-rules><if><else return=\"cookie.a\"/><header name=\"a\"><exist/></header></if></http-rules></user-centric-rules>",
            "<else> at line 1: <else> must be the last child of <if>",
        ),
        (
            "<user-centric-rules><http-rules><if><else return=\"cookie.a\"/></if></http-rules></user-centric-rules>",
            "<if> at line 1: needs at least one condition element",
        ),
        (
            "<user-centric-rules><http-rules><or/></http-rules></user-centric-rules>",
            "<or> at line 1: needs at least one child element",
        ),
        (
            "<user-centric-rules><http-rules/>\n<http-rules/></user-centric-rules>",
            "<http-rules> at line 2: <http-rules> appears twice",
        ),
        (
            "<user-centric-rules><tcp-rules/></user-centric-rules>",
            "<tcp-rules> at line 1: unknown element <tcp-rules> (expected http-rules or sip-rules)",
        ),
        (
            "<rules/>",
            "<rules> at line 1: unknown element <rules> (expected user-centric-rules)",
        ),
        (
            "<user-centric-rules version=\"2\"/>",
            "<user-centric-rules> at line 1: unknown attribute \"version\"",
        ),
        (
            "<user-centric-rules><http-rules>key</http-rules></user-centric-rules>",
            "<http-rules> at line 1: unexpected text \"key\"",
        ),
        (
            "<user-centric-rules><http-rules><header name=\"a b\"><exist/></header></http-rules></user-centric-rules>",
            "<header> at line 1: invalid header name \"a b\"",
        ),
        (
            "<user-centric-rules>\n<http-rules>\n</http-rulez>\n</user-centric-rules>",
            "line 3: malformed XML: ",
        ),
        (
            "<user-centric-rules>\n<http-rules>",
            "<http-rules> at line 2: malformed XML: element is not closed",
        ),
        (
            "<user-centric-rules>&bogus;</user-centric-rules>",
            "line 1: malformed XML: unknown entity &bogus;",
        ),
        ("", "line 1: malformed XML: no root element"),
        (
            "<user-centric-rules/><x/>",
            "line 1: malformed XML: element <x> after the root element",
        ),
    ];
    for (src, want) in cases {
        let got = Rules::from_xml(src).unwrap_err().to_string();
        assert!(got.starts_with(want), "got {got:?}\nwant {want:?}");
    }
}

#[test]
fn user_part_of_uri_headers() {
    let cases = [
        ("\"Alice\" <sip:alice@example.com>;tag=1", Some("alice")),
        ("<sips:bob;npdi@example.com:5061>", Some("bob")),
        ("sip:carol:secret@example.com", Some("carol")),
        ("tel:+1555", None),
        ("http://dave@example.com/x", Some("dave")),
        ("erin@example.com", Some("erin")),
        ("<sip:@example.com>", None),
        ("", None),
    ];
    for (v, want) in cases {
        assert_eq!(uri_user(v), want, "{v}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

    /// On requests assembled from the parts the shipped example looks at
    /// (present, empty or absent), the XML file, its nested TOML twin and
    /// its flat TOML twin extract the same key from the same rule.
    #[test]
    fn xml_and_both_toml_forms_agree(
        path in proptest::sample::select(vec!["/", "/users/ann", "/users/", "/shop", "/users/b%20c/x"]),
        params in proptest::collection::vec(
            (proptest::sample::select(vec!["user", "tenant", "cart", "x"]),
             proptest::sample::select(vec!["", "u1", "42", "a%20b", "7x"])),
            0..4),
        headers in proptest::collection::vec(
            (proptest::sample::select(vec!["x-internal", "x-user", "x-from"]),
             proptest::sample::select(vec!["", "1", " bob ", "<sip:al@h>", "sip:h"])),
            0..3),
        cookies in proptest::collection::vec(
            (proptest::sample::select(vec!["session", "tenant", "other"]),
             proptest::sample::select(vec!["", "s1", "t9"])),
            0..3),
    ) {
        let xml = Rules::from_xml(EXAMPLE).unwrap();
        let flat = toml_rules(EXAMPLE_TOML);
        let nested = toml_rules(EXAMPLE_NESTED_TOML);
        let query: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let uri = if query.is_empty() { path.to_owned() } else { format!("{path}?{}", query.join("&")) };
        let cookie: Vec<String> = cookies.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let cookie = cookie.join("; ");
        let mut hs: Vec<(&str, &str)> = headers.clone();
        if !cookie.is_empty() {
            hs.push(("cookie", &cookie));
        }
        let req = request(&uri, &hs);
        let want = xml.extract(&req.view());
        proptest::prop_assert_eq!(nested.extract(&req.view()), want.clone(), "nested: {} {:?}", uri, hs);
        proptest::prop_assert_eq!(flat.extract(&req.view()), want, "flat: {} {:?}", uri, hs);
    }
}
