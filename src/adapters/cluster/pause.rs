//! Pauses of this node's own process: a long GC pause of the host, a VM
//! stall, a SIGSTOP. While a node is stopped its peers hear nothing from
//! it and close their busy connections to it; when it resumes, its clock
//! has jumped and every peer looks silent or gone at once, although it is
//! the node itself that was away. A node that concluded from that that
//! its peers are dead would serve alone, as the only member of its view,
//! the requests that queued during its pause: keys it does not own.
//!
//! [`PauseWatch`] notices such a pause with a ticker that wakes every
//! [`PauseWatch::tick`]: a wake that comes more than `threshold` late
//! means the process (or its runtime) did not run meanwhile. From the
//! moment a wake is overdue until `grace` after the late wake, the node
//! is *suspect of a pause* ([`PauseWatch::suspected`]): its failure
//! decisions are held (the membership view keeps the peers it had, a busy
//! connection's silence is not judged, an ejected peer is dialled again
//! on demand) while it re-validates its peers with new connections and
//! fresh gossip. Whatever is still gone when the grace ends is dropped
//! then. The late wake logs one line with how long the node was paused.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use crate::seam::{NodeEvent, Observer};

/// The tracing target of this module's events: its path before the
/// adapters were put in wings (`crate::adapters::REQUEST_PATH`).
const LOG: &str = "peerlb::adapters::pause";

/// Detects pauses of this node's process and holds its failure decisions
/// for a grace period after one (see the module doc).
#[derive(Debug)]
pub(crate) struct PauseWatch {
    epoch: Instant,
    tick: Duration,
    threshold: Duration,
    grace: Duration,
    /// When the ticker last ran, in ms since `epoch`.
    last_tick_ms: AtomicU64,
    /// Failure decisions are held until then, in ms since `epoch`.
    grace_until_ms: AtomicU64,
    /// The last wake before the latest pause, in ms since `epoch`.
    paused_since_ms: AtomicU64,
}

impl PauseWatch {
    /// A watch that counts a wake `threshold` or more late as a pause and
    /// holds failure decisions for `grace` after it. The ticker wakes
    /// every `threshold / 2` (at least 10 ms).
    pub(crate) fn new(threshold: Duration, grace: Duration) -> PauseWatch {
        PauseWatch {
            epoch: Instant::now(),
            tick: (threshold / 2).max(Duration::from_millis(10)),
            threshold,
            grace,
            last_tick_ms: AtomicU64::new(0),
            grace_until_ms: AtomicU64::new(0),
            paused_since_ms: AtomicU64::new(0),
        }
    }

    /// The pause threshold of a node: half the peer silence timeout
    /// (`peer.idle_timeout_ms`, 1 s by default: a peer closes a busy
    /// connection after that much silence, and this node's keeper would
    /// judge its peers silent after as long). Gossip's failure detector
    /// takes longer at its defaults (phi 8 with 200 ms rounds).
    pub(crate) fn threshold_for(idle_timeout: Duration) -> Duration {
        idle_timeout / 2
    }

    /// The grace after a pause: time for one dial to each peer
    /// (`limits.connect_timeout_ms`) and five gossip rounds, which bring
    /// every live member's fresh heartbeat back.
    pub(crate) fn grace_for(connect_timeout: Duration, gossip_interval: Duration) -> Duration {
        connect_timeout + gossip_interval * 5
    }

    fn ms(&self, t: Instant) -> u64 {
        u64::try_from(t.duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    /// True while this node may just have been paused: the ticker's wake
    /// is overdue by `threshold` or more (the process is not running it:
    /// it was stopped, or is only now resuming and has not reached the
    /// ticker yet), or a pause ended less than `grace` ago. Failure
    /// decisions wait while it holds.
    pub(crate) fn suspected(&self) -> bool {
        self.suspected_at(Instant::now())
    }

    /// [`Self::suspected`] at `now`, a clock read the caller made (one per
    /// request on the peer path is enough).
    pub(crate) fn suspected_at(&self, now: Instant) -> bool {
        let now = self.ms(now);
        self.overdue(now) || now < self.grace_until_ms.load(Ordering::Relaxed)
    }

    /// The ticker's wake is overdue by `threshold` at `now` (ms).
    fn overdue(&self, now: u64) -> bool {
        let overdue = u64::try_from((self.tick + self.threshold).as_millis()).unwrap_or(u64::MAX);
        now.saturating_sub(self.last_tick_ms.load(Ordering::Relaxed)) >= overdue
    }

    /// True when `t` is from before a pause this node is still suspect of
    /// ([`Self::suspected`]): a connection established then is not trusted
    /// for new requests until it has been replaced (its peer may have
    /// closed it while this node was away, and that close may not have
    /// been read yet).
    pub(crate) fn predates_pause(&self, t: Instant) -> bool {
        let (t, now) = (self.ms(t), self.ms(Instant::now()));
        if self.overdue(now) {
            return t <= self.last_tick_ms.load(Ordering::Relaxed);
        }
        now < self.grace_until_ms.load(Ordering::Relaxed)
            && t <= self.paused_since_ms.load(Ordering::Relaxed)
    }

    /// When the current grace ends (or now plus one tick, if the ticker
    /// has not run since the pause): the moment to look again.
    pub(crate) fn look_again_at(&self) -> Instant {
        let until = self.epoch + Duration::from_millis(self.grace_until_ms.load(Ordering::Relaxed));
        until.max(Instant::now() + self.tick)
    }

    /// Runs the ticker for ever: every `tick`, notes that the process ran;
    /// a wake `threshold` or more late starts a grace, logs `this node was
    /// paused` with the pause's length and reports [`NodeEvent::Paused`].
    pub(crate) async fn run(self: std::sync::Arc<Self>, observer: std::sync::Arc<dyn Observer>) {
        let mut last = Instant::now();
        self.last_tick_ms.store(self.ms(last), Ordering::Relaxed);
        loop {
            tokio::time::sleep(self.tick).await;
            let now = Instant::now();
            let late = now.duration_since(last).saturating_sub(self.tick);
            if late >= self.threshold {
                self.paused_since_ms.store(self.ms(last), Ordering::Relaxed);
                self.grace_until_ms
                    .store(self.ms(now + self.grace), Ordering::Relaxed);
                let paused_ms = u64::try_from(late.as_millis()).unwrap_or(u64::MAX);
                warn!(target: LOG,
                    paused_ms,
                    grace_ms = self.grace.as_millis() as u64,
                    "this node was paused: holding its peers in routing while it re-validates them"
                );
                observer.observe(&NodeEvent::Paused { paused_ms });
            }
            self.last_tick_ms.store(self.ms(now), Ordering::Relaxed);
            last = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Default)]
    struct Seen(Mutex<Vec<u64>>);

    impl Observer for Seen {
        fn observe(&self, event: &NodeEvent<'_>) {
            if let NodeEvent::Paused { paused_ms } = event {
                self.0.lock().unwrap().push(*paused_ms);
            }
        }
    }

    /// Lets the ticker run (virtual time, advanced in small steps as a
    /// running process's time is).
    async fn run_for(d: Duration) {
        let step = Duration::from_millis(10);
        let end = Instant::now() + d;
        while Instant::now() < end {
            tokio::time::advance(step).await;
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_wake_is_a_pause_and_holds_decisions_for_the_grace() {
        let watch = Arc::new(PauseWatch::new(
            Duration::from_millis(500),
            Duration::from_secs(2),
        ));
        let seen = Arc::new(Seen::default());
        tokio::spawn(watch.clone().run(seen.clone()));
        run_for(Duration::from_secs(3)).await;
        assert!(!watch.suspected(), "a node that runs is not suspect");
        assert!(seen.0.lock().unwrap().is_empty());

        // The process stops for 2 s: time jumps with no task running.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(
            watch.suspected(),
            "suspect before the ticker has run again (another task may resume first)"
        );
        // Before the last wake ahead of the pause (the ticker wakes every 250 ms).
        let before = Instant::now() - Duration::from_millis(2_400);
        assert!(watch.predates_pause(before));
        assert!(!watch.predates_pause(Instant::now()));
        run_for(Duration::from_millis(100)).await;
        let paused = seen.0.lock().unwrap().clone();
        assert_eq!(paused.len(), 1, "one pause reported: {paused:?}");
        assert!((1_900..=2_100).contains(&paused[0]), "{paused:?}");
        run_for(Duration::from_millis(1_700)).await;
        assert!(watch.suspected(), "still within the 2 s grace");
        assert!(watch.predates_pause(before));
        assert!(
            !watch.predates_pause(Instant::now() - Duration::from_millis(1_500)),
            "a connection made after the pause is trusted"
        );
        run_for(Duration::from_millis(400)).await;
        assert!(!watch.suspected(), "the grace ended");
        assert!(
            !watch.predates_pause(before),
            "nothing is held after the grace"
        );
        assert_eq!(seen.0.lock().unwrap().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_late_by_less_than_the_threshold_is_no_pause() {
        let watch = Arc::new(PauseWatch::new(
            Duration::from_millis(500),
            Duration::from_secs(2),
        ));
        let seen = Arc::new(Seen::default());
        tokio::spawn(watch.clone().run(seen.clone()));
        run_for(Duration::from_secs(1)).await;
        tokio::time::advance(Duration::from_millis(400)).await;
        run_for(Duration::from_millis(500)).await;
        assert!(seen.0.lock().unwrap().is_empty());
        assert!(!watch.suspected());
    }

    #[test]
    fn defaults_give_a_half_second_threshold_and_a_two_second_grace() {
        let ms = Duration::from_millis;
        assert_eq!(PauseWatch::threshold_for(ms(1_000)), ms(500));
        assert_eq!(PauseWatch::grace_for(ms(1_000), ms(200)), ms(2_000));
    }
}
