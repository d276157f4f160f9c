//! The quantizers (Q8_0 for the KV cache, Q16 for activations) and the quantized dots.
use super::*;

/// Σ x·y of 16 + 16 signed bytes, as an i32.
#[cfg(target_feature = "dotprod")]
#[inline(always)]
pub(super) fn dot_i8x32(x0: int8x16_t, x1: int8x16_t, y0: int8x16_t, y1: int8x16_t) -> i32 {
    // SAFETY: register-only; this build targets CPUs with the dot-product extension.
    unsafe {
        let mut acc = vdupq_n_s32(0);
        core::arch::asm!(
            "sdot {acc:v}.4s, {x0:v}.16b, {y0:v}.16b",
            "sdot {acc:v}.4s, {x1:v}.16b, {y1:v}.16b",
            acc = inout(vreg) acc,
            x0 = in(vreg) x0,
            y0 = in(vreg) y0,
            x1 = in(vreg) x1,
            y1 = in(vreg) y1,
            options(pure, nomem, nostack),
        );
        vaddvq_s32(acc)
    }
}

/// Σ x·y of 16 + 16 signed bytes, as an i32.
#[cfg(not(target_feature = "dotprod"))]
#[inline(always)]
pub(super) fn dot_i8x32(x0: int8x16_t, x1: int8x16_t, y0: int8x16_t, y1: int8x16_t) -> i32 {
    // SAFETY: register-only NEON arithmetic; NEON is baseline on aarch64.
    unsafe {
        let p0 = vmull_s8(vget_low_s8(x0), vget_low_s8(y0));
        let p1 = vmull_high_s8(x0, y0);
        let p2 = vmull_s8(vget_low_s8(x1), vget_low_s8(y1));
        let p3 = vmull_high_s8(x1, y1);
        let s = vaddq_s32(
            vaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1)),
            vaddq_s32(vpaddlq_s16(p2), vpaddlq_s16(p3)),
        );
        vaddvq_s32(s)
    }
}

/// The largest |x| of a block; `maxnm` ignores NaN, as the scalar fold does.
#[inline(always)]
pub(super) fn block_amax(v: [float32x4_t; 8]) -> f32 {
    // SAFETY: register-only NEON arithmetic.
    unsafe {
        let mut m = vdupq_n_f32(0.0);
        for vi in v {
            m = vmaxnmq_f32(m, vabsq_f32(vi));
        }
        vmaxnmvq_f32(m)
    }
}

pub(super) fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    let nb = (x.len() / QK).min(out.len() / BlockQ8_0::BYTES);
    for b in 0..nb {
        // SAFETY: block `b` < nb lies inside `x` (32 floats) and `out` (34 bytes).
        unsafe {
            let p = x.as_ptr().add(b * QK);
            let v: [float32x4_t; 8] = core::array::from_fn(|i| vld1q_f32(p.add(4 * i)));
            let d = block_amax(v) / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let lo = vdupq_n_s32(-127);
            let hi = vdupq_n_s32(127);
            // fcvtas rounds half away from zero, saturates and maps NaN to 0, like the scalar path.
            let ints =
                v.map(|vi| vminq_s32(vmaxq_s32(vcvtaq_s32_f32(vmulq_n_f32(vi, id)), lo), hi));
            let o = out.as_mut_ptr().add(b * BlockQ8_0::BYTES);
            let dh = half::f16::from_f32(d).to_bits().to_le_bytes();
            *o = dh[0];
            *o.add(1) = dh[1];
            for k in 0..4 {
                let s16 = vcombine_s16(vqmovn_s32(ints[2 * k]), vqmovn_s32(ints[2 * k + 1]));
                vst1_s8(o.add(2 + 8 * k) as *mut i8, vqmovn_s16(s16));
            }
        }
    }
}

pub(super) fn quantize_q16(x: &[f32], out: &mut [u8]) {
    let nb = (x.len() / QK).min(out.len() / BlockQ16::BYTES);
    for b in 0..nb {
        // SAFETY: block `b` < nb lies inside `x` (32 floats) and `out` (72 bytes).
        unsafe {
            let p = x.as_ptr().add(b * QK);
            let v: [float32x4_t; 8] = core::array::from_fn(|i| vld1q_f32(p.add(4 * i)));
            let d = block_amax(v) / BlockQ16::MAX;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let (lo, hi) = (vdupq_n_s32(-32639), vdupq_n_s32(32639));
            // fcvtns rounds to nearest even, saturates and maps NaN to 0, like the scalar path.
            let ints =
                v.map(|vi| vminq_s32(vmaxq_s32(vcvtnq_s32_f32(vmulq_n_f32(vi, id)), lo), hi));
            let sum = ints.iter().fold(0i32, |s, i| s + vaddvq_s32(*i));
            let o = out.as_mut_ptr().add(b * BlockQ16::BYTES);
            (o as *mut f32).write_unaligned(d);
            (o.add(4) as *mut f32).write_unaligned(d * sum as f32);
            for k in 0..4 {
                let q = vcombine_s16(vmovn_s32(ints[2 * k]), vmovn_s32(ints[2 * k + 1]));
                vst1q_s16(o.add(8 + 16 * k) as *mut i16, q);
            }
        }
    }
}

/// A Q16 block's quants split into bytes, `q = 256·hi + lo`: (lo, hi) for values 0..16 and for
/// 16..32. `vld2q_s8` separates each i16's low and high byte; where the low byte is negative as an
/// i8 the high byte is one short, which `hi - (lo >> 7)` repairs (|q| <= 127·257 keeps hi in i8).
#[inline(always)]
pub(super) fn split_q16(xb: &[u8]) -> [(int8x16_t, int8x16_t); 2] {
    let q = &xb[BlockQ16::QUANTS..BlockQ16::BYTES];
    // SAFETY: `q` holds the block's 32 quants (64 bytes).
    unsafe {
        let p = q.as_ptr() as *const i8;
        [0, 32].map(|o| {
            let bytes = vld2q_s8(p.add(o));
            let (lo, hi) = (bytes.0, bytes.1);
            (lo, vsubq_s8(hi, vshrq_n_s8(lo, 7)))
        })
    }
}

/// Weights in format `W` · N rows of Q16 activations, in the scalar reference's float order.
pub(super) fn dot<W: Unpack, const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    let nb = xs
        .iter()
        .fold(w.len() / W::BYTES, |n, x| n.min(x.len() / BlockQ16::BYTES));
    let mut acc = [0f32; N];
    for b in 0..nb {
        let wb = &w[b * W::BYTES..(b + 1) * W::BYTES];
        let (w0, w1) = W::unpack(wb);
        let (dw, mw) = W::scales(wb);
        for (a, x) in acc.iter_mut().zip(&xs) {
            let xb = &x[b * BlockQ16::BYTES..(b + 1) * BlockQ16::BYTES];
            let [(lo0, hi0), (lo1, hi1)] = split_q16(xb);
            let f = |i: usize| f32::from_le_bytes([xb[i], xb[i + 1], xb[i + 2], xb[i + 3]]);
            let sum = 256 * dot_i8x32(w0, w1, hi0, hi1) + dot_i8x32(w0, w1, lo0, lo1);
            *a += sum as f32 * (dw * f(0));
            if W::HAS_MIN {
                *a += mw * f(4);
            }
        }
    }
    acc
}
