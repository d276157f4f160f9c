//! KV caches and activations on the device, and the core's `Backend` over them: each step of the
//! layer loop records its dispatches into one command encoder, submitted when a result is read
//! back or the batch ends. Every buffer and bind group is made when the session starts; a forward
//! pass writes only the token ids, where each row sits, and the batch's numbers.
//!
//! A session holds one KV cache or several (slots, for a server's sequences): each layer's keys
//! and values are one buffer of `slots × max_seq` rows, and every row of a batch names its slot
//! and position, so one forward pass runs the next tokens of several sequences together.

use anyhow::{bail, Result};
use sapient_core::model::layer_loop;
use sapient_core::{ops, Backend, Config, RopeStyle, Segment, Want};
use wgpu::util::DeviceExt;

use super::kernels::{Fused, Kernels, FLOAT_ROWS, PREFILL_TILE, Q16_TILE, Q16_WORDS};
use super::profile::KernelTimer;
use super::weights::{GpuFormat, GpuMatrix, Part};
use super::{map_read, GpuKv, GpuModel};
use crate::run::{KernelTimes, Session};

/// Logit rows computed and read back per submission.
const LOGIT_ROWS: usize = 8;
/// The most pieces a decoded token's attention is split into over a long context.
const MAX_SPLITS: usize = 32;
/// Context positions per piece of a decoded token's attention: one step of the kernel's keys, so
/// that a long context spreads over many workgroups (on an H200, 2048 positions took 242 µs a
/// layer in 8 pieces of 256, and 40 µs in 32 pieces of 64 once the kernel's loads went four at a
/// time).
const SPLIT_KEYS: usize = 64;
const MAX_WORKGROUPS: usize = 65535;
/// A forward pass is submitted in pieces of this many layers, so that the GPU runs one while the
/// host records the next: on an H200 the host's recording and submitting took 0.6-0.9 ms a
/// SmolLM2 token, which then decoded 342 -> 393 tokens/s (pieces of 2 layers: 389).
/// With `bench --profile` it stays one submission, which the kernel timer reads.
const SUBMIT_LAYERS: usize = 8;

/// `Rows` in the shaders: the tokens a dispatch covers, and the pieces of a decoded token's
/// attention.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(super) struct Rows {
    pub(super) first: u32,
    pub(super) count: u32,
    pub(super) splits: u32,
    pub(super) pad: u32,
}

/// `Place` in layer.wgsl: where a row of the batch sits.
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(super) struct Place {
    /// The first cache row of its sequence's slot.
    pub(super) kv_row0: u32,
    /// Its position in its sequence.
    pub(super) pos: u32,
}

/// `Mat` in matmul.wgsl.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(super) struct Mat {
    rows: u32,
    cols: u32,
    out_row0: u32,
    x_stride: u32,
    out_stride: u32,
    d_off: u32,
    m_off: u32,
    bias_off: u32,
    eps: f32,
    nb: u32,
    head_dim: u32,
    q_dim: u32,
    kv_dim: u32,
    rope_adjacent: u32,
    pad: [u32; 2],
}

impl Mat {
    /// The numbers of part `p` of `m`, reading rows of `x_stride` inputs and writing rows of
    /// `out_stride` outputs (the bias, where there is one, follows the norm's `cols` weights),
    /// with Q|K|V's shape for its RoPE epilogue.
    pub(super) fn new(
        m: &GpuMatrix,
        p: &Part,
        x_stride: usize,
        out_stride: usize,
        eps: f32,
        rope: Option<&RopeStore<'_>>,
    ) -> Self {
        let shape = rope.map_or([0; 4], |r| {
            let (hd, qd, kvd) = (r.head_dim as u32, r.q_dim as u32, r.kv_dim as u32);
            [hd, qd, kvd, (r.style == RopeStyle::Adjacent) as u32]
        });
        Mat {
            rows: p.rows as u32,
            cols: m.cols as u32,
            out_row0: p.row0 as u32,
            x_stride: x_stride as u32,
            out_stride: out_stride as u32,
            d_off: p.d_off as u32,
            m_off: p.m_off as u32,
            bias_off: m.cols as u32,
            eps,
            nb: m.blocks as u32,
            head_dim: shape[0],
            q_dim: shape[1],
            kv_dim: shape[2],
            rope_adjacent: shape[3],
            pad: [0; 2],
        }
    }
}

/// What Q|K|V's epilogue (`Fused::NormRope`) needs besides its mat-mul: the heads' shape,
/// RoPE's pairs, and the buffers of the angles, the layer's caches (for a Q8_0 cache, the f32
/// rows that `kv_store` quantizes into it) and the batch rows' places.
pub(super) struct RopeStore<'b> {
    pub(super) head_dim: usize,
    pub(super) q_dim: usize,
    pub(super) kv_dim: usize,
    pub(super) style: RopeStyle,
    pub(super) angles: &'b wgpu::Buffer,
    pub(super) k_cache: &'b wgpu::Buffer,
    pub(super) v_cache: &'b wgpu::Buffer,
    pub(super) places: &'b wgpu::Buffer,
}

/// A uniform buffer holding `bytes` (rewritable, for the numbers a forward pass sets).
pub(super) fn uniform(device: &wgpu::Device, name: &str, bytes: &[u8]) -> wgpu::Buffer {
    device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some(name),
        contents: bytes,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
    })
}

/// A bind group of whole buffers.
pub(super) fn bind_group(
    device: &wgpu::Device,
    layout: &wgpu::BindGroupLayout,
    entries: &[(u32, &wgpu::Buffer)],
) -> wgpu::BindGroup {
    let entries: Vec<_> = entries
        .iter()
        .map(|&(binding, b)| wgpu::BindGroupEntry {
            binding,
            resource: b.as_entire_binding(),
        })
        .collect();
    device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout,
        entries: &entries,
    })
}

/// A mat-mul's bind groups: one per part of `m`, each with its numbers in a uniform. It reads
/// rows of `x` (`x.1` floats apart) and writes rows of `y` (`y.1` apart); Q|K|V's (`rope`, for
/// `Fused::NormRope`) writes Q there and K and V in the cache. Given a `q16` buffer, integer
/// weights also get the bind groups that quantize `x` into it and read it (for batches of more
/// than one token).
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul_groups(
    device: &wgpu::Device,
    k: &Kernels,
    m: &GpuMatrix,
    fused: Fused,
    rows: &wgpu::Buffer,
    (x, x_stride): (&wgpu::Buffer, usize),
    (y, out_stride): (&wgpu::Buffer, usize),
    aux: &wgpu::Buffer,
    q16: Option<&wgpu::Buffer>,
    eps: f32,
    rope: Option<&RopeStore<'_>>,
) -> MatMul {
    debug_assert_eq!(rope.is_some(), fused == Fused::NormRope);
    let mats: Vec<_> = m
        .parts
        .iter()
        .map(|p| {
            let mat = Mat::new(m, p, x_stride, out_stride, eps, rope);
            uniform(device, "mat", bytemuck::bytes_of(&mat))
        })
        .collect();
    let l = &k.layouts;
    let (layout, layout_q16) = match rope {
        Some(_) => (&l.matmul_rope, &l.matmul_q16_rope),
        None => (&l.matmul, &l.matmul_q16),
    };
    // Bind groups of every part, reading the inputs that `input` binds.
    let groups = |layout: &wgpu::BindGroupLayout, input: (u32, &wgpu::Buffer)| -> Vec<_> {
        m.parts
            .iter()
            .zip(&mats)
            .map(|(p, mat)| {
                let mut entries =
                    vec![(0, rows), (1, mat), (2, &p.buffer), input, (4, y), (5, aux)];
                if let Some(r) = rope {
                    entries.extend([
                        (8, r.angles),
                        (9, r.k_cache),
                        (10, r.v_cache),
                        (11, r.places),
                    ]);
                }
                (bind_group(device, layout, &entries), p.rows)
            })
            .collect()
    };
    let q16 = q16
        .filter(|_| k.q16(m.format, fused).is_some() && !mats.is_empty())
        .map(|q| Q16MatMul {
            quantize: bind_group(
                device,
                &k.layouts.quantize,
                &[(0, rows), (1, &mats[0]), (3, x), (5, aux), (7, q)],
            ),
            parts: groups(layout_q16, (7, q)),
        });
    let parts = groups(layout, (3, x));
    MatMul {
        parts,
        q16,
        format: m.format,
        fused,
    }
}

/// The embedding's bind groups: rows of `m` for the ids in `tokens` into rows of `y`
/// (`cols` floats apart).
pub(super) fn embed_groups(
    device: &wgpu::Device,
    k: &Kernels,
    m: &GpuMatrix,
    rows: &wgpu::Buffer,
    tokens: &wgpu::Buffer,
    y: &wgpu::Buffer,
    cols: usize,
) -> MatMul {
    let parts = m
        .parts
        .iter()
        .map(|p| {
            let mat = uniform(
                device,
                "embed",
                bytemuck::bytes_of(&Mat::new(m, p, 0, cols, 0.0, None)),
            );
            let entries = [(0, rows), (1, &mat), (2, &p.buffer), (4, y), (6, tokens)];
            (bind_group(device, &k.layouts.embed, &entries), p.rows)
        })
        .collect();
    MatMul {
        parts,
        q16: None,
        format: m.format,
        fused: Fused::Store,
    }
}

/// `Shape` in layer.wgsl.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(super) struct Shape {
    pub(super) n_heads: u32,
    pub(super) n_kv_heads: u32,
    pub(super) head_dim: u32,
    pub(super) window: u32,
    pub(super) q_dim: u32,
    pub(super) kv_dim: u32,
    pub(super) scale: f32,
    pub(super) hidden: u32,
    pub(super) eps: f32,
    pub(super) vocab: u32,
    pub(super) pad: [u32; 2],
}

impl Shape {
    pub(super) fn new(c: &Config) -> Self {
        let (qd, kvd) = (c.q_dim(), c.kv_dim());
        Shape {
            n_heads: c.n_heads as u32,
            n_kv_heads: c.n_kv_heads as u32,
            head_dim: c.head_dim as u32,
            window: c.sliding_window.unwrap_or(0) as u32,
            q_dim: qd as u32,
            kv_dim: kvd as u32,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
            hidden: c.hidden_size as u32,
            eps: c.rms_norm_eps,
            vocab: c.vocab_size as u32,
            pad: [0; 2],
        }
    }
}

/// One mat-mul: a bind group per part of its matrix (and its rows).
pub(super) struct MatMul {
    parts: Vec<(wgpu::BindGroup, usize)>,
    q16: Option<Q16MatMul>,
    format: GpuFormat,
    fused: Fused,
}

/// A mat-mul's bind groups over Q16 inputs in a buffer: the quantizer's, and one per part.
struct Q16MatMul {
    quantize: wgpu::BindGroup,
    parts: Vec<(wgpu::BindGroup, usize)>,
}

struct LayerGroups {
    qkv: MatMul,
    /// A Q8_0 cache's: the quantizer of the rows Q|K|V's epilogue staged.
    kv_store: Option<wgpu::BindGroup>,
    attention: wgpu::BindGroup,
    wo: MatMul,
    gate_up: MatMul,
    down: MatMul,
}

/// The command encoder of the batch being recorded, and its dispatches.
#[derive(Default)]
pub(super) struct Recorder {
    /// The compute pass that takes every dispatch until the encoder is taken: wgpu orders the
    /// dispatches of a pass as it orders passes, and a pass apiece took the host about twice as
    /// long per dispatch (BENCHMARKS.md). Declared before the encoder, so that it ends first
    /// when a recorder is dropped.
    pass: Option<wgpu::ComputePass<'static>>,
    encoder: Option<wgpu::CommandEncoder>,
    pub(super) dispatches: usize,
    /// Timestamps around each dispatch, with `bench --profile`.
    pub(super) timer: Option<KernelTimer>,
}

impl Recorder {
    /// Records `kernel` (its name in `bench --profile`).
    pub(super) fn dispatch(
        &mut self,
        device: &wgpu::Device,
        kernel: &'static str,
        pipeline: &wgpu::ComputePipeline,
        group: &wgpu::BindGroup,
        size: [usize; 3],
    ) {
        let queries = self.timer.as_mut().and_then(|t| t.queries(kernel));
        let timer = self.timer.as_ref();
        let own_pass = timer.is_some_and(|t| !t.inside_passes);
        if own_pass {
            self.pass = None;
        }
        let pass = match &mut self.pass {
            Some(pass) => pass,
            None => {
                let encoder = self
                    .encoder
                    .get_or_insert_with(|| device.create_command_encoder(&Default::default()));
                let timestamp_writes = timer.zip(queries).filter(|_| own_pass).map(|(t, q)| {
                    wgpu::ComputePassTimestampWrites {
                        query_set: &t.queries,
                        beginning_of_pass_write_index: Some(q[0]),
                        end_of_pass_write_index: Some(q[1]),
                    }
                });
                let pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes,
                });
                self.pass.insert(pass.forget_lifetime())
            }
        };
        let inside = timer.zip(queries).filter(|_| !own_pass);
        if let Some((t, q)) = inside {
            pass.write_timestamp(&t.queries, q[0]);
        }
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, group, &[]);
        pass.dispatch_workgroups(size[0] as u32, size[1] as u32, size[2] as u32);
        if let Some((t, q)) = inside {
            pass.write_timestamp(&t.queries, q[1]);
        }
        self.dispatches += 1;
    }

    /// The encoder with everything recorded so far (a new one when nothing was), its pass ended.
    pub(super) fn take_encoder(&mut self, device: &wgpu::Device) -> wgpu::CommandEncoder {
        self.pass = None;
        self.encoder
            .take()
            .unwrap_or_else(|| device.create_command_encoder(&Default::default()))
    }

    /// Whether anything is recorded and not yet taken.
    pub(super) fn is_empty(&self) -> bool {
        self.encoder.is_none()
    }

    /// Every part of `mm` for `count` tokens, as `kernel`.
    pub(super) fn matmul(
        &mut self,
        device: &wgpu::Device,
        kernel: &'static str,
        k: &Kernels,
        mm: &MatMul,
        count: usize,
    ) -> Result<()> {
        let q16 = k.q16(mm.format, mm.fused);
        // A batch's tiles over Q16 inputs, which one `quantize` dispatch makes first.
        let tiled = q16.as_ref().zip(mm.q16.as_ref()).filter(|_| count > 1);
        if let Some((p, q)) = tiled {
            self.dispatch(device, "quantize", p.quantize, &q.quantize, [1, count, 1]);
        }
        let parts = tiled.map_or(&mm.parts, |(_, q)| &q.parts);
        for (group, rows) in parts {
            let (pipeline, (group_rows, tile)) = match (&q16, tiled) {
                (_, Some((p, _))) => (p.matmul, Q16_TILE),
                (Some(p), None) if count == 1 => {
                    let (pipeline, group_rows) = p.matvec(*rows)?;
                    (pipeline, (group_rows, 1))
                }
                _ => {
                    let tile = if count == 1 { 1 } else { PREFILL_TILE };
                    (k.matmul(mm.format, mm.fused, tile)?, (FLOAT_ROWS, tile))
                }
            };
            let groups = rows.div_ceil(group_rows);
            let gx = groups.min(MAX_WORKGROUPS);
            let size = [gx, groups.div_ceil(gx), count.div_ceil(tile)];
            self.dispatch(device, kernel, pipeline, group, size);
        }
        Ok(())
    }

    /// The embedding rows (`cols` wide) of `count` tokens, from every part of `mm`.
    pub(super) fn embed(
        &mut self,
        device: &wgpu::Device,
        k: &Kernels,
        mm: &MatMul,
        count: usize,
        cols: usize,
    ) -> Result<()> {
        let pipeline = k.embed(mm.format)?;
        for (group, _) in &mm.parts {
            self.dispatch(
                device,
                "embed",
                pipeline,
                group,
                [cols.div_ceil(4).div_ceil(64), count, 1],
            );
        }
        Ok(())
    }
}

pub struct GpuSession<'m> {
    model: &'m GpuModel,
    max_seq: usize,
    max_batch: usize,
    /// Positions held in each slot's cache.
    kv_lens: Vec<usize>,
    /// The slots of the forward pass's sequences, in its order.
    active: Vec<usize>,
    batch: wgpu::Buffer,
    places: wgpu::Buffer,
    /// The batch's token ids and places, gathered before they are written.
    batch_tokens: Vec<u32>,
    batch_places: Vec<Place>,
    logit_rows: wgpu::Buffer,
    tokens: wgpu::Buffer,
    out: wgpu::Buffer,
    logits: wgpu::Buffer,
    best: wgpu::Buffer,
    staging: wgpu::Buffer,
    embed: MatMul,
    layers: Vec<LayerGroups>,
    norm: wgpu::BindGroup,
    lm_head: MatMul,
    argmax: wgpu::BindGroup,
    rec: Recorder,
    /// Tokens in the batch being recorded, and its attention's splits.
    n: usize,
    splits: usize,
    last_dispatches: usize,
    /// What went wrong on the device, for the error the forward pass returns.
    failure: Option<anyhow::Error>,
}

impl<'m> GpuSession<'m> {
    /// One KV cache of `max_seq` positions, batches of up to `max_batch` tokens.
    pub fn new(model: &'m GpuModel, max_seq: usize, max_batch: usize) -> Result<Self> {
        Self::with_slots(model, 1, max_seq, max_batch)
    }

    /// `slots` KV caches of `max_seq` positions each (see `forward_slots`).
    pub fn with_slots(
        model: &'m GpuModel,
        slots: usize,
        max_seq: usize,
        max_batch: usize,
    ) -> Result<Self> {
        let c = &model.config;
        let device = &model.device;
        if slots == 0 || max_seq == 0 || max_batch == 0 {
            bail!(
                "a GPU session needs at least one KV slot, room for one position and one token \
                 per batch"
            );
        }
        let cache_rows = slots.checked_mul(max_seq).ok_or_else(|| {
            anyhow::anyhow!("GPU: {slots} KV slots of {max_seq} positions overflow")
        })?;
        let (h, qd, kvd, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        // Each layer's keys (and values) in 4-byte words.
        let cache_words = cache_rows
            .checked_mul(model.kv.row_bytes(kvd))
            .ok_or_else(|| anyhow::anyhow!("GPU: a KV cache of {cache_rows} rows overflows"))?
            .div_ceil(4);
        let limit = model
            .limits
            .max_storage_buffer_binding_size
            .min(model.limits.max_buffer_size);
        let storage =
            |name: &str, floats: usize, extra: wgpu::BufferUsages| -> Result<wgpu::Buffer> {
                let bytes = (floats.max(4) * 4) as u64;
                if bytes > limit {
                    bail!(
                    "GPU {}: the {name} buffer needs {bytes} bytes, more than one binding may hold \
                     ({limit}); use a shorter --ctx, fewer --parallel slots or smaller batches",
                    model.info.name
                );
                }
                Ok(device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(name),
                    size: bytes,
                    usage: wgpu::BufferUsages::STORAGE | extra,
                    mapped_at_creation: false,
                }))
            };
        let none = wgpu::BufferUsages::empty();
        let copy_src = wgpu::BufferUsages::COPY_SRC;
        let copy_dst = wgpu::BufferUsages::COPY_DST;
        let x = storage("x", max_batch * h, none)?;
        let out = storage("final norm", max_batch * h, copy_src)?;
        let q = storage("q", max_batch * qd, none)?;
        let att = storage("attention", max_batch * qd, none)?;
        let hidden = storage("swiglu", max_batch * ff, none)?;
        let logits = storage("logits", LOGIT_ROWS * c.vocab_size, copy_src)?;
        let best = storage("argmax", 1, copy_src)?;
        let partial = storage(
            "attention splits",
            c.n_heads * MAX_SPLITS * (c.head_dim + 2),
            none,
        )?;
        let tokens = storage("tokens", max_batch, copy_dst)?;
        let places = storage("places", 2 * max_batch, copy_dst)?;
        let dummy = storage("unused", 1, none)?;
        // A Q8_0 cache's new keys and values in f32, a row per batch row, for `kv_store`.
        let staged = match model.kv {
            GpuKv::Q8_0 => Some((
                storage("staged keys", max_batch * kvd, none)?,
                storage("staged values", max_batch * kvd, none)?,
            )),
            GpuKv::F32 | GpuKv::F16 => None,
        };
        // Q16 activations of the widest input, for batches of several tokens.
        let q16 = if model.kernels.has_q16() && max_batch > 1 {
            let blocks = h.max(qd).max(ff).div_ceil(sapient_core::quant::QK);
            Some(storage(
                "q16 activations",
                max_batch * blocks * Q16_WORDS,
                none,
            )?)
        } else {
            None
        };
        let mut angles = vec![0f32; max_seq * c.head_dim];
        let scale = c.rope_attention_factor();
        for (pos, a) in angles.chunks_exact_mut(c.head_dim).enumerate() {
            let (cos, sin) = a.split_at_mut(c.head_dim / 2);
            ops::rope_angles(pos, &model.inv_freq, scale, cos, sin);
        }
        let angles_bytes = (angles.len() * 4) as u64;
        if angles_bytes > limit {
            bail!(
                "GPU {}: RoPE angles for {max_seq} positions exceed one binding",
                model.info.name
            );
        }
        let angles = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("rope angles"),
            contents: bytemuck::cast_slice(&angles),
            usage: wgpu::BufferUsages::STORAGE,
        });
        let zero = Rows {
            first: 0,
            count: 0,
            splits: 1,
            pad: 0,
        };
        let batch = uniform(device, "batch", bytemuck::bytes_of(&zero));
        let logit_rows = uniform(device, "logit rows", bytemuck::bytes_of(&zero));
        let shape = uniform(device, "shape", bytemuck::bytes_of(&Shape::new(c)));
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: (LOGIT_ROWS * c.vocab_size).max(max_batch * h) as u64 * 4,
            usage: wgpu::BufferUsages::MAP_READ | copy_dst,
            mapped_at_creation: false,
        });

        let k = &model.kernels;
        let group = |layout, entries: &[(u32, &wgpu::Buffer)]| bind_group(device, layout, entries);
        let eps = c.rms_norm_eps;
        let q16 = q16.as_ref();
        let matmul = |m, fused, rows, x, y, aux| {
            matmul_groups(device, k, m, fused, rows, x, y, aux, q16, eps, None)
        };
        let mut layers = Vec::with_capacity(c.n_layers);
        for l in &model.layers {
            let k_cache = storage("k cache", cache_words, none)?;
            let v_cache = storage("v cache", cache_words, none)?;
            let (k_written, v_written) = staged
                .as_ref()
                .map_or((&k_cache, &v_cache), |s| (&s.0, &s.1));
            let rope = RopeStore {
                head_dim: c.head_dim,
                q_dim: qd,
                kv_dim: kvd,
                style: c.rope_style,
                angles: &angles,
                k_cache: k_written,
                v_cache: v_written,
                places: &places,
            };
            let kv_store = staged.as_ref().map(|(k_new, v_new)| {
                group(
                    &k.layouts.kv_store,
                    &[
                        (0, &batch),
                        (1, &shape),
                        (2, k_new),
                        (3, v_new),
                        (4, &k_cache),
                        (5, &v_cache),
                        (7, &places),
                    ],
                )
            });
            layers.push(LayerGroups {
                qkv: matmul_groups(
                    device,
                    k,
                    &l.qkv,
                    Fused::NormRope,
                    &batch,
                    (&x, h),
                    (&q, qd),
                    &l.qkv_aux,
                    q16,
                    eps,
                    Some(&rope),
                ),
                kv_store,
                attention: group(
                    &k.layouts.attention,
                    &[
                        (0, &batch),
                        (1, &shape),
                        (2, &q),
                        (3, &k_cache),
                        (4, &v_cache),
                        (5, &att),
                        (6, &partial),
                        (7, &places),
                    ],
                ),
                wo: matmul(&l.wo, Fused::Add, &batch, (&att, qd), (&x, h), &dummy),
                gate_up: matmul(
                    &l.gate_up,
                    Fused::NormSwiglu,
                    &batch,
                    (&x, h),
                    (&hidden, ff),
                    &l.ffn_norm,
                ),
                down: matmul(&l.down, Fused::Add, &batch, (&hidden, ff), (&x, h), &dummy),
            });
        }
        let embed = embed_groups(device, k, &model.embed, &batch, &tokens, &x, h);
        let norm = group(
            &k.layouts.norm,
            &[
                (0, &batch),
                (1, &shape),
                (2, &x),
                (3, &model.norm),
                (4, &out),
            ],
        );
        let lm_head = matmul(
            model.output(),
            Fused::Store,
            &logit_rows,
            (&out, h),
            (&logits, c.vocab_size),
            &dummy,
        );
        let argmax = group(
            &k.layouts.argmax,
            &[(0, &batch), (1, &shape), (2, &logits), (3, &best)],
        );
        model.check()?;
        Ok(GpuSession {
            model,
            max_seq,
            max_batch,
            kv_lens: vec![0; slots],
            active: vec![0],
            batch,
            places,
            batch_tokens: Vec::with_capacity(max_batch),
            batch_places: Vec::with_capacity(max_batch),
            logit_rows,
            tokens,
            out,
            logits,
            best,
            staging,
            embed,
            layers,
            norm,
            lm_head,
            argmax,
            rec: Recorder::default(),
            n: 0,
            splits: 1,
            last_dispatches: 0,
            failure: None,
        })
    }

    /// Submits what was recorded, plus a copy of `bytes` of `src` from byte `start` to the
    /// staging buffer, waits, and hands the bytes to `read`.
    fn read_back(
        &mut self,
        src: &wgpu::Buffer,
        start: usize,
        bytes: usize,
        read: impl FnOnce(&[u8]),
    ) -> Result<()> {
        let device = &self.model.device;
        let mut encoder = self.rec.take_encoder(device);
        encoder.copy_buffer_to_buffer(src, start as u64, &self.staging, 0, bytes as u64);
        self.submit_encoder(encoder);
        let slice = self.staging.slice(..bytes as u64);
        map_read(device, &slice)
            .map_err(|e| anyhow::anyhow!("GPU {}: {e}", self.model.info.name))?;
        self.model.check()?;
        let view = slice
            .get_mapped_range()
            .map_err(|e| anyhow::anyhow!("GPU {}: reading back: {e}", self.model.info.name))?;
        read(&view);
        drop(view);
        self.staging.unmap();
        self.collect_times()
    }

    fn submit(&mut self) -> Result<()> {
        if !self.rec.is_empty() {
            let encoder = self.rec.take_encoder(&self.model.device);
            self.submit_encoder(encoder);
        }
        self.collect_times()?;
        self.model.check()
    }

    /// Submits `encoder`, ending with the copy of its kernel times where they are on.
    fn submit_encoder(&mut self, mut encoder: wgpu::CommandEncoder) {
        if let Some(t) = &self.rec.timer {
            t.resolve(&mut encoder);
        }
        self.model.queue.submit([encoder.finish()]);
        if let Some(t) = &mut self.rec.timer {
            t.submitted();
        }
    }

    /// With kernel times on: waits for the last submission and adds its passes' times.
    fn collect_times(&mut self) -> Result<()> {
        match &mut self.rec.timer {
            Some(t) => t
                .collect(&self.model.device)
                .map_err(|e| anyhow::anyhow!("GPU {}: {e}", self.model.info.name)),
            None => Ok(()),
        }
    }

    fn write_rows(&self, buffer: &wgpu::Buffer, rows: Rows) {
        self.model
            .queue
            .write_buffer(buffer, 0, bytemuck::bytes_of(&rows));
    }
}

// The steps record dispatches; errors the device finds surface at the next read-back or commit.
impl Backend for GpuSession<'_> {
    fn max_batch(&self) -> usize {
        self.max_batch
    }

    fn sequences(&self) -> usize {
        self.active.len()
    }

    fn kv_len(&self, seq: usize) -> usize {
        self.kv_lens[self.active[seq]]
    }

    fn kv_capacity(&self, _seq: usize) -> usize {
        self.max_seq
    }

    fn embed(&mut self, tokens: &[&[u32]], segments: &[Segment]) -> sapient_core::Result<()> {
        // The batch's rows in order: each segment's tokens, at its slot's rows and positions.
        self.batch_tokens.clear();
        self.batch_places.clear();
        for seg in segments {
            if seg.row != self.batch_tokens.len() {
                return Err(sapient_core::Error::Backend(
                    "the batch's segments are not in row order",
                ));
            }
            let kv_row0 = (self.active[seg.seq] * self.max_seq) as u32;
            let ids = &tokens[seg.seq][seg.offset..seg.offset + seg.len];
            self.batch_tokens.extend_from_slice(ids);
            self.batch_places.extend((0..seg.len).map(|i| Place {
                kv_row0,
                pos: (seg.pos0 + i) as u32,
            }));
        }
        let n = self.batch_tokens.len();
        self.n = n;
        self.rec.dispatches = 0;
        // A decoded token alone splits its attention over a long context.
        self.splits = match self.batch_places[..] {
            [one] => (one.pos as usize + 1)
                .div_ceil(SPLIT_KEYS)
                .clamp(1, MAX_SPLITS),
            _ => 1,
        };
        let rows = Rows {
            first: 0,
            count: n as u32,
            splits: self.splits as u32,
            pad: 0,
        };
        self.write_rows(&self.batch, rows);
        let queue = &self.model.queue;
        queue.write_buffer(&self.tokens, 0, bytemuck::cast_slice(&self.batch_tokens));
        queue.write_buffer(&self.places, 0, bytemuck::cast_slice(&self.batch_places));
        let result = self.rec.embed(
            &self.model.device,
            &self.model.kernels,
            &self.embed,
            n,
            self.model.config.hidden_size,
        );
        result.map_err(|e| self.fail(e))
    }

    fn qkv(&mut self, layer: usize, n: usize) -> sapient_core::Result<()> {
        let result = self.rec.matmul(
            &self.model.device,
            "qkv",
            &self.model.kernels,
            &self.layers[layer].qkv,
            n,
        );
        result.map_err(|e| self.fail(e))
    }

    fn rope_store(&mut self, layer: usize, _segments: &[Segment]) -> sapient_core::Result<()> {
        // Q|K|V's epilogue rotated Q and K and stored K and V (`Fused::NormRope`), in an f32 or
        // f16 cache itself; a Q8_0 cache's blocks span rows of several workgroups, so they are
        // quantized here, from the f32 rows it staged.
        let Some(group) = &self.layers[layer].kv_store else {
            return Ok(());
        };
        let (model, n) = (self.model, self.n);
        let Some(pipeline) = &model.kernels.kv_store else {
            return Err(self.fail(anyhow::anyhow!("no kv_store kernel was compiled")));
        };
        let blocks = 2 * model.config.kv_dim() / sapient_core::quant::QK;
        self.rec.dispatch(
            &model.device,
            "kv_store",
            pipeline,
            group,
            [blocks.div_ceil(64), n, 1],
        );
        Ok(())
    }

    fn attention(&mut self, layer: usize, _segments: &[Segment]) -> sapient_core::Result<()> {
        let (heads, n) = (self.model.config.n_heads, self.n);
        let (model, group) = (self.model, &self.layers[layer].attention);
        let (device, k) = (&model.device, &model.kernels);
        self.rec.dispatch(
            device,
            "attention",
            &k.attention,
            group,
            [heads, n, self.splits],
        );
        if self.splits > 1 {
            self.rec.dispatch(
                device,
                "attention_reduce",
                &k.attention_reduce,
                group,
                [heads, 1, 1],
            );
        }
        Ok(())
    }

    fn attn_out(&mut self, layer: usize, n: usize) -> sapient_core::Result<()> {
        let result = self.rec.matmul(
            &self.model.device,
            "attn_out",
            &self.model.kernels,
            &self.layers[layer].wo,
            n,
        );
        result.map_err(|e| self.fail(e))
    }

    fn gate_up(&mut self, layer: usize, n: usize) -> sapient_core::Result<()> {
        let result = self.rec.matmul(
            &self.model.device,
            "gate_up",
            &self.model.kernels,
            &self.layers[layer].gate_up,
            n,
        );
        result.map_err(|e| self.fail(e))
    }

    fn ffn_out(&mut self, layer: usize, n: usize) -> sapient_core::Result<()> {
        let device = &self.model.device;
        let result = self.rec.matmul(
            device,
            "down",
            &self.model.kernels,
            &self.layers[layer].down,
            n,
        );
        let done = layer + 1;
        if self.rec.timer.is_none()
            && done.is_multiple_of(SUBMIT_LAYERS)
            && done < self.layers.len()
        {
            let encoder = self.rec.take_encoder(device);
            self.model.queue.submit([encoder.finish()]);
        }
        result.map_err(|e| self.fail(e))
    }

    fn final_norm(&mut self, _first: usize, _n: usize) -> sapient_core::Result<()> {
        // Every row of the batch: one dispatch whatever the rows asked for.
        let model = self.model;
        let size = [self.n, 1, 1];
        self.rec.dispatch(
            &model.device,
            "final_norm",
            &model.kernels.rms_norm,
            &self.norm,
            size,
        );
        Ok(())
    }

    fn read_hidden(&mut self, first: usize, out: &mut [f32]) -> sapient_core::Result<()> {
        let src = self.out.clone();
        let start = first * self.model.config.hidden_size * 4;
        self.read_back(&src, start, out.len() * 4, |b| {
            out.copy_from_slice(bytemuck::cast_slice(b))
        })
        .map_err(|e| self.fail(e))
    }

    fn logits(&mut self, first: usize, out: &mut [f32]) -> sapient_core::Result<()> {
        let vocab = self.model.config.vocab_size;
        let logits = self.logits.clone();
        let mut result = Ok(());
        for (i, chunk) in out.chunks_mut(LOGIT_ROWS * vocab).enumerate() {
            let count = chunk.len() / vocab;
            let rows = Rows {
                first: (first + i * LOGIT_ROWS) as u32,
                count: count as u32,
                splits: 1,
                pad: 0,
            };
            self.write_rows(&self.logit_rows, rows);
            result = self
                .rec
                .matmul(
                    &self.model.device,
                    "logits",
                    &self.model.kernels,
                    &self.lm_head,
                    count,
                )
                .and_then(|()| {
                    self.read_back(&logits, 0, chunk.len() * 4, |b| {
                        chunk.copy_from_slice(bytemuck::cast_slice(b))
                    })
                });
            if result.is_err() {
                break;
            }
        }
        result.map_err(|e| self.fail(e))
    }

    fn argmax(&mut self, row: usize) -> sapient_core::Result<u32> {
        let rows = Rows {
            first: row as u32,
            count: 1,
            splits: 1,
            pad: 0,
        };
        self.write_rows(&self.logit_rows, rows);
        let model = self.model;
        let result = self
            .rec
            .matmul(&model.device, "logits", &model.kernels, &self.lm_head, 1);
        result.map_err(|e| self.fail(e))?;
        self.rec.dispatch(
            &model.device,
            "argmax",
            &model.kernels.argmax,
            &self.argmax,
            [1, 1, 1],
        );
        let best = self.best.clone();
        let mut id = 0u32;
        self.read_back(&best, 0, 4, |b| {
            id = u32::from_le_bytes([b[0], b[1], b[2], b[3]])
        })
        .map_err(|e| self.fail(e))?;
        Ok(id)
    }

    fn commit(&mut self, segments: &[Segment]) -> sapient_core::Result<()> {
        let n: usize = segments.iter().map(|s| s.len).sum();
        self.submit().map_err(|e| self.fail(e))?;
        for seg in segments {
            self.kv_lens[self.active[seg.seq]] += seg.len;
        }
        if n == 1 {
            self.last_dispatches = self.rec.dispatches;
        }
        Ok(())
    }
}

impl GpuSession<'_> {
    /// Keeps `e` for the forward pass to return, and gives the core its static stand-in.
    fn fail(&mut self, e: anyhow::Error) -> sapient_core::Error {
        self.failure.get_or_insert(e);
        sapient_core::Error::Backend("the GPU failed")
    }

    /// KV slots.
    pub fn slots(&self) -> usize {
        self.kv_lens.len()
    }

    /// Positions held in `slot`'s cache.
    pub fn slot_len(&self, slot: usize) -> usize {
        self.kv_lens[slot]
    }

    /// Drops `slot`'s positions from `len` on.
    pub fn truncate_slot(&mut self, slot: usize, len: usize) {
        self.kv_lens[slot] = self.kv_lens[slot].min(len);
    }

    /// One forward pass over the next tokens of several sequences: `tokens[i]` continues the
    /// sequence in KV slot `slots[i]` (distinct slots) and fills `wants[i]`, as
    /// `Model::forward_many` does with CPU caches.
    pub fn forward_slots(
        &mut self,
        slots: &[usize],
        tokens: &[&[u32]],
        wants: &mut [Want<'_>],
    ) -> Result<()> {
        for (i, &slot) in slots.iter().enumerate() {
            if slot >= self.slots() {
                bail!("KV slot {slot} does not exist ({} slots)", self.slots());
            }
            if slots[..i].contains(&slot) {
                bail!("KV slot {slot} is given twice in one forward pass");
            }
        }
        self.active.clear();
        self.active.extend_from_slice(slots);
        self.run_layers(tokens, wants)
    }

    fn run_layers(&mut self, tokens: &[&[u32]], wants: &mut [Want<'_>]) -> Result<()> {
        let config = &self.model.config;
        let result = layer_loop(config, self, tokens, wants);
        match (result, self.failure.take()) {
            (Ok(()), _) => Ok(()),
            (Err(_), Some(detail)) => Err(detail),
            (Err(e), None) => Err(e.into()),
        }
    }
}

impl Session for GpuSession<'_> {
    fn config(&self) -> &Config {
        &self.model.config
    }

    /// Runs slot 0.
    fn forward(&mut self, tokens: &[u32], want: Want<'_>) -> Result<()> {
        self.active.clear();
        self.active.push(0);
        self.run_layers(&[tokens], &mut [want])
    }

    fn kv_len(&self) -> usize {
        self.kv_lens[0]
    }

    fn max_seq(&self) -> usize {
        self.max_seq
    }

    fn truncate(&mut self, len: usize) {
        self.truncate_slot(0, len);
    }

    fn time_kernels(&mut self) -> Result<()> {
        if !self.model.timestamps {
            bail!(
                "GPU {}: the adapter has no timestamp queries, so no kernel times",
                self.model.info.name
            );
        }
        if self.rec.timer.is_none() {
            self.rec.timer = Some(KernelTimer::new(&self.model.device, &self.model.queue));
        }
        Ok(())
    }

    fn take_kernel_times(&mut self) -> KernelTimes {
        self.rec
            .timer
            .as_mut()
            .map(KernelTimer::take)
            .unwrap_or_default()
    }

    fn dispatches_per_token(&self) -> Option<usize> {
        Some(self.last_dispatches)
    }
}
