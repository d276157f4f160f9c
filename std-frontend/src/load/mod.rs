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
use sapient_core::kernels::Kernels;
use sapient_core::weights::{LayerWeights, Matrix, Weights};
use sapient_core::{Format, Model};

pub mod gguf;
pub mod gguf_config;
pub mod hf_config;
pub mod random;
pub mod resolve;
mod safetensors_file;

use gguf::{GgmlType, Gguf};
use safetensors_file::{Dtype, SafetensorsFile};
use sapient_core::Config;

/// What to do with F32/F16/BF16 matrices at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Quantize {
    /// Keep them as f32 (f16/bf16 are widened; f32 is used in place).
    None,
    /// Quantize them to Q8_0 (matrices whose rows are not a whole number of blocks stay f32);
    /// quantized matrices stay as the file has them.
    #[default]
    Auto,
    /// Every matrix to Q8_0, quantized ones too (re-quantized from their values, as
    /// `llama-quantize --allow-requantize` does): more memory than a 4- or 6-bit file, but the
    /// fastest kernels where the k-quants' are slower. Rows that are not whole blocks stay as
    /// stored.
    Q8_0,
    /// Convert every matrix to f32, quantized ones too: slow, but computes with exactly the
    /// weights the file holds, for checking against a float reference.
    F32,
    /// Every matrix as the file stores it, safetensors F16/BF16 too, read in place from the map:
    /// what writing the model elsewhere needs, without holding a widened copy in memory.
    AsStored,
}

#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    pub quantize: Quantize,
    /// Read the config from this file instead of `config.json` beside the weights.
    pub config_file: Option<PathBuf>,
}

/// A model's mapped files and parsed configuration.
pub struct ModelFiles {
    pub path: PathBuf,
    /// The architecture as the files name it (`llama`, `mistral`, `qwen2`, `idefics3`).
    pub arch: String,
    pub config: Config,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    source: Source,
}

enum Source {
    Safetensors {
        /// Where the decoder's tensors live: `model.` or `model.text_model.`.
        prefix: &'static str,
        files: Vec<SafetensorsFile>,
        /// Tensor name -> index in `files`.
        index: HashMap<String, usize>,
    },
    Gguf {
        map: Mmap,
        gguf: Gguf,
    },
}

/// Memory-maps `path` read-only.
pub(crate) fn map_file(path: &Path) -> Result<Mmap> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: the map is read-only and lives as long as the `ModelFiles` that owns it. As with
    // every mmap-based loader, a file truncated or rewritten by another process while mapped is
    // outside what we can guard against.
    unsafe { Mmap::map(&file) }.with_context(|| format!("cannot map {}", path.display()))
}

/// A tensor's bytes and how to read them.
struct Tensor<'a> {
    kind: Kind,
    /// Row-major shape, PyTorch order (`[rows, cols]` for a matrix).
    shape: Vec<usize>,
    bytes: &'a [u8],
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Float(Dtype),
    Block(Format),
}

impl Tensor<'_> {
    fn to_f32(&self, name: &str) -> Result<Vec<f32>> {
        let n: usize = self.shape.iter().product();
        Ok(match self.kind {
            Kind::Float(d) => d.to_f32(self.bytes),
            Kind::Block(f) => {
                let mut out = vec![0f32; n];
                sapient_core::quant::dequantize_row(f, self.bytes, &mut out)
                    .with_context(|| format!("tensor {name}"))?;
                out
            }
        })
    }
}

impl ModelFiles {
    /// Opens a model: a Hugging Face checkpoint directory (`config.json` and `model.safetensors`
    /// or shards listed in `model.safetensors.index.json`), one `.safetensors` file with a
    /// `config.json` beside it, or a `.gguf` file.
    pub fn open(path: &Path, opts: &LoadOptions) -> Result<Self> {
        if path.is_file() && path.extension().is_some_and(|e| e == "gguf") {
            return Self::open_gguf(path);
        }
        let (dir, shards) = if path.is_dir() {
            let index = path.join("model.safetensors.index.json");
            let single = path.join("model.safetensors");
            if single.is_file() {
                (path.to_path_buf(), vec![single])
            } else if index.is_file() {
                (path.to_path_buf(), shard_files(path, &index)?)
            } else if let Some(gguf) = only_gguf(path)? {
                return Self::open_gguf(&gguf);
            } else {
                bail!(
                    "{} holds neither model.safetensors, model.safetensors.index.json nor a single .gguf file",
                    path.display()
                );
            }
        } else if path.extension().is_some_and(|e| e == "safetensors") && path.is_file() {
            let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
            (dir, vec![path.to_path_buf()])
        } else {
            bail!(
                "model not found: {} is not a directory, a .gguf or a .safetensors file",
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
        let mut eos = hf.eos_token_ids.clone();
        if let Ok(text) = std::fs::read_to_string(dir.join("generation_config.json")) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                for id in hf_config::token_ids(v.get("eos_token_id")) {
                    if !eos.contains(&id) {
                        eos.push(id);
                    }
                }
            }
        }
        Ok(ModelFiles {
            path: path.to_path_buf(),
            arch: hf.arch.name().to_owned(),
            config: hf.config,
            bos_token_id: hf.bos_token_id,
            eos_token_ids: eos,
            source: Source::Safetensors {
                prefix: hf.prefix,
                files,
                index,
            },
        })
    }

    fn open_gguf(path: &Path) -> Result<Self> {
        let map = map_file(path)?;
        let gguf = Gguf::parse(&map).with_context(|| format!("in {}", path.display()))?;
        let meta = gguf_config::parse(&gguf).with_context(|| format!("in {}", path.display()))?;
        Ok(ModelFiles {
            path: path.to_path_buf(),
            arch: meta.arch,
            config: meta.config,
            bos_token_id: meta.bos_token_id,
            eos_token_ids: meta.eos_token_ids,
            source: Source::Gguf { map, gguf },
        })
    }

    /// The parsed GGUF header, for a model loaded from a `.gguf` file.
    pub fn gguf(&self) -> Option<&Gguf> {
        match &self.source {
            Source::Gguf { gguf, .. } => Some(gguf),
            Source::Safetensors { .. } => None,
        }
    }

    /// The directory holding the model's side files (tokenizer.json, tokenizer_config.json).
    pub fn dir(&self) -> &Path {
        if self.path.is_dir() {
            &self.path
        } else {
            self.path.parent().unwrap_or(Path::new("."))
        }
    }

    /// A tensor of the files, refused if its values (or, quantized, its scales) are not all
    /// finite: a NaN there would spread silently through attention's softmax.
    fn tensor(&self, name: &str) -> Result<Tensor<'_>> {
        let t = self.stored_tensor(name)?;
        let format = match t.kind {
            Kind::Float(Dtype::F32) => Format::F32,
            Kind::Float(Dtype::F16) => Format::F16,
            Kind::Float(Dtype::BF16) => Format::BF16,
            Kind::Block(f) => f,
        };
        if let Some(i) = format.first_non_finite(t.bytes) {
            let what = match format.is_quantized() {
                true => "the scale of block",
                false => "value",
            };
            bail!("tensor {name}: {what} {i} is not finite (NaN or infinity)");
        }
        Ok(t)
    }

    fn stored_tensor(&self, name: &str) -> Result<Tensor<'_>> {
        match &self.source {
            Source::Safetensors { files, index, .. } => {
                let i = *index
                    .get(name)
                    .ok_or_else(|| anyhow!("tensor {name} is missing from the checkpoint"))?;
                let (dtype, shape, bytes) = files[i].tensor(name)?;
                Ok(Tensor {
                    kind: Kind::Float(dtype),
                    shape: shape.to_vec(),
                    bytes,
                })
            }
            Source::Gguf { map, gguf } => {
                let t = gguf
                    .tensors
                    .get(name)
                    .ok_or_else(|| anyhow!("tensor {name} is missing from the GGUF file"))?;
                let kind = match t.ggml_type {
                    GgmlType::F32 => Kind::Float(Dtype::F32),
                    GgmlType::F16 => Kind::Float(Dtype::F16),
                    GgmlType::BF16 => Kind::Float(Dtype::BF16),
                    quantized => Kind::Block(quantized.format()),
                };
                // GGUF lists dimensions innermost first; reversed, they are PyTorch's.
                let shape = t.dims.iter().rev().copied().collect();
                Ok(Tensor {
                    kind,
                    shape,
                    bytes: &map[t.start..t.start + t.len],
                })
            }
        }
    }

    fn has(&self, name: &str) -> bool {
        match &self.source {
            Source::Safetensors { index, .. } => index.contains_key(name),
            Source::Gguf { gguf, .. } => gguf.tensors.contains_key(name),
        }
    }

    /// A 2-D weight as a `Matrix`: used in place when the core reads its format, otherwise
    /// converted as `quantize` says.
    fn matrix(&self, name: &str, quantize: Quantize) -> Result<Matrix<'_>> {
        let t = self.tensor(name)?;
        let &[rows, cols] = t.shape.as_slice() else {
            bail!("tensor {name} has shape {:?}, expected a matrix", t.shape);
        };
        let in_place = match t.kind {
            Kind::Block(f) => Some(f),
            Kind::Float(Dtype::F32) => Some(Format::F32),
            Kind::Float(Dtype::F16) if self.gguf().is_some() || quantize == Quantize::AsStored => {
                Some(Format::F16)
            }
            Kind::Float(Dtype::BF16) if self.gguf().is_some() || quantize == Quantize::AsStored => {
                Some(Format::BF16)
            }
            _ => None,
        };
        let matrix = match in_place {
            _ if quantize == Quantize::F32 => Matrix::new(
                Format::F32,
                rows,
                cols,
                Cow::Owned(f32_bytes(&t.to_f32(name)?)),
            ),
            Some(f) if quantize == Quantize::Q8_0 && f != Format::Q8_0 && cols % 32 == 0 => {
                q8_0_matrix(&t.to_f32(name)?, rows, cols)
            }
            Some(f)
                if f.is_quantized()
                    || quantize == Quantize::None
                    || quantize == Quantize::AsStored
                    || cols % 32 != 0
                    || self.gguf().is_some() =>
            {
                Matrix::new(f, rows, cols, Cow::Borrowed(t.bytes))
            }
            _ if matches!(quantize, Quantize::Auto | Quantize::Q8_0) && cols % 32 == 0 => {
                q8_0_matrix(&t.to_f32(name)?, rows, cols)
            }
            _ => Matrix::new(
                Format::F32,
                rows,
                cols,
                Cow::Owned(f32_bytes(&t.to_f32(name)?)),
            ),
        };
        matrix.with_context(|| format!("tensor {name}"))
    }

    /// A 1-D weight (a norm or a bias) as f32 values of its own (they are small; the file may
    /// hold f16).
    fn vector(&self, name: &str) -> Result<Cow<'static, [f32]>> {
        let t = self.tensor(name)?;
        if t.shape.len() != 1 {
            bail!("tensor {name} has shape {:?}, expected a vector", t.shape);
        }
        Ok(t.to_f32(name)?.into())
    }

    /// Builds the model; its matrices borrow from these files where they can.
    pub fn model(&self, quantize: Quantize) -> Result<Model<'_>> {
        self.model_with_progress(quantize, &|_| {})
    }

    /// `model`, calling `progress(layers_done)` as layers are built.
    pub fn model_with_progress(
        &self,
        quantize: Quantize,
        progress: &dyn Fn(usize),
    ) -> Result<Model<'_>> {
        let c = &self.config;
        let names = TensorNames::for_source(&self.source);
        let mut layers = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let n = |s: &str| names.layer(i, s);
            let bias = |s: &str| -> Result<Option<Cow<'static, [f32]>>> {
                if c.qkv_bias {
                    self.vector(&n(s)).map(Some)
                } else {
                    Ok(None)
                }
            };
            layers.push(LayerWeights {
                attn_norm: self.vector(&n("attn_norm"))?,
                wq: self.matrix(&n("wq"), quantize)?,
                wk: self.matrix(&n("wk"), quantize)?,
                wv: self.matrix(&n("wv"), quantize)?,
                wo: self.matrix(&n("wo"), quantize)?,
                bq: bias("bq")?,
                bk: bias("bk")?,
                bv: bias("bv")?,
                ffn_norm: self.vector(&n("ffn_norm"))?,
                w_gate: self.matrix(&n("w_gate"), quantize)?,
                w_up: self.matrix(&n("w_up"), quantize)?,
                w_down: self.matrix(&n("w_down"), quantize)?,
            });
            progress(i + 1);
        }
        let lm_head = if !c.tie_word_embeddings && self.has(&names.output) {
            Some(self.matrix(&names.output, quantize)?)
        } else {
            None
        };
        let weights = Weights {
            embed: self.matrix(&names.embed, quantize)?,
            layers: layers.into(),
            norm: self.vector(&names.norm)?,
            lm_head,
            rope_freq_factors: match names.gguf && self.has(ROPE_FREQS) {
                true => Some(self.vector(ROPE_FREQS)?),
                false => None,
            },
        };
        chosen_kernels(Model::new(c.clone(), weights)?)
    }
}

/// The environment variable that names the CPU kernels to run instead of the fastest this CPU
/// has (a table's name as the load summary prints it: `scalar`, `avx2`, `avx2+vnni`, ...), to
/// compare instruction sets on one machine.
pub const CPU_KERNELS_VAR: &str = "SAPIENT_CPU_KERNELS";

/// `model` on the kernels `CPU_KERNELS_VAR` names, where it is set.
///
/// # Errors
/// A name this build has no table of, or whose instructions this CPU lacks.
pub fn chosen_kernels(model: Model<'_>) -> Result<Model<'_>> {
    let Some(name) = std::env::var_os(CPU_KERNELS_VAR) else {
        return Ok(model);
    };
    let name = name.to_string_lossy();
    match Kernels::runnable(&name) {
        Some(kernels) => Ok(model.with_kernels(kernels)),
        None => {
            let names: Vec<_> = Kernels::runnable_tables().map(|k| k.name).collect();
            bail!(
                "{CPU_KERNELS_VAR}={name}: no such CPU kernels on this machine (it runs {})",
                names.join(", ")
            )
        }
    }
}

/// Llama 3.1+ GGUF files' RoPE frequency factors (llama.cpp's converter writes them from the
/// checkpoint's `rope_scaling`).
const ROPE_FREQS: &str = "rope_freqs.weight";

/// Where each weight lives under the two naming schemes.
struct TensorNames {
    gguf: bool,
    prefix: &'static str,
    embed: String,
    norm: String,
    output: String,
}

impl TensorNames {
    fn for_source(source: &Source) -> Self {
        match source {
            Source::Gguf { .. } => TensorNames {
                gguf: true,
                prefix: "",
                embed: "token_embd.weight".into(),
                norm: "output_norm.weight".into(),
                output: "output.weight".into(),
            },
            Source::Safetensors { prefix, .. } => TensorNames {
                gguf: false,
                prefix,
                embed: format!("{prefix}embed_tokens.weight"),
                norm: format!("{prefix}norm.weight"),
                output: "lm_head.weight".into(),
            },
        }
    }

    fn layer(&self, i: usize, what: &str) -> String {
        let (gguf, hf) = match what {
            "attn_norm" => ("attn_norm.weight", "input_layernorm.weight"),
            "wq" => ("attn_q.weight", "self_attn.q_proj.weight"),
            "wk" => ("attn_k.weight", "self_attn.k_proj.weight"),
            "wv" => ("attn_v.weight", "self_attn.v_proj.weight"),
            "wo" => ("attn_output.weight", "self_attn.o_proj.weight"),
            "bq" => ("attn_q.bias", "self_attn.q_proj.bias"),
            "bk" => ("attn_k.bias", "self_attn.k_proj.bias"),
            "bv" => ("attn_v.bias", "self_attn.v_proj.bias"),
            "ffn_norm" => ("ffn_norm.weight", "post_attention_layernorm.weight"),
            "w_gate" => ("ffn_gate.weight", "mlp.gate_proj.weight"),
            "w_up" => ("ffn_up.weight", "mlp.up_proj.weight"),
            "w_down" => ("ffn_down.weight", "mlp.down_proj.weight"),
            other => unreachable!("no tensor called {other}"),
        };
        if self.gguf {
            format!("blk.{i}.{gguf}")
        } else {
            format!("{}layers.{i}.{hf}", self.prefix)
        }
    }
}

/// The one `.gguf` file in `dir`, if there is exactly one.
pub(crate) fn only_gguf(dir: &Path) -> Result<Option<PathBuf>> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let p = e?.path();
        if p.extension().is_some_and(|e| e == "gguf") {
            found.push(p);
        }
    }
    Ok(if found.len() == 1 { found.pop() } else { None })
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

/// A row-major f32 matrix quantized to Q8_0, rows in parallel.
fn q8_0_matrix(values: &[f32], rows: usize, cols: usize) -> sapient_core::Result<Matrix<'static>> {
    let row_bytes = Format::Q8_0.row_bytes(cols)?;
    let mut q = vec![0u8; rows * row_bytes];
    q.par_chunks_mut(row_bytes)
        .zip(values.par_chunks(cols))
        .try_for_each(|(out, x)| sapient_core::quant::quantize_row(Format::Q8_0, x, out))?;
    Matrix::new(Format::Q8_0, rows, cols, Cow::Owned(q))
}

/// f32 values as little-endian bytes.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// One line about a model: what it is, how big, in which formats, how much memory.
/// Weight bytes one decoded token reads: every layer's matrices, the output projection and one
/// embedding row (norms and biases are too small to count). The KV cache read grows with the
/// context on top of this.
pub fn weight_bytes_per_token(model: &Model<'_>) -> usize {
    let w = &model.weights;
    let layers: usize = w
        .layers
        .iter()
        .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down])
        .map(|m| m.bytes().len())
        .sum();
    layers + w.output().bytes().len() + w.embed.bytes().len() / w.embed.rows.max(1)
}

pub fn summary(model: &Model<'_>, arch: &str) -> String {
    let w = &model.weights;
    let mut mats: Vec<&Matrix<'_>> = vec![&w.embed];
    mats.extend(w.lm_head.iter());
    for l in w.layers.iter() {
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
