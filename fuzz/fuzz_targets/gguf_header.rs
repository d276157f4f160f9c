#![no_main]
//! The GGUF parser (header, metadata, tensor table) on any bytes, then what reads its result:
//! the model config from the metadata and the tokenizer builder. Errors are fine; panics, hangs
//! and allocations beyond the input's size are not.
use libfuzzer_sys::fuzz_target;
use sapient::load::gguf::Gguf;
use sapient::load::gguf_config;
use sapient::tokenizer::Tokenizer;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = Gguf::parse(data) else {
        return;
    };
    let _ = gguf_config::parse(&g);
    if let Ok(t) = Tokenizer::from_gguf(&g) {
        if let Ok(ids) = t.encode("Hello world, 123 <s> ▁x") {
            let _ = t.decode(&ids, false);
        }
    }
});
