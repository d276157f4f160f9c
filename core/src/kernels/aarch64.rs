//! NEON twins of `scalar`. NEON is part of the aarch64 baseline, so no run-time check is needed.
//! The i8 dot products use the `sdot` instruction when the build targets CPUs that have it
//! (`-C target-feature=+dotprod`, on by default for Apple silicon), and widening multiplies with
//! pairwise adds otherwise. `no_std` has no portable run-time detection of `dotprod`, and its
//! intrinsic is still unstable in Rust, hence compile-time selection and inline assembly.
use core::arch::aarch64::*;

use super::{Kernels, QuantDots, AXPY_ROWS, TILE};
use crate::quant::k_quants::BLOCKS_PER_SUPER;
use crate::quant::{
    f16_at, BlockQ16, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1,
    BlockQ6K, BlockQ8_0, KBlock, QK,
};

pub(super) static KERNELS: Kernels = Kernels {
    name: if cfg!(target_feature = "dotprod") {
        "neon+dotprod"
    } else {
        "neon"
    },
    quantize_q8_0,
    quantize_q16,
    q8_0: dots::<BlockQ8_0>(),
    q4_0: dots::<BlockQ4_0>(),
    q4_1: dots::<BlockQ4_1>(),
    q5_0: dots::<BlockQ5_0>(),
    q5_1: dots::<BlockQ5_1>(),
    q3_k: dots::<BlockQ3K>(),
    q4_k: dots::<BlockQ4K>(),
    q5_k: dots::<BlockQ5K>(),
    q6_k: dots::<BlockQ6K>(),
    dot_f32: |w, x| dot_f32::<1>(w, [x])[0],
    dot_f32_x4: dot_f32::<TILE>,
    // NEON's f16 conversions need `float16x4_t`, still unstable in Rust: the scalar loop.
    dot_f16: |w, x| super::scalar::dot_f16::<1>(w, [x])[0],
    dot_f16_x4: super::scalar::dot_f16::<TILE>,
    dot_bf16: |w, x| dot_bf16::<1>(w, [x])[0],
    dot_bf16_x4: dot_bf16::<TILE>,
    axpy_q8_0,
    silu_mul: crate::ops::silu_mul,
    exp_sub: crate::ops::exp_sub,
};

const fn dots<W: Unpack>() -> QuantDots {
    QuantDots {
        one: |w, x| dot::<W, 1>(w, [x])[0],
        x4: dot::<W, TILE>,
        rows4: |w, x| w.map(|w| dot::<W, 1>(w, [x])[0]),
        rows2x4: |w, x| w.map(|w| dot::<W, TILE>(w, x)),
        panel: None,
    }
}

fn axpy_q8_0(out: &mut [f32], a: &[f32], rows: &[&[u8]]) {
    let rows = &rows[..rows.len().min(AXPY_ROWS)];
    let nb = super::q8_0_blocks(rows);
    let n = nb * QK;
    if n == 0 {
        return;
    }
    let runs = (a.len() / rows.len()).min(out.len() / n);
    for b in 0..nb {
        // SAFETY: block `b` < nb lies inside every row (34 bytes: 32 quants after the scale);
        // each of the `runs` runs of `out` holds 32 floats at `i * n + b * 32`.
        unsafe {
            let mut d = [0f32; AXPY_ROWS];
            let mut v = [[vdupq_n_f32(0.0); 8]; AXPY_ROWS];
            for (k, row) in rows.iter().enumerate() {
                let blk = &row[b * BlockQ8_0::BYTES..(b + 1) * BlockQ8_0::BYTES];
                d[k] = f16_at(blk);
                let q = [0, 16].map(|o| vld1q_s8(blk.as_ptr().add(2 + o) as *const i8));
                let wide = q.map(|q| [vmovl_s8(vget_low_s8(q)), vmovl_high_s8(q)]);
                for (c, h) in wide.iter().flatten().enumerate() {
                    v[k][2 * c] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(*h)));
                    v[k][2 * c + 1] = vcvtq_f32_s32(vmovl_high_s16(*h));
                }
            }
            for (i, ai) in a.chunks_exact(rows.len()).take(runs).enumerate() {
                let ad: [float32x4_t; AXPY_ROWS] =
                    core::array::from_fn(|k| vdupq_n_f32(ai.get(k).map_or(0.0, |a| a * d[k])));
                let op = out.as_mut_ptr().add(i * n + b * QK);
                for c in 0..8 {
                    let mut o = vld1q_f32(op.add(4 * c));
                    for (adk, vk) in ad.iter().zip(&v[..rows.len()]) {
                        o = vfmaq_f32(o, *adk, vk[c]);
                    }
                    vst1q_f32(op.add(4 * c), o);
                }
            }
        }
    }
}

/// Σ x·y of 16 + 16 signed bytes, as an i32.
#[cfg(target_feature = "dotprod")]
#[inline(always)]
fn dot_i8x32(x0: int8x16_t, x1: int8x16_t, y0: int8x16_t, y1: int8x16_t) -> i32 {
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
fn dot_i8x32(x0: int8x16_t, x1: int8x16_t, y0: int8x16_t, y1: int8x16_t) -> i32 {
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
fn block_amax(v: [float32x4_t; 8]) -> f32 {
    // SAFETY: register-only NEON arithmetic.
    unsafe {
        let mut m = vdupq_n_f32(0.0);
        for vi in v {
            m = vmaxnmq_f32(m, vabsq_f32(vi));
        }
        vmaxnmvq_f32(m)
    }
}

fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
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

fn quantize_q16(x: &[f32], out: &mut [u8]) {
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

/// A weight block's 32 quants as signed bytes (values 0..16, 16..32). Blocks are stored in
/// units of `BYTES` bytes: one block, or a k-quant super-block of `UNIT` blocks, where `j` says
/// which.
trait Unpack {
    const BYTES: usize;
    /// Blocks of 32 values per unit.
    const UNIT: usize = 1;
    /// Whether the block has a minimum whose term `m·(dx·Σq)` is added.
    const HAS_MIN: bool = false;
    /// Whether the "minimum" is the scale of the block's second half instead (Q6_K).
    const HALF_SCALES: bool = false;
    /// The quants of block `j` of the unit at the start of `b` (`BYTES` long).
    fn unpack(b: &[u8], j: usize) -> (int8x16_t, int8x16_t);
    /// The scale and the minimum (or second scale) of block `j`: by default an f16 scale first
    /// and, with a minimum, an f16 minimum after it.
    #[inline(always)]
    fn scales(b: &[u8], _j: usize) -> (f32, f32) {
        (f16_at(b), if Self::HAS_MIN { f16_at(&b[2..]) } else { 0.0 })
    }
}

macro_rules! k_unpack {
    ($($t:ty => $unpack:expr),* $(,)?) => {$(
        impl Unpack for $t {
            const BYTES: usize = <$t as KBlock>::BYTES;
            const UNIT: usize = BLOCKS_PER_SUPER;
            const HAS_MIN: bool = <$t as KBlock>::HAS_MIN;
            const HALF_SCALES: bool = <$t as KBlock>::HALF_SCALES;
            #[inline(always)]
            fn unpack(b: &[u8], j: usize) -> (int8x16_t, int8x16_t) {
                $unpack(b, j)
            }
            #[inline(always)]
            fn scales(b: &[u8], j: usize) -> (f32, f32) {
                <$t as KBlock>::scales(b, j)
            }
        }
    )*};
}

k_unpack!(
    BlockQ3K => |b: &[u8], j: usize| {
        let (low_lo, low_hi) = bits32(&b[32 + 32 * (j / 4)..][..32], 2 * (j % 4), 3);
        let (high_lo, high_hi) = bits32(&b[..32], j, 1);
        // SAFETY: register-only; the quants are 0..=7 before the bias, -4..=3 after.
        unsafe {
            let bias = vdupq_n_s8(4);
            (
                vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low_lo, vshlq_n_u8(high_lo, 2))), bias),
                vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low_hi, vshlq_n_u8(high_hi, 2))), bias),
            )
        }
    },
    BlockQ4K => |b: &[u8], j: usize| {
        let (lo, hi) = bits32(&b[16 + 32 * (j / 2)..][..32], 4 * (j % 2), 0x0f);
        // SAFETY: register-only; nibbles are 0..=15, so reinterpreting them as i8 keeps them.
        unsafe { (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi)) }
    },
    BlockQ5K => |b: &[u8], j: usize| {
        let (lo, hi) = bits32(&b[48 + 32 * (j / 2)..][..32], 4 * (j % 2), 0x0f);
        let (h_lo, h_hi) = bits32(&b[16..48], j, 1);
        // SAFETY: register-only; the quants are 0..=31, so as i8 they stay.
        unsafe {
            (
                vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8(h_lo, 4))),
                vreinterpretq_s8_u8(vorrq_u8(hi, vshlq_n_u8(h_hi, 4))),
            )
        }
    },
    BlockQ6K => |b: &[u8], j: usize| {
        let (n, c) = (j / 4, j % 4);
        let (lo, hi) = bits32(&b[64 * n + 32 * (c % 2)..][..32], 4 * (c / 2), 0x0f);
        let (h_lo, h_hi) = bits32(&b[128 + 32 * n..][..32], 2 * c, 3);
        // SAFETY: register-only; the quants are 0..=63 before the bias, -32..=31 after.
        unsafe {
            let bias = vdupq_n_s8(32);
            (
                vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8(h_lo, 4))), bias),
                vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(hi, vshlq_n_u8(h_hi, 4))), bias),
            )
        }
    },
);

/// `(byte >> shift) & mask` of the 32 bytes of `b`: nibbles, or a k-quant's high bits.
#[inline(always)]
fn bits32(b: &[u8], shift: usize, mask: u8) -> (uint8x16_t, uint8x16_t) {
    let b = &b[..32];
    // SAFETY: `b` holds 32 bytes; the rest is register-only NEON arithmetic.
    unsafe {
        let count = vdupq_n_s8(-(shift as i8));
        let mask = vdupq_n_u8(mask);
        let v0 = vshlq_u8(vld1q_u8(b.as_ptr()), count);
        let v1 = vshlq_u8(vld1q_u8(b.as_ptr().add(16)), count);
        (vandq_u8(v0, mask), vandq_u8(v1, mask))
    }
}

impl Unpack for BlockQ8_0 {
    const BYTES: usize = Self::BYTES;
    #[inline(always)]
    fn unpack(b: &[u8], _: usize) -> (int8x16_t, int8x16_t) {
        let q = &b[2..Self::BYTES];
        // SAFETY: `q` holds the block's 32 quants.
        unsafe {
            let p = q.as_ptr() as *const i8;
            (vld1q_s8(p), vld1q_s8(p.add(16)))
        }
    }
}

impl Unpack for BlockQ4_0 {
    const BYTES: usize = Self::BYTES;
    #[inline(always)]
    fn unpack(b: &[u8], _: usize) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = nibbles(&b[2..]);
        // SAFETY: register-only NEON arithmetic.
        unsafe {
            let eight = vdupq_n_s8(8);
            (
                vsubq_s8(vreinterpretq_s8_u8(lo), eight),
                vsubq_s8(vreinterpretq_s8_u8(hi), eight),
            )
        }
    }
}

impl Unpack for BlockQ4_1 {
    const BYTES: usize = Self::BYTES;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn unpack(b: &[u8], _: usize) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = nibbles(&b[4..]);
        // SAFETY: register-only; nibbles are 0..=15, so reinterpreting them as i8 keeps them.
        unsafe { (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi)) }
    }
}

impl Unpack for BlockQ5_0 {
    const BYTES: usize = Self::BYTES;
    #[inline(always)]
    fn unpack(b: &[u8], _: usize) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = fives(&b[2..6], &b[6..]);
        // SAFETY: register-only NEON arithmetic; five-bit quants are 0..=31, so as i8 they stay.
        unsafe {
            let sixteen = vdupq_n_s8(16);
            (
                vsubq_s8(vreinterpretq_s8_u8(lo), sixteen),
                vsubq_s8(vreinterpretq_s8_u8(hi), sixteen),
            )
        }
    }
}

impl Unpack for BlockQ5_1 {
    const BYTES: usize = Self::BYTES;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn unpack(b: &[u8], _: usize) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = fives(&b[4..8], &b[8..]);
        // SAFETY: register-only; five-bit quants are 0..=31, so reinterpreting them as i8 keeps them.
        unsafe { (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi)) }
    }
}

/// The five-bit quants of a Q5 block (fifth bits `qh`, 4 bytes; nibbles `qs`): elements 0..16
/// and 16..32. Each lane picks the byte of `qh` that holds its bit and tests it.
#[inline(always)]
fn fives(qh: &[u8], qs: &[u8]) -> (uint8x16_t, uint8x16_t) {
    const BYTE_LO: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
    const BYTE_HI: [u8; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let (lo, hi) = nibbles(qs);
    // SAFETY: register-only NEON arithmetic, and loads of the three 16-byte tables.
    unsafe {
        let bits = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
        let q = vreinterpretq_u8_u32(vdupq_n_u32(bits));
        let bit = vld1q_u8(BIT.as_ptr());
        let sixteen = vdupq_n_u8(16);
        let fifth_lo = vandq_u8(
            vtstq_u8(vqtbl1q_u8(q, vld1q_u8(BYTE_LO.as_ptr())), bit),
            sixteen,
        );
        let fifth_hi = vandq_u8(
            vtstq_u8(vqtbl1q_u8(q, vld1q_u8(BYTE_HI.as_ptr())), bit),
            sixteen,
        );
        (vorrq_u8(lo, fifth_lo), vorrq_u8(hi, fifth_hi))
    }
}

/// The 32 nibbles of a Q4 block: elements 0..16 (low nibbles) and 16..32 (high nibbles).
#[inline(always)]
fn nibbles(qs: &[u8]) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: the callers pass a slice of at least 16 bytes.
    unsafe {
        let v = vld1q_u8(qs[..16].as_ptr());
        (vandq_u8(v, vdupq_n_u8(0x0f)), vshrq_n_u8(v, 4))
    }
}

/// A Q16 block's quants split into bytes, `q = 256·hi + lo`: (lo, hi) for values 0..16 and for
/// 16..32. `vld2q_s8` separates each i16's low and high byte; where the low byte is negative as an
/// i8 the high byte is one short, which `hi - (lo >> 7)` repairs (|q| <= 127·257 keeps hi in i8).
#[inline(always)]
fn split_q16(xb: &[u8]) -> [(int8x16_t, int8x16_t); 2] {
    let q = &xb[8..BlockQ16::BYTES];
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
fn dot<W: Unpack, const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    let nb = xs.iter().fold(w.len() / W::BYTES * W::UNIT, |n, x| {
        n.min(x.len() / BlockQ16::BYTES)
    });
    let mut acc = [0f32; N];
    for b in 0..nb {
        let (unit, j) = (b / W::UNIT, b % W::UNIT);
        let wb = &w[unit * W::BYTES..(unit + 1) * W::BYTES];
        let (w0, w1) = W::unpack(wb, j);
        let (dw, mw) = W::scales(wb, j);
        for (a, x) in acc.iter_mut().zip(&xs) {
            let xb = &x[b * BlockQ16::BYTES..(b + 1) * BlockQ16::BYTES];
            let [(lo0, hi0), (lo1, hi1)] = split_q16(xb);
            let f = |i: usize| f32::from_le_bytes([xb[i], xb[i + 1], xb[i + 2], xb[i + 3]]);
            if W::HALF_SCALES {
                // SAFETY: register-only.
                let zero = unsafe { vdupq_n_s8(0) };
                let half =
                    |w, lo, hi| 256 * dot_i8x32(w, zero, hi, zero) + dot_i8x32(w, zero, lo, zero);
                *a += half(w0, lo0, hi0) as f32 * (dw * f(0));
                *a += half(w1, lo1, hi1) as f32 * (mw * f(0));
                continue;
            }
            let sum = 256 * dot_i8x32(w0, w1, hi0, hi1) + dot_i8x32(w0, w1, lo0, lo1);
            *a += sum as f32 * (dw * f(0));
            if W::HAS_MIN {
                *a += mw * f(4);
            }
        }
    }
    acc
}

fn dot_f32<const N: usize>(w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
    let load4 = |p: *const u8| {
        // SAFETY: the caller (`dot_floats`) hands over 16 readable bytes.
        unsafe { vreinterpretq_f32_u8(vld1q_u8(p)) }
    };
    dot_floats(w, xs, 4, load4, |b| {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    })
}

/// bf16 weights: the top halves of f32s, so widening is a shift.
fn dot_bf16<const N: usize>(w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
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
fn dot_floats<const N: usize>(
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
