//! Deterministic in-process cluster simulation (cargo feature `sim`).
//!
//! Runs N real nodes — the real [`crate::Node`], engine, hyper ingress,
//! quinn forwarding and chitchat gossip — as turmoil hosts on a simulated
//! network with virtual time, drives client traffic through a sprayer,
//! applies a scripted fault schedule and checks invariants. Scenarios are
//! TOML files in `simulations/` ([`scenario::Scenario`]); the same seed
//! gives a byte-identical trace ([`trace`]) in any process, provided the
//! binary links [`crate::sim_os_overrides!`] and is built with
//! `--cfg tokio_unstable`. See `simulations/README.md`.
//!
//! - [`net`]: turmoil sockets behind [`crate::Env`] (client listener,
//!   quinn `AsyncUdpSocket`) and the virtual wall clock.
//! - [`gossip`]: chitchat's `Transport` over turmoil UDP.
//! - [`certs`]: deterministic Ed25519 cluster certificates.
//! - [`os`]: process randomness from the seed (the `getrandom` override).
//! - [`harness`]: one run: hosts, clients, faults, invariants, figures.
//! - [`trace`]: the event trace and its hash.
//! - [`report`]: the SVG chart of per-node load with fault markers.

pub mod certs;
pub mod gossip;
pub mod harness;
pub mod net;
pub mod os;
pub mod report;
pub mod scenario;
pub mod trace;
