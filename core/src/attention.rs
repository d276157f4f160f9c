//! Causal attention of a batch of queries over the cached keys and values, on the CPU.
//!
//! An online softmax (keep the running maximum, rescale when it grows) visits every key once in
//! fixed steps, so attention needs no memory as long as the context, and a query's result is the
//! same bits whichever other queries share its block: prefill and decoding agree exactly.
use crate::config::MAX_HEAD_DIM;
use crate::error::{Error, Result};
use crate::exec::Exec;
use crate::kernels::panel::{PANEL, PANEL_BLOCK_BYTES};
use crate::kernels::{Kernels, WeightStrides, TILE};
use crate::kv_cache::LayerKv;
use crate::ops;
use crate::quant::{self, q16, BlockQ16, Format, QK};

/// The shape of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (each shared by `n_heads / n_kv_heads` query heads).
    pub n_kv_heads: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Each query sees itself and the `w - 1` positions before it.
    pub window: Option<usize>,
}

/// `out` ← attention of the `n_tok` queries in `q` (positions `first_pos ..`, heads of
/// `shape.head_dim` one after another per token) over the keys and values in `kv`, split across
/// `exec` when there is enough work.
///
/// # Errors
/// [`Error::InvalidArgument`] for a shape it cannot run (heads larger than `MAX_HEAD_DIM`, or `q`
/// not whole tokens), [`Error::Mismatch`] when `q`, `out` and the shape disagree, and whatever
/// `exec` reports.
pub fn attend<E: Exec + ?Sized>(
    kernels: &Kernels,
    exec: &E,
    q: &[f32],
    kv: LayerKv<'_>,
    first_pos: usize,
    shape: AttentionShape,
    out: &mut [f32],
) -> Result<()> {
    let hd = shape.head_dim;
    if q.len() != out.len() {
        return Err(Error::Mismatch {
            op: "attention",
            lhs: ("query values", q.len()),
            rhs: ("output values", out.len()),
        });
    }
    if hd > MAX_HEAD_DIM {
        return Err(Error::InvalidArgument {
            what: "attention",
            reason: "head_dim is larger than MAX_HEAD_DIM",
        });
    }
    if !q.len().is_multiple_of(shape.n_heads * hd) {
        return Err(Error::InvalidArgument {
            what: "attention",
            reason: "the queries are not whole rows of n_heads × head_dim values",
        });
    }
    // The query heads that share a KV head go together, and with them, while prefilling, the
    // same heads of the next tokens: each cached key and value row is then read and widened
    // (or packed) once for all of them. Decoding keeps groups to a tile of heads, so that
    // threads still share a long context's work when there are few KV heads.
    let rows = query_rows(hd);
    let n_tok = q.len() / (shape.n_heads * hd);
    let per_kv = shape.n_heads / shape.n_kv_heads;
    let most = if n_tok == 1 { TILE } else { rows };
    let group = (1..=most.min(per_kv))
        .rev()
        .find(|g| per_kv.is_multiple_of(*g))
        .unwrap_or(1);
    let block_tokens = rows / group;
    let block = Block {
        q,
        first_pos,
        shape,
        group,
    };
    // Decoding: a chunk per group of heads, so that threads share a long context's work.
    // Prefill: a chunk per block of tokens, all their heads.
    let chunk = if n_tok == 1 {
        group * hd
    } else {
        block_tokens * shape.n_heads * hd
    };
    let attend = |i: usize, o: &mut [f32]| {
        if n_tok == 1 {
            block.attend::<TILE, DECODE_ACC_FLOATS, DECODE_Q16_BYTES>(
                kernels,
                &kv,
                (0, i * group),
                o,
                (group * hd, 0),
            )
        } else {
            let t0 = i * block_tokens;
            for h0 in (0..shape.n_heads).step_by(group) {
                let stride = shape.n_heads * hd;
                block.attend::<MAX_ROWS, ACC_FLOATS, Q16_BYTES>(
                    kernels,
                    &kv,
                    (t0, h0),
                    o,
                    (stride, h0 * hd),
                )?;
            }
            Ok(())
        }
    };
    // Roughly the multiply-adds of the scores and the weighted sum. Below a few hundred
    // thousand, handing chunks to other threads costs more than it saves.
    let work = q.len() * 2 * (first_pos + n_tok);
    if work < PARALLEL_ATTENTION_WORK {
        crate::exec::Serial.for_each_chunk(out, chunk, &attend)
    } else {
        exec.for_each_chunk(out, chunk, &attend)
    }
}

/// Attention smaller than this many multiply-adds runs on the calling thread.
const PARALLEL_ATTENTION_WORK: usize = 1 << 18;

/// Keys scored per step of the online softmax. Steps start at multiples of it, whatever the
/// queries, so a query's arithmetic does not depend on which others share its block.
const KEY_STEP: usize = 32;

/// The most query rows (tokens × heads of one KV head) attended together: with more, each key
/// is packed for more of them.
const MAX_ROWS: usize = 16 * TILE;

/// The stack buffers of a block (floats of weighted value sums, bytes of Q16 queries): as many
/// rows as they hold for the head size, 16 at the largest heads, `MAX_ROWS` at 128 and below.
const ACC_FLOATS: usize = 16 * MAX_HEAD_DIM;
const Q16_BYTES: usize = 16 * (MAX_HEAD_DIM / QK) * BlockQ16::BYTES;

/// The same buffers for a decoded token's block (at most `TILE` heads): zeroing the prefill's
/// larger ones for every few heads of every sequence took 2.4% of a decode step of 8 sequences.
const DECODE_ACC_FLOATS: usize = TILE * MAX_HEAD_DIM;
const DECODE_Q16_BYTES: usize = TILE * (MAX_HEAD_DIM / QK) * BlockQ16::BYTES;

/// Query rows per block for heads of `hd` (at most `MAX_HEAD_DIM`).
fn query_rows(hd: usize) -> usize {
    let hd = hd.max(QK);
    MAX_ROWS
        .min(ACC_FLOATS / hd)
        .min(Q16_BYTES / q16::row_bytes(hd))
}

/// One attention call's queries, and how they are grouped.
struct Block<'a> {
    q: &'a [f32],
    first_pos: usize,
    shape: AttentionShape,
    /// Query heads per block, all sharing one KV head.
    group: usize,
}

impl Block<'_> {
    /// Query heads `h0 .. h0 + group` of the tokens `t0 ..` that `out` holds (each token's
    /// output `stride` floats after the last, the heads' `head_dim` runs from `col0` on), against
    /// the cached keys and values each token sees.
    ///
    /// An online softmax (keep the running maximum, rescale when it grows) visits every key once
    /// and needs no buffer as long as the context, so attention takes no scratch memory at all:
    /// its buffers are on the stack, for at most `ROWS` query rows, `ACC` floats of weighted sums
    /// and `Q16` bytes of quantized queries (the block's rows must fit them).
    fn attend<const ROWS: usize, const ACC: usize, const Q16: usize>(
        &self,
        kernels: &Kernels,
        kv: &LayerKv<'_>,
        (t0, h0): (usize, usize),
        out: &mut [f32],
        (stride, col0): (usize, usize),
    ) -> Result<()> {
        let (hd, g) = (self.shape.head_dim, self.group);
        let n_tok = out.len().div_ceil(stride);
        let n = n_tok * g;
        let kv_head = h0 / (self.shape.n_heads / self.shape.n_kv_heads);
        // Row i: token t0 + i / g, head h0 + i % g, seeing keys span[i].
        let q_row = |i: usize| {
            let (t, h) = (t0 + i / g, h0 + i % g);
            &self.q[(t * self.shape.n_heads + h) * hd..][..hd]
        };
        let span: [(usize, usize); ROWS] = core::array::from_fn(|i| {
            let pos = self.first_pos + t0 + i.min(n - 1) / g;
            (
                self.shape.window.map_or(0, |w| (pos + 1).saturating_sub(w)),
                pos,
            )
        });
        let span = &span[..n];
        let scale = 1.0 / libm::sqrtf(hd as f32);
        let qb = q16::row_bytes(hd);
        // Row i's Q16 query: q16[i * qb ..][..qb].
        let mut q16 = [0u8; Q16];
        if kv.format == Format::Q8_0 {
            for (i, buf) in q16[..n * qb].chunks_exact_mut(qb).enumerate() {
                kernels.quantize_q16(q_row(i), buf)?;
            }
        }
        // The kernels take TILE queries: the last tile repeats the last row.
        let tile = |k: usize| -> [&[u8]; TILE] {
            core::array::from_fn(|j| &q16[(k * TILE + j).min(n - 1) * qb..][..qb])
        };
        // Row i's weighted sum of values so far: acc[i * hd ..][..hd].
        let mut acc = [0f32; ACC];
        let acc = &mut acc[..n * hd];
        let (mut max, mut sum) = ([f32::NEG_INFINITY; ROWS], [0.0f32; ROWS]);
        // scores[j][i]: key j of the step against row i, as the kernels give them, then, for
        // more than a tile of rows, their probability weights in place (`softmax_step`);
        // probs[i][j]: those of a tile's rows or fewer, one row at a time (zero outside the
        // row's span).
        let mut scores = [[0f32; ROWS]; KEY_STEP];
        let mut probs = [[0f32; KEY_STEP]; TILE];
        let mut packed = [0u8; MAX_HEAD_DIM / QK * PANEL_BLOCK_BYTES];
        let mut row = [0f32; MAX_HEAD_DIM];
        let first = span.iter().map(|s| s.0).min().unwrap_or(0);
        let last = span.iter().map(|s| s.1).max().unwrap_or(0);
        let mut start = first / KEY_STEP * KEY_STEP;
        while start <= last {
            let end = (start + KEY_STEP).min(last + 1);
            let scores = &mut scores[..end - start];
            if let (Format::Q8_0, Some(panel)) = (kv.format, &kernels.q8_0.panel) {
                // The cached keys take the weight rows' place, PANEL at a time: a key's score
                // is then the same bits whichever rows share its tile. One tile of queries (a
                // decoded token's heads) reads the keys unpacked, as decoding reads weight
                // rows: packing them cost as much as the scores.
                let one_tile = n <= TILE;
                let packed = &mut packed[..hd / QK * PANEL_BLOCK_BYTES];
                for (j, s) in (start..end).step_by(PANEL).zip(scores.chunks_mut(PANEL)) {
                    for k in 0..n.div_ceil(TILE) {
                        let out = if one_tile {
                            // Keys past the step's end repeat its last; their scores are dropped.
                            let keys =
                                core::array::from_fn(|i| kv.k_row(j + i.min(s.len() - 1), kv_head));
                            (panel.rows_x4)(keys, tile(k))
                        } else {
                            if k == 0 {
                                let keys = core::array::from_fn(|i| {
                                    (i < s.len()).then(|| kv.k_row(j + i, kv_head))
                                });
                                (panel.pack)(&keys, 0, packed);
                            }
                            let mut out = [[0f32; PANEL]; TILE];
                            (panel.dot)(packed, tile(k), &mut out);
                            out
                        };
                        // The tile's rows side by side in each key's scores (`ROWS` holds whole
                        // tiles).
                        let at = (k * TILE).min(ROWS - TILE);
                        for (key, sk) in s.iter_mut().enumerate() {
                            let rows: [f32; TILE] = core::array::from_fn(|i| out[i][key]);
                            sk[at..at + TILE].copy_from_slice(&rows);
                        }
                    }
                }
            } else if kv.format == Format::Q8_0 && n == 1 {
                // Four keys against the one query per call.
                let mut j = start;
                for s4 in scores.chunks_mut(4) {
                    if s4.len() == 4 {
                        let keys = core::array::from_fn(|i| kv.k_row(j + i, kv_head));
                        let r = (kernels.q8_0.rows4)(keys, &q16[..qb]);
                        s4.iter_mut().zip(r).for_each(|(s, r)| s[0] = r);
                    } else {
                        for (i, s) in s4.iter_mut().enumerate() {
                            s[0] = (kernels.q8_0.one)(kv.k_row(j + i, kv_head), &q16[..qb]);
                        }
                    }
                    j += s4.len();
                }
            } else if kv.format == Format::Q8_0 {
                // Two keys against a tile of queries per call.
                for k in 0..n.div_ceil(TILE) {
                    let at = |i: usize| (k * TILE + i).min(ROWS - 1);
                    let mut j = start;
                    for s2 in scores.chunks_mut(2) {
                        if let [a, b] = s2 {
                            let keys = [kv.k_row(j, kv_head), kv.k_row(j + 1, kv_head)];
                            let [ra, rb] = (kernels.q8_0.rows2x4)(keys, tile(k));
                            for i in 0..TILE {
                                (a[at(i)], b[at(i)]) = (ra[i], rb[i]);
                            }
                        } else {
                            let r = (kernels.q8_0.x4)(kv.k_row(j, kv_head), tile(k));
                            for (i, r) in r.into_iter().enumerate() {
                                s2[0][at(i)] = r;
                            }
                        }
                        j += s2.len();
                    }
                }
            } else {
                let (dot, dot_x4) = match kv.format {
                    Format::F32 => (kernels.dot_f32, kernels.dot_f32_x4),
                    _ => (kernels.dot_f16, kernels.dot_f16_x4),
                };
                for (j, s) in (start..end).zip(scores.iter_mut()) {
                    // Rows come from the cache, whose layout fixed their lengths: the table's
                    // kernels need no further checks. A tile of rows at a time widens the key
                    // once for all of them (the same bits as one row at a time).
                    let k = kv.k_row(j, kv_head);
                    let tiles = n / TILE * TILE;
                    for t0 in (0..tiles).step_by(TILE) {
                        let r = dot_x4(k, core::array::from_fn(|i| q_row(t0 + i)));
                        s[t0..t0 + TILE].copy_from_slice(&r);
                    }
                    for (i, s) in s[..n].iter_mut().enumerate().skip(tiles) {
                        *s = dot(k, q_row(i));
                    }
                }
            }
            let steps = end - start;
            // Row i's keys in the step.
            let live = |i: usize| {
                let (lo, pos) = span[i];
                (
                    lo.max(start) - start,
                    (pos + 1).min(end).saturating_sub(start),
                )
            };
            let weights = if n > TILE {
                // The rows side by side, a vector lane each: the same arithmetic as one row at
                // a time below, without a sum across lanes or a transposing copy.
                let lives: [(usize, usize); ROWS] =
                    core::array::from_fn(|i| if i < n { live(i) } else { (0, 0) });
                let mut rescale = [1f32; ROWS];
                let weights = scores[..steps].as_flattened_mut();
                let mut rows = ops::SoftmaxRows {
                    live: &lives[..n],
                    max: &mut max[..n],
                    sum: &mut sum[..n],
                    rescale: &mut rescale[..n],
                };
                (kernels.softmax_step)(weights, ROWS, scale, &mut rows);
                for (a, r) in acc.chunks_exact_mut(hd).zip(rescale) {
                    if r != 1.0 {
                        a.iter_mut().for_each(|o| *o *= r);
                    }
                }
                (&*weights, WeightStrides { run: 1, key: ROWS })
            } else {
                // Per row, contiguous: loops the compiler vectorizes.
                for (i, pi) in probs[..n].iter_mut().enumerate() {
                    let pi = &mut pi[..steps];
                    pi.fill(0.0);
                    let (a, b) = live(i);
                    if a >= b {
                        continue;
                    }
                    let live = &mut pi[a..b];
                    for (p, s) in live.iter_mut().zip(&scores[a..b]) {
                        *p = s[i] * scale;
                    }
                    let step_max = live
                        .iter()
                        .fold(f32::NEG_INFINITY, |m, v| ops::running_max(m, *v));
                    if step_max > max[i] {
                        let r = ops::exp(max[i] - step_max);
                        acc[i * hd..][..hd].iter_mut().for_each(|o| *o *= r);
                        sum[i] *= r;
                        max[i] = step_max;
                    }
                    sum[i] += (kernels.exp_sub)(live, max[i]);
                }
                let by_row = WeightStrides {
                    run: KEY_STEP,
                    key: 1,
                };
                (probs[..n].as_flattened(), by_row)
            };
            self.add_values(kernels, kv, kv_head, start, steps, weights, acc, &mut row)?;
            start = end;
        }
        for (i, (a, s)) in acc.chunks_exact_mut(hd).zip(sum).enumerate() {
            if s > 0.0 {
                let inv = 1.0 / s;
                a.iter_mut().for_each(|o| *o *= inv);
            }
            out[(i / g) * stride + col0 + (i % g) * hd..][..hd].copy_from_slice(a);
        }
        Ok(())
    }

    /// `acc[i] += Σ_j p(i, j) · V[start + j]` over the `len` keys of one step, in key order, row
    /// `i`'s probability of key `j` at `probs[i·w.run + j·w.key]`; keys outside a row's span
    /// have probability zero, which adds exactly nothing.
    #[allow(clippy::too_many_arguments)]
    fn add_values(
        &self,
        kernels: &Kernels,
        kv: &LayerKv<'_>,
        kv_head: usize,
        start: usize,
        len: usize,
        (probs, w): (&[f32], WeightStrides),
        acc: &mut [f32],
        row: &mut [f32; MAX_HEAD_DIM],
    ) -> Result<()> {
        let hd = self.shape.head_dim;
        let runs = acc.len() / hd;
        let p = |i: usize, j: usize| probs[i * w.run + j * w.key];
        // A step ends at the last key any row sees (live keys weigh at least e^-87.3): all its
        // value rows are read.
        if kv.format == Format::Q8_0 {
            // All the step's values in one call, each widened once for every row.
            let mut rows: [&[u8]; KEY_STEP] = [&[]; KEY_STEP];
            for (j, r) in rows[..len].iter_mut().enumerate() {
                *r = kv.v_row(start + j, kv_head);
            }
            (kernels.axpy_q8_0)(acc, probs, w, &rows[..len]);
        } else {
            // Each value row widened once for all the rows that weigh it.
            for j in 0..len {
                if (0..runs).all(|i| p(i, j) == 0.0) {
                    continue;
                }
                let (v, bytes) = (&mut row[..hd], kv.v_row(start + j, kv_head));
                match kv.format {
                    Format::F16 => (kernels.widen_f16)(bytes, v),
                    _ => quant::dequantize_row(kv.format, bytes, v)?,
                }
                let weights = probs.get(j * w.key..).unwrap_or(&[]);
                (kernels.add_weighted)(acc, weights, w.run, v);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use alloc::vec;
    use alloc::vec::Vec;

    use super::*;
    use crate::config::{Config, RopeStyle};
    use crate::exec::Serial;
    use crate::kv_cache::{KvCache, KvFormat};

    fn config(n_heads: usize, n_kv_heads: usize) -> Config {
        Config {
            vocab_size: 16,
            hidden_size: n_heads * 32,
            intermediate_size: 32,
            n_layers: 1,
            n_heads,
            n_kv_heads,
            head_dim: 32,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_style: RopeStyle::Halves,
            rope_scaling: None,
            tie_word_embeddings: true,
            qkv_bias: false,
            sliding_window: None,
            max_position_embeddings: 64,
        }
    }

    /// Attention, serial, with the best kernels.
    fn attention(q: &[f32], kv: LayerKv<'_>, first_pos: usize, shape: AttentionShape) -> Vec<f32> {
        let mut out = vec![0f32; q.len()];
        attend(Kernels::best(), &Serial, q, kv, first_pos, shape, &mut out).unwrap();
        out
    }

    fn wave(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| libm::sinf(i as f32 * seed) * 2.0).collect()
    }

    /// A token's attention is the same bits whether it comes alone (decoding) or in a block of
    /// prefill tokens, with and without a sliding window, for every KV format and grouping.
    #[test]
    #[cfg_attr(miri, ignore = "millions of steps: minutes under Miri; run natively")]
    fn prefill_attention_equals_one_token_at_a_time() {
        let hd = 64;
        for (n_heads, n_kv_heads) in [(4, 4), (6, 2), (9, 3), (7, 1), (32, 2)] {
            for format in [KvFormat::F32, KvFormat::F16, KvFormat::Q8_0] {
                for window in [None, Some(5), Some(40)] {
                    let c = config(n_heads, n_kv_heads);
                    let c = Config { head_dim: hd, ..c };
                    let (n_past, n_tok, ctx) = (30, 21, 64);
                    let mut mem = vec![0u8; KvCache::bytes_needed(&c, ctx, format).unwrap()];
                    let mut cache = KvCache::new(&c, ctx, format, &mut mem).unwrap();
                    let kvd = n_kv_heads * hd;
                    let (k, v) = (
                        wave((n_past + n_tok) * kvd, 0.37),
                        wave((n_past + n_tok) * kvd, 0.11),
                    );
                    cache.store(Kernels::best(), 0, 0, &k, &v).unwrap();
                    let q = wave(n_tok * n_heads * hd, 0.23);
                    let shape = AttentionShape {
                        n_heads,
                        n_kv_heads,
                        head_dim: hd,
                        window,
                    };
                    let all = attention(&q, cache.layer(0), n_past, shape);
                    for (t, (qt, want)) in q
                        .chunks(n_heads * hd)
                        .zip(all.chunks(n_heads * hd))
                        .enumerate()
                    {
                        let one = attention(qt, cache.layer(0), n_past + t, shape);
                        let same = one
                            .iter()
                            .zip(want)
                            .all(|(a, b)| a.to_bits() == b.to_bits() || (*a == 0.0 && *b == 0.0));
                        assert!(same, "{n_heads}/{n_kv_heads} {format:?} {window:?} t{t}");
                    }
                }
            }
        }
    }

    /// Grouped attention (one to four query heads per KV head, and a group size that does not
    /// divide into tiles) against a plain softmax over the cache's own (dequantized) rows.
    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri; run natively")]
    fn grouped_attention_matches_plain_softmax() {
        let hd = 32;
        for (n_heads, n_kv_heads) in [(4, 4), (4, 2), (6, 2), (8, 2), (7, 1), (4, 1)] {
            for format in [KvFormat::F32, KvFormat::Q8_0] {
                let c = config(n_heads, n_kv_heads);
                let (n_past, n_tok) = (9, 5);
                let mut mem = vec![0u8; KvCache::bytes_needed(&c, 16, format).unwrap()];
                let mut cache = KvCache::new(&c, 16, format, &mut mem).unwrap();
                let kvd = n_kv_heads * hd;
                let (k, v) = (wave(16 * kvd, 0.37), wave(16 * kvd, 0.11));
                let k = &k[..(n_past + n_tok) * kvd];
                let v = &v[..(n_past + n_tok) * kvd];
                cache.store(Kernels::best(), 0, 0, k, v).unwrap();
                let q = wave(n_tok * n_heads * hd, 0.23);
                let shape = AttentionShape {
                    n_heads,
                    n_kv_heads,
                    head_dim: hd,
                    window: None,
                };
                let out = attention(&q, cache.layer(0), n_past, shape);

                let kv = cache.layer(0);
                let row = |bytes: &[u8]| {
                    let mut r = vec![0f32; hd];
                    quant::dequantize_row(format.format(), bytes, &mut r).unwrap();
                    r
                };
                for t in 0..n_tok {
                    for h in 0..n_heads {
                        let qh = &q[(t * n_heads + h) * hd..][..hd];
                        let kvh = h / (n_heads / n_kv_heads);
                        let keys = 0..=n_past + t;
                        let s: Vec<f32> = keys
                            .clone()
                            .map(|j| {
                                let kr = row(kv.k_row(j, kvh));
                                qh.iter().zip(&kr).map(|(a, b)| a * b).sum::<f32>()
                                    / libm::sqrtf(hd as f32)
                            })
                            .collect();
                        let m = s.iter().fold(f32::NEG_INFINITY, |a, b| a.max(*b));
                        let e: Vec<f32> = s.iter().map(|x| libm::expf(x - m)).collect();
                        let total: f32 = e.iter().sum();
                        let mut want = vec![0f32; hd];
                        for (j, p) in keys.zip(&e) {
                            for (w, x) in want.iter_mut().zip(row(kv.v_row(j, kvh))) {
                                *w += p / total * x;
                            }
                        }
                        let got = &out[(t * n_heads + h) * hd..][..hd];
                        for (a, b) in got.iter().zip(&want) {
                            assert!(
                                (a - b).abs() < 1e-3,
                                "{n_heads}/{n_kv_heads} {format:?} t{t} h{h}: {a} vs {b}"
                            );
                        }
                    }
                }
            }
        }
    }
}
