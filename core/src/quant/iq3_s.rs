//! IQ3_S: 256 values as `{ d: f16, qs: [u8; 64], qh: [u8; 8], signs: [u8; 32], scales: [u8; 4] }`
//! (110 bytes), in eight 32-value blocks of eight groups of four. A group's magnitudes are an
//! entry of a fixed grid of 512 (`IQ3S_GRID`: four odd values 1..=15 per entry, indexed by a byte
//! of `qs` and, as a ninth bit, bit `g` of the block's `qh` byte), each with a sign bit of
//! `signs`; block `j`'s scale is `d · (1 + 2·s)`, `s` nibble `j % 2` of `scales[j / 2]`. Read as
//! a k-quant: halves with scales `1 + 2s`, stored quants the signed values plus 16. IQ3_M files
//! are mostly IQ3_S.
use super::k_quants::{u16_at, KBlock, KInts, HALVES_PER_SUPER};
use super::QK;

/// IQ3_S, read in place.
pub struct BlockIQ3S;

impl BlockIQ3S {
    /// Byte offset of the grid indices' low eight bits (eight per block).
    pub const QS: usize = 2;
    /// Byte offset of their ninth bits (a byte per block).
    pub const QH: usize = 66;
    /// Byte offset of the sign bits (four bytes per block).
    pub const SIGNS: usize = 74;
    /// Byte offset of the scales (a nibble per block).
    pub const SCALES: usize = 106;

    /// Each block's scale factor `1 + 2s` (1..=31), block `j` in byte `j`: the four scale bytes'
    /// nibbles spread to one byte each with shifts and masks.
    #[inline(always)]
    pub fn scale_bytes(sb: &[u8]) -> u64 {
        let s = &sb[Self::SCALES..Self::SCALES + 4];
        let n = u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as u64;
        let n = (n | (n << 16)) & 0x0000_ffff_0000_ffff;
        let n = (n | (n << 8)) & 0x00ff_00ff_00ff_00ff;
        let n = (n | (n << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
        (n << 1) | 0x0101_0101_0101_0101
    }

    /// Group `g`'s (0..8) grid entry in block `j`: four magnitudes, one per byte.
    #[inline(always)]
    pub fn grid_entry(sb: &[u8], j: usize, g: usize) -> u32 {
        let high = ((sb[Self::QH + j] >> g) & 1) as usize;
        IQ3S_GRID[sb[Self::QS + 8 * j + g] as usize | (high << 8)]
    }

    /// Block `j`'s 32 sign bits, bit `v` for value `v` (set: negative).
    #[inline(always)]
    pub fn signs(sb: &[u8], j: usize) -> u32 {
        let s = &sb[Self::SIGNS + 4 * j..][..4];
        u32::from_le_bytes([s[0], s[1], s[2], s[3]])
    }
}

impl KBlock for BlockIQ3S {
    const BYTES: usize = 110;
    const HAS_MIN: bool = false;
    /// The signed values lie in -15..=15.
    const OFFSET: i32 = 16;
    const SHARED_HALVES: bool = true;
    #[inline(always)]
    fn f16_bits(sb: &[u8]) -> [u16; 2] {
        let d = u16_at(sb, 0);
        [d, d]
    }
    #[inline(always)]
    fn ints(sb: &[u8]) -> KInts {
        let scales = Self::scale_bytes(sb).to_le_bytes();
        KInts {
            scales: core::array::from_fn(|k| scales[k / 2] as i8),
            mins: [0; HALVES_PER_SUPER],
        }
    }
    fn quants(sb: &[u8], j: usize) -> [u8; QK] {
        let signs = Self::signs(sb, j);
        core::array::from_fn(|v| {
            let magnitude = (Self::grid_entry(sb, j, v / 4) >> (8 * (v % 4))) as u8 as i32;
            let value = if signs >> v & 1 == 1 {
                -magnitude
            } else {
                magnitude
            };
            (value + Self::OFFSET) as u8
        })
    }
}

/// ggml's `iq3s_grid`: entry `i` holds four magnitudes, byte `k` the `k`th.
pub static IQ3S_GRID: [u32; 512] = [
    0x0101_0101,
    0x0101_0103,
    0x0101_0105,
    0x0101_010b,
    0x0101_010f,
    0x0101_0301,
    0x0101_0303,
    0x0101_0305,
    0x0101_0309,
    0x0101_030d,
    0x0101_0501,
    0x0101_0503,
    0x0101_050b,
    0x0101_0707,
    0x0101_0901,
    0x0101_0905,
    0x0101_090b,
    0x0101_090f,
    0x0101_0b03,
    0x0101_0b07,
    0x0101_0d01,
    0x0101_0d05,
    0x0101_0f03,
    0x0101_0f09,
    0x0101_0f0f,
    0x0103_0101,
    0x0103_0103,
    0x0103_0105,
    0x0103_0109,
    0x0103_0301,
    0x0103_0303,
    0x0103_030b,
    0x0103_0501,
    0x0103_0507,
    0x0103_050f,
    0x0103_0703,
    0x0103_070b,
    0x0103_0909,
    0x0103_0d03,
    0x0103_0d0b,
    0x0103_0f05,
    0x0105_0101,
    0x0105_0103,
    0x0105_010b,
    0x0105_010f,
    0x0105_0301,
    0x0105_0307,
    0x0105_030d,
    0x0105_0503,
    0x0105_050b,
    0x0105_0701,
    0x0105_0709,
    0x0105_0905,
    0x0105_090b,
    0x0105_090f,
    0x0105_0b03,
    0x0105_0b07,
    0x0105_0f01,
    0x0105_0f07,
    0x0107_0107,
    0x0107_0303,
    0x0107_030b,
    0x0107_0501,
    0x0107_0505,
    0x0107_0703,
    0x0107_0707,
    0x0107_070d,
    0x0107_0909,
    0x0107_0b01,
    0x0107_0b05,
    0x0107_0d0f,
    0x0107_0f03,
    0x0107_0f0b,
    0x0109_0101,
    0x0109_0307,
    0x0109_030f,
    0x0109_0503,
    0x0109_0509,
    0x0109_0705,
    0x0109_0901,
    0x0109_0907,
    0x0109_0b03,
    0x0109_0f01,
    0x010b_0105,
    0x010b_0109,
    0x010b_0501,
    0x010b_0505,
    0x010b_050d,
    0x010b_0707,
    0x010b_0903,
    0x010b_090b,
    0x010b_090f,
    0x010b_0d0d,
    0x010b_0f07,
    0x010d_010d,
    0x010d_0303,
    0x010d_0307,
    0x010d_0703,
    0x010d_0b05,
    0x010d_0f03,
    0x010f_0101,
    0x010f_0105,
    0x010f_0109,
    0x010f_0501,
    0x010f_0505,
    0x010f_050d,
    0x010f_0707,
    0x010f_0b01,
    0x010f_0b09,
    0x0301_0101,
    0x0301_0103,
    0x0301_0105,
    0x0301_0109,
    0x0301_0301,
    0x0301_0303,
    0x0301_0307,
    0x0301_030b,
    0x0301_030f,
    0x0301_0501,
    0x0301_0505,
    0x0301_0703,
    0x0301_0709,
    0x0301_070d,
    0x0301_0b09,
    0x0301_0b0d,
    0x0301_0d03,
    0x0301_0f05,
    0x0303_0101,
    0x0303_0103,
    0x0303_0107,
    0x0303_010d,
    0x0303_0301,
    0x0303_0309,
    0x0303_0503,
    0x0303_0701,
    0x0303_0707,
    0x0303_0903,
    0x0303_0b01,
    0x0303_0b05,
    0x0303_0f01,
    0x0303_0f0d,
    0x0305_0101,
    0x0305_0305,
    0x0305_030b,
    0x0305_030f,
    0x0305_0501,
    0x0305_0509,
    0x0305_0705,
    0x0305_0901,
    0x0305_0907,
    0x0305_0b0b,
    0x0305_0d01,
    0x0305_0f05,
    0x0307_0103,
    0x0307_0109,
    0x0307_010f,
    0x0307_0301,
    0x0307_0307,
    0x0307_0503,
    0x0307_050f,
    0x0307_0701,
    0x0307_0709,
    0x0307_0903,
    0x0307_0d05,
    0x0307_0f01,
    0x0309_0107,
    0x0309_010b,
    0x0309_0305,
    0x0309_0309,
    0x0309_0703,
    0x0309_0707,
    0x0309_0905,
    0x0309_090d,
    0x0309_0b01,
    0x0309_0b09,
    0x030b_0103,
    0x030b_0301,
    0x030b_0307,
    0x030b_0503,
    0x030b_0701,
    0x030b_0705,
    0x030b_0b03,
    0x030d_0501,
    0x030d_0509,
    0x030d_050f,
    0x030d_0909,
    0x030d_090d,
    0x030f_0103,
    0x030f_0107,
    0x030f_0301,
    0x030f_0305,
    0x030f_0503,
    0x030f_070b,
    0x030f_0903,
    0x030f_0d05,
    0x030f_0f01,
    0x0501_0101,
    0x0501_0103,
    0x0501_0107,
    0x0501_010b,
    0x0501_010f,
    0x0501_0301,
    0x0501_0305,
    0x0501_0309,
    0x0501_030d,
    0x0501_0503,
    0x0501_0507,
    0x0501_050f,
    0x0501_0701,
    0x0501_0705,
    0x0501_0903,
    0x0501_0907,
    0x0501_090b,
    0x0501_0b01,
    0x0501_0b05,
    0x0501_0d0f,
    0x0501_0f01,
    0x0501_0f07,
    0x0501_0f0b,
    0x0503_0101,
    0x0503_0105,
    0x0503_0301,
    0x0503_0307,
    0x0503_030f,
    0x0503_0505,
    0x0503_050b,
    0x0503_0703,
    0x0503_0709,
    0x0503_0905,
    0x0503_0b03,
    0x0505_0103,
    0x0505_0109,
    0x0505_010f,
    0x0505_0503,
    0x0505_0507,
    0x0505_0701,
    0x0505_070f,
    0x0505_0903,
    0x0505_0b07,
    0x0505_0b0f,
    0x0505_0f03,
    0x0505_0f09,
    0x0507_0101,
    0x0507_0105,
    0x0507_010b,
    0x0507_0303,
    0x0507_0505,
    0x0507_0509,
    0x0507_0703,
    0x0507_0707,
    0x0507_0905,
    0x0507_0b01,
    0x0507_0d0d,
    0x0509_0103,
    0x0509_010f,
    0x0509_0501,
    0x0509_0507,
    0x0509_0705,
    0x0509_070b,
    0x0509_0903,
    0x0509_0f05,
    0x0509_0f0b,
    0x050b_0109,
    0x050b_0303,
    0x050b_0505,
    0x050b_070f,
    0x050b_0901,
    0x050b_0b07,
    0x050b_0f01,
    0x050d_0101,
    0x050d_0105,
    0x050d_010f,
    0x050d_0503,
    0x050d_0b0b,
    0x050d_0d03,
    0x050f_010b,
    0x050f_0303,
    0x050f_050d,
    0x050f_0701,
    0x050f_0907,
    0x050f_0b01,
    0x0701_0105,
    0x0701_0303,
    0x0701_0307,
    0x0701_030b,
    0x0701_030f,
    0x0701_0505,
    0x0701_0703,
    0x0701_0707,
    0x0701_070b,
    0x0701_0905,
    0x0701_0909,
    0x0701_090f,
    0x0701_0b03,
    0x0701_0d07,
    0x0701_0f03,
    0x0703_0103,
    0x0703_0107,
    0x0703_010b,
    0x0703_0309,
    0x0703_0503,
    0x0703_0507,
    0x0703_0901,
    0x0703_0d01,
    0x0703_0f05,
    0x0703_0f0d,
    0x0705_0101,
    0x0705_0305,
    0x0705_0501,
    0x0705_0705,
    0x0705_0709,
    0x0705_0b01,
    0x0707_0103,
    0x0707_0301,
    0x0707_0309,
    0x0707_0503,
    0x0707_0507,
    0x0707_050f,
    0x0707_0701,
    0x0707_0903,
    0x0707_0907,
    0x0707_090f,
    0x0707_0b0b,
    0x0707_0f07,
    0x0709_0107,
    0x0709_0303,
    0x0709_030d,
    0x0709_0505,
    0x0709_0703,
    0x0709_0b05,
    0x0709_0d01,
    0x0709_0d09,
    0x070b_0103,
    0x070b_0301,
    0x070b_0305,
    0x070b_050b,
    0x070b_0705,
    0x070b_0909,
    0x070b_0b0d,
    0x070b_0f07,
    0x070d_030d,
    0x070d_0903,
    0x070f_0103,
    0x070f_0107,
    0x070f_0501,
    0x070f_0505,
    0x070f_070b,
    0x0901_0101,
    0x0901_0109,
    0x0901_0305,
    0x0901_0501,
    0x0901_0509,
    0x0901_050f,
    0x0901_0705,
    0x0901_0903,
    0x0901_0b01,
    0x0901_0f01,
    0x0903_0105,
    0x0903_010f,
    0x0903_0303,
    0x0903_0307,
    0x0903_0505,
    0x0903_0701,
    0x0903_070b,
    0x0903_0907,
    0x0903_0b03,
    0x0903_0b0b,
    0x0905_0103,
    0x0905_0107,
    0x0905_0301,
    0x0905_030b,
    0x0905_0503,
    0x0905_0707,
    0x0905_0901,
    0x0905_0b0f,
    0x0905_0d05,
    0x0905_0f01,
    0x0907_0109,
    0x0907_0303,
    0x0907_0307,
    0x0907_0501,
    0x0907_0505,
    0x0907_0703,
    0x0907_070b,
    0x0909_0101,
    0x0909_0105,
    0x0909_0509,
    0x0909_070f,
    0x0909_0901,
    0x0909_0f03,
    0x090b_010b,
    0x090b_010f,
    0x090b_0503,
    0x090b_0d05,
    0x090d_0307,
    0x090d_0709,
    0x090d_0d01,
    0x090f_0301,
    0x090f_030b,
    0x090f_0701,
    0x090f_0907,
    0x090f_0b03,
    0x0b01_0105,
    0x0b01_0301,
    0x0b01_0309,
    0x0b01_0505,
    0x0b01_0901,
    0x0b01_0909,
    0x0b01_090f,
    0x0b01_0b05,
    0x0b01_0d0d,
    0x0b01_0f09,
    0x0b03_0103,
    0x0b03_0107,
    0x0b03_010b,
    0x0b03_0305,
    0x0b03_0503,
    0x0b03_0705,
    0x0b03_0f05,
    0x0b05_0101,
    0x0b05_0303,
    0x0b05_0507,
    0x0b05_0701,
    0x0b05_070d,
    0x0b05_0b07,
    0x0b07_0105,
    0x0b07_010f,
    0x0b07_0301,
    0x0b07_050f,
    0x0b07_0909,
    0x0b07_0b03,
    0x0b07_0d0b,
    0x0b07_0f07,
    0x0b09_0103,
    0x0b09_0109,
    0x0b09_0501,
    0x0b09_0705,
    0x0b09_090d,
    0x0b0b_0305,
    0x0b0b_050d,
    0x0b0b_0b03,
    0x0b0b_0b07,
    0x0b0d_0905,
    0x0b0f_0105,
    0x0b0f_0109,
    0x0b0f_0505,
    0x0d01_0303,
    0x0d01_0307,
    0x0d01_030b,
    0x0d01_0703,
    0x0d01_0707,
    0x0d01_0d01,
    0x0d03_0101,
    0x0d03_0501,
    0x0d03_050f,
    0x0d03_0d09,
    0x0d05_0305,
    0x0d05_0709,
    0x0d05_0905,
    0x0d05_0b0b,
    0x0d05_0d05,
    0x0d05_0f01,
    0x0d07_0101,
    0x0d07_0309,
    0x0d07_0503,
    0x0d07_0901,
    0x0d09_050b,
    0x0d09_0907,
    0x0d09_0d05,
    0x0d0b_0101,
    0x0d0b_0107,
    0x0d0b_0709,
    0x0d0b_0d01,
    0x0d0d_010b,
    0x0d0d_0901,
    0x0d0f_0303,
    0x0d0f_0307,
    0x0f01_0101,
    0x0f01_0109,
    0x0f01_010f,
    0x0f01_0501,
    0x0f01_0505,
    0x0f01_070d,
    0x0f01_0901,
    0x0f01_0b09,
    0x0f01_0d05,
    0x0f03_0105,
    0x0f03_0303,
    0x0f03_0509,
    0x0f03_0907,
    0x0f03_090b,
    0x0f05_0103,
    0x0f05_0109,
    0x0f05_0301,
    0x0f05_030d,
    0x0f05_0503,
    0x0f05_0701,
    0x0f05_0b03,
    0x0f07_0105,
    0x0f07_0705,
    0x0f07_070b,
    0x0f07_0b07,
    0x0f09_0103,
    0x0f09_010b,
    0x0f09_0307,
    0x0f09_0501,
    0x0f09_0b01,
    0x0f0b_0505,
    0x0f0b_0905,
    0x0f0d_0105,
    0x0f0d_0703,
    0x0f0f_0101,
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::k_quants::{dequantize_blocks, QK_K};
    use half::f16;
    use proptest::prelude::*;

    /// ggml's `kmask_iq2xs`.
    const KMASK: [u8; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

    proptest! {
        /// ggml's `dequantize_row_iq3_s`, written out, is what the k-quant form gives.
        #[test]
        fn k_quant_form_is_ggml_dequantization(sb in proptest::collection::vec(any::<u8>(), 110)) {
            let mut sb = sb;
            sb[1] &= 0x3b; // a finite d
            let mut y = [0f32; QK_K];
            dequantize_blocks::<BlockIQ3S>(&sb, &mut y);
            let d = f16::from_le_bytes([sb[0], sb[1]]).to_f32();
            let mut at = 0;
            for ib32 in (0..8).step_by(2) {
                let scale = sb[BlockIQ3S::SCALES + ib32 / 2];
                for (half, sc) in [(0, scale & 0xf), (1, scale >> 4)] {
                    let db = d * (1 + 2 * sc as i32) as f32;
                    let j = ib32 + half;
                    let (qs, qh) = (&sb[BlockIQ3S::QS + 8 * j..], sb[BlockIQ3S::QH + j]);
                    let signs = &sb[BlockIQ3S::SIGNS + 4 * j..];
                    for l in 0..4 {
                        let i1 = qs[2 * l] as usize | ((qh as usize) << (8 - 2 * l)) & 256;
                        let i2 = qs[2 * l + 1] as usize | ((qh as usize) << (7 - 2 * l)) & 256;
                        let (g1, g2) = (IQ3S_GRID[i1].to_le_bytes(), IQ3S_GRID[i2].to_le_bytes());
                        for j in 0..4 {
                            let s1 = if signs[l] & KMASK[j] != 0 { -1.0 } else { 1.0 };
                            let s2 = if signs[l] & KMASK[j + 4] != 0 { -1.0 } else { 1.0 };
                            prop_assert_eq!(y[at + j], db * g1[j] as f32 * s1);
                            prop_assert_eq!(y[at + j + 4], db * g2[j] as f32 * s2);
                        }
                        at += 8;
                    }
                }
            }
        }
    }
}
