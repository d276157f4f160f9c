//! Shared helpers of the golden tests: where the fixtures are and how to read their references.
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The repository's `tests/fixtures`, or `$SAPIENT_FIXTURES`.
pub fn fixtures() -> PathBuf {
    if let Ok(p) = std::env::var("SAPIENT_FIXTURES") {
        return PathBuf::from(p);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

pub fn tiny(name: &str) -> PathBuf {
    fixtures().join("tiny").join(name)
}

/// A checkpoint made by `tests/fixtures/make_more_fixtures.py` under `folder` (`rope_scaling`,
/// `shapes`): in the repository, not among the shared fixtures, so never under
/// `$SAPIENT_FIXTURES`.
pub fn more_fixture(folder: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(folder)
        .join(name)
}

pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The names of the tiny fixtures, from `index.json`.
pub fn tiny_names() -> Vec<String> {
    let index = read_json(&fixtures().join("tiny/index.json"));
    let mut names: Vec<String> = index["fixtures"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    names.sort();
    // Every loop over the fixtures would pass vacuously on an empty index.
    assert!(
        names.len() >= 8,
        "only {} fixtures in index.json",
        names.len()
    );
    names
}

pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// The checkpoint in `dir` with the config file `config` beside it (`config.json`,
/// `config.v4.json`), loaded as the CLI loads it.
pub fn open_checkpoint(
    dir: &Path,
    config: &str,
    quantize: sapient::load::Quantize,
) -> sapient::load::ModelFiles {
    let opts = sapient::load::LoadOptions {
        quantize,
        config_file: Some(dir.join(config)),
    };
    sapient::load::ModelFiles::open(dir, &opts)
        .unwrap_or_else(|e| panic!("{}/{config}: {e:#}", dir.display()))
}

/// The last position's logits of `prompt`, on one thread with a `kv` cache.
pub fn last_logits(
    model: &sapient_core::Model<'_>,
    kv: sapient_core::KvFormat,
    prompt: &[u32],
) -> Vec<f32> {
    let runner = sapient::run::CpuRunner::new(model, kv, &sapient_core::Serial);
    sapient::run::logits(&runner, prompt, false)
        .unwrap()
        .remove(0)
}

/// transformers' float32 numbers up to summation order: the tolerance of f32 weights with an
/// f32 KV cache.
pub const F32_TOL: f32 = 2e-4;

/// `model` (f32 weights, an f32 KV cache) against a fixture's `reference.json`: every position's
/// logits of seq7, the last of seq40 (within `F32_TOL`), and both greedy continuations.
pub fn check_f32_against_reference(what: &str, model: &sapient_core::Model<'_>, r: &Value) {
    use sapient::run::{self, CpuRunner};
    use sapient_core::{KvFormat, Serial};
    let runner = CpuRunner::new(model, KvFormat::F32, &Serial);
    let seq7 = ids(&r["inputs"]["seq7"]);
    let all = run::logits(&runner, &seq7, true).unwrap();
    let theirs = r["outputs"]["seq7"]["all_logits"].as_array().unwrap();
    assert_eq!(all.len(), theirs.len(), "{what}: positions");
    for (p, (ours, theirs)) in all.iter().zip(theirs).enumerate() {
        let d = max_abs_diff(ours, &floats(theirs));
        assert!(
            d < F32_TOL,
            "{what}: seq7 position {p} logits differ by {d}"
        );
    }
    for seq in ["seq7", "seq40"] {
        let prompt = ids(&r["inputs"][seq]);
        let out = &r["outputs"][seq];
        let last = run::logits(&runner, &prompt, false).unwrap();
        let d = max_abs_diff(&last[0], &floats(&out["last_logits"]));
        assert!(d < F32_TOL, "{what}: {seq} last logits differ by {d}");
        let greedy = run::greedy(&runner, &prompt, 16, &[]).unwrap();
        assert_eq!(greedy, ids(&out["greedy16"]), "{what}: {seq} greedy");
    }
}

/// SmolLM2-135M-Instruct's Q4_1 GGUF, as `scripts/fetch-model.sh` leaves it (or `$SAPIENT_SMOLLM2`).
pub fn smollm2_gguf() -> PathBuf {
    if let Ok(p) = std::env::var("SAPIENT_SMOLLM2") {
        return PathBuf::from(p);
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-model.sh (scripts/test.sh does)",
        p.display()
    );
    p
}

pub fn smollm2_reference() -> Value {
    read_json(&fixtures().join("smollm2/reference.json"))
}

/// llama.cpp's `models/` directory (vocabulary-only GGUFs and their tokenizer tests), where
/// `scripts/fetch-llama-cpp.sh` puts the source (`$SAPIENT_LLAMA_CPP_SRC`, or its default cache).
pub fn llama_cpp_models() -> Option<PathBuf> {
    match std::env::var("SAPIENT_LLAMA_CPP_SRC") {
        Ok(src) => Some(PathBuf::from(src).join("models")),
        Err(_) => {
            let home = std::env::var("HOME").ok()?;
            let dir = PathBuf::from(home).join(".cache/sapient/llama.cpp/src-0.3.36/models");
            dir.is_dir().then_some(dir)
        }
    }
}

/// The directory where `scripts/fetch-tekken-vocab.sh` makes a Tekken vocabulary and its cases
/// (`$SAPIENT_TEKKEN_VOCAB`, or its default cache).
pub fn tekken_vocab() -> Option<PathBuf> {
    match std::env::var("SAPIENT_TEKKEN_VOCAB") {
        Ok(dir) => Some(PathBuf::from(dir)),
        Err(_) => {
            let home = std::env::var("HOME").ok()?;
            let dir = PathBuf::from(home).join(".cache/sapient/tekken");
            dir.join("ggml-vocab-tekken.gguf.out")
                .is_file()
                .then_some(dir)
        }
    }
}

/// llama.cpp's `test-tokenizer-0` cases of vocabulary `name` (`ggml-vocab-NAME.gguf.inp` and
/// `.out` in `dir`): each input text and the ids llama.cpp gives it.
pub fn llama_cpp_vocab_cases(dir: &Path, name: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.inp"))).unwrap();
    let out = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.out"))).unwrap();
    let mut inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    // The file ends with a separator, which llama.cpp's reader does not count as a case.
    if inputs.last() == Some(&"") {
        inputs.pop();
    }
    let outputs: Vec<&str> = out.lines().collect();
    assert_eq!(inputs.len(), outputs.len(), "{name}: cases");
    inputs
        .into_iter()
        .zip(outputs)
        .map(|(i, o)| {
            let ids = o.split_whitespace().map(|t| t.parse().unwrap()).collect();
            (i.to_owned(), ids)
        })
        .collect()
}
