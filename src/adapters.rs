//! Adapters: everything that does I/O. They own tasks, spans, timeouts and
//! retries, translate I/O into engine values and back, and hold no policy
//! logic.
//!
//! The folders are the wings, lowest first; a wing uses the ones below it
//! and never one above (`tests/layout.rs` checks it, docs/architecture.md
//! "Layout" gives the order and why):
//!
//! - the shared base at this level: [`wire`] (the peer stream's frames and
//!   the facts of a client connection), [`framing`], [`body`], [`tunnel`]
//!   (the byte relay of upgraded connections), [`access`], [`metrics`]
//!   (the counters and histograms the node records), [`informational`]
//!   (1xx responses on their way to the client);
//! - [`cluster`]: gossip, its keyring, sealed transport and bounds, the
//!   process pause watch;
//! - [`transport`]: the peer endpoint, links, dial, admission, UDP socket,
//!   peer mutual TLS;
//! - [`http`]: the HTTP server kit both the client and the admin listeners
//!   use (accept loop, connection table, preface, PROXY protocol, entry
//!   TLS, send timeout);
//! - the shared state at this level: [`node_state`] (the hub every request
//!   and admin call reads) and [`errors`] (every error as an HTTP answer);
//! - [`ops`]: the admin API, manager, members admin, keyring admin,
//!   health, the metrics page and the admin listener;
//! - [`serve`]: the owner, the app, the upstream pool, forwarded headers,
//!   the SIP app and SIP upstream;
//! - [`front`]: the ingress and its stages, client input checks, extended
//!   CONNECT, the SIP entry.

pub(crate) mod access;
pub(crate) mod body;
pub(crate) mod cluster;
pub(crate) mod errors;
pub(crate) mod framing;
pub(crate) mod front;
pub(crate) mod http;
pub(crate) mod informational;
pub(crate) mod metrics;
pub(crate) mod node_state;
pub(crate) mod ops;
pub(crate) mod serve;
pub(crate) mod transport;
pub(crate) mod tunnel;
pub(crate) mod wire;

/// The tracing target of the request path's events and spans, wherever
/// they are emitted (`front/ingress/`, `serve/owner`, `node_state`): the
/// target they had when one file held the whole path, so log filters such
/// as `RUST_LOG=peerlb::adapters::ingress=debug` and the simulation's
/// trace lines (which include the target) stay as they were. Every other
/// module that logs names its target the same way (`const LOG`): the
/// module path it had before the adapters were put in wings.
const REQUEST_PATH: &str = "peerlb::adapters::ingress";
