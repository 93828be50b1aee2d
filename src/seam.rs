//! The I/O seam's traits and the events a node reports through it: what
//! the adapters take from the outside world ([`Connection`],
//! [`HttpListener`], a wall [`Clock`]) and give back to it
//! ([`NodeEvent`] through an [`Observer`]). They sit below the adapters;
//! the sockets that implement them in production and [`crate::Env`],
//! which hands them to a node, are `env.rs`, above the adapters. The
//! public paths are `peerlb::env::...` (re-exported there).

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::engine::node_id::NodeId;

/// A client connection accepted by an [`HttpListener`].
pub trait Connection: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Connection for T {}

/// What [`HttpListener::accept`] returns.
pub type Accepted<'a> =
    Pin<Box<dyn Future<Output = io::Result<(Box<dyn Connection>, SocketAddr)>> + Send + 'a>>;

/// A bound client listener (TCP in production, turmoil in a simulation).
pub trait HttpListener: Send + 'static {
    /// Waits for the next client connection and its remote address.
    fn accept(&mut self) -> Accepted<'_>;
    /// The bound address (for logs).
    fn local_addr(&self) -> io::Result<SocketAddr>;
}

impl HttpListener for tokio::net::TcpListener {
    fn accept(&mut self) -> Accepted<'_> {
        Box::pin(async move {
            let (s, a) = tokio::net::TcpListener::accept(self).await?;
            let _ = s.set_nodelay(true);
            Ok((Box::new(s) as Box<dyn Connection>, a))
        })
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        tokio::net::TcpListener::local_addr(self)
    }
}

/// The wall clock of a node: generation ids, QUIC address-validation
/// tokens (quinn's `TimeSource`) and certificate validity (rustls'
/// `TimeProvider`). Intervals and timeouts use `tokio::time`, never this.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current wall-clock time.
    fn now(&self) -> SystemTime;
}

/// The operating system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    // The wall clock, read only here (clippy.toml): the generation id and
    // the certificate checks; a simulation hands in its own clock.
    #[allow(clippy::disallowed_methods)]
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// [`Clock`] as quinn's token time source and rustls' time provider.
#[derive(Debug, Clone)]
pub(crate) struct ClockAdapter(pub(crate) Arc<dyn Clock>);

impl quinn::TimeSource for ClockAdapter {
    fn now(&self) -> SystemTime {
        self.0.now()
    }
}

impl rustls::time_provider::TimeProvider for ClockAdapter {
    fn current_time(&self) -> Option<rustls_pki_types::UnixTime> {
        let d = self.0.now().duration_since(std::time::UNIX_EPOCH).ok()?;
        Some(rustls_pki_types::UnixTime::since_unix_epoch(d))
    }
}

/// What a node did, reported to its [`Observer`] as it happens (on the
/// task that did it, synchronously: an observer must not block). The
/// node's log lines say the same for people; these are for programs and
/// do not change when a log message is reworded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeEvent<'a> {
    /// The node accepts clients (logged as `node running`).
    Running {
        /// This run's generation id (`Env::generation`).
        generation: u64,
    },
    /// The node's membership view changed (logged as `membership view
    /// changed`): the ring it routes on from now.
    ViewChanged {
        /// The view's version (increases on every change).
        version: u64,
        /// Each serving member and its weight, in id order (the ring's
        /// members; the node itself included while it serves).
        serving: &'a [(NodeId, u32)],
    },
    /// The node's app starts serving a request (once per app invocation,
    /// logged at debug as `app serving`).
    Served {
        /// The node that received the request from its client.
        entry: &'a str,
        /// The hash key it was routed on, if any.
        key: Option<&'a str>,
        /// Its request-target's path and query (`/kv/k1?user=u&r=c1-7`).
        path_and_query: &'a str,
    },
    /// The peer's connection was lost: it is out of this node's ring until
    /// it reconnects.
    PeerEjected {
        /// The peer.
        peer: &'a NodeId,
    },
    /// The peer proved its identity on a new connection after being
    /// ejected (or for the first time): routable again.
    PeerRestored {
        /// The peer.
        peer: &'a NodeId,
    },
    /// The node's own process was paused (a wake of its pause ticker came
    /// late: a GC pause, a VM stall, SIGSTOP); logged as `this node was
    /// paused`. Its failure decisions are held for a grace period while it
    /// re-validates its peers.
    Paused {
        /// How long it did not run, in ms (an estimate, to the ticker's
        /// period).
        paused_ms: u64,
    },
}

/// Receives a node's [`NodeEvent`]s.
pub trait Observer: Send + Sync + 'static {
    /// Called once per event, on the node's task that caused it; must
    /// return promptly (no I/O, no blocking lock held across awaits).
    fn observe(&self, event: &NodeEvent<'_>);
}

/// The production observer: ignores every event (the log lines carry them).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl Observer for NoObserver {
    fn observe(&self, _: &NodeEvent<'_>) {}
}
