//! Attention's weighted sum over a Q8_0 V cache.
use super::*;

/// Up to four rows at a time, in 512-bit vectors with AVX-512 (the same multiply-adds per value,
/// in the same order, so the same bits).
pub(super) fn axpy_q8_0<const ISA: u8>(out: &mut [f32], a: &[f32], rows: &[&[u8]]) {
    // SAFETY: CPU features as above (AVX-512 only in its table); the kernels stay within the
    // whole blocks and runs they have.
    unsafe {
        match rows {
            [r0] => axpy_rows::<1, ISA>(out, a, [r0]),
            [r0, r1] => axpy_rows::<2, ISA>(out, a, [r0, r1]),
            [r0, r1, r2] => axpy_rows::<3, ISA>(out, a, [r0, r1, r2]),
            [r0, r1, r2, r3, ..] => axpy_rows::<4, ISA>(out, a, [r0, r1, r2, r3]),
            [] => {}
        }
    }
}

/// # Safety
/// The CPU features of `ISA`.
pub(super) unsafe fn axpy_rows<const K: usize, const ISA: u8>(
    out: &mut [f32],
    a: &[f32],
    rows: [&[u8]; K],
) {
    // SAFETY: as the caller guarantees.
    unsafe {
        if ISA == AVX512_VNNI {
            axpy_q8_0_avx512::<K>(out, a, rows)
        } else {
            axpy_q8_0_avx2::<K>(out, a, rows)
        }
    }
}

/// # Safety
/// The CPU has the features enabled here. Every row holds whole Q8_0 blocks; the kernel
/// reads `min(out.len() / runs, row values)` values of each, with `runs = a.len() / K`, and
/// stays within `out`, `a` and the rows whatever their lengths.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn axpy_q8_0_avx512<const K: usize>(
    out: &mut [f32],
    a: &[f32],
    rows: [&[u8]; K],
) {
    let nb = super::super::q8_0_blocks(&rows);
    let n = nb * QK;
    if n == 0 {
        return;
    }
    let runs = (a.len() / K).min(out.len() / n);
    for b in 0..nb {
        // SAFETY: block `b` < nb lies inside every row (34 bytes), and in each of the `runs`
        // runs of `out` (32 floats at `i * n + b * 32`); `a` holds `runs · K` values.
        unsafe {
            // v[c][k]: values 16c..16c+16 of row k's block, widened.
            let mut d = [0f32; K];
            let mut v = [[_mm512_setzero_ps(); K]; 2];
            for (k, dk) in d.iter_mut().enumerate() {
                let rp = rows[k].as_ptr().add(b * BlockQ8_0::BYTES);
                *dk = f16_at(rp);
                for (c, vc) in v.iter_mut().enumerate() {
                    let q = _mm_loadu_si128(rp.add(2 + 16 * c) as *const __m128i);
                    vc[k] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
                }
            }
            for i in 0..runs {
                let mut ad = [_mm512_setzero_ps(); K];
                for (k, adk) in ad.iter_mut().enumerate() {
                    *adk = _mm512_set1_ps(*a.get_unchecked(i * K + k) * d[k]);
                }
                let op = out.as_mut_ptr().add(i * n + b * QK);
                for (c, vc) in v.iter().enumerate() {
                    let mut o = _mm512_loadu_ps(op.add(16 * c));
                    for (adk, vck) in ad.iter().zip(vc) {
                        o = _mm512_fmadd_ps(*adk, *vck, o);
                    }
                    _mm512_storeu_ps(op.add(16 * c), o);
                }
            }
        }
    }
}

/// `K` rows at a time, so that their widened blocks stay in registers.
///
/// # Safety
/// As for `axpy_q8_0_avx512`, with the features enabled here.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn axpy_q8_0_avx2<const K: usize>(out: &mut [f32], a: &[f32], rows: [&[u8]; K]) {
    let nb = super::super::q8_0_blocks(&rows);
    let n = nb * QK;
    if n == 0 {
        return;
    }
    let runs = (a.len() / K).min(out.len() / n);
    for b in 0..nb {
        // SAFETY: block `b` < nb lies inside every row (34 bytes), and in each of the `runs`
        // runs of `out` (32 floats at `i * n + b * 32`); `a` holds `runs · K` values.
        unsafe {
            // v[c][k]: values 8c..8c+8 of row k's block, widened.
            let mut d = [0f32; K];
            let mut v = [[_mm256_setzero_ps(); K]; 4];
            for (k, dk) in d.iter_mut().enumerate() {
                let rp = rows[k].as_ptr().add(b * BlockQ8_0::BYTES);
                *dk = f16_at(rp);
                for (c, vc) in v.iter_mut().enumerate() {
                    let q = _mm_loadl_epi64(rp.add(2 + 8 * c) as *const __m128i);
                    vc[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                }
            }
            for i in 0..runs {
                let mut ad = [_mm256_setzero_ps(); K];
                for (k, adk) in ad.iter_mut().enumerate() {
                    *adk = _mm256_set1_ps(*a.get_unchecked(i * K + k) * d[k]);
                }
                let op = out.as_mut_ptr().add(i * n + b * QK);
                for (c, vc) in v.iter().enumerate() {
                    let mut o = _mm256_loadu_ps(op.add(8 * c));
                    for (adk, vck) in ad.iter().zip(vc) {
                        o = _mm256_fmadd_ps(*adk, *vck, o);
                    }
                    _mm256_storeu_ps(op.add(8 * c), o);
                }
            }
        }
    }
}
