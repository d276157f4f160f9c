//! Q8_0: 32 values as `{ d: f16, qs: [i8; 32] }`, value `qs[j] * d`.
use half::f16;

use super::{Block, QK};

/// One Q8_0 block, laid out exactly as ggml's `block_q8_0`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8_0 {
    /// The scale: value = `d · q`.
    pub d: f16,
    /// The quants.
    pub qs: [i8; QK],
}

const _: () = assert!(core::mem::size_of::<BlockQ8_0>() == BlockQ8_0::BYTES);

impl BlockQ8_0 {
    /// Bytes of a stored block.
    pub const BYTES: usize = 2 + QK;
}

impl Block for BlockQ8_0 {
    const BYTES: usize = Self::BYTES;

    /// ggml's `quantize_row_q8_0_ref` for one block.
    fn quantize(x: &[f32; QK]) -> Self {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(libm::fabsf(*v)));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0i8; QK];
        for (q, v) in qs.iter_mut().zip(x) {
            // Finite input never leaves ±127. For ±inf and NaN, where C is undefined, clamp to
            // ±127 (so every SIMD kernel can negate a quant) and let `as` map NaN to 0.
            *q = libm::roundf(v * id).clamp(-127.0, 127.0) as i8;
        }
        BlockQ8_0 {
            d: f16::from_f32(d),
            qs,
        }
    }

    fn read(b: &[u8]) -> Self {
        let mut qs = [0i8; QK];
        for (q, v) in qs.iter_mut().zip(&b[2..Self::BYTES]) {
            *q = *v as i8;
        }
        BlockQ8_0 {
            d: f16::from_bits(u16::from_le_bytes([b[0], b[1]])),
            qs,
        }
    }

    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_bits().to_le_bytes());
        for (o, q) in out[2..Self::BYTES].iter_mut().zip(&self.qs) {
            *o = *q as u8;
        }
    }

    fn dequantize(&self, out: &mut [f32; QK]) {
        let d = self.d.to_f32();
        for (v, q) in out.iter_mut().zip(&self.qs) {
            *v = *q as f32 * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_blocks;
    use proptest::prelude::*;

    #[test]
    fn all_zero_block_has_zero_scale_and_quants() {
        let b = BlockQ8_0::quantize(&[0.0; QK]);
        assert_eq!(b.d.to_bits(), 0);
        assert_eq!(b.qs, [0; QK]);
    }

    #[test]
    fn halves_round_away_from_zero() {
        // amax 127 gives d = 1, so each value is its own quant.
        let mut x = [0.0f32; QK];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        x[3] = 0.5;
        let b = BlockQ8_0::quantize(&x);
        assert_eq!(&b.qs[..4], &[127, 3, -3, 1]);
    }

    proptest! {
        #[test]
        fn round_trip_within_half_a_step(x in proptest::collection::vec(-1e4f32..1e4, QK)) {
            let b = BlockQ8_0::quantize(x.as_slice().try_into().unwrap());
            let mut bytes = [0u8; BlockQ8_0::BYTES];
            b.write(&mut bytes);
            prop_assert_eq!(BlockQ8_0::read(&bytes), b);
            let mut y = [0f32; QK];
            dequantize_blocks::<BlockQ8_0>(&bytes, &mut y);
            let d = b.d.to_f32();
            // d is rounded to f16, so the grid is d_f16, not amax/127: allow the f16 rounding of d
            // times the largest quant on top of half a step.
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let slack = (amax / 127.0 - d).abs() * 127.0 + amax * 1e-6;
            for (a, b) in x.iter().zip(&y) {
                prop_assert!((a - b).abs() <= d / 2.0 + slack, "{} vs {} (d {})", a, b, d);
            }
        }
    }
}
