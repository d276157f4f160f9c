//! Several sequences in shared batches (`Model::forward_many`) give each sequence the same bits
//! as running it alone, whatever the batch size, the mix of lengths, positions and outputs; and
//! `embed` over many texts, built on it, matches transformers.
use sapient::load::{LoadOptions, ModelFiles, Quantize};
use sapient::run::{self, CpuRunner, Pooling};
use sapient::Rayon;
use sapient_core::{Exec, KvCache, KvFormat, Model, Scratch, Serial, Want};
use sapient_tests::*;

fn fixture(name: &str) -> ModelFiles {
    ModelFiles::open(&tiny(name), &LoadOptions::default()).unwrap()
}

/// What a sequence asks for, by kind; `output` makes the buffer.
#[derive(Clone, Copy, Debug)]
enum Ask {
    Nothing,
    Last,
    Argmax,
    All,
    Hidden,
}

fn output(model: &Model<'_>, ask: Ask, n: usize) -> Vec<f32> {
    let (v, h) = (model.config.vocab_size, model.config.hidden_size);
    match ask {
        Ask::Nothing | Ask::Argmax => vec![0.0; 1],
        Ask::Last => vec![0.0; v],
        Ask::All => vec![0.0; n * v],
        Ask::Hidden => vec![0.0; n * h],
    }
}

fn want<'o>(ask: Ask, out: &'o mut [f32], id: &'o mut u32) -> Want<'o> {
    match ask {
        Ask::Nothing => Want::Nothing,
        Ask::Last => Want::LastLogits(out),
        Ask::Argmax => Want::LastArgmax(id),
        Ask::All => Want::AllLogits(out),
        Ask::Hidden => Want::Hidden(out),
    }
}

/// One sequence: a prefix already in its cache, then `tokens`, with `ask`.
struct Seq {
    prefix: Vec<u32>,
    tokens: Vec<u32>,
    ask: Ask,
}

/// Each sequence's output and chosen id, run through `forward_many` in batches of `batch`
/// (`together`) or alone, one `forward` each.
fn run(
    model: &Model<'_>,
    kv: KvFormat,
    seqs: &[Seq],
    batch: usize,
    together: bool,
    exec: &(impl Exec + ?Sized),
) -> Vec<(Vec<f32>, u32)> {
    let c = &model.config;
    let mut mems: Vec<Vec<u8>> = seqs
        .iter()
        .map(|s| {
            let len = s.prefix.len() + s.tokens.len();
            vec![0u8; KvCache::bytes_needed(c, len, kv).unwrap()]
        })
        .collect();
    let mut caches: Vec<KvCache<'_>> = seqs
        .iter()
        .zip(mems.iter_mut())
        .map(|(s, m)| KvCache::new(c, s.prefix.len() + s.tokens.len(), kv, m).unwrap())
        .collect();
    let mut scratch_mem = vec![0f32; Scratch::bytes_needed(c, batch).unwrap().div_ceil(4)];
    let mut scratch = Scratch::new(c, batch, bytemuck::cast_slice_mut(&mut scratch_mem)).unwrap();
    for (s, cache) in seqs.iter().zip(caches.iter_mut()) {
        model
            .forward(&s.prefix, cache, &mut scratch, exec, Want::Nothing)
            .unwrap();
    }
    let mut outs: Vec<(Vec<f32>, u32)> = seqs
        .iter()
        .map(|s| (output(model, s.ask, s.tokens.len()), u32::MAX))
        .collect();
    if together {
        let tokens: Vec<&[u32]> = seqs.iter().map(|s| s.tokens.as_slice()).collect();
        let mut wants: Vec<Want<'_>> = seqs
            .iter()
            .zip(outs.iter_mut())
            .map(|(s, (o, id))| want(s.ask, o, id))
            .collect();
        let mut refs: Vec<&mut KvCache<'_>> = caches.iter_mut().collect();
        model
            .forward_many(&tokens, &mut refs, &mut scratch, exec, &mut wants)
            .unwrap();
    } else {
        for ((s, cache), (o, id)) in seqs.iter().zip(caches.iter_mut()).zip(outs.iter_mut()) {
            model
                .forward(&s.tokens, cache, &mut scratch, exec, want(s.ask, o, id))
                .unwrap();
        }
    }
    for (s, cache) in seqs.iter().zip(&caches) {
        assert_eq!(cache.len(), s.prefix.len() + s.tokens.len());
    }
    outs
}

fn pattern(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (seed * 131 + i * 37) % 500).collect()
}

#[test]
fn shared_batches_give_each_sequence_its_own_bits() {
    let asks = [Ask::All, Ask::Hidden, Ask::Last, Ask::Argmax, Ask::Nothing];
    for name in ["llama", "qwen2", "mistral"] {
        let files = fixture(name);
        for quantize in [Quantize::None, Quantize::Auto] {
            let model = files.model(quantize).unwrap();
            for kv in [KvFormat::F32, KvFormat::default_for(&model.config)] {
                let seqs: Vec<Seq> = [(0, 1), (3, 7), (0, 40), (17, 3), (5, 1), (0, 23)]
                    .iter()
                    .enumerate()
                    .map(|(i, &(prefix, n))| Seq {
                        prefix: pattern(i as u32 + 100, prefix),
                        tokens: pattern(i as u32, n),
                        ask: asks[i % asks.len()],
                    })
                    .collect();
                // Alone, with one thread; together, with one and with two (the mat-muls then
                // split by rows or by tokens depending on the batch).
                for (batch, threads) in [
                    (1, 1),
                    (4, 1),
                    (6, 2),
                    (9, 2),
                    (13, 1),
                    (32, 1),
                    (32, 2),
                    (128, 2),
                ] {
                    let alone = run(&model, kv, &seqs, batch, false, &Serial);
                    let pool = Rayon::new(Some(threads)).unwrap();
                    let together = run(&model, kv, &seqs, batch, true, &pool);
                    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
                        let same = a.1 == t.1
                            && a.0
                                .iter()
                                .zip(&t.0)
                                .all(|(x, y)| x.to_bits() == y.to_bits());
                        assert!(
                            same,
                            "{name} {quantize:?} {kv:?} batch {batch}: sequence {i} ({:?}) differs",
                            seqs[i].ask
                        );
                    }
                    if matches!(seqs[3].ask, Ask::Argmax) {
                        assert_ne!(together[3].1, u32::MAX);
                    }
                }
            }
        }
    }
}

#[test]
fn mismatched_sequences_are_errors() {
    let files = fixture("llama");
    let model = files.model(Quantize::None).unwrap();
    let c = &model.config;
    let mut mem = vec![0u8; KvCache::bytes_needed(c, 8, KvFormat::F32).unwrap()];
    let mut cache = KvCache::new(c, 8, KvFormat::F32, &mut mem).unwrap();
    let mut scratch_mem = vec![0f32; Scratch::bytes_needed(c, 4).unwrap().div_ceil(4)];
    let mut scratch = Scratch::new(c, 4, bytemuck::cast_slice_mut(&mut scratch_mem)).unwrap();
    let mut logits = vec![0f32; c.vocab_size];
    // Two inputs, one cache.
    let e = model
        .forward_many(
            &[&[1, 2], &[3]],
            &mut [&mut cache],
            &mut scratch,
            &Serial,
            &mut [Want::Nothing, Want::Nothing],
        )
        .unwrap_err();
    assert!(e.to_string().contains("sequences"), "{e}");
    // The last logits of no tokens.
    let e = model
        .forward(
            &[],
            &mut cache,
            &mut scratch,
            &Serial,
            Want::LastLogits(&mut logits),
        )
        .unwrap_err();
    assert!(e.to_string().contains("no tokens are given"), "{e}");
    assert_eq!(cache.len(), 0);
}

/// Many texts embedded in shared passes: each equals its embedding alone, bit for bit, and
/// transformers' mean of the final hidden states within f32 tolerance.
#[test]
fn embeddings_of_many_texts_match_transformers() {
    for name in tiny_names() {
        let files = fixture(&name);
        let model = files.model(Quantize::None).unwrap();
        let runner = CpuRunner::new(&model, KvFormat::F32, &Serial);
        let r = read_json(&tiny(&name).join("reference.json"));
        let (seq7, seq40) = (ids(&r["inputs"]["seq7"]), ids(&r["inputs"]["seq40"]));
        let texts: Vec<&[u32]> = vec![&seq7, &seq40, &seq7[..3], &seq40[5..]];
        for batch in [8, 50, 256] {
            let many = run::embeddings(&runner, &texts, Pooling::Mean, false, batch).unwrap();
            for (text, e) in texts.iter().zip(&many) {
                let alone = run::embeddings(&runner, &[text], Pooling::Mean, false, 1).unwrap();
                assert_eq!(&alone[0], e, "{name}: batch {batch}");
            }
            for (i, seq) in ["seq7", "seq40"].iter().enumerate() {
                let want = floats(&r["outputs"][seq]["hidden_mean"]);
                let d = max_abs_diff(&many[i], &want);
                assert!(d < 2e-4, "{name} {seq}: embedding differs by {d}");
            }
        }
        let last = run::embeddings(&runner, &texts[..1], Pooling::Last, true, 64).unwrap();
        let hidden = run::hidden_states(&runner, &seq7).unwrap();
        let h = model.config.hidden_size;
        let tail = &hidden[hidden.len() - h..];
        let norm = tail.iter().map(|v| v * v).sum::<f32>().sqrt();
        for (a, b) in last[0].iter().zip(tail) {
            assert!((a - b / norm).abs() < 1e-6, "{name}: last pooling");
        }
    }
}

/// SmolLM2's mean-pooled embedding of a reference prompt, from the GGUF's weights, within 1% of
/// transformers' (its L2 norm, and the distance over the values the reference keeps).
#[test]
fn smollm2_embedding_matches_reference() {
    let r = smollm2_reference();
    let files = ModelFiles::open(&smollm2_gguf(), &LoadOptions::default()).unwrap();
    let model = files.model(Quantize::Auto).unwrap();
    let tok = sapient::tokenizer::Tokenizer::load(&files).unwrap();
    let e = &r["embedding"];
    let prompt = tok.encode(e["prompt"].as_str().unwrap()).unwrap();
    let other = tok
        .encode("An unrelated line of text, to share the batch.")
        .unwrap();
    let runner = CpuRunner::new(&model, KvFormat::F16, &Serial);
    let got = run::embeddings(&runner, &[&other, &prompt], Pooling::Mean, false, 256).unwrap();
    let got = &got[1];
    let norm = got.iter().map(|v| v * v).sum::<f32>().sqrt() as f64;
    let want_norm = e["l2_norm"].as_f64().unwrap();
    assert!(
        (norm - want_norm).abs() < 0.01 * want_norm,
        "{norm} vs {want_norm}"
    );
    let first8 = floats(&e["first8"]);
    let dist = got
        .iter()
        .zip(&first8)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum::<f64>()
        .sqrt();
    assert!(dist < 0.01 * want_norm, "first 8 values {dist} away");
}
