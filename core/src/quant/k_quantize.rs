//! Quantizing to Q4_K, Q5_K and Q6_K: ggml's reference quantizers (`quantize_row_q4_K_ref`,
//! `quantize_row_q5_K_ref`, `quantize_row_q6_K_ref`, what `llama-quantize` runs without an
//! importance matrix), step for step in the same float operations, so that a file written here
//! holds the bytes llama.cpp would write.
use half::f16;

use super::k_quants::QK_K;

/// ggml's GROUP_MAX_EPS: a group whose largest magnitude is below this is all zeros.
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// Round to nearest, ties to even, as ggml's `nearest_int` does it (valid for |x| < 2^22).
pub(super) fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

fn to_f16(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_le_bytes()
}

fn f16_value(b: [u8; 2]) -> f32 {
    f16::from_le_bytes(b).to_f32()
}

/// ggml's `make_qkx2_quants`: levels `l` in 0..=nmax with `x ≈ scale · l − min`, searched over
/// `nstep + 1` candidate scales for the least weighted squared error. Returns `(scale, min)`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    laux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.iter_mut().for_each(|v| *v = 0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * l[i] as f32 + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let (w, lf) = (weights[i], q as f32);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * (diff * diff);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `make_qx_quants` with `rmse_type` 1 and no weights: signed levels `l` in
/// `-nmax..nmax`, stored as `l + nmax`, with `x ≈ scale · l`, the scale searched over 19
/// candidates for the least `x²`-weighted squared error. Returns the scale.
fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l[..x.len()].iter_mut().for_each(|v| *v = 0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let mut iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (i, &v) in x.iter().enumerate() {
        let q = level(iscale, v);
        l[i] = (q + nmax) as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let q = level(iscale, v);
            let w = v * v;
            sumlx += w * v * q as f32;
            suml2 += w * q as f32 * q as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (i, &v) in x.iter().enumerate() {
                l[i] = (level(iscale, v) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Q4_K's and Q5_K's header and levels from 256 values: eight blocks' scales and minimums
/// searched by `make_qkx2_quants` (levels `0..=nmax`), packed to six bits each against the
/// super-block's f16 `d` and `dmin`, and the levels taken again for them. Returns the header
/// (`d`, `dmin`, the twelve scale bytes) and the levels.
fn scales_mins_levels(x: &[f32], nmax: i32, rmin: f32, nstep: i32) -> ([u8; 16], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let mut laux = [0u8; 32];
    let mut weights = [0f32; 32];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * (j + 1)];
        let sum_x2: f32 = xs.iter().fold(0.0, |s, v| s + v * v);
        let av_x = libm::sqrtf(sum_x2 / 32.0);
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let block = &mut l[32 * j..32 * (j + 1)];
        (scales[j], mins[j]) =
            make_qkx2_quants(nmax, xs, &weights, block, &mut laux, rmin, 0.1, nstep);
        max_scale = max_scale.max(scales[j]);
        max_min = max_min.max(mins[j]);
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut header = [0u8; 16];
    let packed = &mut header[4..];
    for j in 0..8 {
        // ggml stores nearest_int's result in a u8 before taking the min with 63.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let d = to_f16(max_scale / 63.0);
    let dmin = to_f16(max_min / 63.0);
    header[0..2].copy_from_slice(&d);
    header[2..4].copy_from_slice(&dmin);
    for j in 0..8 {
        let (sc, m) = super::k_quants::scale_min_k4(j, &header[4..]);
        let d = f16_value(d) * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = f16_value(dmin) * m as f32;
        for i in 0..32 {
            l[32 * j + i] = nearest_int((x[32 * j + i] + dm) / d).clamp(0, nmax) as u8;
        }
    }
    (header, l)
}

/// One Q4_K super-block (144 bytes) from 256 values.
pub fn quantize_q4k(x: &[f32], y: &mut [u8]) {
    let (header, l) = scales_mins_levels(x, 15, -1.0, 20);
    y[..16].copy_from_slice(&header);
    for (c, q) in y[16..144].chunks_exact_mut(32).enumerate() {
        let j = 64 * c;
        for (i, b) in q.iter_mut().enumerate() {
            *b = l[j + i] | (l[j + i + 32] << 4);
        }
    }
}

/// One Q5_K super-block (176 bytes) from 256 values: Q4_K's with five-bit levels, the fifth
/// bits in `qh` (bit `2c` for block `2c`, `2c + 1` for block `2c + 1`).
pub fn quantize_q5k(x: &[f32], y: &mut [u8]) {
    let (header, l) = scales_mins_levels(x, 31, -0.5, 15);
    y[..16].copy_from_slice(&header);
    let (qh, qs) = y[16..176].split_at_mut(32);
    qh.fill(0);
    for (c, q) in qs.chunks_exact_mut(32).enumerate() {
        let j = 64 * c;
        for (i, b) in q.iter_mut().enumerate() {
            let (l1, l2) = (l[j + i], l[j + i + 32]);
            qh[i] |= ((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1));
            *b = (l1 & 0xf) | ((l2 & 0xf) << 4);
        }
    }
}

/// One Q6_K super-block (210 bytes) from 256 values.
pub fn quantize_q6k(x: &[f32], y: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for ib in 0..16 {
        let scale = make_qx_quants(32, &x[16 * ib..16 * (ib + 1)], &mut l[16 * ib..]);
        scales[ib] = scale;
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
        }
    }
    y[..210].fill(0);
    if max_abs_scale < GROUP_MAX_EPS {
        return;
    }
    let iscale = -128.0 / max_scale;
    let d = to_f16(1.0 / iscale);
    y[208..210].copy_from_slice(&d);
    for ib in 0..16 {
        y[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
    }
    for j in 0..16 {
        let d = f16_value(d) * (y[192 + j] as i8) as f32;
        if d == 0.0 {
            continue;
        }
        for i in 0..16 {
            let q = nearest_int(x[16 * j + i] / d).clamp(-32, 31);
            l[16 * j + i] = (q + 32) as i8;
        }
    }
    let (ql, rest) = y.split_at_mut(128);
    let qh = &mut rest[..64];
    for half in 0..2 {
        let (j, ql, qh) = (128 * half, &mut ql[64 * half..], &mut qh[32 * half..]);
        for i in 0..32 {
            let q = |k: usize| l[j + i + 32 * k] as u8;
            ql[i] = (q(0) & 0xf) | ((q(2) & 0xf) << 4);
            ql[i + 32] = (q(1) & 0xf) | ((q(3) & 0xf) << 4);
            qh[i] = (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
        }
    }
}

/// Quantizes a row of whole super-blocks with `quantize_one` (`bytes` per super-block).
pub fn quantize_blocks(
    x: &[f32],
    out: &mut [u8],
    bytes: usize,
    quantize_one: fn(&[f32], &mut [u8]),
) {
    for (xs, y) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(bytes)) {
        quantize_one(xs, y);
    }
}
