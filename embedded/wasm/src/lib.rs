//! sapient-core in WebAssembly: the model `sapient-model-image` compiles in, run greedily from
//! JavaScript (`run.mjs`). No heap (the global allocator fails every request) and no
//! `wasm-bindgen`: JavaScript writes the prompt's ids into `prompt_ids()`'s buffer of this
//! module's memory, calls `generate`, and reads the ids from `generated_ids()`'s.
#![no_std]

use core::panic::PanicInfo;
use core::sync::atomic::{AtomicU32, Ordering};

use sapient_core::sample::{Sampler, SamplerConfig};
use sapient_core::{Error, KvCache, Model, Scratch, Serial, Want};
use sapient_model_image::{self as model, Arena, NoHeap};

/// The longest prompt `generate` takes, and the most tokens it decodes.
pub const MAX_PROMPT: usize = 64;
pub const MAX_NEW: usize = 256;
const MAX_SEQ: usize = MAX_PROMPT + MAX_NEW;
const MAX_BATCH: usize = 16;
const VOCAB: usize = model::CONFIG.vocab_size;
const KV_BYTES: usize = model::kv_bytes(MAX_SEQ);
const SCRATCH_BYTES: usize = model::scratch_bytes(MAX_BATCH);

/// Shared with JavaScript through the module's memory (atomics: safe to read and write here
/// whatever JavaScript wrote; the module is single-threaded).
static PROMPT: [AtomicU32; MAX_PROMPT] = [const { AtomicU32::new(0) }; MAX_PROMPT];
static GENERATED: [AtomicU32; MAX_NEW] = [const { AtomicU32::new(0) }; MAX_NEW];

/// No heap: every allocation fails. Nothing from `Model::new` to sampling asks for one.
#[global_allocator]
static ALLOCATOR: NoHeap = NoHeap;

#[panic_handler]
fn panic(_: &PanicInfo) -> ! {
    core::arch::wasm32::unreachable()
}

/// Where JavaScript writes the prompt's ids (`MAX_PROMPT` of them at most).
#[no_mangle]
pub extern "C" fn prompt_ids() -> *const AtomicU32 {
    PROMPT.as_ptr()
}

/// Where `generate` leaves the ids it decoded.
#[no_mangle]
pub extern "C" fn generated_ids() -> *const AtomicU32 {
    GENERATED.as_ptr()
}

/// Runs the first `prompt_len` ids of `prompt_ids()` and greedily decodes `new_tokens` ids into
/// `generated_ids()`. Returns how many it decoded, or -1 if the lengths are out of range, -2 if
/// the core reported an error.
#[no_mangle]
pub extern "C" fn generate(prompt_len: u32, new_tokens: u32) -> i32 {
    let (prompt_len, new_tokens) = (prompt_len as usize, new_tokens as usize);
    if prompt_len == 0 || prompt_len > MAX_PROMPT || new_tokens > MAX_NEW {
        return -1;
    }
    match run(prompt_len, new_tokens) {
        Ok(()) => new_tokens as i32,
        Err(_) => -2,
    }
}

fn run(prompt_len: usize, new_tokens: usize) -> Result<(), Error> {
    let mut prompt = [0u32; MAX_PROMPT];
    for (p, shared) in prompt.iter_mut().zip(&PROMPT) {
        *p = shared.load(Ordering::Relaxed);
    }
    let layers = model::layers()?;
    let model = Model::new(model::CONFIG, model::weights(&layers)?)?;
    let mut kv = Arena([0; KV_BYTES]);
    let mut scratch = Arena([0; SCRATCH_BYTES]);
    let mut cache = KvCache::new(&model::CONFIG, MAX_SEQ, model::KV_FORMAT, &mut kv.0)?;
    let mut scratch = Scratch::new(&model::CONFIG, MAX_BATCH, &mut scratch.0)?;
    let mut sampler = Sampler::in_memory(SamplerConfig::greedy(), &mut [])?;
    let mut logits = [0f32; VOCAB];
    let mut next = [0u32];
    for (i, out) in GENERATED.iter().take(new_tokens).enumerate() {
        let input = if i == 0 {
            &prompt[..prompt_len]
        } else {
            &next[..]
        };
        let want = Want::LastLogits(&mut logits);
        model.forward(input, &mut cache, &mut scratch, &Serial, want)?;
        next[0] = sampler.sample(&mut logits, &[])?;
        out.store(next[0], Ordering::Relaxed);
    }
    Ok(())
}
