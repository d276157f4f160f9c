//! Q8K: the activation side of the k-quant mat-muls (Q2_K to Q6_K). 256 values as
//! `{ d: f32, qs: [i8; 256], sums: [i16; 16] }`, value `qs[j] * d`, with `sums[k]` the sum of
//! quants `16k .. 16k + 16`: what a 16-value half's minimum or offset multiplies.
//!
//! Every other quantized format meets Q16 activations (see `q16`), whose rounding error is 256
//! times smaller than 8 bits'. For the k-quants 8 bits halve the integer work on x86 (one
//! `vpmaddubsw` per 32 weights where Q16 takes two `vpmaddwd` and the quants' widening) and let
//! a super-block's 4- to 8-bit scales and minimums apply in integers, with one float step per
//! super-block (ggml's `Q8_K`): decoding a Q4_K_M model about 2.4x faster on an AVX2 host. What
//! it costs is measured in BENCHMARKS.md (SmolLM2 Q4_K_M against its weights in f32: perplexity
//! +0.12%, where Q16 gave +0.06%).
//! The dot of a weight super-block with a Q8K block is an exact integer sum, scaled once in
//! float, so every kernel and every tile shape gives the same bits.
use super::k_quants::QK_K;

/// Quants per entry of `sums`.
pub const SUM_SPAN: usize = 16;

/// One Q8K block. Not a ggml format: it never leaves memory the engine owns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8K {
    /// The scale: value ≈ `d · q`.
    pub d: f32,
    /// The quants, within ±127.
    pub qs: [i8; QK_K],
    /// `sums[k] = Σ qs[16k .. 16k + 16]`.
    pub sums: [i16; QK_K / SUM_SPAN],
}

impl BlockQ8K {
    /// Bytes of a stored block: `d`, then the quants, then the sums (little-endian).
    pub const BYTES: usize = 4 + QK_K + 2 * (QK_K / SUM_SPAN);
    /// Byte offset of the quants.
    pub const QUANTS: usize = 4;
    /// Byte offset of the sums.
    pub const SUMS: usize = 4 + QK_K;

    /// Rounds half away from zero, as Q8_0's quantizer does (the SIMD twins share its
    /// rounding). Non-finite input still gives valid quants: NaN becomes 0 and ±inf ±127.
    pub fn quantize(x: &[f32; QK_K]) -> Self {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(libm::fabsf(*v)));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0i8; QK_K];
        for (q, v) in qs.iter_mut().zip(x) {
            *q = libm::roundf(v * id).clamp(-127.0, 127.0) as i8;
        }
        BlockQ8K {
            d,
            qs,
            sums: sums(&qs),
        }
    }

    /// Reads a stored block from the start of `b`.
    pub fn read(b: &[u8]) -> Self {
        let mut qs = [0i8; QK_K];
        for (q, v) in qs.iter_mut().zip(&b[Self::QUANTS..Self::SUMS]) {
            *q = *v as i8;
        }
        let mut s = [0i16; QK_K / SUM_SPAN];
        for (s, v) in s.iter_mut().zip(b[Self::SUMS..Self::BYTES].chunks_exact(2)) {
            *s = i16::from_le_bytes([v[0], v[1]]);
        }
        BlockQ8K {
            d: f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            qs,
            sums: s,
        }
    }

    /// Writes the block to the start of `out`.
    pub fn write(&self, out: &mut [u8]) {
        out[..4].copy_from_slice(&self.d.to_le_bytes());
        for (o, q) in out[Self::QUANTS..Self::SUMS].iter_mut().zip(&self.qs) {
            *o = *q as u8;
        }
        for (o, s) in out[Self::SUMS..Self::BYTES]
            .chunks_exact_mut(2)
            .zip(&self.sums)
        {
            o.copy_from_slice(&s.to_le_bytes());
        }
    }
}

/// The sums of each run of `SUM_SPAN` quants.
pub fn sums(qs: &[i8; QK_K]) -> [i16; QK_K / SUM_SPAN] {
    core::array::from_fn(|k| {
        qs[SUM_SPAN * k..][..SUM_SPAN]
            .iter()
            .map(|&q| q as i16)
            .sum()
    })
}

/// Bytes of `n` values as Q8K (whole blocks only: `n` a multiple of 256).
pub const fn row_bytes(n: usize) -> usize {
    n / QK_K * BlockQ8K::BYTES
}

/// Quantizes the whole blocks `x` and `out` both hold: the reference every SIMD quantizer
/// matches bit for bit.
pub fn quantize_row(x: &[f32], out: &mut [u8]) {
    for (xb, o) in x
        .as_chunks::<QK_K>()
        .0
        .iter()
        .zip(out.chunks_exact_mut(BlockQ8K::BYTES))
    {
        BlockQ8K::quantize(xb).write(o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_bounds_the_error() {
        let x: [f32; QK_K] = core::array::from_fn(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013);
        let b = BlockQ8K::quantize(&x);
        let mut bytes = [0u8; BlockQ8K::BYTES];
        b.write(&mut bytes);
        assert_eq!(BlockQ8K::read(&bytes), b);
        for (v, q) in x.iter().zip(&b.qs) {
            assert!((v - b.d * *q as f32).abs() <= b.d * 0.5 + 1e-7);
        }
        for (k, s) in b.sums.iter().enumerate() {
            let want: i32 = b.qs[16 * k..16 * k + 16].iter().map(|&q| q as i32).sum();
            assert_eq!(*s as i32, want);
        }
    }

    #[test]
    fn non_finite_input_gives_valid_quants() {
        let mut x = [0.5f32; QK_K];
        x[0] = f32::NAN;
        x[1] = f32::INFINITY;
        x[2] = f32::NEG_INFINITY;
        let b = BlockQ8K::quantize(&x);
        assert!(b.qs.iter().all(|q| (-127..=127).contains(q)));
        let zeros = BlockQ8K::quantize(&[0.0; QK_K]);
        assert_eq!((zeros.d, zeros.qs), (0.0, [0; QK_K]));
    }
}
