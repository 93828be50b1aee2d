//! The protocol fronts at the entry node: the HTTP request path
//! ([`ingress`] and its stages), the checks of what a client sent
//! ([`client_input`]), HTTP/2 extended CONNECT for WebSockets
//! ([`extended_connect`]) and the SIP entry ([`sip`]).

pub(crate) mod client_input;
pub(crate) mod extended_connect;
pub(crate) mod ingress;
pub(crate) mod sip;
