//! Fill-in-the-middle prompts on llama.cpp's vocabulary-only GGUF files of code models
//! (`$SAPIENT_LLAMA_CPP_SRC`; the test command sets it): the tokens found by their texts, the
//! prompt's layout, and what is cut to fit.
use sapient::infill::{ExtraFile, Fim, FimRequest};
use sapient::load::gguf::{Gguf, Value};
use sapient::tokenizer::Tokenizer;
use sapient_tests::llama_cpp_models;

fn vocab(name: &str) -> Option<Tokenizer> {
    let Some(dir) = llama_cpp_models() else {
        eprintln!("SKIPPED: no llama.cpp source (run scripts/fetch-llama-cpp.sh, set SAPIENT_LLAMA_CPP_SRC)");
        return None;
    };
    let bytes = std::fs::read(dir.join(format!("ggml-vocab-{name}.gguf"))).unwrap();
    Some(Tokenizer::from_gguf(&Gguf::parse(&bytes).unwrap()).unwrap())
}

fn fim(tok: &Tokenizer) -> Fim {
    Fim::find(tok, None).unwrap().expect("FIM tokens")
}

fn id(tok: &Tokenizer, text: &str) -> u32 {
    tok.id(text)
        .unwrap_or_else(|| panic!("{text} is not a token"))
}

#[test]
fn code_vocabularies_have_their_fim_tokens_and_others_none() {
    let Some(star) = vocab("starcoder") else {
        return;
    };
    let f = fim(&star);
    let ends = f.end_ids();
    for end in ["<|endoftext|>", "<fim_pad>"] {
        assert!(ends.contains(&id(&star, end)), "{end} ends a middle");
    }
    // StarCoder 2's repository tokens are not among the texts llama.cpp looks for.
    for other in ["<fim_middle>", "<repo_name>", "<file_sep>"] {
        assert!(!ends.contains(&id(&star, other)), "{other}");
    }
    let refact = vocab("refact").unwrap();
    assert!(fim(&refact).end_ids().contains(&id(&refact, "<reponame>")));
    assert!(fim(&vocab("deepseek-coder").unwrap()).end_ids().is_empty());
    for name in ["llama-spm", "llama-bpe", "gpt-2", "phi-3"] {
        assert_eq!(
            Fim::find(&vocab(name).unwrap(), None).unwrap(),
            None,
            "{name}"
        );
    }
}

#[test]
fn prompts_put_prefix_suffix_and_middle_in_psm_order() {
    let Some(star) = vocab("starcoder") else {
        return;
    };
    let (prefix, suffix) = ("def add(a, b):\n    ", "\n\nprint(add(1, 2))\n");
    let p = fim(&star)
        .prompt(
            &star,
            &FimRequest {
                prefix,
                suffix,
                middle: "return",
                extra: &[],
            },
            4096,
        )
        .unwrap();
    let mut want = vec![id(&star, "<fim_prefix>")];
    want.extend(star.encode(prefix).unwrap());
    want.extend(star.encode("return").unwrap());
    want.push(id(&star, "<fim_suffix>"));
    want.extend(star.encode(suffix).unwrap());
    want.push(id(&star, "<fim_middle>"));
    assert_eq!(p.ids, want);
    assert!(!p.truncated);

    // DeepSeek-Coder's vocabulary asks for BOS, has no repository tokens, and names its FIM
    // tokens otherwise.
    let ds = vocab("deepseek-coder").unwrap();
    let p = fim(&ds)
        .prompt(
            &ds,
            &FimRequest {
                prefix: "int x = ",
                suffix: ";",
                ..FimRequest::default()
            },
            64,
        )
        .unwrap();
    let mut want = vec![ds.bos.unwrap(), id(&ds, "<｜fim▁begin｜>")];
    want.extend(ds.encode("int x = ").unwrap());
    want.push(id(&ds, "<｜fim▁hole｜>"));
    want.extend(ds.encode(";").unwrap());
    want.push(id(&ds, "<｜fim▁end｜>"));
    assert_eq!(p.ids, want);
}

#[test]
fn long_prompts_keep_the_text_next_to_the_gap() {
    let Some(star) = vocab("starcoder") else {
        return;
    };
    let f = fim(&star);
    let prefix: String = (0..300).map(|i| format!("x{i} = {i}\n")).collect();
    let suffix: String = (0..300).map(|i| format!("y{i} = {i}\n")).collect();
    let (prefix_ids, suffix_ids) = (star.encode(&prefix).unwrap(), star.encode(&suffix).unwrap());
    for limit in [7, 50, 203, 1000] {
        let p = f
            .prompt(
                &star,
                &FimRequest {
                    prefix: &prefix,
                    suffix: &suffix,
                    ..FimRequest::default()
                },
                limit,
            )
            .unwrap();
        assert!(p.truncated);
        assert_eq!(p.ids.len(), limit, "the prompt fills its limit");
        let room = limit - 3;
        let suffix_take = room - room * 3 / 4;
        let prefix_take = room - suffix_take;
        assert_eq!(
            p.ids[1..=prefix_take],
            prefix_ids[prefix_ids.len() - prefix_take..]
        );
        assert_eq!(p.ids[prefix_take + 2..limit - 1], suffix_ids[..suffix_take]);
    }
    // A short suffix leaves its room to the prefix.
    let p = f
        .prompt(
            &star,
            &FimRequest {
                prefix: &prefix,
                suffix: "\n",
                ..FimRequest::default()
            },
            100,
        )
        .unwrap();
    assert_eq!(p.ids.len(), 100);
    assert_eq!(p.ids[1..97], prefix_ids[prefix_ids.len() - 96..]);
    // Not even the middle's start fits.
    let err = f
        .prompt(
            &star,
            &FimRequest {
                middle: &prefix,
                ..FimRequest::default()
            },
            100,
        )
        .unwrap_err();
    assert!(format!("{err}").contains("the limit is 100"), "{err}");
}

/// StarCoder's vocabulary with its repository and file separator tokens named by GGUF keys.
fn starcoder_with_repo_tokens() -> Option<(Tokenizer, Fim)> {
    let dir = llama_cpp_models()?;
    let bytes = std::fs::read(dir.join("ggml-vocab-starcoder.gguf")).unwrap();
    let mut g = Gguf::parse(&bytes).unwrap();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    for (key, text) in [("fim_rep", "<repo_name>"), ("fim_sep", "<file_sep>")] {
        let key = format!("tokenizer.ggml.{key}_token_id");
        g.metadata.insert(key, Value::U32(id(&tok, text)));
    }
    let fim = Fim::find(&tok, Some(&g)).unwrap().unwrap();
    Some((tok, fim))
}

#[test]
fn extra_files_come_first_in_llama_cpps_layout() {
    let Some((star, star_fim)) = starcoder_with_repo_tokens() else {
        return;
    };
    let extra = [
        ExtraFile {
            filename: "util.py".into(),
            text: "def one():\n    return 1\n".into(),
        },
        ExtraFile {
            filename: "b.py".into(),
            text: "B = 2\n".into(),
        },
    ];
    let request = FimRequest {
        prefix: "x = one() + ",
        suffix: "\n",
        middle: "",
        extra: &extra,
    };
    let p = star_fim.prompt(&star, &request, 4096).unwrap();
    let (repo, sep) = (id(&star, "<repo_name>"), id(&star, "<file_sep>"));
    let mut want = vec![repo];
    want.extend(star.encode("myproject\n").unwrap());
    for file in &extra {
        want.push(sep);
        want.extend(star.encode(&format!("{}\n", file.filename)).unwrap());
        want.extend(star.encode(&file.text).unwrap());
    }
    want.push(sep);
    want.extend(star.encode("filename\n").unwrap());
    let context = want.len();
    want.push(id(&star, "<fim_prefix>"));
    want.extend(star.encode(request.prefix).unwrap());
    want.push(id(&star, "<fim_suffix>"));
    want.extend(star.encode("\n").unwrap());
    want.push(id(&star, "<fim_middle>"));
    assert_eq!(p.ids, want);
    // With less room the context loses its start first.
    let short = star_fim.prompt(&star, &request, want.len() - 5).unwrap();
    assert!(short.truncated);
    assert_eq!(short.ids[..], want[5..]);
    assert!(short.ids.len() > want.len() - context);
    // The repository context goes in without extra files too, as llama-server puts it.
    let alone = FimRequest {
        extra: &[],
        ..request
    };
    let p = star_fim.prompt(&star, &alone, 4096).unwrap();
    let mut context = vec![repo];
    context.extend(star.encode("myproject\n").unwrap());
    context.push(sep);
    context.extend(star.encode("filename\n").unwrap());
    context.push(id(&star, "<fim_prefix>"));
    assert_eq!(p.ids[..context.len()], context[..]);
    assert!(star_fim.end_ids().contains(&repo) && star_fim.end_ids().contains(&sep));

    // A vocabulary without a file separator: llama.cpp's snippet separator.
    let ds = vocab("deepseek-coder").unwrap();
    let p = fim(&ds).prompt(&ds, &request, 4096).unwrap();
    let mut want = vec![ds.bos.unwrap()];
    for file in &extra {
        want.extend(ds.encode("\n\n--- snippet ---\n\n").unwrap());
        want.extend(ds.encode(&file.text).unwrap());
    }
    want.push(id(&ds, "<｜fim▁begin｜>"));
    assert_eq!(p.ids[..want.len()], want[..]);
}

#[test]
fn gguf_keys_name_the_tokens_and_are_checked() {
    let Some(dir) = llama_cpp_models() else {
        return;
    };
    let bytes = std::fs::read(dir.join("ggml-vocab-starcoder.gguf")).unwrap();
    let mut g = Gguf::parse(&bytes).unwrap();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    // The older key names a prefix token the texts would not pick.
    g.metadata
        .insert("tokenizer.ggml.prefix_token_id".into(), Value::U32(7));
    let p = Fim::find(&tok, Some(&g))
        .unwrap()
        .unwrap()
        .prompt(&tok, &FimRequest::default(), 3)
        .unwrap();
    assert_eq!(
        p.ids,
        [7, id(&tok, "<fim_suffix>"), id(&tok, "<fim_middle>")]
    );
    g.metadata
        .insert("tokenizer.ggml.fim_mid_token_id".into(), Value::U64(49152));
    let err = format!("{:#}", Fim::find(&tok, Some(&g)).unwrap_err());
    assert!(
        err.contains("tokenizer.ggml.fim_mid_token_id = 49152 is outside the vocabulary"),
        "{err}"
    );
}

/// A special token's text in the code (a tokenizer's source, say) stays text, as llama-server
/// tokenizes it: `<|endoftext|>` in a prefix does not end it; and the same for SentencePiece
/// vocabularies' `encode_plain`.
#[test]
fn special_tokens_texts_in_the_code_stay_text() {
    let Some(star) = vocab("starcoder") else {
        return;
    };
    let eot = id(&star, "<|endoftext|>");
    let prefix = "EOT = \"<|endoftext|>\"\nPRE = '<fim_prefix>'\n";
    assert!(
        star.encode(prefix).unwrap().contains(&eot),
        "encode reads it as the token"
    );
    let plain = star.encode_plain(prefix).unwrap();
    assert!(!plain.contains(&eot) && !plain.contains(&id(&star, "<fim_prefix>")));
    assert_eq!(star.decode(&plain, false).unwrap(), prefix);
    let request = FimRequest {
        prefix,
        suffix: "<|endoftext|>",
        ..FimRequest::default()
    };
    let p = fim(&star).prompt(&star, &request, 4096).unwrap();
    assert_eq!(
        p.ids.iter().filter(|&&t| t == eot).count(),
        0,
        "{:?}",
        p.ids
    );
    assert_eq!(p.ids[1..1 + plain.len()], plain[..]);

    let spm = vocab("llama-spm").unwrap();
    let eos = id(&spm, "</s>");
    assert!(spm.encode("a</s>b").unwrap().contains(&eos));
    let plain = spm.encode_plain("a</s>b").unwrap();
    assert!(!plain.contains(&eos));
    assert_eq!(spm.decode(&plain, false).unwrap(), "a</s>b");
    assert_eq!(
        spm.encode_plain("plain text").unwrap(),
        spm.encode("plain text").unwrap()
    );
}
