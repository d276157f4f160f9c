//! Attention's weighted sum over a Q8_0 V cache.
//!
//! A call adds a whole step of keys (rows) to some query rows' sums (runs of `out`). A decoded
//! token's few runs stay in registers across all the keys, each key's block widened once per
//! group of runs; prefill's many runs are loaded and stored per group of keys, each group
//! widened once for all of them. Each value gets `o += (a·d)·v` per key in key order, as one
//! FMA, in both tables and whatever the grouping: the same bits. Run `i`'s weight for key `k`
//! is `a[w(i, k)]`, `w(i, k) = i·w.run + k·w.key` (`WeightStrides`).
use super::*;

/// Runs of `out` kept in registers at once: four 32-float blocks in 512-bit vectors (eight
/// registers), two in 256-bit ones (eight).
const RUNS_512: usize = 4;
const RUNS_256: usize = 2;
/// Keys widened at once with AVX-512 (eight registers).
const KEYS_512: usize = 4;

/// `out[i] += Σ_k a[w(i, k)] · rows[k]` for each whole run `out[i]` (as long as the rows'
/// whole blocks) that `a` has all its weights for (`WeightStrides::runs`), over every row, in
/// order.
pub(super) fn axpy_q8_0<const ISA: u8>(
    out: &mut [f32],
    a: &[f32],
    w: WeightStrides,
    rows: &[&[u8]],
) {
    let nb = super::super::q8_0_blocks(rows);
    let n = nb * QK;
    if n == 0 {
        return;
    }
    let runs = w.runs(a.len(), rows.len(), out.len() / n);
    // SAFETY: CPU features as the table was chosen for (AVX-512 only in its table); `runs` runs
    // of `n` floats lie in `out`, run `i`'s weights for every key at `a[w(i, k)]`, and `nb` whole
    // blocks in every row.
    unsafe {
        let (out, a) = (out.as_mut_ptr(), a.as_ptr());
        if ISA == AVX512_VNNI {
            axpy_avx512(out, a, w, rows, nb, runs)
        } else {
            axpy_avx2(out, a, w, rows, nb, runs)
        }
    }
}

/// # Safety
/// AVX-512 F/BW/VL; `runs` runs of `nb · 32` floats at `out`, run `i`'s `rows.len()` weights
/// at `a + w(i, k)`, `nb` whole Q8_0 blocks in every row.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn axpy_avx512(
    out: *mut f32,
    a: *const f32,
    w: WeightStrides,
    rows: &[&[u8]],
    nb: usize,
    runs: usize,
) {
    let n = nb * QK;
    if runs > RUNS_512 {
        // Prefill's many rows: each key group widened once for all of them, their sums loaded
        // and stored per group instead (re-widening per few rows was 5% slower at depth 512).
        for b in 0..nb {
            let groups = rows.chunks_exact(KEYS_512);
            let tail = groups.remainder();
            let mut k = 0;
            // SAFETY: as the caller guarantees; key groups stay inside `rows` and each run's
            // weights.
            unsafe {
                let o = out.add(b * QK);
                for group in groups {
                    all_runs_avx512::<KEYS_512>(o, n, runs, a.add(k * w.key), w, group, b);
                    k += KEYS_512;
                }
                match tail.len() {
                    1 => all_runs_avx512::<1>(o, n, runs, a.add(k * w.key), w, tail, b),
                    2 => all_runs_avx512::<2>(o, n, runs, a.add(k * w.key), w, tail, b),
                    3 => all_runs_avx512::<3>(o, n, runs, a.add(k * w.key), w, tail, b),
                    _ => {}
                }
            }
        }
        return;
    }
    for b in 0..nb {
        let mut i = 0;
        while i < runs {
            let r = (runs - i).min(RUNS_512);
            // SAFETY: runs `i .. i + r` and block `b` are inside, as the caller guarantees.
            unsafe {
                let (o, a) = (out.add(i * n + b * QK), a.add(i * w.run));
                match r {
                    1 => runs_avx512::<1>(o, n, a, w, rows, b),
                    2 => runs_avx512::<2>(o, n, a, w, rows, b),
                    3 => runs_avx512::<3>(o, n, a, w, rows, b),
                    _ => runs_avx512::<RUNS_512>(o, n, a, w, rows, b),
                }
            }
            i += r;
        }
    }
}

/// Block `b` of `R` runs (`n` floats apart from `out`), in registers through every key.
///
/// # Safety
/// As `axpy_avx512`, for these runs.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn runs_avx512<const R: usize>(
    out: *mut f32,
    n: usize,
    a: *const f32,
    w: WeightStrides,
    rows: &[&[u8]],
    b: usize,
) {
    // SAFETY: as the caller guarantees; key groups stay inside `rows` and each run's weights.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        for (i, acc) in acc.iter_mut().enumerate() {
            for (c, acc) in acc.iter_mut().enumerate() {
                *acc = _mm512_loadu_ps(out.add(i * n + 16 * c));
            }
        }
        let groups = rows.chunks_exact(KEYS_512);
        let tail = groups.remainder();
        let mut k = 0;
        for group in groups {
            keys_avx512::<R, KEYS_512>(&mut acc, a.add(k * w.key), w, group, b);
            k += KEYS_512;
        }
        match tail.len() {
            1 => keys_avx512::<R, 1>(&mut acc, a.add(k * w.key), w, tail, b),
            2 => keys_avx512::<R, 2>(&mut acc, a.add(k * w.key), w, tail, b),
            3 => keys_avx512::<R, 3>(&mut acc, a.add(k * w.key), w, tail, b),
            _ => {}
        }
        for (i, acc) in acc.iter().enumerate() {
            for (c, acc) in acc.iter().enumerate() {
                _mm512_storeu_ps(out.add(i * n + 16 * c), *acc);
            }
        }
    }
}

/// `K` rows' block `b` (widened once) into every one of `runs` runs (`n` floats apart from
/// `out`), each loaded and stored once.
///
/// # Safety
/// AVX-512 F/BW/VL; `rows` holds `K` rows with block `b` whole, and each run a weight at
/// `a + w(i, k)` for each of the `K` keys and 32 floats at `out + i·n`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn all_runs_avx512<const K: usize>(
    out: *mut f32,
    n: usize,
    runs: usize,
    a: *const f32,
    w: WeightStrides,
    rows: &[&[u8]],
    b: usize,
) {
    // SAFETY: as the caller guarantees.
    unsafe {
        let (d, v) = widen_avx512::<K>(rows, b);
        for i in 0..runs {
            let o = out.add(i * n);
            let mut acc = [_mm512_loadu_ps(o), _mm512_loadu_ps(o.add(16))];
            for (k, vk) in v.iter().enumerate() {
                let ad = _mm512_set1_ps(*a.add(i * w.run + k * w.key) * d[k]);
                for (acc, vc) in acc.iter_mut().zip(vk) {
                    *acc = _mm512_fmadd_ps(ad, *vc, *acc);
                }
            }
            _mm512_storeu_ps(o, acc[0]);
            _mm512_storeu_ps(o.add(16), acc[1]);
        }
    }
}

/// `K` rows' block `b`: their scales, and their values widened, `v[k][c]` holding values
/// `16c .. 16c + 16` of row `k`.
///
/// # Safety
/// AVX-512 F/BW/VL; `rows` holds `K` rows with block `b` whole.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn widen_avx512<const K: usize>(rows: &[&[u8]], b: usize) -> ([f32; K], [[__m512; 2]; K]) {
    // SAFETY: as the caller guarantees.
    unsafe {
        let mut d = [0f32; K];
        let mut v = [[_mm512_setzero_ps(); 2]; K];
        for (k, (dk, vk)) in d.iter_mut().zip(v.iter_mut()).enumerate() {
            let rp = rows.get_unchecked(k).as_ptr().add(b * BlockQ8_0::BYTES);
            *dk = f16_at(rp);
            for (c, vc) in vk.iter_mut().enumerate() {
                let q = _mm_loadu_si128(rp.add(2 + 16 * c) as *const __m128i);
                *vc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
            }
        }
        (d, v)
    }
}

/// `acc[i] += Σ_k a[w(i, k)] · rows[k]` over `K` rows' block `b`.
///
/// # Safety
/// AVX-512 F/BW/VL; `rows` holds `K` rows with block `b` whole, and each of the `R` runs a
/// weight at `a + w(i, k)` for each of the `K` keys.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn keys_avx512<const R: usize, const K: usize>(
    acc: &mut [[__m512; 2]; R],
    a: *const f32,
    w: WeightStrides,
    rows: &[&[u8]],
    b: usize,
) {
    // SAFETY: as the caller guarantees.
    unsafe {
        let (d, v) = widen_avx512::<K>(rows, b);
        for (i, acc) in acc.iter_mut().enumerate() {
            for (k, vk) in v.iter().enumerate() {
                let ad = _mm512_set1_ps(*a.add(i * w.run + k * w.key) * d[k]);
                for (acc, vc) in acc.iter_mut().zip(vk) {
                    *acc = _mm512_fmadd_ps(ad, *vc, *acc);
                }
            }
        }
    }
}

/// # Safety
/// AVX2, FMA and F16C; otherwise as `axpy_avx512`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_avx2(
    out: *mut f32,
    a: *const f32,
    w: WeightStrides,
    rows: &[&[u8]],
    nb: usize,
    runs: usize,
) {
    let n = nb * QK;
    if runs > RUNS_256 {
        // Prefill's many rows: as in `axpy_avx512`, each key pair widened once for all of them.
        for b in 0..nb {
            let pairs = rows.chunks_exact(2);
            let tail = pairs.remainder();
            let mut k = 0;
            // SAFETY: as the caller guarantees; key pairs stay inside `rows` and each run's
            // weights.
            unsafe {
                let o = out.add(b * QK);
                for pair in pairs {
                    all_runs_avx2::<2>(o, n, runs, a.add(k * w.key), w, pair, b);
                    k += 2;
                }
                if !tail.is_empty() {
                    all_runs_avx2::<1>(o, n, runs, a.add(k * w.key), w, tail, b);
                }
            }
        }
        return;
    }
    for b in 0..nb {
        let mut i = 0;
        while i < runs {
            let r = (runs - i).min(RUNS_256);
            // SAFETY: runs `i .. i + r` and block `b` are inside, as the caller guarantees.
            unsafe {
                let (o, a) = (out.add(i * n + b * QK), a.add(i * w.run));
                match r {
                    1 => runs_avx2::<1>(o, n, a, w, rows, b),
                    _ => runs_avx2::<RUNS_256>(o, n, a, w, rows, b),
                }
            }
            i += r;
        }
    }
}

/// `K` rows' block `b` (widened once) into every one of `runs` runs, each loaded and stored
/// once.
///
/// # Safety
/// AVX2, FMA and F16C; otherwise as `all_runs_avx512`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn all_runs_avx2<const K: usize>(
    out: *mut f32,
    n: usize,
    runs: usize,
    a: *const f32,
    w: WeightStrides,
    rows: &[&[u8]],
    b: usize,
) {
    // SAFETY: as the caller guarantees.
    unsafe {
        let (d, v) = widen_avx2::<K>(rows, b);
        for i in 0..runs {
            let o = out.add(i * n);
            let mut acc = [_mm256_setzero_ps(); 4];
            for (c, acc) in acc.iter_mut().enumerate() {
                *acc = _mm256_loadu_ps(o.add(8 * c));
            }
            for (k, vk) in v.iter().enumerate() {
                let ad = _mm256_set1_ps(*a.add(i * w.run + k * w.key) * d[k]);
                for (acc, vc) in acc.iter_mut().zip(vk) {
                    *acc = _mm256_fmadd_ps(ad, *vc, *acc);
                }
            }
            for (c, acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.add(8 * c), *acc);
            }
        }
    }
}

/// `K` rows' block `b`: their scales, and their values widened, `v[k][c]` holding values
/// `8c .. 8c + 8` of row `k`.
///
/// # Safety
/// AVX2, FMA and F16C; `rows` holds `K` rows with block `b` whole.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen_avx2<const K: usize>(rows: &[&[u8]], b: usize) -> ([f32; K], [[__m256; 4]; K]) {
    // SAFETY: as the caller guarantees.
    unsafe {
        let mut d = [0f32; K];
        let mut v = [[_mm256_setzero_ps(); 4]; K];
        for (k, (dk, vk)) in d.iter_mut().zip(v.iter_mut()).enumerate() {
            let rp = rows.get_unchecked(k).as_ptr().add(b * BlockQ8_0::BYTES);
            *dk = f16_at(rp);
            for (c, vc) in vk.iter_mut().enumerate() {
                let q = _mm_loadl_epi64(rp.add(2 + 8 * c) as *const __m128i);
                *vc = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
            }
        }
        (d, v)
    }
}

/// Block `b` of `R` runs in registers through every key, one key widened at a time.
///
/// # Safety
/// As `axpy_avx2`, for these runs.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn runs_avx2<const R: usize>(
    out: *mut f32,
    n: usize,
    a: *const f32,
    w: WeightStrides,
    rows: &[&[u8]],
    b: usize,
) {
    // SAFETY: as the caller guarantees: each row's block `b`, each run's weights for every key.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        for (i, acc) in acc.iter_mut().enumerate() {
            for (c, acc) in acc.iter_mut().enumerate() {
                *acc = _mm256_loadu_ps(out.add(i * n + 8 * c));
            }
        }
        for (k, row) in rows.chunks_exact(1).enumerate() {
            let ([d], [v]) = widen_avx2::<1>(row, b);
            for (i, acc) in acc.iter_mut().enumerate() {
                let ad = _mm256_set1_ps(*a.add(i * w.run + k * w.key) * d);
                for (acc, vc) in acc.iter_mut().zip(&v) {
                    *acc = _mm256_fmadd_ps(ad, *vc, *acc);
                }
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            for (c, acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.add(i * n + 8 * c), *acc);
            }
        }
    }
}
