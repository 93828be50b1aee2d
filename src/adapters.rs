//! Adapters: everything that does I/O. They own tasks, spans, timeouts and
//! retries, translate I/O into engine values and back, and hold no policy
//! logic.

pub(crate) mod access;
pub(crate) mod admin;
pub(crate) mod admin_server;
pub(crate) mod app;
pub(crate) mod body;
pub(crate) mod client_input;
pub(crate) mod errors;
pub(crate) mod framing;
pub(crate) mod gossip;
pub(crate) mod health;
pub(crate) mod ingress;
pub(crate) mod metrics;
pub(crate) mod node_state;
pub(crate) mod owner;
pub(crate) mod pause;
pub(crate) mod peer;
pub(crate) mod send_timeout;
pub(crate) mod sip;
pub mod tls;
pub(crate) mod tunnel;
pub(crate) mod upstream;
pub(crate) mod wire;

/// The tracing target of the request path's events and spans, wherever
/// they are emitted (`ingress/`, `owner`, `node_state`): the target they
/// had when one file held the whole path, so log filters such as
/// `RUST_LOG=peerlb::adapters::ingress=debug` and the simulation's trace
/// lines (which include the target) stay as they were.
const REQUEST_PATH: &str = "peerlb::adapters::ingress";
