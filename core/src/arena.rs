//! `Scratch`: the activation buffers of the layer loop, carved from memory the caller owns.
use crate::config::Config;
use crate::error::{Error, Result};
use crate::kernels::k_panel::{self, KTokens, K_FEWEST_TOKENS};
use crate::kernels::{most_transposed_tokens, TILE};

/// Rows of logits computed at once in batches of at least this many tokens: the last tokens of
/// that many sequences share one pass over the output matrix.
pub const LOGIT_ROWS: usize = 16;

/// Rows of logits a scratch for batches of `b` tokens holds: `LOGIT_ROWS` for batches that many
/// sequences can share, a tile for smaller ones (a microcontroller's arena stays small).
const fn logit_rows(b: usize) -> usize {
    if b >= LOGIT_ROWS {
        LOGIT_ROWS
    } else if b < TILE {
        b
    } else {
        TILE
    }
}

const fn max(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}
use crate::quant::k_quants::QK_K;
use crate::quant::{q16, q8k, QK};

/// Activation buffers for batches of up to `max_batch` tokens.
pub struct Scratch<'a> {
    pub(crate) max_batch: usize,
    pub(crate) f: &'a mut [f32],
    pub(crate) quantized: &'a mut [u8],
    pub(crate) k_tiles: &'a mut [KTokens],
    layout: Layout,
}

/// Lengths (in f32) of each buffer, and of the quantized activations' buffer (in bytes).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Layout {
    x: usize,
    xb: usize,
    q: usize,
    k: usize,
    v: usize,
    att: usize,
    gate: usize,
    rope: usize,
    tmp: usize,
    logits: usize,
    quantized: usize,
    /// Tiles of Q8K activations transposed for the k-quants' k-panel (`KTokens`, 64-byte
    /// aligned within the arena).
    k_tiles: usize,
}

impl Layout {
    const fn new(c: &Config, b: usize) -> Result<Self> {
        if let Err(e) = c.validate() {
            return Err(e);
        }
        if b == 0 {
            return Err(Error::InvalidConfig {
                field: "max_batch",
                reason: "must be greater than zero",
            });
        }
        let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        // The mat-mul writes its output row-major by weight row before reordering it per token;
        // the largest group is Q|K|V, gate|up, or the output projection of `LOGIT_ROWS` tokens.
        let tmp = max(
            b * max(max(q + 2 * kv, 2 * ff), h),
            logit_rows(b) * c.vocab_size,
        );
        // Q16 activations feed the quantized matrices, whose rows are whole blocks: the widest
        // input among those that are (hidden 32 with intermediate 48 still quantizes Q, K, V);
        // Q8K ones the k-quants, whose rows are whole super-blocks. A mat-mul whose matrices
        // mix the two takes both, side by side.
        let inputs = [h, ff, q];
        let (mut widest, mut widest_k) = (0, 0);
        let mut i = 0;
        while i < inputs.len() {
            if inputs[i].is_multiple_of(QK) {
                widest = max(widest, inputs[i]);
            }
            if inputs[i].is_multiple_of(QK_K) {
                widest_k = max(widest_k, inputs[i]);
            }
            i += 1;
        }
        Ok(Layout {
            x: b * h,
            xb: b * h,
            q: b * q,
            k: b * kv,
            v: b * kv,
            att: b * q,
            gate: b * ff,
            rope: b * c.head_dim,
            tmp,
            // The last tokens of several sequences (one row when decoding alone).
            logits: logit_rows(b) * c.vocab_size,
            // A decode step of several sequences also keeps its Q16 tokens transposed, padded
            // to whole tiles (`kernels::transposed_tokens`).
            quantized: (b + most_transposed_tokens(b)) * q16::row_bytes(widest)
                + b * q8k::row_bytes(widest_k),
            // A batch the k-panel takes transposes its Q8K tokens once for every block of rows
            // (`Kernels::transpose_k_tiles`).
            k_tiles: if b >= K_FEWEST_TOKENS {
                k_panel::tiles(b) * (widest_k / QK_K)
            } else {
                0
            },
        })
    }

    /// Bytes of the arena: the floats, the quantized activations, and the transposed tiles
    /// with room to align them.
    const fn bytes(&self) -> usize {
        let tiles = match self.k_tiles {
            0 => 0,
            n => n * size_of::<KTokens>() + align_of::<KTokens>() - 1,
        };
        self.floats() * 4 + self.quantized + tiles
    }

    const fn floats(&self) -> usize {
        self.x
            + self.xb
            + self.q
            + self.k
            + self.v
            + self.att
            + self.gate
            + self.rope
            + self.tmp
            + self.logits
    }
}

impl<'a> Scratch<'a> {
    /// Exactly how many bytes `new` needs for batches of up to `max_batch` tokens. Longer inputs
    /// are processed `max_batch` tokens at a time. A `const fn`, so firmware can size a `static`
    /// arena at compile time.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if `config` is invalid or `max_batch` is zero.
    pub const fn bytes_needed(config: &Config, max_batch: usize) -> Result<usize> {
        match Layout::new(config, max_batch) {
            Ok(l) => Ok(l.bytes()),
            Err(e) => Err(e),
        }
    }

    /// Borrows `mem`, which must be 4-byte aligned (a `Vec<f32>` or `[f32; N]` viewed as bytes,
    /// or any allocation of alignment 4) and at least `bytes_needed` long.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an invalid config or a zero batch, [`Error::ArenaTooSmall`]
    /// if `mem` is shorter than `bytes_needed`, [`Error::Misaligned`] if it is not 4-byte aligned.
    pub fn new(config: &Config, max_batch: usize, mem: &'a mut [u8]) -> Result<Self> {
        let layout = Layout::new(config, max_batch)?;
        let needed = layout.bytes();
        if mem.len() < needed {
            return Err(Error::ArenaTooSmall {
                what: "scratch",
                needed,
                got: mem.len(),
            });
        }
        let mem_len = mem.len();
        let (f_bytes, rest) = mem.split_at_mut(layout.floats() * 4);
        // SAFETY: every bit pattern is a valid f32, and `align_to_mut` only yields the part of
        // the slice that is correctly aligned; we reject the arena if any prefix is left over.
        let (prefix, f, _) = unsafe { f_bytes.align_to_mut::<f32>() };
        if !prefix.is_empty() {
            return Err(Error::Misaligned {
                what: "scratch",
                align: 4,
            });
        }
        let (quantized, tile_bytes) = rest.split_at_mut(layout.quantized);
        // SAFETY: a `KTokens` is bytes and f32s with no padding, so every bit pattern is a
        // valid one, and `align_to_mut` only yields the part of the slice that is aligned.
        let (_, k_tiles, _) = unsafe { tile_bytes.align_to_mut::<KTokens>() };
        let Some(k_tiles) = k_tiles.get_mut(..layout.k_tiles) else {
            return Err(Error::ArenaTooSmall {
                what: "scratch (transposed tiles)",
                needed,
                got: mem_len,
            });
        };
        Ok(Scratch {
            max_batch,
            f,
            quantized,
            k_tiles,
            layout,
        })
    }

    /// Checks that this scratch was made for `config`'s shape.
    pub(crate) fn check_shape(&self, config: &Config) -> Result<()> {
        if Layout::new(config, self.max_batch)? != self.layout {
            return Err(Error::InvalidConfig {
                field: "scratch",
                reason: "was made for a model of another shape",
            });
        }
        Ok(())
    }

    /// The buffers, each sized for `max_batch` tokens.
    pub(crate) fn split(&mut self) -> Buffers<'_> {
        let l = self.layout;
        let f = &mut *self.f;
        let (x, f) = f.split_at_mut(l.x);
        let (xb, f) = f.split_at_mut(l.xb);
        let (q, f) = f.split_at_mut(l.q);
        let (k, f) = f.split_at_mut(l.k);
        let (v, f) = f.split_at_mut(l.v);
        let (att, f) = f.split_at_mut(l.att);
        let (gate, f) = f.split_at_mut(l.gate);
        let (rope, f) = f.split_at_mut(l.rope);
        let (tmp, f) = f.split_at_mut(l.tmp);
        let logits = &mut f[..l.logits];
        Buffers {
            x,
            xb,
            q,
            k,
            v,
            att,
            gate,
            rope,
            tmp,
            logits,
            quantized: &mut *self.quantized,
            k_tiles: &mut *self.k_tiles,
        }
    }
}

pub(crate) struct Buffers<'s> {
    pub x: &'s mut [f32],
    pub xb: &'s mut [f32],
    pub q: &'s mut [f32],
    pub k: &'s mut [f32],
    pub v: &'s mut [f32],
    pub att: &'s mut [f32],
    pub gate: &'s mut [f32],
    /// cos then sin of each token's RoPE angles: `head_dim` per token.
    pub rope: &'s mut [f32],
    pub tmp: &'s mut [f32],
    /// Logits of the last tokens of up to `LOGIT_ROWS` sequences, and the row greedy decoding
    /// reads.
    pub logits: &'s mut [f32],
    /// The current mat-mul input as Q16 and as Q8K (`Layout::new` says how much of each).
    pub quantized: &'s mut [u8],
    /// The current mat-mul input's Q8K tiles, transposed for the k-panel.
    pub k_tiles: &'s mut [KTokens],
}
