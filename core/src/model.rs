//! The Llama layer loop: one loop for Llama 1/2/3, SmolLM, Mistral, Qwen2 and the SmolVLM text
//! backbone, written against `Backend`, and `Model`, which runs it on the CPU.
use alloc::vec::Vec;

use crate::arena::Scratch;
use crate::backend::{Backend, Segment};
use crate::config::Config;
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

pub struct Model<'w> {
    pub config: Config,
    pub weights: Weights<'w>,
    inv_freq: Vec<f32>,
    kernels: &'static Kernels,
}

impl<'w> Model<'w> {
    /// Checks every weight against `config` and picks the fastest kernels for this CPU.
    pub fn new(config: Config, weights: Weights<'w>) -> Result<Self> {
        weights.validate(&config)?;
        let mut inv_freq = config.rope_inv_freq();
        if let Some(factors) = &weights.rope_freq_factors {
            for (f, d) in inv_freq.iter_mut().zip(factors) {
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
