//! AVX2 + FMA + F16C twins of `scalar`, with AVX-VNNI and AVX-512 variants of the quantized dots.
//!
//! Each table is only handed out by `Kernels::best` after its `*_available()` said yes, which is
//! what makes the safe wrappers below sound.
use core::arch::x86_64::*;

use super::panel::{PANEL, PANEL_BLOCK_BYTES, PANEL_QUANTS};
use super::{Kernels, PanelAcc, PanelDots, PanelRows, QuantDots, TILE};
use crate::quant::k_quants::BLOCKS_PER_SUPER;
use crate::quant::{
    BlockQ16, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0,
    KBlock, QK,
};

// cpufeatures also checks that the OS saves the AVX registers; it does not know F16C.
cpufeatures::new!(cpuid_avx2, "avx2", "fma");

/// Whether this CPU runs the kernels here: AVX2, FMA and F16C.
pub fn available() -> bool {
    let f16c = __cpuid(1).ecx & (1 << 29) != 0;
    cpuid_avx2::get() && f16c
}

/// Whether this CPU also has AVX-VNNI (`vpdpwssd`: the i16·i16 dot, accumulated, in one
/// instruction).
pub fn vnni_available() -> bool {
    available() && __cpuid_count(7, 0).eax >= 1 && __cpuid_count(7, 1).eax & (1 << 4) != 0
}

cpufeatures::new!(cpuid_avx512, "avx512f", "avx512bw", "avx512vl");

/// Whether this CPU (and OS) also run AVX-512 F/BW/VL with AVX512-VNNI: the same 256-bit kernels
/// then get 32 vector registers instead of 16, which ends the accumulators' spills in the tiles.
pub fn avx512_available() -> bool {
    available() && cpuid_avx512::get() && __cpuid_count(7, 0).ecx & (1 << 11) != 0
}

/// Instruction-set levels of the tables below.
const AVX2: u8 = 0;
const AVX_VNNI: u8 = 1;
const AVX512_VNNI: u8 = 2;

pub(super) static KERNELS: Kernels = table::<AVX2>("avx2");
pub(super) static KERNELS_VNNI: Kernels = table::<AVX_VNNI>("avx2+vnni");
pub(super) static KERNELS_AVX512: Kernels = table::<AVX512_VNNI>("avx2+avx512vl");

/// The table for `ISA`: `vpdpwssd` in place of `vpmaddwd`+`vpaddd` with either VNNI, and 32
/// registers with AVX-512. All give the same exact integer sums in the same float order, so all
/// give the same bits.
const fn table<const ISA: u8>(name: &'static str) -> Kernels {
    Kernels {
        name,
        quantize_q8_0,
        quantize_q16,
        q8_0: dots::<BlockQ8_0, ISA>(),
        q4_0: dots::<BlockQ4_0, ISA>(),
        q4_1: dots::<BlockQ4_1, ISA>(),
        q5_0: dots::<BlockQ5_0, ISA>(),
        q5_1: dots::<BlockQ5_1, ISA>(),
        q4_k: dots::<BlockQ4K, ISA>(),
        q5_k: dots::<BlockQ5K, ISA>(),
        q6_k: dots::<BlockQ6K, ISA>(),
        dot_f32: |w, x| dot_f32::<1>(w, [x])[0],
        dot_f32_x4: dot_f32::<TILE>,
        dot_f16: |w, x| dot_f16::<1>(w, [x])[0],
        dot_f16_x4: dot_f16::<TILE>,
        axpy_q8_0: axpy_q8_0::<ISA>,
        silu_mul,
        exp_sub,
    }
}

fn silu_mul(gate: &mut [f32], up: &[f32]) {
    // SAFETY: CPU features as above.
    unsafe { silu_mul_avx2(gate, up) }
}

fn exp_sub(x: &mut [f32], m: f32) -> f32 {
    // SAFETY: CPU features as above.
    unsafe { exp_sub_avx2(x, m) }
}

/// The portable loop, vectorized eight wide instead of baseline x86-64's four.
#[target_feature(enable = "avx2")]
unsafe fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) {
    crate::ops::silu_mul(gate, up)
}

/// The portable loop, vectorized eight wide instead of baseline x86-64's four.
#[target_feature(enable = "avx2")]
unsafe fn exp_sub_avx2(x: &mut [f32], m: f32) -> f32 {
    crate::ops::exp_sub(x, m)
}

const fn dots<W: Unpack, const ISA: u8>() -> QuantDots {
    QuantDots {
        one: |w, x| dot::<W, 1, 1, ISA>([w], [x])[0][0],
        x4: |w, xs| dot::<W, 1, TILE, ISA>([w], xs)[0],
        rows4: |w, x| dot::<W, 4, 1, ISA>(w, [x]).map(|r| r[0]),
        rows2x4: dot::<W, 2, TILE, ISA>,
        panel: Some(PanelDots {
            pack: pack::<W>,
            dot: panel::<W, ISA>,
            rows: panel_rows::<W, ISA>,
        }),
    }
}

/// Up to four rows at a time, in 512-bit vectors with AVX-512 (the same multiply-adds per value,
/// in the same order, so the same bits).
fn axpy_q8_0<const ISA: u8>(out: &mut [f32], a: &[f32], rows: &[&[u8]]) {
    // SAFETY: CPU features as above (AVX-512 only in its table); the kernels stay within the
    // whole blocks and runs they have.
    unsafe {
        match rows {
            [r0] => axpy_rows::<1, ISA>(out, a, [r0]),
            [r0, r1] => axpy_rows::<2, ISA>(out, a, [r0, r1]),
            [r0, r1, r2] => axpy_rows::<3, ISA>(out, a, [r0, r1, r2]),
            [r0, r1, r2, r3, ..] => axpy_rows::<4, ISA>(out, a, [r0, r1, r2, r3]),
            [] => {}
        }
    }
}

/// # Safety
/// The CPU features of `ISA`.
unsafe fn axpy_rows<const K: usize, const ISA: u8>(out: &mut [f32], a: &[f32], rows: [&[u8]; K]) {
    // SAFETY: as the caller guarantees.
    unsafe {
        if ISA == AVX512_VNNI {
            axpy_q8_0_avx512::<K>(out, a, rows)
        } else {
            axpy_q8_0_avx2::<K>(out, a, rows)
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn axpy_q8_0_avx512<const K: usize>(out: &mut [f32], a: &[f32], rows: [&[u8]; K]) {
    let nb = super::q8_0_blocks(&rows);
    let n = nb * QK;
    if n == 0 {
        return;
    }
    let runs = (a.len() / K).min(out.len() / n);
    for b in 0..nb {
        // SAFETY: block `b` < nb lies inside every row (34 bytes), and in each of the `runs`
        // runs of `out` (32 floats at `i * n + b * 32`); `a` holds `runs · K` values.
        unsafe {
            // v[c][k]: values 16c..16c+16 of row k's block, widened.
            let mut d = [0f32; K];
            let mut v = [[_mm512_setzero_ps(); K]; 2];
            for (k, dk) in d.iter_mut().enumerate() {
                let rp = rows[k].as_ptr().add(b * BlockQ8_0::BYTES);
                *dk = f16_at(rp);
                for (c, vc) in v.iter_mut().enumerate() {
                    let q = _mm_loadu_si128(rp.add(2 + 16 * c) as *const __m128i);
                    vc[k] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
                }
            }
            for i in 0..runs {
                let mut ad = [_mm512_setzero_ps(); K];
                for (k, adk) in ad.iter_mut().enumerate() {
                    *adk = _mm512_set1_ps(*a.get_unchecked(i * K + k) * d[k]);
                }
                let op = out.as_mut_ptr().add(i * n + b * QK);
                for (c, vc) in v.iter().enumerate() {
                    let mut o = _mm512_loadu_ps(op.add(16 * c));
                    for (adk, vck) in ad.iter().zip(vc) {
                        o = _mm512_fmadd_ps(*adk, *vck, o);
                    }
                    _mm512_storeu_ps(op.add(16 * c), o);
                }
            }
        }
    }
}

/// `K` rows at a time, so that their widened blocks stay in registers.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_q8_0_avx2<const K: usize>(out: &mut [f32], a: &[f32], rows: [&[u8]; K]) {
    let nb = super::q8_0_blocks(&rows);
    let n = nb * QK;
    if n == 0 {
        return;
    }
    let runs = (a.len() / K).min(out.len() / n);
    for b in 0..nb {
        // SAFETY: block `b` < nb lies inside every row (34 bytes), and in each of the `runs`
        // runs of `out` (32 floats at `i * n + b * 32`); `a` holds `runs · K` values.
        unsafe {
            // v[c][k]: values 8c..8c+8 of row k's block, widened.
            let mut d = [0f32; K];
            let mut v = [[_mm256_setzero_ps(); K]; 4];
            for (k, dk) in d.iter_mut().enumerate() {
                let rp = rows[k].as_ptr().add(b * BlockQ8_0::BYTES);
                *dk = f16_at(rp);
                for (c, vc) in v.iter_mut().enumerate() {
                    let q = _mm_loadl_epi64(rp.add(2 + 8 * c) as *const __m128i);
                    vc[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                }
            }
            for i in 0..runs {
                let mut ad = [_mm256_setzero_ps(); K];
                for (k, adk) in ad.iter_mut().enumerate() {
                    *adk = _mm256_set1_ps(*a.get_unchecked(i * K + k) * d[k]);
                }
                let op = out.as_mut_ptr().add(i * n + b * QK);
                for (c, vc) in v.iter().enumerate() {
                    let mut o = _mm256_loadu_ps(op.add(8 * c));
                    for (adk, vck) in ad.iter().zip(vc) {
                        o = _mm256_fmadd_ps(*adk, *vck, o);
                    }
                    _mm256_storeu_ps(op.add(8 * c), o);
                }
            }
        }
    }
}

fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    // SAFETY: this table is used only when `available()` reported AVX2, FMA and F16C.
    unsafe { quantize_q8_0_avx2(x, out) }
}

fn quantize_q16(x: &[f32], out: &mut [u8]) {
    // SAFETY: as above.
    unsafe { quantize_q16_avx2(x, out) }
}

/// R weight rows in format `W` against N rows of Q16 activations.
fn dot<W: Unpack, const R: usize, const N: usize, const ISA: u8>(
    w: [&[u8]; R],
    xs: [&[u8]; N],
) -> [[f32; N]; R] {
    let nb = w
        .iter()
        .fold(usize::MAX, |n, w| n.min(blocks::<W>(w.len())));
    let nb = xs.iter().fold(nb, |n, x| n.min(x.len() / BlockQ16::BYTES));
    // SAFETY: `Kernels::best` hands out each table only when its `*_available()` said yes; `nb`
    // whole blocks lie inside every slice.
    unsafe {
        match ISA {
            AVX512_VNNI => tile_avx512::<W, R, N>(nb, w, xs),
            AVX_VNNI => tile_vnni::<W, R, N>(nb, w, xs),
            _ => tile_avx2::<W, R, N>(nb, w, xs),
        }
    }
}

/// Packs blocks `b0 ..` of `PANEL` weight rows (see `super::panel`).
fn pack<W: Unpack>(rows: &PanelRows<'_>, b0: usize, out: &mut [u8]) {
    let nb = out.len() / PANEL_BLOCK_BYTES;
    let nb = rows
        .iter()
        .flatten()
        .fold(nb, |n, w| n.min(blocks::<W>(w.len()).saturating_sub(b0)));
    // SAFETY: CPU features as above; blocks `b0 .. b0 + nb` lie inside every row, and `nb`
    // packed blocks inside `out`.
    unsafe { pack_avx2::<W>(nb, rows, b0, out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_avx2<W: Unpack>(nb: usize, rows: &PanelRows<'_>, b0: usize, out: &mut [u8]) {
    let mut unit_scales = UnitScales::new();
    for b in 0..nb {
        // SAFETY: as the caller guarantees: block `b0 + b` inside every row, packed block `b`
        // inside `out`.
        unsafe {
            let o = out.as_mut_ptr().add(b * PANEL_BLOCK_BYTES);
            let q = o.add(PANEL_QUANTS) as *mut __m256i;
            let mut dm = [0f32; 2 * PANEL];
            let j0 = (b0 + b) % W::UNIT;
            if W::UNIT > 1 && (b == 0 || j0 == 0) {
                let units = core::array::from_fn(|r| match rows[r] {
                    Some(w) => unit::<W>(w.as_ptr(), b0 + b).0,
                    None => core::ptr::null(),
                });
                unit_scales.read::<W>(units);
            }
            // Eight rows at a time: lo[i] holds row i's pairs 0..8 (one per 32-bit lane), hi[i]
            // pairs 8..16; transposed, each vector holds one pair of the eight rows, the half
            // of a packed pair that belongs to them.
            for h in 0..PANEL / 8 {
                let mut lo = [_mm256_setzero_si256(); 8];
                let mut hi = [_mm256_setzero_si256(); 8];
                for i in 0..8 {
                    let r = 8 * h + i;
                    if let Some(w) = rows[r] {
                        let (p, j) = unit::<W>(w.as_ptr(), b0 + b);
                        // The next panel's rows: packing reads sixteen streams at a time, more
                        // than the hardware prefetcher follows.
                        let ahead = PANEL * w.len() + line_in_unit::<W>(j);
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead) as *const i8);
                        (lo[i], hi[i]) = W::unpack(p, j);
                        (dm[r], dm[PANEL + r]) = if W::UNIT > 1 {
                            unit_scales.one(j, r)
                        } else {
                            let (d, m) = W::scales(p, j);
                            (_mm256_cvtss_f32(d), _mm256_cvtss_f32(m))
                        };
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
#[inline(always)]
unsafe fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
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

/// `PANEL` weight rows against one row of Q16 activations, with the panel kernel's arithmetic.
fn panel_rows<W: Unpack, const ISA: u8>(w: [&[u8]; PANEL], x: &[u8]) -> [f32; PANEL] {
    let nb = w.iter().fold(x.len() / BlockQ16::BYTES, |n, w| {
        n.min(blocks::<W>(w.len()))
    });
    let mut out = [0f32; PANEL];
    // SAFETY: as for `dot`; `nb` whole blocks lie inside every slice.
    unsafe {
        match ISA {
            AVX512_VNNI => rows_avx512::<W>(nb, w, x, &mut out),
            AVX_VNNI => rows_vnni::<W>(nb, w, x, &mut out),
            _ => rows_avx2::<W>(nb, w, x, &mut out),
        }
    }
    out
}

/// A packed panel against `TILE` rows of Q16 activations.
fn panel<W: Unpack, const ISA: u8>(packed: &[u8], xs: [&[u8]; TILE], acc: &mut PanelAcc) {
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
            _ => {
                for h in 0..PANEL / 8 {
                    panel_avx2::<W>(nb, packed, xs, acc, h);
                }
            }
        }
    }
}

fn dot_f16<const N: usize>(w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
    let n = xs.iter().fold(w.len() / 2, |n, x| n.min(x.len()));
    // SAFETY: CPU features as above; `n` values lie inside `w` (as bytes) and every `xs[i]`.
    unsafe { dot_f16_avx2(n, w, xs) }
}

fn dot_f32<const N: usize>(w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
    let n = xs.iter().fold(w.len() / 4, |n, x| n.min(x.len()));
    // SAFETY: CPU features as above; `n` values lie inside `w` (as bytes) and every `xs[i]`.
    unsafe { dot_f32_avx2(n, w, xs) }
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees two readable bytes at `p` and F16C.
    unsafe {
        let bits = (p as *const u16).read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    // SAFETY: register-only arithmetic; the caller has AVX.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

/// The horizontal sums of `N` accumulators. A plain loop: closures do not inherit the enclosing
/// function's target features, so `map(|a| hsum(a))` would call the intrinsics out of line.
#[inline(always)]
unsafe fn hsums<const N: usize>(acc: [__m256; N]) -> [f32; N] {
    let mut out = [0f32; N];
    for i in 0..N {
        // SAFETY: register-only; the caller has AVX.
        out[i] = unsafe { hsum(acc[i]) };
    }
    out
}

/// A weight block's 32 quants as two vectors of 16 `i16` (values 0..16, 16..32). Blocks are
/// stored in units of `BYTES` bytes: one block, or a k-quant super-block of `UNIT` blocks, where
/// `j` says which.
trait Unpack {
    const BYTES: usize;
    /// Blocks of 32 values per unit.
    const UNIT: usize = 1;
    /// Whether the block has a minimum whose term `m·(dx·Σq)` is added.
    const HAS_MIN: bool = false;
    /// Whether the "minimum" is the scale of the block's second half instead (Q6_K), whose
    /// halves are summed and scaled apart.
    const HALF_SCALES: bool = false;
    /// The quants of block `j` of the unit at `p`.
    ///
    /// # Safety
    /// `BYTES` readable bytes at `p`, `j < UNIT`; the caller has AVX2.
    unsafe fn unpack(p: *const u8, j: usize) -> (__m256i, __m256i);

    /// The scale and the minimum (zero without one) of block `j` of the unit at `p`, broadcast.
    ///
    /// # Safety
    /// As for `unpack`, and F16C.
    #[inline(always)]
    unsafe fn scales(p: *const u8, _j: usize) -> (__m256, __m256) {
        // SAFETY: the block starts with its f16 scale.
        unsafe { (_mm256_set1_ps(f16_at(p)), _mm256_setzero_ps()) }
    }

    /// The scales and the minimums (zeros without) of the blocks at `p[0..8]`, one per lane.
    /// Single-block units only: a kernel reads a k-quant's scales with `unit_scales`.
    ///
    /// # Safety
    /// As for `scales`, at every `p[i]`.
    #[inline(always)]
    unsafe fn scales8(p: [*const u8; 8], _j: usize) -> (__m256, __m256) {
        debug_assert_eq!(Self::UNIT, 1);
        // SAFETY: each block starts with its f16 scale.
        unsafe { (f16s_at(p, 0), _mm256_setzero_ps()) }
    }

    /// The scales and minimums of the `UNIT` blocks of the k-quant super-block at `p`.
    ///
    /// # Safety
    /// `BYTES` readable bytes at `p`.
    #[inline(always)]
    unsafe fn unit_scales(_p: *const u8) -> ([f32; BLOCKS_PER_SUPER], [f32; BLOCKS_PER_SUPER]) {
        unreachable!("single-block formats have no super-blocks")
    }
}

/// The scales of a k-quant super-block's eight blocks for each row of a panel, read once per
/// super-block (`KBlock::unit_scales`) instead of once per block: `d[j][r]`, `m[j][r]`.
struct UnitScales {
    d: [[f32; PANEL]; BLOCKS_PER_SUPER],
    m: [[f32; PANEL]; BLOCKS_PER_SUPER],
}

impl UnitScales {
    #[inline(always)]
    fn new() -> Self {
        UnitScales {
            d: [[0.0; PANEL]; BLOCKS_PER_SUPER],
            m: [[0.0; PANEL]; BLOCKS_PER_SUPER],
        }
    }

    /// Reads the super-blocks at `units` (a null pointer: a padding row, scales zero).
    ///
    /// # Safety
    /// `W::BYTES` readable bytes at every non-null `units[r]`.
    #[inline(always)]
    unsafe fn read<W: Unpack>(&mut self, units: [*const u8; PANEL]) {
        for (r, p) in units.into_iter().enumerate() {
            let (d, m) = if p.is_null() {
                Default::default()
            } else {
                // SAFETY: as the caller guarantees.
                unsafe { W::unit_scales(p) }
            };
            for j in 0..BLOCKS_PER_SUPER {
                self.d[j][r] = d[j];
                self.m[j][r] = m[j];
            }
        }
    }

    /// Block `j`'s scale and minimum of row `r`.
    #[inline(always)]
    fn one(&self, j: usize, r: usize) -> (f32, f32) {
        (self.d[j][r], self.m[j][r])
    }

    /// Block `j`'s scales and minimums of rows `8h .. 8h + 8`, one per lane.
    #[inline(always)]
    unsafe fn eight(&self, j: usize, h: usize) -> (__m256, __m256) {
        // SAFETY: loads of eight floats inside the arrays (h < PANEL / 8); the caller has AVX.
        unsafe {
            (
                _mm256_loadu_ps(self.d[j][8 * h..].as_ptr()),
                _mm256_loadu_ps(self.m[j][8 * h..].as_ptr()),
            )
        }
    }
}

/// Where in its unit block `j` prefetches: each block of a k-quant super-block a cache line
/// further (the last byte once past the end), so that the blocks together cover the super-block;
/// a single-block unit at its start.
#[inline(always)]
fn line_in_unit<W: Unpack>(j: usize) -> usize {
    (j * 64).min(W::BYTES - 1)
}

/// Whole blocks in `len` bytes of format `W`.
#[inline(always)]
fn blocks<W: Unpack>(len: usize) -> usize {
    len / W::BYTES * W::UNIT
}

/// The unit holding block `b` of the row at `row`, and the block's index in it.
///
/// # Safety
/// Block `b` lies inside the row.
#[inline(always)]
unsafe fn unit<W: Unpack>(row: *const u8, b: usize) -> (*const u8, usize) {
    // SAFETY: as the caller guarantees.
    unsafe { (row.add(b / W::UNIT * W::BYTES), b % W::UNIT) }
}

/// `acc + Σ_lo·(d_lo·dx) + Σ_hi·(d_hi·dx)`: a block whose halves have their own scales, low half
/// first (every kernel adds them in this order, so all give the same bits).
#[inline(always)]
unsafe fn half_sums(
    lo: __m256i,
    hi: __m256i,
    d_lo: __m256,
    d_hi: __m256,
    dx: __m256,
    acc: __m256,
) -> __m256 {
    // SAFETY: register-only; the caller has AVX2 and FMA.
    unsafe {
        let acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_mul_ps(d_lo, dx), acc);
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_mul_ps(d_hi, dx), acc)
    }
}

/// The f16s at byte `offset` of `p[0..8]`, widened, one per lane.
///
/// # Safety
/// Two readable bytes at each `p[i] + offset`; F16C.
#[inline(always)]
unsafe fn f16s_at(p: [*const u8; 8], offset: usize) -> __m256 {
    // SAFETY: as the caller guarantees.
    unsafe {
        let h = |i: usize| (p[i].add(offset) as *const i16).read_unaligned();
        _mm256_cvtph_ps(_mm_setr_epi16(
            h(0),
            h(1),
            h(2),
            h(3),
            h(4),
            h(5),
            h(6),
            h(7),
        ))
    }
}

impl Unpack for BlockQ8_0 {
    const BYTES: usize = Self::BYTES;
    #[inline(always)]
    unsafe fn unpack(p: *const u8, _j: usize) -> (__m256i, __m256i) {
        // SAFETY: 32 quants follow the 2-byte scale.
        unsafe {
            (
                _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(2) as *const __m128i)),
                _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(18) as *const __m128i)),
            )
        }
    }
}

impl Unpack for BlockQ4_0 {
    const BYTES: usize = Self::BYTES;
    #[inline(always)]
    unsafe fn unpack(p: *const u8, _j: usize) -> (__m256i, __m256i) {
        // SAFETY: 16 bytes of nibbles follow the 2-byte scale.
        unsafe {
            let (lo, hi) = nibbles(p.add(2));
            let eight = _mm256_set1_epi16(8);
            (_mm256_sub_epi16(lo, eight), _mm256_sub_epi16(hi, eight))
        }
    }
}

impl Unpack for BlockQ4_1 {
    const BYTES: usize = Self::BYTES;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn scales(p: *const u8, _j: usize) -> (__m256, __m256) {
        // SAFETY: the block starts with its scale and minimum.
        unsafe { scale_min(p) }
    }
    #[inline(always)]
    unsafe fn scales8(p: [*const u8; 8], _j: usize) -> (__m256, __m256) {
        // SAFETY: each block starts with its scale and minimum.
        unsafe { (f16s_at(p, 0), f16s_at(p, 2)) }
    }
    #[inline(always)]
    unsafe fn unpack(p: *const u8, _j: usize) -> (__m256i, __m256i) {
        // SAFETY: 16 bytes of nibbles follow the scale and the minimum.
        unsafe { nibbles(p.add(4)) }
    }
}

impl Unpack for BlockQ5_0 {
    const BYTES: usize = Self::BYTES;
    #[inline(always)]
    unsafe fn unpack(p: *const u8, _j: usize) -> (__m256i, __m256i) {
        // SAFETY: the fifth bits (4 bytes) follow the 2-byte scale, the nibbles (16) them.
        unsafe {
            let (lo, hi) = fives(p.add(2), p.add(6));
            let sixteen = _mm256_set1_epi16(16);
            (_mm256_sub_epi16(lo, sixteen), _mm256_sub_epi16(hi, sixteen))
        }
    }
}

impl Unpack for BlockQ5_1 {
    const BYTES: usize = Self::BYTES;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn scales(p: *const u8, _j: usize) -> (__m256, __m256) {
        // SAFETY: the block starts with its scale and minimum.
        unsafe { scale_min(p) }
    }
    #[inline(always)]
    unsafe fn scales8(p: [*const u8; 8], _j: usize) -> (__m256, __m256) {
        // SAFETY: each block starts with its scale and minimum.
        unsafe { (f16s_at(p, 0), f16s_at(p, 2)) }
    }
    #[inline(always)]
    unsafe fn unpack(p: *const u8, _j: usize) -> (__m256i, __m256i) {
        // SAFETY: the fifth bits (4 bytes) follow the scale and minimum, the nibbles (16) them.
        unsafe { fives(p.add(4), p.add(8)) }
    }
}

impl Unpack for BlockQ4K {
    const BYTES: usize = <Self as KBlock>::BYTES;
    const UNIT: usize = BLOCKS_PER_SUPER;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn unpack(p: *const u8, j: usize) -> (__m256i, __m256i) {
        // SAFETY: block j's 32 bytes of nibbles lie in the super-block.
        unsafe { bits32(p.add(16 + 32 * (j / 2)), 4 * (j % 2), 0x0f) }
    }
    #[inline(always)]
    unsafe fn scales(p: *const u8, j: usize) -> (__m256, __m256) {
        // SAFETY: the caller guarantees a whole super-block at `p`.
        unsafe { k_scales::<Self>(p, j) }
    }
    #[inline(always)]
    unsafe fn unit_scales(p: *const u8) -> ([f32; BLOCKS_PER_SUPER], [f32; BLOCKS_PER_SUPER]) {
        // SAFETY: the caller guarantees a whole super-block at `p`.
        unsafe { k_unit_scales::<Self>(p) }
    }
}

impl Unpack for BlockQ5K {
    const BYTES: usize = <Self as KBlock>::BYTES;
    const UNIT: usize = BLOCKS_PER_SUPER;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn unpack(p: *const u8, j: usize) -> (__m256i, __m256i) {
        // SAFETY: the nibbles (at 48) and the fifth bits (32 bytes at 16) lie in the super-block.
        unsafe {
            let low = bytes32(p.add(48 + 32 * (j / 2)), 4 * (j % 2), 0x0f);
            let high = bytes32(p.add(16), j, 1);
            widen_u8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)))
        }
    }
    #[inline(always)]
    unsafe fn scales(p: *const u8, j: usize) -> (__m256, __m256) {
        // SAFETY: the caller guarantees a whole super-block at `p`.
        unsafe { k_scales::<Self>(p, j) }
    }
    #[inline(always)]
    unsafe fn unit_scales(p: *const u8) -> ([f32; BLOCKS_PER_SUPER], [f32; BLOCKS_PER_SUPER]) {
        // SAFETY: the caller guarantees a whole super-block at `p`.
        unsafe { k_unit_scales::<Self>(p) }
    }
}

impl Unpack for BlockQ6K {
    const BYTES: usize = <Self as KBlock>::BYTES;
    const UNIT: usize = BLOCKS_PER_SUPER;
    const HALF_SCALES: bool = true;
    /// Block `j` is quarter `c` of half `n` (see `KBlock for BlockQ6K`).
    #[inline(always)]
    unsafe fn unpack(p: *const u8, j: usize) -> (__m256i, __m256i) {
        let (n, c) = (j / 4, j % 4);
        // SAFETY: the low bits (32 bytes at 64n + 32(c % 2)) and the high bits (32 bytes at
        // 128 + 32n) lie in the super-block.
        unsafe {
            let low = bytes32(p.add(64 * n + 32 * (c % 2)), 4 * (c / 2), 0x0f);
            let high = bytes32(p.add(128 + 32 * n), 2 * c, 3);
            let q = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
            widen_i8(_mm256_sub_epi8(q, _mm256_set1_epi8(32)))
        }
    }
    #[inline(always)]
    unsafe fn scales(p: *const u8, j: usize) -> (__m256, __m256) {
        // SAFETY: the caller guarantees a whole super-block at `p`.
        unsafe { k_scales::<Self>(p, j) }
    }
    #[inline(always)]
    unsafe fn unit_scales(p: *const u8) -> ([f32; BLOCKS_PER_SUPER], [f32; BLOCKS_PER_SUPER]) {
        // SAFETY: the caller guarantees a whole super-block at `p`.
        unsafe { k_unit_scales::<Self>(p) }
    }
}

/// `KBlock::unit_scales` of the super-block at `p`, its f16s widened with F16C (the portable
/// conversion costs more than the rest of the scales).
///
/// # Safety
/// `K::BYTES` readable bytes at `p`; F16C.
#[inline(always)]
unsafe fn k_unit_scales<K: KBlock>(
    p: *const u8,
) -> ([f32; BLOCKS_PER_SUPER], [f32; BLOCKS_PER_SUPER]) {
    let (d, dmin) = K::F16_AT;
    // SAFETY: as the caller guarantees; the f16s lie inside the super-block.
    unsafe {
        let sb = core::slice::from_raw_parts(p, K::BYTES);
        K::unit_scales_from(sb, f16_at(p.add(d)), f16_at(p.add(dmin)))
    }
}

/// Block `j`'s two scales from the super-block at `p` (`KBlock::scales`), broadcast.
///
/// # Safety
/// `K::BYTES` readable bytes at `p`.
#[inline(always)]
unsafe fn k_scales<K: KBlock>(p: *const u8, j: usize) -> (__m256, __m256) {
    // SAFETY: as the caller guarantees.
    let (d, m) = K::scales(unsafe { core::slice::from_raw_parts(p, K::BYTES) }, j);
    // SAFETY: register-only; the caller has AVX.
    unsafe { (_mm256_set1_ps(d), _mm256_set1_ps(m)) }
}

/// `(byte >> shift) & mask` of each of the 32 bytes at `p`, kept as bytes. The shift runs on
/// 16-bit lanes; the mask drops what crossed from the neighbouring byte, and a shift left by up
/// to 4 of the result (at most 3 bits wide) stays inside each byte.
///
/// # Safety
/// 32 readable bytes at `p`; AVX2.
#[inline(always)]
unsafe fn bytes32(p: *const u8, shift: usize, mask: i8) -> __m256i {
    // SAFETY: as the caller guarantees.
    unsafe {
        let v = _mm256_loadu_si256(p as *const __m256i);
        let v = _mm256_srl_epi16(v, _mm_cvtsi32_si128(shift as i32));
        _mm256_and_si256(v, _mm256_set1_epi8(mask))
    }
}

/// 32 unsigned bytes as `i16` (values 0..16, 16..32).
#[inline(always)]
unsafe fn widen_u8(v: __m256i) -> (__m256i, __m256i) {
    // SAFETY: register-only; the caller has AVX2.
    unsafe {
        (
            _mm256_cvtepu8_epi16(_mm256_castsi256_si128(v)),
            _mm256_cvtepu8_epi16(_mm256_extracti128_si256(v, 1)),
        )
    }
}

/// 32 signed bytes as `i16` (values 0..16, 16..32).
#[inline(always)]
unsafe fn widen_i8(v: __m256i) -> (__m256i, __m256i) {
    // SAFETY: register-only; the caller has AVX2.
    unsafe {
        (
            _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)),
            _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)),
        )
    }
}

/// `(byte >> shift) & mask` of each of the 32 bytes at `p`, as `i16` (values 0..16, 16..32):
/// nibbles, or a k-quant's high bits.
///
/// # Safety
/// 32 readable bytes at `p`; AVX2.
#[inline(always)]
unsafe fn bits32(p: *const u8, shift: usize, mask: i16) -> (__m256i, __m256i) {
    // SAFETY: as the caller guarantees.
    unsafe {
        let count = _mm_cvtsi32_si128(shift as i32);
        let mask = _mm256_set1_epi16(mask);
        let v0 = _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i));
        let v1 = _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(16) as *const __m128i));
        (
            _mm256_and_si256(_mm256_srl_epi16(v0, count), mask),
            _mm256_and_si256(_mm256_srl_epi16(v1, count), mask),
        )
    }
}

/// The scale and the minimum, two f16s at `p`, broadcast: one conversion.
///
/// # Safety
/// Four readable bytes at `p`; AVX2 and F16C.
#[inline(always)]
unsafe fn scale_min(p: *const u8) -> (__m256, __m256) {
    // SAFETY: as the caller guarantees.
    unsafe {
        let bits = (p as *const i32).read_unaligned();
        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
        (
            _mm256_broadcastss_ps(dm),
            _mm256_broadcastss_ps(_mm_movehdup_ps(dm)),
        )
    }
}

/// The five-bit quants of a Q5 block whose fifth bits (a little-endian u32) are at `qh` and
/// nibbles at `qs`, as `i16` (values 0..16, 16..32): bit `j` of `qh` tested in lane `j % 16` of
/// the half that holds element `j`.
///
/// # Safety
/// Four readable bytes at `qh`, sixteen at `qs`; AVX2.
#[inline(always)]
unsafe fn fives(qh: *const u8, qs: *const u8) -> (__m256i, __m256i) {
    // SAFETY: as the caller guarantees.
    unsafe {
        let (lo, hi) = nibbles(qs);
        let bits = (qh as *const u32).read_unaligned();
        let lanes = _mm256_setr_epi16(
            1,
            2,
            4,
            8,
            16,
            32,
            64,
            128,
            256,
            512,
            1024,
            2048,
            4096,
            8192,
            16384,
            i16::MIN,
        );
        let sixteen = _mm256_set1_epi16(16);
        let bits_lo = _mm256_and_si256(_mm256_set1_epi16(bits as u16 as i16), lanes);
        let bits_hi = _mm256_and_si256(_mm256_set1_epi16((bits >> 16) as u16 as i16), lanes);
        let fifth_lo = _mm256_and_si256(_mm256_cmpeq_epi16(bits_lo, lanes), sixteen);
        let fifth_hi = _mm256_and_si256(_mm256_cmpeq_epi16(bits_hi, lanes), sixteen);
        (_mm256_or_si256(lo, fifth_lo), _mm256_or_si256(hi, fifth_hi))
    }
}

/// The low nibbles of 16 bytes (values 0..16) and their high nibbles (16..32), as `i16`.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller guarantees 16 readable bytes at `p` and AVX2.
    unsafe {
        let v = _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i));
        (
            _mm256_and_si256(v, _mm256_set1_epi16(0x0f)),
            _mm256_srli_epi16(v, 4),
        )
    }
}

/// The largest |x| of a block, NaN ignored (`max` keeps its second operand when the first is NaN,
/// as the scalar fold does).
#[inline(always)]
unsafe fn block_amax(v: [__m256; 4]) -> f32 {
    // SAFETY: register-only arithmetic; the caller has AVX.
    unsafe {
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_setzero_ps();
        for vi in v {
            m = _mm256_max_ps(_mm256_andnot_ps(sign, vi), m);
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        _mm_cvtss_f32(m4)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q16_avx2(x: &[f32], out: &mut [u8]) {
    let nb = (x.len() / QK).min(out.len() / BlockQ16::BYTES);
    for b in 0..nb {
        // SAFETY: block `b` < nb lies inside `x` (32 floats) and `out` (72 bytes).
        unsafe {
            let p = x.as_ptr().add(b * QK);
            let v: [__m256; 4] = core::array::from_fn(|i| _mm256_loadu_ps(p.add(8 * i)));
            let d = block_amax(v) / BlockQ16::MAX;
            let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
            let (lo, hi) = (
                _mm256_set1_ps(-BlockQ16::MAX),
                _mm256_set1_ps(BlockQ16::MAX),
            );
            let mut ints = [_mm256_setzero_si256(); 4];
            for i in 0..4 {
                let s = _mm256_mul_ps(v[i], id);
                // NaN to 0, then clamp; the conversion rounds to nearest even like `rintf`.
                let s = _mm256_and_ps(s, _mm256_cmp_ps(s, s, _CMP_ORD_Q));
                ints[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(s, lo), hi));
            }
            let total = _mm256_add_epi32(
                _mm256_add_epi32(ints[0], ints[1]),
                _mm256_add_epi32(ints[2], ints[3]),
            );
            let t4 = _mm_add_epi32(
                _mm256_castsi256_si128(total),
                _mm256_extracti128_si256(total, 1),
            );
            let t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0b01_00_11_10));
            let t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0b10_11_00_01));
            let sum = _mm_cvtsi128_si32(t4);
            // packs interleaves the 128-bit lanes of its operands; the permute restores order.
            let q01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(ints[0], ints[1]), 0b11_01_10_00);
            let q23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(ints[2], ints[3]), 0b11_01_10_00);
            let o = out.as_mut_ptr().add(b * BlockQ16::BYTES);
            (o as *mut f32).write_unaligned(d);
            (o.add(4) as *mut f32).write_unaligned(d * sum as f32);
            _mm256_storeu_si256(o.add(8) as *mut __m256i, q01);
            _mm256_storeu_si256(o.add(40) as *mut __m256i, q23);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_0_avx2(x: &[f32], out: &mut [u8]) {
    let nb = (x.len() / QK).min(out.len() / BlockQ8_0::BYTES);
    let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for b in 0..nb {
        // SAFETY: block `b` < nb lies inside `x` (32 floats) and `out` (34 bytes).
        unsafe {
            let p = x.as_ptr().add(b * QK);
            let v: [__m256; 4] = core::array::from_fn(|i| _mm256_loadu_ps(p.add(8 * i)));
            let amax = block_amax(v);

            let d = amax / 127.0;
            let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
            let mut ints = [_mm256_setzero_si256(); 4];
            for (q, vi) in ints.iter_mut().zip(v) {
                *q = _mm256_cvtps_epi32(round_q8(_mm256_mul_ps(vi, id)));
            }
            let i01 = _mm256_packs_epi32(ints[0], ints[1]);
            let i23 = _mm256_packs_epi32(ints[2], ints[3]);
            let q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(i01, i23), perm);

            let o = out.as_mut_ptr().add(b * BlockQ8_0::BYTES);
            let dh = _mm_cvtps_ph(_mm_set_ss(d), _MM_FROUND_TO_NEAREST_INT);
            (o as *mut u16).write_unaligned(_mm_extract_epi16(dh, 0) as u16);
            _mm256_storeu_si256(o.add(2) as *mut __m256i, q);
        }
    }
}

/// Rounds half away from zero (C's `roundf`), maps NaN to 0 and clamps to ±127, exactly as the
/// scalar quantizer does: truncate, then step away from zero where the dropped part is >= 0.5.
#[inline(always)]
unsafe fn round_q8(v: __m256) -> __m256 {
    // SAFETY: register-only arithmetic; the caller has AVX.
    unsafe {
        let t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        let frac = _mm256_andnot_ps(_mm256_set1_ps(-0.0), _mm256_sub_ps(v, t));
        let away = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5), _CMP_GE_OQ);
        let one = _mm256_or_ps(_mm256_and_ps(v, _mm256_set1_ps(-0.0)), _mm256_set1_ps(1.0));
        let r = _mm256_add_ps(t, _mm256_and_ps(away, one));
        let r = _mm256_and_ps(r, _mm256_cmp_ps(r, r, _CMP_ORD_Q));
        _mm256_min_ps(
            _mm256_max_ps(r, _mm256_set1_ps(-127.0)),
            _mm256_set1_ps(127.0),
        )
    }
}

// The one-row quantized dots (the table's `one`, `x4`, `rows4`, `rows2x4`; mat-muls and
// attention use the panel kernels further down): R weight rows against N activation rows, one
// accumulator per (row, token), blocks added in order. Every tile shape therefore gives a
// (row, token) pair the same sum. Independent FMA chains, which hide the FMA's four-cycle
// latency, come from several rows and tokens per tile.

/// How far ahead of the block in use the weight stream is prefetched, in bytes. A single core's
/// hardware prefetcher does not keep up with one weight stream on its own: measured on SmolLM2
/// Q8_0 decode (2 threads), no prefetch gave 67 tokens/s, 512 bytes 76, 2048 to 8192 bytes 95-104.
const PREFETCH: usize = 4096;

#[inline(always)]
unsafe fn tile<W: Unpack, const R: usize, const N: usize, const ISA: u8>(
    nb: usize,
    w: [&[u8]; R],
    xs: [&[u8]; N],
) -> [[f32; N]; R] {
    // SAFETY: the caller guarantees `nb` whole blocks in every slice, AVX2/FMA/F16C, and the
    // features of `ISA`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); N]; R];
        for b in 0..nb {
            let mut dw = [_mm256_setzero_ps(); R];
            let mut mw = [_mm256_setzero_ps(); R];
            let mut qw = [(_mm256_setzero_si256(), _mm256_setzero_si256()); R];
            for r in 0..R {
                let (wp, j) = unit::<W>(w[r].as_ptr(), b);
                let ahead = PREFETCH + line_in_unit::<W>(j);
                _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(ahead) as *const i8);
                (dw[r], mw[r]) = W::scales(wp, j);
                qw[r] = W::unpack(wp, j);
            }
            for t in 0..N {
                let xp = xs[t].as_ptr().add(b * BlockQ16::BYTES);
                let dx = _mm256_set1_ps((xp as *const f32).read_unaligned());
                // The minimum's term m·s is spread over the eight lanes, s/8 each (exact), so
                // that it stays a vector FMA.
                let s8 = _mm256_set1_ps((xp.add(4) as *const f32).read_unaligned() * 0.125);
                let x0 = _mm256_loadu_si256(xp.add(8) as *const __m256i);
                let x1 = _mm256_loadu_si256(xp.add(40) as *const __m256i);
                for r in 0..R {
                    if W::HALF_SCALES {
                        // Each half's sum with its own scale, low half first.
                        let lo = _mm256_cvtepi32_ps(_mm256_madd_epi16(qw[r].0, x0));
                        let hi = _mm256_cvtepi32_ps(_mm256_madd_epi16(qw[r].1, x1));
                        acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(lo, dx), dw[r], acc[r][t]);
                        acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(hi, dx), mw[r], acc[r][t]);
                        continue;
                    }
                    let dot = _mm256_madd_epi16(qw[r].0, x0);
                    let dot = match ISA {
                        AVX512_VNNI | AVX_VNNI => dpwssd::<ISA>(dot, qw[r].1, x1),
                        _ => _mm256_add_epi32(dot, _mm256_madd_epi16(qw[r].1, x1)),
                    };
                    // (Σ·dx)·dw: both scales stay vectors; dw·dx first would be a scalar
                    // multiply and a broadcast per (row, token).
                    let scaled = _mm256_mul_ps(_mm256_cvtepi32_ps(dot), dx);
                    acc[r][t] = _mm256_fmadd_ps(scaled, dw[r], acc[r][t]);
                    if W::HAS_MIN {
                        acc[r][t] = _mm256_fmadd_ps(mw[r], s8, acc[r][t]);
                    }
                }
            }
        }
        let mut out = [[0f32; N]; R];
        for r in 0..R {
            out[r] = hsums(acc[r]);
        }
        out
    }
}

/// `acc + Σ a·b` over each pair of i16 lanes, as eight i32: one `vpdpwssd`. In assembly because
/// LLVM splits the intrinsic back into `vpmaddwd` + `vpaddd`, an extra instruction per
/// (row, token, block) in the hottest loop.
#[inline(always)]
unsafe fn dpwssd<const ISA: u8>(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: the caller has the features of `ISA`.
    unsafe {
        if ISA == AVX512_VNNI {
            dpwssd_evex(acc, a, b)
        } else {
            dpwssd_vex(acc, a, b)
        }
    }
}

#[target_feature(enable = "avx2,avxvnni")]
#[inline]
unsafe fn dpwssd_vex(mut acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: register-only; AVX-VNNI as this function requires.
    unsafe {
        core::arch::asm!(
            "{{vex}} vpdpwssd {acc}, {a}, {b}",
            acc = inout(ymm_reg) acc,
            a = in(ymm_reg) a,
            b = in(ymm_reg) b,
            options(pure, nomem, nostack),
        );
    }
    acc
}

#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
#[inline]
unsafe fn dpwssd_evex(mut acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: register-only; AVX512-VNNI and AVX512VL as this function requires. The EVEX form
    // also reaches ymm16-31, which only the zmm register class offers (printed as ymm).
    unsafe {
        core::arch::asm!(
            "vpdpwssd {acc:y}, {a:y}, {b:y}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack),
        );
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2<W: Unpack, const R: usize, const N: usize>(
    nb: usize,
    w: [&[u8]; R],
    xs: [&[u8]; N],
) -> [[f32; N]; R] {
    // SAFETY: as the caller guarantees for this function.
    unsafe { tile::<W, R, N, AVX2>(nb, w, xs) }
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn tile_vnni<W: Unpack, const R: usize, const N: usize>(
    nb: usize,
    w: [&[u8]; R],
    xs: [&[u8]; N],
) -> [[f32; N]; R] {
    // SAFETY: as the caller guarantees for this function.
    unsafe { tile::<W, R, N, AVX_VNNI>(nb, w, xs) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile_avx512<W: Unpack, const R: usize, const N: usize>(
    nb: usize,
    w: [&[u8]; R],
    xs: [&[u8]; N],
) -> [[f32; N]; R] {
    // SAFETY: as the caller guarantees for this function.
    unsafe { tile::<W, R, N, AVX512_VNNI>(nb, w, xs) }
}

/// The 256-bit panel kernel (see `super::panel`) on rows `8h .. 8h + 8` of the panel: per block,
/// one integer sum per (row, token) in a lane of `isum[t]`, then `acc += Σ·(dw·dx)` and `m·s`
/// for the eight rows at once.
#[inline(always)]
unsafe fn panel_half<W: Unpack, const ISA: u8>(
    nb: usize,
    packed: &[u8],
    xs: [&[u8]; TILE],
    acc: &mut PanelAcc,
    h: usize,
) {
    // SAFETY: the caller guarantees `nb` whole blocks in `packed` and every `xs[t]`, h < 2,
    // AVX2/FMA, and the features of `ISA`.
    unsafe {
        let mut facc = [_mm256_setzero_ps(); TILE];
        for t in 0..TILE {
            facc[t] = _mm256_loadu_ps(acc[t].as_ptr().add(8 * h));
        }
        for b in 0..nb {
            let pb = packed.as_ptr().add(b * PANEL_BLOCK_BYTES);
            let mut xp = [pb; TILE];
            for t in 0..TILE {
                xp[t] = xs[t].as_ptr().add(b * BlockQ16::BYTES);
            }
            // Two sums per token, one per half of the block (pairs 0..8 and 8..16) and taken in
            // turn, so that enough `vpdpwssd`s are in flight to cover its latency; integer
            // addition is exact, so the split changes no result, and the halves are what
            // formats with half scales need apart.
            let mut split = [[_mm256_setzero_si256(); TILE]; 2];
            for p0 in 0..QK / 4 {
                for (s, sums) in split.iter_mut().enumerate() {
                    let p = p0 + s * QK / 4;
                    let wp = pb.add(PANEL_QUANTS + p * PANEL * 4 + h * 32);
                    let wv = _mm256_loadu_si256(wp as *const __m256i);
                    for t in 0..TILE {
                        let pair = (xp[t].add(8 + 4 * p) as *const i32).read_unaligned();
                        let xv = _mm256_set1_epi32(pair);
                        sums[t] = match ISA {
                            AVX_VNNI => dpwssd_vex(sums[t], wv, xv),
                            _ => _mm256_add_epi32(sums[t], _mm256_madd_epi16(wv, xv)),
                        };
                    }
                }
            }
            let dw = _mm256_loadu_ps(pb.add(h * 32) as *const f32);
            if W::HALF_SCALES {
                let dw_hi = _mm256_loadu_ps(pb.add(PANEL * 4 + h * 32) as *const f32);
                for t in 0..TILE {
                    let dx = _mm256_set1_ps((xp[t] as *const f32).read_unaligned());
                    let (lo, hi) = (split[0][t], split[1][t]);
                    facc[t] = half_sums(lo, hi, dw, dw_hi, dx, facc[t]);
                }
                continue;
            }
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

/// `panel_rows` for a decoded token: each row's block sum as the one-row kernels start it (eight
/// lanes of partial sums), then eight rows' lanes added across into one vector of eight block
/// sums, so that the block's scaling is the panel kernel's, lane for lane, in the same order.
#[inline(always)]
unsafe fn rows_tile<W: Unpack, const ISA: u8>(
    nb: usize,
    w: [&[u8]; PANEL],
    x: &[u8],
    out: &mut [f32; PANEL],
) {
    // SAFETY: the caller guarantees `nb` whole blocks in every slice, AVX2/FMA/F16C, and the
    // features of `ISA`.
    unsafe {
        let mut facc = [_mm256_setzero_ps(); PANEL / 8];
        let mut unit_scales = UnitScales::new();
        for b in 0..nb {
            let xp = x.as_ptr().add(b * BlockQ16::BYTES);
            let x0 = _mm256_loadu_si256(xp.add(8) as *const __m256i);
            let x1 = _mm256_loadu_si256(xp.add(40) as *const __m256i);
            let dx = _mm256_set1_ps((xp as *const f32).read_unaligned());
            let s = _mm256_set1_ps((xp.add(4) as *const f32).read_unaligned());
            if W::UNIT > 1 && b % W::UNIT == 0 {
                unit_scales.read::<W>(core::array::from_fn(|r| unit::<W>(w[r].as_ptr(), b).0));
            }
            for (h, acc) in facc.iter_mut().enumerate() {
                let mut wp = [xp; 8];
                let mut j = 0;
                let mut v = [_mm256_setzero_si256(); 8];
                let mut v_hi = [_mm256_setzero_si256(); 8];
                for r in 0..8 {
                    (wp[r], j) = unit::<W>(w[8 * h + r].as_ptr(), b);
                    // The same block of the next panel's row (the panel's rows are usually one
                    // run of memory, which a fixed distance would land inside).
                    let ahead = PANEL * w[8 * h + r].len() + line_in_unit::<W>(j);
                    _mm_prefetch::<_MM_HINT_T0>(wp[r].wrapping_add(ahead) as *const i8);
                    let (lo, hi) = W::unpack(wp[r], j);
                    let dot = _mm256_madd_epi16(lo, x0);
                    if W::HALF_SCALES {
                        v[r] = dot;
                        v_hi[r] = _mm256_madd_epi16(hi, x1);
                        continue;
                    }
                    v[r] = match ISA {
                        AVX512_VNNI | AVX_VNNI => dpwssd::<ISA>(dot, hi, x1),
                        _ => _mm256_add_epi32(dot, _mm256_madd_epi16(hi, x1)),
                    };
                }
                let (dw, mw) = if W::UNIT > 1 {
                    unit_scales.eight(j, h)
                } else {
                    W::scales8(wp, j)
                };
                if W::HALF_SCALES {
                    *acc = half_sums(sum_across8(v), sum_across8(v_hi), dw, mw, dx, *acc);
                    continue;
                }
                let isum = sum_across8(v);
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, dx), *acc);
                if W::HAS_MIN {
                    *acc = _mm256_fmadd_ps(mw, s, *acc);
                }
            }
        }
        for (h, acc) in facc.iter().enumerate() {
            _mm256_storeu_ps(out.as_mut_ptr().add(8 * h), *acc);
        }
    }
}

/// Lane `r` of the result: the sum of `v[r]`'s eight lanes.
#[inline(always)]
unsafe fn sum_across8(v: [__m256i; 8]) -> __m256i {
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

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_avx2<W: Unpack>(nb: usize, w: [&[u8]; PANEL], x: &[u8], out: &mut [f32; PANEL]) {
    // SAFETY: as the caller guarantees for this function.
    unsafe { rows_tile::<W, AVX2>(nb, w, x, out) }
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn rows_vnni<W: Unpack>(nb: usize, w: [&[u8]; PANEL], x: &[u8], out: &mut [f32; PANEL]) {
    // SAFETY: as the caller guarantees for this function.
    unsafe { rows_tile::<W, AVX_VNNI>(nb, w, x, out) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_avx512<W: Unpack>(nb: usize, w: [&[u8]; PANEL], x: &[u8], out: &mut [f32; PANEL]) {
    // SAFETY: as the caller guarantees for this function.
    unsafe { rows_tile::<W, AVX512_VNNI>(nb, w, x, out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn panel_avx2<W: Unpack>(
    nb: usize,
    packed: &[u8],
    xs: [&[u8]; TILE],
    acc: &mut PanelAcc,
    h: usize,
) {
    // SAFETY: as the caller guarantees for this function.
    unsafe { panel_half::<W, AVX2>(nb, packed, xs, acc, h) }
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn panel_vnni<W: Unpack>(
    nb: usize,
    packed: &[u8],
    xs: [&[u8]; TILE],
    acc: &mut PanelAcc,
    h: usize,
) {
    // SAFETY: as the caller guarantees for this function.
    unsafe { panel_half::<W, AVX_VNNI>(nb, packed, xs, acc, h) }
}

/// The 512-bit panel kernel: as `panel_half`, all sixteen rows in one vector, four sums per
/// token in flight. The same integer sums and float operations per lane, so the same bits.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn panel_avx512<W: Unpack>(nb: usize, packed: &[u8], xs: [&[u8]; TILE], acc: &mut PanelAcc) {
    const SPLIT: usize = 4;
    // SAFETY: the caller guarantees `nb` whole blocks in `packed` and every `xs[t]`, and the
    // features enabled here.
    unsafe {
        let mut facc = [_mm512_setzero_ps(); TILE];
        for t in 0..TILE {
            facc[t] = _mm512_loadu_ps(acc[t].as_ptr());
        }
        for b in 0..nb {
            let pb = packed.as_ptr().add(b * PANEL_BLOCK_BYTES);
            let mut xp = [pb; TILE];
            for t in 0..TILE {
                xp[t] = xs[t].as_ptr().add(b * BlockQ16::BYTES);
            }
            // Four sums per token, one per quarter of the block: the first two make the low
            // half, the last two the high half.
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
            if W::HALF_SCALES {
                let dw_hi = _mm512_loadu_ps(pb.add(PANEL * 4) as *const f32);
                for t in 0..TILE {
                    let dx = _mm512_set1_ps((xp[t] as *const f32).read_unaligned());
                    let lo = _mm512_add_epi32(split[0][t], split[1][t]);
                    let hi = _mm512_add_epi32(split[2][t], split[3][t]);
                    let lo = _mm512_cvtepi32_ps(lo);
                    let hi = _mm512_cvtepi32_ps(hi);
                    facc[t] = _mm512_fmadd_ps(lo, _mm512_mul_ps(dw, dx), facc[t]);
                    facc[t] = _mm512_fmadd_ps(hi, _mm512_mul_ps(dw_hi, dx), facc[t]);
                }
                continue;
            }
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

/// `vpdpwssd` on 512-bit vectors, in assembly for the reason `dpwssd` gives.
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
unsafe fn dpwssd_zmm(mut acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    // SAFETY: register-only; AVX512-VNNI as this function requires.
    unsafe {
        core::arch::asm!(
            "vpdpwssd {acc}, {a}, {b}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack),
        );
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32_avx2<const N: usize>(n: usize, w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: values i..i+8 lie inside `w` (as bytes) and every `xs[k]`, since i + 8 <= n.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().wrapping_add(i * 4 + PREFETCH) as *const i8);
            let wv = _mm256_loadu_ps(w.as_ptr().add(i * 4) as *const f32);
            for (a, x) in acc.iter_mut().zip(&xs) {
                *a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.as_ptr().add(i)), *a);
            }
        }
        i += 8;
    }
    // SAFETY: register-only.
    let mut out = unsafe { hsums(acc) };
    for j in i..n {
        let b = &w[j * 4..j * 4 + 4];
        let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        for (o, x) in out.iter_mut().zip(&xs) {
            *o += v * x[j];
        }
    }
    out
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16_avx2<const N: usize>(n: usize, w: &[u8], xs: [&[f32]; N]) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: values i..i+8 lie inside `w` (as bytes) and every `xs[k]`, since i + 8 <= n.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().wrapping_add(i * 2 + PREFETCH) as *const i8);
            let wv = _mm256_cvtph_ps(_mm_loadu_si128(w.as_ptr().add(i * 2) as *const __m128i));
            for (a, x) in acc.iter_mut().zip(&xs) {
                *a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.as_ptr().add(i)), *a);
            }
        }
        i += 8;
    }
    // SAFETY: register-only.
    let mut out = unsafe { hsums(acc) };
    for j in i..n {
        // SAFETY: value j < n lies inside `w`.
        let v = unsafe { f16_at(w.as_ptr().add(j * 2)) };
        for (o, x) in out.iter_mut().zip(&xs) {
            *o += v * x[j];
        }
    }
    out
}
