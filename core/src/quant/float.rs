//! Rows of plain floats: f32, f16 and bf16, little-endian.
use half::{bf16, f16};

/// `x` as little-endian f32 bytes (as many values as both hold).
pub fn f32_to_bytes(x: &[f32], out: &mut [u8]) {
    for (v, o) in x.iter().zip(out.chunks_exact_mut(4)) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

/// Little-endian f32 bytes as values (as many as both hold).
pub fn bytes_to_f32(bytes: &[u8], out: &mut [f32]) {
    for (b, o) in bytes.chunks_exact(4).zip(out.iter_mut()) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// `x` as little-endian f16, rounded to nearest (as many values as both hold).
pub fn quantize_row_f16(x: &[f32], out: &mut [u8]) {
    for (v, o) in x.iter().zip(out.chunks_exact_mut(2)) {
        o.copy_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes());
    }
}

/// Little-endian f16 bytes widened to f32 (as many values as both hold).
pub fn dequantize_row_f16(bytes: &[u8], out: &mut [f32]) {
    for (b, o) in bytes.chunks_exact(2).zip(out.iter_mut()) {
        *o = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
    }
}

/// `x` as little-endian bf16, rounded to nearest (as many values as both hold).
pub fn quantize_row_bf16(x: &[f32], out: &mut [u8]) {
    for (v, o) in x.iter().zip(out.chunks_exact_mut(2)) {
        o.copy_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes());
    }
}

/// Little-endian bf16 bytes widened to f32 (as many values as both hold).
pub fn dequantize_row_bf16(bytes: &[u8], out: &mut [f32]) {
    for (b, o) in bytes.chunks_exact(2).zip(out.iter_mut()) {
        *o = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
    }
}

#[cfg(test)]
mod tests {
    use crate::quant::{dequantize_row, quantize_row, Format};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn half_formats_round_trip_within_their_precision(x in proptest::collection::vec(-6e4f32..6e4, 1..64)) {
            for (format, rel) in [(Format::F16, 1.0 / 2048.0), (Format::BF16, 1.0 / 256.0), (Format::F32, 0.0)] {
                let mut bytes = alloc::vec![0u8; format.row_bytes(x.len()).unwrap()];
                quantize_row(format, &x, &mut bytes).unwrap();
                let mut y = alloc::vec![0f32; x.len()];
                dequantize_row(format, &bytes, &mut y).unwrap();
                for (a, b) in x.iter().zip(&y) {
                    // f16's smallest normal step near zero is 2^-24 absolute.
                    prop_assert!((a - b).abs() <= a.abs() * rel + 6e-8, "{format}: {a} vs {b}");
                }
            }
        }
    }
}
