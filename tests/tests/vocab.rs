//! llama.cpp's own tokenizer tests (`test-tokenizer-0`): each vocabulary-only GGUF under the
//! vendored source's `models/` comes with inputs (`.inp`, cases separated by
//! `\n__ggml_vocab_test__\n`) and the ids llama.cpp gives them (`.out`, one line per case, no BOS).
//! The source is where `scripts/fetch-llama-cpp.sh` puts it (`$SAPIENT_LLAMA_CPP_SRC`; the test
//! command sets it); without it these tests say SKIPPED.
use std::path::PathBuf;

use sapient::load::gguf::Gguf;
use sapient::tokenizer::Tokenizer;

/// The vocabularies sapient tokenizes exactly as llama.cpp does.
const SUPPORTED: &[&str] = &[
    "llama-spm",
    "phi-3",
    "llama-bpe",
    "qwen2",
    "qwen35",
    "gpt-2",
    "starcoder",
    "refact",
    "mpt",
    "falcon",
    "command-r",
    "deepseek-coder",
];

/// Vocabularies whose tokenizer model or pre-tokenizer sapient refuses, and the words its error
/// must contain.
const REFUSED: &[(&str, &str)] = &[
    ("bert-bge", "tokenizer model \"bert\""),
    ("deepseek-llm", "pre-tokenizer \"deepseek-llm\""),
    ("gemma-4", "gemma4"),
];

fn models_dir() -> Option<PathBuf> {
    match std::env::var("SAPIENT_LLAMA_CPP_SRC") {
        Ok(src) => Some(PathBuf::from(src).join("models")),
        Err(_) => {
            let home = std::env::var("HOME").ok()?;
            let dir = PathBuf::from(home).join(".cache/sapient/llama.cpp/src-0.3.36/models");
            dir.is_dir().then_some(dir)
        }
    }
}

fn load(dir: &std::path::Path, name: &str) -> anyhow::Result<Tokenizer> {
    let bytes = std::fs::read(dir.join(format!("ggml-vocab-{name}.gguf")))?;
    Tokenizer::from_gguf(&Gguf::parse(&bytes)?)
}

fn cases(dir: &std::path::Path, name: &str) -> Vec<(String, Vec<u32>)> {
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

#[test]
fn llama_cpp_vocabularies_tokenize_as_llama_cpp_does() {
    let Some(dir) = models_dir() else {
        eprintln!("SKIPPED: no llama.cpp source (run scripts/fetch-llama-cpp.sh, set SAPIENT_LLAMA_CPP_SRC)");
        return;
    };
    let mut failures = Vec::new();
    let mut compared = 0;
    for name in SUPPORTED {
        let tok = load(&dir, name).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        for (text, want) in cases(&dir, name) {
            let got = tok.encode(&text).unwrap();
            compared += 1;
            if got != want {
                failures.push(format!(
                    "{name}: {text:?}\n  llama.cpp {want:?}\n  sapient   {got:?}"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {compared} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(compared >= 400, "only {compared} cases compared");
}

#[test]
fn unsupported_vocabularies_are_refused_by_name() {
    let Some(dir) = models_dir() else {
        eprintln!("SKIPPED: no llama.cpp source (run scripts/fetch-llama-cpp.sh)");
        return;
    };
    for (name, words) in REFUSED {
        let e = load(&dir, name)
            .err()
            .unwrap_or_else(|| panic!("{name} loaded"));
        let msg = format!("{e:#}");
        assert!(msg.contains(words), "{name}: {msg}");
    }
}

#[test]
fn spm_round_trips_text_through_decode() {
    let Some(dir) = models_dir() else {
        eprintln!("SKIPPED: no llama.cpp source (run scripts/fetch-llama-cpp.sh)");
        return;
    };
    let tok = load(&dir, "llama-spm").unwrap();
    for (text, _) in cases(&dir, "llama-spm") {
        let ids = tok.encode(&text).unwrap();
        assert_eq!(tok.decode(&ids, true).unwrap(), text, "{text:?}");
    }
}
