//! llama.cpp's own tokenizer tests (`test-tokenizer-0`): each vocabulary-only GGUF under the
//! vendored source's `models/` comes with inputs (`.inp`, cases separated by
//! `\n__ggml_vocab_test__\n`) and the ids llama.cpp gives them (`.out`, one line per case, no BOS).
//! The source is where `scripts/fetch-llama-cpp.sh` puts it (`$SAPIENT_LLAMA_CPP_SRC`; the test
//! command sets it); without it these tests say SKIPPED.
use sapient_tests::{llama_cpp_models, llama_cpp_vocab_cases as cases, tekken_vocab};

use sapient::constraint::{Automaton, SortedVocab};
use sapient::json_output::JsonPrefix;
use sapient::json_schema::Schema;
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
    "deepseek-llm",
];

/// Vocabularies whose tokenizer model or pre-tokenizer sapient refuses, and the words its error
/// must contain.
const REFUSED: &[(&str, &str)] = &[
    ("bert-bge", "tokenizer model \"bert\""),
    ("gemma-4", "gemma4"),
];

fn load(dir: &std::path::Path, name: &str) -> anyhow::Result<Tokenizer> {
    let bytes = std::fs::read(dir.join(format!("ggml-vocab-{name}.gguf")))?;
    Tokenizer::from_gguf(&Gguf::parse(&bytes)?)
}

#[test]
fn llama_cpp_vocabularies_tokenize_as_llama_cpp_does() {
    let Some(dir) = llama_cpp_models() else {
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

/// A text's tokens, each taken as its bytes (what the server's `logprobs` report for a token)
/// and put end to end, are the text's bytes: byte tokens and pieces of characters included.
#[test]
fn token_bytes_put_end_to_end_are_the_text() {
    let Some(dir) = llama_cpp_models() else {
        eprintln!("SKIPPED: no llama.cpp source (run scripts/fetch-llama-cpp.sh, set SAPIENT_LLAMA_CPP_SRC)");
        return;
    };
    let mut compared = 0;
    for name in SUPPORTED {
        let tok = load(&dir, name).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        for (text, _) in cases(&dir, name) {
            let ids = tok.encode(&text).unwrap();
            let bytes: Vec<u8> = ids.iter().flat_map(|&id| tok.token_bytes(id)).collect();
            let want = tok.decode_continuation(&ids, false).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&bytes),
                want,
                "{name}: {text:?} as {ids:?}"
            );
            compared += 1;
        }
    }
    assert!(compared >= 400, "only {compared} cases compared");
}

/// The JSON mask over a sorted vocabulary allows exactly the tokens that, fed one by one from
/// the same point of a JSON object, the automaton accepts (special tokens never).
#[test]
fn json_mask_allows_what_the_automaton_accepts_token_by_token() {
    let Some(dir) = llama_cpp_models() else {
        eprintln!("SKIPPED: no llama.cpp source (run scripts/fetch-llama-cpp.sh, set SAPIENT_LLAMA_CPP_SRC)");
        return;
    };
    let points = [
        "",
        " {",
        "{\"name\": \"Jo",
        "{\"a\": [1, 2.",
        "{\"a\": tr",
        "{\"a\": {\"b\": [] }",
        "{\"k\\u00",
        "{\"a\": 1}",
    ];
    for name in ["llama-spm", "llama-bpe", "qwen2"] {
        let tok = load(&dir, name).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let n = tok.vocab_size();
        let vocab = SortedVocab::new(&tok, n);
        let special = tok.special_ids();
        let mut mask = Vec::new();
        for point in points {
            let from = JsonPrefix::default()
                .feed(&(), point.as_bytes())
                .unwrap_or_else(|| panic!("{point:?}"));
            vocab.allowed(&(), from, &mut mask);
            let mut count = 0;
            for id in 0..n as u32 {
                let bytes = tok.token_bytes(id);
                let want = !bytes.is_empty()
                    && special.binary_search(&id).is_err()
                    && from.feed(&(), &bytes).is_some();
                assert_eq!(
                    mask[id as usize], want,
                    "{name} after {point:?}: token {id} {bytes:?}"
                );
                count += usize::from(want);
            }
            assert!(
                count > 0 || from.is_complete(),
                "{name} after {point:?}: nothing allowed"
            );
        }
        // And under schemas: keys, an enum, an integer; a union of objects told apart by their
        // first property (a call to one of two tools).
        let schema = Schema::compile(&serde_json::json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "n": {"type": "integer"},
                           "kind": {"enum": ["cat", "cow", 12]}},
            "required": ["name"]
        }))
        .unwrap();
        let call = |name: &str, arg: &str| {
            serde_json::json!({"type": "object", "required": ["name", "arguments"], "properties": {
                "name": {"const": name},
                "arguments": {"type": "object", "properties": {arg: {"type": "string"}},
                              "required": [arg]}}})
        };
        let union = Schema::compile(&serde_json::json!({
            "anyOf": [call("get_weather", "city"), call("get_time", "zone")]
        }))
        .unwrap();
        for (schema, point) in [
            (&schema, ""),
            (&schema, "{\""),
            (&schema, "{\"n\": 1"),
            (&schema, "{\"kind\": \"c"),
            (&schema, "{\"name\": \"x\","),
            (&union, "{"),
            (&union, "{\"na"),
            (&union, "{\"name\": \"get_"),
            (&union, "{\"name\": \"get_time\", \"arguments\": {\""),
        ] {
            let from = schema
                .start()
                .feed(schema, point.as_bytes())
                .unwrap_or_else(|| panic!("{point:?}"));
            vocab.allowed(schema, from, &mut mask);
            for id in 0..n as u32 {
                let bytes = tok.token_bytes(id);
                let want = !bytes.is_empty()
                    && special.binary_search(&id).is_err()
                    && from.feed(schema, &bytes).is_some();
                assert_eq!(
                    mask[id as usize], want,
                    "{name} after {point:?}: token {id} {bytes:?}"
                );
            }
        }
    }
}

/// Mistral's Tekken vocabulary (Mistral NeMo, Ministral, Mistral Small 3), for which llama.cpp
/// ships no test file: `scripts/fetch-tekken-vocab.sh` writes one as llama.cpp's converter does,
/// with the ids that mistral_common, Mistral's own tokenizer, gives 178 texts (llama.cpp's test
/// inputs, paragraphs of the GPL, scripts, code, emoji). The test command sets
/// `SAPIENT_TEKKEN_VOCAB`.
#[test]
fn tekken_tokenizes_as_mistral_common_does() {
    let Some(dir) = tekken_vocab() else {
        eprintln!("SKIPPED: no Tekken vocabulary (run scripts/fetch-tekken-vocab.sh)");
        return;
    };
    let tok = load(&dir, "tekken").unwrap_or_else(|e| panic!("tekken: {e:#}"));
    let cases = cases(&dir, "tekken");
    assert!(cases.len() >= 150, "only {} cases", cases.len());
    for (text, want) in cases {
        assert_eq!(tok.encode(&text).unwrap(), want, "{text:?}");
        assert_eq!(tok.decode(&want, true).unwrap(), text, "{text:?}");
    }
}

#[test]
fn unsupported_vocabularies_are_refused_by_name() {
    let Some(dir) = llama_cpp_models() else {
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
    let Some(dir) = llama_cpp_models() else {
        eprintln!("SKIPPED: no llama.cpp source (run scripts/fetch-llama-cpp.sh)");
        return;
    };
    let tok = load(&dir, "llama-spm").unwrap();
    for (text, _) in cases(&dir, "llama-spm") {
        let ids = tok.encode(&text).unwrap();
        assert_eq!(tok.decode(&ids, true).unwrap(), text, "{text:?}");
    }
}

/// Phi-3's special tokens drop the whitespace after them (but `<unk>`, `<s>` and
/// `<|endoftext|>`), as llama.cpp and Phi-3's `tokenizer.json` have it: the newlines its chat
/// template writes after each turn's tokens are not tokens. The ids are llama.cpp's
/// (`llama-tokenize --ids --no-bos`).
#[test]
fn phi3_special_tokens_drop_the_whitespace_after_them() {
    let Some(dir) = llama_cpp_models() else {
        eprintln!("SKIPPED: no llama.cpp source (run scripts/fetch-llama-cpp.sh)");
        return;
    };
    let tok = load(&dir, "phi-3").unwrap();
    let cases: [(&str, &[u32]); 2] = [
        (
            "<|system|>\nBe brief.<|end|>\n<|user|>\n  Hi\t there <|end|>\n<|assistant|>\n",
            &[
                32006, 1522, 11473, 29889, 32007, 32010, 6324, 12, 727, 29871, 32007, 32001,
            ],
        ),
        (
            "<s> x</s> y<unk> z<|endoftext|> w",
            &[1, 29871, 921, 2, 343, 0, 29871, 503, 32000, 29871, 281],
        ),
    ];
    for (text, want) in cases {
        assert_eq!(tok.encode(text).unwrap(), want, "{text:?}");
    }
    // Other SentencePiece vocabularies keep it.
    let llama = load(&dir, "llama-spm").unwrap();
    assert_eq!(llama.encode("</s>\nx").unwrap(), [2, 29871, 13, 29916]);
}
