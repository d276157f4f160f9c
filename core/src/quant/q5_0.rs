//! Q5_0: 32 values as `{ d: f16, qh: [u8; 4], qs: [u8; 16] }`; nibbles as Q4_0, and bit `j` of
//! the little-endian `qh` is the fifth bit of element `j`; value `(n - 16) * d`.
use half::f16;

use super::{Block, QK};

/// One Q5_0 block, laid out exactly as ggml's `block_q5_0`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ5_0 {
    /// The scale: value = `d · (q − 16)`.
    pub d: f16,
    /// The fifth bit of each quant, bit j for value j.
    pub qh: [u8; 4],
    /// The low four bits, as Q4_0 packs them.
    pub qs: [u8; QK / 2],
}

const _: () = assert!(core::mem::size_of::<BlockQ5_0>() == BlockQ5_0::BYTES);

impl BlockQ5_0 {
    /// Bytes of a stored block.
    pub const BYTES: usize = 2 + 4 + QK / 2;

    /// The 32 stored five-bit quants (0..32), values in order.
    pub fn quants(&self) -> [u8; QK] {
        unpack5(&self.qh, &self.qs)
    }
}

impl Block for BlockQ5_0 {
    const BYTES: usize = Self::BYTES;

    /// ggml's `quantize_row_q5_0_ref` for one block: the value of largest magnitude maps to -16.
    fn quantize(x: &[f32; QK]) -> Self {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in x {
            if amax < libm::fabsf(v) {
                amax = libm::fabsf(v);
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: [u8; QK] = core::array::from_fn(|j| ((x[j] * id + 16.5) as i8).min(31) as u8);
        let (qh, qs) = pack5(&q);
        BlockQ5_0 {
            d: f16::from_f32(d),
            qh,
            qs,
        }
    }

    fn read(b: &[u8]) -> Self {
        BlockQ5_0 {
            d: f16::from_bits(u16::from_le_bytes([b[0], b[1]])),
            qh: b[2..6].try_into().unwrap(),
            qs: b[6..Self::BYTES].try_into().unwrap(),
        }
    }

    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_bits().to_le_bytes());
        out[2..6].copy_from_slice(&self.qh);
        out[6..Self::BYTES].copy_from_slice(&self.qs);
    }

    fn dequantize(&self, out: &mut [f32; QK]) {
        let d = self.d.to_f32();
        for (o, q) in out.iter_mut().zip(self.quants()) {
            *o = (q as i32 - 16) as f32 * d;
        }
    }
}

/// Five-bit quants (0..32) as ggml stores them: low nibbles as Q4's, fifth bits in `qh`.
pub(crate) fn pack5(q: &[u8; QK]) -> ([u8; 4], [u8; QK / 2]) {
    let mut qh = 0u32;
    let mut qs = [0u8; QK / 2];
    for j in 0..QK / 2 {
        let (lo, hi) = (q[j], q[j + QK / 2]);
        qs[j] = (lo & 0x0f) | ((hi & 0x0f) << 4);
        qh |= (((lo & 0x10) >> 4) as u32) << j;
        qh |= (((hi & 0x10) >> 4) as u32) << (j + QK / 2);
    }
    (qh.to_le_bytes(), qs)
}

/// The 32 five-bit quants of `pack5`'s layout.
pub(crate) fn unpack5(qh: &[u8; 4], qs: &[u8; QK / 2]) -> [u8; QK] {
    let qh = u32::from_le_bytes(*qh);
    core::array::from_fn(|j| {
        let nibble = if j < QK / 2 {
            qs[j] & 0x0f
        } else {
            qs[j - QK / 2] >> 4
        };
        nibble | ((((qh >> j) & 1) as u8) << 4)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_blocks;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip_within_half_a_step(x in proptest::collection::vec(-1e4f32..1e4, QK)) {
            let b = BlockQ5_0::quantize(x.as_slice().try_into().unwrap());
            let mut bytes = [0u8; BlockQ5_0::BYTES];
            b.write(&mut bytes);
            prop_assert_eq!(BlockQ5_0::read(&bytes), b);
            let mut y = [0f32; QK];
            dequantize_blocks::<BlockQ5_0>(&bytes, &mut y);
            let d = b.d.to_f32().abs();
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            // d is rounded to f16: the grid stretches by 16|d - d_exact|.
            let slack = (amax / 16.0 - d).abs() * 16.0 + amax * 1e-6;
            // The grid runs from -16d to 15d (d signed): values of the other sign beyond 15.5|d|
            // clamp to its last step, at most |d| away. Everything else is within half a step.
            let dd = b.d.to_f32();
            for (a, b) in x.iter().zip(&y) {
                let bound = if a / dd > 15.5 { d } else { d / 2.0 };
                prop_assert!((a - b).abs() <= bound + slack, "{} vs {} (d {})", a, b, dd);
            }
        }

        #[test]
        fn five_bit_packing_round_trips(q in proptest::array::uniform32(0u8..32)) {
            let (qh, qs) = pack5(&q);
            prop_assert_eq!(unpack5(&qh, &qs), q);
        }
    }
}
