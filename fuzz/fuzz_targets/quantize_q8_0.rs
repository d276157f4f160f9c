#![no_main]
//! Q8_0: any f32 bit patterns never panic; the SIMD quantizer is bit-exact with the reference;
//! finite blocks come back within half a step plus the f16 rounding of the scale.
use libfuzzer_sys::fuzz_target;
use sapient_core::kernels::Kernels;
use sapient_core::quant::{quantize_row, Format};

#[path = "common.rs"]
mod common;
use common::*;

fuzz_target!(|data: &[u8]| {
    let x = values(data);
    round_trip(Format::Q8_0, &x, |xb| {
        let (amax, _, _) = stats(xb);
        let d = amax / 127.0;
        (d <= F16_MAX).then(|| d / 2.0 + amax * F16_REL + 127.0 * F16_ABS + amax * 1e-6)
    });
    let mut reference = vec![0u8; Format::Q8_0.row_bytes(x.len()).unwrap()];
    quantize_row(Format::Q8_0, &x, &mut reference).unwrap();
    let mut simd = vec![0u8; reference.len()];
    Kernels::best().quantize_q8_0(&x, &mut simd).unwrap();
    assert_eq!(simd, reference);
});
