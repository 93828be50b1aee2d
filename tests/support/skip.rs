//! The one way a test skips for a tool this machine lacks (HAProxy,
//! Chromium, SIPp, the deployment files' checkers, network namespaces).
//!
//! A missing tool fails the test when `CI` or the test's
//! `PEERLB_REQUIRE_<TOOL>` is set (to anything but empty, `0` or `false`):
//! `.ci/run` installs every tool and sets both, so there nothing is
//! skipped. Otherwise the test returns early after writing one line,
//! `SKIPPED <test binary>::<test>: <why> (...)`, straight to the process's
//! standard error. libtest captures only what `print!`/`eprint!` write in
//! a passing test, not writes to the `std::io::stderr()` handle, so the line
//! shows in a plain `cargo test` run without `--nocapture`, beside
//! libtest's `test ... ok` (which still counts the test as passed: the
//! `SKIPPED` line is the record). README.md lists the tools and the tests
//! each one covers.

use std::io::Write;
use std::path::PathBuf;

/// Whether the environment variable `var` is set to a true value (not
/// empty, `0` or `false`).
fn set(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// Whether this run must not skip for `require` (`CI` or `require` set).
pub fn required(require: &str) -> bool {
    set("CI") || set(require)
}

/// Skips the calling test: panics (a failure) when the run requires the
/// tool (`CI` or `require` set), else writes the `SKIPPED` line; the caller
/// then returns. `why` says what is missing, `install` how to get it.
pub fn skip(require: &str, why: &str, install: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("<unnamed thread>")
        .to_owned();
    let test = format!("{}::{test}", env!("CARGO_CRATE_NAME"));
    assert!(
        !required(require),
        "{test}: {why}, but this run requires it (CI or {require} is set; {install})"
    );
    // The handle, not eprintln!: libtest would capture the macro's output.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: {why} ({install}; CI or {require}=1 makes this a failure)"
    );
}

/// The executable `name` on `PATH` (the first of `names` found), or `None`
/// after [`skip`] (which fails the test instead when the run requires it).
pub fn tool(names: &[&str], require: &str, install: &str) -> Option<PathBuf> {
    let found = names.iter().find_map(|n| super::which(n));
    if found.is_none() {
        skip(require, &format!("{} is not installed", names[0]), install);
    }
    found
}

/// HAProxy (`PEERLB_REQUIRE_HAPROXY`), or `None` after [`skip`].
pub fn haproxy() -> Option<PathBuf> {
    tool(
        &["haproxy"],
        "PEERLB_REQUIRE_HAPROXY",
        "apt-get install -y haproxy",
    )
}
