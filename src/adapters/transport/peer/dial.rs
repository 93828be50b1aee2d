//! How hard a node dials a member: members come only from configured seeds
//! and authenticated gossip (the keyring), but even a key holder must not
//! turn the cluster into a traffic source aimed at an address of its
//! choosing. Two rules:
//!
//! - at most `gossip.max_members` members are supervised at a time
//!   (members kept first, new ones in id order: [`select`]), so made-up
//!   members cannot grow a node's connection state without bound;
//! - the delay between attempts doubles from [`FIRST`]; it stops at
//!   [`CAP_KNOWN`] for a member that completed a handshake once (a peer
//!   that restarts is back within about a second) and at
//!   [`CAP_NEVER_CONNECTED`] for an address that never completed one, so
//!   such an address gets one connection attempt (a QUIC Initial and its
//!   retransmissions, a few KB) per minute, not one per second;
//! - an address that never completed a handshake is given up after
//!   [`GIVE_UP_AFTER`] attempts in a row: it is not dialled again until
//!   gossip announces the member with another address or generation (or
//!   it drops out of the live set and comes back), and the member can
//!   still dial this node. A key holder announcing a ghost thus gets at
//!   most `GIVE_UP_AFTER` connection attempts per node per announcement
//!   (each at most one `connect_timeout` of QUIC Initials), however long
//!   it keeps the ghost alive. A real node whose peer port stayed
//!   unreachable that long (firewall) is dialled again after it restarts
//!   (a new generation), or as soon as it dials this node itself.
//!
//! A dial that fails while the peer's own connection to this node has
//! completed counts as a success: the peer stays routable over that
//! connection (a node that restarts under load dials its peers too, and
//! their dials back may time out meanwhile).

use std::time::Duration;

/// Delay after the first failed attempt.
pub(crate) const FIRST: Duration = Duration::from_millis(50);

/// Longest delay for a member that completed a handshake before.
pub(crate) const CAP_KNOWN: Duration = Duration::from_secs(1);

/// Longest delay for an address that never completed a handshake.
pub(crate) const CAP_NEVER_CONNECTED: Duration = Duration::from_secs(60);

/// Attempts in a row after which an address that never completed a
/// handshake is given up (about 0.35 s of backoff plus three connect
/// timeouts: a node that is up answers its first Initial).
pub(crate) const GIVE_UP_AFTER: u32 = 3;

/// True when the supervisor stops after `failures` failed attempts in a
/// row to a member that completed a handshake (`ever_connected`) or not.
pub(crate) fn give_up(failures: u32, ever_connected: bool) -> bool {
    !ever_connected && failures >= GIVE_UP_AFTER
}

/// The delay after `prev`, doubled up to the cap that applies.
pub(crate) fn next_backoff(prev: Duration, ever_connected: bool) -> Duration {
    let cap = if ever_connected {
        CAP_KNOWN
    } else {
        CAP_NEVER_CONNECTED
    };
    prev.saturating_mul(2).min(cap)
}

/// Which of `wanted` (id order) to supervise, given those already
/// supervised: every wanted member already supervised, then new ones in
/// order, up to `max` (`gossip.max_members`).
pub(crate) fn select<'a, K: Ord + 'a>(
    wanted: impl Iterator<Item = &'a K>,
    supervised: impl Fn(&K) -> bool,
    max: usize,
) -> Vec<&'a K> {
    let (mut kept, new): (Vec<&K>, Vec<&K>) = wanted.partition(|k| supervised(k));
    let room = max.saturating_sub(kept.len());
    kept.extend(new.into_iter().take(room));
    kept.truncate(max);
    kept.sort();
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_connected_addresses_back_off_to_a_minute_known_peers_to_a_second() {
        let mut d = FIRST;
        let mut attempts_in_first_hour = 0;
        let mut t = Duration::ZERO;
        while t < Duration::from_secs(3600) {
            t += d;
            attempts_in_first_hour += 1;
            d = next_backoff(d, false);
        }
        assert_eq!(d, CAP_NEVER_CONNECTED);
        // 11 doublings to the cap, then one a minute.
        assert!(
            attempts_in_first_hour <= 11 + 60,
            "{attempts_in_first_hour}"
        );
        let mut d = FIRST;
        for _ in 0..10 {
            d = next_backoff(d, true);
        }
        assert_eq!(d, CAP_KNOWN);
    }

    #[test]
    fn only_never_connected_addresses_are_given_up_after_three_attempts() {
        assert!(!give_up(GIVE_UP_AFTER - 1, false));
        assert!(give_up(GIVE_UP_AFTER, false));
        assert!(!give_up(1000, true));
    }

    #[test]
    fn supervised_members_are_kept_and_new_ones_fill_up_to_the_cap() {
        let wanted: Vec<u32> = (0..200).collect();
        let chosen = select(wanted.iter(), |k| *k >= 190, 128);
        assert_eq!(chosen.len(), 128);
        for k in 190..200 {
            assert!(chosen.contains(&&k), "{k} was dropped");
        }
        assert!(chosen.contains(&&0));
        let few: Vec<u32> = (0..3).collect();
        assert_eq!(select(few.iter(), |_| false, 128), vec![&0, &1, &2]);
    }
}
