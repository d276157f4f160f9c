//! sapient-core on a Cortex-M4F: the GGUF `scripts/embedded-demo.sh` wrote (Q8_0 matrices) in
//! flash, borrowed in place (`sapient-model-image`); the KV cache and the scratch in `static` arenas sized by the core's
//! `const fn`s; the `Serial` executor; a global allocator that fails every request. It runs a
//! prompt, greedily decodes `NEW_TOKENS` tokens and prints `tokens: <ids>` over semihosting, then
//! the SysTick ticks the prompt and each decoded token took.
#![no_std]
#![no_main]

use core::panic::PanicInfo;

use cortex_m::peripheral::syst::SystClkSource;
use cortex_m::peripheral::SYST;
use cortex_m_rt::entry;
use cortex_m_semihosting::{debug, hprint, hprintln};
use sapient_core::sample::{Sampler, SamplerConfig};
use sapient_core::{Error, KvCache, Model, Scratch, Serial, Want};
use sapient_model_image::{self as model, Arena, NoHeap};

const PROMPT: [u32; 7] = [1, 5, 9, 13, 17, 21, 25];
const NEW_TOKENS: usize = 16;
const MAX_SEQ: usize = PROMPT.len() + NEW_TOKENS;
const MAX_BATCH: usize = PROMPT.len();
const VOCAB: usize = model::CONFIG.vocab_size;
const KV_BYTES: usize = model::kv_bytes(MAX_SEQ);
const SCRATCH_BYTES: usize = model::scratch_bytes(MAX_BATCH);

/// No heap: every allocation fails. Nothing from `Model::new` to sampling asks for one.
#[global_allocator]
static ALLOCATOR: NoHeap = NoHeap;

#[panic_handler]
fn panic(info: &PanicInfo) -> ! {
    hprintln!("panic: {}", info);
    debug::exit(debug::EXIT_FAILURE);
    halt()
}

#[entry]
fn main() -> ! {
    let status = match run() {
        Ok(()) => debug::EXIT_SUCCESS,
        Err(e) => {
            hprintln!("error: {}", e);
            debug::EXIT_FAILURE
        }
    };
    debug::exit(status);
    halt()
}

/// Where a board without a debugger attached stays once the run is over (`debug::exit` ends
/// qemu before this).
fn halt() -> ! {
    loop {
        cortex_m::asm::wfi();
    }
}

fn run() -> Result<(), Error> {
    let taken = Error::InvalidArgument {
        what: "arena",
        reason: "already taken",
    };
    let kv = cortex_m::singleton!(: Arena<KV_BYTES> = Arena([0; KV_BYTES])).ok_or(taken)?;
    let scratch =
        cortex_m::singleton!(: Arena<SCRATCH_BYTES> = Arena([0; SCRATCH_BYTES])).ok_or(taken)?;

    let layers = model::layers()?;
    let weights = model::weights(&layers)?;
    let model = Model::new(model::CONFIG, weights)?;
    let mut cache = KvCache::new(&model::CONFIG, MAX_SEQ, model::KV_FORMAT, &mut kv.0)?;
    let mut scratch = Scratch::new(&model::CONFIG, MAX_BATCH, &mut scratch.0)?;
    let mut sampler = Sampler::in_memory(SamplerConfig::greedy(), &mut [])?;

    // SysTick counts down the core clock; 24 bits, so each step is timed on its own.
    let mut syst = cortex_m::Peripherals::take().ok_or(taken)?.SYST;
    syst.set_clock_source(SystClkSource::Core);
    syst.set_reload(SYST_MAX);
    syst.clear_current();
    syst.enable_counter();

    let mut logits = [0f32; VOCAB];
    let mut next = [0u32];
    let mut ticks = [0u32; NEW_TOKENS];
    hprint!("tokens:");
    for (i, t) in ticks.iter_mut().enumerate() {
        let input = if i == 0 { &PROMPT[..] } else { &next[..] };
        let want = Want::LastLogits(&mut logits);
        syst.clear_current();
        let start = SYST::get_current();
        model.forward(input, &mut cache, &mut scratch, &Serial, want)?;
        next[0] = sampler.sample(&mut logits, &[])?;
        // Modulo 2^24: right unless the counter went round (COUNTFLAG says so).
        *t = if syst.has_wrapped() {
            u32::MAX
        } else {
            start.wrapping_sub(SYST::get_current()) & SYST_MAX
        };
        hprint!(" {}", next[0]);
    }
    hprintln!();
    let decode = &ticks[1..];
    let decode_total: u64 = decode.iter().map(|&t| u64::from(t)).sum();
    hprintln!(
        "systick: prompt of {} tokens {} ticks, {} per decoded token (mean of {}){}",
        PROMPT.len(),
        ticks[0],
        decode_total / decode.len() as u64,
        decode.len(),
        if ticks.contains(&u32::MAX) {
            " (a step overflowed the 24-bit counter)"
        } else {
            ""
        }
    );
    Ok(())
}

/// SysTick's largest reload value.
const SYST_MAX: u32 = 0x00FF_FFFF;
