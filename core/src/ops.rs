//! The element-wise operations of a Llama layer, on plain f32 slices.
use crate::config::RopeStyle;
use crate::error::{Error, Result};

/// `e^x` in f32 within 2 ulp, without branches or tables, so loops over it vectorize: the exponent
/// from `x·log2(e)` rounded, the remainder through a degree-6 polynomial (Cephes' `expf`), and
/// `2^n` built in the float's exponent bits. Inputs are clamped to [-87.3, 88.7], so the result is
/// always a normal float (about 1e-38 at the low end, where `expf` would go subnormal or to 0);
/// NaN stays NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = core::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.7);
    // Round to nearest: adding 1.5·2^23 leaves the integer in the low mantissa bits (the sum's
    // ulp is 1), so subtracting it back gives n as a float and subtracting its bits n as an int.
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let ni = t.to_bits() as i32 - ROUND.to_bits() as i32;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    // 2^n for n in [-126, 128]: the biased exponent; 2^128 (x near 88.7) is split in two. All
    // integer arithmetic (no float-to-int cast, whose saturation would stop vectorization).
    let half = ni >> 1;
    let scale_a = f32::from_bits(((half + 127) as u32) << 23);
    let scale_b = f32::from_bits(((ni - half + 127) as u32) << 23);
    e * scale_a * scale_b
}

/// `Ok` where `got` is the `expected` length, else an error naming `what`.
pub(crate) fn same_len(what: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected != got {
        return Err(Error::Length {
            what,
            expected,
            got,
        });
    }
    Ok(())
}

/// `out = x / sqrt(mean(x²) + eps) * weight`, row by row (rows are `weight.len()` long).
///
/// # Errors
/// [`Error::Length`] if `out` differs from `x` in length, [`Error::NotBlockMultiple`] if `x`
/// is not whole rows.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) -> Result<()> {
    same_len("rms_norm output", x.len(), out.len())?;
    let n = weight.len();
    if n == 0 || !x.len().is_multiple_of(n) {
        return Err(Error::NotBlockMultiple {
            what: "rms_norm input (rows of the weight's length)",
            len: x.len(),
            block: n,
        });
    }
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let r = 1.0 / libm::sqrtf(sum_of_squares(xr) / n as f32 + eps);
        for ((o, v), w) in or.iter_mut().zip(xr).zip(weight) {
            *o = w * (v * r);
        }
    }
    Ok(())
}

/// `Σ v²` in sixteen running sums (value `i` into sum `i % 16`), added up in a fixed order at the
/// end: the compiler keeps the sums in vector lanes, where one running sum is a chain of
/// dependent adds (0.7 µs a row of 576, a few percent of a decode step of eight sequences, on
/// one thread). A row's result depends on that row alone.
fn sum_of_squares(x: &[f32]) -> f32 {
    let mut sums = [0f32; 16];
    let (rows, rest) = x.as_chunks::<16>();
    for c in rows {
        for (s, v) in sums.iter_mut().zip(c) {
            *s += v * v;
        }
    }
    for (s, v) in sums.iter_mut().zip(rest) {
        *s += v * v;
    }
    sums.iter().sum()
}

/// Numerically stable softmax in place.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = exp(*v - max);
        sum += *v;
    }
    if sum > 0.0 {
        for v in x.iter_mut() {
            *v /= sum;
        }
    }
}

/// `gate = silu(gate) * up` over the shorter length: the loop the kernel tables compile for
/// each instruction set (the same operations, so the same bits, at any vector width).
#[inline(always)]
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + exp(-*g)) * u;
    }
}

/// `x = e^(x - m)`, element-wise, and the sum of the results: a softmax's exponentials,
/// compiled per instruction set like `silu_mul`. The sum goes in eight lanes (element `j` into
/// lane `j % 8`), then pairwise: a fixed order, so the same bits at any vector width, without a
/// chain of dependent additions.
#[inline(always)]
pub fn exp_sub(x: &mut [f32], m: f32) -> f32 {
    let mut lanes = [0f32; 8];
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        for (l, v) in lanes.iter_mut().zip(c.iter_mut()) {
            *v = exp(*v - m);
            *l += *v;
        }
    }
    for (l, v) in lanes.iter_mut().zip(chunks.into_remainder()) {
        *v = exp(*v - m);
        *l += *v;
    }
    let [a, b, c, d, e, f, g, h] = lanes;
    ((a + e) + (c + g)) + ((b + f) + (d + h))
}

/// `v` if it is larger than `m`, else `m`: a running maximum that passes NaN by, one compare
/// and one blend in a vector loop (`f32::max`'s NaN rule kept the compiler from vectorizing).
#[inline(always)]
pub fn running_max(m: f32, v: f32) -> f32 {
    if v > m {
        v
    } else {
        m
    }
}

/// Query rows `softmax_step` takes side by side: one vector lane each (a 512-bit vector).
pub const SOFTMAX_ROWS: usize = 16;

/// A block's query rows in `softmax_step`: the keys of the step each sees, and their state.
pub struct SoftmaxRows<'a> {
    /// Row `i` sees the step's keys `live[i].0 .. live[i].1` (none when empty).
    pub live: &'a [(usize, usize)],
    /// Each row's largest scaled score so far.
    pub max: &'a mut [f32],
    /// Each row's sum of exponentials so far.
    pub sum: &'a mut [f32],
    /// Written: the factor each row's weighted sums take for the step (1 where `max` stays).
    pub rescale: &'a mut [f32],
}

/// One step of attention's online softmax over a block's query rows, side by side:
/// `s[j·stride + i]` is key `j`'s score against row `i` (`s.len() / stride` keys, one row per
/// `rows.live` entry).
///
/// In place, as each row on its own would go (`exp_sub`'s arithmetic): a live score becomes
/// `p = score·scale`; where the row's largest `p` tops `max[i]`, `max[i]` takes it and `sum[i]`
/// is multiplied by `rescale[i] = e^(old − new)`, the factor the row's weighted sums take too
/// (1 where `max[i]` stays); then every live `p` becomes `e^(p − max[i])` and its dead keys
/// zero, and `sum[i]` adds the live ones, key `j` into lane `(j − live[i].0) % 8` and the lanes
/// as `exp_sub` adds them. Rows past the shortest of `rows`' slices are left as they were.
///
/// The rows' lanes run through each step together, `SOFTMAX_ROWS` at a time where `stride`
/// holds them (vector operations, no sums across lanes); one row at a time otherwise.
#[inline(always)]
pub fn softmax_step(s: &mut [f32], stride: usize, scale: f32, rows: &mut SoftmaxRows<'_>) {
    let SoftmaxRows {
        live,
        max,
        sum,
        rescale,
    } = rows;
    let n = live.len().min(max.len()).min(sum.len()).min(rescale.len());
    let keys = s.len().checked_div(stride).unwrap_or(0);
    if keys == 0 {
        // No scores: no row's maximum or sum moves.
        rescale[..n].fill(1.0);
        return;
    }
    // Rows past the stride have no place in `s`.
    let n = n.min(stride);
    let mut r0 = 0;
    while r0 < n {
        let group = (n - r0).min(SOFTMAX_ROWS);
        if r0 + SOFTMAX_ROWS <= stride && keys <= i32::MAX as usize {
            let mut step = LaneStep {
                rows: group,
                live: [(0, 0); SOFTMAX_ROWS],
                max: [f32::NEG_INFINITY; SOFTMAX_ROWS],
                sum: [0.0; SOFTMAX_ROWS],
                rescale: [1.0; SOFTMAX_ROWS],
            };
            step.live[..group].copy_from_slice(&live[r0..r0 + group]);
            step.max[..group].copy_from_slice(&max[r0..r0 + group]);
            step.sum[..group].copy_from_slice(&sum[r0..r0 + group]);
            step.run(&mut s[r0..], stride, keys, scale);
            max[r0..r0 + group].copy_from_slice(&step.max[..group]);
            sum[r0..r0 + group].copy_from_slice(&step.sum[..group]);
            rescale[r0..r0 + group].copy_from_slice(&step.rescale[..group]);
        } else {
            for i in r0..r0 + group {
                let row = RowStep {
                    live: live[i],
                    stride,
                    keys,
                };
                (max[i], sum[i], rescale[i]) = row.run(&mut s[i..], scale, max[i], sum[i]);
            }
        }
        r0 += group;
    }
}

/// `SOFTMAX_ROWS` rows of `softmax_step` in vector lanes: the block's first `rows`, the lanes
/// past them without live keys and their scores left as they were.
struct LaneStep {
    rows: usize,
    live: [(usize, usize); SOFTMAX_ROWS],
    max: [f32; SOFTMAX_ROWS],
    sum: [f32; SOFTMAX_ROWS],
    rescale: [f32; SOFTMAX_ROWS],
}

impl LaneStep {
    /// The step over `keys` keys of `s` (at most `i32::MAX`), lane `l`'s score of key `j` at
    /// `s[j·stride + l]` (`stride >= SOFTMAX_ROWS`).
    #[inline(always)]
    fn run(&mut self, s: &mut [f32], stride: usize, keys: usize, scale: f32) {
        const L: usize = SOFTMAX_ROWS;
        fn lanes(s: &mut [f32], at: usize) -> &mut [f32; L] {
            (&mut s[at..][..L])
                .try_into()
                .unwrap_or_else(|_| unreachable!())
        }
        // 32-bit lanes, as the floats': one vector compare per key.
        let bound = |k: usize| k.min(keys) as i32;
        let (lo, hi) = (self.live.map(|l| bound(l.0)), self.live.map(|l| bound(l.1)));
        let mut top = [f32::NEG_INFINITY; L];
        for j in 0..keys {
            let (v, key) = (lanes(s, j * stride), j as i32);
            for (t, (v, (a, b))) in top.iter_mut().zip(v.iter().zip(lo.iter().zip(&hi))) {
                let live = (*a <= key) & (key < *b);
                let m = running_max(*t, v * scale);
                *t = if live { m } else { *t };
            }
        }
        let rows = self
            .max
            .iter_mut()
            .zip(&mut self.sum)
            .zip(&mut self.rescale);
        for (((max, sum), rescale), top) in rows.zip(top) {
            let grows = top > *max;
            let r = exp(*max - top);
            *rescale = if grows { r } else { 1.0 };
            *sum = if grows { *sum * r } else { *sum };
            *max = if grows { top } else { *max };
        }
        // Key j into part j % 8. `exp_sub` puts it into lane (j - live.0) % 8: the same parts
        // turned round, which its sum of the lanes, pairs k and k + 4 then pairs of pairs,
        // adds as it does these (the turn only swaps terms of its additions).
        let mut parts = [[0f32; L]; 8];
        for j0 in (0..keys).step_by(8) {
            for (k, part) in parts.iter_mut().enumerate() {
                let j = j0 + k;
                if j >= keys {
                    break;
                }
                let (v, key) = (lanes(s, j * stride), j as i32);
                for l in 0..L {
                    let live = (lo[l] <= key) & (key < hi[l]);
                    let e = if live {
                        exp(v[l] * scale - self.max[l])
                    } else {
                        0.0
                    };
                    v[l] = if l < self.rows { e } else { v[l] };
                    part[l] += e;
                }
            }
        }
        let p = &parts;
        for (l, sum) in self.sum.iter_mut().enumerate() {
            *sum += ((p[0][l] + p[4][l]) + (p[2][l] + p[6][l]))
                + ((p[1][l] + p[5][l]) + (p[3][l] + p[7][l]));
        }
    }
}

/// One row of `softmax_step` (a block whose stride does not hold `SOFTMAX_ROWS` lanes).
struct RowStep {
    live: (usize, usize),
    stride: usize,
    keys: usize,
}

impl RowStep {
    /// The row whose score of key `j` is `s[j·stride]`: its new maximum, sum and rescale factor.
    fn run(&self, s: &mut [f32], scale: f32, max: f32, sum: f32) -> (f32, f32, f32) {
        let (a, b) = self.live;
        let is_live = |j: usize| a <= j && j < b;
        let mut top = f32::NEG_INFINITY;
        for j in (0..self.keys).filter(|j| is_live(*j)) {
            top = running_max(top, s[j * self.stride] * scale);
        }
        let (mut max, mut sum, mut rescale) = (max, sum, 1.0);
        if top > max {
            rescale = exp(max - top);
            sum *= rescale;
            max = top;
        }
        let mut lanes = [0f32; 8];
        for j in 0..self.keys {
            let v = &mut s[j * self.stride];
            *v = if is_live(j) {
                exp(*v * scale - max)
            } else {
                0.0
            };
            lanes[j % 8] += *v;
        }
        let [l0, l1, l2, l3, l4, l5, l6, l7] = lanes;
        let total = ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7));
        (max, sum + total, rescale)
    }
}

/// `out[i] += a[i·stride] · v` for each run `out[i]` of `v.len()` floats that `a` has a weight
/// for, a multiply then an add per value (a zero weight adds nothing and is skipped): attention's
/// weighted sum over a widened value row, compiled per instruction set like `silu_mul`.
#[inline(always)]
pub fn add_weighted(out: &mut [f32], a: &[f32], stride: usize, v: &[f32]) {
    if v.is_empty() {
        return;
    }
    for (i, o) in out.chunks_exact_mut(v.len()).enumerate() {
        let Some(&w) = i.checked_mul(stride).and_then(|at| a.get(at)) else {
            break;
        };
        if w != 0.0 {
            for (o, x) in o.iter_mut().zip(v) {
                *o += w * x;
            }
        }
    }
}

/// `x += y`.
///
/// # Errors
/// [`Error::Length`] if the lengths differ.
pub fn add(x: &mut [f32], y: &[f32]) -> Result<()> {
    same_len("add", x.len(), y.len())?;
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
    Ok(())
}

/// Adds `bias` to every row of `x` (rows are `bias.len()` long).
///
/// # Errors
/// [`Error::NotBlockMultiple`] if `x` is not whole rows of `bias` (or `bias` is empty).
pub fn add_bias(x: &mut [f32], bias: &[f32]) -> Result<()> {
    if bias.is_empty() || !x.len().is_multiple_of(bias.len()) {
        return Err(Error::NotBlockMultiple {
            what: "bias input (rows of the bias's length)",
            len: x.len(),
            block: bias.len(),
        });
    }
    for row in x.chunks_exact_mut(bias.len()) {
        add(row, bias)?;
    }
    Ok(())
}

/// Fills `cos` and `sin` (each `inv_freq.len()` long) with the rotation angles of position `pos`,
/// computed in f32 as transformers does (`pos * inv_freq`, then cos and sin, each times `scale`:
/// YaRN's attention factor, 1 for other models).
pub fn rope_angles(pos: usize, inv_freq: &[f32], scale: f32, cos: &mut [f32], sin: &mut [f32]) {
    for ((f, c), s) in inv_freq.iter().zip(cos.iter_mut()).zip(sin.iter_mut()) {
        let a = pos as f32 * f;
        *c = libm::cosf(a) * scale;
        *s = libm::sinf(a) * scale;
    }
}

/// Rotates every head in `x` (heads are `2 * cos.len()` long) by the given angles.
///
/// # Errors
/// [`Error::Length`] if `cos` and `sin` differ, [`Error::NotBlockMultiple`] if `x` is not
/// whole heads.
pub fn rope(x: &mut [f32], cos: &[f32], sin: &[f32], style: RopeStyle) -> Result<()> {
    let half = cos.len();
    same_len("rope sin", half, sin.len())?;
    if half == 0 || !x.len().is_multiple_of(2 * half) {
        return Err(Error::NotBlockMultiple {
            what: "rope input (heads of 2 × angles)",
            len: x.len(),
            block: 2 * half,
        });
    }
    for head in x.chunks_exact_mut(2 * half) {
        for i in 0..half {
            let (a, b) = match style {
                RopeStyle::Halves => (i, i + half),
                RopeStyle::Adjacent => (2 * i, 2 * i + 1),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos[i] - x1 * sin[i];
            head[b] = x1 * cos[i] + x0 * sin[i];
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn softmax_is_stable_for_huge_inputs() {
        let mut x = [1000.0f32, 1001.0, 999.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[1] > x[0] && x[0] > x[2]);
    }

    #[test]
    fn rms_norm_of_constant_row_is_weight() {
        let mut out = [0.0; 4];
        rms_norm(&[3.0; 4], &[1.0, 2.0, 3.0, 4.0], 0.0, &mut out).unwrap();
        assert_eq!(out, [1.0, 2.0, 3.0, 4.0]);
        assert!(rms_norm(&[3.0; 5], &[1.0; 4], 0.0, &mut [0.0; 5]).is_err());
    }

    #[test]
    fn rope_styles_pair_different_elements() {
        let (cos, sin) = ([0.0f32, 1.0], [1.0f32, 0.0]);
        let mut h = [1.0f32, 2.0, 3.0, 4.0];
        rope(&mut h, &cos, &sin, RopeStyle::Halves).unwrap();
        // Pair (0, 2) rotated by 90°, pair (1, 3) untouched.
        assert_eq!(h, [-3.0, 2.0, 1.0, 4.0]);
        let mut a = [1.0f32, 2.0, 3.0, 4.0];
        rope(&mut a, &cos, &sin, RopeStyle::Adjacent).unwrap();
        // Pair (0, 1) rotated by 90°, pair (2, 3) untouched.
        assert_eq!(a, [-2.0, 1.0, 3.0, 4.0]);
    }

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri; run natively")]
    fn exp_matches_libm_within_2_ulp() {
        let mut x = -87.0f32;
        while x < 88.5 {
            let (a, b) = (exp(x), libm::expf(x));
            let ulp = (a.to_bits() as i64 - b.to_bits() as i64).abs();
            assert!(ulp <= 2, "exp({x}) = {a}, expf {b} ({ulp} ulp)");
            x += 0.001_3;
        }
        assert!(exp(-1000.0) < 1e-37 && exp(-1000.0) > 0.0);
        assert!(exp(100.0) > 1e38);
        assert!(exp(f32::NAN).is_nan());
    }

    proptest! {
        #[test]
        fn rope_preserves_norm(x in proptest::collection::vec(-10f32..10.0, 16), pos in 0usize..4096) {
            let inv: alloc::vec::Vec<f32> = (0..8).map(|i| 1.0 / libm::powf(10000.0, i as f32 / 8.0)).collect();
            let (mut c, mut s) = ([0f32; 8], [0f32; 8]);
            rope_angles(pos, &inv, 1.0, &mut c, &mut s);
            for style in [RopeStyle::Halves, RopeStyle::Adjacent] {
                let mut y = x.clone();
                rope(&mut y, &c, &s, style).unwrap();
                let n0: f32 = x.iter().map(|v| v * v).sum();
                let n1: f32 = y.iter().map(|v| v * v).sum();
                prop_assert!((n0 - n1).abs() <= 1e-4 * n0.max(1.0));
            }
        }

        #[test]
        fn softmax_sums_to_one(x in proptest::collection::vec(-80f32..80.0, 1..64)) {
            let mut y = x.clone();
            softmax(&mut y);
            prop_assert!((y.iter().sum::<f32>() - 1.0).abs() < 1e-5);
            prop_assert!(y.iter().all(|v| *v >= 0.0));
        }
    }
}
