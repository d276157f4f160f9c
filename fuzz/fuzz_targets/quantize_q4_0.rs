#![no_main]
//! Q4_0: any f32 bit patterns never panic; finite blocks come back within one step (values of
//! the sign opposite to the largest clamp to the grid's end) plus the f16 rounding of the scale.
use libfuzzer_sys::fuzz_target;
use sapient_core::quant::Format;

#[path = "common.rs"]
mod common;
use common::*;

fuzz_target!(|data: &[u8]| {
    round_trip(Format::Q4_0, &values(data), |xb| {
        let (amax, _, _) = stats(xb);
        let d = amax / 8.0;
        (d <= F16_MAX).then(|| d + amax * F16_REL + 8.0 * F16_ABS + amax * 1e-6)
    });
});
