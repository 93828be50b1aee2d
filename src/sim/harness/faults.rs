//! The fault script: each fault applied to the simulation at its time
//! (kill, restart, join, weight, drain, partitions, heal, slow node,
//! latency, loss) and recorded as [`Applied`].

use std::net::IpAddr;
use std::time::Duration;

use super::super::gossip::SimGossip;
use super::super::scenario::Action;
use super::{Applied, Run, SidecarCmd};
use crate::{NodeId, Ring};

impl Run<'_> {
    fn ips(&self, ids: &[String]) -> Vec<IpAddr> {
        ids.iter().map(|i| self.slot(i).ip).collect()
    }

    /// Resolves `owner:<key>`: the node that last served `key`, else the
    /// owner on the ring of the ready nodes.
    fn resolve(&self, node: &str) -> String {
        let Some(key) = node.strip_prefix("owner:") else {
            return node.to_owned();
        };
        if let Some(n) = self.shared.borrow().last_owner.get(key) {
            return n.clone();
        }
        let ready: Vec<(NodeId, u32)> = self
            .shared
            .borrow()
            .ready
            .iter()
            .map(|i| (NodeId::from(i.as_str()), self.weights[i]))
            .collect();
        Ring::build(&ready, self.ring_spec)
            .owner(key)
            .map_or_else(|| "n1".to_owned(), |o| o.to_string())
    }

    pub(super) fn apply(
        &mut self,
        sim: &mut turmoil::Sim<'_>,
        index: usize,
        gossip: &SimGossip,
    ) -> anyhow::Result<()> {
        // Long: one arm per fault action of the scenario format, each a few lines.
        let f = &self.scenario.faults[index];
        let now = sim.elapsed();
        let node = f.node.as_deref().map(|n| self.resolve(n));
        let label = match (&node, f.action) {
            (Some(n), Action::Slow) => format!("slow {n} x{}", f.factor),
            (Some(n), Action::Weight) => format!("weight {n} {}", f.value.unwrap_or_default()),
            (Some(n), a) => format!("{a:?} {n}").to_lowercase(),
            (None, Action::Heal) => "heal".to_owned(),
            (None, a) => format!("{a:?} {:?}|{:?}", f.a, f.b).to_lowercase(),
        };
        self.trace
            .line("sim", format_args!("fault {label} (script #{index})"));
        match f.action {
            Action::Kill => {
                let n = node.clone().expect("checked");
                if self.running.remove(&n) {
                    sim.crash(self.slot(&n).ip);
                }
                self.shared.borrow_mut().ready.remove(&n);
                self.draining.remove(&n);
                self.downs.entry(n).or_default().push(now);
            }
            Action::Restart => {
                let n = node.clone().expect("checked");
                let slot = self.slot(&n);
                // A new start publishes the configured weight again.
                self.weights.insert(n.clone(), slot.config.node.weight);
                if !slot.registered.get() {
                    self.register(sim, &n, gossip);
                } else if !self.running.contains(&n) {
                    sim.bounce(slot.ip);
                    self.running.insert(n);
                }
            }
            Action::Join => {
                let n = node.clone().expect("checked");
                if !self.slot(&n).registered.get() {
                    self.register(sim, &n, gossip);
                }
            }
            Action::Weight => {
                let n = node.clone().expect("checked");
                let value = f.value.expect("checked");
                let sent = self.running.contains(&n)
                    && self.slot(&n).sidecar.borrow().as_ref().is_some_and(|tx| {
                        tx.send(SidecarCmd::Weight {
                            fault: index,
                            value,
                        })
                        .is_ok()
                    });
                if sent {
                    self.weights.insert(n, value);
                } else {
                    self.weight_answers
                        .borrow_mut()
                        .insert(index, Err(format!("{n} is not running")));
                }
            }
            Action::Drain => {
                let n = node.clone().expect("checked");
                self.shared.borrow_mut().ready.remove(&n);
                if let Some(tx) = self.slot(&n).drain.borrow().as_ref() {
                    let _ = tx.send(true);
                }
                self.draining.insert(n.clone());
                self.downs.entry(n).or_default().push(now);
            }
            Action::Partition | Action::PartitionOneway => {
                self.net_faults.push((now, None));
                let oneway = f.action == Action::PartitionOneway;
                for a in self.ips(&f.a) {
                    for b in self.ips(&f.b) {
                        if oneway {
                            sim.partition_oneway(a, b);
                        } else {
                            sim.partition(a, b);
                        }
                        self.partitions.push((a, b, oneway));
                    }
                }
            }
            Action::Heal => {
                for f in &mut self.net_faults {
                    f.1.get_or_insert(now);
                }
                for (a, b, oneway) in std::mem::take(&mut self.partitions) {
                    if oneway {
                        sim.repair_oneway(a, b);
                    } else {
                        sim.repair(a, b);
                    }
                }
            }
            Action::Slow => {
                let n = node.clone().expect("checked");
                self.slot(&n)
                    .slowdown
                    .store(f.factor.max(1), std::sync::atomic::Ordering::Relaxed);
            }
            Action::Latency => {
                for a in self.ips(&f.a) {
                    for b in self.ips(&f.b) {
                        sim.set_link_latency(a, b, Duration::from_millis(f.ms));
                    }
                }
            }
            Action::Loss => {
                self.net_faults.push((now, None));
                for a in self.ips(&f.a) {
                    for b in self.ips(&f.b) {
                        sim.set_link_fail_rate(a, b, f.rate);
                    }
                }
            }
        }
        self.applied.push(Applied {
            at: now,
            action: f.action,
            node,
            label,
            value: f.value,
        });
        Ok(())
    }
}
