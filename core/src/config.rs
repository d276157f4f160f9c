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

/// How a model stretches RoPE past the context it was trained on (`rope_type` in Hugging Face's
/// `rope_scaling`, `rope.scaling.type` in GGUF).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Position interpolation (`"linear"`): every frequency divided by `factor`.
    Linear {
        /// How much longer the context is than the one the model was trained on.
        factor: f32,
    },
    /// Llama 3's per-wavelength scaling (`"llama3"`).
    Llama3(Llama3Scaling),
    /// YaRN (`"yarn"`): frequencies blended between interpolated and not by wavelength, and the
    /// rotation scaled by an attention factor.
    Yarn(YarnScaling),
}

impl RopeScaling {
    /// The factor the context was stretched by.
    pub const fn factor(&self) -> f32 {
        match self {
            RopeScaling::Linear { factor } => *factor,
            RopeScaling::Llama3(s) => s.factor,
            RopeScaling::Yarn(s) => s.factor,
        }
    }

    /// The name Hugging Face's `rope_type` gives it.
    pub const fn name(&self) -> &'static str {
        match self {
            RopeScaling::Linear { .. } => "linear",
            RopeScaling::Llama3(_) => "llama3",
            RopeScaling::Yarn(_) => "yarn",
        }
    }
}

/// Llama-3 frequency scaling (`rope_type = "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Scaling {
    /// How much longer the context is than the one the model was trained on.
    pub factor: f32,
    /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled fully.
    pub low_freq_factor: f32,
    /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
    pub high_freq_factor: f32,
    /// The context the model was trained on.
    pub original_max_position_embeddings: usize,
}

/// YaRN scaling (`rope_type = "yarn"`), as transformers' `_compute_yarn_parameters` and ggml's
/// `rope_yarn` compute it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YarnScaling {
    /// How much longer the context is than the one the model was trained on.
    pub factor: f32,
    /// The context the model was trained on.
    pub original_max_position_embeddings: usize,
    /// Pairs that turn more than `beta_fast` times over the original context keep their
    /// frequency (32 unless the model says otherwise).
    pub beta_fast: f32,
    /// Pairs that turn fewer than `beta_slow` times are interpolated fully (1 unless the model
    /// says otherwise).
    pub beta_slow: f32,
    /// Whether the ramp's ends are rounded outwards to whole pairs (transformers' `truncate`,
    /// true unless the model says otherwise; ggml always rounds).
    pub truncate: bool,
    /// What cos and sin are multiplied by (`attention_factor`; by default
    /// `0.1 · ln(factor) + 1`).
    pub attention_factor: f32,
}

impl YarnScaling {
    /// The attention factor YaRN's paper suggests when a model gives none: `0.1 · mscale ·
    /// ln(factor) + 1` (transformers' `yarn_get_mscale`), 1 for factors up to 1.
    pub fn mscale(factor: f64, mscale: f64) -> f64 {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * mscale * libm::log(factor) + 1.0
        }
    }

    /// The first pair of the ramp between extrapolated and interpolated frequencies and its
    /// width in pairs (transformers' `find_correction_range`), for heads of `head_dim` and base
    /// `theta`.
    fn ramp(&self, head_dim: usize, theta: f32) -> (f32, f32) {
        let dim = head_dim as f64;
        let old = self.original_max_position_embeddings as f64;
        let pair = |rotations: f32| {
            let turns = old / (rotations as f64 * 2.0 * core::f64::consts::PI);
            dim * libm::log(turns) / (2.0 * libm::log(theta as f64))
        };
        let (mut low, mut high) = (pair(self.beta_fast), pair(self.beta_slow));
        if self.truncate {
            (low, high) = (libm::floor(low), libm::ceil(high));
        }
        let (low, high) = (low.max(0.0), high.min(dim - 1.0));
        // transformers widens an empty ramp by a thousandth; both in Python's f64.
        let width = if low == high { 0.001 } else { high - low };
        (low as f32, width as f32)
    }
}

/// Upper bound on `head_dim`. Attention keeps blocks of query rows on the stack, about 170 bytes
/// per unit of `MAX_HEAD_DIM` per thread (82 KiB at 512), so firmware for models with small heads
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
    /// RoPE scaling, if the model has it.
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
            if !rope_scaling_is_valid(s) {
                return Err(invalid(
                    "rope_scaling",
                    "needs a finite factor > 0; llama3: 0 < low_freq_factor < high_freq_factor; \
                     llama3 and yarn: original_max_position_embeddings > 0; yarn: finite betas and \
                     an attention factor > 0",
                ));
            }
        }
        Ok(())
    }

    /// RoPE inverse frequencies, one per pair (`head_dim / 2`), computed in f32 as transformers
    /// does, with the model's scaling applied. A fixed-size table: no allocation.
    pub fn rope_inv_freq(&self) -> InvFreq {
        let d = self.head_dim.min(MAX_HEAD_DIM);
        let mut freqs = InvFreq::new();
        for i in 0..d / 2 {
            let f = 1.0 / libm::powf(self.rope_theta, (2 * i) as f32 / d as f32);
            let f = match self.rope_scaling {
                None => f,
                Some(RopeScaling::Linear { factor }) => f / factor,
                Some(RopeScaling::Llama3(s)) => llama3_scale(f, s),
                Some(RopeScaling::Yarn(s)) => yarn_scale(i, d, self.rope_theta, s),
            };
            // Cannot fail: `d / 2` is at most the table's capacity.
            let _ = freqs.push(f);
        }
        freqs
    }

    /// The context the model supports: `max_position_embeddings`, or YaRN's original context
    /// times its factor where that is longer (Qwen2.5's model cards switch YaRN on without
    /// raising `max_position_embeddings`).
    pub fn context_length(&self) -> usize {
        match self.rope_scaling {
            Some(RopeScaling::Yarn(s)) => {
                let stretched = s.original_max_position_embeddings as f64 * s.factor as f64;
                self.max_position_embeddings
                    .max(stretched.min(MAX_DIM as f64) as usize)
            }
            _ => self.max_position_embeddings,
        }
    }

    /// What RoPE's cos and sin are multiplied by: YaRN's attention factor, 1 otherwise.
    pub const fn rope_attention_factor(&self) -> f32 {
        match self.rope_scaling {
            Some(RopeScaling::Yarn(s)) => s.attention_factor,
            _ => 1.0,
        }
    }
}

/// RoPE's inverse frequencies, one per pair of a head.
pub type InvFreq = heapless::Vec<f32, { MAX_HEAD_DIM / 2 }>;

const fn invalid(field: &'static str, reason: &'static str) -> Error {
    Error::InvalidConfig { field, reason }
}

/// transformers' `_compute_llama3_parameters` for one frequency.
fn llama3_scale(inv_freq: f32, s: Llama3Scaling) -> f32 {
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

/// transformers' `_compute_yarn_parameters` for pair `i` of `d`-wide heads: the frequency blended
/// between the interpolated one (divided by `factor`) and the original by where the pair falls
/// on the ramp, in f32 as torch computes it.
fn yarn_scale(i: usize, d: usize, theta: f32, s: YarnScaling) -> f32 {
    let pos_freq = libm::powf(theta, (2 * i) as f32 / d as f32);
    let extrapolated = 1.0 / pos_freq;
    let interpolated = 1.0 / (s.factor * pos_freq);
    let (low, width) = s.ramp(d, theta);
    let ramp = ((i as f32 - low) / width).clamp(0.0, 1.0);
    let kept = 1.0 - ramp;
    interpolated * (1.0 - kept) + extrapolated * kept
}

/// Whether `s` has numbers RoPE can be computed from.
const fn rope_scaling_is_valid(s: RopeScaling) -> bool {
    let factor = s.factor();
    if !(factor.is_finite() && factor > 0.0) {
        return false;
    }
    match s {
        RopeScaling::Linear { .. } => true,
        RopeScaling::Llama3(s) => {
            s.low_freq_factor.is_finite()
                && s.high_freq_factor.is_finite()
                && s.high_freq_factor > s.low_freq_factor
                && s.low_freq_factor > 0.0
                && s.original_max_position_embeddings > 0
        }
        RopeScaling::Yarn(s) => {
            s.beta_fast.is_finite()
                && s.beta_slow.is_finite()
                && s.beta_fast > 0.0
                && s.beta_slow > 0.0
                && s.attention_factor.is_finite()
                && s.attention_factor > 0.0
                && s.original_max_position_embeddings > 0
        }
    }
}
