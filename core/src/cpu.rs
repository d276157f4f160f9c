//! The CPU backend: SIMD kernels from `Kernels`, threads from `Exec`, the activations and the KV
//! cache in memory the caller lent (`Scratch`, `KvCache`).
use crate::arena::Buffers;
use crate::attention::{self, AttentionShape};
use crate::backend::{Backend, Segment};
use crate::config::RopeStyle;
use crate::error::{Error, Result};
use crate::exec::{ChunkFn, Exec, Serial};
use crate::kernels::k_panel::KTokens;
use crate::kernels::panel::PANEL;
use crate::kernels::{transposed_tokens, Activations, Kernels};
use crate::kv_cache::KvCache;
use crate::matrix::Matrix;
use crate::model::Model;
use crate::ops;
use crate::quant::ActivationFormat;
use crate::sample;

pub(crate) struct Cpu<'a, 'b, 'w, 'c, E: Exec + ?Sized> {
    model: &'a Model<'w>,
    /// One cache per sequence.
    caches: &'a mut [&'b mut KvCache<'c>],
    b: Buffers<'a>,
    mm: MatMul<'a, E>,
    /// Rows of logits the scratch holds (`b.logits` is lent out while they are computed).
    logit_rows: usize,
}

/// A mat-mul's kernels, threads and working memory.
struct MatMul<'a, E: Exec + ?Sized> {
    kernels: &'static Kernels,
    exec: &'a E,
    /// Q16 and Q8K copies of the current mat-mul input.
    quantized: &'a mut [u8],
    /// The Q8K copy's tiles, transposed for the k-panel.
    k_tiles: &'a mut [KTokens],
    /// Mat-mul output before it is reordered per token.
    tmp: &'a mut [f32],
}

impl<'a, 'b, 'w, 'c, E: Exec + ?Sized> Cpu<'a, 'b, 'w, 'c, E> {
    pub(crate) fn new(
        model: &'a Model<'w>,
        exec: &'a E,
        caches: &'a mut [&'b mut KvCache<'c>],
        mut b: Buffers<'a>,
    ) -> Self {
        let mm = MatMul {
            kernels: model.kernels(),
            exec,
            quantized: core::mem::take(&mut b.quantized),
            k_tiles: core::mem::take(&mut b.k_tiles),
            tmp: core::mem::take(&mut b.tmp),
        };
        let logit_rows = b.logits.len() / model.config.vocab_size;
        Cpu {
            model,
            caches,
            b,
            mm,
            logit_rows,
        }
    }
}

impl<E: Exec + ?Sized> Backend for Cpu<'_, '_, '_, '_, E> {
    fn max_batch(&self) -> usize {
        self.b.x.len() / self.model.config.hidden_size
    }

    fn sequences(&self) -> usize {
        self.caches.len()
    }

    fn kv_len(&self, seq: usize) -> usize {
        self.caches[seq].len()
    }

    fn kv_capacity(&self, seq: usize) -> usize {
        self.caches[seq].max_seq()
    }

    fn embed(&mut self, tokens: &[&[u32]], segments: &[Segment]) -> Result<()> {
        let c = &self.model.config;
        let (h, hd, half) = (c.hidden_size, c.head_dim, c.head_dim / 2);
        let scale = c.rope_attention_factor();
        for seg in segments {
            let ids = &tokens[seg.seq][seg.offset..seg.offset + seg.len];
            let xs = self.b.x[seg.row * h..].chunks_exact_mut(h);
            for (&token, x) in ids.iter().zip(xs) {
                self.model.weights.embed.dequantize_row(token as usize, x)?;
            }
            let angles = self.b.rope[seg.row * hd..]
                .chunks_exact_mut(hd)
                .take(seg.len);
            for (t, a) in angles.enumerate() {
                let (cos, sin) = a.split_at_mut(half);
                ops::rope_angles(seg.pos0 + t, self.model.inv_freq(), scale, cos, sin);
            }
        }
        Ok(())
    }

    fn qkv(&mut self, layer: usize, n: usize) -> Result<()> {
        let (c, l) = (&self.model.config, &self.model.weights.layers[layer]);
        let (h, qd, kvd) = (c.hidden_size, c.q_dim(), c.kv_dim());
        let b = &mut self.b;
        let xb = &mut b.xb[..n * h];
        ops::rms_norm(&b.x[..n * h], &l.attn_norm, c.rms_norm_eps, xb)?;
        let (q, k, v) = (&mut b.q[..n * qd], &mut b.k[..n * kvd], &mut b.v[..n * kvd]);
        self.mm
            .matmul(xb, n, &[&l.wq, &l.wk, &l.wv], &mut [q, k, v])?;
        for (buf, bias) in [(q, &l.bq), (k, &l.bk), (v, &l.bv)] {
            if let Some(bias) = bias {
                ops::add_bias(buf, bias)?;
            }
        }
        Ok(())
    }

    fn rope_store(&mut self, layer: usize, segments: &[Segment]) -> Result<()> {
        let c = &self.model.config;
        let (hd, qd, kvd) = (c.head_dim, c.q_dim(), c.kv_dim());
        let b = &mut self.b;
        for seg in segments {
            let (first, n) = (seg.row, seg.len);
            let angles = &b.rope[first * hd..(first + n) * hd];
            let q = &mut b.q[first * qd..(first + n) * qd];
            let k = &mut b.k[first * kvd..(first + n) * kvd];
            rope(q, n, angles, c.rope_style)?;
            rope(k, n, angles, c.rope_style)?;
            let v = &b.v[first * kvd..(first + n) * kvd];
            self.caches[seg.seq].store(self.mm.kernels, layer, seg.pos0, k, v)?;
        }
        Ok(())
    }

    fn attention(&mut self, layer: usize, segments: &[Segment]) -> Result<()> {
        let c = &self.model.config;
        let shape = AttentionShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            window: c.sliding_window,
        };
        let qd = c.q_dim();
        let kernels = self.mm.kernels;
        // A decode step of several sequences (one token each, in consecutive rows): a chunk per
        // sequence, each attending on one thread, instead of a fork and join per sequence for a
        // few heads each. The same arithmetic per head either way, so the same bits.
        let first = segments.first().map_or(0, |s| s.row);
        let one_token_each = segments.len() > 1
            && segments
                .iter()
                .enumerate()
                .all(|(i, s)| s.len == 1 && s.row == first + i);
        if one_token_each {
            let caches = &*self.caches;
            let q = &self.b.q;
            let att = &mut self.b.att[first * qd..(first + segments.len()) * qd];
            return self.mm.exec.for_each_chunk(att, qd, &|i, out| {
                let seg = &segments[i];
                let q = &q[seg.row * qd..(seg.row + 1) * qd];
                let kv = caches[seg.seq].layer(layer);
                attention::attend(kernels, &Serial, q, kv, seg.pos0, shape, out)
            });
        }
        for seg in segments {
            let rows = seg.row * qd..(seg.row + seg.len) * qd;
            let (q, att) = (&self.b.q[rows.clone()], &mut self.b.att[rows]);
            let kv = self.caches[seg.seq].layer(layer);
            attention::attend(kernels, self.mm.exec, q, kv, seg.pos0, shape, att)?;
        }
        Ok(())
    }

    fn attn_out(&mut self, layer: usize, n: usize) -> Result<()> {
        let (c, l) = (&self.model.config, &self.model.weights.layers[layer]);
        let h = c.hidden_size;
        let b = &mut self.b;
        self.mm
            .matmul_add(&b.att[..n * c.q_dim()], n, &l.wo, &mut b.x[..n * h])
    }

    fn gate_up(&mut self, layer: usize, n: usize) -> Result<()> {
        let (c, l) = (&self.model.config, &self.model.weights.layers[layer]);
        let (h, ff) = (c.hidden_size, c.intermediate_size);
        let b = &mut self.b;
        let xb = &mut b.xb[..n * h];
        ops::rms_norm(&b.x[..n * h], &l.ffn_norm, c.rms_norm_eps, xb)?;
        let gate = &mut b.gate[..n * ff];
        self.mm.silu_gate_up(xb, n, [&l.w_gate, &l.w_up], gate)
    }

    fn ffn_out(&mut self, layer: usize, n: usize) -> Result<()> {
        let (c, l) = (&self.model.config, &self.model.weights.layers[layer]);
        let (h, ff) = (c.hidden_size, c.intermediate_size);
        let b = &mut self.b;
        self.mm
            .matmul_add(&b.gate[..n * ff], n, &l.w_down, &mut b.x[..n * h])
    }

    fn final_norm(&mut self, first: usize, n: usize) -> Result<()> {
        let c = &self.model.config;
        let rows = first * c.hidden_size..(first + n) * c.hidden_size;
        let (x, out) = (&self.b.x[rows.clone()], &mut self.b.xb[rows]);
        ops::rms_norm(x, &self.model.weights.norm, c.rms_norm_eps, out)
    }

    fn read_hidden(&mut self, first: usize, out: &mut [f32]) -> Result<()> {
        let have = self.b.xb.len();
        let start = first * self.model.config.hidden_size;
        let src = self
            .b
            .xb
            .get(start..start + out.len())
            .ok_or(Error::OutOfRange {
                what: "hidden state value",
                index: start + out.len() - 1,
                len: have,
            })?;
        out.copy_from_slice(src);
        Ok(())
    }

    fn logits(&mut self, first: usize, out: &mut [f32]) -> Result<()> {
        let c = &self.model.config;
        let (h, vocab) = (c.hidden_size, c.vocab_size);
        let out_proj = self.model.weights.output();
        let rows = &self.b.xb[first * h..];
        // As many tokens at a time as the logit buffer holds rows: the mat-mul's reorder buffer
        // holds that many rows too.
        let at_once = self.max_logit_rows();
        for (xs, o) in rows
            .chunks(at_once * h)
            .zip(out.chunks_mut(at_once * vocab))
        {
            let k = o.len() / vocab;
            self.mm.matmul(&xs[..k * h], k, &[out_proj], &mut [o])?;
        }
        // A NaN or an infinity here came from the weights; sampling would pick from garbage.
        self.mm.exec.for_each_chunk(out, vocab, &|i, row| {
            if row.iter().all(|v| v.is_finite()) {
                Ok(())
            } else {
                Err(Error::NotFinite {
                    what: "logits",
                    row: first + i,
                })
            }
        })
    }

    fn argmax(&mut self, row: usize) -> Result<u32> {
        let logits = core::mem::take(&mut self.b.logits);
        let vocab = self.model.config.vocab_size;
        let result = self.logits(row, &mut logits[..vocab]);
        let id = sample::argmax(&logits[..vocab]);
        self.b.logits = logits;
        result.map(|()| id)
    }

    fn max_logit_rows(&self) -> usize {
        self.logit_rows
    }

    fn logits_rows(&mut self, rows: &[usize]) -> Result<&[f32]> {
        let (h, vocab) = (self.model.config.hidden_size, self.model.config.vocab_size);
        let k = rows.len();
        let have = self.max_logit_rows();
        if k > have {
            return Err(Error::Mismatch {
                op: "logits_rows",
                lhs: ("rows asked for", k),
                rhs: ("at most (max_logit_rows)", have),
            });
        }
        if rows.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::InvalidArgument {
                what: "logits_rows",
                reason: "the rows must ascend",
            });
        }
        let batch = self.b.xb.len() / h;
        if let Some(&r) = rows.iter().find(|&&r| r >= batch) {
            return Err(Error::OutOfRange {
                what: "logit row",
                index: r,
                len: batch,
            });
        }
        // Rows ascend, so row i comes from row rows[i] >= i: moving them up in order is safe.
        for (i, &r) in rows.iter().enumerate() {
            self.b.xb.copy_within(r * h..(r + 1) * h, i * h);
        }
        let logits = core::mem::take(&mut self.b.logits);
        let result = self.logits(0, &mut logits[..k * vocab]);
        self.b.logits = logits;
        result?;
        Ok(&self.b.logits[..k * vocab])
    }

    fn commit(&mut self, segments: &[Segment]) -> Result<()> {
        for seg in segments {
            self.caches[seg.seq].advance(seg.len);
        }
        Ok(())
    }
}

/// Rotates each token's heads; `angles` holds `cos` then `sin` (`head_dim / 2` each) per token.
fn rope(x: &mut [f32], n_tok: usize, angles: &[f32], style: RopeStyle) -> Result<()> {
    if n_tok == 0 || !x.len().is_multiple_of(n_tok) || !angles.len().is_multiple_of(n_tok) {
        return Err(Error::InvalidArgument {
            what: "rope",
            reason: "the input and the angles are not whole rows of one or more tokens",
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

impl<E: Exec + ?Sized> MatMul<'_, E> {
    /// `outs[i] = x · mats[i]ᵀ` for `n_tok` rows of `x`, all matrices in one parallel job.
    fn matmul(
        &mut self,
        x: &[f32],
        n_tok: usize,
        mats: &[&Matrix<'_>],
        outs: &mut [&mut [f32]],
    ) -> Result<()> {
        let exec = self.exec;
        self.compute(x, n_tok, mats)?.copy_out(exec, mats, outs)
    }

    /// `acc += x · matᵀ` (a residual add) for `n_tok` rows of `x`: each token's results are
    /// added straight from the scratch.
    fn matmul_add(
        &mut self,
        x: &[f32],
        n_tok: usize,
        mat: &Matrix<'_>,
        acc: &mut [f32],
    ) -> Result<()> {
        let exec = self.exec;
        ops::same_len("residual add", n_tok * mat.rows, acc.len())?;
        let results = self.compute(x, n_tok, &[mat])?;
        let add = |t: usize, row: &mut [f32]| {
            results.token_runs(&[mat], t, |_, row0, run| {
                ops::add(&mut row[row0..row0 + run.len()], run)
            })
        };
        if acc.len() >= PARALLEL_PASS {
            results.per_token(exec, acc, mat.rows, &add)
        } else {
            for (t, row) in acc.chunks_exact_mut(mat.rows).enumerate() {
                add(t, row)?;
            }
            Ok(())
        }
    }

    /// The feed-forward's hidden activations: `gate = SiLU(x · w_gateᵀ) · (x · w_upᵀ)`. Each
    /// token's products come straight from the mat-mul's scratch, in a parallel job over the
    /// tokens: no serial copy, no serial SiLU, and no buffer for the up projection.
    fn silu_gate_up(
        &mut self,
        x: &[f32],
        n_tok: usize,
        [w_gate, w_up]: [&Matrix<'_>; 2],
        gate: &mut [f32],
    ) -> Result<()> {
        let (exec, silu_mul) = (self.exec, self.kernels.silu_mul);
        if w_up.rows != w_gate.rows {
            return Err(Error::Mismatch {
                op: "SiLU(gate) · up",
                lhs: ("gate rows", w_gate.rows),
                rhs: ("up rows", w_up.rows),
            });
        }
        ops::same_len("SiLU(gate) · up", n_tok * w_gate.rows, gate.len())?;
        let mats = [w_gate, w_up];
        let results = self.compute(x, n_tok, &mats)?;
        results.per_token(exec, gate, w_gate.rows, &|t, g| {
            results.token_runs(&mats, t, |k, row0, run| {
                let g = &mut g[row0..row0 + run.len()];
                match k {
                    0 => g.copy_from_slice(run),
                    // Gate rows come before up rows: each gate value is in place by now.
                    _ => silu_mul(g, run),
                }
                Ok(())
            })
        })
    }

    /// The mat-mul itself, split by rows into the scratch, to be handed on.
    fn compute(&mut self, x: &[f32], n_tok: usize, mats: &[&Matrix<'_>]) -> Result<RowResults<'_>> {
        let cols = mats.first().map_or(0, |m| m.cols);
        if let Some(m) = mats.iter().find(|m| m.cols != cols) {
            return Err(Error::Mismatch {
                op: "mat-mul of several matrices",
                lhs: ("columns of the first", cols),
                rhs: ("columns of another", m.cols),
            });
        }
        if x.len() != n_tok * cols {
            return Err(Error::Length {
                what: "mat-mul input",
                expected: n_tok * cols,
                got: x.len(),
            });
        }
        let takes = |to| {
            mats.iter()
                .any(|m| m.format.activation_format() == Some(to))
        };
        let have = self.quantized.len();
        let (mut q16, mut q8k) = (None, None);
        let mut rest = &mut *self.quantized;
        for (to, copy) in [
            (ActivationFormat::Q16, &mut q16),
            (ActivationFormat::Q8K, &mut q8k),
        ] {
            if !takes(to) {
                continue;
            }
            let row = to.row_bytes(cols);
            if rest.len() < n_tok * row {
                return Err(Error::ArenaTooSmall {
                    what: "scratch (quantized activations)",
                    needed: have - rest.len() + n_tok * row,
                    got: have,
                });
            }
            let (buf, after) = core::mem::take(&mut rest).split_at_mut(n_tok * row);
            rest = after;
            let kernels = self.kernels;
            let quantize = |first: usize, q: &mut [u8]| {
                let xs = x[first * cols..].chunks_exact(cols);
                for (xr, qr) in xs.zip(q.chunks_exact_mut(row)) {
                    kernels.quantize_activations(to, xr, qr)?;
                }
                Ok(())
            };
            if x.len() >= PARALLEL_PASS {
                let per_chunk = n_tok.div_ceil(2 * self.exec.threads());
                self.exec
                    .for_each_byte_chunk(buf, per_chunk * row, &|i, q| {
                        quantize(i * per_chunk, q)
                    })?;
            } else {
                quantize(0, buf)?;
            }
            *copy = Some(&*buf);
        }
        // A decode step of several sequences: its tiles transposed once, not per chunk.
        let mut transposed = None;
        let tile_format = mats
            .iter()
            .map(|m| m.format)
            .find(|f| f.activation_format() == Some(ActivationFormat::Q16));
        if let (Some(format), Some(q16)) = (tile_format, q16) {
            let tokens = transposed_tokens(n_tok);
            let bytes = tokens * ActivationFormat::Q16.row_bytes(cols);
            if tokens > 0 {
                if rest.len() < bytes {
                    return Err(Error::ArenaTooSmall {
                        what: "scratch (transposed activations)",
                        needed: have - rest.len() + bytes,
                        got: have,
                    });
                }
                let out = &mut core::mem::take(&mut rest)[..bytes];
                transposed = self
                    .kernels
                    .transpose_tiles(format, q16, n_tok, cols, out)?;
            }
        }
        // The k-panel's tiles, transposed once for every chunk and block of rows.
        let kernels = self.kernels;
        let mut k_tiles = None;
        let k_format = mats
            .iter()
            .map(|m| m.format)
            .find(|&f| kernels.unpacks_rows(f, n_tok));
        if let (Some(format), Some(q8k)) = (k_format, q8k) {
            k_tiles = kernels.transpose_k_tiles(format, q8k, n_tok, cols, self.k_tiles)?;
        }
        let acts = Activations {
            f32: x,
            q16,
            q8k,
            transposed,
            k_tiles,
            n_tok,
            cols,
        };
        let threads = self.exec.threads();
        // Split by rows, each chunk taking every token: a run of rows of the matrices laid end
        // to end, written to the scratch piece by piece (one per matrix it covers, [token][row]
        // within it) and handed out after, one run per token. Each weight is then packed or
        // unpacked once per group of tokens (`panel`'s, `k_panel`'s) however many threads share
        // the work. A prefill split by tokens instead, two chunks per thread, packed every weight
        // once per chunk: SmolLM2's Q8_0 and Q4_1 prefill (pp512, two threads) took 1.04-1.08x
        // the time, the 1.1B IQ3_M's (unpacked) 1.1x, and each thread more would have packed or
        // unpacked every weight once more.
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
        // Four chunks per thread balance uneven progress (threads slowed by the host, rows of
        // unequal cost): with two, on an AVX2 host's two threads, a 1.1B IQ3_M decoded 15%
        // slower, eight SmolLM2 Q8_0 streams 19%; prefill the same. (Two won while each chunk
        // transposed the step's tiles itself; on an Intel host with AMX they still decode eight
        // streams 2-5% faster, within the server's noise.) Whole panels keep padding rows out.
        let rows_per_chunk = total.div_ceil(threads * 4).next_multiple_of(PANEL);
        self.exec
            .for_each_chunk(tmp, rows_per_chunk * n_tok, &|i, out| {
                let mut out = out;
                row_pieces(mats, i * rows_per_chunk, out.len() / n_tok, |k, row0, n| {
                    let (here, rest) = core::mem::take(&mut out).split_at_mut(n * n_tok);
                    out = rest;
                    kernels.matmul_rows(mats[k], &acts, row0, here)
                })
            })?;
        Ok(RowResults {
            rows_per_chunk,
            n_tok,
            tmp: &*tmp,
        })
    }
}

/// Floats from which a pass over a mat-mul's input or results is a parallel job over the
/// tokens (quantizing a prefill's inputs; handing on several decoded tokens' logits, a
/// prefill's results); fewer take less time than starting a job.
const PARALLEL_PASS: usize = 1 << 16;

/// The row-split mat-mul's results, in the scratch: chunks of `rows_per_chunk` rows of the
/// matrices laid end to end, each chunk's rows in pieces (one per matrix), `[token][row]`
/// within a piece.
struct RowResults<'t> {
    rows_per_chunk: usize,
    n_tok: usize,
    tmp: &'t [f32],
}

impl RowResults<'_> {
    /// Calls `f(matrix, first row, results)` for each run of token `t`'s results, in order.
    fn token_runs(
        &self,
        mats: &[&Matrix<'_>],
        t: usize,
        mut f: impl FnMut(usize, usize, &[f32]) -> Result<()>,
    ) -> Result<()> {
        let (rows_per_chunk, n_tok) = (self.rows_per_chunk, self.n_tok);
        for (i, chunk) in self.tmp.chunks(rows_per_chunk * n_tok).enumerate() {
            let mut chunk = chunk;
            row_pieces(
                mats,
                i * rows_per_chunk,
                chunk.len() / n_tok,
                |k, row0, n| {
                    let (piece, rest) = chunk.split_at(n * n_tok);
                    chunk = rest;
                    f(k, row0, &piece[t * n..(t + 1) * n])
                },
            )?;
        }
        Ok(())
    }

    /// Copies every token's results into `outs` (`[token][row]` each): a parallel job over the
    /// tokens for an output as large as several decoded tokens' logits, on this thread for
    /// the rest (smaller copies take less time than starting a job).
    fn copy_out<E: Exec + ?Sized>(
        &self,
        exec: &E,
        mats: &[&Matrix<'_>],
        outs: &mut [&mut [f32]],
    ) -> Result<()> {
        if mats.len() != outs.len() {
            return Err(Error::Mismatch {
                op: "mat-mul",
                lhs: ("matrices", mats.len()),
                rhs: ("outputs", outs.len()),
            });
        }
        for (m, o) in mats.iter().zip(outs.iter()) {
            ops::same_len("mat-mul output", self.n_tok * m.rows, o.len())?;
        }
        for (k, (m, out)) in mats.iter().zip(outs.iter_mut()).enumerate() {
            let copy = |t: usize, row: &mut [f32]| {
                self.token_runs(mats, t, |kk, row0, run| {
                    if kk == k {
                        row[row0..row0 + run.len()].copy_from_slice(run);
                    }
                    Ok(())
                })
            };
            if out.len() >= PARALLEL_PASS {
                self.per_token(exec, out, m.rows, &copy)?;
            } else {
                for (t, row) in out.chunks_exact_mut(m.rows).enumerate() {
                    copy(t, row)?;
                }
            }
        }
        Ok(())
    }

    /// `f(t, token t's row of out)` for every token: in parallel when there are several.
    fn per_token<E: Exec + ?Sized>(
        &self,
        exec: &E,
        out: &mut [f32],
        row_len: usize,
        f: &ChunkFn<'_>,
    ) -> Result<()> {
        if self.n_tok == 1 {
            f(0, out)
        } else {
            exec.for_each_chunk(out, row_len, f)
        }
    }
}

/// Calls `f(matrix, first row in it, rows)` for each piece of the rows `start .. start + len`
/// of `mats` laid end to end, in order.
fn row_pieces(
    mats: &[&Matrix<'_>],
    start: usize,
    len: usize,
    mut f: impl FnMut(usize, usize, usize) -> Result<()>,
) -> Result<()> {
    let (mut row, end, mut first) = (start, start + len, 0);
    for (k, m) in mats.iter().enumerate() {
        let last = first + m.rows;
        if row < last && row < end {
            let n = last.min(end) - row;
            f(k, row - first, n)?;
            row += n;
        }
        first = last;
    }
    Ok(())
}
