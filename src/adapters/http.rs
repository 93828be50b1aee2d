//! The HTTP server kit the client listeners (`front/ingress`) and the
//! admin listener (`ops/admin_server`) share: the accept loop and the
//! connection settings, HTTP/1.1 and HTTP/2 ([`server`]); the connection
//! table and its limits ([`conns`]); what a connection goes through before
//! HTTP ([`conn`]: the PROXY header, [`proxy_protocol`], and the TLS
//! handshake, [`entry_tls`], with client certificates per SNI name,
//! [`client_cert`]); HTTP/2 prior knowledge on cleartext
//! ([`preface`]); an HTTP/2 connection's streams and its rapid-reset rule
//! ([`h2_streams`]); the client socket's send timeout ([`send_timeout`]);
//! response bodies under backpressure and the node's response budget
//! ([`relay`]).

pub(crate) mod client_cert;
pub(crate) mod client_gone;
pub(crate) mod conn;
pub(crate) mod conns;
pub mod entry_tls;
pub(crate) mod h2_streams;
pub(crate) mod on_own_wake;
pub(crate) mod preface;
pub(crate) mod proxy_protocol;
pub(crate) mod relay;
pub(crate) mod send_timeout;
pub(crate) mod server;

pub(crate) use conn::{ConnInfo, ListenerSetup};
pub(crate) use conns::{ConnTable, Refusal};
pub(crate) use server::{ConnEvent, Handler, serve};
