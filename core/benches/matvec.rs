//! Single-threaded mat-vec of a 4096 x 4096 matrix in each weight format, reported as bytes of
//! weights streamed per second, beside a plain streaming read of memory for comparison.
//!
//! `cargo bench -p sapient-core --bench matvec`; GFLOP/s = 2 · 4096² / time.
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sapient_core::kernels::{panel, Activations, Kernels};
use sapient_core::quant::{ActivationFormat, Format};
use sapient_core::Matrix;

const N: usize = 4096;

fn matvec(c: &mut Criterion) {
    let values: Vec<f32> = (0..N * N)
        .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
        .collect();
    let x: Vec<f32> = (0..N).map(|i| (i as f32 * 0.37).sin()).collect();
    let k = Kernels::best();
    let (q16, q8k) = quantized(k, &x, N);
    let acts = Activations {
        f32: &x,
        q16: Some(&q16),
        q8k: Some(&q8k),
        transposed: None,
        k_tiles: None,
        n_tok: 1,
        cols: N,
    };
    let mut group = c.benchmark_group(format!("matvec_4096x4096_{}", k.name));
    group.sample_size(20);
    for format in [
        Format::F32,
        Format::F16,
        Format::BF16,
        Format::Q8_0,
        Format::Q4_1,
        Format::Q4_0,
        Format::Q5_0,
        Format::Q5_1,
        Format::Q4K,
        Format::Q6K,
    ] {
        let m = Matrix::quantize(format, N, N, &values).unwrap();
        let mut out = vec![0f32; N];
        group.throughput(Throughput::Bytes(m.bytes().len() as u64));
        group.bench_function(format.name(), |b| {
            b.iter(|| {
                k.matmul_rows(black_box(&m), black_box(&acts), 0, &mut out)
                    .unwrap()
            })
        });
    }
    group.finish();
}

/// Prefill's shape: 64 tokens against a 1536 x 576 matrix (SmolLM2's gate projection), which
/// stays in the caches, so this measures the kernels' arithmetic. Throughput is in
/// multiply-adds (elements of 64 · 1536 · 576).
fn matmul_prefill(c: &mut Criterion) {
    matmul_tokens(
        c,
        Kernels::best(),
        64,
        (1536, 576),
        &[Format::Q8_0, Format::Q4_1, Format::Q4_0],
    );
}

/// One thread's share of a 512-token prefill on two threads (128 tokens) against a 5632 x 2048
/// matrix (TinyLlama's gate projection, more than L2 holds): the k-quants' many-token kernels,
/// next to Q8_0's panels, on every SIMD table this CPU runs. Throughput in multiply-adds.
fn matmul_prefill_k(c: &mut Criterion) {
    let formats = [
        Format::Q8_0,
        Format::Q2K,
        Format::Q3K,
        Format::Q4K,
        Format::Q5K,
        Format::Q6K,
    ];
    for (k, runs) in Kernels::simd_tables() {
        if runs() {
            matmul_tokens(c, k, 128, (5632, 2048), &formats);
        }
    }
}

/// The k-quants' tile kernel alone, in cache: 128 unpacked rows of one super-block against one
/// transposed tile of 16 tokens (what `matmul_prefill_k` spends most of its time in), on every
/// SIMD table this CPU runs. Throughput in multiply-adds.
fn k_panel_dot(c: &mut Criterion) {
    use sapient_core::kernels::k_panel::{KRow, KTokens, K_ROWS, K_TOKENS};
    use sapient_core::quant::k_quants::QK_K;
    let x: Vec<f32> = (0..K_TOKENS * QK_K)
        .map(|i| (i as f32 * 0.37).sin())
        .collect();
    for (k, runs) in Kernels::simd_tables() {
        if !runs() {
            continue;
        }
        let mut group = c.benchmark_group(format!("k_panel_dot_{}", k.name));
        group.throughput(Throughput::Elements((K_ROWS * K_TOKENS * QK_K) as u64));
        let (_, q8k) = quantized(k, &x, QK_K);
        let xb = q8k.len() / K_TOKENS;
        let xs: [&[u8]; K_TOKENS] = core::array::from_fn(|t| &q8k[t * xb..(t + 1) * xb]);
        for format in [
            Format::Q2K,
            Format::Q3K,
            Format::Q4K,
            Format::Q5K,
            Format::Q6K,
            Format::IQ4XS,
        ] {
            let Some(kernels) = &k.dots(format).unwrap().k_panel else {
                continue;
            };
            let m = matrix(format, K_ROWS, QK_K, &x[..QK_K].repeat(K_ROWS));
            let rows: Vec<&[u8]> = (0..K_ROWS).map(|r| m.row(r)).collect();
            let mut unpacked = vec![KRow::ZERO; K_ROWS];
            (kernels.unpack)(&rows, 0, &mut unpacked);
            let mut tile = KTokens::ZERO;
            (kernels.transpose)(xs, 0, &mut tile);
            let mut acc = vec![[0f32; K_TOKENS]; K_ROWS];
            group.bench_function(format.name(), |b| {
                b.iter(|| (kernels.dot)(black_box(&unpacked), black_box(&tile), K_TOKENS, &mut acc))
            });
        }
        group.finish();
    }
}

/// A server's decode steps: one token of each of 1, 4, 8, 16 and 32 sequences against the same
/// matrix, where panel packing and the unpacked tiles meet.
fn matmul_decode_steps(c: &mut Criterion) {
    for n_tok in [1, 4, 8, 16, 32] {
        matmul_tokens(
            c,
            Kernels::best(),
            n_tok,
            (1536, 576),
            &[Format::Q8_0, Format::Q4_1],
        );
    }
}

/// Decode steps of one to four sequences against SmolLM2's output matrix (49152 x 576, 28 MB
/// in Q8_0, streamed from memory): where the one-token kernel and the tiles of four meet.
fn matmul_few_tokens(c: &mut Criterion) {
    for n_tok in 1..=4 {
        matmul_tokens(
            c,
            Kernels::best(),
            n_tok,
            (49152, 576),
            &[Format::Q8_0, Format::Q4_1],
        );
    }
}

/// One token against a 512 x 2048 matrix (under 1.2 MB in every quantized format, so it stays in
/// the caches): each format's one-token arithmetic alone, k-quants included (rows of 256).
fn matvec_cached(c: &mut Criterion) {
    let formats = [
        Format::Q8_0,
        Format::Q4_1,
        Format::Q5_0,
        Format::Q2K,
        Format::Q3K,
        Format::Q4K,
        Format::Q6K,
    ];
    matmul_tokens(c, Kernels::best(), 1, (512, 2048), &formats);
}

/// A matrix in `format`: quantized from `values`, or for the formats sapient reads but does not
/// write (Q2_K, Q3_K), blocks of arbitrary quant bits with small finite f16 scales, which cost
/// the kernels what real ones do.
fn matrix(format: Format, rows: usize, cols: usize, values: &[f32]) -> Matrix<'static> {
    if let Ok(m) = Matrix::quantize(format, rows, cols, values) {
        return m;
    }
    let mut bytes: Vec<u8> = (0..rows * format.row_bytes(cols).unwrap())
        .map(|i| (i * 7919 % 251) as u8)
        .collect();
    let scale = half::f16::from_f32(0.01).to_bits().to_le_bytes();
    for block in bytes.chunks_exact_mut(format.block_bytes()) {
        for &at in format.scale_offsets() {
            block[at..at + 2].copy_from_slice(&scale);
        }
    }
    Matrix::new(format, rows, cols, bytes.into()).unwrap()
}

/// `n_tok` tokens against a `rows x cols` matrix in each of `formats`.
/// Rows of `cols` values as Q16 and as Q8K (empty where `cols` is no multiple of 256).
fn quantized(k: &Kernels, x: &[f32], cols: usize) -> (Vec<u8>, Vec<u8>) {
    let mut out = [Vec::new(), Vec::new()];
    for (to, out) in [ActivationFormat::Q16, ActivationFormat::Q8K]
        .into_iter()
        .zip(&mut out)
    {
        if !cols.is_multiple_of(to.block_len()) {
            continue;
        }
        let row = to.row_bytes(cols);
        out.resize(x.len() / cols * row, 0);
        for (xr, qr) in x.chunks(cols).zip(out.chunks_mut(row)) {
            k.quantize_activations(to, xr, qr).unwrap();
        }
    }
    let [q16, q8k] = out;
    (q16, q8k)
}

fn matmul_tokens(
    c: &mut Criterion,
    k: &Kernels,
    n_tok: usize,
    (rows, cols): (usize, usize),
    formats: &[Format],
) {
    let values: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
        .collect();
    let x: Vec<f32> = (0..n_tok * cols).map(|i| (i as f32 * 0.37).sin()).collect();
    let (q16, q8k) = quantized(k, &x, cols);
    let acts = Activations {
        f32: &x,
        q16: Some(&q16),
        q8k: Some(&q8k),
        transposed: None,
        k_tiles: None,
        n_tok,
        cols,
    };
    let mut group = c.benchmark_group(format!("matmul_{n_tok}x{rows}x{cols}_{}", k.name));
    group.sample_size(20);
    group.throughput(Throughput::Elements((n_tok * rows * cols) as u64));
    for &format in formats {
        let m = matrix(format, rows, cols, &values);
        let mut out = vec![0f32; rows * n_tok];
        group.bench_function(format.name(), |b| {
            b.iter(|| {
                k.matmul_rows(black_box(&m), black_box(&acts), 0, &mut out)
                    .unwrap()
            })
        });
    }
    group.finish();
}

/// The two ways a step of 8 or 16 tokens can take (they give the same bits): packed panels
/// (`panel::matmul`) against transposed tiles of eight tokens (`panel::matvec`), on SmolLM2's
/// gate projection (in cache) and its output matrix (28 MB, streamed from memory).
fn decode_step_paths(c: &mut Criterion) {
    let k = Kernels::best();
    let Some(dots) = k.dots(Format::Q8_0).unwrap().panel.as_ref() else {
        return;
    };
    for (rows, cols) in [(1536, 576), (49152, 576)] {
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
            .collect();
        let m = Matrix::quantize(Format::Q8_0, rows, cols, &values).unwrap();
        for n_tok in [8, 16] {
            let x: Vec<f32> = (0..n_tok * cols).map(|i| (i as f32 * 0.37).sin()).collect();
            let row = sapient_core::quant::q16::row_bytes(cols);
            let mut xq = vec![0u8; n_tok * row];
            for (xr, qr) in x.chunks(cols).zip(xq.chunks_mut(row)) {
                k.quantize_q16(xr, qr).unwrap();
            }
            let x1 = |t: usize| &xq[t * row..(t + 1) * row];
            let mut out = vec![0f32; rows * n_tok];
            let mut group =
                c.benchmark_group(format!("step_{n_tok}x{rows}x{cols}_q8_0_{}", k.name));
            group.sample_size(if rows > 4096 { 10 } else { 20 });
            group.bench_function("packed_panels", |b| {
                b.iter(|| {
                    panel::matmul(
                        dots,
                        rows,
                        cols / 32,
                        |r| m.row(r),
                        n_tok,
                        x1,
                        |r, t, v| out[t * rows + r..][..v.len()].copy_from_slice(v),
                    )
                })
            });
            group.bench_function("transposed_tiles", |b| {
                b.iter(|| {
                    panel::matvec(
                        dots,
                        rows,
                        cols / 32,
                        |r| m.row(r),
                        n_tok,
                        x1,
                        None,
                        |r, t, v| out[t * rows + r..][..v.len()].copy_from_slice(v),
                    )
                })
            });
            group.finish();
        }
    }
}

/// The two ways a k-quant decode step of a few tokens can take (they give the same bits): the
/// tiles of four (`QuantDots::x4`, `rows2x4`) against the transposed tiles of sixteen
/// (`k_panel`), for each x86 table, on a 2816 x 1024 matrix (a 1B model's gate projection) in
/// Q4_K, Q6_K and IQ4_XS: where `KPanelDots::from_tokens` should lie.
fn k_step_paths(c: &mut Criterion) {
    let (rows, cols) = (2816, 1024);
    let values: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
        .collect();
    for format in [Format::Q4K, Format::Q6K, Format::IQ4XS] {
        let m = matrix(format, rows, cols, &values);
        for (k, runs) in Kernels::simd_tables() {
            if !runs() {
                continue;
            }
            for n_tok in [2, 3, 4, 5, 8, 9, 12] {
                let x: Vec<f32> = (0..n_tok * cols).map(|i| (i as f32 * 0.37).sin()).collect();
                let (q16, q8k) = quantized(k, &x, cols);
                let acts = Activations {
                    f32: &x,
                    q16: Some(&q16),
                    q8k: Some(&q8k),
                    transposed: None,
                    k_tiles: None,
                    n_tok,
                    cols,
                };
                let mut out = vec![0f32; rows * n_tok];
                let name = format!("k_step_{n_tok}x{rows}x{cols}_{}_{}", format.name(), k.name);
                let mut group = c.benchmark_group(name);
                group.sample_size(20);
                for (name, from) in [("tiles_of_four", usize::MAX), ("k_panel", 1)] {
                    let mut table = Kernels::clone(k);
                    let dots = match format {
                        Format::Q4K => &mut table.q4_k,
                        Format::Q6K => &mut table.q6_k,
                        _ => &mut table.iq4_xs,
                    };
                    let Some(p) = dots.k_panel.as_mut() else {
                        continue;
                    };
                    p.from_tokens = from;
                    group.bench_function(name, |b| {
                        b.iter(|| {
                            table
                                .matmul_rows(black_box(&m), black_box(&acts), 0, &mut out)
                                .unwrap()
                        })
                    });
                }
                group.finish();
            }
        }
    }
}

/// Summing a buffer far larger than the caches: the memory bandwidth one core can stream.
fn memory_bandwidth(c: &mut Criterion) {
    let buf: Vec<u64> = (0..(256 << 20) / 8).map(|i| i as u64).collect();
    let mut group = c.benchmark_group("memory");
    group.sample_size(10);
    group.throughput(Throughput::Bytes((buf.len() * 8) as u64));
    group.bench_function("stream_read_256MiB", |b| {
        b.iter(|| black_box(&buf).iter().fold(0u64, |a, v| a.wrapping_add(*v)))
    });
    group.finish();
}

criterion_group!(
    benches,
    matvec,
    matvec_cached,
    matmul_prefill,
    matmul_prefill_k,
    k_panel_dot,
    matmul_decode_steps,
    matmul_few_tokens,
    decode_step_paths,
    k_step_paths,
    memory_bandwidth
);
criterion_main!(benches);
