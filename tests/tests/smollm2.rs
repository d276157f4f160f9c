//! The real SmolLM2-135M-Instruct Q4_1 GGUF against transformers' reference (weights dequantized
//! exactly from the same file).
use sapient::load::{LoadOptions, ModelFiles, Quantize};
use sapient::run::{self, CpuRunner, Runner};
use sapient::tokenizer::{TextStream, Tokenizer};
use sapient_core::{KvFormat, Model, Serial};
use sapient_tests::*;

fn open() -> ModelFiles {
    ModelFiles::open(&smollm2_gguf(), &LoadOptions::default()).unwrap()
}

#[test]
fn gguf_tokenizer_matches_reference_ids() {
    let files = open();
    let tok = Tokenizer::load(&files).unwrap();
    let r = smollm2_reference();
    for p in r["prompts"].as_array().unwrap() {
        assert_eq!(
            tok.encode(p["prompt"].as_str().unwrap()).unwrap(),
            ids(&p["ids"]),
            "{}",
            p["prompt"]
        );
    }
    // SmolLM2's own pre-tokenizer splits digits one by one (7639 tokens; GPT-2's regex gives 7658).
    let text = std::fs::read_to_string(fixtures().join("text/GPL-3.txt")).unwrap();
    let got = tok.encode(&text).unwrap();
    let want = ids(&r["perplexity_faithful"]["token_ids"]);
    assert_eq!(got.len(), 7639);
    assert_eq!(got, want);
    // Round trip, and streaming never splits a character.
    assert_eq!(tok.decode(&got, false).unwrap(), text);
    let mut stream = TextStream::new(&tok);
    let mut streamed = String::new();
    for id in tok.encode("naïve café — 東京 🎉").unwrap() {
        streamed += &stream.push(id).unwrap().unwrap_or_default();
    }
    streamed += &stream.finish().unwrap().unwrap_or_default();
    assert_eq!(streamed, "naïve café — 東京 🎉");
}

/// Asserts that every prompt's last logits, from `model` with a `kv` cache, are within `tol` of
/// the reference's top 10.
fn assert_top10_within(model: &Model<'_>, kv: KvFormat, tol: f32) {
    let r = smollm2_reference();
    for p in r["prompts"].as_array().unwrap() {
        let logits = run::logits(&CpuRunner::new(model, kv, &Serial), &ids(&p["ids"]), false)
            .unwrap()
            .remove(0);
        for (id, v) in ids(&p["last_logits_top10_ids"])
            .iter()
            .zip(floats(&p["last_logits_top10_values"]))
        {
            let d = (logits[*id as usize] - v).abs();
            assert!(
                d < tol,
                "{} ({kv:?}): logit of {id} differs by {d}",
                p["prompt"]
            );
        }
    }
}

/// The model's own weights widened to f32 give transformers' logits: the GGUF path (adjacent-pair
/// RoPE on llama.cpp's permuted Q/K, tied Q8_0 embeddings) is exact, not just close.
#[test]
fn f32_weights_match_reference_logits() {
    let files = open();
    assert_top10_within(&files.model(Quantize::F32).unwrap(), KvFormat::F32, 2e-3);
}

/// The Q4_1 weights used as they are, with Q16 activations: only the KV cache format adds error.
/// With an f16 or f32 cache the top-10 logits stay within 0.02 of transformers' (measured: 0.006
/// at most); ggml's Q8_0 activations moved them by up to 1.1.
#[test]
fn quantized_weights_track_reference_logits() {
    let files = open();
    let model = files.model(Quantize::Auto).unwrap();
    for kv in [KvFormat::F16, KvFormat::F32] {
        assert_top10_within(&model, kv, 0.02);
    }
}

/// Greedy decoding on the Q4_1 weights as they are, with every KV cache format, gives the
/// reference's first 8 tokens. "The capital of France is" is the hard case: at step 6 the
/// reference itself is a near tie (" answer" 2988 leads " United" 1797 by 0.22), which ggml's Q8_0
/// activations (0.25 RMS logit error on this model) flip; Q16 activations keep it.
#[test]
fn greedy_starts_like_the_reference() {
    let files = open();
    let model = files.model(Quantize::Auto).unwrap();
    let pool = sapient::Rayon::new(None).unwrap();
    let r = smollm2_reference();
    for p in r["prompts"].as_array().unwrap() {
        let prompt = ids(&p["ids"]);
        let want = &ids(&p["greedy_new_ids"])[..8];
        for kv in [KvFormat::Q8_0, KvFormat::F16, KvFormat::F32] {
            let got = run::greedy(&CpuRunner::new(&model, kv, &pool), &prompt, 8, &[]).unwrap();
            assert_eq!(got, want, "{} with a {kv:?} KV cache", p["prompt"]);
        }
    }
}

#[test]
fn perplexity_within_two_percent_of_reference() {
    let files = open();
    let model = files.model(Quantize::Auto).unwrap();
    let r = smollm2_reference();
    let pf = &r["perplexity_faithful"];
    let ids = ids(&pf["token_ids"]);
    let pool = sapient::Rayon::new(None).unwrap();
    let (ppl, scored) = run::perplexity(
        &CpuRunner::new(&model, KvFormat::default_for(&model.config), &pool),
        &ids,
        512,
        run::PerplexityRecipe::EveryPosition,
    )
    .unwrap();
    let want = pf["ppl"].as_f64().unwrap();
    assert_eq!(scored, pf["n_scored_tokens"].as_u64().unwrap() as usize);
    assert!(
        (ppl / want - 1.0).abs() < 0.02,
        "perplexity {ppl}, reference {want}"
    );
}

/// `Quantize::Q8_0` (`--quantize q8_0`) converts every matrix of the Q4_1 file to Q8_0, each
/// block within one Q8_0 step (its largest magnitude / 127) of the values the file holds; the
/// default keeps the file's Q4_1 (and its Q8_0 embedding).
#[test]
fn q8_0_requantizes_every_quantized_matrix() {
    let files = open();
    let stored = files.model(Quantize::Auto).unwrap();
    let q8 = files.model(Quantize::Q8_0).unwrap();
    let (before, after) = (matrices(&stored), matrices(&q8));
    assert_eq!(before.len(), after.len());
    let q4_1 = before
        .iter()
        .filter(|m| m.format == sapient_core::Format::Q4_1);
    assert!(q4_1.count() > 0, "the file's matrices are Q4_1");
    let mut compared = 0;
    for (a, b) in before.iter().zip(&after) {
        assert_eq!(b.format, sapient_core::Format::Q8_0);
        assert_eq!((a.rows, a.cols), (b.rows, b.cols));
        let (mut x, mut y) = (vec![0f32; a.cols], vec![0f32; a.cols]);
        for r in [0, a.rows / 2, a.rows - 1] {
            a.dequantize_row(r, &mut x).unwrap();
            b.dequantize_row(r, &mut y).unwrap();
            for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
                let step = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                for (u, v) in xb.iter().zip(yb) {
                    assert!((u - v).abs() <= step, "row {r}: {u} became {v}");
                }
            }
            compared += 1;
        }
    }
    assert_eq!(compared, 3 * before.len());
}

/// Every matrix of `m`: the embedding, each layer's seven, the output projection if untied.
fn matrices<'m>(m: &'m Model<'_>) -> Vec<&'m sapient_core::Matrix<'m>> {
    let w = &m.weights;
    let mut all = vec![&w.embed];
    for l in w.layers.iter() {
        all.extend([&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]);
    }
    all.extend(w.lm_head.as_ref());
    all
}

/// Constrained output on the real model, through the chat template. Any object: the text is a
/// prefix of a JSON object at every step, a whole one whenever the model stopped, never the
/// code fence it writes unconstrained; greedily, a request it can answer ends in a whole object.
/// A schema: greedy and sampled runs stop only on a value of the schema (its required keys,
/// their types, the enum's values, no other keys), and the text is always a prefix of one. A
/// GBNF grammar of JSON: the same, for its sentences.
#[test]
fn constrained_output_is_the_language_asked_for() {
    use sapient::chat::{end_of_turn_ids, ChatTemplate, Message};
    use sapient::constraint::{Automaton, OutputConstraint, SortedVocab, Trigger};
    use sapient::generate::{generate, Stop};
    use sapient::grammar::Grammar;
    use sapient::json_output::JsonPrefix;
    use sapient::json_schema::Schema;
    use sapient_core::sample::{Sampler, SamplerConfig};
    use std::sync::Arc;

    let files = open();
    let model = files.model(Quantize::Auto).unwrap();
    let pool = sapient::Rayon::new(None).unwrap();
    let tok = Arc::new(Tokenizer::load(&files).unwrap());
    let template = ChatTemplate::load(&files, &tok, None).unwrap();
    let vocab = Arc::new(SortedVocab::new(&tok, model.config.vocab_size));
    let mut stop = files.eos_token_ids.clone();
    stop.extend(end_of_turn_ids(&tok));
    let runner = CpuRunner::new(&model, KvFormat::default_for(&model.config), &pool);
    let object = || OutputConstraint::new(vocab.clone(), tok.clone());
    let sampled = |seed| SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed,
        ..SamplerConfig::default()
    };
    let run = |content: &str, sampling, max_tokens, mut output: Option<OutputConstraint>| {
        let text = template
            .render(&[Message::text("user", content)], true)
            .unwrap();
        let prompt = tok.encode_chat(&text).unwrap();
        let mut out = Vec::new();
        let (_, why) = runner
            .with_session(prompt.len() + max_tokens, 64, |s| {
                let mut sampler = Sampler::new(sampling)?;
                generate(
                    s,
                    &mut sampler,
                    output.as_mut(),
                    &prompt,
                    &mut Vec::new(),
                    max_tokens,
                    &stop,
                    |t| {
                        out.push(t);
                        Ok(true)
                    },
                )
            })
            .unwrap();
        (tok.decode(&out, true).unwrap(), why)
    };

    let (text, why) = run(
        "Reply with a JSON object with the keys city and country for Paris.",
        SamplerConfig::greedy(),
        48,
        Some(object()),
    );
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(why, Stop::EndOfSequence);
    assert_eq!(value["city"], "Paris", "{text}");
    let cat = "Give me a JSON object describing a cat.";
    let (free, _) = run(cat, SamplerConfig::greedy(), 48, None);
    assert!(free.starts_with("```"), "{free:?}");
    for seed in 0..6 {
        let (text, why) = run(cat, sampled(seed), 48, Some(object()));
        let state = JsonPrefix::default()
            .feed(&(), text.as_bytes())
            .unwrap_or_else(|| panic!("seed {seed}: {text:?} is no JSON prefix"));
        if why == Stop::EndOfSequence {
            assert!(state.is_complete(), "seed {seed}: stopped in {text:?}");
            let _: serde_json::Value = serde_json::from_str(&text).unwrap();
        }
    }

    let schema = Arc::new(
        Schema::compile(&serde_json::json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "color": {"enum": ["black", "white", "orange"]},
                "indoor": {"type": "boolean"},
                "toys": {"type": "array", "items": {"type": "string"}, "maxItems": 3}
            },
            "required": ["name", "age", "color", "indoor", "toys"],
            "additionalProperties": false
        }))
        .unwrap(),
    );
    let mut whole = 0;
    for seed in 0..6 {
        let sampling = if seed == 0 {
            SamplerConfig::greedy()
        } else {
            sampled(seed)
        };
        let output = OutputConstraint::with_schema(vocab.clone(), tok.clone(), schema.clone());
        let (text, why) = run("Describe a cat as JSON.", sampling, 80, Some(output));
        let state = schema
            .start()
            .feed(&schema, text.as_bytes())
            .unwrap_or_else(|| panic!("seed {seed}: {text:?} is no prefix of the schema's values"));
        if why != Stop::EndOfSequence {
            continue;
        }
        assert!(state.is_complete(), "seed {seed}: stopped in {text:?}");
        whole += 1;
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let o = v.as_object().unwrap();
        let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["age", "color", "indoor", "name", "toys"], "{text}");
        assert!(
            o["name"].is_string() && o["age"].is_i64() && o["indoor"].is_boolean(),
            "{text}"
        );
        assert!(
            ["black", "white", "orange"].contains(&o["color"].as_str().unwrap()),
            "{text}"
        );
        let toys = o["toys"].as_array().unwrap();
        assert!(
            toys.len() <= 3 && toys.iter().all(|t| t.is_string()),
            "{text}"
        );
    }
    assert!(whole >= 1, "no run under the schema ended in a whole value");

    // A lazy constraint: free text, then a value of the schema after the trigger (the code
    // fence SmolLM2 opens its answer to this with), then free text again.
    let fence = "```python\n";
    let mut triggered = 0;
    for seed in 0..6 {
        let sampling = if seed == 0 {
            SamplerConfig::greedy()
        } else {
            sampled(seed)
        };
        let trigger = Trigger {
            text: fence.as_bytes().to_vec(),
            at_start: false,
        };
        let lazy = vec![(schema.clone(), vec![trigger])];
        let output = OutputConstraint::lazy(vocab.clone(), tok.clone(), lazy);
        let (text, why) = run(cat, sampling, 120, Some(output));
        let Some(at) = text.find(fence) else {
            assert!(seed != 0, "greedy: no fence in {text:?}");
            continue;
        };
        triggered += 1;
        let json = &text[at + fence.len()..];
        let mut values = serde_json::Deserializer::from_str(json).into_iter::<serde_json::Value>();
        match values.next() {
            Some(Ok(_)) => {
                let end = values.byte_offset();
                let state = schema.start().feed(&schema, &json.as_bytes()[..end]);
                assert!(
                    state.is_some_and(|s| s.is_complete()),
                    "seed {seed}: {text:?}"
                );
            }
            // Cut short by max_tokens: still a prefix of the schema's values.
            _ => assert!(
                why == Stop::MaxTokens && schema.start().feed(&schema, json.as_bytes()).is_some(),
                "seed {seed}: {text:?}"
            ),
        }
    }
    assert!(triggered >= 1);

    // A GBNF grammar (JSON's, as llama.cpp's grammars/json.gbnf writes it): the text is always
    // a prefix of a sentence, and a whole one whenever the model stopped.
    let grammar = Arc::new(
        Grammar::parse(
            r#"
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws     ::= | " " | "\n" [ \t]{0,20}
"#,
        )
        .unwrap(),
    );
    let mut whole = 0;
    for seed in 0..4 {
        let sampling = if seed == 0 {
            SamplerConfig::greedy()
        } else {
            sampled(seed)
        };
        let output = OutputConstraint::with_grammar(vocab.clone(), tok.clone(), grammar.clone());
        let (text, why) = run(cat, sampling, 64, Some(output));
        let state = grammar
            .start()
            .feed(&grammar, text.as_bytes())
            .unwrap_or_else(|| panic!("seed {seed}: {text:?} is no prefix of the grammar's"));
        if why == Stop::EndOfSequence {
            assert!(state.is_complete(), "seed {seed}: stopped in {text:?}");
            let _: serde_json::Value = serde_json::from_str(&text).unwrap();
            whole += 1;
        }
    }
    assert!(
        whole >= 1,
        "no run under the grammar ended in a whole sentence"
    );
}

/// Two tools: `get_weather` of a city, `get_time` of a zone.
fn weather_and_time() -> Vec<sapient::tool_calls::Tool> {
    sapient::tool_calls::Tool::list(&serde_json::json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "required": ["city"], "properties": {"city": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
            "required": ["zone"], "properties": {"zone": {"type": "string"}}}}},
    ]))
    .unwrap()
}

/// What a scripted model draws under `output` (greedy; each step the script's next token far
/// likelier than the rest) until a token differs from the script: the text, and whether the
/// output is whole.
fn scripted(
    files: &ModelFiles,
    tok: &Tokenizer,
    mut output: sapient::constraint::OutputConstraint,
    script: &str,
) -> (String, bool) {
    use sapient_core::sample::{Sampler, SamplerConfig};
    let mut sampler = Sampler::new(SamplerConfig::greedy()).unwrap();
    let mut out: Vec<u32> = Vec::new();
    for want in tok.encode(script).unwrap() {
        let mut logits = vec![0.0f32; files.config.vocab_size];
        logits[want as usize] = 100.0;
        let got = output
            .sample(&mut sampler, &mut logits, &out, &files.eos_token_ids)
            .unwrap();
        out.push(got);
        if got != want {
            break;
        }
    }
    (tok.decode(&out, false).unwrap(), output.is_complete())
}

/// A lazy constraint of several schemas, each after its own trigger (Mistral's `[ARGS]` tool
/// format under `tool_choice` `auto`: a tool's arguments after the text that names it), driven
/// by a scripted model (each step one token far likelier than the rest, greedy): text before
/// a trigger goes free, arguments that keep the named tool's schema pass as written, and a
/// token that would break it is replaced by one that keeps it.
#[test]
fn each_lazy_schema_holds_after_its_own_trigger() {
    use sapient::constraint::{Automaton, OutputConstraint, SortedVocab};
    use sapient::json_schema::Schema;
    use sapient::tool_calls::ToolFormat;
    use std::sync::Arc;

    let files = open();
    let tok = Arc::new(Tokenizer::load(&files).unwrap());
    let vocab = Arc::new(SortedVocab::new(&tok, files.config.vocab_size));
    let tools = weather_and_time();
    let groups = ToolFormat::MistralArgs.auto_constraint(&tools, false);
    let schemas: Vec<Arc<Schema>> = groups
        .iter()
        .map(|(s, _)| Arc::new(Schema::compile(s).unwrap()))
        .collect();
    let lazy: Vec<_> = schemas
        .iter()
        .cloned()
        .zip(groups.into_iter().map(|g| g.1))
        .collect();
    let drawn = |script: &str| {
        let output = OutputConstraint::lazy(vocab.clone(), tok.clone(), lazy.clone());
        scripted(&files, &tok, output, script)
    };
    let opening = "Let me check. [TOOL_CALLS]get_weather[ARGS]";
    let (text, complete) = drawn(&format!("{opening}{{\"city\": \"Paris\"}}"));
    assert_eq!(text, format!("{opening}{{\"city\": \"Paris\"}}"));
    assert!(
        complete,
        "the arguments are a whole value of get_weather's schema"
    );
    // get_time's zone is a string: the number the script wants is replaced.
    let opening = "[TOOL_CALLS]get_time[ARGS]";
    let (text, _) = drawn(&format!("{opening}{{\"zone\": 5}}"));
    let args = text.strip_prefix(opening).unwrap();
    assert!(
        args.starts_with("{\"zone\": ") && !args.contains('5'),
        "{text:?}"
    );
    assert!(schemas[1]
        .start()
        .feed(&schemas[1], args.as_bytes())
        .is_some());
    // ... where get_weather's schema would have refused `zone` at once.
    assert!(schemas[0]
        .start()
        .feed(&schemas[0], args.as_bytes())
        .is_none());
    // A name that is no tool's opens nothing: the text goes free.
    let free = "[TOOL_CALLS]get_wether[ARGS]{\"zone\": 5}";
    assert_eq!(drawn(free).0, free);
}

/// A lazy grammar (llama-server's `grammar_lazy`), driven by a scripted model as above: text
/// before a trigger goes free, the grammar holds from the trigger's own text on (a word
/// anywhere, a pattern's first capture group, a token) to the end, and a trigger whose text
/// the grammar refuses is an error, not a silent pass.
#[test]
fn a_lazy_grammar_holds_from_its_trigger_on() {
    use sapient::constraint::{GrammarTrigger, OutputConstraint, SortedVocab};
    use sapient::grammar::Grammar;
    use sapient_core::sample::{Sampler, SamplerConfig};
    use std::sync::Arc;

    let files = open();
    let tok = Arc::new(Tokenizer::load(&files).unwrap());
    let vocab = Arc::new(SortedVocab::new(&tok, files.config.vocab_size));
    let grammar = Arc::new(Grammar::parse(r#"root ::= "<answer>" [0-9]+ "</answer>""#).unwrap());
    let drawn = |trigger: GrammarTrigger, script: &str| {
        let triggers: Arc<[GrammarTrigger]> = vec![trigger].into();
        let output =
            OutputConstraint::lazy_grammar(vocab.clone(), tok.clone(), grammar.clone(), triggers);
        scripted(&files, &tok, output, script)
    };
    let word = || GrammarTrigger::Word(b"<answer>".to_vec());
    let pattern = |p: &str| GrammarTrigger::Pattern(regex::bytes::Regex::new(p).unwrap());
    let first_token = tok.encode("<answer>").unwrap()[0];

    // A sentence of the grammar after free text passes as written, whatever fired it.
    let script = "Let me count: 4x2. <answer>8</answer>";
    for trigger in [
        word(),
        pattern(r"count: .*?(<answer>)"),
        pattern(r"^[\s\S]*?(<answer>)$"),
        GrammarTrigger::Token(first_token),
    ] {
        let (text, complete) = drawn(trigger.clone(), script);
        assert_eq!(text, script, "{trigger:?}");
        assert!(complete, "{trigger:?}: the grammar's sentence is whole");
    }
    // Before the trigger anything goes ('x' included); after it, a letter the grammar refuses
    // is replaced, and nothing may follow the whole sentence but the end.
    let (text, _) = drawn(word(), "Say x: <answer>4x</answer>");
    let answer = text.strip_prefix("Say x: <answer>4").unwrap();
    assert!(!answer.starts_with('x'), "{text:?}");
    let (text, complete) = drawn(word(), "<answer>7</answer> and more");
    assert!(text.starts_with("<answer>7</answer>") && !text.contains("more"));
    assert!(complete, "{text:?}");
    // No trigger: free text all through.
    let free = "No answer tag here: 4x2.";
    assert_eq!(drawn(word(), free).0, free);

    // A trigger the grammar cannot begin with: the draw that fires it is an error.
    let triggers: Arc<[GrammarTrigger]> = vec![GrammarTrigger::Word(b"Oh".to_vec())].into();
    let mut output = OutputConstraint::lazy_grammar(vocab, tok.clone(), grammar, triggers);
    let mut sampler = Sampler::new(SamplerConfig::greedy()).unwrap();
    let mut out = Vec::new();
    let mut failed = None;
    for want in tok.encode("Oh, <answer>1</answer>").unwrap() {
        let mut logits = vec![0.0f32; files.config.vocab_size];
        logits[want as usize] = 100.0;
        match output.sample(&mut sampler, &mut logits, &out, &files.eos_token_ids) {
            Ok(got) => out.push(got),
            Err(e) => {
                failed = Some(format!("{e:#}"));
                break;
            }
        }
    }
    let failed = failed.expect("the grammar refuses \"Oh\"");
    assert!(failed.contains("does not accept"), "{failed}");
}

/// A forced call in Mistral's `[ARGS]` format, any of several tools: the reply names one of
/// the tools, then keeps to that tool's arguments' schema, driven by a scripted model as above:
/// a script that does so passes as written, and a token that would leave the tools' names or
/// break the named tool's schema is replaced by one that keeps them.
#[test]
fn a_forced_call_names_one_of_its_tools() {
    use sapient::constraint::{Automaton, Choice, OutputConstraint, SortedVocab};
    use sapient::json_schema::Schema;
    use sapient::tool_calls::{ForcedBody, ToolFormat};
    use std::sync::Arc;

    let files = open();
    let tok = Arc::new(Tokenizer::load(&files).unwrap());
    let vocab = Arc::new(SortedVocab::new(&tok, files.config.vocab_size));
    let tools = weather_and_time();
    let forced = ToolFormat::MistralArgs.forced(&tools, None).unwrap();
    assert_eq!(forced.prefix, "[TOOL_CALLS]");
    let ForcedBody::Named(named) = forced.body else {
        panic!("the tool's name, then its arguments");
    };
    let options = named
        .iter()
        .map(|(opening, schema)| {
            let schema = Arc::new(Schema::compile(schema).unwrap());
            (opening.as_bytes().to_vec(), schema)
        })
        .collect();
    let choice = Arc::new(Choice::new(options).unwrap());
    let drawn = |script: &str| {
        let output = OutputConstraint::with_choice(vocab.clone(), tok.clone(), choice.clone());
        let (text, complete) = scripted(&files, &tok, output, script);
        let prefix = choice.start().feed(&choice, text.as_bytes());
        assert!(prefix.is_some(), "{text:?} left the choice");
        (text, complete)
    };
    let call = "get_time[ARGS]{\"zone\": \"UTC\"}";
    assert_eq!(drawn(call), (call.to_owned(), true));
    // Text before the call, or a name that is no tool's: replaced at once, or where it leaves
    // the names.
    let (text, _) = drawn("Sure: get_time[ARGS]{}");
    assert!(!text.starts_with("Sure"), "{text:?}");
    let (text, _) = drawn("get_wether[ARGS]{}");
    assert!(!text.starts_with("get_wether"), "{text:?}");
    // get_time's zone is a string: the number the script wants is replaced.
    let (text, _) = drawn("get_time[ARGS]{\"zone\": 5}");
    assert!(
        text.starts_with("get_time[ARGS]{\"zone\": ") && !text.contains('5'),
        "{text:?}"
    );
}

/// DRY's sequence breakers on SmolLM2's vocabulary, as llama.cpp works them out: `:` alone
/// wherever a token holds it; `"ab` as the token `"` followed by `ab`'s tokens; and with the
/// defaults, a repetition that crosses a newline counts only from after it.
#[test]
fn dry_breakers_follow_the_vocabulary() {
    use sapient::dry::{sequence_breakers, DEFAULT_BREAKERS, MAX_BREAKERS};
    use sapient_core::sample::{Sampler, SamplerConfig};
    use std::sync::Arc;

    let files = open();
    let tok = Tokenizer::load(&files).unwrap();
    let colon = tok.encode(":").unwrap();
    let breakers = format!("{:?}", sequence_breakers(&tok, &[":".into()]).unwrap());
    assert!(
        breakers.contains(&format!("({}, [])", colon[0])),
        "{breakers}"
    );
    let quote = tok.encode("\"").unwrap()[0];
    let ab = tok.encode("ab").unwrap();
    let two = format!("{:?}", sequence_breakers(&tok, &["\"ab".into()]).unwrap());
    assert!(two.contains(&format!("({quote}, {ab:?})")), "{two}");
    assert!(sequence_breakers(&tok, &[String::new()]).is_err());
    assert!(sequence_breakers(&tok, &vec!["x".to_owned(); MAX_BREAKERS + 1]).is_err());

    // " one two\n three four one two\n three": " four" would extend " one two\n three", a
    // repetition of four tokens; past the newline only " three" repeats, under the two allowed.
    let defaults: Vec<String> = DEFAULT_BREAKERS.iter().map(|b| b.to_string()).collect();
    let breakers = Arc::new(sequence_breakers(&tok, &defaults).unwrap());
    let history = tok.encode(" one two\n three four one two\n three").unwrap();
    let four = tok.encode(" four").unwrap()[0];
    let config = SamplerConfig {
        temperature: 0.0,
        dry_multiplier: 1.0,
        dry_base: 2.0,
        dry_allowed_length: 2,
        ..SamplerConfig::default()
    };
    let penalty = |sampler: Sampler<'static>| {
        let mut logits = vec![0.0f32; files.config.vocab_size];
        let mut sampler = sampler;
        sampler.sample(&mut logits, &history).unwrap();
        -logits[four as usize]
    };
    let free = penalty(Sampler::new(config).unwrap());
    let broken = penalty(
        Sampler::new(config)
            .unwrap()
            .with_sequence_breakers(breakers),
    );
    assert_eq!((free, broken), (4.0, 0.0), "{history:?}");
}
