//! Dot products and mat-muls for every weight format, with a scalar reference (`scalar`) and SIMD
//! twins (`x86`: AVX2+FMA+F16C, `aarch64`: NEON), collected in a table of function pointers that
//! is picked once from the CPU's features (`Kernels::best`).
//!
//! Quantized weights are multiplied with activations quantized to Q8_0 per 32-block, as ggml
//! does; f32 weights with f32 activations; f16/bf16 weights are widened to f32 row by row.
use crate::error::{Error, Result};
use crate::quant::{self, BlockQ8_0, Format, QK};
use crate::weights::Matrix;

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
pub mod scalar;
#[cfg(target_arch = "x86_64")]
pub mod x86;

/// How many activation rows a tiled kernel takes at once.
pub const TILE: usize = 4;

type DotQ = fn(&[u8], &[u8]) -> f32;
type DotQx4 = fn(&[u8], [&[u8]; TILE]) -> [f32; TILE];
/// Q4_1 also takes each activation block's `d·Σq` (see `q8_0_block_sums`): its minimum term is
/// `m·d·Σq`, the same for every weight row, so it is computed once per activation row.
type DotQ4_1 = fn(&[u8], &[u8], &[f32]) -> f32;
type DotQ4_1x4 = fn(&[u8], [&[u8]; TILE], [&[f32]; TILE]) -> [f32; TILE];
/// Four weight rows against one activation row, and two against `TILE`: each activation block is
/// loaded once for all the rows.
type DotQ4x1 = fn([&[u8]; 4], &[u8]) -> [f32; 4];
type DotQ2x4 = fn([&[u8]; 2], [&[u8]; TILE]) -> [[f32; TILE]; 2];
type DotQ4_1_4x1 = fn([&[u8]; 4], &[u8], &[f32]) -> [f32; 4];
type DotQ4_1_2x4 = fn([&[u8]; 2], [&[u8]; TILE], [&[f32]; TILE]) -> [[f32; TILE]; 2];

/// One instruction set's kernels. Each entry is memory-safe for any input (it works on the whole
/// blocks that all arguments hold); the checked functions of this module validate lengths first.
pub struct Kernels {
    pub name: &'static str,
    /// Quantizes a row of activations to Q8_0, bit-exact with the reference quantizer.
    pub quantize_q8_0: fn(&[f32], &mut [u8]),
    pub dot_q8_0: DotQ,
    pub dot_q8_0_x4: DotQx4,
    pub dot_q8_0_4x1: DotQ4x1,
    pub dot_q8_0_2x4: DotQ2x4,
    pub dot_q4_0: DotQ,
    pub dot_q4_0_x4: DotQx4,
    pub dot_q4_0_4x1: DotQ4x1,
    pub dot_q4_0_2x4: DotQ2x4,
    pub dot_q4_1: DotQ4_1,
    pub dot_q4_1_x4: DotQ4_1x4,
    pub dot_q4_1_4x1: DotQ4_1_4x1,
    pub dot_q4_1_2x4: DotQ4_1_2x4,
    pub dot_f32: fn(&[u8], &[f32]) -> f32,
    pub dot_f32_x4: fn(&[u8], [&[f32]; TILE]) -> [f32; TILE],
    /// `out += a · row` for a Q8_0 row (attention's weighted sum over a quantized V cache).
    pub axpy_q8_0: fn(&mut [f32], f32, &[u8]),
}

impl Kernels {
    /// The fastest kernels this CPU runs. On x86-64 the AVX2 set is chosen only when the CPU
    /// reports AVX2, FMA and F16C (and its AVX-VNNI variant only with AVX-VNNI too), so an older
    /// CPU gets the scalar set rather than SIGILL.
    pub fn best() -> &'static Kernels {
        #[cfg(target_arch = "x86_64")]
        if x86::vnni_available() {
            return &x86::KERNELS_VNNI;
        }
        #[cfg(target_arch = "x86_64")]
        if x86::available() {
            return &x86::KERNELS;
        }
        #[cfg(target_arch = "aarch64")]
        return &aarch64::KERNELS;
        #[allow(unreachable_code)]
        &scalar::KERNELS
    }

    pub fn scalar() -> &'static Kernels {
        &scalar::KERNELS
    }

    /// Quantizes `x` (a multiple of 32 long) to Q8_0 in `out`.
    pub fn quantize_q8_0(&self, x: &[f32], out: &mut [u8]) -> Result<()> {
        expect_len("Q8_0 output", Format::Q8_0.row_bytes(x.len())?, out.len())?;
        (self.quantize_q8_0)(x, out);
        Ok(())
    }

    /// Dot product of one weight row stored in `format` (`Q8_0`, `Q4_0` or `Q4_1`) with one row of
    /// Q8_0 activations of the same length.
    pub fn dot_quantized(&self, format: Format, w: &[u8], x: &[u8]) -> Result<f32> {
        let n = expect_quantized_row(format, w.len())?;
        expect_len("Q8_0 activations", n / QK * BlockQ8_0::BYTES, x.len())?;
        Ok(match format {
            Format::Q8_0 => (self.dot_q8_0)(w, x),
            Format::Q4_0 => (self.dot_q4_0)(w, x),
            Format::Q4_1 => {
                let mut sums = alloc::vec![0f32; n / QK];
                q8_0_block_sums(x, &mut sums);
                (self.dot_q4_1)(w, x, &sums)
            }
            _ => unreachable!("checked by expect_quantized_row"),
        })
    }

    /// `out += a · row` for a Q8_0 row as long as `out`.
    pub fn axpy_q8_0(&self, out: &mut [f32], a: f32, row: &[u8]) -> Result<()> {
        expect_len("Q8_0 row", Format::Q8_0.row_bytes(out.len())?, row.len())?;
        (self.axpy_q8_0)(out, a, row);
        Ok(())
    }

    /// Dot product of two f32 vectors, the first as little-endian bytes.
    pub fn dot_f32_bytes(&self, w: &[u8], x: &[f32]) -> Result<f32> {
        expect_len("f32 weight bytes", x.len() * 4, w.len())?;
        Ok((self.dot_f32)(w, x))
    }

    /// Rows `row0 .. row0 + out.len() / n_tok` of `W · Xᵀ`, for the `n_tok` activation rows in `x`.
    ///
    /// `out[(r - row0) * n_tok + t]` receives row `r` against token `t`: consecutive outputs share a
    /// weight row, so each weight block is loaded once per tile of `TILE` tokens.
    pub fn matmul_rows(
        &self,
        w: &Matrix<'_>,
        x: &Activations<'_>,
        row0: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let n_tok = x.n_tok;
        if x.cols != w.cols {
            return Err(Error::Length {
                what: "activation row",
                expected: w.cols,
                got: x.cols,
            });
        }
        if n_tok == 0 || !out.len().is_multiple_of(n_tok) || row0 + out.len() / n_tok > w.rows {
            return Err(Error::Length {
                what: "mat-mul output",
                expected: (w.rows - row0.min(w.rows)) * n_tok,
                got: out.len(),
            });
        }
        let rows = out.len() / n_tok;
        let w_row = |r: usize| w.row(row0 + r);
        match w.format {
            Format::Q8_0 | Format::Q4_0 => {
                let (q8, xb) = x.q8_rows(w.format)?;
                let (one, four, quad, pair): (DotQ, DotQx4, DotQ4x1, DotQ2x4) = match w.format {
                    Format::Q8_0 => (
                        self.dot_q8_0,
                        self.dot_q8_0_x4,
                        self.dot_q8_0_4x1,
                        self.dot_q8_0_2x4,
                    ),
                    _ => (
                        self.dot_q4_0,
                        self.dot_q4_0_x4,
                        self.dot_q4_0_4x1,
                        self.dot_q4_0_2x4,
                    ),
                };
                let x1 = |t: usize| &q8[t * xb..(t + 1) * xb];
                let x4 = |t: usize| -> [&[u8]; TILE] { core::array::from_fn(|i| x1(t + i)) };
                tile(
                    out,
                    n_tok,
                    |r, t| one(w_row(r), x1(t)),
                    |r, t| four(w_row(r), x4(t)),
                    Some((
                        |r, t| quad(core::array::from_fn(|i| w_row(r + i)), x1(t)),
                        |r, t| pair([w_row(r), w_row(r + 1)], x4(t)),
                    )),
                );
            }
            Format::Q4_1 => {
                let (q8, xb) = x.q8_rows(w.format)?;
                let nb = x.cols / QK;
                let sums = x
                    .q8_sums
                    .filter(|s| s.len() == nb * n_tok)
                    .ok_or(Error::Length {
                        what: "Q8_0 activation block sums",
                        expected: nb * n_tok,
                        got: x.q8_sums.map_or(0, |s| s.len()),
                    })?;
                let x1 = |t: usize| &q8[t * xb..(t + 1) * xb];
                let s1 = |t: usize| &sums[t * nb..(t + 1) * nb];
                let x4 = |t: usize| -> [&[u8]; TILE] { core::array::from_fn(|i| x1(t + i)) };
                let s4 = |t: usize| -> [&[f32]; TILE] { core::array::from_fn(|i| s1(t + i)) };
                tile(
                    out,
                    n_tok,
                    |r, t| (self.dot_q4_1)(w_row(r), x1(t), s1(t)),
                    |r, t| (self.dot_q4_1_x4)(w_row(r), x4(t), s4(t)),
                    Some((
                        |r, t| {
                            (self.dot_q4_1_4x1)(
                                core::array::from_fn(|i| w_row(r + i)),
                                x1(t),
                                s1(t),
                            )
                        },
                        |r, t| (self.dot_q4_1_2x4)([w_row(r), w_row(r + 1)], x4(t), s4(t)),
                    )),
                );
            }
            Format::F32 => {
                let xf = x.f32;
                expect_len("f32 activations", x.cols * n_tok, xf.len())?;
                let c = x.cols;
                let x1 = |t: usize| &xf[t * c..(t + 1) * c];
                let no_pairs: Option<(QuadAt, PairAt)> = None;
                tile(
                    out,
                    n_tok,
                    |r, t| (self.dot_f32)(w_row(r), x1(t)),
                    |r, t| (self.dot_f32_x4)(w_row(r), core::array::from_fn(|i| x1(t + i))),
                    no_pairs,
                );
            }
            Format::F16 | Format::BF16 => {
                let xf = x.f32;
                expect_len("f32 activations", x.cols * n_tok, xf.len())?;
                let c = x.cols;
                // Widen a chunk of the row at a time on the stack: no allocation, no scratch.
                let mut buf = [0f32; 256];
                for r in 0..rows {
                    let wr = w.row(row0 + r);
                    let o = &mut out[r * n_tok..(r + 1) * n_tok];
                    o.fill(0.0);
                    let mut start = 0;
                    while start < c {
                        let len = (c - start).min(buf.len());
                        let bytes = &wr[start * 2..(start + len) * 2];
                        quant::dequantize_row(w.format, bytes, &mut buf[..len])?;
                        for (t, o) in o.iter_mut().enumerate() {
                            let xs = &xf[t * c + start..t * c + start + len];
                            *o += buf[..len].iter().zip(xs).map(|(a, b)| a * b).sum::<f32>();
                        }
                        start += len;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Multi-row tiles at (first row, first token): four rows and one token, two rows and `TILE`.
type QuadAt = fn(usize, usize) -> [f32; 4];
type PairAt = fn(usize, usize) -> [[f32; TILE]; 2];

/// Fills `out` (`[row][token]`, `n_tok` per row) from kernels at (row, first token): one row and
/// one token `one`, one row and `TILE` tokens `four`, and, where the format has them, four rows
/// and one token and two rows and `TILE` tokens (`multi`). Whole tiles of tokens go two rows at a
/// time; the tokens left over (all of them when decoding) four rows at a time.
fn tile(
    out: &mut [f32],
    n_tok: usize,
    one: impl Fn(usize, usize) -> f32,
    four: impl Fn(usize, usize) -> [f32; TILE],
    multi: Option<(
        impl Fn(usize, usize) -> [f32; 4],
        impl Fn(usize, usize) -> [[f32; TILE]; 2],
    )>,
) {
    let rows = out.len() / n_tok;
    let tiles = n_tok / TILE * TILE;
    let (rows_by_2, rows_by_4) = match multi {
        Some(_) => (rows / 2 * 2, rows / 4 * 4),
        None => (0, 0),
    };
    for t in (0..tiles).step_by(TILE) {
        if let Some((_, pair)) = &multi {
            for r in (0..rows_by_2).step_by(2) {
                let v = pair(r, t);
                out[r * n_tok + t..r * n_tok + t + TILE].copy_from_slice(&v[0]);
                out[(r + 1) * n_tok + t..(r + 1) * n_tok + t + TILE].copy_from_slice(&v[1]);
            }
        }
        for r in rows_by_2..rows {
            out[r * n_tok + t..r * n_tok + t + TILE].copy_from_slice(&four(r, t));
        }
    }
    for t in tiles..n_tok {
        if let Some((quad, _)) = &multi {
            for r in (0..rows_by_4).step_by(4) {
                for (i, v) in quad(r, t).into_iter().enumerate() {
                    out[(r + i) * n_tok + t] = v;
                }
            }
        }
        for r in rows_by_4..rows {
            out[r * n_tok + t] = one(r, t);
        }
    }
}

/// `n_tok` rows of activations, each `cols` long: always as f32, and as Q8_0 when a quantized
/// weight will consume them (with each block's `d·Σq` for Q4_1 weights).
#[derive(Clone, Copy)]
pub struct Activations<'a> {
    pub f32: &'a [f32],
    pub q8: Option<&'a [u8]>,
    pub q8_sums: Option<&'a [f32]>,
    pub n_tok: usize,
    pub cols: usize,
}

impl<'a> Activations<'a> {
    /// The Q8_0 rows and the bytes of one row, checked.
    fn q8_rows(&self, format: Format) -> Result<(&'a [u8], usize)> {
        let q8 = self.q8.ok_or(Error::UnsupportedFormat {
            what: "mat-mul without Q8_0 activations",
            format,
        })?;
        let xb = Format::Q8_0.row_bytes(self.cols)?;
        expect_len("Q8_0 activations", xb * self.n_tok, q8.len())?;
        Ok((q8, xb))
    }
}

/// Each Q8_0 block's `d·Σq` (d as stored, in f16), into `out` (one per block).
pub fn q8_0_block_sums(x: &[u8], out: &mut [f32]) {
    for (b, o) in x.chunks_exact(BlockQ8_0::BYTES).zip(out.iter_mut()) {
        let sum: i32 = b[2..].iter().map(|q| (*q as i8) as i32).sum();
        *o = quant::f16_at(b) * sum as f32;
    }
}

fn expect_len(what: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected != got {
        return Err(Error::Length {
            what,
            expected,
            got,
        });
    }
    Ok(())
}

/// Checks that `bytes` is a whole row of a quantized format and returns its length in values.
fn expect_quantized_row(format: Format, bytes: usize) -> Result<usize> {
    if !matches!(format, Format::Q8_0 | Format::Q4_0 | Format::Q4_1) {
        return Err(Error::UnsupportedFormat {
            what: "quantized dot product",
            format,
        });
    }
    if !bytes.is_multiple_of(format.block_bytes()) {
        return Err(Error::NotBlockMultiple {
            what: "quantized weight row bytes",
            len: bytes,
            block: format.block_bytes(),
        });
    }
    Ok(bytes / format.block_bytes() * QK)
}

#[cfg(test)]
mod tests;
