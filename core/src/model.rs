//! The Llama layer loop: one loop for Llama 1/2/3, SmolLM, Mistral, Qwen2 and the SmolVLM text
//! backbone, written against `Backend`, and `Model`, which runs it on the CPU.
use crate::arena::Scratch;
use crate::backend::{Backend, Segment};
use crate::config::{Config, InvFreq};
use crate::cpu::Cpu;
use crate::error::{Error, Result};
use crate::exec::Exec;
use crate::kernels::Kernels;
use crate::kv_cache::KvCache;
use crate::ops;
use crate::weights::Weights;

/// What a forward pass hands back.
pub enum Want<'o> {
    /// Only fill the KV cache (a prompt whose logits nobody reads).
    Nothing,
    /// Logits of the last token (`vocab_size` values).
    LastLogits(&'o mut [f32]),
    /// The id of the last token's largest logit: greedy decoding without reading the logits.
    LastArgmax(&'o mut u32),
    /// Logits of every token (`n × vocab_size`).
    AllLogits(&'o mut [f32]),
    /// Final hidden states after the final norm (`n × hidden_size`).
    Hidden(&'o mut [f32]),
}

/// A model ready to run on the CPU: its configuration, its weights (borrowed for `'w`), RoPE's
/// frequencies and the kernels picked for this CPU.
pub struct Model<'w> {
    /// The model's shape.
    pub config: Config,
    /// The model's weights.
    pub weights: Weights<'w>,
    inv_freq: InvFreq,
    kernels: &'static Kernels,
}

impl<'w> Model<'w> {
    /// Checks every weight against `config` and picks the fastest kernels for this CPU.
    ///
    /// # Errors
    /// As [`Weights::validate`]: an invalid config, or the first tensor whose shape disagrees.
    pub fn new(config: Config, weights: Weights<'w>) -> Result<Self> {
        weights.validate(&config)?;
        let mut inv_freq = config.rope_inv_freq();
        if let Some(factors) = &weights.rope_freq_factors {
            for (f, d) in inv_freq.iter_mut().zip(factors.iter()) {
                *f /= d;
            }
        }
        Ok(Model {
            inv_freq,
            config,
            weights,
            kernels: Kernels::best(),
        })
    }

    /// Uses `kernels` instead of the CPU's best (to compare the scalar reference, for example).
    pub fn with_kernels(mut self, kernels: &'static Kernels) -> Self {
        self.kernels = kernels;
        self
    }

    /// The kernels it runs.
    pub fn kernels(&self) -> &'static Kernels {
        self.kernels
    }

    /// RoPE's inverse frequency of each pair of a head (Llama-3 scaling or the weights' frequency
    /// factors applied).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// Runs `tokens` at the positions after those already in `cache`, appends their K and V to
    /// it, and fills `want`. Inputs longer than the scratch's batch are processed in batches.
    ///
    /// # Errors
    /// [`Error::ContextFull`] if `cache` cannot hold the tokens (nothing is computed then),
    /// [`Error::InvalidConfig`] if the cache or scratch was made for another shape; an error
    /// naming a token id past the vocabulary or a `want` buffer of the wrong length;
    /// [`Error::NotFinite`] if the logits are not finite (weights that are not numbers).
    pub fn forward<E: Exec + ?Sized>(
        &self,
        tokens: &[u32],
        cache: &mut KvCache<'_>,
        scratch: &mut Scratch<'_>,
        exec: &E,
        want: Want<'_>,
    ) -> Result<()> {
        self.forward_many(&[tokens], &mut [cache], scratch, exec, &mut [want])
    }

    /// `forward` for several sequences at once: sequence `s` runs `tokens[s]` after what
    /// `caches[s]` holds and fills `wants[s]`. Their tokens share batches (up to the scratch's
    /// batch size), so the weights are read once for all of them; each token's results are the
    /// same bits as when its sequence runs alone.
    ///
    /// # Errors
    /// As `forward`, and [`Error::Mismatch`] if `tokens`, `caches` and `wants` differ in number.
    pub fn forward_many<E: Exec + ?Sized>(
        &self,
        tokens: &[&[u32]],
        caches: &mut [&mut KvCache<'_>],
        scratch: &mut Scratch<'_>,
        exec: &E,
        wants: &mut [Want<'_>],
    ) -> Result<()> {
        for cache in caches.iter() {
            cache.check_shape(&self.config)?;
        }
        scratch.check_shape(&self.config)?;
        // `run` takes a closure it may call only once; the Option hands the borrows over.
        let mut args = Some((caches, wants));
        let mut result = Ok(());
        exec.run(&mut || {
            if let Some((caches, wants)) = args.take() {
                let mut cpu = Cpu::new(self, exec, caches, scratch.split());
                result = layer_loop(&self.config, &mut cpu, tokens, wants);
            }
        });
        result
    }
}

/// Most segments (runs of one sequence's tokens) in one batch: a batch ends early when more
/// sequences would join it. Bounds the stack the layer loop needs.
pub const MAX_SEGMENTS: usize = 64;

/// Runs each sequence's `tokens[s]` through the model on `backend`, at the positions after those
/// its KV cache holds, and fills `wants[s]`. The sequences' tokens are packed into batches of at
/// most the backend's batch size, in order.
///
/// # Errors
/// [`Error::ContextFull`] when a cache cannot hold its sequence's tokens (checked before any
/// work), [`Error::Mismatch`] when `tokens`, `wants` and the caches disagree in number or a
/// `Want`'s buffer has the wrong length, and whatever the backend reports.
pub fn layer_loop<B: Backend + ?Sized>(
    c: &Config,
    backend: &mut B,
    tokens: &[&[u32]],
    wants: &mut [Want<'_>],
) -> Result<()> {
    let n_seq = tokens.len();
    if wants.len() != n_seq {
        return Err(Error::Mismatch {
            op: "forward",
            lhs: ("token sequences", n_seq),
            rhs: ("wants", wants.len()),
        });
    }
    if backend.sequences() != n_seq {
        return Err(Error::Mismatch {
            op: "forward",
            lhs: ("token sequences", n_seq),
            rhs: ("KV caches", backend.sequences()),
        });
    }
    for (s, (seq, want)) in tokens.iter().zip(wants.iter()).enumerate() {
        check_sequence(c, backend, s, seq, want)?;
    }
    let batch = backend.max_batch();
    let mut segments = [Segment::default(); MAX_SEGMENTS];
    // The next token to run: sequence `seq`, at `offset` in its input.
    let (mut seq, mut offset) = (0, 0);
    loop {
        let mut rows = 0;
        let mut count = 0;
        while seq < n_seq && rows < batch && count < MAX_SEGMENTS {
            let len = (tokens[seq].len() - offset).min(batch - rows);
            if len > 0 {
                segments[count] = Segment {
                    seq,
                    offset,
                    row: rows,
                    len,
                    pos0: backend.kv_len(seq),
                };
                count += 1;
                rows += len;
                offset += len;
            }
            if offset == tokens[seq].len() {
                seq += 1;
                offset = 0;
            }
        }
        if count == 0 {
            return Ok(());
        }
        forward_batch(c, backend, tokens, &segments[..count], wants)?;
    }
}

/// Checks one sequence's input against the vocabulary, its cache's room and its `want`.
fn check_sequence<B: Backend + ?Sized>(
    c: &Config,
    backend: &B,
    s: usize,
    tokens: &[u32],
    want: &Want<'_>,
) -> Result<()> {
    let n = tokens.len();
    if let Some(&token) = tokens.iter().find(|t| **t as usize >= c.vocab_size) {
        return Err(Error::TokenOutOfRange {
            token,
            vocab: c.vocab_size,
        });
    }
    let pos = backend.kv_len(s);
    if n > backend.kv_capacity(s) - pos {
        return Err(Error::ContextFull {
            pos,
            tokens: n,
            max_seq: backend.kv_capacity(s),
        });
    }
    if n == 0 && matches!(want, Want::LastLogits(_) | Want::LastArgmax(_)) {
        return Err(Error::InvalidArgument {
            what: "forward",
            reason: "the last token's logits are asked for, but no tokens are given",
        });
    }
    let expected = match want {
        Want::Nothing | Want::LastArgmax(_) => None,
        Want::LastLogits(o) => Some(("last logits", c.vocab_size, o.len())),
        Want::AllLogits(o) => Some(("all logits", n * c.vocab_size, o.len())),
        Want::Hidden(o) => Some(("hidden states", n * c.hidden_size, o.len())),
    };
    match expected {
        Some((what, expected, got)) if expected != got => Err(Error::Length {
            what,
            expected,
            got,
        }),
        _ => Ok(()),
    }
}

fn forward_batch<B: Backend + ?Sized>(
    c: &Config,
    be: &mut B,
    tokens: &[&[u32]],
    segments: &[Segment],
    wants: &mut [Want<'_>],
) -> Result<()> {
    let n = segments.iter().map(|s| s.len).sum();
    be.embed(tokens, segments)?;
    for layer in 0..c.n_layers {
        be.qkv(layer, n)?;
        be.rope_store(layer, segments)?;
        be.attention(layer, segments)?;
        be.attn_out(layer, n)?;
        be.gate_up(layer, n)?;
        be.ffn_out(layer, n)?;
    }
    let (h, vocab) = (c.hidden_size, c.vocab_size);
    let wants_last = |seg: &Segment, wants: &[Want<'_>]| {
        seg.offset + seg.len == tokens[seg.seq].len()
            && matches!(wants[seg.seq], Want::LastLogits(_) | Want::LastArgmax(_))
    };
    let lasts = segments.iter().filter(|s| wants_last(s, wants)).count();
    // Several sequences' last tokens go through the output matrix together.
    let gather = lasts > 1 && be.max_logit_rows() > 1;
    for seg in segments {
        let last = seg.row + seg.len - 1;
        let rows = seg.offset..seg.offset + seg.len;
        let ends_input = seg.offset + seg.len == tokens[seg.seq].len();
        match &mut wants[seg.seq] {
            Want::Nothing => {}
            Want::Hidden(out) => {
                be.final_norm(seg.row, seg.len)?;
                be.read_hidden(seg.row, &mut out[rows.start * h..rows.end * h])?;
            }
            Want::AllLogits(out) => {
                be.final_norm(seg.row, seg.len)?;
                be.logits(seg.row, &mut out[rows.start * vocab..rows.end * vocab])?;
            }
            Want::LastLogits(out) if ends_input && !gather => {
                be.final_norm(last, 1)?;
                be.logits(last, out)?;
            }
            Want::LastArgmax(id) if ends_input && !gather => {
                be.final_norm(last, 1)?;
                **id = be.argmax(last)?;
            }
            Want::LastLogits(_) | Want::LastArgmax(_) => {}
        }
    }
    if gather {
        let mut chosen = [0usize; MAX_SEGMENTS];
        let mut n = 0;
        for (i, seg) in segments.iter().enumerate() {
            if wants_last(seg, wants) {
                chosen[n] = i;
                n += 1;
            }
        }
        for group in chosen[..n].chunks(be.max_logit_rows()) {
            let mut rows = [0usize; MAX_SEGMENTS];
            for (r, &i) in rows.iter_mut().zip(group) {
                *r = segments[i].row + segments[i].len - 1;
                be.final_norm(*r, 1)?;
            }
            let logits = be.logits_rows(&rows[..group.len()])?;
            for (row, &i) in logits.chunks_exact(vocab).zip(group) {
                match &mut wants[segments[i].seq] {
                    Want::LastLogits(out) => out.copy_from_slice(row),
                    Want::LastArgmax(id) => **id = crate::sample::argmax(row),
                    _ => {}
                }
            }
        }
    }
    be.commit(segments)
}

/// The mean over positions of `n × dim` hidden states: the embedding `sapient embed` prints.
///
/// # Errors
/// [`Error::InvalidArgument`] if `hidden` is not whole rows of `dim`, [`Error::Length`] if
/// `out` is not `dim` long.
pub fn mean_rows(hidden: &[f32], dim: usize, out: &mut [f32]) -> Result<()> {
    if dim == 0 || !hidden.len().is_multiple_of(dim) {
        return Err(Error::InvalidArgument {
            what: "mean_rows",
            reason: "the hidden states are not whole rows of `dim` values",
        });
    }
    if out.len() != dim {
        return Err(Error::Length {
            what: "mean_rows output",
            expected: dim,
            got: out.len(),
        });
    }
    let n = hidden.len() / dim;
    out.fill(0.0);
    for row in hidden.chunks_exact(dim) {
        ops::add(out, row)?;
    }
    if n > 0 {
        out.iter_mut().for_each(|v| *v /= n as f32);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use alloc::vec;
    use alloc::vec::Vec;

    use super::*;
    use crate::config::RopeStyle;
    use crate::exec::Serial;
    use crate::kv_cache::KvFormat;
    use crate::quant::Format;
    use crate::sample::{Sampler, SamplerConfig};
    use crate::weights::{LayerWeights, Matrix};

    fn tiny_config() -> Config {
        Config {
            vocab_size: 16,
            hidden_size: 32,
            intermediate_size: 48,
            // One layer under Miri, which interprets every operation.
            n_layers: if cfg!(miri) { 1 } else { 2 },
            n_heads: 2,
            n_kv_heads: 1,
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

    /// A `rows × cols` matrix of deterministic values in `format`.
    fn matrix(format: Format, rows: usize, cols: usize, seed: usize) -> Matrix<'static> {
        let v: Vec<f32> = (0..rows * cols)
            .map(|i| libm::sinf((i * 7 + seed * 13) as f32 * 0.31) * 0.5)
            .collect();
        Matrix::quantize(format, rows, cols, &v).unwrap()
    }

    fn tiny_model() -> Model<'static> {
        let c = tiny_config();
        let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let layers = (0..c.n_layers)
            .map(|l| LayerWeights {
                attn_norm: vec![1.0; h].into(),
                // Q8_0 where the input rows are whole blocks, f32 for the down projection's
                // 48-wide rows.
                wq: matrix(Format::Q8_0, q, h, 10 * l),
                wk: matrix(Format::Q8_0, kv, h, 10 * l + 1),
                wv: matrix(Format::Q8_0, kv, h, 10 * l + 2),
                wo: matrix(Format::Q8_0, h, q, 10 * l + 3),
                bq: None,
                bk: None,
                bv: None,
                ffn_norm: vec![1.0; h].into(),
                w_gate: matrix(Format::Q8_0, ff, h, 10 * l + 4),
                w_up: matrix(Format::Q8_0, ff, h, 10 * l + 5),
                w_down: matrix(Format::F32, h, ff, 10 * l + 6),
            })
            .collect();
        let weights = Weights {
            embed: matrix(Format::Q8_0, c.vocab_size, h, 99),
            layers,
            norm: vec![1.0; h].into(),
            lm_head: None,
            rope_freq_factors: None,
        };
        Model::new(c, weights).unwrap()
    }

    /// The whole path a firmware takes, in memory the caller owns: arenas sized by
    /// `bytes_needed`, a prompt, then greedy tokens, each step's logits from the cache equal to
    /// those of the whole sequence at once. Small enough for Miri, which checks the arenas'
    /// casts.
    #[test]
    fn forward_in_caller_memory_decodes_as_it_prefills() {
        let model = tiny_model();
        let c = &model.config;
        let ctx = if cfg!(miri) { 4 } else { 8 };
        let mut kv_mem = vec![0u8; KvCache::bytes_needed(c, ctx, KvFormat::Q8_0).unwrap()];
        let need = Scratch::bytes_needed(c, 4).unwrap();
        let mut scratch_mem = vec![0u8; need + 3];
        // The scratch holds f32s: start it at an aligned byte.
        let at = scratch_mem.as_ptr().align_offset(4);
        let scratch_bytes = &mut scratch_mem[at..at + need];
        let mut cache = KvCache::new(c, ctx, KvFormat::Q8_0, &mut kv_mem).unwrap();
        let mut scratch = Scratch::new(c, 4, scratch_bytes).unwrap();
        let mut sampler = Sampler::new(SamplerConfig::greedy()).unwrap();
        let mut tokens = vec![1u32, 5, 9];
        let mut logits = vec![0f32; c.vocab_size];
        model
            .forward(
                &tokens,
                &mut cache,
                &mut scratch,
                &Serial,
                Want::LastLogits(&mut logits),
            )
            .unwrap();
        while tokens.len() < ctx {
            let next = sampler.sample(&mut logits, &tokens).unwrap();
            assert!((next as usize) < c.vocab_size);
            tokens.push(next);
            model
                .forward(
                    &[next],
                    &mut cache,
                    &mut scratch,
                    &Serial,
                    Want::LastLogits(&mut logits),
                )
                .unwrap();
        }
        assert_eq!(cache.len(), ctx);
        // The same tokens at once, in a fresh cache: the last logits agree bit for bit.
        let mut again = vec![0f32; c.vocab_size];
        let mut cache2 = KvCache::new(c, ctx, KvFormat::Q8_0, &mut kv_mem).unwrap();
        model
            .forward(
                &tokens,
                &mut cache2,
                &mut scratch,
                &Serial,
                Want::LastLogits(&mut again),
            )
            .unwrap();
        assert_eq!(
            logits.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            again.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        // One more token does not fit.
        let err = model
            .forward(&[1], &mut cache2, &mut scratch, &Serial, Want::Nothing)
            .unwrap_err();
        assert!(matches!(err, Error::ContextFull { .. }), "{err}");
    }
}
