//! Block formats, ggml's byte layout so files interoperate with llama.cpp.
//!
//! Each quantized format stores a row of `n` values as `n / 32` blocks (the k-quants as `n / 256`
//! super-blocks of eight). Rows are passed around as
//! `&[u8]` (a memory map or an owned buffer) and read block by block, so nothing requires the bytes
//! to be aligned.
use core::fmt;

use crate::error::{Error, Result};

pub mod float;
pub mod iq1_m;
pub mod iq1_s;
pub mod iq2_s;
pub mod iq2_xs;
pub mod iq2_xxs;
pub mod iq3_s;
pub mod iq3_xxs;
pub mod iq4_nl;
pub mod iq4_xs;
pub mod iq_grids;
pub mod k_quantize;
pub mod k_quants;
pub mod q16;
pub mod q4_0;
pub mod q4_1;
pub mod q5_0;
pub mod q5_1;
pub mod q8_0;
pub mod q8k;
pub mod tq1_0;
pub mod tq2_0;

pub use iq1_m::BlockIQ1M;
pub use iq1_s::BlockIQ1S;
pub use iq2_s::BlockIQ2S;
pub use iq2_xs::BlockIQ2XS;
pub use iq2_xxs::BlockIQ2XXS;
pub use iq3_s::BlockIQ3S;
pub use iq3_xxs::BlockIQ3XXS;
pub use iq4_nl::BlockIQ4NL;
pub use iq4_xs::BlockIQ4XS;
pub use k_quants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, KBlock};
pub use q16::BlockQ16;
pub use q4_0::BlockQ4_0;
pub use q4_1::BlockQ4_1;
pub use q5_0::BlockQ5_0;
pub use q5_1::BlockQ5_1;
pub use q8_0::BlockQ8_0;
pub use q8k::BlockQ8K;
pub use tq1_0::BlockTQ1_0;
pub use tq2_0::BlockTQ2_0;

/// Values per block of every quantized format here.
pub const QK: usize = 32;

/// One block of 32 values of a quantized format, in ggml's byte layout (Q16 too, in its own):
/// how it is stored, read, made and widened back. The row loops are written once over it
/// (`quantize_blocks`, `dequantize_blocks`); the kernels read blocks in place instead.
pub trait Block: Sized {
    /// Bytes of one block in a file or an arena.
    const BYTES: usize;
    /// The reference quantizer (ggml's `quantize_row_*_ref` on one block).
    fn quantize(x: &[f32; QK]) -> Self;
    /// The block at the start of `b` (at least `BYTES` long).
    fn read(b: &[u8]) -> Self;
    /// Writes the block to the start of `out` (at least `BYTES` long).
    fn write(&self, out: &mut [u8]);
    /// The block's values, as ggml's `dequantize_row_*` computes them.
    fn dequantize(&self, out: &mut [f32; QK]);
}

/// Quantizes the whole blocks both `x` and `out` hold, with the reference quantizer.
pub fn quantize_blocks<B: Block>(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x
        .as_chunks::<QK>()
        .0
        .iter()
        .zip(out.chunks_exact_mut(B::BYTES))
    {
        B::quantize(xb).write(ob);
    }
}

/// Widens the whole blocks both `bytes` and `out` hold.
pub fn dequantize_blocks<B: Block>(bytes: &[u8], out: &mut [f32]) {
    for (b, o) in bytes
        .chunks_exact(B::BYTES)
        .zip(out.as_chunks_mut::<QK>().0)
    {
        B::read(b).dequantize(o);
    }
}

/// How the values of a row are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// 4-byte floats.
    F32,
    /// IEEE half floats.
    F16,
    /// bfloat16.
    BF16,
    /// ggml's Q8_0: 32 signed 8-bit quants and an f16 scale (34 bytes).
    Q8_0,
    /// ggml's Q4_0: 32 4-bit quants offset by 8 and an f16 scale (18 bytes).
    Q4_0,
    /// ggml's Q4_1: 32 4-bit quants, an f16 scale and an f16 minimum (20 bytes).
    Q4_1,
    /// ggml's Q5_0: 32 5-bit quants offset by 16 and an f16 scale (22 bytes).
    Q5_0,
    /// ggml's Q5_1: 32 5-bit quants, an f16 scale and an f16 minimum (24 bytes).
    Q5_1,
    /// ggml's Q2_K: 256 2-bit values in 16 blocks with 4-bit scales and minimums (84 bytes).
    Q2K,
    /// ggml's Q3_K: 256 3-bit values in 16 blocks with 6-bit scales (110 bytes).
    Q3K,
    /// ggml's Q4_K: 256 values in 8 blocks with 6-bit scales and minimums (144 bytes).
    Q4K,
    /// ggml's Q5_K: Q4_K with a fifth bit (176 bytes).
    Q5K,
    /// ggml's Q6_K: 256 6-bit values in 16 blocks with 8-bit scales (210 bytes).
    Q6K,
    /// ggml's IQ4_NL: 32 4-bit indices into a fixed non-uniform grid and an f16 scale (18
    /// bytes).
    IQ4NL,
    /// ggml's IQ4_XS: IQ4_NL's grid in 256 values, 8 blocks with 6-bit scales (136 bytes).
    IQ4XS,
    /// ggml's IQ3_S: 256 values as groups of four from a fixed grid with sign bits, 8 blocks with
    /// 4-bit scales (110 bytes).
    IQ3S,
    /// ggml's IQ3_XXS: 256 values as groups of four from a fixed grid of 256 with sign bits, 8
    /// blocks with 4-bit scales (98 bytes).
    IQ3XXS,
    /// ggml's IQ2_XXS: 256 values as groups of eight from a fixed grid of 256 with sign bits, 8
    /// blocks with 4-bit scales (66 bytes).
    IQ2XXS,
    /// ggml's IQ2_XS: IQ2_XXS with a grid of 512 and 4-bit scales per 16 values (74 bytes).
    IQ2XS,
    /// ggml's IQ2_S: a grid of 1024, explicit sign bits, 4-bit scales per 16 values (82 bytes).
    IQ2S,
    /// ggml's IQ1_S: 256 values as groups of eight from a fixed grid of 2048 of -1, 0 and 1, 8
    /// blocks with 3-bit scales and shifts (50 bytes).
    IQ1S,
    /// ggml's IQ1_M: IQ1_S's grid with a shift per eight values and 3-bit scales per 16 values,
    /// `d` spread over the scales' top bits (56 bytes).
    IQ1M,
    /// ggml's TQ1_0: 256 ternary values, five base-3 digits a byte, one f16 scale (54 bytes).
    TQ1_0,
    /// ggml's TQ2_0: 256 ternary values in two bits each, one f16 scale (66 bytes).
    TQ2_0,
}

/// The quantized form of the activations a quantized weight multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivationFormat {
    /// 16-bit quants per 32 values (`q16`).
    Q16,
    /// 8-bit quants per 256 values with sums per 16 (`q8k`).
    Q8K,
}

impl ActivationFormat {
    /// Values per block.
    pub const fn block_len(self) -> usize {
        match self {
            ActivationFormat::Q16 => QK,
            ActivationFormat::Q8K => k_quants::QK_K,
        }
    }

    /// The format's name, as error messages give it.
    pub const fn name(self) -> &'static str {
        match self {
            ActivationFormat::Q16 => "Q16 activations",
            ActivationFormat::Q8K => "Q8K activations",
        }
    }

    /// Bytes of `n` values (whole blocks only).
    pub const fn row_bytes(self, n: usize) -> usize {
        match self {
            ActivationFormat::Q16 => q16::row_bytes(n),
            ActivationFormat::Q8K => q8k::row_bytes(n),
        }
    }
}

impl Format {
    /// Values per block (1 for the float formats).
    pub const fn block_len(self) -> usize {
        match self {
            Format::F32 | Format::F16 | Format::BF16 => 1,
            Format::Q8_0
            | Format::Q4_0
            | Format::Q4_1
            | Format::Q5_0
            | Format::Q5_1
            | Format::IQ4NL => QK,
            Format::Q2K
            | Format::Q3K
            | Format::Q4K
            | Format::Q5K
            | Format::Q6K
            | Format::IQ4XS
            | Format::IQ3S
            | Format::IQ3XXS
            | Format::IQ2XXS
            | Format::IQ2XS
            | Format::IQ2S
            | Format::IQ1S
            | Format::IQ1M
            | Format::TQ1_0
            | Format::TQ2_0 => k_quants::QK_K,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            Format::F32 => 4,
            Format::F16 | Format::BF16 => 2,
            Format::Q8_0 => BlockQ8_0::BYTES,
            Format::Q4_0 => BlockQ4_0::BYTES,
            Format::Q4_1 => BlockQ4_1::BYTES,
            Format::Q5_0 => BlockQ5_0::BYTES,
            Format::Q5_1 => BlockQ5_1::BYTES,
            Format::Q2K => <k_quants::BlockQ2K as KBlock>::BYTES,
            Format::Q3K => <k_quants::BlockQ3K as KBlock>::BYTES,
            Format::Q4K => <k_quants::BlockQ4K as KBlock>::BYTES,
            Format::Q5K => <k_quants::BlockQ5K as KBlock>::BYTES,
            Format::Q6K => <k_quants::BlockQ6K as KBlock>::BYTES,
            Format::IQ4NL => BlockIQ4NL::BYTES,
            Format::IQ4XS => <BlockIQ4XS as KBlock>::BYTES,
            Format::IQ3S => <BlockIQ3S as KBlock>::BYTES,
            Format::IQ3XXS => <BlockIQ3XXS as KBlock>::BYTES,
            Format::IQ2XXS => <BlockIQ2XXS as KBlock>::BYTES,
            Format::IQ2XS => <BlockIQ2XS as KBlock>::BYTES,
            Format::IQ2S => <BlockIQ2S as KBlock>::BYTES,
            Format::IQ1S => <BlockIQ1S as KBlock>::BYTES,
            Format::IQ1M => <BlockIQ1M as KBlock>::BYTES,
            Format::TQ1_0 => <BlockTQ1_0 as KBlock>::BYTES,
            Format::TQ2_0 => <BlockTQ2_0 as KBlock>::BYTES,
        }
    }

    /// Whether values come in blocks with scales (not a float format).
    pub const fn is_quantized(self) -> bool {
        self.block_len() > 1
    }

    /// The format the activations of a quantized weight in this format take: Q16 for the
    /// 32-value blocks, Q8K for the 256-value super-blocks (see `q8k` for why they differ);
    /// `None` for the float formats, which take f32.
    pub const fn activation_format(self) -> Option<ActivationFormat> {
        match self.block_len() {
            1 => None,
            QK => Some(ActivationFormat::Q16),
            _ => Some(ActivationFormat::Q8K),
        }
    }

    /// Byte offsets of the f16 scales (and minimums) in each block of a quantized format; the
    /// rest of a block is small integers, finite whatever its bits. IQ1_M has none: its `d` is
    /// four nibbles apart (`BlockIQ1M::d_bits`).
    pub const fn scale_offsets(self) -> &'static [usize] {
        match self {
            Format::F32 | Format::F16 | Format::BF16 | Format::IQ1M => &[],
            Format::Q8_0
            | Format::Q4_0
            | Format::Q5_0
            | Format::IQ4NL
            | Format::IQ4XS
            | Format::IQ3S
            | Format::IQ3XXS
            | Format::IQ2XXS
            | Format::IQ2XS
            | Format::IQ2S
            | Format::IQ1S => &[0],
            Format::Q4_1 | Format::Q5_1 | Format::Q4K | Format::Q5K => &[0, 2],
            Format::Q2K => &[80, 82],
            Format::Q3K => &[108],
            Format::Q6K => &[208],
            Format::TQ1_0 => &[52],
            Format::TQ2_0 => &[64],
        }
    }

    /// The first value (float formats) or block (quantized formats, by its scales) of `bytes`
    /// that is NaN or infinite: weights no computation should be trusted with.
    pub fn first_non_finite(self, bytes: &[u8]) -> Option<usize> {
        let f16_bad = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]) & 0x7c00 == 0x7c00;
        match self {
            Format::F32 => bytes
                .chunks_exact(4)
                .position(|b| !f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite()),
            Format::F16 => bytes.chunks_exact(2).position(f16_bad),
            Format::BF16 => bytes
                .chunks_exact(2)
                .position(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7f80 == 0x7f80),
            Format::IQ1M => bytes
                .chunks_exact(self.block_bytes())
                .position(|b| f16_bad(&BlockIQ1M::d_bits(BlockIQ1M::scale_words(b)).to_le_bytes())),
            _ => bytes
                .chunks_exact(self.block_bytes())
                .position(|b| self.scale_offsets().iter().any(|&o| f16_bad(&b[o..]))),
        }
    }

    /// Bytes of one row of `n` values.
    ///
    /// # Errors
    /// [`Error::NotBlockMultiple`] if `n` is not a whole number of blocks.
    pub const fn row_bytes(self, n: usize) -> Result<usize> {
        let block = self.block_len();
        if !n.is_multiple_of(block) {
            return Err(Error::NotBlockMultiple {
                what: "row",
                len: n,
                block,
            });
        }
        Ok(n / block * self.block_bytes())
    }

    /// ggml's name of the format (`q8_0`, `q4_K`, `f16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Format::F32 => "f32",
            Format::F16 => "f16",
            Format::BF16 => "bf16",
            Format::Q8_0 => "q8_0",
            Format::Q4_0 => "q4_0",
            Format::Q4_1 => "q4_1",
            Format::Q5_0 => "q5_0",
            Format::Q5_1 => "q5_1",
            Format::Q2K => "q2_K",
            Format::Q3K => "q3_K",
            Format::Q4K => "q4_K",
            Format::Q5K => "q5_K",
            Format::Q6K => "q6_K",
            Format::IQ4NL => "iq4_nl",
            Format::IQ4XS => "iq4_xs",
            Format::IQ3S => "iq3_s",
            Format::IQ3XXS => "iq3_xxs",
            Format::IQ2XXS => "iq2_xxs",
            Format::IQ2XS => "iq2_xs",
            Format::IQ2S => "iq2_s",
            Format::IQ1S => "iq1_s",
            Format::IQ1M => "iq1_m",
            Format::TQ1_0 => "tq1_0",
            Format::TQ2_0 => "tq2_0",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Every quantized weight format (the block formats; all but F32, F16 and BF16).
pub const QUANTIZED: [Format; 21] = [
    Format::Q8_0,
    Format::Q4_0,
    Format::Q4_1,
    Format::Q5_0,
    Format::Q5_1,
    Format::Q2K,
    Format::Q3K,
    Format::Q4K,
    Format::Q5K,
    Format::Q6K,
    Format::IQ4NL,
    Format::IQ4XS,
    Format::IQ3S,
    Format::IQ3XXS,
    Format::IQ2XXS,
    Format::IQ2XS,
    Format::IQ2S,
    Format::IQ1S,
    Format::IQ1M,
    Format::TQ1_0,
    Format::TQ2_0,
];

/// Quantizes (or converts) `x` into `out` in `format`, as llama.cpp's quantizers do without an
/// importance matrix. Q2_K, Q3_K and the grid i-quants (IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S,
/// IQ1_S) are read, never written, here: an error.
///
/// # Errors
/// [`Error::NotBlockMultiple`] if `x` is not whole blocks, [`Error::Length`] if `out` is not
/// their size, [`Error::UnsupportedFormat`] for the formats read, never written.
pub fn quantize_row(format: Format, x: &[f32], out: &mut [u8]) -> Result<()> {
    check_row(format, x.len(), out.len())?;
    match format {
        Format::Q4K => k_quantize::quantize_blocks(
            x,
            out,
            <k_quants::BlockQ4K as k_quants::KBlock>::BYTES,
            k_quantize::quantize_q4k,
        ),
        Format::Q6K => k_quantize::quantize_blocks(
            x,
            out,
            <k_quants::BlockQ6K as k_quants::KBlock>::BYTES,
            k_quantize::quantize_q6k,
        ),
        Format::IQ4XS => {
            k_quantize::quantize_blocks(x, out, <BlockIQ4XS as KBlock>::BYTES, iq4_xs::quantize)
        }
        Format::Q5K => k_quantize::quantize_blocks(
            x,
            out,
            <k_quants::BlockQ5K as k_quants::KBlock>::BYTES,
            k_quantize::quantize_q5k,
        ),
        Format::Q2K
        | Format::Q3K
        | Format::IQ3S
        | Format::IQ3XXS
        | Format::IQ2XXS
        | Format::IQ2XS
        | Format::IQ2S
        | Format::IQ1S
        | Format::IQ1M
        | Format::TQ1_0
        | Format::TQ2_0 => {
            return Err(Error::UnsupportedFormat {
                what: "quantizing to",
                format,
            })
        }
        Format::F32 => float::f32_to_bytes(x, out),
        Format::F16 => float::quantize_row_f16(x, out),
        Format::BF16 => float::quantize_row_bf16(x, out),
        Format::Q8_0 => quantize_blocks::<BlockQ8_0>(x, out),
        Format::Q4_0 => quantize_blocks::<BlockQ4_0>(x, out),
        Format::Q4_1 => quantize_blocks::<BlockQ4_1>(x, out),
        Format::Q5_0 => quantize_blocks::<BlockQ5_0>(x, out),
        Format::Q5_1 => quantize_blocks::<BlockQ5_1>(x, out),
        Format::IQ4NL => quantize_blocks::<BlockIQ4NL>(x, out),
    }
    Ok(())
}

/// Converts a row stored in `format` back to f32.
///
/// # Errors
/// [`Error::NotBlockMultiple`] if `out` is not whole blocks, [`Error::Length`] if `bytes` is
/// not their size.
pub fn dequantize_row(format: Format, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    check_row(format, out.len(), bytes.len())?;
    match format {
        Format::F32 => float::bytes_to_f32(bytes, out),
        Format::F16 => float::dequantize_row_f16(bytes, out),
        Format::BF16 => float::dequantize_row_bf16(bytes, out),
        Format::Q8_0 => dequantize_blocks::<BlockQ8_0>(bytes, out),
        Format::Q4_0 => dequantize_blocks::<BlockQ4_0>(bytes, out),
        Format::Q4_1 => dequantize_blocks::<BlockQ4_1>(bytes, out),
        Format::Q5_0 => dequantize_blocks::<BlockQ5_0>(bytes, out),
        Format::Q5_1 => dequantize_blocks::<BlockQ5_1>(bytes, out),
        Format::Q2K => k_quants::dequantize_blocks::<k_quants::BlockQ2K>(bytes, out),
        Format::Q3K => k_quants::dequantize_blocks::<k_quants::BlockQ3K>(bytes, out),
        Format::Q4K => k_quants::dequantize_blocks::<k_quants::BlockQ4K>(bytes, out),
        Format::Q5K => k_quants::dequantize_blocks::<k_quants::BlockQ5K>(bytes, out),
        Format::Q6K => k_quants::dequantize_blocks::<k_quants::BlockQ6K>(bytes, out),
        Format::IQ4NL => dequantize_blocks::<BlockIQ4NL>(bytes, out),
        Format::IQ4XS => k_quants::dequantize_blocks::<BlockIQ4XS>(bytes, out),
        Format::IQ3S => k_quants::dequantize_blocks::<BlockIQ3S>(bytes, out),
        Format::IQ3XXS => k_quants::dequantize_blocks::<BlockIQ3XXS>(bytes, out),
        Format::IQ2XXS => k_quants::dequantize_blocks::<BlockIQ2XXS>(bytes, out),
        Format::IQ2XS => k_quants::dequantize_blocks::<BlockIQ2XS>(bytes, out),
        Format::IQ2S => k_quants::dequantize_blocks::<BlockIQ2S>(bytes, out),
        Format::IQ1S => k_quants::dequantize_blocks::<BlockIQ1S>(bytes, out),
        Format::IQ1M => k_quants::dequantize_blocks::<BlockIQ1M>(bytes, out),
        Format::TQ1_0 => k_quants::dequantize_blocks::<BlockTQ1_0>(bytes, out),
        Format::TQ2_0 => k_quants::dequantize_blocks::<BlockTQ2_0>(bytes, out),
    }
    Ok(())
}

fn check_row(format: Format, n: usize, bytes: usize) -> Result<()> {
    let expected = format.row_bytes(n)?;
    if bytes != expected {
        return Err(Error::Length {
            what: "quantized row bytes",
            expected,
            got: bytes,
        });
    }
    Ok(())
}

/// Reads the little-endian f16 at `b[0..2]` as f32.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

#[cfg(test)]
pub(crate) mod test_data {
    /// ggml's synthetic test signal (llama.cpp `tests/test-quantize-fns.cpp`).
    pub fn ggml_signal(offset: f32, n: usize) -> alloc::vec::Vec<f32> {
        (0..n)
            .map(|i| 0.1 + 2.0 * libm::cosf(i as f32 + offset))
            .collect()
    }

    /// ggml's error measure: sqrt(sum of squared differences) / n.
    pub fn array_rmse(a: &[f32], b: &[f32]) -> f32 {
        let sum: f64 = a
            .iter()
            .zip(b)
            .map(|(x, y)| ((x - y) as f64) * ((x - y) as f64))
            .sum();
        (libm::sqrt(sum) / a.len() as f64) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::test_data::{array_rmse, ggml_signal};
    use super::*;
    use alloc::vec;

    /// llama.cpp's `test-quantize-fns`: the reference quantizers' total error on its synthetic
    /// signal stays under `MAX_QUANTIZATION_TOTAL_ERROR` (0.002) for every format here.
    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri; run natively")]
    fn ggml_total_quantization_error() {
        let x = ggml_signal(0.0, 4096);
        for format in [
            Format::Q8_0,
            Format::Q4_0,
            Format::Q4_1,
            Format::Q5_0,
            Format::Q5_1,
            Format::Q4K,
            Format::Q5K,
            Format::Q6K,
            Format::IQ4NL,
            Format::IQ4XS,
        ] {
            let mut q = vec![0u8; format.row_bytes(x.len()).unwrap()];
            let mut y = vec![0f32; x.len()];
            quantize_row(format, &x, &mut q).unwrap();
            dequantize_row(format, &q, &mut y).unwrap();
            let rmse = array_rmse(&x, &y);
            assert!(rmse < 0.002, "{format}: {rmse}");
        }
    }

    #[test]
    fn non_finite_scales_and_values_are_found() {
        for format in QUANTIZED {
            // Two blocks of ones: every byte 0x3c, every f16 in them 1.0.
            let bytes = alloc::vec![0x3cu8; 2 * format.block_bytes()];
            assert_eq!(format.first_non_finite(&bytes), None, "{format}");
            for &o in format.scale_offsets() {
                for bits in [0x7e00u16, 0x7c00, 0xfc00] {
                    let mut bad = bytes.clone();
                    let at = format.block_bytes() + o;
                    bad[at..at + 2].copy_from_slice(&bits.to_le_bytes());
                    assert_eq!(
                        format.first_non_finite(&bad),
                        Some(1),
                        "{format} {o} {bits:x}"
                    );
                }
            }
        }
        let iq1m = alloc::vec![0x3cu8; 2 * Format::IQ1M.block_bytes()];
        for bits in [0x7e00u16, 0x7c00, 0xfc00] {
            let mut bad = iq1m.clone();
            BlockIQ1M::set_d_bits(&mut bad[Format::IQ1M.block_bytes()..], bits);
            assert_eq!(Format::IQ1M.first_non_finite(&bad), Some(1), "{bits:x}");
        }
        let f32s: alloc::vec::Vec<u8> = [1.0f32, f32::NAN]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(Format::F32.first_non_finite(&f32s), Some(1));
        assert_eq!(Format::F16.first_non_finite(&[0, 0x3c, 0, 0x7c]), Some(1));
        assert_eq!(
            Format::BF16.first_non_finite(&[0, 0x3f, 0x80, 0xff]),
            Some(1)
        );
    }
}
