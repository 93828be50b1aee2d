//! One HTTP/2 connection's streams: how many are open (the idle close),
//! and the rapid-reset defence (CVE-2023-44487) by rate, not by lifetime.
//!
//! **Premature resets.** A stream the client resets before peerlb
//! answered it, less than [`PREMATURE_LIFETIME`] after it started, is a
//! premature reset (Envoy's `premature_reset_min_stream_lifetime_seconds`,
//! 1 s by default). A stream that ran longer before its reset is an
//! ordinary cancel (a browser leaving a page, a gRPC deadline) and never
//! counts.
//!
//! **The rule, over a window of time.** The connection's streams are
//! counted in windows of [`RESET_WINDOW`] (10 s); the rule reads the
//! current window and the one before it (10-20 s of history). A
//! connection is a flood when those windows hold at least
//! [`RESET_MIN_PREMATURE`] premature resets (200: 10 a second or more)
//! and they are more than half of the streams started in them. A client
//! that cancels one stream a second runs for ever; one that opens and
//! resets hundreds a second is cut within its first few hundred streams.
//! (The rule of earlier versions counted over the connection's lifetime,
//! so a normal client was cut after its 200th cancel however slowly they
//! came.)
//!
//! **The cut.** The connection gets GOAWAY naming the last stream
//! processed (hyper's graceful shutdown: every stream at or below it is
//! finished and answered, the client retries the rest elsewhere), then is
//! closed once they are done or after [`FLOOD_DRAIN`], whichever comes
//! first; never a bare close. Streams the client resets before hyper
//! accepts them are bounded by the h2 crate itself (see `server.rs`).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// A stream reset this soon after it started is premature.
pub(crate) const PREMATURE_LIFETIME: Duration = Duration::from_secs(1);

/// The length of one counting window.
pub(crate) const RESET_WINDOW: Duration = Duration::from_secs(10);

/// Premature resets in the current and the previous window that make a
/// flood (with more than half of the streams started in them).
pub(crate) const RESET_MIN_PREMATURE: u64 = 200;

/// How long a flooding connection has, after its GOAWAY, to finish the
/// streams at or below the last one processed.
pub(crate) const FLOOD_DRAIN: Duration = Duration::from_secs(5);

/// Streams started and premature resets in two consecutive windows of
/// [`RESET_WINDOW`] (times in ms since the connection's epoch).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResetWindows {
    /// Start of the current window, ms.
    start_ms: u64,
    /// (started, premature) in the current window.
    current: (u64, u64),
    /// The same in the window before it (zero when that one is older).
    previous: (u64, u64),
}

impl ResetWindows {
    /// Moves the windows on to `now_ms`.
    fn roll(&mut self, now_ms: u64) {
        let len = RESET_WINDOW.as_millis() as u64;
        let elapsed = now_ms.saturating_sub(self.start_ms);
        if elapsed < len {
            return;
        }
        self.previous = if elapsed < 2 * len {
            self.current
        } else {
            (0, 0)
        };
        self.current = (0, 0);
        self.start_ms = now_ms - elapsed % len;
    }

    /// A stream started at `now_ms`.
    pub(crate) fn started(&mut self, now_ms: u64) {
        self.roll(now_ms);
        self.current.0 += 1;
    }

    /// A stream that started at `began_ms` was reset, unanswered, at
    /// `now_ms`; true when the connection is now a flood (see the module
    /// doc).
    pub(crate) fn reset(&mut self, began_ms: u64, now_ms: u64) -> bool {
        self.roll(now_ms);
        if now_ms.saturating_sub(began_ms) >= PREMATURE_LIFETIME.as_millis() as u64 {
            return false;
        }
        self.current.1 += 1;
        let started = self.current.0 + self.previous.0;
        let premature = self.current.1 + self.previous.1;
        premature >= RESET_MIN_PREMATURE && premature.saturating_mul(2) > started
    }
}

/// Counts one HTTP/2 connection's streams: started and reset before their
/// answer (over its life, for the log), the rate rule's windows, open
/// now, and when the last one started or ended (idle close).
pub(crate) struct ConnStreams {
    started: AtomicU64,
    premature: AtomicU64,
    pub(crate) active: AtomicU64,
    windows: Mutex<ResetWindows>,
    /// Time of the last stream start or end, in ms since `epoch`.
    last_ms: AtomicU64,
    epoch: tokio::time::Instant,
    /// Woken once when the rule first holds.
    pub(crate) flood: tokio::sync::Notify,
    /// Set when `flood` was woken.
    flooded: AtomicBool,
}

impl ConnStreams {
    pub(crate) fn new() -> ConnStreams {
        ConnStreams {
            started: AtomicU64::new(0),
            premature: AtomicU64::new(0),
            active: AtomicU64::new(0),
            windows: Mutex::new(ResetWindows::default()),
            last_ms: AtomicU64::new(0),
            epoch: tokio::time::Instant::now(),
            flood: tokio::sync::Notify::new(),
            flooded: AtomicBool::new(false),
        }
    }

    /// Streams started on the connection so far.
    pub(crate) fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Streams reset prematurely on the connection so far.
    pub(crate) fn premature(&self) -> u64 {
        self.premature.load(Ordering::Relaxed)
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Marks activity now (a stream or a tunnel opened or ended).
    pub(crate) fn touch(&self) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// `None` when no stream has been open for `idle`; else when to look
    /// again.
    pub(crate) fn idle_until(&self, idle: Duration) -> Option<tokio::time::Instant> {
        let at = self.epoch + Duration::from_millis(self.last_ms.load(Ordering::Relaxed)) + idle;
        let now = tokio::time::Instant::now();
        if self.active.load(Ordering::Relaxed) > 0 {
            return Some(now + idle);
        }
        (at > now).then_some(at)
    }
}

/// One stream's place in [`ConnStreams`], from its handler's start to its
/// answer (or its reset: the future is dropped unanswered).
pub(crate) struct StreamGuard {
    conn: Arc<ConnStreams>,
    began_ms: u64,
    answered: bool,
}

impl StreamGuard {
    pub(crate) fn start(conn: &Arc<ConnStreams>) -> StreamGuard {
        let now = conn.now_ms();
        conn.started.fetch_add(1, Ordering::Relaxed);
        conn.active.fetch_add(1, Ordering::Relaxed);
        conn.last_ms.store(now, Ordering::Relaxed);
        conn.windows.lock().expect("reset windows").started(now);
        StreamGuard {
            conn: conn.clone(),
            began_ms: now,
            answered: false,
        }
    }

    /// The stream's answer is ready: it ends without counting as reset.
    pub(crate) fn answer(mut self) {
        self.answered = true;
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let c = &self.conn;
        let now = c.now_ms();
        c.active.fetch_sub(1, Ordering::Relaxed);
        c.last_ms.store(now, Ordering::Relaxed);
        if !self.answered {
            let flood = c
                .windows
                .lock()
                .expect("reset windows")
                .reset(self.began_ms, now);
            if now.saturating_sub(self.began_ms) < PREMATURE_LIFETIME.as_millis() as u64 {
                c.premature.fetch_add(1, Ordering::Relaxed);
            }
            if flood && !c.flooded.swap(true, Ordering::Relaxed) {
                c.flood.notify_one();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1000;

    #[test]
    fn a_client_cancelling_one_stream_a_second_for_ten_minutes_is_never_a_flood() {
        let mut w = ResetWindows::default();
        for i in 0..600 {
            // A stream a second, reset 0.5 s after it started.
            w.started(i * S);
            assert!(!w.reset(i * S, i * S + S / 2), "cut at {i} s");
        }
    }

    #[test]
    fn hundreds_of_resets_a_second_are_a_flood_within_the_threshold() {
        let mut w = ResetWindows::default();
        let mut cut = None;
        for i in 0..1000u64 {
            // 500 a second, each reset at once.
            let t = 5 * S + i * 2;
            w.started(t);
            if w.reset(t, t) {
                cut = Some(i + 1);
                break;
            }
        }
        assert_eq!(cut, Some(RESET_MIN_PREMATURE));
    }

    #[test]
    fn streams_that_ran_a_second_before_their_reset_never_count() {
        let mut w = ResetWindows::default();
        for i in 0..10_000u64 {
            let t = i;
            w.started(t);
            assert!(!w.reset(t, t + S));
        }
    }

    #[test]
    fn a_flood_needs_a_majority_of_the_windows_streams() {
        let mut w = ResetWindows::default();
        // 300 answered streams, then premature resets: the cut comes
        // when they pass half of all the streams in the windows.
        for t in 0..300 {
            w.started(t);
        }
        let mut cut = None;
        for i in 0..1000u64 {
            let t = 300 + i;
            w.started(t);
            if w.reset(t, t) {
                cut = Some(i + 1);
                break;
            }
        }
        assert_eq!(cut, Some(301), "301 of 601");
    }

    #[test]
    fn the_windows_forget_what_is_older_than_two_of_them() {
        let mut w = ResetWindows::default();
        for t in 0..199 {
            w.started(t);
            assert!(!w.reset(t, t));
        }
        // 20 s later the 199 are forgotten: 199 more are not a flood.
        for t in 0..199 {
            let t = 25 * S + t;
            w.started(t);
            assert!(!w.reset(t, t), "at {t}");
        }
        // Within the next window they still count: one more is.
        w.started(36 * S);
        assert!(w.reset(36 * S, 36 * S));
    }

    #[tokio::test]
    async fn dropped_unanswered_streams_wake_the_flood_check_once() {
        let conn = Arc::new(ConnStreams::new());
        for _ in 0..RESET_MIN_PREMATURE {
            drop(StreamGuard::start(&conn));
        }
        assert_eq!(conn.premature(), RESET_MIN_PREMATURE);
        // The permit is stored: the first wait returns at once.
        tokio::time::timeout(Duration::from_secs(1), conn.flood.notified())
            .await
            .expect("flood noticed");
        // Answered streams are not resets.
        StreamGuard::start(&conn).answer();
        assert_eq!(conn.premature(), RESET_MIN_PREMATURE);
        assert_eq!(conn.active.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_only_with_no_stream_open() {
        let conn = Arc::new(ConnStreams::new());
        let idle = Duration::from_secs(30);
        let g = StreamGuard::start(&conn);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(conn.idle_until(idle).is_some(), "a stream is open");
        drop(g);
        assert!(conn.idle_until(idle).is_some(), "just ended");
        tokio::time::sleep(idle).await;
        assert!(conn.idle_until(idle).is_none());
    }
}
