//! Links sapient-core into a `#![no_std]` staticlib, as firmware would.
#![no_std]

use core::alloc::{GlobalAlloc, Layout};
use core::panic::PanicInfo;

use sapient_core::quant::{quantize_row, Format};
use sapient_core::{Config, KvCache, KvFormat, RopeStyle};

/// An allocator that has no memory: enough to link `alloc`, which sapient-core uses.
struct NoMemory;

// SAFETY: `alloc` always reports failure (null), which GlobalAlloc allows; `dealloc` is never
// reached because nothing was ever allocated.
unsafe impl GlobalAlloc for NoMemory {
    unsafe fn alloc(&self, _: Layout) -> *mut u8 {
        core::ptr::null_mut()
    }
    unsafe fn dealloc(&self, _: *mut u8, _: Layout) {}
}

#[global_allocator]
static ALLOCATOR: NoMemory = NoMemory;

#[panic_handler]
fn panic(_: &PanicInfo) -> ! {
    loop {}
}

/// Bytes a 2-layer model's Q8_0 KV cache needs for 64 positions, and one quantized block.
#[no_mangle]
pub extern "C" fn sapient_check(out: *mut u8) -> usize {
    let config = Config {
        vocab_size: 512,
        hidden_size: 128,
        intermediate_size: 192,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 32,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_style: RopeStyle::Halves,
        rope_scaling: None,
        tie_word_embeddings: true,
        qkv_bias: false,
        sliding_window: None,
        max_position_embeddings: 256,
    };
    let mut block = [0u8; 34];
    let _ = quantize_row(Format::Q8_0, &[0.5; 32], &mut block);
    if !out.is_null() {
        // SAFETY: the C caller passes 34 writable bytes or null.
        unsafe { core::ptr::copy_nonoverlapping(block.as_ptr(), out, block.len()) };
    }
    KvCache::bytes_needed(&config, 64, KvFormat::Q8_0).unwrap_or(0)
}
