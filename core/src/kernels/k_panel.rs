//! The k-quants' many-token mat-mul (prefill): a block of weight rows is unpacked once per
//! super-block into one byte per value, and every tile of sixteen tokens, transposed, runs over it.
//!
//! Transposed, a tile's Q8K quants sit `[group of four values][token][4]`: one 512-bit load gives
//! the same four values of all sixteen tokens, and one `vpdpbusd` against a row's four unpacked
//! bytes, broadcast, adds them to sixteen integer sums at once, one per token. Sixty-four
//! multiply-adds per instruction, where the row-by-token tiles (`rows2x4`) need a `vpmaddubsw`
//! and a `vpmaddwd` for 32 and unpack each block again for every four tokens. A half's (or a
//! block's) sums are then multiplied by its integer scale, the minimums' and offsets' terms come
//! from the tokens' 16-value sums, and the super-block ends with `q8k_step`'s float operations in
//! each token's lane: the scalar kernel's exact integer sums and float order, so its bits.
//!
//! On AMX (x86-64, `x86::kpanel_amx`) unpacking also folds each half's scale into its values,
//! and the tile unit multiplies sixteen rows by the tile at once.
//!
//! Unpacking costs once per block of `K_ROWS` rows, super-block and group of up to
//! `K_GROUP_TOKENS` tokens: small next to the arithmetic it feeds except the i-quants' (IQ3_S's
//! took a fifth of a prefill's time with groups of 128 tokens; BENCHMARKS.md), hence groups as
//! large as the stack allows. The tiles are transposed once per mat-mul input, into the
//! scratch (`transpose_tiles`), where each block of rows transposing them again took 8% of a
//! prefill's time.
use crate::quant::k_quants::{HALVES_PER_SUPER, QK_K};
use crate::quant::{BlockQ8K, KBlock};

/// Tokens of a transposed tile: one per 32-bit lane of a 512-bit vector.
pub const K_TOKENS: usize = 16;

/// Weight rows a kernel call takes at a time: `dot` gets a multiple of this many.
pub const K_MICRO: usize = 8;

/// Weight rows unpacked at a time (a multiple of `K_MICRO` and of AMX's sixteen): 18 KiB
/// (42 KiB on x86-64, whose rows also hold their scaled values), in L2 while the tiles pass.
/// With the results of `K_GROUP_TOKENS` tokens waiting in float, 72 KiB of stack in all (96 KiB
/// on x86-64; docs/embedded.md). Each block of rows reads the transposed tiles again: 32 rows
/// made the 1.1B shape's prefill level to 3% slower (Q4_K_M) than 48; 64, faster when each
/// block transposed the tiles itself, would need 126 KiB of stack on x86-64.
pub const K_ROWS: usize = 48;

/// The fewest tokens any table's k-panel takes (`KPanelDots::from_tokens`): a scratch for
/// smaller batches holds no transposed tiles.
pub const K_FEWEST_TOKENS: usize = 5;

/// Tokens whose results wait in float while the super-blocks go by: their unpacking is shared
/// (the CPU backend splits these mat-muls by rows, each chunk taking all the tokens).
pub(crate) const K_GROUP_TOKENS: usize = 256;

/// One weight row's super-block, unpacked.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KRow {
    /// The stored quants (`KBlock::quants`, `OFFSET` above the signed ones), values in order.
    pub codes: [u8; QK_K],
    /// Each value (its code less `OFFSET`) times its half's integer scale (at most 4,096 in
    /// size, Q6_K's -32·-128, whatever the bits: an `i16`), as `256·high + low`: the low bytes,
    /// unsigned. Only tables whose `unpack` folds the scales (`KPanelDots::folds_scales`, AMX)
    /// write these; AMX multiplies them with the tokens'.
    #[cfg(target_arch = "x86_64")]
    pub scaled_low: [u8; QK_K],
    /// The high bytes of those products (see `scaled_low`), signed.
    #[cfg(target_arch = "x86_64")]
    pub scaled_high: [i8; QK_K],
    /// Each half's integer scale (`KInts::scales`), widened.
    pub scales: [i32; HALVES_PER_SUPER],
    /// What multiplies the tokens' 16-value sums, as `i16` pairs (half `2i` low, `2i + 1` high):
    /// the minimums (formats with minimums), the scales (formats with an offset), else zeros.
    /// No format has both.
    pub side: [u32; HALVES_PER_SUPER / 2],
    /// The super-block's scale `d` and minimum scale `dmin` (formats without minimums: `d`).
    pub d: f32,
    /// See `d`.
    pub dmin: f32,
}

impl KRow {
    /// A row of zeros: what a super-block missing from a short row unpacks to.
    pub const ZERO: KRow = KRow {
        codes: [0; QK_K],
        #[cfg(target_arch = "x86_64")]
        scaled_low: [0; QK_K],
        #[cfg(target_arch = "x86_64")]
        scaled_high: [0; QK_K],
        scales: [0; HALVES_PER_SUPER],
        side: [0; HALVES_PER_SUPER / 2],
        d: 0.0,
        dmin: 0.0,
    };
}

/// A tile of `K_TOKENS` tokens' Q8K blocks (one super-block), transposed. Bytes and f32s with
/// no padding (its size a multiple of its alignment), so a scratch arena's bytes can hold them.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KTokens {
    /// Group `g` holds values `4g .. 4g + 4` of every token, token `t` at bytes `4t .. 4t + 4`.
    pub codes: [[u8; 4 * K_TOKENS]; QK_K / 4],
    /// Entry `i` holds the sums of halves `2i` and `2i + 1` of every token (`i16` pairs, token
    /// `t` at bytes `4t .. 4t + 4`).
    pub sums: [[u8; 4 * K_TOKENS]; HALVES_PER_SUPER / 2],
    /// Each token's scale.
    pub d: [f32; K_TOKENS],
}

const _: () = assert!(size_of::<KTokens>() == BlockQ8K::BYTES * K_TOKENS);

impl KTokens {
    /// A tile of zeros.
    pub const ZERO: KTokens = KTokens {
        codes: [[0; 4 * K_TOKENS]; QK_K / 4],
        sums: [[0; 4 * K_TOKENS]; HALVES_PER_SUPER / 2],
        d: [0.0; K_TOKENS],
    };
}

/// The k-quant mat-mul kernels of one format on one instruction set.
#[derive(Clone)]
pub struct KPanelDots {
    /// Tokens from which a mat-mul takes these kernels (fewer take the format's tiles of four,
    /// `QuantDots::x4` and `rows2x4`): both ways give the same bits.
    pub from_tokens: usize,
    /// Super-block `s` of each weight row into its `KRow`, as many as both hold (as
    /// `unpack_ref` does; a row too short for it gives `KRow::ZERO`).
    pub unpack: fn(&[&[u8]], usize, &mut [KRow]),
    /// Whether `unpack` also writes each value times its scale (`KRow::scaled_low`,
    /// `scaled_high`; x86-64's AMX table); other tables leave those bytes as they were.
    pub folds_scales: bool,
    /// Super-block `s` of `K_TOKENS` Q8K activation rows, transposed (as `transpose_ref` does;
    /// a row too short for it gives a token of zeros).
    pub transpose: fn([&[u8]; K_TOKENS], usize, &mut KTokens),
    /// Unpacked rows · a transposed tile: `acc[r][t] +=` the super-block's `q8k_step`, for
    /// the first `K_MICRO`-multiple of rows `rows` and `acc` both hold, and at least the
    /// tile's first `tokens` tokens (a decode step's few: the lanes past them may be left
    /// as they were).
    pub dot: fn(&[KRow], &KTokens, usize, &mut [[f32; K_TOKENS]]),
}

/// Super-block `s` of one row in format `K`, with the scaled values too where `folds_scales`:
/// the reference the SIMD unpackers are tested against.
#[cfg(test)]
pub fn unpack_ref<K: KBlock>(row: &[u8], s: usize, folds_scales: bool) -> KRow {
    let Some(sb) = row.get(s * K::BYTES..(s + 1) * K::BYTES) else {
        return KRow::ZERO;
    };
    let mut out = KRow {
        codes: core::array::from_fn(|v| K::quants(sb, v / 32)[v % 32]),
        ..KRow::ZERO
    };
    unpack_factors::<K>(sb, &mut out);
    #[cfg(target_arch = "x86_64")]
    if folds_scales {
        for v in 0..QK_K {
            let value = out.codes[v] as i32 - K::OFFSET;
            let p = value * out.scales[v / crate::quant::q8k::SUM_SPAN];
            out.scaled_low[v] = p as u8;
            out.scaled_high[v] = (p >> 8) as i8;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = folds_scales;
    out
}

/// Everything of a `KRow` but its codes, from the super-block at the start of `sb`.
pub fn unpack_factors<K: KBlock>(sb: &[u8], out: &mut KRow) {
    let ints = K::ints(sb);
    let side = if K::HAS_MIN { ints.mins } else { ints.scales };
    let takes_side = K::HAS_MIN || K::OFFSET != 0;
    let pair = |a: i8, b: i8| (a as i16 as u16) as u32 | ((b as i16 as u16) as u32) << 16;
    out.scales = ints.scales.map(i32::from);
    out.side = core::array::from_fn(|i| match takes_side {
        true => pair(side[2 * i], side[2 * i + 1]),
        false => 0,
    });
    (out.d, out.dmin) = K::d_dmin(sb);
}

/// Super-block `s` of `K_TOKENS` Q8K rows, transposed: the reference the SIMD transposers are
/// tested against, and what they fall back on for rows too short for it.
pub fn transpose_ref(xs: [&[u8]; K_TOKENS], s: usize) -> KTokens {
    let mut out = KTokens::ZERO;
    for (t, x) in xs.iter().enumerate() {
        let Some(b) = x.get(s * BlockQ8K::BYTES..(s + 1) * BlockQ8K::BYTES) else {
            continue;
        };
        for (g, codes) in out.codes.iter_mut().enumerate() {
            let at = BlockQ8K::QUANTS + 4 * g;
            codes[4 * t..4 * t + 4].copy_from_slice(&b[at..at + 4]);
        }
        for (i, sums) in out.sums.iter_mut().enumerate() {
            let at = BlockQ8K::SUMS + 4 * i;
            sums[4 * t..4 * t + 4].copy_from_slice(&b[at..at + 4]);
        }
        out.d[t] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
    out
}

/// Tiles of `K_TOKENS` tokens for `n_tok` tokens, a last one padded.
pub const fn tiles(n_tok: usize) -> usize {
    n_tok.div_ceil(K_TOKENS)
}

/// Every tile of `n_tok` Q8K activation rows `x(t)` (`ns` super-blocks each) transposed by
/// `kernels` into `out`, `[tile][super-block]` (tile `i` holds tokens `16i .. 16i + 16`, a
/// last one padded with copies of the last token, as `matmul` pads them); `out` holds at least
/// `tiles(n_tok) · ns` of them.
pub fn transpose_tiles<'a>(
    kernels: &KPanelDots,
    ns: usize,
    n_tok: usize,
    x: impl Fn(usize) -> &'a [u8],
    out: &mut [KTokens],
) {
    if n_tok == 0 || ns == 0 {
        return;
    }
    for (i, tile) in out.chunks_exact_mut(ns).take(tiles(n_tok)).enumerate() {
        let xs = core::array::from_fn(|j| x((i * K_TOKENS + j).min(n_tok - 1)));
        for (s, t) in tile.iter_mut().enumerate() {
            (kernels.transpose)(xs, s, t);
        }
    }
}

/// `rows × n_tok` results of k-quant weight rows `row(r)` (`ns` super-blocks each) against Q8K
/// activation rows `x(t)`, by `kernels`; `put(r, t, run)` stores those of rows
/// `r .. r + run.len()`. `transposed`, where the caller has them, are the tokens' tiles as
/// `transpose_tiles` lays them out (else each block of rows transposes them itself).
#[allow(clippy::too_many_arguments)]
pub fn matmul<'a>(
    kernels: &KPanelDots,
    rows: usize,
    ns: usize,
    row: impl Fn(usize) -> &'a [u8],
    n_tok: usize,
    x: impl Fn(usize) -> &'a [u8],
    transposed: Option<&[KTokens]>,
    mut put: impl FnMut(usize, usize, &[f32]),
) {
    if n_tok == 0 || rows == 0 {
        return;
    }
    let transposed = transposed.filter(|t| t.len() >= tiles(n_tok) * ns);
    let mut unpacked = [KRow::ZERO; K_ROWS];
    let mut tile = KTokens::ZERO;
    // `[tile][row][token]`: a row's sixteen results are one vector for the kernel.
    let mut totals = [[[0f32; K_TOKENS]; K_ROWS]; K_GROUP_TOKENS / K_TOKENS];
    for r0 in (0..rows).step_by(K_ROWS) {
        let n = (rows - r0).min(K_ROWS);
        let padded = n.next_multiple_of(K_MICRO);
        // Rows past the end repeat the last one; their results are dropped.
        let ws: [&[u8]; K_ROWS] = core::array::from_fn(|i| row((r0 + i).min(rows - 1)));
        for t0 in (0..n_tok).step_by(K_GROUP_TOKENS) {
            let group_tiles = tiles((n_tok - t0).min(K_GROUP_TOKENS));
            for t in &mut totals[..group_tiles] {
                t[..padded].fill([0.0; K_TOKENS]);
            }
            for s in 0..ns {
                (kernels.unpack)(&ws[..padded], s, &mut unpacked[..padded]);
                for (i, totals) in totals[..group_tiles].iter_mut().enumerate() {
                    let at = t0 / K_TOKENS + i;
                    let tile = match transposed {
                        Some(transposed) => &transposed[at * ns + s],
                        None => {
                            // Tokens past the end repeat the last one; their results are dropped.
                            let xs =
                                core::array::from_fn(|j| x((at * K_TOKENS + j).min(n_tok - 1)));
                            (kernels.transpose)(xs, s, &mut tile);
                            &tile
                        }
                    };
                    let tokens = (n_tok - at * K_TOKENS).min(K_TOKENS);
                    (kernels.dot)(&unpacked[..padded], tile, tokens, &mut totals[..padded]);
                }
            }
            let mut run = [0f32; K_ROWS];
            for (i, totals) in totals[..group_tiles].iter().enumerate() {
                for j in 0..K_TOKENS {
                    let t = t0 + i * K_TOKENS + j;
                    if t >= n_tok {
                        break;
                    }
                    for (o, r) in run[..n].iter_mut().zip(totals) {
                        *o = r[j];
                    }
                    // In runs of a length the compiler knows, which the callers copy with a
                    // few vector moves (a call to `memcpy` per run of 48 took 2% of a
                    // prefill's samples).
                    let whole = n / K_TOKENS * K_TOKENS;
                    for r in (0..whole).step_by(K_TOKENS) {
                        put(r0 + r, t, &run[r..r + K_TOKENS]);
                    }
                    if whole < n {
                        put(r0 + whole, t, &run[whole..n]);
                    }
                }
            }
        }
    }
}
