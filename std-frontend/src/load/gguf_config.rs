//! GGUF metadata (`llama.*`, `qwen2.*`) -> `Config`.
use anyhow::{anyhow, bail, Result};
use sapient_core::{Config, RopeScaling, RopeStyle, YarnScaling};

use super::gguf::{Gguf, Value};

pub struct GgufMeta {
    pub arch: String,
    pub config: Config,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

/// End-of-generation tokens llama.cpp recognizes by their text, beyond the file's EOS id.
const END_OF_GENERATION: [&str; 6] = [
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end|>",
    "</s>",
    "<end_of_turn>",
];

pub fn parse(g: &Gguf) -> Result<GgufMeta> {
    let arch = g
        .str("general.architecture")
        .ok_or_else(|| anyhow!("GGUF file has no general.architecture"))?
        .to_owned();
    // llama.cpp's converter permuted the Q/K rows of `llama` tensors so that RoPE rotates
    // adjacent pairs; `qwen2` tensors were written as Hugging Face has them.
    let rope_style = match arch.as_str() {
        "llama" => RopeStyle::Adjacent,
        "qwen2" => RopeStyle::Halves,
        other => return Err(sapient_core::Error::unknown_architecture(other).into()),
    };
    let key = |k: &str| format!("{arch}.{k}");
    let req = |k: &str| -> Result<usize> {
        g.u64(&key(k))
            .map(|v| v as usize)
            .ok_or_else(|| anyhow!("GGUF key {} is missing or not an integer", key(k)))
    };
    let hidden = req("embedding_length")?;
    let n_heads = req("attention.head_count")?;
    let n_kv_heads = g
        .u64(&key("attention.head_count_kv"))
        .map_or(n_heads, |v| v as usize);
    if n_heads == 0 {
        bail!(
            "invalid config: {} must be greater than zero",
            key("attention.head_count")
        );
    }
    let head_dim = match g.u64(&key("attention.key_length")) {
        Some(d) => d as usize,
        None if hidden % n_heads != 0 => bail!(
            "invalid config: {} {hidden} is not a multiple of {} {n_heads} (and no {} is given)",
            key("embedding_length"),
            key("attention.head_count"),
            key("attention.key_length")
        ),
        None => hidden / n_heads,
    };
    let vocab = match g.u64(&key("vocab_size")) {
        Some(v) => v as usize,
        None => match g.get("tokenizer.ggml.tokens") {
            Some(Value::Array(t)) => t.len(),
            _ => g
                .tensors
                .get("token_embd.weight")
                .and_then(|t| t.dims.get(1).copied())
                .ok_or_else(|| anyhow!("GGUF file gives no vocabulary size"))?,
        },
    };
    let max_position_embeddings = g.u64(&key("context_length")).map_or(2048, |v| v as usize);
    let config = Config {
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: req("feed_forward_length")?,
        n_layers: req("block_count")?,
        n_heads,
        n_kv_heads,
        head_dim,
        rms_norm_eps: g
            .f64(&key("attention.layer_norm_rms_epsilon"))
            .unwrap_or(1e-5) as f32,
        rope_theta: g.f64(&key("rope.freq_base")).unwrap_or(10000.0) as f32,
        rope_style,
        rope_scaling: rope_scaling(g, &key, max_position_embeddings)?,
        tie_word_embeddings: !g.tensors.contains_key("output.weight"),
        qkv_bias: g.tensors.contains_key("blk.0.attn_q.bias"),
        // Not llama.cpp's (it ignores Mistral's window); sapient's writer keeps it here.
        sliding_window: g.u64(&key("attention.sliding_window")).map(|v| v as usize),
        max_position_embeddings,
    };
    config.validate()?;

    let mut eos: Vec<u32> = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"]
        .iter()
        .filter_map(|k| g.u64(k))
        .map(|v| v as u32)
        .collect();
    if let Some(Value::Array(tokens)) = g.get("tokenizer.ggml.tokens") {
        for (i, t) in tokens.iter().enumerate() {
            if t.as_str().is_some_and(|t| END_OF_GENERATION.contains(&t))
                && !eos.contains(&(i as u32))
            {
                eos.push(i as u32);
            }
        }
    }
    Ok(GgufMeta {
        arch,
        config,
        bos_token_id: g.u64("tokenizer.ggml.bos_token_id").map(|v| v as u32),
        eos_token_ids: eos,
    })
}

/// RoPE scaling from `{arch}.rope.scaling.*` as llama.cpp reads it: the type is linear unless
/// given, a factor of 0 or 1 (or none) scales nothing, YaRN's original context is the model's
/// unless given. Llama 3 scaling comes as frequency factors (`rope_freqs.weight`), not here.
///
/// For YaRN, where the file carries what the checkpoint's `rope_scaling` said (the converter
/// writes `yarn_beta_fast`, `yarn_beta_slow` and `yarn_attn_factor` only when it said so), that
/// is used, as transformers uses it; otherwise YaRN's defaults, which is what llama.cpp uses.
fn rope_scaling(
    g: &Gguf,
    key: &dyn Fn(&str) -> String,
    context_length: usize,
) -> Result<Option<RopeScaling>> {
    let kind = g.str(&key("rope.scaling.type")).unwrap_or("linear");
    let factor = g
        .f64(&key("rope.scaling.factor"))
        .or_else(|| g.f64(&key("rope.scale_linear")))
        .unwrap_or(0.0);
    let attn_factor = g.f64(&key("rope.scaling.attn_factor")).unwrap_or(1.0);
    if kind != "yarn" && attn_factor != 1.0 {
        bail!(
            "{} = {attn_factor} with RoPE scaling {kind:?}: sapient scales RoPE's rotation only for YaRN",
            key("rope.scaling.attn_factor")
        );
    }
    let scaled = factor != 0.0 && factor != 1.0;
    match kind {
        "none" => Ok(None),
        "linear" | "yarn" if !scaled => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear {
            factor: factor as f32,
        })),
        "yarn" => {
            let log_mul = g
                .f64(&key("rope.scaling.yarn_log_multiplier"))
                .filter(|m| *m != 0.0);
            let attention_factor = match (g.f64(&key("rope.scaling.yarn_attn_factor")), log_mul) {
                (Some(a), _) => a,
                (None, Some(m)) => YarnScaling::mscale(factor, 1.0) / YarnScaling::mscale(factor, m),
                (None, None) => YarnScaling::mscale(factor, 1.0),
            };
            let original = g
                .u64(&key("rope.scaling.original_context_length"))
                .map_or(context_length, |v| v as usize);
            Ok(Some(RopeScaling::Yarn(YarnScaling {
                factor: factor as f32,
                original_max_position_embeddings: original,
                beta_fast: g.f64(&key("rope.scaling.yarn_beta_fast")).unwrap_or(32.0) as f32,
                beta_slow: g.f64(&key("rope.scaling.yarn_beta_slow")).unwrap_or(1.0) as f32,
                truncate: true,
                attention_factor: (attention_factor * attn_factor) as f32,
            })))
        }
        other => bail!(
            "unsupported RoPE scaling {} = {other:?}: sapient implements none, linear and yarn (and Llama 3's, as rope_freqs.weight)",
            key("rope.scaling.type")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::writer::write_gguf;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The config of a header-only `llama` GGUF with `extra` keys (written as llama.cpp names
    /// them, under `llama.`).
    fn config_with(extra: &[(&str, Value)]) -> Result<Config> {
        let mut meta = vec![(
            "general.architecture".to_owned(),
            Value::String("llama".into()),
        )];
        let dims = [
            ("vocab_size", 32),
            ("context_length", 4096),
            ("embedding_length", 64),
            ("block_count", 1),
            ("feed_forward_length", 128),
            ("attention.head_count", 4),
        ];
        for (k, v) in dims {
            meta.push((format!("llama.{k}"), Value::U32(v)));
        }
        for (k, v) in extra {
            meta.push((format!("llama.{k}"), v.clone()));
        }
        static FILES: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!("sapient-gguf-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{}.gguf", FILES.fetch_add(1, Ordering::Relaxed)));
        write_gguf(&path, &meta, &[], |_, _| Ok(()))?;
        let bytes = std::fs::read(&path)?;
        std::fs::remove_file(&path)?;
        Ok(parse(&Gguf::parse(&bytes)?)?.config)
    }

    fn scaling(extra: &[(&str, Value)]) -> Option<RopeScaling> {
        config_with(extra).unwrap().rope_scaling
    }

    #[test]
    fn rope_scaling_is_read_as_llama_cpp_reads_it() {
        let s = |v: &str| Value::String(v.into());
        assert_eq!(scaling(&[]), None);
        // The type defaults to linear; a factor of 1 (or none) scales nothing.
        assert_eq!(
            scaling(&[("rope.scaling.factor", Value::F32(4.0))]),
            Some(RopeScaling::Linear { factor: 4.0 })
        );
        assert_eq!(
            scaling(&[("rope.scale_linear", Value::F32(2.0))]),
            Some(RopeScaling::Linear { factor: 2.0 })
        );
        assert_eq!(scaling(&[("rope.scaling.type", s("linear"))]), None);
        assert_eq!(
            scaling(&[
                ("rope.scaling.type", s("none")),
                ("rope.scaling.factor", Value::F32(4.0))
            ]),
            None
        );
        // YaRN with llama.cpp's defaults: the model's context, betas 32 and 1, 0.1·ln(4) + 1.
        let Some(RopeScaling::Yarn(y)) = scaling(&[
            ("rope.scaling.type", s("yarn")),
            ("rope.scaling.factor", Value::F32(4.0)),
        ]) else {
            panic!("no YaRN");
        };
        assert_eq!(y.original_max_position_embeddings, 4096);
        assert_eq!((y.beta_fast, y.beta_slow, y.truncate), (32.0, 1.0, true));
        assert_eq!(y.attention_factor, (0.1 * 4f64.ln() + 1.0) as f32);
        // What the converter writes from a checkpoint's rope_scaling wins over the defaults.
        let Some(RopeScaling::Yarn(y)) = scaling(&[
            ("rope.scaling.type", s("yarn")),
            ("rope.scaling.factor", Value::F32(4.0)),
            ("rope.scaling.original_context_length", Value::U32(32768)),
            ("rope.scaling.yarn_beta_fast", Value::F32(16.0)),
            ("rope.scaling.yarn_beta_slow", Value::F32(2.0)),
            ("rope.scaling.yarn_attn_factor", Value::F32(0.5)),
        ]) else {
            panic!("no YaRN");
        };
        assert_eq!(y.original_max_position_embeddings, 32768);
        assert_eq!(
            (y.beta_fast, y.beta_slow, y.attention_factor),
            (16.0, 2.0, 0.5)
        );
        // DeepSeek's log multiplier: llama.cpp's ratio of two mscales (its mscale taken as 1).
        let Some(RopeScaling::Yarn(y)) = scaling(&[
            ("rope.scaling.type", s("yarn")),
            ("rope.scaling.factor", Value::F32(40.0)),
            ("rope.scaling.yarn_log_multiplier", Value::F32(0.707)),
        ]) else {
            panic!("no YaRN");
        };
        let m = |m: f64| 0.1 * m * 40f64.ln() + 1.0;
        assert_eq!(y.attention_factor, (m(1.0) / m(0.707f32 as f64)) as f32);
    }

    #[test]
    fn rope_scaling_sapient_cannot_follow_is_an_error() {
        let s = |v: &str| Value::String(v.into());
        let err = config_with(&[
            ("rope.scaling.type", s("longrope")),
            ("rope.scaling.factor", Value::F32(4.0)),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("llama.rope.scaling.type"), "{err}");
        assert!(err.to_string().contains("longrope"), "{err}");
        let err = config_with(&[("rope.scaling.attn_factor", Value::F32(1.5))]).unwrap_err();
        assert!(err.to_string().contains("attn_factor"), "{err}");
        let err = config_with(&[("rope.scaling.factor", Value::F32(f32::NAN))]).unwrap_err();
        assert!(err.to_string().contains("rope_scaling"), "{err}");
    }
}
