//! Q16: the activation side of every quantized mat-mul. 32 values as
//! `{ d: f32, s: f32, qs: [i16; 32] }`, value `qs[j] * d`, with `s = d · Σ qs` kept for the
//! weight formats whose dot needs the activations' sum (Q4_1's and Q5_1's minimums). The
//! k-quants take Q8K instead (see `q8k`).
//!
//! ggml quantizes activations to Q8_0, whose rounding (a 254th of each block's largest value) moves
//! a small model's logits by tenths, enough to flip near-tied greedy choices. Sixteen bits make
//! that error 256 times smaller at the same integer throughput on x86 (`vpmaddwd`/`vpdpwssd` take
//! 16-bit pairs where `vpmaddubsw`/`vpdpbusd` take 8-bit quads, but need no sign juggling).
//! `|qs| <= 127·257`, so each quant is also `256·hi + lo` with both halves in `i8`: the split the
//! NEON kernels use to run two 8-bit dot products.
use super::{Block, QK};

/// One Q16 block. Not a ggml format: it never leaves memory the engine owns.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ16 {
    /// The scale: value ≈ `d · q`.
    pub d: f32,
    /// `d · Σ q`: what a weight block's minimum multiplies.
    pub s: f32,
    /// The quants.
    pub qs: [i16; QK],
}

const _: () = assert!(core::mem::size_of::<BlockQ16>() == BlockQ16::BYTES);

impl BlockQ16 {
    /// Bytes of a stored block.
    pub const BYTES: usize = 8 + 2 * QK;
    /// Byte offset of the quants.
    pub const QUANTS: usize = 8;
    /// The largest quant: `127 · 256 + 127`.
    pub const MAX: f32 = 32639.0;
}

impl Block for BlockQ16 {
    const BYTES: usize = Self::BYTES;

    /// Round to nearest, ties to even (what the SIMD conversions do). Non-finite input, which has
    /// no meaningful result, still gives finite quants: NaN becomes 0 and ±inf saturate.
    fn quantize(x: &[f32; QK]) -> Self {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(libm::fabsf(*v)));
        let d = amax / Self::MAX;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0i16; QK];
        let mut sum = 0i32;
        for (q, v) in qs.iter_mut().zip(x) {
            let scaled = v * id;
            *q = if scaled.is_nan() {
                0
            } else {
                libm::rintf(scaled.clamp(-Self::MAX, Self::MAX)) as i16
            };
            sum += *q as i32;
        }
        BlockQ16 {
            d,
            s: d * sum as f32,
            qs,
        }
    }

    fn read(b: &[u8]) -> Self {
        let f = |i: usize| f32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut qs = [0i16; QK];
        for (q, v) in qs
            .iter_mut()
            .zip(b[Self::QUANTS..Self::BYTES].chunks_exact(2))
        {
            *q = i16::from_le_bytes([v[0], v[1]]);
        }
        BlockQ16 {
            d: f(0),
            s: f(4),
            qs,
        }
    }

    fn write(&self, out: &mut [u8]) {
        out[..4].copy_from_slice(&self.d.to_le_bytes());
        out[4..8].copy_from_slice(&self.s.to_le_bytes());
        for (o, q) in out[Self::QUANTS..Self::BYTES]
            .chunks_exact_mut(2)
            .zip(&self.qs)
        {
            o.copy_from_slice(&q.to_le_bytes());
        }
    }

    fn dequantize(&self, out: &mut [f32; QK]) {
        for (o, q) in out.iter_mut().zip(&self.qs) {
            *o = *q as f32 * self.d;
        }
    }
}

/// Bytes of a Q16 row of `n` values (`n` a multiple of 32).
pub const fn row_bytes(n: usize) -> usize {
    n / QK * BlockQ16::BYTES
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_blocks, quantize_blocks};
    use proptest::prelude::*;

    proptest! {
        /// Each value comes back within half a step (`d / 2`, plus the rounding of `x / d` and
        /// `q · d` in f32) and `s` is `d · Σq`.
        #[test]
        fn round_trip(x in proptest::collection::vec(-1e6f32..1e6, 64)) {
            let mut q = [0u8; 2 * BlockQ16::BYTES];
            quantize_blocks::<BlockQ16>(&x, &mut q);
            let mut back = [0f32; 64];
            dequantize_blocks::<BlockQ16>(&q, &mut back);
            for (b, (xb, yb)) in q.chunks_exact(BlockQ16::BYTES).zip(x.chunks(32).zip(back.chunks(32))) {
                let block = BlockQ16::read(b);
                for (a, c) in xb.iter().zip(yb) {
                    prop_assert!((a - c).abs() <= block.d * 0.5 + a.abs() * 1e-6, "{a} {c} d={}", block.d);
                }
                let sum: i32 = block.qs.iter().map(|v| *v as i32).sum();
                prop_assert_eq!(block.s, block.d * sum as f32);
                prop_assert!(block.qs.iter().all(|v| (*v as f32).abs() <= BlockQ16::MAX));
            }
        }
    }

    #[test]
    fn non_finite_input_gives_finite_quants() {
        let mut x = [1.0f32; QK];
        x[0] = f32::NAN;
        x[1] = -2.0;
        let b = BlockQ16::quantize(&x);
        assert_eq!(b.qs[0], 0);
        assert_eq!(b.qs[1], -32639);
        x[2] = f32::INFINITY;
        let b = BlockQ16::quantize(&x);
        assert!(b.qs.iter().all(|q| q.unsigned_abs() <= 32639));
    }
}
