//! IQ4_XS: IQ4_NL's grid (`iq4_nl::IQ4_VALUES`) in 256-value super-blocks,
//! `{ d: f16, scales_h: u16, scales_l: [u8; 4], qs: [u8; 128] }`: each 32-value block has a
//! 6-bit scale `ls` (four bits in `scales_l`, two in `scales_h`), value `d · (ls − 32) ·
//! IQ4_VALUES[n]`, its sixteen bytes of nibbles as IQ4_NL's. Read as a k-quant: halves with
//! scales `ls − 32`, stored quants the grid values plus 128.
use half::f16;

use super::iq4_nl::{best_scale, nearest_value, pack_nibbles, IQ4_VALUES};
use super::k_quantize::nearest_int;
use super::k_quants::{u16_at, KBlock, KInts, BLOCKS_PER_SUPER, HALVES_PER_SUPER, QK_K};
use super::QK;

/// IQ4_XS, read in place.
pub struct BlockIQ4XS;

/// Byte offset of the nibbles.
const QS: usize = 8;

impl BlockIQ4XS {
    /// Each block's 6-bit scale `ls` (0..64), block `ib` in byte `ib`: `scales_l`'s nibbles and
    /// `scales_h`'s bit pairs spread to one byte each with shifts and masks (a loop over the
    /// blocks cost a decoded super-block's dot as much again).
    #[inline(always)]
    pub fn scale_bytes(sb: &[u8]) -> u64 {
        let low = u32::from_le_bytes([sb[4], sb[5], sb[6], sb[7]]) as u64;
        let low = (low | (low << 16)) & 0x0000_ffff_0000_ffff;
        let low = (low | (low << 8)) & 0x00ff_00ff_00ff_00ff;
        let low = (low | (low << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
        let high = u16::from_le_bytes([sb[2], sb[3]]) as u64;
        let high = (high | (high << 24)) & 0x0000_00ff_0000_00ff;
        let high = (high | (high << 12)) & 0x000f_000f_000f_000f;
        let high = (high | (high << 6)) & 0x0303_0303_0303_0303;
        low | (high << 4)
    }

    /// Each block's scale less 32 (ggml's `ls - 32`).
    #[inline(always)]
    pub fn block_scales(sb: &[u8]) -> [i8; BLOCKS_PER_SUPER] {
        Self::scale_bytes(sb).to_le_bytes().map(|ls| ls as i8 - 32)
    }
}

impl KBlock for BlockIQ4XS {
    const BYTES: usize = QS + QK_K / 2;
    const HAS_MIN: bool = false;
    /// The grid's values are signed; stored quants are unsigned, as `vpmaddubsw` wants them.
    const OFFSET: i32 = 128;
    const WIDE: bool = true;
    const SHARED_HALVES: bool = true;
    #[inline(always)]
    fn f16_bits(sb: &[u8]) -> [u16; 2] {
        let d = u16_at(sb, 0);
        [d, d]
    }
    #[inline(always)]
    fn ints(sb: &[u8]) -> KInts {
        let scales = Self::block_scales(sb);
        KInts {
            scales: core::array::from_fn(|k| scales[k / 2]),
            mins: [0; HALVES_PER_SUPER],
        }
    }
    /// Block `j`'s sixteen bytes at `8 + 16j`, low nibbles first, through the grid.
    fn quants(sb: &[u8], j: usize) -> [u8; QK] {
        let qs = &sb[QS + QK / 2 * j..][..QK / 2];
        core::array::from_fn(|l| {
            let n = if l < QK / 2 {
                qs[l] & 0x0f
            } else {
                qs[l - QK / 2] >> 4
            };
            (IQ4_VALUES[n as usize] as i32 + Self::OFFSET) as u8
        })
    }
}

/// One IQ4_XS super-block (136 bytes) from 256 values, as `llama-quantize` writes it without an
/// importance matrix (ggml's `quantize_iq4_xs`): each block's scale searched as IQ4_NL's, then
/// rounded to a 6-bit multiple of the super-block's scale, the largest one -32, and the indices
/// taken again for it.
pub fn quantize(x: &[f32], y: &mut [u8]) {
    let mut scales = [0f32; BLOCKS_PER_SUPER];
    let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
    for (s, xb) in scales.iter_mut().zip(x.as_chunks::<QK>().0) {
        *s = best_scale(xb);
        if libm::fabsf(*s) > amax_scale {
            amax_scale = libm::fabsf(*s);
            max_scale = *s;
        }
    }
    let d = -max_scale / 32.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    y[..BlockIQ4XS::BYTES].fill(0);
    y[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    let mut high = 0u16;
    for (ib, xb) in x.chunks_exact(QK).enumerate() {
        let l = nearest_int(id * scales[ib]).clamp(-32, 31);
        let dl = d * l as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        let mut q = [0u8; QK];
        for (q, v) in q.iter_mut().zip(xb) {
            *q = nearest_value(idl * v);
        }
        y[QS + QK / 2 * ib..][..QK / 2].copy_from_slice(&pack_nibbles(&q));
        let ls = (l + 32) as u8;
        y[4 + ib / 2] |= (ls & 0x0f) << (4 * (ib % 2));
        high |= ((ls >> 4) as u16) << (2 * ib);
    }
    y[2..4].copy_from_slice(&high.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::k_quants::dequantize_blocks;
    use proptest::prelude::*;

    proptest! {
        /// ggml's `dequantize_row_iq4_xs`, written out, is what the k-quant form gives.
        #[test]
        fn k_quant_form_is_ggml_dequantization(sb in proptest::collection::vec(any::<u8>(), 136)) {
            let mut sb = sb;
            sb[1] &= 0x3b; // a finite d
            let mut y = [0f32; QK_K];
            dequantize_blocks::<BlockIQ4XS>(&sb, &mut y);
            let d = f16::from_le_bytes([sb[0], sb[1]]).to_f32();
            let high = u16::from_le_bytes([sb[2], sb[3]]);
            for ib in 0..BLOCKS_PER_SUPER {
                let ls = ((sb[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) as i32
                    | ((((high >> (2 * ib)) & 3) as i32) << 4);
                let dl = d * (ls - 32) as f32;
                for j in 0..16 {
                    let q = sb[8 + 16 * ib + j];
                    prop_assert_eq!(y[32 * ib + j], dl * IQ4_VALUES[(q & 0xf) as usize] as f32);
                    prop_assert_eq!(y[32 * ib + 16 + j], dl * IQ4_VALUES[(q >> 4) as usize] as f32);
                }
            }
        }

        #[test]
        fn round_trip_stays_near(x in proptest::collection::vec(-1e3f32..1e3, QK_K)) {
            let mut sb = [0u8; 136];
            quantize(&x, &mut sb);
            let mut y = [0f32; QK_K];
            dequantize_blocks::<BlockIQ4XS>(&sb, &mut y);
            // IQ4_NL's bound (see its test), the blocks' scales rounded to 1/32 of the largest.
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (a, b) in x.iter().zip(&y) {
                prop_assert!((a - b).abs() <= amax * 0.3 + 1e-3, "{} vs {}", a, b);
            }
        }
    }
}
