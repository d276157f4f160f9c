//! The Llama layer loop: one loop for Llama 1/2/3, SmolLM, Mistral, Qwen2 and the SmolVLM text
//! backbone, written against `Backend`, and `Model`, which runs it on the CPU.
use alloc::vec::Vec;

use crate::arena::Scratch;
use crate::backend::Backend;
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
        cache.check_shape(&self.config)?;
        scratch.check_shape(&self.config)?;
        // `run` takes a closure it may call only once; the Option hands `want` over.
        let mut want = Some(want);
        let mut result = Ok(());
        exec.run(&mut || {
            if let Some(want) = want.take() {
                let mut cpu = Cpu::new(self, exec, cache, scratch.split());
                result = layer_loop(&self.config, &mut cpu, tokens, want);
            }
        });
        result
    }
}

/// Runs `tokens` through the model on `backend`, at the positions after those its KV cache
/// holds, and fills `want`. Inputs longer than the backend's batch are processed in batches.
pub fn layer_loop<B: Backend + ?Sized>(
    c: &Config,
    backend: &mut B,
    tokens: &[u32],
    mut want: Want<'_>,
) -> Result<()> {
    let n = tokens.len();
    if let Some(&token) = tokens.iter().find(|t| **t as usize >= c.vocab_size) {
        return Err(Error::TokenOutOfRange {
            token,
            vocab: c.vocab_size,
        });
    }
    let pos = backend.kv_len();
    if n > backend.kv_capacity() - pos {
        return Err(Error::ContextFull {
            pos,
            tokens: n,
            max_seq: backend.kv_capacity(),
        });
    }
    let expected = match &want {
        Want::Nothing | Want::LastArgmax(_) => None,
        Want::LastLogits(o) => Some(("last logits", c.vocab_size, o.len())),
        Want::AllLogits(o) => Some(("all logits", n * c.vocab_size, o.len())),
        Want::Hidden(o) => Some(("hidden states", n * c.hidden_size, o.len())),
    };
    if let Some((what, expected, got)) = expected {
        if expected != got {
            return Err(Error::Length {
                what,
                expected,
                got,
            });
        }
    }
    let batch = backend.max_batch();
    let mut start = 0;
    while start < n {
        let end = (start + batch).min(n);
        let part = match &mut want {
            Want::Nothing => Want::Nothing,
            Want::LastLogits(o) if end == n => Want::LastLogits(o),
            Want::LastArgmax(id) if end == n => Want::LastArgmax(id),
            Want::LastLogits(_) | Want::LastArgmax(_) => Want::Nothing,
            Want::AllLogits(o) => Want::AllLogits(&mut o[start * c.vocab_size..end * c.vocab_size]),
            Want::Hidden(o) => Want::Hidden(&mut o[start * c.hidden_size..end * c.hidden_size]),
        };
        forward_batch(c, backend, &tokens[start..end], part)?;
        start = end;
    }
    Ok(())
}

fn forward_batch<B: Backend + ?Sized>(
    c: &Config,
    be: &mut B,
    tokens: &[u32],
    want: Want<'_>,
) -> Result<()> {
    let n = tokens.len();
    let pos0 = be.kv_len();
    be.embed(tokens, pos0)?;
    for layer in 0..c.n_layers {
        be.qkv(layer, n)?;
        be.rope_store(layer, n, pos0)?;
        be.attention(layer, n, pos0)?;
        be.attn_out(layer, n)?;
        be.gate_up(layer, n)?;
        be.ffn_out(layer, n)?;
    }
    match want {
        Want::Nothing => {}
        Want::Hidden(out) => {
            be.final_norm(0, n)?;
            be.read_hidden(out)?;
        }
        Want::LastLogits(out) => {
            be.final_norm(n - 1, 1)?;
            be.logits(n - 1, out)?;
        }
        Want::LastArgmax(id) => {
            be.final_norm(n - 1, 1)?;
            *id = be.argmax(n - 1)?;
        }
        Want::AllLogits(out) => {
            be.final_norm(0, n)?;
            be.logits(0, out)?;
        }
    }
    be.commit(n)
}

/// The mean over positions of `n × dim` hidden states: the embedding `sapient embed` prints.
pub fn mean_rows(hidden: &[f32], dim: usize, out: &mut [f32]) -> Result<()> {
    if dim == 0 || !hidden.len().is_multiple_of(dim) || out.len() != dim {
        return Err(Error::Length {
            what: "mean_rows",
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
