//! Running the deployment files' containers here as their runtime
//! would: a network namespace of the pod's or container's own, the uid
//! and gid it runs as (`setpriv`), the environment and arguments the
//! kubelet or `docker run` would give it.

// Real processes: wall-clock time and blocking sleeps.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::path::{Path, PathBuf};
use std::process::Command;

use super::read;
use crate::support::which;

/// Why a container cannot be run here the way its runtime would (a
/// network namespace of its own, another uid), if it cannot: needs root,
/// `ip` (iproute2), `setpriv` (util-linux) and `curl`.
pub(super) fn cannot_run_containers() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    for t in ["ip", "setpriv", "curl"] {
        if which(t).is_none() {
            return Some(format!("no `{t}`"));
        }
    }
    None
}

/// True (after saying so) when the containers cannot be run here and the
/// run does not require them.
pub(super) fn skip_containers() -> bool {
    let Some(why) = cannot_run_containers() else {
        return false;
    };
    assert!(
        std::env::var_os("PEERLB_REQUIRE_DEPLOY_TOOLS").is_none()
            && std::env::var_os("CI").is_none(),
        "this run requires running the deploy files' containers, but: {why}"
    );
    eprintln!("SKIPPED: the containers cannot be run here: {why}");
    true
}

/// A network namespace of its own, as a pod's (its containers share it)
/// or a container's: loopback up, with `ips` on it; removed on drop.
pub(super) struct Netns(String);

impl Netns {
    pub(super) fn make(tag: &str, ips: &[&str]) -> Netns {
        let ns = Netns(format!("plb{tag}{}", std::process::id()));
        let ip = |args: &[&str]| {
            let out = Command::new("ip").args(args).output().unwrap();
            assert!(
                out.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        ip(&["netns", "add", &ns.0]);
        ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
        for a in ips {
            ip(&["-n", &ns.0, "addr", "add", &format!("{a}/32"), "dev", "lo"]);
        }
        ns
    }

    /// `program` run in the namespace.
    pub(super) fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0]).arg(program);
        c
    }

    /// `program args` in the namespace as `uid`:`gid` with no other group
    /// (`setpriv --clear-groups`), the environment exactly `env`, stdout
    /// and stderr to `log`.
    pub(super) fn run_as(
        &self,
        (uid, gid): (u64, u64),
        program: &str,
        args: &[String],
        env: &[(String, String)],
        log: &Path,
    ) -> KillOnDrop {
        let log = std::fs::File::create(log).unwrap();
        let child = self
            .command("setpriv")
            .args([
                format!("--reuid={uid}"),
                format!("--regid={gid}"),
                "--clear-groups".into(),
                "--".into(),
                program.into(),
            ])
            .args(args)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        KillOnDrop(child)
    }

    /// `GET url` from inside the namespace: (status, body), or `None`
    /// when nothing answered.
    pub(super) fn get(&self, url: &str) -> Option<(u16, String)> {
        let out = self
            .command("curl")
            .args(["-s", "-m", "2", "-w", "\n%{http_code}", url])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let (body, code) = text.rsplit_once('\n')?;
        let code: u16 = code.trim().parse().ok()?;
        (code != 0).then(|| (code, body.to_owned()))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// A child process killed (and reaped) on drop.
pub(super) struct KillOnDrop(pub(super) std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `value` with each `$(NAME)` of `vars` replaced, as the kubelet expands
/// a container's `env` values and `args` from the variables defined
/// before them.
pub(super) fn kubelet_expand(value: &str, vars: &[(String, String)]) -> String {
    let mut out = value.to_owned();
    for (k, v) in vars {
        out = out.replace(&format!("$({k})"), v);
    }
    out
}

/// A container's environment as the kubelet gives it: `fieldRef`s to the
/// pod's name and IP resolved, `$(VAR)` references expanded, in order.
pub(super) fn container_env(
    container: &serde_json::Value,
    pod: &str,
    pod_ip: &str,
) -> Vec<(String, String)> {
    let mut vars: Vec<(String, String)> = Vec::new();
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap().to_owned();
        let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Some("metadata.name") => pod.to_owned(),
            Some("status.podIP") => pod_ip.to_owned(),
            Some(other) => panic!("env {name}: fieldRef {other} not modelled"),
            None => kubelet_expand(e["value"].as_str().unwrap(), &vars),
        };
        vars.push((name, value));
    }
    vars
}

pub(super) fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// Sets `path`'s owner (uid 0, `gid`) and mode.
pub(super) fn own(path: &Path, gid: u32, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    std::os::unix::fs::chown(path, Some(0), Some(gid)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The image's entry point and user, from the Dockerfile's runtime stage:
/// (`ENTRYPOINT` as a list, `ENV` pairs). The user `nonroot` of
/// distroless images is uid and gid 65532.
pub(super) fn image_entry_and_env() -> (Vec<String>, Vec<(String, String)>) {
    let text = read("docker/Dockerfile");
    let joined = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("\\\n", " ");
    let runtime = &joined[joined.rfind("\nFROM ").unwrap()..];
    let mut entry = Vec::new();
    let mut env = Vec::new();
    for l in runtime.lines() {
        if let Some(r) = l.strip_prefix("ENTRYPOINT ") {
            entry = serde_json::from_str(r).unwrap();
        }
        if let Some(r) = l.strip_prefix("ENV ") {
            for pair in r.split_whitespace() {
                let (k, v) = pair.split_once('=').unwrap();
                env.push((k.to_owned(), v.to_owned()));
            }
        }
        if let Some(u) = l.strip_prefix("USER ") {
            assert_eq!(u.trim(), "nonroot", "the uid below is distroless nonroot's");
        }
    }
    (entry, env)
}

/// The uid and gid of distroless's `nonroot` user.
pub(super) const NONROOT: (u64, u64) = (65532, 65532);

/// Polls `f` every 100 ms for up to `secs` seconds.
pub(super) fn poll_for<T>(secs: u64, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(x) = f() {
            return Some(x);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Every file under `dir`.
pub(super) fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The commands of the Dockerfile's example (the `#   ` lines of its
/// opening comment), continuation lines joined.
pub(super) fn dockerfile_example() -> Vec<String> {
    let text = read("docker/Dockerfile");
    let lines: Vec<&str> = text
        .lines()
        .take_while(|l| l.starts_with('#'))
        .filter_map(|l| l.strip_prefix("#   "))
        .collect();
    lines
        .join("\n")
        .replace("\\\n", " ")
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// Words of a command line as a POSIX shell splits them, for the
/// example's quoting only (double quotes, no escapes), `$PWD` expanded.
pub(super) fn shell_words(line: &str, pwd: &Path) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut any = false;
    for ch in line.chars() {
        match ch {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            ' ' if !quoted => {
                if any || !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
                any = false;
            }
            c => word.push(c),
        }
    }
    if any || !word.is_empty() {
        words.push(word);
    }
    words
        .into_iter()
        .map(|w| w.replace("$PWD", &pwd.to_string_lossy()))
        .collect()
}

/// One `docker run` of the example: what it sets up.
#[derive(Debug, Default)]
pub(super) struct DockerRun {
    pub(super) name: Option<String>,
    pub(super) env: Vec<(String, String)>,
    /// (host path, container path)
    pub(super) mounts: Vec<(String, String)>,
    /// (host port, container port, protocol)
    pub(super) published: Vec<(u16, u16, String)>,
    /// `--network container:<name>`: the namespace of that container.
    pub(super) network_of: Option<String>,
    pub(super) entrypoint: Option<String>,
    pub(super) image: String,
    pub(super) args: Vec<String>,
}

pub(super) fn parse_docker_run(words: &[String]) -> DockerRun {
    assert_eq!(words[..2], ["docker", "run"], "{words:?}");
    let mut r = DockerRun::default();
    let mut it = words[2..].iter();
    while let Some(w) = it.next() {
        let mut value = || it.next().unwrap().clone();
        match w.as_str() {
            "--rm" | "-d" => {}
            "--name" => r.name = Some(value()),
            "-e" => {
                let v = value();
                let (k, v) = v.split_once('=').unwrap();
                r.env.push((k.into(), v.into()));
            }
            "-v" => {
                let v = value();
                let mut parts = v.split(':');
                let (host, inside) = (parts.next().unwrap(), parts.next().unwrap());
                assert!(parts.all(|o| o == "ro"), "{v}");
                r.mounts.push((host.into(), inside.into()));
            }
            "-p" => {
                let v = value();
                let (ports, proto) = v.split_once('/').unwrap();
                let (host, inside) = ports.split_once(':').unwrap();
                r.published
                    .push((host.parse().unwrap(), inside.parse().unwrap(), proto.into()));
            }
            "--network" => {
                r.network_of = Some(value().strip_prefix("container:").unwrap().to_owned());
            }
            "--entrypoint" => r.entrypoint = Some(value()),
            image => {
                assert!(
                    !image.starts_with('-'),
                    "docker run option {image} not modelled"
                );
                r.image = image.to_owned();
                r.args = it.cloned().collect();
                break;
            }
        }
    }
    r
}
