//! The roster: every member this node has known, the ones out of its view
//! included, kept beside the membership view for the operator's surfaces
//! (status JSON, `peerlb status`, the manager page, metrics). Routing
//! never reads it: the view and the rings are built as before, and a
//! failed member stays out of every ring.
//!
//! A member in the view is `alive` (its published status says serving,
//! draining, offline or leaving). One that leaves the view becomes
//! `failed` (gossip no longer lists it live, or the peer link lost it),
//! with the time it was last in the view and the reason the node logged
//! (`peer left routing`); one whose last status was `leaving` (a drain by
//! SIGTERM) becomes `left`. A node named in `cluster.toml` and never in
//! the view is `never seen`. A member is forgotten only when an operator
//! says so ([`Roster::forget`]: `peerlb forget NODE`, `POST
//! /_peerlb/forget?node=ID`), or replaced when it returns.

use std::collections::BTreeMap;

use tokio::time::Instant;

use crate::engine::membership::{Member, MembershipView, NodeStatus};
use crate::engine::node_id::NodeId;

/// What the roster knows of a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum MemberState {
    /// In this node's view now.
    Alive,
    /// Out of the view without saying goodbye (gossip's failure detector or
    /// the peer link declared it dead).
    Failed,
    /// Out of the view after publishing `leaving` (a drain by SIGTERM).
    Left,
    /// Named in `cluster.toml`, never in this node's view.
    NeverSeen,
}

impl MemberState {
    /// The state's name in JSON, tables and metrics labels.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            MemberState::Alive => "alive",
            MemberState::Failed => "failed",
            MemberState::Left => "left",
            MemberState::NeverSeen => "never seen",
        }
    }

    /// The state as a number (the `peerlb_member_state` gauge): 0 alive,
    /// 1 failed, 2 left, 3 never seen.
    pub(crate) fn code(self) -> u8 {
        match self {
            MemberState::Alive => 0,
            MemberState::Failed => 1,
            MemberState::Left => 2,
            MemberState::NeverSeen => 3,
        }
    }
}

/// One member's record.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    /// Where it stands.
    pub state: MemberState,
    /// When it entered that state (for `failed`: when it left the view,
    /// the downtime's start).
    pub since: Instant,
    /// When it was last in this node's view (`None`: never).
    pub last_heard: Option<Instant>,
    /// Why it left the view (`failed` and `left`): the reason of the
    /// `peer left routing` log line.
    pub reason: Option<&'static str>,
    /// The member as it was last in the view (`None`: never seen).
    pub last: Option<Member>,
}

/// Every member this node has known, by id.
#[derive(Debug, Default)]
pub(crate) struct Roster {
    records: BTreeMap<NodeId, Record>,
}

impl Roster {
    /// A roster with `named` (the nodes of `cluster.toml`) as `never
    /// seen`, as of `now`.
    pub(crate) fn new(named: impl IntoIterator<Item = NodeId>, now: Instant) -> Roster {
        Roster {
            records: named
                .into_iter()
                .map(|id| {
                    (
                        id,
                        Record {
                            state: MemberState::NeverSeen,
                            since: now,
                            last_heard: None,
                            reason: None,
                            last: None,
                        },
                    )
                })
                .collect(),
        }
    }

    /// Takes a new view at `now`: its members are `alive`; a member alive
    /// before and absent now is `left` if its last status was `leaving`,
    /// else `failed` with `reason(id)`.
    pub(crate) fn observe(
        &mut self,
        view: &MembershipView,
        now: Instant,
        reason: impl Fn(&NodeId) -> &'static str,
    ) {
        for m in view.members() {
            let r = self.records.entry(m.id.clone()).or_insert(Record {
                state: MemberState::Alive,
                since: now,
                last_heard: None,
                reason: None,
                last: None,
            });
            if r.state != MemberState::Alive {
                r.state = MemberState::Alive;
                r.since = now;
                r.reason = None;
            }
            r.last_heard = Some(now);
            r.last = Some(m.clone());
        }
        for (id, r) in &mut self.records {
            if r.state != MemberState::Alive || view.get(id).is_some() {
                continue;
            }
            let leaving = r.last.as_ref().map(|m| m.status) == Some(NodeStatus::Leaving);
            r.state = if leaving {
                MemberState::Left
            } else {
                MemberState::Failed
            };
            r.since = now;
            r.reason = Some(if leaving {
                "drain: leaving"
            } else {
                reason(id)
            });
        }
    }

    /// Removes member `id` unless it is alive: `Ok` when it was removed.
    ///
    /// # Errors
    /// `Err(None)` when no member has that id; `Err(Some(Alive))` when it
    /// is in the view (it cannot be forgotten while it is there).
    pub(crate) fn forget(&mut self, id: &str) -> Result<MemberState, Option<MemberState>> {
        match self.records.get(id).map(|r| r.state) {
            None => Err(None),
            Some(MemberState::Alive) => Err(Some(MemberState::Alive)),
            Some(s) => {
                self.records.remove(id);
                Ok(s)
            }
        }
    }

    /// Every record, in id order.
    pub(crate) fn records(&self) -> impl Iterator<Item = (&NodeId, &Record)> {
        self.records.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, status: NodeStatus) -> Member {
        Member {
            id: NodeId::from(id),
            generation: 1,
            peer_addr: "127.0.0.1:1".parse().unwrap(),
            http_addr: "127.0.0.1:2".parse().unwrap(),
            weight: 100,
            status,
            load: 100,
            inflight: 0,
        }
    }

    fn view(members: &[Member]) -> MembershipView {
        MembershipView::new(NodeId::from("a"), members.iter().cloned(), 16)
    }

    fn states(r: &Roster) -> Vec<(String, &'static str, Option<&'static str>)> {
        r.records()
            .map(|(id, r)| (id.to_string(), r.state.as_str(), r.reason))
            .collect()
    }

    #[test]
    fn a_member_out_of_the_view_stays_failed_or_left_until_forgotten() {
        let t0 = Instant::now();
        let mut r = Roster::new(["a", "b", "c", "d"].map(NodeId::from), t0);
        let a = member("a", NodeStatus::Serving);
        let b = member("b", NodeStatus::Serving);
        let c = member("c", NodeStatus::Leaving);
        r.observe(&view(&[a.clone(), b, c]), t0, |_| "unused");
        let t1 = t0 + std::time::Duration::from_secs(3);
        r.observe(
            &view(std::slice::from_ref(&a)),
            t1,
            |_| "gossip: no longer live",
        );
        assert_eq!(
            states(&r),
            [
                ("a".into(), "alive", None),
                ("b".into(), "failed", Some("gossip: no longer live")),
                ("c".into(), "left", Some("drain: leaving")),
                ("d".into(), "never seen", None),
            ]
        );
        let b = r.records().find(|(id, _)| &***id == "b").unwrap().1;
        assert_eq!((b.since, b.last_heard), (t1, Some(t0)));
        // Still failed after later views; alive again when it returns.
        r.observe(
            &view(std::slice::from_ref(&a)),
            t1 + std::time::Duration::from_secs(1),
            |_| "other",
        );
        assert_eq!(states(&r)[1].2, Some("gossip: no longer live"));
        r.observe(
            &view(&[a.clone(), member("b", NodeStatus::Serving)]),
            t1,
            |_| "x",
        );
        assert_eq!(states(&r)[1], ("b".into(), "alive", None));
        assert_eq!(r.forget("b"), Err(Some(MemberState::Alive)));
        assert_eq!(r.forget("c"), Ok(MemberState::Left));
        assert_eq!(r.forget("c"), Err(None));
        assert_eq!(
            r.records()
                .filter(|(_, r)| r.state != MemberState::Alive)
                .count(),
            1
        );
    }
}
