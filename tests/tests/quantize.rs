//! `sapient quantize` (`convert::write_model`): what it writes loads back as the same model in
//! the formats it chose; a GGUF's own formats are kept bit for bit; Q4_K_M mixes as
//! llama-quantize does; a Hugging Face `tokenizer.json` becomes the metadata llama.cpp writes.
use std::path::{Path, PathBuf};

use sapient::convert::vocab::hf_tokenizer_metadata;
use sapient::convert::{llama3_factors, matrix_format, write_model, Placement, Role, Target};
use sapient::load::gguf::{Gguf, Value};
use sapient::load::{LoadOptions, ModelFiles, Quantize};
use sapient::run::{self, CpuRunner};
use sapient::tokenizer::Tokenizer;
use sapient_core::weights::Matrix;
use sapient_core::{KvFormat, Model, RopeScaling, RopeStyle, Serial};
use sapient_tests::*;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sapient-quantize-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(files: &ModelFiles, out: &Path, target: Target) {
    let model = files.model(Quantize::AsStored).unwrap();
    let mut warnings = Vec::new();
    write_model(files, &model, out, target, &|_, _| {}, &mut |w| {
        warnings.push(w)
    })
    .unwrap();
}

fn open(path: &Path) -> ModelFiles {
    ModelFiles::open(path, &LoadOptions::default()).unwrap()
}

fn gguf(path: &Path) -> Gguf {
    Gguf::parse(&std::fs::read(path).unwrap()).unwrap()
}

fn all_logits(model: &Model<'_>, prompt: &[u32]) -> Vec<Vec<f32>> {
    run::logits(&CpuRunner::new(model, KvFormat::F32, &Serial), prompt, true).unwrap()
}

/// `matrix` in `format`, from its values (what the writer does to a matrix, in memory), its rows
/// in adjacent-pair order for heads of `permute` rows where given.
fn converted(matrix: &Matrix<'_>, format: Format, permute: Option<usize>) -> Matrix<'static> {
    let mut values = vec![0f32; matrix.rows * matrix.cols];
    for (r, row) in values.chunks_exact_mut(matrix.cols).enumerate() {
        let source = match permute {
            Some(hd) => r / hd * hd + (r % hd % 2) * (hd / 2) + r % hd / 2,
            None => r,
        };
        matrix.dequantize_row(source, row).unwrap();
    }
    Matrix::quantize(format, matrix.rows, matrix.cols, &values).unwrap()
}

use sapient_core::Format;

/// The fixture's model with every matrix converted as `target` says, in memory: a `llama`
/// checkpoint's Q/K rows permuted to adjacent pairs, as its GGUF has them.
fn expected<'f>(files: &'f ModelFiles, target: Target) -> Model<'f> {
    let model = files.model(Quantize::None).unwrap();
    let (mut c, mut w) = (model.config.clone(), model.weights);
    let permute =
        (files.arch != "qwen2" && c.rope_style == RopeStyle::Halves).then_some(c.head_dim);
    if permute.is_some() {
        c.rope_style = RopeStyle::Adjacent;
    }
    let tied = w.lm_head.is_none();
    let f = |m: &Matrix<'_>, role: Role, layer: usize, heads: Option<usize>| {
        let at = Placement::in_model(&c, tied, role, layer, m.cols);
        converted(m, matrix_format(target, at), heads)
    };
    w.embed = f(&w.embed, Role::TokenEmbedding, 0, None);
    for (i, l) in w.layers.to_mut().iter_mut().enumerate() {
        l.wq = f(&l.wq, Role::Other, i, permute);
        l.wk = f(&l.wk, Role::Other, i, permute);
        l.wv = f(&l.wv, Role::AttentionV, i, None);
        l.wo = f(&l.wo, Role::Other, i, None);
        l.w_gate = f(&l.w_gate, Role::Other, i, None);
        l.w_up = f(&l.w_up, Role::Other, i, None);
        l.w_down = f(&l.w_down, Role::FeedForwardDown, i, None);
    }
    if let Some(out) = &w.lm_head {
        w.lm_head = Some(f(out, Role::Output, 0, None));
    }
    // Llama 3 scaling travels as the frequency factors llama.cpp's converter computes.
    if let Some(RopeScaling::Llama3(s)) = c.rope_scaling {
        c.rope_scaling = None;
        w.rope_freq_factors = Some(llama3_factors(c.rope_theta, c.head_dim, s).into());
    }
    Model::new(c, w).unwrap()
}

/// Every fixture written in every target reads back as the same model in those formats, its
/// layout and RoPE as the GGUF holds them: the same logits, bit for bit.
#[test]
fn fixtures_read_back_as_the_same_model() {
    let dir = temp_dir("fixtures");
    for name in tiny_names() {
        let files = open(&tiny(&name));
        let r = read_json(&tiny(&name).join("reference.json"));
        let seq40 = ids(&r["inputs"]["seq40"]);
        for target in [
            Target::F16,
            Target::Q8_0,
            Target::Q4_0,
            Target::Q4_1,
            Target::Q4KM,
        ] {
            let out = dir.join(format!("{name}-{target:?}.gguf"));
            write(&files, &out, target);
            let back_files = open(&out);
            let back = back_files.model(Quantize::None).unwrap();
            let want_model = expected(&files, target);
            let (got, want) = (all_logits(&back, &seq40), all_logits(&want_model, &seq40));
            for (p, (g, w)) in got.iter().zip(&want).enumerate() {
                let d = max_abs_diff(g, w);
                assert!(d == 0.0, "{name} {target:?}: position {p} differs by {d}");
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// SmolLM2's Q4_1 file written as q4_1 keeps every tensor's bytes (its Q8_0 tied embedding is
/// what llama-quantize gives an output matrix of 576-wide rows), so the model is the same, bit
/// for bit, tokenizer and template included; as q4_k_m it mixes as llama-quantize does.
#[test]
fn smollm2_gguf_keeps_its_formats_and_mixes_q4_k_m() {
    let dir = temp_dir("smollm2");
    let files = open(&smollm2_gguf());
    let out = dir.join("q4_1.gguf");
    write(&files, &out, Target::Q4_1);
    let (src, dst) = (files.gguf().unwrap(), gguf(&out));
    for (name, t) in &src.tensors {
        assert_eq!(dst.tensors[name].ggml_type, t.ggml_type, "{name}");
    }
    assert_eq!(dst.tensors.len(), src.tensors.len());
    for key in [
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "tokenizer.chat_template",
    ] {
        assert_eq!(dst.get(key), src.get(key), "{key}");
    }
    let prompt = [1, 504, 3458, 282, 4649, 314];
    let source = files.model(Quantize::Auto).unwrap();
    let back_files = open(&out);
    let back = back_files.model(Quantize::Auto).unwrap();
    assert_eq!(all_logits(&source, &prompt), all_logits(&back, &prompt));

    let out = dir.join("q4_k_m.gguf");
    write(&files, &out, Target::Q4KM);
    let mut counts = std::collections::BTreeMap::new();
    for t in gguf(&out).tensors.values() {
        *counts.entry(t.ggml_type.name()).or_insert(0) += 1;
    }
    let want = [
        ("f32", 61),
        ("q4_K", 16),
        ("q5_0", 166),
        ("q6_K", 14),
        ("q8_0", 15),
    ];
    assert_eq!(counts, want.into_iter().collect());
    let back_files = open(&out);
    let back = back_files.model(Quantize::Auto).unwrap();
    let tok = Tokenizer::load(&back_files).unwrap();
    let ids = tok.encode("The capital of France is").unwrap();
    let text = run::greedy(&CpuRunner::new(&back, KvFormat::F32, &Serial), &ids, 4, &[]).unwrap();
    assert_eq!(tok.decode(&text, true).unwrap(), " Paris.\n\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// FNV-1a 64, as `scripts/gguf-tensor-hashes.py` hashes a tensor's bytes.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// SmolLM2's Q4_1 file as iq4_xs and as q5_k_m is the file `llama-quantize
/// --allow-requantize` makes (llama.cpp 0.3.36), tensor for tensor, bit for bit (its types and
/// hashes in `tests/data/smollm2_*_tensors.json`, by `scripts/gguf-tensor-hashes.py`). IQ4_XS:
/// IQ4_XS for the 1536-wide rows, its IQ4_NL fallback for the 576-wide ones, Q5_K for the first
/// eighth's down projections; Q5_K_M: Q5_K, Q6_K for some V and down projections, Q5_1 for the
/// 576-wide rows; both Q8_0 for the tied output. And both still know the capital of France.
#[test]
fn smollm2_iq4_xs_and_q5_k_m_are_the_files_llama_quantize_makes() {
    for (target, record) in [
        (Target::IQ4XS, "smollm2_iq4_xs_tensors.json"),
        (Target::Q5KM, "smollm2_q5_k_m_tensors.json"),
    ] {
        is_the_file_llama_quantize_makes(target, record);
    }
}

fn is_the_file_llama_quantize_makes(target: Target, record: &str) {
    let dir = temp_dir(&format!("{target:?}"));
    let files = open(&smollm2_gguf());
    let out = dir.join("out.gguf");
    write(&files, &out, target);
    let want = read_json(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("data")
            .join(record),
    );
    let bytes = std::fs::read(&out).unwrap();
    let written = Gguf::parse(&bytes).unwrap();
    assert_eq!(written.tensors.len(), want.as_object().unwrap().len());
    for (name, t) in &written.tensors {
        let w = &want[name.as_str()];
        let ty = w[0]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: not in llama-quantize's file"));
        assert!(
            t.ggml_type.name().eq_ignore_ascii_case(ty),
            "{name}: {} vs {ty}",
            t.ggml_type.name()
        );
        let hash = format!("{:016x}", fnv1a64(&bytes[t.start..t.start + t.len]));
        assert_eq!(hash, w[1].as_str().unwrap(), "{name} ({ty}): bytes differ");
    }
    let back_files = open(&out);
    let back = back_files.model(Quantize::Auto).unwrap();
    let tok = Tokenizer::load(&back_files).unwrap();
    let ids = tok.encode("The capital of France is").unwrap();
    let text = run::greedy(&CpuRunner::new(&back, KvFormat::F32, &Serial), &ids, 4, &[]).unwrap();
    assert_eq!(tok.decode(&text, true).unwrap(), " Paris.\n\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A `tokenizer.json` (SmolLM2's, as sapient builds it from the GGUF) becomes the GGUF
/// tokenizer metadata llama.cpp's converter wrote for it: the same tokens, token types and
/// merges, and the pre-tokenizer recognized by its hash as `smollm`.
#[test]
fn tokenizer_json_becomes_llama_cpp_metadata() {
    let dir = temp_dir("tokenizer");
    let files = open(&smollm2_gguf());
    let g = files.gguf().unwrap();
    let tok = Tokenizer::load(&files).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tok.to_hf_json().unwrap()).unwrap();
    let config = serde_json::json!({
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "chat_template": g.str("tokenizer.chat_template").unwrap(),
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    let vocab = files.config.vocab_size;
    let mut warnings = Vec::new();
    let meta = hf_tokenizer_metadata(&dir, vocab, None, None, &mut |w| warnings.push(w)).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let get = |k: &str| {
        meta.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        get("tokenizer.ggml.pre"),
        Some(Value::String("smollm".into()))
    );
    for key in [
        "tokenizer.ggml.model",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "tokenizer.chat_template",
    ] {
        assert_eq!(get(key).as_ref(), g.get(key), "{key}");
    }
    let types = |v: Option<&Value>| -> Vec<u64> {
        v.and_then(Value::as_array)
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect()
    };
    assert_eq!(
        types(get("tokenizer.ggml.token_type").as_ref()),
        types(g.get("tokenizer.ggml.token_type"))
    );
    let id = |k: &str| get(k).and_then(|v| v.as_u64());
    assert_eq!(
        id("tokenizer.ggml.bos_token_id"),
        g.u64("tokenizer.ggml.bos_token_id")
    );
    assert_eq!(
        id("tokenizer.ggml.eos_token_id"),
        g.u64("tokenizer.ggml.eos_token_id")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A SentencePiece `tokenizer.model` (llama.cpp's `llama-spm` test vocabulary, written as
/// SentencePiece's protobuf) becomes the `llama` metadata llama.cpp's converter writes: the same
/// pieces, scores and types; and a vocabulary-only GGUF of it tokenizes llama.cpp's own test
/// cases as llama.cpp does.
#[test]
fn sentencepiece_model_becomes_llama_cpp_metadata() {
    let Some(models) = llama_cpp_models() else {
        eprintln!("SKIPPED: no llama.cpp source (run scripts/fetch-llama-cpp.sh)");
        return;
    };
    let g = gguf(&models.join("ggml-vocab-llama-spm.gguf"));
    let array = |k: &str| g.get(k).and_then(Value::as_array).unwrap().to_vec();
    let (tokens, scores, types) = (
        array("tokenizer.ggml.tokens"),
        array("tokenizer.ggml.scores"),
        array("tokenizer.ggml.token_type"),
    );
    // ModelProto { pieces (1): SentencePiece { piece (1), score (2), type (3) } }
    let varint = |out: &mut Vec<u8>, mut v: u64| loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            break;
        }
        out.push(b | 0x80);
    };
    let mut model = Vec::new();
    for ((t, s), ty) in tokens.iter().zip(&scores).zip(&types) {
        let text = t.as_str().unwrap().as_bytes();
        let mut piece = vec![0x0a];
        varint(&mut piece, text.len() as u64);
        piece.extend_from_slice(text);
        piece.push(0x15);
        piece.extend_from_slice(&(s.as_f64().unwrap() as f32).to_le_bytes());
        piece.push(0x18);
        varint(&mut piece, ty.as_u64().unwrap());
        model.push(0x0a);
        varint(&mut model, piece.len() as u64);
        model.extend_from_slice(&piece);
    }
    let dir = temp_dir("spm");
    std::fs::write(dir.join("tokenizer.model"), &model).unwrap();
    let config =
        serde_json::json!({ "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>" });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    let meta =
        hf_tokenizer_metadata(&dir, tokens.len(), None, None, &mut |w| panic!("{w}")).unwrap();
    let get = |k: &str| {
        meta.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        get("tokenizer.ggml.model"),
        Some(Value::String("llama".into()))
    );
    assert_eq!(
        get("tokenizer.ggml.tokens"),
        Some(Value::Array(tokens.clone()))
    );
    let numbers = |v: &[Value]| v.iter().map(|x| x.as_f64().unwrap()).collect::<Vec<_>>();
    assert_eq!(
        numbers(get("tokenizer.ggml.scores").unwrap().as_array().unwrap()),
        numbers(&scores)
    );
    assert_eq!(
        numbers(
            get("tokenizer.ggml.token_type")
                .unwrap()
                .as_array()
                .unwrap()
        ),
        numbers(&types)
    );
    for k in ["bos", "eos", "unknown"] {
        let key = format!("tokenizer.ggml.{k}_token_id");
        assert_eq!(get(&key).and_then(|v| v.as_u64()), g.u64(&key), "{key}");
    }
    let mut vocab_only = meta;
    vocab_only.insert(
        0,
        ("general.architecture".into(), Value::String("llama".into())),
    );
    let path = dir.join("vocab.gguf");
    sapient::convert::writer::write_gguf(&path, &vocab_only, &[], |_, _| Ok(())).unwrap();
    let tok = Tokenizer::open(&path).unwrap();
    let cases = llama_cpp_vocab_cases(&models, "llama-spm");
    assert!(cases.len() > 10);
    for (text, want) in cases {
        assert_eq!(tok.encode(&text).unwrap(), want, "{text:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
