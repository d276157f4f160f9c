#![no_main]
//! A whole `load + one forward` on a GGUF file made of the input (tiny synthetic models in the
//! seed corpus): parsing, config, weight checks, arenas, two tokens through every layer.
use libfuzzer_sys::fuzz_target;

#[path = "model_common.rs"]
mod model_common;

fuzz_target!(|data: &[u8]| {
    let path = model_common::scratch().join("model.gguf");
    std::fs::write(&path, data).unwrap();
    model_common::load_and_run(&path);
});
