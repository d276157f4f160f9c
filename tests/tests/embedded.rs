//! The core used the way firmware would: weights borrowed from one byte image, the KV cache and
//! the scratch in fixed arrays sized with `bytes_needed`, the `Serial` executor, and nothing from
//! the std frontend. It must produce the std path's greedy tokens.
use sapient::run::CpuRunner;
use std::borrow::Cow;

use sapient_core::sample::argmax;
use sapient_core::{
    Config, Format, KvCache, KvFormat, LayerWeights, Matrix, Model, RopeStyle, Scratch, Serial,
    Want, Weights,
};
use sapient_tests::*;

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

    fn vector(&self, name: &str) -> Vec<f32> {
        self.range(name)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }
}

#[test]
fn core_alone_with_fixed_arenas_matches_the_std_path() {
    let dir = tiny("llama_hd32");
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let image = Image {
        bytes,
        header,
        data_start: 8 + n,
    };

    // What firmware would compile in: the fixture's config.json, by hand.
    let config = Config {
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
    let (h, ff, kv) = (
        config.hidden_size,
        config.intermediate_size,
        config.kv_dim(),
    );
    let layers = (0..config.n_layers)
        .map(|i| {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            LayerWeights {
                attn_norm: image.vector(&p("input_layernorm.weight")),
                wq: image.matrix(&p("self_attn.q_proj.weight"), config.q_dim(), h),
                wk: image.matrix(&p("self_attn.k_proj.weight"), kv, h),
                wv: image.matrix(&p("self_attn.v_proj.weight"), kv, h),
                wo: image.matrix(&p("self_attn.o_proj.weight"), h, config.q_dim()),
                bq: None,
                bk: None,
                bv: None,
                ffn_norm: image.vector(&p("post_attention_layernorm.weight")),
                w_gate: image.matrix(&p("mlp.gate_proj.weight"), ff, h),
                w_up: image.matrix(&p("mlp.up_proj.weight"), ff, h),
                w_down: image.matrix(&p("mlp.down_proj.weight"), h, ff),
            }
        })
        .collect();
    let weights = Weights {
        embed: image.matrix("model.embed_tokens.weight", config.vocab_size, h),
        layers,
        norm: image.vector("model.norm.weight"),
        lm_head: None,
        rope_freq_factors: None,
    };
    let model = Model::new(config.clone(), weights).unwrap();

    let (max_seq, max_batch) = (64, 8);
    let mut kv_arena = Arena([0u8; 32 * 1024]);
    let mut scratch_arena = Arena([0u8; 64 * 1024]);
    let kv_bytes = KvCache::bytes_needed(&config, max_seq, KvFormat::Q8_0).unwrap();
    let scratch_bytes = Scratch::bytes_needed(&config, max_batch).unwrap();
    assert!(kv_bytes <= kv_arena.0.len() && scratch_bytes <= scratch_arena.0.len());
    let mut cache = KvCache::new(
        &config,
        max_seq,
        KvFormat::Q8_0,
        &mut kv_arena.0[..kv_bytes],
    )
    .unwrap();
    let mut scratch =
        Scratch::new(&config, max_batch, &mut scratch_arena.0[..scratch_bytes]).unwrap();

    let r = read_json(&dir.join("reference.json"));
    let prompt = ids(&r["inputs"]["seq40"]);
    let mut logits = [0f32; 512];
    let mut generated = Vec::new();
    let mut input = prompt.clone();
    for _ in 0..16 {
        model
            .forward(
                &input,
                &mut cache,
                &mut scratch,
                &Serial,
                Want::LastLogits(&mut logits),
            )
            .unwrap();
        let next = argmax(&logits);
        generated.push(next);
        input = vec![next];
    }

    let files = sapient::ModelFiles::open(
        &dir,
        &sapient::LoadOptions {
            quantize: sapient::Quantize::None,
            config_file: None,
        },
    )
    .unwrap();
    let std_model = files.model(sapient::Quantize::None).unwrap();
    assert_eq!(
        files.config, config,
        "the hand-written config is the fixture's"
    );
    let std_tokens = sapient::run::greedy(
        &CpuRunner::new(&std_model, KvFormat::Q8_0, &Serial),
        &prompt,
        16,
        &[],
    )
    .unwrap();
    assert_eq!(generated, std_tokens);
}
