//! Bind and advertise addresses apart (`http_bind`, `peer_bind`,
//! `gossip_bind`, `--bind`): any IP may be bound, `0.0.0.0` included; the
//! advertised `*_addr` must be an address peers reach; errors name the
//! field or flag.

use super::{ONE, src, validate};
use crate::config::{BindAddrs, Overrides};

fn with(extra: &str) -> String {
    ONE.replace(
        "gossip_addr = \"127.0.0.1:3\"\n",
        &format!("gossip_addr = \"127.0.0.1:3\"\n{extra}"),
    )
}

#[test]
fn without_bind_fields_a_node_binds_its_advertised_addresses() {
    let c = validate(ONE, "n1").unwrap();
    assert_eq!(
        c.bind,
        BindAddrs {
            http: c.node.http_addr,
            peer: c.node.peer_addr,
            gossip: c.node.gossip_addr,
        }
    );
}

#[test]
fn bind_fields_take_an_ip_alone_with_the_advertised_port_or_a_full_address() {
    let c = validate(
        &with("http_bind = \"0.0.0.0\"\npeer_bind = \"0.0.0.0:7000\"\ngossip_bind = \"[::]\"\n"),
        "n1",
    )
    .unwrap();
    assert_eq!(c.bind.http, "0.0.0.0:1".parse().unwrap());
    assert_eq!(c.bind.peer, "0.0.0.0:7000".parse().unwrap());
    assert_eq!(c.bind.gossip, "[::]:3".parse().unwrap());
    // What peers are told does not change.
    assert_eq!(c.node.peer_addr, "127.0.0.1:2".parse().unwrap());
    assert_eq!(c.nodes[0].gossip_addr, "127.0.0.1:3".parse().unwrap());
}

#[test]
fn the_unspecified_address_is_refused_for_every_advertised_address_naming_its_bind_field() {
    for (field, bind) in [
        ("http_addr", "http_bind"),
        ("peer_addr", "peer_bind"),
        ("gossip_addr", "gossip_bind"),
    ] {
        let text = ONE.replace(
            &format!("{field} = \"127.0.0.1:"),
            &format!("{field} = \"0.0.0.0:"),
        );
        let e = validate(&text, "n1").unwrap_err().to_string();
        assert!(
            e.contains(&format!(": nodes[0].{field}: 0.0.0.0:"))
                && e.contains(&format!("{bind} = \"0.0.0.0\"")),
            "{e}"
        );
    }
}

#[test]
fn bad_bind_values_are_named_by_their_field() {
    for (extra, field, says) in [
        ("peer_bind = \"here\"\n", "nodes[0].peer_bind", "neither"),
        (
            "http_bind = \"0.0.0.0:0\"\n",
            "nodes[0].http_bind",
            "port 0",
        ),
        // Both UDP sockets on port 2 of every address.
        (
            "gossip_bind = \"0.0.0.0:2\"\n",
            "nodes[0].gossip_bind",
            "both are UDP",
        ),
        // The client listener over the admin listener (127.0.0.1:1001).
        (
            "http_bind = \"0.0.0.0:1001\"\n",
            "nodes[0].http_bind",
            "admin_addr",
        ),
    ] {
        let e = validate(&with(extra), "n1").unwrap_err().to_string();
        assert!(
            e.contains(&format!(": {field}: ")) && e.contains(says),
            "{extra}: {e}"
        );
    }
}

#[test]
fn bind_flags_beat_the_bind_ip_which_beats_the_file() {
    let s = src(&with("peer_bind = \"127.0.0.9\"\n"));
    let file = s.parse().unwrap();
    let c = file
        .validate(
            &s,
            "n1",
            &Overrides {
                bind: Some("0.0.0.0".into()),
                gossip_bind: Some("127.0.0.1:7946".into()),
                ..Overrides::default()
            },
        )
        .unwrap();
    assert_eq!(c.bind.http, "0.0.0.0:1".parse().unwrap());
    assert_eq!(c.bind.peer, "0.0.0.0:2".parse().unwrap());
    assert_eq!(c.bind.gossip, "127.0.0.1:7946".parse().unwrap());
    let c = file.validate(&s, "n1", &Overrides::default()).unwrap();
    assert_eq!(c.bind.peer, "127.0.0.9:2".parse().unwrap());
    // An IP alone follows the advertised port a flag moved.
    let c = file
        .validate(
            &s,
            "n1",
            &Overrides {
                peer_addr: Some("10.1.2.3:7000".into()),
                ..Overrides::default()
            },
        )
        .unwrap();
    assert_eq!(c.bind.peer, "127.0.0.9:7000".parse().unwrap());
    assert_eq!(c.node.peer_addr, "10.1.2.3:7000".parse().unwrap());
    for (ov, flag) in [
        (
            Overrides {
                bind: Some("0.0.0.0:1".into()),
                ..Overrides::default()
            },
            "--bind",
        ),
        (
            Overrides {
                peer_bind: Some("nowhere".into()),
                ..Overrides::default()
            },
            "--peer-bind",
        ),
        (
            Overrides {
                peer_bind: Some("0.0.0.0:3".into()),
                ..Overrides::default()
            },
            "--peer-bind",
        ),
    ] {
        let e = file.validate(&s, "n1", &ov).unwrap_err().to_string();
        assert!(e.contains(&format!(": {flag}: ")), "{flag}: {e}");
    }
}

#[test]
fn two_nodes_on_one_http_addr_are_a_clash_of_http_addr_not_of_the_admin_addr_it_defaults() {
    let text = format!(
        "{ONE}[[nodes]]\nid = \"n2\"\nhttp_addr = \"127.0.0.1:1\"\npeer_addr = \"127.0.0.1:5\"\ngossip_addr = \"127.0.0.1:6\"\n"
    );
    let e = validate(&text, "n1").unwrap_err().to_string();
    assert!(
        e.contains(": nodes[1].http_addr: 127.0.0.1:1 is also used by nodes[0]"),
        "{e}"
    );
}
