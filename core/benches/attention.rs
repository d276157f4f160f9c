//! Attention on one thread over a cache of `ctx` positions: one decoded token's, and a prefill's
//! last 64 tokens' (each seeing the positions up to its own); SmolLM2-135M's heads (9 query
//! heads sharing 3 KV heads of 64) and Llama-3-8B's (32 sharing 8, of 128), in the Q8_0 and F16
//! caches. Throughput is in cached positions per second, per query token for prefill.
//!
//! `cargo bench -p sapient-core --bench attention`
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sapient_core::attention::{attend, AttentionShape};
use sapient_core::kernels::Kernels;
use sapient_core::kv_cache::LayerKv;
use sapient_core::quant::{quantize_row, Format};
use sapient_core::Serial;

/// The two models' head shapes: name, query heads, KV heads, head size.
const SHAPES: [(&str, usize, usize, usize); 2] = [("smollm2", 9, 3, 64), ("llama3_8b", 32, 8, 128)];

/// A cache of `ctx` positions in `format` for heads of `shape`: its keys and values.
fn cache(format: Format, ctx: usize, (n_kv_heads, head_dim): (usize, usize)) -> [Vec<u8>; 2] {
    let row_bytes = format.row_bytes(head_dim).unwrap();
    [0.37f32, 0.11].map(|seed| {
        let mut bytes = vec![0u8; ctx * n_kv_heads * row_bytes];
        for (r, out) in bytes.chunks_exact_mut(row_bytes).enumerate() {
            let x: Vec<f32> = (0..head_dim)
                .map(|i| ((r * head_dim + i) as f32 * seed).sin())
                .collect();
            quantize_row(format, &x, out).unwrap();
        }
        bytes
    })
}

/// `n_tok` query tokens ending at position `ctx - 1` against a cache of `ctx` positions.
fn bench_attention(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    format: Format,
    (name, n_heads, n_kv_heads, head_dim): (&str, usize, usize, usize),
    ctx: usize,
    n_tok: usize,
) {
    let k = Kernels::best();
    let [keys, values] = cache(format, ctx, (n_kv_heads, head_dim));
    let kv = LayerKv {
        k: &keys,
        v: &values,
        format,
        row_bytes: format.row_bytes(head_dim).unwrap(),
        n_kv_heads,
    };
    let shape = AttentionShape {
        n_heads,
        n_kv_heads,
        head_dim,
        window: None,
    };
    let q: Vec<f32> = (0..n_tok * n_heads * head_dim)
        .map(|i| (i as f32 * 0.23).sin())
        .collect();
    let mut out = vec![0f32; q.len()];
    group.throughput(Throughput::Elements((ctx * n_tok) as u64));
    group.bench_function(format!("{name}_{}_ctx{ctx}", format.name()), |b| {
        b.iter(|| attend(k, &Serial, black_box(&q), kv, ctx - n_tok, shape, &mut out).unwrap())
    });
}

fn decode(c: &mut Criterion) {
    let mut group = c.benchmark_group(format!("attention_decode_{}", Kernels::best().name));
    group.sample_size(30);
    for shape in SHAPES {
        for format in [Format::Q8_0, Format::F16] {
            for ctx in [64, 256, 1024] {
                bench_attention(&mut group, format, shape, ctx, 1);
            }
        }
    }
    group.finish();
}

fn prefill(c: &mut Criterion) {
    let mut group = c.benchmark_group(format!("attention_prefill64_{}", Kernels::best().name));
    group.sample_size(10);
    for shape in SHAPES {
        for format in [Format::Q8_0, Format::F16] {
            for ctx in [512, 2048] {
                bench_attention(&mut group, format, shape, ctx, 64);
            }
        }
    }
    group.finish();
}

criterion_group!(benches, decode, prefill);
criterion_main!(benches);
