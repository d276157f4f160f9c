//! JSON output's cost per masked draw: the mask of SmolLM2's vocabulary at three points of an
//! object (between tokens, inside a string, inside a number), any object's and a schema's, and
//! the sort done once per tokenizer. Reads `models/SmolLM2-135M-Instruct.Q4_1.gguf` (scripts/fetch-model.sh).
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion};
use sapient::constraint::{Automaton, SortedVocab};
use sapient::json_output::JsonPrefix;
use sapient::json_schema::Schema;
use sapient::tokenizer::Tokenizer;

fn json_mask(c: &mut Criterion) {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let Ok(tok) = Tokenizer::open(&path) else {
        eprintln!(
            "SKIPPED: no {} (run scripts/fetch-model.sh)",
            path.display()
        );
        return;
    };
    let n = tok.vocab_size();
    c.bench_function("json_vocab_sort", |b| b.iter(|| SortedVocab::new(&tok, n)));
    let vocab = SortedVocab::new(&tok, n);
    let mut mask = Vec::new();
    for (name, point) in [
        ("object_open", "{"),
        ("in_string", "{\"name\": \"Jo"),
        ("in_number", "{\"a\": [1, 2."),
    ] {
        let from = JsonPrefix::default()
            .feed(&(), point.as_bytes())
            .expect("a JSON prefix");
        c.bench_function(&format!("json_mask_{name}"), |b| {
            b.iter(|| vocab.allowed(&(), from, &mut mask))
        });
    }
    // A schema's automaton carries a stack of its containers: the same points under one.
    let schema = Schema::compile(&serde_json::json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "a": {"type": "array", "items": {"type": "number"}}},
        "required": ["name", "a"]
    }))
    .expect("a supported schema");
    for (name, point) in [
        ("object_open", "{"),
        ("in_string", "{\"name\": \"Jo"),
        ("in_number", "{\"a\": [1, 2."),
    ] {
        let from = schema
            .start()
            .feed(&schema, point.as_bytes())
            .expect("a prefix");
        c.bench_function(&format!("json_schema_mask_{name}"), |b| {
            b.iter(|| vocab.allowed(&schema, from, &mut mask))
        });
    }
}

criterion_group!(benches, json_mask);
criterion_main!(benches);
