//! Bad inputs get errors that name the problem.
use sapient::load::{LoadOptions, ModelFiles, Quantize};
use sapient::run::CpuRunner;
use sapient::Rayon;
use sapient_core::{Error, Format, KvCache, KvFormat, Matrix, Model, Scratch, Serial, Want};
use sapient_tests::*;

fn llama() -> ModelFiles {
    ModelFiles::open(&tiny("llama"), &LoadOptions::default()).unwrap()
}

#[test]
fn arenas_one_byte_too_small() {
    let files = llama();
    let c = &files.config;
    let need = KvCache::bytes_needed(c, 16, KvFormat::F32).unwrap();
    let mut mem = vec![0u8; need - 1];
    let err = KvCache::new(c, 16, KvFormat::F32, &mut mem).err().unwrap();
    assert!(
        matches!(err, Error::ArenaTooSmall { needed, got, .. } if needed == need && got == need - 1)
    );
    assert!(err.to_string().contains("KV cache"), "{err}");

    let need = Scratch::bytes_needed(c, 4).unwrap();
    let mut mem = vec![0f32; need / 4 + 1];
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut mem);
    let err = Scratch::new(c, 4, &mut bytes[..need - 1]).err().unwrap();
    assert!(err.to_string().contains("scratch"), "{err}");
    // Misaligned by one byte: an error, not a panic.
    let err = Scratch::new(c, 4, &mut bytes[1..need + 1]).err().unwrap();
    assert!(matches!(err, Error::Misaligned { .. }), "{err}");
}

#[test]
fn non_finite_logits_are_an_error() {
    let files = llama();
    let model = files.model(Quantize::None).unwrap();
    let c = model.config.clone();
    let (vocab, h) = (c.vocab_size, c.hidden_size);
    // One vocabulary entry's output weights are NaN: that logit is NaN for every token.
    let mut values = vec![0.01f32; vocab * h];
    values[7 * h..8 * h].fill(f32::NAN);
    let mut weights = model.weights.clone();
    weights.lm_head = Some(Matrix::quantize(Format::F32, vocab, h, &values).unwrap());
    let model = Model::new(c.clone(), weights).unwrap();
    let rayon = Rayon::new(Some(2)).unwrap();
    for exec in [&Serial as &dyn sapient_core::Exec, &rayon] {
        let mut arenas = sapient::run::Arenas::new(&c, 8, KvFormat::F32, 8).unwrap();
        let (mut cache, mut scratch) = arenas.borrow(&c).unwrap();
        let mut logits = vec![0f32; 3 * vocab];
        let err = model
            .forward(
                &[1, 2, 3],
                &mut cache,
                &mut scratch,
                exec,
                Want::AllLogits(&mut logits),
            )
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::NotFinite {
                    what: "logits",
                    row: 0
                }
            ),
            "{err}"
        );
    }
}

#[test]
fn position_past_max_seq() {
    let files = llama();
    let model = files.model(Quantize::None).unwrap();
    let c = &model.config;
    let mut arenas = sapient::run::Arenas::new(c, 4, KvFormat::F32, 4).unwrap();
    let (mut cache, mut scratch) = arenas.borrow(c).unwrap();
    model
        .forward(&[1, 2, 3], &mut cache, &mut scratch, &Serial, Want::Nothing)
        .unwrap();
    let err = model
        .forward(&[4, 5], &mut cache, &mut scratch, &Serial, Want::Nothing)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::ContextFull {
                pos: 3,
                tokens: 2,
                max_seq: 4
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("context full"), "{err}");
    // Nothing was written: the cache still holds 3 positions and takes one more.
    assert_eq!(cache.len(), 3);
    model
        .forward(&[4], &mut cache, &mut scratch, &Serial, Want::Nothing)
        .unwrap();
    let err = model
        .forward(&[600], &mut cache, &mut scratch, &Serial, Want::Nothing)
        .unwrap_err();
    assert!(matches!(
        err,
        Error::ContextFull { .. } | Error::TokenOutOfRange { .. }
    ));
}

#[test]
fn token_out_of_vocabulary() {
    let files = llama();
    let model = files.model(Quantize::None).unwrap();
    let err = sapient::run::logits(
        &CpuRunner::new(&model, KvFormat::F32, &Serial),
        &[1, 512],
        false,
    )
    .unwrap_err();
    assert!(err.to_string().contains("512"), "{err}");
}

fn with_config(edit: impl Fn(&mut serde_json::Value)) -> anyhow::Result<()> {
    let dir = tiny("llama");
    let mut cfg = read_json(&dir.join("config.json"));
    edit(&mut cfg);
    let tmp = std::env::temp_dir().join(format!(
        "sapient-config-{}-{:?}.json",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&tmp, cfg.to_string()).unwrap();
    let opts = LoadOptions {
        quantize: Quantize::None,
        config_file: Some(tmp.clone()),
    };
    let result = ModelFiles::open(&dir, &opts).and_then(|f| f.model(Quantize::None).map(|_| ()));
    std::fs::remove_file(&tmp).ok();
    result
}

#[test]
fn zero_heads_in_config() {
    let err = with_config(|c| c["num_attention_heads"] = 0.into()).unwrap_err();
    assert!(
        format!("{err:#}").contains("num_attention_heads"),
        "{err:#}"
    );
}

#[test]
fn shape_disagreeing_with_config() {
    let err = with_config(|c| c["intermediate_size"] = 128.into()).unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("gate_proj") && msg.contains("layer 0") && msg.contains("128"),
        "{msg}"
    );
}

#[test]
fn unknown_architecture() {
    let err = with_config(|c| c["model_type"] = "mamba".into()).unwrap_err();
    assert!(format!("{err:#}").contains("mamba"), "{err:#}");
}
