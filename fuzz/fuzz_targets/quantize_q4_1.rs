#![no_main]
//! Q4_1: any f32 bit patterns never panic; finite blocks come back within half a step plus the
//! f16 rounding of the scale and of the minimum.
use libfuzzer_sys::fuzz_target;
use sapient_core::quant::Format;

#[path = "common.rs"]
mod common;
use common::*;

fuzz_target!(|data: &[u8]| {
    round_trip(Format::Q4_1, &values(data), |xb| {
        let (_, min, max) = stats(xb);
        let d = (max - min) / 15.0;
        let fits = d.is_finite() && d <= F16_MAX && min.abs() <= F16_MAX;
        fits.then(|| {
            d / 2.0 + (min.abs() + max - min) * F16_REL + 16.0 * F16_ABS + (max - min) * 1e-6
        })
    });
});
