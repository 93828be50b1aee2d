//! peerlb: a self-balancing peer cluster node.
//!
//! N identical nodes run behind an L4 sprayer. Every node is both an *entry
//! node* (it accepts client HTTP requests) and a *target* (it serves them
//! with its local app). For each request the entry node decides the
//! *owner* (consistent-hash ring fed by data-centric rules, a sticky route,
//! or another balancing policy), serves it itself or forwards it to the
//! owner over QUIC with mutual TLS, tagged as proxied, and streams the
//! response back. Membership and health travel by chitchat gossip; a peer
//! whose QUIC connection drops is ejected at once and its requests fail
//! over to the next node on the ring.
//!
//! # Layout
//!
//! - [`config`]: `cluster.toml` model and validation into a [`NodeConfig`].
//! - `engine/` (I/O-free, no clock, seeded randomness): `ring` (consistent
//!   hash with virtual nodes), `rules` (data-centric rules), `sticky`
//!   (sticky route cookie / URL parameter), `balance` (policies),
//!   `node_id` ([`NodeId`] and its naming rules), `membership` (immutable
//!   [`MembershipView`]), `route` (the decision), `failover` (replay plan
//!   and the choice after a failed attempt), `sip` (SIP messages, their
//!   hash key and dialog parameter, the SIP decision, the demo SIP
//!   server), `testing` (doc-hidden test
//!   support: the request builder the unit tests and the benches share).
//! - `adapters/` (I/O): `gossip` (chitchat over a transport sealed with
//!   the cluster [`keyring`], bounds on what gossip may say), `peer` (quinn
//!   endpoint, client pool and server, admission before authentication), `wire` (peer stream frames), `ingress` (hyper
//!   server and the request path; before HTTP, the PROXY protocol header
//!   and the TLS handshake a client listener asks for), `sip` (SIP over
//!   UDP and TCP on `sip_addr`, forwarded on the peer wire; an owner's
//!   relay to an upstream SIP server), `owner`
//!   (serving with the local app),
//!   `node_state` (counters, in-flight, weight, rules: shared by ingress,
//!   owner and `admin`), `pause` (a pause of the node's own process
//!   noticed, failure decisions held after it), `errors` (every error as
//!   an HTTP answer), `app`
//!   (built-in and upstream app), `tls` (identity, issuance, configs:
//!   cluster CA, node certificates, mutual TLS; `tls::entry`: HTTPS at the
//!   entry, certificates by SNI, reloads).
//! - [`node`]: the composition root, [`Node::build`] then [`Node::run`].
//! - [`env`]: the I/O seam: sockets, generation and seed handed to a node.
//! - [`explain`]: `peerlb route`, the engine's decision for one request, explained.
//! - `main.rs` and `cli/` (binary crate): the `peerlb` CLI, one file per
//!   command (`node`, `up`, `certs`, `check-config`, `route`, `app`: the
//!   built-in app alone, a benchmark backend; `keyring`: gossip key
//!   rotation).
//! - `sim` (cargo feature `sim`): the deterministic simulation on turmoil
//!   (`simulations/README.md`), run by the `peerlb-sim` binary.

#![warn(missing_docs, unreachable_pub)]

mod adapters;
pub mod config;
mod engine;
pub mod env;
pub mod explain;
#[cfg(test)]
mod fuzz;
pub mod node;
#[cfg(feature = "sim")]
pub mod sim;

pub use adapters::app::{AppListener, serve_standalone as serve_app};
pub use adapters::gossip::keyring;
pub use adapters::tls;
pub use config::{ClusterFile, ConfigError, NodeConfig, Overrides, Source};
pub use engine::balance::PolicyKind;
pub use engine::membership::{Member, MembershipView, NodeStatus};
pub use engine::node_id::{InvalidNodeId, NodeId};
pub use engine::ring::{Assignment, Ring, RingSpec};
pub use engine::route::{Decision, Reason, Router};
pub use engine::rules::{RequestView, RuleSpec, Rules};
pub use engine::session_id::{NamedServers, SessionIdForm, SessionPick, SessionRoute};
pub use engine::slow_start::SlowStart;
pub use engine::sticky::{RouteCookie, SameSite};
#[doc(hidden)]
pub use engine::testing;
pub use env::{Env, SipSockets};
pub use node::Node;
