#![no_main]
//! A Hugging Face checkpoint directory from hostile bytes: `config.json` and `model.safetensors`
//! (the input is a little-endian u32 length, that many bytes of config, then the safetensors
//! file), loaded as the CLI loads it and, when it loads, run for one forward pass.
use libfuzzer_sys::fuzz_target;

#[path = "model_common.rs"]
mod model_common;

fuzz_target!(|data: &[u8]| {
    let Some((len, rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    let len = (u32::from_le_bytes(*len) as usize).min(rest.len());
    let (config, weights) = rest.split_at(len);
    let dir = model_common::scratch();
    std::fs::write(dir.join("config.json"), config).unwrap();
    std::fs::write(dir.join("model.safetensors"), weights).unwrap();
    model_common::load_and_run(&dir);
});
