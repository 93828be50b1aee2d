//! Consistent hashing: a slot table filled by weighted rendezvous hashing.
//!
//! The key space is cut into `M` slots (a power of two set by `vnodes`, see
//! [`slot_bits`]; 262,144 by default). A key hashes with [`hash_key`] to a
//! 64-bit point, and its slot is the point's top `log2 M` bits. Slot `s`
//! belongs to the node ranked first for `s` by weighted rendezvous (highest
//! random weight) hashing: each node draws a pseudo-random `u(node, s)` and
//! the node with the smallest `-ln(u) / weight` wins (Schindelhauer &
//! Schomaker's logarithmic method; exact, platform-independent integer
//! arithmetic in the `hrw` module). The rest of that ranking is the key's
//! failover order ([`Ring::candidates`]).
//!
//! Why this and not a ring of virtual nodes or Maglev:
//!
//! - Monotone like a ring: a node's rank for a slot depends only on that
//!   node and that slot, so when a node leaves only the slots it owned
//!   change owner (each to its second-ranked node), and a joining node takes
//!   slots only from others (case C2; the proptests in `ring/tests.rs` check
//!   both on every slot).
//! - Balanced unlike a ring: each slot is an independent weighted draw, so a
//!   node's share is `M * w / W` slots plus or minus a binomial deviation.
//!   With 10 equal nodes and 2^18 slots the largest share is 1.009 x the
//!   mean on average over ten id sets and 1.015 at worst (plain virtual
//!   nodes: 1.048 and 1.075 with 1024 vnodes per node); see
//!   [`DEFAULT_VNODES`].
//! - Maglev's table (Eisenbud et al., NSDI 2016) balances within one entry
//!   but is only *minimally* disruptive: removing a backend also moves some
//!   entries between the remaining ones, breaking C2.
//! - Lookup is one hash of the key and one table load, whatever the number
//!   of nodes; plain rendezvous hashing would cost one hash per node.
//! - The failover order of a key is the rendezvous ranking of its slot, so
//!   the next candidate when the owner dies is exactly the owner on the
//!   table rebuilt without it (case C6).
//!
//! Building the table costs `M x N` scores (a few ns each); a membership
//! change rebuilds incrementally from the previous table ([`Ring::rebuild`]):
//! a leaving node costs a rescore of its own slots, a joining one one score
//! per slot (1-4 ms at up to 1,000 nodes, see `docs/performance.md`).
//!
//! Determinism: the table is a function of the *set* of `(node id, weight)`
//! pairs and of `vnodes` only. Nodes are identified by id (never by an index
//! into the caller's list); the per-node hash input is length-prefixed so no
//! two ids share one (case C1); rank ties fall to the lower node id.
//!
//! [`Assignment::Capped`] (`ring.assignment = "capped"`, module `capped`)
//! fills the table differently: every node within one slot of its weighted
//! share, at the cost of a few keys moving between nodes that stay on a
//! change (no balanced assignment of the node set alone can avoid that).
//!
//! Case codes (C1, C2, C6) name cases of `docs/cases.md`: the input, the
//! value peerlb must give, and where it is tested.

use std::cmp::Ordering;

use xxhash_rust::xxh3::xxh3_64;

use super::node_id::NodeId;

mod capped;
mod hrw;

use hrw::Contender;

/// How the slot table is filled from the rendezvous ranking of each slot
/// (`ring.assignment`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Assignment {
    /// Slot `s` belongs to the node ranked first for `s` (weighted
    /// rendezvous). Monotone: a leave moves only the leaver's slots, a join
    /// only slots to the joiner (cases C2, C3), and the second candidate is
    /// the owner without the first (C6). A node's share is binomial around
    /// its weighted share: max/avg 1.009 at 10 nodes, 1.04 at 100, 1.24 at
    /// 1,000 (default table).
    #[default]
    Rendezvous,
    /// Every node holds its weighted share of slots within one slot: the
    /// unique stable assignment of slots to nodes with those quotas, both
    /// sides ranking by the rendezvous scores (module `capped`). Max/avg
    /// 1.0000, 1.0002 and 1.0033 at 10, 100, 1,000 nodes, a function of the
    /// node set like the rendezvous table; but a leave or join also moves
    /// slots between nodes that stay (1.2 %, 16 % and 216 % of the ideal
    /// at 10, 100, 1,000 nodes: `docs/architecture.md`, "The ring"), and a
    /// rebuild makes the assignment again (about 0.3 s at 1,000 nodes).
    Capped,
}

/// What a table is built for besides its nodes: its size (`vnodes`, see
/// `slot_bits`) and how it is filled. A plain `u32` converts to the
/// rendezvous table of that size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RingSpec {
    /// Ring resolution: `256 * vnodes` slots rounded up to a power of two.
    pub vnodes: u32,
    /// How slots are given to nodes.
    pub assignment: Assignment,
}

impl From<u32> for RingSpec {
    fn from(vnodes: u32) -> RingSpec {
        RingSpec {
            vnodes,
            assignment: Assignment::Rendezvous,
        }
    }
}

/// Default `vnodes`: 1024, a table of `256 * 1024` = 262,144 (2^18) slots
/// (512 KiB of `u16` owners).
///
/// Measured max/avg owned share (exact, over all slots) for 10 nodes of
/// weight 100, mean and worst over ten id sets (`node-N`, `nN`,
/// `10.0.0.N:7000`, `web-0N`, `sN`, `hostN.example.com`, ...):
///
/// | vnodes | slots | mean of 10 id sets | worst of 10 |
/// | ---: | ---: | ---: | ---: |
/// | 64   | 2^14 | 1.038 | 1.049 |
/// | 256  | 2^16 | 1.019 | 1.032 |
/// | 512  | 2^17 | 1.013 | 1.027 |
/// | 1024 | 2^18 | 1.009 | 1.015 |
/// | 4096 | 2^20 | 1.005 | 1.008 |
///
/// The figures shrink as `1/sqrt(slots / N)`. 2^18 is the smallest table
/// that keeps every id set well inside the 1.03 target. Its full build at
/// 1,000 nodes took 1.2 s on a loaded 2-core machine (start-up only);
/// membership changes rebuild incrementally in 1-4 ms (`docs/performance.md`).
pub(crate) const DEFAULT_VNODES: u32 = 1024;

/// Slots per unit of `vnodes` before rounding up to a power of two.
const SLOTS_PER_VNODE: u64 = 256;

/// Smallest and largest table, as `log2` of the slot count.
const MIN_SLOT_BITS: u32 = 8;
const MAX_SLOT_BITS: u32 = 24;

/// Slots scored together by a full build (the table size is a multiple).
const BLOCK: usize = 8;

/// Most nodes a table can hold: owners are stored as `u16`, and `u16::MAX`
/// marks a slot being rescored during a rebuild.
pub(crate) const MAX_NODES: usize = u16::MAX as usize;

/// Hashes a routing key to its 64-bit point: xxh3-64 of the key's UTF-8
/// bytes, seed 0. The slot is the point's top bits.
pub(crate) fn hash_key(key: &str) -> u64 {
    xxh3_64(key.as_bytes())
}

/// `log2` of the slot count for `vnodes`: `256 * vnodes` rounded up to a
/// power of two, within `2^8 ..= 2^24` (`vnodes` 0 counts as 1). `vnodes`
/// 1024 gives 18, 100 gives 15, 4 gives 10.
pub(crate) fn slot_bits(vnodes: u32) -> u32 {
    (u64::from(vnodes.max(1)) * SLOTS_PER_VNODE)
        .next_power_of_two()
        .trailing_zeros()
        .clamp(MIN_SLOT_BITS, MAX_SLOT_BITS)
}

/// An immutable consistent-hash table.
///
/// Invariants: `nodes` is sorted by id without duplicates, every weight is
/// positive, `keys[i]` is `hrw::node_key` of `nodes[i]`'s seed, `table[s]`
/// is the index in `nodes` of slot `s`'s owner, and `Ring::first[s]` the
/// index of the node ranked first for `s` (the same table for
/// [`Assignment::Rendezvous`]; `first` is empty then). Tables have `2^bits`
/// entries, none when there are no nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ring {
    nodes: Vec<NodeId>,
    weights: Vec<u32>,
    keys: Vec<u64>,
    table: Vec<u16>,
    /// The rendezvous table when `assignment` is not rendezvous, else empty.
    first: Vec<u16>,
    bits: u32,
    vnodes: u32,
    assignment: Assignment,
    /// All weights are equal: ranks compare plain `u`s (see `hrw`).
    uniform: bool,
}

impl Ring {
    /// Builds the table for `(node id, weight)` pairs; `spec` sets its size
    /// (`vnodes`: `256 * vnodes` slots rounded up to a power of two, see
    /// `DEFAULT_VNODES`; the name is kept from the virtual-node ring it
    /// replaced: more means finer balance and more memory) and its
    /// [`Assignment`] (a plain `u32` is `vnodes` with the rendezvous one).
    ///
    /// The input order does not matter. If an id appears more than once, the
    /// largest weight is used. Nodes of weight 0 are not part of the ring
    /// ([`Ring::node_count`] does not count them). Weight is relative: a
    /// node of weight 200 owns twice the slots of one of weight 100.
    ///
    /// Cost: one score per node and slot (`2^bits x N`); the capped
    /// assignment adds its proposals (module `capped`).
    ///
    /// # Panics
    ///
    /// If more than [`u16::MAX`] (65,535) nodes have a positive weight.
    pub fn build(nodes: &[(NodeId, u32)], spec: impl Into<RingSpec>) -> Ring {
        let mut ring = Ring::empty(normalize(nodes), spec.into());
        ring.fill();
        ring
    }

    /// Scores every slot (the full build), eight slots at a time.
    fn fill(&mut self) {
        if self.nodes.is_empty() {
            return;
        }
        let scorer = Scorer::new(self);
        let mut table = vec![0u16; 1 << self.bits];
        for (block, owners) in table.chunks_exact_mut(BLOCK).enumerate() {
            owners.copy_from_slice(&scorer.best_block((block * BLOCK) as u32));
        }
        self.set_first(table);
    }

    /// Installs the rendezvous table `first` and the table the assignment
    /// makes of it.
    fn set_first(&mut self, first: Vec<u16>) {
        match self.assignment {
            Assignment::Rendezvous => {
                self.table = first;
                self.first = Vec::new();
            }
            Assignment::Capped => {
                self.table = capped::assign(self, &first);
                self.first = first;
            }
        }
    }

    /// The rendezvous table: slot -> index of the node ranked first.
    fn first(&self) -> &[u16] {
        if self.first.is_empty() {
            &self.table
        } else {
            &self.first
        }
    }

    /// How this ring's table was filled.
    pub fn assignment(&self) -> Assignment {
        self.assignment
    }

    /// The ring for `nodes` and `spec`, computed from `self` where that is
    /// cheaper: equal to `Ring::build(nodes, spec)` in every case.
    ///
    /// When the slot count is unchanged and few nodes differ, the previous
    /// rendezvous table is kept: slots of nodes that left (or changed
    /// weight) are rescored over the new node set, and each joining node (or
    /// new weight) is scored once per slot against the slot's first-ranked
    /// node. Otherwise it falls back to a full build. The capped assignment
    /// is then made again from that table (module `capped`).
    ///
    /// # Panics
    ///
    /// As [`Ring::build`].
    pub fn rebuild(&self, nodes: &[(NodeId, u32)], spec: impl Into<RingSpec>) -> Ring {
        let spec = spec.into();
        let input = normalize(nodes);
        if self.nodes.is_empty() || input.is_empty() || slot_bits(spec.vnodes) != self.bits {
            return Ring::build(&input, spec);
        }
        let mut ring = Ring::empty(input, spec);
        // Old index -> new index for nodes kept with the same weight.
        let mut remap = vec![u16::MAX; self.nodes.len()];
        let mut joined: Vec<u16> = Vec::new();
        let (mut i, mut j) = (0, 0);
        while j < ring.nodes.len() {
            match self.nodes.get(i).map(|old| old.cmp(&ring.nodes[j])) {
                Some(Ordering::Less) => i += 1,
                Some(Ordering::Equal) => {
                    if self.weights[i] == ring.weights[j] {
                        remap[i] = j as u16;
                    } else {
                        joined.push(j as u16);
                    }
                    i += 1;
                    j += 1;
                }
                _ => {
                    joined.push(j as u16);
                    j += 1;
                }
            }
        }
        let kept = remap.iter().filter(|&&r| r != u16::MAX).count();
        let left = self.nodes.len() - kept;
        // Incremental: the leavers' slots rescored over N nodes (about M
        // scores per leaver), then M * (1 + joined) scores; full: M * N.
        if 1 + left + joined.len() >= ring.nodes.len() {
            ring.fill();
            return ring;
        }
        let scorer = Scorer::new(&ring);
        let mut table: Vec<u16> = self.first().iter().map(|&o| remap[o as usize]).collect();
        for (s, owner) in table.iter_mut().enumerate() {
            if *owner == u16::MAX {
                *owner = scorer.best(s as u32);
            }
        }
        ring.contest(&mut table, &joined);
        ring.set_first(table);
        ring
    }

    /// Lets each node of `joined` take the slots of `table` where it ranks
    /// above the current owner.
    fn contest(&self, table: &mut [u16], joined: &[u16]) {
        if joined.is_empty() {
            return;
        }
        if self.uniform {
            // Equal weights: the larger u wins, then the lower index.
            let keys = &self.keys;
            for (s, owner) in table.iter_mut().enumerate() {
                let s = s as u32;
                let mut best = (hrw::score(keys[usize::from(*owner)], s), *owner);
                for &n in joined {
                    let u = hrw::score(keys[usize::from(n)], s);
                    if u > best.0 || (u == best.0 && n < best.1) {
                        best = (u, n);
                    }
                }
                *owner = best.1;
            }
            return;
        }
        for (s, owner) in table.iter_mut().enumerate() {
            let s = s as u32;
            let mut best = self.contender(u32::from(*owner), s);
            for &n in joined {
                let c = self.contender(u32::from(n), s);
                if c.cmp_rank(&best).is_lt() {
                    best = c;
                }
            }
            *owner = best.index as u16;
        }
    }

    /// A ring with `input`'s nodes (normalised) and no table yet.
    fn empty(input: Vec<(NodeId, u32)>, spec: RingSpec) -> Ring {
        assert!(input.len() <= MAX_NODES, "too many ring nodes");
        let keys = input
            .iter()
            .map(|(id, _)| hrw::node_key(hrw::node_seed(id)))
            .collect();
        let (nodes, weights): (Vec<NodeId>, Vec<u32>) = input.into_iter().unzip();
        Ring {
            uniform: weights.windows(2).all(|w| w[0] == w[1]),
            nodes,
            weights,
            keys,
            table: Vec::new(),
            first: Vec::new(),
            bits: slot_bits(spec.vnodes),
            vnodes: spec.vnodes,
            assignment: spec.assignment,
        }
    }

    /// The node owning `key`. `None` when the ring is empty. Allocation-free:
    /// one xxh3 of the key and one table load.
    pub fn owner(&self, key: &str) -> Option<&NodeId> {
        self.owner_of_point(hash_key(key))
    }

    /// The node owning point `point` (the owner of its slot: the top bits).
    /// `None` when the ring is empty.
    pub fn owner_of_point(&self, point: u64) -> Option<&NodeId> {
        let owner = *self.table.get(self.slot_of(point))?;
        Some(&self.nodes[owner as usize])
    }

    /// The distinct nodes for `key` in failover order: the owner first, then
    /// the other nodes in their rendezvous rank for the key's slot. Yields
    /// every ring node exactly once. On a rendezvous table the second
    /// candidate is the owner of the key on the ring without the first (and
    /// so on down the list); on a capped one it is the node the slot ranks
    /// best after the owner, which is that owner unless its quota is taken
    /// by slots it ranks better.
    ///
    /// Lazy: the owner comes from the table (one load); each of the next
    /// `SCANNED_CANDIDATES` candidates is found when asked by one pass
    /// over the nodes (`N` scores, no allocation: the best node ranked after
    /// the previous one); asking for more scores and sorts the remaining
    /// nodes once (one allocation). A request that fails over once or twice
    /// never ranks the whole cluster.
    pub fn candidates(&self, key: &str) -> Candidates<'_> {
        self.candidates_of_point(hash_key(key))
    }

    /// [`Ring::candidates`] for a point rather than a key.
    pub fn candidates_of_point(&self, point: u64) -> Candidates<'_> {
        Candidates {
            ring: self,
            slot: self.slot_of(point) as u32,
            yielded: 0,
            owner: 0,
            last: None,
            rest: Vec::new(),
        }
    }

    fn slot_of(&self, point: u64) -> usize {
        (point >> (64 - self.bits)) as usize
    }

    /// Number of slots in the table: `2^bits` for `vnodes` (see
    /// [`Ring::build`]), 0 when the ring is empty.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// True when the ring has no node (none with a positive weight).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Number of distinct nodes on the ring.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The ring's nodes and their weights, sorted by id.
    pub fn nodes(&self) -> impl ExactSizeIterator<Item = (&NodeId, u32)> {
        self.nodes.iter().zip(self.weights.iter().copied())
    }

    /// The `vnodes` the ring was built with.
    pub fn vnodes(&self) -> u32 {
        self.vnodes
    }

    /// The size and assignment the ring was built with.
    pub fn spec(&self) -> RingSpec {
        RingSpec {
            vnodes: self.vnodes,
            assignment: self.assignment,
        }
    }

    /// Each node's exact share of the key space (owned slots / slots; sum
    /// 1.0), sorted by id. Used by tests and the admin page; O(slots).
    pub fn shares(&self) -> Vec<(NodeId, f64)> {
        let mut owned = vec![0usize; self.nodes.len()];
        for &o in &self.table {
            owned[o as usize] += 1;
        }
        let slots = self.table.len() as f64;
        self.nodes
            .iter()
            .zip(owned)
            .map(|(id, n)| (NodeId::clone(id), n as f64 / slots))
            .collect()
    }

    /// Node `index`'s standing for `slot`.
    fn contender(&self, index: u32, slot: u32) -> Contender {
        let i = index as usize;
        Contender {
            u: hrw::score(self.keys[i], slot),
            weight: self.weights[i],
            index,
        }
    }

    /// The standing of the node ranked first among those ranked after
    /// `last` for `slot` (one pass, `N` scores); `None` when `last` is the
    /// last node.
    fn next_after(&self, slot: u32, last: Contender) -> Option<Contender> {
        let mut best: Option<Contender> = None;
        for i in 0..self.nodes.len() as u32 {
            let c = self.contender(i, slot);
            if c.cmp_rank(&last).is_gt() && best.is_none_or(|b| c.cmp_rank(&b).is_lt()) {
                best = Some(c);
            }
        }
        best
    }

    /// The nodes ranked after `last` for `slot` except `skip`, worst first
    /// (so `pop` yields them in failover order).
    fn ranked_after(&self, slot: u32, last: Contender, skip: u16) -> Vec<u16> {
        if self.uniform {
            // Sort keys `u << 16 | !index`: ascending puts the best last.
            // Ranked after `last`: smaller `u`, or equal `u` and larger index.
            let mut rest: Vec<u128> = (0..self.nodes.len() as u16)
                .filter_map(|i| {
                    let u = hrw::score(self.keys[usize::from(i)], slot);
                    let after = u < last.u || (u == last.u && u32::from(i) > last.index);
                    (after && i != skip).then_some((u128::from(u) << 16) | u128::from(!i))
                })
                .collect();
            rest.sort_unstable();
            return rest.into_iter().map(|k| !(k as u16)).collect();
        }
        let mut rest: Vec<(Contender, u64)> = (0..self.nodes.len() as u32)
            .map(|i| self.contender(i, slot))
            .filter(|c| c.cmp_rank(&last).is_gt() && c.index != u32::from(skip))
            .map(|c| (c, hrw::neg_log2(c.u)))
            .collect();
        rest.sort_unstable_by(|(a, la), (b, lb)| b.cmp_rank_with(*lb, a, *la));
        rest.into_iter().map(|(c, _)| c.index as u16).collect()
    }
}

/// Normalises build input: weight-0 entries dropped, sorted by id, the
/// largest weight kept for a repeated id.
fn normalize(nodes: &[(NodeId, u32)]) -> Vec<(NodeId, u32)> {
    let mut input: Vec<(NodeId, u32)> = nodes.iter().filter(|(_, w)| *w > 0).cloned().collect();
    input.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    input.dedup_by(|later, earlier| later.0 == earlier.0);
    input
}

/// Scores slots for one node set: nodes grouped by weight, so within a
/// group the best is the largest `u` (no logarithm; see `hrw`).
struct Scorer {
    /// One entry per distinct weight, in order of first appearance.
    groups: Vec<Group>,
}

/// The nodes of one weight: their indexes (ascending) and score keys.
struct Group {
    weight: u32,
    indexes: Vec<u32>,
    keys: Vec<u64>,
}

impl Scorer {
    fn new(ring: &Ring) -> Scorer {
        let mut groups: Vec<Group> = Vec::new();
        for (i, (&weight, &key)) in ring.weights.iter().zip(&ring.keys).enumerate() {
            let g = match groups.iter().position(|g| g.weight == weight) {
                Some(g) => g,
                None => {
                    groups.push(Group {
                        weight,
                        indexes: Vec::new(),
                        keys: Vec::new(),
                    });
                    groups.len() - 1
                }
            };
            groups[g].indexes.push(i as u32);
            groups[g].keys.push(key);
        }
        Scorer { groups }
    }

    /// The indexes of the nodes ranked first for slots `base..base + 8`:
    /// [`Scorer::best`] with eight independent maxima per pass over a
    /// group's keys (the scores of a pass overlap in the CPU).
    fn best_block(&self, base: u32) -> [u16; BLOCK] {
        let mut best: [Option<Contender>; BLOCK] = [None; BLOCK];
        for group in &self.groups {
            let mut bu = [0u64; BLOCK];
            for (k, u) in bu.iter_mut().enumerate() {
                *u = hrw::score(group.keys[0], base + k as u32);
            }
            let mut bi = [0usize; BLOCK];
            for (g, &key) in group.keys.iter().enumerate().skip(1) {
                for k in 0..BLOCK {
                    let u = hrw::score(key, base + k as u32);
                    if u > bu[k] {
                        (bu[k], bi[k]) = (u, g);
                    }
                }
            }
            for k in 0..BLOCK {
                let c = Contender {
                    u: bu[k],
                    weight: group.weight,
                    index: group.indexes[bi[k]],
                };
                if best[k].is_none_or(|b| c.cmp_rank(&b).is_lt()) {
                    best[k] = Some(c);
                }
            }
        }
        best.map(|b| b.map_or(0, |b| b.index as u16))
    }

    /// The index of the node ranked first for `slot`.
    fn best(&self, slot: u32) -> u16 {
        let mut best: Option<Contender> = None;
        for group in &self.groups {
            // Indexes ascend (= ids ascend), so a tie keeps the first.
            let mut bu = hrw::score(group.keys[0], slot);
            let mut bi = 0;
            for (k, &key) in group.keys.iter().enumerate().skip(1) {
                let u = hrw::score(key, slot);
                if u > bu {
                    (bu, bi) = (u, k);
                }
            }
            let c = Contender {
                u: bu,
                weight: group.weight,
                index: group.indexes[bi],
            };
            if best.is_none_or(|b| c.cmp_rank(&b).is_lt()) {
                best = Some(c);
            }
        }
        best.map_or(0, |b| b.index as u16)
    }
}

impl Ring {
    /// Bounded-load consistent hashing (Mirrokni, Thorup, Zadimoghaddam,
    /// "Consistent Hashing with Bounded Loads", SODA 2018 / arXiv 2016), with
    /// the weighted capacities of HAProxy's `hash-balance-factor`
    /// (`chash_server_is_eligible`): the failover order of `key`, where the
    /// owner is the first node in that order whose load is below its
    /// capacity.
    ///
    /// With `factor_pct` = 100 x c (at least 100) and `total` the sum of
    /// `load` over the ring's nodes, the cluster has
    /// `capacity = ceil((total + 1) * factor_pct / 100)` (the `+ 1` is the
    /// request being placed); each node gets a part of it proportional to
    /// its weight (`weight * (capacity / W)` plus its part of the remainder,
    /// split by cumulative weight in id order, `W` the total weight), at
    /// least 1. A node is eligible when `load < its part`. Some node is
    /// always eligible (the capacity exceeds the total load), so keys of a
    /// node above c times the average move to the next node in their
    /// failover order ([`Ring::candidates`]), and the same keys move the
    /// same way on every entry node with the same loads.
    ///
    /// Returns the candidates (the chosen owner first, then the remaining
    /// nodes in failover order; each ring node once) and how many nodes were
    /// passed over. Empty for an empty ring. [`Ring::bounded_owner`] gives
    /// the owner alone without ranking the other nodes.
    pub fn bounded_candidates(
        &self,
        key: &str,
        factor_pct: u32,
        load: impl Fn(&NodeId) -> u64,
    ) -> (Vec<NodeId>, usize) {
        let point = hash_key(key);
        let Some((owner, skipped)) = self.bounded_owner(point, factor_pct, load) else {
            return (Vec::new(), 0);
        };
        let mut out = Vec::with_capacity(self.nodes.len());
        out.push(owner.clone());
        out.extend(
            self.candidates_of_point(point)
                .filter(|id| *id != owner)
                .cloned(),
        );
        (out, skipped)
    }

    /// The owner [`Ring::bounded_candidates`] picks for the key at `point`
    /// and how many nodes were passed over, without building the whole
    /// order: one pass over the nodes for the total load (the loads are
    /// read once each), then the key's candidates one at a time until one
    /// is eligible (usually the first). `None` for an empty ring.
    pub fn bounded_owner(
        &self,
        point: u64,
        factor_pct: u32,
        load: impl Fn(&NodeId) -> u64,
    ) -> Option<(&NodeId, usize)> {
        if self.nodes.is_empty() {
            return None;
        }
        let loads: Vec<u64> = self.nodes.iter().map(&load).collect();
        let total_load: u128 = loads.iter().map(|&l| u128::from(l)).sum();
        let total_weight: u128 = self.weights.iter().map(|&w| u128::from(w)).sum();
        let capacity = ((total_load + 1) * u128::from(factor_pct.max(100))).div_ceil(100);
        let (per_weight, remainder) = (capacity / total_weight, capacity % total_weight);
        let mut eligible = vec![false; self.nodes.len()];
        let mut cumulative = 0u128;
        for (i, &w) in self.weights.iter().enumerate() {
            let w = u128::from(w);
            let mut cap = w * per_weight + ((cumulative + w) * remainder) / total_weight
                - (cumulative * remainder) / total_weight;
            cumulative += w;
            if cap == 0 {
                cap = 1;
            }
            eligible[i] = u128::from(loads[i]) < cap;
        }
        let index = |id: &NodeId| {
            self.nodes
                .binary_search(id)
                .expect("candidates come from the ring")
        };
        let mut order = self.candidates_of_point(point);
        let first = order.next()?;
        if eligible[index(first)] {
            return Some((first, 0));
        }
        // Some node is always eligible (capacity > total load); the owner
        // stays the ring owner if none were (it cannot happen).
        Some(
            order
                .enumerate()
                .find(|(_, id)| eligible[index(id)])
                .map_or((first, 0), |(i, id)| (id, i + 1)),
        )
    }
}

/// Candidates after the owner that [`Candidates`] finds one pass over the
/// nodes each (2 here: the second and third candidates) before it ranks the
/// rest at once. Past a few passes one sort is cheaper.
pub(crate) const SCANNED_CANDIDATES: usize = 2;

/// Iterator over the distinct nodes of a ring in failover order, returned by
/// [`Ring::candidates`]; lazy (see there).
#[derive(Debug)]
pub struct Candidates<'r> {
    ring: &'r Ring,
    slot: u32,
    yielded: usize,
    /// The owner (yielded first; skipped in the rank order after it).
    owner: u16,
    /// The standing of the last node of the rank order passed (yielded, or
    /// the owner skipped).
    last: Option<Contender>,
    /// The not yet yielded nodes, worst first; filled once
    /// [`SCANNED_CANDIDATES`] passes have been made.
    rest: Vec<u16>,
}

impl<'r> Iterator for Candidates<'r> {
    type Item = &'r NodeId;

    fn next(&mut self) -> Option<&'r NodeId> {
        let ring = self.ring;
        if self.yielded >= ring.nodes.len() {
            return None;
        }
        let slot = self.slot;
        let next = if self.yielded == 0 {
            let owner = ring.table[slot as usize];
            self.owner = owner;
            // The rank order starts with the first-ranked node: the owner
            // on a rendezvous table (and most slots of a capped one).
            let first = ring.first()[slot as usize];
            let first = ring.contender(u32::from(first), slot);
            self.last = (first.index == u32::from(owner)).then_some(first);
            owner
        } else if self.yielded <= SCANNED_CANDIDATES {
            let mut c = match self.last {
                Some(last) => ring.next_after(slot, last)?,
                None => ring.contender(u32::from(ring.first()[slot as usize]), slot),
            };
            if c.index == u32::from(self.owner) {
                c = ring.next_after(slot, c)?;
            }
            self.last = Some(c);
            c.index as u16
        } else {
            if self.yielded == SCANNED_CANDIDATES + 1 {
                let last = self.last.expect("the scanned candidates were passed");
                self.rest = ring.ranked_after(slot, last, self.owner);
            }
            self.rest.pop()?
        };
        self.yielded += 1;
        Some(&ring.nodes[next as usize])
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.ring.nodes.len() - self.yielded;
        (left, Some(left))
    }
}

impl ExactSizeIterator for Candidates<'_> {}

#[cfg(test)]
mod tests;
