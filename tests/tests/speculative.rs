//! Speculative decoding gives the target's own greedy output, token for token, whatever the
//! draft: another fixture with the same vocabulary, the same weights in another format, or an
//! n-gram lookup; and it ends (stop token, max tokens, full context) exactly where plain
//! generation ends, with the cache holding the same tokens.
use sapient::generate::{generate, Stop};
use sapient::load::{LoadOptions, ModelFiles, Quantize};
use sapient::run::{CpuRunner, Runner};
use sapient::speculative::{generate_speculative, Draft, DraftStats, ModelDraft};
use sapient::Rayon;
use sapient_core::sample::{Sampler, SamplerConfig};
use sapient_core::{KvFormat, Model, Serial};
use sapient_tests::*;

/// What a run produced: the tokens reported, why it ended, the tokens fed (the history) and the
/// cache's length.
#[derive(Debug, PartialEq)]
struct Run {
    tokens: Vec<u32>,
    why: Stop,
    history: Vec<u32>,
    kv_len: usize,
}

struct Case<'a> {
    prompt: &'a [u32],
    max_tokens: usize,
    stop: &'a [u32],
    ctx: usize,
}

fn plain(target: &impl Runner, c: &Case<'_>) -> Run {
    target
        .with_session(c.ctx, 16, |s| {
            let (mut tokens, mut history) = (Vec::new(), Vec::new());
            let mut sampler = Sampler::new(SamplerConfig::greedy())?;
            let (_, why) = generate(
                s,
                &mut sampler,
                None,
                c.prompt,
                &mut history,
                c.max_tokens,
                c.stop,
                |t| {
                    tokens.push(t);
                    Ok(true)
                },
            )?;
            Ok(Run {
                tokens,
                why,
                history,
                kv_len: s.kv_len(),
            })
        })
        .unwrap()
}

fn speculative(
    target: &impl Runner,
    draft: Option<&impl Runner>,
    k: usize,
    c: &Case<'_>,
) -> (Run, DraftStats) {
    let run = |s: &mut dyn sapient::run::Session, d: &mut Draft<'_>| {
        let (mut tokens, mut history) = (Vec::new(), Vec::new());
        let mut sampler = Sampler::new(SamplerConfig::greedy())?;
        let (_, why, stats) = generate_speculative(
            s,
            d,
            k,
            &mut sampler,
            c.prompt,
            &mut history,
            c.max_tokens,
            c.stop,
            |t| {
                tokens.push(t);
                Ok(true)
            },
        )?;
        let kv_len = s.kv_len();
        Ok((
            Run {
                tokens,
                why,
                history,
                kv_len,
            },
            stats,
        ))
    };
    match draft {
        None => target
            .with_session(c.ctx, 16, |s| run(s, &mut Draft::Ngram))
            .unwrap(),
        Some(draft) => draft
            .with_session(c.ctx, 16, |ds| {
                let sampler = Sampler::new(SamplerConfig::greedy())?;
                let mut d = Draft::Model(Box::new(ModelDraft::new(ds, sampler)));
                target.with_session(c.ctx, 16, |s| run(s, &mut d))
            })
            .unwrap(),
    }
}

fn fixture(name: &str, quantize: Quantize) -> ModelFiles {
    let opts = LoadOptions {
        quantize,
        config_file: None,
    };
    ModelFiles::open(&tiny(name), &opts).unwrap()
}

/// Plain runs and speculative ones with drafts of 1 to 7 tokens agree on `case`.
fn assert_same(
    what: &str,
    target: &impl Runner,
    draft: Option<&impl Runner>,
    case: &Case<'_>,
) -> DraftStats {
    let want = plain(target, case);
    let mut last = DraftStats::default();
    for k in [1, 2, 4, 7] {
        let (got, stats) = speculative(target, draft, k, case);
        assert_eq!(got, want, "{what}, {k} draft tokens");
        assert!(stats.accepted <= stats.proposed, "{what}: {stats:?}");
        last = stats;
    }
    last
}

#[test]
fn fixture_drafts_give_the_target_output() {
    let r = read_json(&tiny("llama").join("reference.json"));
    let seq40 = ids(&r["inputs"]["seq40"]);
    let draft_files = fixture("llama", Quantize::None);
    let draft_model = draft_files.model(Quantize::None).unwrap();
    let draft = CpuRunner::new(&draft_model, KvFormat::F32, &Serial);
    for name in ["mistral", "qwen2", "llama_hd32"] {
        let files = fixture(name, Quantize::None);
        let model = files.model(Quantize::None).unwrap();
        let target = CpuRunner::new(&model, KvFormat::default_for(&model.config), &Serial);
        let case = Case {
            prompt: &seq40,
            max_tokens: 40,
            stop: &[],
            ctx: 128,
        };
        assert_same(name, &target, Some(&draft), &case);
        // The target's own weights quantized: a draft that is mostly right.
        let q8 = files.model(Quantize::Auto).unwrap();
        let close = CpuRunner::new(&q8, KvFormat::F32, &Serial);
        let stats = assert_same(name, &target, Some(&close), &case);
        assert!(stats.accepted > 0, "{name}: {stats:?}");
    }
}

/// Where plain generation stops (a stop token, the last token asked for, a full context),
/// speculation stops too, with the same tokens in the cache, even when the stop falls inside a
/// run of accepted draft tokens.
#[test]
fn speculation_stops_where_generation_stops() {
    let files = fixture("mistral", Quantize::None);
    let model = files.model(Quantize::None).unwrap();
    let target = CpuRunner::new(&model, KvFormat::F32, &Serial);
    // The same model as its own draft accepts everything: every stop falls inside a run.
    let draft = CpuRunner::new(&model, KvFormat::F32, &Serial);
    let prompt = [1, 5, 9, 13, 17, 21, 25];
    let free = plain(
        &target,
        &Case {
            prompt: &prompt,
            max_tokens: 30,
            stop: &[],
            ctx: 64,
        },
    );
    let stop = [free.tokens[11]];
    let cases = [
        (30, &stop[..], 64),
        (13, &[][..], 64),
        (30, &[][..], prompt.len() + 9),
        (0, &[][..], 64),
        (1, &[][..], 64),
    ];
    for (max_tokens, stop, ctx) in cases {
        let case = Case {
            prompt: &prompt,
            max_tokens,
            stop,
            ctx,
        };
        let what = format!("max {max_tokens}, stop {stop:?}, ctx {ctx}");
        let want = plain(&target, &case);
        assert_eq!(want.kv_len, want.history.len(), "{what}");
        assert_same(&what, &target, Some(&draft), &case);
        assert_same(&what, &target, None::<&CpuRunner<Serial>>, &case);
    }
}

/// Prompt lookup on a prompt that repeats itself: the target's output, with most proposals
/// accepted once the model repeats the pattern.
#[test]
fn ngram_draft_gives_the_target_output() {
    for name in ["llama", "qwen2"] {
        let files = fixture(name, Quantize::None);
        let model = files.model(Quantize::None).unwrap();
        let target = CpuRunner::new(&model, KvFormat::F32, &Serial);
        let pattern = [3, 141, 59, 26, 53, 58, 97, 93, 238, 46];
        let prompt: Vec<u32> = pattern.iter().cycle().take(50).copied().collect();
        let case = Case {
            prompt: &prompt,
            max_tokens: 40,
            stop: &[],
            ctx: 128,
        };
        let stats = assert_same(name, &target, None::<&CpuRunner<Serial>>, &case);
        assert!(stats.proposed > 0, "{name}: {stats:?}");
    }
}

/// The real SmolLM2: the Q4_1 file drafting for its own weights computed exactly (f32), and an
/// n-gram draft, on the reference prompts.
#[test]
fn smollm2_drafts_give_the_target_output() {
    let r = smollm2_reference();
    let files = ModelFiles::open(&smollm2_gguf(), &LoadOptions::default()).unwrap();
    let exact: Model<'_> = files.model(Quantize::F32).unwrap();
    let native = files.model(Quantize::Auto).unwrap();
    let exec = Rayon::new(None).unwrap();
    let target = CpuRunner::new(&exact, KvFormat::F32, &exec);
    let draft = CpuRunner::new(&native, KvFormat::Q8_0, &exec);
    let mut accepted = 0;
    for p in r["prompts"].as_array().unwrap().iter().take(3) {
        let prompt = ids(&p["ids"]);
        let case = Case {
            prompt: &prompt,
            max_tokens: 24,
            stop: &[],
            ctx: prompt.len() + 24,
        };
        let want = plain(&target, &case);
        for k in [3, 6] {
            let (got, stats) = speculative(&target, Some(&draft), k, &case);
            assert_eq!(got, want, "{}: {k} draft tokens", p["prompt"]);
            accepted += stats.accepted;
            let (got, _) = speculative(&target, None::<&CpuRunner<Rayon>>, k, &case);
            assert_eq!(got, want, "{}: n-gram, {k} draft tokens", p["prompt"]);
        }
    }
    assert!(accepted > 0);
}
