//! Attention's weighted sum over cached Q8_0 value rows.
use super::*;

/// Keys widened at once (32 registers for their values).
const KEYS: usize = 4;

/// `out[i] += Σ_k a[i·w.run + k·w.key] · rows[k]` for each whole run `out[i]` (as long as the
/// rows' whole blocks) that `a` has all its weights for (`WeightStrides::runs`), over every
/// row, in order, `KEYS` rows at a time.
pub(super) fn axpy_q8_0(out: &mut [f32], a: &[f32], w: WeightStrides, rows: &[&[u8]]) {
    let nb = crate::kernels::q8_0_blocks(rows);
    let n = nb * QK;
    if n == 0 {
        return;
    }
    let runs = w.runs(a.len(), rows.len(), out.len() / n);
    if runs == 0 {
        return;
    }
    for (g, group) in rows.chunks(KEYS).enumerate() {
        add_keys(out, &a[g * KEYS * w.key..], w, group, nb, runs);
    }
}

/// At most `KEYS` rows into `runs` runs of `nb` blocks.
fn add_keys(out: &mut [f32], a: &[f32], w: WeightStrides, rows: &[&[u8]], nb: usize, runs: usize) {
    let n = nb * QK;
    for b in 0..nb {
        // SAFETY: block `b` < nb lies inside every row (34 bytes: 32 quants after the scale);
        // each of the `runs` runs of `out` holds 32 floats at `i * n + b * 32`.
        unsafe {
            let mut d = [0f32; KEYS];
            let mut v = [[vdupq_n_f32(0.0); 8]; KEYS];
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
            for i in 0..runs {
                let ad: [float32x4_t; KEYS] = core::array::from_fn(|k| {
                    let a = if k < rows.len() {
                        a[i * w.run + k * w.key]
                    } else {
                        0.0
                    };
                    vdupq_n_f32(a * d[k])
                });
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
