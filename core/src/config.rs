//! The numbers a Llama-family model is made of. Plain data, buildable in a `const` (firmware sizes
//! its arenas from one at compile time); parsing lives in the std frontend.

use crate::error::{Error, Result};

/// Which elements of a head RoPE rotates together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(i, i + d/2)`: Hugging Face checkpoints of every architecture, and GGUF `qwen2`.
    Halves,
    /// Pairs `(2i, 2i + 1)`: GGUF `llama` tensors, whose Q/K rows llama.cpp's converter permuted.
    Adjacent,
}

/// Llama-3 frequency scaling (`rope_type = "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeScaling {
    /// How much longer the context is than the one the model was trained on.
    pub factor: f32,
    /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled fully.
    pub low_freq_factor: f32,
    /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
    pub high_freq_factor: f32,
    /// The context the model was trained on.
    pub original_max_position_embeddings: usize,
}

/// Upper bound on `head_dim`. Attention keeps blocks of query rows on the stack, about 170 bytes
/// per unit of `MAX_HEAD_DIM` per thread (88 KiB at 512), so firmware for models with small heads
/// shrinks its stack by setting `SAPIENT_MAX_HEAD_DIM` (a multiple of 32) when it builds the core,
/// as embassy's crates take their sizes; 512 otherwise. A model with larger heads is then refused
/// by `Config::validate`, not run.
pub const MAX_HEAD_DIM: usize = match option_env!("SAPIENT_MAX_HEAD_DIM") {
    Some(s) => parse_max_head_dim(s),
    None => 512,
};

/// `SAPIENT_MAX_HEAD_DIM`'s value; a build with a bad one fails to compile, naming it.
const fn parse_max_head_dim(s: &str) -> usize {
    let digits = s.as_bytes();
    let mut n = 0usize;
    let mut i = 0;
    while i < digits.len() {
        let d = digits[i];
        if !d.is_ascii_digit() || n > 4096 {
            panic!("SAPIENT_MAX_HEAD_DIM must be a number from 32 to 4096");
        }
        n = n * 10 + (d - b'0') as usize;
        i += 1;
    }
    if n < 32 || n > 4096 || !n.is_multiple_of(32) {
        panic!("SAPIENT_MAX_HEAD_DIM must be a multiple of 32 from 32 to 4096");
    }
    n
}
/// Upper bound on any single dimension, far above any real model, so that products of dimensions
/// cannot overflow `usize` on a 64-bit target.
pub const MAX_DIM: usize = 1 << 24;

/// A model's shape and constants, named as in Hugging Face's `config.json` where they come from it.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Tokens in the vocabulary (rows of the embedding).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the feed-forward's hidden layer.
    pub intermediate_size: usize,
    /// Transformer blocks (`num_hidden_layers`).
    pub n_layers: usize,
    /// Query heads (`num_attention_heads`).
    pub n_heads: usize,
    /// Key/value heads (`num_key_value_heads`); fewer than `n_heads` is grouped-query attention.
    pub n_kv_heads: usize,
    /// Values per head (at most `MAX_HEAD_DIM`).
    pub head_dim: usize,
    /// Added to the mean square in RMSNorm.
    pub rms_norm_eps: f32,
    /// RoPE's base frequency.
    pub rope_theta: f32,
    /// Which elements RoPE rotates together.
    pub rope_style: RopeStyle,
    /// Llama-3 frequency scaling, if the model has it.
    pub rope_scaling: Option<RopeScaling>,
    /// Whether the output projection is the embedding.
    pub tie_word_embeddings: bool,
    /// Qwen2: Q, K and V projections carry biases.
    pub qkv_bias: bool,
    /// Mistral: a query sees itself and the `w - 1` positions before it.
    pub sliding_window: Option<usize>,
    /// The context the model supports.
    pub max_position_embeddings: usize,
}

impl Config {
    /// Width of all query heads together: `n_heads × head_dim`.
    pub const fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of all key (or value) heads together: `n_kv_heads × head_dim`.
    pub const fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Rejects any configuration that could not run: zero or absurd sizes, heads that do not
    /// group, an odd head dimension, non-finite constants.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first field (by its Hugging Face name) that is wrong.
    pub const fn validate(&self) -> Result<()> {
        let dims = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.n_layers),
            ("num_attention_heads", self.n_heads),
            ("num_key_value_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
        ];
        // A `while` loop: `for` is not available in a `const fn`.
        let mut i = 0;
        while i < dims.len() {
            let (field, v) = dims[i];
            if v == 0 {
                return Err(invalid(field, "must be greater than zero"));
            }
            if v > MAX_DIM {
                return Err(invalid(field, "is too large"));
            }
            i += 1;
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(invalid(
                "num_key_value_heads",
                "must divide num_attention_heads",
            ));
        }
        if !self.head_dim.is_multiple_of(2) || self.head_dim > MAX_HEAD_DIM {
            return Err(invalid(
                "head_dim",
                "must be even and at most MAX_HEAD_DIM (512 unless SAPIENT_MAX_HEAD_DIM is set)",
            ));
        }
        if self.q_dim() > MAX_DIM {
            return Err(invalid(
                "num_attention_heads",
                "times head_dim is too large",
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return Err(invalid("rms_norm_eps", "must be finite and non-negative"));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(invalid("rope_theta", "must be finite and positive"));
        }
        if let Some(0) = self.sliding_window {
            return Err(invalid("sliding_window", "must be greater than zero"));
        }
        if let Some(s) = self.rope_scaling {
            let ok = s.factor.is_finite()
                && s.factor > 0.0
                && s.low_freq_factor.is_finite()
                && s.high_freq_factor.is_finite()
                && s.high_freq_factor > s.low_freq_factor
                && s.low_freq_factor > 0.0
                && s.original_max_position_embeddings > 0;
            if !ok {
                return Err(invalid(
                    "rope_scaling",
                    "needs factor > 0, 0 < low_freq_factor < high_freq_factor and original_max_position_embeddings > 0",
                ));
            }
        }
        Ok(())
    }

    /// RoPE inverse frequencies, one per pair (`head_dim / 2`), computed in f32 as transformers
    /// does, with Llama-3 scaling applied when configured. A fixed-size table: no allocation.
    pub fn rope_inv_freq(&self) -> InvFreq {
        let d = self.head_dim.min(MAX_HEAD_DIM);
        let mut freqs = InvFreq::new();
        for i in 0..d / 2 {
            let f = 1.0 / libm::powf(self.rope_theta, (2 * i) as f32 / d as f32);
            let f = match self.rope_scaling {
                Some(s) => llama3_scale(f, s),
                None => f,
            };
            // Cannot fail: `d / 2` is at most the table's capacity.
            let _ = freqs.push(f);
        }
        freqs
    }
}

/// RoPE's inverse frequencies, one per pair of a head.
pub type InvFreq = heapless::Vec<f32, { MAX_HEAD_DIM / 2 }>;

const fn invalid(field: &'static str, reason: &'static str) -> Error {
    Error::InvalidConfig { field, reason }
}

/// transformers' `_compute_llama3_parameters` for one frequency.
fn llama3_scale(inv_freq: f32, s: RopeScaling) -> f32 {
    let old = s.original_max_position_embeddings as f32;
    let low_freq_wavelen = old / s.low_freq_factor;
    let high_freq_wavelen = old / s.high_freq_factor;
    let wavelen = 2.0 * core::f32::consts::PI / inv_freq;
    if wavelen < high_freq_wavelen {
        inv_freq
    } else if wavelen > low_freq_wavelen {
        inv_freq / s.factor
    } else {
        let smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        (1.0 - smooth) * inv_freq / s.factor + smooth * inv_freq
    }
}
