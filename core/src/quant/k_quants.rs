//! ggml's k-quants: 256-value super-blocks, the formats of the popular Q4_K_M files, read in place.
//!
//! Each super-block is eight 32-value blocks, and each block reads as the kernels' common form
//! `value = d · q + m` (`KBlock::block`): Q4_K and Q5_K fold their 6-bit sub-block scale and
//! minimum into `d` and `m` (exact: an f16 times a 6-bit integer fits f32); Q3_K's and Q6_K's
//! 16-value sub-blocks give each half of a block its own scale (`HALF_SCALES`: `d` for values
//! 0..16, `m` for 16..32); Q2_K's 16-value sub-blocks carry a scale and a minimum each, so its
//! halves have their own scales and, with `HALF_MINS`, their own minimums too (`KBlock::mins`).
//! Dequantizing in that form gives ggml's `dequantize_row_q{2,3,4,5,6}_K` bit for bit.
use super::{f16_at, QK};

/// Values per super-block.
pub const QK_K: usize = 256;

/// Blocks of 32 values per super-block.
pub const BLOCKS_PER_SUPER: usize = QK_K / QK;

/// A k-quant format, read block by block.
pub trait KBlock {
    /// Bytes of one super-block.
    const BYTES: usize;
    /// Whether block `j` carries a minimum in `m` (Q4_K, Q5_K).
    const HAS_MIN: bool;
    /// Whether the halves of a block have their own scales, `d` and `m` (Q6_K).
    const HALF_SCALES: bool;
    /// Whether the halves of a block also have their own minimums, `mins` (Q2_K, with
    /// `HALF_SCALES`): a half's minimum multiplies the activations' sum over that half.
    const HALF_MINS: bool = false;
    /// Byte offset of the f16 that scales the half minimums (`HALF_MINS` only).
    const MIN_F16_AT: usize = 0;
    /// `(d, m)` of block `j` (0..8) of the super-block at the start of `sb`.
    fn scales(sb: &[u8], j: usize) -> (f32, f32);
    /// Byte offsets of the super-block's f16 scale and f16 minimum scale (Q3_K and Q6_K have one
    /// f16, given twice).
    const F16_AT: (usize, usize);
    /// The integer factors of all eight blocks' `scales`, what a kernel reads once per
    /// super-block: `d = f16(F16_AT.0) · ints.0[j]`, and `m = -f16(F16_AT.1) · ints.1[j]` with a
    /// minimum or `f16(F16_AT.1) · ints.1[j]` for the second half's scale. Every format's 6- or
    /// 8-bit factors fit an `i8`, so kernels widen them eight at a time.
    fn unit_ints(sb: &[u8]) -> ([i8; BLOCKS_PER_SUPER], [i8; BLOCKS_PER_SUPER]);
    /// `scales` of all eight blocks at once, from `unit_ints` and the f16s at `F16_AT`.
    fn unit_scales(sb: &[u8]) -> ([f32; BLOCKS_PER_SUPER], [f32; BLOCKS_PER_SUPER]) {
        let (d_at, dmin_at) = Self::F16_AT;
        let (d, dmin) = (f16_at(&sb[d_at..]), f16_at(&sb[dmin_at..]));
        let (s, m) = Self::unit_ints(sb);
        (
            core::array::from_fn(|j| d * s[j] as f32),
            core::array::from_fn(|j| {
                if Self::HAS_MIN {
                    -(dmin * m[j] as f32)
                } else {
                    dmin * m[j] as f32
                }
            }),
        )
    }
    /// `(d, m, q)` of block `j`.
    fn block(sb: &[u8], j: usize) -> (f32, f32, [i32; QK]);
    /// The minimums of block `j`'s two halves (`HALF_MINS`; zeros otherwise).
    fn mins(_sb: &[u8], _j: usize) -> (f32, f32) {
        (0.0, 0.0)
    }
    /// The integer factors of all eight blocks' `mins`, low halves and high halves:
    /// `mins(j) = (-f16(MIN_F16_AT) · ints.0[j], -f16(MIN_F16_AT) · ints.1[j])`.
    fn unit_min_ints(_sb: &[u8]) -> ([i8; BLOCKS_PER_SUPER], [i8; BLOCKS_PER_SUPER]) {
        ([0; BLOCKS_PER_SUPER], [0; BLOCKS_PER_SUPER])
    }
    /// `mins` of all eight blocks at once, from `unit_min_ints` (`HALF_MINS` only).
    fn unit_mins(sb: &[u8]) -> ([f32; BLOCKS_PER_SUPER], [f32; BLOCKS_PER_SUPER]) {
        debug_assert!(Self::HALF_MINS);
        let dmin = f16_at(&sb[Self::MIN_F16_AT..]);
        let (lo, hi) = Self::unit_min_ints(sb);
        (
            core::array::from_fn(|j| -(dmin * lo[j] as f32)),
            core::array::from_fn(|j| -(dmin * hi[j] as f32)),
        )
    }
}

/// Q2_K: `{ scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16 }`; each scale byte is a 16-value
/// sub-block's 4-bit scale (low nibble) and 4-bit minimum (high nibble).
pub struct BlockQ2K;

/// Q3_K: `{ hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16 }`.
pub struct BlockQ3K;
/// Q4_K: `{ d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128] }`.
pub struct BlockQ4K;
/// Q5_K: `{ d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128] }`.
pub struct BlockQ5K;
/// Q6_K: `{ ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16 }`.
pub struct BlockQ6K;

/// The 6-bit scale and minimum of block `j` from the 12 packed scale bytes (ggml's
/// `get_scale_min_k4`).
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K's and Q5_K's `(d · scale, -dmin · min)` for block `j`.
pub fn k4_scales(sb: &[u8], j: usize) -> (f32, f32) {
    let (sc, m) = scale_min_k4(j, &sb[4..16]);
    (f16_at(sb) * sc as f32, -(f16_at(&sb[2..]) * m as f32))
}

/// Q4_K's and Q5_K's eight 6-bit scales and minimums: the twelve packed bytes unpacked as words
/// at once (ggml's `kmask` shuffle).
#[inline(always)]
fn k4_unit_ints(sb: &[u8]) -> ([i8; BLOCKS_PER_SUPER], [i8; BLOCKS_PER_SUPER]) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([sb[4 + i], sb[5 + i], sb[6 + i], sb[7 + i]]);
    let (u0, u1, u2) = (word(0), word(4), word(8));
    // Blocks 0..4 keep their six bits in place; blocks 4..8 take four from the last word and
    // their top two from the first two words' top bits.
    let scales = [u0 & LOW6, (u2 & LOW4) | (((u0 >> 6) & LOW2) << 4)];
    let mins = [u1 & LOW6, ((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4)];
    let bytes = |w: [u32; 2]| {
        (w[0] as u64 | (w[1] as u64) << 32)
            .to_le_bytes()
            .map(|b| b as i8)
    };
    (bytes(scales), bytes(mins))
}

/// Q3_K's 6-bit scale of 16-value sub-block `s` (0..16), less 32: four low bits from the first
/// eight bytes, two high bits from the last four.
#[inline(always)]
fn q3_scale(scales: &[u8], s: usize) -> i8 {
    let low = (scales[s % 8] >> (4 * (s / 8))) & 0x0f;
    let high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
    (low | (high << 4)) as i8 - 32
}

impl KBlock for BlockQ2K {
    const BYTES: usize = 84;
    const HAS_MIN: bool = false;
    const HALF_SCALES: bool = true;
    const HALF_MINS: bool = true;
    const F16_AT: (usize, usize) = (80, 80);
    const MIN_F16_AT: usize = 82;
    /// Block `j`'s halves are sub-blocks `2j` and `2j + 1`.
    fn scales(sb: &[u8], j: usize) -> (f32, f32) {
        let d = f16_at(&sb[80..]);
        (
            d * (sb[2 * j] & 0x0f) as f32,
            d * (sb[2 * j + 1] & 0x0f) as f32,
        )
    }
    #[inline(always)]
    fn unit_ints(sb: &[u8]) -> ([i8; BLOCKS_PER_SUPER], [i8; BLOCKS_PER_SUPER]) {
        (
            core::array::from_fn(|j| (sb[2 * j] & 0x0f) as i8),
            core::array::from_fn(|j| (sb[2 * j + 1] & 0x0f) as i8),
        )
    }
    /// Block `j` takes bits `2c, 2c + 1` (c = j % 4) of `qs[32(j / 4)..]` (ggml's
    /// `dequantize_row_q2_K`).
    fn block(sb: &[u8], j: usize) -> (f32, f32, [i32; QK]) {
        let qs = &sb[16 + 32 * (j / 4)..][..32];
        let shift = 2 * (j % 4);
        let (d_lo, d_hi) = Self::scales(sb, j);
        (
            d_lo,
            d_hi,
            core::array::from_fn(|l| ((qs[l] >> shift) & 3) as i32),
        )
    }
    fn mins(sb: &[u8], j: usize) -> (f32, f32) {
        let dmin = f16_at(&sb[82..]);
        (
            -(dmin * (sb[2 * j] >> 4) as f32),
            -(dmin * (sb[2 * j + 1] >> 4) as f32),
        )
    }
    #[inline(always)]
    fn unit_min_ints(sb: &[u8]) -> ([i8; BLOCKS_PER_SUPER], [i8; BLOCKS_PER_SUPER]) {
        (
            core::array::from_fn(|j| (sb[2 * j] >> 4) as i8),
            core::array::from_fn(|j| (sb[2 * j + 1] >> 4) as i8),
        )
    }
}

impl KBlock for BlockQ3K {
    const BYTES: usize = 110;
    const HAS_MIN: bool = false;
    const HALF_SCALES: bool = true;
    const F16_AT: (usize, usize) = (108, 108);
    /// Block `j`'s halves are sub-blocks `2j` and `2j + 1`.
    fn scales(sb: &[u8], j: usize) -> (f32, f32) {
        let d = f16_at(&sb[108..]);
        let scales = &sb[96..108];
        let scale = |s| d * q3_scale(scales, s) as f32;
        (scale(2 * j), scale(2 * j + 1))
    }
    #[inline(always)]
    fn unit_ints(sb: &[u8]) -> ([i8; BLOCKS_PER_SUPER], [i8; BLOCKS_PER_SUPER]) {
        let scales = &sb[96..108];
        (
            core::array::from_fn(|j| q3_scale(scales, 2 * j)),
            core::array::from_fn(|j| q3_scale(scales, 2 * j + 1)),
        )
    }
    /// Block `j` takes bits `2c, 2c + 1` (c = j % 4) of `qs[32(j / 4)..]` and bit `j` of `hmask`;
    /// a clear `hmask` bit subtracts 4 (ggml's `dequantize_row_q3_K`).
    fn block(sb: &[u8], j: usize) -> (f32, f32, [i32; QK]) {
        let (n, c) = (j / 4, j % 4);
        let hmask = &sb[..32];
        let qs = &sb[32 + 32 * n..][..32];
        let (d_lo, d_hi) = Self::scales(sb, j);
        let q = core::array::from_fn(|l| {
            let low = ((qs[l] >> (2 * c)) & 3) as i32;
            let high = ((hmask[l] >> j) & 1) as i32;
            low - 4 + 4 * high
        });
        (d_lo, d_hi, q)
    }
}

impl KBlock for BlockQ4K {
    const BYTES: usize = 144;
    const HAS_MIN: bool = true;
    const HALF_SCALES: bool = false;
    fn scales(sb: &[u8], j: usize) -> (f32, f32) {
        k4_scales(sb, j)
    }
    const F16_AT: (usize, usize) = (0, 2);
    #[inline(always)]
    fn unit_ints(sb: &[u8]) -> ([i8; BLOCKS_PER_SUPER], [i8; BLOCKS_PER_SUPER]) {
        k4_unit_ints(sb)
    }
    fn block(sb: &[u8], j: usize) -> (f32, f32, [i32; QK]) {
        let (d, m) = k4_scales(sb, j);
        let qs = &sb[16 + 32 * (j / 2)..][..32];
        let shift = 4 * (j % 2);
        (
            d,
            m,
            core::array::from_fn(|l| ((qs[l] >> shift) & 0x0f) as i32),
        )
    }
}

impl KBlock for BlockQ5K {
    const BYTES: usize = 176;
    const HAS_MIN: bool = true;
    const HALF_SCALES: bool = false;
    fn scales(sb: &[u8], j: usize) -> (f32, f32) {
        k4_scales(sb, j)
    }
    const F16_AT: (usize, usize) = (0, 2);
    #[inline(always)]
    fn unit_ints(sb: &[u8]) -> ([i8; BLOCKS_PER_SUPER], [i8; BLOCKS_PER_SUPER]) {
        k4_unit_ints(sb)
    }
    fn block(sb: &[u8], j: usize) -> (f32, f32, [i32; QK]) {
        let (d, m) = k4_scales(sb, j);
        let qh = &sb[16..48];
        let qs = &sb[48 + 32 * (j / 2)..][..32];
        let shift = 4 * (j % 2);
        let q = core::array::from_fn(|l| {
            (((qs[l] >> shift) & 0x0f) | (((qh[l] >> j) & 1) << 4)) as i32
        });
        (d, m, q)
    }
}

impl KBlock for BlockQ6K {
    const BYTES: usize = 210;
    const HAS_MIN: bool = false;
    const HALF_SCALES: bool = true;
    /// `d · scale` of the two 16-value sub-blocks that make block `j`.
    fn scales(sb: &[u8], j: usize) -> (f32, f32) {
        // Block j's sub-blocks are 2j and 2j + 1 (= 8(j / 4) + 2(j % 4) + 0, 1).
        let sc = &sb[192 + 2 * j..][..2];
        let d = f16_at(&sb[208..]);
        (d * (sc[0] as i8) as f32, d * (sc[1] as i8) as f32)
    }
    const F16_AT: (usize, usize) = (208, 208);
    #[inline(always)]
    fn unit_ints(sb: &[u8]) -> ([i8; BLOCKS_PER_SUPER], [i8; BLOCKS_PER_SUPER]) {
        let sc = &sb[192..208];
        (
            core::array::from_fn(|j| sc[2 * j] as i8),
            core::array::from_fn(|j| sc[2 * j + 1] as i8),
        )
    }
    /// Block `j` is quarter `c = j % 4` of half `n = j / 4`: low nibbles of `ql[32c..]` for
    /// c < 2, high nibbles of `ql[32(c - 2)..]` after, with bits `2c, 2c + 1` of `qh` on top.
    fn block(sb: &[u8], j: usize) -> (f32, f32, [i32; QK]) {
        let (n, c) = (j / 4, j % 4);
        let ql = &sb[64 * n + 32 * (c % 2)..][..32];
        let qh = &sb[128 + 32 * n..][..32];
        let (d_lo, d_hi) = Self::scales(sb, j);
        let shift = 4 * (c / 2);
        let q = core::array::from_fn(|l| {
            let low = (ql[l] >> shift) & 0x0f;
            let high = (qh[l] >> (2 * c)) & 3;
            (low | (high << 4)) as i32 - 32
        });
        (d_lo, d_hi, q)
    }
}

/// Dequantizes whole super-blocks of `bytes` into `out` (as many as both hold).
pub fn dequantize_blocks<K: KBlock>(bytes: &[u8], out: &mut [f32]) {
    for (sb, y) in bytes.chunks_exact(K::BYTES).zip(out.chunks_exact_mut(QK_K)) {
        for (j, y) in y.chunks_exact_mut(QK).enumerate() {
            let (d, m, q) = K::block(sb, j);
            let (min_lo, min_hi) = K::mins(sb, j);
            for (l, (y, q)) in y.iter_mut().zip(q).enumerate() {
                let lo = l < QK / 2;
                *y = if K::HALF_MINS {
                    (if lo { d } else { m }) * q as f32 + if lo { min_lo } else { min_hi }
                } else if K::HALF_SCALES {
                    (if lo { d } else { m }) * q as f32
                } else {
                    d * q as f32 + m
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn unit_scales_agree<K: KBlock>(sb: &[u8]) -> Result<(), TestCaseError> {
        let (d, m) = K::unit_scales(sb);
        for j in 0..BLOCKS_PER_SUPER {
            let (dj, mj) = K::scales(sb, j);
            // Bits, except that a NaN's sign and payload are not specified (Miri varies them, even
            // `f32::NAN`'s, which is `0.0 / 0.0`): every NaN reads as one fixed pattern.
            let bits = |v: f32| if v.is_nan() { 0x7fc0_0000 } else { v.to_bits() };
            prop_assert_eq!((bits(d[j]), bits(m[j])), (bits(dj), bits(mj)));
            if K::HALF_MINS {
                let (min_lo, min_hi) = K::unit_mins(sb);
                let (lo, hi) = K::mins(sb, j);
                prop_assert_eq!((bits(min_lo[j]), bits(min_hi[j])), (bits(lo), bits(hi)));
            }
        }
        Ok(())
    }

    proptest! {
        /// The once-per-super-block scales are the per-block ones, bit for bit.
        #[test]
        fn unit_scales_are_the_block_scales(sb in proptest::collection::vec(any::<u8>(), 210)) {
            unit_scales_agree::<BlockQ2K>(&sb)?;
            unit_scales_agree::<BlockQ3K>(&sb)?;
            unit_scales_agree::<BlockQ4K>(&sb)?;
            unit_scales_agree::<BlockQ5K>(&sb)?;
            unit_scales_agree::<BlockQ6K>(&sb)?;
        }
    }
}
