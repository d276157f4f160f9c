//! Panel packing and the panel kernels (see `kernels::panel`): the many-token mat-mul, and the
//! decoding twin that gives the same bits on unpacked rows.
use super::*;
use core::mem::MaybeUninit;

/// Packs blocks `b0 ..` of `PANEL` weight rows (see `super::panel`).
pub(super) fn pack<W: Unpack>(rows: &PanelRows<'_>, b0: usize, out: &mut [u8]) {
    let nb = out.len() / PANEL_BLOCK_BYTES;
    let nb = rows
        .iter()
        .flatten()
        .fold(nb, |n, w| n.min(blocks::<W>(w.len()).saturating_sub(b0)));
    // SAFETY: CPU features as above; blocks `b0 .. b0 + nb` lie inside every row, and `nb`
    // packed blocks inside `out`.
    unsafe { pack_avx2::<W>(nb, rows, b0, out) }
}

/// # Safety
/// The CPU has AVX2, FMA and F16C; blocks `b0 .. b0 + nb` lie inside every row of `rows` that
/// is `Some`, and `nb` packed blocks (`PANEL_BLOCK_BYTES` each) inside `out`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pack_avx2<W: Unpack>(
    nb: usize,
    rows: &PanelRows<'_>,
    b0: usize,
    out: &mut [u8],
) {
    for b in 0..nb {
        // SAFETY: as the caller guarantees: block `b0 + b` inside every row, packed block `b`
        // inside `out`.
        unsafe {
            let o = out.as_mut_ptr().add(b * PANEL_BLOCK_BYTES);
            let q = o.add(PANEL_QUANTS) as *mut __m256i;
            let mut dm = [0f32; PANEL_QUANTS / 4];
            // Eight rows at a time: lo[i] holds row i's pairs 0..8 (one per 32-bit lane), hi[i]
            // pairs 8..16; transposed, each vector holds one pair of the eight rows, the half
            // of a packed pair that belongs to them.
            for h in 0..PANEL / 8 {
                let mut lo = [_mm256_setzero_si256(); 8];
                let mut hi = [_mm256_setzero_si256(); 8];
                for i in 0..8 {
                    let r = 8 * h + i;
                    if let Some(w) = rows[r] {
                        let p = block_at::<W>(w.as_ptr(), b0 + b);
                        // The next panel's rows: packing reads sixteen streams at a time, more
                        // than the hardware prefetcher follows.
                        let ahead = PANEL * w.len();
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead) as *const i8);
                        (lo[i], hi[i]) = W::unpack(p);
                        let (d, m) = W::scales(p);
                        (dm[r], dm[PANEL + r]) = (_mm256_cvtss_f32(d), _mm256_cvtss_f32(m));
                    }
                }
                let (lo, hi) = (transpose8(lo), transpose8(hi));
                for p in 0..8 {
                    _mm256_storeu_si256(q.add(p * PANEL / 8 + h), lo[p]);
                    _mm256_storeu_si256(q.add((p + 8) * PANEL / 8 + h), hi[p]);
                }
            }
            core::ptr::copy_nonoverlapping(dm.as_ptr() as *const u8, o, PANEL_QUANTS);
        }
    }
}

/// Transposes eight vectors of eight 32-bit lanes.
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX2).
#[inline(always)]
pub(super) unsafe fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
    // SAFETY: register-only; the caller has AVX2.
    unsafe {
        // Pairs of rows interleaved, then fours: u[i] holds columns i and i + 4 of four rows.
        let t: [__m256i; 8] = [
            _mm256_unpacklo_epi32(r[0], r[1]),
            _mm256_unpackhi_epi32(r[0], r[1]),
            _mm256_unpacklo_epi32(r[2], r[3]),
            _mm256_unpackhi_epi32(r[2], r[3]),
            _mm256_unpacklo_epi32(r[4], r[5]),
            _mm256_unpackhi_epi32(r[4], r[5]),
            _mm256_unpacklo_epi32(r[6], r[7]),
            _mm256_unpackhi_epi32(r[6], r[7]),
        ];
        let u: [__m256i; 8] = [
            _mm256_unpacklo_epi64(t[0], t[2]),
            _mm256_unpackhi_epi64(t[0], t[2]),
            _mm256_unpacklo_epi64(t[1], t[3]),
            _mm256_unpackhi_epi64(t[1], t[3]),
            _mm256_unpacklo_epi64(t[4], t[6]),
            _mm256_unpackhi_epi64(t[4], t[6]),
            _mm256_unpacklo_epi64(t[5], t[7]),
            _mm256_unpackhi_epi64(t[5], t[7]),
        ];
        [
            _mm256_permute2x128_si256(u[0], u[4], 0x20),
            _mm256_permute2x128_si256(u[1], u[5], 0x20),
            _mm256_permute2x128_si256(u[2], u[6], 0x20),
            _mm256_permute2x128_si256(u[3], u[7], 0x20),
            _mm256_permute2x128_si256(u[0], u[4], 0x31),
            _mm256_permute2x128_si256(u[1], u[5], 0x31),
            _mm256_permute2x128_si256(u[2], u[6], 0x31),
            _mm256_permute2x128_si256(u[3], u[7], 0x31),
        ]
    }
}

/// `acc` plus one block's result in each lane: its integer sum `isum` scaled by the weights'
/// scales times the activations' (`dw·dx`), then, for formats with a minimum, the weights'
/// minimums times the activations' sum `s`. Every kernel of this file scales a block so, which
/// is what makes their results the same bits.
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX2, FMA).
#[inline(always)]
unsafe fn add_block<W: Unpack>(
    acc: __m256,
    isum: __m256i,
    (dw, mw): (__m256, __m256),
    dx: __m256,
    s: __m256,
) -> __m256 {
    // SAFETY: register-only; the caller has AVX2 and FMA.
    unsafe {
        let acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, dx), acc);
        if W::HAS_MIN {
            _mm256_fmadd_ps(mw, s, acc)
        } else {
            acc
        }
    }
}

/// The whole blocks that every weight row of `w` and every Q16 activation row of `xs` hold.
fn whole_blocks<W: Unpack>(w: &[&[u8]; PANEL], xs: &[&[u8]]) -> usize {
    let nb = xs
        .iter()
        .fold(usize::MAX, |n, x| n.min(x.len() / BlockQ16::BYTES));
    w.iter().fold(nb, |n, w| n.min(blocks::<W>(w.len())))
}

/// The blocks from `b0` on that every weight row of `w` holds and the transposed tile `xt` has.
pub(super) fn x8_row_blocks<W: Unpack>(w: &[&[u8]; X8_ROWS], b0: usize, xt: &[u8]) -> usize {
    w.iter().fold(xt.len() / X8_BLOCK_BYTES, |n, w| {
        n.min(blocks::<W>(w.len()).saturating_sub(b0))
    })
}

/// `PANEL` weight rows against `T` rows of Q16 activations, unpacked, with the panel kernel's
/// arithmetic: one token when decoding, a tile of tokens for batches too small to repay packing.
/// On 256-bit vectors (the AVX-512 table has `rows_one_avx512` and `rows_x4_avx512`).
pub(super) fn panel_rows<W: Unpack, const ISA: u8, const T: usize>(
    w: [&[u8]; PANEL],
    xs: [&[u8]; T],
) -> [[f32; PANEL]; T] {
    let nb = whole_blocks::<W>(&w, &xs);
    let mut out = [[0f32; PANEL]; T];
    // SAFETY: as for `dot`; `nb` whole blocks lie inside every slice.
    unsafe {
        match ISA {
            AVX_VNNI => rows_vnni::<W, T>(nb, w, xs, &mut out),
            _ => rows_avx2::<W, T>(nb, w, xs, &mut out),
        }
    }
    out
}

/// A packed panel against `TILE` rows of Q16 activations.
pub(super) fn panel<W: Unpack, const ISA: u8>(
    packed: &[u8],
    xs: [&[u8]; TILE],
    acc: &mut PanelAcc,
) {
    let nb = packed.len() / PANEL_BLOCK_BYTES;
    let nb = xs.iter().fold(nb, |n, x| n.min(x.len() / BlockQ16::BYTES));
    // SAFETY: as for `dot`; `nb` whole blocks lie inside `packed` and every `xs[t]`.
    unsafe {
        match ISA {
            AVX512_VNNI => panel_avx512::<W>(nb, packed, xs, acc),
            AVX_VNNI => {
                for h in 0..PANEL / 8 {
                    panel_vnni::<W>(nb, packed, xs, acc, h);
                }
            }
            _ => panel_avx2::<W>(nb, packed, xs, acc),
        }
    }
}

/// Block `b` of the packed panel and of each token's activations.
///
/// # Safety
/// Block `b` lies inside `packed` and inside every `xs[t]`.
#[inline(always)]
unsafe fn panel_block_at(
    packed: &[u8],
    xs: [&[u8]; TILE],
    b: usize,
) -> (*const u8, [*const u8; TILE]) {
    // SAFETY: as the caller guarantees.
    let pb = unsafe { packed.as_ptr().add(b * PANEL_BLOCK_BYTES) };
    // SAFETY: as the caller guarantees.
    let xp = core::array::from_fn(|t| unsafe { xs[t].as_ptr().add(b * BlockQ16::BYTES) });
    (pb, xp)
}

/// The AVX-VNNI panel kernel (see `super::panel`) on rows `8h .. 8h + 8` of the panel: per
/// block, one integer sum per (row, token) in a lane of `isum[t]`, then `acc += Σ·(dw·dx)` and
/// `m·s` for the eight rows at once.
///
/// # Safety
/// The CPU has AVX2, FMA and AVX-VNNI; `h < PANEL / 8`; `nb` whole packed blocks lie inside
/// `packed` and `nb` Q16 blocks inside every `xs[t]`.
#[inline(always)]
pub(super) unsafe fn panel_half<W: Unpack>(
    nb: usize,
    packed: &[u8],
    xs: [&[u8]; TILE],
    acc: &mut PanelAcc,
    h: usize,
) {
    // SAFETY: the caller guarantees `nb` whole blocks in `packed` and every `xs[t]`, h < 2,
    // AVX2, FMA and AVX-VNNI.
    unsafe {
        let mut facc = [_mm256_setzero_ps(); TILE];
        for t in 0..TILE {
            facc[t] = _mm256_loadu_ps(acc[t].as_ptr().add(8 * h));
        }
        for b in 0..nb {
            let (pb, xp) = panel_block_at(packed, xs, b);
            // Two sums per token, one per half of the block (pairs 0..8 and 8..16) and taken in
            // turn, so that enough `vpdpwssd`s are in flight to cover its latency; integer
            // addition is exact, so the split changes no result.
            let mut split = [[_mm256_setzero_si256(); TILE]; 2];
            for p0 in 0..QK / 4 {
                for (s, sums) in split.iter_mut().enumerate() {
                    let p = p0 + s * QK / 4;
                    let wp = pb.add(PANEL_QUANTS + p * PANEL * 4 + h * 32);
                    let wv = _mm256_loadu_si256(wp as *const __m256i);
                    for t in 0..TILE {
                        let pair = (xp[t].add(8 + 4 * p) as *const i32).read_unaligned();
                        sums[t] = dpwssd_vex(sums[t], wv, _mm256_set1_epi32(pair));
                    }
                }
            }
            let dw = _mm256_loadu_ps(pb.add(h * 32) as *const f32);
            for t in 0..TILE {
                let isum = _mm256_add_epi32(split[0][t], split[1][t]);
                let dx = _mm256_set1_ps((xp[t] as *const f32).read_unaligned());
                let scale = _mm256_mul_ps(dw, dx);
                facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, facc[t]);
            }
            if W::HAS_MIN {
                let mw = _mm256_loadu_ps(pb.add(PANEL * 4 + h * 32) as *const f32);
                for t in 0..TILE {
                    let s = _mm256_set1_ps((xp[t].add(4) as *const f32).read_unaligned());
                    facc[t] = _mm256_fmadd_ps(mw, s, facc[t]);
                }
            }
        }
        for t in 0..TILE {
            _mm256_storeu_ps(acc[t].as_mut_ptr().add(8 * h), facc[t]);
        }
    }
}

/// `panel_rows` for `T` tokens: each row's block sum as the one-row kernels start it (eight
/// lanes of partial sums), then eight rows' lanes added across into one vector of eight block
/// sums, so that the block's scaling is the panel kernel's, lane for lane, in the same order. A
/// row's block is unpacked once for all `T` tokens.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and the features of `ISA`; `nb` whole blocks of format `W` lie
/// inside every `w[r]` and `nb` Q16 blocks inside every `xs[t]`.
#[inline(always)]
pub(super) unsafe fn rows_tile<W: Unpack, const ISA: u8, const T: usize>(
    nb: usize,
    w: [&[u8]; PANEL],
    xs: [&[u8]; T],
    out: &mut [[f32; PANEL]; T],
) {
    if T == 1 {
        let out = out.as_flattened_mut().as_chunks_mut::<PANEL>().0;
        // SAFETY: as the caller guarantees.
        return unsafe { rows_one::<W, ISA>(nb, w, xs[0], &mut out[0]) };
    }
    // SAFETY: the caller guarantees `nb` whole blocks in every slice, AVX2/FMA/F16C, and the
    // features of `ISA`.
    unsafe {
        let mut facc = [[_mm256_setzero_ps(); PANEL / 8]; T];
        // The prefetches' distance: the same block of the next panel's row (the panel's rows are
        // usually one run of memory, which a fixed distance would land inside).
        let next_panel: [usize; PANEL] = core::array::from_fn(|r| PANEL * w[r].len());
        for b in 0..nb {
            let mut x0 = [_mm256_setzero_si256(); T];
            let mut x1 = [_mm256_setzero_si256(); T];
            let mut dx = [_mm256_setzero_ps(); T];
            let mut s = [_mm256_setzero_ps(); T];
            for t in 0..T {
                let xp = xs[t].as_ptr().add(b * BlockQ16::BYTES);
                x0[t] = _mm256_loadu_si256(xp.add(8) as *const __m256i);
                x1[t] = _mm256_loadu_si256(xp.add(40) as *const __m256i);
                dx[t] = _mm256_set1_ps((xp as *const f32).read_unaligned());
                s[t] = _mm256_set1_ps((xp.add(4) as *const f32).read_unaligned());
            }
            for h in 0..PANEL / 8 {
                let wp: [*const u8; 8] =
                    core::array::from_fn(|r| block_at::<W>(w[8 * h + r].as_ptr(), b));
                let mut v = [[_mm256_setzero_si256(); 8]; T];
                for r in 0..8 {
                    let ahead = next_panel[8 * h + r];
                    _mm_prefetch::<_MM_HINT_T0>(wp[r].wrapping_add(ahead) as *const i8);
                    let (lo, hi) = W::unpack(wp[r]);
                    for t in 0..T {
                        v[t][r] = block_dot::<ISA>(lo, hi, x0[t], x1[t]);
                    }
                }
                let (dw, mw) = W::scales8(wp);
                for t in 0..T {
                    let isum = sum_across8(v[t]);
                    facc[t][h] = add_block::<W>(facc[t][h], isum, (dw, mw), dx[t], s[t]);
                }
            }
        }
        for t in 0..T {
            for (h, acc) in facc[t].iter().enumerate() {
                _mm256_storeu_ps(out[t].as_mut_ptr().add(8 * h), *acc);
            }
        }
    }
}

/// Blocks of each row that `rows_one` reads in one run before it scales their sums.
const RUN_BLOCKS: usize = 64;

/// The rows' integer block sums of one run: `[row][group of eight blocks]`, a block per lane.
/// Left uninitialized: a run writes the groups it reads, and zeroing all 4 KiB for each call
/// (sixteen rows of SmolLM2's 18 blocks use three groups of eight) took 3% of its decoding.
type RunSums = [[MaybeUninit<__m256i>; RUN_BLOCKS / 8]; PANEL];

/// `rows_tile` for one token, reading each row's run of blocks in one pass, one row after
/// another: one sequential stream, where the rows side by side are sixteen (an AMD AVX-512 host
/// decoded at three quarters of llama.cpp's rate that way). Each block also asks for the same
/// block of the next panel's row into L2: on an Intel host whose memory answers slowly, the
/// hardware prefetcher alone left one token's decode at half the memory's rate. The integer
/// block sums wait in `RunSums`, then an 8 × 8 transpose puts each block's rows side by side
/// for the same scaling, lane for lane, in the same order: the same bits.
///
/// # Safety
/// As for `rows_tile`, with `T` = 1.
#[inline(always)]
unsafe fn rows_one<W: Unpack, const ISA: u8>(
    nb: usize,
    w: [&[u8]; PANEL],
    x: &[u8],
    out: &mut [f32; PANEL],
) {
    // SAFETY: the caller guarantees `nb` whole blocks in every slice, AVX2/FMA/F16C, and the
    // features of `ISA`.
    unsafe {
        let mut facc = [_mm256_setzero_ps(); PANEL / 8];
        let mut sums: RunSums = [[MaybeUninit::uninit(); RUN_BLOCKS / 8]; PANEL];
        for c0 in (0..nb).step_by(RUN_BLOCKS) {
            let run = (nb - c0).min(RUN_BLOCKS);
            for (r, row_sums) in sums.iter_mut().enumerate() {
                let row = w[r].as_ptr();
                for (g, group) in row_sums[..run.div_ceil(8)].iter_mut().enumerate() {
                    let mut v = [_mm256_setzero_si256(); 8];
                    for (j, v) in v.iter_mut().enumerate().take(run - 8 * g) {
                        let b = c0 + 8 * g + j;
                        let xp = x.as_ptr().add(b * BlockQ16::BYTES);
                        let x0 = _mm256_loadu_si256(xp.add(8) as *const __m256i);
                        let x1 = _mm256_loadu_si256(xp.add(40) as *const __m256i);
                        let wp = block_at::<W>(row, b);
                        let ahead = PANEL * w[r].len();
                        _mm_prefetch::<_MM_HINT_T1>(wp.wrapping_add(ahead) as *const i8);
                        let (lo, hi) = W::unpack(wp);
                        *v = block_dot::<ISA>(lo, hi, x0, x1);
                    }
                    group.write(sum_across8(v));
                }
            }
            for g in 0..run.div_ceil(8) {
                // `by_block[j][h]`: block `8g + j` of rows `8h .. 8h + 8`, a row per lane.
                let mut by_block = [[_mm256_setzero_si256(); PANEL / 8]; 8];
                for (h, eight) in sums.chunks_exact(8).enumerate() {
                    let mut rows = [_mm256_setzero_si256(); 8];
                    for (v, row_sums) in rows.iter_mut().zip(eight) {
                        // SAFETY: this run wrote groups `..run.div_ceil(8)` of every row.
                        *v = row_sums[g].assume_init();
                    }
                    for (block, v) in by_block.iter_mut().zip(transpose8(rows)) {
                        block[h] = v;
                    }
                }
                for (j, block) in by_block.iter().enumerate().take(run - 8 * g) {
                    let b = c0 + 8 * g + j;
                    let xp = x.as_ptr().add(b * BlockQ16::BYTES);
                    let dx = _mm256_set1_ps((xp as *const f32).read_unaligned());
                    let s = _mm256_set1_ps((xp.add(4) as *const f32).read_unaligned());
                    for ((h, acc), isum) in facc.iter_mut().enumerate().zip(block) {
                        let wp: [*const u8; 8] =
                            core::array::from_fn(|r| block_at::<W>(w[8 * h + r].as_ptr(), b));
                        *acc = add_block::<W>(*acc, *isum, W::scales8(wp), dx, s);
                    }
                }
            }
        }
        for (h, acc) in facc.iter().enumerate() {
            _mm256_storeu_ps(out.as_mut_ptr().add(8 * h), *acc);
        }
    }
}

/// `panel_rows` for a tile of four tokens on 512-bit vectors (the AVX-512 table's `rows_x4`).
pub(super) fn rows_x4_avx512<W: Unpack>(w: [&[u8]; PANEL], xs: [&[u8]; TILE]) -> PanelAcc {
    let nb = whole_blocks::<W>(&w, &xs);
    let mut out = [[0f32; PANEL]; TILE];
    // SAFETY: the table holding this entry is handed out only where the CPU has AVX-512
    // F/BW/VL and AVX512-VNNI besides AVX2/FMA/F16C; `nb` whole blocks lie inside every slice.
    unsafe { rows_x4_zmm::<W>(nb, w, xs, &mut out) };
    out
}

/// Rows whose block sums one vector of `rows_x4_zmm` holds, for each of the four tokens.
const ROWS_PER_LANE: usize = 4;

/// `rows_tile` for four tokens, with a `vpdpwssd` on 512-bit vectors for every (row, token,
/// block) instead of two 256-bit ones and an eighth of a sum across: a vector holds the four
/// tokens side by side, a 128-bit lane each, and in a lane four of the block's sixteen pairs.
/// Per block, the tokens' quants are transposed by lanes (lane `t` of `x[k]`: token `t`'s
/// pairs `4k .. 4k + 4`, once for all sixteen rows); each row's block is widened once and its
/// pairs `4k .. 4k + 4` broadcast into every lane, so four products give each (row, token) four
/// partial sums, and four rows' unpacks add them into one vector of block sums, lane `4t + r`
/// for token `t` and row `r`. Then `add_block`'s scaling per lane, in the same order: the bits
/// `rows_one` gives each token.
///
/// # Safety
/// The CPU has the features enabled here; `nb` whole blocks of format `W` lie inside every
/// `w[r]` and `nb` Q16 blocks inside every `xs[t]`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_x4_zmm<W: Unpack>(
    nb: usize,
    w: [&[u8]; PANEL],
    xs: [&[u8]; TILE],
    out: &mut PanelAcc,
) {
    const GROUPS: usize = PANEL / ROWS_PER_LANE;
    // SAFETY: the caller guarantees `nb` whole blocks in every slice and the features.
    unsafe {
        let mut facc = [_mm512_setzero_ps(); GROUPS];
        let by_token = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
        // The prefetches' distance, as in `rows_tile`.
        let next_panel: [usize; PANEL] = core::array::from_fn(|r| PANEL * w[r].len());
        let mut widened = WidenedRows([[0; QK / 2]; ROWS_PER_LANE]);
        for b in 0..nb {
            let xp: [*const u8; TILE] =
                core::array::from_fn(|t| xs[t].as_ptr().add(b * BlockQ16::BYTES));
            let x = transpose_lanes(xp.map(|p| _mm512_loadu_si512(p.add(8) as *const __m512i)));
            let token_scalars = |offset: usize| {
                let v: [f32; TILE] =
                    core::array::from_fn(|t| (xp[t].add(offset) as *const f32).read_unaligned());
                _mm512_permutexvar_ps(by_token, _mm512_castps128_ps512(_mm_loadu_ps(v.as_ptr())))
            };
            let dx = token_scalars(0);
            let s = if W::HAS_MIN {
                token_scalars(4)
            } else {
                _mm512_setzero_ps()
            };
            for h in 0..PANEL / 8 {
                let wp: [*const u8; 8] =
                    core::array::from_fn(|r| block_at::<W>(w[8 * h + r].as_ptr(), b));
                let (dw8, mw8) = W::scales8(wp);
                for e in 0..2 {
                    let mut sums = [_mm512_setzero_si512(); ROWS_PER_LANE];
                    for (i, sum) in sums.iter_mut().enumerate() {
                        let r = ROWS_PER_LANE * e + i;
                        let ahead = next_panel[8 * h + r];
                        _mm_prefetch::<_MM_HINT_T0>(wp[r].wrapping_add(ahead) as *const i8);
                        let (lo, hi) = W::unpack(wp[r]);
                        let q = widened.0[i].as_mut_ptr() as *mut __m256i;
                        _mm256_store_si256(q, lo);
                        _mm256_store_si256(q.add(1), hi);
                        let q = q as *const __m128i;
                        for (k, xk) in x.iter().enumerate() {
                            let pairs = _mm512_broadcast_i32x4(_mm_load_si128(q.add(k)));
                            *sum = dpwssd_zmm(*sum, pairs, *xk);
                        }
                    }
                    let isum = sum_lane_quarters(sums);
                    let (dw, mw) = if e == 0 {
                        (_mm256_castps256_ps128(dw8), _mm256_castps256_ps128(mw8))
                    } else {
                        (
                            _mm256_extractf128_ps::<1>(dw8),
                            _mm256_extractf128_ps::<1>(mw8),
                        )
                    };
                    let g = 2 * h + e;
                    let scale = _mm512_mul_ps(_mm512_broadcast_f32x4(dw), dx);
                    facc[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, facc[g]);
                    if W::HAS_MIN {
                        facc[g] = _mm512_fmadd_ps(_mm512_broadcast_f32x4(mw), s, facc[g]);
                    }
                }
            }
        }
        for (g, acc) in facc.iter().enumerate() {
            let mut lanes = [0f32; 16];
            _mm512_storeu_ps(lanes.as_mut_ptr(), *acc);
            for (t, out) in out.iter_mut().enumerate() {
                let at = ROWS_PER_LANE * g;
                out[at..at + ROWS_PER_LANE].copy_from_slice(&lanes[ROWS_PER_LANE * t..][..4]);
            }
        }
    }
}

/// `panel_rows` for one token on 512-bit vectors (the AVX-512 table's `rows`).
pub(super) fn rows_one_avx512<W: Unpack>(w: [&[u8]; PANEL], x: &[u8]) -> [f32; PANEL] {
    let nb = whole_blocks::<W>(&w, &[x]);
    let mut out = [0f32; PANEL];
    // SAFETY: as for `rows_x4_avx512`.
    unsafe { rows_one_zmm::<W>(nb, w, x, &mut out) };
    out
}

/// A row's block sums of one run of `rows_one_zmm`: `[row][group of sixteen blocks]`, a block
/// per lane; uninitialized, as `RunSums`.
type RunSumsZmm = [[MaybeUninit<__m512i>; RUN_BLOCKS / 16]; PANEL];

/// `rows_one` on 512-bit vectors: each (row, block) is one `vpdpwssd` of the whole block (32
/// quants) instead of two 256-bit products, and sixteen blocks' vectors are added across into
/// one vector of their sums; after the run a 16 × 16 transpose puts each block's sixteen rows
/// side by side for `add_block`'s scaling per lane, in the same order: the same bits.
///
/// # Safety
/// As for `rows_x4_zmm`, with one Q16 row `x`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_one_zmm<W: Unpack>(nb: usize, w: [&[u8]; PANEL], x: &[u8], out: &mut [f32; PANEL]) {
    // SAFETY: the caller guarantees `nb` whole blocks in every slice and the features.
    unsafe {
        let mut facc = _mm512_setzero_ps();
        let mut sums: RunSumsZmm = [[MaybeUninit::uninit(); RUN_BLOCKS / 16]; PANEL];
        for c0 in (0..nb).step_by(RUN_BLOCKS) {
            let run = (nb - c0).min(RUN_BLOCKS);
            for (r, row_sums) in sums.iter_mut().enumerate() {
                let row = w[r].as_ptr();
                let ahead = PANEL * w[r].len();
                // The block's 32 products in one vector's pairs.
                let block_products = |b: usize| {
                    let xq = x.as_ptr().add(b * BlockQ16::BYTES + 8) as *const __m512i;
                    let wp = block_at::<W>(row, b);
                    _mm_prefetch::<_MM_HINT_T1>(wp.wrapping_add(ahead) as *const i8);
                    let (lo, hi) = W::unpack(wp);
                    let quants = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                    dpwssd_zmm(_mm512_setzero_si512(), quants, _mm512_loadu_si512(xq))
                };
                for (g, group) in row_sums[..run.div_ceil(16)].iter_mut().enumerate() {
                    let (first, left) = (c0 + 16 * g, run - 16 * g);
                    if left >= 16 {
                        let mut v = [_mm512_setzero_si512(); 16];
                        for (j, v) in v.iter_mut().enumerate() {
                            *v = block_products(first + j);
                        }
                        group.write(sum_across16(v));
                        continue;
                    }
                    // A short last group: its blocks four at a time, each four's sums into
                    // their 128-bit lane (a whole group's sum across for two blocks would cost
                    // as much as for sixteen).
                    let mut short = _mm512_setzero_si512();
                    for f in 0..left.div_ceil(4) {
                        let mut v = [_mm512_setzero_si512(); 4];
                        for (j, v) in v.iter_mut().enumerate() {
                            if 4 * f + j < left {
                                *v = block_products(first + 4 * f + j);
                            }
                        }
                        let lane = 0xF << (4 * f);
                        short = _mm512_mask_broadcast_i32x4(short, lane, sum_across4(v));
                    }
                    group.write(short);
                }
            }
            for g in 0..run.div_ceil(16) {
                let mut group = [_mm512_setzero_si512(); PANEL];
                for (v, row_sums) in group.iter_mut().zip(&sums) {
                    // SAFETY: this run wrote groups `..run.div_ceil(16)` of every row.
                    *v = row_sums[g].assume_init();
                }
                let by_block = transpose16(group);
                for (j, isum) in by_block.iter().enumerate().take(run - 16 * g) {
                    let b = c0 + 16 * g + j;
                    let xp = x.as_ptr().add(b * BlockQ16::BYTES);
                    let dx = _mm512_set1_ps((xp as *const f32).read_unaligned());
                    let mut wp = [core::ptr::null(); PANEL];
                    for (wp, row) in wp.iter_mut().zip(w) {
                        *wp = block_at::<W>(row.as_ptr(), b);
                    }
                    let (halves, _) = wp.as_chunks::<8>();
                    let (dw_lo, mw_lo) = W::scales8(halves[0]);
                    let (dw_hi, mw_hi) = W::scales8(halves[1]);
                    let scale = _mm512_mul_ps(join_halves(dw_lo, dw_hi), dx);
                    facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(*isum), scale, facc);
                    if W::HAS_MIN {
                        let s = _mm512_set1_ps((xp.add(4) as *const f32).read_unaligned());
                        facc = _mm512_fmadd_ps(join_halves(mw_lo, mw_hi), s, facc);
                    }
                }
            }
        }
        _mm512_storeu_ps(out.as_mut_ptr(), facc);
    }
}

/// `lo` in the low eight lanes, `hi` in the high eight.
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX512F).
#[inline(always)]
unsafe fn join_halves(lo: __m256, hi: __m256) -> __m512 {
    // SAFETY: register-only; the caller has AVX512F.
    unsafe {
        let lo = _mm512_castps_pd(_mm512_castps256_ps512(lo));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(lo, _mm256_castps_pd(hi)))
    }
}

/// Lane `j` of the result: the sum of `v[j]`'s sixteen lanes (exact integer sums).
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX512F).
#[inline(always)]
unsafe fn sum_across16(v: [__m512i; 16]) -> __m512i {
    // SAFETY: register-only; the caller has AVX512F.
    unsafe {
        // Per 128-bit lane, four vectors' partial sums side by side, then the lanes added.
        let mut q = [_mm512_setzero_si512(); 4];
        for (i, q) in q.iter_mut().enumerate() {
            *q = sum_lane_quarters([v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]]);
        }
        let q01 = _mm512_add_epi32(
            _mm512_shuffle_i32x4::<0x88>(q[0], q[1]),
            _mm512_shuffle_i32x4::<0xDD>(q[0], q[1]),
        );
        let q23 = _mm512_add_epi32(
            _mm512_shuffle_i32x4::<0x88>(q[2], q[3]),
            _mm512_shuffle_i32x4::<0xDD>(q[2], q[3]),
        );
        _mm512_add_epi32(
            _mm512_shuffle_i32x4::<0x88>(q01, q23),
            _mm512_shuffle_i32x4::<0xDD>(q01, q23),
        )
    }
}

/// Lane `j` of the result: the sum of `v[j]`'s sixteen lanes (exact integer sums).
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX512F).
#[inline(always)]
unsafe fn sum_across4(v: [__m512i; 4]) -> __m128i {
    // SAFETY: register-only; the caller has AVX512F.
    unsafe {
        let q = sum_lane_quarters(v);
        let half = _mm256_add_epi32(_mm512_castsi512_si256(q), _mm512_extracti64x4_epi64::<1>(q));
        _mm_add_epi32(
            _mm256_castsi256_si128(half),
            _mm256_extracti128_si256::<1>(half),
        )
    }
}

/// Lane `r` of result `j` is lane `j` of `m[r]`: a 16 × 16 transpose of 32-bit lanes.
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX512F).
#[inline(always)]
unsafe fn transpose16(m: [__m512i; 16]) -> [__m512i; 16] {
    // SAFETY: register-only; the caller has AVX512F.
    unsafe {
        let mut t = [_mm512_setzero_si512(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_epi32(m[2 * i], m[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_epi32(m[2 * i], m[2 * i + 1]);
        }
        // `u[4i + c]`, 128-bit lane k: rows 4i .. 4i + 4 of column 4k + c.
        let mut u = [_mm512_setzero_si512(); 16];
        for i in 0..4 {
            u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
            u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
            u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
            u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
        }
        let mut out = [_mm512_setzero_si512(); 16];
        for c in 0..4 {
            let columns = transpose_lanes([u[c], u[4 + c], u[8 + c], u[12 + c]]);
            for (k, column) in columns.into_iter().enumerate() {
                out[4 * k + c] = column;
            }
        }
        out
    }
}

/// Four rows' blocks widened to 16 pairs of i16 each, for `rows_x4_zmm`'s broadcasts.
#[repr(align(64))]
struct WidenedRows([[i32; QK / 2]; ROWS_PER_LANE]);

/// Lane `t` (128 bits) of result `k` is lane `k` of `z[t]`: a 4 × 4 transpose of 128-bit lanes
/// (in `rows_x4_zmm`, each token's pairs `4k .. 4k + 4` side by side).
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX512F).
#[inline(always)]
unsafe fn transpose_lanes(z: [__m512i; 4]) -> [__m512i; 4] {
    // SAFETY: register-only; the caller has AVX512F.
    unsafe {
        // (z0 lanes 0, 1, z1 lanes 0, 1), (z0 lanes 2, 3, z1 lanes 2, 3), and so for z2, z3.
        let low01 = _mm512_shuffle_i32x4::<0x44>(z[0], z[1]);
        let high01 = _mm512_shuffle_i32x4::<0xEE>(z[0], z[1]);
        let low23 = _mm512_shuffle_i32x4::<0x44>(z[2], z[3]);
        let high23 = _mm512_shuffle_i32x4::<0xEE>(z[2], z[3]);
        [
            _mm512_shuffle_i32x4::<0x88>(low01, low23),
            _mm512_shuffle_i32x4::<0xDD>(low01, low23),
            _mm512_shuffle_i32x4::<0x88>(high01, high23),
            _mm512_shuffle_i32x4::<0xDD>(high01, high23),
        ]
    }
}

/// Lane `4t + r` of the result: the sum of lanes `4t .. 4t + 4` of `v[r]` (each 128-bit lane's
/// four partial sums of a row, added across; exact integer sums).
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX512F).
#[inline(always)]
unsafe fn sum_lane_quarters(v: [__m512i; ROWS_PER_LANE]) -> __m512i {
    // SAFETY: register-only; the caller has AVX512F.
    unsafe {
        // Per 128-bit lane: (v0₀ + v0₂, v1₀ + v1₂, v0₁ + v0₃, v1₁ + v1₃), and so for v2, v3.
        let v01 = _mm512_add_epi32(
            _mm512_unpacklo_epi32(v[0], v[1]),
            _mm512_unpackhi_epi32(v[0], v[1]),
        );
        let v23 = _mm512_add_epi32(
            _mm512_unpacklo_epi32(v[2], v[3]),
            _mm512_unpackhi_epi32(v[2], v[3]),
        );
        _mm512_add_epi32(
            _mm512_unpacklo_epi64(v01, v23),
            _mm512_unpackhi_epi64(v01, v23),
        )
    }
}

/// Transposes blocks `b0 ..` of eight Q16 activation rows (see `super::panel`).
pub(super) fn transpose_x8(xs: [&[u8]; X8], b0: usize, out: &mut [u8]) {
    let nb = x8_blocks(&xs, b0, out);
    // SAFETY: CPU features as above; blocks `b0 .. b0 + nb` lie inside every row, and `nb`
    // transposed blocks inside `out`.
    unsafe { transpose_x8_avx2(nb, xs.map(<[u8]>::as_ptr), b0, out.as_mut_ptr()) }
}

/// The whole blocks from `b0` on that every row of `xs` holds and `out` has room for
/// transposed: what a transposer fills.
pub(super) fn x8_blocks(xs: &[&[u8]; X8], b0: usize, out: &[u8]) -> usize {
    xs.iter().fold(out.len() / X8_BLOCK_BYTES, |n, x| {
        n.min((x.len() / BlockQ16::BYTES).saturating_sub(b0))
    })
}

/// Stores the eight tokens' block scales, then their sums (a row of f32 each), at the start of
/// the transposed block at `o`.
///
/// # Safety
/// A Q16 block at each `x[t]`, `X8_QUANTS` writable bytes at `o`; the CPU has AVX.
#[inline(always)]
pub(super) unsafe fn store_x8_scales(x: [*const u8; X8], o: *mut u8) {
    // SAFETY: as the caller guarantees: each block starts with its f32 scale and sum.
    unsafe {
        let mut floats = [[0f32; X8]; 2];
        for t in 0..X8 {
            floats[0][t] = (x[t] as *const f32).read_unaligned();
            floats[1][t] = (x[t].add(4) as *const f32).read_unaligned();
        }
        for (k, row) in floats.iter().enumerate() {
            _mm256_storeu_ps(o.add(k * X8 * 4) as *mut f32, _mm256_loadu_ps(row.as_ptr()));
        }
    }
}

/// # Safety
/// The CPU has AVX2; Q16 blocks `b0 .. b0 + nb` lie inside every row at `xs[t]`, and `nb`
/// transposed blocks (`X8_BLOCK_BYTES` each) at `out`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn transpose_x8_avx2(nb: usize, xs: [*const u8; X8], b0: usize, out: *mut u8) {
    for b in 0..nb {
        // SAFETY: as the caller guarantees: block `b0 + b` inside every row, transposed block
        // `b` inside `out`.
        unsafe {
            let o = out.add(b * X8_BLOCK_BYTES);
            let x = xs.map(|x| x.add((b0 + b) * BlockQ16::BYTES));
            store_x8_scales(x, o);
            let mut lo = [_mm256_setzero_si256(); X8];
            let mut hi = [_mm256_setzero_si256(); X8];
            for t in 0..X8 {
                lo[t] = _mm256_loadu_si256(x[t].add(8) as *const __m256i);
                hi[t] = _mm256_loadu_si256(x[t].add(40) as *const __m256i);
            }
            let q = o.add(X8_QUANTS) as *mut __m256i;
            let (lo, hi) = (transpose8(lo), transpose8(hi));
            for p in 0..8 {
                _mm256_storeu_si256(q.add(p), lo[p]);
                _mm256_storeu_si256(q.add(p + 8), hi[p]);
            }
        }
    }
}

/// Transposes blocks `b0 ..` of eight Q16 activation rows into the 512-bit kernels' layout
/// (`X8Layout::Lanes`): per block the tokens' scales and sums as `transpose_x8` stores them,
/// then for each half `h` of the tile and each group `k` of four pairs a 512-bit vector whose
/// 128-bit lane `t` holds token `4h + t`'s pairs `4k .. 4k + 4` (`rows_x4_zmm`'s `x`).
pub(super) fn transpose_x8_lanes(xs: [&[u8]; X8], b0: usize, out: &mut [u8]) {
    let nb = x8_blocks(&xs, b0, out);
    // SAFETY: the tables holding this entry are handed out only where the CPU has AVX-512
    // F/BW/VL besides AVX2; blocks `b0 .. b0 + nb` lie inside every row, and `nb` transposed
    // blocks inside `out`.
    unsafe { transpose_x8_lanes_avx512(nb, xs.map(<[u8]>::as_ptr), b0, out.as_mut_ptr()) }
}

/// # Safety
/// The CPU has AVX2 and AVX-512 F/BW/VL; Q16 blocks `b0 .. b0 + nb` lie inside every row at
/// `xs[t]`, and `nb` transposed blocks (`X8_BLOCK_BYTES` each) at `out`.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
unsafe fn transpose_x8_lanes_avx512(nb: usize, xs: [*const u8; X8], b0: usize, out: *mut u8) {
    // SAFETY: as the caller guarantees.
    unsafe {
        for b in 0..nb {
            let x = xs.map(|p| p.add((b0 + b) * BlockQ16::BYTES));
            let o = out.add(b * X8_BLOCK_BYTES);
            store_x8_scales(x, o);
            let quants = o.add(X8_QUANTS) as *mut __m512i;
            for h in 0..X8 / TILE {
                let mut z = [_mm512_setzero_si512(); TILE];
                for (t, z) in z.iter_mut().enumerate() {
                    *z = _mm512_loadu_si512(x[TILE * h + t].add(8) as *const __m512i);
                }
                for (k, v) in transpose_lanes(z).into_iter().enumerate() {
                    _mm512_storeu_si512(quants.add(4 * h + k), v);
                }
            }
        }
    }
}

/// Weight rows per pass of the 512-bit transposed-tile kernel: two groups of four, each of
/// whose blocks' two sets of sums (a half of the tile each) keep eight chains of `vpdpwssd` in
/// flight.
const OCT: usize = 8;

/// `X8_ROWS` weight rows' blocks `b0 ..` against a transposed tile of eight tokens in
/// `X8Layout::Lanes`, `OCT` rows at a time.
pub(super) fn rows_x8_lanes<W: Unpack>(
    w: [&[u8]; X8_ROWS],
    b0: usize,
    xt: &[u8],
    acc: &mut [[f32; X8]; X8_ROWS],
) {
    let nb = x8_row_blocks::<W>(&w, b0, xt);
    let row_len = w[0].len();
    for (o, acc) in acc.as_chunks_mut::<OCT>().0.iter_mut().enumerate() {
        let w: [*const u8; OCT] = core::array::from_fn(|i| w[o * OCT + i].as_ptr());
        // SAFETY: as for `rows_x4_avx512`; blocks `b0 .. b0 + nb` lie inside every row, `nb`
        // transposed blocks inside `xt`.
        unsafe { rows_x8_lanes_zmm::<W>(nb, w, row_len, b0, xt.as_ptr(), acc) }
    }
}

/// `rows_x4_zmm` for each half of a tile of eight tokens (transposed once per mat-mul, not per
/// block): each row's block is widened once and each of its four broadcasts multiplies both
/// halves, so every (row, token, block) is one `vpdpwssd` on 512-bit vectors, and four rows'
/// sums are added across by 128-bit lanes. Then `add_block`'s scaling per lane, in the same
/// order: the bits `rows` gives each token.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C, AVX512F/BW/VL and AVX512-VNNI; blocks `b0 .. b0 + nb` of format
/// `W` lie inside every row at `w[r]`, and `nb` transposed blocks (`X8Layout::Lanes`) at `xt`.
/// `row_len` (a row's bytes) only aims the prefetches.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_x8_lanes_zmm<W: Unpack>(
    nb: usize,
    w: [*const u8; OCT],
    row_len: usize,
    b0: usize,
    xt: *const u8,
    acc: &mut [[f32; X8]; OCT],
) {
    const HALVES: usize = X8 / TILE;
    const QUARTETS: usize = OCT / ROWS_PER_LANE;
    // SAFETY: the caller guarantees the blocks in every row and in `xt`, and the features.
    unsafe {
        // `facc[q][h]`: rows `4q .. 4q + 4` against tokens `4h .. 4h + 4`, lane `4t + r`.
        let mut facc = [[_mm512_setzero_ps(); HALVES]; QUARTETS];
        for (q, facc) in facc.iter_mut().enumerate() {
            for (h, facc) in facc.iter_mut().enumerate() {
                let mut lanes = [0f32; 16];
                for (i, lane) in lanes.iter_mut().enumerate() {
                    let (t, r) = (i / ROWS_PER_LANE, i % ROWS_PER_LANE);
                    *lane = acc[ROWS_PER_LANE * q + r][TILE * h + t];
                }
                *facc = _mm512_loadu_ps(lanes.as_ptr());
            }
        }
        let by_token = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
        let mut widened = WidenedRows([[0; QK / 2]; ROWS_PER_LANE]);
        for b in 0..nb {
            let x = xt.add(b * X8_BLOCK_BYTES);
            let xq = x.add(X8_QUANTS) as *const __m512i;
            let mut dx = [_mm512_setzero_ps(); HALVES];
            let mut s = [_mm512_setzero_ps(); HALVES];
            for h in 0..HALVES {
                let by_lane = |offset: usize| {
                    let v = _mm_loadu_ps(x.add(offset + 4 * TILE * h) as *const f32);
                    _mm512_permutexvar_ps(by_token, _mm512_castps128_ps512(v))
                };
                dx[h] = by_lane(0);
                if W::HAS_MIN {
                    s[h] = by_lane(X8 * 4);
                }
            }
            let wp: [*const u8; OCT] = w.map(|row| block_at::<W>(row, b0 + b));
            let (dw8, mw8) = W::scales8(wp);
            for (q, facc) in facc.iter_mut().enumerate() {
                let mut sums = [[_mm512_setzero_si512(); ROWS_PER_LANE]; HALVES];
                for i in 0..ROWS_PER_LANE {
                    let p = wp[ROWS_PER_LANE * q + i];
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(OCT * row_len) as *const i8);
                    let (lo, hi) = W::unpack(p);
                    let widened = widened.0[i].as_mut_ptr() as *mut __m256i;
                    _mm256_store_si256(widened, lo);
                    _mm256_store_si256(widened.add(1), hi);
                    let widened = widened as *const __m128i;
                    for k in 0..4 {
                        let pairs = _mm512_broadcast_i32x4(_mm_load_si128(widened.add(k)));
                        for (h, sums) in sums.iter_mut().enumerate() {
                            // Loaded at each use (L1): held, the tile's eight vectors left
                            // too few registers for the sums.
                            let x = _mm512_loadu_si512(xq.add(4 * h + k));
                            sums[i] = dpwssd_zmm(sums[i], pairs, x);
                        }
                    }
                }
                let (dw, mw) = if q == 0 {
                    (_mm256_castps256_ps128(dw8), _mm256_castps256_ps128(mw8))
                } else {
                    (
                        _mm256_extractf128_ps::<1>(dw8),
                        _mm256_extractf128_ps::<1>(mw8),
                    )
                };
                let (dw, mw) = (_mm512_broadcast_f32x4(dw), _mm512_broadcast_f32x4(mw));
                for h in 0..HALVES {
                    let isum = sum_lane_quarters(sums[h]);
                    let scale = _mm512_mul_ps(dw, dx[h]);
                    facc[h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, facc[h]);
                    if W::HAS_MIN {
                        facc[h] = _mm512_fmadd_ps(mw, s[h], facc[h]);
                    }
                }
            }
        }
        for (q, facc) in facc.iter().enumerate() {
            for (h, facc) in facc.iter().enumerate() {
                let mut lanes = [0f32; 16];
                _mm512_storeu_ps(lanes.as_mut_ptr(), *facc);
                for (i, lane) in lanes.iter().enumerate() {
                    let (t, r) = (i / ROWS_PER_LANE, i % ROWS_PER_LANE);
                    acc[ROWS_PER_LANE * q + r][TILE * h + t] = *lane;
                }
            }
        }
    }
}

/// Weight rows per pass of the 256-bit transposed-tile kernel: its accumulators (two per row)
/// and the tile's pairs fill the registers.
const QUAD: usize = 4;

/// `X8_ROWS` weight rows' blocks `b0 ..` against a transposed tile of eight tokens (see
/// `super::panel`), `QUAD` rows at a time on 256-bit vectors.
pub(super) fn rows_x8<W: Unpack, const ISA: u8>(
    w: [&[u8]; X8_ROWS],
    b0: usize,
    xt: &[u8],
    acc: &mut [[f32; X8]; X8_ROWS],
) {
    let nb = x8_row_blocks::<W>(&w, b0, xt);
    let row_len = w[0].len();
    for (q, acc) in acc.as_chunks_mut::<QUAD>().0.iter_mut().enumerate() {
        let w: [*const u8; QUAD] = core::array::from_fn(|i| w[q * QUAD + i].as_ptr());
        // SAFETY: as for `dot`; blocks `b0 .. b0 + nb` lie inside every row, `nb` transposed
        // blocks inside `xt`.
        unsafe {
            match ISA {
                AVX_VNNI => rows_x8_vnni::<W>(nb, w, row_len, b0, xt.as_ptr(), acc),
                _ => rows_x8_avx2::<W>(nb, w, row_len, b0, xt.as_ptr(), acc),
            }
        }
    }
}

/// Per block: each row's 32 quants widened to a buffer, then per pair the eight tokens' pairs
/// loaded once and multiplied with each row's pair broadcast (one integer sum per (row, token)
/// in a lane), then the panel kernel's scaling per lane.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and the features of `ISA`; blocks `b0 .. b0 + nb` of format `W`
/// lie inside every row at `w[r]`, and `nb` transposed blocks at `xt`. `row_len` (a row's
/// bytes) only aims the prefetches.
#[inline(always)]
unsafe fn rows_x8_tile<W: Unpack, const ISA: u8>(
    nb: usize,
    w: [*const u8; QUAD],
    row_len: usize,
    b0: usize,
    xt: *const u8,
    acc: &mut [[f32; X8]; QUAD],
) {
    // SAFETY: the caller guarantees the blocks in every row and in `xt`, AVX2/FMA/F16C, and the
    // features of `ISA`.
    unsafe {
        let mut facc = [_mm256_setzero_ps(); QUAD];
        for r in 0..QUAD {
            facc[r] = _mm256_loadu_ps(acc[r].as_ptr());
        }
        // Two blocks' widened quants: the next block is widened while this one is multiplied,
        // so the broadcasts never wait on the stores they read.
        let mut quants = WidenedQuants([[[0; QK / 2]; QUAD]; 2]);
        if nb > 0 {
            widen_rows::<W>(w, row_len, b0, &mut quants.0[0]);
        }
        for b in 0..nb {
            if b + 1 < nb {
                widen_rows::<W>(w, row_len, b0 + b + 1, &mut quants.0[(b + 1) % 2]);
            }
            let q = &quants.0[b % 2];
            let x = xt.add(b * X8_BLOCK_BYTES);
            let xq = x.add(X8_QUANTS) as *const __m256i;
            // Two sums per row, one per half of the block: two chains of `vpdpwssd` in flight
            // (integer addition is exact, so the split changes no result).
            let mut lo = [_mm256_setzero_si256(); QUAD];
            let mut hi = [_mm256_setzero_si256(); QUAD];
            for p in 0..QK / 4 {
                let x_lo = _mm256_loadu_si256(xq.add(p));
                let x_hi = _mm256_loadu_si256(xq.add(p + QK / 4));
                for r in 0..QUAD {
                    let w_lo = _mm256_set1_epi32(q[r][p]);
                    let w_hi = _mm256_set1_epi32(q[r][p + QK / 4]);
                    (lo[r], hi[r]) = match ISA {
                        AVX_VNNI => (
                            dpwssd::<ISA>(lo[r], w_lo, x_lo),
                            dpwssd::<ISA>(hi[r], w_hi, x_hi),
                        ),
                        _ => (
                            _mm256_add_epi32(lo[r], _mm256_madd_epi16(w_lo, x_lo)),
                            _mm256_add_epi32(hi[r], _mm256_madd_epi16(w_hi, x_hi)),
                        ),
                    };
                }
            }
            let dx = _mm256_loadu_ps(x as *const f32);
            let s = _mm256_loadu_ps(x.add(X8 * 4) as *const f32);
            for r in 0..QUAD {
                let scales = W::scales(block_at::<W>(w[r], b0 + b));
                let isum = _mm256_add_epi32(lo[r], hi[r]);
                facc[r] = add_block::<W>(facc[r], isum, scales, dx, s);
            }
        }
        for r in 0..QUAD {
            _mm256_storeu_ps(acc[r].as_mut_ptr(), facc[r]);
        }
    }
}

#[repr(align(32))]
struct WidenedQuants([[[i32; QK / 2]; QUAD]; 2]);

/// Widens block `b` of each row into `out` (a row's 32 quants as 16 pairs of i16), and prefetches
/// the same block of the next rows' quad (usually the rows right after these, a fixed distance
/// on, which the hardware prefetcher does not reach in time).
///
/// # Safety
/// The CPU has AVX2 and F16C; block `b` of format `W` lies inside every row at `w[r]`.
#[inline(always)]
unsafe fn widen_rows<W: Unpack>(
    w: [*const u8; QUAD],
    row_len: usize,
    b: usize,
    out: &mut [[i32; QK / 2]; QUAD],
) {
    // SAFETY: as the caller guarantees; `out[r]` is 64 bytes at a 32-byte boundary.
    unsafe {
        for r in 0..QUAD {
            let p = block_at::<W>(w[r], b);
            let ahead = QUAD * row_len;
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead) as *const i8);
            let (lo, hi) = W::unpack(p);
            let q = out[r].as_mut_ptr() as *mut __m256i;
            _mm256_store_si256(q, lo);
            _mm256_store_si256(q.add(1), hi);
        }
    }
}

/// # Safety
/// As for `rows_x8_tile`, with the features enabled here.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_x8_avx2<W: Unpack>(
    nb: usize,
    w: [*const u8; QUAD],
    row_len: usize,
    b0: usize,
    xt: *const u8,
    acc: &mut [[f32; X8]; QUAD],
) {
    // SAFETY: as the caller guarantees for this function.
    unsafe { rows_x8_tile::<W, AVX2>(nb, w, row_len, b0, xt, acc) }
}

/// # Safety
/// As for `rows_x8_tile`, with the features enabled here.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn rows_x8_vnni<W: Unpack>(
    nb: usize,
    w: [*const u8; QUAD],
    row_len: usize,
    b0: usize,
    xt: *const u8,
    acc: &mut [[f32; X8]; QUAD],
) {
    // SAFETY: as the caller guarantees for this function.
    unsafe { rows_x8_tile::<W, AVX_VNNI>(nb, w, row_len, b0, xt, acc) }
}

/// Lane `r` of the result: the sum of `v[r]`'s eight lanes.
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX2).
#[inline(always)]
pub(super) unsafe fn sum_across8(v: [__m256i; 8]) -> __m256i {
    // SAFETY: register-only; the caller has AVX2.
    unsafe {
        // After two rounds of pairwise sums each 128-bit half holds four rows' partial sums:
        // rows 0..4 in `q0`, rows 4..8 in `q1`, low halves and high halves apart.
        let q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        let q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
        _mm256_add_epi32(
            _mm256_permute2x128_si256(q0, q1, 0x20),
            _mm256_permute2x128_si256(q0, q1, 0x31),
        )
    }
}

/// # Safety
/// As for `rows_tile`, with the features enabled here.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_avx2<W: Unpack, const T: usize>(
    nb: usize,
    w: [&[u8]; PANEL],
    xs: [&[u8]; T],
    out: &mut [[f32; PANEL]; T],
) {
    // SAFETY: as the caller guarantees for this function.
    unsafe { rows_tile::<W, AVX2, T>(nb, w, xs, out) }
}

/// # Safety
/// As for `rows_tile`, with the features enabled here.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn rows_vnni<W: Unpack, const T: usize>(
    nb: usize,
    w: [&[u8]; PANEL],
    xs: [&[u8]; T],
    out: &mut [[f32; PANEL]; T],
) {
    // SAFETY: as the caller guarantees for this function.
    unsafe { rows_tile::<W, AVX_VNNI, T>(nb, w, xs, out) }
}

/// The AVX2 panel kernel: all sixteen rows at once, each token's broadcast pair shared by both
/// halves' `vpmaddwd`s. Without VNNI a sum's chain is one `vpaddd` per pair (the multiply feeds
/// it, not the sum), so eight sums cover the latency without `panel_half`'s split, and the
/// float accumulators wait in `acc` between blocks: eight sums, two weight vectors and a
/// broadcast fill the sixteen registers. Each lane's integer sum and float steps are
/// `panel_half`'s, so the same bits. Against the half-panel kernel run twice (which broadcast
/// every pair twice and spilled): see BENCHMARKS.md.
///
/// # Safety
/// The CPU has the features enabled here; `nb` whole packed blocks lie inside `packed` and
/// `nb` Q16 blocks inside every `xs[t]`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn panel_avx2<W: Unpack>(
    nb: usize,
    packed: &[u8],
    xs: [&[u8]; TILE],
    acc: &mut PanelAcc,
) {
    // SAFETY: the caller guarantees `nb` whole blocks in `packed` and every `xs[t]`, and the
    // features enabled here; `acc[t]` holds `PANEL` floats, two vectors.
    unsafe {
        for b in 0..nb {
            let (pb, xp) = panel_block_at(packed, xs, b);
            // `sums[h][t]`: rows `8h .. 8h + 8` of token `t`.
            let mut sums = [[_mm256_setzero_si256(); TILE]; 2];
            for p in 0..QK / 2 {
                let wp = pb.add(PANEL_QUANTS + p * PANEL * 4) as *const __m256i;
                let wv = [_mm256_loadu_si256(wp), _mm256_loadu_si256(wp.add(1))];
                for t in 0..TILE {
                    let pair = (xp[t].add(8 + 4 * p) as *const i32).read_unaligned();
                    let xv = _mm256_set1_epi32(pair);
                    for (sums, wv) in sums.iter_mut().zip(wv) {
                        sums[t] = _mm256_add_epi32(sums[t], _mm256_madd_epi16(wv, xv));
                    }
                }
            }
            for (h, sums) in sums.iter().enumerate() {
                let dw = _mm256_loadu_ps(pb.add(h * 32) as *const f32);
                let mw = _mm256_loadu_ps(pb.add(PANEL * 4 + h * 32) as *const f32);
                for t in 0..TILE {
                    let a = acc[t].as_mut_ptr().add(8 * h);
                    let dx = _mm256_set1_ps((xp[t] as *const f32).read_unaligned());
                    let s = _mm256_set1_ps((xp[t].add(4) as *const f32).read_unaligned());
                    let f = add_block::<W>(_mm256_loadu_ps(a), sums[t], (dw, mw), dx, s);
                    _mm256_storeu_ps(a, f);
                }
            }
        }
    }
}

/// # Safety
/// As for `panel_half`, with the features enabled here.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn panel_vnni<W: Unpack>(
    nb: usize,
    packed: &[u8],
    xs: [&[u8]; TILE],
    acc: &mut PanelAcc,
    h: usize,
) {
    // SAFETY: as the caller guarantees for this function.
    unsafe { panel_half::<W>(nb, packed, xs, acc, h) }
}

/// The 512-bit panel kernel: as `panel_half`, all sixteen rows in one vector, four sums per
/// token in flight. The same integer sums and float operations per lane, so the same bits.
///
/// # Safety
/// The CPU has the features enabled here; `nb` whole packed blocks lie inside `packed` and
/// `nb` Q16 blocks inside every `xs[t]`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn panel_avx512<W: Unpack>(
    nb: usize,
    packed: &[u8],
    xs: [&[u8]; TILE],
    acc: &mut PanelAcc,
) {
    const SPLIT: usize = 4;
    // SAFETY: the caller guarantees `nb` whole blocks in `packed` and every `xs[t]`, and the
    // features enabled here.
    unsafe {
        let mut facc = [_mm512_setzero_ps(); TILE];
        for t in 0..TILE {
            facc[t] = _mm512_loadu_ps(acc[t].as_ptr());
        }
        for b in 0..nb {
            let (pb, xp) = panel_block_at(packed, xs, b);
            // Four sums per token, one per quarter of the block.
            let mut split = [[_mm512_setzero_si512(); TILE]; SPLIT];
            for p0 in 0..QK / 2 / SPLIT {
                for (s, sums) in split.iter_mut().enumerate() {
                    let p = p0 + s * QK / 2 / SPLIT;
                    let wp = pb.add(PANEL_QUANTS + p * PANEL * 4);
                    let wv = _mm512_loadu_si512(wp as *const __m512i);
                    for t in 0..TILE {
                        let pair = (xp[t].add(8 + 4 * p) as *const i32).read_unaligned();
                        sums[t] = dpwssd_zmm(sums[t], wv, _mm512_set1_epi32(pair));
                    }
                }
            }
            let dw = _mm512_loadu_ps(pb as *const f32);
            for t in 0..TILE {
                let isum = _mm512_add_epi32(
                    _mm512_add_epi32(split[0][t], split[1][t]),
                    _mm512_add_epi32(split[2][t], split[3][t]),
                );
                let dx = _mm512_set1_ps((xp[t] as *const f32).read_unaligned());
                let scale = _mm512_mul_ps(dw, dx);
                facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, facc[t]);
            }
            if W::HAS_MIN {
                let mw = _mm512_loadu_ps(pb.add(PANEL * 4) as *const f32);
                for t in 0..TILE {
                    let s = _mm512_set1_ps((xp[t].add(4) as *const f32).read_unaligned());
                    facc[t] = _mm512_fmadd_ps(mw, s, facc[t]);
                }
            }
        }
        for t in 0..TILE {
            _mm512_storeu_ps(acc[t].as_mut_ptr(), facc[t]);
        }
    }
}
