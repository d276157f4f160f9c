//! Shapes the tiny fixtures do not have (`tests/fixtures/shapes`, made by transformers through
//! `make_more_fixtures.py`): heads of 8, 24, 80 and 128 values, one KV head for several query
//! heads, a feed-forward width and a vocabulary that are no multiple of 32, a sliding window of 7.
//! Each against transformers in f32 (both config layouts), with the default Q8_0 weights, and
//! from the GGUF `sapient quantize` writes of it.
use sapient::convert::{write_model, Target};
use sapient::load::{LoadOptions, ModelFiles, Quantize};
use sapient::run::{self, CpuRunner};
use sapient_core::{KvFormat, Serial};
use sapient_tests::*;

const FIXTURES: [&str; 4] = [
    "llama_hd24_ff200",
    "llama_hd80",
    "qwen2_hd128",
    "mistral_hd8_window7",
];

#[test]
fn other_shapes_match_transformers() {
    for name in FIXTURES {
        let dir = more_fixture("shapes", name);
        let r = read_json(&dir.join("reference.json"));
        for config in ["config.json", "config.v4.json"] {
            let files = open_checkpoint(&dir, config, Quantize::None);
            let model = files.model(Quantize::None).unwrap();
            check_f32_against_reference(&format!("{name}/{config}"), &model, &r);
        }
    }
}

/// The default load (Q8_0 where rows are whole blocks, the default KV cache) stays as close to
/// transformers as the golden tests require of the tiny fixtures: cosine 0.995 or more at every
/// position of seq7 and the last of seq40.
#[test]
fn other_shapes_stay_close_with_default_weights() {
    for name in FIXTURES {
        let dir = more_fixture("shapes", name);
        let r = read_json(&dir.join("reference.json"));
        let files = open_checkpoint(&dir, "config.json", Quantize::Auto);
        let model = files.model(Quantize::Auto).unwrap();
        let kv = KvFormat::default_for(&model.config);
        let runner = CpuRunner::new(&model, kv, &Serial);
        let seq7 = ids(&r["inputs"]["seq7"]);
        let all = run::logits(&runner, &seq7, true).unwrap();
        let theirs = r["outputs"]["seq7"]["all_logits"].as_array().unwrap();
        for (p, (ours, theirs)) in all.iter().zip(theirs).enumerate() {
            let c = cosine(ours, &floats(theirs));
            assert!(c >= 0.995, "{name}: seq7 position {p}: cosine {c}");
        }
        let seq40 = ids(&r["inputs"]["seq40"]);
        let c = cosine(
            &last_logits(&model, kv, &seq40),
            &floats(&r["outputs"]["seq40"]["last_logits"]),
        );
        assert!(c >= 0.995, "{name}: seq40: cosine {c}");
    }
}

/// `sapient quantize` to f16 and back: Llama's Q/K rows permuted for heads of 24 and 80, the
/// window and the untied output kept; logits within what f16 weights move them.
#[test]
fn other_shapes_survive_the_gguf_round_trip() {
    let tmp = std::env::temp_dir().join(format!("sapient-shapes-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    for name in FIXTURES {
        let dir = more_fixture("shapes", name);
        let r = read_json(&dir.join("reference.json"));
        let files = open_checkpoint(&dir, "config.json", Quantize::None);
        let model = files.model(Quantize::None).unwrap();
        let out = tmp.join(format!("{name}.gguf"));
        write_model(&files, &model, &out, Target::F16, &|_, _| {}, &mut |_| {}).unwrap();
        let back = ModelFiles::open(&out, &LoadOptions::default()).unwrap();
        let back = back.model(Quantize::None).unwrap();
        let (a, b) = (&back.config, &model.config);
        assert_eq!(
            (
                a.head_dim,
                a.n_kv_heads,
                a.sliding_window,
                a.tie_word_embeddings
            ),
            (
                b.head_dim,
                b.n_kv_heads,
                b.sliding_window,
                b.tie_word_embeddings
            ),
            "{name}"
        );
        let seq40 = ids(&r["inputs"]["seq40"]);
        let d = max_abs_diff(
            &last_logits(&back, KvFormat::F32, &seq40),
            &floats(&r["outputs"]["seq40"]["last_logits"]),
        );
        // f16 weights against f32 ones: the golden tests measured 0.0051 on qwen2_f16.
        assert!(d < 0.02, "{name}.gguf: last logits differ by {d}");
        std::fs::remove_file(&out).unwrap();
    }
}
