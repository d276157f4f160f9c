//! Q4_0: 32 values as `{ d: f16, qs: [u8; 16] }`; the low nibble of `qs[j]` is element `j`, the
//! high nibble element `j + 16`; value `(n - 8) * d`.
use half::f16;

use super::{Block, QK};

/// One Q4_0 block, laid out exactly as ggml's `block_q4_0`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ4_0 {
    /// The scale: value = `d · (q − 8)`.
    pub d: f16,
    /// Value j's quant in the low nibble of byte j, value j + 16's in its high nibble.
    pub qs: [u8; QK / 2],
}

const _: () = assert!(core::mem::size_of::<BlockQ4_0>() == BlockQ4_0::BYTES);

impl BlockQ4_0 {
    /// Bytes of a stored block.
    pub const BYTES: usize = 2 + QK / 2;
}

impl Block for BlockQ4_0 {
    const BYTES: usize = Self::BYTES;

    /// ggml's `quantize_row_q4_0_ref` for one block: the value of largest magnitude maps to -8.
    fn quantize(x: &[f32; QK]) -> Self {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in x {
            if amax < libm::fabsf(v) {
                amax = libm::fabsf(v);
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; QK / 2];
        for (j, q) in qs.iter_mut().enumerate() {
            let lo = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let hi = ((x[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
            *q = lo | (hi << 4);
        }
        BlockQ4_0 {
            d: f16::from_f32(d),
            qs,
        }
    }

    fn read(b: &[u8]) -> Self {
        BlockQ4_0 {
            d: f16::from_bits(u16::from_le_bytes([b[0], b[1]])),
            qs: b[2..Self::BYTES].try_into().unwrap(),
        }
    }

    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_bits().to_le_bytes());
        out[2..Self::BYTES].copy_from_slice(&self.qs);
    }

    fn dequantize(&self, out: &mut [f32; QK]) {
        let d = self.d.to_f32();
        for (j, q) in self.qs.iter().enumerate() {
            out[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
            out[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_blocks;
    use proptest::prelude::*;

    #[test]
    fn all_zero_block() {
        let b = BlockQ4_0::quantize(&[0.0; QK]);
        // 0 / -8 is -0.0, in ggml and gguf-py alike.
        assert_eq!(b.d.to_f32(), 0.0);
        assert_eq!(b.qs, [0x88; QK / 2]);
    }

    proptest! {
        #[test]
        fn round_trip_within_half_a_step(x in proptest::collection::vec(-1e4f32..1e4, QK)) {
            let b = BlockQ4_0::quantize(x.as_slice().try_into().unwrap());
            let mut bytes = [0u8; BlockQ4_0::BYTES];
            b.write(&mut bytes);
            prop_assert_eq!(BlockQ4_0::read(&bytes), b);
            let mut y = [0f32; QK];
            dequantize_blocks::<BlockQ4_0>(&bytes, &mut y);
            let d = b.d.to_f32().abs();
            // The grid is the f16-rounded d; the f16 rounding can move the far end by 8 steps of it.
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let slack = (amax / 8.0 - d).abs() * 8.0 + amax * 1e-6;
            // The grid runs from -8d to 7d (d signed): values of the other sign beyond 7.5|d|
            // clamp to its last step, at most |d| away since |x| <= 8|d|. Everything else is
            // within half a step.
            let dd = b.d.to_f32();
            for (a, b) in x.iter().zip(&y) {
                let beyond = a / dd > 7.5;
                let bound = if beyond { d } else { d / 2.0 };
                prop_assert!((a - b).abs() <= bound + slack, "{} vs {} (d {})", a, b, dd);
            }
        }
    }
}
