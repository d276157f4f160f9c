//! sapient-core: the `no_std` heart of sapient.
//!
//! Block formats compatible with ggml (`quant`), dot-product and mat-mul kernels with a scalar
//! reference and SIMD twins (`kernels`), the element-wise operations of a Llama layer (`ops`), and
//! the layer loop itself (`model`) over memory the caller provides (`KvCache`, `Scratch`).
//!
//! The core never allocates the KV cache or the activation scratch: the caller asks how many bytes
//! they need (`KvCache::bytes_needed`, `Scratch::bytes_needed`), allocates them however it likes,
//! and lends them.
#![no_std]
#![forbid(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, clippy::missing_errors_doc, clippy::missing_panics_doc)]

#[cfg(test)]
extern crate std;

extern crate alloc;

pub mod arena;
pub mod attention;
pub mod backend;
pub mod config;
mod cpu;
pub mod error;
pub mod exec;
pub mod kernels;
pub mod kv_cache;
pub mod matrix;
pub mod model;
pub mod ops;
pub mod quant;
pub mod sample;
pub mod weights;

pub use arena::Scratch;
pub use backend::{Backend, Segment};
pub use config::{Config, Llama3Scaling, RopeScaling, RopeStyle, YarnScaling};
pub use error::{Error, Result};
pub use exec::{Exec, Serial};
pub use kv_cache::{KvCache, KvFormat};
pub use model::{Model, Want};
pub use quant::Format;
pub use weights::{LayerWeights, Layers, Matrix, Weights};

/// The README's example of the core without a heap, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeExample;
