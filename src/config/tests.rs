//! Validation errors name their field; the embedded default is valid.

use std::path::PathBuf;
use std::time::Duration;

use super::*;
use crate::engine::balance::Policy;

mod response_limits;

fn src(text: &str) -> Source {
    Source {
        origin: "test.toml".into(),
        base_dir: PathBuf::from("/etc/peerlb"),
        path: None,
        text: text.into(),
    }
}

fn validate(text: &str, node: &str) -> Result<NodeConfig, ConfigError> {
    let s = src(text);
    s.parse()?.validate(&s, node, &Overrides::default())
}

#[test]
fn embedded_default_is_valid_three_nodes_on_loopback() {
    let s = Source::load(None).unwrap();
    let c = s
        .parse()
        .unwrap()
        .validate(&s, "n2", &Overrides::default())
        .unwrap();
    assert_eq!(c.nodes.len(), 3);
    assert_eq!(&*c.node.id, "n2");
    assert_eq!(c.node.http_addr, "127.0.0.1:8082".parse().unwrap());
    assert_eq!(
        c.routing.policy,
        Policy::from(crate::engine::balance::PolicyKind::ConsistentHash)
    );
    assert_eq!(c.app, AppKind::Builtin);
    assert_eq!(c.ingress.max_request_target, 8192);
    assert_eq!(c.gossip.seeds, vec!["127.0.0.1:7181", "127.0.0.1:7183"]);
    assert_eq!(c.tls.cert, PathBuf::from("./certs/n2.pem"));
    assert!(!c.routing.rules.is_empty());
    let f = s.parse().unwrap();
    assert_eq!(f.sprayer_addr.as_deref(), Some("127.0.0.1:8080"));
}

#[test]
fn unknown_field_is_named() {
    let e = validate("name = \"x\"\nbogus = 1\n", "n1").unwrap_err();
    assert!(matches!(e, ConfigError::Parse { .. }));
    assert!(e.to_string().contains("bogus"), "{e}");
}

const ONE: &str = "[[nodes]]\nid = \"n1\"\nhttp_addr = \"127.0.0.1:1\"\npeer_addr = \"127.0.0.1:2\"\ngossip_addr = \"127.0.0.1:3\"\n";

#[test]
fn gossip_max_members_above_the_default_needs_ids_whose_full_digest_fits_one_datagram() {
    let c = validate(ONE, "n1").unwrap();
    assert_eq!(c.gossip.max_members, 128);
    assert_eq!(c.gossip.sample_window, 1000);
    assert_eq!(c.peer.max_peers, 128);
    // 1,024 members with the 2-byte id `n1` over IPv4: 43 bytes each.
    let c = validate(
        &format!("[gossip]\nmax_members = 1024\nsample_window = 100\n{ONE}"),
        "n1",
    )
    .unwrap();
    assert_eq!(c.gossip.max_members, 1024);
    assert_eq!(c.peer.max_peers, 1024);
    assert_eq!(c.gossip.sample_window, 100);
    // A 40-byte id: 81 bytes a member, too many for 1,024 in a datagram.
    let long = ONE.replace("\"n1\"", &format!("\"{}\"", "n".repeat(40)));
    let e = validate(
        &format!("[gossip]\nmax_members = 1024\n{long}"),
        &"n".repeat(40),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("gossip.max_members") && e.contains("at most 706 members"),
        "{e}"
    );
    // The default fits any ids.
    validate(&long, &"n".repeat(40)).unwrap();
    // gossip.state_signatures: "require" by default, "sign" and "off".
    assert_eq!(
        c.gossip.state_signatures,
        crate::config::StateSignatures::Require
    );
    for (v, want) in [
        ("sign", crate::config::StateSignatures::Sign),
        ("off", crate::config::StateSignatures::Off),
        ("require", crate::config::StateSignatures::Require),
    ] {
        let c = validate(
            &format!("[gossip]\nstate_signatures = \"{v}\"\n{ONE}"),
            "n1",
        )
        .unwrap();
        assert_eq!(c.gossip.state_signatures, want);
    }
    for (gossip, field) in [
        ("max_members = 1", "gossip.max_members"),
        ("max_members = 5000", "gossip.max_members"),
        ("sample_window = 5", "gossip.sample_window"),
        ("sample_window = 1001", "gossip.sample_window"),
        ("state_signatures = \"maybe\"", "gossip.state_signatures"),
    ] {
        let e = validate(&format!("[gossip]\n{gossip}\n{ONE}"), "n1")
            .unwrap_err()
            .to_string();
        assert!(e.contains(field), "{gossip}: {e}");
    }
}

#[test]
fn bad_address_names_the_field_path() {
    let text = format!(
        "{ONE}[[nodes]]\nid = \"n2\"\nhttp_addr = \"127.0.0.1:4\"\npeer_addr = \"nowhere\"\ngossip_addr = \"127.0.0.1:6\"\n"
    );
    let e = validate(&text, "n1").unwrap_err().to_string();
    assert!(e.starts_with("test.toml: nodes[1].peer_addr: "), "{e}");
}

#[test]
fn duplicate_ids_and_addresses_are_refused() {
    let dup = format!("{ONE}{ONE}");
    let e = validate(&dup, "n1").unwrap_err().to_string();
    assert!(e.contains("nodes[1].id"), "{e}");
    let clash = format!(
        "{ONE}[[nodes]]\nid = \"n2\"\nhttp_addr = \"127.0.0.1:4\"\npeer_addr = \"127.0.0.1:2\"\ngossip_addr = \"127.0.0.1:6\"\n"
    );
    let e = validate(&clash, "n1").unwrap_err().to_string();
    assert!(e.contains("nodes[1].peer_addr"), "{e}");
}

#[test]
fn bad_policy_app_vnodes_and_timeouts_are_named() {
    for (text, field) in [
        (format!("policy = \"fastest\"\n{ONE}"), "policy"),
        (format!("app = \"ftp://x\"\n{ONE}"), "app"),
        (format!("[ring]\nvnodes = 0\n{ONE}"), "ring.vnodes"),
        (
            format!("[peer]\nkeep_alive_ms = 2000\nidle_timeout_ms = 1000\n{ONE}"),
            "peer.keep_alive_ms",
        ),
        (format!("[peer]\nprotocol = 4\n{ONE}"), "peer.protocol"),
        (format!("[peer]\ndial = \"lazily\"\n{ONE}"), "peer.dial"),
        (
            format!("[limits]\nresponse_timeout_ms = 0\n{ONE}"),
            "limits.response_timeout_ms",
        ),
        (
            format!("[limits]\nbody_read_timeout_ms = 0\n{ONE}"),
            "limits.body_read_timeout_ms",
        ),
        (
            format!("[peer]\nidle_timeout_ms = 4611686018427387904\n{ONE}"),
            "peer.idle_timeout_ms",
        ),
        (
            format!("[limits]\ndrain_grace_ms = 9223372036854775807\n{ONE}"),
            "limits.drain_grace_ms",
        ),
        (
            format!("[limits]\nstartup_wait_ms = 2592000001\n{ONE}"),
            "limits.startup_wait_ms",
        ),
        (String::new(), "nodes"),
    ] {
        let e = validate(&text, "n1").unwrap_err().to_string();
        assert!(e.contains(&format!(": {field}: ")), "{field}: {e}");
    }
}

#[test]
fn peer_dial_defaults_to_at_sight_and_takes_on_demand() {
    let c = validate(ONE, "n1").unwrap();
    assert!(!c.peer.dial_on_demand);
    let c = validate(&format!("[peer]\ndial = \"on_demand\"\n{ONE}"), "n1").unwrap();
    assert!(c.peer.dial_on_demand);
}

#[test]
fn policies_with_local_affinity_and_balance_ranges() {
    let c = validate(&format!("policy = \"least-load:local\"\n{ONE}"), "n1").unwrap();
    assert_eq!(c.routing.policy.to_string(), "least-load:local");
    for (text, field) in [
        (
            format!("policy = \"consistent-hash:local\"\n{ONE}"),
            "policy",
        ),
        (
            format!("[balance]\nhash_balance_factor = 0.5\n{ONE}"),
            "balance.hash_balance_factor",
        ),
        (
            format!("[balance]\nmetric_history = 1.0\n{ONE}"),
            "balance.metric_history",
        ),
        (
            format!("[balance]\nmetric_capacity = 0\n{ONE}"),
            "balance.metric_capacity",
        ),
        (
            format!("rules_file = \"r.xml\"\n{ONE}[[rules]]\nextract = [{{ query = \"u\" }}]\n"),
            "rules_file",
        ),
    ] {
        let e = validate(&text, "n1").unwrap_err().to_string();
        assert!(e.contains(&format!(": {field}: ")), "{field}: {e}");
    }
    let c = validate(
        &format!("[balance]\nhash_balance_factor = 1.25\n{ONE}"),
        "n1",
    )
    .unwrap();
    assert_eq!(c.routing.router.hash_balance_factor, Some(1.25));
}

#[test]
fn a_missing_rules_file_names_the_file() {
    let e = validate(&format!("rules_file = \"nope.xml\"\n{ONE}"), "n1")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("test.toml: rules_file: /etc/peerlb/nope.xml: "),
        "{e}"
    );
}

#[test]
fn addresses_that_cannot_work_are_refused() {
    let node = |i: u32, http: &str, peer: &str, gossip: &str| {
        format!(
            "[[nodes]]\nid = \"n{i}\"\nhttp_addr = \"{http}\"\npeer_addr = \"{peer}\"\ngossip_addr = \"{gossip}\"\n"
        )
    };
    for (text, field) in [
        (
            node(1, "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:2"),
            "nodes[0].gossip_addr",
        ),
        (
            node(1, "127.0.0.1:1", "127.0.0.1:0", "127.0.0.1:3"),
            "nodes[0].peer_addr",
        ),
        (
            node(1, "127.0.0.1:1", "0.0.0.0:2", "127.0.0.1:3"),
            "nodes[0].peer_addr",
        ),
        (
            node(1, "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")
                + &node(2, "127.0.0.1:4", "127.0.0.1:3", "127.0.0.1:6"),
            "nodes[1].peer_addr",
        ),
        (
            format!("sprayer_addr = \"127.0.0.1:1\"\n{ONE}"),
            "sprayer_addr",
        ),
        (
            ONE.replace(
                "gossip_addr = \"127.0.0.1:3\"",
                "gossip_addr = \"127.0.0.1:3\"\nweight = 0",
            ),
            "nodes",
        ),
    ] {
        let e = validate(&text, "n1").unwrap_err().to_string();
        assert!(e.contains(&format!(": {field}: ")), "{field}: {e}");
    }
}

#[test]
fn bad_rule_is_reported_under_rules() {
    let text = format!("{ONE}[[rules]]\nextract = [{{ path_regex = \"(\" }}]\n");
    let e = validate(&text, "n1").unwrap_err().to_string();
    assert!(
        e.starts_with("test.toml: rules[0].extract[0].path_regex: "),
        "{e}"
    );
}

#[test]
fn unknown_node_needs_all_addresses() {
    let e = validate(ONE, "n9").unwrap_err().to_string();
    assert!(e.contains("--node") && e.contains("n1"), "{e}");
    let s = src(ONE);
    let ov = Overrides {
        http_addr: Some("127.0.0.1:11".into()),
        peer_addr: Some("127.0.0.1:12".into()),
        gossip_addr: Some("127.0.0.1:13".into()),
        weight: Some(50),
        ..Overrides::default()
    };
    let c = s.parse().unwrap().validate(&s, "n9", &ov).unwrap();
    assert_eq!(c.nodes.len(), 2);
    assert_eq!(c.node.weight, 50);
    assert_eq!(c.gossip.seeds, vec!["127.0.0.1:3"]);
}

#[test]
fn overrides_replace_per_node_values() {
    let s = src(ONE);
    let ov = Overrides {
        http_addr: Some("127.0.0.1:9999".into()),
        app: Some("http://127.0.0.1:9000".into()),
        ..Overrides::default()
    };
    let c = s.parse().unwrap().validate(&s, "n1", &ov).unwrap();
    assert_eq!(c.node.http_addr, "127.0.0.1:9999".parse().unwrap());
    assert_eq!(c.nodes[0].http_addr, c.node.http_addr);
    assert!(matches!(c.app, AppKind::Upstream(_)));
    let bad = Overrides {
        gossip_addr: Some("x".into()),
        ..Overrides::default()
    };
    let e = s
        .parse()
        .unwrap()
        .validate(&s, "n1", &bad)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--gossip-addr"), "{e}");
}

#[test]
fn address_flags_keep_the_file_rules() {
    let two = format!(
        "{ONE}[[nodes]]\nid = \"n2\"\nhttp_addr = \"127.0.0.1:4\"\npeer_addr = \"127.0.0.1:5\"\ngossip_addr = \"127.0.0.1:6\"\n"
    );
    let s = src(&two);
    let file = s.parse().unwrap();
    let flag = |http: Option<&str>, peer: Option<&str>, gossip: Option<&str>| Overrides {
        http_addr: http.map(Into::into),
        peer_addr: peer.map(Into::into),
        gossip_addr: gossip.map(Into::into),
        ..Overrides::default()
    };
    for (ov, node, field, says) in [
        (
            flag(Some("127.0.0.1:0"), None, None),
            "n1",
            "--http-addr",
            "port 0",
        ),
        (
            flag(None, Some("0.0.0.0:7"), None),
            "n1",
            "--peer-addr",
            "0.0.0.0",
        ),
        (
            flag(None, None, Some("127.0.0.1:0")),
            "n1",
            "--gossip-addr",
            "port 0",
        ),
        (
            flag(Some("127.0.0.1:4"), None, None),
            "n1",
            "--http-addr",
            "nodes[1]",
        ),
        (
            flag(None, Some("127.0.0.1:3"), None),
            "n1",
            "--peer-addr",
            "peer_addr",
        ),
        (
            flag(None, Some("127.0.0.1:6"), None),
            "n1",
            "--peer-addr",
            "nodes[1]",
        ),
        // A node joining with all three flags gets the same rules.
        (
            flag(
                Some("127.0.0.1:8"),
                Some("127.0.0.1:5"),
                Some("127.0.0.1:9"),
            ),
            "n3",
            "--peer-addr",
            "nodes[1]",
        ),
    ] {
        let e = file.validate(&s, node, &ov).unwrap_err().to_string();
        assert!(
            e.contains(&format!(": {field}: ")) && e.contains(says),
            "{field}: {e}"
        );
    }
    // Values that keep the rules still pass.
    let ok = flag(
        Some("127.0.0.1:7"),
        Some("127.0.0.1:8"),
        Some("127.0.0.1:9"),
    );
    file.validate(&s, "n1", &ok).unwrap();
    file.validate(&s, "n3", &ok).unwrap();
}

#[test]
fn tls_paths_are_relative_to_the_config_file() {
    let c = validate(ONE, "n1").unwrap();
    assert_eq!(c.tls.ca, PathBuf::from("/etc/peerlb/certs/ca.pem"));
    assert_eq!(c.tls.key, PathBuf::from("/etc/peerlb/certs/n1.key"));
}

#[test]
fn the_longest_accepted_durations_build_a_node_config() {
    let max = MAX_DURATION_MS;
    let text = format!(
        "[limits]\nresponse_timeout_ms = {max}\nconnect_timeout_ms = {max}\ndrain_grace_ms = {max}\ndrain_timeout_ms = {max}\nstartup_wait_ms = {max}\nheader_read_timeout_ms = {max}\nbody_read_timeout_ms = {max}\nsend_timeout_ms = {max}\n[gossip]\ninterval_ms = {max}\ndead_node_grace_ms = {max}\n[peer]\nkeep_alive_ms = {}\nidle_timeout_ms = {max}\n{ONE}",
        max - 1
    );
    let c = validate(&text, "n1").unwrap();
    assert_eq!(c.peer.idle_timeout, std::time::Duration::from_millis(max));
    // A deadline this far out neither overflows a tokio timer nor QUIC's
    // idle-timeout varint.
    let _ = tokio::time::Instant::now() + c.peer.idle_timeout;
    assert!(quinn::IdleTimeout::try_from(c.peer.idle_timeout * 3).is_ok());
}

#[test]
fn the_sticky_cookie_is_configured_and_checked() {
    let c = validate(
        &format!("[sticky]\ncookie = \"lb\"\ncookie_path = \"/app\"\ncookie_same_site = \"none\"\ncookie_secure = true\n{ONE}"),
        "n1",
    )
    .unwrap();
    assert_eq!(
        c.ingress.route_cookie,
        crate::engine::RouteCookie {
            name: "lb".into(),
            path: "/app".into(),
            same_site: crate::engine::SameSite::None,
            secure: true,
        }
    );
    assert_eq!(
        validate(ONE, "n1").unwrap().ingress.route_cookie,
        crate::engine::RouteCookie::default()
    );
    for (text, field) in [
        ("cookie = \"a b\"", "sticky.cookie"),
        ("cookie = \"\"", "sticky.cookie"),
        ("cookie = \"a;b\"", "sticky.cookie"),
        ("cookie_path = \"app\"", "sticky.cookie_path"),
        ("cookie_path = \"/a;Domain=x\"", "sticky.cookie_path"),
        ("cookie_same_site = \"loose\"", "sticky.cookie_same_site"),
        ("cookie_same_site = \"None\"", "sticky.cookie_same_site"),
    ] {
        let e = validate(&format!("[sticky]\n{text}\n{ONE}"), "n1")
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!(": {field}: ")), "{text}: {e}");
    }
}

#[test]
fn admin_addr_defaults_to_loopback_client_port_plus_1000() {
    let c = validate(ONE, "n1").unwrap();
    assert_eq!(c.node.admin_addr, "127.0.0.1:1001".parse().unwrap());
    // Another machine's node keeps a loopback admin address too.
    let text = "[[nodes]]\nid = \"n1\"\nhttp_addr = \"198.51.100.11:8080\"\npeer_addr = \"198.51.100.11:7080\"\ngossip_addr = \"198.51.100.11:7180\"\n\
                [[nodes]]\nid = \"n2\"\nhttp_addr = \"198.51.100.12:8080\"\npeer_addr = \"198.51.100.12:7080\"\ngossip_addr = \"198.51.100.12:7180\"\n";
    let c = validate(text, "n2").unwrap();
    assert_eq!(c.node.admin_addr, "127.0.0.1:9080".parse().unwrap());
    assert_eq!(c.nodes[0].admin_addr, "127.0.0.1:9080".parse().unwrap());
    // A client port past 64535 has no default: the field is asked for.
    let high = ONE.replace("127.0.0.1:1\"", "127.0.0.1:65000\"");
    let e = validate(&high, "n1").unwrap_err().to_string();
    assert!(
        e.contains("nodes[0].admin_addr") && e.contains("give admin_addr"),
        "{e}"
    );
    // Given: taken as is.
    let given = format!("{ONE}admin_addr = \"10.0.0.1:9999\"\n");
    let c = validate(&given, "n1").unwrap();
    assert_eq!(c.node.admin_addr, "10.0.0.1:9999".parse().unwrap());
}

#[test]
fn admin_addr_clashes_name_the_field() {
    let two = |a1: &str, a2: &str| {
        format!(
            "{ONE}admin_addr = \"{a1}\"\n[[nodes]]\nid = \"n2\"\nhttp_addr = \"127.0.0.1:4\"\npeer_addr = \"127.0.0.1:5\"\ngossip_addr = \"127.0.0.1:6\"\nadmin_addr = \"{a2}\"\n"
        )
    };
    for (text, says) in [
        (
            two("127.0.0.1:1", "127.0.0.1:9"),
            "nodes[0].admin_addr: 127.0.0.1:1 is also this node's http_addr",
        ),
        (
            two("127.0.0.1:9", "127.0.0.1:9"),
            "nodes[1].admin_addr: 127.0.0.1:9 is also used by nodes[0]",
        ),
        (
            two("127.0.0.1:4", "127.0.0.1:9"),
            "nodes[1].http_addr: 127.0.0.1:4 is also nodes[0].admin_addr",
        ),
        (
            two("127.0.0.1:9", "127.0.0.1:1"),
            "nodes[1].admin_addr: 127.0.0.1:1 is also used by nodes[0]",
        ),
        (
            two("127.0.0.1:0", "127.0.0.1:9"),
            "nodes[0].admin_addr: 127.0.0.1:0: port 0",
        ),
        (
            two("nowhere", "127.0.0.1:9"),
            "nodes[0].admin_addr: \"nowhere\"",
        ),
        (
            format!(
                "sprayer_addr = \"127.0.0.1:9\"\n{}",
                two("127.0.0.1:8", "127.0.0.1:9")
            ),
            "sprayer_addr: 127.0.0.1:9 is also nodes[1].admin_addr",
        ),
    ] {
        let e = validate(&text, "n1").unwrap_err().to_string();
        assert!(e.contains(says), "{e}\nwanted {says}");
    }
    // The flag is named when the clash comes from it.
    let s = src(&two("127.0.0.1:8", "127.0.0.1:9"));
    let ov = Overrides {
        admin_addr: Some("127.0.0.1:9".into()),
        ..Overrides::default()
    };
    let e = s
        .parse()
        .unwrap()
        .validate(&s, "n1", &ov)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--admin-addr"), "{e}");
    let ov = Overrides {
        shared_listen: Some("127.0.0.1:8".into()),
        ..Overrides::default()
    };
    let e = s
        .parse()
        .unwrap()
        .validate(&s, "n1", &ov)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--shared-listen") && e.contains("admin_addr"),
        "{e}"
    );
}

#[test]
fn slow_start_is_off_by_default_and_its_ramp_is_validated() {
    let c = validate(ONE, "n1").unwrap();
    assert!(c.routing.slow_start.is_off());
    let c = validate(
        &format!("[balance]\nslow_start_ms = 30000\nslow_start_steps = 5\n{ONE}"),
        "n1",
    )
    .unwrap();
    assert_eq!(
        c.routing.slow_start,
        crate::SlowStart::new(std::time::Duration::from_secs(30), 5)
    );
    for (text, field) in [
        (
            format!("[balance]\nslow_start_ms = 3600001\n{ONE}"),
            "balance.slow_start_ms",
        ),
        (
            format!("[balance]\nslow_start_steps = 0\n{ONE}"),
            "balance.slow_start_steps",
        ),
        (
            format!("[balance]\nslow_start_steps = 101\n{ONE}"),
            "balance.slow_start_steps",
        ),
    ] {
        let e = validate(&text, "n1").unwrap_err().to_string();
        assert!(e.contains(field), "{field}: {e}");
    }
}

#[test]
fn http2_and_websocket_limits_are_read_and_checked() {
    let c = validate(ONE, "n1").unwrap();
    assert_eq!(c.ingress.h2_max_concurrent_streams, 100);
    assert_eq!(
        c.ingress.websocket_idle_timeout,
        std::time::Duration::from_secs(300)
    );
    let c = validate(
        &format!(
            "[limits]\nh2_max_concurrent_streams = 7\nwebsocket_idle_timeout_ms = 1500\n{ONE}"
        ),
        "n1",
    )
    .unwrap();
    assert_eq!(c.ingress.h2_max_concurrent_streams, 7);
    assert_eq!(
        c.ingress.websocket_idle_timeout,
        std::time::Duration::from_millis(1500)
    );
    for (bad, field) in [
        (
            "h2_max_concurrent_streams = 0",
            "limits.h2_max_concurrent_streams",
        ),
        (
            "h2_max_concurrent_streams = 10001",
            "limits.h2_max_concurrent_streams",
        ),
        (
            "websocket_idle_timeout_ms = 0",
            "limits.websocket_idle_timeout_ms",
        ),
    ] {
        match validate(&format!("[limits]\n{bad}\n{ONE}"), "n1") {
            Err(ConfigError::Invalid { field: f, .. }) => assert_eq!(f, field, "{bad}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
}

mod bind;
mod listeners;
