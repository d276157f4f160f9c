//! One decoded token's attention over a cache of `ctx` positions, on one thread: SmolLM2-135M's
//! heads (9 query heads sharing 3 KV heads of 64) and Llama-3-8B's (32 sharing 8, of 128), in
//! the Q8_0 and F16 caches. Throughput is in cached positions per second.
//!
//! `cargo bench -p sapient-core --bench attention`
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sapient_core::attention::{attend, AttentionShape};
use sapient_core::kernels::Kernels;
use sapient_core::kv_cache::LayerKv;
use sapient_core::quant::{quantize_row, Format};
use sapient_core::Serial;

fn decode(c: &mut Criterion) {
    let k = Kernels::best();
    let mut group = c.benchmark_group(format!("attention_decode_{}", k.name));
    group.sample_size(30);
    for (name, n_heads, n_kv_heads, head_dim) in [("smollm2", 9, 3, 64), ("llama3_8b", 32, 8, 128)]
    {
        for format in [Format::Q8_0, Format::F16] {
            for ctx in [64, 256, 1024] {
                let row_bytes = format.row_bytes(head_dim).unwrap();
                let rows = ctx * n_kv_heads;
                let cache = |seed: f32| -> Vec<u8> {
                    let mut bytes = vec![0u8; rows * row_bytes];
                    for (r, out) in bytes.chunks_exact_mut(row_bytes).enumerate() {
                        let x: Vec<f32> = (0..head_dim)
                            .map(|i| ((r * head_dim + i) as f32 * seed).sin())
                            .collect();
                        quantize_row(format, &x, out).unwrap();
                    }
                    bytes
                };
                let (keys, values) = (cache(0.37), cache(0.11));
                let kv = LayerKv {
                    k: &keys,
                    v: &values,
                    format,
                    row_bytes,
                    n_kv_heads,
                };
                let shape = AttentionShape {
                    n_heads,
                    n_kv_heads,
                    head_dim,
                    window: None,
                };
                let q: Vec<f32> = (0..n_heads * head_dim)
                    .map(|i| (i as f32 * 0.23).sin())
                    .collect();
                let mut out = vec![0f32; q.len()];
                group.throughput(Throughput::Elements(ctx as u64));
                group.bench_function(format!("{name}_{}_ctx{ctx}", format.name()), |b| {
                    b.iter(|| {
                        attend(k, &Serial, black_box(&q), kv, ctx - 1, shape, &mut out).unwrap()
                    })
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, decode);
criterion_main!(benches);
