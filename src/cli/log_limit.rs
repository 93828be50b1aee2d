//! Rate limiting of repeated warnings from chitchat and from peerlb's
//! gossip layer: an isolated node's chitchat warns "Failed to gossip" for
//! every peer every gossip round (15 lines a second with the defaults),
//! and a holder of the gossip key can make the gossip layer warn of every
//! datagram it sends (13.5 lines a second in the review of issue 34:
//! forged state republished over, members with invalid keys, datagrams
//! out of bounds). This layer lets the first event of each such WARN/ERROR
//! call site through per [`WINDOW`], drops the
//! rest and, when the call site speaks again after the window, first logs
//! how many it dropped (`repeated warnings suppressed`, with `suppressed`
//! and `target`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tracing::callsite::Identifier;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// At most one event per call site is let through in this window.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);

/// Per call site: when its last event was let through, and how many were
/// dropped since.
#[derive(Default)]
pub(crate) struct RateLimit {
    seen: Mutex<HashMap<Identifier, (Instant, u64)>>,
}

/// What to do with one event.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Let it through, after a summary of `n` dropped ones when `n > 0`.
    Pass(u64),
    /// Drop it (counted).
    Drop,
}

impl RateLimit {
    fn judge(&self, id: Identifier, now: Instant) -> Verdict {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        match seen.get_mut(&id) {
            Some((at, dropped)) if now.duration_since(*at) < WINDOW => {
                *dropped += 1;
                Verdict::Drop
            }
            Some((at, dropped)) => {
                *at = now;
                Verdict::Pass(std::mem::take(dropped))
            }
            None => {
                seen.insert(id, (now, 0));
                Verdict::Pass(0)
            }
        }
    }
}

/// The targets rate limited: chitchat's, and the gossip layer's
/// (`adapters/cluster`: `gossip.rs`, `sealed.rs`).
const LIMITED_TARGETS: [&str; 2] = ["chitchat", "peerlb::adapters::gossip"];

/// Whether events of this metadata are rate limited.
fn limited(meta: &tracing::Metadata<'_>) -> bool {
    *meta.level() <= Level::WARN && LIMITED_TARGETS.iter().any(|t| meta.target().starts_with(t))
}

impl<S: Subscriber> Layer<S> for RateLimit {
    fn event_enabled(&self, event: &Event<'_>, _cx: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if !limited(meta) {
            return true;
        }
        match self.judge(meta.callsite(), Instant::now()) {
            Verdict::Drop => false,
            Verdict::Pass(0) => true,
            Verdict::Pass(n) => {
                tracing::warn!(
                    target: "peerlb::log",
                    suppressed = n,
                    target_of = meta.target(),
                    window = ?WINDOW,
                    "repeated warnings suppressed: the next line's call site logged this many more"
                );
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call site for the tests: its own metadata, a warning of target
    /// `chitchat` (two sites differ by their address, as real ones do).
    struct Site(&'static tracing::Metadata<'static>);
    impl tracing::callsite::Callsite for Site {
        fn set_interest(&self, _: tracing::subscriber::Interest) {}
        fn metadata(&self) -> &tracing::Metadata<'_> {
            self.0
        }
    }
    macro_rules! site {
        ($site:ident, $meta:ident, $name:literal) => {
            static $meta: tracing::Metadata<'static> = tracing::Metadata::new(
                $name,
                "chitchat",
                tracing::Level::WARN,
                None,
                None,
                None,
                tracing::field::FieldSet::new(&[], Identifier(&$site)),
                tracing::metadata::Kind::EVENT,
            );
            static $site: Site = Site(&$meta);
        };
    }
    site!(A, META_A, "a");
    site!(B, META_B, "b");

    #[test]
    fn one_event_per_call_site_per_window_then_a_count() {
        let r = RateLimit::default();
        let t0 = Instant::now();
        let a = || Identifier(&A);
        assert_eq!(r.judge(a(), t0), Verdict::Pass(0));
        for ms in [1, 200, 9_999] {
            assert_eq!(r.judge(a(), t0 + Duration::from_millis(ms)), Verdict::Drop);
        }
        // Another call site has its own window.
        assert_eq!(r.judge(Identifier(&B), t0), Verdict::Pass(0));
        assert_eq!(r.judge(a(), t0 + WINDOW), Verdict::Pass(3));
        assert_eq!(
            r.judge(a(), t0 + WINDOW + Duration::from_millis(1)),
            Verdict::Drop
        );
        assert_eq!(r.judge(a(), t0 + WINDOW * 3), Verdict::Pass(1));
    }

    #[test]
    fn only_chitchat_and_gossip_warnings_and_errors_are_limited() {
        let meta = |level, target| {
            tracing::Metadata::new(
                "e",
                target,
                level,
                None,
                None,
                None,
                tracing::field::FieldSet::new(&[], Identifier(&A)),
                tracing::metadata::Kind::EVENT,
            )
        };
        assert!(limited(&meta(Level::WARN, "chitchat::server")));
        assert!(limited(&meta(Level::ERROR, "chitchat")));
        assert!(!limited(&meta(Level::INFO, "chitchat::server")));
        assert!(!limited(&meta(Level::WARN, "peerlb::node")));
        // The gossip layer's targets (gossip.rs, sealed.rs `LOG`).
        assert!(limited(&meta(Level::WARN, "peerlb::adapters::gossip")));
        assert!(limited(&meta(
            Level::WARN,
            "peerlb::adapters::gossip::sealed"
        )));
        assert!(!limited(&meta(Level::INFO, "peerlb::adapters::gossip")));
    }
}
