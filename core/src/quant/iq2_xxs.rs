//! IQ2_XXS: 256 values as `{ d: f16, qs: [u16; 32] }` (66 bytes), in eight 32-value blocks of
//! four groups of eight. Block `j`'s eight bytes at `2 + 8j` are four grid indices (a byte each,
//! into `IQ2XXS_GRID`: eight magnitudes 8, 25 or 43 per entry) and a word whose bits `7l..7l + 7`
//! pick group `l`'s signs (`sign_byte`) and whose top four bits are the block's scale `s`. ggml's
//! value is `d·(0.5 + s)·0.25·magnitude·sign`; read as a k-quant: `d/8` (`D_SCALE`), both halves
//! scaled by `1 + 2s`, stored quants the signed values plus 64. IQ2_XXS files are mostly this.
use super::iq_grids::IQ2XXS_GRID;
use super::k_quants::{u16_at, KBlock, KInts, HALVES_PER_SUPER};
use super::QK;

/// IQ2_XXS, read in place.
pub struct BlockIQ2XXS;

/// ggml's `ksigns_iq2xs`: eight sign bits from seven, the eighth making their count even (bit
/// `v` set: value `v` of the group is negative).
#[inline(always)]
pub const fn sign_byte(index: u32) -> u8 {
    let index = index & 127;
    (index | ((index.count_ones() & 1) << 7)) as u8
}

/// Group `v / 8`'s signs of `signs` (a byte per group of eight), applied to `magnitudes`, plus
/// `offset`: the stored quants of the i-quants whose grids hold magnitudes.
#[inline(always)]
pub(crate) fn signed_quants(magnitudes: [u8; QK], signs: [u8; 4], offset: i32) -> [u8; QK] {
    core::array::from_fn(|v| {
        let m = magnitudes[v] as i32;
        let value = if signs[v / 8] >> (v % 8) & 1 == 1 {
            -m
        } else {
            m
        };
        (value + offset) as u8
    })
}

/// Half scales `1 + 2s`, `s` nibble `k % 2` of byte `k / 2` of `sb[at..at + 8]` for half `k`
/// (IQ2_XS's and IQ2_S's scales).
#[inline(always)]
pub(crate) fn nibble_half_scales(sb: &[u8], at: usize) -> KInts {
    KInts {
        scales: core::array::from_fn(|k| {
            (1 + 2 * ((sb[at + k / 2] >> (4 * (k % 2))) & 0x0f)) as i8
        }),
        mins: [0; HALVES_PER_SUPER],
    }
}

impl BlockIQ2XXS {
    /// Byte offset of the blocks' eight bytes each.
    pub const QS: usize = 2;

    /// Block `j`'s grid indices (bytes 0..4) and sign-and-scale word (bytes 4..8).
    #[inline(always)]
    pub fn block_words(sb: &[u8], j: usize) -> (u32, u32) {
        let b = &sb[Self::QS + 8 * j..][..8];
        (
            u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        )
    }
}

impl KBlock for BlockIQ2XXS {
    const BYTES: usize = 66;
    const HAS_MIN: bool = false;
    /// The signed values lie in -43..=43.
    const OFFSET: i32 = 64;
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
                (1 + 2 * (Self::block_words(sb, k / 2).1 >> 28)) as i8
            }),
            mins: [0; HALVES_PER_SUPER],
        }
    }
    fn quants(sb: &[u8], j: usize) -> [u8; QK] {
        let (grid, aux) = Self::block_words(sb, j);
        let magnitudes: [u8; QK] = core::array::from_fn(|v| {
            (IQ2XXS_GRID[(grid >> (8 * (v / 8))) as u8 as usize] >> (8 * (v % 8))) as u8
        });
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

    /// ggml's `ksigns_iq2xs`, as its table has them.
    #[test]
    fn sign_bytes_are_ggml_table() {
        let first = [
            0u8, 129, 130, 3, 132, 5, 6, 135, 136, 9, 10, 139, 12, 141, 142, 15,
        ];
        for (i, s) in first.iter().enumerate() {
            assert_eq!(sign_byte(i as u32), *s);
        }
        assert_eq!(sign_byte(127), 255);
        assert_eq!(sign_byte(126), 126);
    }

    proptest! {
        /// ggml's `dequantize_row_iq2_xxs`, written out, is what the k-quant form gives.
        #[test]
        fn k_quant_form_is_ggml_dequantization(sb in proptest::collection::vec(any::<u8>(), 66)) {
            let mut sb = sb;
            sb[1] &= 0x3b; // a finite d
            let mut y = [0f32; QK_K];
            dequantize_blocks::<BlockIQ2XXS>(&sb, &mut y);
            let d = f16::from_le_bytes([sb[0], sb[1]]).to_f32();
            for ib32 in 0..8 {
                let (grid, aux) = BlockIQ2XXS::block_words(&sb, ib32);
                let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
                for l in 0..4 {
                    let g = IQ2XXS_GRID[(grid >> (8 * l)) as u8 as usize].to_le_bytes();
                    let signs = sign_byte(aux >> (7 * l));
                    for (k, g) in g.iter().enumerate() {
                        let s = if signs & (1 << k) != 0 { -1.0 } else { 1.0 };
                        prop_assert_eq!(y[32 * ib32 + 8 * l + k], db * *g as f32 * s);
                    }
                }
            }
        }
    }
}
