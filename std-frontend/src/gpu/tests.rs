//! Each GPU kernel against its CPU twin on random shapes that are not multiples of the workgroup
//! sizes, matrices split across storage bindings included. Without an adapter the tests say so
//! and pass, unless `SAPIENT_REQUIRE_GPU` is set (CI sets it and runs them on lavapipe).
use sapient_core::attention::{attend, AttentionShape};
use sapient_core::kernels::Kernels as CpuKernels;
use sapient_core::kv_cache::LayerKv;
use sapient_core::quant::{BlockIQ1M, Format, QUANTIZED};
use sapient_core::sample::{argmax, Rng};
use sapient_core::{ops, Matrix, RopeStyle, Serial};
use wgpu::util::DeviceExt;

use super::kernels::{Fused, Kernels, MatMulUse, Q16_VEC_ROWS, Q16_WORDS, WIDE_VEC_GROUPS};
use super::profile::KernelTimer;
use super::session::{
    bind_group, embed_groups, matmul_groups, uniform, Place, Recorder, RopeStore, Rows, Shape,
};
use super::weights::{GpuFormat, GpuMatrix, RowOrder};
use super::{map_read, Device, GpuKv};

fn device() -> Option<Device> {
    let d = Device::open(true).unwrap();
    if d.is_none() {
        assert!(
            std::env::var_os("SAPIENT_REQUIRE_GPU").is_none(),
            "SAPIENT_REQUIRE_GPU is set but wgpu finds no adapter"
        );
        eprintln!("SKIPPED: no GPU adapter (install mesa-vulkan-drivers for lavapipe)");
    }
    d
}

/// Every mat-mul kernel of `format`: each fusion, a part narrow and one wide enough for the
/// wide Q16 mat-vec.
fn every_matmul(format: GpuFormat) -> Vec<MatMulUse> {
    let wide = Q16_VEC_ROWS[1] * WIDE_VEC_GROUPS;
    Fused::ALL
        .into_iter()
        .flat_map(|fused| {
            [1, wide].map(|rows| MatMulUse {
                format,
                fused,
                rows,
            })
        })
        .collect()
}

/// Every mat-mul kernel of `format` (Q|K|V's with biases), over Q16 inputs where `packed_dot`.
fn matmul_kernels(d: &Device, format: GpuFormat, packed_dot: bool, kv: GpuKv) -> Kernels {
    let matmuls = every_matmul(format);
    Kernels::new(
        &d.compiled,
        &matmuls,
        None,
        true,
        packed_dot,
        WIDE_VEC_GROUPS,
        kv,
    )
    .unwrap()
}

/// The kernels a layer runs besides its mat-muls (RoPE, attention, the norm, argmax).
fn layer_kernels(d: &Device, kv: GpuKv) -> Kernels {
    Kernels::new(&d.compiled, &[], None, false, false, WIDE_VEC_GROUPS, kv).unwrap()
}

fn random(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.next_f32() * 2.0 - 1.0).collect()
}

/// A `rows × cols` matrix of `format` with random values: quantized where the core quantizes
/// to it, else (Q2_K, Q3_K, the grid i-quants) random super-blocks whose scales `d` and `dmin`
/// are 2⁻¹⁰.
pub(super) fn random_matrix(
    rng: &mut Rng,
    format: Format,
    rows: usize,
    cols: usize,
) -> Matrix<'static> {
    let values = random(rng, rows * cols);
    if let Ok(m) = Matrix::quantize(format, rows, cols, &values) {
        return m;
    }
    let mut bytes: Vec<u8> = (0..rows * format.row_bytes(cols).unwrap())
        .map(|_| (rng.next_u64() >> 56) as u8)
        .collect();
    let scale = half::f16::from_f32(1.0 / 1024.0);
    for sb in bytes.chunks_exact_mut(format.block_bytes()) {
        if format == Format::IQ1M {
            BlockIQ1M::set_d_bits(sb, scale.to_bits());
        }
        for &at in format.scale_offsets() {
            sb[at..at + 2].copy_from_slice(&scale.to_le_bytes());
        }
    }
    Matrix::new(format, rows, cols, std::borrow::Cow::Owned(bytes)).unwrap()
}

fn buffer(d: &Device, values: &[f32]) -> wgpu::Buffer {
    bytes_buffer(d, bytemuck::cast_slice(values))
}

fn bytes_buffer(d: &Device, bytes: &[u8]) -> wgpu::Buffer {
    let mut bytes = bytes.to_vec();
    bytes.resize(bytes.len().next_multiple_of(4).max(16), 0);
    d.device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents: &bytes,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        })
}

/// Submits what `rec` recorded and reads `n` floats of `src` back.
fn run_and_read(d: &Device, rec: &mut Recorder, src: &wgpu::Buffer, n: usize) -> Vec<f32> {
    let staging = d.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: (n * 4) as u64,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = rec.take_encoder(&d.device);
    encoder.copy_buffer_to_buffer(src, 0, &staging, 0, (n * 4) as u64);
    d.queue.submit([encoder.finish()]);
    let slice = staging.slice(..);
    map_read(&d.device, &slice).unwrap();
    let error = d.error.lock().unwrap().clone();
    assert!(error.is_none(), "{error:?}");
    let out = bytemuck::cast_slice(&slice.get_mapped_range().unwrap()).to_vec();
    out
}

fn rows(first: usize, count: usize, splits: usize) -> Rows {
    Rows {
        first: first as u32,
        count: count as u32,
        splits: splits as u32,
        pad: 0,
    }
}

/// The places of `n` rows of one sequence from position `pos0`, its slot's rows from `kv_row0`.
fn places(d: &Device, kv_row0: usize, pos0: usize, n: usize) -> wgpu::Buffer {
    let p: Vec<Place> = (0..n)
        .map(|i| Place {
            kv_row0: kv_row0 as u32,
            pos: (pos0 + i) as u32,
        })
        .collect();
    d.device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("places"),
            contents: bytemuck::cast_slice(&p),
            usage: wgpu::BufferUsages::STORAGE,
        })
}

/// `Σ_c w[r][c]·x[c]` in f64, and `Σ|w·x|` (the scale of its rounding error).
fn dot(m: &Matrix<'_>, r: usize, x: &[f32]) -> (f64, f64) {
    let mut w = vec![0f32; m.cols];
    m.dequantize_row(r, &mut w).unwrap();
    let exact = w.iter().zip(x).map(|(a, b)| *a as f64 * *b as f64).sum();
    let scale = w
        .iter()
        .zip(x)
        .map(|(a, b)| (*a as f64 * *b as f64).abs())
        .sum();
    (exact, scale)
}

fn silu(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

/// Every mat-mul variant but Q|K|V's (each other fusion, one token and tiles of 2 with a partial
/// last tile, logits from a row offset) in every format, on 37 rows (not a multiple of the 4 a
/// workgroup takes) of 96 columns (k-quants 256, floats 70), whole and split into parts of at
/// most 2 KiB (k-quants 4 KiB); integer formats with f32 activations and with Q16 ones (packed
/// 8-bit dot products).
#[test]
fn matmul_kernels_match_the_cpu() {
    let Some(d) = device() else { return };
    let mut rng = Rng::new(7);
    let eps = 1e-5;
    let mut checked = 0;
    for format in QUANTIZED
        .into_iter()
        .chain([Format::F16, Format::BF16, Format::F32])
    {
        let cols = match format.block_len() {
            1 => 70,
            32 => 96,
            _ => 256,
        };
        let split = if cols == 256 { 4096 } else { 2048 };
        let gpu_format = GpuFormat::of(format);
        let packed = if gpu_format.is_integer() {
            &[false, true][..]
        } else {
            &[false]
        };
        for &packed_dot in packed {
            let k = Kernels::new(
                &d.compiled,
                &every_matmul(gpu_format),
                Some(gpu_format),
                false,
                packed_dot,
                WIDE_VEC_GROUPS,
                GpuKv::F32,
            )
            .unwrap();
            for fused in [Fused::Add, Fused::NormSwiglu, Fused::Store] {
                let pairs = fused == Fused::NormSwiglu;
                let rows_each = if pairs { 19 } else { 37 };
                let mats: Vec<Matrix<'_>> = (0..if pairs { 2 } else { 1 })
                    .map(|_| random_matrix(&mut rng, format, rows_each, cols))
                    .collect();
                let refs: Vec<&Matrix<'_>> = mats.iter().collect();
                for max_binding in [u64::MAX, split] {
                    let order = if pairs {
                        RowOrder::Interleaved
                    } else {
                        RowOrder::Stacked
                    };
                    let m =
                        GpuMatrix::upload(&d.device, "w", &refs, order, 4, max_binding).unwrap();
                    assert_eq!(m.parts.len() > 1, max_binding == split, "{format:?}");
                    for (n, first) in [(1, 0), (11, 0), (11, 3)] {
                        if first > 0 && fused != Fused::Store {
                            continue;
                        }
                        let out_cols = rows_each;
                        let x = random(&mut rng, n * cols);
                        let gain = random(&mut rng, cols);
                        let y0 = random(&mut rng, n * out_cols);
                        let (xb, yb, auxb) = (buffer(&d, &x), buffer(&d, &y0), buffer(&d, &gain));
                        let q16 = buffer(&d, &vec![0f32; n * cols.div_ceil(32) * Q16_WORDS]);
                        let count = n - first;
                        let rb = uniform(
                            &d.device,
                            "rows",
                            bytemuck::bytes_of(&rows(first, count, 1)),
                        );
                        let mm = matmul_groups(
                            &d.device,
                            &k,
                            &m,
                            fused,
                            &rb,
                            (&xb, cols),
                            (&yb, out_cols),
                            &auxb,
                            Some(&q16),
                            eps,
                            None,
                        );
                        let mut rec = Recorder::default();
                        rec.matmul(&d.device, "test", &k, &mm, count).unwrap();
                        let quantized = packed_dot && count > 1;
                        assert_eq!(rec.dispatches, m.parts.len() + quantized as usize);
                        let got = run_and_read(&d, &mut rec, &yb, n * out_cols);
                        for t in first..n {
                            let xt = &x[t * cols..(t + 1) * cols];
                            let mut xn = vec![0f32; cols];
                            if fused == Fused::NormSwiglu {
                                ops::rms_norm(xt, &gain, eps, &mut xn).unwrap();
                            } else {
                                xn.copy_from_slice(xt);
                            }
                            for r in 0..rows_each {
                                let o = (t - first) * out_cols + r;
                                let (want, tol) = match fused {
                                    Fused::NormSwiglu => {
                                        let (g, sg) = dot(&mats[0], r, &xn);
                                        let (u, su) = dot(&mats[1], r, &xn);
                                        {
                                            // silu' ≤ 1.1: the error of g moves the result by at most 1.1·|u|·δg.
                                            let tol = 2e-5
                                                * ((1.0 + sg) * (1.1 + u.abs())
                                                    + (1.0 + silu(g).abs()) * (1.0 + su));
                                            (silu(g) * u, tol)
                                        }
                                    }
                                    _ => {
                                        let (v, s) = dot(&mats[0], r, &xn);
                                        let v = match fused {
                                            Fused::Add => v + y0[o] as f64,
                                            _ => v,
                                        };
                                        (v, 2e-5 * (1.0 + s))
                                    }
                                };
                                let e = (got[o] as f64 - want).abs();
                                assert!(
                                    e <= tol,
                                    "{format:?} {fused:?} packed {packed_dot} n {n} \
                                     first {first} binding {max_binding}: token {t} row {r}: \
                                     {} vs {want}",
                                    got[o]
                                );
                            }
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    // The float formats once, the quantized ones with and without packed dot products.
    let layouts = 3 + 2 * QUANTIZED.len();
    assert_eq!(checked, layouts * 2 * (2 * 2 + 3));
}

/// With integer weights, a token's result is the same bits alone (the mat-vec quantizes its
/// inputs as it reads them, 64 blocks at a time) as in a batch (one `quantize` dispatch, then the
/// tiled mat-mul), on rows of 67 blocks (some running sums take two, some one) and of 18 (most
/// take none): 20 rows (the narrow mat-vec) and rows enough for the wide one, not a whole number
/// of its workgroups nor of the tile's.
#[test]
fn q16_lone_token_matches_its_batch() {
    let Some(d) = device() else { return };
    if !d.packed_dot {
        eprintln!("SKIPPED: this adapter's WGSL has no dot4I8Packed");
        return;
    }
    let mut rng = Rng::new(13);
    let n = 11;
    let wide = Q16_VEC_ROWS[1] * WIDE_VEC_GROUPS + 6;
    let cases = [Format::Q8_0, Format::Q4_0, Format::Q4_1, Format::Q5_1]
        .into_iter()
        .flat_map(|f| [(f, 20, 67 * 32), (f, wide, 67 * 32), (f, 20, 18 * 32)]);
    for (format, rows_out, cols) in cases {
        let gpu_format = GpuFormat::of(format);
        let k = matmul_kernels(&d, gpu_format, true, GpuKv::F32);
        let values = random(&mut rng, rows_out * cols);
        let mat = Matrix::quantize(format, rows_out, cols, &values).unwrap();
        let m = GpuMatrix::upload(&d.device, "w", &[&mat], RowOrder::Stacked, 4, u64::MAX).unwrap();
        let x = random(&mut rng, n * cols);
        let auxb = buffer(&d, &random(&mut rng, cols));
        let vec_rows = k
            .q16(gpu_format, Fused::Add)
            .unwrap()
            .matvec(rows_out)
            .unwrap()
            .1;
        assert_eq!(vec_rows, Q16_VEC_ROWS[(rows_out == wide) as usize]);
        for fused in [Fused::Add, Fused::NormSwiglu] {
            let out_cols = if fused == Fused::NormSwiglu {
                rows_out / 2
            } else {
                rows_out
            };
            let run = |count: usize, first_row: &[f32]| {
                let xb = buffer(&d, first_row);
                let yb = buffer(&d, &vec![0.5f32; count * out_cols]);
                let q16 = buffer(&d, &vec![0f32; count * cols.div_ceil(32) * Q16_WORDS]);
                let rb = uniform(&d.device, "rows", bytemuck::bytes_of(&rows(0, count, 1)));
                let mm = matmul_groups(
                    &d.device,
                    &k,
                    &m,
                    fused,
                    &rb,
                    (&xb, cols),
                    (&yb, out_cols),
                    &auxb,
                    Some(&q16),
                    1e-5,
                    None,
                );
                let mut rec = Recorder::default();
                rec.matmul(&d.device, "test", &k, &mm, count).unwrap();
                run_and_read(&d, &mut rec, &yb, count * out_cols)
            };
            let batch = run(n, &x);
            for t in [0, 7, n - 1] {
                let alone = run(1, &x[t * cols..(t + 1) * cols]);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&alone),
                    bits(&batch[t * out_cols..(t + 1) * out_cols]),
                    "{format:?} {fused:?}, {rows_out} rows: token {t}"
                );
            }
        }
    }
}

/// Embedding rows of tokens spread over the parts of a split matrix equal the CPU's rows.
#[test]
fn embedding_kernel_matches_the_cpu() {
    let Some(d) = device() else { return };
    let mut rng = Rng::new(11);
    for format in [
        Format::Q8_0,
        Format::Q4_0,
        Format::Q4_1,
        Format::Q5_0,
        Format::Q5_1,
        Format::Q4K,
        Format::Q6K,
        Format::IQ4NL,
        Format::IQ4XS,
        Format::IQ3S,
        Format::IQ3XXS,
        Format::IQ2XS,
        Format::IQ1S,
        Format::IQ1M,
        Format::TQ1_0,
        Format::F16,
        Format::F32,
    ] {
        let (vocab, cols) = (77, 96.max(format.block_len()));
        let m = random_matrix(&mut rng, format, vocab, cols);
        let k = Kernels::new(
            &d.compiled,
            &[],
            Some(GpuFormat::of(format)),
            false,
            false,
            WIDE_VEC_GROUPS,
            GpuKv::F32,
        )
        .unwrap();
        let g = GpuMatrix::upload(&d.device, "embed", &[&m], RowOrder::Stacked, 4, 2048).unwrap();
        assert!(g.parts.len() > 1);
        let tokens: Vec<u32> = vec![0, 76, 40, 3, 40, 63];
        let n = tokens.len();
        let tb = d
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: None,
                contents: bytemuck::cast_slice(&tokens),
                usage: wgpu::BufferUsages::STORAGE,
            });
        let y = buffer(&d, &vec![0f32; n * cols]);
        let rb = uniform(&d.device, "rows", bytemuck::bytes_of(&rows(0, n, 1)));
        let mm = embed_groups(&d.device, &k, &g, &rb, &tb, &y, cols);
        let mut rec = Recorder::default();
        rec.embed(&d.device, &k, &mm, n, cols).unwrap();
        let got = run_and_read(&d, &mut rec, &y, n * cols);
        for (t, &id) in tokens.iter().enumerate() {
            let mut want = vec![0f32; cols];
            m.dequantize_row(id as usize, &mut want).unwrap();
            for (a, b) in got[t * cols..(t + 1) * cols].iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                    "{format:?} token {id}"
                );
            }
        }
    }
}

fn shape(n_heads: usize, n_kv_heads: usize, hd: usize, window: usize) -> Shape {
    Shape {
        n_heads: n_heads as u32,
        n_kv_heads: n_kv_heads as u32,
        head_dim: hd as u32,
        window: window as u32,
        q_dim: (n_heads * hd) as u32,
        kv_dim: (n_kv_heads * hd) as u32,
        scale: 1.0 / (hd as f32).sqrt(),
        hidden: 0,
        eps: 0.0,
        vocab: 0,
        pad: [0; 2],
    }
}

/// The CPU's block format of a KV cache in `kv`.
fn cpu_format(kv: GpuKv) -> Format {
    match kv {
        GpuKv::F32 => Format::F32,
        GpuKv::F16 => Format::F16,
        GpuKv::Q8_0 => Format::Q8_0,
    }
}

/// `values` (whole rows of heads) as the CPU's KV cache in `kv` holds them.
fn cpu_kv_bytes(values: &[f32], kv: GpuKv) -> Vec<u8> {
    let format = cpu_format(kv);
    let mut out = vec![0u8; format.row_bytes(values.len()).unwrap()];
    sapient_core::quant::quantize_row(format, values, &mut out).unwrap();
    out
}

/// The CPU's cache bytes `cpu` as the GPU's cache in `kv` holds them: the same, but for Q8_0's
/// blocks, whose scale follows the quants and is padded to a word.
fn gpu_kv_bytes(cpu: &[u8], kv: GpuKv) -> Vec<u8> {
    match kv {
        GpuKv::F32 | GpuKv::F16 => cpu.to_vec(),
        GpuKv::Q8_0 => cpu
            .chunks_exact(34)
            .flat_map(|b| [&b[2..], &b[..2], &[0, 0]].concat())
            .collect(),
    }
}

/// `values` as the GPU's KV cache in `kv` holds them.
fn kv_bytes(values: &[f32], kv: GpuKv) -> Vec<u8> {
    gpu_kv_bytes(&cpu_kv_bytes(values, kv), kv)
}

/// Reads the first `n` values of a KV cache in `kv` back, as f32.
fn read_kv(d: &Device, rec: &mut Recorder, src: &wgpu::Buffer, n: usize, kv: GpuKv) -> Vec<f32> {
    let words = run_and_read(d, rec, src, kv.row_bytes(n).div_ceil(4));
    let bytes = bytemuck::cast_slice::<f32, u8>(&words);
    match kv {
        GpuKv::F32 => words,
        GpuKv::F16 => bytes
            .chunks_exact(2)
            .take(n)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        GpuKv::Q8_0 => bytes
            .chunks_exact(36)
            .flat_map(|b| {
                let d = half::f16::from_le_bytes([b[32], b[33]]).to_f32();
                b[..32].iter().map(move |&q| q as i8 as f32 * d)
            })
            .take(n)
            .collect(),
    }
}

/// Q|K|V's epilogue (`Fused::NormRope`) against the CPU: the RMSNorm'd mat-mul plus its biases,
/// then RoPE (both pair styles) as `ops::rope` does, Q into its rows and K and V into the KV slot
/// of each row (the second of two here); in an f16 cache too, each value within an f16 rounding
/// of the CPU's. Weights in Q8_0 (with f32 inputs and with Q16 ones) and F16, whole and split
/// into parts of at most 2 KiB; and a token gets the same bits alone as in its batch.
#[test]
fn qkv_rope_kernels_match_the_cpu() {
    let Some(d) = device() else { return };
    for kv in kv_formats(&d) {
        qkv_rope_matches_the_cpu(&d, kv);
    }
}

/// The KV cache formats the adapter can hold.
fn kv_formats(d: &Device) -> Vec<GpuKv> {
    if d.shader_f16 {
        vec![GpuKv::F32, GpuKv::F16, GpuKv::Q8_0]
    } else {
        eprintln!("SKIPPED: an f16 KV cache (the adapter has no f16 in shaders)");
        vec![GpuKv::F32, GpuKv::Q8_0]
    }
}

/// What Q|K|V's epilogue wrote for a batch: Q's rows, and each cache.
struct QkvOut {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

fn qkv_rope_matches_the_cpu(d: &Device, kv: GpuKv) {
    // A Q8_0 cache's K and V rows are staged in f32, one per batch row, for `kv_store`.
    let staged = kv == GpuKv::Q8_0;
    let written = if staged { GpuKv::F32 } else { kv };
    // Where the epilogue puts token t of a batch at position `pos`, in the second slot.
    let kv_row = |t: usize, pos: usize, max_seq: usize| if staged { t } else { max_seq + pos };
    let mut rng = Rng::new(3);
    let (cols, eps, max_seq, pos0) = (96, 1e-5, 20, 6);
    let mut checked = 0;
    let weights = [
        (Format::Q8_0, false),
        (Format::Q8_0, true),
        (Format::F16, false),
    ];
    for (format, packed_dot) in weights.into_iter().filter(|w| !w.1 || d.packed_dot) {
        let gpu_format = GpuFormat::of(format);
        let k = matmul_kernels(d, gpu_format, packed_dot, kv);
        for style in [RopeStyle::Halves, RopeStyle::Adjacent] {
            for (n_heads, n_kv, hd) in [(4, 2, 16), (3, 1, 6)] {
                let (qd, kvd) = (n_heads * hd, n_kv * hd);
                let mats = [qd, kvd, kvd].map(|rows| random_matrix(&mut rng, format, rows, cols));
                let order = RowOrder::qkv(style, hd, qd + kvd);
                let gain = random(&mut rng, cols);
                let bias = random(&mut rng, qd + 2 * kvd);
                let mut aux = gain.clone();
                aux.extend((0..bias.len()).map(|r| bias[order.stacked_row(r)]));
                let inv_freq: Vec<f32> = (0..hd / 2)
                    .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / hd as f32))
                    .collect();
                let mut angles = vec![0f32; max_seq * hd];
                for (pos, a) in angles.chunks_exact_mut(hd).enumerate() {
                    let (c, s) = a.split_at_mut(hd / 2);
                    ops::rope_angles(pos, &inv_freq, 1.0, c, s);
                }
                let (auxb, ab) = (buffer(d, &aux), buffer(d, &angles));
                let n = 11;
                let x = random(&mut rng, n * cols);
                for max_binding in [u64::MAX, 2048] {
                    let refs = [&mats[0], &mats[1], &mats[2]];
                    let m =
                        GpuMatrix::upload(&d.device, "qkv", &refs, order, 4, max_binding).unwrap();
                    assert_eq!(m.parts.len() > 1, max_binding == 2048);
                    // Rows from `x` at positions from `pos` of the second slot.
                    let run = |x: &[f32], pos: usize| -> QkvOut {
                        let count = x.len() / cols;
                        let qb = buffer(d, &vec![0f32; count * qd]);
                        let cache = 2 * max_seq * kvd;
                        let (kc, vc) = (
                            bytes_buffer(d, &vec![0; written.row_bytes(cache)]),
                            bytes_buffer(d, &vec![0; written.row_bytes(cache)]),
                        );
                        let pb = places(d, max_seq, pos, count);
                        let rope = RopeStore {
                            head_dim: hd,
                            q_dim: qd,
                            kv_dim: kvd,
                            style,
                            angles: &ab,
                            k_cache: &kc,
                            v_cache: &vc,
                            places: &pb,
                        };
                        let xb = buffer(d, x);
                        let q16 = buffer(d, &vec![0f32; count * cols.div_ceil(32) * Q16_WORDS]);
                        let rb = uniform(&d.device, "rows", bytemuck::bytes_of(&rows(0, count, 1)));
                        let mm = matmul_groups(
                            &d.device,
                            &k,
                            &m,
                            Fused::NormRope,
                            &rb,
                            (&xb, cols),
                            (&qb, qd),
                            &auxb,
                            Some(&q16),
                            eps,
                            Some(&rope),
                        );
                        let mut rec = Recorder::default();
                        rec.matmul(&d.device, "test", &k, &mm, count).unwrap();
                        QkvOut {
                            q: run_and_read(d, &mut rec, &qb, count * qd),
                            k: read_kv(d, &mut rec, &kc, cache, written),
                            v: read_kv(d, &mut rec, &vc, cache, written),
                        }
                    };
                    let got = run(&x, pos0);
                    let untouched = if staged { n..2 * max_seq } else { 0..max_seq };
                    assert!(
                        got.k[untouched.start * kvd..untouched.end * kvd]
                            .iter()
                            .all(|v| *v == 0.0),
                        "rows {untouched:?} are untouched"
                    );
                    for t in 0..n {
                        let mut xn = vec![0f32; cols];
                        ops::rms_norm(&x[t * cols..(t + 1) * cols], &gain, eps, &mut xn).unwrap();
                        // Each row's value and the scale of its rounding error, stacked Q|K|V.
                        let (values, scales): (Vec<f64>, Vec<f64>) = mats
                            .iter()
                            .flat_map(|m| (0..m.rows).map(|r| dot(m, r, &xn)))
                            .zip(&bias)
                            .map(|((v, s), b)| (v + *b as f64, s))
                            .unzip();
                        let a = &angles[(pos0 + t) * hd..][..hd];
                        let rotated = |range: std::ops::Range<usize>| {
                            let mut r: Vec<f32> = values[range].iter().map(|&v| v as f32).collect();
                            ops::rope(&mut r, &a[..hd / 2], &a[hd / 2..], style).unwrap();
                            r
                        };
                        let (want_q, want_k) = (rotated(0..qd), rotated(qd..qd + kvd));
                        // A rotated value mixes two: its error, at most their scales' sum (the
                        // largest of its head's, twice).
                        let tol = |row: usize| {
                            let head = row - row % hd;
                            let s = scales[head..head + hd].iter().fold(0f64, |a, &b| a.max(b));
                            (2e-5 * (1.0 + 2.0 * s)) as f32
                        };
                        let rounding = |w: f32| match written {
                            GpuKv::F16 => w.abs() / 1024.0,
                            GpuKv::F32 | GpuKv::Q8_0 => 0.0,
                        };
                        let cached = kv_row(t, pos0 + t, max_seq) * kvd;
                        let case = format!(
                            "{format:?} packed {packed_dot} {kv:?} {style:?} {n_heads}/{n_kv} \
                             hd {hd} binding {max_binding}: token {t}"
                        );
                        for (i, &w) in want_q.iter().enumerate() {
                            let g = got.q[t * qd + i];
                            assert!((g - w).abs() <= tol(i), "{case}: q[{i}] {g} vs {w}");
                        }
                        for (i, &w) in want_k.iter().enumerate() {
                            let g = got.k[cached + i];
                            let e = tol(qd + i) + rounding(w);
                            assert!((g - w).abs() <= e, "{case}: k[{i}] {g} vs {w}");
                        }
                        for i in 0..kvd {
                            let (g, w) = (got.v[cached + i], values[qd + kvd + i] as f32);
                            let e = (2e-5 * (1.0 + scales[qd + kvd + i])) as f32 + rounding(w);
                            assert!((g - w).abs() <= e, "{case}: v[{i}] {g} vs {w}");
                        }
                    }
                    for t in [0, 7, n - 1] {
                        let alone = run(&x[t * cols..(t + 1) * cols], pos0 + t);
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        // The token's K and V alone (the batch's row 0) and in the batch.
                        let row = |r: usize| {
                            let at = kv_row(r, pos0 + t, max_seq) * kvd;
                            at..at + kvd
                        };
                        let (one, all) = (row(0), row(t));
                        assert_eq!(bits(&alone.q), bits(&got.q[t * qd..(t + 1) * qd]), "q {t}");
                        assert_eq!(bits(&alone.k[one.clone()]), bits(&got.k[all.clone()]));
                        assert_eq!(bits(&alone.v[one]), bits(&got.v[all]));
                    }
                    checked += 1;
                }
            }
        }
    }
    let weights = if d.packed_dot { 3 } else { 2 };
    assert_eq!(checked, weights * 2 * 2 * 2);
}

/// Attention against the CPU's on f32, f16 and Q8_0 caches: head sizes 16 to 128 (32 to 128 in
/// Q8_0), one to seven query heads per KV head, sliding windows, prefill blocks, and decoding
/// split into 1, 2 and 5 pieces over up to 700 positions; the sequence's KV slot starts after
/// another's rows.
#[test]
fn attention_kernel_matches_the_cpu() {
    let Some(d) = device() else { return };
    for kv in kv_formats(&d) {
        attention_matches_the_cpu(&d, kv);
    }
}

fn attention_matches_the_cpu(d: &Device, kv: GpuKv) {
    let k = layer_kernels(d, kv);
    let mut rng = Rng::new(5);
    let mut checked = 0;
    // Q8_0 blocks need heads of a multiple of 32 values.
    let shapes = match kv {
        GpuKv::Q8_0 => [(4, 4, 32), (6, 2, 64), (7, 1, 128)],
        GpuKv::F32 | GpuKv::F16 => [(4, 4, 16), (6, 2, 48), (7, 1, 128)],
    };
    for (n_heads, n_kv, hd) in shapes {
        for window in [0, 20] {
            for (n, pos0, splits) in [(1, 0, 1), (1, 299, 2), (1, 700, 5), (5, 30, 1), (3, 90, 1)] {
                let sh = shape(n_heads, n_kv, hd, window);
                let (qd, kvd) = (n_heads * hd, n_kv * hd);
                let ctx = pos0 + n;
                let q = random(&mut rng, n * qd);
                let (kv_k, kv_v) = (random(&mut rng, ctx * kvd), random(&mut rng, ctx * kvd));
                // The sequence's slot starts after another's rows, which it must not see.
                let other = 7;
                let in_slot = |rows: &[f32], rng: &mut Rng| {
                    let mut all = random(rng, other * kvd);
                    all.extend_from_slice(rows);
                    all
                };
                let (slot_k, slot_v) = (in_slot(&kv_k, &mut rng), in_slot(&kv_v, &mut rng));
                let (kb, vb) = (
                    bytes_buffer(d, &kv_bytes(&slot_k, kv)),
                    bytes_buffer(d, &kv_bytes(&slot_v, kv)),
                );
                let qb = buffer(d, &q);
                let att = buffer(d, &vec![0f32; n * qd]);
                let partial = buffer(d, &vec![0f32; n_heads * splits * (hd + 2)]);
                let rb = uniform(&d.device, "rows", bytemuck::bytes_of(&rows(0, n, splits)));
                let sb = uniform(&d.device, "shape", bytemuck::bytes_of(&sh));
                let pb = places(d, other, pos0, n);
                let entries = [
                    (0, &rb),
                    (1, &sb),
                    (2, &qb),
                    (3, &kb),
                    (4, &vb),
                    (5, &att),
                    (6, &partial),
                    (7, &pb),
                ];
                let group = bind_group(&d.device, &k.layouts.attention, &entries);
                let mut rec = Recorder::default();
                rec.dispatch(
                    &d.device,
                    "test",
                    &k.attention,
                    &group,
                    [n_heads, n, splits],
                );
                if splits > 1 {
                    rec.dispatch(
                        &d.device,
                        "test",
                        &k.attention_reduce,
                        &group,
                        [n_heads, 1, 1],
                    );
                }
                let got = run_and_read(d, &mut rec, &att, n * qd);

                let (kbytes, vbytes) = (cpu_kv_bytes(&kv_k, kv), cpu_kv_bytes(&kv_v, kv));
                let cpu_kv = LayerKv {
                    k: &kbytes,
                    v: &vbytes,
                    format: cpu_format(kv),
                    row_bytes: cpu_format(kv).row_bytes(hd).unwrap(),
                    n_kv_heads: n_kv,
                };
                let cpu_shape = AttentionShape {
                    n_heads,
                    n_kv_heads: n_kv,
                    head_dim: hd,
                    window: (window > 0).then_some(window),
                };
                let mut want = vec![0f32; n * qd];
                attend(
                    CpuKernels::scalar(),
                    &Serial,
                    &q,
                    cpu_kv,
                    pos0,
                    cpu_shape,
                    &mut want,
                )
                .unwrap();
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() < 1e-4,
                        "{kv:?} {n_heads}/{n_kv} hd {hd} window {window} n {n} pos0 {pos0} \
                         splits {splits}: [{i}] {a} vs {b}"
                    );
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 3 * 2 * 5);
}

/// `kv_store` against the CPU's Q8_0 cache: each batch row's staged K and V quantized into its
/// place in the second slot, and nothing else written. A block of halves (amax 127: a scale of
/// exactly 1) must round them away from zero as C's `roundf` does, bit for bit; elsewhere a
/// scale may differ from the CPU's by one f16 step and a quant by one (a GPU may round its
/// divisions' last bit otherwise; lavapipe does not).
#[test]
fn kv_store_kernel_quantizes_as_the_cpu() {
    let Some(d) = device() else { return };
    let k = layer_kernels(&d, GpuKv::Q8_0);
    let pipeline = k.kv_store.as_ref().expect("a Q8_0 cache's kv_store");
    let q8 = GpuKv::Q8_0;
    let mut rng = Rng::new(11);
    let (max_seq, pos0) = (12, 3);
    let mut exact = 0;
    for (n_kv, hd, n) in [(2, 32, 1), (1, 64, 5), (3, 128, 9)] {
        let kvd = n_kv * hd;
        // Blocks of magnitudes from 1e-3 to 1e3; the first block of K all zero, V's all halves.
        let mut staged = |first: &[f32]| {
            let mut x = random(&mut rng, n * kvd);
            for b in x.chunks_exact_mut(32) {
                let scale = 10f32.powi((rng.next_u64() % 7) as i32 - 3);
                b.iter_mut().for_each(|v| *v *= scale);
            }
            x[..32].copy_from_slice(first);
            x
        };
        let halves: Vec<f32> = (0..32)
            .map(|i| {
                if i == 0 {
                    127.0
                } else {
                    (i as f32 - 16.0) + 0.5
                }
            })
            .collect();
        let (kn, vn) = (staged(&[0.0; 32]), staged(&halves));
        let cache = 2 * max_seq * kvd;
        let (kc, vc) = (
            bytes_buffer(&d, &vec![0; q8.row_bytes(cache)]),
            bytes_buffer(&d, &vec![0; q8.row_bytes(cache)]),
        );
        let (kb, vb) = (buffer(&d, &kn), buffer(&d, &vn));
        let rb = uniform(&d.device, "rows", bytemuck::bytes_of(&rows(0, n, 1)));
        let sb = uniform(
            &d.device,
            "shape",
            bytemuck::bytes_of(&shape(n_kv, n_kv, hd, 0)),
        );
        let pb = places(&d, max_seq, pos0, n);
        let entries = [
            (0, &rb),
            (1, &sb),
            (2, &kb),
            (3, &vb),
            (4, &kc),
            (5, &vc),
            (7, &pb),
        ];
        let group = bind_group(&d.device, &k.layouts.kv_store, &entries);
        let mut rec = Recorder::default();
        let size = [(2 * kvd / 32).div_ceil(64), n, 1];
        rec.dispatch(&d.device, "test", pipeline, &group, size);
        for (cache_buffer, values) in [(&kc, &kn), (&vc, &vn)] {
            let words = run_and_read(&d, &mut rec, cache_buffer, q8.row_bytes(cache) / 4);
            let got: &[u8] = bytemuck::cast_slice(&words);
            let want = kv_bytes(values, q8);
            let at = q8.row_bytes((max_seq + pos0) * kvd);
            let case = format!("{n_kv} heads of {hd}, {n} rows");
            assert!(got[..at].iter().all(|b| *b == 0), "{case}: rows before");
            assert!(
                got[at + want.len()..].iter().all(|b| *b == 0),
                "{case}: rows after"
            );
            for (i, (g, w)) in got[at..].chunks(36).zip(want.chunks(36)).enumerate() {
                if i == 0 {
                    assert_eq!(g, w, "{case}: the first block");
                }
                let scale = |b: &[u8]| half::f16::from_le_bytes([b[32], b[33]]).to_bits() as i32;
                assert!(
                    (scale(g) - scale(w)).abs() <= 1,
                    "{case}: block {i}'s scale"
                );
                assert_eq!(&g[34..], &[0, 0], "{case}: block {i}'s padding");
                for (a, b) in g[..32].iter().zip(&w[..32]) {
                    assert!(
                        (*a as i8 as i32 - *b as i8 as i32).abs() <= 1,
                        "{case}: block {i}"
                    );
                }
                exact += (g == w) as usize;
            }
        }
    }
    eprintln!("kv_store: {exact} blocks the same bytes as the CPU's");
}

/// The final RMSNorm and greedy argmax (ties go to the first index, as the CPU's) on sizes that
/// are not multiples of their workgroups.
#[test]
fn norm_and_argmax_kernels_match_the_cpu() {
    let Some(d) = device() else { return };
    let k = layer_kernels(&d, GpuKv::F32);
    let mut rng = Rng::new(9);
    let (n, hidden, vocab) = (3, 200, 1001);
    let mut sh = shape(1, 1, 2, 0);
    (sh.hidden, sh.eps, sh.vocab) = (hidden as u32, 1e-6, vocab as u32);
    let sb = uniform(&d.device, "shape", bytemuck::bytes_of(&sh));
    let rb = uniform(&d.device, "rows", bytemuck::bytes_of(&rows(0, n, 1)));

    let (x, gain) = (random(&mut rng, n * hidden), random(&mut rng, hidden));
    let (xb, gb, out) = (
        buffer(&d, &x),
        buffer(&d, &gain),
        buffer(&d, &vec![0f32; n * hidden]),
    );
    let group = bind_group(
        &d.device,
        &k.layouts.norm,
        &[(0, &rb), (1, &sb), (2, &xb), (3, &gb), (4, &out)],
    );
    let mut rec = Recorder::default();
    rec.dispatch(&d.device, "test", &k.rms_norm, &group, [n, 1, 1]);
    let got = run_and_read(&d, &mut rec, &out, n * hidden);
    let mut want = vec![0f32; hidden];
    for t in 0..n {
        ops::rms_norm(&x[t * hidden..(t + 1) * hidden], &gain, 1e-6, &mut want).unwrap();
        for (a, b) in got[t * hidden..].iter().zip(&want) {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "row {t}: {a} vs {b}"
            );
        }
    }

    for best in [0, 517, 1000] {
        let mut logits = random(&mut rng, vocab);
        logits[best] = 5.0;
        logits[(best + 300) % vocab] = 5.0;
        let lb = buffer(&d, &logits);
        let id = buffer(&d, &[0.0]);
        let group = bind_group(
            &d.device,
            &k.layouts.argmax,
            &[(0, &rb), (1, &sb), (2, &lb), (3, &id)],
        );
        let mut rec = Recorder::default();
        rec.dispatch(&d.device, "test", &k.argmax, &group, [1, 1, 1]);
        let got = run_and_read(&d, &mut rec, &id, 1)[0].to_bits();
        assert_eq!(got, argmax(&logits), "max at {best}");
    }
}

/// `bench --profile`'s timer, both ways it takes timestamps (between the dispatches of one pass,
/// or at the ends of a pass per dispatch): every dispatch counted under its kernel, the host's
/// time too, and the kernels' results what they are untimed. And a recorder dropped with its
/// pass open.
#[test]
fn kernel_timer_counts_each_dispatch_either_way() {
    let Some(d) = device() else { return };
    if !d.timestamps {
        eprintln!("SKIPPED: the adapter has no timestamp queries");
        return;
    }
    let k = layer_kernels(&d, GpuKv::F32);
    let mut rng = Rng::new(4);
    let (n, hidden) = (2, 96);
    let mut sh = shape(1, 1, 2, 0);
    (sh.hidden, sh.eps) = (hidden as u32, 1e-6);
    let sb = uniform(&d.device, "shape", bytemuck::bytes_of(&sh));
    let rb = uniform(&d.device, "rows", bytemuck::bytes_of(&rows(0, n, 1)));
    let (x, gain) = (random(&mut rng, n * hidden), random(&mut rng, hidden));
    let (xb, gb) = (buffer(&d, &x), buffer(&d, &gain));
    let outs = [0, 1].map(|_| buffer(&d, &vec![0f32; n * hidden]));
    let groups = outs.each_ref().map(|out| {
        let entries = [(0, &rb), (1, &sb), (2, &xb), (3, &gb), (4, out)];
        bind_group(&d.device, &k.layouts.norm, &entries)
    });
    // A recorder dropped mid-pass (a forward pass that failed) leaves the device without error:
    // `run_and_read` below checks.
    let mut dropped = Recorder::default();
    dropped.dispatch(&d.device, "norm", &k.rms_norm, &groups[0], [n, 1, 1]);
    drop(dropped);
    let untimed = {
        let mut rec = Recorder::default();
        rec.dispatch(&d.device, "norm", &k.rms_norm, &groups[0], [n, 1, 1]);
        run_and_read(&d, &mut rec, &outs[0], n * hidden)
    };
    for inside_passes in [true, false] {
        let mut timer = KernelTimer::new(&d.device, &d.queue);
        if inside_passes && !timer.inside_passes {
            continue;
        }
        timer.inside_passes = inside_passes;
        let mut rec = Recorder::default();
        rec.timer = Some(timer);
        for (kernel, group) in [("first", &groups[1]), ("second", &groups[0])] {
            rec.dispatch(&d.device, kernel, &k.rms_norm, group, [n, 1, 1]);
        }
        rec.dispatch(&d.device, "first", &k.rms_norm, &groups[1], [n, 1, 1]);
        let mut encoder = rec.take_encoder(&d.device);
        let timer = rec.timer.as_mut().unwrap();
        timer.resolve(&mut encoder);
        d.queue.submit([encoder.finish()]);
        timer.submitted();
        timer.collect(&d.device).unwrap();
        let times = timer.take();
        let calls = |name| {
            times
                .kernels
                .iter()
                .find(|t| t.kernel == name)
                .unwrap()
                .calls
        };
        assert_eq!((calls("first"), calls("second")), (2, 1), "{times:?}");
        assert_eq!(times.untimed, 0);
        assert!(times.kernels.iter().all(|t| t.nanos > 0.0), "{times:?}");
        assert!(
            times.host_nanos > 0.0 && times.span_nanos > 0.0,
            "{times:?}"
        );
        rec.timer = None;
        for out in &outs {
            let got = run_and_read(&d, &mut rec, out, n * hidden);
            assert_eq!(got, untimed, "inside passes: {inside_passes}");
        }
    }
}
