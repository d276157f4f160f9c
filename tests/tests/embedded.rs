//! The core used the way firmware would: weights, norms and the layer table borrowed from memory
//! prepared beforehand, the KV cache and the scratch in fixed arrays sized by the `const fn`s, the
//! `Serial` executor, and nothing from the std frontend. From `Model::new` to the last sampled
//! token, the global allocator fails every request (a firmware without a heap); the tokens must
//! be the std path's.
//!
//! Its own test binary without the libtest harness (`harness = false` in Cargo.toml): the
//! harness's threads allocate while a test runs, and the allocator here is process-wide.
use std::alloc::{GlobalAlloc, Layout, System};
use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};

use sapient::run::CpuRunner;
use sapient_core::sample::{Sampler, SamplerConfig};
use sapient_core::{
    Config, Format, KvCache, KvFormat, LayerWeights, Layers, Matrix, Model, RopeStyle, Scratch,
    Serial, Want, Weights,
};
use sapient_tests::*;

/// The system allocator, except that while `NO_HEAP` is set every allocation fails, which aborts
/// the process ("memory allocation of N bytes failed").
struct FailingWhenArmed;

static NO_HEAP: AtomicBool = AtomicBool::new(false);

// SAFETY: forwards to `System` (which upholds GlobalAlloc's contract) or reports failure with
// null, which GlobalAlloc allows; `dealloc` only ever sees `System`'s pointers.
unsafe impl GlobalAlloc for FailingWhenArmed {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if NO_HEAP.load(Ordering::SeqCst) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout (the only allocator here).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: FailingWhenArmed = FailingWhenArmed;

/// Runs `f` with the heap switched off.
fn without_heap<T>(f: impl FnOnce() -> T) -> T {
    NO_HEAP.store(true, Ordering::SeqCst);
    let out = f();
    NO_HEAP.store(false, Ordering::SeqCst);
    out
}

/// Config of the fixture: `const`, so the arenas' sizes are compile-time constants.
const CONFIG: Config = Config {
    vocab_size: 512,
    hidden_size: 128,
    intermediate_size: 192,
    n_layers: 2,
    n_heads: 4,
    n_kv_heads: 2,
    head_dim: 32,
    rms_norm_eps: 1e-5,
    rope_theta: 10000.0,
    rope_style: RopeStyle::Halves,
    rope_scaling: None,
    tie_word_embeddings: true,
    qkv_bias: false,
    sliding_window: None,
    max_position_embeddings: 256,
};
const MAX_SEQ: usize = 64;
const MAX_BATCH: usize = 8;
const KV_BYTES: usize = match KvCache::bytes_needed(&CONFIG, MAX_SEQ, KvFormat::Q8_0) {
    Ok(n) => n,
    Err(_) => panic!("the fixture's config is valid"),
};
const SCRATCH_BYTES: usize = match Scratch::bytes_needed(&CONFIG, MAX_BATCH) {
    Ok(n) => n,
    Err(_) => panic!("the fixture's config is valid"),
};
const VOCAB: usize = CONFIG.vocab_size;
/// The stack of the thread that runs the model: the README's bound for a forward pass, plus what
/// the thread itself and this test's arrays take.
const STACK_BYTES: usize = 128 * 1024;

/// Fixed, aligned storage, as a `static` in firmware would be.
#[repr(C, align(16))]
struct Arena<const N: usize>([u8; N]);

/// A safetensors file as a flash image: the harness finds each tensor's byte range once; the
/// model then borrows those ranges.
struct Image {
    bytes: Vec<u8>,
    header: serde_json::Value,
    data_start: usize,
}

impl Image {
    fn range(&self, name: &str) -> &[u8] {
        let o = &self.header[name]["data_offsets"];
        let (a, b) = (
            o[0].as_u64().unwrap() as usize,
            o[1].as_u64().unwrap() as usize,
        );
        &self.bytes[self.data_start + a..self.data_start + b]
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Matrix<'_> {
        Matrix::new(Format::F32, rows, cols, Cow::Borrowed(self.range(name))).unwrap()
    }

    /// A norm as f32 values (prepared before the heap goes away; the model borrows them).
    fn vector(&self, name: &str) -> Vec<f32> {
        self.range(name)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }
}

fn main() {
    core_alone_without_a_heap_matches_the_std_path();
    println!("test core_alone_without_a_heap_matches_the_std_path ... ok");
}

fn core_alone_without_a_heap_matches_the_std_path() {
    let dir = tiny("llama_hd32");
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let image = Image {
        bytes,
        header,
        data_start: 8 + n,
    };

    // What firmware would hold in flash: matrices in the image, norms as f32 arrays, and the
    // table of layers.
    let c = &CONFIG;
    let (h, ff, kv) = (c.hidden_size, c.intermediate_size, c.kv_dim());
    let norms: Vec<[Vec<f32>; 2]> = (0..c.n_layers)
        .map(|i| {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            [
                image.vector(&p("input_layernorm.weight")),
                image.vector(&p("post_attention_layernorm.weight")),
            ]
        })
        .collect();
    let final_norm = image.vector("model.norm.weight");
    let layers: Vec<LayerWeights<'_>> = (0..c.n_layers)
        .map(|i| {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            LayerWeights {
                attn_norm: Cow::Borrowed(&norms[i][0]),
                wq: image.matrix(&p("self_attn.q_proj.weight"), c.q_dim(), h),
                wk: image.matrix(&p("self_attn.k_proj.weight"), kv, h),
                wv: image.matrix(&p("self_attn.v_proj.weight"), kv, h),
                wo: image.matrix(&p("self_attn.o_proj.weight"), h, c.q_dim()),
                bq: None,
                bk: None,
                bv: None,
                ffn_norm: Cow::Borrowed(&norms[i][1]),
                w_gate: image.matrix(&p("mlp.gate_proj.weight"), ff, h),
                w_up: image.matrix(&p("mlp.up_proj.weight"), ff, h),
                w_down: image.matrix(&p("mlp.down_proj.weight"), h, ff),
            }
        })
        .collect();
    let embed = image.matrix("model.embed_tokens.weight", c.vocab_size, h);
    let r = read_json(&dir.join("reference.json"));
    let prompt = ids(&r["inputs"]["seq40"]);

    // The arenas a firmware would declare as `static`s, sized at compile time.
    let mut kv_arena = Arena([0u8; KV_BYTES]);
    let mut scratch_arena = Arena([0u8; SCRATCH_BYTES]);
    let mut candidates = [(0u32, 0f32); VOCAB];
    let sampling = SamplerConfig {
        temperature: 0.9,
        top_k: 20,
        top_p: 0.9,
        min_p: 0.02,
        seed: 7,
        ..SamplerConfig::default()
    };

    let mut generated = [0u32; 16];
    let mut logits = [0f32; VOCAB];
    let run = || {
        without_heap(|| {
            let weights = Weights {
                embed: embed.clone(),
                layers: Layers::Borrowed(&layers),
                norm: Cow::Borrowed(&final_norm),
                lm_head: None,
                rope_freq_factors: None,
            };
            let model = Model::new(CONFIG, weights).unwrap();
            let mut cache =
                KvCache::new(&CONFIG, MAX_SEQ, KvFormat::Q8_0, &mut kv_arena.0).unwrap();
            let mut scratch = Scratch::new(&CONFIG, MAX_BATCH, &mut scratch_arena.0).unwrap();
            let mut greedy = Sampler::in_memory(SamplerConfig::greedy(), &mut []).unwrap();
            let mut next = 0;
            for (i, token) in generated.iter_mut().enumerate() {
                let one = [next];
                let input = if i == 0 { &prompt[..] } else { &one[..] };
                let want = Want::LastLogits(&mut logits);
                model
                    .forward(input, &mut cache, &mut scratch, &Serial, want)
                    .unwrap();
                next = greedy.sample(&mut logits, &[]).unwrap();
                *token = next;
            }
            // Sampling proper (top-k, top-p, min-p, temperature) in the caller's candidates.
            let mut sampler = Sampler::in_memory(sampling, &mut candidates).unwrap();
            sampler.sample(&mut logits.clone(), &generated).unwrap()
        })
    };
    // On a thread with the stack the README promises a forward pass needs; overflowing it kills
    // the process.
    let sampled = std::thread::scope(|s| {
        std::thread::Builder::new()
            .stack_size(STACK_BYTES)
            .spawn_scoped(s, run)
            .unwrap()
            .join()
            .unwrap()
    });

    let files = sapient::ModelFiles::open(
        &dir,
        &sapient::LoadOptions {
            quantize: sapient::Quantize::None,
            config_file: None,
        },
    )
    .unwrap();
    let std_model = files.model(sapient::Quantize::None).unwrap();
    assert_eq!(files.config, CONFIG, "the const config is the fixture's");
    let std_tokens = sapient::run::greedy(
        &CpuRunner::new(&std_model, KvFormat::Q8_0, &Serial),
        &prompt,
        16,
        &[],
    )
    .unwrap();
    assert_eq!(generated.to_vec(), std_tokens);
    let mut owned = Sampler::new(sampling).unwrap();
    assert_eq!(sampled, owned.sample(&mut logits, &generated).unwrap());
}
