//! The callers' TCP and TLS connections this node accepted, by flow id
//! (RFC 5923 connection reuse; the flow token of RFC 5626 5.2): the entry
//! names a connection in the `Record-Route` of a dialog-creating request
//! it took over it (`peerlb-flow=<id>.<node>`), and a request the SIP
//! server sends toward that caller is written on it, here or, over the
//! peer wire, on the node that holds it (`upstream/flow.rs`).
//!
//! An id is 16 hex digits drawn from a per-process random start, so an id
//! of a node that restarted names no connection of the new process.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes one whole SIP message on a connection; `false` once the
/// connection's writer is gone.
pub(crate) type FlowSender = Box<dyn Fn(Vec<u8>) -> bool + Send + Sync>;

/// The open flows of one node.
pub(crate) struct Flows {
    salt: u64,
    next: AtomicU64,
    open: Mutex<HashMap<u64, FlowSender>>,
}

impl Default for Flows {
    fn default() -> Self {
        use std::hash::BuildHasher as _;
        Flows {
            salt: std::collections::hash_map::RandomState::new().hash_one(0u8),
            next: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
        }
    }
}

impl std::fmt::Debug for Flows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.open.lock().expect("flows lock").len();
        f.debug_struct("Flows").field("open", &n).finish()
    }
}

impl Flows {
    /// Registers a connection written through `send`; it stays until the
    /// returned [`Flow`] is dropped (the connection's task ends).
    pub(crate) fn register(self: &Arc<Self>, send: FlowSender) -> Flow {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let id = xxhash_rust::xxh3::xxh3_64_with_seed(&n.to_le_bytes(), self.salt);
        self.open.lock().expect("flows lock").insert(id, send);
        Flow {
            flows: self.clone(),
            id,
        }
    }

    /// Writes `bytes` on the flow whose id (hex) is `id`: `false` when no
    /// such flow is open (never was, or its connection closed).
    pub(crate) fn send(&self, id: &str, bytes: Vec<u8>) -> bool {
        let Ok(id) = u64::from_str_radix(id, 16) else {
            return false;
        };
        let open = self.open.lock().expect("flows lock");
        open.get(&id).is_some_and(|send| send(bytes))
    }
}

/// One registered connection, removed from its [`Flows`] when dropped.
pub(crate) struct Flow {
    flows: Arc<Flows>,
    id: u64,
}

impl Flow {
    /// The flow's id as a `peerlb-flow` token carries it (16 hex digits).
    pub(crate) fn id(&self) -> String {
        format!("{:016x}", self.id)
    }
}

impl Drop for Flow {
    fn drop(&mut self) {
        self.flows.open.lock().expect("flows lock").remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registered flow takes messages until it is dropped; an unknown
    /// or malformed id takes none; a writer that is gone reports it.
    #[test]
    fn a_flow_takes_messages_while_registered() {
        let flows = Arc::new(Flows::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let flow = flows.register(Box::new(move |b| tx.send(b).is_ok()));
        let id = flow.id();
        assert_eq!(id.len(), 16);
        assert!(flows.send(&id, b"BYE".to_vec()));
        assert_eq!(rx.recv().unwrap(), b"BYE");
        assert!(!flows.send("zz", b"BYE".to_vec()));
        let other = flows.register(Box::new(|_| false));
        assert_ne!(other.id(), id);
        assert!(!flows.send(&other.id(), b"BYE".to_vec()));
        drop(flow);
        assert!(!flows.send(&id, b"BYE".to_vec()));
    }
}
