//! The k-quants' many-token kernel (`kernels::k_panel`) on AMX: unpacked rows against a
//! transposed tile of sixteen tokens, sixteen rows at a time.
//!
//! A tile product sums 64 values at once, across four halves with their own integer scales, so
//! the scales go into the values before it: unpacking stores each value's signed value times
//! its scale, `scale·(code - OFFSET)` (an `i16`), as two bytes, `256·high + low`
//! (`KRow::scaled_low`, `scaled_high`; `kpanel::unpack` with `FOLD`). Per super-block of
//! sixteen rows, four `tdpbusd` multiply the low bytes (unsigned) and four `tdpbssd` the high
//! ones (signed) with the tokens' quants, and `256·high + low` of the two sums is exactly the
//! integer the 512-bit kernel builds half by half and then corrects for the offset with the
//! tokens' 16-value sums (at most 256 · 4,096 · 128 in size: no overflow). The formats with an
//! offset thus skip that correction; those with minimums still take theirs from the sums, and
//! `finish_zmm` ends the super-block in the same float steps: the same bits.
use super::amx::{configure_tiles, TileConfig};
use super::kpanel::{finish_zmm, tile_dot, transpose, unpack};
use super::*;
use crate::kernels::k_panel::{KPanelDots, KRow, KTokens, K_MICRO, K_TOKENS};
use core::mem::MaybeUninit;

/// The k-quant kernels of format `K` on AMX (and AVX-512 for the rest).
pub(super) const fn k_panel<K: KBytes>() -> KPanelDots {
    KPanelDots {
        from_tokens: PANEL_MIN_TOKENS,
        unpack: unpack::<K, true>,
        folds_scales: true,
        transpose,
        dot: dot_tiles::<K>,
    }
}

/// Rows a tile product takes.
const TILE_ROWS: usize = 16;

/// Bytes of a tile row: 64 values of a row, or four values of each of sixteen tokens.
const TILE_BYTES: usize = 64;

/// Every tile 16 rows of 64 bytes: the low and high bytes' sums (0, 1), the rows' low and high
/// bytes (2, 3), the tokens' quants, a quarter of the super-block each (4 to 7). Measured: a
/// second pair of sums' tiles, so that one group of rows is multiplied while the last one's are
/// scaled (which leaves the tokens' quants two tiles to take turns in, loaded for each group),
/// ran 14% slower.
static K_TILES: TileConfig = TileConfig::new([(TILE_ROWS as u8, TILE_BYTES as u16); 8]);

/// Every token of the tile: the tile unit multiplies all sixteen at once.
fn dot_tiles<K: KBytes>(rows: &[KRow], x: &KTokens, _: usize, acc: &mut [[f32; K_TOKENS]]) {
    let n = rows.len().min(acc.len()) / K_MICRO * K_MICRO;
    let tiled = n / TILE_ROWS * TILE_ROWS;
    // SAFETY: the AMX table is handed out only when `amx::available()` said yes; `tiled` rows
    // lie in both `rows` and `acc`.
    unsafe { dot_amx::<K>(&rows[..tiled], x, &mut acc[..tiled]) }
    // A last eight rows (`n` is a multiple of eight) on 512-bit vectors.
    tile_dot::<K, AVX512_VNNI>(&rows[tiled..n], x, K_TOKENS, &mut acc[tiled..n]);
}

/// A tile's sums: per row, one `i32` per token.
#[repr(C, align(64))]
struct Sums([[i32; K_TOKENS]; TILE_ROWS]);

/// Per group of sixteen rows: the tiles' sums, then `256·high + low` per (row, token) and
/// `finish_zmm` for each eight rows.
///
/// # Safety
/// AMX granted (`amx::available`), AVX-512 F/BW/VL with VNNI; `rows.len()` is a multiple of
/// `TILE_ROWS` and `acc` holds as many rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_amx<K: KBytes>(rows: &[KRow], x: &KTokens, acc: &mut [[f32; K_TOKENS]]) {
    if rows.is_empty() {
        return;
    }
    // Written by the tile stores before they are read.
    let mut low = MaybeUninit::<Sums>::uninit();
    let mut high = MaybeUninit::<Sums>::uninit();
    // SAFETY: as the caller guarantees. The tokens' tiles read 64 rows of 64 bytes: all of
    // `x.codes`; a group's tiles read 64 bytes at offsets below 256 of the scaled bytes of
    // sixteen `KRow`s from its first (which `rows` holds); the stores write all of `low` and
    // `high`.
    unsafe {
        configure_tiles(&K_TILES);
        core::arch::asm!(
            "tileloadd tmm4, [{x} + {row}*1]",
            "tileloadd tmm5, [{x} + {row}*1 + 1024]",
            "tileloadd tmm6, [{x} + {row}*1 + 2048]",
            "tileloadd tmm7, [{x} + {row}*1 + 3072]",
            x = in(reg) x.codes.as_ptr(), row = in(reg) TILE_BYTES,
            options(nostack, readonly),
        );
        for (rs, acc) in rows
            .chunks_exact(TILE_ROWS)
            .zip(acc.chunks_exact_mut(TILE_ROWS))
        {
            core::arch::asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tileloadd tmm2, [{lo} + {stride}*1]",
                "tileloadd tmm3, [{hi} + {stride}*1]",
                "tdpbusd tmm0, tmm2, tmm4",
                "tdpbssd tmm1, tmm3, tmm4",
                "tileloadd tmm2, [{lo} + {stride}*1 + 64]",
                "tileloadd tmm3, [{hi} + {stride}*1 + 64]",
                "tdpbusd tmm0, tmm2, tmm5",
                "tdpbssd tmm1, tmm3, tmm5",
                "tileloadd tmm2, [{lo} + {stride}*1 + 128]",
                "tileloadd tmm3, [{hi} + {stride}*1 + 128]",
                "tdpbusd tmm0, tmm2, tmm6",
                "tdpbssd tmm1, tmm3, tmm6",
                "tileloadd tmm2, [{lo} + {stride}*1 + 192]",
                "tileloadd tmm3, [{hi} + {stride}*1 + 192]",
                "tdpbusd tmm0, tmm2, tmm7",
                "tdpbssd tmm1, tmm3, tmm7",
                "tilestored [{low} + {row}*1], tmm0",
                "tilestored [{high} + {row}*1], tmm1",
                lo = in(reg) rs[0].scaled_low.as_ptr(),
                hi = in(reg) rs[0].scaled_high.as_ptr(),
                stride = in(reg) size_of::<KRow>(),
                low = in(reg) low.as_mut_ptr(),
                high = in(reg) high.as_mut_ptr(),
                row = in(reg) TILE_BYTES,
                options(nostack),
            );
            let (low, high) = (&(*low.as_ptr()).0, &(*high.as_ptr()).0);
            for (half, acc) in acc.chunks_exact_mut(K_MICRO).enumerate() {
                // A loop, not `from_fn`: a closure would not inherit the target features.
                let mut scaled = [_mm512_setzero_si512(); K_MICRO];
                for (r, v) in scaled.iter_mut().enumerate() {
                    let r = K_MICRO * half + r;
                    let l = _mm512_load_si512(low[r].as_ptr() as *const __m512i);
                    let h = _mm512_load_si512(high[r].as_ptr() as *const __m512i);
                    *v = _mm512_add_epi32(_mm512_slli_epi32::<8>(h), l);
                }
                let rs = <&[KRow; K_MICRO]>::try_from(&rs[K_MICRO * half..][..K_MICRO]);
                if let Ok(rs) = rs {
                    finish_zmm::<K, true>(rs, scaled, x, acc);
                }
            }
        }
    }
}
