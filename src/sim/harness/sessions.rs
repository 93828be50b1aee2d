//! Sticky sessions in a run (case C7): client hosts whose users hold
//! sessions, keep the cookies the nodes set and send them back, and the
//! invariant "stickiness holds unless its node died".
//!
//! Case code (C7) names a case of `docs/cases.md`: the input, the
//! value peerlb must give, and where it is tested.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use super::clients::{Outgoing, begin, complete, virtual_instant};
use super::{Record, Shared};
use crate::sim::scenario::Traffic;
use crate::sim::trace::{self, Trace};

/// The sticky route cookie's name (`engine::sticky::ROUTE_COOKIE`).
const ROUTE_COOKIE: &str = "peerlb-route";

/// Violating sessions described one by one; the rest are counted.
const DESCRIBED: usize = 20;

/// Sticky-session figures of one run.
#[derive(Debug, Clone, Default)]
pub struct StickyFigures {
    /// Sessions started: the answer to `/session` set the route to the node
    /// that served it.
    pub started: u64,
    /// Answered requests that carried a route.
    pub routed: u64,
    /// Of those, requests served by the node their route named.
    pub stuck: u64,
    /// Sessions whose route was rewritten because its node died.
    pub moved: u64,
    /// Route rewrites after the route's node died (a session can move twice).
    pub rewrites: u64,
    /// Requests that broke the invariant.
    pub violations: u64,
    /// Sessions with at least one such request.
    pub sessions_violated: u64,
}

/// One client host holding `t.sessions` sticky sessions `<name>-s<j>`, each
/// a user that sends one request at a time.
pub(super) async fn client(
    name: String,
    t: Traffic,
    seed: u64,
    shared: Rc<RefCell<Shared>>,
    trace: Trace,
) -> turmoil::Result {
    trace.register_host(&name);
    let tasks: Vec<_> = (0..t.sessions)
        .map(|j| {
            let seed = seed ^ (j as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            tokio::task::spawn_local(session(
                format!("{name}-s{j}"),
                name.clone(),
                t.clone(),
                seed,
                shared.clone(),
                trace.clone(),
            ))
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
    Ok(())
}

/// One session: Poisson arrivals at `t.rate / t.sessions`, but never two
/// requests at once (the next one waits for the answer). The first request
/// (and any after a failed start) is `/session`; the cookies each answer
/// sets are kept and sent back in name order.
async fn session(
    id: String,
    client: String,
    t: Traffic,
    seed: u64,
    shared: Rc<RefCell<Shared>>,
    trace: Trace,
) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let at = virtual_instant();
    let rate = t.rate / t.sessions as f64;
    let mut jar: BTreeMap<String, String> = BTreeMap::new();
    let mut next = t.start_s;
    let mut n = 0u64;
    loop {
        let u: f64 = rng.random::<f64>().max(1e-12);
        next += -u.ln() / rate;
        if next >= t.stop_s {
            break;
        }
        tokio::time::sleep_until(at(next)).await;
        n += 1;
        let tag = format!("{id}-{n}");
        let started = jar.contains_key("session");
        let path = match (started, t.delay_ms) {
            (false, _) => format!("/session?s={id}&r={tag}"),
            (true, 0) => format!("/cart?s={id}&r={tag}"),
            (true, ms) => format!("/delay/{ms}?s={id}&r={tag}"),
        };
        let cookie = (!jar.is_empty()).then(|| {
            jar.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("; ")
        });
        let out = Outgoing {
            tag,
            key: id.clone(),
            method: if started {
                t.method.clone()
            } else {
                "GET".to_owned()
            },
            path,
            session: Some(id.clone()),
            cookie,
            route: jar.get(ROUTE_COOKIE).cloned(),
        };
        let Some((index, entry)) = begin(&shared, &trace, &client, &mut rng, &out) else {
            continue;
        };
        if let Some(a) = complete(&shared, &trace, &client, index, &entry, out).await {
            for c in &a.set_cookies {
                if let Some((k, v)) = c.split(';').next().and_then(|p| p.split_once('=')) {
                    jar.insert(k.trim().to_owned(), v.trim().to_owned());
                }
            }
        }
        next = next.max(trace::now().as_secs_f64());
    }
}

/// Checks "stickiness holds unless its node died" over every session's
/// answered requests (2xx-4xx with `peerlb-served-by`), in the order the
/// session sent them. `up(node, from, to)` is true when `node` was running
/// (had logged `node running`, and was not killed or drained since) from
/// before `from` until `to`.
///
/// - The answer that starts a session (no route sent) sets the route to
///   the node that served it.
/// - A request whose route names node R is served by R, unless R was not
///   up throughout the request (it died before or during it); then another
///   node X serves it and the answer rewrites the route to X. The session's
///   later requests carry X and are held to it the same way.
/// - An answer that sets a route names the node that served it.
///
/// Returns the figures and one violation line per violating session (at
/// most 20, then a count of the others).
pub fn check_sticky(
    records: &[Record],
    up: impl Fn(&str, Duration, Duration) -> bool,
) -> (StickyFigures, Vec<String>) {
    let mut fig = StickyFigures::default();
    let mut bad: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut moved: BTreeMap<&str, bool> = BTreeMap::new();
    for r in records {
        let Some(session) = r.session.as_deref() else {
            continue;
        };
        let Some(Ok((status, served, _))) = &r.result else {
            continue;
        };
        if *status >= 500 || served.is_empty() {
            continue;
        }
        let end = r.end.unwrap_or(r.start);
        let set = r.set_route.as_deref();
        let mut wrong = |msg: String| bad.entry(session).or_default().push(msg);
        match r.route.as_deref() {
            None if set == Some(served) => fig.started += 1,
            None => wrong(format!(
                "{}: started on {served} but the answer set route {set:?}",
                r.tag
            )),
            Some(route) => {
                fig.routed += 1;
                if route == served {
                    fig.stuck += 1;
                    if set.is_some_and(|s| s != route) {
                        wrong(format!(
                            "{}: served by its route {route} but the answer set route {set:?}",
                            r.tag
                        ));
                    }
                } else if up(route, r.start, end) {
                    wrong(format!(
                        "{}: route {route} was up, yet {served} served it (entry {})",
                        r.tag, r.entry
                    ));
                } else if set != Some(served) {
                    wrong(format!(
                        "{}: {route} died and {served} served it, but the answer set route {set:?}",
                        r.tag
                    ));
                } else {
                    fig.rewrites += 1;
                    *moved.entry(session).or_default() = true;
                }
            }
        }
    }
    fig.moved = moved.values().filter(|m| **m).count() as u64;
    fig.violations = bad.values().map(|v| v.len() as u64).sum();
    fig.sessions_violated = bad.len() as u64;
    let mut lines: Vec<String> = bad
        .iter()
        .take(DESCRIBED)
        .map(|(s, v)| match v.len() {
            1 => format!("sticky session {s}: {}", v[0]),
            n => format!("sticky session {s}: {} (and {} more)", v[0], n - 1),
        })
        .collect();
    if bad.len() > DESCRIBED {
        lines.push(format!(
            "{} more sticky sessions broke stickiness",
            bad.len() - DESCRIBED
        ));
    }
    (fig, lines)
}
