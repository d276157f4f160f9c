//! The GPU backend against the CPU backend on the same weights: every fixture in every weight
//! format the GPU has kernels for, matrices split across storage bindings, attention split over
//! a long context, and SmolLM2's greedy continuations. Where no GPU adapter exists the tests say
//! so and skip, unless `SAPIENT_REQUIRE_GPU` is set (CI sets it: it runs them on lavapipe).
#![cfg(feature = "gpu")]

use std::borrow::Cow;

use sapient::convert::{matrix_format, Placement, Role, Target};
use sapient::gpu::{GpuKv, GpuModel, GpuOptions};
use sapient::load::{LoadOptions, ModelFiles, Quantize};
use sapient::run::{self, CpuRunner};
use sapient_core::quant::Format;
use sapient_core::{KvFormat, Matrix, Model, Serial, Weights};
use sapient_tests::*;

/// Largest normalized mean squared error (Σ(gpu − cpu)² / Σcpu², as llama.cpp's
/// `test-backend-ops` measures) allowed between the backends' logits, with float weights and with
/// quantized ones. The GPU sums in another order (both quantize the inputs of Q8_0, Q4_0 and Q4_1
/// weights to Q16, but the GPU's f32 parts round differently). Measured on the fixtures
/// (lavapipe): at most 1.2e-11 with float weights, 1.9e-8 with quantized ones.
const MAX_NMSE_FLOAT: f64 = 1e-9;
const MAX_NMSE_QUANTIZED: f64 = 1e-6;
/// The same between the GPU's Q16 inputs and the CPU's f32 ones on the same weights (the CPU
/// multiplies k-quants with 8-bit Q8K inputs, further from both; compared on their exact f32
/// values instead): Q16 rounds each input by up to 1/65278 of its block's largest, which
/// SmolLM2's outlier channels make a larger share of the rest. Measured: at most 1.1e-6.
const MAX_NMSE_Q16_INPUTS: f64 = 1e-5;
/// The same with f16 KV caches on both, f32 weights: both round keys and values to f16, the same
/// f16 where their f32 values agree, but the backends' last-bit differences flip the rounding of
/// a value near the middle of two f16 steps to the other step, ~1e-3 of it. Measured on
/// lavapipe: at most 2.8e-8 (an f16 cache against an f32 one on the same backend: ~4.6e-7).
const MAX_NMSE_F16_KV: f64 = 1e-6;
/// The same with Q8_0 KV caches on both, f32 weights: both quantize keys and values as ggml does,
/// but a last-bit difference before quantizing moves a value near the middle of two steps by a
/// whole step (1/127 of its block's largest), and the CPU multiplies the keys by Q16 queries
/// where the GPU takes f32 ones. Measured on lavapipe: at most 5.7e-6.
const MAX_NMSE_Q8_0_KV: f64 = 5e-5;

fn gpu(model: &Model<'_>, max_binding_bytes: Option<u64>) -> Option<GpuModel> {
    gpu_with(
        model,
        GpuOptions {
            max_binding_bytes,
            ..GpuOptions::default()
        },
    )
}

/// The model on any adapter (a software one too), with `opts`' other choices.
fn gpu_with(model: &Model<'_>, opts: GpuOptions) -> Option<GpuModel> {
    let opts = GpuOptions {
        allow_software: true,
        ..opts
    };
    let g = GpuModel::new(model, &opts).expect("uploading the model");
    if g.is_none() {
        assert!(
            std::env::var_os("SAPIENT_REQUIRE_GPU").is_none(),
            "SAPIENT_REQUIRE_GPU is set but wgpu finds no adapter (install mesa-vulkan-drivers)"
        );
        eprintln!("SKIPPED: no GPU adapter (install mesa-vulkan-drivers for lavapipe)");
    }
    g
}

fn nmse(gpu: &[f32], cpu: &[f32]) -> f64 {
    let err: f64 = gpu
        .iter()
        .zip(cpu)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let norm: f64 = cpu.iter().map(|b| (*b as f64).powi(2)).sum();
    err / norm
}

/// The model with each matrix converted (from its f32 values) to the format `pick` gives it for
/// its role and layer.
fn converted(
    model: &Model<'_>,
    pick: impl Fn(Role, usize, &Matrix<'_>) -> Format,
) -> Model<'static> {
    let convert = |m: &Matrix<'_>, role: Role, layer: usize| {
        let format = pick(role, layer, m);
        let mut values = vec![0f32; m.rows * m.cols];
        for (r, row) in values.chunks_exact_mut(m.cols).enumerate() {
            m.dequantize_row(r, row).unwrap();
        }
        let q = Matrix::quantize(format, m.rows, m.cols, &values).unwrap();
        Matrix::new(format, m.rows, m.cols, Cow::Owned(q.bytes().to_vec())).unwrap()
    };
    let w = &model.weights;
    let weights = Weights {
        embed: convert(&w.embed, Role::TokenEmbedding, 0),
        layers: w
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| sapient_core::LayerWeights {
                attn_norm: l.attn_norm.to_vec().into(),
                wq: convert(&l.wq, Role::Other, i),
                wk: convert(&l.wk, Role::Other, i),
                wv: convert(&l.wv, Role::AttentionV, i),
                wo: convert(&l.wo, Role::Other, i),
                bq: l.bq.as_ref().map(|b| b.to_vec().into()),
                bk: l.bk.as_ref().map(|b| b.to_vec().into()),
                bv: l.bv.as_ref().map(|b| b.to_vec().into()),
                ffn_norm: l.ffn_norm.to_vec().into(),
                w_gate: convert(&l.w_gate, Role::Other, i),
                w_up: convert(&l.w_up, Role::Other, i),
                w_down: convert(&l.w_down, Role::FeedForwardDown, i),
            })
            .collect(),
        norm: w.norm.to_vec().into(),
        lm_head: w.lm_head.as_ref().map(|m| convert(m, Role::Output, 0)),
        rope_freq_factors: w.rope_freq_factors.as_ref().map(|f| f.to_vec().into()),
    };
    Model::new(model.config.clone(), weights).unwrap()
}

/// The model in llama-quantize's Q4_K_M mix: Q4_K, Q6_K for some V and down projections and
/// the output, Q5_0 and Q8_0 where rows are no whole number of super-blocks.
fn q4_k_m(model: &Model<'_>) -> Model<'static> {
    let (c, tied) = (&model.config, model.weights.lm_head.is_none());
    converted(model, |role, layer, m| {
        matrix_format(
            Target::Q4KM,
            Placement::in_model(c, tied, role, layer, m.cols),
        )
    })
}

/// Logits at every position and greedy continuations: GPU against CPU (with f32 KV caches).
fn compare(name: &str, model: &Model<'_>, g: &GpuModel, seqs: &[Vec<u32>], max_nmse: f64) -> f64 {
    compare_kv(name, model, g, seqs, max_nmse, KvFormat::F32)
}

/// As `compare`, the CPU's KV cache in `cpu_kv`.
fn compare_kv(
    name: &str,
    model: &Model<'_>,
    g: &GpuModel,
    seqs: &[Vec<u32>],
    max_nmse: f64,
    cpu_kv: KvFormat,
) -> f64 {
    let cpu = CpuRunner::new(model, cpu_kv, &Serial);
    let mut worst = 0f64;
    for seq in seqs {
        let want = run::logits(&cpu, seq, true).unwrap();
        let got = run::logits(g, seq, true).unwrap();
        assert_eq!(got.len(), seq.len());
        for (p, (a, b)) in got.iter().zip(&want).enumerate() {
            let e = nmse(a, b);
            assert!(e < max_nmse, "{name}: position {p}: NMSE {e:.2e}");
            worst = worst.max(e);
        }
        let greedy_cpu = run::greedy(&cpu, seq, 16, &[]).unwrap();
        let greedy_gpu = run::greedy(g, seq, 16, &[]).unwrap();
        assert_eq!(greedy_gpu, greedy_cpu, "{name}: greedy continuation");
    }
    worst
}

fn fixture_seqs(name: &str) -> Vec<Vec<u32>> {
    let r = read_json(&tiny(name).join("reference.json"));
    vec![ids(&r["inputs"]["seq7"]), ids(&r["inputs"]["seq40"])]
}

fn load(name: &str) -> ModelFiles {
    ModelFiles::open(&tiny(name), &LoadOptions::default()).unwrap()
}

#[test]
fn every_fixture_in_every_format_matches_the_cpu() {
    let names = tiny_names();
    assert!(names.len() >= 8, "fixtures: {names:?}");
    let mut compared = 0;
    for name in &names {
        let files = load(name);
        let model = files.model(Quantize::None).unwrap();
        let seqs = fixture_seqs(name);
        for format in [
            Format::F32,
            Format::F16,
            Format::BF16,
            Format::Q8_0,
            Format::Q4_0,
            Format::Q4_1,
        ] {
            if format.row_bytes(model.config.hidden_size).is_err()
                || format.row_bytes(model.config.intermediate_size).is_err()
            {
                continue;
            }
            let m = converted(&model, |_, _, _| format);
            let Some(g) = gpu(&m, None) else { return };
            let max_nmse = if format.is_quantized() {
                MAX_NMSE_QUANTIZED
            } else {
                MAX_NMSE_FLOAT
            };
            let worst = compare(&format!("{name} {format:?}"), &m, &g, &seqs, max_nmse);
            eprintln!("{name} {format:?}: worst NMSE {worst:.2e}");
            compared += 1;
        }
    }
    assert!(
        compared >= names.len() * 2,
        "compared {compared} model/format pairs"
    );
}

/// An f16 KV cache on the GPU against the CPU's f16 cache, every fixture with f32 weights.
#[test]
fn f16_kv_cache_matches_the_cpu() {
    let Some(compared) = kv_cache_matches_the_cpu(GpuKv::F16, KvFormat::F16, MAX_NMSE_F16_KV)
    else {
        return;
    };
    assert!(compared >= 8, "compared {compared} fixtures");
}

/// A Q8_0 KV cache on the GPU against the CPU's Q8_0 cache, every fixture whose heads are whole
/// blocks of 32, with f32 weights.
#[test]
fn q8_0_kv_cache_matches_the_cpu() {
    let Some(compared) = kv_cache_matches_the_cpu(GpuKv::Q8_0, KvFormat::Q8_0, MAX_NMSE_Q8_0_KV)
    else {
        return;
    };
    assert!(compared >= 6, "compared {compared} fixtures");
}

/// Every fixture whose heads `cpu`'s blocks fit, with f32 weights, the GPU's cache in `kv`
/// against the CPU's in `cpu`: the fixtures compared (`None` without an adapter).
fn kv_cache_matches_the_cpu(kv: GpuKv, cpu: KvFormat, max_nmse: f64) -> Option<usize> {
    let mut compared = 0;
    for name in tiny_names() {
        let files = load(&name);
        let model = files.model(Quantize::None).unwrap();
        if cpu.format().row_bytes(model.config.head_dim).is_err() {
            continue;
        }
        let opts = GpuOptions {
            kv,
            ..GpuOptions::default()
        };
        let g = gpu_with(&model, opts)?;
        let seqs = fixture_seqs(&name);
        let worst = compare_kv(&name, &model, &g, &seqs, max_nmse, cpu);
        eprintln!("{name}, {kv:?} KV: worst NMSE {worst:.2e}");
        compared += 1;
    }
    Some(compared)
}

/// Linear and YaRN RoPE scaling (YaRN's attention factor scales the angles the GPU reads), and
/// shapes the tiny fixtures lack (heads of 8, 24, 80 and 128, a feed-forward width of 200, a
/// window of 7), agree with the CPU, which agrees with transformers (`rope_scaling.rs`,
/// `shapes.rs`).
#[test]
fn scaled_rope_and_other_shapes_match_the_cpu() {
    let fixtures = [
        ("rope_scaling", "llama_linear_rope"),
        ("rope_scaling", "qwen2_yarn"),
        ("shapes", "llama_hd24_ff200"),
        ("shapes", "llama_hd80"),
        ("shapes", "qwen2_hd128"),
        ("shapes", "mistral_hd8_window7"),
    ];
    for (folder, name) in fixtures {
        let dir = more_fixture(folder, name);
        let files = ModelFiles::open(&dir, &LoadOptions::default()).unwrap();
        let model = files.model(Quantize::None).unwrap();
        let r = read_json(&dir.join("reference.json"));
        let seqs = vec![ids(&r["inputs"]["seq7"]), ids(&r["inputs"]["seq40"])];
        let Some(g) = gpu(&model, None) else { return };
        compare(name, &model, &g, &seqs, MAX_NMSE_FLOAT);
    }
}

/// Every matrix split into parts of at most 2 KiB (one binding each) gives the same bits.
#[test]
fn matrices_split_across_bindings_give_the_same_logits() {
    let files = load("llama_hd32");
    let model = files.model(Quantize::Auto).unwrap();
    let Some(whole) = gpu(&model, None) else {
        return;
    };
    let Some(split) = gpu(&model, Some(2048)) else {
        return;
    };
    let seq = &fixture_seqs("llama_hd32")[1];
    assert_eq!(
        run::logits(&split, seq, true).unwrap(),
        run::logits(&whole, seq, true).unwrap()
    );
}

/// Decoding after 300 positions splits attention over the context (and a sliding window limits
/// it): the GPU still agrees with the CPU.
#[test]
fn long_context_decoding_matches_the_cpu() {
    for name in ["llama", "mistral"] {
        let files = load(name);
        let model = files.model(Quantize::None).unwrap();
        let vocab = model.config.vocab_size as u32;
        let prompt: Vec<u32> = (0..300u32).map(|i| (i * 7919 + 13) % vocab).collect();
        let Some(g) = gpu(&model, None) else { return };
        let cpu = CpuRunner::new(&model, KvFormat::F32, &Serial);
        assert_eq!(
            run::greedy(&g, &prompt, 8, &[]).unwrap(),
            run::greedy(&cpu, &prompt, 8, &[]).unwrap(),
            "{name}"
        );
    }
}

/// SmolLM2-135M's Q4_1 GGUF: greedy 16 tokens of the reference prompts as on the CPU.
#[test]
fn smollm2_greedy_matches_the_cpu() {
    let files = ModelFiles::open(&smollm2_gguf(), &LoadOptions::default()).unwrap();
    let model = files.model(Quantize::Auto).unwrap();
    let Some(g) = gpu(&model, None) else { return };
    let cpu = CpuRunner::new(&model, KvFormat::F32, &Serial);
    let r = smollm2_reference();
    let prompts = r["prompts"].as_array().unwrap();
    assert!(!prompts.is_empty());
    for p in prompts {
        let prompt = ids(&p["ids"]);
        assert_eq!(
            run::greedy(&g, &prompt, 16, &[]).unwrap(),
            run::greedy(&cpu, &prompt, 16, &[]).unwrap(),
            "{}",
            p["prompt"]
        );
    }
}

/// A Q4_K_M mix, as people download them, stays in its blocks on the GPU (Q5_0 as Q5, Q4_K and
/// Q6_K in their super-blocks; Q|K|V of mixed formats share one) and agrees with the CPU:
/// every fixture (rows too short for k-quants: Q5_0 and Q8_0) and SmolLM2-135M (Q4_K and Q6_K
/// down projections; its logits and greedy tokens for two reference prompts against the CPU on
/// the same values in f32).
#[test]
fn q4_k_m_mixes_match_the_cpu() {
    for name in tiny_names() {
        let files = load(&name);
        let model = q4_k_m(&files.model(Quantize::None).unwrap());
        let Some(g) = gpu(&model, None) else { return };
        let worst = compare(&name, &model, &g, &fixture_seqs(&name), MAX_NMSE_QUANTIZED);
        eprintln!("{name} Q4_K_M: worst NMSE {worst:.2e}");
    }
    let files = ModelFiles::open(&smollm2_gguf(), &LoadOptions::default()).unwrap();
    let model = q4_k_m(&files.model(Quantize::Auto).unwrap());
    let Some(g) = gpu(&model, None) else { return };
    assert!(
        g.summary()
            .contains("MiB of weights (Q4_K, Q5, Q6_K, Q8_0)"),
        "{}",
        g.summary()
    );
    let exact = converted(&model, |_, _, _| Format::F32);
    let prompts: Vec<Vec<u32>> = smollm2_reference()["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .take(2)
        .map(|p| ids(&p["ids"]))
        .collect();
    let worst = compare("SmolLM2 Q4_K_M", &exact, &g, &prompts, MAX_NMSE_Q16_INPUTS);
    eprintln!("SmolLM2 Q4_K_M: worst NMSE {worst:.2e}");
}

/// A GPU session of several KV slots, driven as `sapient serve` drives it: sequences join at
/// different steps, prefill chunks and single decode tokens share forward passes, slots are used
/// out of order, and a slot cut back (a cached prompt start) continues. Every sequence gets the
/// logits (within the float tolerance) and the greedy tokens it gets alone, with f32 and with
/// Q8_0 KV caches.
#[test]
fn slots_share_forward_passes_as_each_sequence_alone() {
    for kv in [GpuKv::F32, GpuKv::Q8_0] {
        slots_as_alone(kv);
    }
}

fn slots_as_alone(kv: GpuKv) {
    use sapient::gpu::GpuSession;
    use sapient::run::Runner;
    use sapient_core::sample::argmax;
    use sapient_core::Want;

    let files = load("qwen2");
    let model = files.model(Quantize::Auto).unwrap();
    let opts = GpuOptions {
        kv,
        ..GpuOptions::default()
    };
    let Some(g) = gpu_with(&model, opts) else {
        return;
    };
    let vocab = model.config.vocab_size;
    let seqs = fixture_seqs("qwen2");
    let prompts = [&seqs[0][..5], &seqs[1][..9], &seqs[0][2..5]];
    let decoded = 6;
    // Alone: each prompt, then greedy tokens, one session each.
    let alone: Vec<(Vec<u32>, Vec<Vec<f32>>)> = prompts
        .iter()
        .map(|p| {
            g.with_session(32, 16, |s| {
                let (mut tokens, mut all) = (Vec::new(), Vec::new());
                let mut logits = vec![0f32; vocab];
                s.forward(p, Want::LastLogits(&mut logits))?;
                for _ in 0..decoded {
                    all.push(logits.clone());
                    let t = argmax(&logits);
                    tokens.push(t);
                    s.forward(&[t], Want::LastLogits(&mut logits))?;
                }
                Ok((tokens, all))
            })
            .unwrap()
        })
        .collect();

    let mut session = GpuSession::with_slots(&g, 3, 32, 16).unwrap();
    let slot_of = [2, 0, 1];
    let start = [0, 1, 3];
    let mut fed: Vec<Vec<u32>> = vec![Vec::new(); 3];
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); 3];
    let mut logits = vec![vec![0f32; vocab]; 3];
    for step in 0..start[2] + decoded {
        let live: Vec<usize> = (0..3)
            .filter(|&s| step >= start[s] && got[s].len() < decoded)
            .collect();
        let inputs: Vec<Vec<u32>> = live
            .iter()
            .map(|&s| match got[s].last() {
                None => prompts[s].to_vec(),
                Some(&t) => vec![t],
            })
            .collect();
        let refs: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
        let slots: Vec<usize> = live.iter().map(|&s| slot_of[s]).collect();
        let mut outs: Vec<&mut [f32]> = Vec::new();
        for (s, l) in logits.iter_mut().enumerate() {
            if live.contains(&s) {
                outs.push(l);
            }
        }
        let mut wants: Vec<Want<'_>> = outs.into_iter().map(Want::LastLogits).collect();
        session.forward_slots(&slots, &refs, &mut wants).unwrap();
        for (&s, input) in live.iter().zip(&inputs) {
            fed[s].extend_from_slice(input);
            let k = got[s].len();
            let e = nmse(&logits[s], &alone[s].1[k]);
            assert!(
                e < MAX_NMSE_FLOAT,
                "{kv:?}: sequence {s} token {k}: NMSE {e:.2e}"
            );
            got[s].push(argmax(&logits[s]));
        }
    }
    for s in 0..3 {
        assert_eq!(got[s], alone[s].0, "{kv:?}: sequence {s}: greedy tokens");
        assert_eq!(session.slot_len(slot_of[s]), fed[s].len());
    }
    // A prompt that starts as sequence 0 did: its slot cut back, only the rest run.
    let kept = prompts[0].len() - 2;
    session.truncate_slot(slot_of[0], kept);
    let mut again = vec![0f32; vocab];
    session
        .forward_slots(
            &[slot_of[0]],
            &[&prompts[0][kept..]],
            &mut [Want::LastLogits(&mut again)],
        )
        .unwrap();
    let e = nmse(&again, &alone[0].1[0]);
    assert!(e < MAX_NMSE_FLOAT, "a cut-back slot: NMSE {e:.2e}");
    assert!(session
        .forward_slots(&[0, 0], &[&[1], &[1]], &mut [Want::Nothing, Want::Nothing])
        .is_err());
    assert!(session
        .forward_slots(&[3], &[&[1]], &mut [Want::Nothing])
        .is_err());
}

/// `bench --profile`'s kernel times: every dispatch of a decoded token is timed once under its
/// step's name, and the CPU backend says it has none.
#[test]
fn kernel_times_count_every_dispatch() {
    use sapient::run::Runner;
    use sapient_core::Want;

    let files = load("llama");
    let model = files.model(Quantize::Auto).unwrap();
    let cpu = CpuRunner::new(&model, KvFormat::F32, &Serial);
    let err = cpu.with_session(8, 8, |s| s.time_kernels()).unwrap_err();
    assert!(err.to_string().contains("GPU backend"), "{err}");
    let Some(g) = gpu(&model, None) else { return };
    let layers = model.config.n_layers as u64;
    let prompt: Vec<u32> = fixture_seqs("llama")[0][..5].to_vec();
    let decoded = 3u64;
    g.with_session(16, 8, |s| {
        s.time_kernels()?;
        let mut logits = vec![0f32; model.config.vocab_size];
        s.forward(&prompt, Want::LastLogits(&mut logits))?;
        let prefill = s.take_kernel_times();
        assert!(prefill
            .kernels
            .iter()
            .any(|k| k.kernel == "qkv" && k.calls == layers));
        for t in 0..decoded as u32 {
            s.forward(&[t], Want::LastLogits(&mut logits))?;
        }
        let decode = s.take_kernel_times();
        let calls = |name: &str| {
            let k = decode.kernels.iter().find(|k| k.kernel == name);
            k.map_or(0, |k| k.calls)
        };
        for step in ["qkv", "attention", "attn_out", "gate_up", "down"] {
            assert_eq!(calls(step), layers * decoded, "{step}");
        }
        for step in ["embed", "final_norm", "logits"] {
            assert_eq!(calls(step), decoded, "{step}");
        }
        let all: u64 = decode.kernels.iter().map(|k| k.calls).sum();
        assert_eq!(all, decoded * s.dispatches_per_token().unwrap() as u64);
        assert_eq!(decode.untimed, 0);
        assert!(decode.kernels.iter().map(|k| k.nanos).sum::<f64>() > 0.0);
        assert!(decode.span_nanos > 0.0);
        assert!(decode.host_nanos > 0.0);
        Ok(())
    })
    .unwrap();
}
