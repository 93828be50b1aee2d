//! The routing engine: everything peerlb decides, with no I/O.
//!
//! No sockets, no tokio/hyper/quinn/chitchat, no clock and no unseeded
//! randomness: time comes in as `now: Duration` since an arbitrary epoch and
//! randomness as a caller-seeded `&mut impl rand::Rng`, so a simulation with
//! the same seed makes the same decisions. Results go out as values
//! (`route::Decision`). Iteration that can reach a decision uses sorted
//! `Vec`s and `BTreeMap`s, never `HashMap`.
//!
//! # Layout
//!
//! - `ring`: consistent hashing on a slot table filled by weighted
//!   rendezvous hashing (`ring/hrw`: the score and its order); owner and
//!   failover candidates of a key; bounded-load candidates (Mirrokni et al.,
//!   HAProxy `hash-balance-factor`).
//! - `rules`: data-centric rules (TOML model, compiled form) extracting a
//!   hash key from a request; the default key. `rules/xml` parses SailFin's
//!   `data-centric-rules.xml` (quick-xml), `rules/tree` evaluates its
//!   `or` / `and` / `if` expressions.
//! - `sticky`: the sticky route cookie and `;peerlb-route=` path parameter,
//!   and when a response announces a new route (`Session::announce`).
//! - `session_id`: passive sticky routes, the servers named inside the
//!   app's own session id (WebLogic `id!primary!secondary`, httpd
//!   `id.route`, or a regex).
//! - `balance`: policies as pure state machines and the `Policy` name
//!   (`kind[:local]`): round robin, random, weighted random; `balance/`
//!   holds mod_proxy_balancer's byrequests and bytraffic, mod_oc4j's metric
//!   (and its smoothing), and least-load.
//! - `node_id`: `NodeId`, a node's name, and the rules it must follow (it
//!   is also a DNS label of the node's certificate name).
//! - `membership`: the published node state and the immutable membership
//!   view with its ring and version.
//! - `ownership`: a key's owner in a view and the key ranges (ring
//!   points) that moved to or from a node between two views: the answers
//!   of an embedded app's `Handle`.
//! - `route`: `Router::decide(request, view, now, rng) -> Decision` (and
//!   `decide_with_loads` with the entry's own in-flight counts).
//! - `slow_start`: the weight a node publishes while it ramps up after it
//!   joins or returns (HAProxy `slowstart`), step by step.
//! - `sip`: SIP messages (RFC 3261): parsing and stream framing, the
//!   default SIP hash key (From tag + Call-ID), the dialog stickiness
//!   parameter in `Record-Route` / `Route`, the built-in demo user
//!   agent server's answers (`sip/uas`), and the owner's client
//!   transaction toward an upstream SIP server (`sip/upstream`).
//! - `gossip_budget`: the members a full gossip digest leaves room for in
//!   one datagram (`gossip.max_members`), the datagram and seal sizes.
//! - `view_compose`: which members a node's view is made of (gossip's
//!   live members with an up peer link, this node always, the silent ones
//!   held just after its own pause).
//! - `operator`: the operator's rules for a node's own state (leaving is
//!   final, weight 0 needs a weighted peer, when a timed drain ends).
//! - `failover`: the replay plan of a request (which body is kept to be
//!   sent again) and what the entry does after an attempt on a candidate
//!   failed.
//! - `header_scan`: header lookups by name that scan a small map
//!   instead of hashing the name (the request path's many lookups of
//!   names most requests do not carry).
//! - `peer_link`: which connection to a peer carries the next stream and
//!   which are retired (keep, dialler wins, pause retirement, retire on
//!   accept).

pub(crate) mod balance;
pub(crate) mod failover;
pub(crate) mod gossip_budget;
pub(crate) mod header_scan;
pub(crate) mod membership;
pub(crate) mod node_id;
pub(crate) mod operator;
pub(crate) mod ownership;
pub(crate) mod peer_link;
pub(crate) mod ring;
pub(crate) mod route;
pub(crate) mod rules;
pub(crate) mod session_id;
pub(crate) mod sip;
pub(crate) mod slow_start;
pub(crate) mod sticky;
pub(crate) mod view_compose;

pub(crate) use sticky::{RouteCookie, SameSite};
pub mod testing;
