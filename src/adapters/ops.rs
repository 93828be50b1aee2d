//! Operations: the admin API ([`admin`], with the manager and the members
//! admin), the gossip keyring admin ([`keyring_admin`]), the health check
//! ([`health`]), the metrics page ([`metrics_page`]) and the admin
//! listener ([`admin_server`]).

pub(crate) mod admin;
pub(crate) mod admin_server;
pub(crate) mod health;
pub(crate) mod keyring_admin;
pub(crate) mod metrics_page;
