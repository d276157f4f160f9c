//! The operations the layer loop is written against, and their CPU implementation.
//!
//! `model.rs` calls only these; a GPU backend implements the same trait, so the loop is never
//! copied. The CPU backend splits every mat-mul and the attention across an `Exec`.
use crate::config::{RopeStyle, MAX_HEAD_DIM};
use crate::error::{Error, Result};
use crate::exec::Exec;
use crate::kernels::{Activations, Kernels};
use crate::kv_cache::LayerKv;
use crate::ops;
use crate::quant::{self, q16, BlockQ16, Format, QK};
use crate::weights::Matrix;

/// The shape of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Each query sees itself and the `w - 1` positions before it.
    pub window: Option<usize>,
}

pub trait Backend {
    /// Row-wise RMSNorm of `x` into `out`.
    fn rms_norm(&mut self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) -> Result<()>;
    /// `outs[i] = x · mats[i]ᵀ` for `n_tok` rows of `x`, all matrices in one parallel job.
    fn matmul(
        &mut self,
        x: &[f32],
        n_tok: usize,
        mats: &[&Matrix<'_>],
        outs: &mut [&mut [f32]],
    ) -> Result<()>;
    /// Rotates each token's heads; `angles` holds `cos` then `sin` (`head_dim / 2` each) per token.
    fn rope(&mut self, x: &mut [f32], n_tok: usize, angles: &[f32], style: RopeStyle)
        -> Result<()>;
    /// Causal attention of `n_tok` queries at positions `first_pos ..` over the cached K and V.
    fn attention(
        &mut self,
        q: &[f32],
        kv: LayerKv<'_>,
        first_pos: usize,
        shape: AttentionShape,
        out: &mut [f32],
    ) -> Result<()>;
    fn add(&mut self, x: &mut [f32], y: &[f32]) -> Result<()>;
    fn add_bias(&mut self, x: &mut [f32], bias: &[f32]) -> Result<()>;
    fn silu_mul(&mut self, gate: &mut [f32], up: &[f32]) -> Result<()>;
}

/// The CPU backend: SIMD kernels from `Kernels`, threads from `Exec`, working memory from the
/// caller's scratch arena.
pub struct Cpu<'s, E: Exec + ?Sized> {
    pub kernels: &'static Kernels,
    pub exec: &'s E,
    /// Q16 copy of the current mat-mul input.
    pub q16: &'s mut [u8],
    /// Mat-mul output before it is reordered per token.
    pub tmp: &'s mut [f32],
}

impl<E: Exec + ?Sized> Backend for Cpu<'_, E> {
    fn rms_norm(&mut self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) -> Result<()> {
        ops::rms_norm(x, weight, eps, out)
    }

    fn matmul(
        &mut self,
        x: &[f32],
        n_tok: usize,
        mats: &[&Matrix<'_>],
        outs: &mut [&mut [f32]],
    ) -> Result<()> {
        let cols = mats.first().map_or(0, |m| m.cols);
        if mats.len() != outs.len()
            || mats.iter().any(|m| m.cols != cols)
            || x.len() != n_tok * cols
        {
            return Err(Error::Length {
                what: "mat-mul input",
                expected: n_tok * cols,
                got: x.len(),
            });
        }
        for (m, o) in mats.iter().zip(outs.iter()) {
            if o.len() != n_tok * m.rows {
                return Err(Error::Length {
                    what: "mat-mul output",
                    expected: n_tok * m.rows,
                    got: o.len(),
                });
            }
        }
        let q16 = if mats.iter().any(|m| m.format.is_quantized()) {
            let row = q16::row_bytes(cols);
            let have = self.q16.len();
            let q16 = self
                .q16
                .get_mut(..n_tok * row)
                .ok_or(Error::ArenaTooSmall {
                    what: "scratch (Q16 activations)",
                    needed: n_tok * row,
                    got: have,
                })?;
            for (xr, qr) in x.chunks_exact(cols).zip(q16.chunks_exact_mut(row)) {
                self.kernels.quantize_q16(xr, qr)?;
            }
            Some(&*q16)
        } else {
            None
        };
        let acts = Activations {
            f32: x,
            q16,
            n_tok,
            cols,
        };
        let total: usize = mats.iter().map(|m| m.rows).sum();
        let have = self.tmp.len();
        let tmp = self
            .tmp
            .get_mut(..total * n_tok)
            .ok_or(Error::ArenaTooSmall {
                what: "scratch (mat-mul output)",
                needed: total * n_tok * 4,
                got: have * 4,
            })?;
        // A few chunks per thread balance uneven progress; each chunk is a contiguous run of rows.
        let rows_per_chunk = total.div_ceil(self.exec.threads() * 4).max(1);
        let kernels = self.kernels;
        self.exec
            .for_each_chunk(tmp, rows_per_chunk * n_tok, &|i, out| {
                let mut row = i * rows_per_chunk;
                let mut out = out;
                let mut first = 0;
                for m in mats {
                    if out.is_empty() {
                        break;
                    }
                    if row >= first + m.rows {
                        first += m.rows;
                        continue;
                    }
                    let n = (first + m.rows - row).min(out.len() / n_tok);
                    let (here, rest) = out.split_at_mut(n * n_tok);
                    kernels.matmul_rows(m, &acts, row - first, here)?;
                    out = rest;
                    row += n;
                    first += m.rows;
                }
                Ok(())
            })?;
        // Reorder from [row][token] to [token][row], matrix by matrix.
        let mut first = 0;
        for (m, o) in mats.iter().zip(outs.iter_mut()) {
            let src = &tmp[first * n_tok..(first + m.rows) * n_tok];
            for (r, vals) in src.chunks_exact(n_tok).enumerate() {
                for (t, v) in vals.iter().enumerate() {
                    o[t * m.rows + r] = *v;
                }
            }
            first += m.rows;
        }
        Ok(())
    }

    fn rope(
        &mut self,
        x: &mut [f32],
        n_tok: usize,
        angles: &[f32],
        style: RopeStyle,
    ) -> Result<()> {
        if n_tok == 0 || !x.len().is_multiple_of(n_tok) || !angles.len().is_multiple_of(n_tok) {
            return Err(Error::Length {
                what: "rope input",
                expected: n_tok,
                got: x.len(),
            });
        }
        let per_tok = x.len() / n_tok;
        let half = angles.len() / n_tok / 2;
        for (xt, a) in x
            .chunks_exact_mut(per_tok)
            .zip(angles.chunks_exact(2 * half))
        {
            ops::rope(xt, &a[..half], &a[half..], style)?;
        }
        Ok(())
    }

    fn attention(
        &mut self,
        q: &[f32],
        kv: LayerKv<'_>,
        first_pos: usize,
        shape: AttentionShape,
        out: &mut [f32],
    ) -> Result<()> {
        let hd = shape.head_dim;
        if q.len() != out.len() || !q.len().is_multiple_of(shape.n_heads * hd) || hd > MAX_HEAD_DIM
        {
            return Err(Error::Length {
                what: "attention input",
                expected: out.len(),
                got: q.len(),
            });
        }
        let kernels = self.kernels;
        let attend = |i: usize, o: &mut [f32]| {
            let (t, h) = (i / shape.n_heads, i % shape.n_heads);
            let pos = first_pos + t;
            let lo = shape.window.map_or(0, |w| (pos + 1).saturating_sub(w));
            let kv_head = h / (shape.n_heads / shape.n_kv_heads);
            attend_one(kernels, &q[i * hd..(i + 1) * hd], &kv, kv_head, lo, pos, o)
        };
        // Roughly the multiply-adds of the scores and the weighted sum. Below a few hundred
        // thousand, handing chunks to other threads costs more than it saves.
        let n_tok = q.len() / (shape.n_heads * hd);
        let work = q.len() * 2 * (first_pos + n_tok);
        if work < PARALLEL_ATTENTION_WORK {
            crate::exec::Serial.for_each_chunk(out, hd, &attend)
        } else {
            self.exec.for_each_chunk(out, hd, &attend)
        }
    }

    fn add(&mut self, x: &mut [f32], y: &[f32]) -> Result<()> {
        ops::add(x, y)
    }

    fn add_bias(&mut self, x: &mut [f32], bias: &[f32]) -> Result<()> {
        ops::add_bias(x, bias)
    }

    fn silu_mul(&mut self, gate: &mut [f32], up: &[f32]) -> Result<()> {
        ops::silu_mul(gate, up)
    }
}

/// Attention smaller than this many multiply-adds runs on the calling thread.
const PARALLEL_ATTENTION_WORK: usize = 1 << 18;

/// Keys scored per step of the online softmax.
const KEY_STEP: usize = 32;

/// One query head against cached positions `lo ..= pos`, into `out`.
///
/// An online softmax (keep the running maximum, rescale when it grows) visits every key once and
/// needs no buffer as long as the context, so attention takes no scratch memory at all.
fn attend_one(
    kernels: &Kernels,
    q: &[f32],
    kv: &LayerKv<'_>,
    kv_head: usize,
    lo: usize,
    pos: usize,
    out: &mut [f32],
) -> Result<()> {
    let hd = q.len();
    let scale = 1.0 / libm::sqrtf(hd as f32);
    let mut q16 = [0u8; MAX_HEAD_DIM / QK * BlockQ16::BYTES];
    let mut row = [0f32; MAX_HEAD_DIM];
    if kv.format == Format::Q8_0 {
        kernels.quantize_q16(q, &mut q16[..q16::row_bytes(hd)])?;
    }
    out.fill(0.0);
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
    let mut scores = [0f32; KEY_STEP];
    let mut start = lo;
    while start <= pos {
        let end = (start + KEY_STEP).min(pos + 1);
        let scores = &mut scores[..end - start];
        if kv.format == Format::Q8_0 {
            // Four keys per call: the cached keys take the weight rows' place.
            let q16 = &q16[..q16::row_bytes(hd)];
            let mut j = start;
            for s4 in scores.chunks_mut(4) {
                if s4.len() == 4 {
                    let keys = core::array::from_fn(|i| kv.k_row(j + i, kv_head));
                    s4.copy_from_slice(&(kernels.q8_0.rows4)(keys, q16));
                } else {
                    for (i, s) in s4.iter_mut().enumerate() {
                        *s = (kernels.q8_0.one)(kv.k_row(j + i, kv_head), q16);
                    }
                }
                j += s4.len();
            }
            scores.iter_mut().for_each(|s| *s *= scale);
        } else {
            for (j, s) in (start..end).zip(scores.iter_mut()) {
                let k = kv.k_row(j, kv_head);
                // Rows come from the cache, whose layout fixed their lengths: the table's kernels
                // need no further checks.
                let dot = match kv.format {
                    Format::F32 => (kernels.dot_f32)(k, q),
                    format => {
                        quant::dequantize_row(format, k, &mut row[..hd])?;
                        row[..hd].iter().zip(q).map(|(a, b)| a * b).sum()
                    }
                };
                *s = dot * scale;
            }
        }
        let step_max = scores.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
        if step_max > max {
            let r = ops::exp(max - step_max);
            out.iter_mut().for_each(|o| *o *= r);
            sum *= r;
            max = step_max;
        }
        // All the step's probabilities first: a loop the compiler vectorizes.
        for s in scores.iter_mut() {
            *s = ops::exp(*s - max);
            sum += *s;
        }
        for (j, p) in (start..end).zip(scores.iter()) {
            let v = kv.v_row(j, kv_head);
            match kv.format {
                Format::Q8_0 => (kernels.axpy_q8_0)(out, *p, v),
                format => add_scaled_row(format, v, *p, out, &mut row[..hd])?,
            }
        }
        start = end;
    }
    if sum > 0.0 {
        let inv = 1.0 / sum;
        out.iter_mut().for_each(|o| *o *= inv);
    }
    Ok(())
}

/// `out += p · v` for a cached f32 or f16 V row; `buf` (as long as `out`) holds a widened f16 row.
fn add_scaled_row(
    format: Format,
    v: &[u8],
    p: f32,
    out: &mut [f32],
    buf: &mut [f32],
) -> Result<()> {
    if format == Format::F32 {
        for (o, b) in out.iter_mut().zip(v.chunks_exact(4)) {
            *o += p * f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    } else {
        quant::dequantize_row(format, v, buf)?;
        for (o, x) in out.iter_mut().zip(buf.iter()) {
            *o += p * x;
        }
    }
    Ok(())
}
