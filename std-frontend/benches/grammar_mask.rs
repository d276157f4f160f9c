//! A GBNF grammar's cost per masked draw: the mask of SmolLM2's vocabulary at points of a JSON
//! grammar written in GBNF (as llama.cpp's grammars/json.gbnf is: compare with `json_mask`'s
//! automaton), of a free-text one, and of one that keeps the matcher's most ways. Reads `models/SmolLM2-135M-Instruct.Q4_1.gguf`
//! (scripts/fetch-model.sh).
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion};
use sapient::constraint::{Automaton, SortedVocab};
use sapient::grammar::Grammar;
use sapient::tokenizer::Tokenizer;

const JSON: &str = r#"
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws     ::= | " " | "\n" [ \t]{0,20}
"#;

const WORDS: &str = r#"root ::= ("Yes" | "No") ", " [a-z ]{1,30} ".""#;

fn grammar_mask(c: &mut Criterion) {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let Ok(tok) = Tokenizer::open(&path) else {
        eprintln!(
            "SKIPPED: no {} (run scripts/fetch-model.sh)",
            path.display()
        );
        return;
    };
    let vocab = SortedVocab::new(&tok, tok.vocab_size());
    let mut mask = Vec::new();
    let json = Grammar::parse(JSON).expect("the JSON grammar parses");
    let words = Grammar::parse(WORDS).expect("the words grammar parses");
    // Near the most a grammar may ask: 60 ways (each rule's words, and its number after them).
    let alternatives: Vec<String> = (0..30).map(|i| format!("w{i}")).collect();
    let rules: String = (0..30)
        .map(|i| format!("w{i} ::= [a-z ]* \"{i}\"\n"))
        .collect();
    let ways = format!("root ::= {}\n{rules}", alternatives.join(" | "));
    let ways = Grammar::parse(&ways).expect("the ways grammar parses");
    for (name, grammar, point) in [
        ("json_object_open", &json, "{"),
        ("json_in_string", &json, "{\"name\": \"Jo"),
        ("json_in_number", &json, "{\"a\": [1, 2."),
        ("words_start", &words, ""),
        ("words_in_text", &words, "Yes, it is"),
        ("sixty_ways_in_text", &ways, "it is"),
    ] {
        let from = grammar
            .start()
            .feed(grammar, point.as_bytes())
            .expect("a prefix of the grammar");
        c.bench_function(&format!("grammar_mask_{name}"), |b| {
            b.iter(|| vocab.allowed(grammar, from.clone(), &mut mask))
        });
    }
}

criterion_group!(benches, grammar_mask);
criterion_main!(benches);
