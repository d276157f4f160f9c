//! The reference kernels: plain loops, the ground truth every SIMD twin is tested against.
//!
//! Every function here is memory-safe for any input: it processes as many whole blocks as the
//! shortest argument holds. The checked entry points in `kernels` reject mismatched lengths
//! before calling into any table.
use super::Kernels;
use crate::quant::{f16_at, q8_0, BlockQ4_0, BlockQ4_1, BlockQ8_0, QK};

pub static KERNELS: Kernels = Kernels {
    name: "scalar",
    quantize_q8_0: q8_0::quantize_row_ref,
    dot_q8_0: |w, x| dot_q8_0::<1>(w, [x])[0],
    dot_q8_0_x4: dot_q8_0::<4>,
    dot_q8_0_4x1: |w, x| w.map(|w| dot_q8_0(w, [x])[0]),
    dot_q8_0_2x4: |w, x| w.map(|w| dot_q8_0(w, x)),
    dot_q4_0: |w, x| dot_q4_0::<1>(w, [x])[0],
    dot_q4_0_x4: dot_q4_0::<4>,
    dot_q4_0_4x1: |w, x| w.map(|w| dot_q4_0(w, [x])[0]),
    dot_q4_0_2x4: |w, x| w.map(|w| dot_q4_0(w, x)),
    dot_q4_1: |w, x, s| dot_q4_1::<1>(w, [x], [s])[0],
    dot_q4_1_x4: dot_q4_1::<4>,
    dot_q4_1_4x1: |w, x, s| w.map(|w| dot_q4_1(w, [x], [s])[0]),
    dot_q4_1_2x4: |w, x, s| w.map(|w| dot_q4_1(w, x, s)),
    dot_f32: |w, x| dot_f32::<1>(w, [x])[0],
    dot_f32_x4: dot_f32::<4>,
    axpy_q8_0,
};

/// `out += a · row` over the whole blocks both hold.
pub fn axpy_q8_0(out: &mut [f32], a: f32, row: &[u8]) {
    for (o, b) in out
        .chunks_exact_mut(QK)
        .zip(row.chunks_exact(BlockQ8_0::BYTES))
    {
        let ad = a * f16_at(b);
        for (o, q) in o.iter_mut().zip(&b[2..]) {
            *o += ad * (*q as i8) as f32;
        }
    }
}

fn blocks<const N: usize>(w: &[u8], w_block: usize, xs: &[&[u8]; N]) -> usize {
    xs.iter()
        .fold(w.len() / w_block, |n, x| n.min(x.len() / BlockQ8_0::BYTES))
}

/// Q8_0 weights · N rows of Q8_0 activations.
pub fn dot_q8_0<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    let mut acc = [0f32; N];
    for b in 0..blocks(w, BlockQ8_0::BYTES, &xs) {
        let wb = &w[b * BlockQ8_0::BYTES..(b + 1) * BlockQ8_0::BYTES];
        let dw = f16_at(wb);
        for (a, x) in acc.iter_mut().zip(&xs) {
            let xb = &x[b * BlockQ8_0::BYTES..(b + 1) * BlockQ8_0::BYTES];
            let mut sum = 0i32;
            for (p, q) in wb[2..].iter().zip(&xb[2..]) {
                sum += (*p as i8) as i32 * (*q as i8) as i32;
            }
            *a += sum as f32 * (dw * f16_at(xb));
        }
    }
    acc
}

/// Q4_0 weights · N rows of Q8_0 activations.
pub fn dot_q4_0<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    let mut acc = [0f32; N];
    for b in 0..blocks(w, BlockQ4_0::BYTES, &xs) {
        let wb = &w[b * BlockQ4_0::BYTES..(b + 1) * BlockQ4_0::BYTES];
        let dw = f16_at(wb);
        for (a, x) in acc.iter_mut().zip(&xs) {
            let xb = &x[b * BlockQ8_0::BYTES..(b + 1) * BlockQ8_0::BYTES];
            let mut sum = 0i32;
            for j in 0..QK / 2 {
                let n = wb[2 + j];
                sum += ((n & 0x0f) as i32 - 8) * (xb[2 + j] as i8) as i32;
                sum += ((n >> 4) as i32 - 8) * (xb[2 + j + QK / 2] as i8) as i32;
            }
            *a += sum as f32 * (dw * f16_at(xb));
        }
    }
    acc
}

/// Q4_1 weights · N rows of Q8_0 activations: `d·dx·Σ n·q + m·(dx·Σ q)` per block, the last
/// factor precomputed per activation block in `sums`.
pub fn dot_q4_1<const N: usize>(w: &[u8], xs: [&[u8]; N], sums: [&[f32]; N]) -> [f32; N] {
    let nb = sums
        .iter()
        .fold(blocks(w, BlockQ4_1::BYTES, &xs), |n, s| n.min(s.len()));
    let mut acc = [0f32; N];
    for b in 0..nb {
        let wb = &w[b * BlockQ4_1::BYTES..(b + 1) * BlockQ4_1::BYTES];
        let (dw, mw) = (f16_at(wb), f16_at(&wb[2..]));
        for ((a, x), s) in acc.iter_mut().zip(&xs).zip(&sums) {
            let xb = &x[b * BlockQ8_0::BYTES..(b + 1) * BlockQ8_0::BYTES];
            let mut sum = 0i32;
            for j in 0..QK / 2 {
                let n = wb[4 + j];
                let (q0, q1) = ((xb[2 + j] as i8) as i32, (xb[2 + j + QK / 2] as i8) as i32);
                sum += (n & 0x0f) as i32 * q0 + (n >> 4) as i32 * q1;
            }
            *a += sum as f32 * (dw * f16_at(xb)) + mw * s[b];
        }
    }
    acc
}

/// f32 weights (little-endian bytes) · N rows of f32 activations.
pub fn dot_f32<const N: usize>(w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
    let n = xs.iter().fold(w.len() / 4, |n, x| n.min(x.len()));
    let mut acc = [0f32; N];
    for (i, b) in w[..n * 4].chunks_exact(4).enumerate() {
        let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        for (a, x) in acc.iter_mut().zip(&xs) {
            *a += v * x[i];
        }
    }
    acc
}
