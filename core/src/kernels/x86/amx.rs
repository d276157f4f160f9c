//! AMX (Intel's tile matrix unit, from Sapphire Rapids on) for the transposed tiles of eight
//! tokens: a decode step of several sequences against Q8_0 weights, and against the other
//! formats of 32-quant blocks (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL), each block unpacked to bytes
//! first.
//!
//! One `tdpbssd` multiplies a tile of 16 weight rows' block (16 × 32 i8, loaded straight from
//! Q8_0 rows, from the unpacked copy for the others) with the block of eight tokens into 16 × 16
//! i32 sums. The activations are Q16, so each token's i16 quants go in as two signed bytes,
//! `q = 256·high + low` (`|q| <= 127·257` makes both fit `i8`), its high bytes in columns 0..8,
//! its low ones in 8..16: one instruction for both halves. `256·high + low` of the sums is the
//! block's exact integer sum, the same one the 256-bit kernels get, scaled in the same float
//! steps: the same bits.
//!
//! Linux hands AMX's 8 KiB of tile state to a process only on request (`arch_prctl`), so
//! `available` asks once; the tile configuration is per thread, and each call loads it unless
//! the thread already has it.
use super::*;
use core::marker::PhantomData;
use core::mem::MaybeUninit;

/// Bytes of a transposed block here: the tokens' scales and sums (f32, as `X8_QUANTS` lays them
/// out), then per group of four quants a row of the tile: each token's four high bytes, then
/// each token's four low bytes (`[group][high, low][token][4]`, i8).
const BYTES: usize = X8_QUANTS;
/// Bytes of one row of that tile (and of the sums tile): 16 columns of 4 bytes.
const TILE_ROW: usize = 2 * 4 * X8;
const _: () = assert!(BYTES + QK / 4 * TILE_ROW == X8_BLOCK_BYTES);

/// Whether this CPU has AMX-INT8, the OS saves its tile state, and it granted this process its
/// use (asked once, on Linux: elsewhere AMX is left alone).
pub fn available() -> bool {
    use core::sync::atomic::{AtomicU8, Ordering};
    // 0: not asked yet, 1: no, 2: yes.
    static STATE: AtomicU8 = AtomicU8::new(0);
    match STATE.load(Ordering::Relaxed) {
        0 => {
            let yes = avx512_available() && cpu_has_amx() && os_grants_amx();
            STATE.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
        s => s == 2,
    }
}

/// AMX-TILE and AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25).
fn cpu_has_amx() -> bool {
    let edx = __cpuid_count(7, 0).edx;
    edx & (1 << 24) != 0 && edx & (1 << 25) != 0
}

/// Whether the OS enabled the tile state in XCR0 (bits 17 and 18) and lets this process use it.
#[cfg(target_os = "linux")]
fn os_grants_amx() -> bool {
    // OSXSAVE: XGETBV is allowed.
    if __cpuid(1).ecx & (1 << 27) == 0 {
        return false;
    }
    let (xcr0_lo, _hi): (u32, u32);
    // SAFETY: XGETBV with ECX = 0 reads XCR0; OSXSAVE (checked above) makes it valid.
    unsafe {
        core::arch::asm!("xgetbv", in("ecx") 0, out("eax") xcr0_lo, out("edx") _hi,
            options(nomem, nostack, preserves_flags));
    }
    if xcr0_lo & (0b11 << 17) != 0b11 << 17 {
        return false;
    }
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: the arch_prctl system call (x86-64 Linux ABI: number in RAX, arguments in RDI and
    // RSI, RCX and R11 clobbered) with ARCH_REQ_XCOMP_PERM only records a permission in the
    // kernel; it touches no memory of this process.
    unsafe {
        core::arch::asm!("syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM, in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn os_grants_amx() -> bool {
    false
}

/// Transposes blocks `b0 ..` of eight Q16 activation rows into this module's layout.
pub(super) fn transpose_x8(xs: [&[u8]; X8], b0: usize, out: &mut [u8]) {
    let nb = x8_blocks(&xs, b0, out);
    // SAFETY: `available` (AVX-512) before this table is handed out; blocks `b0 .. b0 + nb` lie
    // inside every row, and `nb` transposed blocks inside `out`.
    unsafe { transpose_x8_avx512(nb, xs.map(<[u8]>::as_ptr), b0, out.as_mut_ptr()) }
}

/// # Safety
/// The CPU has AVX-512 F/BW/VL; Q16 blocks `b0 .. b0 + nb` lie inside every row at `xs[t]`, and
/// `nb` transposed blocks (`X8_BLOCK_BYTES` each) at `out`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn transpose_x8_avx512(nb: usize, xs: [*const u8; X8], b0: usize, out: *mut u8) {
    for b in 0..nb {
        // SAFETY: as the caller guarantees: block `b0 + b` inside every row, transposed block
        // `b` inside `out`.
        unsafe {
            let o = out.add(b * X8_BLOCK_BYTES);
            let x = xs.map(|x| x.add((b0 + b) * BlockQ16::BYTES));
            store_x8_scales(x, o);
            let mut high = [_mm256_setzero_si256(); X8];
            let mut low = [_mm256_setzero_si256(); X8];
            for t in 0..X8 {
                let q = _mm512_loadu_si512(x[t].add(BlockQ16::QUANTS) as *const __m512i);
                // The low byte as i8, and `(q - low) / 256` (no overflow: `|q| <= 127·257`).
                // Each group of four quants' bytes is one 32-bit lane: token t's lane k.
                let lo = _mm512_cvtepi16_epi8(q);
                let hi = _mm512_srai_epi16::<8>(_mm512_sub_epi16(q, _mm512_cvtepi8_epi16(lo)));
                high[t] = _mm512_cvtepi16_epi8(hi);
                low[t] = lo;
            }
            let (high, low) = (transpose8(high), transpose8(low));
            for k in 0..QK / 4 {
                let row = o.add(BYTES + k * TILE_ROW);
                _mm256_storeu_si256(row as *mut __m256i, high[k]);
                _mm256_storeu_si256(row.add(32) as *mut __m256i, low[k]);
            }
        }
    }
}

/// A tile configuration (`ldtilecfg`'s 64 bytes).
#[repr(C, align(64))]
pub(super) struct TileConfig([u8; 64]);

impl TileConfig {
    /// Palette 1 (eight tiles of up to 16 rows of 64 bytes), tile `t` of `shapes[t]` (rows,
    /// bytes per row).
    pub(super) const fn new(shapes: [(u8, u16); 8]) -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1;
        let mut t = 0;
        while t < 8 {
            let bytes = shapes[t].1.to_le_bytes();
            c[16 + 2 * t] = bytes[0];
            c[17 + 2 * t] = bytes[1];
            c[48 + t] = shapes[t].0;
            t += 1;
        }
        TileConfig(c)
    }
}

/// The tiles here: sums for even blocks (0) and odd ones (1), so that the next blocks' are
/// multiplied while one block's are scaled; the weights of even and odd blocks (4, 5); the
/// tokens' bytes of even and odd blocks (6, 7). Tiles 2 and 3 stay unused.
static TILES: TileConfig = TileConfig::new([
    (16, TILE_ROW as u16),
    (16, TILE_ROW as u16),
    (0, 0),
    (0, 0),
    (16, QK as u16),
    (16, QK as u16),
    ((QK / 4) as u8, TILE_ROW as u16),
    ((QK / 4) as u8, TILE_ROW as u16),
]);

/// Loads `config` into this thread's tile configuration unless it holds it already (loading
/// costs about ten times as much as reading it back; a thread switches only between mat-muls
/// of different formats).
///
/// # Safety
/// The CPU has AMX and the OS granted it (`available`), and AVX-512 F/BW.
#[inline(always)]
pub(super) unsafe fn configure_tiles(config: &TileConfig) {
    // SAFETY: AMX granted and AVX-512 as the caller guarantees; `now` and `config` are 64
    // aligned bytes.
    unsafe {
        let mut now = TileConfig([0; 64]);
        core::arch::asm!("sttilecfg [{}]", in(reg) now.0.as_mut_ptr(), options(nostack));
        let a = _mm512_load_si512(now.0.as_ptr() as *const __m512i);
        let b = _mm512_load_si512(config.0.as_ptr() as *const __m512i);
        if _mm512_cmpneq_epi64_mask(a, b) != 0 {
            core::arch::asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack));
        }
    }
}

/// `X8_ROWS` Q8_0 weight rows' blocks `b0 ..` against a transposed tile of eight tokens.
pub(super) fn rows_x8_q8_0(
    w: [&[u8]; X8_ROWS],
    b0: usize,
    xt: &[u8],
    acc: &mut [[f32; X8]; X8_ROWS],
) {
    let nb = x8_row_blocks::<BlockQ8_0>(&w, b0, xt);
    // The rows of one matrix lie a fixed stride apart, and a tile loads them straight from
    // there; any others (the last rows repeated as padding) are copied block by block.
    let base = w[0].as_ptr();
    let stride = (w[1].as_ptr() as usize).wrapping_sub(base as usize);
    let strided = stride <= i32::MAX as usize / X8_ROWS
        && w.iter()
            .enumerate()
            .all(|(i, r)| r.as_ptr() as usize == (base as usize).wrapping_add(i * stride));
    let rows = if strided {
        Rows::Strided(base, stride)
    } else {
        Rows::Apart(w.map(<[u8]>::as_ptr))
    };
    // SAFETY: `available` before this table is handed out; blocks `b0 .. b0 + nb` lie inside
    // every row (and, strided, row `i` is `base + i·stride`), `nb` transposed blocks inside `xt`.
    unsafe { rows_x8_amx(nb, rows, b0, xt.as_ptr(), acc) }
}

/// `X8_ROWS` weight rows' blocks `b0 ..` of format `W` against a transposed tile of eight
/// tokens, each block of the rows unpacked to bytes for the tile.
pub(super) fn rows_x8<W: Unpack>(
    w: [&[u8]; X8_ROWS],
    b0: usize,
    xt: &[u8],
    acc: &mut [[f32; X8]; X8_ROWS],
) {
    let nb = x8_row_blocks::<W>(&w, b0, xt);
    let rows = Unpacked::<W>(w.map(<[u8]>::as_ptr), w[0].len(), PhantomData);
    // SAFETY: `available` before this table is handed out; blocks `b0 .. b0 + nb` lie inside
    // every row, `nb` transposed blocks inside `xt`.
    unsafe { rows_x8_amx(nb, rows, b0, xt.as_ptr(), acc) }
}

/// Where a call's rows are.
#[derive(Clone, Copy)]
enum Rows {
    /// Row `i` at `base + i·stride` (`16·stride` fits an i32).
    Strided(*const u8, usize),
    /// Anywhere.
    Apart([*const u8; X8_ROWS]),
}

/// One block of 16 rows, each 64 bytes after the last: Q8_0's copied blocks, for rows apart, or
/// the other formats' unpacked quants.
#[repr(C, align(64))]
struct Gathered([[u8; 64]; X8_ROWS]);

/// One block of 16 rows as the tile reads it: the quants (16 rows of 32 `i8`, `stride` bytes
/// apart), the rows' scales and, for formats with one, minimums (f32, lane `i` row `i`).
#[derive(Clone, Copy)]
struct TileBlock {
    quants: *const u8,
    stride: usize,
    dw: __m512,
    mw: __m512,
}

/// Where a call's blocks come from.
trait TileSource: Copy {
    /// Whether the blocks have minimums, whose term `m·(dx·Σq)` is added.
    const HAS_MIN: bool;

    /// Block `b` of the rows, through `buf` where it must be copied or unpacked.
    ///
    /// # Safety
    /// Block `b` lies inside every row; AVX-512 F/BW/VL and F16C.
    unsafe fn block(self, b: usize, buf: &mut MaybeUninit<Gathered>) -> TileBlock;
}

impl TileSource for Rows {
    const HAS_MIN: bool = false;

    #[inline(always)]
    unsafe fn block(self, b: usize, buf: &mut MaybeUninit<Gathered>) -> TileBlock {
        // SAFETY: block `b` lies inside every row, as the caller guarantees; `buf`'s rows hold
        // a block each.
        unsafe {
            let (first, stride) = match self {
                Rows::Strided(base, stride) => {
                    // As many bytes of the next call's rows (usually the rows right after
                    // these, one run of memory) as this block takes of these, in order: a tile
                    // load waits for every row it reads, and sixteen streams are more than the
                    // hardware prefetcher follows. Into L2: into L1, eight sequences decoded
                    // 7% slower on an Intel host with slow memory.
                    let next = base.wrapping_add(X8_ROWS * stride);
                    let from = next.wrapping_add(b * X8_ROWS * BlockQ8_0::BYTES);
                    for line in (0..X8_ROWS * BlockQ8_0::BYTES).step_by(64) {
                        _mm_prefetch::<_MM_HINT_T1>(from.wrapping_add(line) as *const i8);
                    }
                    (block_at::<BlockQ8_0>(base, b), stride)
                }
                Rows::Apart(w) => {
                    let buf = buf.as_mut_ptr() as *mut u8;
                    for (i, r) in w.iter().enumerate() {
                        let p = block_at::<BlockQ8_0>(*r, b);
                        core::ptr::copy_nonoverlapping(p, buf.add(64 * i), BlockQ8_0::BYTES);
                    }
                    (buf as *const u8, 64)
                }
            };
            // The rows' f16 scales: the first two bytes of each block.
            let rows_at = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
            let offsets = _mm512_mullo_epi32(rows_at, _mm512_set1_epi32(stride as i32));
            let scales = _mm512_i32gather_epi32::<1>(offsets, first as *const i32);
            TileBlock {
                quants: first.add(2),
                stride,
                dw: _mm512_cvtph_ps(_mm512_cvtepi32_epi16(scales)),
                mw: _mm512_setzero_ps(),
            }
        }
    }
}

/// Rows of format `W` (anywhere; the first's length aims the prefetches), each block unpacked.
struct Unpacked<W>([*const u8; X8_ROWS], usize, PhantomData<W>);

impl<W> Clone for Unpacked<W> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<W> Copy for Unpacked<W> {}

impl<W: Unpack> TileSource for Unpacked<W> {
    const HAS_MIN: bool = W::HAS_MIN;

    #[inline(always)]
    unsafe fn block(self, b: usize, buf: &mut MaybeUninit<Gathered>) -> TileBlock {
        let Unpacked(rows, row_len, _) = self;
        // SAFETY: block `b` lies inside every row, as the caller guarantees; each of `buf`'s
        // rows takes 32 bytes.
        unsafe {
            let p = rows.map(|r| block_at::<W>(r, b));
            let buf = buf.as_mut_ptr() as *mut u8;
            for (i, p) in p.iter().enumerate() {
                // The next call's rows (usually the sixteen after these), into L2 as for Q8_0.
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(X8_ROWS * row_len) as *const i8);
                let (lo, hi) = W::unpack(*p);
                let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                _mm256_store_si256(buf.add(64 * i) as *mut __m256i, _mm512_cvtepi16_epi8(both));
            }
            let halves = |s: [__m256; 2]| {
                let low = _mm512_castps256_ps512(s[0]);
                _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                    _mm512_castps_pd(low),
                    _mm256_castps_pd(s[1]),
                ))
            };
            let (d0, m0) = W::scales8(core::array::from_fn(|i| p[i]));
            let (d1, m1) = W::scales8(core::array::from_fn(|i| p[8 + i]));
            TileBlock {
                quants: buf,
                stride: 64,
                dw: halves([d0, d1]),
                mw: halves([m0, m1]),
            }
        }
    }
}

/// Blocks multiplied ahead of the one being scaled: two, each in the even or the odd tiles
/// (sums, weights, tokens), while the sums of the one being scaled are already stored.
const AHEAD: usize = 2;

/// A block's sums from the tiles: per row, each token's sum of high bytes, then of low bytes.
#[repr(C, align(64))]
struct Sums([[i32; 2 * X8]; X8_ROWS]);

/// The tile work of one block: the weights' quants times the tokens' bytes (the transposed block
/// at `x`), in the even or the odd tiles. `store_sums` writes the result out.
///
/// # Safety
/// AMX granted and configured with `TILES`; 32 quants at `w.quants + i·w.stride` for each row
/// `i`, a transposed block at `x`.
#[inline(always)]
unsafe fn multiply_block(w: &TileBlock, x: *const u8, odd: bool) {
    let (quants, stride) = (w.quants, w.stride);
    let bytes = x.wrapping_add(BYTES);
    // SAFETY: as the caller guarantees: the tiles read 16 rows of 32 quants at `quants` and
    // eight rows of 64 bytes at `bytes`.
    unsafe {
        if odd {
            core::arch::asm!(
                "tileloadd tmm7, [{bytes} + {row}*1]",
                "tileloadd tmm5, [{quants} + {stride}*1]",
                "tilezero tmm1",
                "tdpbssd tmm1, tmm5, tmm7",
                quants = in(reg) quants, stride = in(reg) stride, bytes = in(reg) bytes,
                row = in(reg) TILE_ROW, options(nostack, readonly),
            );
        } else {
            core::arch::asm!(
                "tileloadd tmm6, [{bytes} + {row}*1]",
                "tileloadd tmm4, [{quants} + {stride}*1]",
                "tilezero tmm0",
                "tdpbssd tmm0, tmm4, tmm6",
                quants = in(reg) quants, stride = in(reg) stride, bytes = in(reg) bytes,
                row = in(reg) TILE_ROW, options(nostack, readonly),
            );
        }
    }
}

/// Stores the even or the odd tile's sums (`multiply_block`'s) into `sums`.
///
/// # Safety
/// AMX granted and configured with `TILES`; `sums` is valid for writes.
#[inline(always)]
unsafe fn store_sums(sums: *mut Sums, odd: bool) {
    // SAFETY: the tile store writes 16 rows of 64 bytes: all of `sums`, which the caller
    // guarantees writable.
    unsafe {
        if odd {
            core::arch::asm!("tilestored [{sums} + {row}*1], tmm1",
                sums = in(reg) sums, row = in(reg) TILE_ROW, options(nostack));
        } else {
            core::arch::asm!("tilestored [{sums} + {row}*1], tmm0",
                sums = in(reg) sums, row = in(reg) TILE_ROW, options(nostack));
        }
    }
}

/// Per block: the tiles' integer sums (the next two blocks' multiplied while this one's are
/// scaled), then for each pair of rows `acc += Σ·(dw·dx)` on the 16 lanes of (row, token), and
/// with minimums `acc += mw·s` after, as the 256-bit kernels do on each lane.
///
/// # Safety
/// AMX granted (`available`), AVX-512 F/BW/VL; blocks `b0 .. b0 + nb` lie inside every row,
/// `nb` transposed blocks at `xt`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn rows_x8_amx<S: TileSource>(
    nb: usize,
    rows: S,
    b0: usize,
    xt: *const u8,
    acc: &mut [[f32; X8]; X8_ROWS],
) {
    // SAFETY: as the caller guarantees; every pointer below is a block inside a row, a
    // transposed block inside `xt`, or a local buffer.
    unsafe {
        configure_tiles(&TILES);
        let acc = acc.as_flattened_mut();
        let mut facc = [_mm512_setzero_ps(); X8_ROWS / 2];
        for (i, f) in facc.iter_mut().enumerate() {
            *f = _mm512_loadu_ps(acc.as_ptr().add(16 * i));
        }
        // Lanes 0..8 take row 2i's scale, lanes 8..16 row 2i + 1's.
        let pair: [__m512i; X8_ROWS / 2] = core::array::from_fn(|i| {
            let (a, b) = (
                _mm256_set1_epi32(2 * i as i32),
                _mm256_set1_epi32(2 * i as i32 + 1),
            );
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
        });
        // Written before they are read (the sums by the tile store, the gathered or unpacked
        // blocks by `block`), and not worth zeroing on every call.
        let mut sums = MaybeUninit::<Sums>::uninit();
        let mut gathered = [const { MaybeUninit::<Gathered>::uninit() }; AHEAD + 1];
        let none = TileBlock {
            quants: xt,
            stride: 0,
            dw: _mm512_setzero_ps(),
            mw: _mm512_setzero_ps(),
        };
        let mut at = [none; AHEAD + 1];
        // Blocks `b + 1 ..= b + AHEAD` are being multiplied while block `b`'s sums are scaled,
        // and `b + 1`'s are stored only after them: a tile store holds back the loads behind it
        // until its product is done, so storing first would wait out the multiplication.
        for b in 0..nb.min(AHEAD) {
            at[b] = rows.block(b0 + b, &mut gathered[b]);
            multiply_block(&at[b], xt.add(b * X8_BLOCK_BYTES), b % 2 == 1);
        }
        if nb > 0 {
            store_sums(sums.as_mut_ptr(), false);
        }
        for b in 0..nb {
            let ahead = b + AHEAD;
            if ahead < nb {
                let slot = ahead % (AHEAD + 1);
                at[slot] = rows.block(b0 + ahead, &mut gathered[slot]);
                let x = xt.add(ahead * X8_BLOCK_BYTES);
                multiply_block(&at[slot], x, ahead % 2 == 1);
            }
            let x = xt.add(b * X8_BLOCK_BYTES);
            // Both halves: AVX-512 F's 64-bit insert (the 32-bit one needs DQ).
            let both = |v: __m256| {
                let v = _mm256_castps_pd(v);
                _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(v), v))
            };
            let dx = both(_mm256_loadu_ps(x as *const f32));
            // The tokens' `dx·Σq`, for the minimums' term.
            let sx = both(_mm256_loadu_ps((x as *const f32).add(X8)));
            let TileBlock { dw, mw, .. } = at[b % (AHEAD + 1)];
            for (i, f) in facc.iter_mut().enumerate() {
                let rows = &(*sums.as_ptr()).0;
                let even = _mm512_load_si512(rows[2 * i].as_ptr() as *const __m512i);
                let odd = _mm512_load_si512(rows[2 * i + 1].as_ptr() as *const __m512i);
                // Rows 2i and 2i + 1: their high bytes' sums, then their low ones'.
                let h = _mm512_shuffle_i64x2::<0b01_00_01_00>(even, odd);
                let l = _mm512_shuffle_i64x2::<0b11_10_11_10>(even, odd);
                let isum = _mm512_add_epi32(_mm512_slli_epi32::<8>(h), l);
                let d = _mm512_permutexvar_ps(pair[i], dw);
                *f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, dx), *f);
                if S::HAS_MIN {
                    *f = _mm512_fmadd_ps(_mm512_permutexvar_ps(pair[i], mw), sx, *f);
                }
            }
            if b + 1 < nb {
                store_sums(sums.as_mut_ptr(), (b + 1) % 2 == 1);
            }
        }
        for (i, f) in facc.iter().enumerate() {
            _mm512_storeu_ps(acc.as_mut_ptr().add(16 * i), *f);
        }
    }
}
