//! The `peerlb` command line: `node`, `up`, `certs`, `check-config`, `route`,
//! `app`, `keyring`, `status`, `drain`, `undrain`, `offline`, `weight`,
//! `reload-rules`. This file parses the command line and dispatches; each command
//! lives in its own file under `cli/`, the helpers they share in `cli.rs`.

// No unsafe code, but the libc calls whose `#[allow]` says why
// (`cli/node.rs`: the open file limit; `cli/up.rs`: signalling a child;
// `cli/memory.rs`: returning free memory to the OS; SIGPIPE's default
// action below).
#![deny(unsafe_code)]
#![deny(clippy::disallowed_methods, clippy::disallowed_types)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;

/// peerlb: a self-balancing peer cluster node.
#[derive(Parser)]
#[command(name = "peerlb", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Log line format on stderr: text, or json (one object per line).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t,
        env = "PEERLB_LOG_FORMAT"
    )]
    log_format: cli::LogFormat,
    /// Log one line per request and node (target peerlb::access: request
    /// id, entry, owner, status, duration, reason); off by default, as it
    /// costs a few percent of CPU. On or off whatever RUST_LOG says.
    #[arg(long, global = true, env = "PEERLB_ACCESS_LOG")]
    access_log: bool,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one node of the cluster.
    Node(cli::node::NodeArgs),
    /// Start every node of the cluster as a child process on this host,
    /// all sharing the sprayer address with SO_REUSEPORT.
    Up(cli::up::UpArgs),
    /// Create the cluster CA and node certificates (keeps existing files).
    Certs(cli::certs::CertsArgs),
    /// Explain the owner the engine picks for one request (no network).
    Route(cli::route::RouteArgs),
    /// Serve the built-in demo app alone over plain HTTP/1.1 (no cluster,
    /// no peers): a backend for benchmarks (bench/compare.sh).
    App(cli::app::AppArgs),
    /// Validate cluster.toml and exit: 0 when valid, 64 when not.
    CheckConfig(cli::check_config::CheckConfigArgs),
    /// Gossip key rotation on the nodes of this host (admin API): new,
    /// list, install KEY, use FINGERPRINT, remove FINGERPRINT.
    Keyring(cli::keyring::KeyringArgs),
    /// The cluster as one node sees it, as a table: members, status,
    /// weight, load, in flight, ring share (admin API).
    Status(cli::members::StatusArgs),
    /// Drain a member: no new sticky sessions or ring keys; the sessions
    /// bound to it finish there (admin API, forwarded to the member).
    Drain(cli::members::DrainArgs),
    /// Put a draining or offline member back to serving.
    Undrain(cli::members::ChangeArgs),
    /// Take a member offline: no traffic, still a member.
    Offline(cli::members::ChangeArgs),
    /// Set a member's weight (100 is one share; not persisted): published
    /// in gossip, every ring takes it (admin API, forwarded to the member).
    Weight(cli::members::WeightArgs),
    /// Read and compile the data-centric rules again on the node asked
    /// (its rules_file or the [[rules]] of its --config file).
    ReloadRules(cli::members::ReloadRulesArgs),
    /// Forget a failed, left or never seen member: the node asked no
    /// longer lists it (admin API; each node keeps its own list).
    Forget(cli::members::ForgetArgs),
}

/// What each command's help says of the global options, which only
/// `peerlb --help` lists.
const GLOBAL_OPTIONS_NOTE: &str = "Global options (before or after the command): --log-format text|json, --access-log; see `peerlb --help`.";

/// The command line with the global options listed once, in `peerlb
/// --help`: each command gets hidden copies of them (clap then does not
/// propagate the listed ones there; they are still accepted after the
/// command) and a line saying where they are.
fn command() -> clap::Command {
    use clap::CommandFactory as _;
    let cmd = Cli::command();
    let hidden: Vec<clap::Arg> = cmd
        .get_arguments()
        .filter(|a| a.is_global_set())
        .map(|a| a.clone().hide(true))
        .collect();
    fn with_hidden(sc: clap::Command, hidden: &[clap::Arg]) -> clap::Command {
        let sc = sc
            .args(hidden.iter().cloned())
            .after_help(GLOBAL_OPTIONS_NOTE);
        sc.mut_subcommands(|c| with_hidden(c, hidden))
    }
    cmd.mut_subcommands(|sc| with_hidden(sc, &hidden))
}

fn main() -> ExitCode {
    let cli = {
        use clap::FromArgMatches as _;
        Cli::from_arg_matches(&command().get_matches()).unwrap_or_else(|e| e.exit())
    };
    if matches!(
        cli.cmd,
        Cmd::Route(_) | Cmd::CheckConfig(_) | Cmd::Status(_)
    ) {
        // Printing commands end quietly when their reader goes away
        // (`peerlb route ... | head`), like other Unix tools.
        // SAFETY: restoring the default disposition of one signal before
        // any thread starts. Through libc: std has no call for it.
        #[allow(unsafe_code)]
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL)
        };
    }
    cli::init_tracing(cli.log_format, cli.access_log);
    let code = match cli.cmd {
        Cmd::Node(a) => cli::node::run(a),
        Cmd::Up(a) => cli::up::run(a, cli.log_format, cli.access_log),
        Cmd::Certs(a) => cli::certs::run(a),
        Cmd::CheckConfig(a) => cli::check_config::run(a),
        Cmd::Route(a) => cli::route::run(a),
        Cmd::App(a) => cli::app::run(a),
        Cmd::Keyring(a) => cli::keyring::run(a),
        Cmd::Status(a) => cli::members::status(a),
        Cmd::Drain(a) => cli::members::drain(a),
        Cmd::Undrain(a) => cli::members::change(a, "undrain", "serving"),
        Cmd::Offline(a) => cli::members::change(a, "offline", "offline"),
        Cmd::Weight(a) => cli::members::weight(a),
        Cmd::ReloadRules(a) => cli::members::reload_rules(a),
        Cmd::Forget(a) => cli::members::forget(a),
    };
    match code {
        Ok(c) => ExitCode::from(c),
        Err(e) => {
            eprintln!("peerlb: {e:#}");
            ExitCode::FAILURE
        }
    }
}
