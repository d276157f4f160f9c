//! Every SIMD kernel against its scalar twin, and ggml's synthetic accuracy test.
use alloc::string::ToString;
use alloc::vec;
use alloc::vec::Vec;

use proptest::prelude::*;

use super::*;
use crate::quant::test_data::{array_rmse, ggml_signal};
use crate::quant::{
    dequantize_blocks, dequantize_row, q16, q8k, quantize_blocks, quantize_row, ActivationFormat,
    BlockQ16, BlockQ8K,
};

/// A row of `format` made from `x`: the reference quantizer's bytes, or for the k-quants (which
/// sapient reads but does not write) super-blocks whose every quant and packed scale byte comes
/// from `x`'s bits, so that any bit pattern occurs, and whose f16 scales are finite and follow
/// `x`'s magnitude.
fn quantized(format: Format, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; format.row_bytes(x.len()).unwrap()];
    if !is_k(format) {
        quantize_row(format, x, &mut q).unwrap();
        return q;
    }
    for (sb, xs) in q
        .chunks_exact_mut(format.block_bytes())
        .zip(x.chunks_exact(quant::k_quants::QK_K))
    {
        for (i, b) in sb.iter_mut().enumerate() {
            let v = xs[i % xs.len()].to_bits().rotate_left(i as u32 % 32);
            *b = (v ^ (v >> 8) ^ (v >> 16) ^ (v >> 24)) as u8;
        }
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs())).min(1e30);
        set_k_scales(format, sb, amax);
    }
    q
}

/// The f16 scales of a k-quant super-block `sb`, finite and following `amax`.
fn set_k_scales(format: Format, sb: &mut [u8], amax: f32) {
    let d = half::f16::from_f32((amax / 512.0).min(6e4))
        .to_bits()
        .to_le_bytes();
    let dmin = half::f16::from_f32((amax / 2048.0).min(6e4))
        .to_bits()
        .to_le_bytes();
    {
        match format {
            Format::Q2K => {
                sb[80..82].copy_from_slice(&d);
                sb[82..84].copy_from_slice(&dmin);
            }
            Format::Q3K => sb[108..110].copy_from_slice(&d),
            Format::Q6K => sb[208..210].copy_from_slice(&d),
            Format::IQ4XS
            | Format::IQ3S
            | Format::IQ3XXS
            | Format::IQ2XXS
            | Format::IQ2XS
            | Format::IQ2S
            | Format::IQ1S => sb[..2].copy_from_slice(&d),
            Format::IQ1M => quant::BlockIQ1M::set_d_bits(sb, u16::from_le_bytes(d)),
            Format::TQ1_0 => sb[52..54].copy_from_slice(&d),
            Format::TQ2_0 => sb[64..66].copy_from_slice(&d),
            _ => {
                sb[..2].copy_from_slice(&d);
                sb[2..4].copy_from_slice(&dmin);
            }
        }
    }
}

fn is_k(format: Format) -> bool {
    format.block_len() == quant::k_quants::QK_K
}

/// A row length for `format` from a block count: `blocks` blocks of 32, or for the k-quants one
/// to `K_SUPERS` super-blocks.
/// `rows` weight rows in `format` made from `w` by scaling and rotating it.
fn scaled_rows(format: Format, w: &[f32], rows: usize) -> Vec<Vec<u8>> {
    let n = w.len();
    (0..rows)
        .map(|r| {
            let k = [1.0, -0.5, 2.0, 0.25][r % 4] * (1 + r / 4) as f32;
            let wr: Vec<f32> = (0..n).map(|i| w[(i + 7 * r) % n] * k).collect();
            quantized(format, &wr)
        })
        .collect()
}

/// The most super-blocks in a k-quant test row: more than twice the four that the one-row dot
/// adds across at once, so that whole groups and every remainder meet.
const K_SUPERS: usize = 9;

/// Values enough for the longest test row of any format.
const ROW_VALUES: usize = K_SUPERS * quant::k_quants::QK_K;

fn row_len(format: Format, blocks: usize) -> usize {
    if is_k(format) {
        quant::k_quants::QK_K * (1 + blocks % K_SUPERS)
    } else {
        blocks * QK
    }
}

/// Activations as the reference Q16 quantizer gives them.
fn q16_row(x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; q16::row_bytes(x.len())];
    quantize_blocks::<BlockQ16>(x, &mut q);
    q
}

/// Activations for weights in `format`, as the reference quantizer of its activation format
/// gives them.
fn acts_row(format: Format, x: &[f32]) -> Vec<u8> {
    match format.activation_format() {
        Some(ActivationFormat::Q8K) => {
            let mut q = vec![0u8; q8k::row_bytes(x.len())];
            q8k::quantize_row(x, &mut q);
            q
        }
        _ => q16_row(x),
    }
}

/// The values of `n` activations quantized for weights in `format`.
fn acts_values(format: Format, x: &[u8], n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    match format.activation_format() {
        Some(ActivationFormat::Q8K) => {
            for (b, out) in x
                .chunks_exact(BlockQ8K::BYTES)
                .zip(v.chunks_exact_mut(quant::k_quants::QK_K))
            {
                let b = BlockQ8K::read(b);
                for (o, q) in out.iter_mut().zip(b.qs) {
                    *o = b.d * q as f32;
                }
            }
        }
        _ => dequantize_blocks::<BlockQ16>(x, &mut v),
    }
    v
}

/// Whether `format`'s dots are exact integer sums scaled in one order, so that every table and
/// tile shape must give the scalar bits (the k-quants with Q8K activations).
fn exact(format: Format) -> bool {
    format.activation_format() == Some(ActivationFormat::Q8K)
}

/// Values spanning tiny, ordinary and huge magnitudes, and exact zeros.
fn values(len: usize) -> impl Strategy<Value = Vec<f32>> {
    let v = prop_oneof![
        4 => -10.0f32..10.0,
        1 => -1e-30f32..1e-30,
        1 => -1e30f32..1e30,
        1 => Just(0.0f32),
    ];
    proptest::collection::vec(v, len)
}

/// The scale against which float rounding error is measured: Σ(|d·q| + |m|)·|x| over the
/// weights' blocks (a k-quant's halves), the sizes of the terms the kernels round (with a minimum
/// `m`, the scaled sum and `m·Σx` can nearly cancel, so Σ|w·x| alone would understate them).
fn abs_dot(format: Format, w: &[u8], x: &[u8], n: usize) -> f32 {
    use super::scalar::Unpack;
    use crate::quant::KBlock;
    fn k_terms<K: KBlock>(w: &[u8], x: &[f32]) -> f32 {
        let mut sum = 0f32;
        for (sb, xs) in w.chunks_exact(K::BYTES).zip(x.chunks_exact(256)) {
            let (d, dmin) = K::d_dmin(sb);
            let ints = K::ints(sb);
            for (j, xb) in xs.chunks_exact(QK).enumerate() {
                for (l, (q, x)) in K::quants(sb, j).iter().zip(xb).enumerate() {
                    let (scale, min) = (ints.scales[2 * j + l / 16], ints.mins[2 * j + l / 16]);
                    let v = d * scale as f32 * (*q as i32 - K::OFFSET) as f32;
                    sum += (v.abs() + (dmin * min as f32).abs()) * x.abs();
                }
            }
        }
        sum
    }
    fn terms<W: Unpack>(w: &[u8], x: &[f32]) -> f32 {
        let mut sum = 0f32;
        for (b, xb) in x.chunks_exact(QK).take(w.len() / W::BYTES).enumerate() {
            let (d, m, q) = super::scalar::unpack_at::<W>(w, b);
            for (q, x) in q.iter().zip(xb) {
                sum += ((d * *q as f32).abs() + m.abs()) * x.abs();
            }
        }
        sum
    }
    let xs = acts_values(format, x, n);
    match format {
        Format::Q8_0 => terms::<quant::BlockQ8_0>(w, &xs),
        Format::Q4_0 => terms::<quant::BlockQ4_0>(w, &xs),
        Format::Q4_1 => terms::<quant::BlockQ4_1>(w, &xs),
        Format::Q5_0 => terms::<quant::BlockQ5_0>(w, &xs),
        Format::Q5_1 => terms::<quant::BlockQ5_1>(w, &xs),
        Format::Q2K => k_terms::<quant::BlockQ2K>(w, &xs),
        Format::Q3K => k_terms::<quant::BlockQ3K>(w, &xs),
        Format::Q4K => k_terms::<quant::BlockQ4K>(w, &xs),
        Format::Q5K => k_terms::<quant::BlockQ5K>(w, &xs),
        Format::Q6K => k_terms::<quant::BlockQ6K>(w, &xs),
        Format::IQ4NL => terms::<quant::BlockIQ4NL>(w, &xs),
        Format::IQ4XS => k_terms::<quant::BlockIQ4XS>(w, &xs),
        Format::IQ3S => k_terms::<quant::BlockIQ3S>(w, &xs),
        Format::IQ3XXS => k_terms::<quant::BlockIQ3XXS>(w, &xs),
        Format::IQ2XXS => k_terms::<quant::BlockIQ2XXS>(w, &xs),
        Format::IQ2XS => k_terms::<quant::BlockIQ2XS>(w, &xs),
        Format::IQ2S => k_terms::<quant::BlockIQ2S>(w, &xs),
        Format::IQ1S => k_terms::<quant::BlockIQ1S>(w, &xs),
        Format::IQ1M => k_terms::<quant::BlockIQ1M>(w, &xs),
        Format::TQ1_0 => k_terms::<quant::BlockTQ1_0>(w, &xs),
        Format::TQ2_0 => k_terms::<quant::BlockTQ2_0>(w, &xs),
        other => unreachable!("{other} is not quantized"),
    }
}

/// `simd` within `bound` of `scalar`; where the sum overflows f32 (a 1e30 weight squared, or an
/// f16 scale that rounds to infinity), both must overflow.
fn close(scalar: f32, simd: f32, bound: f32) -> Result<(), TestCaseError> {
    if !scalar.is_finite() || !bound.is_finite() {
        prop_assert!(
            !simd.is_finite() || !bound.is_finite(),
            "scalar {scalar} simd {simd}"
        );
    } else {
        prop_assert!(
            (scalar - simd).abs() <= bound,
            "scalar {scalar} simd {simd} bound {bound}"
        );
    }
    Ok(())
}

/// The formats with a reference quantizer.
const WRITABLE: [Format; 6] = [
    Format::Q8_0,
    Format::Q4_0,
    Format::Q4_1,
    Format::Q5_0,
    Format::Q5_1,
    Format::IQ4NL,
];

use crate::quant::QUANTIZED;

/// A softmax step over no keys, a stride of zero or more rows than the stride holds neither
/// panics nor moves a row it has no scores for.
#[test]
fn runnable_finds_each_table_this_cpu_runs_by_name() {
    assert!(core::ptr::eq(
        Kernels::runnable("scalar").unwrap(),
        Kernels::scalar()
    ));
    for (k, runs) in Kernels::simd_tables() {
        let found = Kernels::runnable(k.name);
        assert_eq!(found.is_some(), runs(), "{}", k.name);
        assert!(found.is_none_or(|f| core::ptr::eq(f, *k)), "{}", k.name);
    }
    let names: Vec<_> = Kernels::runnable_tables().map(|k| k.name).collect();
    assert_eq!(names[0], "scalar");
    assert_eq!(names.len(), 1 + simd_tables().len());
    assert!(Kernels::runnable("").is_none());
    assert!(Kernels::runnable("avx2 ").is_none());
}

#[test]
fn softmax_step_takes_any_shape() {
    let mut tables = simd_tables();
    tables.push(Kernels::scalar());
    for k in tables {
        for (len, stride, n) in [
            (0usize, 4usize, 3),
            (3, 8, 5),
            (8, 0, 2),
            (12, 4, 9),
            (64, 32, 40),
        ] {
            let mut s: Vec<f32> = (0..len).map(|i| i as f32 * 0.5).collect();
            let live = vec![(0, usize::MAX); n];
            let (mut max, mut sum, mut rescale) = (vec![1.0; n], vec![2.0; n], vec![f32::NAN; n]);
            let mut rows = crate::ops::SoftmaxRows {
                live: &live,
                max: &mut max,
                sum: &mut sum,
                rescale: &mut rescale,
            };
            (k.softmax_step)(&mut s, stride, 0.5, &mut rows);
            let keys = len.checked_div(stride).unwrap_or(0);
            for i in 0..n {
                if keys == 0 || i >= stride {
                    assert_eq!(
                        (max[i], sum[i]),
                        (1.0, 2.0),
                        "{} {len} {stride} {n}",
                        k.name
                    );
                } else {
                    assert!(
                        sum[i] > 0.0 && rescale[i] <= 1.0,
                        "{} {len} {stride} {n}",
                        k.name
                    );
                }
            }
        }
    }
}

/// One row's step of attention's online softmax on its own, as attention takes a tile of rows
/// or fewer: the live scores scaled into a row, the maximum raised (the sum rescaled), then
/// `ops::exp_sub`. The row's probabilities by key, its maximum, sum and rescale factor.
fn softmax_row_alone(
    scores: &[f32],
    (a, b): (usize, usize),
    scale: f32,
    (max, sum): (f32, f32),
) -> (Vec<f32>, f32, f32, f32) {
    let b = b.min(scores.len());
    let mut probs = vec![0f32; scores.len()];
    if a >= b {
        return (probs, max, sum, 1.0);
    }
    let live = &mut probs[a..b];
    for (p, s) in live.iter_mut().zip(&scores[a..b]) {
        *p = s * scale;
    }
    let top = live
        .iter()
        .fold(f32::NEG_INFINITY, |m, v| crate::ops::running_max(m, *v));
    let (mut max, mut sum, mut rescale) = (max, sum, 1.0);
    if top > max {
        rescale = crate::ops::exp(max - top);
        sum *= rescale;
        max = top;
    }
    sum += crate::ops::exp_sub(live, max);
    (probs, max, sum, rescale)
}

/// The SIMD tables this CPU runs, each checked against the scalar twin by the property tests
/// (not only the one `Kernels::best` picks: the others ship to other CPUs). Those this CPU cannot
/// run are named on stderr, past the test harness's capture, so that a run that skipped them
/// says so.
fn simd_tables() -> Vec<&'static Kernels> {
    let mut runnable = Vec::new();
    for (table, runs) in Kernels::simd_tables() {
        if runs() {
            runnable.push(*table);
        } else {
            not_tested(table.name);
        }
    }
    runnable
}

/// Says once per process, on stderr, that `table`'s kernels went untested on this CPU.
fn not_tested(table: &'static str) {
    use std::io::Write;
    static SAID: std::sync::Mutex<Vec<&str>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap();
    if !said.contains(&table) {
        said.push(table);
        let _ = writeln!(
            std::io::stderr(),
            "note: the {table} kernels are not tested here: this CPU lacks their features"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// The SIMD activation quantizer is bit-exact with the reference, NaN and infinities included.
    #[test]
    #[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
    fn quantize_q8_0_is_bit_exact(blocks in 1usize..12, x in values(12 * 32), specials in proptest::collection::vec((0usize..384, prop_oneof![Just(f32::NAN), Just(f32::INFINITY), Just(f32::NEG_INFINITY), Just(-0.0f32), Just(f32::MIN_POSITIVE / 4.0)]), 0..4)) {
        for k in simd_tables() {
            let mut x = x[..blocks * 32].to_vec();
            for &(i, v) in &specials {
                if i < x.len() { x[i] = v; }
            }
            let reference = quantized(Format::Q8_0, &x);
            let mut simd = vec![0u8; reference.len()];
            k.quantize_q8_0(&x, &mut simd).unwrap();
            prop_assert_eq!(simd, reference);
        }
    }

    /// The SIMD Q16 quantizer is bit-exact with the reference, NaN and infinities included.
    #[test]
    #[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
    fn quantize_q16_is_bit_exact(blocks in 1usize..12, x in values(12 * 32), specials in proptest::collection::vec((0usize..384, prop_oneof![Just(f32::NAN), Just(f32::INFINITY), Just(f32::NEG_INFINITY), Just(-0.0f32), Just(f32::MIN_POSITIVE / 4.0)]), 0..4)) {
        for k in simd_tables() {
            let mut x = x[..blocks * 32].to_vec();
            for &(i, v) in &specials {
                if i < x.len() { x[i] = v; }
            }
            let reference = q16_row(&x);
            let mut simd = vec![0u8; reference.len()];
            k.quantize_q16(&x, &mut simd).unwrap();
            prop_assert_eq!(simd, reference);
        }
    }

    /// The SIMD Q8K quantizer is bit-exact with the reference, NaN and infinities included.
    #[test]
    #[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
    fn quantize_q8k_is_bit_exact(blocks in 1usize..4, x in values(4 * 256), specials in proptest::collection::vec((0usize..1024, prop_oneof![Just(f32::NAN), Just(f32::INFINITY), Just(f32::NEG_INFINITY), Just(-0.0f32), Just(f32::MIN_POSITIVE / 4.0)]), 0..4)) {
        for k in simd_tables() {
            let mut x = x[..blocks * 256].to_vec();
            for &(i, v) in &specials {
                if i < x.len() { x[i] = v; }
            }
            let reference = acts_row(Format::Q4K, &x);
            let mut simd = vec![0u8; reference.len()];
            k.quantize_q8k(&x, &mut simd).unwrap();
            prop_assert_eq!(simd, reference);
        }
    }

    /// Each quantized dot shape agrees with the scalar reference within 1e-5 of Σ|w·x|: both add
    /// the same per-block integer sums, only in another order; with Q8K activations, bit for bit.
    #[test]
    #[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
    fn quantized_dots_match_scalar(blocks in 1usize..20, w in values(ROW_VALUES), xs in proptest::collection::vec(values(ROW_VALUES), TILE)) {
        for k in simd_tables() {
            for format in QUANTIZED {
                let n = row_len(format, blocks);
                let xq: Vec<Vec<u8>> = xs.iter().map(|x| acts_row(format, &x[..n])).collect();
                let xs = core::array::from_fn(|i| xq[i].as_slice());
                // Four rows: these weights and others made from them.
                let wq: Vec<Vec<u8>> = [1.0, -0.5, 2.0, 0.25].iter().map(|k| {
                    let wr: Vec<f32> = w[..n].iter().map(|v| v * k).collect();
                    quantized(format, &wr)
                }).collect();
                let w4: [&[u8]; 4] = core::array::from_fn(|r| wq[r].as_slice());
                let dots = k.dots(format).unwrap();
                let x4 = (dots.x4)(w4[0], xs);
                let pair = (dots.rows2x4)([w4[0], w4[1]], xs);
                let quads: Vec<[f32; 4]> = xs.iter().map(|x| (dots.rows4)(w4, x)).collect();
                for (t, x) in xq.iter().enumerate() {
                    for (r, wr) in wq.iter().enumerate() {
                        let s = Kernels::scalar().dot_quantized(format, wr, x).unwrap();
                        let one = k.dot_quantized(format, wr, x).unwrap();
                        if exact(format) {
                            let mut got = vec![one, quads[t][r]];
                            if r < 2 {
                                got.push(pair[r][t]);
                            }
                            if r == 0 {
                                got.push(x4[t]);
                            }
                            for v in got {
                                prop_assert_eq!(v.to_bits(), s.to_bits(), "{} {} r{} t{}", k.name, format, r, t);
                            }
                            continue;
                        }
                        let bound = 1e-5 * abs_dot(format, wr, x, n) + f32::MIN_POSITIVE;
                        close(s, one, bound)?;
                        close(s, quads[t][r], bound)?;
                        if r < 2 {
                            close(s, pair[r][t], bound)?;
                        }
                        if r == 0 {
                            close(s, x4[t], bound)?;
                        }
                    }
                }
            }
        }
    }

    /// The panel kernels (where the table has them): packing is byte-exact with the reference
    /// packer, padding rows included; the packed dot and the unpacked rows, one token or a tile at
    /// a time, give the same bits for every (row, token), within 1e-5 of Σ|w·x| of the scalar dot; and a packed dot split in two
    /// chunks of blocks gives the bits of one.
    #[test]
    #[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
    fn panel_kernels_match_scalar(blocks in 1usize..20, split in 0usize..20, w in values(ROW_VALUES), xs in proptest::collection::vec(values(ROW_VALUES), TILE), rows in 1usize..=panel::PANEL) {
        for k in simd_tables() {
            for format in QUANTIZED {
                let Some(kernels) = &k.dots(format).unwrap().panel else {
                    continue;
                };
                let n = row_len(format, blocks);
                let blocks = n / QK;
                let split = split.min(blocks);
                let xq: Vec<Vec<u8>> = xs.iter().map(|x| q16_row(&x[..n])).collect();
                let xs: [&[u8]; TILE] = core::array::from_fn(|i| xq[i].as_slice());
                let wq = scaled_rows(format, &w[..n], rows);
                let panel: [Option<&[u8]>; panel::PANEL] = core::array::from_fn(|r| wq.get(r).map(Vec::as_slice));
                let mut packed = vec![0u8; blocks * panel::PANEL_BLOCK_BYTES];
                (kernels.pack)(&panel, 0, &mut packed);
                let mut reference = vec![0u8; packed.len()];
                match format {
                    Format::Q8_0 => panel::pack_ref::<quant::BlockQ8_0>(&panel, 0, &mut reference),
                    Format::Q4_0 => panel::pack_ref::<quant::BlockQ4_0>(&panel, 0, &mut reference),
                    Format::Q4_1 => panel::pack_ref::<quant::BlockQ4_1>(&panel, 0, &mut reference),
                    Format::Q5_0 => panel::pack_ref::<quant::BlockQ5_0>(&panel, 0, &mut reference),
                    Format::Q5_1 => panel::pack_ref::<quant::BlockQ5_1>(&panel, 0, &mut reference),
                    Format::IQ4NL => panel::pack_ref::<quant::BlockIQ4NL>(&panel, 0, &mut reference),
                    other => unreachable!("{other} has no panel kernels"),
                }
                prop_assert!(packed == reference, "{format}: packing differs");

                let mut acc = [[0f32; panel::PANEL]; TILE];
                (kernels.dot)(&packed, xs, &mut acc);
                let mut chunked = [[0f32; panel::PANEL]; TILE];
                let at = split * panel::PANEL_BLOCK_BYTES;
                (kernels.dot)(&packed[..at], xs, &mut chunked);
                (kernels.dot)(&packed[at..], xs.map(|x| &x[split * BlockQ16::BYTES..]), &mut chunked);
                prop_assert!(acc.map(|a| a.map(f32::to_bits)) == chunked.map(|a| a.map(f32::to_bits)), "{format}: chunks differ");

                let padded: [&[u8]; panel::PANEL] = core::array::from_fn(|r| wq[r.min(rows - 1)].as_slice());
                let unpacked_tile = (kernels.rows_x4)(padded, xs);
                for (t, x) in xq.iter().enumerate() {
                    let unpacked = (kernels.rows)(padded, x);
                    for (r, wr) in wq.iter().enumerate() {
                        prop_assert_eq!(unpacked[r].to_bits(), acc[t][r].to_bits(), "{} r{} t{}", format, r, t);
                        prop_assert_eq!(unpacked_tile[t][r].to_bits(), acc[t][r].to_bits(), "{} tile r{} t{}", format, r, t);
                        let s = Kernels::scalar().dot_quantized(format, wr, x).unwrap();
                        let bound = 1e-5 * abs_dot(format, wr, x, n) + f32::MIN_POSITIVE;
                        close(s, acc[t][r], bound)?;
                    }
                    for (r, v) in acc[t].iter().enumerate().skip(rows) {
                        prop_assert_eq!(*v, 0.0, "padding row {}", r);
                    }
                }
            }
        }
    }

    /// The k-quants' many-token kernels: unpacking and transposing are exact with the
    /// references, and unpacked rows against a transposed tile, super-block after super-block,
    /// give every (row, token) the scalar kernel's bits. (Only x86 and aarch64 tables have them;
    /// under Node.js's WASI this test and the next together made Node crash on exit, one run
    /// in five, after every test had passed.)
    #[test]
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
    fn k_panel_kernels_match_scalar(supers in 1usize..4, w in values(3 * 256), xs in proptest::collection::vec(values(3 * 256), k_panel::K_TOKENS), rows in 1usize..=20, tokens in 1usize..=k_panel::K_TOKENS) {
        use k_panel::{transpose_ref, unpack_ref, KRow, KTokens, K_MICRO, K_TOKENS};
        for k in simd_tables() {
            for format in QUANTIZED {
                let Some(kernels) = &k.dots(format).unwrap().k_panel else {
                    continue;
                };
                let n = supers * quant::k_quants::QK_K;
                let xq: Vec<Vec<u8>> = xs.iter().map(|x| acts_row(format, &x[..n])).collect();
                let x16: [&[u8]; K_TOKENS] = core::array::from_fn(|t| xq[t].as_slice());
                let wq = scaled_rows(format, &w[..n], rows);
                let padded = rows.next_multiple_of(K_MICRO);
                let ws: Vec<&[u8]> = (0..padded).map(|r| wq[r.min(rows - 1)].as_slice()).collect();
                let mut acc = vec![[0f32; K_TOKENS]; padded];
                for s in 0..supers {
                    let mut unpacked = vec![KRow::ZERO; padded];
                    (kernels.unpack)(&ws, s, &mut unpacked);
                    let fold = kernels.folds_scales;
                    for (r, u) in unpacked.iter().enumerate() {
                        let reference = match format {
                            Format::Q2K => unpack_ref::<quant::BlockQ2K>(ws[r], s, fold),
                            Format::Q3K => unpack_ref::<quant::BlockQ3K>(ws[r], s, fold),
                            Format::Q4K => unpack_ref::<quant::BlockQ4K>(ws[r], s, fold),
                            Format::Q5K => unpack_ref::<quant::BlockQ5K>(ws[r], s, fold),
                            Format::Q6K => unpack_ref::<quant::BlockQ6K>(ws[r], s, fold),
                            Format::IQ4XS => unpack_ref::<quant::BlockIQ4XS>(ws[r], s, fold),
                            Format::IQ3S => unpack_ref::<quant::BlockIQ3S>(ws[r], s, fold),
                            Format::IQ3XXS => unpack_ref::<quant::BlockIQ3XXS>(ws[r], s, fold),
                            Format::IQ2XXS => unpack_ref::<quant::BlockIQ2XXS>(ws[r], s, fold),
                            Format::IQ2XS => unpack_ref::<quant::BlockIQ2XS>(ws[r], s, fold),
                            Format::IQ2S => unpack_ref::<quant::BlockIQ2S>(ws[r], s, fold),
                            Format::IQ1S => unpack_ref::<quant::BlockIQ1S>(ws[r], s, fold),
                            Format::IQ1M => unpack_ref::<quant::BlockIQ1M>(ws[r], s, fold),
                            Format::TQ1_0 => unpack_ref::<quant::BlockTQ1_0>(ws[r], s, fold),
                            Format::TQ2_0 => unpack_ref::<quant::BlockTQ2_0>(ws[r], s, fold),
                            other => unreachable!("{other} has no k-panel kernels"),
                        };
                        prop_assert!(*u == reference, "{}: row {} super-block {} unpacks differently", format, r, s);
                    }
                    let mut tile = KTokens::ZERO;
                    (kernels.transpose)(x16, s, &mut tile);
                    prop_assert!(tile == transpose_ref(x16, s), "{}: super-block {} transposes differently", format, s);
                    (kernels.dot)(&unpacked, &tile, tokens, &mut acc);
                }
                // The tile's first `tokens` (the kernel may skip the others).
                for (r, wr) in wq.iter().enumerate() {
                    for (t, x) in x16.iter().enumerate().take(tokens) {
                        let s = Kernels::scalar().dot_quantized(format, wr, x).unwrap();
                        prop_assert_eq!(acc[r][t].to_bits(), s.to_bits(), "{} r{} t{}", format, r, t);
                    }
                }
            }
        }
    }

    /// One token against rows longer than the one-token kernel reads in one run (x86 reads
    /// 64 blocks of each row at a time): the packed panel's bits, for every run and every
    /// remainder of a group of eight (256-bit) or sixteen (512-bit) blocks; the tile of four
    /// tokens too.
    #[test]
    #[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
    fn one_token_over_long_rows_matches_the_panel(blocks in 60usize..140, w in values(140 * QK), x in values(140 * QK), rows in 1usize..=panel::PANEL) {
        for k in simd_tables() {
            for format in QUANTIZED {
                let Some(kernels) = &k.dots(format).unwrap().panel else {
                    continue;
                };
                let n = blocks * QK;
                let xq = q16_row(&x[..n]);
                let wq = scaled_rows(format, &w[..n], rows);
                let panel: [Option<&[u8]>; panel::PANEL] = core::array::from_fn(|r| wq.get(r).map(Vec::as_slice));
                let mut packed = vec![0u8; blocks * panel::PANEL_BLOCK_BYTES];
                (kernels.pack)(&panel, 0, &mut packed);
                let mut acc = [[0f32; panel::PANEL]; TILE];
                (kernels.dot)(&packed, [xq.as_slice(); TILE], &mut acc);
                let padded: [&[u8]; panel::PANEL] = core::array::from_fn(|r| wq[r.min(rows - 1)].as_slice());
                let one = (kernels.rows)(padded, &xq);
                let tile = (kernels.rows_x4)(padded, [xq.as_slice(); TILE]);
                for r in 0..rows {
                    prop_assert_eq!(one[r].to_bits(), acc[0][r].to_bits(), "{} {} r{}", k.name, format, r);
                    for t in &tile {
                        prop_assert_eq!(t[r].to_bits(), acc[0][r].to_bits(), "{} {} tile r{}", k.name, format, r);
                    }
                }
            }
        }
    }

    /// The transposed tiles of eight tokens (each table's own layout): transposing from a block
    /// on gives that block's part of the whole, and weight rows against a tile, in one chunk of
    /// blocks or two, give every token the bits `rows` gives it alone.
    #[test]
    #[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
    fn transposed_tiles_match_the_rows_kernel(blocks in 1usize..20, split in 0usize..20, w in values(ROW_VALUES), xs in proptest::collection::vec(values(ROW_VALUES), panel::X8), rows in 1usize..=panel::PANEL) {
        for k in simd_tables() {
            for format in QUANTIZED {
                let Some(kernels) = &k.dots(format).unwrap().panel else {
                    continue;
                };
                let n = row_len(format, blocks);
                let blocks = n / QK;
                let split = split.min(blocks);
                let xq: Vec<Vec<u8>> = xs.iter().map(|x| q16_row(&x[..n])).collect();
                let xs: [&[u8]; panel::X8] = core::array::from_fn(|i| xq[i].as_slice());
                let mut transposed = vec![0u8; blocks * panel::X8_BLOCK_BYTES];
                (kernels.transpose_x8)(xs, 0, &mut transposed);
                let mut tail = vec![0u8; (blocks - split) * panel::X8_BLOCK_BYTES];
                (kernels.transpose_x8)(xs, split, &mut tail);
                prop_assert!(tail[..] == transposed[split * panel::X8_BLOCK_BYTES..], "transposing from block {} differs", split);

                // The rows of one matrix (a fixed stride apart, as a mat-mul passes them), and
                // rows apart in memory with the last repeated, as the mat-mul pads them.
                let wq = scaled_rows(format, &w[..n], panel::PANEL);
                let matrix = wq.concat();
                let in_matrix: [&[u8]; panel::PANEL] = core::array::from_fn(|r| &matrix[r * wq[0].len()..][..wq[0].len()]);
                let padded: [&[u8]; panel::PANEL] = core::array::from_fn(|r| wq[r.min(rows - 1)].as_slice());
                for (layout, w16) in [("strided", in_matrix), ("padded", padded)] {
                    let alone: Vec<[f32; panel::PANEL]> = xq.iter().map(|x| (kernels.rows)(w16, x)).collect();
                    for r0 in (0..panel::PANEL).step_by(panel::X8_ROWS) {
                        let group: [&[u8]; panel::X8_ROWS] = core::array::from_fn(|i| w16[r0 + i]);
                        let mut whole = [[0f32; panel::X8]; panel::X8_ROWS];
                        (kernels.rows_x8)(group, 0, &transposed, &mut whole);
                        let mut chunked = [[0f32; panel::X8]; panel::X8_ROWS];
                        let at = split * panel::X8_BLOCK_BYTES;
                        (kernels.rows_x8)(group, 0, &transposed[..at], &mut chunked);
                        (kernels.rows_x8)(group, split, &transposed[at..], &mut chunked);
                        for i in 0..panel::X8_ROWS {
                            let r = r0 + i;
                            for t in 0..panel::X8 {
                                prop_assert_eq!(whole[i][t].to_bits(), alone[t][r].to_bits(), "{} {} {} r{} t{}", k.name, format, layout, r, t);
                                prop_assert_eq!(chunked[i][t].to_bits(), alone[t][r].to_bits(), "{} {} {} chunked r{} t{}", k.name, format, layout, r, t);
                            }
                        }
                    }
                }
            }
        }
    }

    /// SiLU·mul and the softmax's exponentials give the scalar table's bits on any length,
    /// NaN, infinities and huge values included.
    #[test]
    #[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
    fn elementwise_kernels_are_bit_exact(len in 0usize..100, x in values(100), y in values(100), m in -50f32..50.0, specials in proptest::collection::vec((0usize..100, prop_oneof![Just(f32::NAN), Just(f32::INFINITY), Just(f32::NEG_INFINITY), Just(-0.0f32), Just(88.0f32), Just(-100.0f32)]), 0..4)) {
        for k in simd_tables() {
            let mut x = x[..len].to_vec();
            for &(i, v) in &specials {
                if i < len { x[i] = v; }
            }
            let (best, scalar) = (k, Kernels::scalar());
            let (mut a, mut b) = (x.clone(), x.clone());
            (best.silu_mul)(&mut a, &y);
            (scalar.silu_mul)(&mut b, &y);
            prop_assert_eq!(a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            let (mut a, mut b) = (x.clone(), x);
            prop_assert_eq!((best.exp_sub)(&mut a, m).to_bits(), (scalar.exp_sub)(&mut b, m).to_bits());
            prop_assert_eq!(a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        }
    }

    /// A value row added into several runs by their weights gives the scalar table's bits in
    /// every table, zero weights skipped, for runs and strides the weights cover or not.
    #[test]
    #[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
    fn add_weighted_is_bit_exact(len in 0usize..80, runs in 0usize..6, stride in 0usize..4, n_weights in 0usize..16, v in values(80), out in values(6 * 80), a in values(16)) {
        let mut tables = simd_tables();
        tables.push(Kernels::scalar());
        let (v, a) = (&v[..len], &a[..n_weights]);
        let mut want = out[..runs * len].to_vec();
        for (i, o) in want.chunks_exact_mut(len.max(1)).enumerate() {
            let Some(&w) = a.get(i * stride) else { break };
            if len > 0 && w != 0.0 {
                for (o, x) in o.iter_mut().zip(v) {
                    *o += w * x;
                }
            }
        }
        for k in tables {
            let mut got = out[..runs * len].to_vec();
            (k.add_weighted)(&mut got, a, stride, v);
            prop_assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "{}", k.name);
        }
    }

    /// A softmax step over rows side by side gives every row the bits it gets alone (attention's
    /// one-row-at-a-time arithmetic: `exp_sub` over its live keys), in every table, on strides
    /// that hold the vector lanes and strides that do not; the lanes past the rows keep their
    /// scores.
    #[test]
    #[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
    fn softmax_step_gives_each_row_its_own_bits(keys in 1usize..40, n in 1usize..40, pad in 0usize..24, scores in values(40 * 64), spans in proptest::collection::vec((0usize..45, 0usize..45), 40), start in proptest::collection::vec((prop_oneof![Just(f32::NEG_INFINITY), -20f32..20.0], 0f32..10.0), 40), scale in 0.01f32..1.0) {
        let stride = n + pad;
        let s = &scores[..keys * stride];
        let live = &spans[..n];
        let alone: Vec<_> = (0..n).map(|i| {
            let row: Vec<f32> = (0..keys).map(|j| s[j * stride + i]).collect();
            softmax_row_alone(&row, live[i], scale, start[i])
        }).collect();
        let mut tables = simd_tables();
        tables.push(Kernels::scalar());
        for k in tables {
            let mut s = s.to_vec();
            let (mut max, mut sum): (Vec<f32>, Vec<f32>) = start[..n].iter().copied().unzip();
            let mut rescale = vec![f32::NAN; n];
            let mut rows = crate::ops::SoftmaxRows { live, max: &mut max, sum: &mut sum, rescale: &mut rescale };
            (k.softmax_step)(&mut s, stride, scale, &mut rows);
            for (i, (p, m, total, r)) in alone.iter().enumerate() {
                let got: Vec<u32> = (0..keys).map(|j| s[j * stride + i].to_bits()).collect();
                prop_assert_eq!(got, p.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{} row {}", k.name, i);
                prop_assert_eq!((max[i].to_bits(), sum[i].to_bits(), rescale[i].to_bits()), (m.to_bits(), total.to_bits(), r.to_bits()), "{} row {}", k.name, i);
            }
            for j in 0..keys {
                for i in n..stride {
                    prop_assert_eq!(s[j * stride + i].to_bits(), scores[j * stride + i].to_bits());
                }
            }
        }
    }

    /// f16 widening is exact in every table: any bits (subnormals, infinities, NaNs) give the
    /// scalar conversion's value, for lengths around the vectors' eight and a shorter output.
    #[test]
    #[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
    fn f16_widening_is_exact(bits in proptest::collection::vec(any::<u16>(), 0..40), short in 0usize..3) {
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let len = bits.len().saturating_sub(short);
        for k in simd_tables() {
            let (mut a, mut b) = (vec![7.0f32; len], vec![7.0f32; len]);
            (k.widen_f16)(&bytes, &mut a);
            (Kernels::scalar().widen_f16)(&bytes, &mut b);
            for (x, y) in a.iter().zip(&b) {
                prop_assert!(x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()), "{x} vs {y}");
            }
        }
    }

    /// Quantized activations cost what their rounding allows: with Q16 next to nothing (a
    /// quantized dot within 1e-4 of Σ|w·x| of the f32 dot of the dequantized weights with the
    /// unquantized activations); with Q8K at most half a step of each super-block's activations
    /// times Σ|w| over it (plus 1e-5 of Σ|w·x| for the float sums).
    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri; run natively")]
    fn quantized_dots_track_f32_activations(blocks in 1usize..20, w in proptest::collection::vec(-4f32..4.0, ROW_VALUES), x in proptest::collection::vec(-30f32..30.0, ROW_VALUES)) {
        for format in QUANTIZED {
            let n = row_len(format, blocks);
            let xq = acts_row(format, &x[..n]);
            let wq = quantized(format, &w[..n]);
            let mut wd = vec![0f32; n];
            dequantize_row(format, &wq, &mut wd).unwrap();
            let exact: f64 = wd.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let scale: f64 = wd.iter().zip(&x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
            let bound = match format.activation_format() {
                Some(ActivationFormat::Q8K) => {
                    let steps = xq.chunks_exact(BlockQ8K::BYTES).map(|b| BlockQ8K::read(b).d as f64);
                    let rounding: f64 = wd.chunks(quant::k_quants::QK_K).zip(steps)
                        .map(|(w, d)| d / 2.0 * w.iter().map(|v| v.abs() as f64).sum::<f64>())
                        .sum();
                    rounding + 1e-5 * scale + 1e-6
                }
                _ => 1e-4 * scale + 1e-6,
            };
            for k in core::iter::once(Kernels::scalar()).chain(simd_tables()) {
                let got = k.dot_quantized(format, &wq, &xq).unwrap() as f64;
                prop_assert!((got - exact).abs() <= bound, "{} {format}: {got} vs {exact}", k.name);
            }
        }
    }

    /// f16 dots on any length, within 1e-5 of Σ|w·x| (of the f16 values).
    #[test]
    #[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
    fn f16_dots_match_scalar(len in 0usize..300, w in proptest::collection::vec(-100f32..100.0, 300), xs in proptest::collection::vec(values(300), TILE)) {
        for k in simd_tables() {
            let wb = quantized(Format::F16, &w[..len]);
            let mut wd = vec![0f32; len];
            dequantize_row(Format::F16, &wb, &mut wd).unwrap();
            let xs: [&[f32]; TILE] = core::array::from_fn(|i| &xs[i][..len]);
            let tile = (k.dot_f16_x4)(&wb, xs);
            for (i, x) in xs.iter().enumerate() {
                let s = Kernels::scalar().dot_f16_bytes(&wb, x).unwrap();
                let b = k.dot_f16_bytes(&wb, x).unwrap();
                let bound = 1e-5 * wd.iter().zip(x.iter()).map(|(a, b)| (a * b).abs()).sum::<f32>();
                close(s, b, bound)?;
                close(s, tile[i], bound)?;
            }
        }
    }

    /// bf16 dots on any length, within 1e-5 of Σ|w·x| (of the bf16 values).
    #[test]
    #[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
    fn bf16_dots_match_scalar(len in 0usize..300, w in values(300), xs in proptest::collection::vec(values(300), TILE)) {
        for k in simd_tables() {
            let wb = quantized(Format::BF16, &w[..len]);
            let mut wd = vec![0f32; len];
            dequantize_row(Format::BF16, &wb, &mut wd).unwrap();
            let xs: [&[f32]; TILE] = core::array::from_fn(|i| &xs[i][..len]);
            let tile = (k.dot_bf16_x4)(&wb, xs);
            for (i, x) in xs.iter().enumerate() {
                let exact: f32 = wd.iter().zip(x.iter()).map(|(a, b)| a * b).sum();
                let s = Kernels::scalar().dot_bf16_bytes(&wb, x).unwrap();
                let b = k.dot_bf16_bytes(&wb, x).unwrap();
                let bound = 1e-5 * wd.iter().zip(x.iter()).map(|(a, b)| (a * b).abs()).sum::<f32>() + f32::MIN_POSITIVE;
                close(exact, s, bound)?;
                close(s, b, bound)?;
                close(s, tile[i], bound)?;
            }
        }
    }

    /// f32 dots on any length (not only multiples of 32), within 1e-5 of Σ|w·x|.
    #[test]
    #[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
    fn f32_dots_match_scalar(len in 0usize..300, w in values(300), xs in proptest::collection::vec(values(300), TILE)) {
        for k in simd_tables() {
            let wb = quantized(Format::F32, &w[..len]);
            let xs: [&[f32]; TILE] = core::array::from_fn(|i| &xs[i][..len]);
            let tile = (k.dot_f32_x4)(&wb, xs);
            for (i, x) in xs.iter().enumerate() {
                let s = Kernels::scalar().dot_f32_bytes(&wb, x).unwrap();
                let b = k.dot_f32_bytes(&wb, x).unwrap();
                let bound = 1e-5 * w[..len].iter().zip(x.iter()).map(|(a, b)| (a * b).abs()).sum::<f32>();
                close(s, b, bound)?;
                close(s, tile[i], bound)?;
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    /// The Q8_0 axpy (one to a step of rows into one to six runs, the weights a row of keys per
    /// run or a row of runs per key, `gap` floats apart) agrees with the scalar one within float
    /// rounding of each term.
    #[test]
    #[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
    fn axpy_q8_0_matches_scalar(blocks in 1usize..5, n_rows in 1usize..12, runs in 1usize..7, gap in 0usize..3, key_major in proptest::bool::ANY, v in proptest::collection::vec(values(4 * 32), 11), out in proptest::collection::vec(-100f32..100.0, 6 * 4 * 32), a in proptest::collection::vec(-10f32..10.0, 96)) {
        let n = blocks * 32;
        let w = if key_major {
            WeightStrides { run: 1, key: runs + gap }
        } else {
            WeightStrides { run: n_rows + gap, key: 1 }
        };
        let rows: Vec<Vec<u8>> = v[..n_rows].iter().map(|v| quantized(Format::Q8_0, &v[..n])).collect();
        let rows: Vec<&[u8]> = rows.iter().map(|r| r.as_slice()).collect();
        // At most 5·1 + 10·8 + 1 = 86 weights (key-major) or 5·13 + 11 = 76 (by run).
        let a = &a[..(runs - 1) * w.run + (n_rows - 1) * w.key + 1];
        let (mut s, mut b) = (out[..runs * n].to_vec(), out[..runs * n].to_vec());
        Kernels::scalar().axpy_q8_0(&mut s, a, w, &rows).unwrap();
        Kernels::best().axpy_q8_0(&mut b, a, w, &rows).unwrap();
        let deq: Vec<Vec<f32>> = rows.iter().map(|r| {
            let mut d = vec![0f32; n];
            dequantize_row(Format::Q8_0, r, &mut d).unwrap();
            d
        }).collect();
        for i in 0..runs * n {
            let terms: f32 = (0..n_rows).map(|k| (a[i / n * w.run + k * w.key] * deq[k][i % n]).abs()).sum();
            let bound = 1e-6 * (terms + out[i].abs()) * n_rows as f32 + f32::MIN_POSITIVE;
            close(s[i], b[i], bound)?;
        }
    }
}

/// llama.cpp's `test-quantize-fns`: the SIMD quantizer against the reference, and the quantized
/// dot product against the f32 one, with ggml's thresholds.
#[test]
#[cfg_attr(miri, ignore = "too slow under Miri; run natively")]
fn ggml_reference_and_dot_product_error() {
    let n = 4096;
    let x = ggml_signal(0.0, n);
    let y = ggml_signal(1.0, n);

    let reference = quantized(Format::Q8_0, &x);
    let mut simd = vec![0u8; reference.len()];
    Kernels::best().quantize_q8_0(&x, &mut simd).unwrap();
    let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
    dequantize_row(Format::Q8_0, &reference, &mut a).unwrap();
    dequantize_row(Format::Q8_0, &simd, &mut b).unwrap();
    assert!(array_rmse(&a, &b) < 0.0001);

    let exact: f64 = x
        .iter()
        .zip(&y)
        .map(|(a, b)| (*a as f64) * (*b as f64))
        .sum();
    let mut yq = vec![0u8; q16::row_bytes(n)];
    Kernels::best().quantize_q16(&y, &mut yq).unwrap();
    for format in WRITABLE {
        let wq = quantized(format, &x);
        for k in [Kernels::scalar(), Kernels::best()] {
            let dot = k.dot_quantized(format, &wq, &yq).unwrap();
            let err = (dot as f64 - exact).abs() / n as f64;
            assert!(err < 0.02, "{format} {}: dot error {err}", k.name);
        }
    }
}

#[test]
fn mismatched_lengths_are_errors() {
    let k = Kernels::best();
    let w = vec![0u8; 72 * 2];
    assert!(matches!(
        k.dot_quantized(Format::Q8_0, &w[..68], &w[..72]),
        Err(Error::Length { .. })
    ));
    assert!(matches!(
        k.dot_quantized(Format::Q4_0, &w[..35], &w),
        Err(Error::NotBlockMultiple { .. })
    ));
    assert!(matches!(
        k.dot_quantized(Format::F32, &w, &w),
        Err(Error::UnsupportedFormat { .. })
    ));
    assert!(k.quantize_q8_0(&[0.0; 33], &mut [0u8; 34]).is_err());
    assert!(k.quantize_q16(&[0.0; 33], &mut [0u8; 72]).is_err());
    assert!(k.quantize_q16(&[0.0; 32], &mut [0u8; 71]).is_err());
    assert!(k.quantize_q8k(&[0.0; 255], &mut [0u8; 292]).is_err());
    assert!(k.quantize_q8k(&[0.0; 256], &mut [0u8; 291]).is_err());
    // A k-quant row with Q16 activations of its length: the wrong format, so the wrong size.
    let w = vec![0u8; Format::Q4K.block_bytes()];
    assert!(matches!(
        k.dot_quantized(Format::Q4K, &w, &q16_row(&[0.0; 256])),
        Err(Error::Length {
            what: "Q8K activations",
            ..
        })
    ));
    assert!(k.dot_f32_bytes(&[0u8; 8], &[1.0]).is_err());
    assert!(k.dot_f16_bytes(&[0u8; 8], &[1.0]).is_err());
    let row: &[u8] = &[0u8; 34];
    let by_run = |run| WeightStrides { run, key: 1 };
    assert!(k
        .axpy_q8_0(&mut [0.0; 64], &[1.0; 1], by_run(1), &[row])
        .is_err());
    assert!(k
        .axpy_q8_0(&mut [0.0; 64], &[1.0; 4], by_run(2), &[row, &[0u8; 68]])
        .is_err());
    assert!(k
        .axpy_q8_0(&mut [0.0; 48], &[1.0; 2], by_run(1), &[row])
        .is_err());
    assert!(k
        .axpy_q8_0(&mut [0.0; 64], &[1.0; 3], by_run(2), &[row; 2])
        .is_err());
    let by_key = |key| WeightStrides { run: 1, key };
    assert!(k
        .axpy_q8_0(&mut [0.0; 64], &[1.0; 4], by_key(3), &[row; 2])
        .is_err());
    assert!(k.axpy_q8_0(&mut [0.0; 32], &[], by_run(1), &[&[]]).is_err());
    assert!(k.axpy_q8_0(&mut [0.0; 32], &[1.0], by_run(1), &[]).is_err());
    assert!(k
        .axpy_q8_0(&mut [0.0; 64], &[1.0; 4], by_run(2), &[row; 2])
        .is_ok());
    assert!(k
        .axpy_q8_0(&mut [0.0; 64], &[1.0; 3], by_run(2), &[row; 1])
        .is_ok());
    assert!(k
        .axpy_q8_0(&mut [0.0; 64], &[1.0; 4], by_key(2), &[row; 2])
        .is_ok());
}

/// Which runs an axpy's weights cover: every key's weight inside the slice, whatever the
/// strides (runs sharing weights, strides whose products overflow).
#[test]
fn weight_strides_count_the_covered_runs() {
    let w = |run, key| WeightStrides { run, key };
    assert_eq!(w(4, 1).runs(12, 4, 9), 3);
    assert_eq!(w(4, 1).runs(11, 4, 9), 2);
    assert_eq!(w(1, 4).runs(12, 3, 9), 4);
    assert_eq!(w(1, 4).runs(12, 3, 2), 2);
    assert_eq!(w(0, 1).runs(4, 4, 9), 9);
    assert_eq!(w(0, 1).runs(3, 4, 9), 0);
    assert_eq!(w(1, 1).runs(8, 0, 9), 0);
    assert_eq!(w(1, usize::MAX).runs(8, 2, 9), 0);
    assert_eq!(w(usize::MAX, 1).runs(8, 2, 9), 1);
}

/// Faults that are not lengths get variants that say what they are: no message reads like
/// "expected 640, got 640".
#[test]
fn faults_name_what_is_wrong() {
    let k = Kernels::best();
    let row: &[u8] = &[0u8; 34];
    let axpy = k
        .axpy_q8_0(
            &mut [0.0; 32],
            &[1.0; 1],
            WeightStrides { run: 1, key: 1 },
            &[row; 2],
        )
        .unwrap_err();
    assert!(
        matches!(axpy, Error::InvalidArgument { what: "axpy", .. }),
        "{axpy}"
    );
    let m = Matrix::new(Format::Q8_0, 2, 32, vec![0u8; 68].into()).unwrap();
    let oob = m.dequantize_row(2, &mut [0.0; 32]).unwrap_err();
    assert_eq!(
        oob,
        Error::OutOfRange {
            what: "matrix row",
            index: 2,
            len: 2
        }
    );
    assert_eq!(
        oob.to_string(),
        "matrix row 2 is out of range (there are 2)"
    );
    let huge = Matrix::new(Format::Q8_0, usize::MAX, 32, vec![0u8; 68].into()).unwrap_err();
    assert!(matches!(huge, Error::Overflow { .. }), "{huge}");
    let xq = q16_row(&[0.5; 32]);
    let acts = Activations {
        f32: &[0.5; 32],
        q16: Some(&xq),
        q8k: None,
        transposed: None,
        k_tiles: None,
        n_tok: 1,
        cols: 32,
    };
    let past = k.matmul_rows(&m, &acts, 1, &mut [0.0; 2]).unwrap_err();
    assert!(
        matches!(
            past,
            Error::OutOfRange {
                index: 2,
                len: 2,
                ..
            }
        ),
        "{past}"
    );
    for e in [axpy, oob, huge, past] {
        assert!(!e.to_string().contains("expected length"), "{e}");
    }
}

/// The tiled mat-mul against plain per-row dots, for every weight format and a ragged token count,
/// in both output orders.
#[test]
#[cfg_attr(miri, ignore = "too slow under Miri; run natively")]
fn matmul_rows_equals_row_dots() {
    let (rows, cols, n_tok) = (70, 256, 11);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| libm::sinf(i as f32 * 0.37))
        .collect();
    let x: Vec<f32> = (0..n_tok * cols)
        .map(|i| libm::cosf(i as f32 * 0.11))
        .collect();
    let q16: Vec<u8> = x.chunks(cols).flat_map(q16_row).collect();
    let q8k: Vec<u8> = x
        .chunks(cols)
        .flat_map(|r| acts_row(Format::Q4K, r))
        .collect();
    let acts = Activations {
        f32: &x,
        q16: Some(&q16),
        q8k: Some(&q8k),
        transposed: None,
        k_tiles: None,
        n_tok,
        cols,
    };
    for format in [
        Format::F32,
        Format::F16,
        Format::BF16,
        Format::Q8_0,
        Format::Q4_0,
        Format::Q4_1,
        Format::Q5_0,
        Format::Q5_1,
        Format::Q2K,
        Format::Q3K,
        Format::Q4K,
        Format::Q5K,
        Format::Q6K,
    ] {
        let bytes: Vec<u8> = w.chunks(cols).flat_map(|r| quantized(format, r)).collect();
        let m = Matrix::new(format, rows, cols, bytes.into()).unwrap();
        let mut out = vec![0f32; (rows - 1) * n_tok];
        Kernels::best().matmul_rows(&m, &acts, 1, &mut out).unwrap();
        for r in 1..rows {
            for t in 0..n_tok {
                let expected = if let Some(to) = format.activation_format() {
                    let (xq, xb) = match to {
                        ActivationFormat::Q16 => (&q16, q16::row_bytes(cols)),
                        ActivationFormat::Q8K => (&q8k, q8k::row_bytes(cols)),
                    };
                    Kernels::scalar()
                        .dot_quantized(format, m.row(r), &xq[t * xb..(t + 1) * xb])
                        .unwrap()
                } else {
                    let mut wr = vec![0f32; cols];
                    dequantize_row(format, m.row(r), &mut wr).unwrap();
                    wr.iter()
                        .zip(&x[t * cols..(t + 1) * cols])
                        .map(|(a, b)| a * b)
                        .sum()
                };
                let got = out[t * (rows - 1) + r - 1];
                assert!(
                    (got - expected).abs() < 1e-4,
                    "{format} r{r} t{t}: {got} vs {expected}"
                );
            }
        }
        assert!(Kernels::best()
            .matmul_rows(&m, &acts, 1, &mut vec![0f32; rows * n_tok])
            .is_err());

        // Token order, from token 3 on: the same bits.
        let mut by_tok = vec![0f32; (n_tok - 3) * rows];
        Kernels::best()
            .matmul_tokens(&m, &acts, 3, &mut by_tok)
            .unwrap();
        for r in 1..rows {
            for t in 3..n_tok {
                assert_eq!(
                    by_tok[(t - 3) * rows + r].to_bits(),
                    out[t * (rows - 1) + r - 1].to_bits(),
                    "{format} r{r} t{t}"
                );
            }
        }
        assert!(Kernels::best()
            .matmul_tokens(&m, &acts, 4, &mut by_tok)
            .is_err());
    }
}

/// The build's CPU features pick the table: a `+dotprod` aarch64 build must run the `sdot` path.
#[test]
#[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
fn best_kernels_follow_the_cpu() {
    let name = Kernels::best().name;
    #[cfg(all(target_arch = "aarch64", target_feature = "dotprod"))]
    assert_eq!(name, "neon+dotprod");
    #[cfg(all(target_arch = "aarch64", not(target_feature = "dotprod")))]
    assert_eq!(name, "neon");
    #[cfg(target_arch = "x86_64")]
    assert_eq!(
        name,
        if x86::amx_available() {
            "avx2+avx512vl+amx"
        } else if x86::avx512_available() {
            "avx2+avx512vl"
        } else if x86::vnni_available() {
            "avx2+vnni"
        } else if x86::available() {
            "avx2"
        } else {
            "scalar"
        }
    );
    #[cfg(target_arch = "wasm32")]
    assert_eq!(
        name,
        if cfg!(target_feature = "simd128") {
            "simd128"
        } else {
            "scalar"
        }
    );
}

/// Every tile shape gives a (row, token) pair the very same bits, so batching, threads and row
/// pairing never change a result.
#[test]
#[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
fn tile_shapes_agree_bit_for_bit() {
    let n = 8 * 32;
    let rows: Vec<Vec<f32>> = (0..4)
        .map(|r| {
            (0..n)
                .map(|i| libm::sinf((i * 7 + r * 13) as f32 * 0.1))
                .collect()
        })
        .collect();
    let toks: Vec<Vec<f32>> = (0..4)
        .map(|t| {
            (0..n)
                .map(|i| libm::cosf((i * 3 + t * 5) as f32 * 0.2) * 3.0)
                .collect()
        })
        .collect();
    for format in QUANTIZED {
        let xq: Vec<Vec<u8>> = toks.iter().map(|x| acts_row(format, x)).collect();
        let dots = Kernels::best().dots(format).unwrap();
        let wq: Vec<Vec<u8>> = rows.iter().map(|w| quantized(format, w)).collect();
        let w4: [&[u8]; 4] = core::array::from_fn(|r| wq[r].as_slice());
        let x4: [&[u8]; 4] = core::array::from_fn(|t| xq[t].as_slice());
        for r in 0..4 {
            for t in 0..4 {
                let one = (dots.one)(w4[r], x4[t]);
                let four = (dots.x4)(w4[r], x4)[t];
                let quad = (dots.rows4)(w4, x4[t])[r];
                let pair = (dots.rows2x4)([w4[r], w4[r ^ 1]], x4)[0][t];
                assert_eq!(
                    [one.to_bits(), four.to_bits(), quad.to_bits()],
                    [pair.to_bits(); 3],
                    "{format} r{r} t{t}"
                );
            }
        }
    }
}

/// The scalar reference, which every SIMD kernel is held to, is the dot of the dequantized rows:
/// each format's scales, minimums and quants read as its dequantizer reads them.
#[test]
fn scalar_dots_are_the_dequantized_dots() {
    let n = 512;
    let w: Vec<f32> = (0..n).map(|i| libm::sinf(i as f32 * 0.37) * 2.0).collect();
    let x: Vec<f32> = (0..n)
        .map(|i| libm::cosf(i as f32 * 0.11) * 4.0 + 0.5)
        .collect();
    for format in QUANTIZED {
        let xq = acts_row(format, &x);
        let xd = acts_values(format, &xq, n);
        let wq = quantized(format, &w);
        let mut wd = vec![0f32; n];
        dequantize_row(format, &wq, &mut wd).unwrap();
        let exact: f64 = wd.iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum();
        let dot = Kernels::scalar().dot_quantized(format, &wq, &xq).unwrap();
        let bound = 1e-5 * abs_dot(format, &wq, &xq, n) as f64;
        assert!(
            (dot as f64 - exact).abs() <= bound,
            "{format}: {dot} against {exact} (bound {bound})"
        );
    }
}

/// (First token, tokens) of the batches a token's result is checked in against all tokens at
/// once: alone, in a tile of four padded or not, in transposed tiles of eight padded or not,
/// and in panels.
const BATCHES: [(usize, usize); 14] = [
    (0, 1),
    (5, 1),
    (7, 2),
    (1, 3),
    (3, 4),
    (2, 5),
    (9, 6),
    (0, 7),
    (4, panel::X8 + 1),
    (4, panel::X8 + 3),
    (6, panel::X8 + TILE + 1),
    (3, panel::X8 + 7),
    (1, PANEL_MIN_TOKENS),
    (2, PANEL_MIN_TOKENS + 5),
];

/// The weights (`rows × cols`) and activations (`n_tok × cols`) the batch-size tests multiply.
fn batch_values(rows: usize, cols: usize, n_tok: usize) -> (Vec<f32>, Vec<f32>) {
    let w = (0..rows * cols)
        .map(|i| libm::sinf(i as f32 * 0.37))
        .collect();
    let x = (0..n_tok * cols)
        .map(|i| libm::cosf(i as f32 * 0.11) * 4.0)
        .collect();
    (w, x)
}

/// A token's mat-mul result does not depend on how many tokens go with it (one, a tile of four,
/// transposed tiles of eight, panels from `PANEL_MIN_TOKENS` on), nor on the rows computed with
/// it. Rows of 72 blocks: more than a transposed tile holds at once, so the tiles go by in chunks
/// of blocks.
#[test]
#[cfg_attr(miri, ignore = "too slow under Miri; run natively")]
fn batch_size_changes_no_result() {
    let (rows, cols, n_tok) = (37, 2304, 2 * PANEL_MIN_TOKENS + 3);
    let (w, x) = batch_values(rows, cols, n_tok);
    let q16: Vec<u8> = x.chunks(cols).flat_map(q16_row).collect();
    let q8k: Vec<u8> = x
        .chunks(cols)
        .flat_map(|r| acts_row(Format::Q4K, r))
        .collect();
    let (b16, b8k) = (q16::row_bytes(cols), q8k::row_bytes(cols));
    let acts = |t0: usize, n: usize| Activations {
        f32: &x[t0 * cols..(t0 + n) * cols],
        q16: Some(&q16[t0 * b16..(t0 + n) * b16]),
        q8k: Some(&q8k[t0 * b8k..(t0 + n) * b8k]),
        transposed: None,
        k_tiles: None,
        n_tok: n,
        cols,
    };
    for format in QUANTIZED {
        let bytes: Vec<u8> = w.chunks(cols).flat_map(|r| quantized(format, r)).collect();
        let m = Matrix::new(format, rows, cols, bytes.into()).unwrap();
        let mut all = vec![0f32; rows * n_tok];
        Kernels::best()
            .matmul_rows(&m, &acts(0, n_tok), 0, &mut all)
            .unwrap();
        for (t0, n) in BATCHES {
            let mut part = vec![0f32; (rows - 3) * n];
            Kernels::best()
                .matmul_rows(&m, &acts(t0, n), 3, &mut part)
                .unwrap();
            // The same tokens with their tile transposed beforehand, as a decode step passes it.
            // (As a decode step does: no tiles from `PANEL_MIN_TOKENS` tokens on.)
            let tiled = if transposed_tokens(n) > 0 { n } else { 0 };
            let mut buf = vec![0u8; transposed_tokens(n) * b16];
            let q = &q16[t0 * b16..(t0 + tiled) * b16];
            let transposed = Kernels::best()
                .transpose_tiles(format, q, tiled, cols, &mut buf)
                .unwrap();
            let has_tiles = Kernels::best().dots(format).unwrap().panel.is_some();
            assert_eq!(transposed.is_some(), has_tiles, "{format} {n} tokens");
            let mut pre = vec![0f32; (rows - 3) * n];
            let acts_pre = Activations {
                transposed,
                ..acts(t0, n)
            };
            Kernels::best()
                .matmul_rows(&m, &acts_pre, 3, &mut pre)
                .unwrap();
            assert!(
                pre.iter()
                    .zip(&part)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{format} {n} tokens from {t0}, transposed beforehand"
            );
            for r in 3..rows {
                for t in 0..n {
                    assert_eq!(
                        part[t * (rows - 3) + r - 3].to_bits(),
                        all[(t0 + t) * rows + r].to_bits(),
                        "{format} {n} tokens from {t0}: r{r} t{t}"
                    );
                }
            }
        }
    }
}

/// Float weights too: a token's result is the same alone, in a tile of four, or in a padded one.
#[test]
#[cfg_attr(miri, ignore = "too slow under Miri; run natively")]
fn float_batch_size_changes_no_result() {
    let (rows, cols, n_tok) = (11, 200, 2 * PANEL_MIN_TOKENS + 3);
    let (w, x) = batch_values(rows, cols, n_tok);
    let acts = |t0: usize, n: usize| Activations {
        f32: &x[t0 * cols..(t0 + n) * cols],
        q16: None,
        q8k: None,
        transposed: None,
        k_tiles: None,
        n_tok: n,
        cols,
    };
    for format in [Format::F32, Format::F16, Format::BF16] {
        let bytes: Vec<u8> = match format {
            Format::F32 => w.iter().flat_map(|v| v.to_le_bytes()).collect(),
            Format::F16 => w
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect(),
            _ => w
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
        };
        let m = Matrix::new(format, rows, cols, bytes.into()).unwrap();
        let mut all = vec![0f32; rows * n_tok];
        Kernels::best()
            .matmul_rows(&m, &acts(0, n_tok), 0, &mut all)
            .unwrap();
        for (t0, n) in BATCHES {
            let mut part = vec![0f32; rows * n];
            Kernels::best()
                .matmul_rows(&m, &acts(t0, n), 0, &mut part)
                .unwrap();
            for (t, part) in part.chunks(rows).enumerate() {
                let whole = &all[(t0 + t) * rows..][..rows];
                assert!(
                    part.iter()
                        .zip(whole)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{format} {n} tokens from {t0}: t{t}"
                );
            }
        }
    }
}

/// The k-quants' many-token mat-mul over more rows than one unpacked block and more tokens than
/// one group, neither a whole number of tiles, and over rows and tokens too short for a
/// super-block: every table's results are the scalar kernel's bits, and short input reads as
/// zeros, not past its end. (Only x86 and aarch64 tables have these kernels.)
/// Every stored bit set (each quant the largest its bits give) against activations all at
/// ±127: the sums the kernels keep in 16 bits (`KBlock::MAX_QUANT`) at their largest.
#[test]
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
fn k_panel_kernels_take_the_largest_quants() {
    use k_panel::{KRow, KTokens, K_MICRO, K_TOKENS};
    let n = quant::k_quants::QK_K;
    for k in simd_tables() {
        for format in QUANTIZED {
            let Some(kernels) = &k.dots(format).unwrap().k_panel else {
                continue;
            };
            let mut w = vec![0xFFu8; format.block_bytes()];
            set_k_scales(format, &mut w, 1.0);
            for sign in [1.0f32, -1.0] {
                let xq = acts_row(format, &vec![sign; n]);
                let mut unpacked = vec![KRow::ZERO; K_MICRO];
                (kernels.unpack)(&[w.as_slice(); K_MICRO], 0, &mut unpacked);
                let mut tile = KTokens::ZERO;
                (kernels.transpose)([xq.as_slice(); K_TOKENS], 0, &mut tile);
                let mut acc = vec![[0f32; K_TOKENS]; K_MICRO];
                (kernels.dot)(&unpacked, &tile, K_TOKENS, &mut acc);
                let s = Kernels::scalar().dot_quantized(format, &w, &xq).unwrap();
                let bits = s.to_bits();
                let all = acc.iter().flatten().all(|a| a.to_bits() == bits);
                assert!(all, "{} {format} {sign}: {:?} against {s}", k.name, acc[0]);
            }
        }
    }
}

#[test]
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[cfg_attr(miri, ignore = "too slow under Miri; run natively")]
fn k_panel_matmul_is_the_scalar_bits() {
    use k_panel::{transpose_ref, KRow, KTokens, K_GROUP_TOKENS, K_ROWS, K_TOKENS};
    // Two blocks of rows and two groups of tokens, each the last one short.
    let (rows, cols) = (K_ROWS + 13, 2 * quant::k_quants::QK_K);
    let n_tok = K_GROUP_TOKENS + 45;
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| libm::sinf(i as f32 * 0.37) * 3.0)
        .collect();
    let x: Vec<f32> = (0..n_tok * cols)
        .map(|i| libm::cosf(i as f32 * 0.11) * 4.0)
        .collect();
    let q8k: Vec<u8> = x
        .chunks(cols)
        .flat_map(|r| acts_row(Format::Q4K, r))
        .collect();
    let xb = q8k::row_bytes(cols);
    let acts = Activations {
        f32: &x,
        q16: None,
        q8k: Some(&q8k),
        transposed: None,
        k_tiles: None,
        n_tok,
        cols,
    };
    for k in simd_tables() {
        for format in QUANTIZED {
            let Some(kernels) = &k.dots(format).unwrap().k_panel else {
                continue;
            };
            let bytes: Vec<u8> = w.chunks(cols).flat_map(|r| quantized(format, r)).collect();
            let m = Matrix::new(format, rows, cols, bytes.into()).unwrap();
            // Tiles transposed once (as the CPU backend does), or by each block of rows.
            let mut tiles = vec![KTokens::ZERO; k_panel::tiles(n_tok) * cols / 256];
            let k_tiles = k
                .transpose_k_tiles(format, &q8k, n_tok, cols, &mut tiles)
                .unwrap();
            assert!(k_tiles.is_some(), "{} {format}", k.name);
            let with_tiles = Activations { k_tiles, ..acts };
            // On a thread with the stack docs/embedded.md promises a forward pass needs (its
            // tiles live there): overflowing it kills the process.
            let mut out = vec![0f32; rows * n_tok];
            let mut out_tiles = vec![0f32; rows * n_tok];
            // Tokens from a tile's start read the transposed tiles from there; from elsewhere
            // they are transposed again.
            let (from_tile, from_other) = (K_TOKENS, K_TOKENS + 3);
            let mut out_from_tile = vec![0f32; rows * (n_tok - from_tile)];
            let mut out_from_other = vec![0f32; rows * (n_tok - from_other)];
            std::thread::scope(|s| {
                std::thread::Builder::new()
                    .stack_size(128 * 1024)
                    .spawn_scoped(s, || {
                        k.matmul_rows(&m, &acts, 0, &mut out).unwrap();
                        k.matmul_rows(&m, &with_tiles, 0, &mut out_tiles).unwrap();
                        k.matmul_tokens(&m, &with_tiles, from_tile, &mut out_from_tile)
                            .unwrap();
                        k.matmul_tokens(&m, &with_tiles, from_other, &mut out_from_other)
                            .unwrap();
                    })
                    .unwrap()
                    .join()
                    .unwrap()
            });
            for r in 0..rows {
                for t in 0..n_tok {
                    let x = &q8k[t * xb..(t + 1) * xb];
                    let s = Kernels::scalar()
                        .dot_quantized(format, m.row(r), x)
                        .unwrap();
                    let mut got = vec![out[t * rows + r], out_tiles[t * rows + r]];
                    for (t0, o) in [(from_tile, &out_from_tile), (from_other, &out_from_other)] {
                        if t >= t0 {
                            got.push(o[(t - t0) * rows + r]);
                        }
                    }
                    for (i, v) in got.into_iter().enumerate() {
                        assert_eq!(
                            v.to_bits(),
                            s.to_bits(),
                            "{} {format} r{r} t{t}, run {i}",
                            k.name
                        );
                    }
                }
            }
            let short = &m.row(0)[..format.block_bytes() - 1];
            let mut unpacked = [KRow::ZERO; 1];
            unpacked[0].d = 1.0;
            (kernels.unpack)(&[short], 0, &mut unpacked);
            assert_eq!(unpacked[0], KRow::ZERO, "{} {format}: a short row", k.name);
            let xs: [&[u8]; K_TOKENS] =
                core::array::from_fn(|t| &q8k[t * xb..][..if t == 3 { xb - 1 } else { xb }]);
            let mut tile = KTokens::ZERO;
            (kernels.transpose)(xs, 1, &mut tile);
            assert_eq!(
                tile,
                transpose_ref(xs, 1),
                "{} {format}: a short token",
                k.name
            );
            assert!(tile.d[3] == 0.0 && tile.d[2] != 0.0);
        }
    }
}

/// No table takes the k-panel for fewer tokens than `K_FEWEST_TOKENS`, below which a scratch
/// keeps no room for the transposed tiles (`Kernels::transpose_k_tiles` would fail for lack of
/// it).
#[test]
fn no_k_panel_takes_fewer_tokens_than_the_scratch_keeps_tiles_for() {
    for (k, _) in Kernels::simd_tables() {
        for format in QUANTIZED {
            if let Some(kernels) = &k.dots(format).unwrap().k_panel {
                assert!(
                    kernels.from_tokens >= k_panel::K_FEWEST_TOKENS,
                    "{} {format}: from {} tokens",
                    k.name,
                    kernels.from_tokens
                );
            }
        }
    }
}

/// The AVX-512 table's V sum gives the AVX2 table's bits (where this CPU runs it).
#[cfg(target_arch = "x86_64")]
#[test]
#[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
fn x86_axpy_tables_agree_bit_for_bit() {
    if !x86::avx512_available() {
        not_tested(x86::KERNELS_AVX512.name);
        return;
    }
    let n = 3 * 32;
    let rows: Vec<Vec<u8>> = (0..11)
        .map(|r| {
            let v: Vec<f32> = (0..n)
                .map(|i| libm::sinf((i * 5 + r) as f32 * 0.3))
                .collect();
            quantized(Format::Q8_0, &v)
        })
        .collect();
    let rows: Vec<&[u8]> = rows.iter().map(|r| r.as_slice()).collect();
    for (k, runs) in (1..=11).flat_map(|k| [1, 2, 3, 4, 5, 9].map(|r| (k, r))) {
        let a: Vec<f32> = (0..runs * (k + 1))
            .map(|i| libm::cosf(i as f32) * 0.7)
            .collect();
        let start: Vec<f32> = (0..runs * n).map(|i| libm::sinf(i as f32 * 0.01)).collect();
        for w in [
            WeightStrides { run: k + 1, key: 1 },
            WeightStrides { run: 1, key: runs },
        ] {
            let (mut x, mut y) = (start.clone(), start.clone());
            x86::KERNELS.axpy_q8_0(&mut x, &a, w, &rows[..k]).unwrap();
            x86::KERNELS_AVX512
                .axpy_q8_0(&mut y, &a, w, &rows[..k])
                .unwrap();
            assert_eq!(
                x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{k} rows, {runs} runs, {w:?}"
            );
        }
    }
}

/// The AVX-VNNI and AVX-512 tables give the AVX2 table's bits (where this CPU runs them).
#[cfg(target_arch = "x86_64")]
#[test]
#[cfg_attr(miri, ignore = "compares SIMD kernels, which Miri does not run")]
fn x86_tables_agree_bit_for_bit() {
    let n = 8 * 32;
    let w: Vec<f32> = (0..n).map(|i| libm::sinf(i as f32 * 0.37) * 5.0).collect();
    let toks: Vec<Vec<f32>> = (0..TILE)
        .map(|t| {
            (0..n)
                .map(|i| libm::cosf((i + 7 * t) as f32 * 0.11) * 3.0)
                .collect()
        })
        .collect();
    let tables: Vec<(bool, &Kernels)> = Kernels::simd_tables()
        .iter()
        .map(|(k, runs)| (runs(), *k))
        .collect();
    let compared = tables.iter().filter(|(ok, _)| *ok).count();
    if compared < 2 {
        not_tested("AVX-VNNI and AVX-512 (compared with AVX2)");
    }
    for format in QUANTIZED {
        let xq: Vec<Vec<u8>> = toks.iter().map(|x| acts_row(format, x)).collect();
        let x4: [&[u8]; TILE] = core::array::from_fn(|t| xq[t].as_slice());
        let wq = quantized(format, &w);
        let wq2: Vec<u8> = quantized(format, &w.iter().map(|v| -v).collect::<Vec<_>>());
        let results: Vec<[[u32; TILE]; 2]> = tables
            .iter()
            .filter(|(ok, _)| *ok)
            .map(|(_, k)| {
                let d = k.dots(format).unwrap();
                (d.rows2x4)([&wq, &wq2], x4).map(|r| r.map(f32::to_bits))
            })
            .collect();
        for r in &results {
            assert_eq!(*r, results[0], "{format}");
        }
        if Kernels::best().dots(format).unwrap().panel.is_none() {
            continue;
        }
        let panel: [&[u8]; panel::PANEL] = core::array::from_fn(|r| [&wq, &wq2][r % 2].as_slice());
        let packed_rows = panel.map(Some);
        let results: Vec<Vec<u32>> = tables
            .iter()
            .filter(|(ok, _)| *ok)
            .map(|(_, k)| {
                let kernels = k.dots(format).unwrap().panel.as_ref().unwrap();
                let mut packed = vec![0u8; 8 * panel::PANEL_BLOCK_BYTES];
                (kernels.pack)(&packed_rows, 0, &mut packed);
                let mut acc = [[0f32; panel::PANEL]; TILE];
                (kernels.dot)(&packed, x4, &mut acc);
                let rows = (kernels.rows)(panel, x4[1]);
                acc.iter()
                    .flatten()
                    .chain(&rows)
                    .map(|v| v.to_bits())
                    .collect()
            })
            .collect();
        for r in &results {
            assert_eq!(*r, results[0], "{format} panel");
        }
    }
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
proptest! {
    /// The SIMD128 Q8_0 dots give the scalar kernels' bits: the same exact block sums, scaled in
    /// the same order.
    #[test]
    fn simd128_q8_0_dots_are_the_scalar_bits(blocks in 1usize..20, w in values(ROW_VALUES), xs in proptest::collection::vec(values(ROW_VALUES), TILE)) {
        let n = blocks * 32;
        let wq = quantized(Format::Q8_0, &w[..n]);
        let xq: Vec<Vec<u8>> = xs.iter().map(|x| q16_row(&x[..n])).collect();
        let x4: [&[u8]; TILE] = core::array::from_fn(|i| xq[i].as_slice());
        let (simd, scalar) = (&super::wasm32::KERNELS.q8_0, &Kernels::scalar().q8_0);
        let bits = |v: [f32; TILE]| v.map(f32::to_bits);
        prop_assert_eq!(bits((simd.x4)(&wq, x4)), bits((scalar.x4)(&wq, x4)));
        prop_assert_eq!((simd.one)(&wq, x4[0]).to_bits(), (scalar.one)(&wq, x4[0]).to_bits());
    }
}
