//! f32 and f16 weight dots, and the element-wise kernels compiled for AVX2.
use super::*;

pub(super) fn silu_mul(gate: &mut [f32], up: &[f32]) {
    // SAFETY: CPU features as above.
    unsafe { silu_mul_avx2(gate, up) }
}

pub(super) fn exp_sub(x: &mut [f32], m: f32) -> f32 {
    // SAFETY: CPU features as above.
    unsafe { exp_sub_avx2(x, m) }
}

/// The portable loop, vectorized eight wide instead of baseline x86-64's four.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) {
    crate::ops::silu_mul(gate, up)
}

/// The portable loop, vectorized eight wide instead of baseline x86-64's four.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn exp_sub_avx2(x: &mut [f32], m: f32) -> f32 {
    crate::ops::exp_sub(x, m)
}

pub(super) fn dot_f16<const N: usize>(w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
    let n = xs.iter().fold(w.len() / 2, |n, x| n.min(x.len()));
    // SAFETY: CPU features as above; `n` values lie inside `w` (as bytes) and every `xs[i]`.
    unsafe { dot_f16_avx2(n, w, xs) }
}

pub(super) fn dot_f32<const N: usize>(w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
    let n = xs.iter().fold(w.len() / 4, |n, x| n.min(x.len()));
    // SAFETY: CPU features as above; `n` values lie inside `w` (as bytes) and every `xs[i]`.
    unsafe { dot_f32_avx2(n, w, xs) }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_f32_avx2<const N: usize>(n: usize, w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: values i..i+8 lie inside `w` (as bytes) and every `xs[k]`, since i + 8 <= n.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().wrapping_add(i * 4 + PREFETCH) as *const i8);
            let wv = _mm256_loadu_ps(w.as_ptr().add(i * 4) as *const f32);
            for (a, x) in acc.iter_mut().zip(&xs) {
                *a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.as_ptr().add(i)), *a);
            }
        }
        i += 8;
    }
    // SAFETY: register-only.
    let mut out = unsafe { hsums(acc) };
    for j in i..n {
        let b = &w[j * 4..j * 4 + 4];
        let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        for (o, x) in out.iter_mut().zip(&xs) {
            *o += v * x[j];
        }
    }
    out
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_f16_avx2<const N: usize>(n: usize, w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: values i..i+8 lie inside `w` (as bytes) and every `xs[k]`, since i + 8 <= n.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().wrapping_add(i * 2 + PREFETCH) as *const i8);
            let wv = _mm256_cvtph_ps(_mm_loadu_si128(w.as_ptr().add(i * 2) as *const __m128i));
            for (a, x) in acc.iter_mut().zip(&xs) {
                *a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.as_ptr().add(i)), *a);
            }
        }
        i += 8;
    }
    // SAFETY: register-only.
    let mut out = unsafe { hsums(acc) };
    for j in i..n {
        // SAFETY: value j < n lies inside `w`.
        let v = unsafe { f16_at(w.as_ptr().add(j * 2)) };
        for (o, x) in out.iter_mut().zip(&xs) {
            *o += v * x[j];
        }
    }
    out
}
