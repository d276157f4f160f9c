//! The many-token mat-mul (prefill): `PANEL` weight rows are widened once into a packed panel,
//! then every tile of tokens runs over it.
//!
//! Packed, the quants of a block sit `[pair][row][2]` as i16: one vector load gives the same two
//! values of every row, and one `vpdpwssd` against a token's broadcast pair of Q16 values adds
//! them to one integer sum per row. A (row, token) pair's block sum then ends in one vector lane,
//! so the block's scaling (convert, scale, add) is shared by all the panel's rows, and each
//! broadcast value by all of them: several times fewer vector operations per multiply-add than
//! the one-row kernels, whose lanes hold parts of one pair's sum.
//!
//! Each (row, token) result is the same whatever other rows and tokens share its panel and tile
//! (padding rows and tokens are computed and dropped), so threads and splits change nothing.
//! It is not the bits of the one-row kernels: those sum each lane's part of a block in float.
//!
//! A decode step of eight to fifteen sequences is too few tokens to repay packing every
//! weight panel, so its tiles of eight tokens turn the other way round: the activations are
//! transposed instead (`[pair][token]`, once per call, a few kilobytes), and each weight row,
//! unpacked in place, broadcasts its pairs against them. A lane then holds one token's block sum
//! of one row: the same integer sum and the same float scaling as the panel kernel's lane.
#[cfg(test)]
use super::scalar::{unpack_at, Unpack};
use super::{PanelDots, PanelRows, TILE};
use crate::quant::{BlockQ16, QK};

/// Weight rows per panel: one 512-bit vector of i32 sums (two 256-bit ones).
pub const PANEL: usize = 16;

/// Bytes of one packed block: the rows' scales, the rows' minimums (zero for formats without),
/// both f32, then the quants as i16 `[pair][row][2]`.
pub const PANEL_BLOCK_BYTES: usize = PANEL_QUANTS + PANEL * QK * 2;

/// Byte offset of the quants in a packed block.
pub const PANEL_QUANTS: usize = 2 * PANEL * 4;

/// Blocks packed at a time: 18 KiB on the stack, which stays in L1 while the tiles pass.
const CHUNK_BLOCKS: usize = 16;

/// Tokens of a transposed tile (`rows_x8`): one per 32-bit lane of a 256-bit vector.
pub const X8: usize = 8;

/// Tokens left over past the whole transposed tiles from which one more tile is run, padded
/// with copies of the last token (their results dropped): one pass over the weights for all of
/// them, where a tile of four and single tokens make two to four (a decode step of five
/// sequences ran at 0.78x four's rate, seven at 0.64x; padded, they run at eight's cost, 1.14x
/// four's).
pub const X8_PADDED_FROM: usize = 5;

/// Transposed tiles that `matvec` runs for `n_tok` tokens: the whole ones, and one padded from
/// `X8_PADDED_FROM` tokens left over.
pub const fn x8_tiles(n_tok: usize) -> usize {
    n_tok / X8 + (n_tok % X8 >= X8_PADDED_FROM) as usize
}

/// Weight rows per call of the transposed-tile kernel: one AMX tile of rows (the 256-bit kernels
/// take them four at a time).
pub const X8_ROWS: usize = 16;

/// Bytes of one block of a transposed tile: the tokens' scales and their sums (both f32), then
/// for each pair of quants the tokens' pairs (`[pair][token]`, two i16 each).
pub const X8_BLOCK_BYTES: usize = X8_QUANTS + QK / 2 * X8 * 4;

/// Byte offset of the pairs in a transposed block.
pub const X8_QUANTS: usize = 2 * X8 * 4;

/// Most blocks of a transposed tile held at once: 36 KiB on the stack, 2,048 columns (every
/// projection of models up to that hidden size is transposed once per call). Smaller rows get
/// a buffer of 16 or 32 blocks: zeroing it is paid once per call, and a call comes per thread's
/// share of rows.
const X8_CHUNK_BLOCKS: usize = 64;

/// Weight rows whose results wait while a tile's chunks of blocks go by (more blocks than one
/// chunk holds): a multiple of `X8_ROWS`.
const X8_GROUP_ROWS: usize = 64;

#[repr(align(64))]
struct Transposed<const BLOCKS: usize>([[u8; X8_BLOCK_BYTES]; BLOCKS]);

/// Tokens whose accumulators wait on the stack while the blocks go chunk by chunk: the packing
/// of each chunk is shared by this many tokens, a whole batch of the default size (16 KiB of
/// accumulators; 128 tokens, which packed each panel twice a batch, made SmolLM2's Q4_1 pp512
/// 4% slower).
const GROUP_TOKENS: usize = 256;

#[repr(align(64))]
struct Packed([u8; CHUNK_BLOCKS * PANEL_BLOCK_BYTES]);

/// Packs blocks `b0 ..` of `rows` (`None`: a padding row of zeros) into `out`, as many as it
/// holds whole: the reference the SIMD packers are tested against.
#[cfg(test)]
pub fn pack_ref<W: Unpack>(rows: &PanelRows<'_>, b0: usize, out: &mut [u8]) {
    for (b, o) in out.chunks_exact_mut(PANEL_BLOCK_BYTES).enumerate() {
        let (scales, quants) = o.split_at_mut(PANEL_QUANTS);
        for (r, row) in rows.iter().enumerate() {
            let (d, m, q) = match row {
                Some(w) => unpack_at::<W>(w, b0 + b),
                None => (0.0, 0.0, [0; QK]),
            };
            for (k, v) in [d, m].into_iter().enumerate() {
                let at = (k * PANEL + r) * 4;
                scales[at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
            for (p, pair) in q.chunks_exact(2).enumerate() {
                let at = (p * PANEL + r) * 4;
                quants[at..at + 2].copy_from_slice(&(pair[0] as i16).to_le_bytes());
                quants[at + 2..at + 4].copy_from_slice(&(pair[1] as i16).to_le_bytes());
            }
        }
    }
}

/// `rows × n_tok` results of weight rows `row(r)` (`nb` blocks each) against Q16 activation
/// rows `x(t)`, by `kernels`; `put(r, t, run)` stores those of rows `r .. r + run.len()`.
pub fn matmul<'a>(
    kernels: &PanelDots,
    rows: usize,
    nb: usize,
    row: impl Fn(usize) -> &'a [u8],
    n_tok: usize,
    x: impl Fn(usize) -> &'a [u8],
    mut put: impl FnMut(usize, usize, &[f32]),
) {
    if n_tok == 0 {
        return;
    }
    let mut packed = Packed([0; CHUNK_BLOCKS * PANEL_BLOCK_BYTES]);
    let mut acc = [[[0f32; PANEL]; TILE]; GROUP_TOKENS / TILE];
    for r0 in (0..rows).step_by(PANEL) {
        let panel: PanelRows<'_> = core::array::from_fn(|i| (r0 + i < rows).then(|| row(r0 + i)));
        for t0 in (0..n_tok).step_by(GROUP_TOKENS) {
            let tiles = (n_tok - t0).min(GROUP_TOKENS).div_ceil(TILE);
            let acc = &mut acc[..tiles];
            acc.fill([[0.0; PANEL]; TILE]);
            for b0 in (0..nb).step_by(CHUNK_BLOCKS) {
                let chunk = &mut packed.0[..(nb - b0).min(CHUNK_BLOCKS) * PANEL_BLOCK_BYTES];
                (kernels.pack)(&panel, b0, chunk);
                for (i, a) in acc.iter_mut().enumerate() {
                    // Tokens past the end repeat the last one; their results are dropped.
                    let xs = core::array::from_fn(|j| {
                        let t = (t0 + i * TILE + j).min(n_tok - 1);
                        &x(t)[b0 * BlockQ16::BYTES..]
                    });
                    (kernels.dot)(chunk, xs, a);
                }
            }
            for (i, a) in acc.iter().enumerate() {
                for (j, a) in a.iter().enumerate() {
                    let t = t0 + i * TILE + j;
                    if t >= n_tok {
                        break;
                    }
                    put(r0, t, &a[..(rows - r0).min(PANEL)]);
                }
            }
        }
    }
}

/// `rows × n_tok` results as `matmul` gives them, without packing (few tokens: decoding one
/// sequence or a step of several): transposed tiles of `X8` tokens (`x8_tiles`), then a tile
/// of `TILE` (`super::tiles_of_four`), then one token alone; a last tile short of tokens is
/// padded with copies of the last one, whose results are dropped.
///
/// `transposed`, where the caller has them, holds the tokens' tiles already transposed for
/// these kernels (tile `i`: tokens `8i .. 8i + 8`, `nb` blocks), and nothing is transposed
/// here.
#[allow(clippy::too_many_arguments)]
pub fn matvec<'a>(
    kernels: &PanelDots,
    rows: usize,
    nb: usize,
    row: impl Fn(usize) -> &'a [u8],
    n_tok: usize,
    x: impl Fn(usize) -> &'a [u8],
    transposed: Option<&[u8]>,
    mut put: impl FnMut(usize, usize, &[f32]),
) {
    if n_tok == 0 {
        return;
    }
    let by_eight = (x8_tiles(n_tok) * X8).min(n_tok);
    let tile_bytes = nb * X8_BLOCK_BYTES;
    if let Some(tiles) = transposed.filter(|t| t.len() >= x8_tiles(n_tok) * tile_bytes) {
        for (i, tile) in tiles
            .chunks_exact(tile_bytes)
            .take(x8_tiles(n_tok))
            .enumerate()
        {
            let tokens = (n_tok - X8 * i).min(X8);
            rows_x8_transposed(kernels, rows, nb, &row, tile, tokens, |r, t, v| {
                put(r, X8 * i + t, v)
            });
        }
    } else if by_eight > 0 {
        let (row, x, put) = (&row, &x, &mut put);
        match nb {
            0..=16 => tiles_x8::<16>(kernels, rows, nb, row, by_eight, x, put),
            17..=32 => tiles_x8::<32>(kernels, rows, nb, row, by_eight, x, put),
            _ => tiles_x8::<X8_CHUNK_BLOCKS>(kernels, rows, nb, row, by_eight, x, put),
        }
    }
    if by_eight == n_tok {
        return;
    }
    let fours = by_eight + super::tiles_of_four(n_tok - by_eight) * TILE;
    // Tokens past the end repeat the last one; their results are dropped.
    let x = |t: usize| x(t.min(n_tok - 1));
    for r0 in (0..rows).step_by(PANEL) {
        // Rows past the end repeat the last one; their results are dropped.
        let panel = core::array::from_fn(|i| row((r0 + i).min(rows - 1)));
        let run = (rows - r0).min(PANEL);
        for t0 in (by_eight..fours).step_by(TILE) {
            let out = (kernels.rows_x4)(panel, core::array::from_fn(|i| x(t0 + i)));
            for (i, out) in out.iter().enumerate().take(n_tok - t0) {
                put(r0, t0 + i, &out[..run]);
            }
        }
        for t in fours..n_tok {
            let out = (kernels.rows)(panel, x(t));
            put(r0, t, &out[..run]);
        }
    }
}

/// Tokens `0 .. n_tok` in transposed tiles, `BLOCKS` blocks at a time; a last tile short of
/// tokens is padded with copies of the last one.
fn tiles_x8<'a, const BLOCKS: usize>(
    kernels: &PanelDots,
    rows: usize,
    nb: usize,
    row: &impl Fn(usize) -> &'a [u8],
    n_tok: usize,
    x: &impl Fn(usize) -> &'a [u8],
    put: &mut impl FnMut(usize, usize, &[f32]),
) {
    let mut transposed = Transposed([[0; X8_BLOCK_BYTES]; BLOCKS]);
    for t0 in (0..n_tok).step_by(X8) {
        let xs = core::array::from_fn(|i| x((t0 + i).min(n_tok - 1)));
        let tokens = (n_tok - t0).min(X8);
        let transposed = transposed.0.as_flattened_mut();
        rows_x8(kernels, rows, nb, row, xs, tokens, transposed, |r, t, v| {
            put(r, t0 + t, v)
        });
    }
}

/// Every weight row against one transposed tile of `X8` activation rows `xs` (`nb` blocks),
/// through `transposed` (whole transposed blocks); the results of the first `tokens` go to
/// `put`.
#[allow(clippy::too_many_arguments)]
fn rows_x8<'a>(
    kernels: &PanelDots,
    rows: usize,
    nb: usize,
    row: &impl Fn(usize) -> &'a [u8],
    xs: [&[u8]; X8],
    tokens: usize,
    transposed: &mut [u8],
    mut put: impl FnMut(usize, usize, &[f32]),
) {
    let chunk_blocks = transposed.len() / X8_BLOCK_BYTES;
    if nb <= chunk_blocks {
        let tile = &mut transposed[..nb * X8_BLOCK_BYTES];
        (kernels.transpose_x8)(xs, 0, tile);
        return rows_x8_transposed(kernels, rows, nb, row, tile, tokens, put);
    }
    for g0 in (0..rows).step_by(X8_GROUP_ROWS) {
        let group = (rows - g0).min(X8_GROUP_ROWS);
        let mut acc = [[[0f32; X8]; X8_ROWS]; X8_GROUP_ROWS / X8_ROWS];
        let row_tiles = group.div_ceil(X8_ROWS);
        for b0 in (0..nb).step_by(chunk_blocks) {
            let chunk = &mut transposed[..(nb - b0).min(chunk_blocks) * X8_BLOCK_BYTES];
            (kernels.transpose_x8)(xs, b0, chunk);
            for (q, acc) in acc[..row_tiles].iter_mut().enumerate() {
                // Rows past the end repeat the last one; their results are dropped.
                let w = core::array::from_fn(|i| row((g0 + X8_ROWS * q + i).min(rows - 1)));
                (kernels.rows_x8)(w, b0, chunk, acc);
            }
        }
        put_group(g0, group, &acc, tokens, &mut put);
    }
}

/// Hands on the results of a group of rows from `g0` (`group` of them) for the tile's first
/// `tokens`: one run of the rows per token, a call per token, not per result.
fn put_group(
    g0: usize,
    group: usize,
    acc: &[[[f32; X8]; X8_ROWS]; X8_GROUP_ROWS / X8_ROWS],
    tokens: usize,
    put: &mut impl FnMut(usize, usize, &[f32]),
) {
    let acc = acc.as_flattened();
    let mut run = [0f32; X8_GROUP_ROWS];
    for t in 0..tokens {
        for (o, acc) in run.iter_mut().zip(&acc[..group]) {
            *o = acc[t];
        }
        put(g0, t, &run[..group]);
    }
}

/// Every weight row against one whole transposed tile (`nb` blocks); the results of its first
/// `tokens` go to `put`.
fn rows_x8_transposed<'a>(
    kernels: &PanelDots,
    rows: usize,
    nb: usize,
    row: &impl Fn(usize) -> &'a [u8],
    tile: &[u8],
    tokens: usize,
    mut put: impl FnMut(usize, usize, &[f32]),
) {
    let tile = &tile[..nb * X8_BLOCK_BYTES];
    for g0 in (0..rows).step_by(X8_GROUP_ROWS) {
        let group = (rows - g0).min(X8_GROUP_ROWS);
        let mut acc = [[[0f32; X8]; X8_ROWS]; X8_GROUP_ROWS / X8_ROWS];
        for (q, acc) in acc[..group.div_ceil(X8_ROWS)].iter_mut().enumerate() {
            // Rows past the end repeat the last one; their results are dropped.
            let w = core::array::from_fn(|i| row((g0 + X8_ROWS * q + i).min(rows - 1)));
            (kernels.rows_x8)(w, 0, tile, acc);
        }
        put_group(g0, group, &acc, tokens, &mut put);
    }
}
