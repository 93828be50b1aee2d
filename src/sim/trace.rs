//! The event trace of one simulation run and its hash.
//!
//! Every line is `<virtual ms>.<us> <host> <level> <target> <message>
//! <fields>`: the nodes' own tracing events (targets `peerlb::*`, captured
//! by [`TraceLayer`] on the simulation's thread, attributed to the turmoil
//! host whose tokio runtime emitted them) and the harness's events (faults, client
//! requests and their outcomes). The hash is xxh3-64 over the lines in
//! order, so two runs with the same seed must print the same hash.

use std::cell::Cell;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use xxhash_rust::xxh3::Xxh3;

thread_local! {
    /// Virtual time of the simulation running on this thread, in ns.
    static NOW: Cell<u64> = const { Cell::new(0) };
}

/// The virtual time of the simulation on this thread (the start of the
/// current turmoil step).
pub fn now() -> Duration {
    Duration::from_nanos(NOW.get())
}

pub(crate) fn set_now(d: Duration) {
    NOW.set(d.as_nanos() as u64);
}

/// A node event the harness interprets, as a node's observer reported it
/// ([`crate::env::NodeEvent`], through [`SimObserver`]), never parsed
/// from log text. Events do not go into the trace or its hash (the nodes'
/// log lines do).
#[derive(Debug, Clone)]
pub enum NodeEvent {
    /// The node's routable set changed.
    View {
        /// Virtual time.
        at: Duration,
        /// The node.
        host: String,
        /// Each serving member and its weight, in id order.
        serving: Vec<(String, u32)>,
    },
    /// The node accepts clients.
    Running {
        /// Virtual time.
        at: Duration,
        /// The node.
        host: String,
        /// Its generation.
        generation: u64,
    },
    /// The node's app is serving a request.
    AppServe {
        /// Virtual time.
        at: Duration,
        /// The node.
        host: String,
        /// The request's path and query.
        path: String,
    },
    /// The node ejected a peer (its connection was lost).
    PeerEjected {
        /// Virtual time.
        at: Duration,
        /// The node.
        host: String,
        /// The peer.
        peer: String,
    },
    /// The node found a peer routable again (or for the first time).
    PeerRestored {
        /// Virtual time.
        at: Duration,
        /// The node.
        host: String,
        /// The peer.
        peer: String,
    },
}

/// The observer a simulated node is built with: records its events, at
/// the current virtual time, for the harness ([`Trace::take_events`]).
pub struct SimObserver {
    /// The node's host name.
    pub host: String,
    /// The run's trace.
    pub trace: Trace,
}

impl crate::env::Observer for SimObserver {
    fn observe(&self, event: &crate::env::NodeEvent<'_>) {
        use crate::env::NodeEvent as E;
        let (at, host) = (now(), self.host.clone());
        let ev = match *event {
            E::Running { generation } => NodeEvent::Running {
                at,
                host,
                generation,
            },
            E::ViewChanged { serving, .. } => NodeEvent::View {
                at,
                host,
                serving: serving.iter().map(|(id, w)| (id.to_string(), *w)).collect(),
            },
            E::Served { path_and_query, .. } => NodeEvent::AppServe {
                at,
                host,
                path: path_and_query.to_owned(),
            },
            E::PeerEjected { peer } => NodeEvent::PeerEjected {
                at,
                host,
                peer: peer.to_string(),
            },
            E::PeerRestored { peer } => NodeEvent::PeerRestored {
                at,
                host,
                peer: peer.to_string(),
            },
            // A simulated host never stops while time runs on.
            E::Paused { .. } => return,
        };
        self.trace.0.lock().expect("trace lock").events.push(ev);
    }
}

#[derive(Default)]
struct Inner {
    /// The turmoil host each tokio runtime belongs to (every host has its own).
    #[cfg(tokio_unstable)]
    hosts: std::collections::HashMap<tokio::runtime::Id, String>,
    hasher: Option<Xxh3>,
    count: u64,
    lines: Option<Vec<String>>,
    events: Vec<NodeEvent>,
}

/// The trace of one run: a hash over every line, optionally the lines.
#[derive(Clone)]
pub struct Trace(Arc<Mutex<Inner>>);

impl Trace {
    /// A new trace; `keep_lines` keeps every line (for `--trace`).
    pub fn new(keep_lines: bool) -> Trace {
        Trace(Arc::new(Mutex::new(Inner {
            hasher: Some(Xxh3::new()),
            lines: keep_lines.then(Vec::new),
            ..Inner::default()
        })))
    }

    /// Appends one line at the current virtual time.
    pub fn line(&self, host: &str, what: std::fmt::Arguments<'_>) {
        let t = now();
        let line = format!(
            "{:>6}.{:03} {host} {what}",
            t.as_millis(),
            t.subsec_micros() % 1000
        );
        self.push(line);
    }

    fn push(&self, line: String) {
        let mut g = self.0.lock().expect("trace lock");
        if let Some(h) = &mut g.hasher {
            h.update(line.as_bytes());
            h.update(b"\n");
        }
        g.count += 1;
        if let Some(l) = &mut g.lines {
            l.push(line);
        }
    }

    /// Names the host whose tokio runtime is the current one: call it first
    /// thing in every host's software (again after each restart).
    pub fn register_host(&self, name: &str) {
        #[cfg(tokio_unstable)]
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            self.0
                .lock()
                .expect("trace lock")
                .hosts
                .insert(h.id(), name.to_owned());
        }
        #[cfg(not(tokio_unstable))]
        let _ = name;
    }

    /// The host whose runtime is current, or `-`.
    fn current_host(&self) -> String {
        #[cfg(tokio_unstable)]
        if let Ok(h) = tokio::runtime::Handle::try_current()
            && let Some(n) = self.0.lock().expect("trace lock").hosts.get(&h.id())
        {
            return n.clone();
        }
        "-".to_owned()
    }

    /// Node events seen since the last call.
    pub fn take_events(&self) -> Vec<NodeEvent> {
        std::mem::take(&mut self.0.lock().expect("trace lock").events)
    }

    /// Lines so far.
    pub fn count(&self) -> u64 {
        self.0.lock().expect("trace lock").count
    }

    /// The hash of every line so far, as 16 hex digits.
    pub fn hash(&self) -> String {
        let g = self.0.lock().expect("trace lock");
        format!("{:016x}", g.hasher.as_ref().map_or(0, Xxh3::digest))
    }

    /// The kept lines (empty unless made with `keep_lines`).
    pub fn lines(&self) -> Vec<String> {
        self.0
            .lock()
            .expect("trace lock")
            .lines
            .clone()
            .unwrap_or_default()
    }
}

/// The tracing layer that writes node events into a [`Trace`].
pub struct TraceLayer(pub Trace);

#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => {
                let _ = write!(self.message, "{value:?}");
            }
            name => {
                let _ = write!(self.rest, " {name}={value:?}");
            }
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.rest, " {}={value:?}", field.name());
        }
    }
}

impl<S> tracing_subscriber::Layer<S> for TraceLayer
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        if !meta.target().starts_with("peerlb") {
            return;
        }
        let host = self.0.current_host();
        let mut f = Fields::default();
        event.record(&mut f);
        self.0.line(
            &host,
            format_args!("{} {} {}{}", meta.level(), meta.target(), f.message, f.rest),
        );
    }
}
