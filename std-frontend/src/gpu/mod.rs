//! The GPU backend, on wgpu: Metal on macOS, Vulkan on Linux (and Mesa's software lavapipe),
//! DX12 on Windows. Weights are uploaded once, repacked for the shaders; the KV cache and every
//! activation stay on the device; a decoded token is one command submission, and only the chosen
//! id (greedy) or the logits come back. The layer loop is the core's: `GpuSession` implements
//! `sapient_core::Backend` with WGSL kernels.
mod kernels;
mod profile;
mod session;
#[cfg(test)]
mod tests;
mod weights;

use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{anyhow, bail, Result};
use sapient_core::{Config, Model};
use wgpu::util::DeviceExt;

use kernels::{Fused, Kernels, MatMulUse, WIDE_VEC_GROUPS};
pub use session::GpuSession;
use weights::{GpuFormat, GpuMatrix, RowOrder};

use crate::run::{Runner, Session};

/// Parts of a matrix hold whole multiples of this many rows: whole gate/up and RoPE pairs, and
/// whole groups of the 4 rows a thread of the Q16 tile takes (a part's last workgroup may still be
/// partial: the kernels check their rows).
const PART_ROWS: usize = 4;

/// How the KV cache holds keys and values on the device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GpuKv {
    #[default]
    F32,
    /// Half the memory; needs f16 in shaders (wgpu's `SHADER_F16`).
    F16,
    /// Blocks of 32 values as ggml's Q8_0 quantizes them (3.6x less memory than f32): 8 words of
    /// 8-bit quants, then a word holding the scale's f16 bits (36 bytes where the file format
    /// packs 34, so that every word is aligned). Needs `head_dim` a multiple of 32.
    Q8_0,
}

impl GpuKv {
    /// Every format (the kernel tests compile each).
    #[cfg(test)]
    pub const ALL: [GpuKv; 3] = [GpuKv::F32, GpuKv::F16, GpuKv::Q8_0];

    /// Bytes a cached row of `values` values takes (whole blocks for Q8_0).
    pub fn row_bytes(self, values: usize) -> usize {
        match self {
            GpuKv::F32 => 4 * values,
            GpuKv::F16 => 2 * values,
            GpuKv::Q8_0 => values.div_ceil(sapient_core::quant::QK) * Q8_0_KV_BLOCK_BYTES,
        }
    }

    /// As `--kv` names it.
    pub fn name(self) -> &'static str {
        match self {
            GpuKv::F32 => "f32",
            GpuKv::F16 => "f16",
            GpuKv::Q8_0 => "q8_0",
        }
    }
}

/// Bytes of a Q8_0 block in a GPU KV cache (`GpuKv::Q8_0`).
const Q8_0_KV_BLOCK_BYTES: usize = 36;

#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    /// Accept a software adapter (lavapipe, WARP): `--backend gpu` does, `auto` does not.
    pub allow_software: bool,
    /// The KV cache's format.
    pub kv: GpuKv,
    /// Split matrices into parts of at most this many bytes (default: the adapter's limit).
    pub max_binding_bytes: Option<u64>,
}

/// One transformer block on the device.
struct GpuLayer {
    /// Q|K|V rows, in `RowOrder::qkv`'s order.
    qkv: GpuMatrix,
    /// The attention norm's weights, then the Q|K|V biases (in the rows' order) where the model
    /// has them.
    qkv_aux: wgpu::Buffer,
    wo: GpuMatrix,
    /// Gate and up rows interleaved.
    gate_up: GpuMatrix,
    ffn_norm: wgpu::Buffer,
    down: GpuMatrix,
}

/// A model uploaded to a GPU.
pub struct GpuModel {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    limits: wgpu::Limits,
    /// Timestamp queries (kernel times for `bench --profile`).
    timestamps: bool,
    /// The KV cache's format (the kernels that touch it are compiled for it).
    kv: GpuKv,
    config: Config,
    inv_freq: Vec<f32>,
    embed: GpuMatrix,
    /// The output projection; `None` when tied to the embedding.
    lm_head: Option<GpuMatrix>,
    layers: Vec<GpuLayer>,
    norm: wgpu::Buffer,
    kernels: Kernels,
    weight_bytes: u64,
    /// The weights' device layouts (`GpuFormat::of`, or shared by a fused mat-mul's matrices).
    layouts: Vec<GpuFormat>,
    /// The first error the device reported outside an error scope.
    error: Arc<Mutex<Option<String>>>,
}

/// wgpu with the APIs we run on (Vulkan, Metal, DX12; `WGPU_BACKEND` may narrow them). Its
/// OpenGL backend is left out: we have no kernels for it and it opens a display connection.
fn instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::PRIMARY;
    wgpu::Instance::new(desc.with_env())
}

/// Every adapter wgpu finds, as "name (backend, kind)".
pub fn adapters() -> Vec<String> {
    let instance = instance();
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY))
        .iter()
        .map(|a| describe(&a.get_info()))
        .collect()
}

fn describe(info: &wgpu::AdapterInfo) -> String {
    let kind = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => "discrete",
        wgpu::DeviceType::IntegratedGpu => "integrated",
        wgpu::DeviceType::VirtualGpu => "virtual",
        wgpu::DeviceType::Cpu => "software",
        wgpu::DeviceType::Other => "other",
    };
    format!("{} ({:?}, {kind})", info.name, info.backend)
}

/// The best adapter: discrete, then integrated, then virtual or other, then (if allowed) a
/// software one; and whether its WGSL has packed 8-bit dot products.
fn pick_adapter(allow_software: bool) -> Option<(wgpu::Adapter, bool)> {
    let instance = instance();
    let packed_dot = instance
        .wgsl_language_features()
        .contains(wgpu::WgslLanguageFeatures::Packed4x8IntegerDotProduct);
    let rank = |t: wgpu::DeviceType| match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu | wgpu::DeviceType::Other => 2,
        wgpu::DeviceType::Cpu => 3,
    };
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY))
        .into_iter()
        .filter(|a| allow_software || a.get_info().device_type != wgpu::DeviceType::Cpu)
        .min_by_key(|a| rank(a.get_info().device_type))
        .map(|a| (a, packed_dot))
}

/// Maps `slice` for reading once what was submitted has run. The device is shared, so another
/// thread's poll may be the one that runs the map's callback, after this thread's poll returned:
/// the callback's result is waited for, not looked for.
fn map_read(device: &wgpu::Device, slice: &wgpu::BufferSlice<'_>) -> Result<()> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    slice.map_async(wgpu::MapMode::Read, move |r| {
        // The receiver is gone only when the wait below gave up.
        let _ = tx.send(r);
    });
    device
        .poll(wgpu::PollType::Wait {
            submission_index: None,
            timeout: None,
        })
        .map_err(|e| anyhow!("{e}"))?;
    match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(r) => r.map_err(|e| anyhow!("reading back: {e}")),
        Err(_) => bail!("the read-back never finished"),
    }
}

/// An opened adapter (wgpu's handles are shared references: a clone is the same device).
#[derive(Clone)]
struct Device {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    limits: wgpu::Limits,
    /// WGSL's `dot4I8Packed` (a single instruction where the GPU has one, emulated otherwise).
    packed_dot: bool,
    /// Timestamp queries (`bench --profile`).
    timestamps: bool,
    /// f16 in shaders (an f16 KV cache).
    shader_f16: bool,
    /// The first error the device reported outside an error scope.
    error: Arc<Mutex<Option<String>>>,
    /// The kernels compiled on it so far.
    compiled: Arc<kernels::Compiled>,
}

impl Device {
    /// The best adapter's device, opened once per process and shared by every model after: a
    /// driver holds a context per opened device (on an H200, a test that opened a device for
    /// each of some thirty models found no adapter after that). `None` without an adapter.
    fn open(allow_software: bool) -> Result<Option<Self>> {
        static OPENED: [OnceLock<Mutex<Option<Option<Device>>>>; 2] =
            [OnceLock::new(), OnceLock::new()];
        let slot = OPENED[allow_software as usize].get_or_init(Mutex::default);
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(opened) = &*slot {
            return Ok(opened.clone());
        }
        let opened = Self::open_new(allow_software)?;
        *slot = Some(opened.clone());
        Ok(opened)
    }

    /// The best adapter's device with every limit the adapter has, timestamp queries (also
    /// inside passes; for `bench --profile`) and f16 in shaders where it has them.
    fn open_new(allow_software: bool) -> Result<Option<Self>> {
        let Some((adapter, packed_dot)) = pick_adapter(allow_software) else {
            return Ok(None);
        };
        let info = adapter.get_info();
        let limits = adapter.limits();
        let features = adapter.features()
            & (wgpu::Features::TIMESTAMP_QUERY
                | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
                | wgpu::Features::SHADER_F16);
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("sapient"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| anyhow!("GPU {}: cannot open the device: {e}", info.name))?;
        let error = Arc::new(Mutex::new(None));
        let slot = error.clone();
        device.on_uncaptured_error(Arc::new(move |e| {
            let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert_with(|| e.to_string());
        }));
        Ok(Some(Device {
            queue,
            info,
            limits,
            packed_dot,
            timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            error,
            compiled: Arc::new(kernels::Compiled::new(&device)),
            device,
        }))
    }
}

impl GpuModel {
    /// Uploads `model` to the best adapter; `None` when there is no adapter `opts` accepts.
    pub fn new(model: &Model<'_>, opts: &GpuOptions) -> Result<Option<Self>> {
        let Some(Device {
            device,
            queue,
            info,
            limits,
            packed_dot,
            timestamps,
            shader_f16,
            error,
            compiled,
        }) = Device::open(opts.allow_software)?
        else {
            return Ok(None);
        };
        if opts.kv == GpuKv::F16 && !shader_f16 {
            bail!(
                "GPU {}: no f16 in its shaders, so no f16 KV cache (--kv f32)",
                info.name
            );
        }
        if opts.kv == GpuKv::Q8_0
            && !model
                .config
                .head_dim
                .is_multiple_of(sapient_core::quant::QK)
        {
            bail!(
                "--kv q8_0 needs heads of a multiple of {} values; this model's have {} (--kv f32)",
                sapient_core::quant::QK,
                model.config.head_dim
            );
        }
        let max_binding = opts
            .max_binding_bytes
            .unwrap_or(u64::MAX)
            .min(limits.max_storage_buffer_binding_size)
            .min(limits.max_buffer_size);

        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let c = &model.config;
        let w = &model.weights;
        let upload = |name: &str, mats: &[&sapient_core::Matrix<'_>], order| {
            GpuMatrix::upload(&device, name, mats, order, PART_ROWS, max_binding)
        };
        let floats = |name: &str, values: &[f32]| {
            device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(name),
                contents: bytemuck::cast_slice(values),
                usage: wgpu::BufferUsages::STORAGE,
            })
        };
        let qkv_order = RowOrder::qkv(c.rope_style, c.head_dim, c.q_dim() + c.kv_dim());
        let mut layers = Vec::with_capacity(c.n_layers);
        for l in w.layers.iter() {
            let mut aux = l.attn_norm.to_vec();
            let bias: Vec<f32> = [&l.bq, &l.bk, &l.bv]
                .into_iter()
                .flatten()
                .flat_map(|b| b.iter().copied())
                .collect();
            aux.extend((0..bias.len()).map(|r| bias[qkv_order.stacked_row(r)]));
            layers.push(GpuLayer {
                qkv: upload("qkv", &[&l.wq, &l.wk, &l.wv], qkv_order)?,
                qkv_aux: floats("attn_norm", &aux),
                wo: upload("o_proj", &[&l.wo], RowOrder::Stacked)?,
                gate_up: upload("gate_up", &[&l.w_gate, &l.w_up], RowOrder::Interleaved)?,
                ffn_norm: floats("ffn_norm", &l.ffn_norm),
                down: upload("down_proj", &[&l.w_down], RowOrder::Stacked)?,
            });
        }
        let embed = upload("embed_tokens", &[&w.embed], RowOrder::Stacked)?;
        let lm_head = match &w.lm_head {
            Some(m) => Some(upload("lm_head", &[m], RowOrder::Stacked)?),
            None => None,
        };
        let norm = floats("norm", &w.norm);
        let mut layouts: Vec<_> = layers
            .iter()
            .flat_map(|l| [&l.qkv, &l.wo, &l.gate_up, &l.down])
            .chain(lm_head.iter())
            .chain([&embed])
            .map(|m| m.format)
            .collect();
        layouts.sort_by_key(|f| f.name());
        layouts.dedup();
        let output = lm_head.as_ref().unwrap_or(&embed);
        let matmuls: Vec<_> = layers
            .iter()
            .flat_map(|l| {
                [
                    (&l.qkv, Fused::NormRope),
                    (&l.wo, Fused::Add),
                    (&l.gate_up, Fused::NormSwiglu),
                    (&l.down, Fused::Add),
                ]
            })
            .chain([(output, Fused::Store)])
            .flat_map(|(m, fused)| {
                m.parts.iter().map(move |p| MatMulUse {
                    format: m.format,
                    fused,
                    rows: p.rows,
                })
            })
            .collect();
        // A software adapter runs workgroups in turn on a few CPU threads, so each one's fixed
        // cost (the norm, quantizing the inputs, the adding tree's barriers) counts where a GPU
        // hides it: there every part takes the wide mat-vec, the same sums in the same order
        // (SmolLM2-135M Q4_1 decodes 1.3 -> 2.3-2.4 tokens/s on lavapipe, `bench -p 16 -n 8`).
        let wide_vec_groups = if info.device_type == wgpu::DeviceType::Cpu {
            1
        } else {
            WIDE_VEC_GROUPS
        };
        let kernels = Kernels::new(
            &compiled,
            &matmuls,
            Some(embed.format),
            c.qkv_bias,
            packed_dot,
            wide_vec_groups,
            opts.kv,
        )?;
        if let Some(e) = pollster::block_on(scope.pop()) {
            bail!("GPU {}: {e}", info.name);
        }
        let weight_bytes = layers
            .iter()
            .flat_map(|l| [&l.qkv, &l.wo, &l.gate_up, &l.down])
            .chain(lm_head.iter())
            .chain([&embed])
            .flat_map(|m| &m.parts)
            .map(|p| p.buffer.size())
            .sum();
        Ok(Some(GpuModel {
            device,
            queue,
            info,
            limits,
            timestamps,
            kv: opts.kv,
            config: c.clone(),
            inv_freq: model.inv_freq().to_vec(),
            embed,
            lm_head,
            layers,
            norm,
            kernels,
            weight_bytes,
            layouts,
            error,
        }))
    }

    /// The adapter, its API, the weights' size and layouts on the device, whether integer
    /// weights meet Q16 inputs in packed 8-bit dot products, and the KV cache's format.
    pub fn summary(&self) -> String {
        let layouts: Vec<_> = self.layouts.iter().map(|f| f.name()).collect();
        let integer = if self.kernels.has_q16() {
            ", integer weights against Q16 inputs (dot4I8Packed)"
        } else {
            ""
        };
        format!(
            "{}, {:.1} MiB of weights ({}){integer}, {} KV cache",
            describe(&self.info),
            self.weight_bytes as f64 / (1 << 20) as f64,
            layouts.join(", "),
            self.kv.name()
        )
    }

    fn output(&self) -> &GpuMatrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// The first error the device reported, if any.
    fn check(&self) -> Result<()> {
        let slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Some(e) => bail!("GPU {}: {e}", self.info.name),
            None => Ok(()),
        }
    }
}

impl Runner for GpuModel {
    fn config(&self) -> &Config {
        &self.config
    }

    fn with_session<R>(
        &self,
        max_seq: usize,
        max_batch: usize,
        f: impl FnOnce(&mut dyn Session) -> Result<R>,
    ) -> Result<R> {
        f(&mut GpuSession::new(self, max_seq, max_batch)?)
    }
}
