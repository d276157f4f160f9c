//! The k-quants, which take Q8K activations (see `quant::q8k`): each block's stored quants as
//! unsigned bytes (at most 127, so also valid signed ones) against the activations' bytes (one
//! `sdot` per 16, or widening multiplies), times the halves' integer scales, one integer sum per
//! super-block, then the scalar `dot_q8k`'s float steps: the scalar kernel's bits.
use super::*;
use crate::kernels::scalar::q8k_step;
use crate::quant::iq4_nl::IQ4_VALUES;
use crate::quant::q8k::SUM_SPAN;
use crate::quant::BlockQ8K;

/// A k-quant's blocks as bytes.
pub(super) trait KBytes: KBlock {
    /// Block `j`'s stored quants (`KBlock::quants`): values 0..16, 16..32.
    fn bytes(sb: &[u8], j: usize) -> (uint8x16_t, uint8x16_t);
}

impl KBytes for BlockQ2K {
    #[inline(always)]
    fn bytes(sb: &[u8], j: usize) -> (uint8x16_t, uint8x16_t) {
        bits32(&sb[16 + 32 * (j / 4)..], 2 * (j % 4), 3)
    }
}

impl KBytes for BlockTQ2_0 {
    #[inline(always)]
    fn bytes(sb: &[u8], j: usize) -> (uint8x16_t, uint8x16_t) {
        bits32(&sb[32 * (j / 4)..], 2 * (j % 4), 3)
    }
}

impl KBytes for BlockQ3K {
    #[inline(always)]
    fn bytes(sb: &[u8], j: usize) -> (uint8x16_t, uint8x16_t) {
        let low = bits32(&sb[32 + 32 * (j / 4)..], 2 * (j % 4), 3);
        let high = bits32(&sb[..32], j, 1);
        above(low, high, 2)
    }
}

impl KBytes for BlockQ4K {
    #[inline(always)]
    fn bytes(sb: &[u8], j: usize) -> (uint8x16_t, uint8x16_t) {
        bits32(&sb[16 + 32 * (j / 2)..], 4 * (j % 2), 0x0f)
    }
}

impl KBytes for BlockQ5K {
    #[inline(always)]
    fn bytes(sb: &[u8], j: usize) -> (uint8x16_t, uint8x16_t) {
        let low = bits32(&sb[48 + 32 * (j / 2)..], 4 * (j % 2), 0x0f);
        let high = bits32(&sb[16..48], j, 1);
        above(low, high, 4)
    }
}

impl KBytes for BlockIQ4XS {
    /// Block `j`'s nibbles through the grid (`vqtbl1q`), stored quants as `KBlock::quants`.
    #[inline(always)]
    fn bytes(sb: &[u8], j: usize) -> (uint8x16_t, uint8x16_t) {
        let qs = &sb[8 + 16 * j..][..16];
        // SAFETY: `qs` holds 16 bytes, the table 16; the rest is register-only NEON arithmetic.
        unsafe {
            let table = vld1q_u8(IQ4_STORED.as_ptr());
            let v = vld1q_u8(qs.as_ptr());
            let low4 = vdupq_n_u8(0x0f);
            (
                vqtbl1q_u8(table, vandq_u8(v, low4)),
                vqtbl1q_u8(table, vshrq_n_u8::<4>(v)),
            )
        }
    }
}

impl KBytes for BlockIQ3S {
    /// Eight grid entries, looked up one by one, their signs applied as byte masks.
    #[inline(always)]
    fn bytes(sb: &[u8], j: usize) -> (uint8x16_t, uint8x16_t) {
        const BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
        let magnitudes: [u32; 8] = core::array::from_fn(|g| Self::grid_entry(sb, j, g));
        let signs = Self::signs(sb, j).to_le_bytes();
        // SAFETY: `magnitudes` is 32 bytes, `BITS` 16; the rest is register-only NEON
        // arithmetic.
        unsafe {
            let m = magnitudes.as_ptr() as *const u8;
            let bits = vld1q_u8(BITS.as_ptr());
            let offset = vdupq_n_u8(Self::OFFSET as u8);
            let signed = |m: uint8x16_t, s0: u8, s1: u8| {
                // 0xff where the value's sign bit is set; then `(m ^ neg) - neg`.
                let negative = vtstq_u8(vcombine_u8(vdup_n_u8(s0), vdup_n_u8(s1)), bits);
                vaddq_u8(vsubq_u8(veorq_u8(m, negative), negative), offset)
            };
            (
                signed(vld1q_u8(m), signs[0], signs[1]),
                signed(vld1q_u8(m.add(16)), signs[2], signs[3]),
            )
        }
    }
}

/// A block's stored quants from `KBlock::quants`: the grid i-quants whose entries are looked up
/// one by one anyway.
#[inline(always)]
fn from_quants(q: [u8; QK]) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: `q` is 32 bytes.
    unsafe { (vld1q_u8(q.as_ptr()), vld1q_u8(q.as_ptr().add(16))) }
}

/// The grid i-quants' blocks through `from_quants`.
macro_rules! bytes_from_quants {
    ($($block:ty),*) => {$(
        impl KBytes for $block {
            #[inline(always)]
            fn bytes(sb: &[u8], j: usize) -> (uint8x16_t, uint8x16_t) {
                from_quants(Self::quants(sb, j))
            }
        }
    )*};
}

bytes_from_quants!(
    BlockIQ3XXS,
    BlockIQ2XXS,
    BlockIQ2XS,
    BlockIQ2S,
    BlockIQ1S,
    BlockIQ1M,
    BlockTQ1_0
);

/// IQ4_XS's stored quants by index.
static IQ4_STORED: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (IQ4_VALUES[i] as i32 + BlockIQ4XS::OFFSET) as u8;
        i += 1;
    }
    t
};

impl KBytes for BlockQ6K {
    /// Block `j` is quarter `c` of half `n` (see `KBlock for BlockQ6K`).
    #[inline(always)]
    fn bytes(sb: &[u8], j: usize) -> (uint8x16_t, uint8x16_t) {
        let (n, c) = (j / 4, j % 4);
        let low = bits32(&sb[64 * n + 32 * (c % 2)..], 4 * (c / 2), 0x0f);
        let high = bits32(&sb[128 + 32 * n..], 2 * c, 3);
        above(low, high, 4)
    }
}

/// `low | high << SHIFT`, both halves.
#[inline(always)]
fn above(
    low: (uint8x16_t, uint8x16_t),
    high: (uint8x16_t, uint8x16_t),
    shift: i8,
) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: register-only NEON arithmetic.
    unsafe {
        let count = vdupq_n_s8(shift);
        (
            vorrq_u8(low.0, vshlq_u8(high.0, count)),
            vorrq_u8(low.1, vshlq_u8(high.1, count)),
        )
    }
}

/// `(byte >> shift) & mask` of the first 32 bytes of `b`.
#[inline(always)]
fn bits32(b: &[u8], shift: usize, mask: u8) -> (uint8x16_t, uint8x16_t) {
    let b = &b[..32];
    // SAFETY: `b` holds 32 bytes; the rest is register-only NEON arithmetic.
    unsafe {
        let count = vdupq_n_s8(-(shift as i8));
        let mask = vdupq_n_u8(mask);
        let v0 = vshlq_u8(vld1q_u8(b.as_ptr()), count);
        let v1 = vshlq_u8(vld1q_u8(b.as_ptr().add(16)), count);
        (vandq_u8(v0, mask), vandq_u8(v1, mask))
    }
}

/// Σ x·y of 16 signed bytes.
#[inline(always)]
fn dot_i8x16(x: int8x16_t, y: int8x16_t) -> i32 {
    // SAFETY: register-only.
    let zero = unsafe { vdupq_n_s8(0) };
    dot_i8x32(x, zero, y, zero)
}

/// K-quant weights · N rows of Q8K activations, as `scalar::dot_q8k` computes it.
pub(super) fn dot_q8k<K: KBytes, const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    let ns = xs
        .iter()
        .fold(w.len() / K::BYTES, |n, x| n.min(x.len() / BlockQ8K::BYTES));
    let mut acc = [0f32; N];
    for (s, sb) in w.chunks_exact(K::BYTES).take(ns).enumerate() {
        let (d, dmin) = K::d_dmin(sb);
        let ints = K::ints(sb);
        let xb: [&[u8]; N] =
            core::array::from_fn(|t| &xs[t][s * BlockQ8K::BYTES..][..BlockQ8K::BYTES]);
        let mut isum = [0i32; N];
        for j in 0..BLOCKS_PER_SUPER {
            // SAFETY: register-only; stored quants are at most 127, the same as signed bytes,
            // except `WIDE` ones, whose signed values are the stored quants less 128.
            let (w0, w1) = unsafe {
                let (w0, w1) = K::bytes(sb, j);
                let (w0, w1) = if K::WIDE {
                    let flip = vdupq_n_u8(0x80);
                    (veorq_u8(w0, flip), veorq_u8(w1, flip))
                } else {
                    (w0, w1)
                };
                (vreinterpretq_s8_u8(w0), vreinterpretq_s8_u8(w1))
            };
            for (sum, x) in isum.iter_mut().zip(&xb) {
                let q = &x[BlockQ8K::QUANTS + QK * j..][..QK];
                // SAFETY: `q` holds the block's 32 quants.
                let (x0, x1) = unsafe {
                    let p = q.as_ptr() as *const i8;
                    (vld1q_s8(p), vld1q_s8(p.add(16)))
                };
                *sum += ints.scales[2 * j] as i32 * dot_i8x16(w0, x0)
                    + ints.scales[2 * j + 1] as i32 * dot_i8x16(w1, x1);
            }
        }
        for ((a, x), isum) in acc.iter_mut().zip(&xb).zip(isum) {
            let x = BlockQ8K::read(x);
            let (mut offsets, mut msum) = (0i32, 0i32);
            for (k, sum) in x.sums.iter().enumerate() {
                offsets += ints.scales[k] as i32 * *sum as i32;
                msum += ints.mins[k] as i32 * *sum as i32;
            }
            let offset = if K::WIDE { 0 } else { K::OFFSET };
            *a += q8k_step(d, dmin, x.d, isum - offset * offsets, msum);
        }
    }
    acc
}

// One entry of the activations' sums per half block.
const _: () = assert!(2 * SUM_SPAN == QK);
