//! f32, f16 and bf16 weight dots, and the element-wise kernels compiled for AVX2.
use super::*;
use crate::ops::SoftmaxRows;

pub(super) fn silu_mul(gate: &mut [f32], up: &[f32]) {
    // SAFETY: CPU features as above.
    unsafe { silu_mul_avx2(gate, up) }
}

pub(super) fn exp_sub(x: &mut [f32], m: f32) -> f32 {
    // SAFETY: CPU features as above.
    unsafe { exp_sub_avx2(x, m) }
}

pub(super) fn add_weighted_avx2(out: &mut [f32], a: &[f32], stride: usize, v: &[f32]) {
    // SAFETY: CPU features as above.
    unsafe { add_weighted_lanes_avx2(out, a, stride, v) }
}

pub(super) fn add_weighted_avx512(out: &mut [f32], a: &[f32], stride: usize, v: &[f32]) {
    // SAFETY: only the AVX-512 table holds this entry, handed out on CPUs with AVX-512 F.
    unsafe { add_weighted_lanes_avx512(out, a, stride, v) }
}

pub(super) fn softmax_step_avx2(
    s: &mut [f32],
    stride: usize,
    scale: f32,
    rows: &mut SoftmaxRows<'_>,
) {
    // SAFETY: CPU features as above.
    unsafe { softmax_lanes_avx2(s, stride, scale, rows) }
}

pub(super) fn softmax_step_avx512(
    s: &mut [f32],
    stride: usize,
    scale: f32,
    rows: &mut SoftmaxRows<'_>,
) {
    // SAFETY: only the AVX-512 table holds this entry, handed out on CPUs with AVX-512 F.
    unsafe { softmax_lanes_avx512(s, stride, scale, rows) }
}

/// The portable loop, vectorized eight wide instead of baseline x86-64's four.
///
/// # Safety
/// The CPU has AVX2. Any lengths: the loop stops at the shorter slice.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) {
    crate::ops::silu_mul(gate, up)
}

/// The portable loop, vectorized eight wide instead of baseline x86-64's four.
///
/// # Safety
/// The CPU has AVX2. Any length.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn exp_sub_avx2(x: &mut [f32], m: f32) -> f32 {
    crate::ops::exp_sub(x, m)
}

/// The portable loop, eight values a vector.
///
/// # Safety
/// The CPU has AVX2. Any lengths.
#[target_feature(enable = "avx2")]
unsafe fn add_weighted_lanes_avx2(out: &mut [f32], a: &[f32], stride: usize, v: &[f32]) {
    crate::ops::add_weighted(out, a, stride, v)
}

/// The portable loop, sixteen values a vector.
///
/// # Safety
/// The CPU has AVX-512 F. Any lengths.
#[target_feature(enable = "avx2,avx512f")]
unsafe fn add_weighted_lanes_avx512(out: &mut [f32], a: &[f32], stride: usize, v: &[f32]) {
    crate::ops::add_weighted(out, a, stride, v)
}

/// The portable step, sixteen rows' lanes in two 256-bit vectors.
///
/// # Safety
/// The CPU has AVX2. Any lengths.
#[target_feature(enable = "avx2")]
unsafe fn softmax_lanes_avx2(s: &mut [f32], stride: usize, scale: f32, rows: &mut SoftmaxRows<'_>) {
    crate::ops::softmax_step(s, stride, scale, rows)
}

/// The portable step, sixteen rows' lanes in one 512-bit vector.
///
/// # Safety
/// The CPU has AVX-512 F. Any lengths.
#[target_feature(enable = "avx2,avx512f")]
unsafe fn softmax_lanes_avx512(
    s: &mut [f32],
    stride: usize,
    scale: f32,
    rows: &mut SoftmaxRows<'_>,
) {
    crate::ops::softmax_step(s, stride, scale, rows)
}

pub(super) fn dot_f16<const N: usize>(w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
    dot_floats::<F16, N>(w, xs)
}

pub(super) fn dot_bf16<const N: usize>(w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
    dot_floats::<Bf16, N>(w, xs)
}

pub(super) fn dot_f32<const N: usize>(w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
    dot_floats::<F32, N>(w, xs)
}

/// A float format of weights, widened to f32 eight values at a time.
pub(super) trait Floats {
    const BYTES: usize;
    /// The eight values at `p`, as f32.
    ///
    /// # Safety
    /// `8 · BYTES` readable bytes at `p`; AVX2 and F16C.
    unsafe fn load8(p: *const u8) -> __m256;
    /// The value at `p`.
    ///
    /// # Safety
    /// `BYTES` readable bytes at `p`; F16C.
    unsafe fn load1(p: *const u8) -> f32;
}

pub(super) struct F32;
pub(super) struct F16;
/// bfloat16: the top half of an f32, so widening is a shift.
pub(super) struct Bf16;

impl Floats for F32 {
    const BYTES: usize = 4;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: as the caller guarantees.
        unsafe { _mm256_loadu_ps(p as *const f32) }
    }
    #[inline(always)]
    unsafe fn load1(p: *const u8) -> f32 {
        // SAFETY: as the caller guarantees.
        unsafe { (p as *const f32).read_unaligned() }
    }
}

impl Floats for F16 {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: as the caller guarantees.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn load1(p: *const u8) -> f32 {
        // SAFETY: as the caller guarantees.
        unsafe { f16_at(p) }
    }
}

impl Floats for Bf16 {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: as the caller guarantees.
        unsafe {
            let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16))
        }
    }
    #[inline(always)]
    unsafe fn load1(p: *const u8) -> f32 {
        // SAFETY: as the caller guarantees.
        unsafe { f32::from_bits(((p as *const u16).read_unaligned() as u32) << 16) }
    }
}

fn dot_floats<L: Floats, const N: usize>(w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
    let n = xs.iter().fold(w.len() / L::BYTES, |n, x| n.min(x.len()));
    // SAFETY: CPU features as above; `n` values lie inside `w` (as bytes) and every `xs[i]`.
    unsafe { dot_floats_avx2::<L, N>(n, w, xs) }
}

/// Float weights in format `L` · N rows of f32 activations: eight lanes of FMAs, then the rest
/// one value at a time.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `n` values of format `L` lie inside `w` and `n` inside every
/// `xs[i]`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_floats_avx2<L: Floats, const N: usize>(
    n: usize,
    w: &[u8],
    xs: [&[f32]; N],
) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: values i..i+8 lie inside `w` (as bytes) and every `xs[k]`, since i + 8 <= n.
        unsafe {
            let p = w.as_ptr().add(i * L::BYTES);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH) as *const i8);
            let wv = L::load8(p);
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
        let v = unsafe { L::load1(w.as_ptr().add(j * L::BYTES)) };
        for (o, x) in out.iter_mut().zip(&xs) {
            *o += v * x[j];
        }
    }
    out
}

/// f16 values widened to f32 (exactly), eight at a time with F16C.
pub(super) fn widen_f16(bytes: &[u8], out: &mut [f32]) {
    let n = (bytes.len() / 2).min(out.len());
    // SAFETY: every x86 table is handed out only where the CPU has AVX2 and F16C; values
    // `0 .. n` lie inside both slices.
    unsafe { widen_f16_f16c(n, bytes.as_ptr(), out.as_mut_ptr()) }
}

/// # Safety
/// AVX2 and F16C; `2n` readable bytes at `src`, `n` writable floats at `dst`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen_f16_f16c(n: usize, src: *const u8, dst: *mut f32) {
    let mut i = 0;
    // SAFETY: values `i .. i + 8` (then `i`) lie inside both, as the caller guarantees.
    unsafe {
        while i + 8 <= n {
            let h = _mm_loadu_si128(src.add(2 * i) as *const __m128i);
            _mm256_storeu_ps(dst.add(i), _mm256_cvtph_ps(h));
            i += 8;
        }
        while i < n {
            *dst.add(i) = f16_at(src.add(2 * i));
            i += 1;
        }
    }
}
