//! Attention's weighted sum over cached Q8_0 value rows.
use super::*;

pub(super) fn axpy_q8_0(out: &mut [f32], a: &[f32], rows: &[&[u8]]) {
    let rows = &rows[..rows.len().min(AXPY_ROWS)];
    let nb = crate::kernels::q8_0_blocks(rows);
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
