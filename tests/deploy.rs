//! The deployment files under `deploy/`, each checked by the tool that
//! reads it where this machine has one (`.ci/run` installs them):
//! `systemd-analyze verify` for the unit, `haproxy -c` for the HAProxy
//! sprayer, `keepalived -t` for the IPVS sprayer, `kubernetes-validate`
//! (PyPI; Kubernetes' schemas, offline) and a YAML parse (python3-yaml)
//! of the Kubernetes manifests with the cluster.toml they embed validated
//! by peerlb itself, and a parse of the Dockerfile's instructions (no
//! Docker daemon here: the image build is not exercised). Then the
//! containers themselves, run as the files say (root, `ip`, `setpriv`,
//! `curl`): a pod of the StatefulSet (its two containers in a network
//! namespace of the pod's, as its non-root uid and gid with no other
//! group, its volumes with the modes and group the kubelet gives them,
//! its environment and arguments), and the Dockerfile's `docker run`
//! example as printed (the image's user, environment and entry point, the
//! example's mounts, variables and arguments). A missing tool skips its
//! test with a `SKIPPED` line, unless CI or `PEERLB_REQUIRE_DEPLOY_TOOLS`
//! is set (tests/support/skip.rs).

// Black-box tests of files and tools: no simulated time here.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

#[path = "deploy/run.rs"]
mod run;
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use run::*;
use support::*;

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(deploy(path)).unwrap_or_else(|e| panic!("deploy/{path}: {e}"))
}

/// The tool `name`, or `None` (after saying so) when it is missing and the
/// run does not require it.
fn tool(name: &str, install: &str) -> Option<PathBuf> {
    support::skip::tool(&[name], "PEERLB_REQUIRE_DEPLOY_TOOLS", install)
}

/// The default drain time of a node, in whole seconds rounded up:
/// `drain_grace_ms + drain_timeout_ms` (what a stop timeout must cover).
fn default_drain_s() -> u64 {
    let l = peerlb::config::LimitsSection::default();
    (l.drain_grace_ms + l.drain_timeout_ms).div_ceil(1000)
}

/// `key=value` of a unit file's first `key=` line.
fn unit_value<'a>(unit: &'a str, key: &str) -> Option<&'a str> {
    unit.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
}

#[test]
fn the_systemd_unit_verifies_and_covers_the_drain() {
    let unit = read("systemd/peerlb.service");
    let stop: u64 = unit_value(&unit, "TimeoutStopSec")
        .expect("TimeoutStopSec")
        .parse()
        .expect("whole seconds");
    assert!(
        stop > default_drain_s(),
        "{stop} s <= the drain's {} s",
        default_drain_s()
    );
    let nofile: u64 = unit_value(&unit, "LimitNOFILE").unwrap().parse().unwrap();
    assert!(nofile >= 65_536, "{nofile}");
    assert_eq!(unit_value(&unit, "KillSignal"), Some("SIGTERM"));
    assert_eq!(unit_value(&unit, "RestartPreventExitStatus"), Some("64"));
    let Some(analyze) = tool("systemd-analyze", "apt-get install -y systemd") else {
        return;
    };
    // verify checks that ExecStart exists: point it at the binary built
    // for this test run.
    let dir = temp_dir("deploy-systemd");
    let path = write(
        &dir,
        "peerlb.service",
        &unit.replace("/usr/local/bin/peerlb", bin()),
    );
    let out = Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // It exits 0 after some errors (a bad time value is "ignored"): any
    // line about the unit is a failure.
    let about_unit: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("peerlb.service"))
        .collect();
    assert!(
        out.status.success() && about_unit.is_empty(),
        "systemd-analyze verify: {stderr}"
    );
    // The check catches a broken unit.
    let broken = write(
        &dir,
        "broken.service",
        &unit.replace("TimeoutStopSec=35", "TimeoutStopSec=soon"),
    );
    let out = Command::new(which("systemd-analyze").unwrap())
        .arg("verify")
        .arg(&broken)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("broken.service"),
        "a broken unit went unnoticed"
    );
}

/// `path` checked by `haproxy -c`: true when valid.
fn haproxy_accepts(haproxy: &Path, path: &Path) -> bool {
    Command::new(haproxy)
        .arg("-c")
        .arg("-f")
        .arg(path)
        .output()
        .unwrap()
        .status
        .success()
}

#[test]
fn the_haproxy_sprayer_config_is_valid_and_is_the_documented_one() {
    let cfg = read("haproxy/haproxy.cfg");
    assert!(cfg.contains("option httpchk") && cfg.contains("uri /_peerlb/health"));
    // docs/operations.md shows the same configuration (the file without
    // its leading comment).
    let body: String = cfg
        .lines()
        .skip_while(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .unwrap();
    let block = doc
        .split_once("HAProxy in TCP mode")
        .and_then(|(_, rest)| rest.split("```").nth(1))
        .expect("the HAProxy example in docs/operations.md");
    assert_eq!(
        block.trim_start_matches('\n'),
        body,
        "docs/operations.md and deploy/haproxy/haproxy.cfg differ"
    );
    let Some(haproxy) = tool("haproxy", "apt-get install -y haproxy") else {
        return;
    };
    assert!(haproxy_accepts(&haproxy, &deploy("haproxy/haproxy.cfg")));
    let dir = temp_dir("deploy-haproxy");
    let broken = write(
        &dir,
        "broken.cfg",
        &cfg.replace("balance roundrobin", "balance nonsense"),
    );
    assert!(
        !haproxy_accepts(&haproxy, &broken),
        "a broken config went unnoticed"
    );
}

/// `keepalived -t` of `path`: its complaints (empty: valid).
fn keepalived_complaints(keepalived: &Path, path: &Path) -> String {
    assert!(path.exists(), "{}", path.display());
    let out = Command::new(keepalived)
        .arg("-t")
        .arg("-f")
        .arg(path)
        .output()
        .unwrap();
    let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
    text += &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        text += &format!("\nexit {}", out.status);
    }
    text
}

#[test]
fn the_keepalived_ipvs_config_checks_each_node_health() {
    let cfg = read("keepalived/keepalived.conf");
    let servers = cfg.matches("real_server ").count();
    assert_eq!(servers, 3);
    assert_eq!(cfg.matches("path /_peerlb/health").count(), servers);
    let Some(keepalived) = tool("keepalived", "apt-get install -y keepalived") else {
        return;
    };
    let complaints = keepalived_complaints(&keepalived, &deploy("keepalived/keepalived.conf"));
    assert!(complaints.trim().is_empty(), "keepalived -t: {complaints}");
    let dir = temp_dir("deploy-keepalived");
    let broken = write(
        &dir,
        "broken.conf",
        &cfg.replace("lb_algo rr", "lb_algo nonsense"),
    );
    assert!(
        !keepalived_complaints(&keepalived, &broken)
            .trim()
            .is_empty(),
        "a broken config went unnoticed"
    );
}

/// The documents of a YAML file as JSON values (python3 with PyYAML).
fn yaml_documents(python: &Path, path: &Path) -> Vec<serde_json::Value> {
    let out = Command::new(python)
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_kubernetes_manifests_parse_and_their_cluster_file_is_valid() {
    let Some(python) = tool("python3", "apt-get install -y python3-yaml") else {
        return;
    };
    let docs = yaml_documents(&python, &deploy("kubernetes/peerlb.yaml"));
    let of_kind = |kind: &str| -> Vec<&serde_json::Value> {
        docs.iter().filter(|d| d["kind"] == kind).collect()
    };
    let services = of_kind("Service");
    let headless = services
        .iter()
        .find(|s| s["spec"]["clusterIP"] == "None")
        .expect("a headless Service");
    let sprayer = services
        .iter()
        .find(|s| s["spec"]["type"] == "LoadBalancer" || s["spec"]["type"] == "NodePort")
        .expect("a LoadBalancer or NodePort Service");
    let set = of_kind("StatefulSet")[0];
    let pdb = of_kind("PodDisruptionBudget")[0];
    let config = of_kind("ConfigMap")[0]["data"]["cluster.toml"]
        .as_str()
        .expect("cluster.toml in the ConfigMap");
    let ns = set["metadata"]["namespace"].as_str().unwrap();
    assert_eq!(set["spec"]["serviceName"], headless["metadata"]["name"]);
    let labels = &set["spec"]["template"]["metadata"]["labels"];
    for selector in [
        &headless["spec"]["selector"],
        &sprayer["spec"]["selector"],
        &pdb["spec"]["selector"]["matchLabels"],
        &set["spec"]["selector"]["matchLabels"],
    ] {
        assert_eq!(selector, labels);
    }
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    let pod = &set["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(
        container["readinessProbe"]["httpGet"]["path"],
        "/_peerlb/health"
    );
    let ports = container["ports"].as_array().unwrap();
    assert_eq!(
        container["readinessProbe"]["httpGet"]["port"],
        sprayer["spec"]["ports"][0]["targetPort"]
    );
    let env = |name: &str| -> String {
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
            .unwrap_or_else(|| panic!("env {name}"))
            .to_owned()
    };
    let port_of = |name: &str| {
        ports
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("port {name}"))
    };
    // The embedded cluster file is valid for a pod: node peerlb-0 on its
    // pod IP, with the addresses the pod's environment gives it.
    let pod_ip = "10.1.2.3";
    let addr = |var: &str| env(var).replace("$(POD_IP)", pod_ip);
    let dir = temp_dir("deploy-k8s");
    let path = write(&dir, "cluster.toml", config);
    let src = peerlb::Source::load(Some(&path)).unwrap();
    let file = src.parse().unwrap_or_else(|e| panic!("{e}"));
    let mut overrides = peerlb::Overrides::default();
    overrides.http_addr = Some(addr("PEERLB_HTTP_ADDR"));
    overrides.peer_addr = Some(addr("PEERLB_PEER_ADDR"));
    overrides.gossip_addr = Some(addr("PEERLB_GOSSIP_ADDR"));
    overrides.admin_addr = Some(addr("PEERLB_ADMIN_ADDR"));
    overrides.bind = Some(env("PEERLB_BIND"));
    let c = file
        .validate(&src, "peerlb-0", &overrides)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.node.http_addr.port() as u64, port_of("http"));
    assert_eq!(c.node.peer_addr.port() as u64, port_of("peer"));
    assert_eq!(c.node.gossip_addr.port() as u64, port_of("gossip"));
    assert_eq!(c.node.admin_addr.port() as u64, port_of("metrics"));
    assert_eq!(env("PEERLB_NODE"), "$(POD_NAME)");
    // Bound on the pod's interfaces, advertised on its IP.
    assert_eq!(
        c.bind.peer,
        format!("0.0.0.0:{}", port_of("peer")).parse().unwrap()
    );
    assert_eq!(
        c.bind.gossip,
        format!("0.0.0.0:{}", port_of("gossip")).parse().unwrap()
    );
    assert_eq!(c.node.peer_addr.ip().to_string(), pod_ip);
    // Prometheus scrapes the metrics path on the port named `metrics`.
    let metrics = services
        .iter()
        .find(|s| s["spec"]["ports"][0]["targetPort"] == "metrics")
        .expect("a Service for the metrics port");
    assert_eq!(
        metrics["metadata"]["annotations"]["prometheus.io/path"],
        "/_peerlb/metrics"
    );
    assert_eq!(
        metrics["metadata"]["annotations"]["prometheus.io/port"],
        port_of("metrics").to_string()
    );
    // The pinned release, in both containers; the app is the second one,
    // where `app` points.
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 2, "the node and its app");
    for k in containers {
        assert_eq!(
            k["image"],
            format!("peerlb:{}", env!("CARGO_PKG_VERSION")),
            "{}",
            k["name"]
        );
    }
    let app_args: Vec<&str> = containers[1]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let listen = app_args[app_args.iter().position(|a| *a == "--listen").unwrap() + 1];
    let peerlb::config::AppKind::Upstream(up) = &c.app else {
        panic!("an upstream app: {:?}", c.app);
    };
    assert_eq!(
        up.addr,
        peerlb::config::AppAddr::Http(format!("http://{listen}").parse().unwrap())
    );
    assert_eq!(
        up.idle_timeout,
        std::time::Duration::from_millis(
            peerlb::config::LimitsSection::default().upstream_idle_timeout_ms
        )
    );
    // Non-root, and the volumes readable by its group.
    let sc = &pod["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_ne!(sc["runAsUser"], 0);
    assert_eq!(sc["fsGroup"], sc["runAsGroup"]);
    // Every node the file lists is a pod of the set, and every seed is a
    // pod's name under the headless Service.
    let replicas = set["spec"]["replicas"].as_u64().unwrap() as usize;
    let ids: Vec<String> = c.nodes.iter().map(|n| n.id.to_string()).collect();
    let pods: Vec<String> = (0..replicas).map(|i| format!("peerlb-{i}")).collect();
    assert_eq!(ids, pods);
    let svc = headless["metadata"]["name"].as_str().unwrap();
    let seeds: Vec<String> = pods
        .iter()
        .map(|p| format!("{p}.{svc}.{ns}.svc.cluster.local:{}", port_of("gossip")))
        .collect();
    assert_eq!(c.gossip.seeds, seeds);
    // The pod's grace period covers the drain the file configures.
    let drain = c.lifecycle.drain_grace + c.lifecycle.drain_timeout;
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(grace > drain.as_secs(), "{grace} s <= {drain:?}");
    // Readiness turns 503 -> not ready within the drain grace: the
    // sprayer stops sending before the listener closes.
    let probe = &container["readinessProbe"];
    let noticed =
        probe["periodSeconds"].as_u64().unwrap() * probe["failureThreshold"].as_u64().unwrap();
    assert!(
        std::time::Duration::from_secs(noticed) < c.lifecycle.drain_grace,
        "{noticed} s"
    );
    // The CA certificate and keyring come from a Secret, group-readable;
    // the pod's own certificate and key from a volume of its own (the
    // csi-driver's, one per pod); ca.key from nowhere.
    let volumes = pod["volumes"].as_array().unwrap();
    let mounted_at = |dir: &Path| -> &serde_json::Value {
        let mount = container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| Path::new(m["mountPath"].as_str().unwrap()) == dir)
            .unwrap_or_else(|| panic!("nothing mounted at {}", dir.display()));
        volumes.iter().find(|v| v["name"] == mount["name"]).unwrap()
    };
    let shared = mounted_at(c.tls.ca.parent().unwrap());
    assert_eq!(shared["secret"]["defaultMode"], 0o440);
    assert_eq!(c.tls.gossip_keyring.parent(), c.tls.ca.parent());
    let own = mounted_at(c.tls.cert.parent().unwrap());
    assert_eq!(c.tls.key.parent(), c.tls.cert.parent());
    assert_ne!(own["name"], shared["name"]);
    let attrs = &own["csi"]["volumeAttributes"];
    assert_eq!(
        attrs["csi.cert-manager.io/dns-names"],
        "${POD_NAME}.node.peerlb"
    );
    assert_eq!(
        attrs["csi.cert-manager.io/certificate-file"],
        c.tls.cert.file_name().unwrap().to_str().unwrap()
    );
    assert_eq!(
        attrs["csi.cert-manager.io/privatekey-file"],
        c.tls.key.file_name().unwrap().to_str().unwrap()
    );
    assert_eq!(
        attrs["csi.cert-manager.io/fs-group"],
        sc["fsGroup"].to_string()
    );
    // No step ships the whole certificate directory (ca.key with it).
    assert!(
        !read("kubernetes/peerlb.yaml")
            .lines()
            .any(|l| l.trim_end().ends_with("--from-file=certs/")),
        "a step copies certs/ whole"
    );
}

#[test]
fn the_dockerfile_builds_in_stages_and_runs_as_a_non_root_node() {
    let text = read("docker/Dockerfile");
    // Instructions, continuation lines joined, comments dropped.
    let joined = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("\\\n", " ");
    let instructions: Vec<(String, String)> = joined
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (op, rest) = l.trim().split_once(' ').unwrap_or((l.trim(), ""));
            (op.to_ascii_uppercase(), rest.trim().to_owned())
        })
        .collect();
    const KNOWN: &[&str] = &[
        "FROM",
        "WORKDIR",
        "COPY",
        "RUN",
        "ENV",
        "EXPOSE",
        "USER",
        "STOPSIGNAL",
        "ENTRYPOINT",
        "CMD",
        "ARG",
        "LABEL",
    ];
    for (op, _) in &instructions {
        assert!(KNOWN.contains(&op.as_str()), "unknown instruction {op}");
    }
    let froms: Vec<&String> = instructions
        .iter()
        .filter(|(op, _)| op == "FROM")
        .map(|(_, r)| r)
        .collect();
    assert_eq!(froms.len(), 2, "{froms:?}");
    let stage = froms[0]
        .split_once(" AS ")
        .map(|(_, s)| s.trim())
        .expect("a named build stage");
    assert!(
        froms[1].contains("distroless"),
        "a small runtime image: {}",
        froms[1]
    );
    let runtime: Vec<&(String, String)> = instructions
        .iter()
        .skip_while(|(op, r)| !(op == "FROM" && r == froms[1]))
        .collect();
    let get = |op: &str| {
        runtime
            .iter()
            .rev()
            .find(|(o, _)| o == op)
            .map(|(_, r)| r.as_str())
    };
    assert!(
        runtime
            .iter()
            .any(|(op, r)| op == "COPY" && r.starts_with(&format!("--from={stage} "))),
        "the binary comes from the build stage"
    );
    assert!(matches!(get("USER"), Some(u) if u != "root" && u != "0"));
    assert_eq!(get("STOPSIGNAL"), Some("SIGTERM"));
    let entry: Vec<String> = serde_json::from_str(get("ENTRYPOINT").unwrap()).unwrap();
    assert_eq!(entry[1..], ["node"]);
    // Certificates and keys are mounted, never copied in.
    for (op, r) in &instructions {
        if op == "COPY" {
            assert!(
                !r.contains(".key") && !r.contains(".pem") && !r.contains("certs"),
                "{r}"
            );
        }
    }
    let ignore = read("docker/Dockerfile.dockerignore");
    for p in ["target", ".git", "*.key"] {
        assert!(ignore.lines().any(|l| l == p), "{p} not ignored");
    }
}

/// `kubernetes-validate --strict` of `path` (every document against the
/// Kubernetes schemas it bundles, offline; unknown fields refused): its
/// complaints, empty when valid.
fn kubernetes_complaints(validate: &Path, path: &Path) -> String {
    let out = Command::new(validate)
        .args(["--strict", "--quiet"])
        .arg(path)
        .output()
        .unwrap();
    if out.status.success() {
        return String::new();
    }
    format!(
        "exit {}: {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn every_kubernetes_manifest_validates_against_the_kubernetes_schemas() {
    let Some(validate) = tool("kubernetes-validate", "pip install kubernetes-validate") else {
        return;
    };
    let dir = deploy("kubernetes");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            let complaints = kubernetes_complaints(&validate, &path);
            assert!(complaints.is_empty(), "{}: {complaints}", path.display());
            checked += 1;
        }
    }
    assert!(checked > 0, "no manifest in {}", dir.display());
    // The check catches a field the schema does not have.
    let text = read("kubernetes/peerlb.yaml");
    let tmp = temp_dir("deploy-k8s-schema");
    let broken = write(
        &tmp,
        "broken.yaml",
        &text.replacen("fsGroup: 65532", "fsGroup: 65532\n        fsGroupp: 1", 1),
    );
    assert!(
        kubernetes_complaints(&validate, &broken).contains("fsGroupp"),
        "a broken manifest went unnoticed"
    );
}

#[test]
fn a_pod_of_the_statefulset_runs_as_printed_non_root_reading_its_volumes_through_fs_group() {
    if skip_containers() {
        return;
    }
    let Some(python) = tool("python3", "apt-get install -y python3-yaml") else {
        return;
    };
    let docs = yaml_documents(&python, &deploy("kubernetes/peerlb.yaml"));
    let find = |kind: &str| docs.iter().find(|d| d["kind"] == kind).unwrap();
    let set = find("StatefulSet");
    let config = find("ConfigMap")["data"]["cluster.toml"].as_str().unwrap();
    let pod = &set["spec"]["template"]["spec"];
    let sc = &pod["securityContext"];
    let user = (
        sc["runAsUser"].as_u64().unwrap(),
        sc["runAsGroup"].as_u64().unwrap(),
    );
    // --clear-groups is exact: the fsGroup (the kubelet adds it as a
    // supplementary group) is the primary group already.
    assert_eq!(sc["fsGroup"].as_u64(), Some(user.1));
    let fs_group = user.1 as u32;
    let secret_mode = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|v| v["secret"]["defaultMode"].as_u64())
        .unwrap() as u32;
    // The pod's root: every absolute path of the manifest under it.
    let root = temp_dir("deploy-k8s-pod");
    own(&root, 0, 0o755);
    let at = |p: &str| p.replace("/etc/peerlb", &root.join("etc/peerlb").to_string_lossy());
    let etc = root.join("etc/peerlb");
    // What the operator issues outside the cluster: the CA, the keyring
    // and the node certificates (with this manifest's cluster.toml).
    let issuer = root.join("issuer");
    std::fs::create_dir_all(&issuer).unwrap();
    let issuer_toml = write(&issuer, "cluster.toml", config);
    let out = Command::new(bin())
        .args(["certs", "--config"])
        .arg(&issuer_toml)
        .arg("--dir")
        .arg(issuer.join("certs"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // The volumes as the kubelet makes them: the ConfigMap (0644), the
    // Secret with its mode and the fsGroup as group, the pod's own
    // certificate and key (the csi-driver's files, group fsGroup, as
    // readable as the Secret's), directories group-owned.
    let file = peerlb::Source::load(Some(&issuer_toml))
        .unwrap()
        .parse()
        .unwrap();
    let cert_name = |p: &Option<String>| Path::new(p.as_ref().unwrap()).to_path_buf();
    let volume = |dir: &Path, files: &[(&str, PathBuf)], mode: u32| {
        std::fs::create_dir_all(dir).unwrap();
        own(dir, fs_group, 0o750);
        for (name, from) in files {
            let to = dir.join(name);
            std::fs::copy(from, &to).unwrap();
            own(&to, fs_group, mode);
        }
    };
    std::fs::create_dir_all(&etc).unwrap();
    own(&root.join("etc"), 0, 0o755);
    own(&etc, 0, 0o755);
    volume(
        &etc.join("config"),
        &[("cluster.toml", issuer_toml.clone())],
        0o644,
    );
    let certs = issuer.join("certs");
    volume(
        Path::new(&at(&file.tls.dir)),
        &[
            ("ca.pem", certs.join("ca.pem")),
            ("gossip.keys", certs.join("gossip.keys")),
        ],
        secret_mode,
    );
    let node_pem = PathBuf::from(at(cert_name(&file.tls.cert).to_str().unwrap()));
    let node_key = PathBuf::from(at(cert_name(&file.tls.key).to_str().unwrap()));
    assert_eq!(node_pem.parent(), node_key.parent());
    volume(
        node_pem.parent().unwrap(),
        &[
            (
                node_pem.file_name().unwrap().to_str().unwrap(),
                certs.join("peerlb-0.pem"),
            ),
            (
                node_key.file_name().unwrap().to_str().unwrap(),
                certs.join("peerlb-0.key"),
            ),
        ],
        secret_mode,
    );
    // The config the pod reads names the pod's root.
    std::fs::write(etc.join("config/cluster.toml"), at(config)).unwrap();
    assert!(
        !walk(&etc).iter().any(|p| p.ends_with("ca.key")),
        "ca.key reached the pod"
    );
    // Pod peerlb-0 on its IP, both containers in its network namespace.
    let pod_ip = "10.1.2.3";
    let net = Netns::make("k8s", &[pod_ip]);
    let (entry, image_env) = image_entry_and_env();
    let run = |k: &serde_json::Value, log: &str| {
        let mut env: Vec<(String, String)> = image_env.clone();
        for (name, value) in container_env(k, "peerlb-0", pod_ip) {
            env.retain(|(n, _)| *n != name);
            env.push((name, at(&value)));
        }
        // `command` replaces the image's entry point, `args` follow it.
        let mut argv = match k["command"].as_array() {
            Some(_) => strings(&k["command"]),
            None => entry.clone(),
        };
        argv.extend(strings(&k["args"]).iter().map(|a| kubelet_expand(a, &env)));
        assert_eq!(argv[0], "/usr/local/bin/peerlb");
        net.run_as(user, bin(), &argv[1..], &env, &root.join(log))
    };
    let containers = pod["containers"].as_array().unwrap();
    let _app = run(&containers[1], "app.log");
    let node = run(&containers[0], "node.log");
    let log = || std::fs::read_to_string(root.join("node.log")).unwrap_or_default();
    let health = format!("http://{pod_ip}:8080/_peerlb/health");
    poll_for(30, || net.get(&health).filter(|(c, _)| *c == 200))
        .unwrap_or_else(|| panic!("the pod's node did not become ready\n{}", log()));
    // The app answers through the node, which serves with it.
    let (code, body) = net
        .get(&format!("http://{pod_ip}:8080/hello?user=alice"))
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["node"], "peerlb-0", "{body}");
    // Prometheus's target: the port named `metrics`, the Service's path.
    let metrics_port = containers[0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "metrics")
        .unwrap()["containerPort"]
        .as_u64()
        .unwrap();
    let (code, text) = net
        .get(&format!("http://{pod_ip}:{metrics_port}/_peerlb/metrics"))
        .unwrap();
    assert!(
        code == 200 && text.contains("peerlb_requests_total"),
        "{code}: {text}"
    );
    drop(node);
    // The same files owner-only and root-owned, as the manifest once had
    // them (mode 0400, no fsGroup): the node cannot read its key.
    own(&node_key, 0, 0o400);
    let mut refused = run(&containers[0], "refused.log");
    let status = refused.0.wait().unwrap();
    let said = std::fs::read_to_string(root.join("refused.log")).unwrap();
    assert_eq!(status.code(), Some(64), "{said}");
    assert!(said.contains("Permission denied"), "{said}");
}

#[test]
fn the_dockerfile_example_runs_as_printed_bound_on_0_0_0_0_advertising_the_machine() {
    if skip_containers() {
        return;
    }
    let example = dockerfile_example();
    let tag = format!("peerlb:{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(
        example[0],
        format!("docker build -f deploy/docker/Dockerfile -t {tag} ."),
        "the image is built with the release's tag"
    );
    // Machine web-1 of docs/configuration.md's three-machine example, in
    // the directory its bundle (docs/operations.md) was unpacked in.
    let machine = temp_dir("deploy-docker");
    own(&machine, 0, 0o755);
    let conf = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .unwrap();
    let rest = &conf[conf.find("## Example: three machines").unwrap()..];
    let start = rest.find("```toml\n").unwrap() + "```toml\n".len();
    let toml = &rest[start..start + rest[start..].find("```").unwrap()];
    let issuer = temp_dir("deploy-docker-issuer");
    let config = write(&issuer, "cluster.toml", toml);
    let out = Command::new(bin())
        .args(["certs", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    std::fs::copy(&config, machine.join("cluster.toml")).unwrap();
    std::fs::create_dir_all(machine.join("certs")).unwrap();
    for f in ["ca.pem", "web-1.pem", "web-1.key", "gossip.keys"] {
        std::fs::copy(issuer.join("certs").join(f), machine.join("certs").join(f)).unwrap();
    }
    {
        use std::os::unix::fs::PermissionsExt as _;
        let key = machine.join("certs/web-1.key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(
            machine.join("certs"),
            std::fs::Permissions::from_mode(0o700),
        )
        .unwrap();
    }
    let file = peerlb::Source::load(Some(&config))
        .unwrap()
        .parse()
        .unwrap();
    let web1 = file.nodes.iter().find(|n| n.id == "web-1").unwrap();
    // The container's root: each mount a symbolic link to its host path.
    let root = temp_dir("deploy-docker-root");
    own(&root, 0, 0o755);
    let (entry, image_env) = image_entry_and_env();
    let inside = |p: &str| root.join(p.trim_start_matches('/'));
    let net = Netns::make("dkr", &[]);
    let mut running = Vec::new();
    for line in &example[1..] {
        let words = shell_words(line, &machine);
        if words[0] != "docker" {
            // A host command, run as printed in the machine's directory.
            let out = Command::new("bash")
                .args(["-euo", "pipefail", "-c", line])
                .current_dir(&machine)
                .output()
                .unwrap();
            assert!(out.status.success(), "{line}: {out:?}");
            continue;
        }
        let r = parse_docker_run(&words);
        assert_eq!(r.image, tag);
        for (host, at) in &r.mounts {
            let link = inside(at);
            std::fs::create_dir_all(link.parent().unwrap()).unwrap();
            std::os::unix::fs::symlink(host, &link).unwrap();
        }
        // What `-p` publishes is what the node advertises: the
        // machine's ports reach the container's.
        if r.network_of.is_none() {
            let mut published: Vec<(u16, u16, String)> = r.published.clone();
            published.sort();
            let mut advertised = vec![
                (
                    web1.http_addr.rsplit(':').next().unwrap().parse().unwrap(),
                    "tcp",
                ),
                (
                    web1.peer_addr.rsplit(':').next().unwrap().parse().unwrap(),
                    "udp",
                ),
                (
                    web1.gossip_addr
                        .rsplit(':')
                        .next()
                        .unwrap()
                        .parse()
                        .unwrap(),
                    "udp",
                ),
            ]
            .into_iter()
            .map(|(p, proto): (u16, &str)| (p, p, proto.to_owned()))
            .collect::<Vec<_>>();
            advertised.sort();
            assert_eq!(published, advertised);
        }
        let mut env = image_env.clone();
        for (k, v) in &r.env {
            env.retain(|(n, _)| n != k);
            env.push((k.clone(), v.clone()));
        }
        let env: Vec<(String, String)> = env
            .into_iter()
            .map(|(k, v)| {
                let v = if v.starts_with('/') {
                    inside(&v).to_string_lossy().into_owned()
                } else {
                    v
                };
                (k, v)
            })
            .collect();
        let mut argv = match &r.entrypoint {
            Some(e) => vec![e.clone()],
            None => entry.clone(),
        };
        argv.extend(r.args.iter().cloned());
        assert_eq!(argv[0], "/usr/local/bin/peerlb");
        let log = root.join(format!("{}.log", r.name.clone().unwrap_or_default()));
        running.push(net.run_as(NONROOT, bin(), &argv[1..], &env, &log));
    }
    assert_eq!(running.len(), 2, "the node and its app");
    let log = || std::fs::read_to_string(root.join("web-1.log")).unwrap_or_default();
    // Inside, the node listens on every address: the container's loopback
    // answers, though the address it advertises is the machine's.
    let http_port = web1.http_addr.rsplit(':').next().unwrap();
    let health = format!("http://127.0.0.1:{http_port}/_peerlb/health");
    poll_for(30, || net.get(&health).filter(|(c, _)| *c == 200))
        .unwrap_or_else(|| panic!("the container's node did not become ready\n{}", log()));
    let (code, body) = net
        .get(&format!(
            "http://127.0.0.1:{http_port}/api/tenants/acme/orders"
        ))
        .unwrap();
    assert_eq!(code, 200, "{body}\n{}", log());
    assert!(body.contains("app-web-1"), "{body}");
    let admin = format!(
        "http://127.0.0.1:{}/_peerlb/status",
        1000 + http_port.parse::<u16>().unwrap()
    );
    let (_, status) = net.get(&admin).unwrap();
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["members"][0]["http_addr"], web1.http_addr.as_str());
}
