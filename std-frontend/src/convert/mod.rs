//! `sapient quantize`: any model sapient loads, written as a GGUF v3 file llama.cpp loads, with
//! its tensors in the formats llama.cpp would choose.
//!
//! Names, layout and metadata follow llama.cpp's converter (`convert_hf_to_gguf.py`): `llama`
//! tensors get their Q/K rows permuted so that RoPE rotates adjacent pairs, `qwen2` ones keep
//! Hugging Face's halves, Llama 3 scaling becomes `rope_freqs.weight`, and the tokenizer becomes
//! `tokenizer.ggml.*`. Formats follow `convert_hf_to_gguf.py --outtype` for `f16` and `q8_0`
//! (every matrix) and `llama-quantize` for the others (the output matrix in Q6_K, Q4_K_M's
//! Q6_K layers, and its fallbacks where rows are no whole number of blocks).
use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Result};
use rayon::prelude::*;
use sapient_core::weights::Matrix;
use sapient_core::{Config, Format, Llama3Scaling, Model, RopeScaling, RopeStyle};

use crate::load::gguf::{GgmlType, Value};
use crate::load::ModelFiles;

mod pre_hashes;
mod protobuf;
pub mod vocab;
pub mod writer;

use writer::TensorEntry;

/// What `--type` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    F16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q4K,
    Q6K,
    /// llama.cpp's Q4_K_M mixture.
    Q4KM,
    /// llama.cpp's Q5_K_M mixture (Q4_K_M's, on Q5_K).
    Q5KM,
    /// llama.cpp's IQ4_NL mixture (IQ4_NL with some Q5_K and Q6_K).
    IQ4NL,
    /// llama.cpp's IQ4_XS mixture (IQ4_XS with some Q5_K and Q6_K).
    IQ4XS,
}

impl Target {
    /// llama.cpp's `general.file_type` (`LLAMA_FTYPE_MOSTLY_*`); all-Q4_K has none of its own
    /// and is closest to Q4_K_S.
    fn file_type(self) -> u32 {
        match self {
            Target::F16 => 1,
            Target::Q4_0 => 2,
            Target::Q4_1 => 3,
            Target::Q8_0 => 7,
            Target::Q4K => 14,
            Target::Q4KM => 15,
            Target::Q5KM => 17,
            Target::Q6K => 18,
            Target::IQ4NL => 25,
            Target::IQ4XS => 30,
        }
    }

    /// The format most matrices get.
    fn base(self) -> Format {
        match self {
            Target::F16 => Format::F16,
            Target::Q8_0 => Format::Q8_0,
            Target::Q4_0 => Format::Q4_0,
            Target::Q4_1 => Format::Q4_1,
            Target::Q4K | Target::Q4KM => Format::Q4K,
            Target::Q5KM => Format::Q5K,
            Target::Q6K => Format::Q6K,
            Target::IQ4NL => Format::IQ4NL,
            Target::IQ4XS => Format::IQ4XS,
        }
    }
}

/// What a matrix does, as far as choosing its format goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    TokenEmbedding,
    Output,
    AttentionV,
    FeedForwardDown,
    Other,
}

/// Values per block of `format`.
fn block_len(format: Format) -> usize {
    GgmlType::of(format).block().0
}

/// Where a matrix sits in its model, as far as choosing its format goes.
#[derive(Debug, Clone, Copy)]
pub struct Placement {
    pub role: Role,
    /// Its layer (0 for the embedding and output matrices).
    pub layer: usize,
    pub n_layers: usize,
    /// Values per row.
    pub cols: usize,
    /// The token embedding is also the output matrix.
    pub tied: bool,
    /// Query heads per key-value head.
    pub gqa: usize,
}

impl Placement {
    /// A matrix of `cols` values per row with `role` in layer `layer` of a model configured as
    /// `c`, its token embedding also its output matrix where `tied`.
    pub fn in_model(c: &Config, tied: bool, role: Role, layer: usize, cols: usize) -> Self {
        Placement {
            role,
            layer,
            n_layers: c.n_layers,
            cols,
            tied,
            gqa: c.n_heads / c.n_kv_heads.max(1),
        }
    }
}

/// The format of a matrix placed at `at`: llama.cpp's `llama_tensor_get_type` (without an
/// importance matrix) for the targets `llama-quantize` makes, one format for all for the others.
pub fn matrix_format(target: Target, at: Placement) -> Format {
    let Placement {
        role,
        layer,
        n_layers,
        cols,
        tied,
        gqa,
    } = at;
    let fits = |f: Format| cols.is_multiple_of(block_len(f));
    let chosen = match target {
        Target::F16 => return Format::F16,
        Target::Q8_0 => {
            return if fits(Format::Q8_0) {
                Format::Q8_0
            } else {
                Format::F16
            }
        }
        _ => {
            let base = target.base();
            // llama.cpp's `use_more_bits`: the first and last eighth, every third between.
            let more_bits =
                |i: usize, n: usize| i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
            match role {
                Role::Output => output_format(base, fits(base)),
                Role::TokenEmbedding if tied => output_format(base, fits(base)),
                Role::AttentionV | Role::FeedForwardDown
                    if matches!(target, Target::Q4KM | Target::Q5KM)
                        && more_bits(layer, n_layers) =>
                {
                    Format::Q6K
                }
                Role::AttentionV if matches!(target, Target::IQ4NL | Target::IQ4XS) && gqa >= 4 => {
                    Format::Q5K
                }
                Role::FeedForwardDown
                    if matches!(target, Target::IQ4NL | Target::IQ4XS) && layer < n_layers / 8 =>
                {
                    Format::Q5K
                }
                _ => base,
            }
        }
    };
    if fits(chosen) {
        return chosen;
    }
    // llama.cpp's fallbacks for rows that are no whole number of super-blocks.
    let fallback = match chosen {
        Format::Q3K => Format::Q4_0,
        Format::Q4K => Format::Q5_0,
        Format::Q5K => Format::Q5_1,
        Format::Q6K => Format::Q8_0,
        Format::IQ4XS => Format::IQ4NL,
        other => other,
    };
    if fits(fallback) {
        fallback
    } else {
        Format::F16
    }
}

/// llama.cpp's output matrix: Q6_K, or Q8_0 where the target's blocks do not fit its rows.
fn output_format(base: Format, fits: bool) -> Format {
    if !fits {
        Format::Q8_0
    } else if base != Format::Q8_0 {
        Format::Q6K
    } else {
        base
    }
}

/// Where a tensor's values come from.
enum Source<'m> {
    /// A matrix; `heads` set when its rows are permuted from halves to adjacent pairs, a head
    /// of `head_dim` rows at a time.
    Matrix(&'m Matrix<'m>, Option<usize>),
    /// A vector (a norm, a bias, RoPE frequency factors), written as f32; `heads` as above.
    Vector(&'m [f32], Option<usize>),
    /// Values made here (Llama 3 frequency factors).
    Owned(Vec<f32>),
}

struct Planned<'m> {
    entry: TensorEntry,
    source: Source<'m>,
}

/// What was written.
pub struct Report {
    /// Tensors per type name.
    pub types: BTreeMap<&'static str, usize>,
    pub bytes: u64,
    pub tensors: usize,
}

/// Writes `model` (loaded from `files` with `Quantize::AsStored`) to `out` in
/// `target`'s formats. `progress(done, total)` is called after each tensor; warnings go to
/// `warn`.
pub fn write_model(
    files: &ModelFiles,
    model: &Model<'_>,
    out: &Path,
    target: Target,
    progress: &dyn Fn(usize, usize),
    warn: &mut dyn FnMut(String),
) -> Result<Report> {
    let c = &model.config;
    let arch = match files.arch.as_str() {
        "qwen2" => "qwen2",
        "llama" | "mistral" | "idefics3" => "llama",
        other => bail!("cannot write a GGUF for architecture {other}"),
    };
    // `llama` GGUF tensors rotate adjacent pairs; a Hugging Face checkpoint's rotate halves.
    let permute = (arch == "llama" && c.rope_style == RopeStyle::Halves).then_some(c.head_dim);
    let plan = plan_tensors(model, target, permute)?;
    let metadata = metadata(files, model, arch, target, warn)?;
    let entries: Vec<TensorEntry> = plan
        .iter()
        .map(|p| TensorEntry {
            name: p.entry.name.clone(),
            dims: p.entry.dims.clone(),
            ty: p.entry.ty,
        })
        .collect();
    let total = plan.len();
    writer::write_gguf(out, &metadata, &entries, |i, buf| {
        fill(&plan[i], buf)?;
        progress(i + 1, total);
        Ok(())
    })?;
    let mut types = BTreeMap::new();
    for e in &entries {
        *types.entry(e.ty.name()).or_default() += 1;
    }
    Ok(Report {
        types,
        bytes: std::fs::metadata(out)?.len(),
        tensors: entries.len(),
    })
}

/// Every tensor of `model` with its llama.cpp name, shape and format.
fn plan_tensors<'m>(
    model: &'m Model<'_>,
    target: Target,
    permute: Option<usize>,
) -> Result<Vec<Planned<'m>>> {
    let c = &model.config;
    let w = &model.weights;
    let tied = w.lm_head.is_none();
    let mut plan = Vec::new();
    let mut matrix = |name: String, m: &'m Matrix<'m>, role: Role, layer: usize, heads: bool| {
        let format = matrix_format(target, Placement::in_model(c, tied, role, layer, m.cols));
        plan.push(Planned {
            entry: TensorEntry {
                name,
                dims: vec![m.cols, m.rows],
                ty: GgmlType::of(format),
            },
            source: Source::Matrix(m, permute.filter(|_| heads)),
        });
    };
    matrix(
        "token_embd.weight".into(),
        &w.embed,
        Role::TokenEmbedding,
        0,
        false,
    );
    for (i, l) in w.layers.iter().enumerate() {
        let name = |s: &str| format!("blk.{i}.{s}");
        matrix(name("attn_q.weight"), &l.wq, Role::Other, i, true);
        matrix(name("attn_k.weight"), &l.wk, Role::Other, i, true);
        matrix(name("attn_v.weight"), &l.wv, Role::AttentionV, i, false);
        matrix(name("attn_output.weight"), &l.wo, Role::Other, i, false);
        matrix(name("ffn_gate.weight"), &l.w_gate, Role::Other, i, false);
        matrix(name("ffn_up.weight"), &l.w_up, Role::Other, i, false);
        matrix(
            name("ffn_down.weight"),
            &l.w_down,
            Role::FeedForwardDown,
            i,
            false,
        );
    }
    if let Some(out) = &w.lm_head {
        matrix("output.weight".into(), out, Role::Output, 0, false);
    }
    let mut vector = |name: String, v: &'m [f32], heads: bool| {
        plan.push(Planned {
            entry: TensorEntry {
                name,
                dims: vec![v.len()],
                ty: GgmlType::F32,
            },
            source: Source::Vector(v, permute.filter(|_| heads)),
        });
    };
    for (i, l) in w.layers.iter().enumerate() {
        let name = |s: &str| format!("blk.{i}.{s}");
        vector(name("attn_norm.weight"), &l.attn_norm, false);
        vector(name("ffn_norm.weight"), &l.ffn_norm, false);
        for (s, b, heads) in [("q", &l.bq, true), ("k", &l.bk, true), ("v", &l.bv, false)] {
            if let Some(b) = b {
                vector(name(&format!("attn_{s}.bias")), b, heads);
            }
        }
    }
    vector("output_norm.weight".into(), &w.norm, false);
    let factors = match (&w.rope_freq_factors, c.rope_scaling) {
        (Some(f), _) => Some(Source::Vector(f, None)),
        (None, Some(RopeScaling::Llama3(s))) => {
            Some(Source::Owned(llama3_factors(c.rope_theta, c.head_dim, s)))
        }
        // Linear and YaRN scaling travel as `rope.scaling.*` keys (`metadata`).
        (None, _) => None,
    };
    if let Some(source) = factors {
        let len = c.head_dim / 2;
        plan.push(Planned {
            entry: TensorEntry {
                name: "rope_freqs.weight".into(),
                dims: vec![len],
                ty: GgmlType::F32,
            },
            source,
        });
    }
    Ok(plan)
}

/// Row `r` of a permuted tensor comes from this row of the original: within each head of
/// `head_dim` rows, row `2i + j` of the adjacent-pair layout is row `j · head_dim / 2 + i` of
/// the halves layout (llama.cpp's converter's `permute`).
fn source_row(r: usize, head_dim: Option<usize>) -> usize {
    match head_dim {
        None => r,
        Some(hd) => {
            let (head, k) = (r / hd, r % hd);
            head * hd + (k % 2) * (hd / 2) + k / 2
        }
    }
}

/// Writes a planned tensor's bytes to `buf`.
fn fill(p: &Planned<'_>, buf: &mut Vec<u8>) -> Result<()> {
    let format = p.entry.ty.format();
    match &p.source {
        // Same format, same row order: the bytes as they are, with nothing lost.
        Source::Matrix(m, None) if m.format == format => buf.extend_from_slice(m.bytes()),
        Source::Matrix(m, heads) => {
            let row_bytes = format.row_bytes(m.cols)?;
            buf.resize(m.rows * row_bytes, 0);
            buf.par_chunks_mut(row_bytes)
                .enumerate()
                .try_for_each_init(
                    || vec![0f32; m.cols],
                    |values, (r, out)| -> Result<()> {
                        m.dequantize_row(source_row(r, *heads), values)?;
                        sapient_core::quant::quantize_row(format, values, out)?;
                        Ok(())
                    },
                )?;
        }
        Source::Vector(v, heads) => {
            for r in 0..v.len() {
                buf.extend_from_slice(&v[source_row(r, *heads)].to_le_bytes());
            }
        }
        Source::Owned(v) => {
            for x in v {
                buf.extend_from_slice(&x.to_le_bytes());
            }
        }
    }
    Ok(())
}

/// llama.cpp's converter's `rope_freqs.weight` for Llama 3 scaling (`LlamaModel
/// .generate_extra_tensors`): the frequencies in f32, the factors in Python's f64 arithmetic.
pub fn llama3_factors(theta: f32, head_dim: usize, s: Llama3Scaling) -> Vec<f32> {
    let old = s.original_max_position_embeddings as f64;
    let (low, high, factor) = (
        s.low_freq_factor as f64,
        s.high_freq_factor as f64,
        s.factor as f64,
    );
    let (low_wavelen, high_wavelen) = (old / low, old / high);
    (0..head_dim / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / head_dim as f32;
            let freq = (1.0 / theta.powf(exponent)) as f64;
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            f as f32
        })
        .collect()
}

/// The file's metadata: a GGUF source's own (its tokenizer, template and hyper-parameters),
/// or, for a Hugging Face checkpoint, what llama.cpp's converter writes.
fn metadata(
    files: &ModelFiles,
    model: &Model<'_>,
    arch: &str,
    target: Target,
    warn: &mut dyn FnMut(String),
) -> Result<Vec<(String, Value)>> {
    let rewritten = [
        "general.file_type",
        "general.quantization_version",
        "general.alignment",
    ];
    let mut meta: Vec<(String, Value)> = match files.gguf() {
        Some(g) => {
            let mut keys: Vec<&String> = g
                .metadata
                .keys()
                .filter(|k| !rewritten.contains(&k.as_str()))
                .collect();
            keys.sort();
            keys.into_iter()
                .map(|k| (k.clone(), g.metadata[k].clone()))
                .collect()
        }
        None => hf_metadata(files, model, arch, warn)?,
    };
    // general.architecture first, as every writer puts it.
    meta.sort_by_key(|(k, _)| k != "general.architecture");
    meta.push(("general.file_type".into(), Value::U32(target.file_type())));
    meta.push(("general.quantization_version".into(), Value::U32(2)));
    Ok(meta)
}

fn hf_metadata(
    files: &ModelFiles,
    model: &Model<'_>,
    arch: &str,
    warn: &mut dyn FnMut(String),
) -> Result<Vec<(String, Value)>> {
    let c = &model.config;
    let name = files
        .dir()
        .file_name()
        .map_or("model".into(), |n| n.to_string_lossy().into_owned());
    let u32_of = |v: usize| Value::U32(v as u32);
    let mut meta = vec![
        (
            "general.architecture".to_owned(),
            Value::String(arch.into()),
        ),
        ("general.name".to_owned(), Value::String(name)),
    ];
    let mut key = |k: &str, v: Value| meta.push((format!("{arch}.{k}"), v));
    key("vocab_size", u32_of(c.vocab_size));
    key("context_length", u32_of(c.max_position_embeddings));
    key("embedding_length", u32_of(c.hidden_size));
    key("block_count", u32_of(c.n_layers));
    key("feed_forward_length", u32_of(c.intermediate_size));
    key("attention.head_count", u32_of(c.n_heads));
    key("attention.head_count_kv", u32_of(c.n_kv_heads));
    key(
        "attention.layer_norm_rms_epsilon",
        Value::F32(c.rms_norm_eps),
    );
    key("rope.freq_base", Value::F32(c.rope_theta));
    key("rope.dimension_count", u32_of(c.head_dim));
    match c.rope_scaling {
        None | Some(RopeScaling::Llama3(_)) => {}
        Some(RopeScaling::Linear { factor }) => {
            key("rope.scaling.type", Value::String("linear".into()));
            key("rope.scaling.factor", Value::F32(factor));
        }
        Some(RopeScaling::Yarn(s)) => {
            if !s.truncate {
                bail!("YaRN scaling with truncate = false has no GGUF form (llama.cpp always rounds the ramp's ends)");
            }
            key("rope.scaling.type", Value::String("yarn".into()));
            key("rope.scaling.factor", Value::F32(s.factor));
            key(
                "rope.scaling.original_context_length",
                u32_of(s.original_max_position_embeddings),
            );
            key("rope.scaling.yarn_beta_fast", Value::F32(s.beta_fast));
            key("rope.scaling.yarn_beta_slow", Value::F32(s.beta_slow));
            key(
                "rope.scaling.yarn_attn_factor",
                Value::F32(s.attention_factor),
            );
        }
    }
    if c.head_dim * c.n_heads != c.hidden_size {
        key("attention.key_length", u32_of(c.head_dim));
        key("attention.value_length", u32_of(c.head_dim));
    }
    if let Some(w) = c.sliding_window {
        key("attention.sliding_window", u32_of(w));
    }
    let dir = files.dir();
    if dir.join("tokenizer.json").is_file() || dir.join("tokenizer.model").is_file() {
        let eos = files.eos_token_ids.first().copied();
        meta.extend(vocab::hf_tokenizer_metadata(
            files.dir(),
            c.vocab_size,
            files.bos_token_id,
            eos,
            warn,
        )?);
    } else {
        warn(format!(
            "{} has neither tokenizer.json nor tokenizer.model: the GGUF gets no vocabulary (sapient runs it with --prompt-ids; llama.cpp needs one)",
            files.dir().display()
        ));
    }
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M's Q4_K_M as llama-quantize makes it: 166 Q5_0, 16 Q4_K, 14 Q6_K, 15 Q8_0.
    #[test]
    fn q4_k_m_matches_llama_quantize_on_smollm2_shapes() {
        let n = 30;
        let at = |role: Role, layer: usize, cols: usize| Placement {
            role,
            layer,
            n_layers: n,
            cols,
            tied: true,
            gqa: 3,
        };
        let mut counts = BTreeMap::new();
        let mut count = |f: Format| *counts.entry(f.to_string()).or_insert(0) += 1;
        count(matrix_format(
            Target::Q4KM,
            at(Role::TokenEmbedding, 0, 576),
        ));
        for i in 0..n {
            for (role, cols) in [
                (Role::Other, 576),
                (Role::Other, 576),
                (Role::AttentionV, 576),
                (Role::Other, 576),
                (Role::Other, 576),
                (Role::Other, 576),
                (Role::FeedForwardDown, 1536),
            ] {
                count(matrix_format(Target::Q4KM, at(role, i, cols)));
            }
        }
        let want: BTreeMap<String, i32> = [("q5_0", 166), ("q4_K", 16), ("q6_K", 14), ("q8_0", 15)]
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        assert_eq!(counts, want);
    }

    #[test]
    fn permutation_interleaves_the_halves_of_each_head() {
        let rows: Vec<usize> = (0..8).map(|r| source_row(r, Some(4))).collect();
        assert_eq!(rows, [0, 2, 1, 3, 4, 6, 5, 7]);
    }
}
