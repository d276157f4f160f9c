#![no_main]
//! The GGUF tokenizer builder (SentencePiece and byte-level BPE) on hostile vocabularies, then
//! encoding and decoding with what it built.
//!
//! The input is lines of text: the first names the model (`llama` or `gpt2`, then optional words
//! `bos=N`, `unk=N`, `pre=NAME`, `nospace`); tokens follow one per line up to a line `--`, then
//! merges up to another `--`; the rest is the text to encode. A token's score is minus its index,
//! its type control for `<s>`-like names, byte for `<0xNN>`, normal otherwise.
use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use sapient::load::gguf::{Gguf, Value};
use sapient::tokenizer::Tokenizer;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(3, "\n--\n");
    let (head, merges, input) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
    );
    let mut lines = head.lines();
    let mut options = lines.next().unwrap_or("").split(' ');
    let model = options.next().unwrap_or("").to_owned();
    let tokens: Vec<&str> = lines.collect();
    let mut metadata = HashMap::new();
    let string = |s: &str| Value::String(s.to_owned());
    metadata.insert("tokenizer.ggml.model".into(), string(&model));
    for option in options {
        match option.split_once('=') {
            Some(("bos", n)) => {
                metadata.insert(
                    "tokenizer.ggml.bos_token_id".into(),
                    Value::U32(n.parse().unwrap_or(0)),
                );
            }
            Some(("unk", n)) => {
                metadata.insert(
                    "tokenizer.ggml.unknown_token_id".into(),
                    Value::U32(n.parse().unwrap_or(0)),
                );
            }
            Some(("pre", name)) => {
                metadata.insert("tokenizer.ggml.pre".into(), string(name));
            }
            _ if option == "nospace" => {
                metadata.insert("tokenizer.ggml.add_space_prefix".into(), Value::Bool(false));
            }
            _ => {}
        }
    }
    let kind = |t: &str| {
        if t.starts_with("<0x") && t.len() == 6 {
            6
        } else if t.starts_with('<') && t.ends_with('>') {
            3
        } else {
            1
        }
    };
    metadata.insert(
        "tokenizer.ggml.tokens".into(),
        Value::Array(tokens.iter().map(|t| string(t)).collect()),
    );
    metadata.insert(
        "tokenizer.ggml.scores".into(),
        Value::Array((0..tokens.len()).map(|i| Value::F32(-(i as f32))).collect()),
    );
    metadata.insert(
        "tokenizer.ggml.token_type".into(),
        Value::Array(tokens.iter().map(|t| Value::I32(kind(t))).collect()),
    );
    metadata.insert(
        "tokenizer.ggml.merges".into(),
        Value::Array(merges.lines().map(string).collect()),
    );
    let g = Gguf {
        version: 3,
        metadata,
        tensors: HashMap::new(),
        order: Vec::new(),
    };
    let Ok(t) = Tokenizer::from_gguf(&g) else {
        return;
    };
    if let Ok(ids) = t.encode(input) {
        let _ = t.decode(&ids, false);
        let _ = t.decode(&ids, true);
    }
    let _ = t.encode_prompt(input);
});
