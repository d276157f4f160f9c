//! llama.cpp's own GBNF grammars (its `grammars/` directory, from the source
//! `scripts/fetch-llama-cpp.sh` fetches; without it this test says SKIPPED): each parses, takes
//! a sentence of its language whole and refuses a near miss.
use sapient::constraint::Automaton;
use sapient::grammar::Grammar;
use sapient_tests::llama_cpp_models;

/// Whether `text` is a whole sentence of `grammar`.
fn takes(grammar: &Grammar, text: &str) -> bool {
    grammar
        .start()
        .feed(grammar, text.as_bytes())
        .is_some_and(|s| s.is_complete())
}

#[test]
fn llama_cpp_grammars_parse_and_match_their_languages() {
    let Some(grammars) = llama_cpp_models().and_then(|m| Some(m.parent()?.join("grammars"))) else {
        eprintln!("SKIPPED: no llama.cpp source (run scripts/fetch-llama-cpp.sh, set SAPIENT_LLAMA_CPP_SRC)");
        return;
    };
    let mut parsed = 0;
    for entry in std::fs::read_dir(&grammars).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "gbnf") {
            let text = std::fs::read_to_string(&path).unwrap();
            Grammar::parse(&text).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            parsed += 1;
        }
    }
    assert!(parsed >= 8, "{parsed} grammars in {}", grammars.display());
    let cases: &[(&str, &[&str], &[&str])] = &[
        (
            "json",
            &[r#"{"a": [1, -2.5e3, "x\u00e9\n"], "b": {"c": null}}"#, "{}"],
            &[r#"{"a": 01}"#, r#"{"a" 1}"#, "[]"],
        ),
        ("json_arr", &["[\n1,\n{\"a\": true}]"], &["[1]"]),
        (
            "arithmetic",
            &["1+2*(y -3) = x\n"],
            &["1+2*(y - 3) = x\n", "1 = \n"],
        ),
        ("list", &["- one\n- two\n"], &["- one", "one\n"]),
        (
            "chess",
            &["1. e4 e5\n2. Nf3 Nc6\n"],
            &["1. e4 e5\n", "1. e9 e5\n2. Nf3 Nc6\n"],
        ),
        ("japanese", &["こんにちは 世界"], &["hello"]),
        ("english", &["Hello, world!"], &["héllo"]),
        (
            "c",
            &["int main(){return 0;}", ""],
            &["int main(){return 0}"],
        ),
    ];
    for (name, passing, failing) in cases {
        let path = grammars.join(format!("{name}.gbnf"));
        let grammar = Grammar::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for text in *passing {
            assert!(takes(&grammar, text), "{name}: {text:?} should match");
        }
        for text in *failing {
            assert!(!takes(&grammar, text), "{name}: {text:?} should not match");
        }
    }
}
