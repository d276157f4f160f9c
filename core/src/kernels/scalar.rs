//! The reference kernels: plain loops, the ground truth every SIMD twin is tested against.
//!
//! Every function here is memory-safe for any input: it processes as many whole blocks as the
//! shortest argument holds. The checked entry points in `kernels` reject mismatched lengths
//! before calling into any table.
use super::{Kernels, QuantDots, WeightStrides};
use crate::quant::k_quants::BLOCKS_PER_SUPER;
use crate::quant::q8k::SUM_SPAN;
use crate::quant::{
    f16_at, iq4_nl, q8k, quantize_blocks, Block, BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS,
    BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS, BlockIQ4NL, BlockIQ4XS, BlockQ16, BlockQ2K, BlockQ3K,
    BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0,
    BlockTQ1_0, BlockTQ2_0, KBlock, QK,
};

/// The scalar table.
pub static KERNELS: Kernels = TABLE;

/// The table by value, for SIMD tables that keep some scalar entries (`..scalar::TABLE`).
pub(super) const TABLE: Kernels = Kernels {
    name: "scalar",
    quantize_q8_0: quantize_blocks::<BlockQ8_0>,
    quantize_q16: quantize_blocks::<BlockQ16>,
    quantize_q8k: q8k::quantize_row,
    q8_0: dots::<BlockQ8_0>(),
    q4_0: dots::<BlockQ4_0>(),
    q4_1: dots::<BlockQ4_1>(),
    q5_0: dots::<BlockQ5_0>(),
    q5_1: dots::<BlockQ5_1>(),
    q2_k: q8k_dots::<BlockQ2K>(),
    q3_k: q8k_dots::<BlockQ3K>(),
    q4_k: q8k_dots::<BlockQ4K>(),
    q5_k: q8k_dots::<BlockQ5K>(),
    q6_k: q8k_dots::<BlockQ6K>(),
    iq4_nl: dots::<BlockIQ4NL>(),
    iq4_xs: q8k_dots::<BlockIQ4XS>(),
    iq3_s: q8k_dots::<BlockIQ3S>(),
    iq3_xxs: q8k_dots::<BlockIQ3XXS>(),
    iq2_xxs: q8k_dots::<BlockIQ2XXS>(),
    iq2_xs: q8k_dots::<BlockIQ2XS>(),
    iq2_s: q8k_dots::<BlockIQ2S>(),
    iq1_s: q8k_dots::<BlockIQ1S>(),
    iq1_m: q8k_dots::<BlockIQ1M>(),
    tq1_0: q8k_dots::<BlockTQ1_0>(),
    tq2_0: q8k_dots::<BlockTQ2_0>(),
    dot_f32: |w, x| dot_f32::<1>(w, [x])[0],
    dot_f32_x4: dot_f32::<4>,
    dot_f16: |w, x| dot_f16::<1>(w, [x])[0],
    dot_f16_x4: dot_f16::<4>,
    dot_bf16: |w, x| dot_bf16::<1>(w, [x])[0],
    dot_bf16_x4: dot_bf16::<4>,
    axpy_q8_0,
    silu_mul: crate::ops::silu_mul,
    exp_sub: crate::ops::exp_sub,
    add_weighted: crate::ops::add_weighted,
    softmax_step: crate::ops::softmax_step,
    widen_f16: crate::quant::float::dequantize_row_f16,
};

pub(super) const fn dots<W: Unpack>() -> QuantDots {
    QuantDots {
        one: |w, x| dot::<W, 1>(w, [x])[0],
        x4: dot::<W, 4>,
        rows4: |w, x| w.map(|w| dot::<W, 1>(w, [x])[0]),
        rows2x4: |w, x| w.map(|w| dot::<W, 4>(w, x)),
        panel: None,
        k_panel: None,
    }
}

/// The dots of a k-quant against Q8K activations.
pub(super) const fn q8k_dots<K: KBlock>() -> QuantDots {
    QuantDots {
        one: |w, x| dot_q8k::<K, 1>(w, [x])[0],
        x4: dot_q8k::<K, 4>,
        rows4: |w, x| w.map(|w| dot_q8k::<K, 1>(w, [x])[0]),
        rows2x4: |w, x| w.map(|w| dot_q8k::<K, 4>(w, x)),
        panel: None,
        k_panel: None,
    }
}

/// K-quant weights · N rows of Q8K activations. Per super-block, two exact integer sums over
/// its blocks' halves (`k` = 2j + h the half's index, `u` the stored quants): `isum = Σ scale ·
/// (Σ u·x − OFFSET · sums[k])` and `msum = Σ min · sums[k]`; then `q8k_step`.
pub fn dot_q8k<K: KBlock, const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    let ns = xs
        .iter()
        .fold(w.len() / K::BYTES, |n, x| n.min(x.len() / BlockQ8K::BYTES));
    let mut acc = [0f32; N];
    for (s, sb) in w.chunks_exact(K::BYTES).take(ns).enumerate() {
        let (d, dmin) = K::d_dmin(sb);
        let ints = K::ints(sb);
        let quants: [[u8; QK]; BLOCKS_PER_SUPER] = core::array::from_fn(|j| K::quants(sb, j));
        for (a, x) in acc.iter_mut().zip(&xs) {
            let xb = BlockQ8K::read(&x[s * BlockQ8K::BYTES..]);
            let (mut isum, mut msum) = (0i32, 0i32);
            for (j, q) in quants.iter().enumerate() {
                for (h, q) in q.chunks_exact(SUM_SPAN).enumerate() {
                    let k = 2 * j + h;
                    let qx: i32 = q
                        .iter()
                        .zip(&xb.qs[SUM_SPAN * k..][..SUM_SPAN])
                        .map(|(q, x)| *q as i32 * *x as i32)
                        .sum();
                    let sum = xb.sums[k] as i32;
                    isum += ints.scales[k] as i32 * (qx - K::OFFSET * sum);
                    msum += ints.mins[k] as i32 * sum;
                }
            }
            *a += q8k_step(d, dmin, xb.d, isum, msum);
        }
    }
    acc
}

/// One super-block's contribution from its integer sums (see `dot_q8k`): `(d·dx)·isum −
/// (dmin·dx)·msum`, in this order, which every kernel follows for the same bits.
#[inline(always)]
pub fn q8k_step(d: f32, dmin: f32, dx: f32, isum: i32, msum: i32) -> f32 {
    (d * dx) * isum as f32 - (dmin * dx) * msum as f32
}

/// A weight block as integers: `value[j] = d · q[j] + m`.
pub trait Unpack {
    /// Bytes of one block.
    const BYTES: usize;
    /// Whether blocks carry a minimum `m` (otherwise it is 0 and its term is skipped).
    const HAS_MIN: bool = false;
    /// `(d, m, q)` of the block at the start of `b`.
    fn unpack(b: &[u8]) -> (f32, f32, [i32; QK]);
}

/// Block `b` of the row `w`.
pub fn unpack_at<W: Unpack>(w: &[u8], b: usize) -> (f32, f32, [i32; QK]) {
    W::unpack(&w[b * W::BYTES..])
}

impl Unpack for BlockQ8_0 {
    const BYTES: usize = Self::BYTES;
    fn unpack(b: &[u8]) -> (f32, f32, [i32; QK]) {
        (
            f16_at(b),
            0.0,
            core::array::from_fn(|j| (b[2 + j] as i8) as i32),
        )
    }
}

impl Unpack for BlockQ4_0 {
    const BYTES: usize = Self::BYTES;
    fn unpack(b: &[u8]) -> (f32, f32, [i32; QK]) {
        (f16_at(b), 0.0, nibbles(&b[2..]).map(|n| n - 8))
    }
}

impl Unpack for BlockQ4_1 {
    const BYTES: usize = Self::BYTES;
    const HAS_MIN: bool = true;
    fn unpack(b: &[u8]) -> (f32, f32, [i32; QK]) {
        (f16_at(b), f16_at(&b[2..]), nibbles(&b[4..]))
    }
}

impl Unpack for BlockQ5_0 {
    const BYTES: usize = Self::BYTES;
    fn unpack(b: &[u8]) -> (f32, f32, [i32; QK]) {
        let q = Self::read(b);
        (f16_at(b), 0.0, fives(&q.qh, &q.qs).map(|n| n - 16))
    }
}

impl Unpack for BlockQ5_1 {
    const BYTES: usize = Self::BYTES;
    const HAS_MIN: bool = true;
    fn unpack(b: &[u8]) -> (f32, f32, [i32; QK]) {
        let q = Self::read(b);
        (f16_at(b), f16_at(&b[2..]), fives(&q.qh, &q.qs))
    }
}

impl Unpack for BlockIQ4NL {
    const BYTES: usize = Self::BYTES;
    fn unpack(b: &[u8]) -> (f32, f32, [i32; QK]) {
        (f16_at(b), 0.0, iq4_nl::grid_values(&b[2..]).map(i32::from))
    }
}

/// The five-bit quants of a Q5 block.
fn fives(qh: &[u8; 4], qs: &[u8; QK / 2]) -> [i32; QK] {
    crate::quant::q5_0::unpack5(qh, qs).map(i32::from)
}

/// Values 0..16 are the low nibbles of the 16 bytes, 16..32 the high ones.
fn nibbles(qs: &[u8]) -> [i32; QK] {
    core::array::from_fn(|j| {
        let n = qs[j % (QK / 2)];
        (if j < QK / 2 { n & 0x0f } else { n >> 4 }) as i32
    })
}

/// `out[i] += Σ_k a[i·w.run + k·w.key] · rows[k]` for each whole run `out[i]` (as long as the
/// shortest row's whole blocks) that `a` has all its weights for (`WeightStrides::runs`), over
/// every row, in order.
pub fn axpy_q8_0(out: &mut [f32], a: &[f32], w: WeightStrides, rows: &[&[u8]]) {
    let nb = super::q8_0_blocks(rows);
    let n = nb * QK;
    if n == 0 {
        return;
    }
    let runs = w.runs(a.len(), rows.len(), out.len() / n);
    for (i, o) in out.chunks_exact_mut(n).take(runs).enumerate() {
        for (k, row) in rows.iter().enumerate() {
            for (o, b) in o
                .chunks_exact_mut(QK)
                .zip(row.chunks_exact(BlockQ8_0::BYTES))
            {
                let ad = a[i * w.run + k * w.key] * f16_at(b);
                for (o, q) in o.iter_mut().zip(&b[2..]) {
                    *o += ad * (*q as i8) as f32;
                }
            }
        }
    }
}

/// Weights in format `W` · N rows of Q16 activations: per block `dw·dx·Σ qw·qx + m·(dx·Σ qx)`,
/// the last factor being the activation block's `s`.
pub fn dot<W: Unpack, const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    let nb = xs
        .iter()
        .fold(w.len() / W::BYTES, |n, x| n.min(x.len() / BlockQ16::BYTES));
    let mut acc = [0f32; N];
    for b in 0..nb {
        let (dw, mw, qw) = unpack_at::<W>(w, b);
        for (a, x) in acc.iter_mut().zip(&xs) {
            let xb = BlockQ16::read(&x[b * BlockQ16::BYTES..]);
            let prod: i32 = qw.iter().zip(&xb.qs).map(|(p, q)| p * *q as i32).sum();
            *a += prod as f32 * (dw * xb.d);
            if W::HAS_MIN {
                *a += mw * xb.s;
            }
        }
    }
    acc
}

/// f32 weights (little-endian bytes) · N rows of f32 activations.
pub fn dot_f32<const N: usize>(w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
    dot_floats(w, xs, 4, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// f16 weights (little-endian bytes) · N rows of f32 activations.
pub fn dot_f16<const N: usize>(w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
    dot_floats(w, xs, 2, f16_at)
}

/// bf16 weights (little-endian bytes) · N rows of f32 activations.
pub fn dot_bf16<const N: usize>(w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
    dot_floats(w, xs, 2, |b| {
        f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)
    })
}

/// Weights of `bytes` bytes per value, read by `value`, · N rows of f32 activations, in order.
fn dot_floats<const N: usize>(
    w: &[u8],
    xs: [&[f32]; N],
    bytes: usize,
    value: impl Fn(&[u8]) -> f32,
) -> [f32; N] {
    let n = xs.iter().fold(w.len() / bytes, |n, x| n.min(x.len()));
    let mut acc = [0f32; N];
    for (i, b) in w[..n * bytes].chunks_exact(bytes).enumerate() {
        let v = value(b);
        for (a, x) in acc.iter_mut().zip(&xs) {
            *a += v * x[i];
        }
    }
    acc
}
