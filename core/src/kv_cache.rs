//! The key/value cache, in memory the caller owns.
//!
//! Layout: for each layer, all K rows then all V rows; each is `max_seq × n_kv_heads` rows of
//! `head_dim` values in the cache's format. Rows are read block by block from bytes, so the
//! arena needs no particular alignment.
use crate::config::Config;
use crate::error::{Error, Result};
use crate::kernels::Kernels;
use crate::quant::{self, Format};

/// How K and V rows are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvFormat {
    /// 4 bytes a value.
    F32,
    /// 2 bytes a value.
    F16,
    /// 34 bytes per 32 values (needs `head_dim` a multiple of 32).
    Q8_0,
}

impl KvFormat {
    /// Q8_0 (4x smaller than f32) when a head is a whole number of blocks, f32 otherwise.
    pub const fn default_for(config: &Config) -> Self {
        if config.head_dim.is_multiple_of(quant::QK) {
            KvFormat::Q8_0
        } else {
            KvFormat::F32
        }
    }

    /// The rows' block format.
    pub const fn format(self) -> Format {
        match self {
            KvFormat::F32 => Format::F32,
            KvFormat::F16 => Format::F16,
            KvFormat::Q8_0 => Format::Q8_0,
        }
    }
}

/// A KV cache over `&'a mut [u8]`, holding positions `0 .. len()`.
pub struct KvCache<'a> {
    mem: &'a mut [u8],
    format: KvFormat,
    n_layers: usize,
    n_kv_heads: usize,
    head_dim: usize,
    max_seq: usize,
    row_bytes: usize,
    len: usize,
}

impl<'a> KvCache<'a> {
    /// Exactly how many bytes `new` needs for `max_seq` positions of `config` in `format`:
    /// `n_layers × 2 × max_seq × n_kv_heads` rows of `head_dim` values in `format`. A `const fn`,
    /// so firmware can size a `static` arena at compile time.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if `config` is invalid or the size overflows `usize`;
    /// [`Error::NotBlockMultiple`] if a head is not a whole number of `format`'s blocks.
    pub const fn bytes_needed(config: &Config, max_seq: usize, format: KvFormat) -> Result<usize> {
        if let Err(e) = config.validate() {
            return Err(e);
        }
        let row = match format.format().row_bytes(config.head_dim) {
            Ok(row) => row,
            Err(e) => return Err(e),
        };
        let factors = [config.n_layers, 2, max_seq, config.n_kv_heads];
        let mut bytes = row;
        let mut i = 0;
        while i < factors.len() {
            bytes = match bytes.checked_mul(factors[i]) {
                Some(b) => b,
                None => {
                    return Err(Error::InvalidConfig {
                        field: "max_seq",
                        reason: "makes the KV cache larger than the address space",
                    })
                }
            };
            i += 1;
        }
        Ok(bytes)
    }

    /// Borrows `mem` as an empty cache. Fails if `mem` is smaller than `bytes_needed`.
    ///
    /// # Errors
    /// As `bytes_needed`, and [`Error::ArenaTooSmall`] if `mem` is shorter than it says.
    pub fn new(
        config: &Config,
        max_seq: usize,
        format: KvFormat,
        mem: &'a mut [u8],
    ) -> Result<Self> {
        let needed = Self::bytes_needed(config, max_seq, format)?;
        if mem.len() < needed {
            return Err(Error::ArenaTooSmall {
                what: "KV cache",
                needed,
                got: mem.len(),
            });
        }
        Ok(KvCache {
            mem: &mut mem[..needed],
            format,
            n_layers: config.n_layers,
            n_kv_heads: config.n_kv_heads,
            head_dim: config.head_dim,
            max_seq,
            row_bytes: format.format().row_bytes(config.head_dim)?,
            len: 0,
        })
    }

    /// Positions filled so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the cache can hold.
    pub fn max_seq(&self) -> usize {
        self.max_seq
    }

    /// How the rows are stored.
    pub fn format(&self) -> KvFormat {
        self.format
    }

    /// Forgets every position after the first `len` (keeps the bytes; they are overwritten).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Forgets every position (a new sequence starts).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Checks that this cache was made for `config`'s shape.
    pub(crate) fn check_shape(&self, config: &Config) -> Result<()> {
        if (self.n_layers, self.n_kv_heads, self.head_dim)
            != (config.n_layers, config.n_kv_heads, config.head_dim)
        {
            return Err(Error::InvalidConfig {
                field: "KV cache",
                reason: "was made for a model of another shape",
            });
        }
        Ok(())
    }

    /// Marks `n` positions as filled (after every layer wrote them).
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    fn plane_bytes(&self) -> usize {
        self.max_seq * self.n_kv_heads * self.row_bytes
    }

    /// Stores K and V rows (`n × n_kv_heads × head_dim` each) of `layer` at positions `pos ..`,
    /// quantizing Q8_0 rows with `kernels`.
    pub(crate) fn store(
        &mut self,
        kernels: &Kernels,
        layer: usize,
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<()> {
        let kv_dim = self.n_kv_heads * self.head_dim;
        let n = k.len() / kv_dim;
        if layer >= self.n_layers {
            return Err(Error::OutOfRange {
                what: "KV cache layer",
                index: layer,
                len: self.n_layers,
            });
        }
        if k.len() != v.len() {
            return Err(Error::Mismatch {
                op: "KV store",
                lhs: ("K values", k.len()),
                rhs: ("V values", v.len()),
            });
        }
        if !k.len().is_multiple_of(kv_dim) {
            return Err(Error::InvalidArgument {
                what: "KV store",
                reason: "K and V are not whole rows of n_kv_heads × head_dim values",
            });
        }
        if pos + n > self.max_seq {
            return Err(Error::ContextFull {
                pos,
                tokens: n,
                max_seq: self.max_seq,
            });
        }
        let plane = self.plane_bytes();
        let row_bytes = self.row_bytes;
        let fmt = self.format.format();
        let start = pos * self.n_kv_heads * row_bytes;
        let len = n * self.n_kv_heads * row_bytes;
        for (which, src) in [(0, k), (1, v)] {
            let base = (2 * layer + which) * plane + start;
            let dst = &mut self.mem[base..base + len];
            for (row, out) in src
                .chunks_exact(self.head_dim)
                .zip(dst.chunks_exact_mut(row_bytes))
            {
                match fmt {
                    Format::Q8_0 => kernels.quantize_q8_0(row, out)?,
                    _ => quant::quantize_row(fmt, row, out)?,
                }
            }
        }
        Ok(())
    }

    /// The K and V planes of `layer` (positions `0 .. max_seq`), for attention.
    pub(crate) fn layer(&self, layer: usize) -> LayerKv<'_> {
        let plane = self.plane_bytes();
        let base = 2 * layer * plane;
        LayerKv {
            k: &self.mem[base..base + plane],
            v: &self.mem[base + plane..base + 2 * plane],
            format: self.format.format(),
            row_bytes: self.row_bytes,
            n_kv_heads: self.n_kv_heads,
        }
    }
}

/// One layer's cached K and V.
#[derive(Clone, Copy)]
pub struct LayerKv<'c> {
    /// Every key row of the layer (`max_seq × n_kv_heads` rows).
    pub k: &'c [u8],
    /// Every value row of the layer, likewise.
    pub v: &'c [u8],
    /// The rows' format.
    pub format: Format,
    /// Bytes of one row (`head_dim` values).
    pub row_bytes: usize,
    /// Rows per position.
    pub n_kv_heads: usize,
}

impl LayerKv<'_> {
    fn offset(&self, pos: usize, kv_head: usize) -> usize {
        (pos * self.n_kv_heads + kv_head) * self.row_bytes
    }

    /// The key of `kv_head` at `pos`.
    ///
    /// # Panics
    /// If `pos` or `kv_head` is past the layer's rows.
    pub fn k_row(&self, pos: usize, kv_head: usize) -> &[u8] {
        let o = self.offset(pos, kv_head);
        &self.k[o..o + self.row_bytes]
    }

    /// The value of `kv_head` at `pos`.
    ///
    /// # Panics
    /// If `pos` or `kv_head` is past the layer's rows.
    pub fn v_row(&self, pos: usize, kv_head: usize) -> &[u8] {
        let o = self.offset(pos, kv_head);
        &self.v[o..o + self.row_bytes]
    }
}
