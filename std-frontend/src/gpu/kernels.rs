//! The compute pipelines: WGSL sources assembled with their constants, and the bind group
//! layouts they share (explicit, so one bind group serves every variant of a kernel).
use std::collections::HashMap;

use anyhow::{anyhow, Result};

use super::weights::GpuFormat;
use super::ROWS;

const MATMUL: &str = include_str!("shaders/matmul.wgsl");
const FORMATS: &str = include_str!("shaders/formats.wgsl");
const LAYER: &str = include_str!("shaders/layer.wgsl");

/// Threads that share one row of a mat-mul.
const LANES: usize = 16;
/// Tokens per mat-mul workgroup when prefilling (decoding runs one).
pub const PREFILL_TILE: usize = 8;

/// What surrounds a mat-mul: the RMSNorm prologue, and what the epilogue does with a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fused {
    /// RMSNorm(X)·Wᵀ (+ bias): Q|K|V.
    NormStore,
    /// `y += x·Wᵀ`: the output and down projections into the residual stream.
    Add,
    /// SiLU(gate)·up of RMSNorm(X)·Wᵀ over interleaved gate/up rows.
    NormSwiglu,
    /// `y = x·Wᵀ`: the logits.
    Store,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    Uniform,
    Read,
    ReadWrite,
}

pub struct Kernels {
    pub matmul_layout: wgpu::BindGroupLayout,
    pub embed_layout: wgpu::BindGroupLayout,
    pub rope_layout: wgpu::BindGroupLayout,
    pub attention_layout: wgpu::BindGroupLayout,
    pub norm_layout: wgpu::BindGroupLayout,
    pub argmax_layout: wgpu::BindGroupLayout,
    matmul: HashMap<(GpuFormat, Fused, usize), wgpu::ComputePipeline>,
    embed: HashMap<GpuFormat, wgpu::ComputePipeline>,
    pub rope_store: wgpu::ComputePipeline,
    pub attention: wgpu::ComputePipeline,
    pub attention_reduce: wgpu::ComputePipeline,
    pub rms_norm: wgpu::ComputePipeline,
    pub argmax: wgpu::ComputePipeline,
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

fn matmul_source(format: GpuFormat, fused: Fused, tile: usize, bias: bool) -> String {
    let (norm, epi) = match fused {
        Fused::NormStore => (true, 0),
        Fused::Add => (false, 1),
        Fused::NormSwiglu => (true, 2),
        Fused::Store => (false, 0),
    };
    let bias = bias && fused == Fused::NormStore;
    format!(
        "const ROWS: u32 = {ROWS}u;\nconst LANES: u32 = {LANES}u;\nconst TOK: u32 = {tile}u;\n\
         const NORM: bool = {norm};\nconst BIAS: bool = {bias};\nconst EPI: u32 = {epi}u;\n{}\n{MATMUL}",
        section(FORMATS, format.name())
    )
}

impl Kernels {
    /// Compiles the kernels for weights in `formats`; `bias` adds Q|K|V biases to that mat-mul.
    pub fn new(device: &wgpu::Device, formats: &[GpuFormat], bias: bool) -> Result<Self> {
        use Binding::*;
        let matmul_layout = layout(
            device,
            &[
                (0, Uniform),
                (1, Uniform),
                (2, Read),
                (3, Read),
                (4, ReadWrite),
                (5, Read),
            ],
        );
        let embed_layout = layout(
            device,
            &[
                (0, Uniform),
                (1, Uniform),
                (2, Read),
                (4, ReadWrite),
                (6, Read),
            ],
        );
        let rope_layout = layout(
            device,
            &[
                (0, Uniform),
                (1, Uniform),
                (2, ReadWrite),
                (3, Read),
                (4, ReadWrite),
                (5, ReadWrite),
                (6, Read),
            ],
        );
        let attention_layout = layout(
            device,
            &[
                (0, Uniform),
                (1, Uniform),
                (2, Read),
                (3, Read),
                (4, Read),
                (5, ReadWrite),
                (6, ReadWrite),
                (7, Read),
            ],
        );
        let norm_layout = layout(
            device,
            &[
                (0, Uniform),
                (1, Uniform),
                (2, Read),
                (3, Read),
                (4, ReadWrite),
            ],
        );
        let argmax_layout = layout(
            device,
            &[(0, Uniform), (1, Uniform), (2, Read), (3, ReadWrite)],
        );

        let mut matmul = HashMap::new();
        let mut embed = HashMap::new();
        for &format in formats {
            for fused in [
                Fused::NormStore,
                Fused::Add,
                Fused::NormSwiglu,
                Fused::Store,
            ] {
                for tile in [1, PREFILL_TILE] {
                    let source = matmul_source(format, fused, tile, bias);
                    let p = pipeline(device, &matmul_layout, &source, "matmul");
                    matmul.insert((format, fused, tile), p);
                }
            }
            let source = matmul_source(format, Fused::Store, 1, false);
            embed.insert(format, pipeline(device, &embed_layout, &source, "embed"));
        }
        let layer = |name: &str| format!("{}{}", header(LAYER), section(LAYER, name));
        let attention_source = layer("attention");
        Ok(Kernels {
            rope_store: pipeline(device, &rope_layout, &layer("rope_store"), "rope_store"),
            attention: pipeline(device, &attention_layout, &attention_source, "attention"),
            attention_reduce: pipeline(
                device,
                &attention_layout,
                &attention_source,
                "attention_reduce",
            ),
            rms_norm: pipeline(device, &norm_layout, &layer("rms_norm"), "rms_norm"),
            argmax: pipeline(device, &argmax_layout, &layer("argmax"), "argmax"),
            matmul_layout,
            embed_layout,
            rope_layout,
            attention_layout,
            norm_layout,
            argmax_layout,
            matmul,
            embed,
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

    pub fn embed(&self, format: GpuFormat) -> Result<&wgpu::ComputePipeline> {
        self.embed
            .get(&format)
            .ok_or_else(|| anyhow!("no {} embedding kernel was compiled", format.name()))
    }
}
