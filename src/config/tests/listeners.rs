//! The client listeners, the SIP addresses and the metrics address: paths
//! resolved, the shared listener's defaults, clashes and bad values named
//! by field.

use super::*;

#[test]
fn listener_settings_resolve_paths_and_the_shared_listener_follows_by_default() {
    let text = format!(
        "[listener]\nproxy_protocol = true\nproxy_protocol_timeout_ms = 700\n[listener.tls]\ncert = \"tls/site.pem\"\nkey = \"/abs/site.key\"\nsni = [{{ cert = \"a.pem\", key = \"a.key\" }}]\n{ONE}"
    );
    let c = validate(&text, "n1").unwrap();
    assert_eq!(c.listener.proxy_protocol, Some(Duration::from_millis(700)));
    let tls = c.listener.tls.clone().unwrap();
    assert_eq!(tls.reload_interval, Duration::from_secs(5));
    assert_eq!(tls.certs.len(), 2);
    assert_eq!(tls.certs[0].cert, PathBuf::from("/etc/peerlb/tls/site.pem"));
    assert_eq!(tls.certs[0].key, PathBuf::from("/abs/site.key"));
    assert_eq!(tls.certs[0].field, "listener.tls");
    assert_eq!(tls.certs[1].field, "listener.tls.sni[0]");
    assert_eq!(c.shared_listener, c.listener);

    // A [shared_listener] of its own; no PROXY header by default.
    let text = format!("[shared_listener]\nproxy_protocol = true\n{ONE}");
    let c = validate(&text, "n1").unwrap();
    assert_eq!(c.listener, ListenerSettings::default());
    assert_eq!(
        c.shared_listener.proxy_protocol,
        Some(Duration::from_secs(5))
    );

    // --tls-cert replaces the default certificate on every listener.
    let s = src(ONE);
    let ov = Overrides {
        tls_cert: Some(("/c.pem".into(), "/c.key".into())),
        ..Overrides::default()
    };
    let c = s.parse().unwrap().validate(&s, "n1", &ov).unwrap();
    let tls = c.shared_listener.tls.unwrap();
    assert_eq!(tls.certs[0].cert, PathBuf::from("/c.pem"));
    assert_eq!(tls.certs[0].field, "--tls-cert");
}

#[test]
fn bad_listener_values_name_the_field() {
    for (section, field) in [
        (
            "[listener]\nproxy_protocol_timeout_ms = 0\n",
            "listener.proxy_protocol_timeout_ms",
        ),
        (
            "[shared_listener]\nproxy_protocol_timeout_ms = 0\n",
            "shared_listener.proxy_protocol_timeout_ms",
        ),
        (
            "[listener.tls]\ncert = \"\"\nkey = \"k\"\n",
            "listener.tls.cert",
        ),
        (
            "[listener.tls]\ncert = \"c\"\nkey = \"k\"\nsni = [{ cert = \"c\", key = \"\" }]\n",
            "listener.tls.sni[0].key",
        ),
        ("[listener.tls]\ncert = \"c\"\n", "key"),
    ] {
        let e = validate(&format!("{section}{ONE}"), "n1")
            .unwrap_err()
            .to_string();
        assert!(e.contains(field), "{field}: {e}");
    }
}

#[test]
fn sip_addr_is_optional_and_its_clashes_name_the_field() {
    let c = validate(ONE, "n1").unwrap();
    assert_eq!(c.node.sip_addr, None);
    let given = format!("{ONE}sip_addr = \"127.0.0.1:5060\"\n");
    let c = validate(&given, "n1").unwrap();
    assert_eq!(c.node.sip_addr, Some("127.0.0.1:5060".parse().unwrap()));
    let two = |s1: &str, s2: &str| {
        format!(
            "{ONE}sip_addr = \"{s1}\"\n[[nodes]]\nid = \"n2\"\nhttp_addr = \"127.0.0.1:4\"\npeer_addr = \"127.0.0.1:5\"\ngossip_addr = \"127.0.0.1:6\"\nsip_addr = \"{s2}\"\n"
        )
    };
    for (text, says) in [
        (
            two("127.0.0.1:2", "127.0.0.1:9"),
            "nodes[0].sip_addr: 127.0.0.1:2 is also this node's peer_addr",
        ),
        (
            two("127.0.0.1:1", "127.0.0.1:9"),
            "nodes[0].sip_addr: 127.0.0.1:1 is also this node's http_addr",
        ),
        (
            two("127.0.0.1:9", "127.0.0.1:9"),
            "nodes[1].sip_addr: 127.0.0.1:9 is also used by nodes[0]",
        ),
        (
            two("127.0.0.1:5", "127.0.0.1:9"),
            "nodes[1].peer_addr: 127.0.0.1:5 is also nodes[0].sip_addr",
        ),
        (
            two("127.0.0.1:0", "127.0.0.1:9"),
            "nodes[0].sip_addr: 127.0.0.1:0: port 0",
        ),
        (
            two("nowhere", "127.0.0.1:9"),
            "nodes[0].sip_addr: \"nowhere\"",
        ),
    ] {
        let e = validate(&text, "n1").unwrap_err().to_string();
        assert!(e.contains(says), "{e}\nwanted {says}");
    }
}

/// `sip_sprayer_addr` is checked with the file; `--shared-sip-listen`
/// (what `peerlb up` passes it as) lands in `shared_sip_listen` of a node
/// with a `sip_addr`, and is refused naming the flag otherwise.
#[test]
fn the_shared_sip_address_is_validated_and_reaches_the_node_config() {
    let sip_one = ONE.replace(
        "gossip_addr = \"127.0.0.1:3\"",
        "gossip_addr = \"127.0.0.1:3\"\nsip_addr = \"127.0.0.1:5061\"",
    );
    let flag = |addr: &str| Overrides {
        shared_sip_listen: Some(addr.into()),
        ..Overrides::default()
    };
    let with = |text: &str, ov: &Overrides| {
        let s = src(text);
        s.parse().unwrap().validate(&s, "n1", ov)
    };
    let c = with(
        &format!("sip_sprayer_addr = \"127.0.0.1:5060\"\n{sip_one}"),
        &flag("127.0.0.1:5060"),
    )
    .unwrap();
    assert_eq!(c.shared_sip_listen, Some("127.0.0.1:5060".parse().unwrap()));
    assert_eq!(
        with(&sip_one, &Overrides::default())
            .unwrap()
            .shared_sip_listen,
        None
    );
    for (text, ov, field) in [
        (
            format!("sip_sprayer_addr = \"127.0.0.1:1\"\n{sip_one}"),
            Overrides::default(),
            "sip_sprayer_addr",
        ),
        (
            format!("sip_sprayer_addr = \"[::]:5060\"\n{sip_one}"),
            Overrides::default(),
            "sip_sprayer_addr",
        ),
        (
            format!("sip_sprayer_addr = \"127.0.0.1:5060\"\n{ONE}"),
            Overrides::default(),
            "sip_sprayer_addr",
        ),
        (
            ONE.to_owned(),
            flag("127.0.0.1:5060"),
            "--shared-sip-listen",
        ),
        (
            sip_one.clone(),
            flag("127.0.0.1:5061"),
            "--shared-sip-listen",
        ),
        (sip_one.clone(), flag("127.0.0.1:0"), "--shared-sip-listen"),
    ] {
        match with(&text, &ov) {
            Err(ConfigError::Invalid { field: f, .. }) => assert_eq!(f, field, "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
}

#[test]
fn metrics_addr_is_optional_and_its_clashes_name_the_field() {
    let c = validate(ONE, "n1").unwrap();
    assert_eq!(c.node.metrics_addr, None);
    let c = validate(&format!("{ONE}metrics_addr = \"127.0.0.1:9100\"\n"), "n1").unwrap();
    assert_eq!(c.node.metrics_addr, Some("127.0.0.1:9100".parse().unwrap()));
    let two = |m1: &str, m2: &str| {
        format!(
            "{ONE}admin_addr = \"127.0.0.1:8\"\nmetrics_addr = \"{m1}\"\n[[nodes]]\nid = \"n2\"\nhttp_addr = \"127.0.0.1:4\"\npeer_addr = \"127.0.0.1:5\"\ngossip_addr = \"127.0.0.1:6\"\nadmin_addr = \"127.0.0.1:9\"\nmetrics_addr = \"{m2}\"\n"
        )
    };
    for (text, says) in [
        (
            two("127.0.0.1:1", "127.0.0.1:10"),
            "nodes[0].metrics_addr: 127.0.0.1:1 is also this node's http_addr",
        ),
        (
            two("127.0.0.1:8", "127.0.0.1:10"),
            "nodes[0].metrics_addr: 127.0.0.1:8 is also this node's admin_addr",
        ),
        (
            two("127.0.0.1:10", "127.0.0.1:10"),
            "nodes[1].metrics_addr: 127.0.0.1:10 is also used by nodes[0]",
        ),
        (
            two("127.0.0.1:9", "127.0.0.1:10"),
            "nodes[1].admin_addr: 127.0.0.1:9 is also nodes[0].metrics_addr",
        ),
        (
            two("127.0.0.1:0", "127.0.0.1:10"),
            "nodes[0].metrics_addr: 127.0.0.1:0: port 0",
        ),
        (
            two("nowhere", "127.0.0.1:10"),
            "nodes[0].metrics_addr: \"nowhere\"",
        ),
    ] {
        let e = validate(&text, "n1").unwrap_err().to_string();
        assert!(e.contains(says), "{e}\nwanted {says}");
    }
}
