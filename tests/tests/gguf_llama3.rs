//! A Llama 3.1-style GGUF: the `llama3_rope` fixture written by `scripts/hf-to-gguf.py` as
//! llama.cpp's converter writes it (Q/K rows permuted, RoPE scaling as `rope_freqs.weight`
//! frequency factors) matches transformers' float32 outputs of the checkpoint at f32 tolerance.
use std::path::Path;

use sapient::load::{LoadOptions, ModelFiles, Quantize};
use sapient::run::{self, CpuRunner};
use sapient_core::{KvFormat, Serial};
use sapient_tests::*;

/// As the golden tests' f32 tolerance: the factors differ from transformers' scaled frequencies
/// only in the last bits of a division.
const F32_TOL: f32 = 2e-4;

fn data() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/llama3_rope.gguf")
}

#[test]
fn rope_freq_factors_match_transformers_llama3_scaling() {
    let files = ModelFiles::open(&data(), &LoadOptions::default()).unwrap();
    let model = files.model(Quantize::None).unwrap();
    assert!(model.weights.rope_freq_factors.is_some());
    let r = read_json(&tiny("llama3_rope").join("reference.json"));
    let runner = CpuRunner::new(&model, KvFormat::F32, &Serial);
    let mut compared = 0;
    for seq in ["seq7", "seq40"] {
        let prompt = ids(&r["inputs"][seq]);
        let out = &r["outputs"][seq];
        let all = run::logits(&runner, &prompt, true).unwrap();
        for (p, (ours, theirs)) in all
            .iter()
            .zip(out["all_logits"].as_array().into_iter().flatten())
            .enumerate()
        {
            let d = max_abs_diff(ours, &floats(theirs));
            assert!(d < F32_TOL, "{seq} position {p}: logits differ by {d}");
            compared += 1;
        }
        let last = run::logits(&runner, &prompt, false).unwrap();
        let d = max_abs_diff(&last[0], &floats(&out["last_logits"]));
        assert!(d < F32_TOL, "{seq}: last logits differ by {d}");
        compared += 1;
        let greedy = run::greedy(&runner, &prompt, 16, &[]).unwrap();
        assert_eq!(greedy, ids(&out["greedy16"]), "{seq}: greedy");
    }
    assert!(compared >= 8, "compared {compared} rows of logits");
}

/// Without its factors the same file gives other logits: the test above depends on them.
#[test]
fn the_factors_matter() {
    let files = ModelFiles::open(&data(), &LoadOptions::default()).unwrap();
    let mut model = files.model(Quantize::None).unwrap();
    let r = read_json(&tiny("llama3_rope").join("reference.json"));
    let prompt = ids(&r["inputs"]["seq40"]);
    model.weights.rope_freq_factors = None;
    let plain = sapient_core::Model::new(model.config.clone(), model.weights).unwrap();
    let last = run::logits(
        &CpuRunner::new(&plain, KvFormat::F32, &Serial),
        &prompt,
        false,
    )
    .unwrap();
    let d = max_abs_diff(&last[0], &floats(&r["outputs"]["seq40"]["last_logits"]));
    assert!(d > 0.1, "logits without the factors differ by only {d}");
}
