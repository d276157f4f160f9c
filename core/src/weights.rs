//! Weights as the layer loop reads them: matrices in any supported format, and norms and biases
//! in f32, each borrowed (from a memory map or a `static`) or owned. Firmware borrows everything,
//! layers included, so building a model needs no allocator.
use alloc::borrow::Cow;
use alloc::vec::Vec;
use core::ops::Deref;

use crate::config::Config;
use crate::error::{Error, Result};
pub use crate::matrix::Matrix;

/// One transformer block.
#[derive(Debug, Clone)]
pub struct LayerWeights<'w> {
    /// RMSNorm weights before attention (`hidden_size`).
    pub attn_norm: Cow<'w, [f32]>,
    /// Query projection (`q_dim × hidden_size`).
    pub wq: Matrix<'w>,
    /// Key projection (`kv_dim × hidden_size`).
    pub wk: Matrix<'w>,
    /// Value projection (`kv_dim × hidden_size`).
    pub wv: Matrix<'w>,
    /// Attention's output projection (`hidden_size × q_dim`).
    pub wo: Matrix<'w>,
    /// Qwen2's projection biases.
    pub bq: Option<Cow<'w, [f32]>>,
    /// Qwen2's key bias (`kv_dim`).
    pub bk: Option<Cow<'w, [f32]>>,
    /// Qwen2's value bias (`kv_dim`).
    pub bv: Option<Cow<'w, [f32]>>,
    /// RMSNorm weights before the feed-forward (`hidden_size`).
    pub ffn_norm: Cow<'w, [f32]>,
    /// Feed-forward gate projection (`intermediate_size × hidden_size`).
    pub w_gate: Matrix<'w>,
    /// Feed-forward up projection (`intermediate_size × hidden_size`).
    pub w_up: Matrix<'w>,
    /// Feed-forward down projection (`hidden_size × intermediate_size`).
    pub w_down: Matrix<'w>,
}

/// Every weight of a model, borrowed for `'w` or owned.
#[derive(Debug, Clone)]
pub struct Weights<'w> {
    /// Token embeddings (`vocab_size × hidden_size`).
    pub embed: Matrix<'w>,
    /// The transformer blocks, in order.
    pub layers: Layers<'w>,
    /// The final RMSNorm's weights (`hidden_size`).
    pub norm: Cow<'w, [f32]>,
    /// `None` when the output projection is tied to the embedding.
    pub lm_head: Option<Matrix<'w>>,
    /// Llama 3.1+ GGUF files' `rope_freqs.weight`: one divisor per pair of a head, applied to
    /// RoPE's frequencies (llama.cpp's frequency factors, in place of `Config::rope_scaling`).
    pub rope_freq_factors: Option<Cow<'w, [f32]>>,
}

/// The layers, owned or borrowed. Not a `Cow`: `Cow<'w, [LayerWeights<'w>]>` would make
/// `Weights` invariant in `'w`, so a `Weights<'static>` could not stand in for a shorter one.
#[derive(Debug, Clone)]
pub enum Layers<'w> {
    /// Owned (the std frontend's loaders).
    Owned(Vec<LayerWeights<'w>>),
    /// Borrowed (firmware: an array built at start).
    Borrowed(&'w [LayerWeights<'w>]),
}

impl<'w> Layers<'w> {
    /// The layers to modify, copied first if borrowed (as `Cow::to_mut`).
    pub fn to_mut(&mut self) -> &mut Vec<LayerWeights<'w>> {
        if let Layers::Borrowed(s) = *self {
            *self = Layers::Owned(s.to_vec());
        }
        match self {
            Layers::Owned(v) => v,
            Layers::Borrowed(_) => unreachable!("made owned above"),
        }
    }
}

impl<'w> Deref for Layers<'w> {
    type Target = [LayerWeights<'w>];

    fn deref(&self) -> &Self::Target {
        match self {
            Layers::Owned(v) => v,
            Layers::Borrowed(s) => s,
        }
    }
}

impl<'w> From<Vec<LayerWeights<'w>>> for Layers<'w> {
    fn from(v: Vec<LayerWeights<'w>>) -> Self {
        Layers::Owned(v)
    }
}

impl<'w> FromIterator<LayerWeights<'w>> for Layers<'w> {
    fn from_iter<I: IntoIterator<Item = LayerWeights<'w>>>(iter: I) -> Self {
        Layers::Owned(iter.into_iter().collect())
    }
}

impl<'w> From<&'w [LayerWeights<'w>]> for Layers<'w> {
    fn from(s: &'w [LayerWeights<'w>]) -> Self {
        Layers::Borrowed(s)
    }
}

impl Weights<'_> {
    /// The output projection: `lm_head`, or the embedding when they are tied.
    pub fn output(&self) -> &Matrix<'_> {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Checks every shape against `config`, naming the first tensor that disagrees.
    ///
    /// # Errors
    /// As [`Config::validate`], then [`Error::Shape`] naming the first tensor (and layer) whose
    /// shape disagrees, or [`Error::InvalidConfig`] for missing biases, a layer count that
    /// disagrees, or frequency factors that are not finite and positive.
    pub fn validate(&self, c: &Config) -> Result<()> {
        c.validate()?;
        let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        mat("embed_tokens", None, &self.embed, c.vocab_size, h)?;
        vector("norm", None, &self.norm, h)?;
        if let Some(m) = &self.lm_head {
            mat("lm_head", None, m, c.vocab_size, h)?;
        }
        if let Some(f) = &self.rope_freq_factors {
            vector("rope_freqs", None, f, c.head_dim / 2)?;
            if !f.iter().all(|v| v.is_finite() && *v > 0.0) {
                return Err(Error::InvalidConfig {
                    field: "rope_freqs",
                    reason: "frequency factors must be finite and positive",
                });
            }
            if c.rope_scaling.is_some() {
                return Err(Error::InvalidConfig {
                    field: "rope_freqs",
                    reason:
                        "frequency factors and rope_scaling are two ways to scale RoPE; give one",
                });
            }
        }
        if self.layers.len() != c.n_layers {
            return Err(Error::InvalidConfig {
                field: "num_hidden_layers",
                reason: "disagrees with the number of layers in the weights",
            });
        }
        for (i, l) in self.layers.iter().enumerate() {
            let i = Some(i);
            vector("input_layernorm", i, &l.attn_norm, h)?;
            vector("post_attention_layernorm", i, &l.ffn_norm, h)?;
            mat("q_proj", i, &l.wq, q, h)?;
            mat("k_proj", i, &l.wk, kv, h)?;
            mat("v_proj", i, &l.wv, kv, h)?;
            mat("o_proj", i, &l.wo, h, q)?;
            mat("gate_proj", i, &l.w_gate, ff, h)?;
            mat("up_proj", i, &l.w_up, ff, h)?;
            mat("down_proj", i, &l.w_down, h, ff)?;
            for (name, b, n) in [
                ("q_proj.bias", &l.bq, q),
                ("k_proj.bias", &l.bk, kv),
                ("v_proj.bias", &l.bv, kv),
            ] {
                match b {
                    Some(b) => vector(name, i, b, n)?,
                    None if c.qkv_bias => {
                        return Err(Error::InvalidConfig {
                            field: "attention_bias",
                            reason: "is set but a q/k/v bias is missing",
                        })
                    }
                    None => {}
                }
            }
        }
        Ok(())
    }
}

fn mat(
    tensor: &'static str,
    layer: Option<usize>,
    m: &Matrix<'_>,
    rows: usize,
    cols: usize,
) -> Result<()> {
    if m.rows != rows || m.cols != cols {
        return Err(Error::Shape {
            tensor,
            layer,
            expected: [rows, cols],
            got: [m.rows, m.cols],
        });
    }
    Ok(())
}

fn vector(tensor: &'static str, layer: Option<usize>, v: &[f32], n: usize) -> Result<()> {
    if v.len() != n {
        return Err(Error::Shape {
            tensor,
            layer,
            expected: [n, 1],
            got: [v.len(), 1],
        });
    }
    Ok(())
}
