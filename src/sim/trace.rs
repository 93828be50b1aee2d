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

/// A node event the harness interprets (the rest only goes into the hash).
#[derive(Debug, Clone)]
pub enum NodeEvent {
    /// `membership view changed`: the node's routable set.
    View {
        /// Virtual time.
        at: Duration,
        /// The node.
        host: String,
        /// Serving ids, as the node logged them (`["n1", "n2"]`).
        serving: String,
        /// `id=weight` of each serving member (`n1=300 n2=100`).
        weights: String,
    },
    /// `node running`: the node accepts clients.
    Running {
        /// Virtual time.
        at: Duration,
        /// The node.
        host: String,
        /// Its generation.
        generation: u64,
    },
    /// `app serving`: the node's app is serving a request.
    AppServe {
        /// Virtual time.
        at: Duration,
        /// The node.
        host: String,
        /// The request path.
        path: String,
    },
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
    serving: Option<String>,
    weights: Option<String>,
    path: Option<String>,
    generation: Option<u64>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => {
                let _ = write!(self.message, "{value:?}");
            }
            name => {
                let v = format!("{value:?}");
                if name == "serving" {
                    self.serving = Some(v.clone());
                }
                if name == "weights" {
                    self.weights = Some(v.clone());
                }
                if name == "generation" {
                    self.generation = v.parse().ok();
                }
                if name == "uri" {
                    self.path = Some(v.clone());
                }
                let _ = write!(self.rest, " {name}={v}");
            }
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            if field.name() == "uri" {
                self.path = Some(value.to_owned());
            }
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
        let at = now();
        let ev = match f.message.as_str() {
            "membership view changed" => f.serving.clone().map(|serving| NodeEvent::View {
                at,
                host: host.clone(),
                serving,
                weights: f.weights.clone().unwrap_or_default(),
            }),
            "node running" => Some(NodeEvent::Running {
                at,
                host: host.clone(),
                generation: f.generation.unwrap_or(0),
            }),
            "app serving" => f.path.clone().map(|path| NodeEvent::AppServe {
                at,
                host: host.clone(),
                path,
            }),
            _ => None,
        };
        if let Some(ev) = ev {
            self.0.0.lock().expect("trace lock").events.push(ev);
        }
        self.0.line(
            &host,
            format_args!("{} {} {}{}", meta.level(), meta.target(), f.message, f.rest),
        );
    }
}
