//! Weighted rendezvous (highest random weight) scoring of `(node, slot)`
//! pairs: the hash, the fixed-point logarithm and the total order that decide
//! which node owns a slot and in which order the others follow.
//!
//! # The score
//!
//! Rendezvous hashing (Thaler & Ravishankar, "Using name-based mappings to
//! increase hit rates", IEEE/ACM ToN 1998) gives slot `s` to the node with the
//! highest pseudo-random value `u(node, s)`. Its weighted form (Schindelhauer
//! & Schomaker, "Weighted distributed hash tables", SPAA 2005; the
//! "logarithmic method") ranks nodes by `-w / ln(u)` for `u` in (0, 1):
//! equivalently by the smallest `E = -ln(u) / w`, an exponential variable of
//! rate `w`, so node `i` wins with probability `w_i / sum(w)`.
//!
//! Peerlb computes, exactly and identically on every platform:
//!
//! - `u(node, s)` = xxh3-64 of the slot number as 4 little-endian bytes,
//!   seeded with the node's seed `xxh3-64(len(id) as u64 LE ++ id)`
//!   ([`node_seed`]); [`score`] is that function with the seed folded in
//!   ahead of time ([`node_key`]), bit-for-bit equal to
//!   `xxh3_64_with_seed(&s.to_le_bytes(), seed)`.
//! - `L(u)` = `-log2(u / 2^64)` in fixed point with [`FRAC_BITS`] fraction
//!   bits ([`neg_log2`]): integer arithmetic only (a table of `log2(1 + i /
//!   1024)` built at compile time by repeated squaring, interpolated
//!   linearly), so no `f64::ln` whose last bit may differ between libms. It
//!   is within about 2e-7 of the true value and non-increasing in `u`.
//! - The order ([`Contender::cmp_rank`]): smaller `L / w` first (compared as
//!   `L_a * w_b` against `L_b * w_a` in `u128`, exact), then larger `u`, then
//!   the lower node index (= lower node id). It is a strict total order, so
//!   the winner of a slot does not depend on the order nodes are considered
//!   in, and incremental and full rebuilds agree.
//!
//! Between nodes of equal weight the order is simply larger `u` first (then
//! lower id): because `L` is non-increasing in `u`, `L_a < L_b` implies
//! `u_a > u_b`, so the first two keys agree. Builds therefore compare plain
//! `u64`s within each weight class and compute `L` only for the classes'
//! champions, and an equal-weight cluster never computes a logarithm.

use std::cmp::Ordering;

use xxhash_rust::xxh3::xxh3_64;

/// Fraction bits of the fixed-point `-log2` ([`neg_log2`]).
pub(super) const FRAC_BITS: u32 = 40;

/// Linear-interpolation segments of `log2` over `[1, 2)` (10 bits).
const SEG_BITS: u32 = 10;
const SEGS: usize = 1 << SEG_BITS;

/// `LOG2_TABLE[i]` = `log2(1 + i / 1024)` with [`FRAC_BITS`] fraction bits,
/// rounded to nearest; `LOG2_TABLE[1024]` = 1.0 exactly.
static LOG2_TABLE: [u64; SEGS + 1] = log2_table();

/// xxh3's `secret[8..16] ^ secret[16..24]`, the key of its 4..8-byte path.
const XXH3_4TO8_KEY: u64 = 0x1cad_21f7_2c81_017c ^ 0xdb97_9083_e96d_d4de;

/// The seed of a node: xxh3-64 (seed 0) of `len(id) as u64 LE ++ id`. The
/// length prefix keeps the encoding injective, so ids such as `10.0.0.1:55`
/// and `10.0.0.1:555` never share a hash input.
pub(super) fn node_seed(id: &str) -> u64 {
    let mut buf = Vec::with_capacity(8 + id.len());
    buf.extend_from_slice(&(id.len() as u64).to_le_bytes());
    buf.extend_from_slice(id.as_bytes());
    xxh3_64(&buf)
}

/// The per-node constant that [`score`] mixes with the slot number: xxh3's
/// seed-dependent "bitflip" for 4-byte inputs.
pub(super) fn node_key(seed: u64) -> u64 {
    let seed = seed ^ (u64::from((seed as u32).swap_bytes()) << 32);
    XXH3_4TO8_KEY.wrapping_sub(seed)
}

/// `u(node, slot)`: `xxh3_64_with_seed(&slot.to_le_bytes(), seed)` where
/// `key = node_key(seed)`, inlined (xxh3's 4-byte path: the input doubled
/// into 64 bits, xored with the key, then xxh3's `rrmxmx` avalanche).
#[inline(always)]
pub(super) fn score(key: u64, slot: u32) -> u64 {
    let mut v = (u64::from(slot) * 0x1_0000_0001) ^ key;
    v ^= v.rotate_left(49) ^ v.rotate_left(24);
    v = v.wrapping_mul(0x9FB2_1C65_1E98_DF25);
    v ^= (v >> 35).wrapping_add(4);
    v = v.wrapping_mul(0x9FB2_1C65_1E98_DF25);
    v ^ (v >> 28)
}

/// `-log2(u / 2^64)` with [`FRAC_BITS`] fraction bits, for `u` >= 1 (`u` = 0
/// is treated as 1). Non-increasing in `u`; at least 1 and at most
/// `64 << FRAC_BITS`.
pub(super) fn neg_log2(u: u64) -> u64 {
    let u = u.max(1);
    let lz = u.leading_zeros();
    let x = u << lz; // bit 63 set: mantissa 1.f as Q1.63
    let idx = ((x >> (63 - SEG_BITS)) as usize) & (SEGS - 1);
    let frac = (x >> (63 - SEG_BITS - 32)) & 0xFFFF_FFFF;
    let (lo, hi) = (LOG2_TABLE[idx], LOG2_TABLE[idx + 1]);
    let mantissa_log = lo + (((hi - lo) * frac) >> 32);
    let log2 = (u64::from(63 - lz) << FRAC_BITS) + mantissa_log;
    (64u64 << FRAC_BITS) - log2
}

/// `log2(m / 2^62)` for `m / 2^62` in `[1, 2)`, with `FRAC_BITS + 2` bits by
/// repeated squaring (Q2.62 intermediate), then rounded to `FRAC_BITS`.
const fn log2_fraction(m: u64) -> u64 {
    let one: u128 = 1 << 62;
    let mut x = m as u128;
    let mut r: u64 = 0;
    let mut i = 0;
    while i < FRAC_BITS + 2 {
        x = (x * x) >> 62;
        r <<= 1;
        if x >= 2 * one {
            x >>= 1;
            r |= 1;
        }
        i += 1;
    }
    (r + 2) >> 2
}

const fn log2_table() -> [u64; SEGS + 1] {
    let mut t = [0u64; SEGS + 1];
    let mut i = 0;
    while i < SEGS {
        t[i] = log2_fraction(((SEGS + i) as u64) << (62 - SEG_BITS));
        i += 1;
    }
    t[SEGS] = 1 << FRAC_BITS;
    t
}

/// One node's standing for one slot: its `u`, weight and index in the ring's
/// id-sorted node list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Contender {
    pub(super) u: u64,
    pub(super) weight: u32,
    pub(super) index: u32,
}

impl Contender {
    /// The rank order: `Less` when `self` comes first (wins the slot). See
    /// the module doc: smaller `L / w`, then larger `u`, then lower index.
    pub(super) fn cmp_rank(&self, other: &Contender) -> Ordering {
        if self.weight == other.weight {
            // Exact shortcut: L is non-increasing in u (module doc).
            return other.u.cmp(&self.u).then(self.index.cmp(&other.index));
        }
        self.cmp_rank_with(neg_log2(self.u), other, neg_log2(other.u))
    }

    /// [`Contender::cmp_rank`] with both `L`s computed ahead
    /// (`l = neg_log2(u)`), for sorting.
    pub(super) fn cmp_rank_with(&self, l: u64, other: &Contender, other_l: u64) -> Ordering {
        let a = u128::from(l) * u128::from(other.weight);
        let b = u128::from(other_l) * u128::from(self.weight);
        a.cmp(&b)
            .then(other.u.cmp(&self.u))
            .then(self.index.cmp(&other.index))
    }

    /// The rank order without the equal-weight shortcut (tests check that
    /// both agree).
    #[cfg(test)]
    pub(super) fn cmp_rank_exact(&self, other: &Contender) -> Ordering {
        let a = u128::from(neg_log2(self.u)) * u128::from(other.weight);
        let b = u128::from(neg_log2(other.u)) * u128::from(self.weight);
        a.cmp(&b)
            .then(other.u.cmp(&self.u))
            .then(self.index.cmp(&other.index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use xxhash_rust::xxh3::xxh3_64_with_seed;

    #[test]
    fn score_is_xxh3_with_seed_of_the_slot() {
        for seed in [0u64, 1, 0xdead_beef_cafe_babe, u64::MAX, node_seed("n1")] {
            for slot in [0u32, 1, 77, 65_535, 262_143, u32::MAX] {
                assert_eq!(
                    score(node_key(seed), slot),
                    xxh3_64_with_seed(&slot.to_le_bytes(), seed)
                );
            }
        }
        assert_eq!(node_seed("n1"), xxh3_64(b"\x02\0\0\0\0\0\0\0n1"));
    }

    #[test]
    fn log_table_is_strictly_increasing_and_accurate() {
        for i in 0..SEGS {
            assert!(LOG2_TABLE[i] < LOG2_TABLE[i + 1], "{i}");
            let want = (1.0 + i as f64 / SEGS as f64).log2();
            let got = LOG2_TABLE[i] as f64 / (1u64 << FRAC_BITS) as f64;
            assert!((got - want).abs() < 1e-11, "{i}: {got} vs {want}");
        }
        assert_eq!(LOG2_TABLE[0], 0);
    }

    #[test]
    fn neg_log2_known_values_and_bounds() {
        let one = 1u64 << FRAC_BITS;
        assert_eq!(neg_log2(1 << 63), one); // u = 1/2
        assert_eq!(neg_log2(1 << 62), 2 * one); // u = 1/4
        assert_eq!(neg_log2(1), 64 * one);
        assert_eq!(neg_log2(0), 64 * one);
        assert!(neg_log2(u64::MAX) >= 1);
        for u in [3u64, 1000, 1 << 40, 0x9e37_79b9_7f4a_7c15, u64::MAX - 5] {
            let want = -((u as f64) / 2f64.powi(64)).log2();
            let got = neg_log2(u) as f64 / one as f64;
            assert!((got - want).abs() < 3e-7, "{u}: {got} vs {want}");
        }
    }

    #[test]
    fn neg_log2_is_monotone_across_segment_and_octave_edges() {
        for shift in 0..64u32 {
            let base = 1u64 << shift;
            for delta in [0u64, 1, 2] {
                let a = base.saturating_sub(delta);
                assert!(neg_log2(a) >= neg_log2(a.saturating_add(1)), "{a}");
            }
        }
        for seg in 0..SEGS as u64 {
            let edge = (1u64 << 63) | (seg << (63 - SEG_BITS));
            assert!(neg_log2(edge - 1) >= neg_log2(edge), "segment {seg}");
        }
    }

    fn contender(u: u64, weight: u32, index: u32) -> Contender {
        Contender { u, weight, index }
    }

    #[test]
    fn ties_are_broken_by_larger_u_then_lower_index() {
        let a = contender(5, 100, 0);
        let b = contender(5, 100, 1);
        assert_eq!(a.cmp_rank(&b), Ordering::Less);
        assert_eq!(b.cmp_rank(&a), Ordering::Greater);
        assert_eq!(a.cmp_rank(&a), Ordering::Equal);
        assert_eq!(contender(6, 100, 1).cmp_rank(&a), Ordering::Less);
        // Different weights, same L * w (u = 1/2 at weight 1 vs u = 1/4 at
        // weight 2): the larger u wins.
        let half = contender(1 << 63, 1, 3);
        let quarter = contender(1 << 62, 2, 0);
        assert_eq!(half.cmp_rank(&quarter), Ordering::Less);
    }

    proptest! {
        /// The equal-weight shortcut is exact, and the order is total.
        #[test]
        fn shortcut_agrees_with_the_exact_order(
            ua in any::<u64>(), ub in any::<u64>(), uc in any::<u64>(),
            wa in 1u32..400, wb in 1u32..400, same in any::<bool>(),
            near in 0u64..4,
        ) {
            let wb = if same { wa } else { wb };
            let a = contender(ua, wa, 0);
            let b = contender(ub, wb, 1);
            let b_near = contender(ua.wrapping_add(near), wa, 1);
            for (x, y) in [(a, b), (a, b_near), (b_near, a)] {
                prop_assert_eq!(x.cmp_rank(&y), x.cmp_rank_exact(&y));
                prop_assert_eq!(x.cmp_rank(&y), y.cmp_rank(&x).reverse());
            }
            // Transitivity over three.
            let c = contender(uc, if same { wa } else { 1 + wb % 7 }, 2);
            let mut v = [a, b, c];
            v.sort_by(|x, y| x.cmp_rank(y));
            prop_assert!(v[0].cmp_rank(&v[2]) == Ordering::Less);
        }
    }
}
