//! The compute pipelines: WGSL sources assembled with their constants, and the bind group
//! layouts they share (explicit, so one bind group serves every variant of a kernel).
use std::collections::HashMap;
use std::sync::Mutex;

use anyhow::{anyhow, bail, Result};

use super::weights::GpuFormat;
use super::GpuKv;

const MATMUL: &str = include_str!("shaders/matmul.wgsl");
const FORMATS: &str = include_str!("shaders/formats.wgsl");
const LAYER: &str = include_str!("shaders/layer.wgsl");

/// Running sums of a row's dot product: the l-th adds blocks l, l + LANES, ... in turn, and they
/// are added in a tree, in the same order in every variant (a token gets the same bits alone and
/// in a batch). A mat-vec workgroup has LANES threads, one sum each of all its rows: wide, so
/// that a GPU has many loads in flight (with 16 threads to four rows, an H200 ran SmolLM2's
/// mat-vecs at 35-52 µs and an 8B model's at 3-7% of its memory bandwidth).
const LANES: usize = 64;
/// Rows of a workgroup with f32 inputs. Every variant takes an even number: the SwiGLU epilogue
/// finds each gate row's up row in its own workgroup.
pub const FLOAT_ROWS: usize = 2;
/// Rows and tokens of a workgroup of a batch's Q16 mat-mul (`quantize` made the inputs). Eight
/// threads share each 4 rows × `Q16_THREAD_TOKENS` of it, each keeping eight of the LANES
/// running sums in registers: 256 threads.
pub const Q16_TILE: (usize, usize) = (32, 8);
/// Tokens of each thread of the Q16 tile (with 4 rows: a sum per row and token; on an H200,
/// threads with 4 × 2 sums prefilled fastest of nine shapes, BENCHMARKS.md).
const Q16_THREAD_TOKENS: usize = 2;
/// Threads of the Q16 tile.
const Q16_TILE_THREADS: usize = 8 * (Q16_TILE.0 / 4) * (Q16_TILE.1 / Q16_THREAD_TOKENS);
// The tile's code adds eight sums a thread (LANES 64), for whole groups of 4 rows × NT tokens.
const _: () = assert!(
    LANES == 64
        && Q16_TILE.0.is_multiple_of(4)
        && Q16_TILE.1.is_multiple_of(Q16_THREAD_TOKENS)
        && Q16_TILE_THREADS <= 256
);
/// Rows of a lone token's Q16 mat-vec workgroup, narrow and wide. Each thread quantizes its
/// blocks of inputs (and a normed mat-vec's workgroup its RMSNorm) once for all the rows: with
/// two, an 8B model's gate|up read 235 MB of inputs for 132 MB of weights on an H200. The wide
/// variant serves matrices with rows enough to keep `WIDE_VEC_GROUPS` workgroups busy; a small
/// model's matrices stay narrow, spread over the GPU's cores (BENCHMARKS.md).
pub const Q16_VEC_ROWS: [usize; 2] = [2, 8];
/// Workgroups a part of a matrix must fill for its mat-vec to take the wide variant.
pub const WIDE_VEC_GROUPS: usize = 512;
/// Tokens per mat-mul workgroup with f32 inputs when prefilling (decoding runs one).
pub const PREFILL_TILE: usize = 2;

/// Words of a Q16 block of activations (`Q16_WORDS` in matmul.wgsl).
pub const Q16_WORDS: usize = 19;

/// What surrounds a mat-mul: the RMSNorm prologue, and what the epilogue does with a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fused {
    /// RMSNorm(X)·Wᵀ (+ bias), then RoPE on Q and K, Q stored and K and V put in the layer's KV
    /// cache: Q|K|V, whose rows the upload ordered so that each RoPE pair is two neighbours.
    NormRope,
    /// `y += x·Wᵀ`: the output and down projections into the residual stream.
    Add,
    /// SiLU(gate)·up of RMSNorm(X)·Wᵀ over interleaved gate/up rows.
    NormSwiglu,
    /// `y = x·Wᵀ`: the logits.
    Store,
}

#[cfg(test)]
impl Fused {
    /// Every fusion (the kernel tests compile each).
    pub const ALL: [Fused; 4] = [Fused::NormRope, Fused::Add, Fused::NormSwiglu, Fused::Store];
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    Uniform,
    Read,
    ReadWrite,
}

/// A mat-mul the layer loop runs: its weights' layout, what surrounds it, and the rows of one
/// of its parts (they pick the width of a lone token's Q16 mat-vec).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatMulUse {
    pub format: GpuFormat,
    pub fused: Fused,
    pub rows: usize,
}

/// Whether a part of `rows` rows takes the wide Q16 mat-vec (`Q16_VEC_ROWS[1]`): where it fills
/// `wide_vec_groups` of its workgroups.
fn wide_matvec(rows: usize, wide_vec_groups: usize) -> bool {
    rows.div_ceil(Q16_VEC_ROWS[1]) >= wide_vec_groups
}

/// A mat-mul's pipelines over Q16 inputs.
pub struct Q16Pipelines<'k> {
    pub quantize: &'k wgpu::ComputePipeline,
    pub matmul: &'k wgpu::ComputePipeline,
    /// The narrow and the wide mat-vec (`Q16_VEC_ROWS`), where a part of the model takes it.
    matvec: [Option<&'k wgpu::ComputePipeline>; 2],
    wide_vec_groups: usize,
}

impl<'k> Q16Pipelines<'k> {
    /// The mat-vec for a part of `rows` rows, and the rows a workgroup of it takes.
    pub fn matvec(&self, rows: usize) -> Result<(&'k wgpu::ComputePipeline, usize)> {
        let wide = wide_matvec(rows, self.wide_vec_groups) as usize;
        let pipeline = self.matvec[wide]
            .ok_or_else(|| anyhow!("no mat-vec kernel for parts of {rows} rows was compiled"))?;
        Ok((pipeline, Q16_VEC_ROWS[wide]))
    }
}

pub struct Kernels {
    /// The device's bind group layouts (`Compiled`'s).
    pub layouts: Layouts,
    matmul: HashMap<(GpuFormat, Fused, usize), wgpu::ComputePipeline>,
    /// For integer weights where WGSL has `dot4I8Packed`: mat-muls over Q16 inputs, a tile
    /// that `quantize` made, keyed by its tokens, and (tokens 1) a lone token's mat-vec that
    /// makes them itself, keyed by its rows.
    matmul_q16: HashMap<(GpuFormat, Fused, usize, usize), wgpu::ComputePipeline>,
    /// Activations to Q16 blocks: as they are, and RMSNorm'd.
    quantize: Option<[wgpu::ComputePipeline; 2]>,
    /// The embedding's lookup, for its layout.
    embed: Option<(GpuFormat, wgpu::ComputePipeline)>,
    /// Workgroups of the wide Q16 mat-vec a part must fill to take it.
    wide_vec_groups: usize,
    pub attention: wgpu::ComputePipeline,
    pub attention_reduce: wgpu::ComputePipeline,
    /// A Q8_0 cache's quantizer of the rows Q|K|V's epilogue staged.
    pub kv_store: Option<wgpu::ComputePipeline>,
    pub rms_norm: wgpu::ComputePipeline,
    pub argmax: wgpu::ComputePipeline,
}

/// What a device has compiled: the bind group layouts every kernel's variants share, and the
/// pipelines by layout, source and entry point, so that the models on one device (a draft and
/// its target; the tests' hundred) compile each variant once. Creating the Q16 tile's pipeline
/// took 160 ms on lavapipe with Mesa's shader cache warm.
pub struct Compiled {
    device: wgpu::Device,
    layouts: Layouts,
    pipelines: Mutex<HashMap<(Layout, &'static str, String), wgpu::ComputePipeline>>,
}

/// The bind group layouts of the kernels (explicit, so one bind group serves every variant).
#[derive(Clone)]
pub struct Layouts {
    pub matmul: wgpu::BindGroupLayout,
    pub embed: wgpu::BindGroupLayout,
    pub attention: wgpu::BindGroupLayout,
    pub kv_store: wgpu::BindGroupLayout,
    pub norm: wgpu::BindGroupLayout,
    pub argmax: wgpu::BindGroupLayout,
    pub quantize: wgpu::BindGroupLayout,
    pub matmul_q16: wgpu::BindGroupLayout,
    /// `matmul` and `matmul_q16` with what Q|K|V's epilogue writes (`Fused::NormRope`): RoPE's
    /// angles, the layer's K and V caches, and the places of the batch's rows.
    pub matmul_rope: wgpu::BindGroupLayout,
    pub matmul_q16_rope: wgpu::BindGroupLayout,
}

/// Which of `Layouts` a pipeline takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Layout {
    MatMul,
    Embed,
    Attention,
    KvStore,
    Norm,
    Argmax,
    Quantize,
    MatMulQ16,
    MatMulRope,
    MatMulQ16Rope,
}

impl Layout {
    /// A mat-mul's layout: over f32 inputs or Q16 ones a lone token's mat-vec makes (`MatMul`)
    /// or a tile's `quantize` made (`MatMulQ16`), with the RoPE epilogue's buffers for `fused`.
    fn matmul(fused: Fused, q16_tile: bool) -> Self {
        match (fused == Fused::NormRope, q16_tile) {
            (false, false) => Layout::MatMul,
            (false, true) => Layout::MatMulQ16,
            (true, false) => Layout::MatMulRope,
            (true, true) => Layout::MatMulQ16Rope,
        }
    }
}

impl Compiled {
    pub fn new(device: &wgpu::Device) -> Self {
        use Binding::*;
        let layout = |bindings: &[(u32, Binding)]| layout(device, bindings);
        let matmul = [
            (0, Uniform),
            (1, Uniform),
            (2, Read),
            (3, Read),
            (4, ReadWrite),
            (5, Read),
        ];
        let matmul_q16 = [
            (0, Uniform),
            (1, Uniform),
            (2, Read),
            (4, ReadWrite),
            (5, Read),
            (7, Read),
        ];
        let rope = [(8, Read), (9, ReadWrite), (10, ReadWrite), (11, Read)];
        let layouts = Layouts {
            matmul: layout(&matmul),
            embed: layout(&[
                (0, Uniform),
                (1, Uniform),
                (2, Read),
                (4, ReadWrite),
                (6, Read),
            ]),
            attention: layout(&[
                (0, Uniform),
                (1, Uniform),
                (2, Read),
                (3, Read),
                (4, Read),
                (5, ReadWrite),
                (6, ReadWrite),
                (7, Read),
            ]),
            kv_store: layout(&[
                (0, Uniform),
                (1, Uniform),
                (2, Read),
                (3, Read),
                (4, ReadWrite),
                (5, ReadWrite),
                (7, Read),
            ]),
            norm: layout(&[
                (0, Uniform),
                (1, Uniform),
                (2, Read),
                (3, Read),
                (4, ReadWrite),
            ]),
            argmax: layout(&[(0, Uniform), (1, Uniform), (2, Read), (3, ReadWrite)]),
            quantize: layout(&[
                (0, Uniform),
                (1, Uniform),
                (3, Read),
                (5, Read),
                (7, ReadWrite),
            ]),
            matmul_q16: layout(&matmul_q16),
            matmul_rope: layout(&[&matmul[..], &rope].concat()),
            matmul_q16_rope: layout(&[&matmul_q16[..], &rope].concat()),
        };
        Compiled {
            device: device.clone(),
            layouts,
            pipelines: Mutex::default(),
        }
    }

    /// The pipeline of `entry` in `source` with `layout`, compiled on first use.
    fn pipeline(
        &self,
        layout: Layout,
        source: String,
        entry: &'static str,
    ) -> wgpu::ComputePipeline {
        let mut pipelines = self.pipelines.lock().unwrap_or_else(|p| p.into_inner());
        let l = &self.layouts;
        let bind_group_layout = match layout {
            Layout::MatMul => &l.matmul,
            Layout::Embed => &l.embed,
            Layout::Attention => &l.attention,
            Layout::KvStore => &l.kv_store,
            Layout::Norm => &l.norm,
            Layout::Argmax => &l.argmax,
            Layout::Quantize => &l.quantize,
            Layout::MatMulQ16 => &l.matmul_q16,
            Layout::MatMulRope => &l.matmul_rope,
            Layout::MatMulQ16Rope => &l.matmul_q16_rope,
        };
        pipelines
            .entry((layout, entry, source))
            .or_insert_with_key(|(_, entry, source)| {
                pipeline(&self.device, bind_group_layout, source, entry)
            })
            .clone()
    }
}

fn layout(device: &wgpu::Device, bindings: &[(u32, Binding)]) -> wgpu::BindGroupLayout {
    let entries: Vec<_> = bindings
        .iter()
        .map(|&(binding, kind)| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: match kind {
                    Binding::Uniform => wgpu::BufferBindingType::Uniform,
                    Binding::Read => wgpu::BufferBindingType::Storage { read_only: true },
                    Binding::ReadWrite => wgpu::BufferBindingType::Storage { read_only: false },
                },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        })
        .collect();
    device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: None,
        entries: &entries,
    })
}

fn pipeline(
    device: &wgpu::Device,
    layout: &wgpu::BindGroupLayout,
    source: &str,
    entry: &str,
) -> wgpu::ComputePipeline {
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(entry),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    });
    let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(entry),
        bind_group_layouts: &[Some(layout)],
        immediate_size: 0,
    });
    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(entry),
        layout: Some(&pipeline_layout),
        module: &module,
        entry_point: Some(entry),
        compilation_options: Default::default(),
        cache: None,
    })
}

/// The `//#name` section of `source` (up to the next section).
fn section<'s>(source: &'s str, name: &str) -> &'s str {
    let marker = format!("//#{name}\n");
    let start = source
        .find(&marker)
        .map_or(source.len(), |i| i + marker.len());
    let end = source[start..]
        .find("\n//#")
        .map_or(source.len(), |i| start + i + 1);
    &source[start..end]
}

/// `source`'s lines above its first section.
fn header(source: &str) -> &str {
    &source[..source.find("\n//#").map_or(source.len(), |i| i + 1)]
}

/// The lines that give the layer modules which touch the KV cache the type of its elements, `Kv`.
fn kv_header(kv: GpuKv) -> &'static str {
    match kv {
        GpuKv::F32 => "alias Kv = f32;\n",
        GpuKv::F16 => "enable f16;\nalias Kv = f16;\n",
        GpuKv::Q8_0 => "alias Kv = u32;\n",
    }
}

/// The lines that give Q|K|V's epilogue the type it writes K and V in, `Kv`, and KV_STAGED:
/// whether they go to f32 rows for `kv_store` to quantize into a Q8_0 cache.
fn kv_written(kv: GpuKv) -> String {
    let staged = kv == GpuKv::Q8_0;
    let written = if staged { GpuKv::F32 } else { kv };
    format!("{}const KV_STAGED: bool = {staged};\n", kv_header(written))
}

/// The source of the layer module `name`, with the KV cache's element type (and, for attention,
/// the functions that read its values).
fn layer_source(name: &str, kv: GpuKv) -> String {
    let reads = match (name, kv) {
        ("attention", GpuKv::Q8_0) => section(LAYER, "kv_q8_0"),
        ("attention", _) => section(LAYER, "kv_float"),
        _ => "",
    };
    format!(
        "{}{}{}{reads}",
        kv_header(kv),
        header(LAYER),
        section(LAYER, name)
    )
}

/// A mat-mul module's section of matmul.wgsl: f32 inputs, or (integer weights) Q16 ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inputs {
    Float,
    Q16,
}

/// The source of a mat-mul of `tile` tokens, `rows` to a workgroup (Q|K|V's with a KV cache in
/// `kv`).
fn matmul_source(
    format: GpuFormat,
    fused: Fused,
    (tile, rows): (usize, usize),
    bias: bool,
    inputs: Inputs,
    kv: GpuKv,
) -> String {
    let (norm, epi) = match fused {
        Fused::NormRope => (true, 3),
        Fused::Add => (false, 1),
        Fused::NormSwiglu => (true, 2),
        Fused::Store => (false, 0),
    };
    let norm_after = norm && inputs == Inputs::Float;
    let bias = bias && fused == Fused::NormRope;
    let (kv_header, rope) = match fused {
        Fused::NormRope => (kv_written(kv), section(MATMUL, "rope")),
        _ => (String::new(), section(MATMUL, "no_rope")),
    };
    let quants = format
        .quants_section()
        .map_or("", |name| section(FORMATS, name));
    // The Q16 tile gives its threads eight of LANES running sums; every other kernel has LANES
    // threads, each with one sum of every row and token (and its RMSNorm prologue sums over them).
    let q16_tile = inputs == Inputs::Q16 && tile > 1;
    let (threads, red_len, red_stride) = if q16_tile {
        (Q16_TILE_THREADS, 8 * rows * tile, tile)
    } else {
        (LANES, rows * LANES * tile, LANES * tile)
    };
    let inputs = match inputs {
        Inputs::Float => section(MATMUL, "float").to_string(),
        Inputs::Q16 => {
            let entry = if q16_tile { "q16_tile" } else { "q16_vec" };
            format!("{}{}", section(MATMUL, "q16"), section(MATMUL, entry))
        }
    };
    format!(
        "{kv_header}const ROWS: u32 = {rows}u;\nconst LANES: u32 = {LANES}u;\nconst TOK: u32 = {tile}u;\n\
         const THREADS: u32 = {threads}u;\nconst RED_LEN: u32 = {red_len}u;\n\
         const RED_STRIDE: u32 = {red_stride}u;\nconst NT: u32 = {Q16_THREAD_TOKENS}u;\n\
         const NORM: bool = {norm};\nconst NORM_AFTER: bool = {norm_after};\n\
         const BIAS: bool = {bias};\nconst EPI: u32 = {epi}u;\n{}\n\
         {quants}\n{}{inputs}{rope}",
        section(FORMATS, format.scales_section()),
        header(MATMUL),
    )
}

impl Kernels {
    /// The kernels for `matmuls` and an embedding in `embed` (compiled on `compiled`'s device
    /// where it has not yet): only the variants they run, since a model's load waits for each
    /// (160 ms for a Q16 tile on lavapipe). `bias` adds Q|K|V biases to that mat-mul;
    /// `packed_dot` (WGSL has `dot4I8Packed`) gives integer weights Q16 inputs (the tile for
    /// batches and a lone token's mat-vec, in place of the f32 ones), the wide mat-vec for parts
    /// that fill `wide_vec_groups` of its workgroups; Q|K|V's epilogue and attention keep the KV
    /// cache in `kv`.
    pub fn new(
        compiled: &Compiled,
        matmuls: &[MatMulUse],
        embed: Option<GpuFormat>,
        bias: bool,
        packed_dot: bool,
        wide_vec_groups: usize,
        kv: GpuKv,
    ) -> Result<Self> {
        let pipeline = |layout, source, entry| compiled.pipeline(layout, source, entry);
        let mut matmul = HashMap::new();
        let mut matmul_q16 = HashMap::new();
        for &MatMulUse {
            format,
            fused,
            rows,
        } in matmuls
        {
            if packed_dot && format.is_integer() {
                let (tile_rows, tile) = Q16_TILE;
                matmul_q16
                    .entry((format, fused, tile, tile_rows))
                    .or_insert_with(|| {
                        let shape = (tile, tile_rows);
                        let source = matmul_source(format, fused, shape, bias, Inputs::Q16, kv);
                        pipeline(Layout::matmul(fused, true), source, "matmul")
                    });
                let vec_rows = Q16_VEC_ROWS[wide_matvec(rows, wide_vec_groups) as usize];
                matmul_q16
                    .entry((format, fused, 1, vec_rows))
                    .or_insert_with(|| {
                        let shape = (1, vec_rows);
                        let source = matmul_source(format, fused, shape, bias, Inputs::Q16, kv);
                        pipeline(Layout::matmul(fused, false), source, "matvec")
                    });
            } else {
                for tile in [1, PREFILL_TILE] {
                    matmul.entry((format, fused, tile)).or_insert_with(|| {
                        let shape = (tile, FLOAT_ROWS);
                        let source = matmul_source(format, fused, shape, bias, Inputs::Float, kv);
                        pipeline(Layout::matmul(fused, false), source, "matmul")
                    });
                }
            }
        }
        let embed = embed.map(|format| {
            let shape = (1, FLOAT_ROWS);
            let source = matmul_source(format, Fused::Store, shape, false, Inputs::Float, kv);
            (format, pipeline(Layout::Embed, source, "embed"))
        });
        // Without the norm, and with it (a fusion with the norm and no RoPE picks the prologue).
        let quantize = (!matmul_q16.is_empty()).then(|| {
            [Fused::Add, Fused::NormSwiglu].map(|fused| {
                let shape = (1, FLOAT_ROWS);
                let source = matmul_source(GpuFormat::F32, fused, shape, false, Inputs::Float, kv);
                pipeline(Layout::Quantize, source, "quantize")
            })
        });
        let layer = |name: &str| layer_source(name, kv);
        Ok(Kernels {
            attention: pipeline(Layout::Attention, layer("attention"), "attention"),
            attention_reduce: pipeline(Layout::Attention, layer("attention"), "attention_reduce"),
            kv_store: (kv == GpuKv::Q8_0)
                .then(|| pipeline(Layout::KvStore, layer("kv_store"), "kv_store")),
            rms_norm: pipeline(Layout::Norm, layer("rms_norm"), "rms_norm"),
            argmax: pipeline(Layout::Argmax, layer("argmax"), "argmax"),
            layouts: compiled.layouts.clone(),
            matmul,
            matmul_q16,
            quantize,
            embed,
            wide_vec_groups,
        })
    }

    pub fn matmul(
        &self,
        format: GpuFormat,
        fused: Fused,
        tile: usize,
    ) -> Result<&wgpu::ComputePipeline> {
        self.matmul
            .get(&(format, fused, tile))
            .ok_or_else(|| anyhow!("no {} mat-mul kernel was compiled", format.name()))
    }

    /// A mat-mul's Q16 pipelines, where it has them: the quantizer (with the norm its fusion
    /// needs), the tile's mat-mul and the lone token's mat-vec.
    pub fn q16(&self, format: GpuFormat, fused: Fused) -> Option<Q16Pipelines<'_>> {
        let [plain, norm] = self.quantize.as_ref()?;
        let quantize = match fused {
            Fused::NormRope | Fused::NormSwiglu => norm,
            Fused::Add | Fused::Store => plain,
        };
        let get = |tile, rows| self.matmul_q16.get(&(format, fused, tile, rows));
        Some(Q16Pipelines {
            quantize,
            matmul: get(Q16_TILE.1, Q16_TILE.0)?,
            matvec: Q16_VEC_ROWS.map(|rows| get(1, rows)),
            wide_vec_groups: self.wide_vec_groups,
        })
    }

    /// Whether any mat-mul has Q16 pipelines.
    pub fn has_q16(&self) -> bool {
        self.quantize.is_some()
    }

    pub fn embed(&self, format: GpuFormat) -> Result<&wgpu::ComputePipeline> {
        match &self.embed {
            Some((f, pipeline)) if *f == format => Ok(pipeline),
            _ => bail!("no {} embedding kernel was compiled", format.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every module `Kernels::new` can compile, with its entry point.
    fn modules() -> Vec<(String, &'static str)> {
        let mut out = Vec::new();
        // Q|K|V's epilogue with each KV cache; the other fusions touch none.
        let fusions = Fused::ALL.into_iter().flat_map(|fused| match fused {
            Fused::NormRope => GpuKv::ALL.map(|kv| (fused, kv)).to_vec(),
            _ => vec![(fused, GpuKv::F32)],
        });
        for format in GpuFormat::ALL {
            for (fused, kv) in fusions.clone() {
                for bias in [false, true] {
                    let source =
                        |shape, inputs| matmul_source(format, fused, shape, bias, inputs, kv);
                    for tile in [1, PREFILL_TILE] {
                        out.push((source((tile, FLOAT_ROWS), Inputs::Float), "matmul"));
                    }
                    if format.is_integer() {
                        out.push((source((Q16_TILE.1, Q16_TILE.0), Inputs::Q16), "matmul"));
                        for rows in Q16_VEC_ROWS {
                            out.push((source((1, rows), Inputs::Q16), "matvec"));
                        }
                    }
                }
            }
            let shape = (1, FLOAT_ROWS);
            let source = matmul_source(
                format,
                Fused::Store,
                shape,
                false,
                Inputs::Float,
                GpuKv::F32,
            );
            out.push((source, "embed"));
        }
        for fused in [Fused::Add, Fused::NormSwiglu] {
            let shape = (1, FLOAT_ROWS);
            let source = matmul_source(
                GpuFormat::F32,
                fused,
                shape,
                false,
                Inputs::Float,
                GpuKv::F32,
            );
            out.push((source, "quantize"));
        }
        for entry in ["rms_norm", "argmax"] {
            out.push((layer_source(entry, GpuKv::F32), entry));
        }
        for kv in GpuKv::ALL {
            out.push((layer_source("attention", kv), "attention"));
            out.push((layer_source("attention", kv), "attention_reduce"));
        }
        out.push((layer_source("kv_store", GpuKv::Q8_0), "kv_store"));
        out
    }

    /// Apple GPUs run what naga writes in Metal's shading language: every module validates and
    /// translates (Linux CI runs the SPIR-V path on lavapipe; this covers the Metal one).
    #[test]
    fn every_shader_translates_to_metal() {
        use naga::back::msl;
        let mut translated = 0;
        for (source, entry) in modules() {
            let module = naga::front::wgsl::parse_str(&source)
                .unwrap_or_else(|e| panic!("{entry}: {}", e.emit_to_string(&source)));
            let info = naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                naga::valid::Capabilities::all(),
            )
            .validate(&module)
            .unwrap_or_else(|e| panic!("{entry}: {e:?}"));
            let options = msl::Options {
                lang_version: (2, 1),
                ..Default::default()
            };
            let pipeline = msl::PipelineOptions {
                entry_point: Some((naga::ShaderStage::Compute, entry.to_string())),
                ..Default::default()
            };
            let (msl, _) = msl::write_string(&module, &info, &options, &pipeline)
                .unwrap_or_else(|e| panic!("{entry}: {e:?}"));
            assert!(msl.contains("kernel void"), "{entry}: no kernel in\n{msl}");
            translated += 1;
        }
        assert_eq!(
            translated,
            11 * 6 * 2 * 2 + 9 * 6 * 2 * 3 + 11 + 2 + 2 + 3 * 2 + 1
        );
    }
}
