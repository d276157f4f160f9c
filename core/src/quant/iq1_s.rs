//! IQ1_S: 256 values as `{ d: f16, qs: [u8; 32], qh: [u16; 8] }` (50 bytes), in eight 32-value
//! blocks of four groups of eight. Block `j`'s word `qh[j]` holds, in bits `3l..3l + 3`, the
//! high bits of group `l`'s eleven-bit index into `IQ1S_GRID` (eight values -1, 0 or 1 per
//! entry; `qs[4j + l]` the low eight), in bits 12..15 the block's scale `s`, and in bit 15 the
//! sign of its shift `δ = ±1/8`. ggml's value is `d·(2s + 1)·(g + δ)`; read as a k-quant: `d/8`
//! (`D_SCALE`), both halves scaled by `2s + 1`, stored quants `8g ± 1` plus 16.
use super::iq_grids::IQ1S_GRID;
use super::k_quants::{u16_at, KBlock, KInts, HALVES_PER_SUPER};
use super::QK;

/// IQ1_S, read in place.
pub struct BlockIQ1S;

impl BlockIQ1S {
    /// Byte offset of the grid indices' low eight bits (four per block).
    pub const QS: usize = 2;
    /// Byte offset of the blocks' words of high bits, scale and shift sign.
    pub const QH: usize = 34;

    /// Block `j`'s word of high index bits, scale and shift sign.
    #[inline(always)]
    pub fn block_word(sb: &[u8], j: usize) -> u16 {
        u16::from_le_bytes([sb[Self::QH + 2 * j], sb[Self::QH + 2 * j + 1]])
    }
}

impl KBlock for BlockIQ1S {
    const BYTES: usize = 50;
    const HAS_MIN: bool = false;
    /// The values `8g ± 1` lie in -9..=9.
    const OFFSET: i32 = 16;
    const SHARED_HALVES: bool = true;
    #[inline(always)]
    fn f16_bits(sb: &[u8]) -> [u16; 2] {
        let d = u16_at(sb, 0);
        [d, d]
    }
    const D_SCALE: f32 = 0.125;
    #[inline(always)]
    fn ints(sb: &[u8]) -> KInts {
        KInts {
            scales: core::array::from_fn(|k| {
                (2 * ((Self::block_word(sb, k / 2) >> 12) & 7) + 1) as i8
            }),
            mins: [0; HALVES_PER_SUPER],
        }
    }
    fn quants(sb: &[u8], j: usize) -> [u8; QK] {
        let h = Self::block_word(sb, j) as usize;
        let shift = if h & 0x8000 != 0 { -1 } else { 1 };
        let entries: [u64; 4] = core::array::from_fn(|l| {
            IQ1S_GRID[sb[Self::QS + 4 * j + l] as usize | ((h >> (3 * l)) & 7) << 8]
        });
        core::array::from_fn(|v| {
            let g = (entries[v / 8] >> (8 * (v % 8))) as u8 as i8 as i32;
            (8 * g + shift + Self::OFFSET) as u8
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::k_quants::{dequantize_blocks, QK_K};
    use half::f16;
    use proptest::prelude::*;

    proptest! {
        /// ggml's `dequantize_row_iq1_s`, written out, is what the k-quant form gives.
        #[test]
        fn k_quant_form_is_ggml_dequantization(sb in proptest::collection::vec(any::<u8>(), 50)) {
            let mut sb = sb;
            sb[1] &= 0x3b; // a finite d
            let mut y = [0f32; QK_K];
            dequantize_blocks::<BlockIQ1S>(&sb, &mut y);
            let d = f16::from_le_bytes([sb[0], sb[1]]).to_f32();
            for ib in 0..8 {
                let qh = BlockIQ1S::block_word(&sb, ib) as usize;
                let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
                let delta = if qh & 0x8000 != 0 { -0.125 } else { 0.125 };
                for l in 0..4 {
                    let index = sb[2 + 4 * ib + l] as usize | (((qh >> (3 * l)) & 7) << 8);
                    let g = IQ1S_GRID[index].to_le_bytes();
                    for (k, g) in g.iter().enumerate() {
                        prop_assert_eq!(y[32 * ib + 8 * l + k], dl * (*g as i8 as f32 + delta));
                    }
                }
            }
        }
    }
}
