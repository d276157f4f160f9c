//! Q4_1: 32 values as `{ d: f16, m: f16, qs: [u8; 16] }`; nibbles as Q4_0; value `n * d + m`.
use half::f16;

use super::{Block, QK};

/// One Q4_1 block, laid out exactly as ggml's `block_q4_1`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ4_1 {
    /// The scale: value = `d · q + m`.
    pub d: f16,
    /// The minimum.
    pub m: f16,
    /// Value j's quant in the low nibble of byte j, value j + 16's in its high nibble.
    pub qs: [u8; QK / 2],
}

const _: () = assert!(core::mem::size_of::<BlockQ4_1>() == BlockQ4_1::BYTES);

impl BlockQ4_1 {
    /// Bytes of a stored block.
    pub const BYTES: usize = 4 + QK / 2;
}

impl Block for BlockQ4_1 {
    const BYTES: usize = Self::BYTES;

    /// ggml's `quantize_row_q4_1_ref` for one block: 16 steps from the minimum to the maximum.
    fn quantize(x: &[f32; QK]) -> Self {
        let mut min = f32::MAX;
        let mut max = -f32::MAX;
        for &v in x {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; QK / 2];
        for (j, q) in qs.iter_mut().enumerate() {
            let lo = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let hi = (((x[j + QK / 2] - min) * id + 0.5) as i8).min(15) as u8;
            *q = lo | (hi << 4);
        }
        BlockQ4_1 {
            d: f16::from_f32(d),
            m: f16::from_f32(min),
            qs,
        }
    }

    fn read(b: &[u8]) -> Self {
        BlockQ4_1 {
            d: f16::from_bits(u16::from_le_bytes([b[0], b[1]])),
            m: f16::from_bits(u16::from_le_bytes([b[2], b[3]])),
            qs: b[4..Self::BYTES].try_into().unwrap(),
        }
    }

    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_bits().to_le_bytes());
        out[2..4].copy_from_slice(&self.m.to_bits().to_le_bytes());
        out[4..Self::BYTES].copy_from_slice(&self.qs);
    }

    fn dequantize(&self, out: &mut [f32; QK]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (j, q) in self.qs.iter().enumerate() {
            out[j] = (q & 0x0f) as f32 * d + m;
            out[j + QK / 2] = (q >> 4) as f32 * d + m;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_blocks;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip_within_half_a_step(x in proptest::collection::vec(-1e4f32..1e4, QK)) {
            let b = BlockQ4_1::quantize(x.as_slice().try_into().unwrap());
            let mut bytes = [0u8; BlockQ4_1::BYTES];
            b.write(&mut bytes);
            prop_assert_eq!(BlockQ4_1::read(&bytes), b);
            let mut y = [0f32; QK];
            dequantize_blocks::<BlockQ4_1>(&bytes, &mut y);
            let d = b.d.to_f32();
            let min = x.iter().fold(f32::MAX, |m, v| m.min(*v));
            let max = x.iter().fold(-f32::MAX, |m, v| m.max(*v));
            // d and m are rounded to f16: the grid shifts by |m - min| and stretches by 15|d - d_exact|.
            let slack = (b.m.to_f32() - min).abs() + ((max - min) / 15.0 - d).abs() * 15.0
                + (max.abs() + min.abs()) * 1e-6;
            for (a, b) in x.iter().zip(&y) {
                prop_assert!((a - b).abs() <= d / 2.0 + slack, "{} vs {} (d {})", a, b, d);
            }
        }
    }
}
