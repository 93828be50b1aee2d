//! Rule tests: the TOML model, every extractor and condition, errors.
use super::*;
use crate::engine::testing::TestRequest;
use bounds::MAX_RULE_DEPTH;

/// `method uri` with `headers`, from the default test client
/// (192.0.2.7:40123).
fn request(method: &str, uri: &str, headers: &[(&str, &str)]) -> TestRequest {
    TestRequest::new(method, uri).headers(headers)
}

fn rules(toml_src: &str) -> Rules {
    Rules::compile(&specs(toml_src)).unwrap()
}

fn specs(toml_src: &str) -> Vec<RuleSpec> {
    #[derive(Deserialize)]
    struct File {
        rules: Vec<RuleSpec>,
    }
    toml::from_str::<File>(toml_src).unwrap().rules
}

fn key(r: &Rules, req: &TestRequest) -> Option<(usize, String)> {
    r.extract(&req.view())
}

fn compile_err(toml_src: &str) -> String {
    Rules::compile(&specs(toml_src)).unwrap_err().to_string()
}

const USERS: &str = r#"
    [[rules]]
    name = "users"
    extract = [{ query = "user" }, { header = "x-user" }, { cookie = "session" },
               { path_regex = "^/users/([^/]+)", prefix = "u:" },
               { target_regex = "[?&]t=([0-9]+)", prefix = "t:" }]
"#;

#[test]
fn module_doc_example_parses() {
    let r = rules(
        r#"
        [[rules]]
        name = "users"
        when = { path_prefix = "/api/", header_absent = "x-internal" }
        extract = [{ query = "user" }, { header = "x-user" }, { cookie = "session" },
                   { path_regex = "^/users/([^/]+)", prefix = "u:" }]
        "#,
    );
    let req = request("GET", "/api/x?user=ann", &[]);
    assert_eq!(key(&r, &req), Some((0, "ann".into())));
    let req = request("GET", "/api/x?user=ann", &[("x-internal", "1")]);
    assert_eq!(key(&r, &req), None);
}

#[test]
fn toml_model_parses() {
    let s = specs(USERS);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].name.as_deref(), Some("users"));
    assert_eq!(s[0].when, Condition::default());
    assert_eq!(
        s[0].extract[0],
        ExtractorSpec {
            query: Some("user".into()),
            ..Default::default()
        }
    );
    assert_eq!(
        s[0].extract[3],
        ExtractorSpec {
            path_regex: Some("^/users/([^/]+)".into()),
            prefix: Some("u:".into()),
            ..Default::default()
        }
    );
    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct File {
        rules: Vec<RuleSpec>,
    }
    let unknown = toml::from_str::<File>("[[rules]]\nextract = [{ qurey = \"u\" }]");
    assert!(
        unknown
            .unwrap_err()
            .to_string()
            .contains("unknown field `qurey`")
    );
    let unknown = toml::from_str::<File>("[[rules]]\nextract = []\nwhen = { paht = \"/\" }");
    assert!(
        unknown
            .unwrap_err()
            .to_string()
            .contains("unknown field `paht`")
    );
}

/// (request-target, headers, expected key)
type Case = (
    &'static str,
    &'static [(&'static str, &'static str)],
    Option<&'static str>,
);

#[test]
fn each_extractor_kind() {
    let r = rules(USERS);
    assert!(!r.is_empty());
    assert_eq!(r.len(), 1);
    assert_eq!(r.name(0), Some("users"));
    let cases: [Case; 10] = [
        ("/x?a=1&user=al%20ice&user=bob", &[], Some("al ice")),
        ("/x?user=a+b", &[], Some("a b")),
        ("/x?us%65r=enc", &[], Some("enc")),
        ("/x?user=&other=1", &[("x-user", "  hdr  ")], Some("hdr")),
        ("/x", &[("x-user", "h1"), ("x-user", "h2")], Some("h1")),
        (
            "/x",
            &[("cookie", "a=1; session=s1"), ("cookie", "session=s2")],
            Some("s1"),
        ),
        ("/users/42/orders?x=1", &[], Some("u:42")),
        ("/other?x=1&t=99", &[], Some("t:99")),
        ("/users/?t=", &[("x-user", "   ")], None),
        ("/", &[("cookie", "session=")], None),
    ];
    for (uri, headers, want) in cases {
        let req = request("GET", uri, headers);
        assert_eq!(
            key(&r, &req),
            want.map(|k| (0, k.to_owned())),
            "{uri} {headers:?}"
        );
    }
}

#[test]
fn first_non_empty_rule_wins() {
    let r = rules(
        r#"
        [[rules]]
        when = { path_prefix = "/api/" }
        extract = [{ query = "id" }]
        [[rules]]
        extract = [{ header = "x-tenant" }]
        [[rules]]
        extract = [{ query = "id", prefix = "late:" }]
        "#,
    );
    // Rule 0 applies and yields.
    assert_eq!(
        key(&r, &request("GET", "/api/x?id=7", &[("x-tenant", "t")])),
        Some((0, "7".into()))
    );
    // Rule 0 applies but is empty: rule 1.
    assert_eq!(
        key(&r, &request("GET", "/api/x?id=", &[("x-tenant", "t")])),
        Some((1, "t".into()))
    );
    // Rule 0 does not apply, rule 1 empty: rule 2.
    assert_eq!(
        key(&r, &request("GET", "/web?id=7", &[])),
        Some((2, "late:7".into()))
    );
    assert_eq!(key(&r, &request("GET", "/web", &[])), None);
}

#[test]
fn conditions_all_must_hold() {
    let r = rules(
        r#"
        [[rules]]
        extract = [{ header = "x-a" }]
        [rules.when]
        method = "POST"
        host = "Shop.Example"
        path_regex = "^/cart(/|$)"
        header_present = "x-a"
        header_absent = "x-b"
        cookie_present = "c1"
        cookie_absent = "c2"
        "#,
    );
    let ok: &[(&str, &str)] = &[
        ("host", "shop.example:8080"),
        ("x-a", "k"),
        ("cookie", "c1="),
    ];
    assert_eq!(
        key(&r, &request("POST", "/cart/1", ok)),
        Some((0, "k".into()))
    );
    assert_eq!(
        key(&r, &request("POST", "http://SHOP.example/cart", &ok[1..])),
        Some((0, "k".into()))
    );
    assert_eq!(key(&r, &request("GET", "/cart/1", ok)), None);
    assert_eq!(key(&r, &request("post", "/cart/1", ok)), None);
    assert_eq!(key(&r, &request("POST", "/carts", ok)), None);
    assert_eq!(key(&r, &request("POST", "/cart", &ok[1..])), None); // no host
    let other_host = [("host", "other.example"), ok[1], ok[2]];
    assert_eq!(key(&r, &request("POST", "/cart", &other_host)), None);
    let with_b = [ok[0], ok[1], ok[2], ("x-b", "1")];
    assert_eq!(key(&r, &request("POST", "/cart", &with_b)), None);
    let no_c1 = [ok[0], ok[1], ("cookie", "c3=1")];
    assert_eq!(key(&r, &request("POST", "/cart", &no_c1)), None);
    let with_c2 = [ok[0], ok[1], ("cookie", "c1=1; c2=2")];
    assert_eq!(key(&r, &request("POST", "/cart", &with_c2)), None);
}

#[test]
fn ipv6_host_header() {
    let r = rules("[[rules]]\nwhen = { host = \"[::1]\" }\nextract = [{ header = \"x\" }]");
    let req = request("GET", "/", &[("host", "[::1]:8080"), ("x", "v")]);
    assert_eq!(key(&r, &req), Some((0, "v".into())));
}

#[test]
fn h2_default_key_is_remote_host_and_port() {
    assert_eq!(
        default_key("192.0.2.7:40123".parse().unwrap()),
        "192.0.2.7:40123"
    );
    assert_eq!(
        default_key("[2001:db8::1]:443".parse().unwrap()),
        "[2001:db8::1]:443"
    );
    assert_eq!(
        default_key("[::ffff:192.0.2.7]:40123".parse().unwrap()),
        "192.0.2.7:40123"
    );
    let r = rules("[[rules]]\nextract = [{ header = \"x-user\" }]");
    let req = request("GET", "/", &[]);
    assert_eq!(key(&r, &req), None);
    assert_eq!(default_key(req.client), "192.0.2.7:40123");
}

#[test]
fn empty_rules() {
    let r = Rules::compile(&[]).unwrap();
    assert!(r.is_empty());
    assert_eq!(key(&r, &request("GET", "/?user=1", &[])), None);
}

#[test]
fn errors_name_the_field() {
    let cases = [
        (
            "[[rules]]\nextract = [{ query = \"a\" }]\n[[rules]]\nextract = [{ path_regex = \"(\" }]",
            "rules[1].extract[0].path_regex: invalid regex: ",
        ),
        (
            "[[rules]]\nextract = [{ query = \"a\" }, {}, { query = \"a\", cookie = \"b\" }]",
            "rules[0].extract[1]: exactly one of query, header, header_uri_user, cookie, path_regex, target_regex",
        ),
        (
            "[[rules]]\nname = \"u\"\nextract = [{ query = \"a\", cookie = \"b\" }]",
            "rules[0].extract[0]: exactly one of query, header, header_uri_user, cookie, path_regex, target_regex (rule \"u\")",
        ),
        (
            "[[rules]]\nextract = [{ prefix = \"p\" }]",
            "rules[0].extract[0]: exactly one of",
        ),
        (
            "[[rules]]\nextract = [{ target_regex = \"^/x\" }]",
            "rules[0].extract[0].target_regex: regex has no capture group (the key is the first capture group)",
        ),
        (
            "[[rules]]\nextract = []",
            "rules[0].extract: at least one extractor (or a `key` expression) is required",
        ),
        (
            "[[rules]]\nname = \"n\"",
            "rules[0].extract: at least one extractor (or a `key` expression) is required (rule \"n\")",
        ),
        (
            "[[rules]]\nextract = [{ query = \"\" }]",
            "rules[0].extract[0].query: must not be empty",
        ),
        (
            "[[rules]]\nextract = [{ header = \"bad header\" }]",
            "rules[0].extract[0].header: invalid header name \"bad header\"",
        ),
        (
            "[[rules]]\nwhen = { method = \"GE T\" }\nextract = [{ query = \"a\" }]",
            "rules[0].when.method: invalid HTTP method \"GE T\"",
        ),
        (
            "[[rules]]\nwhen = { path_regex = \"[\" }\nextract = [{ query = \"a\" }]",
            "rules[0].when.path_regex: invalid regex: ",
        ),
        (
            "[[rules]]\nwhen = { header_absent = \"\" }\nextract = [{ query = \"a\" }]",
            "rules[0].when.header_absent: must not be empty",
        ),
    ];
    for (src, want) in cases {
        let got = compile_err(src);
        assert!(got.starts_with(want), "got {got:?}, want {want:?}");
    }
    let e = Rules::compile(&specs(
        "[[rules]]\nname = \"r\"\nextract = [{ path_regex = \"(\" }]",
    ))
    .unwrap_err();
    assert_eq!(e.path, "rules[0].extract[0].path_regex");
    assert_eq!(e.rule.as_deref(), Some("r"));
    assert!(matches!(e.kind, RuleErrorKind::InvalidRegex(_)));
    assert!(std::error::Error::source(&e).is_some());
}

#[test]
fn request_target_forms() {
    assert_eq!(request_target(&Uri::from_static("/a?b=1")), "/a?b=1");
    assert_eq!(
        request_target(&Uri::from_static("http://h/a?b=1")),
        "http://h/a?b=1"
    );
    assert_eq!(request_target(&Uri::from_static("h:443")), "h:443");
}

/// Compile errors of the nested `key` form name the expression's path.
#[test]
fn nested_key_errors_name_the_expression() {
    let cases = [
        (
            "[[rules]]\nextract = [{ query = \"a\" }]\nkey = { header = \"h\" }",
            "rules[0]: give either `extract` or `key`, not both",
        ),
        (
            "[[rules]]\nkey = { any = [] }",
            "rules[0].key.any: needs at least one expression",
        ),
        (
            "[[rules]]\nkey = {}",
            "rules[0].key: exactly one of any, all, if, or a test",
        ),
        (
            "[[rules]]\nkey = { any = [{ header = \"a\" }], all = [{ header = \"b\" }] }",
            "rules[0].key: exactly one of",
        ),
        (
            "[[rules]]\nkey = { any = [{ header = \"a\", cookie = \"b\" }] }",
            "rules[0].key.any[0]: at most one of header, cookie, query",
        ),
        (
            "[[rules]]\nkey = { all = [{ header = \"a\" }], else = \"cookie.c\" }",
            "rules[0].key.else: only in an `if`",
        ),
        (
            "[[rules]]\nkey = { if = [{ header = \"a\" }], else = \"match\" }",
            "rules[0].key.else: `match` is only a test's return",
        ),
        (
            "[[rules]]\nkey = { if = [{ header = \"a\" }], else = \"body.x\" }",
            "rules[0].key.else: invalid return variable \"body.x\"",
        ),
        (
            "[[rules]]\nkey = { any = [{ header = \"a\" }], return = \"cookie.c\" }",
            "rules[0].key.return: only in a test",
        ),
        (
            "[[rules]]\nkey = { all = [{ query = \"p\" }, { query = \"q\", return = \"match\" }] }",
            "rules[0].key.all[1].return: `match` needs a `match` test",
        ),
        (
            "[[rules]]\nkey = { header = \"h\", prefix = \"p\" }",
            "rules[0].key.prefix: only with `match`",
        ),
        (
            "[[rules]]\nkey = { match = \"^/x\" }",
            "rules[0].key.match: regex has no capture group",
        ),
        (
            "[[rules]]\nkey = { match = \"(\" }",
            "rules[0].key.match: invalid regex",
        ),
        (
            "[[rules]]\nkey = { query = \"p\", match = \"(x)\", absent = true }",
            "rules[0].key.absent: not with `match`",
        ),
        (
            "[[rules]]\nname = \"bad\"\nkey = { any = [{ header = \"bad header\" }] }",
            "rules[0].key.any[0].header: invalid header name \"bad header\" (rule \"bad\")",
        ),
        (
            "[[rules]]\nkey = { any = [{ if = [{ cookie = \"\" }] }] }",
            "rules[0].key.any[0].if[0].cookie: must not be empty",
        ),
    ];
    for (src, want) in cases {
        let got = compile_err(src);
        assert!(got.starts_with(want), "got {got:?}, want {want:?}");
    }
    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct File {
        rules: Vec<RuleSpec>,
    }
    let unknown = toml::from_str::<File>("[[rules]]\nkey = { any = [{ heder = \"h\" }] }");
    assert!(
        unknown
            .unwrap_err()
            .to_string()
            .contains("unknown field `heder`")
    );
}

/// The nested form: SailFin results (`any` = first non-null, `all` = last
/// when all non-null, `if` / `else`, tests returning their value, a
/// variable, a capture or "" for `absent`), `when` in front, and the
/// module doc's example.
#[test]
fn nested_key_semantics() {
    let r = rules(
        r#"
        [[rules]]
        name = "gated"
        when = { method = "POST" }
        key = { header = "x-post" }

        # The table form: the same as an inline `key = { if = [...], else = ... }`.
        [[rules]]
        [rules.key]
        if = [{ header = "x-a", return = "request.x-b" }, { header = "x-c", absent = true }]
        else = "cookie.fallback"

        [[rules]]
        key = { all = [{ query = "p" }, { query = "id", match = '^([a-z]+)-[0-9]+$', prefix = "id-" }] }

        [[rules]]
        key = { any = [
          { header = "x-path", match = '^/v([0-9]+)/' },
          { cookie = "sid" },
          { match = '^/users/([^/?]+)', prefix = "u:", return = "match" },
        ] }
        "#,
    );
    let k = |method: &str, uri: &str, h: &[(&str, &str)]| key(&r, &request(method, uri, h));
    assert_eq!(k("POST", "/", &[("x-post", "P")]), Some((0, "P".into())));
    assert_eq!(k("GET", "/", &[("x-post", "P")]), None);
    // if: all conditions hold: the last result is "" (absent) -> no key.
    assert_eq!(k("GET", "/", &[("x-a", "1"), ("x-b", "B")]), None);
    // if: a condition fails: the else variable.
    assert_eq!(
        k(
            "GET",
            "/",
            &[("x-a", "1"), ("x-c", "1"), ("cookie", "fallback=F")]
        ),
        Some((1, "F".into()))
    );
    // all: the last result when all are non-null; match on the parameter.
    assert_eq!(
        k("GET", "/?p=&id=ab%2D12", &[("x-c", "1")]),
        Some((2, "id-ab".into()))
    );
    assert_eq!(k("GET", "/?id=ab-12", &[("x-c", "1")]), None);
    // any: first non-null; match on a header value; cookie value; target.
    assert_eq!(
        k(
            "GET",
            "/",
            &[("x-c", "1"), ("x-path", "/v2/x"), ("cookie", "sid=S")]
        ),
        Some((3, "2".into()))
    );
    assert_eq!(
        k(
            "GET",
            "/",
            &[("x-c", "1"), ("x-path", "/x"), ("cookie", "sid=S")]
        ),
        Some((3, "S".into()))
    );
    assert_eq!(
        k("GET", "/users/ann?x", &[("x-c", "1")]),
        Some((3, "u:ann".into()))
    );

    // The module doc's nested example.
    let doc = rules(
        r#"
        [[rules]]
        name = "tenant"
        key = { all = [
          { header = "x-internal" },
          { if = [{ cookie = "tenant", return = "cookie.tenant" }], else = "parameter.tenant" },
        ] }

        [[rules]]
        name = "cart"
        key = { all = [
          { cookie = "session", absent = true },
          { match = '[?&]cart=([0-9]+)', prefix = "cart:" },
        ] }
        "#,
    );
    let k = |uri: &str, h: &[(&str, &str)]| key(&doc, &request("GET", uri, h));
    assert_eq!(
        k("/?tenant=t1", &[("x-internal", "1")]),
        Some((0, "t1".into()))
    );
    assert_eq!(
        k(
            "/?tenant=t1",
            &[("x-internal", "1"), ("cookie", "tenant=t2")]
        ),
        Some((0, "t2".into()))
    );
    assert_eq!(k("/?cart=12", &[]), Some((1, "cart:12".into())));
    assert_eq!(k("/?cart=12", &[("cookie", "session=s")]), None);
}

/// `RuleSpec` with a `key` serialises under the TOML names (`if`, `else`,
/// `match`, `return`) and back.
#[test]
fn nested_key_round_trips() {
    let s = specs(
        r#"
        [[rules]]
        key = { any = [{ query = "u", return = "parameter.u" }, { if = [{ cookie = "c", absent = true }], else = "request.x" }] }
        "#,
    );
    let json = serde_json::to_string(&s).unwrap();
    assert!(
        json.contains(r#""if":"#) && json.contains(r#""else":"request.x""#),
        "{json}"
    );
    assert!(!json.contains("extract"), "{json}");
    assert_eq!(serde_json::from_str::<Vec<RuleSpec>>(&json).unwrap(), s);
}

/// `n` nested `any` around one header test, as a rule's `key`.
fn nested_any(n: usize) -> ExprSpec {
    let mut e = ExprSpec {
        header: Some("x-user".into()),
        ..ExprSpec::default()
    };
    for _ in 0..n {
        e = ExprSpec {
            any: Some(vec![e]),
            ..ExprSpec::default()
        };
    }
    e
}

#[test]
fn nested_keys_deeper_than_the_bound_are_an_error() {
    let spec = |n| RuleSpec {
        name: Some("deep".into()),
        when: Condition::default(),
        extract: vec![],
        key: Some(nested_any(n)),
    };
    // The key and its test are two levels.
    let ok = Rules::compile(&[spec(MAX_RULE_DEPTH - 1)]).unwrap();
    assert_eq!(
        key(&ok, &request("GET", "/", &[("x-user", "ann")])),
        Some((0, "ann".into()))
    );
    let e = Rules::compile(&[spec(MAX_RULE_DEPTH)]).unwrap_err();
    assert!(
        matches!(e.kind, RuleErrorKind::TooDeep(MAX_RULE_DEPTH)),
        "{e}"
    );
    assert!(
        e.path.starts_with("rules[0].key.any[0].any[0]"),
        "{}",
        e.path
    );
}

#[test]
fn a_deeply_nested_toml_key_is_a_parse_error_not_a_crash() {
    // The TOML parser bounds nesting before the rules see it.
    let n = 5_000;
    let src = format!(
        "[[rules]]\nkey = {}{{ header = \"x\" }}{}\n",
        "{ any = [".repeat(n),
        "] }".repeat(n)
    );
    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct File {
        rules: Vec<RuleSpec>,
    }
    let e = toml::from_str::<File>(&src).unwrap_err().to_string();
    assert!(e.contains("recursion limit"), "{e}");
}

#[test]
fn flat_rule_regexes_share_the_rule_set_budget() {
    let src = r#"
        [[rules]]
        extract = [{ path_regex = '(\w{100})' }]
    "#;
    assert!(
        compile_err(src).starts_with("rules[0].extract[0].path_regex: regex too big"),
        "{}",
        compile_err(src)
    );
}

#[test]
fn tls_and_sni_conditions_match_the_connection_facts() {
    let r = rules(
        r#"
        [[rules]]
        name = "api over https"
        when = { sni = "API.example.com.", tls = true }
        extract = [{ query = "user", prefix = "api:" }]

        [[rules]]
        name = "cleartext"
        when = { tls = false }
        extract = [{ query = "user", prefix = "plain:" }]
        "#,
    );
    let plain = request("GET", "/?user=ann", &[]);
    assert_eq!(key(&r, &plain), Some((1, "plain:ann".into())));
    let api = request("GET", "/?user=ann", &[]).tls(Some("api.EXAMPLE.com"));
    assert_eq!(key(&r, &api), Some((0, "api:ann".into())));
    // TLS without SNI, or with another name: neither rule holds.
    let no_sni = request("GET", "/?user=ann", &[]).tls(None);
    assert_eq!(key(&r, &no_sni), None);
    let other = request("GET", "/?user=ann", &[]).tls(Some("www.example.com"));
    assert_eq!(key(&r, &other), None);
    assert!(
        compile_err("[[rules]]\nwhen = { sni = \"\" }\nextract = [{ query = \"u\" }]")
            .contains("when.sni")
    );
}
