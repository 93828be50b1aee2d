//! Which connection to a peer carries a node's next stream, and which of
//! its connections it retires: the rules of one connection per node pair
//! (docs/architecture.md, "Connections"), as pure functions of what the
//! peer layer (`adapters/transport/peer/links.rs`) knows of each
//! connection. Times are `Duration`s since the caller's epoch.
//!
//! - **Keep.** A connection is usable for a new stream while it is open,
//!   not retired, and busy (streams open, or one ended less than `linger`
//!   ago) or quiet for less than `usable` after that; a `peerlb/1` one
//!   while it is open (its ends keep it alive).
//! - **Dialler wins.** Of several usable connections (both nodes dialled
//!   at once), both nodes of the pair keep the one dialled by the smaller
//!   node id ([`dialler_wins`]), the newest such one; the others are
//!   retired: they serve the streams already on them, and carry no new one.
//! - **Pause retirement.** Just after a pause of this node's own process,
//!   a connection from before it is retired (its peer may have closed it
//!   while this node was away): a new dial replaces it.
//! - **Retire on accept.** A connection the peer dialled to this node
//!   (`peerlb/2` or later) retires this node's quiet connections to it
//!   older than one connect timeout: the peer dials only when it holds no
//!   usable connection (it restarted, or found ours quiet too long).

use std::time::Duration;

use super::node_id::NodeId;

/// True when the connection dialled by `dialler` is the one a pair keeps
/// when both nodes dialled each other: the smaller node id's dial wins.
/// Both nodes of the pair compute the same answer.
pub(crate) fn dialler_wins(dialler: &NodeId, other: &NodeId) -> bool {
    dialler < other
}

/// What the peer layer knows of one connection to a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LinkFacts {
    /// Dialled by this node (else accepted from the peer).
    pub dialled: bool,
    /// Negotiated `peerlb/1`: usable while open.
    pub legacy: bool,
    /// Not closed.
    pub open: bool,
    /// Retired already: it carries no new stream.
    pub retired: bool,
    /// Streams open on it now.
    pub streams: u32,
    /// When the last stream on it ended (or it was established).
    pub last_busy: Duration,
    /// When its handshake completed.
    pub established: Duration,
    /// Established before a pause of this node's own that is still
    /// suspected (false when none is).
    pub predates_pause: bool,
}

/// How long a quiet connection stays usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Windows {
    /// A connection is busy this long after its last stream ended
    /// (`peer.idle_timeout_ms`).
    pub linger: Duration,
    /// And usable this long after that (half the QUIC idle timeout), so
    /// both ends still hold it.
    pub usable: Duration,
}

/// What [`choose`] decided.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Choice {
    /// The connection (index into the facts) the next stream goes on;
    /// `None`: none is usable, dial.
    pub chosen: Option<usize>,
    /// The connections to retire now, in index order (empty, without an
    /// allocation, in the usual case).
    pub retire: Vec<usize>,
}

/// The connection `me` opens its next stream to `peer` on, among `links`,
/// at `now`, and the ones it retires (module doc: keep, dialler wins,
/// pause retirement).
pub(crate) fn choose(
    me: &NodeId,
    peer: &NodeId,
    links: &[LinkFacts],
    now: Duration,
    windows: Windows,
) -> Choice {
    let mut retire: Vec<usize> = (0..links.len())
        .filter(|&i| links[i].predates_pause && !links[i].retired)
        .collect();
    let usable = |l: &LinkFacts| {
        l.open
            && !l.retired
            && !l.predates_pause
            && (l.legacy || l.streams > 0 || now < l.last_busy + windows.linger + windows.usable)
    };
    let wins = |l: &LinkFacts| {
        if l.dialled {
            dialler_wins(me, peer)
        } else {
            dialler_wins(peer, me)
        }
    };
    // The best usable one: the pair's dialler's, then the newest (the
    // last of equals, as a stable sort's last element).
    let mut chosen: Option<usize> = None;
    for (i, l) in links.iter().enumerate() {
        if !usable(l) {
            continue;
        }
        let better = chosen.is_none_or(|c| {
            let c = &links[c];
            (wins(l), l.established) >= (wins(c), c.established)
        });
        if better {
            chosen = Some(i);
        }
    }
    if let Some(c) = chosen {
        retire.extend((0..links.len()).filter(|&i| i != c && usable(&links[i])));
        retire.sort_unstable();
    }
    Choice { chosen, retire }
}

/// The connections (indexes into `links`, this node's to the peer before
/// the new one) that a new connection retires at `now`: when the peer
/// dialled it on `peerlb/2` or later (`accepted_current`), every one
/// without streams established at least `connect_timeout` ago; else none.
pub(crate) fn retire_on_register(
    links: &[LinkFacts],
    accepted_current: bool,
    now: Duration,
    connect_timeout: Duration,
) -> Vec<usize> {
    if !accepted_current {
        return Vec::new();
    }
    (0..links.len())
        .filter(|&i| {
            links[i].streams == 0 && now.saturating_sub(links[i].established) >= connect_timeout
        })
        .collect()
}

#[cfg(test)]
mod tests;
