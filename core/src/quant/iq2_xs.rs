//! IQ2_XS: 256 values as `{ d: f16, qs: [u16; 32], scales: [u8; 8] }` (74 bytes), in eight
//! 32-value blocks of four groups of eight. Group `l` of block `j` is the word `qs[4j + l]`: its
//! low nine bits index `IQ2XS_GRID` (eight magnitudes 8, 25 or 43 per entry), its high seven
//! pick the signs (`sign_byte`). Half `h` of block `j` (groups `2h`, `2h + 1`) has scale `s`,
//! nibble `h` of `scales[j]`. ggml's value is `d·(0.5 + s)·0.25·magnitude·sign`; read as a
//! k-quant: `d/8` (`D_SCALE`), halves scaled by `1 + 2s`, stored quants the signed values plus
//! 64. IQ2_XS files are mostly this.
use super::iq2_xxs::{nibble_half_scales, sign_byte, signed_quants};
use super::iq_grids::IQ2XS_GRID;
use super::k_quants::{u16_at, KBlock, KInts};
use super::QK;

/// IQ2_XS, read in place.
pub struct BlockIQ2XS;

impl BlockIQ2XS {
    /// Byte offset of the groups' words.
    pub const QS: usize = 2;
    /// Byte offset of the scales (a nibble per half).
    pub const SCALES: usize = 66;

    /// Group `l`'s (0..4) word in block `j`.
    #[inline(always)]
    pub fn group_word(sb: &[u8], j: usize, l: usize) -> u16 {
        let at = Self::QS + 2 * (4 * j + l);
        u16::from_le_bytes([sb[at], sb[at + 1]])
    }
}

impl KBlock for BlockIQ2XS {
    const BYTES: usize = 74;
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
        let words: [u16; 4] = core::array::from_fn(|l| Self::group_word(sb, j, l));
        let magnitudes: [u8; QK] = core::array::from_fn(|v| {
            (IQ2XS_GRID[(words[v / 8] & 511) as usize] >> (8 * (v % 8))) as u8
        });
        let signs = words.map(|w| sign_byte(w as u32 >> 9));
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
        /// ggml's `dequantize_row_iq2_xs`, written out, is what the k-quant form gives.
        #[test]
        fn k_quant_form_is_ggml_dequantization(sb in proptest::collection::vec(any::<u8>(), 74)) {
            let mut sb = sb;
            sb[1] &= 0x3b; // a finite d
            let mut y = [0f32; QK_K];
            dequantize_blocks::<BlockIQ2XS>(&sb, &mut y);
            let d = f16::from_le_bytes([sb[0], sb[1]]).to_f32();
            for ib32 in 0..8 {
                let scale = sb[BlockIQ2XS::SCALES + ib32];
                let db = [
                    d * (0.5 + (scale & 0xf) as f32) * 0.25,
                    d * (0.5 + (scale >> 4) as f32) * 0.25,
                ];
                for l in 0..4 {
                    let q = BlockIQ2XS::group_word(&sb, ib32, l);
                    let g = IQ2XS_GRID[(q & 511) as usize].to_le_bytes();
                    let signs = sign_byte(q as u32 >> 9);
                    for (k, g) in g.iter().enumerate() {
                        let s = if signs & (1 << k) != 0 { -1.0 } else { 1.0 };
                        prop_assert_eq!(y[32 * ib32 + 8 * l + k], db[l / 2] * *g as f32 * s);
                    }
                }
            }
        }
    }
}
