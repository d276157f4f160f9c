//! IQ1_M: 256 values as `{ qs: [u8; 32], qh: [u8; 16], scales: [u16; 4] }` (56 bytes), in eight
//! 32-value blocks of four groups of eight. Group `l` of block `j` takes the low eight bits of its
//! eleven-bit index into `IQ1S_GRID` (eight values -1, 0 or 1 per entry) from `qs[4j + l]`, and
//! from nibble `l % 2` of `qh[2j + l / 2]` the high three (bits 0..3) and the sign of its shift
//! `δ = ±1/8` (bit 3). Half `k` (16 values) has the 3-bit scale `s` in bits `3(k % 4)` of word
//! `k / 4`; the words' top nibbles are the super-block's f16 `d`, four bits each. ggml's value is
//! `d·(2s + 1)·(g + δ)`; read as a k-quant as IQ1_S is: `d/8` (`D_SCALE`), scales `2s + 1`,
//! stored quants `8g ± 1` plus 16.
use super::iq_grids::IQ1S_GRID;
use super::k_quants::{KBlock, KInts, HALVES_PER_SUPER};
use super::QK;

/// IQ1_M, read in place.
pub struct BlockIQ1M;

impl BlockIQ1M {
    /// Byte offset of the grid indices' high bits and shift signs (two bytes per block).
    pub const QH: usize = 32;
    /// Byte offset of the four words of half scales and `d`'s nibbles.
    pub const SCALES: usize = 48;

    /// The four scale words, as one integer (word `i` in bits `16i..`).
    #[inline(always)]
    pub fn scale_words(sb: &[u8]) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&sb[Self::SCALES..Self::SCALES + 8]);
        u64::from_le_bytes(w)
    }

    /// `d`'s f16 bits: word `i`'s top nibble is bits `4i..4i + 4`.
    #[inline(always)]
    pub fn d_bits(words: u64) -> u16 {
        (0..4).fold(0, |d, i| {
            d | (((words >> (16 * i + 12)) & 0xf) << (4 * i)) as u16
        })
    }

    /// Sets `d`'s f16 bits, leaving the scales.
    pub fn set_d_bits(sb: &mut [u8], bits: u16) {
        for i in 0..4 {
            let at = Self::SCALES + 2 * i + 1;
            sb[at] = (sb[at] & 0x0f) | (((bits >> (4 * i)) as u8) << 4);
        }
    }

    /// The sixteen half scales `2s + 1`, half `k` in byte `k` (halves 0..8 in the first word):
    /// each word's four 3-bit fields spread to bytes, two words per 64 bits.
    #[inline(always)]
    pub fn half_scales(words: u64) -> [u64; 2] {
        let spread = |pair: u64| {
            (0..4).fold(0u64, |s, m| {
                let f = (pair >> (3 * m)) & 0x0007_0007;
                s | ((f & 7) | ((f >> 16) << 32)) << (8 * m)
            })
        };
        // Each byte at most 7: twice it plus one stays in the byte.
        [spread(words), spread(words >> 32)].map(|s| (s << 1) | 0x0101_0101_0101_0101)
    }
}

impl KBlock for BlockIQ1M {
    const BYTES: usize = 56;
    const HAS_MIN: bool = false;
    /// The values `8g ± 1` lie in -9..=9.
    const OFFSET: i32 = 16;
    const D_SCALE: f32 = 0.125;
    #[inline(always)]
    fn f16_bits(sb: &[u8]) -> [u16; 2] {
        let d = Self::d_bits(Self::scale_words(sb));
        [d, d]
    }
    #[inline(always)]
    fn ints(sb: &[u8]) -> KInts {
        let words = Self::half_scales(Self::scale_words(sb));
        KInts {
            scales: core::array::from_fn(|k| (words[k / 8] >> (8 * (k % 8))) as u8 as i8),
            mins: [0; HALVES_PER_SUPER],
        }
    }
    fn quants(sb: &[u8], j: usize) -> [u8; QK] {
        let groups: [(u64, i32); 4] = core::array::from_fn(|l| {
            let nibble = (sb[Self::QH + 2 * j + l / 2] >> (4 * (l % 2))) as usize;
            let entry = IQ1S_GRID[sb[4 * j + l] as usize | (nibble & 7) << 8];
            (entry, if nibble & 8 != 0 { -1 } else { 1 })
        });
        core::array::from_fn(|v| {
            let (entry, shift) = groups[v / 8];
            let g = (entry >> (8 * (v % 8))) as u8 as i8 as i32;
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
        /// ggml's `dequantize_row_iq1_m`, written out, is what the k-quant form gives.
        #[test]
        fn k_quant_form_is_ggml_dequantization(sb in proptest::collection::vec(any::<u8>(), 56)) {
            let mut sb = sb;
            sb[55] &= 0xbf; // a finite d: its exponent's top bit is the last word's bit 14
            let mut y = [0f32; QK_K];
            dequantize_blocks::<BlockIQ1M>(&sb, &mut y);
            let sc: [u16; 4] = core::array::from_fn(|i| u16::from_le_bytes([sb[48 + 2 * i], sb[49 + 2 * i]]));
            let bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
            let d = f16::from_bits(bits).to_f32();
            for ib in 0..8 {
                let dl = [
                    d * (2 * ((sc[ib / 2] >> (6 * (ib % 2))) & 7) + 1) as f32,
                    d * (2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1) as f32,
                ];
                let (qs, qh) = (&sb[4 * ib..], &sb[32 + 2 * ib..]);
                let idx = [
                    qs[0] as usize | ((qh[0] as usize) << 8) & 0x700,
                    qs[1] as usize | ((qh[0] as usize) << 4) & 0x700,
                    qs[2] as usize | ((qh[1] as usize) << 8) & 0x700,
                    qs[3] as usize | ((qh[1] as usize) << 4) & 0x700,
                ];
                let delta = [qh[0] & 0x08, qh[0] & 0x80, qh[1] & 0x08, qh[1] & 0x80]
                    .map(|b| if b != 0 { -0.125 } else { 0.125 });
                for l in 0..4 {
                    let g = IQ1S_GRID[idx[l]].to_le_bytes();
                    for (k, g) in g.iter().enumerate() {
                        let want = dl[l / 2] * (*g as i8 as f32 + delta[l]);
                        prop_assert_eq!(y[32 * ib + 8 * l + k], want);
                    }
                }
            }
        }

        /// The word-wise scales and `d` are the field-by-field ones.
        #[test]
        fn scale_words_unpack_field_by_field(words in any::<u64>()) {
            let scales = BlockIQ1M::half_scales(words);
            for k in 0..16 {
                let s = (words >> (16 * (k / 4) + 3 * (k % 4))) & 7;
                prop_assert_eq!((scales[k / 8] >> (8 * (k % 8))) & 0xff, 2 * s + 1);
            }
            let d = BlockIQ1M::d_bits(words);
            for i in 0..4 {
                prop_assert_eq!((d >> (4 * i)) & 0xf, (words >> (16 * i + 12)) as u16 & 0xf);
            }
            let mut sb = [0u8; 56];
            sb[48..].copy_from_slice(&words.to_le_bytes());
            BlockIQ1M::set_d_bits(&mut sb, d.rotate_left(4));
            let moved = BlockIQ1M::scale_words(&sb);
            prop_assert_eq!(BlockIQ1M::d_bits(moved), d.rotate_left(4));
            prop_assert_eq!(BlockIQ1M::half_scales(moved), BlockIQ1M::half_scales(words));
        }
    }
}
