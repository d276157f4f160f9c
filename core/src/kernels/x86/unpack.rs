//! How each Q16-side weight format's blocks become 32 `i16` quants and their scales (the
//! `Unpack` trait and one impl per format), and the bit-twiddling helpers the formats share
//! (the k-quants' bytes are in `kquants`).
use super::*;
use crate::quant::iq4_nl::IQ4_VALUES;

/// A weight block's 32 quants as two vectors of 16 `i16` (values 0..16, 16..32).
pub(super) trait Unpack {
    const BYTES: usize;
    /// Whether the block has a minimum whose term `m·(dx·Σq)` is added.
    const HAS_MIN: bool = false;
    /// The quants of the block at `p`.
    ///
    /// # Safety
    /// `BYTES` readable bytes at `p`; the caller has AVX2.
    unsafe fn unpack(p: *const u8) -> (__m256i, __m256i);

    /// The scale and the minimum (zero without one) of the block at `p`, broadcast: an f16
    /// scale first and, with a minimum, an f16 minimum right after it.
    ///
    /// # Safety
    /// As for `unpack`, and F16C.
    #[inline(always)]
    unsafe fn scales(p: *const u8) -> (__m256, __m256) {
        // SAFETY: the block starts with its f16 scale, and with a minimum the f16 minimum.
        unsafe {
            if Self::HAS_MIN {
                scale_min(p)
            } else {
                (_mm256_set1_ps(f16_at(p)), _mm256_setzero_ps())
            }
        }
    }

    /// The scales and the minimums (zeros without) of the blocks at `p[0..8]`, one per lane.
    ///
    /// # Safety
    /// As for `scales`, at every `p[i]`.
    #[inline(always)]
    unsafe fn scales8(p: [*const u8; 8]) -> (__m256, __m256) {
        // SAFETY: each block starts with its f16 scale, and with a minimum the f16 minimum.
        unsafe {
            let m = if Self::HAS_MIN {
                f16s_at(p, 2)
            } else {
                _mm256_setzero_ps()
            };
            (f16s_at(p, 0), m)
        }
    }
}

/// Whole blocks in `len` bytes of format `W`.
#[inline(always)]
pub(super) fn blocks<W: Unpack>(len: usize) -> usize {
    len / W::BYTES
}

/// Block `b` of the row at `row`.
///
/// # Safety
/// Block `b` lies inside the row.
#[inline(always)]
pub(super) unsafe fn block_at<W: Unpack>(row: *const u8, b: usize) -> *const u8 {
    // SAFETY: as the caller guarantees.
    unsafe { row.add(b * W::BYTES) }
}

/// The f16s at byte `offset` of `p[0..8]`, widened, one per lane.
///
/// # Safety
/// Two readable bytes at each `p[i] + offset`; F16C.
#[inline(always)]
pub(super) unsafe fn f16s_at(p: [*const u8; 8], offset: usize) -> __m256 {
    // SAFETY: as the caller guarantees.
    unsafe {
        let h = |i: usize| (p[i].add(offset) as *const i16).read_unaligned();
        _mm256_cvtph_ps(_mm_setr_epi16(
            h(0),
            h(1),
            h(2),
            h(3),
            h(4),
            h(5),
            h(6),
            h(7),
        ))
    }
}

impl Unpack for BlockQ8_0 {
    const BYTES: usize = Self::BYTES;
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> (__m256i, __m256i) {
        // SAFETY: 32 quants follow the 2-byte scale.
        unsafe {
            (
                _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(2) as *const __m128i)),
                _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(18) as *const __m128i)),
            )
        }
    }
}

impl Unpack for BlockQ4_0 {
    const BYTES: usize = Self::BYTES;
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> (__m256i, __m256i) {
        // SAFETY: 16 bytes of nibbles follow the 2-byte scale.
        unsafe {
            let (lo, hi) = nibbles(p.add(2));
            let eight = _mm256_set1_epi16(8);
            (_mm256_sub_epi16(lo, eight), _mm256_sub_epi16(hi, eight))
        }
    }
}

impl Unpack for BlockQ4_1 {
    const BYTES: usize = Self::BYTES;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> (__m256i, __m256i) {
        // SAFETY: 16 bytes of nibbles follow the scale and the minimum.
        unsafe { nibbles(p.add(4)) }
    }
}

impl Unpack for BlockQ5_0 {
    const BYTES: usize = Self::BYTES;
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> (__m256i, __m256i) {
        // SAFETY: the fifth bits (4 bytes) follow the 2-byte scale, the nibbles (16) them.
        unsafe {
            let (lo, hi) = fives(p.add(2), p.add(6));
            let sixteen = _mm256_set1_epi16(16);
            (_mm256_sub_epi16(lo, sixteen), _mm256_sub_epi16(hi, sixteen))
        }
    }
}

impl Unpack for BlockQ5_1 {
    const BYTES: usize = Self::BYTES;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> (__m256i, __m256i) {
        // SAFETY: the fifth bits (4 bytes) follow the scale and minimum, the nibbles (16) them.
        unsafe { fives(p.add(4), p.add(8)) }
    }
}

impl Unpack for BlockIQ4NL {
    const BYTES: usize = Self::BYTES;
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> (__m256i, __m256i) {
        // SAFETY: 16 bytes of nibbles follow the 2-byte scale; the grid is 16 bytes.
        unsafe {
            let grid = _mm_loadu_si128(IQ4_VALUES.as_ptr() as *const __m128i);
            let v = _mm_loadu_si128(p.add(2) as *const __m128i);
            let low4 = _mm_set1_epi8(0x0f);
            let lo = _mm_shuffle_epi8(grid, _mm_and_si128(v, low4));
            let hi = _mm_shuffle_epi8(grid, _mm_and_si128(_mm_srli_epi16(v, 4), low4));
            (_mm256_cvtepi8_epi16(lo), _mm256_cvtepi8_epi16(hi))
        }
    }
}

/// The scale and the minimum, two f16s at `p`, broadcast: one conversion.
///
/// # Safety
/// Four readable bytes at `p`; AVX2 and F16C.
#[inline(always)]
pub(super) unsafe fn scale_min(p: *const u8) -> (__m256, __m256) {
    // SAFETY: as the caller guarantees.
    unsafe {
        let bits = (p as *const i32).read_unaligned();
        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
        (
            _mm256_broadcastss_ps(dm),
            _mm256_broadcastss_ps(_mm_movehdup_ps(dm)),
        )
    }
}

/// The five-bit quants of a Q5 block whose fifth bits (a little-endian u32) are at `qh` and
/// nibbles at `qs`, as `i16` (values 0..16, 16..32): bit `j` of `qh` tested in lane `j % 16` of
/// the half that holds element `j`.
///
/// # Safety
/// Four readable bytes at `qh`, sixteen at `qs`; AVX2.
#[inline(always)]
pub(super) unsafe fn fives(qh: *const u8, qs: *const u8) -> (__m256i, __m256i) {
    // SAFETY: as the caller guarantees.
    unsafe {
        let (lo, hi) = nibbles(qs);
        let bits = (qh as *const u32).read_unaligned();
        let lanes = _mm256_setr_epi16(
            1,
            2,
            4,
            8,
            16,
            32,
            64,
            128,
            256,
            512,
            1024,
            2048,
            4096,
            8192,
            16384,
            i16::MIN,
        );
        let sixteen = _mm256_set1_epi16(16);
        let bits_lo = _mm256_and_si256(_mm256_set1_epi16(bits as u16 as i16), lanes);
        let bits_hi = _mm256_and_si256(_mm256_set1_epi16((bits >> 16) as u16 as i16), lanes);
        let fifth_lo = _mm256_and_si256(_mm256_cmpeq_epi16(bits_lo, lanes), sixteen);
        let fifth_hi = _mm256_and_si256(_mm256_cmpeq_epi16(bits_hi, lanes), sixteen);
        (_mm256_or_si256(lo, fifth_lo), _mm256_or_si256(hi, fifth_hi))
    }
}

/// The low nibbles of 16 bytes (values 0..16) and their high nibbles (16..32), as `i16`.
///
/// # Safety
/// 16 readable bytes at `p`; the CPU has AVX2.
#[inline(always)]
pub(super) unsafe fn nibbles(p: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller guarantees 16 readable bytes at `p` and AVX2.
    unsafe {
        let v = _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i));
        (
            _mm256_and_si256(v, _mm256_set1_epi16(0x0f)),
            _mm256_srli_epi16(v, 4),
        )
    }
}
