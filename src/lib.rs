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
//!   hash key and dialog parameter, the SIP decision, the proxy steps, the
//!   demo SIP server), `session_id` (passive routes from the app's session
//!   id), `slow_start` (the ramp of a starting node's weight), `operator`
//!   (the operator's rules for a node's own state), `view_compose` (which
//!   members a view is made of), `peer_link` (which connection to a peer
//!   carries the next stream), `ownership` (a key's owner and the ranges
//!   that moved: what [`Handle`] answers), `testing` (doc-hidden test
//!   support: the request builder the unit tests and the benches share).
//! - `engine/` also holds `gossip_budget` (the members a full gossip
//!   digest leaves room for in one datagram, shared with [`config`]).
//! - `seam` (re-exported as [`env`](mod@env)'s traits): the I/O seam's traits
//!   below the adapters: [`env::Connection`], [`env::HttpListener`],
//!   [`env::Clock`], [`env::NodeEvent`], [`env::Observer`].
//! - `adapters/` (I/O), in wings, lowest first (docs/architecture.md,
//!   "Layout: the wings"; `tests/layout.rs` keeps every arrow pointing
//!   down):
//!   - the shared base: `wire` (peer stream frames), `framing` (the body
//!     framing a head implies), `body` (streaming bodies, the QUIC body
//!     pump), `tunnel` (the byte relay of upgraded connections), `access`
//!     (request id, access log), `metrics` (histograms and counts),
//!     `informational` (1xx answers on their way to the client);
//!   - `cluster/`: `gossip` (chitchat), `keyring` (the cluster
//!     [`keyring`]), `sealed` (the sealed gossip transport), `bounds`
//!     (what a gossip datagram may say), `pause` (a pause of the node's
//!     own process noticed, failure decisions held after it);
//!   - `transport/`: `peer` (quinn endpoint, client pool and server;
//!     `peer/links`, `peer/dial`, admission before authentication in
//!     `peer/admission`, the peer UDP socket in `peer/udp`), `tls`
//!     ([`tls`]: identity, issuance, configs: cluster CA, node
//!     certificates, mutual TLS);
//!   - `http/`: the server kit of the client and admin listeners: `server`
//!     (accept loop), `conns` (connection table), `conn` (before HTTP: the
//!     PROXY protocol header, `proxy_protocol`, and the TLS handshake),
//!     `entry_tls` ([`tls::entry`]: HTTPS at the entry, certificates by
//!     SNI, reloads), `preface`, `send_timeout`, `relay` (response
//!     bodies one frame at a time, the stall cut, the response budget);
//!   - the shared state: `node_state` (counters, in-flight, weight, rules:
//!     shared by ingress, owner and admin), `errors` (every error as an
//!     HTTP answer);
//!   - `ops/`: `admin` (the admin API; `admin/members`, `admin/manager`,
//!     `admin/browser`), `keyring_admin`, `health`, `metrics_page`,
//!     `admin_server` (the admin listener);
//!   - `serve/`: `owner` (serving with the local app), `app` (built-in
//!     and upstream app), `upstream` (the pool to the app), `forwarded`
//!     (`X-Forwarded-*`), `sip` (the SIP app; `sip/upstream`: the relay to
//!     an upstream SIP server);
//!   - `front/`: `ingress` (hyper server and the request path;
//!     `ingress/limits`, `ingress/forward`), `client_input` (checks of
//!     what a client sent), `extended_connect` (WebSocket over HTTP/2),
//!     `sip` (SIP over UDP and TCP on `sip_addr`, forwarded on the peer
//!     wire).
//! - [`node`]: the composition root, [`Node::build`] then [`Node::run`].
//! - `embed` (re-exported): peerlb as a library: [`Node::builder`] with an
//!   app as a `tower::Service` ([`NodeBuilder`]), the [`RequestInfo`]
//!   extension each request carries, and the node's [`Handle`] (who owns a
//!   key, the members, [`ViewChanges`]; the handle itself is
//!   `adapters/serve/app/handle.rs`, the moved-range diff
//!   `engine/ownership`).
//! - [`env`](mod@env): [`Env`] and [`Env::bind`]: sockets, generation and seed
//!   handed to a node (above the adapters).
//! - [`explain`]: `peerlb route`, the engine's decision for one request, explained.
//! - `main.rs` and `cli/` (binary crate): the `peerlb` CLI, one file per
//!   command (`node`, `up`, `certs`, `check-config`, `route`, `app`: the
//!   built-in app alone, a benchmark backend; `keyring`: gossip key
//!   rotation).
//! - `sim` (cargo feature `sim`): the deterministic simulation on turmoil
//!   (`simulations/README.md`), run by the `peerlb-sim` binary.
//!
//! # The public surface
//!
//! The library's API is what this page lists: the builder, the node, its
//! handle and the app's request extension ([`Node::builder`],
//! [`Handle`], [`RequestInfo`], [`body`]), the config ([`config`]), the
//! environment ([`env`](mod@env)), the engine's pure types ([`Ring`],
//! [`Router`], [`MembershipView`], ...), [`explain`], [`keyring`] and
//! [`tls`]; the adapters and the engine's modules are private. The types
//! that will grow are `#[non_exhaustive]`: every config section and
//! validated setting ([`ClusterFile`], [`NodeConfig`] and their parts,
//! [`Overrides`]: made with `Default` and set field by field, or by
//! [`ClusterFile::validate`]), the config enums and every error
//! ([`ConfigError`], [`NodeError`](node::NodeError), [`BuildError`],
//! [`ForwardError`]), and [`ViewChange`].
//!
//! The app is `Send` (tower's convention: [`NodeBuilder::app`] takes a
//! `Clone + Send` service with a `Send` future), though the node runs it on
//! its one `current_thread` runtime; a `!Send` app was not offered, as
//! its only saving would be an uncontended mutex per request
//! (docs/performance.md, "An embedded app").

#![warn(missing_docs, unreachable_pub)]
// No unsafe code, but where a reason stands beside an `#[allow]`
// (`adapters/transport/peer/udp.rs`: registering the peer socket with
// tokio's reactor, turning its receive offload off; `sim/os.rs`: the simulation's `getrandom` override).
#![deny(unsafe_code)]
// The clock calls clippy.toml bans (they would escape the simulation's
// virtual time), denied everywhere but where an `#[allow]` says why.
#![deny(clippy::disallowed_methods, clippy::disallowed_types)]

mod adapters;
pub mod config;
mod embed;
mod engine;
pub mod env;
pub mod explain;
#[cfg(test)]
mod fuzz;
pub mod node;
pub(crate) mod seam;
#[cfg(feature = "sim")]
pub mod sim;

pub use adapters::cluster::keyring;
pub use adapters::serve::app::{AppListener, serve_standalone as serve_app};
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

pub use adapters::serve::app::RequestInfo;
pub use adapters::serve::app::handle::{ForwardError, Handle, ViewChange, ViewChanges};
pub use embed::{BuildError, NodeBuilder};
pub use engine::ownership::MovedRange;

/// The body of every request and response an app sees: the node's own
/// streaming body type (see [`NodeBuilder::app`]).
///
/// ```
/// use http_body_util::BodyExt;
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let b: peerlb::body::Body = peerlb::body::full("hello");
/// assert_eq!(&b.collect().await.unwrap().to_bytes()[..], b"hello");
/// # });
/// ```
pub mod body {
    #[doc(inline)]
    pub use crate::adapters::body::{Body, BodyError, empty, full};
}

/// Mutual TLS for the peer wire (`adapters/transport/tls.rs`: certificate
/// generation, loading, the rustls/quinn configurations) and, in
/// [`entry`](tls::entry), HTTPS at the entry's client listeners
/// (`adapters/http/entry_tls.rs`).
pub mod tls {
    #[doc(inline)]
    pub use crate::adapters::http::client_cert::check_files as check_entry_files;
    #[doc(inline)]
    pub use crate::adapters::http::entry_tls as entry;
    #[doc(inline)]
    pub use crate::adapters::serve::sip::check_upstream_tls as check_sip_upstream;
    #[doc(inline)]
    pub use crate::adapters::transport::tls::*;
}
