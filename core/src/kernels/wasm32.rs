//! WebAssembly SIMD128 twins of the scalar Q8_0 dot products, the format of the weights a
//! WebAssembly module compiles in (`embedded/wasm`). WebAssembly has no run-time feature
//! detection: a module built with `-C target-feature=+simd128` has this table, one built without
//! it the scalar one. The other entries are the scalar table's.
//!
//! Each block's integer sum is exact (`i32x4.dot_i16x8_s` of the weights widened to 16 bits and
//! the Q16 activations) and the scales are applied block by block in the scalar order, so the
//! results are the scalar kernels' bits.
use core::arch::wasm32::{
    i16x8_load_extend_i8x8, i32x4_add, i32x4_dot_i16x8, i32x4_extract_lane, i32x4_splat, v128,
    v128_load,
};

use super::{scalar, Kernels, QuantDots};
use crate::quant::{f16_at, BlockQ16, BlockQ8_0, QK};

/// The SIMD128 table: Q8_0 dots in SIMD128, every other entry the scalar one.
pub static KERNELS: Kernels = Kernels {
    name: "simd128",
    q8_0: QuantDots {
        one: |w, x| dot_q8_0::<1>(w, [x])[0],
        x4: dot_q8_0::<4>,
        rows4: |w, x| w.map(|w| dot_q8_0::<1>(w, [x])[0]),
        rows2x4: |w, x| w.map(|w| dot_q8_0::<4>(w, x)),
        panel: None,
        k_panel: None,
    },
    ..scalar::TABLE
};

/// Q8_0 weights · N rows of Q16 activations, as `scalar::dot` computes it.
fn dot_q8_0<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    let nb = xs.iter().fold(w.len() / BlockQ8_0::BYTES, |n, x| {
        n.min(x.len() / BlockQ16::BYTES)
    });
    let mut acc = [0f32; N];
    for (b, wb) in w.chunks_exact(BlockQ8_0::BYTES).take(nb).enumerate() {
        let dw = f16_at(wb);
        for (a, x) in acc.iter_mut().zip(&xs) {
            let xb = &x[b * BlockQ16::BYTES..][..BlockQ16::BYTES];
            let dx = f32::from_le_bytes([xb[0], xb[1], xb[2], xb[3]]);
            *a += block_sum(&wb[2..], &xb[8..]) as f32 * (dw * dx);
        }
    }
    acc
}

/// Σ q·x over one block: `q` its 32 signed 8-bit weights, `x` the activations' 32 little-endian
/// 16-bit quants (64 bytes).
fn block_sum(q: &[u8], x: &[u8]) -> i32 {
    let (q, x) = (&q[..QK], &x[..2 * QK]);
    let mut sum = i32x4_splat(0);
    for k in 0..QK / 8 {
        // SAFETY: `q` holds 32 bytes and `x` 64 (sliced above); the loads read q[8k .. 8k + 8]
        // and x[16k .. 16k + 16], inside them, and WebAssembly loads need no alignment.
        let (wv, xv) = unsafe {
            (
                i16x8_load_extend_i8x8(q.as_ptr().add(8 * k) as *const i8),
                v128_load(x.as_ptr().add(16 * k) as *const v128),
            )
        };
        sum = i32x4_add(sum, i32x4_dot_i16x8(wv, xv));
    }
    i32x4_extract_lane::<0>(sum)
        + i32x4_extract_lane::<1>(sum)
        + i32x4_extract_lane::<2>(sum)
        + i32x4_extract_lane::<3>(sum)
}
