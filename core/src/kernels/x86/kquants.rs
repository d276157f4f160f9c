//! The k-quants, which take Q8K activations (see `quant::q8k`): each block's quants as 32
//! unsigned bytes, `vpmaddubsw` against the activations' bytes, `vpmaddwd` with the halves'
//! integer scales, one integer sum per (row, token) for the whole super-block, then the scalar
//! `dot_q8k`'s float steps. The integer sums are exact, so every tile shape and every table
//! gives the scalar kernel's bits.
use super::*;
use crate::quant::iq2_xxs::sign_byte;
use crate::quant::iq3_s::IQ3S_GRID;
use crate::quant::iq4_nl::IQ4_VALUES;
use crate::quant::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3XXS_GRID};
use crate::quant::k_quants::{k4_scales_mins, q3_scale_words};
use crate::quant::q8k::SUM_SPAN;
use crate::quant::tq1_0::POW3;

/// A k-quant's blocks as unsigned bytes.
pub(super) trait KBytes: KBlock {
    /// Block `j`'s stored quants (`KBlock::quants`, `OFFSET` above the signed ones), values in
    /// order.
    ///
    /// # Safety
    /// `BYTES` readable bytes at `p`, `j < 8`; AVX2.
    unsafe fn bytes(p: *const u8, j: usize) -> __m256i;

    /// `WIDE` formats: block `j`'s signed values (`bytes` less `OFFSET`, 128: a flipped top
    /// bit), which `vpmaddubsw` takes as magnitudes and signs.
    ///
    /// # Safety
    /// As for `bytes`.
    #[inline(always)]
    unsafe fn signed_bytes(p: *const u8, j: usize) -> __m256i {
        // SAFETY: as the caller guarantees.
        unsafe { _mm256_xor_si256(Self::bytes(p, j), _mm256_set1_epi8(i8::MIN)) }
    }

    /// The super-block's sixteen half scales and half minimums (zeros without), byte `k` for
    /// half `k`: `KBlock::ints`, read with vector operations where the format allows (the
    /// portable byte loops cost more than a super-block's dot).
    ///
    /// # Safety
    /// `BYTES` readable bytes at `p`; AVX2.
    unsafe fn halves(p: *const u8) -> (__m128i, __m128i);
}

/// Q4_K's and Q5_K's `halves`: each block's scale and minimum, twice.
///
/// # Safety
/// `BYTES` readable bytes at `p` (a Q4_K or Q5_K super-block); AVX2.
#[inline(always)]
unsafe fn k4_halves(p: *const u8) -> (__m128i, __m128i) {
    // SAFETY: the twelve scale bytes at 4 lie in the super-block.
    let (s, m) = k4_scales_mins(unsafe { core::slice::from_raw_parts(p, 16) });
    // SAFETY: register-only; the caller has AVX2.
    unsafe {
        let eight = |v: [i8; 8]| _mm_cvtsi64_si128(i64::from_le_bytes(v.map(|v| v as u8)));
        let (s, m) = (eight(s), eight(m));
        (_mm_unpacklo_epi8(s, s), _mm_unpacklo_epi8(m, m))
    }
}

impl KBytes for BlockQ2K {
    #[inline(always)]
    unsafe fn bytes(p: *const u8, j: usize) -> __m256i {
        // SAFETY: block j's 32 bytes of quants (at 16 + 32(j / 4)) lie in the super-block.
        unsafe { bytes32(p.add(16 + 32 * (j / 4)), 2 * (j % 4), 3) }
    }
    /// The sixteen scale bytes at 0: scales in the low nibbles, minimums in the high.
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> (__m128i, __m128i) {
        // SAFETY: the sixteen scale bytes lie in the super-block; the caller has AVX2.
        unsafe {
            let v = _mm_loadu_si128(p as *const __m128i);
            let low4 = _mm_set1_epi8(0x0f);
            (
                _mm_and_si128(v, low4),
                _mm_and_si128(_mm_srli_epi16(v, 4), low4),
            )
        }
    }
}

impl KBytes for BlockQ3K {
    #[inline(always)]
    unsafe fn bytes(p: *const u8, j: usize) -> __m256i {
        // SAFETY: `hmask` (32 bytes at 0) and block j's low bits (32 bytes at 32 + 32(j / 4))
        // lie in the super-block.
        unsafe {
            let low = bytes32(p.add(32 + 32 * (j / 4)), 2 * (j % 4), 3);
            let high = bytes32(p, j, 1);
            _mm256_or_si256(low, _mm256_slli_epi16(high, 2))
        }
    }
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> (__m128i, __m128i) {
        // SAFETY: the twelve scale bytes at 96 lie in the super-block.
        let w = q3_scale_words(unsafe { core::slice::from_raw_parts(p, Self::BYTES) });
        // SAFETY: register-only; the caller has AVX2.
        unsafe {
            let words = _mm_setr_epi32(w[0] as i32, w[1] as i32, w[2] as i32, w[3] as i32);
            (_mm_sub_epi8(words, _mm_set1_epi8(32)), _mm_setzero_si128())
        }
    }
}

impl KBytes for BlockQ4K {
    #[inline(always)]
    unsafe fn bytes(p: *const u8, j: usize) -> __m256i {
        // SAFETY: block j's 32 bytes of nibbles lie in the super-block.
        unsafe { bytes32(p.add(16 + 32 * (j / 2)), 4 * (j % 2), 0x0f) }
    }
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> (__m128i, __m128i) {
        // SAFETY: as the caller guarantees.
        unsafe { k4_halves(p) }
    }
}

impl KBytes for BlockQ5K {
    #[inline(always)]
    unsafe fn bytes(p: *const u8, j: usize) -> __m256i {
        // SAFETY: the nibbles (at 48) and the fifth bits (32 bytes at 16) lie in the super-block.
        unsafe {
            let low = bytes32(p.add(48 + 32 * (j / 2)), 4 * (j % 2), 0x0f);
            let high = bytes32(p.add(16), j, 1);
            _mm256_or_si256(low, _mm256_slli_epi16(high, 4))
        }
    }
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> (__m128i, __m128i) {
        // SAFETY: as the caller guarantees.
        unsafe { k4_halves(p) }
    }
}

impl KBytes for BlockQ6K {
    /// Block `j` is quarter `c` of half `n` (see `KBlock for BlockQ6K`).
    #[inline(always)]
    unsafe fn bytes(p: *const u8, j: usize) -> __m256i {
        let (n, c) = (j / 4, j % 4);
        // SAFETY: the low bits (32 bytes at 64n + 32(c % 2)) and the high bits (32 bytes at
        // 128 + 32n) lie in the super-block.
        unsafe {
            let low = bytes32(p.add(64 * n + 32 * (c % 2)), 4 * (c / 2), 0x0f);
            let high = bytes32(p.add(128 + 32 * n), 2 * c, 3);
            _mm256_or_si256(low, _mm256_slli_epi16(high, 4))
        }
    }
    /// The sixteen signed scale bytes at 192, as stored.
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> (__m128i, __m128i) {
        // SAFETY: the scale bytes lie in the super-block; the caller has AVX2.
        unsafe {
            let scales = _mm_loadu_si128(p.add(192) as *const __m128i);
            (scales, _mm_setzero_si128())
        }
    }
}

/// IQ4_XS's stored quants by index, twice: a table for `vpshufb` in each 128-bit lane.
static IQ4_STORED: [u8; 32] = {
    let mut t = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        t[i] = (IQ4_VALUES[i % 16] as i32 + BlockIQ4XS::OFFSET) as u8;
        i += 1;
    }
    t
};

/// IQ4_XS's signed values by index, twice (`signed_bytes`: no flip of the stored quants).
static IQ4_SIGNED: [i8; 32] = {
    let mut t = [0i8; 32];
    let mut i = 0;
    while i < 32 {
        t[i] = IQ4_VALUES[i % 16];
        i += 1;
    }
    t
};

/// Block `j`'s sixteen bytes of IQ4_XS nibbles as 32 grid indices, values in order: the bytes
/// loaded into both 128-bit lanes at once, the upper lane's shifted down a nibble (a 64-bit
/// shift moves the next byte's bits into each byte's top, which the mask drops). Three
/// instructions where two 128-bit masks and a lane insert took five.
///
/// # Safety
/// `BYTES` readable bytes at `p` (an IQ4_XS super-block), `j < 8`; AVX2.
#[inline(always)]
unsafe fn iq4_indices(p: *const u8, j: usize) -> __m256i {
    // SAFETY: block j's sixteen bytes of nibbles (at 8 + 16j) lie in the super-block.
    unsafe {
        let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(8 + 16 * j) as *const __m128i));
        let v = _mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4));
        _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
    }
}

/// `WIDE`: `vpmaddubsw`'s pair sums could saturate on the stored quants, so the kernels take
/// the signed values' magnitudes and move their signs to the activations (`|v| <= 127`).
impl KBytes for BlockIQ4XS {
    #[inline(always)]
    unsafe fn bytes(p: *const u8, j: usize) -> __m256i {
        // SAFETY: as the caller guarantees; the table is 32 bytes.
        unsafe {
            let table = _mm256_loadu_si256(IQ4_STORED.as_ptr() as *const __m256i);
            _mm256_shuffle_epi8(table, iq4_indices(p, j))
        }
    }
    #[inline(always)]
    unsafe fn signed_bytes(p: *const u8, j: usize) -> __m256i {
        // SAFETY: as the caller guarantees; the table is 32 bytes.
        unsafe {
            let table = _mm256_loadu_si256(IQ4_SIGNED.as_ptr() as *const __m256i);
            _mm256_shuffle_epi8(table, iq4_indices(p, j))
        }
    }
    /// Each block's scale, twice.
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> (__m128i, __m128i) {
        // SAFETY: the scale bytes (2..8) lie in the super-block.
        let ls = BlockIQ4XS::scale_bytes(unsafe { core::slice::from_raw_parts(p, 8) });
        // SAFETY: register-only; the caller has AVX2.
        unsafe {
            let s = _mm_sub_epi8(_mm_cvtsi64_si128(ls as i64), _mm_set1_epi8(32));
            (_mm_unpacklo_epi8(s, s), _mm_setzero_si128())
        }
    }
}

impl KBytes for BlockIQ3S {
    /// Eight grid entries, gathered, their signs applied as byte masks.
    #[inline(always)]
    unsafe fn bytes(p: *const u8, j: usize) -> __m256i {
        // SAFETY: block j's indices (8 bytes at 2 + 8j), ninth bits (the byte at 66 + j) and
        // signs (4 bytes at 74 + 4j) lie in the super-block at `p`; the caller has AVX2.
        unsafe {
            let low = _mm_loadl_epi64(p.add(BlockIQ3S::QS + 8 * j) as *const __m128i);
            let qh = _mm256_set1_epi32(*p.add(BlockIQ3S::QH + j) as i32);
            let ninth = _mm256_and_si256(
                _mm256_srlv_epi32(qh, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                _mm256_set1_epi32(1),
            );
            let index = _mm256_or_si256(_mm256_cvtepu8_epi32(low), _mm256_slli_epi32(ninth, 8));
            // Eight bits and a ninth index the grid's 512 entries.
            let magnitudes = _mm256_i32gather_epi32::<4>(IQ3S_GRID.as_ptr() as *const i32, index);
            let signs = (p.add(BlockIQ3S::SIGNS + 4 * j) as *const u32).read_unaligned();
            signed::<Self>(magnitudes, signs)
        }
    }
    /// Each block's scale, twice.
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> (__m128i, __m128i) {
        // SAFETY: the super-block's 110 bytes lie at `p`.
        let s = BlockIQ3S::scale_bytes(unsafe { core::slice::from_raw_parts(p, Self::BYTES) });
        // SAFETY: register-only; the caller has AVX2.
        unsafe {
            let s = _mm_cvtsi64_si128(s as i64);
            (_mm_unpacklo_epi8(s, s), _mm_setzero_si128())
        }
    }
}

/// The stored quants of 32 magnitudes with their sign bits (bit `v` set: value `v` negative):
/// the signed values plus `K::OFFSET`.
///
/// # Safety
/// register-only: the CPU has AVX2.
#[inline(always)]
unsafe fn signed<K: KBlock>(magnitudes: __m256i, signs: u32) -> __m256i {
    // SAFETY: register-only; the caller has AVX2.
    unsafe {
        // Sign byte `v / 8` to byte `v`, then its bit `v % 8` tested.
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(signs as i32),
            _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                3, 3, 3, 3,
            ),
        );
        let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        let negative = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits);
        negated::<K>(magnitudes, negative)
    }
}

/// The stored quants of 32 magnitudes, those under a 0xff byte of `negative` negated: the
/// signed values plus `K::OFFSET`.
///
/// # Safety
/// register-only: the CPU has AVX2.
#[inline(always)]
unsafe fn negated<K: KBlock>(magnitudes: __m256i, negative: __m256i) -> __m256i {
    // SAFETY: register-only; the caller has AVX2.
    unsafe {
        let values = _mm256_sub_epi8(_mm256_xor_si256(magnitudes, negative), negative);
        _mm256_add_epi8(values, _mm256_set1_epi8(K::OFFSET as i8))
    }
}

/// `sign_byte` of each seven-bit index as eight byte masks (0xff: negative), ggml's
/// `keven_signs_q2xs`: one load per group of eight values.
static SIGN_MASKS: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        let signs = sign_byte(i as u32);
        let mut v = 0;
        while v < 8 {
            if signs >> v & 1 == 1 {
                t[i] |= 0xff << (8 * v);
            }
            v += 1;
        }
        i += 1;
    }
    t
};

/// The byte masks of the four seven-bit sign indices in bits `7l..7l + 7` of `word` (`l` the
/// group of eight values).
///
/// # Safety
/// register-only: the CPU has AVX2.
#[inline(always)]
unsafe fn sign_masks(word: u32) -> __m256i {
    let masks: [u64; 4] = core::array::from_fn(|l| SIGN_MASKS[(word >> (7 * l)) as usize & 127]);
    // SAFETY: `masks` is 32 bytes; the caller has AVX2.
    unsafe { _mm256_loadu_si256(masks.as_ptr() as *const __m256i) }
}

/// Block scales `1 + 2s` from the top four bits of the eight words at `p + stride·j`, byte `j`
/// each, and then each byte twice (both halves of a block share it).
///
/// # Safety
/// `7·stride + 4` readable bytes at `p`; AVX2.
#[inline(always)]
unsafe fn top_nibble_scales(p: *const u8, stride: usize) -> (__m128i, __m128i) {
    // SAFETY: as the caller guarantees.
    unsafe {
        let s = (0..8).fold(0u64, |s, j| {
            let word = (p.add(stride * j) as *const u32).read_unaligned();
            s | ((1 + 2 * (word >> 28)) as u64) << (8 * j)
        });
        let s = _mm_cvtsi64_si128(s as i64);
        (_mm_unpacklo_epi8(s, s), _mm_setzero_si128())
    }
}

/// Half scales `1 + 2s` from the eight bytes at `p`, nibble `h` of byte `j` for half `2j + h`.
///
/// # Safety
/// 8 readable bytes at `p`; AVX2.
#[inline(always)]
unsafe fn nibble_scales(p: *const u8) -> (__m128i, __m128i) {
    // SAFETY: as the caller guarantees.
    unsafe {
        let v = _mm_loadl_epi64(p as *const __m128i);
        let low4 = _mm_set1_epi8(0x0f);
        let halves = _mm_unpacklo_epi8(
            _mm_and_si128(v, low4),
            _mm_and_si128(_mm_srli_epi16(v, 4), low4),
        );
        let scales = _mm_add_epi8(_mm_add_epi8(halves, halves), _mm_set1_epi8(1));
        (scales, _mm_setzero_si128())
    }
}

impl KBytes for BlockIQ2XXS {
    /// Four grid entries of eight magnitudes, gathered, their signs applied as byte masks.
    #[inline(always)]
    unsafe fn bytes(p: *const u8, j: usize) -> __m256i {
        // SAFETY: block j's eight bytes (at 2 + 8j) lie in the super-block at `p`; the caller
        // has AVX2.
        unsafe {
            let at = p.add(BlockIQ2XXS::QS + 8 * j);
            let index = _mm_cvtepu8_epi32(_mm_cvtsi32_si128((at as *const i32).read_unaligned()));
            let magnitudes = _mm256_i32gather_epi64::<8>(IQ2XXS_GRID.as_ptr() as *const i64, index);
            let aux = (at.add(4) as *const u32).read_unaligned();
            negated::<Self>(magnitudes, sign_masks(aux))
        }
    }
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> (__m128i, __m128i) {
        // SAFETY: the eight sign-and-scale words (at 6 + 8j) lie in the super-block.
        unsafe { top_nibble_scales(p.add(BlockIQ2XXS::QS + 4), 8) }
    }
}

impl KBytes for BlockIQ2XS {
    /// Four grid entries of eight magnitudes (nine bits of each word), gathered, their signs
    /// (the words' top seven bits) applied as byte masks.
    #[inline(always)]
    unsafe fn bytes(p: *const u8, j: usize) -> __m256i {
        // SAFETY: block j's four words (at 2 + 8j) lie in the super-block at `p`; the caller
        // has AVX2.
        unsafe {
            let at = p.add(BlockIQ2XS::QS + 8 * j);
            let words = (at as *const u64).read_unaligned();
            let index = _mm_and_si128(
                _mm_cvtepu16_epi32(_mm_cvtsi64_si128(words as i64)),
                _mm_set1_epi32(511),
            );
            let magnitudes = _mm256_i32gather_epi64::<8>(IQ2XS_GRID.as_ptr() as *const i64, index);
            let masks: [u64; 4] =
                core::array::from_fn(|l| SIGN_MASKS[(words >> (16 * l + 9)) as usize & 127]);
            let negative = _mm256_loadu_si256(masks.as_ptr() as *const __m256i);
            negated::<Self>(magnitudes, negative)
        }
    }
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> (__m128i, __m128i) {
        // SAFETY: the eight scale bytes (at 66) lie in the super-block.
        unsafe { nibble_scales(p.add(BlockIQ2XS::SCALES)) }
    }
}

impl KBytes for BlockIQ2S {
    /// Four grid entries of eight magnitudes (eight bits and two of `qh`), gathered, their sign
    /// bytes applied as byte masks.
    #[inline(always)]
    unsafe fn bytes(p: *const u8, j: usize) -> __m256i {
        // SAFETY: block j's indices (4 bytes at 2 + 4j), high bits (the byte at 66 + j) and
        // signs (4 bytes at 34 + 4j) lie in the super-block at `p`; the caller has AVX2.
        unsafe {
            let low = (p.add(BlockIQ2S::QS + 4 * j) as *const i32).read_unaligned();
            let qh = _mm_set1_epi32(*p.add(BlockIQ2S::QH + j) as i32);
            let high = _mm_and_si128(
                _mm_srlv_epi32(qh, _mm_setr_epi32(0, 2, 4, 6)),
                _mm_set1_epi32(3),
            );
            let index = _mm_or_si128(
                _mm_cvtepu8_epi32(_mm_cvtsi32_si128(low)),
                _mm_slli_epi32(high, 8),
            );
            let magnitudes = _mm256_i32gather_epi64::<8>(IQ2S_GRID.as_ptr() as *const i64, index);
            let signs = (p.add(BlockIQ2S::SIGNS + 4 * j) as *const u32).read_unaligned();
            signed::<Self>(magnitudes, signs)
        }
    }
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> (__m128i, __m128i) {
        // SAFETY: the eight scale bytes (at 74) lie in the super-block.
        unsafe { nibble_scales(p.add(BlockIQ2S::SCALES)) }
    }
}

impl KBytes for BlockIQ3XXS {
    /// Eight grid entries of four magnitudes, gathered, their signs applied as byte masks.
    #[inline(always)]
    unsafe fn bytes(p: *const u8, j: usize) -> __m256i {
        // SAFETY: block j's indices (8 bytes at 2 + 8j) and sign-and-scale word (at 66 + 4j)
        // lie in the super-block at `p`; the caller has AVX2.
        unsafe {
            let low = _mm_loadl_epi64(p.add(BlockIQ3XXS::QS + 8 * j) as *const __m128i);
            let index = _mm256_cvtepu8_epi32(low);
            let magnitudes = _mm256_i32gather_epi32::<4>(IQ3XXS_GRID.as_ptr() as *const i32, index);
            let aux = (p.add(BlockIQ3XXS::SIGNS + 4 * j) as *const u32).read_unaligned();
            negated::<Self>(magnitudes, sign_masks(aux))
        }
    }
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> (__m128i, __m128i) {
        // SAFETY: the eight sign-and-scale words (at 66) lie in the super-block.
        unsafe { top_nibble_scales(p.add(BlockIQ3XXS::SIGNS), 4) }
    }
}

impl KBytes for BlockIQ1S {
    /// Four grid entries of eight values -1, 0 or 1 (eight bits and three of the block's word),
    /// gathered, times 8, plus the block's shift ±1 and the offset.
    #[inline(always)]
    unsafe fn bytes(p: *const u8, j: usize) -> __m256i {
        // SAFETY: block j's indices (4 bytes at 2 + 4j) and word (at 34 + 2j) lie in the
        // super-block at `p`; the caller has AVX2.
        unsafe {
            let low = (p.add(BlockIQ1S::QS + 4 * j) as *const i32).read_unaligned();
            let word = (p.add(BlockIQ1S::QH + 2 * j) as *const u16).read_unaligned();
            let high = _mm_and_si128(
                _mm_srlv_epi32(_mm_set1_epi32(word as i32), _mm_setr_epi32(0, 3, 6, 9)),
                _mm_set1_epi32(7),
            );
            let index = _mm_or_si128(
                _mm_cvtepu8_epi32(_mm_cvtsi32_si128(low)),
                _mm_slli_epi32(high, 8),
            );
            let g = _mm256_i32gather_epi64::<8>(IQ1S_GRID.as_ptr() as *const i64, index);
            let shift = if word & 0x8000 != 0 { -1 } else { 1 };
            _mm256_add_epi8(
                _mm256_sign_epi8(_mm256_set1_epi8(8), g),
                _mm256_set1_epi8((shift + Self::OFFSET) as i8),
            )
        }
    }
    /// Each block's scale `2s + 1`, twice.
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> (__m128i, __m128i) {
        // SAFETY: the eight words (at 34) lie in the super-block.
        unsafe {
            let s = (0..8).fold(0u64, |s, j| {
                let word = (p.add(BlockIQ1S::QH + 2 * j) as *const u16).read_unaligned();
                s | ((2 * ((word >> 12) & 7) + 1) as u64) << (8 * j)
            });
            let s = _mm_cvtsi64_si128(s as i64);
            (_mm_unpacklo_epi8(s, s), _mm_setzero_si128())
        }
    }
}

impl KBytes for BlockIQ1M {
    /// Four grid entries of eight values -1, 0 or 1 (eight bits and a nibble's three), gathered,
    /// times 8, plus each group's shift ±1 and the offset.
    #[inline(always)]
    unsafe fn bytes(p: *const u8, j: usize) -> __m256i {
        // SAFETY: block j's indices (4 bytes at 4j) and nibbles (2 bytes at 32 + 2j) lie in the
        // super-block at `p`; the caller has AVX2.
        unsafe {
            let low = (p.add(4 * j) as *const i32).read_unaligned();
            let nibbles = (p.add(BlockIQ1M::QH + 2 * j) as *const u16).read_unaligned();
            let nibbles =
                _mm_srlv_epi32(_mm_set1_epi32(nibbles as i32), _mm_setr_epi32(0, 4, 8, 12));
            let index = _mm_or_si128(
                _mm_cvtepu8_epi32(_mm_cvtsi32_si128(low)),
                _mm_slli_epi32(_mm_and_si128(nibbles, _mm_set1_epi32(7)), 8),
            );
            let g = _mm256_i32gather_epi64::<8>(IQ1S_GRID.as_ptr() as *const i64, index);
            // Each group's stored shift: OFFSET + 1, less 2 where its sign bit is set; byte 0 of
            // each 64-bit lane spread over the lane's eight.
            let negative = _mm_and_si128(_mm_srli_epi32(nibbles, 3), _mm_set1_epi32(1));
            let shift = _mm_sub_epi32(
                _mm_set1_epi32(Self::OFFSET + 1),
                _mm_add_epi32(negative, negative),
            );
            let shift = _mm256_shuffle_epi8(
                _mm256_cvtepu32_epi64(shift),
                _mm256_setr_epi8(
                    0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8, 0, 0, 0, 0, 0, 0, 0, 0, 8, 8,
                    8, 8, 8, 8, 8, 8,
                ),
            );
            _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), shift)
        }
    }
    /// Half `k`'s scale `2s + 1` in byte `k` (`BlockIQ1M::half_scales`): word `k / 4` in 16-bit
    /// lane `k`, multiplied so that its field `k % 4` lands in bits 9..12.
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> (__m128i, __m128i) {
        // SAFETY: the four words (at 48) lie in the super-block; the caller has AVX2.
        unsafe {
            let words = (p.add(BlockIQ1M::SCALES) as *const i64).read_unaligned();
            let lanes = _mm256_shuffle_epi8(
                _mm256_set1_epi64x(words),
                _mm256_setr_epi8(
                    0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7,
                    6, 7, 6, 7, 6, 7,
                ),
            );
            let fields = _mm256_mullo_epi16(
                lanes,
                _mm256_setr_epi16(512, 64, 8, 1, 512, 64, 8, 1, 512, 64, 8, 1, 512, 64, 8, 1),
            );
            let s = _mm256_and_si256(_mm256_srli_epi16::<9>(fields), _mm256_set1_epi16(7));
            let s = _mm256_add_epi16(_mm256_add_epi16(s, s), _mm256_set1_epi16(1));
            let bytes =
                _mm_packus_epi16(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
            (bytes, _mm_setzero_si128())
        }
    }
}

impl KBytes for BlockTQ2_0 {
    #[inline(always)]
    unsafe fn bytes(p: *const u8, j: usize) -> __m256i {
        // SAFETY: block j's 32 bytes of quants (at 32(j / 4)) lie in the super-block.
        unsafe { bytes32(p.add(32 * (j / 4)), 2 * (j % 4), 3) }
    }
    /// Every half's scale 1.
    #[inline(always)]
    unsafe fn halves(_: *const u8) -> (__m128i, __m128i) {
        // SAFETY: register-only; the caller has AVX2.
        unsafe { (_mm_set1_epi8(1), _mm_setzero_si128()) }
    }
}

impl KBytes for BlockTQ1_0 {
    /// The block's bytes, each with the power of three of the digit it gives
    /// (`BlockTQ1_0::digit_of`), through `trits`.
    #[inline(always)]
    unsafe fn bytes(p: *const u8, j: usize) -> __m256i {
        // SAFETY: the 48 bytes of five digits (at 0) and four of four (at 48) lie in the
        // super-block; the caller has AVX2.
        unsafe {
            let pow3 = |n: usize| _mm_set1_epi16(POW3[n] as i16);
            let tail = _mm_loadu_si128(p.add(BlockTQ1_0::QS_TAIL) as *const __m128i);
            let (v, pow3) = match j {
                0..5 => (
                    _mm256_loadu_si256(p as *const __m256i),
                    _mm256_set1_epi16(POW3[j] as i16),
                ),
                5 | 6 => (
                    _mm256_set_m128i(tail, tail),
                    _mm256_set_m128i(pow3(2 * (j - 5) + 1), pow3(2 * (j - 5))),
                ),
                _ => {
                    let qh = (p.add(BlockTQ1_0::QH) as *const i32).read_unaligned();
                    (
                        _mm256_set_m128i(_mm_set1_epi32(qh), tail),
                        _mm256_setr_epi16(81, 81, 81, 81, 81, 81, 81, 81, 1, 1, 3, 3, 9, 9, 27, 27),
                    )
                }
            };
            trits(v, pow3)
        }
    }
    /// Every half's scale 1.
    #[inline(always)]
    unsafe fn halves(_: *const u8) -> (__m128i, __m128i) {
        // SAFETY: register-only; the caller has AVX2.
        unsafe { (_mm_set1_epi8(1), _mm_setzero_si128()) }
    }
}

/// TQ1_0's digit of each byte of `v` (`tq1_0::trit`), both bytes of 16-bit lane `i` by the power
/// of three in lane `i` of `pow3`: a byte in a lane's high half times it keeps `u8(b·3ⁿ)` there,
/// and the high half of that times 3 is the digit.
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX2).
#[inline(always)]
unsafe fn trits(v: __m256i, pow3: __m256i) -> __m256i {
    // SAFETY: register-only; the caller has AVX2.
    unsafe {
        let three = _mm256_set1_epi16(3);
        let even = _mm256_mullo_epi16(_mm256_slli_epi16::<8>(v), pow3);
        let odd = _mm256_mullo_epi16(_mm256_and_si256(v, _mm256_set1_epi16(-256)), pow3);
        _mm256_or_si256(
            _mm256_mulhi_epu16(even, three),
            _mm256_slli_epi16::<8>(_mm256_mulhi_epu16(odd, three)),
        )
    }
}

/// `(byte >> shift) & mask` of each of the 32 bytes at `p`, kept as bytes. The shift runs on
/// 16-bit lanes; the mask drops what crossed from the neighbouring byte, and a shift left by up
/// to 4 of the result (at most 3 bits wide) stays inside each byte.
///
/// # Safety
/// 32 readable bytes at `p`; AVX2.
#[inline(always)]
pub(super) unsafe fn bytes32(p: *const u8, shift: usize, mask: i8) -> __m256i {
    // SAFETY: as the caller guarantees.
    unsafe {
        let v = _mm256_loadu_si256(p as *const __m256i);
        let v = _mm256_srl_epi16(v, _mm_cvtsi32_si128(shift as i32));
        _mm256_and_si256(v, _mm256_set1_epi8(mask))
    }
}

/// One row's super-block, read once for all the tokens it meets: its f16 scales, and its
/// integer factors as `i16` lanes.
#[derive(Clone, Copy)]
struct Factors {
    /// The f16 scale (low half) and minimum scale (high half), as stored.
    f16s: i32,
    /// Low 128 bits: the eight blocks' first-half scales; high: their second-half scales.
    /// Block `j`'s `vpmaddwd` operand is lane `j` of each half, broadcast within it
    /// (`block_scales`).
    by_block: __m256i,
    /// Lane `k`: the scale of values `16k .. 16k + 16`, the order of the activations' sums.
    by_half: __m256i,
    /// Lane `k`: the minimum of values `16k .. 16k + 16` (zeros without minimums).
    mins: __m256i,
}

impl Factors {
    const ZERO: Factors = Factors {
        f16s: 0,
        // SAFETY: all-zero bits are a valid `__m256i` (plain integers).
        by_block: unsafe { core::mem::zeroed() },
        // SAFETY: as above.
        by_half: unsafe { core::mem::zeroed() },
        // SAFETY: as above.
        mins: unsafe { core::mem::zeroed() },
    };
}

/// # Safety
/// `K::BYTES` readable bytes at `p`; AVX2 and F16C.
#[inline(always)]
unsafe fn factors<K: KBytes>(p: *const u8) -> Factors {
    // SAFETY: as the caller guarantees.
    unsafe {
        let (scales, mins) = K::halves(p);
        // Even halves (each block's first) to the low eight bytes, odd ones to the high.
        let by_block = _mm_shuffle_epi8(
            scales,
            _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15),
        );
        let [d, dmin] = K::f16_bits(core::slice::from_raw_parts(p, K::BYTES));
        Factors {
            f16s: d as i32 | ((dmin as i32) << 16),
            by_block: _mm256_cvtepi8_epi16(by_block),
            by_half: _mm256_cvtepi8_epi16(scales),
            mins: if K::HAS_MIN {
                _mm256_cvtepi8_epi16(mins)
            } else {
                _mm256_setzero_si256()
            },
        }
    }
}

/// Block `j`'s scales for `vpmaddwd`: its first half's in the low 128 bits, its second half's in
/// the high, eight times each.
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX2).
#[inline(always)]
unsafe fn block_scales(by_block: __m256i, j: usize) -> __m256i {
    // The bytes of i16 lane j, in every i16 lane of both halves.
    let pair = (((2 * j + 1) << 8) | (2 * j)) as i16;
    // SAFETY: register-only; the caller has AVX2.
    unsafe {
        let pick = _mm256_set1_epi16(pair);
        _mm256_shuffle_epi8(by_block, pick)
    }
}

/// How far ahead of the rows being read the prefetches aim, at least: the same super-block of
/// the row as many whole tiles on. One tile ahead (a decoded token's one row: 672 bytes of Q2_K
/// at 2048 columns) is too close to hide the memory's latency; decoding the 1.1B k-quant files on
/// an AVX-512 host with 16 KiB gave 20% (Q2_K), 6% (Q4_K_M) and 8% (Q6_K) more tokens/s, more
/// than 8 or 32 KiB gave (BENCHMARKS.md).
const PREFETCH_AHEAD: usize = 16 << 10;

/// R weight rows in format `K` against N rows of Q8K activations.
pub(super) fn dot_q8k<K: KBytes, const R: usize, const N: usize, const ISA: u8>(
    w: [&[u8]; R],
    xs: [&[u8]; N],
) -> [[f32; N]; R] {
    let ns = w.iter().fold(usize::MAX, |n, w| n.min(w.len() / K::BYTES));
    let ns = xs.iter().fold(ns, |n, x| n.min(x.len() / BlockQ8K::BYTES));
    let w = w.map(<[u8]>::as_ptr);
    let xs = xs.map(<[u8]>::as_ptr);
    // SAFETY: `Kernels::best` hands out each table only when its `*_available()` said yes; `ns`
    // whole super-blocks lie inside every slice.
    unsafe {
        match ISA {
            AVX512_VNNI => q8k_avx512::<K, R, N>(ns, w, xs),
            AVX_VNNI => q8k_vnni::<K, R, N>(ns, w, xs),
            _ => q8k_avx2::<K, R, N>(ns, w, xs),
        }
    }
}

/// # Safety
/// The CPU has AVX2, FMA and F16C; `ns` whole super-blocks of format `K` lie at every `w[r]` and
/// `ns` Q8K blocks at every `xs[t]`.
#[inline(always)]
unsafe fn q8k_tile<K: KBytes, const R: usize, const N: usize, const ISA: u8>(
    ns: usize,
    w: [*const u8; R],
    xs: [*const u8; N],
) -> [[f32; N]; R] {
    // The float steps take four lanes at once: the rows of a super-block, or, decoding one row,
    // four super-blocks (the sum across and the float steps were half of a decoded
    // super-block's time when each took one).
    const { assert!(R <= 4) };
    let mut out = [[0f32; N]; R];
    let tile_len = R * ns * K::BYTES;
    let ahead = tile_len * PREFETCH_AHEAD.div_ceil(tile_len.max(1));
    let mut s = 0;
    // SAFETY: the caller guarantees `ns` whole super-blocks in every row and activation row.
    unsafe {
        if R == 1 && N == 1 {
            while s + 4 <= ns {
                let b = [
                    q8k_super::<K, R, N, ISA>(s, w, xs, ahead),
                    q8k_super::<K, R, N, ISA>(s + 1, w, xs, ahead),
                    q8k_super::<K, R, N, ISA>(s + 2, w, xs, ahead),
                    q8k_super::<K, R, N, ISA>(s + 3, w, xs, ahead),
                ];
                let f = [b[0].f[0], b[1].f[0], b[2].f[0], b[3].f[0]];
                let acc = [
                    b[0].acc[0][0],
                    b[1].acc[0][0],
                    b[2].acc[0][0],
                    b[3].acc[0][0],
                ];
                let x = [b[0].xp[0], b[1].xp[0], b[2].xp[0], b[3].xp[0]];
                // The super-blocks one after another, as the scalar kernel adds them.
                for step in q8k_steps::<K>(f, acc, x, 4) {
                    out[0][0] += step;
                }
                s += 4;
            }
        }
        while s < ns {
            let b = q8k_super::<K, R, N, ISA>(s, w, xs, ahead);
            let mut f = [Factors::ZERO; 4];
            f[..R].copy_from_slice(&b.f);
            for (t, &xp) in b.xp.iter().enumerate() {
                let mut acc = [_mm256_setzero_si256(); 4];
                for (lane, row) in acc.iter_mut().zip(&b.acc) {
                    *lane = row[t];
                }
                let steps = q8k_steps::<K>(f, acc, [xp; 4], R);
                for (row, step) in out.iter_mut().zip(steps) {
                    row[t] += step;
                }
            }
            s += 1;
        }
    }
    out
}

/// One super-block of every (row, token): the rows' factors, each pair's integer sums as eight
/// lanes, and where the tokens' Q8K blocks are.
struct Super<const R: usize, const N: usize> {
    f: [Factors; R],
    acc: [[__m256i; N]; R],
    xp: [*const u8; N],
}

/// Super-block `s` of every (row, token).
///
/// # Safety
/// As for `q8k_tile`, with `s < ns`.
#[inline(always)]
unsafe fn q8k_super<K: KBytes, const R: usize, const N: usize, const ISA: u8>(
    s: usize,
    w: [*const u8; R],
    xs: [*const u8; N],
    ahead: usize,
) -> Super<R, N> {
    // SAFETY: as the caller guarantees.
    unsafe {
        // Plain loops: closures (`from_fn`) would not inherit the caller's target features, and
        // would call the intrinsics out of line.
        let (mut wp, mut xp) = ([w[0]; R], [xs[0]; N]);
        let mut f = [Factors::ZERO; R];
        for r in 0..R {
            wp[r] = w[r].add(s * K::BYTES);
            f[r] = factors::<K>(wp[r]);
        }
        for t in 0..N {
            xp[t] = xs[t].add(s * BlockQ8K::BYTES);
        }
        let mut acc = [[_mm256_setzero_si256(); N]; R];
        let step = Step { wp, xp, ahead };
        step.block::<K, 0, ISA>(&f, &mut acc);
        step.block::<K, 1, ISA>(&f, &mut acc);
        step.block::<K, 2, ISA>(&f, &mut acc);
        step.block::<K, 3, ISA>(&f, &mut acc);
        step.block::<K, 4, ISA>(&f, &mut acc);
        step.block::<K, 5, ISA>(&f, &mut acc);
        step.block::<K, 6, ISA>(&f, &mut acc);
        step.block::<K, 7, ISA>(&f, &mut acc);
        Super { f, acc, xp }
    }
}

/// `q8k_step` of the first `lanes` of four (row super-block, Q8K block) pairs: the row's factors
/// `f`, the pair's integer sums `acc` (eight lanes to add), the Q8K block at `x`.
///
/// # Safety
/// A Q8K block at each `x[l]`, `l < lanes <= 4`; AVX2 and F16C.
#[inline(always)]
unsafe fn q8k_steps<K: KBytes>(
    f: [Factors; 4],
    acc: [__m256i; 4],
    x: [*const u8; 4],
    lanes: usize,
) -> [f32; 4] {
    // SAFETY: as the caller guarantees.
    unsafe {
        // Lanes 0..4: the integer sums; 4..8: the minimums' sums.
        let mut v = [_mm256_setzero_si256(); 8];
        let (mut f16s, mut dx) = ([0i32; 4], [0f32; 4]);
        for l in 0..lanes {
            let sums = _mm256_loadu_si256(x[l].add(BlockQ8K::SUMS) as *const __m256i);
            v[l] = acc[l];
            if K::OFFSET != 0 && !K::WIDE {
                let offsets = _mm256_madd_epi16(f[l].by_half, sums);
                let offsets = _mm256_mullo_epi32(offsets, _mm256_set1_epi32(K::OFFSET));
                v[l] = _mm256_sub_epi32(v[l], offsets);
            }
            if K::HAS_MIN {
                v[4 + l] = _mm256_madd_epi16(f[l].mins, sums);
            }
            f16s[l] = f[l].f16s;
            dx[l] = (x[l] as *const f32).read_unaligned();
        }
        let isum_msum = _mm256_cvtepi32_ps(sum_across8(v));
        // Each lane's scales as floats: `d` and `dmin`.
        let scales = _mm256_cvtph_ps(_mm_loadu_si128(f16s.as_ptr() as *const __m128i));
        let by_kind = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
        let scales = _mm256_permutevar8x32_ps(scales, by_kind);
        let (d, dmin) = (
            _mm256_castps256_ps128(scales),
            _mm256_extractf128_ps(scales, 1),
        );
        let d = if K::D_SCALE == 1.0 {
            d
        } else {
            _mm_mul_ps(d, _mm_set1_ps(K::D_SCALE))
        };
        // `q8k_step` in each lane, the same operations in the same order.
        let dx = _mm_loadu_ps(dx.as_ptr());
        let a = _mm_mul_ps(_mm_mul_ps(d, dx), _mm256_castps256_ps128(isum_msum));
        let b = _mm_mul_ps(_mm_mul_ps(dmin, dx), _mm256_extractf128_ps(isum_msum, 1));
        let mut steps = [0f32; 4];
        _mm_storeu_ps(steps.as_mut_ptr(), _mm_sub_ps(a, b));
        steps
    }
}

/// Where one super-block's blocks are read: the rows', the tokens', and how far ahead of the
/// rows the prefetches aim.
struct Step<const R: usize, const N: usize> {
    wp: [*const u8; R],
    xp: [*const u8; N],
    ahead: usize,
}

impl<const R: usize, const N: usize> Step<R, N> {
    /// Block `J` (a constant, so that its shifts and offsets are) of every (row, token): the
    /// quants' bytes times the activations', pairs added (`vpmaddubsw`: at most 2·126·127, or
    /// 2·127·127 for `WIDE` formats' signed values: no saturation), times the halves' scales and
    /// added in pairs (`vpmaddwd`) into `acc`; with either VNNI, one `vpdpwssd` for the last two
    /// steps.
    ///
    /// # Safety
    /// As for `q8k_tile`, with the features of `ISA`; `J < 8`.
    #[inline(always)]
    unsafe fn block<K: KBytes, const J: usize, const ISA: u8>(
        &self,
        f: &[Factors; R],
        acc: &mut [[__m256i; N]; R],
    ) {
        // SAFETY: as the caller guarantees.
        unsafe {
            let mut q = [_mm256_setzero_si256(); R];
            let mut magnitude = [_mm256_setzero_si256(); R];
            let mut sc = [_mm256_setzero_si256(); R];
            for r in 0..R {
                // One cache line per block (a super-block is at most four) of the same
                // super-block whole tiles on (`PREFETCH_AHEAD`): the tiles' rows are usually one
                // run of memory, which a distance not a multiple of the tile would land inside.
                // Into L2: 1.1B Q4_K_M and Q6_K decoded 11% faster so on an Intel host.
                if 64 * J < K::BYTES {
                    let ahead = self.wp[r].wrapping_add(self.ahead + 64 * J);
                    _mm_prefetch::<_MM_HINT_T1>(ahead as *const i8);
                }
                if K::WIDE {
                    // The signed values (see `KBlock::WIDE`).
                    q[r] = K::signed_bytes(self.wp[r], J);
                    magnitude[r] = _mm256_abs_epi8(q[r]);
                } else {
                    q[r] = K::bytes(self.wp[r], J);
                }
                sc[r] = block_scales(f[r].by_block, J);
            }
            for (t, xp) in self.xp.iter().enumerate() {
                let x = _mm256_loadu_si256(xp.add(BlockQ8K::QUANTS + 32 * J) as *const __m256i);
                for r in 0..R {
                    let pairs = if K::WIDE {
                        _mm256_maddubs_epi16(magnitude[r], _mm256_sign_epi8(x, q[r]))
                    } else {
                        _mm256_maddubs_epi16(q[r], x)
                    };
                    acc[r][t] = match ISA {
                        AVX512_VNNI | AVX_VNNI => dpwssd::<ISA>(acc[r][t], pairs, sc[r]),
                        _ => _mm256_add_epi32(acc[r][t], _mm256_madd_epi16(pairs, sc[r])),
                    };
                }
            }
        }
    }
}

// The activations' sums are one vector of 16 `i16`.
const _: () = assert!(SUM_SPAN * 16 == crate::quant::k_quants::QK_K);

/// # Safety
/// As for `q8k_tile`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8k_avx2<K: KBytes, const R: usize, const N: usize>(
    ns: usize,
    w: [*const u8; R],
    xs: [*const u8; N],
) -> [[f32; N]; R] {
    // SAFETY: as the caller guarantees for this function.
    unsafe { q8k_tile::<K, R, N, AVX2>(ns, w, xs) }
}

/// # Safety
/// As for `q8k_tile`, and AVX-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn q8k_vnni<K: KBytes, const R: usize, const N: usize>(
    ns: usize,
    w: [*const u8; R],
    xs: [*const u8; N],
) -> [[f32; N]; R] {
    // SAFETY: as the caller guarantees for this function.
    unsafe { q8k_tile::<K, R, N, AVX_VNNI>(ns, w, xs) }
}

/// # Safety
/// As for `q8k_tile`, and AVX-512 F/BW/VL with VNNI (32 vector registers: no spills).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q8k_avx512<K: KBytes, const R: usize, const N: usize>(
    ns: usize,
    w: [*const u8; R],
    xs: [*const u8; N],
) -> [[f32; N]; R] {
    // SAFETY: as the caller guarantees for this function.
    unsafe { q8k_tile::<K, R, N, AVX512_VNNI>(ns, w, xs) }
}
