//! How each weight format's blocks become 32 `i16` quants and their scales (the `Unpack` trait
//! and one impl per format), and the bit-twiddling helpers the formats share.
use super::*;

/// A weight block's 32 quants as two vectors of 16 `i16` (values 0..16, 16..32). Blocks are
/// stored in units of `BYTES` bytes: one block, or a k-quant super-block of `UNIT` blocks, where
/// `j` says which.
pub(super) trait Unpack {
    const BYTES: usize;
    /// Blocks of 32 values per unit.
    const UNIT: usize = 1;
    /// Whether the block has a minimum whose term `m·(dx·Σq)` is added.
    const HAS_MIN: bool = false;
    /// Whether the "minimum" is the scale of the block's second half instead (Q3_K, Q2_K), whose
    /// halves are summed and scaled apart.
    const HALF_SCALES: bool = false;
    /// Whether each half also has a minimum (Q2_K, with `HALF_SCALES`), whose terms
    /// `min·(dx·Σ_half q)` are added after the halves' sums.
    const HALF_MINS: bool = false;
    /// The quants of block `j` of the unit at `p`.
    ///
    /// # Safety
    /// `BYTES` readable bytes at `p`, `j < UNIT`; the caller has AVX2.
    unsafe fn unpack(p: *const u8, j: usize) -> (__m256i, __m256i);

    /// The scale and the minimum (zero without one) of block `j` of the unit at `p`, broadcast:
    /// by default an f16 scale first and, with a minimum, an f16 minimum right after it.
    ///
    /// # Safety
    /// As for `unpack`, and F16C.
    #[inline(always)]
    unsafe fn scales(p: *const u8, _j: usize) -> (__m256, __m256) {
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
    /// Single-block units only: a kernel reads a k-quant's scales with `unit_scales`.
    ///
    /// # Safety
    /// As for `scales`, at every `p[i]`.
    #[inline(always)]
    unsafe fn scales8(p: [*const u8; 8], _j: usize) -> (__m256, __m256) {
        debug_assert_eq!(Self::UNIT, 1);
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

    /// The scales and minimums of the `UNIT` blocks of the k-quant super-block at `p`, block `j`
    /// in lane `j`.
    ///
    /// # Safety
    /// `BYTES` readable bytes at `p`; AVX2 and F16C.
    #[inline(always)]
    unsafe fn unit_scales(_p: *const u8) -> (__m256, __m256) {
        unreachable!("single-block formats have no super-blocks")
    }

    /// The half minimums of block `j` of the unit at `p`, broadcast (`HALF_MINS` only).
    ///
    /// # Safety
    /// As for `scales`.
    #[inline(always)]
    unsafe fn mins(_p: *const u8, _j: usize) -> (__m256, __m256) {
        unreachable!("only formats with half minimums have them")
    }

    /// The half minimums of the `UNIT` blocks of the super-block at `p`, block `j` in lane `j`:
    /// low halves, high halves (`HALF_MINS` only).
    ///
    /// # Safety
    /// As for `unit_scales`.
    #[inline(always)]
    unsafe fn unit_mins(_p: *const u8) -> (__m256, __m256) {
        unreachable!("only formats with half minimums have them")
    }
}

/// The scales of a k-quant super-block's eight blocks for each row of a panel, read once per
/// super-block (`Unpack::unit_scales`) instead of once per block: `d[j][r]`, `m[j][r]`, and with
/// half minimums `min_lo[j][r]`, `min_hi[j][r]`.
pub(super) struct UnitScales {
    d: [[f32; PANEL]; BLOCKS_PER_SUPER],
    m: [[f32; PANEL]; BLOCKS_PER_SUPER],
    min_lo: [[f32; PANEL]; BLOCKS_PER_SUPER],
    min_hi: [[f32; PANEL]; BLOCKS_PER_SUPER],
}

impl UnitScales {
    #[inline(always)]
    pub(super) fn new() -> Self {
        UnitScales {
            d: [[0.0; PANEL]; BLOCKS_PER_SUPER],
            m: [[0.0; PANEL]; BLOCKS_PER_SUPER],
            min_lo: [[0.0; PANEL]; BLOCKS_PER_SUPER],
            min_hi: [[0.0; PANEL]; BLOCKS_PER_SUPER],
        }
    }

    /// Reads the super-blocks at `units` (a null pointer: a padding row, scales zero): each
    /// row's eight blocks come as one vector, and eight rows' vectors are transposed into the
    /// block-major table.
    ///
    /// # Safety
    /// `W::BYTES` readable bytes at every non-null `units[r]`; AVX2 and F16C.
    #[inline(always)]
    pub(super) unsafe fn read<W: Unpack>(&mut self, units: [*const u8; PANEL]) {
        // SAFETY: reads of the super-blocks as the caller guarantees; register-only transposes;
        // stores of eight floats inside the tables (h < PANEL / 8); the caller has AVX2.
        unsafe {
            for h in 0..PANEL / 8 {
                let mut d = [_mm256_setzero_si256(); 8];
                let mut m = [_mm256_setzero_si256(); 8];
                let mut min_lo = [_mm256_setzero_si256(); 8];
                let mut min_hi = [_mm256_setzero_si256(); 8];
                for r in 0..8 {
                    let p = units[8 * h + r];
                    if !p.is_null() {
                        let (dr, mr) = W::unit_scales(p);
                        (d[r], m[r]) = (_mm256_castps_si256(dr), _mm256_castps_si256(mr));
                        if W::HALF_MINS {
                            let (lo, hi) = W::unit_mins(p);
                            min_lo[r] = _mm256_castps_si256(lo);
                            min_hi[r] = _mm256_castps_si256(hi);
                        }
                    }
                }
                let (d, m) = (transpose8(d), transpose8(m));
                for j in 0..BLOCKS_PER_SUPER {
                    _mm256_storeu_si256(self.d[j][8 * h..].as_mut_ptr() as *mut __m256i, d[j]);
                    _mm256_storeu_si256(self.m[j][8 * h..].as_mut_ptr() as *mut __m256i, m[j]);
                }
                if W::HALF_MINS {
                    let (lo, hi) = (transpose8(min_lo), transpose8(min_hi));
                    for j in 0..BLOCKS_PER_SUPER {
                        let at = |t: &mut [[f32; PANEL]; BLOCKS_PER_SUPER]| {
                            t[j][8 * h..].as_mut_ptr() as *mut __m256i
                        };
                        _mm256_storeu_si256(at(&mut self.min_lo), lo[j]);
                        _mm256_storeu_si256(at(&mut self.min_hi), hi[j]);
                    }
                }
            }
        }
    }

    /// Block `j`'s scale and minimum of row `r`.
    #[inline(always)]
    pub(super) fn one(&self, j: usize, r: usize) -> (f32, f32) {
        (self.d[j][r], self.m[j][r])
    }

    /// Block `j`'s half minimums of row `r`.
    #[inline(always)]
    pub(super) fn mins_one(&self, j: usize, r: usize) -> (f32, f32) {
        (self.min_lo[j][r], self.min_hi[j][r])
    }

    /// Block `j`'s half minimums of rows `8h .. 8h + 8`, one per lane.
    ///
    /// # Safety
    /// As for `eight`.
    #[inline(always)]
    pub(super) unsafe fn mins_eight(&self, j: usize, h: usize) -> (__m256, __m256) {
        // SAFETY: loads of eight floats inside the arrays (h < PANEL / 8); the caller has AVX.
        unsafe {
            (
                _mm256_loadu_ps(self.min_lo[j][8 * h..].as_ptr()),
                _mm256_loadu_ps(self.min_hi[j][8 * h..].as_ptr()),
            )
        }
    }

    /// Block `j`'s scales and minimums of rows `8h .. 8h + 8`, one per lane.
    ///
    /// # Safety
    /// `read` has been called for the unit that holds block `j`; `h < PANEL / 8`; the CPU has AVX.
    #[inline(always)]
    pub(super) unsafe fn eight(&self, j: usize, h: usize) -> (__m256, __m256) {
        // SAFETY: loads of eight floats inside the arrays (h < PANEL / 8); the caller has AVX.
        unsafe {
            (
                _mm256_loadu_ps(self.d[j][8 * h..].as_ptr()),
                _mm256_loadu_ps(self.m[j][8 * h..].as_ptr()),
            )
        }
    }
}

/// Where in its unit block `j` prefetches: each block of a k-quant super-block a cache line
/// further (the last byte once past the end), so that the blocks together cover the super-block;
/// a single-block unit at its start.
#[inline(always)]
pub(super) fn line_in_unit<W: Unpack>(j: usize) -> usize {
    (j * 64).min(W::BYTES - 1)
}

/// Whole blocks in `len` bytes of format `W`.
#[inline(always)]
pub(super) fn blocks<W: Unpack>(len: usize) -> usize {
    len / W::BYTES * W::UNIT
}

/// The unit holding block `b` of the row at `row`, and the block's index in it.
///
/// # Safety
/// Block `b` lies inside the row.
#[inline(always)]
pub(super) unsafe fn unit<W: Unpack>(row: *const u8, b: usize) -> (*const u8, usize) {
    // SAFETY: as the caller guarantees.
    unsafe { (row.add(b / W::UNIT * W::BYTES), b % W::UNIT) }
}

/// `acc + Σ_lo·(d_lo·dx) + Σ_hi·(d_hi·dx)`: a block whose halves have their own scales, low half
/// first (every kernel adds them in this order, so all give the same bits).
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX2 and FMA).
#[inline(always)]
pub(super) unsafe fn half_sums(
    lo: __m256i,
    hi: __m256i,
    d_lo: __m256,
    d_hi: __m256,
    dx: __m256,
    acc: __m256,
) -> __m256 {
    // SAFETY: register-only; the caller has AVX2 and FMA.
    unsafe {
        let acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_mul_ps(d_lo, dx), acc);
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_mul_ps(d_hi, dx), acc)
    }
}

/// `acc + min_lo·s_lo + min_hi·s_hi`: a block's half minimums times the activations' half sums,
/// low half first, after the halves' scaled sums (every kernel adds them in this order).
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX2 and FMA).
#[inline(always)]
pub(super) unsafe fn half_mins(
    min_lo: __m256,
    min_hi: __m256,
    s_lo: __m256,
    s_hi: __m256,
    acc: __m256,
) -> __m256 {
    // SAFETY: register-only; the caller has FMA.
    unsafe { _mm256_fmadd_ps(min_hi, s_hi, _mm256_fmadd_ps(min_lo, s_lo, acc)) }
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
    unsafe fn unpack(p: *const u8, _j: usize) -> (__m256i, __m256i) {
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
    unsafe fn unpack(p: *const u8, _j: usize) -> (__m256i, __m256i) {
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
    unsafe fn unpack(p: *const u8, _j: usize) -> (__m256i, __m256i) {
        // SAFETY: 16 bytes of nibbles follow the scale and the minimum.
        unsafe { nibbles(p.add(4)) }
    }
}

impl Unpack for BlockQ5_0 {
    const BYTES: usize = Self::BYTES;
    #[inline(always)]
    unsafe fn unpack(p: *const u8, _j: usize) -> (__m256i, __m256i) {
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
    unsafe fn unpack(p: *const u8, _j: usize) -> (__m256i, __m256i) {
        // SAFETY: the fifth bits (4 bytes) follow the scale and minimum, the nibbles (16) them.
        unsafe { fives(p.add(4), p.add(8)) }
    }
}

/// What every k-quant's `Unpack` shares: its constants from `KBlock`, and its scales read
/// through `KBlock` with F16C; each format adds only its `unpack`.
macro_rules! k_unit {
    () => {
        const BYTES: usize = <Self as KBlock>::BYTES;
        const UNIT: usize = BLOCKS_PER_SUPER;
        const HAS_MIN: bool = <Self as KBlock>::HAS_MIN;
        const HALF_SCALES: bool = <Self as KBlock>::HALF_SCALES;
        const HALF_MINS: bool = <Self as KBlock>::HALF_MINS;
        #[inline(always)]
        unsafe fn scales(p: *const u8, j: usize) -> (__m256, __m256) {
            // SAFETY: the caller guarantees a whole super-block at `p`.
            unsafe { k_scales::<Self>(p, j) }
        }
        #[inline(always)]
        unsafe fn unit_scales(p: *const u8) -> (__m256, __m256) {
            // SAFETY: the caller guarantees a whole super-block at `p`.
            unsafe { k_unit_scales::<Self>(p) }
        }
        #[inline(always)]
        unsafe fn mins(p: *const u8, j: usize) -> (__m256, __m256) {
            // SAFETY: the caller guarantees a whole super-block at `p`.
            unsafe { k_mins::<Self>(p, j) }
        }
        #[inline(always)]
        unsafe fn unit_mins(p: *const u8) -> (__m256, __m256) {
            // SAFETY: the caller guarantees a whole super-block at `p`.
            unsafe { k_unit_mins::<Self>(p) }
        }
    };
}

impl Unpack for BlockQ2K {
    k_unit!();
    /// Bits `2c, 2c + 1` (c = j % 4) of `qs[32(j / 4)..]`.
    #[inline(always)]
    unsafe fn unpack(p: *const u8, j: usize) -> (__m256i, __m256i) {
        // SAFETY: block j's 32 bytes of quants (at 16 + 32(j / 4)) lie in the super-block.
        unsafe { bits32(p.add(16 + 32 * (j / 4)), 2 * (j % 4), 3) }
    }
}

impl Unpack for BlockQ3K {
    k_unit!();
    /// Bits `2c, 2c + 1` of `qs[32(j / 4)..]` and bit `j` of `hmask` (see `KBlock for BlockQ3K`).
    #[inline(always)]
    unsafe fn unpack(p: *const u8, j: usize) -> (__m256i, __m256i) {
        // SAFETY: `hmask` (32 bytes at 0) and block j's low bits (32 bytes at 32 + 32(j / 4))
        // lie in the super-block.
        unsafe {
            let low = bytes32(p.add(32 + 32 * (j / 4)), 2 * (j % 4), 3);
            let high = bytes32(p, j, 1);
            let q = _mm256_or_si256(low, _mm256_slli_epi16(high, 2));
            widen_i8(_mm256_sub_epi8(q, _mm256_set1_epi8(4)))
        }
    }
}

/// `KBlock::unit_scales` of the super-block at `p`, block `j` in lane `j`: the integer factors
/// widened eight at a time, and the f16s with F16C (the portable conversion costs more than the
/// rest of the scales). The same products as the scalar code, so the same bits.
///
/// # Safety
/// `K::BYTES` readable bytes at `p`; AVX2 and F16C.
#[inline(always)]
pub(super) unsafe fn k_unit_scales<K: KBlock>(p: *const u8) -> (__m256, __m256) {
    let (d_at, dmin_at) = K::F16_AT;
    // SAFETY: as the caller guarantees; the f16s lie inside the super-block.
    unsafe {
        let (s, m) = K::unit_ints(core::slice::from_raw_parts(p, K::BYTES));
        let d = _mm256_set1_ps(f16_at(p.add(d_at)));
        let dmin = _mm256_set1_ps(f16_at(p.add(dmin_at)));
        let m = _mm256_mul_ps(dmin, widen8(m));
        let m = if K::HAS_MIN {
            _mm256_xor_ps(m, _mm256_set1_ps(-0.0))
        } else {
            m
        };
        (_mm256_mul_ps(d, widen8(s)), m)
    }
}

/// Eight integer factors as floats, one per lane.
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX2).
#[inline(always)]
unsafe fn widen8(b: [i8; BLOCKS_PER_SUPER]) -> __m256 {
    // SAFETY: register-only; the caller has AVX2.
    unsafe {
        let b = _mm_cvtsi64_si128(i64::from_le_bytes(b.map(|b| b as u8)));
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b))
    }
}

/// `KBlock::unit_mins` of the super-block at `p`, block `j` in lane `j`, as `k_unit_scales`
/// reads the scales: the same products as the scalar code, so the same bits.
///
/// # Safety
/// `K::BYTES` readable bytes at `p`; AVX2 and F16C.
#[inline(always)]
pub(super) unsafe fn k_unit_mins<K: KBlock>(p: *const u8) -> (__m256, __m256) {
    // SAFETY: as the caller guarantees; the f16 lies inside the super-block.
    unsafe {
        let (lo, hi) = K::unit_min_ints(core::slice::from_raw_parts(p, K::BYTES));
        let dmin = _mm256_set1_ps(f16_at(p.add(K::MIN_F16_AT)));
        let negate = |v: __m256| _mm256_xor_ps(v, _mm256_set1_ps(-0.0));
        (
            negate(_mm256_mul_ps(dmin, widen8(lo))),
            negate(_mm256_mul_ps(dmin, widen8(hi))),
        )
    }
}

/// Block `j`'s two scales from the super-block at `p` (`KBlock::scales`), broadcast.
///
/// # Safety
/// `K::BYTES` readable bytes at `p`.
#[inline(always)]
pub(super) unsafe fn k_scales<K: KBlock>(p: *const u8, j: usize) -> (__m256, __m256) {
    // SAFETY: as the caller guarantees.
    let (d, m) = K::scales(unsafe { core::slice::from_raw_parts(p, K::BYTES) }, j);
    // SAFETY: register-only; the caller has AVX.
    unsafe { (_mm256_set1_ps(d), _mm256_set1_ps(m)) }
}

/// Block `j`'s two half minimums from the super-block at `p` (`KBlock::mins`), broadcast.
///
/// # Safety
/// `K::BYTES` readable bytes at `p`.
#[inline(always)]
pub(super) unsafe fn k_mins<K: KBlock>(p: *const u8, j: usize) -> (__m256, __m256) {
    // SAFETY: as the caller guarantees.
    let (lo, hi) = K::mins(unsafe { core::slice::from_raw_parts(p, K::BYTES) }, j);
    // SAFETY: register-only; the caller has AVX.
    unsafe { (_mm256_set1_ps(lo), _mm256_set1_ps(hi)) }
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

/// 32 signed bytes as `i16` (values 0..16, 16..32).
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX2).
#[inline(always)]
pub(super) unsafe fn widen_i8(v: __m256i) -> (__m256i, __m256i) {
    // SAFETY: register-only; the caller has AVX2.
    unsafe {
        (
            _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)),
            _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)),
        )
    }
}

/// `(byte >> shift) & mask` of each of the 32 bytes at `p`, as `i16` (values 0..16, 16..32):
/// nibbles, or a k-quant's high bits.
///
/// # Safety
/// 32 readable bytes at `p`; AVX2.
#[inline(always)]
pub(super) unsafe fn bits32(p: *const u8, shift: usize, mask: i16) -> (__m256i, __m256i) {
    // SAFETY: as the caller guarantees.
    unsafe {
        let count = _mm_cvtsi32_si128(shift as i32);
        let mask = _mm256_set1_epi16(mask);
        let v0 = _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i));
        let v1 = _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(16) as *const __m128i));
        (
            _mm256_and_si256(_mm256_srl_epi16(v0, count), mask),
            _mm256_and_si256(_mm256_srl_epi16(v1, count), mask),
        )
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
