//! Finding, mapping and reading model files.
//!
//! `ModelFiles::open` maps the files and parses the config; `ModelFiles::model` builds a
//! `Model` whose matrices borrow the mapped bytes where their format is used as stored, and own a
//! converted copy otherwise (online quantization to Q8_0, or f16/bf16 widened to f32).
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use memmap2::Mmap;
use rayon::prelude::*;
use sapient_core::weights::{LayerWeights, Matrix, Weights};
use sapient_core::{Format, Model};

pub mod hf_config;
mod safetensors_file;

use hf_config::HfConfig;
use safetensors_file::{Dtype, SafetensorsFile};

/// What to do with F32/F16/BF16 matrices at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Quantize {
    /// Keep them as f32 (f16/bf16 are widened; f32 is used in place).
    None,
    /// Quantize them to Q8_0 (matrices whose rows are not a whole number of blocks stay f32).
    #[default]
    Q8_0,
}

#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    pub quantize: Quantize,
    /// Read the config from this file instead of `config.json` beside the weights.
    pub config_file: Option<PathBuf>,
}

/// A checkpoint's mapped files and parsed config.
pub struct ModelFiles {
    pub path: PathBuf,
    pub hf: HfConfig,
    files: Vec<SafetensorsFile>,
    /// Tensor name -> index in `files`.
    index: HashMap<String, usize>,
}

/// Memory-maps `path` read-only.
pub(crate) fn map_file(path: &Path) -> Result<Mmap> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: the map is read-only and lives as long as the `ModelFiles` that owns it. As with
    // every mmap-based loader, a file truncated or rewritten by another process while mapped is
    // outside what we can guard against.
    unsafe { Mmap::map(&file) }.with_context(|| format!("cannot map {}", path.display()))
}

impl ModelFiles {
    /// Opens a Hugging Face checkpoint: a directory holding `config.json` and `model.safetensors`
    /// (or shards listed in `model.safetensors.index.json`), or one `.safetensors` file with a
    /// `config.json` beside it.
    pub fn open(path: &Path, opts: &LoadOptions) -> Result<Self> {
        let (dir, shards) = if path.is_dir() {
            let index = path.join("model.safetensors.index.json");
            let single = path.join("model.safetensors");
            if single.is_file() {
                (path.to_path_buf(), vec![single])
            } else if index.is_file() {
                (path.to_path_buf(), shard_files(path, &index)?)
            } else {
                bail!(
                    "{} holds neither model.safetensors nor model.safetensors.index.json",
                    path.display()
                );
            }
        } else if path.extension().is_some_and(|e| e == "safetensors") && path.is_file() {
            let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
            (dir, vec![path.to_path_buf()])
        } else {
            bail!(
                "model not found: {} is not a directory or a .safetensors file",
                path.display()
            );
        };
        let config_path = opts
            .config_file
            .clone()
            .unwrap_or_else(|| dir.join("config.json"));
        let text = std::fs::read_to_string(&config_path)
            .with_context(|| format!("cannot read {}", config_path.display()))?;
        let hf =
            hf_config::parse(&text).with_context(|| format!("in {}", config_path.display()))?;

        let mut files = Vec::new();
        let mut index = HashMap::new();
        for (i, shard) in shards.iter().enumerate() {
            let file = SafetensorsFile::open(shard)?;
            for name in file.names() {
                index.insert(name, i);
            }
            files.push(file);
        }
        Ok(ModelFiles {
            path: path.to_path_buf(),
            hf,
            files,
            index,
        })
    }

    fn tensor(&self, name: &str) -> Result<(Dtype, &[usize], &[u8])> {
        let i = *self
            .index
            .get(name)
            .ok_or_else(|| anyhow!("tensor {name} is missing from the checkpoint"))?;
        self.files[i].tensor(name)
    }

    fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// A 2-D weight as a `Matrix`, converted as `quantize` says.
    fn matrix(&self, name: &str, quantize: Quantize) -> Result<Matrix<'_>> {
        let (dtype, shape, bytes) = self.tensor(name)?;
        let &[rows, cols] = shape else {
            bail!("tensor {name} has shape {shape:?}, expected a matrix");
        };
        let matrix = if quantize == Quantize::Q8_0 && cols % 32 == 0 {
            let values = dtype.to_f32(bytes);
            let row_bytes = Format::Q8_0.row_bytes(cols)?;
            let mut q = vec![0u8; rows * row_bytes];
            q.par_chunks_mut(row_bytes)
                .zip(values.par_chunks(cols))
                .try_for_each(|(out, x)| sapient_core::quant::quantize_row(Format::Q8_0, x, out))?;
            Matrix::new(Format::Q8_0, rows, cols, Cow::Owned(q))
        } else if dtype == Dtype::F32 {
            Matrix::new(Format::F32, rows, cols, Cow::Borrowed(bytes))
        } else {
            let values = dtype.to_f32(bytes);
            Matrix::new(Format::F32, rows, cols, Cow::Owned(f32_bytes(&values)))
        };
        matrix.with_context(|| format!("tensor {name}"))
    }

    /// A 1-D weight (a norm or a bias) as f32.
    fn vector(&self, name: &str) -> Result<Vec<f32>> {
        let (dtype, shape, bytes) = self.tensor(name)?;
        if shape.len() != 1 {
            bail!("tensor {name} has shape {shape:?}, expected a vector");
        }
        Ok(dtype.to_f32(bytes))
    }

    /// Builds the model; its matrices borrow from these files where they can.
    pub fn model(&self, quantize: Quantize) -> Result<Model<'_>> {
        let c = &self.hf.config;
        let p = self.hf.prefix;
        let mut layers = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let l = |s: &str| format!("{p}layers.{i}.{s}");
            let bias = |s: &str| -> Result<Option<Vec<f32>>> {
                if c.qkv_bias {
                    self.vector(&l(s)).map(Some)
                } else {
                    Ok(None)
                }
            };
            layers.push(LayerWeights {
                attn_norm: self.vector(&l("input_layernorm.weight"))?,
                wq: self.matrix(&l("self_attn.q_proj.weight"), quantize)?,
                wk: self.matrix(&l("self_attn.k_proj.weight"), quantize)?,
                wv: self.matrix(&l("self_attn.v_proj.weight"), quantize)?,
                wo: self.matrix(&l("self_attn.o_proj.weight"), quantize)?,
                bq: bias("self_attn.q_proj.bias")?,
                bk: bias("self_attn.k_proj.bias")?,
                bv: bias("self_attn.v_proj.bias")?,
                ffn_norm: self.vector(&l("post_attention_layernorm.weight"))?,
                w_gate: self.matrix(&l("mlp.gate_proj.weight"), quantize)?,
                w_up: self.matrix(&l("mlp.up_proj.weight"), quantize)?,
                w_down: self.matrix(&l("mlp.down_proj.weight"), quantize)?,
            });
        }
        let lm_head = if !c.tie_word_embeddings && self.has("lm_head.weight") {
            Some(self.matrix("lm_head.weight", quantize)?)
        } else {
            None
        };
        let weights = Weights {
            embed: self.matrix(&format!("{p}embed_tokens.weight"), quantize)?,
            layers,
            norm: self.vector(&format!("{p}norm.weight"))?,
            lm_head,
        };
        Ok(Model::new(c.clone(), weights)?)
    }
}

fn shard_files(dir: &Path, index: &Path) -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(index)
        .with_context(|| format!("cannot read {}", index.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", index.display()))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| anyhow!("{} has no weight_map", index.display()))?;
    let mut names: Vec<&str> = map.values().filter_map(|f| f.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|n| {
            let p = Path::new(n);
            if p.components().count() != 1 {
                bail!(
                    "shard name {n:?} in {} is not a plain file name",
                    index.display()
                );
            }
            Ok(dir.join(p))
        })
        .collect()
}

/// f32 values as little-endian bytes.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// One line about a model: what it is, how big, in which formats, how much memory.
pub fn summary(model: &Model<'_>, arch: &str) -> String {
    let w = &model.weights;
    let mut mats: Vec<&Matrix<'_>> = vec![&w.embed];
    mats.extend(w.lm_head.iter());
    for l in &w.layers {
        mats.extend([&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]);
    }
    let mut by_format: Vec<(Format, usize)> = Vec::new();
    let (mut params, mut bytes, mut mapped) = (0usize, 0usize, 0usize);
    for m in &mats {
        params += m.rows * m.cols;
        if m.is_borrowed() {
            mapped += m.bytes().len();
        } else {
            bytes += m.bytes().len();
        }
        match by_format.iter_mut().find(|(f, _)| *f == m.format) {
            Some((_, n)) => *n += 1,
            None => by_format.push((m.format, 1)),
        }
    }
    let c = &model.config;
    let formats: Vec<String> = by_format.iter().map(|(f, n)| format!("{n} {f}")).collect();
    format!(
        "{arch}: {} layers, hidden {}, {} heads ({} kv), vocab {}, {:.1}M parameters; matrices: {}; {:.1} MiB owned, {:.1} MiB mapped",
        c.n_layers,
        c.hidden_size,
        c.n_heads,
        c.n_kv_heads,
        c.vocab_size,
        params as f64 / 1e6,
        formats.join(", "),
        bytes as f64 / (1 << 20) as f64,
        mapped as f64 / (1 << 20) as f64,
    )
}
