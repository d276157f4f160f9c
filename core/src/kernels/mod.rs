//! Dot products and mat-muls for every weight format, with a scalar reference (`scalar`) and SIMD
//! twins (`x86`: AVX2+FMA+F16C, with AVX-VNNI and AVX-512 variants; `aarch64`: NEON; `wasm32`:
//! SIMD128 for Q8_0, in modules built with it), collected
//! in a table of function pointers that is picked once from the CPU's features (`Kernels::best`).
//!
//! Quantized weights are multiplied with activations quantized to Q16 per 32-block (see
//! `quant::q16` for why not ggml's Q8_0), the k-quants (Q2_K to Q6_K) with Q8K per 256 (see
//! `quant::q8k`); f32, f16 and bf16 weights with f32 activations.
use core::ops::Range;

use crate::error::{Error, Result};
use crate::matrix::Matrix;
use crate::ops::same_len;
use crate::quant::{self, q16, ActivationFormat, Format, QK};

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
pub mod k_panel;
pub mod panel;
pub mod scalar;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub mod wasm32;
#[cfg(target_arch = "x86_64")]
pub mod x86;

/// A SIMD table and the check of whether this CPU runs it.
pub type SimdTable = (&'static Kernels, fn() -> bool);

#[cfg(target_arch = "x86_64")]
static SIMD_TABLES: [SimdTable; 4] = [
    (&x86::KERNELS, x86::available),
    (&x86::KERNELS_VNNI, x86::vnni_available),
    (&x86::KERNELS_AVX512, x86::avx512_available),
    (&x86::KERNELS_AMX, x86::amx_available),
];

#[cfg(target_arch = "aarch64")]
static SIMD_TABLES: [SimdTable; 1] = [(&aarch64::KERNELS, || true)];

// WebAssembly decides at build time: a module built with SIMD128 runs it everywhere it loads.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
static SIMD_TABLES: [SimdTable; 1] = [(&wasm32::KERNELS, || true)];

#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    all(target_arch = "wasm32", target_feature = "simd128")
)))]
static SIMD_TABLES: [SimdTable; 0] = [];

/// How many activation rows a tiled kernel takes at once.
pub const TILE: usize = 4;

/// From this many activation rows on, quantized mat-muls use the panel kernel where the table
/// has one (the k-quants: `k_panel`; a table's `PanelDots::pack_from` may say more); below,
/// transposed tiles of eight tokens and unpacked ones of four (a server's decode steps), which
/// pack nothing. At 16 tokens both ways measured the same. Every way gives the same bits, so
/// neither this choice nor how threads split rows or tokens changes a result.
pub const PANEL_MIN_TOKENS: usize = 2 * panel::X8;

/// Tokens left over past the whole tiles of `TILE` from which one more tile is run, padded
/// with copies of the last token (their results dropped): one pass over the weights instead of
/// one per token (a decode step of two sequences ran at 1.1x one's rate, three at 1.1x, where
/// four ran at 2.5x).
pub const TILE_PADDED_FROM: usize = 2;

/// Tiles of `TILE` tokens for `n_tok` tokens: the whole ones, and one padded from
/// `TILE_PADDED_FROM` tokens left over; the rest go one at a time.
pub const fn tiles_of_four(n_tok: usize) -> usize {
    n_tok / TILE + (n_tok % TILE >= TILE_PADDED_FROM) as usize
}

/// Tokens whose Q16 rows a mat-mul of `n_tok` tokens keeps transposed for the transposed-tile
/// kernels (`Kernels::transpose_tiles`), padding included: the tiles (`panel::x8_tiles`) of a
/// decode step of fewer than `PANEL_MIN_TOKENS` sequences, so that its threads do not each
/// transpose them again. More tokens take the panel kernels, or (`PanelDots::pack_from`) tiles
/// each chunk transposes.
pub const fn transposed_tokens(n_tok: usize) -> usize {
    if n_tok < PANEL_MIN_TOKENS {
        panel::x8_tiles(n_tok) * panel::X8
    } else {
        0
    }
}

/// The most `transposed_tokens` of any mat-mul of at most `batch` tokens: what a scratch arena
/// for such batches holds for them.
pub const fn most_transposed_tokens(batch: usize) -> usize {
    let (mut n, mut most) = (0, 0);
    while n <= batch && n < PANEL_MIN_TOKENS {
        if transposed_tokens(n) > most {
            most = transposed_tokens(n);
        }
        n += 1;
    }
    most
}

/// `out[i] += Σ_k a[i·w.run + k·w.key] · rows[k]`: `(out, a, w, rows)`.
pub type Axpy = fn(&mut [f32], &[f32], WeightStrides, &[&[u8]]);

/// Where an `Axpy`'s weights lie in their slice: run `i`'s weight for key `k` at
/// `i·run + k·key`. Attention's probabilities come as a row of keys per query row (`key` 1) or,
/// from `ops::softmax_step`, as a row of query rows per key (`run` 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightStrides {
    /// From one run's weights to the next's.
    pub run: usize,
    /// From one key's weight to the next's.
    pub key: usize,
}

impl WeightStrides {
    /// How many of the first `most` runs have a weight for every one of `keys` keys in `len`
    /// floats (none without keys).
    pub fn runs(self, len: usize, keys: usize, most: usize) -> usize {
        let last_key = keys.checked_sub(1).and_then(|k| k.checked_mul(self.key));
        match last_key {
            Some(last) if last < len => match (len - 1 - last).checked_div(self.run) {
                Some(more) => most.min(more + 1),
                None => most,
            },
            _ => 0,
        }
    }
}

/// `ops::softmax_step`: scores (keys × a stride), the stride, the scale, and the rows.
pub type SoftmaxStep = fn(&mut [f32], usize, f32, &mut crate::ops::SoftmaxRows<'_>);

/// Two weight rows · `TILE` activation rows.
pub type Dot2x4 = fn([&[u8]; 2], [&[u8]; TILE]) -> [[f32; TILE]; 2];

/// A panel's weight rows before packing (`None`: a padding row of zeros).
pub type PanelRows<'a> = [Option<&'a [u8]>; panel::PANEL];

/// A panel's results for a tile of tokens: `[token][row]`.
pub type PanelAcc = [[f32; panel::PANEL]; TILE];

/// A panel's unpacked weight rows · `TILE` activation rows.
pub type PanelRowsX4 = fn([&[u8]; panel::PANEL], [&[u8]; TILE]) -> PanelAcc;

/// `X8_ROWS` weight rows from a block on · a transposed tile of `X8` activation rows.
pub type PanelRowsX8 =
    fn([&[u8]; panel::X8_ROWS], usize, &[u8], &mut [[f32; panel::X8]; panel::X8_ROWS]);

/// The many-token kernel of one weight format (see `panel`).
#[derive(Clone)]
pub struct PanelDots {
    /// Packs blocks `b0 ..` of `PANEL` weight rows (`None`: a padding row of zeros) into as many
    /// whole packed blocks as the output holds, as `panel::pack_ref` does.
    pub pack: fn(&PanelRows<'_>, usize, &mut [u8]),
    /// A packed panel (whole blocks) · `TILE` activation rows from the same block on:
    /// `acc[t][r] +=` each block's contribution, blocks in order.
    pub dot: fn(&[u8], [&[u8]; TILE], &mut PanelAcc),
    /// `PANEL` weight rows · one activation row, unpacked (decoding), with `dot`'s arithmetic:
    /// the same bits for every (row, token), so a token's result does not depend on how many
    /// were computed with it.
    pub rows: fn([&[u8]; panel::PANEL], &[u8]) -> [f32; panel::PANEL],
    /// `rows` for `TILE` activation rows at once, each weight block unpacked once for all of
    /// them (a decode step of several sequences): `[token][row]`, the bits `rows` gives each.
    pub rows_x4: PanelRowsX4,
    /// Tokens from which a mat-mul packs panels (`PANEL_MIN_TOKENS`, or more where the
    /// transposed tiles stay faster; `usize::MAX` where they are faster at every size, and
    /// prefill too runs tiles of eight).
    pub pack_from: usize,
    /// The layout `transpose_x8` writes.
    pub x8_layout: X8Layout,
    /// Transposes blocks `b0 ..` of `X8` Q16 activation rows into as many whole transposed
    /// blocks (`X8_BLOCK_BYTES` each) as the output holds, in the layout this table's `rows_x8`
    /// reads (`panel` describes the 256-bit kernels' one, `x86::amx` its own).
    pub transpose_x8: fn([&[u8]; panel::X8], usize, &mut [u8]),
    /// `X8_ROWS` weight rows' blocks `b0 ..` · a transposed tile of `X8` tokens (whole
    /// blocks): `acc[r][t] +=` each block's contribution, blocks in order, with `dot`'s
    /// arithmetic (a decode step of eight sequences or more: the bits `rows` gives each token).
    pub rows_x8: PanelRowsX8,
}

/// One weight format's dot products with activation rows in its `Format::activation_format`.
/// The multi-row shapes load each activation block once for all their rows.
#[derive(Clone)]
pub struct QuantDots {
    /// One weight row · one activation row.
    pub one: fn(&[u8], &[u8]) -> f32,
    /// One weight row · `TILE` activation rows.
    pub x4: fn(&[u8], [&[u8]; TILE]) -> [f32; TILE],
    /// Four weight rows · one activation row (decoding without panel kernels).
    pub rows4: fn([&[u8]; 4], &[u8]) -> [f32; 4],
    /// Two weight rows · `TILE` activation rows (prefill without panel kernels).
    pub rows2x4: Dot2x4,
    /// The panel kernels, where this instruction set has them: mat-muls and attention scores
    /// then use them alone, so their arithmetic is the one every result gets.
    pub panel: Option<PanelDots>,
    /// The k-quants' many-token kernels, where this instruction set has them: prefill's
    /// mat-muls (from `PANEL_MIN_TOKENS` tokens), with the other shapes' bits.
    pub k_panel: Option<k_panel::KPanelDots>,
}

/// One instruction set's kernels. Each entry is memory-safe for any input (it works on the whole
/// blocks that all arguments hold); the checked functions of this module validate lengths first.
/// A table is plain function pointers: a copy with an entry changed is how a benchmark compares
/// two ways of one mat-mul.
#[derive(Clone)]
pub struct Kernels {
    /// The table's name (`scalar`, `avx2`, `neon+dotprod`, `simd128`, ...).
    pub name: &'static str,
    /// Quantizes a row to Q8_0 (the KV cache's K and V rows), bit-exact with the reference.
    pub quantize_q8_0: fn(&[f32], &mut [u8]),
    /// Quantizes a row of activations to Q16, bit-exact with the reference quantizer.
    pub quantize_q16: fn(&[f32], &mut [u8]),
    /// Quantizes a row of activations to Q8K, bit-exact with the reference quantizer.
    pub quantize_q8k: fn(&[f32], &mut [u8]),
    /// Q8_0 weights · Q16 activations.
    pub q8_0: QuantDots,
    /// Q4_0 weights · Q16 activations.
    pub q4_0: QuantDots,
    /// Q4_1 weights · Q16 activations.
    pub q4_1: QuantDots,
    /// Q5_0 weights · Q16 activations.
    pub q5_0: QuantDots,
    /// Q5_1 weights · Q16 activations.
    pub q5_1: QuantDots,
    /// Q2_K weights · Q8K activations.
    pub q2_k: QuantDots,
    /// Q3_K weights · Q8K activations.
    pub q3_k: QuantDots,
    /// Q4_K weights · Q8K activations (an exact integer sum per super-block: every table
    /// gives the scalar one's bits).
    pub q4_k: QuantDots,
    /// Q5_K weights · Q8K activations (an exact integer sum per super-block: every table
    /// gives the scalar one's bits).
    pub q5_k: QuantDots,
    /// Q6_K weights · Q8K activations (an exact integer sum per super-block: every table
    /// gives the scalar one's bits).
    pub q6_k: QuantDots,
    /// IQ4_NL weights · Q16 activations.
    pub iq4_nl: QuantDots,
    /// IQ4_XS weights · Q8K activations (an exact integer sum per super-block: every table
    /// gives the scalar one's bits).
    pub iq4_xs: QuantDots,
    /// IQ3_S weights · Q8K activations (an exact integer sum per super-block: every table
    /// gives the scalar one's bits).
    pub iq3_s: QuantDots,
    /// IQ3_XXS weights · Q8K activations (an exact integer sum per super-block: every table
    /// gives the scalar one's bits).
    pub iq3_xxs: QuantDots,
    /// IQ2_XXS weights · Q8K activations (an exact integer sum per super-block: every table
    /// gives the scalar one's bits).
    pub iq2_xxs: QuantDots,
    /// IQ2_XS weights · Q8K activations (an exact integer sum per super-block: every table
    /// gives the scalar one's bits).
    pub iq2_xs: QuantDots,
    /// IQ2_S weights · Q8K activations (an exact integer sum per super-block: every table
    /// gives the scalar one's bits).
    pub iq2_s: QuantDots,
    /// IQ1_S weights · Q8K activations (an exact integer sum per super-block: every table
    /// gives the scalar one's bits).
    pub iq1_s: QuantDots,
    /// IQ1_M weights · Q8K activations (an exact integer sum per super-block: every table
    /// gives the scalar one's bits).
    pub iq1_m: QuantDots,
    /// TQ1_0 weights · Q8K activations (an exact integer sum per super-block: every table
    /// gives the scalar one's bits).
    pub tq1_0: QuantDots,
    /// TQ2_0 weights · Q8K activations (an exact integer sum per super-block: every table
    /// gives the scalar one's bits).
    pub tq2_0: QuantDots,
    /// f32 weights (little-endian bytes) · f32 activations.
    pub dot_f32: fn(&[u8], &[f32]) -> f32,
    /// `dot_f32` for `TILE` activation rows.
    pub dot_f32_x4: fn(&[u8], [&[f32]; TILE]) -> [f32; TILE],
    /// f16 weights (little-endian bytes: GGUF F16 matrices, an F16 KV cache) · f32 activations.
    pub dot_f16: fn(&[u8], &[f32]) -> f32,
    /// `dot_f16` for `TILE` activation rows.
    pub dot_f16_x4: fn(&[u8], [&[f32]; TILE]) -> [f32; TILE],
    /// bf16 weights (GGUF BF16 matrices) · f32 activations, widened exactly.
    pub dot_bf16: fn(&[u8], &[f32]) -> f32,
    /// `dot_bf16` for `TILE` activation rows.
    pub dot_bf16_x4: fn(&[u8], [&[f32]; TILE]) -> [f32; TILE],
    /// `out[i] += Σ_k a[i·w.run + k·w.key] · rows[k]` for each run `out[i]` (as long as the
    /// Q8_0 rows) of `out` that `a` has all its weights for (`WeightStrides::runs`), over every
    /// row in order: attention's weighted sum over a quantized V cache, each row widened once
    /// for several query heads that share it, their sums kept in registers across a step of
    /// keys.
    pub axpy_q8_0: Axpy,
    /// `ops::silu_mul` and `ops::exp_sub`, compiled for this instruction set: the same
    /// bits as the scalar table's.
    pub silu_mul: fn(&mut [f32], &[f32]),
    /// `x ← exp(x − max)` over a row, returning the sum (softmax's middle step).
    pub exp_sub: fn(&mut [f32], f32) -> f32,
    /// `ops::add_weighted` compiled for this instruction set (the same bits as the scalar
    /// table's): one widened value row into several query rows' weighted sums.
    pub add_weighted: fn(&mut [f32], &[f32], usize, &[f32]),
    /// `ops::softmax_step` compiled for this instruction set (the same bits as the scalar
    /// table's): a step of keys of attention's online softmax for a block's query rows side
    /// by side.
    pub softmax_step: SoftmaxStep,
    /// f16 values (little-endian bytes) widened to f32, exactly: as many as both slices hold
    /// (an f16 KV cache's value rows, widened once per key for every query head that uses it).
    pub widen_f16: fn(&[u8], &mut [f32]),
}

impl Kernels {
    /// The fastest kernels this CPU runs. On x86-64 the AVX2 set is chosen only when the CPU
    /// reports AVX2, FMA and F16C (its AVX-VNNI and AVX-512 variants only with those too), so an older
    /// CPU gets the scalar set rather than SIGILL.
    pub fn best() -> &'static Kernels {
        // Miri interprets the scalar paths; it runs no `cpuid` and few vector intrinsics.
        #[cfg(miri)]
        return &scalar::KERNELS;
        #[cfg(target_arch = "x86_64")]
        if x86::amx_available() {
            return &x86::KERNELS_AMX;
        }
        #[cfg(target_arch = "x86_64")]
        if x86::avx512_available() {
            return &x86::KERNELS_AVX512;
        }
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
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        return &wasm32::KERNELS;
        #[allow(unreachable_code)]
        &scalar::KERNELS
    }

    /// The scalar reference kernels, on every CPU.
    pub fn scalar() -> &'static Kernels {
        &scalar::KERNELS
    }

    /// Every table this CPU runs: the scalar one, then each of `simd_tables` it runs.
    pub fn runnable_tables() -> impl Iterator<Item = &'static Kernels> {
        let simd = Kernels::simd_tables().iter().filter(|(_, runs)| runs());
        core::iter::once(Kernels::scalar()).chain(simd.map(|(k, _)| *k))
    }

    /// The table called `name` (`Kernels::name`) among `runnable_tables`: to compare
    /// instruction sets on one machine.
    pub fn runnable(name: &str) -> Option<&'static Kernels> {
        Kernels::runnable_tables().find(|k| k.name == name)
    }

    /// Every SIMD table this build carries for its architecture, each with the check of whether
    /// this CPU runs it: `best` picks among them, the tests check each against the scalar one.
    pub fn simd_tables() -> &'static [SimdTable] {
        // Miri runs no `cpuid`, and the scalar table alone.
        #[cfg(miri)]
        return &[];
        #[allow(unreachable_code)]
        &SIMD_TABLES
    }

    /// Transposes the tiles of `panel::X8` tokens that the transposed-tile kernels take for
    /// `n_tok` Q16 activation rows of `cols` values (`panel::x8_tiles`, a last tile padded with
    /// copies of the last row) for `format`, into `out`; `None` for a format without them (or
    /// rows that are not whole blocks). A mat-mul split across threads then transposes its
    /// tokens once (`Activations::transposed`).
    ///
    /// # Errors
    /// [`Error::Length`] when `q16` is not `n_tok` Q16 rows of `cols`, or `out` holds fewer
    /// bytes than those tiles' rows.
    pub fn transpose_tiles<'o>(
        &self,
        format: Format,
        q16: &[u8],
        n_tok: usize,
        cols: usize,
        out: &'o mut [u8],
    ) -> Result<Option<TransposedTiles<'o>>> {
        let Some(kernels) = self.dots(format).ok().and_then(|d| d.panel.as_ref()) else {
            return Ok(None);
        };
        if !cols.is_multiple_of(QK) {
            return Ok(None);
        }
        let row = q16::row_bytes(cols);
        same_len("Q16 activations", n_tok * row, q16.len())?;
        let tiles = panel::x8_tiles(n_tok);
        let tile_bytes = cols / QK * panel::X8_BLOCK_BYTES;
        let have = out.len();
        let out = out.get_mut(..tiles * tile_bytes).ok_or(Error::Length {
            what: "transposed tiles",
            expected: tiles * tile_bytes,
            got: have,
        })?;
        for (i, tile) in out.chunks_exact_mut(tile_bytes).enumerate() {
            let xs = core::array::from_fn(|t| {
                let t = (panel::X8 * i + t).min(n_tok - 1);
                &q16[t * row..][..row]
            });
            (kernels.transpose_x8)(xs, 0, tile);
        }
        Ok(Some(TransposedTiles {
            layout: kernels.x8_layout,
            bytes: out,
        }))
    }

    /// Transposes the tiles of `k_panel::K_TOKENS` tokens that the k-panel of `format` takes for
    /// `n_tok` Q8K activation rows of `cols` values (`k_panel::transpose_tiles`: `[tile][super-
    /// block]`, a last tile padded with copies of the last row) into `out`; `None` where
    /// `format` has no k-panel or `n_tok` tokens do not take it. A mat-mul split across
    /// threads, and across blocks of rows within each, then transposes its tokens once
    /// (`Activations::k_tiles`).
    ///
    /// # Errors
    /// [`Error::Length`] when `q8k` is not `n_tok` Q8K rows of `cols`, or `out` holds fewer
    /// tiles than those tokens take.
    pub fn transpose_k_tiles<'o>(
        &self,
        format: Format,
        q8k: &[u8],
        n_tok: usize,
        cols: usize,
        out: &'o mut [k_panel::KTokens],
    ) -> Result<Option<&'o [k_panel::KTokens]>> {
        let Some(kernels) = self
            .dots(format)
            .ok()
            .and_then(|d| d.k_panel.as_ref())
            .filter(|k| n_tok >= k.from_tokens)
        else {
            return Ok(None);
        };
        if !cols.is_multiple_of(quant::k_quants::QK_K) {
            return Ok(None);
        }
        let row = quant::q8k::row_bytes(cols);
        same_len("Q8K activations", n_tok * row, q8k.len())?;
        let ns = cols / quant::k_quants::QK_K;
        let tiles = k_panel::tiles(n_tok) * ns;
        let have = out.len();
        let out = out.get_mut(..tiles).ok_or(Error::Length {
            what: "transposed Q8K tiles",
            expected: tiles,
            got: have,
        })?;
        k_panel::transpose_tiles(kernels, ns, n_tok, |t| &q8k[t * row..][..row], out);
        Ok(Some(out))
    }

    /// The dots of a quantized weight format.
    ///
    /// # Errors
    /// [`Error::UnsupportedFormat`] for a format that is not quantized.
    pub fn dots(&self, format: Format) -> Result<&QuantDots> {
        match format {
            Format::Q8_0 => Ok(&self.q8_0),
            Format::Q4_0 => Ok(&self.q4_0),
            Format::Q4_1 => Ok(&self.q4_1),
            Format::Q5_0 => Ok(&self.q5_0),
            Format::Q5_1 => Ok(&self.q5_1),
            Format::Q2K => Ok(&self.q2_k),
            Format::Q3K => Ok(&self.q3_k),
            Format::Q4K => Ok(&self.q4_k),
            Format::Q5K => Ok(&self.q5_k),
            Format::Q6K => Ok(&self.q6_k),
            Format::IQ4NL => Ok(&self.iq4_nl),
            Format::IQ4XS => Ok(&self.iq4_xs),
            Format::IQ3S => Ok(&self.iq3_s),
            Format::IQ3XXS => Ok(&self.iq3_xxs),
            Format::IQ2XXS => Ok(&self.iq2_xxs),
            Format::IQ2XS => Ok(&self.iq2_xs),
            Format::IQ2S => Ok(&self.iq2_s),
            Format::IQ1S => Ok(&self.iq1_s),
            Format::IQ1M => Ok(&self.iq1_m),
            Format::TQ1_0 => Ok(&self.tq1_0),
            Format::TQ2_0 => Ok(&self.tq2_0),
            _ => Err(Error::UnsupportedFormat {
                what: "quantized dot product",
                format,
            }),
        }
    }

    /// Whether a `format` mat-mul of `n_tok` tokens unpacks its rows (`k_panel`): the work it
    /// shares between tokens is per row, not per token.
    pub fn unpacks_rows(&self, format: Format, n_tok: usize) -> bool {
        self.dots(format)
            .ok()
            .and_then(|d| d.k_panel.as_ref())
            .is_some_and(|k| n_tok >= k.from_tokens)
    }

    /// Quantizes `x` (a multiple of 32 long) to Q8_0 in `out`.
    ///
    /// # Errors
    /// [`Error::NotBlockMultiple`] if `x` is not whole blocks, [`Error::Length`] if `out` is not
    /// their size.
    pub fn quantize_q8_0(&self, x: &[f32], out: &mut [u8]) -> Result<()> {
        same_len("Q8_0 output", Format::Q8_0.row_bytes(x.len())?, out.len())?;
        (self.quantize_q8_0)(x, out);
        Ok(())
    }

    /// Quantizes `x` (a multiple of 32 long) to Q16 in `out`.
    ///
    /// # Errors
    /// [`Error::NotBlockMultiple`] if `x` is not whole blocks, [`Error::Length`] if `out` is not
    /// their size.
    pub fn quantize_q16(&self, x: &[f32], out: &mut [u8]) -> Result<()> {
        Format::Q8_0.row_bytes(x.len())?;
        same_len("Q16 output", q16::row_bytes(x.len()), out.len())?;
        (self.quantize_q16)(x, out);
        Ok(())
    }

    /// Quantizes `x` (a multiple of 256 long) to Q8K in `out`.
    ///
    /// # Errors
    /// [`Error::NotBlockMultiple`] if `x` is not whole blocks, [`Error::Length`] if `out` is not
    /// their size.
    pub fn quantize_q8k(&self, x: &[f32], out: &mut [u8]) -> Result<()> {
        Format::Q4K.row_bytes(x.len())?;
        same_len("Q8K output", quant::q8k::row_bytes(x.len()), out.len())?;
        (self.quantize_q8k)(x, out);
        Ok(())
    }

    /// Quantizes `x` (whole blocks) to `to` in `out`.
    ///
    /// # Errors
    /// As `quantize_q16` and `quantize_q8k`.
    pub fn quantize_activations(
        &self,
        to: ActivationFormat,
        x: &[f32],
        out: &mut [u8],
    ) -> Result<()> {
        match to {
            ActivationFormat::Q16 => self.quantize_q16(x, out),
            ActivationFormat::Q8K => self.quantize_q8k(x, out),
        }
    }

    /// Dot product of one weight row stored in a quantized `format` with one row of
    /// activations of the same length in the format's `activation_format`.
    ///
    /// # Errors
    /// [`Error::UnsupportedFormat`] for a format that is not quantized; a length error if `w` is not
    /// whole blocks or `x` is not the same number of activation blocks.
    pub fn dot_quantized(&self, format: Format, w: &[u8], x: &[u8]) -> Result<f32> {
        let dots = self.dots(format)?;
        let n = expect_quantized_row(format, w.len())?;
        let acts = activation_format(format)?;
        same_len(acts.name(), acts.row_bytes(n), x.len())?;
        Ok((dots.one)(w, x))
    }

    /// `out[i] += Σ_k a[i·w.run + k·w.key] · rows[k]` over Q8_0 rows of one length, for each
    /// run `out[i]` as long as they are.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no rows, or `a` without weights for every run; a length
    /// error for a row that is not `out`'s run length in Q8_0, or an `out` that is not whole
    /// runs.
    pub fn axpy_q8_0(
        &self,
        out: &mut [f32],
        a: &[f32],
        w: WeightStrides,
        rows: &[&[u8]],
    ) -> Result<()> {
        let k = rows.len();
        if k == 0 {
            return Err(Error::InvalidArgument {
                what: "axpy",
                reason: "it takes one row or more",
            });
        }
        let n = expect_quantized_row(Format::Q8_0, rows[0].len())?;
        if n == 0 {
            return Err(Error::InvalidArgument {
                what: "axpy",
                reason: "the rows hold no blocks",
            });
        }
        for row in rows {
            same_len("Q8_0 row", Format::Q8_0.row_bytes(n)?, row.len())?;
        }
        if !out.len().is_multiple_of(n) {
            return Err(Error::NotBlockMultiple {
                what: "axpy output (runs of the rows' length)",
                len: out.len(),
                block: n,
            });
        }
        let runs = out.len() / n;
        if w.runs(a.len(), k, runs) < runs {
            return Err(Error::InvalidArgument {
                what: "axpy",
                reason: "the weights do not cover every run of the output",
            });
        }
        (self.axpy_q8_0)(out, a, w, rows);
        Ok(())
    }

    /// Dot product of two f32 vectors, the first as little-endian bytes.
    ///
    /// # Errors
    /// [`Error::Length`] if `w` is not `4 × x.len()` bytes.
    pub fn dot_f32_bytes(&self, w: &[u8], x: &[f32]) -> Result<f32> {
        same_len("f32 weight bytes", x.len() * 4, w.len())?;
        Ok((self.dot_f32)(w, x))
    }

    /// Dot product of a bf16 vector (little-endian bytes) and an f32 one.
    ///
    /// # Errors
    /// [`Error::Length`] if `w` is not `2 × x.len()` bytes.
    pub fn dot_bf16_bytes(&self, w: &[u8], x: &[f32]) -> Result<f32> {
        same_len("bf16 weight bytes", x.len() * 2, w.len())?;
        Ok((self.dot_bf16)(w, x))
    }

    /// Dot product of an f16 vector (little-endian bytes) and an f32 one.
    ///
    /// # Errors
    /// [`Error::Length`] if `w` is not `2 × x.len()` bytes.
    pub fn dot_f16_bytes(&self, w: &[u8], x: &[f32]) -> Result<f32> {
        same_len("f16 weight bytes", x.len() * 2, w.len())?;
        Ok((self.dot_f16)(w, x))
    }

    /// Rows `row0 .. row0 + n` of `W · Xᵀ` (`n = out.len() / n_tok`), for the `n_tok` activation
    /// rows in `x`.
    ///
    /// `out[t * n + (r - row0)]` receives row `r` against token `t`: a run of rows is one
    /// contiguous piece of `out`, which is how decoding splits a mat-vec across threads, and
    /// each token's results in it are one run, which goes to its place with one copy.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `x` and `out` do not fit `w` and the rows asked for, and the
    /// format errors of the dot products.
    pub fn matmul_rows(
        &self,
        w: &Matrix<'_>,
        x: &Activations<'_>,
        row0: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let n_tok = x.n_tok;
        if n_tok == 0 || !out.len().is_multiple_of(n_tok) {
            return Err(Error::InvalidArgument {
                what: "mat-mul output",
                reason: "it is not a whole number of rows of one result per token",
            });
        }
        if row0 + out.len() / n_tok > w.rows {
            return Err(Error::OutOfRange {
                what: "mat-mul row",
                index: row0 + out.len() / n_tok - 1,
                len: w.rows,
            });
        }
        let rows = out.len() / n_tok;
        self.matmul(w, x, row0..row0 + rows, 0..n_tok, |r, t, run| {
            put_run(&mut out[t * rows + r..], run)
        })
    }

    /// Tokens `tok0 .. tok0 + out.len() / w.rows` of `X · Wᵀ`, every row of `w`.
    ///
    /// `out[(t - tok0) * w.rows + r]` receives row `r` against token `t`: each token's results
    /// in one run, the layout of the layer loop's activations. (The CPU backend splits its
    /// mat-muls by rows, `matmul_rows`, so that each weight is packed or unpacked once per
    /// batch; a split by tokens packs each weight once per chunk.)
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `x` and `out` do not fit `w` and the tokens asked for, and
    /// the format errors of the dot products.
    pub fn matmul_tokens(
        &self,
        w: &Matrix<'_>,
        x: &Activations<'_>,
        tok0: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let rows = w.rows;
        if rows == 0 || !out.len().is_multiple_of(rows) {
            return Err(Error::InvalidArgument {
                what: "mat-mul output",
                reason: "it is not a whole number of tokens of one result per row",
            });
        }
        if tok0 + out.len() / rows > x.n_tok {
            return Err(Error::OutOfRange {
                what: "mat-mul token",
                index: tok0 + out.len() / rows - 1,
                len: x.n_tok,
            });
        }
        let n = out.len() / rows;
        self.matmul(w, x, 0..rows, tok0..tok0 + n, |r, t, run| {
            put_run(&mut out[t * rows + r..], run)
        })
    }

    /// Weight rows `rows` against tokens `toks`; `put(r, t, run)` takes the results of rows
    /// `r .. r + run.len()` against token `t`, with `r` and `t` counted from the ranges' starts.
    fn matmul(
        &self,
        w: &Matrix<'_>,
        x: &Activations<'_>,
        rows: Range<usize>,
        toks: Range<usize>,
        mut put: impl FnMut(usize, usize, &[f32]),
    ) -> Result<()> {
        if x.cols != w.cols {
            return Err(Error::Length {
                what: "activation row",
                expected: w.cols,
                got: x.cols,
            });
        }
        let (n_rows, n_tok) = (rows.len(), toks.len());
        let w_row = |r: usize| w.row(rows.start + r);
        match w.format {
            Format::Q8_0
            | Format::Q4_0
            | Format::Q4_1
            | Format::Q5_0
            | Format::Q5_1
            | Format::Q2K
            | Format::Q3K
            | Format::Q4K
            | Format::Q5K
            | Format::Q6K
            | Format::IQ4NL
            | Format::IQ4XS
            | Format::IQ3S
            | Format::IQ3XXS
            | Format::IQ2XXS
            | Format::IQ2XS
            | Format::IQ2S
            | Format::IQ1S
            | Format::IQ1M
            | Format::TQ1_0
            | Format::TQ2_0 => {
                let dots = self.dots(w.format)?;
                let acts = activation_format(w.format)?;
                let q = match acts {
                    ActivationFormat::Q16 => x.q16,
                    ActivationFormat::Q8K => x.q8k,
                }
                .ok_or(Error::UnsupportedFormat {
                    what: "mat-mul without its quantized activations",
                    format: w.format,
                })?;
                let xb = acts.row_bytes(x.cols);
                same_len(acts.name(), xb * x.n_tok, q.len())?;
                let x1 = |t: usize| &q[(toks.start + t) * xb..(toks.start + t + 1) * xb];
                if let Some(kernels) = dots.k_panel.as_ref().filter(|k| x.n_tok >= k.from_tokens) {
                    let ns = x.cols / quant::k_quants::QK_K;
                    // Tiles transposed once for all chunks, from the first token asked for.
                    let transposed = x
                        .k_tiles
                        .filter(|_| toks.start.is_multiple_of(k_panel::K_TOKENS))
                        .and_then(|t| t.get(toks.start / k_panel::K_TOKENS * ns..));
                    k_panel::matmul(kernels, n_rows, ns, w_row, n_tok, x1, transposed, put);
                    return Ok(());
                }
                if let Some(kernels) = &dots.panel {
                    let nb = x.cols / QK;
                    if x.n_tok >= kernels.pack_from {
                        panel::matmul(kernels, n_rows, nb, w_row, n_tok, x1, put);
                    } else {
                        // Tiles transposed for these kernels, from the first token asked for.
                        let tile_bytes = nb * panel::X8_BLOCK_BYTES;
                        let transposed = x
                            .transposed
                            .filter(|t| t.layout == kernels.x8_layout)
                            .filter(|_| toks.start.is_multiple_of(panel::X8))
                            .and_then(|t| t.bytes.get(toks.start / panel::X8 * tile_bytes..));
                        panel::matvec(kernels, n_rows, nb, w_row, n_tok, x1, transposed, put);
                    }
                    return Ok(());
                }
                // Tokens past the end repeat the last one; `tile` drops their results.
                let x4 = |t: usize| -> [&[u8]; TILE] {
                    core::array::from_fn(|i| x1((t + i).min(n_tok - 1)))
                };
                tile(
                    n_rows,
                    n_tok,
                    |r, t| (dots.one)(w_row(r), x1(t)),
                    |r, t| (dots.x4)(w_row(r), x4(t)),
                    Some((
                        |r, t| (dots.rows4)(core::array::from_fn(|i| w_row(r + i)), x1(t)),
                        |r, t| (dots.rows2x4)([w_row(r), w_row(r + 1)], x4(t)),
                    )),
                    |r, t, v| put(r, t, &[v]),
                );
            }
            Format::F32 | Format::F16 | Format::BF16 => {
                let xf = x.f32;
                same_len("f32 activations", x.cols * x.n_tok, xf.len())?;
                let c = x.cols;
                let x1 = |t: usize| &xf[(toks.start + t) * c..(toks.start + t + 1) * c];
                let (one, four) = match w.format {
                    Format::F32 => (self.dot_f32, self.dot_f32_x4),
                    Format::F16 => (self.dot_f16, self.dot_f16_x4),
                    _ => (self.dot_bf16, self.dot_bf16_x4),
                };
                let no_pairs: Option<(QuadAt, PairAt)> = None;
                tile(
                    n_rows,
                    n_tok,
                    |r, t| one(w_row(r), x1(t)),
                    |r, t| {
                        // Tokens past the end repeat the last one; `tile` drops their results.
                        four(
                            w_row(r),
                            core::array::from_fn(|i| x1((t + i).min(n_tok - 1))),
                        )
                    },
                    no_pairs,
                    |r, t, v| put(r, t, &[v]),
                );
            }
        }
        Ok(())
    }
}

/// Copies a run of results to the start of `out`. A whole panel's run, the many-token kernel's,
/// is copied at a length the compiler knows (a few vector moves) where a call to `memmove` per
/// run of 16 results took 5% of a Q8_0 prefill's samples (pp512 1.5% faster without).
#[inline(always)]
fn put_run(out: &mut [f32], run: &[f32]) {
    match run.len() {
        panel::PANEL => out[..panel::PANEL].copy_from_slice(&run[..panel::PANEL]),
        n => out[..n].copy_from_slice(run),
    }
}

/// Multi-row tiles at (first row, first token): four rows and one token, two rows and `TILE`.
type QuadAt = fn(usize, usize) -> [f32; 4];
type PairAt = fn(usize, usize) -> [[f32; TILE]; 2];

/// Weight rows per block of `tile`'s outer loop: their bytes stay in the nearest caches while
/// every tile of tokens passes over them.
const ROW_BLOCK: usize = 64;

/// Computes `rows × n_tok` results with kernels at (row, first token): one row and one token
/// `one`, one row and `TILE` tokens `four`, and, where the format has them, four rows and one
/// token and two rows and `TILE` tokens (`multi`); `put(r, t, value)` stores each. Rows go in
/// blocks of `ROW_BLOCK`; within one, tiles of tokens (`tiles_of_four`: the last one may be
/// padded, `four` and the pairs then given tokens past `n_tok`, whose results are dropped) take
/// two rows at a time, the tokens left over (a token decoding alone) four rows at a time.
fn tile(
    rows: usize,
    n_tok: usize,
    one: impl Fn(usize, usize) -> f32,
    four: impl Fn(usize, usize) -> [f32; TILE],
    multi: Option<(
        impl Fn(usize, usize) -> [f32; 4],
        impl Fn(usize, usize) -> [[f32; TILE]; 2],
    )>,
    mut put: impl FnMut(usize, usize, f32),
) {
    let tiles = tiles_of_four(n_tok) * TILE;
    for r0 in (0..rows).step_by(ROW_BLOCK) {
        let r1 = (r0 + ROW_BLOCK).min(rows);
        let (by_2, by_4) = match multi {
            Some(_) => (r0 + (r1 - r0) / 2 * 2, r0 + (r1 - r0) / 4 * 4),
            None => (r0, r0),
        };
        for t in (0..tiles).step_by(TILE) {
            if let Some((_, pair)) = &multi {
                for r in (r0..by_2).step_by(2) {
                    let [v0, v1] = pair(r, t);
                    for (i, (a, b)) in v0.into_iter().zip(v1).enumerate().take(n_tok - t) {
                        put(r, t + i, a);
                        put(r + 1, t + i, b);
                    }
                }
            }
            for r in by_2..r1 {
                for (i, v) in four(r, t).into_iter().enumerate().take(n_tok - t) {
                    put(r, t + i, v);
                }
            }
        }
        for t in tiles..n_tok {
            if let Some((quad, _)) = &multi {
                for r in (r0..by_4).step_by(4) {
                    for (i, v) in quad(r, t).into_iter().enumerate() {
                        put(r + i, t, v);
                    }
                }
            }
            for r in by_4..r1 {
                put(r, t, one(r, t));
            }
        }
    }
}

/// `n_tok` rows of activations, each `cols` long: always as f32, and as Q16 or Q8K when a
/// quantized weight will consume them.
#[derive(Clone, Copy)]
pub struct Activations<'a> {
    /// The rows as f32 (`n_tok × cols`).
    pub f32: &'a [f32],
    /// The same rows as Q16 blocks, for the formats that take them (`None` if the caller has
    /// none).
    pub q16: Option<&'a [u8]>,
    /// The same rows as Q8K blocks, for the k-quants (`None` if the caller has none).
    pub q8k: Option<&'a [u8]>,
    /// The Q16 rows' first tiles of `panel::X8` tokens, already transposed
    /// (`Kernels::transpose_tiles`), or `None`: the transposed-tile kernels then transpose them
    /// themselves.
    pub transposed: Option<TransposedTiles<'a>>,
    /// The Q8K rows' tiles of `k_panel::K_TOKENS` tokens, transposed for the k-quants' k-panel
    /// (`Kernels::transpose_k_tiles`), or `None`: the k-panel then transposes them itself.
    pub k_tiles: Option<&'a [k_panel::KTokens]>,
    /// Rows (tokens).
    pub n_tok: usize,
    /// Values per row.
    pub cols: usize,
}

/// How a table's `transpose_x8` lays out a tile: tiles transposed for one format's kernels
/// serve every format whose kernels read the same layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum X8Layout {
    /// Pairs of i16 quants, `[pair][token]` (`panel`).
    Pairs,
    /// High and low bytes of the quants, `[group of four][token]` (x86 AMX).
    Bytes,
    /// Pairs of i16 quants by 128-bit lanes, `[half of the tile][group of four pairs][token of
    /// the half][pair]` (x86 AVX-512).
    Lanes,
}

/// Whole tiles of `panel::X8` Q16 activation rows, transposed: tile `i` holds tokens
/// `8i .. 8i + 8`, all their blocks (`panel::X8_BLOCK_BYTES` each).
#[derive(Debug, Clone, Copy)]
pub struct TransposedTiles<'a> {
    /// The layout of the tiles.
    pub layout: X8Layout,
    /// The tiles, one after another.
    pub bytes: &'a [u8],
}

/// The activation format of a quantized `format`.
fn activation_format(format: Format) -> Result<ActivationFormat> {
    format.activation_format().ok_or(Error::UnsupportedFormat {
        what: "quantized dot product",
        format,
    })
}

/// Whole Q8_0 blocks in the shortest of `rows` (0 for none): what an axpy kernel may read.
fn q8_0_blocks(rows: &[&[u8]]) -> usize {
    rows.iter()
        .map(|r| r.len() / quant::BlockQ8_0::BYTES)
        .min()
        .unwrap_or(0)
}

/// Checks that `bytes` is a whole row of a quantized format and returns its length in values.
fn expect_quantized_row(format: Format, bytes: usize) -> Result<usize> {
    if !format.is_quantized() {
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
    Ok(bytes / format.block_bytes() * format.block_len())
}

#[cfg(test)]
mod tests;
