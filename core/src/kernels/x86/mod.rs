//! AVX2 + FMA + F16C twins of `scalar`, with AVX-VNNI, AVX-512 and AMX variants of the quantized
//! dots.
//!
//! Each table is only handed out by `Kernels::best` after its `*_available()` said yes, which is
//! what makes the safe wrappers below sound.
//!
//! Split by concern, as ggml-cpu's `arch/x86`: this file detects the CPU's features and builds
//! the tables (and holds the register helpers all share); `unpack` turns each format's blocks
//! into `i16` quants and scales; `quants` holds the quantizers and the one-row dots; `kquants`
//! the k-quants' bytes and their dots with Q8K activations; `kpanel` their many-token kernels
//! (unpacking, transposing, the tile kernel); `panel` the
//! packing, the many-token panel kernels and their decoding twin; `amx` Q8_0's transposed tiles
//! on the tile unit, `kpanel_amx` the k-quants' tile kernel there; `axpy` attention's sum over V; `float` the f32/f16 dots and element-wise
//! kernels. A new format is an `Unpack` impl (a
//! k-quant: a `KBytes` impl) and a table entry.
use core::arch::x86_64::*;

mod amx;
mod axpy;
mod float;
mod kpanel;
mod kpanel_amx;
mod kquants;
mod panel;
mod quants;
mod unpack;

use axpy::*;
use float::*;
use kpanel::*;
use kquants::*;
use panel::*;
use quants::*;
use unpack::*;

use super::panel::{
    PANEL, PANEL_BLOCK_BYTES, PANEL_QUANTS, X8, X8_BLOCK_BYTES, X8_QUANTS, X8_ROWS,
};
use super::{
    Kernels, PanelAcc, PanelDots, PanelRows, QuantDots, WeightStrides, X8Layout, PANEL_MIN_TOKENS,
    TILE,
};
use crate::quant::k_quants::QK_K;
use crate::quant::{
    BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS, BlockIQ4NL,
    BlockIQ4XS, BlockQ16, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0,
    BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockTQ1_0, BlockTQ2_0, KBlock, QK,
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

/// Whether this CPU (and OS) also run AVX-512 F/BW/VL with AVX512-VNNI: the 256-bit kernels then
/// get 32 vector registers instead of 16, which ends the accumulators' spills in the tiles, and
/// the panel kernels, the transposed tiles and decoding (one token, or a tile of four) run on
/// 512-bit vectors.
pub fn avx512_available() -> bool {
    available() && cpuid_avx512::get() && __cpuid_count(7, 0).ecx & (1 << 11) != 0
}

/// Whether this CPU also has AMX-INT8 and the OS lets this process use it: Q8_0's mat-muls of
/// eight tokens or more (`amx`) and the k-quants' prefill (`kpanel_amx`) then run on the tile
/// unit.
pub fn amx_available() -> bool {
    amx::available()
}

/// Instruction-set levels of the tables below.
const AVX2: u8 = 0;

const AVX_VNNI: u8 = 1;

const AVX512_VNNI: u8 = 2;

pub(super) static KERNELS: Kernels = table::<AVX2>("avx2");

pub(super) static KERNELS_VNNI: Kernels = table::<AVX_VNNI>("avx2+vnni");

pub(super) static KERNELS_AVX512: Kernels = table::<AVX512_VNNI>("avx2+avx512vl");

pub(super) static KERNELS_AMX: Kernels = amx_table();

/// The AVX-512 table with Q8_0's transposed tiles and the k-quants' tile kernel on AMX: the same
/// integer sums, scaled in the same float steps, so the same bits.
const fn amx_table() -> Kernels {
    let mut k = table::<AVX512_VNNI>("avx2+avx512vl+amx");
    if let Some(p) = &mut k.q8_0.panel {
        // A tile unit multiplies eight tokens faster than the panels do sixteen: decode steps
        // of 16 and 32 sequences ran 1.23x and 1.06x faster on tiles, prefill of 512 tokens
        // 1.19x (SmolLM2; 1.13x TinyLlama-1.1B's shape, whose rows the tiles read from memory
        // again for each eight tokens and still win).
        p.pack_from = usize::MAX;
        p.x8_layout = X8Layout::Bytes;
        p.transpose_x8 = amx::transpose_x8;
        p.rows_x8 = amx::rows_x8_q8_0;
    }
    // The other formats of 32-quant blocks keep their panels from 16 tokens on; their decode
    // steps of 8 to 15 sequences unpack each block to bytes for the tile unit.
    unpacked_on_tiles::<BlockQ4_0>(&mut k.q4_0.panel);
    unpacked_on_tiles::<BlockQ4_1>(&mut k.q4_1.panel);
    unpacked_on_tiles::<BlockQ5_0>(&mut k.q5_0.panel);
    unpacked_on_tiles::<BlockQ5_1>(&mut k.q5_1.panel);
    unpacked_on_tiles::<BlockIQ4NL>(&mut k.iq4_nl.panel);
    // The k-quants' prefill: 512 tokens of TinyLlama-1.1B's shape, see BENCHMARKS.md.
    k.q2_k.k_panel = Some(kpanel_amx::k_panel::<BlockQ2K>());
    k.q3_k.k_panel = Some(kpanel_amx::k_panel::<BlockQ3K>());
    k.q4_k.k_panel = Some(kpanel_amx::k_panel::<BlockQ4K>());
    k.q5_k.k_panel = Some(kpanel_amx::k_panel::<BlockQ5K>());
    k.q6_k.k_panel = Some(kpanel_amx::k_panel::<BlockQ6K>());
    k.iq4_xs.k_panel = Some(kpanel_amx::k_panel::<BlockIQ4XS>());
    k.iq3_s.k_panel = Some(kpanel_amx::k_panel::<BlockIQ3S>());
    k.iq3_xxs.k_panel = Some(kpanel_amx::k_panel::<BlockIQ3XXS>());
    k.iq2_xxs.k_panel = Some(kpanel_amx::k_panel::<BlockIQ2XXS>());
    k.iq2_xs.k_panel = Some(kpanel_amx::k_panel::<BlockIQ2XS>());
    k.iq2_s.k_panel = Some(kpanel_amx::k_panel::<BlockIQ2S>());
    k.iq1_s.k_panel = Some(kpanel_amx::k_panel::<BlockIQ1S>());
    k.iq1_m.k_panel = Some(kpanel_amx::k_panel::<BlockIQ1M>());
    k.tq1_0.k_panel = Some(kpanel_amx::k_panel::<BlockTQ1_0>());
    k.tq2_0.k_panel = Some(kpanel_amx::k_panel::<BlockTQ2_0>());
    k
}

/// Transposed tiles of eight tokens on the tile unit for `W`'s panel kernels.
const fn unpacked_on_tiles<W: Unpack>(panel: &mut Option<PanelDots>) {
    if let Some(p) = panel {
        p.x8_layout = X8Layout::Bytes;
        p.transpose_x8 = amx::transpose_x8;
        p.rows_x8 = amx::rows_x8::<W>;
    }
}

/// The table for `ISA`: `vpdpwssd` in place of `vpmaddwd`+`vpaddd` with either VNNI, and 32
/// registers and some 512-bit kernels with AVX-512. All give the same exact integer sums in the
/// same float order, so all give the same bits.
const fn table<const ISA: u8>(name: &'static str) -> Kernels {
    Kernels {
        name,
        quantize_q8_0,
        quantize_q16,
        quantize_q8k,
        q8_0: dots::<BlockQ8_0, ISA>(),
        q4_0: dots::<BlockQ4_0, ISA>(),
        q4_1: dots::<BlockQ4_1, ISA>(),
        q5_0: dots::<BlockQ5_0, ISA>(),
        q5_1: dots::<BlockQ5_1, ISA>(),
        q2_k: q8k_dots::<BlockQ2K, ISA>(),
        q3_k: q8k_dots::<BlockQ3K, ISA>(),
        q4_k: q8k_dots::<BlockQ4K, ISA>(),
        q5_k: q8k_dots::<BlockQ5K, ISA>(),
        q6_k: q8k_dots::<BlockQ6K, ISA>(),
        iq4_nl: dots::<BlockIQ4NL, ISA>(),
        iq4_xs: q8k_dots::<BlockIQ4XS, ISA>(),
        iq3_s: q8k_dots::<BlockIQ3S, ISA>(),
        iq3_xxs: q8k_dots::<BlockIQ3XXS, ISA>(),
        iq2_xxs: q8k_dots::<BlockIQ2XXS, ISA>(),
        iq2_xs: q8k_dots::<BlockIQ2XS, ISA>(),
        iq2_s: q8k_dots::<BlockIQ2S, ISA>(),
        iq1_s: q8k_dots::<BlockIQ1S, ISA>(),
        iq1_m: q8k_dots::<BlockIQ1M, ISA>(),
        tq1_0: q8k_dots::<BlockTQ1_0, ISA>(),
        tq2_0: q8k_dots::<BlockTQ2_0, ISA>(),
        dot_f32: |w, x| dot_f32::<1>(w, [x])[0],
        dot_f32_x4: dot_f32::<TILE>,
        dot_f16: |w, x| dot_f16::<1>(w, [x])[0],
        dot_f16_x4: dot_f16::<TILE>,
        dot_bf16: |w, x| dot_bf16::<1>(w, [x])[0],
        dot_bf16_x4: dot_bf16::<TILE>,
        axpy_q8_0: axpy_q8_0::<ISA>,
        silu_mul,
        exp_sub,
        add_weighted: if ISA == AVX512_VNNI {
            add_weighted_avx512
        } else {
            add_weighted_avx2
        },
        softmax_step: if ISA == AVX512_VNNI {
            softmax_step_avx512
        } else {
            softmax_step_avx2
        },
        widen_f16,
    }
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
            rows: if ISA == AVX512_VNNI {
                rows_one_avx512::<W>
            } else {
                |w, x| panel_rows::<W, ISA, 1>(w, [x])[0]
            },
            rows_x4: if ISA == AVX512_VNNI {
                rows_x4_avx512::<W>
            } else {
                panel_rows::<W, ISA, TILE>
            },
            pack_from: PANEL_MIN_TOKENS,
            x8_layout: if ISA == AVX512_VNNI {
                X8Layout::Lanes
            } else {
                X8Layout::Pairs
            },
            transpose_x8: if ISA == AVX512_VNNI {
                transpose_x8_lanes
            } else {
                transpose_x8
            },
            rows_x8: if ISA == AVX512_VNNI {
                rows_x8_lanes::<W>
            } else {
                rows_x8::<W, ISA>
            },
        }),
        k_panel: None,
    }
}

/// The dots of a k-quant against Q8K activations (prefill in `kpanel`'s tiles). Decoding reads the
/// four rows one after another, not interleaved: one sequential stream per thread, which the
/// hardware prefetcher follows; four rows at once decoded at half the rate on an AVX-512 AMD
/// host (BENCHMARKS.md).
const fn q8k_dots<K: KBytes, const ISA: u8>() -> QuantDots {
    QuantDots {
        one: |w, x| dot_q8k::<K, 1, 1, ISA>([w], [x])[0][0],
        x4: |w, xs| dot_q8k::<K, 1, TILE, ISA>([w], xs)[0],
        rows4: |w, x| w.map(|w| dot_q8k::<K, 1, 1, ISA>([w], [x])[0][0]),
        rows2x4: dot_q8k::<K, 2, TILE, ISA>,
        panel: None,
        k_panel: Some(k_panel::<K, ISA>()),
    }
}

/// # Safety
/// Two readable bytes at `p`; the CPU has F16C.
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees two readable bytes at `p` and F16C.
    unsafe { f16_to_f32((p as *const u16).read_unaligned()) }
}

/// # Safety
/// register-only: the CPU has F16C.
#[inline(always)]
unsafe fn f16_to_f32(bits: u16) -> f32 {
    // SAFETY: register-only; the caller has F16C.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32))) }
}

/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX).
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
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (AVX).
#[inline(always)]
unsafe fn hsums<const N: usize>(acc: [__m256; N]) -> [f32; N] {
    let mut out = [0f32; N];
    for i in 0..N {
        // SAFETY: register-only; the caller has AVX.
        out[i] = unsafe { hsum(acc[i]) };
    }
    out
}

/// One weight block against one Q16 block, as eight i32 partial sums: `lo·x0 + hi·x1` over
/// pairs of i16 (the block's first and second sixteen pairs), the second half by `vpdpwssd`
/// where `ISA` has it.
///
/// # Safety
/// register-only: the CPU has AVX2 and the features of `ISA`.
#[inline(always)]
unsafe fn block_dot<const ISA: u8>(lo: __m256i, hi: __m256i, x0: __m256i, x1: __m256i) -> __m256i {
    // SAFETY: register-only; the caller has AVX2 and the features of `ISA`.
    unsafe {
        let dot = _mm256_madd_epi16(lo, x0);
        match ISA {
            AVX512_VNNI | AVX_VNNI => dpwssd::<ISA>(dot, hi, x1),
            _ => _mm256_add_epi32(dot, _mm256_madd_epi16(hi, x1)),
        }
    }
}

/// `acc + Σ a·b` over each pair of i16 lanes, as eight i32: one `vpdpwssd`. In assembly because
/// LLVM splits the intrinsic back into `vpmaddwd` + `vpaddd`, an extra instruction per
/// (row, token, block) in the hottest loop.
///
/// # Safety
/// register-only: the CPU has the features of the function that inlines it (`ISA`: AVX-VNNI, or AVX512-VNNI with AVX512VL).
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

/// # Safety
/// Register-only: the CPU has AVX2 and AVX-VNNI.
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

/// # Safety
/// Register-only: the CPU has AVX512F, AVX512VL and AVX512-VNNI.
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

/// `vpdpwssd` on 512-bit vectors, in assembly for the reason `dpwssd` gives.
///
/// # Safety
/// Register-only: the CPU has AVX512F and AVX512-VNNI.
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
