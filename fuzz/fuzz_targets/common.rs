//! Shared by the quantizer targets: raw bytes -> f32 bit patterns, and the round-trip check.
use sapient_core::quant::{dequantize_row, quantize_row, Format, QK};

/// Every 4 bytes of input as an f32 bit pattern (NaN, ±inf and subnormals included), zero-padded
/// to whole blocks.
pub fn values(data: &[u8]) -> Vec<f32> {
    let mut x: Vec<f32> = data
        .chunks_exact(4)
        .map(|b| f32::from_bits(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
        .collect();
    x.resize(x.len().div_ceil(QK) * QK, 0.0);
    x
}

/// Quantizes and dequantizes `x` in `format` (never panics), then, for every block of finite
/// values whose scale f16 can hold, checks each value against `bound(block) `.
pub fn round_trip(format: Format, x: &[f32], bound: impl Fn(&[f32]) -> Option<f32>) {
    let mut q = vec![0u8; format.row_bytes(x.len()).unwrap()];
    quantize_row(format, x, &mut q).unwrap();
    let mut y = vec![0f32; x.len()];
    dequantize_row(format, &q, &mut y).unwrap();
    for (xb, yb) in x.chunks_exact(QK).zip(y.chunks_exact(QK)) {
        if !xb.iter().all(|v| v.is_finite()) {
            continue;
        }
        if let Some(bound) = bound(xb) {
            for (a, b) in xb.iter().zip(yb) {
                assert!(
                    (a - b).abs() <= bound,
                    "{format}: {a} came back as {b} (bound {bound})"
                );
            }
        }
    }
}

/// The largest magnitude in a block, and its min and max.
pub fn stats(xb: &[f32]) -> (f32, f32, f32) {
    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
    let min = xb.iter().fold(f32::MAX, |m, v| m.min(*v));
    let max = xb.iter().fold(-f32::MAX, |m, v| m.max(*v));
    (amax, min, max)
}

/// f16's relative rounding (2^-11) and its absolute step near zero (2^-24), with room.
pub const F16_REL: f32 = 1.0 / 2048.0;
pub const F16_ABS: f32 = 1e-7;
/// The largest finite f16.
pub const F16_MAX: f32 = 65504.0;
