//! GGUF metadata (`llama.*`, `qwen2.*`) -> `Config`.
use anyhow::{anyhow, bail, Result};
use sapient_core::{Config, RopeStyle};

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
        rope_scaling: None,
        tie_word_embeddings: !g.tensors.contains_key("output.weight"),
        qkv_bias: g.tensors.contains_key("blk.0.attn_q.bias"),
        // Not llama.cpp's (it ignores Mistral's window); sapient's writer keeps it here.
        sliding_window: g.u64(&key("attention.sliding_window")).map(|v| v as usize),
        max_position_embeddings: g.u64(&key("context_length")).map_or(2048, |v| v as usize),
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
