//! `Matrix`: a view of a weight matrix (format, rows, columns, bytes), what the kernels take.
//! It sits below both the kernels and the model's weights.
use alloc::borrow::Cow;

use crate::error::{Error, Result};
use crate::quant::{self, Format};

/// A row-major matrix of `rows` rows of `cols` values stored in `format`.
#[derive(Debug, Clone)]
pub struct Matrix<'w> {
    /// How the values are stored.
    pub format: Format,
    /// Rows (outputs).
    pub rows: usize,
    /// Values per row (inputs).
    pub cols: usize,
    bytes: Cow<'w, [u8]>,
    row_bytes: usize,
}

impl<'w> Matrix<'w> {
    /// Checks that `bytes` holds exactly `rows` whole rows of `cols` values in `format`.
    ///
    /// # Errors
    /// [`Error::NotBlockMultiple`] if a row is not whole blocks, [`Error::Overflow`] if the size
    /// overflows, [`Error::Length`] if `bytes` is not exactly `rows` rows.
    pub fn new(format: Format, rows: usize, cols: usize, bytes: Cow<'w, [u8]>) -> Result<Self> {
        let row_bytes = format.row_bytes(cols)?;
        let expected = rows.checked_mul(row_bytes).ok_or(Error::Overflow {
            what: "matrix bytes",
        })?;
        if bytes.len() != expected {
            return Err(Error::Length {
                what: "matrix bytes",
                expected,
                got: bytes.len(),
            });
        }
        Ok(Matrix {
            format,
            rows,
            cols,
            bytes,
            row_bytes,
        })
    }

    /// Quantizes (or converts) a row-major f32 matrix into an owned one in `format`.
    ///
    /// # Errors
    /// [`Error::Length`] if `values` is not `rows × cols` long; as `quant::quantize_row` for the
    /// format (k-quants are not written here).
    pub fn quantize(format: Format, rows: usize, cols: usize, values: &[f32]) -> Result<Self> {
        if values.len() != rows * cols {
            return Err(Error::Length {
                what: "matrix values",
                expected: rows * cols,
                got: values.len(),
            });
        }
        let row_bytes = format.row_bytes(cols)?;
        let mut bytes = alloc::vec![0u8; rows * row_bytes];
        for (x, out) in values
            .chunks_exact(cols.max(1))
            .zip(bytes.chunks_exact_mut(row_bytes.max(1)))
        {
            quant::quantize_row(format, x, out)?;
        }
        Matrix::new(format, rows, cols, Cow::Owned(bytes))
    }

    /// The bytes of row `r`. Panics if `r >= rows`; the layer loop checks token ids first.
    pub fn row(&self, r: usize) -> &[u8] {
        &self.bytes[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// The stored rows, row after row.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Whether the bytes are borrowed (a memory map, a `static`) rather than owned.
    pub fn is_borrowed(&self) -> bool {
        matches!(self.bytes, Cow::Borrowed(_))
    }

    /// Row `r` as f32 in `out` (`cols` long).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `r` is not a row, [`Error::Length`] if `out` is not `cols` long.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<()> {
        if r >= self.rows {
            return Err(Error::OutOfRange {
                what: "matrix row",
                index: r,
                len: self.rows,
            });
        }
        quant::dequantize_row(self.format, self.row(r), out)
    }
}
