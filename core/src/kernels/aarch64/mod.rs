//! NEON twins of `scalar`. NEON is part of the aarch64 baseline, so no run-time check is needed.
//! The i8 dot products use the `sdot` instruction when the build targets CPUs that have it
//! (`-C target-feature=+dotprod`, on by default for Apple silicon), and widening multiplies with
//! pairwise adds otherwise. `no_std` has no portable run-time detection of `dotprod`, and its
//! intrinsic is still unstable in Rust, hence compile-time selection and inline assembly.
//!
//! Split by concern, as the x86 kernels are: this file builds the table; `unpack` turns each
//! format's blocks into signed bytes and scales; `quants` holds the quantizers and the quantized
//! dots (with `sdot` or without); `kquants` the k-quants' dots with Q8K activations; `kpanel`
//! their many-token kernels (with `sdot`); `axpy` attention's sum over V; `float` the f32 and
//! bf16 dots.
//! A new format is an `Unpack` impl (a k-quant: a `KBytes` impl) and a table entry.
use core::arch::aarch64::*;

mod axpy;
mod float;
#[cfg(target_feature = "dotprod")]
mod kpanel;
mod kquants;
mod quants;
mod unpack;

use axpy::*;
use float::*;
use kquants::*;
use quants::*;
use unpack::*;

use super::{Kernels, QuantDots, WeightStrides, TILE};
use crate::quant::k_quants::BLOCKS_PER_SUPER;
use crate::quant::{
    f16_at, BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS,
    BlockIQ4NL, BlockIQ4XS, BlockQ16, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K,
    BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0, BlockTQ1_0, BlockTQ2_0, KBlock, QK,
};

pub(super) static KERNELS: Kernels = Kernels {
    name: if cfg!(target_feature = "dotprod") {
        "neon+dotprod"
    } else {
        "neon"
    },
    quantize_q8_0,
    quantize_q16,
    quantize_q8k: crate::quant::q8k::quantize_row,
    q8_0: dots::<BlockQ8_0>(),
    q4_0: dots::<BlockQ4_0>(),
    q4_1: dots::<BlockQ4_1>(),
    q5_0: dots::<BlockQ5_0>(),
    q5_1: dots::<BlockQ5_1>(),
    q2_k: q8k_dots::<BlockQ2K>(),
    q3_k: q8k_dots::<BlockQ3K>(),
    q4_k: q8k_dots::<BlockQ4K>(),
    q5_k: q8k_dots::<BlockQ5K>(),
    q6_k: q8k_dots::<BlockQ6K>(),
    iq4_nl: dots::<BlockIQ4NL>(),
    iq4_xs: q8k_dots::<BlockIQ4XS>(),
    iq3_s: q8k_dots::<BlockIQ3S>(),
    iq3_xxs: q8k_dots::<BlockIQ3XXS>(),
    iq2_xxs: q8k_dots::<BlockIQ2XXS>(),
    iq2_xs: q8k_dots::<BlockIQ2XS>(),
    iq2_s: q8k_dots::<BlockIQ2S>(),
    iq1_s: q8k_dots::<BlockIQ1S>(),
    iq1_m: q8k_dots::<BlockIQ1M>(),
    tq1_0: q8k_dots::<BlockTQ1_0>(),
    tq2_0: q8k_dots::<BlockTQ2_0>(),
    dot_f32: |w, x| dot_f32::<1>(w, [x])[0],
    dot_f32_x4: dot_f32::<TILE>,
    // NEON's f16 conversions need `float16x4_t`, still unstable in Rust: the scalar loop.
    dot_f16: |w, x| super::scalar::dot_f16::<1>(w, [x])[0],
    dot_f16_x4: super::scalar::dot_f16::<TILE>,
    dot_bf16: |w, x| dot_bf16::<1>(w, [x])[0],
    dot_bf16_x4: dot_bf16::<TILE>,
    axpy_q8_0,
    silu_mul: crate::ops::silu_mul,
    exp_sub: crate::ops::exp_sub,
    add_weighted: crate::ops::add_weighted,
    softmax_step: crate::ops::softmax_step,
    // As `dot_f16`: NEON's f16 conversions are still unstable in Rust.
    widen_f16: crate::quant::float::dequantize_row_f16,
};

const fn dots<W: Unpack>() -> QuantDots {
    QuantDots {
        one: |w, x| dot::<W, 1>(w, [x])[0],
        x4: dot::<W, TILE>,
        rows4: |w, x| w.map(|w| dot::<W, 1>(w, [x])[0]),
        rows2x4: |w, x| w.map(|w| dot::<W, TILE>(w, x)),
        panel: None,
        k_panel: None,
    }
}

const fn q8k_dots<K: KBytes>() -> QuantDots {
    QuantDots {
        one: |w, x| dot_q8k::<K, 1>(w, [x])[0],
        x4: dot_q8k::<K, TILE>,
        rows4: |w, x| w.map(|w| dot_q8k::<K, 1>(w, [x])[0]),
        rows2x4: |w, x| w.map(|w| dot_q8k::<K, TILE>(w, x)),
        panel: None,
        #[cfg(target_feature = "dotprod")]
        k_panel: Some(kpanel::k_panel::<K>()),
        #[cfg(not(target_feature = "dotprod"))]
        k_panel: None,
    }
}
