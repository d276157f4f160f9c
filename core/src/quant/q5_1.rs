//! Q5_1: 32 values as `{ d: f16, m: f16, qh: [u8; 4], qs: [u8; 16] }`; five-bit quants as Q5_0;
//! value `n * d + m`.
use half::f16;

use super::q5_0::{pack5, unpack5};
use super::{Block, QK};

/// One Q5_1 block, laid out exactly as ggml's `block_q5_1`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ5_1 {
    /// The scale: value = `d · q + m`.
    pub d: f16,
    /// The minimum.
    pub m: f16,
    /// The fifth bit of each quant, bit j for value j.
    pub qh: [u8; 4],
    /// The low four bits, as Q4_0 packs them.
    pub qs: [u8; QK / 2],
}

const _: () = assert!(core::mem::size_of::<BlockQ5_1>() == BlockQ5_1::BYTES);

impl BlockQ5_1 {
    /// Bytes of a stored block.
    pub const BYTES: usize = 4 + 4 + QK / 2;

    /// The 32 stored five-bit quants (0..32), values in order.
    pub fn quants(&self) -> [u8; QK] {
        unpack5(&self.qh, &self.qs)
    }
}

impl Block for BlockQ5_1 {
    const BYTES: usize = Self::BYTES;

    /// ggml's `quantize_row_q5_1_ref` for one block: 32 steps from the minimum to the maximum.
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
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: [u8; QK] = core::array::from_fn(|j| ((x[j] - min) * id + 0.5) as u8);
        let (qh, qs) = pack5(&q);
        BlockQ5_1 {
            d: f16::from_f32(d),
            m: f16::from_f32(min),
            qh,
            qs,
        }
    }

    fn read(b: &[u8]) -> Self {
        BlockQ5_1 {
            d: f16::from_bits(u16::from_le_bytes([b[0], b[1]])),
            m: f16::from_bits(u16::from_le_bytes([b[2], b[3]])),
            qh: b[4..8].try_into().unwrap(),
            qs: b[8..Self::BYTES].try_into().unwrap(),
        }
    }

    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_bits().to_le_bytes());
        out[2..4].copy_from_slice(&self.m.to_bits().to_le_bytes());
        out[4..8].copy_from_slice(&self.qh);
        out[8..Self::BYTES].copy_from_slice(&self.qs);
    }

    fn dequantize(&self, out: &mut [f32; QK]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (o, q) in out.iter_mut().zip(self.quants()) {
            *o = q as f32 * d + m;
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
            let b = BlockQ5_1::quantize(x.as_slice().try_into().unwrap());
            let mut bytes = [0u8; BlockQ5_1::BYTES];
            b.write(&mut bytes);
            prop_assert_eq!(BlockQ5_1::read(&bytes), b);
            let mut y = [0f32; QK];
            dequantize_blocks::<BlockQ5_1>(&bytes, &mut y);
            let d = b.d.to_f32();
            let min = x.iter().fold(f32::MAX, |m, v| m.min(*v));
            let max = x.iter().fold(-f32::MAX, |m, v| m.max(*v));
            // d and m are rounded to f16: the grid shifts by |m - min| and stretches by 31|d - d_exact|.
            let slack = (b.m.to_f32() - min).abs() + ((max - min) / 31.0 - d).abs() * 31.0
                + (max.abs() + min.abs()) * 1e-6;
            for (a, b) in x.iter().zip(&y) {
                prop_assert!((a - b).abs() <= d / 2.0 + slack, "{} vs {} (d {})", a, b, d);
            }
        }
    }
}
