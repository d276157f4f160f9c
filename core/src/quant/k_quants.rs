//! ggml's k-quants: 256-value super-blocks, the formats of the popular Q4_K_M files, read in place.
//!
//! A super-block is eight 32-value blocks, each of two 16-value halves, and every format reads as
//! one integer form: a half's values are `(d · scale) · (stored − OFFSET) − dmin · min`, with the
//! super-block's f16 `d` and `dmin` and the half's integer `scale` and `min` (`KBlock::ints`).
//! Q4_K and Q5_K give a block's two halves the same 6-bit scale and minimum; Q3_K's and Q6_K's
//! halves have their own scales and no minimums; Q2_K's halves have their own 4-bit scales and
//! minimums. Dequantizing in that form gives ggml's `dequantize_row_q{2,3,4,5,6}_K` bit for bit;
//! the kernels take the same integers against Q8K activations (see `q8k`), whose sums over 16
//! values are what a half's minimum and offset multiply.
use super::QK;

/// Values per super-block.
pub const QK_K: usize = 256;

/// Blocks of 32 values per super-block.
pub const BLOCKS_PER_SUPER: usize = QK_K / QK;

/// Halves (16 values) per super-block.
pub const HALVES_PER_SUPER: usize = 2 * BLOCKS_PER_SUPER;

/// A super-block's integer factors, what a kernel reads once per super-block, in the order of
/// the values: entry `k` is half `k` (values `16k .. 16k + 16`; block `k / 2`). All fit an `i8`
/// (4- to 8-bit, signed for Q3_K and Q6_K), so kernels widen them sixteen at a time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KInts {
    /// Each half's scale.
    pub scales: [i8; HALVES_PER_SUPER],
    /// Each half's minimum (zeros for formats without minimums).
    pub mins: [i8; HALVES_PER_SUPER],
}

/// Every half's scale 1 and no minimums: the ternary formats, whose one scale is `d`.
pub const UNIT_INTS: KInts = KInts {
    scales: [1; HALVES_PER_SUPER],
    mins: [0; HALVES_PER_SUPER],
};

/// A k-quant format, read super-block by super-block.
pub trait KBlock {
    /// Bytes of one super-block.
    const BYTES: usize;
    /// Whether the halves carry minimums (Q2_K, Q4_K, Q5_K).
    const HAS_MIN: bool;
    /// What each stored quant holds above the signed value it stands for (Q3_K: 4, Q6_K: 32):
    /// stored quants are unsigned, as `vpmaddubsw` wants them.
    const OFFSET: i32 = 0;
    /// Whether stored quants reach above 127 (IQ4_XS: its grid's signed values plus 128): SIMD
    /// kernels whose byte products take them as signed (`sdot`) or could saturate on them
    /// (`vpmaddubsw`) multiply the signed values (stored less 128, within ±127) instead, and
    /// add no offset term.
    const WIDE: bool = false;
    /// The largest quant the stored bits can give, whatever they are (Q2_K: 3 ... Q6_K: 63;
    /// 255 where not stated): a kernel may add as many `vpmaddubsw` pair sums in 16 bits as
    /// this bound allows without overflow.
    const MAX_QUANT: u8 = u8::MAX;
    /// Whether a block's two halves share their scale and minimum (Q4_K, Q5_K): a kernel may
    /// then scale a whole block's sum at once.
    const SHARED_HALVES: bool = false;
    /// What the stored `d` is multiplied by, a power of two (so exactly): ggml scales IQ2_XXS's
    /// blocks by `d·(0.5 + s)·0.25`, which is `(d/8)·(1 + 2s)` with an integer scale.
    const D_SCALE: f32 = 1.0;
    /// The bits of the super-block's f16 scale `d` and f16 minimum scale `dmin` (formats
    /// without minimums give `d`'s twice).
    fn f16_bits(sb: &[u8]) -> [u16; 2];
    /// The super-block's `d` (times `D_SCALE`) and `dmin`.
    #[inline(always)]
    fn d_dmin(sb: &[u8]) -> (f32, f32) {
        let [d, dmin] = Self::f16_bits(sb).map(|b| half::f16::from_bits(b).to_f32());
        let d = if Self::D_SCALE == 1.0 {
            d
        } else {
            d * Self::D_SCALE
        };
        (d, dmin)
    }
    /// The integer scales and minimums of the super-block at the start of `sb`.
    fn ints(sb: &[u8]) -> KInts;
    /// Block `j`'s (0..8) stored quants, values in order: `OFFSET` above the signed quants.
    fn quants(sb: &[u8], j: usize) -> [u8; QK];
}

/// Q2_K: `{ scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16 }`; each scale byte is a 16-value
/// half's 4-bit scale (low nibble) and 4-bit minimum (high nibble).
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

/// Q4_K's and Q5_K's eight 6-bit scales and minimums (`scale_min_k4` of every block), one byte
/// per block: the twelve packed bytes unpacked as words at once (ggml's `kmask` shuffle). Both
/// halves of a block share them.
#[inline(always)]
pub fn k4_scales_mins(sb: &[u8]) -> ([i8; BLOCKS_PER_SUPER], [i8; BLOCKS_PER_SUPER]) {
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

/// `k4_scales_mins` per half.
#[inline(always)]
fn k4_ints(sb: &[u8]) -> KInts {
    let (scales, mins) = k4_scales_mins(sb);
    KInts {
        scales: core::array::from_fn(|k| scales[k / 2]),
        mins: core::array::from_fn(|k| mins[k / 2]),
    }
}

/// Q3_K's sixteen 6-bit scales plus 32, half `k` in byte `k`, from the twelve packed bytes at
/// 96: half `k`'s four low bits are nibble `k / 8` of byte `k % 8`, its two high bits bits
/// `2(k / 4)` of byte `8 + k % 4`; as words at once (ggml's `kmask` shuffle).
#[inline(always)]
pub fn q3_scale_words(sb: &[u8]) -> [u32; 4] {
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([sb[96 + i], sb[97 + i], sb[98 + i], sb[99 + i]]);
    let (a0, a1, a2) = (word(0), word(4), word(8));
    [
        (a0 & LOW4) | ((a2 & LOW2) << 4),
        (a1 & LOW4) | (((a2 >> 2) & LOW2) << 4),
        ((a0 >> 4) & LOW4) | (((a2 >> 4) & LOW2) << 4),
        ((a1 >> 4) & LOW4) | (((a2 >> 6) & LOW2) << 4),
    ]
}

/// The little-endian `u16` at byte `at`.
#[inline(always)]
pub fn u16_at(sb: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([sb[at], sb[at + 1]])
}

/// `(bytes[l] >> shift) & mask` of 32 bytes.
#[inline(always)]
fn bits(bytes: &[u8], shift: usize, mask: u8) -> [u8; QK] {
    core::array::from_fn(|l| (bytes[l] >> shift) & mask)
}

impl KBlock for BlockQ2K {
    const BYTES: usize = 84;
    const MAX_QUANT: u8 = 3;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn f16_bits(sb: &[u8]) -> [u16; 2] {
        [u16_at(sb, 80), u16_at(sb, 82)]
    }
    #[inline(always)]
    fn ints(sb: &[u8]) -> KInts {
        KInts {
            scales: core::array::from_fn(|k| (sb[k] & 0x0f) as i8),
            mins: core::array::from_fn(|k| (sb[k] >> 4) as i8),
        }
    }
    /// Block `j` takes bits `2c, 2c + 1` (c = j % 4) of `qs[32(j / 4)..]` (ggml's
    /// `dequantize_row_q2_K`).
    fn quants(sb: &[u8], j: usize) -> [u8; QK] {
        bits(&sb[16 + 32 * (j / 4)..], 2 * (j % 4), 3)
    }
}

impl KBlock for BlockQ3K {
    const BYTES: usize = 110;
    const MAX_QUANT: u8 = 7;
    const HAS_MIN: bool = false;
    const OFFSET: i32 = 4;
    #[inline(always)]
    fn f16_bits(sb: &[u8]) -> [u16; 2] {
        let d = u16_at(sb, 108);
        [d, d]
    }
    #[inline(always)]
    fn ints(sb: &[u8]) -> KInts {
        let words = q3_scale_words(sb);
        KInts {
            scales: core::array::from_fn(|k| (words[k / 4] >> (8 * (k % 4))) as u8 as i8 - 32),
            mins: [0; HALVES_PER_SUPER],
        }
    }
    /// Block `j` takes bits `2c, 2c + 1` (c = j % 4) of `qs[32(j / 4)..]` and bit `j` of `hmask`;
    /// a clear `hmask` bit means 4 less (ggml's `dequantize_row_q3_K`), so the stored value is
    /// the signed one plus 4.
    fn quants(sb: &[u8], j: usize) -> [u8; QK] {
        let low = bits(&sb[32 + 32 * (j / 4)..], 2 * (j % 4), 3);
        let high = bits(&sb[..32], j, 1);
        core::array::from_fn(|l| low[l] | (high[l] << 2))
    }
}

impl KBlock for BlockQ4K {
    const BYTES: usize = 144;
    const MAX_QUANT: u8 = 15;
    const HAS_MIN: bool = true;
    const SHARED_HALVES: bool = true;
    #[inline(always)]
    fn f16_bits(sb: &[u8]) -> [u16; 2] {
        [u16_at(sb, 0), u16_at(sb, 2)]
    }
    #[inline(always)]
    fn ints(sb: &[u8]) -> KInts {
        k4_ints(sb)
    }
    fn quants(sb: &[u8], j: usize) -> [u8; QK] {
        bits(&sb[16 + 32 * (j / 2)..], 4 * (j % 2), 0x0f)
    }
}

impl KBlock for BlockQ5K {
    const BYTES: usize = 176;
    const MAX_QUANT: u8 = 31;
    const HAS_MIN: bool = true;
    const SHARED_HALVES: bool = true;
    #[inline(always)]
    fn f16_bits(sb: &[u8]) -> [u16; 2] {
        [u16_at(sb, 0), u16_at(sb, 2)]
    }
    #[inline(always)]
    fn ints(sb: &[u8]) -> KInts {
        k4_ints(sb)
    }
    fn quants(sb: &[u8], j: usize) -> [u8; QK] {
        let low = bits(&sb[48 + 32 * (j / 2)..], 4 * (j % 2), 0x0f);
        let high = bits(&sb[16..48], j, 1);
        core::array::from_fn(|l| low[l] | (high[l] << 4))
    }
}

impl KBlock for BlockQ6K {
    const BYTES: usize = 210;
    const MAX_QUANT: u8 = 63;
    const HAS_MIN: bool = false;
    const OFFSET: i32 = 32;
    #[inline(always)]
    fn f16_bits(sb: &[u8]) -> [u16; 2] {
        let d = u16_at(sb, 208);
        [d, d]
    }
    #[inline(always)]
    fn ints(sb: &[u8]) -> KInts {
        KInts {
            scales: core::array::from_fn(|k| sb[192 + k] as i8),
            mins: [0; HALVES_PER_SUPER],
        }
    }
    /// Block `j` is quarter `c = j % 4` of half `n = j / 4`: low nibbles of `ql[32c..]` for
    /// c < 2, high nibbles of `ql[32(c - 2)..]` after, with bits `2c, 2c + 1` of `qh` on top.
    fn quants(sb: &[u8], j: usize) -> [u8; QK] {
        let (n, c) = (j / 4, j % 4);
        let low = bits(&sb[64 * n + 32 * (c % 2)..], 4 * (c / 2), 0x0f);
        let high = bits(&sb[128 + 32 * n..], 2 * c, 3);
        core::array::from_fn(|l| low[l] | (high[l] << 4))
    }
}

/// Dequantizes whole super-blocks of `bytes` into `out` (as many as both hold).
pub fn dequantize_blocks<K: KBlock>(bytes: &[u8], out: &mut [f32]) {
    for (sb, y) in bytes.chunks_exact(K::BYTES).zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = K::d_dmin(sb);
        let ints = K::ints(sb);
        for (j, y) in y.chunks_exact_mut(QK).enumerate() {
            let q = K::quants(sb, j);
            for (h, (y, q)) in y
                .chunks_exact_mut(QK / 2)
                .zip(q.chunks_exact(QK / 2))
                .enumerate()
            {
                let scale = d * ints.scales[2 * j + h] as f32;
                let min = dmin * ints.mins[2 * j + h] as f32;
                for (y, q) in y.iter_mut().zip(q) {
                    let v = scale * (*q as i32 - K::OFFSET) as f32;
                    *y = if K::HAS_MIN { v - min } else { v };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The word-wise unpacking of Q4_K's and Q5_K's scales is ggml's `get_scale_min_k4`.
        #[test]
        fn k4_ints_are_get_scale_min_k4(sb in proptest::collection::vec(any::<u8>(), 16)) {
            let ints = k4_ints(&sb);
            for k in 0..HALVES_PER_SUPER {
                let (sc, m) = scale_min_k4(k / 2, &sb[4..16]);
                prop_assert_eq!((ints.scales[k], ints.mins[k]), (sc as i8, m as i8));
            }
        }

        /// The word-wise unpacking of Q3_K's scales is ggml's byte-wise one
        /// (`dequantize_row_q3_K`).
        #[test]
        fn q3_scales_are_ggml_scales(sb in proptest::collection::vec(any::<u8>(), 110)) {
            let ints = BlockQ3K::ints(&sb);
            let scales = &sb[96..108];
            for k in 0..HALVES_PER_SUPER {
                let low = (scales[k % 8] >> (4 * (k / 8))) & 0x0f;
                let high = (scales[8 + k % 4] >> (2 * (k / 4))) & 3;
                prop_assert_eq!(ints.scales[k], (low | (high << 4)) as i8 - 32);
            }
        }
    }
}
