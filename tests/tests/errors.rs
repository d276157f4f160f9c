//! Bad inputs get errors that name the problem.
use sapient::load::{LoadOptions, ModelFiles, Quantize};
use sapient::run::CpuRunner;
use sapient_core::{Error, KvCache, KvFormat, Scratch, Serial, Want};
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
