//! The transaction-stateful proxy's decisions around one forwarded SIP
//! request (RFC 3261 16 and 17), as pure values: time comes in as `now`
//! (a `Duration` since any fixed instant the caller keeps), nothing here
//! sends or waits.
//!
//! - [`EntryRelay`]: what the entry node sends the caller for one
//!   request: `100 Trying` at once for an INVITE (16.2, 17.2.1), every
//!   answer as it arrives but `100`s (16.7 step 5), at most one final
//!   answer, and `503` only when no final answer went out (16.9).
//! - [`ClientTimers`]: the owner's deadlines for its client transaction
//!   toward the SIP server: Timer B / F until the first answer, then for
//!   an INVITE Timer C (16.6 step 11, 16.7 step 2, 16.8), reset by every
//!   provisional answer but `100`; when Timer C fires after a provisional
//!   answer the owner CANCELs the branch ([`cancel_for`]) and waits Timer
//!   B more for the final answer (the server's `487`).
//! - [`stray_response`]: a response that reached a SIP listener (a server
//!   that answers a fixed address, not the `Via`) goes to the owner whose
//!   branch it carries.
//! - [`Completed`]: INVITE transactions the owner ended with a non-2xx
//!   final answer, which it ACKed itself (17.1.1.3): the caller's ACK of
//!   that answer is absorbed there (hop by hop), and a retransmission of
//!   the answer is ACKed again, until Timer D.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::{SipMessage, StartLine};

/// RFC 3261 Timer C (16.6 step 11): how long a proxy waits for a final
/// answer to an INVITE after its last provisional answer; "MUST be
/// larger than 3 minutes": 180 s by default (`limits.sip_timer_c_ms`).
pub(crate) const TIMER_C: Duration = Duration::from_secs(180);

/// RFC 3261 Timer D (17.1.1.2): how long an INVITE client transaction
/// that got a non-2xx final answer over UDP stays to absorb its
/// retransmissions, at least 32 s.
pub(crate) const TIMER_D: Duration = Duration::from_secs(32);

/// Most INVITE transactions [`Completed`] keeps; past it the oldest is
/// forgotten first (its caller's ACK would then reach the server, which
/// absorbs it as the ACK of its own completed transaction, 17.2.1).
pub(crate) const MAX_COMPLETED: usize = 100_000;

/// Whether `m` is a final response (200..=699).
fn status_of(m: &SipMessage) -> Option<u16> {
    match m.start {
        StartLine::Response { status, .. } => Some(status),
        StartLine::Request { .. } => None,
    }
}

/// The entry node's relay of the answers to one request toward its
/// caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EntryRelay {
    invite: bool,
    ack: bool,
    final_sent: bool,
}

impl EntryRelay {
    /// The relay of `req` (as the entry forwards it: the caller's `Via`
    /// on top), and the answer to send the caller at once: `100 Trying`
    /// for an INVITE (16.2: a stateful proxy sends it as soon as it
    /// handles the request, so a caller over UDP stops retransmitting,
    /// 17.1.1.2), else none.
    pub(crate) fn new(req: &SipMessage) -> (EntryRelay, Option<SipMessage>) {
        let method = req.method().unwrap_or("");
        let invite = method == "INVITE";
        let relay = EntryRelay {
            invite,
            ack: method == "ACK",
            final_sent: false,
        };
        (relay, invite.then(|| req.response(100, "Trying", None)))
    }

    /// What to send the caller of answer `m` from the owner: a `100` to an
    /// INVITE is dropped (the entry sent its own; 16.7 step 5 forbids a
    /// proxy to forward one), anything after the final answer is dropped
    /// (the owner's transaction ends there), the rest goes out.
    pub(crate) fn pass(&mut self, m: SipMessage) -> Option<SipMessage> {
        let status = status_of(&m)?;
        if self.final_sent || (self.invite && status == 100) {
            return None;
        }
        if status >= 200 {
            self.final_sent = true;
        }
        Some(m)
    }

    /// Whether a final answer went to the caller.
    #[cfg(test)]
    pub(crate) fn final_sent(&self) -> bool {
        self.final_sent
    }

    /// The answer to `req` when the entry could not get one from any
    /// candidate: `503 Service Unavailable` (16.9), unless a final answer
    /// already went out (a request failed over, or a stream that failed
    /// after its final answer: the caller gets one final answer) or `req`
    /// is an ACK (never answered).
    pub(crate) fn on_failure(&mut self, req: &SipMessage) -> Option<SipMessage> {
        if self.final_sent || self.ack {
            return None;
        }
        self.final_sent = true;
        Some(req.response(503, "Service Unavailable", None))
    }
}

/// Which of `answers`, the answers to one request gathered at once (the
/// built-in server's, over UDP), to send: all but a `100` when a final
/// answer is among them (the `100` says nothing the final answer does
/// not, and a `100` that arrives after the final one, as a
/// retransmission's may, is one a strict caller such as SIPp refuses).
pub(crate) fn moot_trying<'a>(answers: impl Iterator<Item = &'a SipMessage> + Clone) -> Vec<bool> {
    let has_final = answers
        .clone()
        .any(|m| status_of(m).is_some_and(|s| s >= 200));
    answers
        .map(|m| !(has_final && status_of(m) == Some(100)))
        .collect()
}

/// What a [`ClientTimers`] deadline means when it passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expired {
    /// No final answer: the owner answers `408 Request Timeout` (16.8:
    /// also when Timer C fires before any provisional answer).
    Timeout,
    /// Timer C fired after a provisional answer: the owner sends the
    /// server a CANCEL of the branch ([`cancel_for`]) and waits on.
    Cancel,
}

/// The deadlines of the owner's client transaction for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClientTimers {
    invite: bool,
    timer_b: Duration,
    timer_c: Duration,
    /// When the request went out.
    start: Duration,
    /// When Timer C was last (re)started: the request's sending, then
    /// each provisional answer but `100`.
    c_from: Duration,
    provisional: bool,
    /// When the owner sent its CANCEL.
    cancelled: Option<Duration>,
}

impl ClientTimers {
    /// The timers of a request sent at `now`; an INVITE when `invite`.
    /// `timer_b` bounds the wait for a first answer (Timer B or F, at
    /// most 32 s), and a non-INVITE's wait for its final answer; `timer_c`
    /// an INVITE's wait for a final answer since the last provisional one.
    pub(crate) fn new(invite: bool, now: Duration, timer_b: Duration, timer_c: Duration) -> Self {
        ClientTimers {
            invite,
            timer_b,
            timer_c,
            start: now,
            c_from: now,
            provisional: false,
            cancelled: None,
        }
    }

    /// When the transaction next needs the owner, `now`'s scale.
    pub(crate) fn deadline(&self) -> Duration {
        if let Some(at) = self.cancelled {
            return at + self.timer_b;
        }
        let c = self.c_from + self.timer_c;
        if !self.invite {
            self.start + self.timer_b
        } else if self.provisional {
            c
        } else {
            (self.start + self.timer_b).min(c)
        }
    }

    /// A provisional answer (`status` 100..=199) arrived at `now`: an
    /// INVITE's wait is Timer C's from now on (16.7 step 2: restarted by
    /// each provisional answer but `100`). Nothing changes for a
    /// non-INVITE (Timer F runs on, 17.1.2.2).
    pub(crate) fn on_provisional(&mut self, now: Duration, status: u16) {
        if !self.invite {
            return;
        }
        self.provisional = true;
        if status > 100 && self.cancelled.is_none() {
            self.c_from = now;
        }
    }

    /// The deadline passed at `now`: what to do. After [`Expired::Cancel`]
    /// the next deadline is Timer B after the CANCEL, and then
    /// [`Expired::Timeout`].
    pub(crate) fn on_deadline(&mut self, now: Duration) -> Expired {
        if self.invite && self.provisional && self.cancelled.is_none() {
            self.cancelled = Some(now);
            return Expired::Cancel;
        }
        Expired::Timeout
    }
}

/// The CANCEL of `sent`, an INVITE as the owner sent it to the server
/// (its own `Via` on top), RFC 3261 9.1: the same Request-URI, `Call-ID`,
/// `From`, `To` and `Route`, only the top `Via` (so the server matches
/// it to the INVITE's transaction), `CSeq` `<n> CANCEL`, `Max-Forwards:
/// 70`, no body.
pub(crate) fn cancel_for(sent: &SipMessage) -> SipMessage {
    super::upstream::in_transaction_of(sent, "CANCEL", None)
}

/// Where a response that reached a node's SIP listener goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stray<'a> {
    /// An answer to this node's own client transaction (toward the
    /// server, or toward a caller): handed to it as if it had come to the
    /// transaction's own socket.
    Mine,
    /// An answer to the client transaction of the owner node named: sent
    /// to it over the peer wire, once (it hands it to its transaction and
    /// never passes it on).
    Peer(&'a str),
    /// Nothing of this cluster's waits for it: dropped.
    Drop,
}

/// Where `resp`, a response that reached a SIP listener of node `me`,
/// goes: its top `Via` branch names the owner whose client transaction it
/// answers. An owner's branch toward the server
/// (`upstream::node_of_branch`) is taken only from the SIP server's
/// address (`from_server`: the source's IP is `sip_app`'s); an owner's
/// branch toward a caller (`upstream::node_of_callee_branch`: a request
/// of the server the owner relayed, answered by a caller to a listener,
/// over its own connection for one, instead of to the relaying socket)
/// from anywhere, since the caller answers from its own address. Any
/// other response, and a request, is [`Stray::Drop`].
pub(crate) fn stray_response<'a>(resp: &'a SipMessage, me: &str, from_server: bool) -> Stray<'a> {
    if status_of(resp).is_none() {
        return Stray::Drop;
    }
    let Some(branch) = resp
        .header_list("via")
        .first()
        .and_then(|v| super::Via::parse_value(v).and_then(|v| v.param("branch")))
    else {
        return Stray::Drop;
    };
    let node = super::upstream::node_of_callee_branch(branch).or_else(|| {
        from_server
            .then(|| super::upstream::node_of_branch(branch))
            .flatten()
    });
    match node {
        Some(n) if n == me => Stray::Mine,
        Some(n) => Stray::Peer(n),
        None => Stray::Drop,
    }
}

/// INVITE transactions that ended with a non-2xx final answer, by the
/// owner's branch, each with the ACK the owner sent, kept [`TIMER_D`]
/// (at most [`MAX_COMPLETED`]).
#[derive(Debug, Default)]
pub(crate) struct Completed {
    by_branch: BTreeMap<String, (Duration, SipMessage)>,
    /// Branches in the order they were added (their expiries are in
    /// order too: one Timer D for all).
    order: VecDeque<(Duration, String)>,
}

impl Completed {
    /// The transaction of `branch` ended at `now` with a non-2xx final
    /// answer, which the owner ACKed with `ack`.
    pub(crate) fn insert(&mut self, branch: String, ack: SipMessage, now: Duration) {
        self.prune(now);
        while self.order.len() >= MAX_COMPLETED {
            if let Some((_, b)) = self.order.pop_front() {
                self.by_branch.remove(&b);
            }
        }
        let until = now + TIMER_D;
        self.order.push_back((until, branch.clone()));
        self.by_branch.insert(branch, (until, ack));
    }

    /// The ACK to send again when the server resends the final answer of
    /// the transaction of `branch` at `now` (its ACK was lost, 17.1.1.2:
    /// the client transaction ACKs every retransmission in Completed).
    pub(crate) fn ack_of(&mut self, branch: &str, now: Duration) -> Option<&SipMessage> {
        self.prune(now);
        self.by_branch.get(branch).map(|(_, a)| a)
    }

    /// Whether an ACK whose owner branch is `branch`, arriving at `now`,
    /// acknowledges a non-2xx answer the owner already ACKed: it is
    /// absorbed (17.1.1.3: that ACK is hop by hop; relayed, it would
    /// reach the server a second time). The ACK of a 2xx has a branch of
    /// its own (13.2.2.4) and is relayed.
    pub(crate) fn absorbs(&mut self, branch: &str, now: Duration) -> bool {
        self.prune(now);
        self.by_branch.contains_key(branch)
    }

    /// How many transactions are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_branch.len()
    }

    fn prune(&mut self, now: Duration) {
        while let Some((until, _)) = self.order.front() {
            if *until > now {
                break;
            }
            let (until, b) = self.order.pop_front().expect("a front entry");
            // A branch added again later has a later expiry: keep it.
            if self.by_branch.get(&b).is_some_and(|(u, _)| *u == until) {
                self.by_branch.remove(&b);
            }
        }
    }
}

#[cfg(test)]
mod tests;
