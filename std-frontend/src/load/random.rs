//! Models of a known shape with random weights, `random:SHAPE[:FORMAT]`: speed depends on the
//! shape and the weight format, not on the values, so benchmarks can run where no model file can
//! be fetched (a GPU machine with no network, a CI runner) and on shapes no small file has.
use anyhow::{bail, Result};
use rayon::prelude::*;
use sapient_core::quant::{self, Format};
use sapient_core::sample::Rng;
use sapient_core::{Config, LayerWeights, Matrix, Model, RopeStyle, Weights};

use crate::convert::{matrix_format, Placement, Role, Target};

/// The shapes `random:` knows, as (name, vocab, hidden, intermediate, layers, heads, kv heads,
/// head_dim, tied embeddings).
const SHAPES: [(&str, [usize; 7], bool); 4] = [
    ("smollm2-135m", [49152, 576, 1536, 30, 9, 3, 64], true),
    ("tinyllama-1.1b", [32000, 2048, 5632, 22, 32, 4, 64], false),
    ("llama-3.2-1b", [128256, 2048, 8192, 16, 32, 8, 64], true),
    ("llama-3.1-8b", [128256, 4096, 14336, 32, 32, 8, 128], false),
];

/// How a random model's matrices are stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RandomFormat {
    /// Every matrix in one format.
    All(Format),
    /// Each matrix as `sapient quantize` (and llama-quantize) picks it for the target.
    Mix(Target),
}

/// A parsed `random:SHAPE[:FORMAT]`.
#[derive(Debug, Clone)]
pub struct RandomSpec {
    pub name: String,
    pub config: Config,
    pub format: RandomFormat,
}

/// `None` when `spec` does not start with `random:`.
pub fn parse(spec: &str) -> Result<Option<RandomSpec>> {
    let Some(rest) = spec.strip_prefix("random:") else {
        return Ok(None);
    };
    let (shape, format) = rest.split_once(':').unwrap_or((rest, "q8_0"));
    let names: Vec<&str> = SHAPES.iter().map(|s| s.0).collect();
    let Some((name, [vocab, hidden, inter, layers, heads, kv, hd], tied)) =
        SHAPES.iter().find(|s| s.0 == shape)
    else {
        bail!(
            "random:{shape}: unknown shape (known: {})",
            names.join(", ")
        );
    };
    let format = match format {
        "q8_0" => RandomFormat::All(Format::Q8_0),
        "q4_0" => RandomFormat::All(Format::Q4_0),
        "q4_1" => RandomFormat::All(Format::Q4_1),
        "q4_k" => RandomFormat::All(Format::Q4K),
        "q6_k" => RandomFormat::All(Format::Q6K),
        "q4_k_m" => RandomFormat::Mix(Target::Q4KM),
        "q5_k_m" => RandomFormat::Mix(Target::Q5KM),
        "iq4_nl" => RandomFormat::Mix(Target::IQ4NL),
        "iq4_xs" => RandomFormat::Mix(Target::IQ4XS),
        "f16" => RandomFormat::All(Format::F16),
        "f32" => RandomFormat::All(Format::F32),
        other => bail!(
            "random:{shape}:{other}: unknown format \
             (q8_0, q4_0, q4_1, q4_k, q6_k, q4_k_m, q5_k_m, iq4_nl, iq4_xs, f16, f32)"
        ),
    };
    let config = Config {
        vocab_size: *vocab,
        hidden_size: *hidden,
        intermediate_size: *inter,
        n_layers: *layers,
        n_heads: *heads,
        n_kv_heads: *kv,
        head_dim: *hd,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_style: RopeStyle::Halves,
        rope_scaling: None,
        tie_word_embeddings: *tied,
        qkv_bias: false,
        sliding_window: None,
        max_position_embeddings: 131072,
    };
    Ok(Some(RandomSpec {
        name: name.to_string(),
        config,
        format,
    }))
}

/// The model, its matrices filled from a fixed seed (uniform in ±0.05) in `spec.format`, norms
/// all ones; `progress` is told each layer made.
pub fn model(spec: &RandomSpec, progress: &(dyn Fn(usize) + Sync)) -> Result<Model<'static>> {
    let c = &spec.config;
    let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let format = |role: Role, layer: usize, cols: usize| match spec.format {
        RandomFormat::All(f) => f,
        RandomFormat::Mix(target) => {
            let at = Placement::in_model(c, c.tie_word_embeddings, role, layer, cols);
            matrix_format(target, at)
        }
    };
    let mut layers = Vec::with_capacity(c.n_layers);
    for i in 0..c.n_layers {
        let s = 16 * (i as u64 + 1);
        layers.push(LayerWeights {
            attn_norm: vec![1.0; h].into(),
            wq: matrix(s, q, h, format(Role::Other, i, h))?,
            wk: matrix(s + 1, kv, h, format(Role::Other, i, h))?,
            wv: matrix(s + 2, kv, h, format(Role::AttentionV, i, h))?,
            wo: matrix(s + 3, h, q, format(Role::Other, i, q))?,
            bq: None,
            bk: None,
            bv: None,
            ffn_norm: vec![1.0; h].into(),
            w_gate: matrix(s + 4, ff, h, format(Role::Other, i, h))?,
            w_up: matrix(s + 5, ff, h, format(Role::Other, i, h))?,
            w_down: matrix(s + 6, h, ff, format(Role::FeedForwardDown, i, ff))?,
        });
        progress(i + 1);
    }
    let weights = Weights {
        embed: matrix(1, c.vocab_size, h, format(Role::TokenEmbedding, 0, h))?,
        layers: layers.into(),
        norm: vec![1.0; h].into(),
        lm_head: if c.tie_word_embeddings {
            None
        } else {
            Some(matrix(2, c.vocab_size, h, format(Role::Output, 0, h))?)
        },
        rope_freq_factors: None,
    };
    super::chosen_kernels(Model::new(c.clone(), weights)?)
}

/// A `rows × cols` matrix in `format` of values uniform in ±0.05 from `seed`.
fn matrix(seed: u64, rows: usize, cols: usize, format: Format) -> Result<Matrix<'static>> {
    // Rows in parallel, each from its own stream (so the values do not depend on threads) and
    // quantized as it is made: an 8B shape took 46 s on 16 cores quantizing whole matrices.
    let row_bytes = format.row_bytes(cols)?;
    let mut bytes = vec![0u8; rows * row_bytes];
    bytes
        .par_chunks_mut(row_bytes.max(1))
        .enumerate()
        .try_for_each_init(
            || vec![0f32; cols],
            |values, (r, out)| {
                let mut rng = Rng::new(seed.wrapping_mul(1 << 32).wrapping_add(r as u64));
                values
                    .iter_mut()
                    .for_each(|v| *v = (rng.next_f32() * 2.0 - 1.0) * 0.05);
                quant::quantize_row(format, values, out)
            },
        )?;
    Ok(Matrix::new(format, rows, cols, bytes.into())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_build_the_same_weights_each_time() {
        let spec = parse("random:smollm2-135m:q4_1").unwrap().unwrap();
        assert_eq!(spec.format, RandomFormat::All(Format::Q4_1));
        assert_eq!((spec.config.hidden_size, spec.config.n_layers), (576, 30));
        assert_eq!(
            parse("random:tinyllama-1.1b").unwrap().unwrap().format,
            RandomFormat::All(Format::Q8_0)
        );
        assert!(parse("models/x.gguf").unwrap().is_none());
        let err = parse("random:llama-9000").unwrap_err().to_string();
        assert!(
            err.contains("unknown shape") && err.contains("smollm2-135m"),
            "{err}"
        );
        assert_eq!(
            parse("random:llama-3.1-8b:q4_k_m").unwrap().unwrap().format,
            RandomFormat::Mix(Target::Q4KM)
        );
        assert!(parse("random:smollm2-135m:q3_k").is_err());

        let a = model(&spec, &|_| {}).unwrap();
        let b = model(&spec, &|_| {}).unwrap();
        assert_eq!(
            a.weights.layers[29].w_down.bytes(),
            b.weights.layers[29].w_down.bytes()
        );
        assert_eq!(a.weights.embed.format, Format::Q4_1);
        assert!(a.weights.lm_head.is_none(), "SmolLM2 ties its embeddings");
    }
}
