//! What one UDP source may cost the SIP listener, where its address may be
//! forged: how many requests it may send per interval (a per-source rate
//! limit, after Kamailio's `pike` module: `reqs_density_per_unit` requests
//! per `sampling_time_unit`), and how many bytes it may draw in answer to
//! one request (at most [`AMPLIFICATION`] times what it sent, so a forged
//! source cannot use a node to reflect more than that at a victim).
//! Clock-free: the listener passes `now` (time since any fixed start).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

/// Most bytes answered per byte of an unauthenticated UDP request.
pub(crate) const AMPLIFICATION: usize = 2;

/// Most sources tracked at once (each about 60 bytes: under 4 MiB). Past
/// it, once expired windows are swept (at most once per interval), a new
/// source passes untracked: a flood of forged addresses, each sending one
/// datagram, would gain nothing from a table entry, and the sweep stays
/// bounded.
pub(crate) const MAX_SOURCES: usize = 65_536;

/// The per-source request counts of one listener.
#[derive(Debug)]
pub(crate) struct RateLimit {
    /// Requests a source may send per interval.
    limit: u32,
    /// The interval.
    interval: Duration,
    /// Per source: the start of its current window and its requests in it.
    windows: HashMap<IpAddr, (Duration, u32)>,
    /// When the table was last swept of expired windows.
    swept: Option<Duration>,
}

/// What [`RateLimit::check`] decided for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Under the limit: handle it.
    Pass,
    /// Over the limit in this interval: drop it, answer nothing.
    Drop,
    /// The table is full: handled, not counted (see [`MAX_SOURCES`]).
    Untracked,
}

impl RateLimit {
    /// At most `limit` requests per `interval` from one source address
    /// (`limit` 0: no limit).
    pub(crate) fn new(limit: u32, interval: Duration) -> RateLimit {
        RateLimit {
            limit,
            interval: interval.max(Duration::from_millis(1)),
            windows: HashMap::new(),
            swept: None,
        }
    }

    /// Counts one request from `source` at `now`.
    pub(crate) fn check(&mut self, source: IpAddr, now: Duration) -> Verdict {
        if self.limit == 0 {
            return Verdict::Pass;
        }
        let interval = self.interval;
        if let Some((start, n)) = self.windows.get_mut(&source) {
            if now.saturating_sub(*start) >= interval {
                *start = now;
                *n = 0;
            }
            if *n >= self.limit {
                return Verdict::Drop;
            }
            *n += 1;
            return Verdict::Pass;
        }
        if self.windows.len() >= MAX_SOURCES {
            if self.swept.is_none_or(|t| now.saturating_sub(t) >= interval) {
                self.swept = Some(now);
                self.windows
                    .retain(|_, (start, _)| now.saturating_sub(*start) < interval);
            }
            if self.windows.len() >= MAX_SOURCES {
                return Verdict::Untracked;
            }
        }
        self.windows.insert(source, (now, 1));
        Verdict::Pass
    }

    /// Sources tracked now.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.windows.len()
    }
}

/// Which answers to a UDP request of `request_len` bytes may be sent:
/// `answers` gives each answer's length and whether it is final (a status
/// of 200 or more), in sending order; the result keeps that order. Final
/// answers are kept first, then provisional ones in order, while the
/// total stays within [`AMPLIFICATION`] times `request_len`; an answer that
/// does not fit is left out (a provisional one is only advice to the
/// client, RFC 3261 section 17.1.1; a final one that alone passes the
/// bound is not sent: the client retransmits or times out).
pub(crate) fn answers_within_bound(request_len: usize, answers: &[(usize, bool)]) -> Vec<bool> {
    let bound = request_len.saturating_mul(AMPLIFICATION);
    let mut keep = vec![false; answers.len()];
    let mut spent = 0usize;
    for want_final in [true, false] {
        for (i, &(len, fin)) in answers.iter().enumerate() {
            if fin == want_final && spent.saturating_add(len) <= bound {
                spent += len;
                keep[i] = true;
            }
        }
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_source_past_its_rate_is_dropped_until_its_next_interval() {
        let mut r = RateLimit::new(3, 2 * S);
        let a = ip("192.0.2.1");
        for _ in 0..3 {
            assert_eq!(r.check(a, S), Verdict::Pass);
        }
        assert_eq!(r.check(a, S), Verdict::Drop);
        assert_eq!(r.check(a, 2 * S), Verdict::Drop);
        // Another source is not affected.
        assert_eq!(r.check(ip("192.0.2.2"), 2 * S), Verdict::Pass);
        // The next interval starts afresh.
        assert_eq!(r.check(a, 3 * S), Verdict::Pass);
        // 0: no limit.
        let mut off = RateLimit::new(0, S);
        for _ in 0..1000 {
            assert_eq!(off.check(a, S), Verdict::Pass);
        }
    }

    #[test]
    fn forged_sources_cannot_grow_the_table_past_its_bound() {
        let mut r = RateLimit::new(10, S);
        for i in 0..MAX_SOURCES as u32 + 100 {
            let src = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            let v = r.check(src, Duration::ZERO);
            assert_ne!(v, Verdict::Drop);
        }
        assert_eq!(r.tracked(), MAX_SOURCES);
        // Once their windows expire a sweep makes room.
        assert_eq!(r.check(ip("192.0.2.9"), 2 * S), Verdict::Pass);
        assert_eq!(r.tracked(), 1);
    }

    #[test]
    fn answers_stay_within_twice_the_request_final_first() {
        // The built-in server's 100, 180 and 200 to an INVITE, each about
        // the request's size: the 200 and the 100 fit, the 180 does not.
        let keep = answers_within_bound(400, &[(380, false), (390, false), (400, true)]);
        assert_eq!(keep, vec![true, false, true]);
        // A small request: the final answer only.
        let keep = answers_within_bound(300, &[(380, false), (390, false), (400, true)]);
        assert_eq!(keep, vec![false, false, true]);
        // A final answer alone beyond the bound is not sent.
        assert_eq!(answers_within_bound(100, &[(250, true)]), vec![false]);
        for (req, answers) in [
            (400, vec![(380, false), (390, false), (400, true)]),
            (50, vec![(99, true), (2, false)]),
        ] {
            let keep = answers_within_bound(req, &answers);
            let sent: usize = answers
                .iter()
                .zip(&keep)
                .filter(|(_, k)| **k)
                .map(|(a, _)| a.0)
                .sum();
            assert!(sent <= AMPLIFICATION * req);
        }
    }
}
