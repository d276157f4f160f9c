//! The f32 and bf16 dots.
use super::*;

pub(super) fn dot_f32<const N: usize>(w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
    let load4 = |p: *const u8| {
        // SAFETY: the caller (`dot_floats`) hands over 16 readable bytes.
        unsafe { vreinterpretq_f32_u8(vld1q_u8(p)) }
    };
    dot_floats(w, xs, 4, load4, |b| {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    })
}

/// bf16 weights: the top halves of f32s, so widening is a shift.
pub(super) fn dot_bf16<const N: usize>(w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
    let load4 = |p: *const u8| {
        // SAFETY: the caller (`dot_floats`) hands over 8 readable bytes.
        unsafe { vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p as *const u16), 16)) }
    };
    dot_floats(w, xs, 2, load4, |b| {
        f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)
    })
}

/// Weights of `bytes` bytes per value · N rows of f32 activations: four values at a time widened
/// by `load4` (given `4 · bytes` readable bytes), then the rest one at a time by `load1`.
pub(super) fn dot_floats<const N: usize>(
    w: &[u8],
    xs: [&[f32]; N],
    bytes: usize,
    load4: impl Fn(*const u8) -> float32x4_t,
    load1: impl Fn(&[u8]) -> f32,
) -> [f32; N] {
    let n = xs.iter().fold(w.len() / bytes, |n, x| n.min(x.len()));
    // SAFETY: register-only.
    let mut acc = [unsafe { vdupq_n_f32(0.0) }; N];
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: values i..i+4 lie inside `w` (as bytes) and every `xs[k]`, since i + 4 <= n.
        unsafe {
            let wv = load4(w.as_ptr().add(i * bytes));
            for (a, x) in acc.iter_mut().zip(&xs) {
                *a = vfmaq_f32(*a, wv, vld1q_f32(x.as_ptr().add(i)));
            }
        }
        i += 4;
    }
    // SAFETY: register-only.
    let mut out = acc.map(|a| unsafe { vaddvq_f32(a) });
    for j in i..n {
        let v = load1(&w[j * bytes..(j + 1) * bytes]);
        for (o, x) in out.iter_mut().zip(&xs) {
            *o += v * x[j];
        }
    }
    out
}
