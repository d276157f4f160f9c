//! IQ2_S: 256 values as `{ d: f16, qs: [u8; 32], signs: [u8; 32], qh: [u8; 8], scales: [u8; 8] }`
//! (82 bytes), in eight 32-value blocks of four groups of eight. Group `l` of block `j` indexes
//! `IQ2S_GRID` (eight magnitudes 8, 25 or 43 per entry) with `qs[4j + l]` and, as bits 8 and 9,
//! bits `2l, 2l + 1` of `qh[j]`; byte `signs[4j + l]` holds its sign bits. Half `h` of block `j`
//! has scale `s`, nibble `h` of `scales[j]`. ggml's value is `d·(0.5 + s)·0.25·magnitude·sign`;
//! read as a k-quant: `d/8` (`D_SCALE`), halves scaled by `1 + 2s`, stored quants the signed
//! values plus 64. IQ2_S and IQ2_M files are mostly this.
use super::iq2_xxs::{nibble_half_scales, signed_quants};
use super::iq_grids::IQ2S_GRID;
use super::k_quants::{u16_at, KBlock, KInts};
use super::QK;

/// IQ2_S, read in place.
pub struct BlockIQ2S;

impl BlockIQ2S {
    /// Byte offset of the grid indices' low eight bits (four per block).
    pub const QS: usize = 2;
    /// Byte offset of the sign bits (four bytes per block).
    pub const SIGNS: usize = 34;
    /// Byte offset of the indices' high two bits (a byte per block).
    pub const QH: usize = 66;
    /// Byte offset of the scales (a nibble per half).
    pub const SCALES: usize = 74;

    /// Group `l`'s (0..4) grid index in block `j`.
    #[inline(always)]
    pub fn grid_index(sb: &[u8], j: usize, l: usize) -> usize {
        let high = (sb[Self::QH + j] >> (2 * l)) & 3;
        sb[Self::QS + 4 * j + l] as usize | (high as usize) << 8
    }
}

impl KBlock for BlockIQ2S {
    const BYTES: usize = 82;
    const HAS_MIN: bool = false;
    /// The signed values lie in -43..=43.
    const OFFSET: i32 = 64;
    #[inline(always)]
    fn f16_bits(sb: &[u8]) -> [u16; 2] {
        let d = u16_at(sb, 0);
        [d, d]
    }
    const D_SCALE: f32 = 0.125;
    #[inline(always)]
    fn ints(sb: &[u8]) -> KInts {
        nibble_half_scales(sb, Self::SCALES)
    }
    fn quants(sb: &[u8], j: usize) -> [u8; QK] {
        let entries: [u64; 4] = core::array::from_fn(|l| IQ2S_GRID[Self::grid_index(sb, j, l)]);
        let magnitudes = core::array::from_fn(|v| (entries[v / 8] >> (8 * (v % 8))) as u8);
        let s = &sb[Self::SIGNS + 4 * j..][..4];
        signed_quants(magnitudes, [s[0], s[1], s[2], s[3]], Self::OFFSET)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::k_quants::{dequantize_blocks, QK_K};
    use half::f16;
    use proptest::prelude::*;

    proptest! {
        /// ggml's `dequantize_row_iq2_s`, written out, is what the k-quant form gives.
        #[test]
        fn k_quant_form_is_ggml_dequantization(sb in proptest::collection::vec(any::<u8>(), 82)) {
            let mut sb = sb;
            sb[1] &= 0x3b; // a finite d
            let mut y = [0f32; QK_K];
            dequantize_blocks::<BlockIQ2S>(&sb, &mut y);
            let d = f16::from_le_bytes([sb[0], sb[1]]).to_f32();
            let (qs, signs) = (&sb[2..34], &sb[34..66]);
            let (qh, scales) = (&sb[66..74], &sb[74..82]);
            for ib32 in 0..8 {
                let db = [
                    d * (0.5 + (scales[ib32] & 0xf) as f32) * 0.25,
                    d * (0.5 + (scales[ib32] >> 4) as f32) * 0.25,
                ];
                for l in 0..4 {
                    let index = qs[4 * ib32 + l] as usize
                        | ((qh[ib32] as usize) << (8 - 2 * l)) & 0x300;
                    let g = IQ2S_GRID[index].to_le_bytes();
                    for (k, g) in g.iter().enumerate() {
                        let neg = signs[4 * ib32 + l] & (1 << k) != 0;
                        let s = if neg { -1.0 } else { 1.0 };
                        prop_assert_eq!(y[32 * ib32 + 8 * l + k], db[l / 2] * *g as f32 * s);
                    }
                }
            }
        }
    }
}
