//! `config.json` of a Hugging Face checkpoint -> `Config`, in both the transformers v4 layout
//! (`rope_theta`, `rope_scaling`, `torch_dtype`) and the v5 layout (`rope_parameters`, `dtype`).
use anyhow::{anyhow, bail, Context, Result};
use sapient_core::{Config, Llama3Scaling, RopeScaling, RopeStyle, YarnScaling};
use serde_json::Value;

/// The architectures sapient runs, as named by `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Mistral,
    Qwen2,
    /// Idefics3 (SmolVLM): a Llama text backbone under `model.text_model.`.
    Idefics3,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
            Arch::Idefics3 => "idefics3",
        }
    }
}

/// A parsed checkpoint config: the architecture, the numbers, and the tensor-name prefix.
#[derive(Debug, Clone)]
pub struct HfConfig {
    pub arch: Arch,
    pub config: Config,
    /// Where the decoder's tensors live: `model.` or `model.text_model.`.
    pub prefix: &'static str,
    pub dtype: Option<String>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

pub fn parse(text: &str) -> Result<HfConfig> {
    let root: Value = serde_json::from_str(text).context("config.json is not valid JSON")?;
    let model_type = root
        .get("model_type")
        .and_then(Value::as_str)
        .or_else(|| {
            root.get("architectures")
                .and_then(|a| a.get(0))
                .and_then(Value::as_str)
        })
        .ok_or_else(|| anyhow!("config.json names no model_type or architectures"))?;
    let arch = match model_type {
        "llama" | "LlamaForCausalLM" => Arch::Llama,
        "mistral" | "MistralForCausalLM" => Arch::Mistral,
        "qwen2" | "Qwen2ForCausalLM" => Arch::Qwen2,
        "idefics3" | "Idefics3ForConditionalGeneration" => Arch::Idefics3,
        other => return Err(sapient_core::Error::unknown_architecture(other).into()),
    };
    let (c, prefix) = match arch {
        Arch::Idefics3 => (
            root.get("text_config")
                .ok_or_else(|| anyhow!("idefics3 config.json has no text_config"))?,
            "model.text_model.",
        ),
        _ => (&root, "model."),
    };
    if arch == Arch::Idefics3 {
        let text_type = c
            .get("model_type")
            .and_then(Value::as_str)
            .unwrap_or("llama");
        if text_type != "llama" {
            return Err(sapient_core::Error::unknown_architecture(text_type).into());
        }
    }

    let hidden = usize_field(c, "hidden_size")?;
    let n_heads = usize_field(c, "num_attention_heads")?;
    let n_kv_heads = opt_usize(c, "num_key_value_heads")?.unwrap_or(n_heads);
    if n_heads == 0 {
        bail!("invalid config: num_attention_heads must be greater than zero");
    }
    let head_dim = match opt_usize(c, "head_dim")? {
        Some(d) => d,
        None if hidden % n_heads != 0 => bail!(
            "invalid config: hidden_size {hidden} is not a multiple of num_attention_heads {n_heads} (and no head_dim is given)"
        ),
        None => hidden / n_heads,
    };

    // v5 keeps RoPE settings in `rope_parameters`; v4 in `rope_theta` + `rope_scaling`.
    let rope = c
        .get("rope_parameters")
        .filter(|v| v.is_object())
        .or_else(|| c.get("rope_scaling").filter(|v| v.is_object()));
    let rope_theta = rope
        .and_then(|r| r.get("rope_theta"))
        .or_else(|| c.get("rope_theta"))
        .map(|v| {
            v.as_f64()
                .ok_or_else(|| anyhow!("invalid config: rope_theta is not a number"))
        })
        .transpose()?
        .unwrap_or(10000.0) as f32;
    let rope_type = rope
        .and_then(|r| r.get("rope_type").or_else(|| r.get("type")))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let max_position_embeddings = opt_usize(c, "max_position_embeddings")?.unwrap_or(2048);
    let rope_scaling = match (rope_type, rope) {
        ("default", _) | (_, None) => None,
        ("linear", Some(r)) => Some(RopeScaling::Linear {
            factor: f32_field(r, "factor")?,
        }),
        ("llama3", Some(r)) => Some(RopeScaling::Llama3(Llama3Scaling {
            factor: f32_field(r, "factor")?,
            low_freq_factor: f32_field(r, "low_freq_factor")?,
            high_freq_factor: f32_field(r, "high_freq_factor")?,
            original_max_position_embeddings: usize_field(r, "original_max_position_embeddings")?,
        })),
        ("yarn", Some(r)) => Some(RopeScaling::Yarn(yarn(c, r, max_position_embeddings)?)),
        (other, _) => bail!(
            "unsupported rope_type {other:?}: sapient implements \"default\", \"linear\", \"llama3\" and \"yarn\""
        ),
    };

    let sliding_window = match arch {
        Arch::Mistral => opt_usize(c, "sliding_window")?,
        Arch::Qwen2 if c.get("use_sliding_window").and_then(Value::as_bool) == Some(true) => {
            bail!("qwen2 with use_sliding_window = true is not supported")
        }
        _ => None,
    };
    let qkv_bias = match arch {
        Arch::Qwen2 => true,
        _ => c
            .get("attention_bias")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    };
    if c.get("mlp_bias").and_then(Value::as_bool) == Some(true) {
        bail!("mlp_bias = true is not supported");
    }
    if let Some(act) = c.get("hidden_act").and_then(Value::as_str) {
        if act != "silu" {
            bail!("hidden_act {act:?} is not supported: sapient implements silu");
        }
    }
    let tie = c
        .get("tie_word_embeddings")
        .or_else(|| root.get("tie_word_embeddings"))
        .and_then(Value::as_bool)
        .unwrap_or(false);

    let config = Config {
        vocab_size: usize_field(c, "vocab_size")?,
        hidden_size: hidden,
        intermediate_size: usize_field(c, "intermediate_size")?,
        n_layers: usize_field(c, "num_hidden_layers")?,
        n_heads,
        n_kv_heads,
        head_dim,
        rms_norm_eps: c
            .get("rms_norm_eps")
            .and_then(Value::as_f64)
            .unwrap_or(1e-6) as f32,
        rope_theta,
        rope_style: RopeStyle::Halves,
        rope_scaling,
        tie_word_embeddings: tie,
        qkv_bias,
        sliding_window,
        max_position_embeddings,
    };
    config.validate()?;
    let dtype = c
        .get("dtype")
        .or_else(|| c.get("torch_dtype"))
        .or_else(|| root.get("dtype"))
        .or_else(|| root.get("torch_dtype"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    Ok(HfConfig {
        arch,
        config,
        prefix,
        dtype,
        bos_token_id: token_ids(c.get("bos_token_id")).first().copied(),
        eos_token_ids: token_ids(c.get("eos_token_id")),
    })
}

/// An id or a list of ids (generation configs use both).
pub fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|n| n as u32).into_iter().collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_u64)
            .map(|n| n as u32)
            .collect(),
        _ => Vec::new(),
    }
}

fn opt_usize(c: &Value, key: &str) -> Result<Option<usize>> {
    match c.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(n as usize))
            .ok_or_else(|| anyhow!("invalid config: {key} is not a non-negative integer")),
    }
}

fn usize_field(c: &Value, key: &str) -> Result<usize> {
    opt_usize(c, key)?.ok_or_else(|| anyhow!("invalid config: {key} is missing"))
}

/// YaRN's numbers as transformers' `_compute_yarn_parameters` reads them from the text config `c`
/// and its RoPE settings `r`: the original context from `c` (Phi-3 keeps it there), then `r`,
/// then `max_position_embeddings`; no factor means their ratio; betas that are missing or zero
/// mean 32 and 1; no attention factor means YaRN's `mscale`, or the ratio of two when `mscale`
/// and `mscale_all_dim` are both given.
fn yarn(c: &Value, r: &Value, max_position_embeddings: usize) -> Result<YarnScaling> {
    let original = match opt_usize(c, "original_max_position_embeddings")? {
        Some(n) => n,
        None => {
            opt_usize(r, "original_max_position_embeddings")?.unwrap_or(max_position_embeddings)
        }
    };
    if original == 0 {
        bail!("invalid config: rope scaling field original_max_position_embeddings must be greater than zero");
    }
    let number = |key: &str| -> Result<Option<f64>> {
        match r.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| anyhow!("invalid config: rope scaling field {key} is not a number")),
        }
    };
    let factor = number("factor")?.unwrap_or(max_position_embeddings as f64 / original as f64);
    let nonzero = |v: Option<f64>| v.filter(|v| *v != 0.0);
    let attention_factor = match (
        number("attention_factor")?,
        nonzero(number("mscale")?),
        nonzero(number("mscale_all_dim")?),
    ) {
        (Some(a), _, _) => a,
        (None, Some(m), Some(all)) => {
            YarnScaling::mscale(factor, m) / YarnScaling::mscale(factor, all)
        }
        (None, _, _) => YarnScaling::mscale(factor, 1.0),
    };
    let truncate = match r.get("truncate") {
        None | Some(Value::Null) => true,
        Some(v) => v.as_bool().ok_or_else(|| {
            anyhow!("invalid config: rope scaling field truncate is not a boolean")
        })?,
    };
    Ok(YarnScaling {
        factor: factor as f32,
        original_max_position_embeddings: original,
        beta_fast: nonzero(number("beta_fast")?).unwrap_or(32.0) as f32,
        beta_slow: nonzero(number("beta_slow")?).unwrap_or(1.0) as f32,
        truncate,
        attention_factor: attention_factor as f32,
    })
}

fn f32_field(c: &Value, key: &str) -> Result<f32> {
    c.get(key)
        .and_then(Value::as_f64)
        .map(|v| v as f32)
        .ok_or_else(|| {
            anyhow!("invalid config: rope scaling field {key} is missing or not a number")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_architecture_is_named() {
        let err = parse(r#"{"model_type": "gpt_neox", "hidden_size": 8}"#).unwrap_err();
        assert!(err.to_string().contains("gpt_neox"), "{err}");
    }

    #[test]
    fn zero_heads_is_an_error() {
        let err = parse(r#"{"model_type": "llama", "hidden_size": 8, "num_attention_heads": 0}"#)
            .unwrap_err();
        assert!(err.to_string().contains("num_attention_heads"), "{err}");
    }

    fn scaling(rope: &str) -> Result<Option<RopeScaling>> {
        let base = r#""model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 32, "max_position_embeddings": 32768"#;
        Ok(parse(&format!(
            r#"{{{base}, "rope_theta": 1000000.0, "rope_scaling": {rope}}}"#
        ))?
        .config
        .rope_scaling)
    }

    #[test]
    fn linear_and_yarn_scaling_are_read_as_transformers_reads_them() {
        assert_eq!(
            scaling(r#"{"type": "linear", "factor": 2.0}"#).unwrap(),
            Some(RopeScaling::Linear { factor: 2.0 })
        );
        // Qwen2.5's model card: the original context defaults to max_position_embeddings, the
        // betas to 32 and 1, the attention factor to 0.1·ln(factor) + 1.
        let Some(RopeScaling::Yarn(y)) = scaling(
            r#"{"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}"#,
        )
        .unwrap() else {
            panic!("no YaRN");
        };
        assert_eq!(y.factor, 4.0);
        assert_eq!(y.original_max_position_embeddings, 32768);
        assert_eq!((y.beta_fast, y.beta_slow, y.truncate), (32.0, 1.0, true));
        assert_eq!(y.attention_factor, (0.1 * 4f64.ln() + 1.0) as f32);
        let Some(RopeScaling::Yarn(y)) = scaling(
            r#"{"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 0.707, "beta_fast": 0, "truncate": false}"#,
        )
        .unwrap() else {
            panic!("no YaRN");
        };
        let m = |m: f64| 0.1 * m * 40f64.ln() + 1.0;
        assert_eq!(y.attention_factor, (m(1.0) / m(0.707)) as f32);
        assert_eq!((y.beta_fast, y.truncate), (32.0, false));
        let Some(RopeScaling::Yarn(y)) =
            scaling(r#"{"rope_type": "yarn", "factor": 4.0, "attention_factor": 0.9}"#).unwrap()
        else {
            panic!("no YaRN");
        };
        assert_eq!(y.attention_factor, 0.9);
    }

    #[test]
    fn rope_scaling_sapient_cannot_follow_is_an_error() {
        let err = scaling(r#"{"rope_type": "dynamic", "factor": 2.0}"#).unwrap_err();
        assert!(err.to_string().contains("dynamic"), "{err}");
        let err = scaling(r#"{"rope_type": "linear"}"#).unwrap_err();
        assert!(err.to_string().contains("factor"), "{err}");
        let err = scaling(r#"{"rope_type": "yarn", "factor": -2.0}"#).unwrap_err();
        assert!(err.to_string().contains("rope_scaling"), "{err}");
    }

    #[test]
    fn v4_and_v5_rope_layouts_agree() {
        let base = r#""model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 32"#;
        let v4 = parse(&format!(r#"{{{base}, "rope_theta": 500000.0, "rope_scaling": {{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}}}"#)).unwrap();
        let v5 = parse(&format!(r#"{{{base}, "rope_parameters": {{"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}}}"#)).unwrap();
        assert_eq!(v4.config, v5.config);
        assert_eq!(v4.config.rope_theta, 500000.0);
        assert!(v4.config.rope_scaling.is_some());
    }
}
