//! The k-quants' many-token kernels (see `kernels::k_panel`) with `sdot`: a row's four unpacked
//! bytes, duplicated, against four tokens' four values, one integer sum per token lane; four rows
//! × eight tokens at a time, each half's (or block's) sums times its integer scale. Stored quants
//! are at most 127, so also valid signed bytes (`WIDE` ones are made signed). Tiles are
//! transposed by the portable reference.
use super::*;
use crate::kernels::k_panel::{
    transpose_ref, unpack_factors, KPanelDots, KRow, KTokens, K_MICRO, K_TOKENS,
};
use crate::kernels::PANEL_MIN_TOKENS;
use crate::quant::k_quants::{HALVES_PER_SUPER, QK_K};
use crate::quant::q8k::SUM_SPAN;

/// The panel kernels of format `K`.
pub(super) const fn k_panel<K: KBytes>() -> KPanelDots {
    KPanelDots {
        from_tokens: PANEL_MIN_TOKENS,
        unpack: unpack::<K>,
        folds_scales: false,
        transpose: |xs, s, out| *out = transpose_ref(xs, s),
        dot: dot::<K>,
    }
}

fn unpack<K: KBytes>(rows: &[&[u8]], s: usize, out: &mut [KRow]) {
    for (row, o) in rows.iter().zip(out) {
        let Some(sb) = row.get(s * K::BYTES..(s + 1) * K::BYTES) else {
            *o = KRow::ZERO;
            continue;
        };
        // The row's next super-block, which the next `unpack` of this block of rows reads: the
        // block's rows are as many strided streams, which hardware prefetchers miss.
        for line in (0..K::BYTES + 63).step_by(64) {
            let ahead = sb.as_ptr().wrapping_add(K::BYTES + line.min(K::BYTES - 1));
            // SAFETY: a prefetch reads nothing and does not fault, whatever the address.
            unsafe {
                core::arch::asm!("prfm pldl2keep, [{p}]", p = in(reg) ahead, options(nostack, readonly, preserves_flags));
            }
        }
        for j in 0..QK_K / QK {
            let (lo, hi) = K::bytes(sb, j);
            // SAFETY: the 32 bytes stored lie in `codes`.
            unsafe {
                vst1q_u8(o.codes.as_mut_ptr().add(32 * j), lo);
                vst1q_u8(o.codes.as_mut_ptr().add(32 * j + 16), hi);
            }
        }
        unpack_factors::<K>(sb, o);
    }
}

/// The tile's tokens eight at a time, as far as `tokens` reach.
fn dot<K: KBytes>(rows: &[KRow], x: &KTokens, tokens: usize, acc: &mut [[f32; K_TOKENS]]) {
    let n = rows.len().min(acc.len()) / K_MICRO * K_MICRO;
    let tokens = tokens.clamp(1, K_TOKENS).next_multiple_of(8);
    for (rs, acc) in rows[..n].chunks_exact(4).zip(acc[..n].chunks_exact_mut(4)) {
        for t0 in (0..tokens).step_by(8) {
            rows4x8::<K>(rs, x, t0, acc);
        }
    }
}

/// `acc[r][t0 .. t0 + 8] +=` four rows' super-block against eight tokens.
#[inline(always)]
fn rows4x8<K: KBytes>(rs: &[KRow], x: &KTokens, t0: usize, acc: &mut [[f32; K_TOKENS]]) {
    const R: usize = 4;
    // Values per integer scale.
    let span = if K::SHARED_HALVES {
        2 * SUM_SPAN
    } else {
        SUM_SPAN
    };
    let rs = &rs[..R];
    // SAFETY: every load reads inside `rs` and `x` (group `g < 64`, tokens `t0 + 8 <= 16`);
    // the rest is register-only NEON arithmetic; this build targets CPUs with `sdot`.
    unsafe {
        let zero = vdupq_n_s32(0);
        let mut scaled = [[zero; 2]; R];
        for h in 0..QK_K / span {
            let mut raw = [[zero; 2]; R];
            for g in h * span / 4..(h + 1) * span / 4 {
                let p = x.codes[g].as_ptr().add(4 * t0) as *const i8;
                let (x0, x1) = (vld1q_s8(p), vld1q_s8(p.add(16)));
                for r in 0..R {
                    let w = vld1q_dup_s32(rs[r].codes.as_ptr().add(4 * g) as *const i32);
                    let w = if K::WIDE {
                        // The signed values (see `KBlock::WIDE`).
                        veorq_s8(vreinterpretq_s8_s32(w), vdupq_n_s8(i8::MIN))
                    } else {
                        vreinterpretq_s8_s32(w)
                    };
                    core::arch::asm!(
                        "sdot {a0:v}.4s, {x0:v}.16b, {w:v}.16b",
                        "sdot {a1:v}.4s, {x1:v}.16b, {w:v}.16b",
                        a0 = inout(vreg) raw[r][0],
                        a1 = inout(vreg) raw[r][1],
                        x0 = in(vreg) x0,
                        x1 = in(vreg) x1,
                        w = in(vreg) w,
                        options(pure, nomem, nostack),
                    );
                }
            }
            for r in 0..R {
                let scale = vdupq_n_s32(rs[r].scales[h * span / SUM_SPAN]);
                for v in 0..2 {
                    scaled[r][v] = vmlaq_s32(scaled[r][v], raw[r][v], scale);
                }
            }
        }
        let mut side = [[zero; 2]; R];
        let offset = K::OFFSET != 0 && !K::WIDE;
        if K::HAS_MIN || offset {
            for i in 0..HALVES_PER_SUPER / 2 {
                let p = x.sums[i].as_ptr().add(4 * t0) as *const i16;
                // Four tokens' pairs of sums per vector.
                let sums = [vld1q_s16(p), vld1q_s16(p.add(8))];
                for r in 0..R {
                    let pair = vreinterpretq_s16_u32(vdupq_n_u32(rs[r].side[i]));
                    for v in 0..2 {
                        let lo = vmull_s16(vget_low_s16(sums[v]), vget_low_s16(pair));
                        let hi = vmull_high_s16(sums[v], pair);
                        side[r][v] = vaddq_s32(side[r][v], vpaddq_s32(lo, hi));
                    }
                }
            }
        }
        for r in 0..R {
            for v in 0..2 {
                let isum = if offset {
                    vmlsq_s32(scaled[r][v], side[r][v], vdupq_n_s32(K::OFFSET))
                } else {
                    scaled[r][v]
                };
                let msum = if K::HAS_MIN { side[r][v] } else { zero };
                // `q8k_step` in each token's lane, the same operations in the same order.
                let dx = vld1q_f32(x.d.as_ptr().add(t0 + 4 * v));
                let d = vmulq_f32(vdupq_n_f32(rs[r].d), dx);
                let dmin = vmulq_f32(vdupq_n_f32(rs[r].dmin), dx);
                let a = vmulq_f32(d, vcvtq_f32_s32(isum));
                let b = vmulq_f32(dmin, vcvtq_f32_s32(msum));
                let o = acc[r].as_mut_ptr().add(t0 + 4 * v);
                vst1q_f32(o, vaddq_f32(vld1q_f32(o), vsubq_f32(a, b)));
            }
        }
    }
}
