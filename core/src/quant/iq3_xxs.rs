//! IQ3_XXS: 256 values as `{ d: f16, qs: [u8; 64], signs_and_scales: [u32; 8] }` (98 bytes), in
//! eight 32-value blocks of eight groups of four. Block `j`'s bytes `qs[8j..8j + 8]` index
//! `IQ3XXS_GRID` (four magnitudes 4 to 62 per entry); its word at `66 + 4j` holds, in bits
//! `7l..7l + 7`, the signs of values `8l..8l + 8` (`sign_byte`) and, in its top four bits, the
//! block's scale `s`. ggml's value is `d·(0.5 + s)·0.5·magnitude·sign`; read as a k-quant: `d/4`
//! (`D_SCALE`), both halves scaled by `1 + 2s`, stored quants the signed values plus 64. IQ3_XXS
//! and IQ3_XS files are mostly this.
use super::iq2_xxs::{sign_byte, signed_quants};
use super::iq_grids::IQ3XXS_GRID;
use super::k_quants::{u16_at, KBlock, KInts, HALVES_PER_SUPER};
use super::QK;

/// IQ3_XXS, read in place.
pub struct BlockIQ3XXS;

impl BlockIQ3XXS {
    /// Byte offset of the grid indices (eight per block).
    pub const QS: usize = 2;
    /// Byte offset of the blocks' sign-and-scale words.
    pub const SIGNS: usize = 66;

    /// Block `j`'s sign-and-scale word.
    #[inline(always)]
    pub fn signs_and_scale(sb: &[u8], j: usize) -> u32 {
        let b = &sb[Self::SIGNS + 4 * j..][..4];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl KBlock for BlockIQ3XXS {
    const BYTES: usize = 98;
    const HAS_MIN: bool = false;
    /// The signed values lie in -62..=62.
    const OFFSET: i32 = 64;
    const SHARED_HALVES: bool = true;
    #[inline(always)]
    fn f16_bits(sb: &[u8]) -> [u16; 2] {
        let d = u16_at(sb, 0);
        [d, d]
    }
    const D_SCALE: f32 = 0.25;
    #[inline(always)]
    fn ints(sb: &[u8]) -> KInts {
        KInts {
            scales: core::array::from_fn(|k| {
                (1 + 2 * (Self::signs_and_scale(sb, k / 2) >> 28)) as i8
            }),
            mins: [0; HALVES_PER_SUPER],
        }
    }
    fn quants(sb: &[u8], j: usize) -> [u8; QK] {
        let qs = &sb[Self::QS + 8 * j..][..8];
        let magnitudes =
            core::array::from_fn(|v| (IQ3XXS_GRID[qs[v / 4] as usize] >> (8 * (v % 4))) as u8);
        let aux = Self::signs_and_scale(sb, j);
        let signs = core::array::from_fn(|l| sign_byte(aux >> (7 * l)));
        signed_quants(magnitudes, signs, Self::OFFSET)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::k_quants::{dequantize_blocks, QK_K};
    use half::f16;
    use proptest::prelude::*;

    proptest! {
        /// ggml's `dequantize_row_iq3_xxs`, written out, is what the k-quant form gives.
        #[test]
        fn k_quant_form_is_ggml_dequantization(sb in proptest::collection::vec(any::<u8>(), 98)) {
            let mut sb = sb;
            sb[1] &= 0x3b; // a finite d
            let mut y = [0f32; QK_K];
            dequantize_blocks::<BlockIQ3XXS>(&sb, &mut y);
            let d = f16::from_le_bytes([sb[0], sb[1]]).to_f32();
            for ib32 in 0..8 {
                let aux = BlockIQ3XXS::signs_and_scale(&sb, ib32);
                let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
                let qs = &sb[2 + 8 * ib32..];
                for l in 0..4 {
                    let signs = sign_byte(aux >> (7 * l));
                    let g1 = IQ3XXS_GRID[qs[2 * l] as usize].to_le_bytes();
                    let g2 = IQ3XXS_GRID[qs[2 * l + 1] as usize].to_le_bytes();
                    for k in 0..4 {
                        let s1 = if signs & (1 << k) != 0 { -1.0 } else { 1.0 };
                        let s2 = if signs & (1 << (k + 4)) != 0 { -1.0 } else { 1.0 };
                        let at = 32 * ib32 + 8 * l;
                        prop_assert_eq!(y[at + k], db * g1[k] as f32 * s1);
                        prop_assert_eq!(y[at + k + 4], db * g2[k] as f32 * s2);
                    }
                }
            }
        }
    }
}
