//! The k-quants' many-token kernels (see `kernels::k_panel`): a row's super-block unpacked to
//! bytes, a tile of sixteen tokens transposed, and the tile kernel: with AVX-512 VNNI one
//! `vpdpbusd` per four values of eight rows × sixteen tokens (512-bit vectors), each sum scaled
//! per half (Q4_K and Q5_K: per block) by a `vpmulld`; with AVX-VNNI the same on 256-bit
//! vectors; on AVX2 `vpmaddubsw`, a few groups' pair sums added in 16 bits, then `vpmaddwd`
//! with the half's scale. On 256-bit vectors two rows × the tile's two halves at a time.
use super::*;
use crate::kernels::k_panel::{transpose_ref, KPanelDots, KRow, KTokens, K_MICRO, K_TOKENS};
use crate::quant::k_quants::HALVES_PER_SUPER;
use crate::quant::q8k::SUM_SPAN;

/// The panel kernels of format `K` on instruction set `ISA`.
pub(super) const fn k_panel<K: KBytes, const ISA: u8>() -> KPanelDots {
    KPanelDots {
        from_tokens: from_tokens::<ISA>(),
        unpack: unpack::<K, false>,
        folds_scales: false,
        transpose,
        dot: tile_dot::<K, ISA>,
    }
}

/// Tokens from which a mat-mul takes these kernels rather than the tiles of four: a tile
/// costs what a few tokens do, so it wins once the tiles of four make enough passes.
/// `cargo bench -p sapient-core --bench matvec -- k_step` (a 2816 x 1024 matrix, Q4_K, Q6_K,
/// IQ4_XS; BENCHMARKS.md): with AVX-512 VNNI the tile of sixteen cost 0.79-1.22x four tokens'
/// tiles and 0.41-0.64x eight's; with AVX-VNNI the tile's first eight 0.65-0.84x five tokens'
/// tiles (two passes), 0.89-1.15x four's; on AVX2 0.95-1.08x five's and 0.61-0.72x eight's.
const fn from_tokens<const ISA: u8>() -> usize {
    match ISA {
        AVX512_VNNI | AVX_VNNI => 5,
        _ => 6,
    }
}

/// Super-block `s` of each row unpacked; with `FOLD` (the AMX table: AVX-512 BW) also each
/// value times its scale (`KRow::scaled_low`, `scaled_high`).
pub(super) fn unpack<K: KBytes, const FOLD: bool>(rows: &[&[u8]], s: usize, out: &mut [KRow]) {
    for (row, o) in rows.iter().zip(out) {
        match row.get(s * K::BYTES..(s + 1) * K::BYTES) {
            // SAFETY: the super-block lies in `sb`; every table, and so this entry, is handed
            // out only on a CPU with AVX2 and F16C, the one that folds only with AVX-512.
            Some(sb) if FOLD => unsafe { unpack_folded::<K>(sb.as_ptr(), o) },
            Some(sb) => unsafe { unpack_avx2::<K>(sb.as_ptr(), o) },
            None => *o = KRow::ZERO,
        }
    }
}

/// # Safety
/// `K::BYTES` readable bytes at `p`; AVX2 and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_avx2<K: KBytes>(p: *const u8, o: &mut KRow) {
    // SAFETY: as the caller guarantees.
    unsafe { unpack_row::<K, false>(p, o) }
}

/// # Safety
/// `K::BYTES` readable bytes at `p`; AVX-512 F/BW/VL, F16C.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn unpack_folded<K: KBytes>(p: *const u8, o: &mut KRow) {
    // SAFETY: as the caller guarantees.
    unsafe { unpack_row::<K, true>(p, o) }
}

/// The super-block at `p` into `o`; with `FOLD`, `scale·(code - OFFSET)` of each value too,
/// split in bytes: `256·high + low`.
///
/// # Safety
/// `K::BYTES` readable bytes at `p`; the features of the function that inlines it: AVX2 and
/// F16C, and AVX-512 F/BW/VL with `FOLD`.
#[inline(always)]
unsafe fn unpack_row<K: KBytes, const FOLD: bool>(p: *const u8, o: &mut KRow) {
    // SAFETY: as the caller guarantees; the stores stay inside `o`'s arrays.
    unsafe {
        // The row's next super-block, which the next `unpack` of this block of rows reads: a
        // block's rows are as many strided streams, which the hardware prefetchers miss (the
        // loads here waited on memory most of the time). Prefetches do not fault past the end.
        for line in (0..K::BYTES + 63).step_by(64) {
            let ahead = p.wrapping_add(K::BYTES + line.min(K::BYTES - 1));
            _mm_prefetch::<_MM_HINT_T1>(ahead as *const i8);
        }
        let (scales, mins) = K::halves(p);
        let codes = o.codes.as_mut_ptr() as *mut __m256i;
        if FOLD {
            // Lanes 0..16 the scale of block j's first half, lanes 16..32 its second's.
            let scale16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(scales));
            let mut halves = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(1));
            for j in 0..QK_K / QK {
                let c = K::bytes(p, j);
                _mm256_storeu_si256(codes.add(j), c);
                let s = _mm512_permutexvar_epi16(halves, scale16);
                let v =
                    _mm512_sub_epi16(_mm512_cvtepu8_epi16(c), _mm512_set1_epi16(K::OFFSET as i16));
                let v = _mm512_mullo_epi16(v, s);
                let low = o.scaled_low.as_mut_ptr().add(QK * j) as *mut __m256i;
                let high = o.scaled_high.as_mut_ptr().add(QK * j) as *mut __m256i;
                _mm256_storeu_si256(low, _mm512_cvtepi16_epi8(v));
                _mm256_storeu_si256(high, _mm512_cvtepi16_epi8(_mm512_srai_epi16::<8>(v)));
                halves = _mm512_add_epi16(halves, _mm512_set1_epi16(2));
            }
        } else {
            for j in 0..QK_K / QK {
                _mm256_storeu_si256(codes.add(j), K::bytes(p, j));
            }
        }
        let wide = o.scales.as_mut_ptr() as *mut __m256i;
        _mm256_storeu_si256(wide, _mm256_cvtepi8_epi32(scales));
        let high = _mm_unpackhi_epi64(scales, scales);
        _mm256_storeu_si256(wide.add(1), _mm256_cvtepi8_epi32(high));
        let side = if K::HAS_MIN {
            _mm256_cvtepi8_epi16(mins)
        } else if K::OFFSET != 0 {
            _mm256_cvtepi8_epi16(scales)
        } else {
            _mm256_setzero_si256()
        };
        _mm256_storeu_si256(o.side.as_mut_ptr() as *mut __m256i, side);
        // `KBlock::d_dmin`, with F16C's conversion.
        let [d, dmin] = K::f16_bits(core::slice::from_raw_parts(p, K::BYTES));
        o.d = f16_to_f32(d);
        if K::D_SCALE != 1.0 {
            o.d *= K::D_SCALE;
        }
        o.dmin = f16_to_f32(dmin);
    }
}

pub(super) fn transpose(xs: [&[u8]; K_TOKENS], s: usize, out: &mut KTokens) {
    let block = s * BlockQ8K::BYTES..(s + 1) * BlockQ8K::BYTES;
    if xs.iter().any(|x| x.get(block.clone()).is_none()) {
        *out = transpose_ref(xs, s);
        return;
    }
    let xs = xs.map(|x| x[block.clone()].as_ptr());
    // SAFETY: every row holds block `s`; the tables are handed out only on CPUs with AVX2.
    unsafe { transpose_avx2(xs, out) }
}

/// # Safety
/// A whole Q8K block at each `xs[t]`; AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn transpose_avx2(xs: [*const u8; K_TOKENS], out: &mut KTokens) {
    // SAFETY: as the caller guarantees; the stores stay inside `out`'s arrays.
    unsafe {
        for half in 0..2 {
            let x = &xs[8 * half..8 * half + 8];
            let mut r = [_mm256_setzero_si256(); 8];
            for g0 in (0..QK_K / 4).step_by(8) {
                for t in 0..8 {
                    let at = BlockQ8K::QUANTS + 4 * g0;
                    r[t] = _mm256_loadu_si256(x[t].add(at) as *const __m256i);
                }
                let c = transpose8x8(r);
                for (codes, c) in out.codes[g0..g0 + 8].iter_mut().zip(c) {
                    let o = codes.as_mut_ptr().add(32 * half);
                    _mm256_storeu_si256(o as *mut __m256i, c);
                }
            }
            for (r, x) in r.iter_mut().zip(x) {
                *r = _mm256_loadu_si256(x.add(BlockQ8K::SUMS) as *const __m256i);
            }
            let c = transpose8x8(r);
            for (sums, c) in out.sums.iter_mut().zip(c) {
                let o = sums.as_mut_ptr().add(32 * half);
                _mm256_storeu_si256(o as *mut __m256i, c);
            }
            for (d, x) in out.d[8 * half..].iter_mut().zip(x) {
                *d = (*x as *const f32).read_unaligned();
            }
        }
    }
}

/// Eight vectors of eight 32-bit lanes, transposed: lane `j` of output `i` is lane `i` of
/// input `j`.
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX2).
#[inline(always)]
unsafe fn transpose8x8(r: [__m256i; 8]) -> [__m256i; 8] {
    // SAFETY: register-only; the caller has AVX2.
    unsafe {
        let mut t = [_mm256_setzero_si256(); 8];
        for i in 0..4 {
            t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        // u[4k + c]: column c (and c + 4) of rows 4k .. 4k + 4.
        let mut u = [_mm256_setzero_si256(); 8];
        for k in 0..2 {
            let (a, b, c, d) = (t[4 * k], t[4 * k + 1], t[4 * k + 2], t[4 * k + 3]);
            u[4 * k] = _mm256_unpacklo_epi64(a, c);
            u[4 * k + 1] = _mm256_unpackhi_epi64(a, c);
            u[4 * k + 2] = _mm256_unpacklo_epi64(b, d);
            u[4 * k + 3] = _mm256_unpackhi_epi64(b, d);
        }
        let mut c = [_mm256_setzero_si256(); 8];
        for i in 0..4 {
            c[i] = _mm256_permute2x128_si256::<0x20>(u[i], u[4 + i]);
            c[4 + i] = _mm256_permute2x128_si256::<0x31>(u[i], u[4 + i]);
        }
        c
    }
}

/// The tile's first `tokens` tokens (at least): on 512-bit vectors all sixteen (the 256-bit
/// kernel on eight took 1.2-1.8x their time); on 256-bit vectors eight where no more count (a
/// decode step of a few sequences: 0.54-0.6x sixteen's time).
pub(super) fn tile_dot<K: KBytes, const ISA: u8>(
    rows: &[KRow],
    x: &KTokens,
    tokens: usize,
    acc: &mut [[f32; K_TOKENS]],
) {
    let half = tokens <= K_TOKENS / 2;
    let n = rows.len().min(acc.len()) / K_MICRO * K_MICRO;
    let rows = rows[..n].chunks_exact(K_MICRO);
    for (rs, acc) in rows.zip(acc[..n].chunks_exact_mut(K_MICRO)) {
        let Ok(rs) = <&[KRow; K_MICRO]>::try_from(rs) else {
            continue;
        };
        // SAFETY: `Kernels::best` hands out each table only when its `*_available()` said yes.
        unsafe {
            match ISA {
                AVX512_VNNI => dot_avx512::<K>(rs, x, acc),
                AVX_VNNI => dot_vnni::<K>(rs, x, half, acc),
                _ => dot_avx2::<K>(rs, x, half, acc),
            }
        }
    }
}

/// Eight rows × sixteen tokens on 512-bit vectors, two sums per row and scale (the even and
/// the odd groups of four values): one chain of `vpdpbusd` per row kept it waiting on their
/// latency where a block shares a scale (eight in a chain; k_panel_dot 1.03-1.06x for Q4_K,
/// Q5_K and IQ4_XS, the others level).
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F/BW/VL with VNNI; `acc` holds `K_MICRO` rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_avx512<K: KBytes>(rs: &[KRow; K_MICRO], x: &KTokens, acc: &mut [[f32; K_TOKENS]]) {
    // Values per integer scale.
    let span = if K::SHARED_HALVES {
        2 * SUM_SPAN
    } else {
        SUM_SPAN
    };
    // SAFETY: as the caller guarantees; every read and write stays inside `rs`, `x` and `acc`.
    unsafe {
        let mut scaled = [_mm512_setzero_si512(); K_MICRO];
        for h in 0..QK_K / span {
            let mut raw = [[_mm512_setzero_si512(); K_MICRO]; 2];
            for g in (h * span / 4..(h + 1) * span / 4).step_by(2) {
                for (i, raw) in raw.iter_mut().enumerate() {
                    let g = g + i;
                    let xv = _mm512_loadu_si512(x.codes[g].as_ptr() as *const __m512i);
                    for r in 0..K_MICRO {
                        let w = (rs[r].codes.as_ptr().add(4 * g) as *const i32).read_unaligned();
                        raw[r] = _mm512_dpbusd_epi32(raw[r], _mm512_set1_epi32(w), xv);
                    }
                }
            }
            for r in 0..K_MICRO {
                let scale = _mm512_set1_epi32(rs[r].scales[h * span / SUM_SPAN]);
                let raw = _mm512_add_epi32(raw[0][r], raw[1][r]);
                scaled[r] = _mm512_add_epi32(scaled[r], _mm512_mullo_epi32(raw, scale));
            }
        }
        finish_zmm::<K, false>(rs, scaled, x, acc);
    }
}

/// The end of a super-block on 512-bit vectors, for `K_MICRO` rows whose integer sums
/// `Σ scale·code·x` (`OFFSET_FOLDED`: `Σ scale·(code - OFFSET)·x`) are `scaled`, one lane per
/// token: the minimums' or offsets' terms from the tokens' 16-value sums (the offsets' only
/// when not folded), then `q8k_step` in each token's lane, added to `acc`.
///
/// # Safety
/// Register arithmetic on the features of the function that inlines it: AVX-512 F/BW/VL with
/// VNNI; `acc` holds `K_MICRO` rows.
#[inline(always)]
pub(super) unsafe fn finish_zmm<K: KBytes, const OFFSET_FOLDED: bool>(
    rs: &[KRow; K_MICRO],
    scaled: [__m512i; K_MICRO],
    x: &KTokens,
    acc: &mut [[f32; K_TOKENS]],
) {
    // SAFETY: as the caller guarantees; every read and write stays inside `rs`, `x` and `acc`.
    unsafe {
        let mut side = [_mm512_setzero_si512(); K_MICRO];
        let offset = K::OFFSET != 0 && !OFFSET_FOLDED;
        if K::HAS_MIN || offset {
            for i in 0..HALVES_PER_SUPER / 2 {
                let sums = _mm512_loadu_si512(x.sums[i].as_ptr() as *const __m512i);
                for r in 0..K_MICRO {
                    let pair = _mm512_set1_epi32(rs[r].side[i] as i32);
                    side[r] = dpwssd_zmm(side[r], sums, pair);
                }
            }
        }
        let dx = _mm512_loadu_ps(x.d.as_ptr());
        for r in 0..K_MICRO {
            let isum = if offset {
                let offsets = _mm512_mullo_epi32(side[r], _mm512_set1_epi32(K::OFFSET));
                _mm512_sub_epi32(scaled[r], offsets)
            } else {
                scaled[r]
            };
            let msum = if K::HAS_MIN {
                side[r]
            } else {
                _mm512_setzero_si512()
            };
            // `q8k_step` in each token's lane, the same operations in the same order.
            let d = _mm512_mul_ps(_mm512_set1_ps(rs[r].d), dx);
            let dmin = _mm512_mul_ps(_mm512_set1_ps(rs[r].dmin), dx);
            let a = _mm512_mul_ps(d, _mm512_cvtepi32_ps(isum));
            let b = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(msum));
            let o = acc[r].as_mut_ptr();
            _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), _mm512_sub_ps(a, b)));
        }
    }
}

/// How many groups of four values' `vpmaddubsw` pair sums (a half holds four groups) add up in
/// 16 bits without overflow: each is at most `2 · MAX_QUANT · 128` in size (`WIDE` formats'
/// signed values: `2 · 127 · 127`).
const fn pair_sums<K: KBytes>() -> usize {
    let bound = match K::WIDE {
        true => 2 * 127 * 127,
        false => 2 * 128 * K::MAX_QUANT as usize,
    };
    let n = i16::MAX as usize / bound;
    if n >= 4 {
        4
    } else if n >= 2 {
        2
    } else {
        1
    }
}

/// `R` rows × `V` vectors of eight tokens at a time on 256-bit vectors: a few groups' pair sums
/// added in 16 bits (`pair_sums`), then the half's scale multiplies them in the `vpmaddwd`
/// that adds them.
///
/// # Safety
/// AVX2, FMA and F16C; `acc` holds `K_MICRO` rows.
#[inline(always)]
unsafe fn dot_ymm<K: KBytes, const R: usize, const V: usize>(
    rs: &[KRow; K_MICRO],
    x: &KTokens,
    acc: &mut [[f32; K_TOKENS]],
) {
    // SAFETY: as the caller guarantees; every read and write stays inside `rs`, `x` and `acc`.
    unsafe {
        for r0 in (0..K_MICRO).step_by(R) {
            let rows = &rs[r0..r0 + R];
            let mut scaled = [[_mm256_setzero_si256(); V]; R];
            for h in 0..HALVES_PER_SUPER {
                let scale: [__m256i; R] =
                    core::array::from_fn(|r| _mm256_set1_epi16(rows[r].scales[h] as i16));
                let groups = h * SUM_SPAN / 4..(h + 1) * SUM_SPAN / 4;
                for g0 in groups.step_by(pair_sums::<K>()) {
                    let mut pairs = [[_mm256_setzero_si256(); V]; R];
                    for g in g0..g0 + pair_sums::<K>() {
                        let xv = tokens_ymm::<V>(x, g);
                        for r in 0..R {
                            let w = weights_ymm(&rows[r], g);
                            for v in 0..V {
                                let p = if K::WIDE {
                                    // The signed values: |v| <= 127, no pair sum saturates.
                                    let s = _mm256_xor_si256(w, _mm256_set1_epi8(i8::MIN));
                                    let w = _mm256_abs_epi8(s);
                                    _mm256_maddubs_epi16(w, _mm256_sign_epi8(xv[v], s))
                                } else {
                                    _mm256_maddubs_epi16(w, xv[v])
                                };
                                pairs[r][v] = _mm256_add_epi16(pairs[r][v], p);
                            }
                        }
                    }
                    for r in 0..R {
                        for v in 0..V {
                            let sums = _mm256_madd_epi16(pairs[r][v], scale[r]);
                            scaled[r][v] = _mm256_add_epi32(scaled[r][v], sums);
                        }
                    }
                }
            }
            for v in 0..V {
                let scaled = core::array::from_fn(|r| scaled[r][v]);
                finish_ymm::<K, R>(rows, scaled, x, 8 * v, K::WIDE, &mut acc[r0..r0 + R]);
            }
        }
    }
}

/// Group `g` (values `4g .. 4g + 4`) of the tile's first `8 V` tokens, eight tokens a vector.
///
/// # Safety
/// Loads inside `x` on the features of the function that inlines it (AVX2); `V <= 2`.
#[inline(always)]
unsafe fn tokens_ymm<const V: usize>(x: &KTokens, g: usize) -> [__m256i; V] {
    // SAFETY: group `g` holds `4 * K_TOKENS` bytes, `32 V` of them read; the caller has AVX2.
    core::array::from_fn(|v| unsafe {
        _mm256_loadu_si256(x.codes[g].as_ptr().add(32 * v) as *const __m256i)
    })
}

/// A row's four values of group `g`, broadcast to every 32-bit lane.
///
/// # Safety
/// Register arithmetic on the features of the function that inlines it (AVX2); `g < 64`.
#[inline(always)]
unsafe fn weights_ymm(row: &KRow, g: usize) -> __m256i {
    // SAFETY: bytes `4g .. 4g + 4` lie in the row's codes; the caller has AVX2.
    unsafe { _mm256_set1_epi32((row.codes.as_ptr().add(4 * g) as *const i32).read_unaligned()) }
}

/// Eight rows × sixteen tokens on 256-bit vectors with AVX-VNNI (with `half`, the tile's first
/// eight tokens only): one `vpdpbusd` per four values of a row and eight tokens, each sum
/// scaled per half (Q4_K and Q5_K: per block) by a `vpmulld`, as on 512-bit vectors. Two rows
/// against both eight-token halves of the tile at a time (four with `half`): each broadcast
/// weight serves two vectors of tokens, and the sums fit the sixteen registers.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-VNNI; `acc` holds `K_MICRO` rows.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn dot_vnni<K: KBytes>(
    rs: &[KRow; K_MICRO],
    x: &KTokens,
    half: bool,
    acc: &mut [[f32; K_TOKENS]],
) {
    // SAFETY: as the caller guarantees for this function.
    unsafe {
        if half {
            dot_busd::<K, 4, 1>(rs, x, acc)
        } else {
            dot_busd::<K, 2, 2>(rs, x, acc)
        }
    }
}

/// `dot_vnni`'s loop: `R` rows × `V` vectors of eight tokens at a time.
///
/// # Safety
/// As for `dot_vnni`.
#[inline(always)]
unsafe fn dot_busd<K: KBytes, const R: usize, const V: usize>(
    rs: &[KRow; K_MICRO],
    x: &KTokens,
    acc: &mut [[f32; K_TOKENS]],
) {
    // Values per integer scale.
    let span = if K::SHARED_HALVES {
        2 * SUM_SPAN
    } else {
        SUM_SPAN
    };
    // SAFETY: as the caller guarantees; every read and write stays inside `rs`, `x` and `acc`.
    unsafe {
        for r0 in (0..K_MICRO).step_by(R) {
            let rows = &rs[r0..r0 + R];
            let mut scaled = [[_mm256_setzero_si256(); V]; R];
            for h in 0..QK_K / span {
                let mut raw = [[_mm256_setzero_si256(); V]; R];
                for g in h * span / 4..(h + 1) * span / 4 {
                    let xv = tokens_ymm::<V>(x, g);
                    for r in 0..R {
                        let w = weights_ymm(&rows[r], g);
                        for v in 0..V {
                            raw[r][v] = _mm256_dpbusd_avx_epi32(raw[r][v], w, xv[v]);
                        }
                    }
                }
                for r in 0..R {
                    let scale = _mm256_set1_epi32(rows[r].scales[h * span / SUM_SPAN]);
                    for v in 0..V {
                        let product = _mm256_mullo_epi32(raw[r][v], scale);
                        scaled[r][v] = _mm256_add_epi32(scaled[r][v], product);
                    }
                }
            }
            for v in 0..V {
                let scaled = core::array::from_fn(|r| scaled[r][v]);
                finish_ymm::<K, R>(rows, scaled, x, 8 * v, false, &mut acc[r0..r0 + R]);
            }
        }
    }
}

/// The end of a super-block on 256-bit vectors, for `R` rows whose integer sums
/// `Σ scale·code·x` (`offset_folded`: `Σ scale·(code - OFFSET)·x`) are `scaled`, one lane per
/// token of tokens `t0 .. t0 + 8`: as `finish_zmm`.
///
/// # Safety
/// Register arithmetic on the features of the function that inlines it: AVX2 and FMA; `rs`
/// and `acc` hold `R` rows, `t0 + 8 <= K_TOKENS`.
#[inline(always)]
unsafe fn finish_ymm<K: KBytes, const R: usize>(
    rs: &[KRow],
    scaled: [__m256i; R],
    x: &KTokens,
    t0: usize,
    offset_folded: bool,
    acc: &mut [[f32; K_TOKENS]],
) {
    // SAFETY: as the caller guarantees; every read and write stays inside `rs`, `x` and `acc`.
    unsafe {
        let mut side = [_mm256_setzero_si256(); R];
        let offset = K::OFFSET != 0 && !offset_folded;
        if K::HAS_MIN || offset {
            for i in 0..HALVES_PER_SUPER / 2 {
                let sums = _mm256_loadu_si256(x.sums[i].as_ptr().add(4 * t0) as *const __m256i);
                for r in 0..R {
                    let pair = _mm256_set1_epi32(rs[r].side[i] as i32);
                    side[r] = _mm256_add_epi32(side[r], _mm256_madd_epi16(sums, pair));
                }
            }
        }
        let dx = _mm256_loadu_ps(x.d.as_ptr().add(t0));
        for r in 0..R {
            let isum = if offset {
                let offsets = _mm256_mullo_epi32(side[r], _mm256_set1_epi32(K::OFFSET));
                _mm256_sub_epi32(scaled[r], offsets)
            } else {
                scaled[r]
            };
            let msum = if K::HAS_MIN {
                side[r]
            } else {
                _mm256_setzero_si256()
            };
            // `q8k_step` in each token's lane, the same operations in the same order.
            let d = _mm256_mul_ps(_mm256_set1_ps(rs[r].d), dx);
            let dmin = _mm256_mul_ps(_mm256_set1_ps(rs[r].dmin), dx);
            let a = _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum));
            let b = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(msum));
            let o = acc[r].as_mut_ptr().add(t0);
            _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), _mm256_sub_ps(a, b)));
        }
    }
}

/// Eight rows × sixteen tokens on 256-bit vectors with AVX2 (with `half`, the tile's first
/// eight tokens only): two rows against both eight-token halves of the tile at a time (four
/// with `half`), each broadcast weight serving two vectors of tokens (four rows × eight tokens
/// twice over took 1.03-1.11x the time; four rows × sixteen tokens, which spill, 1.12-1.18x).
///
/// # Safety
/// As for `dot_ymm`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2<K: KBytes>(
    rs: &[KRow; K_MICRO],
    x: &KTokens,
    half: bool,
    acc: &mut [[f32; K_TOKENS]],
) {
    // SAFETY: as the caller guarantees for this function.
    unsafe {
        if half {
            dot_ymm::<K, 4, 1>(rs, x, acc)
        } else {
            dot_ymm::<K, 2, 2>(rs, x, acc)
        }
    }
}
