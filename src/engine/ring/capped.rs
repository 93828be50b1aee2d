//! The capped assignment ([`Assignment::Capped`](super::Assignment)): each
//! node holds exactly its quota of slots, the slots it ranks best among
//! those that rank it well.
//!
//! # Quotas
//!
//! Node `i` of weight `w_i` (total `W`) over `M` slots has the share
//! `M * w_i / W`. Its quota is the share rounded down, and the `M - sum of
//! floors` slots left over go one each to the nodes with the largest
//! fractional part (`M * w_i mod W`), ties to the larger node key
//! (`hrw::node_key`), then the lower index: the largest-remainder method.
//! Every quota is within one slot of the share, and they sum to `M`.
//!
//! # The assignment
//!
//! Slot `s` ranks the nodes by weighted rendezvous (`hrw`), node `i` ranks
//! the slots by its own `u(i, s)` (larger first, then the lower slot). Both
//! orders come from one total order on `(node, slot)` pairs (`L(u) / w`,
//! then larger `u`, then node index, then slot; for one node `L / w` is
//! non-increasing in `u`), so there is exactly one stable assignment with
//! those quotas (no slot and node that both prefer each other to what they
//! hold), whatever the order it is computed in (Gale & Shapley 1962, with
//! capacities: the hospitals/residents problem; uniqueness under a common
//! pair order: the "globally ranked pairs" case). It is computed by slot
//! proposals (deferred acceptance) starting from the rendezvous table: each
//! node over its quota keeps its best `quota` slots and rejects the rest; a
//! rejected slot proposes to its next node in rank order, which takes it if
//! it has room or prefers it to its worst slot (which then proposes in
//! turn). A slot never proposes to a node above its rendezvous owner, so
//! where quotas do not bind the owner is the rendezvous owner.
//!
//! # What it costs and what it does not keep
//!
//! No assignment can be a function of the node set alone, hold every node
//! within one slot of its share for every set, and never move a slot
//! between two nodes that stay: such an assignment gives a slot the same
//! owner in every subset that contains it, which makes it a per-slot
//! ranking (a slot's owner in `S` beats each other member of `S` in the
//! pair alone), and per-slot rankings of an unbounded id space cannot
//! balance every set (Ramsey: some infinite id set ranks every pair alike,
//! and its middle member of any three wins nothing). `docs/architecture.md`
//! ("The ring") gives the argument and the figures: a leave or join moves
//! about `1 + 0.8 N / sqrt(M)` times the ideal (1.01, 1.16 and 3.2 at 10,
//! 100 and 1,000 nodes with 2^18 slots), the excess between nodes that
//! stay; the rendezvous table moves exactly the ideal.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::Ring;
use super::hrw::{self, Contender};

/// Quotas (slots per node, in node order) for `slots` slots: see the module
/// doc. Sums to `slots`.
pub(super) fn quotas(weights: &[u32], keys: &[u64], slots: usize) -> Vec<usize> {
    let total: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    let m = slots as u128;
    let mut quota: Vec<usize> = weights
        .iter()
        .map(|&w| (m * u128::from(w) / total) as usize)
        .collect();
    let left = slots - quota.iter().sum::<usize>();
    let mut order: Vec<(u128, u64, Reverse<usize>)> = weights
        .iter()
        .zip(keys)
        .enumerate()
        .map(|(i, (&w, &k))| ((m * u128::from(w)) % total, k, Reverse(i)))
        .collect();
    order.sort_unstable_by(|a, b| b.cmp(a));
    for (_, _, Reverse(i)) in order.into_iter().take(left) {
        quota[i] += 1;
    }
    quota
}

/// A node's claim on a slot, ordered so that the worst claim is the
/// greatest: smaller `u` worse, then the larger slot.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Claim(Reverse<u64>, u32);

/// One node's slots during the assignment: a heap (worst on top) once the
/// node has been asked to compare, a plain list before.
struct Held {
    quota: usize,
    slots: Vec<u32>,
    heap: Option<BinaryHeap<Claim>>,
}

impl Held {
    fn len(&self) -> usize {
        self.heap.as_ref().map_or(self.slots.len(), BinaryHeap::len)
    }

    fn heap(&mut self, key: u64) -> &mut BinaryHeap<Claim> {
        let slots = &mut self.slots;
        self.heap.get_or_insert_with(|| {
            slots
                .drain(..)
                .map(|s| Claim(Reverse(hrw::score(key, s)), s))
                .collect()
        })
    }
}

/// The capped table for `ring` (nodes, weights, keys, bits set) from its
/// rendezvous table `first`: see the module doc. Cost: the scores of the
/// slots of nodes that are asked to compare, plus `N` scores per proposal
/// (about `0.4 sqrt(M N)` slots are rejected from the rendezvous table).
pub(super) fn assign(ring: &Ring, first: &[u16]) -> Vec<u16> {
    let n = ring.nodes.len();
    let quota = quotas(&ring.weights, &ring.keys, first.len());
    let mut held: Vec<Held> = quota
        .iter()
        .map(|&quota| Held {
            quota,
            slots: Vec::new(),
            heap: None,
        })
        .collect();
    for (s, &o) in first.iter().enumerate() {
        held[usize::from(o)].slots.push(s as u32);
    }
    // Proposals still to make: (slot, the node that last turned it away).
    let mut queue: Vec<(u32, Contender)> = Vec::new();
    for (i, h) in held.iter_mut().enumerate() {
        if h.slots.len() <= h.quota {
            continue;
        }
        let key = ring.keys[i];
        let quota = h.quota;
        let heap = h.heap(key);
        while heap.len() > quota {
            let Claim(_, s) = heap.pop().expect("over quota");
            queue.push((s, ring.contender(i as u32, s)));
        }
    }
    // Slot order: the result does not depend on it (one stable assignment),
    // but a fixed order keeps the work the same on every node.
    queue.sort_unstable_by_key(|&(s, _)| Reverse(s));
    while let Some((s, last)) = queue.pop() {
        let next = ring
            .next_after(s, last)
            .expect("quotas sum to the slot count: some node has room");
        let k = next.index as usize;
        let h = &mut held[k];
        // A node whose share rounds to no slot at all (a tiny weight
        // beside large ones, or fewer slots than nodes) holds none: the
        // slot goes on to the next node in its order.
        if h.quota == 0 {
            queue.push((s, next));
            continue;
        }
        if h.len() < h.quota {
            match &mut h.heap {
                Some(heap) => heap.push(Claim(Reverse(next.u), s)),
                None => h.slots.push(s),
            }
            continue;
        }
        let heap = h.heap(ring.keys[k]);
        let claim = Claim(Reverse(next.u), s);
        let worst = *heap.peek().expect("a full node holds slots");
        if claim < worst {
            heap.pop();
            heap.push(claim);
            queue.push((worst.1, ring.contender(k as u32, worst.1)));
        } else {
            queue.push((s, next));
        }
    }
    let mut table = vec![0u16; first.len()];
    for (i, h) in held.into_iter().enumerate() {
        let slots = h.slots.into_iter();
        let from_heap = h.heap.into_iter().flatten().map(|Claim(_, s)| s);
        for s in slots.chain(from_heap) {
            table[s as usize] = i as u16;
        }
    }
    debug_assert!(n > 0 || table.is_empty());
    table
}

#[cfg(test)]
mod tests;
