//! Linear and YaRN RoPE scaling against transformers: the `rope_scaling` fixtures (a Llama with
//! linear scaling, a Qwen2 with YaRN and non-default betas) in both config layouts, read as
//! Hugging Face checkpoints and again from the GGUF `sapient quantize` writes of them.
use std::path::PathBuf;

use sapient::convert::{write_model, Target};
use sapient::load::{LoadOptions, ModelFiles, Quantize};
use sapient_core::{KvFormat, Model, RopeScaling};
use sapient_tests::*;
use serde_json::Value;

const FIXTURES: [&str; 2] = ["llama_linear_rope", "qwen2_yarn"];

/// The frequencies and the attention factor are transformers' (`rope.inv_freq`,
/// `rope.attention_scaling` in the reference), each within a float32 rounding.
fn check_rope_tables(what: &str, model: &Model<'_>, r: &Value) {
    let theirs = floats(&r["rope"]["inv_freq"]);
    let ours = model.inv_freq();
    assert_eq!(ours.len(), theirs.len(), "{what}: frequencies");
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert!(
            (a - b).abs() <= b.abs() * 2.5e-7,
            "{what}: inv_freq[{i}] {a} against transformers' {b}"
        );
    }
    let factor = r["rope"]["attention_scaling"].as_f64().unwrap() as f32;
    assert_eq!(
        model.config.rope_attention_factor(),
        factor,
        "{what}: attention factor"
    );
}

#[test]
fn scaled_rope_matches_transformers() {
    for name in FIXTURES {
        let dir = more_fixture("rope_scaling", name);
        let r = read_json(&dir.join("reference.json"));
        for config in ["config.json", "config.v4.json"] {
            let files = open_checkpoint(&dir, config, Quantize::None);
            let model = files.model(Quantize::None).unwrap();
            let what = format!("{name}/{config}");
            assert!(
                model.config.rope_scaling.is_some(),
                "{what}: no scaling read"
            );
            check_rope_tables(&what, &model, &r);
            check_f32_against_reference(&what, &model, &r);
        }
    }
}

/// Without its scaling the same checkpoint gives other logits: the test above depends on it.
#[test]
fn the_scaling_matters() {
    for name in FIXTURES {
        let dir = more_fixture("rope_scaling", name);
        let r = read_json(&dir.join("reference.json"));
        let files = open_checkpoint(&dir, "config.json", Quantize::None);
        let model = files.model(Quantize::None).unwrap();
        let mut config = model.config.clone();
        config.rope_scaling = None;
        let plain = Model::new(config, model.weights).unwrap();
        let prompt = ids(&r["inputs"]["seq40"]);
        let d = max_abs_diff(
            &last_logits(&plain, KvFormat::F32, &prompt),
            &floats(&r["outputs"]["seq40"]["last_logits"]),
        );
        assert!(
            d > 100.0 * F32_TOL,
            "{name}: unscaled RoPE moves the logits by only {d}"
        );
    }
}

fn temp_gguf(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sapient-rope-scaling-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{name}.gguf"))
}

/// `sapient quantize` writes the scaling as llama.cpp's `rope.scaling.*` keys, and the file reads
/// back with the same scaling, the same tables, and logits within what f16 weights move them.
#[test]
fn scaling_survives_the_gguf_round_trip() {
    for name in FIXTURES {
        let dir = more_fixture("rope_scaling", name);
        let r = read_json(&dir.join("reference.json"));
        let files = open_checkpoint(&dir, "config.json", Quantize::None);
        let model = files.model(Quantize::None).unwrap();
        let out = temp_gguf(name);
        write_model(&files, &model, &out, Target::F16, &|_, _| {}, &mut |_| {}).unwrap();
        let gguf = ModelFiles::open(&out, &LoadOptions::default()).unwrap();
        let back = gguf.model(Quantize::None).unwrap();
        let kind = match model.config.rope_scaling {
            Some(RopeScaling::Linear { .. }) => "linear",
            Some(RopeScaling::Yarn(_)) => "yarn",
            other => panic!("{name}: unexpected scaling {other:?}"),
        };
        let g = gguf.gguf().unwrap();
        let arch = g.str("general.architecture").unwrap();
        assert_eq!(
            g.str(&format!("{arch}.rope.scaling.type")),
            Some(kind),
            "{name}"
        );
        assert_eq!(
            back.config.rope_scaling, model.config.rope_scaling,
            "{name}"
        );
        check_rope_tables(&format!("{name}.gguf"), &back, &r);
        let prompt = ids(&r["inputs"]["seq40"]);
        let d = max_abs_diff(
            &last_logits(&back, KvFormat::F32, &prompt),
            &floats(&r["outputs"]["seq40"]["last_logits"]),
        );
        // f16 weights against f32 ones: the golden tests measured 0.0051 on qwen2_f16.
        assert!(d < 0.02, "{name}.gguf: last logits differ by {d}");
        std::fs::remove_file(&out).unwrap();
    }
}
