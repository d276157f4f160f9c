//! A model compiled into a program without an operating system: the GGUF that
//! `scripts/embedded-demo.sh` (or `scripts/wasm-demo.sh`) wrote into `embedded/model/`,
//! `include_bytes!`'d, and the module `scripts/gguf-to-rust.py` wrote beside it (the `Config` as
//! a `const`, each matrix's byte range, the norms). `layers` and `weights` borrow the bytes in
//! place: nothing is copied or allocated. With the arenas' sizes for it and the allocator that
//! proves it needs none, shared by the firmware and the WebAssembly module.
#![no_std]

extern crate alloc;

use alloc::borrow::Cow;
use core::alloc::{GlobalAlloc, Layout};

use sapient_core::{
    Config, Error, Format, KvCache, KvFormat, LayerWeights, Layers, Matrix, RopeStyle, Scratch,
    Weights,
};

/// The model file, in flash (or in the WebAssembly module's data).
static GGUF: &[u8] = include_bytes!("../../model/model.gguf");

/// What `scripts/gguf-to-rust.py` wrote from that file.
mod generated {
    use super::{Config, Format, LayerTensors, RopeStyle, Tensor};
    include!("../../model/model.rs");
}

pub use generated::CONFIG;

/// Layers of the model.
pub const N_LAYERS: usize = generated::LAYERS.len();

/// The KV cache's format, as the host chooses it: Q8_0 when a head is whole blocks, f32
/// otherwise.
pub const KV_FORMAT: KvFormat = KvFormat::default_for(&CONFIG);

/// Bytes of a KV cache of `max_seq` positions in `KV_FORMAT`, for a `static` arena.
///
/// # Panics
/// If the model's configuration is invalid: at compile time, in a `const`.
pub const fn kv_bytes(max_seq: usize) -> usize {
    match KvCache::bytes_needed(&CONFIG, max_seq, KV_FORMAT) {
        Ok(n) => n,
        Err(_) => panic!("the model's config does not fit a KV cache"),
    }
}

/// Bytes of a scratch for batches of up to `max_batch` tokens, for a `static` arena.
///
/// # Panics
/// As `kv_bytes`.
pub const fn scratch_bytes(max_batch: usize) -> usize {
    match Scratch::bytes_needed(&CONFIG, max_batch) {
        Ok(n) => n,
        Err(_) => panic!("the model's config does not fit a scratch"),
    }
}

/// An arena with the alignment the scratch needs (4 bytes).
#[repr(C, align(4))]
pub struct Arena<const N: usize>(pub [u8; N]);

/// An allocator without memory: every allocation fails. A program that registers it
/// (`#[global_allocator]`) proves that nothing from `Model::new` to sampling allocates.
pub struct NoHeap;

// SAFETY: `alloc` always reports failure (null), which GlobalAlloc allows; `dealloc` is never
// reached because nothing was ever allocated.
unsafe impl GlobalAlloc for NoHeap {
    unsafe fn alloc(&self, _: Layout) -> *mut u8 {
        core::ptr::null_mut()
    }
    unsafe fn dealloc(&self, _: *mut u8, _: Layout) {}
}
/// A matrix's place in the GGUF.
struct Tensor {
    format: Format,
    start: usize,
    end: usize,
    rows: usize,
    cols: usize,
}

impl Tensor {
    fn matrix(&self) -> Result<Matrix<'static>, Error> {
        let bytes = GGUF
            .get(self.start..self.end)
            .ok_or(Error::InvalidArgument {
                what: "model tensor",
                reason: "its byte range is not inside the GGUF",
            })?;
        Matrix::new(self.format, self.rows, self.cols, Cow::Borrowed(bytes))
    }
}

struct LayerTensors {
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
}

/// The layers, borrowing the GGUF's bytes and the generated norms.
///
/// # Errors
/// An error naming a matrix whose byte range or shape does not fit (the generated module and
/// the GGUF disagree).
pub fn layers() -> Result<heapless::Vec<LayerWeights<'static>, N_LAYERS>, Error> {
    let mut layers = heapless::Vec::new();
    for (t, [attn_norm, ffn_norm]) in generated::LAYERS.iter().zip(&generated::LAYER_NORMS) {
        let layer = LayerWeights {
            attn_norm: Cow::Borrowed(attn_norm),
            wq: t.wq.matrix()?,
            wk: t.wk.matrix()?,
            wv: t.wv.matrix()?,
            wo: t.wo.matrix()?,
            bq: None,
            bk: None,
            bv: None,
            ffn_norm: Cow::Borrowed(ffn_norm),
            w_gate: t.w_gate.matrix()?,
            w_up: t.w_up.matrix()?,
            w_down: t.w_down.matrix()?,
        };
        // Cannot fail: the vector holds exactly the model's layers.
        let _ = layers.push(layer);
    }
    Ok(layers)
}

/// The model's weights over `layers` (from [`layers`]).
///
/// # Errors
/// As [`layers`], for the embedding and the output projection.
pub fn weights<'a>(layers: &'a [LayerWeights<'static>]) -> Result<Weights<'a>, Error> {
    Ok(Weights {
        embed: generated::EMBED.matrix()?,
        layers: Layers::Borrowed(layers),
        norm: Cow::Borrowed(&generated::NORM),
        lm_head: match &generated::OUTPUT {
            Some(t) => Some(t.matrix()?),
            None => None,
        },
        rope_freq_factors: None,
    })
}
