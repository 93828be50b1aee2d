//! Cluster membership: chitchat gossip ([`gossip`]), sealed with the
//! cluster keyring ([`keyring`]) by the transport in [`sealed`] and
//! checked against [`bounds`] before chitchat sees a datagram, members
//! dialled only once their gossip address is confirmed ([`confirm`]); and the
//! watch on this node's own process pausing ([`pause`]); the members
//! that left the view, kept for the operator ([`roster`]).

pub(crate) mod bounds;
pub(crate) mod confirm;
pub(crate) mod gossip;
pub mod keyring;
pub(crate) mod pause;
pub(crate) mod roster;
pub(crate) mod sealed;
pub(crate) mod signed;
