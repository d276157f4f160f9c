//! The quantizers (activations to Q16, the KV cache's rows to Q8_0) and the one-row quantized
//! dots.
use super::*;

pub(super) fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    // SAFETY: this table is used only when `available()` reported AVX2, FMA and F16C.
    unsafe { quantize_q8_0_avx2(x, out) }
}

pub(super) fn quantize_q16(x: &[f32], out: &mut [u8]) {
    // SAFETY: as above.
    unsafe { quantize_q16_avx2(x, out) }
}

pub(super) fn quantize_q8k(x: &[f32], out: &mut [u8]) {
    // SAFETY: as above.
    unsafe { quantize_q8k_avx2(x, out) }
}

/// R weight rows in format `W` against N rows of Q16 activations.
pub(super) fn dot<W: Unpack, const R: usize, const N: usize, const ISA: u8>(
    w: [&[u8]; R],
    xs: [&[u8]; N],
) -> [[f32; N]; R] {
    let nb = w
        .iter()
        .fold(usize::MAX, |n, w| n.min(blocks::<W>(w.len())));
    let nb = xs.iter().fold(nb, |n, x| n.min(x.len() / BlockQ16::BYTES));
    // SAFETY: `Kernels::best` hands out each table only when its `*_available()` said yes; `nb`
    // whole blocks lie inside every slice.
    unsafe {
        match ISA {
            AVX512_VNNI => tile_avx512::<W, R, N>(nb, w, xs),
            AVX_VNNI => tile_vnni::<W, R, N>(nb, w, xs),
            _ => tile_avx2::<W, R, N>(nb, w, xs),
        }
    }
}

/// The largest |x| of a block, NaN ignored (`max` keeps its second operand when the first is NaN,
/// as the scalar fold does).
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX).
#[inline(always)]
pub(super) unsafe fn block_amax(v: [__m256; 4]) -> f32 {
    // SAFETY: register-only arithmetic; the caller has AVX.
    unsafe {
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_setzero_ps();
        for vi in v {
            m = _mm256_max_ps(_mm256_andnot_ps(sign, vi), m);
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        _mm_cvtss_f32(m4)
    }
}

/// The sum of the eight lanes.
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX2).
#[inline(always)]
pub(super) unsafe fn hsum_epi32(v: __m256i) -> i32 {
    // SAFETY: register-only; the caller has AVX2.
    unsafe {
        let t4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0b01_00_11_10));
        let t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0b10_11_00_01));
        _mm_cvtsi128_si32(t4)
    }
}

/// # Safety
/// The CPU has AVX2, FMA and F16C. Any lengths: it quantizes the whole blocks both slices hold.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_q16_avx2(x: &[f32], out: &mut [u8]) {
    let nb = (x.len() / QK).min(out.len() / BlockQ16::BYTES);
    for b in 0..nb {
        // SAFETY: block `b` < nb lies inside `x` (32 floats) and `out` (72 bytes).
        unsafe {
            let p = x.as_ptr().add(b * QK);
            let v: [__m256; 4] = core::array::from_fn(|i| _mm256_loadu_ps(p.add(8 * i)));
            let d = block_amax(v) / BlockQ16::MAX;
            let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
            let (lo, hi) = (
                _mm256_set1_ps(-BlockQ16::MAX),
                _mm256_set1_ps(BlockQ16::MAX),
            );
            let mut ints = [_mm256_setzero_si256(); 4];
            for i in 0..4 {
                let s = _mm256_mul_ps(v[i], id);
                // NaN to 0, then clamp; the conversion rounds to nearest even like `rintf`.
                let s = _mm256_and_ps(s, _mm256_cmp_ps(s, s, _CMP_ORD_Q));
                ints[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(s, lo), hi));
            }
            let sum = _mm256_add_epi32(
                _mm256_add_epi32(ints[0], ints[1]),
                _mm256_add_epi32(ints[2], ints[3]),
            );
            // packs interleaves the 128-bit lanes of its operands; the permute restores order.
            let q01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(ints[0], ints[1]), 0b11_01_10_00);
            let q23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(ints[2], ints[3]), 0b11_01_10_00);
            let o = out.as_mut_ptr().add(b * BlockQ16::BYTES);
            (o as *mut f32).write_unaligned(d);
            (o.add(4) as *mut f32).write_unaligned(d * hsum_epi32(sum) as f32);
            _mm256_storeu_si256(o.add(8) as *mut __m256i, q01);
            _mm256_storeu_si256(o.add(40) as *mut __m256i, q23);
        }
    }
}

/// # Safety
/// The CPU has AVX2, FMA and F16C. Any lengths: it quantizes the whole blocks both slices hold.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_q8_0_avx2(x: &[f32], out: &mut [u8]) {
    let nb = (x.len() / QK).min(out.len() / BlockQ8_0::BYTES);
    let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for b in 0..nb {
        // SAFETY: block `b` < nb lies inside `x` (32 floats) and `out` (34 bytes).
        unsafe {
            let p = x.as_ptr().add(b * QK);
            let v: [__m256; 4] = core::array::from_fn(|i| _mm256_loadu_ps(p.add(8 * i)));
            let amax = block_amax(v);

            let d = amax / 127.0;
            let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
            let mut ints = [_mm256_setzero_si256(); 4];
            for (q, vi) in ints.iter_mut().zip(v) {
                *q = _mm256_cvtps_epi32(round_q8(_mm256_mul_ps(vi, id)));
            }
            let i01 = _mm256_packs_epi32(ints[0], ints[1]);
            let i23 = _mm256_packs_epi32(ints[2], ints[3]);
            let q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(i01, i23), perm);

            let o = out.as_mut_ptr().add(b * BlockQ8_0::BYTES);
            let dh = _mm_cvtps_ph(_mm_set_ss(d), _MM_FROUND_TO_NEAREST_INT);
            (o as *mut u16).write_unaligned(_mm_extract_epi16(dh, 0) as u16);
            _mm256_storeu_si256(o.add(2) as *mut __m256i, q);
        }
    }
}

/// # Safety
/// The CPU has AVX2, FMA and F16C. Any lengths: it quantizes the whole blocks both slices hold.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_q8k_avx2(x: &[f32], out: &mut [u8]) {
    let nb = (x.len() / QK_K).min(out.len() / BlockQ8K::BYTES);
    let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for b in 0..nb {
        // SAFETY: block `b` < nb lies inside `x` (256 floats) and `out` (292 bytes).
        unsafe {
            let p = x.as_ptr().add(b * QK_K);
            let mut amax = 0f32;
            for g in 0..QK_K / QK {
                let v: [__m256; 4] =
                    core::array::from_fn(|i| _mm256_loadu_ps(p.add(QK * g + 8 * i)));
                amax = amax.max(block_amax(v));
            }
            let d = amax / 127.0;
            let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
            let o = out.as_mut_ptr().add(b * BlockQ8K::BYTES);
            (o as *mut f32).write_unaligned(d);
            let sums = o.add(BlockQ8K::SUMS) as *mut i16;
            for g in 0..QK_K / QK {
                let mut ints = [_mm256_setzero_si256(); 4];
                for (i, q) in ints.iter_mut().enumerate() {
                    let v = _mm256_loadu_ps(p.add(QK * g + 8 * i));
                    *q = _mm256_cvtps_epi32(round_q8(_mm256_mul_ps(v, id)));
                }
                let i01 = _mm256_packs_epi32(ints[0], ints[1]);
                let i23 = _mm256_packs_epi32(ints[2], ints[3]);
                let q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(i01, i23), perm);
                _mm256_storeu_si256(o.add(BlockQ8K::QUANTS + QK * g) as *mut __m256i, q);
                let lo = hsum_epi32(_mm256_add_epi32(ints[0], ints[1]));
                let hi = hsum_epi32(_mm256_add_epi32(ints[2], ints[3]));
                sums.add(2 * g).write_unaligned(lo as i16);
                sums.add(2 * g + 1).write_unaligned(hi as i16);
            }
        }
    }
}

/// Rounds half away from zero (C's `roundf`), maps NaN to 0 and clamps to ±127, exactly as the
/// scalar quantizer does: truncate, then step away from zero where the dropped part is >= 0.5.
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX).
#[inline(always)]
pub(super) unsafe fn round_q8(v: __m256) -> __m256 {
    // SAFETY: register-only arithmetic; the caller has AVX.
    unsafe {
        let t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        let frac = _mm256_andnot_ps(_mm256_set1_ps(-0.0), _mm256_sub_ps(v, t));
        let away = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5), _CMP_GE_OQ);
        let one = _mm256_or_ps(_mm256_and_ps(v, _mm256_set1_ps(-0.0)), _mm256_set1_ps(1.0));
        let r = _mm256_add_ps(t, _mm256_and_ps(away, one));
        let r = _mm256_and_ps(r, _mm256_cmp_ps(r, r, _CMP_ORD_Q));
        _mm256_min_ps(
            _mm256_max_ps(r, _mm256_set1_ps(-127.0)),
            _mm256_set1_ps(127.0),
        )
    }
}

// The one-row quantized dots (the table's `one`, `x4`, `rows4`, `rows2x4`; mat-muls and
// attention use the panel kernels further down): R weight rows against N activation rows, one
// accumulator per (row, token), blocks added in order. Every tile shape therefore gives a
// (row, token) pair the same sum. Independent FMA chains, which hide the FMA's four-cycle
// latency, come from several rows and tokens per tile.

/// How far ahead of the block in use the weight stream is prefetched, in bytes. A single core's
/// hardware prefetcher does not keep up with one weight stream on its own: measured on SmolLM2
/// Q8_0 decode (2 threads), no prefetch gave 67 tokens/s, 512 bytes 76, 2048 to 8192 bytes 95-104.
pub(super) const PREFETCH: usize = 4096;

/// # Safety
/// The CPU has AVX2, FMA, F16C and the features of `ISA`; `nb` whole blocks of format `W` lie
/// inside every `w[r]` and `nb` Q16 blocks inside every `xs[t]`.
#[inline(always)]
pub(super) unsafe fn tile<W: Unpack, const R: usize, const N: usize, const ISA: u8>(
    nb: usize,
    w: [&[u8]; R],
    xs: [&[u8]; N],
) -> [[f32; N]; R] {
    // SAFETY: the caller guarantees `nb` whole blocks in every slice, AVX2/FMA/F16C, and the
    // features of `ISA`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); N]; R];
        for b in 0..nb {
            let mut dw = [_mm256_setzero_ps(); R];
            let mut mw = [_mm256_setzero_ps(); R];
            let mut qw = [(_mm256_setzero_si256(), _mm256_setzero_si256()); R];
            for r in 0..R {
                let wp = block_at::<W>(w[r].as_ptr(), b);
                _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH) as *const i8);
                (dw[r], mw[r]) = W::scales(wp);
                qw[r] = W::unpack(wp);
            }
            for t in 0..N {
                let xp = xs[t].as_ptr().add(b * BlockQ16::BYTES);
                let dx = _mm256_set1_ps((xp as *const f32).read_unaligned());
                // The minimum's term m·s is spread over the eight lanes, s/8 each (exact), so
                // that it stays a vector FMA.
                let s8 = _mm256_set1_ps((xp.add(4) as *const f32).read_unaligned() * 0.125);
                let x0 = _mm256_loadu_si256(xp.add(8) as *const __m256i);
                let x1 = _mm256_loadu_si256(xp.add(40) as *const __m256i);
                for r in 0..R {
                    let dot = block_dot::<ISA>(qw[r].0, qw[r].1, x0, x1);
                    // (Σ·dx)·dw: both scales stay vectors; dw·dx first would be a scalar
                    // multiply and a broadcast per (row, token).
                    let scaled = _mm256_mul_ps(_mm256_cvtepi32_ps(dot), dx);
                    acc[r][t] = _mm256_fmadd_ps(scaled, dw[r], acc[r][t]);
                    if W::HAS_MIN {
                        acc[r][t] = _mm256_fmadd_ps(mw[r], s8, acc[r][t]);
                    }
                }
            }
        }
        let mut out = [[0f32; N]; R];
        for r in 0..R {
            out[r] = hsums(acc[r]);
        }
        out
    }
}

/// # Safety
/// As for `tile`, with the features enabled here.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile_avx2<W: Unpack, const R: usize, const N: usize>(
    nb: usize,
    w: [&[u8]; R],
    xs: [&[u8]; N],
) -> [[f32; N]; R] {
    // SAFETY: as the caller guarantees for this function.
    unsafe { tile::<W, R, N, AVX2>(nb, w, xs) }
}

/// # Safety
/// As for `tile`, with the features enabled here.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn tile_vnni<W: Unpack, const R: usize, const N: usize>(
    nb: usize,
    w: [&[u8]; R],
    xs: [&[u8]; N],
) -> [[f32; N]; R] {
    // SAFETY: as the caller guarantees for this function.
    unsafe { tile::<W, R, N, AVX_VNNI>(nb, w, xs) }
}

/// # Safety
/// As for `tile`, with the features enabled here.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn tile_avx512<W: Unpack, const R: usize, const N: usize>(
    nb: usize,
    w: [&[u8]; R],
    xs: [&[u8]; N],
) -> [[f32; N]; R] {
    // SAFETY: as the caller guarantees for this function.
    unsafe { tile::<W, R, N, AVX512_VNNI>(nb, w, xs) }
}
