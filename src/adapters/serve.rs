//! The serving side: the owner ([`owner`]: what a node does with a
//! request it serves, local or forwarded by a peer), the app ([`app`]:
//! built-in or upstream), the upstream pool ([`upstream`]), the
//! `X-Forwarded-*` writers ([`forwarded`]) and the SIP app ([`sip`]: demo
//! server or relay to an upstream SIP server).

pub(crate) mod app;
pub(crate) mod forwarded;
pub(crate) mod owner;
pub(crate) mod sip;
pub(crate) mod upstream;
