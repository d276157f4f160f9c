//! The k-quants that take Q8K activations (Q4_K, Q5_K, Q6_K; see `quant::q8k`): each block's
//! signed quants against the activations' bytes (one `sdot` per 16, or widening multiplies),
//! times the block's integer scales, one integer sum per super-block, then the scalar
//! `dot_q8k`'s float steps: the scalar kernel's bits.
use super::*;
use crate::kernels::scalar::q8k_step;
use crate::quant::BlockQ8K;

/// Σ x·y of 16 signed bytes.
#[inline(always)]
fn dot_i8x16(x: int8x16_t, y: int8x16_t) -> i32 {
    // SAFETY: register-only.
    let zero = unsafe { vdupq_n_s8(0) };
    dot_i8x32(x, zero, y, zero)
}

/// K-quant weights · N rows of Q8K activations, as `scalar::dot_q8k` computes it.
pub(super) fn dot_q8k<K: Unpack + KBlock, const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    let ns = xs.iter().fold(w.len() / <K as KBlock>::BYTES, |n, x| {
        n.min(x.len() / BlockQ8K::BYTES)
    });
    let mut acc = [0f32; N];
    for (s, sb) in w.chunks_exact(<K as KBlock>::BYTES).take(ns).enumerate() {
        let (d, dmin) = (f16_at(&sb[K::F16_AT.0..]), f16_at(&sb[K::F16_AT.1..]));
        let (scales, m) = K::unit_ints(sb);
        let half_scales = if <K as KBlock>::HALF_SCALES {
            m
        } else {
            scales
        };
        let xb: [&[u8]; N] =
            core::array::from_fn(|t| &xs[t][s * BlockQ8K::BYTES..][..BlockQ8K::BYTES]);
        let mut isum = [0i32; N];
        for j in 0..BLOCKS_PER_SUPER {
            let (w0, w1) = <K as Unpack>::unpack(sb, j);
            for (sum, x) in isum.iter_mut().zip(&xb) {
                let q = &x[BlockQ8K::QUANTS + QK * j..][..QK];
                // SAFETY: `q` holds the block's 32 quants.
                let (x0, x1) = unsafe {
                    let p = q.as_ptr() as *const i8;
                    (vld1q_s8(p), vld1q_s8(p.add(16)))
                };
                *sum += if <K as KBlock>::HALF_SCALES {
                    scales[j] as i32 * dot_i8x16(w0, x0) + half_scales[j] as i32 * dot_i8x16(w1, x1)
                } else {
                    scales[j] as i32 * dot_i8x32(w0, w1, x0, x1)
                };
            }
        }
        for ((a, x), isum) in acc.iter_mut().zip(&xb).zip(isum) {
            let x = BlockQ8K::read(x);
            let mut msum = 0i32;
            if <K as KBlock>::HAS_MIN {
                for (j, m) in m.iter().enumerate() {
                    msum += *m as i32 * (x.sums[2 * j] as i32 + x.sums[2 * j + 1] as i32);
                }
            }
            *a += q8k_step(d, dmin, x.d, isum, msum);
        }
    }
    acc
}
