//! A whole model on k-quant weights (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, mixed as Q*_K_M files mix them) runs
//! as the same weights widened to f32 do: logits within what Q16 activations cost, the same
//! greedy tokens wherever the top two logits are further apart than that, and prefill and
//! one-token decoding give the same bits. The weights are super-blocks whose every byte comes
//! from a seeded generator (any bit pattern a file may hold), with finite f16 scales.
use std::borrow::Cow;

use sapient::load::{LoadOptions, ModelFiles, Quantize};
use sapient::run::{self, Arenas, CpuRunner};
use sapient_core::quant::{BlockIQ1M, BlockIQ3S, BlockTQ1_0, BlockTQ2_0, KBlock};
use sapient_core::{
    Config, Format, KvFormat, LayerWeights, Matrix, Model, RopeStyle, Serial, Want, Weights,
};

/// xorshift64*: reproducible bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A `rows × cols` matrix of random super-blocks whose values are about `1 / sqrt(cols)` (so
/// activations keep their size through the layers).
fn k_matrix(rng: &mut Rng, format: Format, rows: usize, cols: usize) -> Matrix<'static> {
    let row_bytes = format.row_bytes(cols).unwrap();
    let mut bytes: Vec<u8> = (0..rows * row_bytes).map(|_| rng.next() as u8).collect();
    let unit = 0.3 / (cols as f32).sqrt();
    for sb in bytes.chunks_exact_mut(format.block_bytes()) {
        let f16 = |v: f32| half::f16::from_f32(v).to_bits().to_le_bytes();
        match format {
            // |d · sc · (q - 32)| up to 128 · 32 steps.
            Format::Q6K => sb[208..210].copy_from_slice(&f16(unit / 128.0)),
            // |d · (sc - 32) · q| up to 32 · 4 steps.
            Format::Q3K => sb[108..110].copy_from_slice(&f16(unit / 32.0)),
            // d · sc · q up to 15 · 3 steps, minus dmin · m up to 15 steps of half the span.
            Format::Q2K => {
                sb[80..82].copy_from_slice(&f16(2.0 * unit / (15.0 * 3.0)));
                sb[82..84].copy_from_slice(&f16(unit / 15.0));
            }
            // d · sc · q up to 63 · 31 steps, minus dmin · m up to 63 steps of half the span.
            _ => {
                sb[..2].copy_from_slice(&f16(2.0 * unit / (63.0 * 31.0)));
                sb[2..4].copy_from_slice(&f16(unit / 63.0));
            }
        }
    }
    Matrix::new(format, rows, cols, Cow::Owned(bytes)).unwrap()
}

fn widened(m: &Matrix<'_>) -> Matrix<'static> {
    let mut bytes = Vec::with_capacity(m.rows * m.cols * 4);
    let mut row = vec![0f32; m.cols];
    for r in 0..m.rows {
        m.dequantize_row(r, &mut row).unwrap();
        bytes.extend(row.iter().flat_map(|v| v.to_le_bytes()));
    }
    Matrix::new(Format::F32, m.rows, m.cols, Cow::Owned(bytes)).unwrap()
}

fn config() -> Config {
    Config {
        vocab_size: 512,
        hidden_size: 256,
        intermediate_size: 512,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 64,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_style: RopeStyle::Adjacent,
        rope_scaling: None,
        tie_word_embeddings: false,
        qkv_bias: false,
        sliding_window: None,
        max_position_embeddings: 256,
    }
}

/// The k-quant model, and the same weights in f32.
fn models() -> (Model<'static>, Model<'static>) {
    let c = config();
    let mut rng = Rng(0x5eed);
    let (h, ff, kv) = (c.hidden_size, c.intermediate_size, c.kv_dim());
    let mut layers = Vec::new();
    for i in 0..c.n_layers {
        // As llama-quantize's Q4_K_M: Q6_K for some V and down projections, Q4_K elsewhere,
        // and Q5_K, Q3_K and Q2_K to cover the other formats.
        let (v, down) = if i == 0 {
            (Format::Q6K, Format::Q6K)
        } else {
            (Format::Q5K, Format::Q4K)
        };
        layers.push(LayerWeights {
            attn_norm: vec![1.0; h].into(),
            wq: k_matrix(&mut rng, Format::Q4K, c.q_dim(), h),
            wk: k_matrix(
                &mut rng,
                if i == 0 { Format::Q4K } else { Format::Q3K },
                kv,
                h,
            ),
            wv: k_matrix(&mut rng, v, kv, h),
            wo: k_matrix(&mut rng, Format::Q5K, h, c.q_dim()),
            bq: None,
            bk: None,
            bv: None,
            ffn_norm: vec![1.0; h].into(),
            w_gate: k_matrix(&mut rng, Format::Q4K, ff, h),
            w_up: k_matrix(
                &mut rng,
                if i == 0 { Format::Q4K } else { Format::Q2K },
                ff,
                h,
            ),
            w_down: k_matrix(&mut rng, down, h, ff),
        });
    }
    let weights = Weights {
        embed: k_matrix(&mut rng, Format::Q4K, c.vocab_size, h),
        layers: layers.into(),
        norm: vec![1.0; h].into(),
        lm_head: Some(k_matrix(&mut rng, Format::Q6K, c.vocab_size, h)),
        rope_freq_factors: None,
    };
    let wide = Weights {
        embed: widened(&weights.embed),
        layers: weights
            .layers
            .iter()
            .map(|l| LayerWeights {
                attn_norm: l.attn_norm.clone(),
                wq: widened(&l.wq),
                wk: widened(&l.wk),
                wv: widened(&l.wv),
                wo: widened(&l.wo),
                bq: None,
                bk: None,
                bv: None,
                ffn_norm: l.ffn_norm.clone(),
                w_gate: widened(&l.w_gate),
                w_up: widened(&l.w_up),
                w_down: widened(&l.w_down),
            })
            .collect(),
        norm: weights.norm.clone(),
        lm_head: weights.lm_head.as_ref().map(widened),
        rope_freq_factors: None,
    };
    (
        Model::new(c.clone(), weights).unwrap(),
        Model::new(c, wide).unwrap(),
    )
}

fn prompt() -> Vec<u32> {
    (0..64).map(|i| (i * 37 + 11) % 512).collect()
}

#[test]
fn k_quant_model_runs_as_its_f32_weights() {
    let (k, wide) = models();
    runs_as_its_f32_weights("random super-blocks", &k, &wide);
}

/// Files made by llama.cpp's own `llama-quantize` (`tests/data/tiny256.*.gguf`: a 2-layer Llama
/// with rows of 256 and 512 values and random F16 weights from `scripts/random-gguf.py OUT
/// tiny-256`, quantized to Q2_K (Q2_K, Q3_K, Q6_K), Q3_K_M (Q3_K, Q4_K, Q5_K, Q6_K), Q5_K_M
/// (Q5_K, Q6_K), IQ4_XS and IQ4_NL (each with a Q6_K output), and with an importance matrix
/// from `llama-imatrix` to IQ2_XXS with each kind of matrix given another of IQ1_S, IQ2_XXS,
/// IQ2_XS, IQ2_S and IQ3_XXS (`--tensor-type`, README)): read in place, as llama.cpp laid them
/// out, they run as their weights widened to f32.
#[test]
fn llama_cpp_quantized_files_run_as_their_f32_weights() {
    for (name, formats) in [
        (
            "tiny256.Q2_K.gguf",
            &[Format::Q2K, Format::Q3K, Format::Q6K][..],
        ),
        (
            "tiny256.Q3_K_M.gguf",
            &[Format::Q3K, Format::Q4K, Format::Q5K, Format::Q6K][..],
        ),
        ("tiny256.Q5_K_M.gguf", &[Format::Q5K, Format::Q6K][..]),
        ("tiny256.IQ4_XS.gguf", &[Format::IQ4XS, Format::Q6K][..]),
        ("tiny256.IQ4_NL.gguf", &[Format::IQ4NL, Format::Q6K][..]),
        (
            "tiny256.IQ1_S-IQ3_XXS.gguf",
            &[
                Format::IQ1S,
                Format::IQ2XXS,
                Format::IQ2XS,
                Format::IQ2S,
                Format::IQ3XXS,
            ][..],
        ),
    ] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("data")
            .join(name);
        let files = ModelFiles::open(&path, &LoadOptions::default()).unwrap();
        let k = files.model(Quantize::Auto).unwrap();
        let held: Vec<Format> = k
            .weights
            .layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down])
            .chain(k.weights.lm_head.as_ref())
            .map(|m| m.format)
            .collect();
        for f in formats {
            assert!(held.contains(f), "{name}: no {f} matrix");
        }
        let wide = files.model(Quantize::F32).unwrap();
        runs_as_its_f32_weights(name, &k, &wide);
    }
}

/// llama.cpp's TQ1_0 and TQ2_0 files of the same weights (`llama-quantize OUT FILE TQ1_0`, and
/// `TQ2_0`: both round each weight to `d·t`, `t` in -1, 0, 1, with the same `d`) hold the same
/// values in two packings (five base-3 digits a byte against two bits a value), so they give the
/// same logits, bit for bit.
#[test]
fn llama_cpp_ternary_files_give_the_same_logits() {
    let logits = |name: &str| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("data")
            .join(name);
        let files = ModelFiles::open(&path, &LoadOptions::default()).unwrap();
        let m = files.model(Quantize::Auto).unwrap();
        let layers = &m.weights.layers;
        let format = if name.contains("TQ1_0") {
            Format::TQ1_0
        } else {
            Format::TQ2_0
        };
        assert!(layers
            .iter()
            .all(|l| l.wq.format == format && l.w_down.format == format));
        let v = run::logits(&CpuRunner::new(&m, KvFormat::F32, &Serial), &prompt(), true).unwrap();
        v.iter()
            .flatten()
            .map(|f| f.to_bits())
            .collect::<Vec<u32>>()
    };
    assert!(logits("tiny256.TQ1_0.gguf") == logits("tiny256.TQ2_0.gguf"));
}

/// `m` (IQ3_S, IQ1_M, TQ1_0 or TQ2_0) rewritten exactly as Q6_K: the same `d` (IQ1_M's times its
/// `D_SCALE` 1/8, which the files' scales hold exactly in f16), each half's integer scale
/// (`1 + 2s`, the ternary formats' 1) as its 8-bit scale, each signed value `v` (within ±15)
/// stored as `v + 32` in Q6_K's layout. The same
/// integers, so the same exact sums against Q8K activations, in a format whose kernels were
/// written and tested apart.
fn as_q6_k<K: KBlock>(m: &Matrix<'_>) -> Matrix<'static> {
    assert!(!K::HAS_MIN);
    let mut bytes = Vec::with_capacity(m.rows * Format::Q6K.row_bytes(m.cols).unwrap());
    for sb in m.bytes().chunks_exact(K::BYTES) {
        let ints = K::ints(sb);
        let mut q = [0u8; 256];
        for (j, block) in q.chunks_exact_mut(32).enumerate() {
            for (q, stored) in block.iter_mut().zip(K::quants(sb, j)) {
                let v = stored as i32 - K::OFFSET;
                assert!((-32..32).contains(&v), "{v} does not fit Q6_K");
                *q = (v + 32) as u8;
            }
        }
        let mut y = [0u8; 210];
        let (ql, rest) = y.split_at_mut(128);
        let (qh, rest) = rest.split_at_mut(64);
        for half in 0..2 {
            let (j, ql, qh) = (128 * half, &mut ql[64 * half..], &mut qh[32 * half..]);
            for i in 0..32 {
                let q = |k: usize| q[j + i + 32 * k];
                ql[i] = (q(0) & 0xf) | ((q(2) & 0xf) << 4);
                ql[i + 32] = (q(1) & 0xf) | ((q(3) & 0xf) << 4);
                qh[i] = (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
            }
        }
        for (s, scale) in rest[..16].iter_mut().zip(ints.scales) {
            *s = scale as u8;
        }
        let (d, _) = K::d_dmin(sb);
        let d16 = half::f16::from_f32(d);
        assert_eq!(d16.to_f32(), d, "d is no f16");
        rest[16..18].copy_from_slice(&d16.to_le_bytes());
        bytes.extend_from_slice(&y);
    }
    Matrix::new(Format::Q6K, m.rows, m.cols, Cow::Owned(bytes)).unwrap()
}

/// llama.cpp's IQ3_M file (`tests/data/tiny256.IQ3_M.gguf`, made as the others: IQ3_S, Q4_K for
/// V, the down projections' first eighth and the attention output, Q6_K output), its IQ3_S file,
/// its IQ1_M file (with an importance matrix: IQ1_M, IQ2_XXS for the attention output, Q2_K for
/// V and the embeddings) and its TQ1_0 and TQ2_0 files (Q4_K embeddings, Q6_K output), read in
/// place, give the logits their IQ3_S, IQ1_M or ternary matrices rewritten as Q6_K give, bit for
/// bit. (Against the weights widened to f32 the logits' error is 1.0e-3 (IQ3_M, IQ1_M) and
/// 1.16e-3 (TQ1_0, TQ2_0) where the other files' is 8.1e-4 to 8.7e-4: the same 8-bit
/// activations, times coarser weights.)
#[test]
fn llama_cpp_iq3_iq1_m_and_ternary_files_run_as_their_q6_k_rewrite() {
    for (name, format) in [
        ("tiny256.IQ3_M.gguf", Format::IQ3S),
        ("tiny256.IQ3_S.gguf", Format::IQ3S),
        ("tiny256.IQ1_M.gguf", Format::IQ1M),
        ("tiny256.TQ1_0.gguf", Format::TQ1_0),
        ("tiny256.TQ2_0.gguf", Format::TQ2_0),
    ] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("data")
            .join(name);
        let files = ModelFiles::open(&path, &LoadOptions::default()).unwrap();
        let iq = files.model(Quantize::Auto).unwrap();
        let rewrite = |m: &Matrix<'_>| -> Matrix<'static> {
            match m.format {
                f if f != format => {
                    Matrix::new(f, m.rows, m.cols, Cow::Owned(m.bytes().to_vec())).unwrap()
                }
                Format::IQ3S => as_q6_k::<BlockIQ3S>(m),
                Format::IQ1M => as_q6_k::<BlockIQ1M>(m),
                Format::TQ1_0 => as_q6_k::<BlockTQ1_0>(m),
                _ => as_q6_k::<BlockTQ2_0>(m),
            }
        };
        let w = &iq.weights;
        let mut rewritten = (w.embed.format == format) as usize;
        let layers: Vec<LayerWeights<'static>> = w
            .layers
            .iter()
            .map(|l| {
                for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                    rewritten += (m.format == format) as usize;
                }
                LayerWeights {
                    attn_norm: l.attn_norm.to_vec().into(),
                    wq: rewrite(&l.wq),
                    wk: rewrite(&l.wk),
                    wv: rewrite(&l.wv),
                    wo: rewrite(&l.wo),
                    bq: None,
                    bk: None,
                    bv: None,
                    ffn_norm: l.ffn_norm.to_vec().into(),
                    w_gate: rewrite(&l.w_gate),
                    w_up: rewrite(&l.w_up),
                    w_down: rewrite(&l.w_down),
                }
            })
            .collect();
        assert!(rewritten >= 9, "{name}: {rewritten} {format} matrices");
        let weights = Weights {
            embed: rewrite(&w.embed),
            layers: layers.into(),
            norm: w.norm.to_vec().into(),
            lm_head: w.lm_head.as_ref().map(rewrite),
            rope_freq_factors: None,
        };
        let q6 = Model::new(iq.config.clone(), weights).unwrap();
        let seq = prompt();
        let a = run::logits(&CpuRunner::new(&iq, KvFormat::F32, &Serial), &seq, true).unwrap();
        let b = run::logits(&CpuRunner::new(&q6, KvFormat::F32, &Serial), &seq, true).unwrap();
        let bits =
            |v: &[Vec<f32>]| -> Vec<u32> { v.iter().flatten().map(|f| f.to_bits()).collect() };
        assert!(bits(&a) == bits(&b), "{name}: logits differ");
    }
}

/// Logits of every prefix of `prompt()` within the quantized activations' error of the f32
/// model's, and the same greedy token wherever the f32 model's top two are further apart than
/// twice the position's largest logit error (at least 20 such positions of the 64). The
/// k-quants take Q8K activations (`quant::q8k`: 8 bits per 256 values), which round each
/// mat-mul input with a normalized squared error of about 4e-5 ((amax/127)²/12 over values
/// whose largest is near 2.8 standard deviations); the logits' measured here: 9.6e-5 (random
/// super-blocks) and 8.3e-4 to 8.7e-4 (llama.cpp's files). The bound is 1e-3; Q16 activations
/// alone stay under 1e-5.
fn runs_as_its_f32_weights(what: &str, k: &Model<'_>, wide: &Model<'_>) {
    let seq = prompt();
    let a = run::logits(&CpuRunner::new(k, KvFormat::F32, &Serial), &seq, true).unwrap();
    let b = run::logits(&CpuRunner::new(wide, KvFormat::F32, &Serial), &seq, true).unwrap();
    let (mut err, mut power) = (0f64, 0f64);
    for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
        err += ((x - y) as f64).powi(2);
        power += (*y as f64).powi(2);
    }
    let nmse = err / power;
    assert!(
        power > 0.0 && nmse < 1e-3,
        "{what}: normalized mean squared error {nmse}"
    );
    let mut decided = 0;
    for (p, (x, y)) in a.iter().zip(&b).enumerate() {
        let err = x
            .iter()
            .zip(y)
            .map(|(u, v)| (u - v).abs())
            .fold(0f32, f32::max);
        let mut sorted = y.clone();
        sorted.sort_by(|u, v| v.total_cmp(u));
        if sorted[0] - sorted[1] > 2.0 * err {
            decided += 1;
            assert_eq!(
                sapient_core::sample::argmax(x),
                sapient_core::sample::argmax(y),
                "{what}: position {p}"
            );
        }
    }
    assert!(
        decided >= 20,
        "{what}: only {decided} of {} positions were clear",
        seq.len()
    );
}

#[test]
fn k_quant_prefill_and_decoding_give_the_same_bits() {
    let (k, _) = models();
    let seq = prompt();
    let full = run::logits(&CpuRunner::new(&k, KvFormat::Q8_0, &Serial), &seq, true).unwrap();
    let c = &k.config;
    let mut arenas = Arenas::new(c, seq.len(), KvFormat::Q8_0, 16).unwrap();
    let (mut cache, mut scratch) = arenas.borrow(c).unwrap();
    let mut rows = Vec::new();
    let mut pre = vec![0f32; 16 * c.vocab_size];
    k.forward(
        &seq[..16],
        &mut cache,
        &mut scratch,
        &Serial,
        Want::AllLogits(&mut pre),
    )
    .unwrap();
    rows.extend(pre.chunks(c.vocab_size).map(<[f32]>::to_vec));
    for &t in &seq[16..] {
        let mut l = vec![0f32; c.vocab_size];
        k.forward(
            &[t],
            &mut cache,
            &mut scratch,
            &Serial,
            Want::LastLogits(&mut l),
        )
        .unwrap();
        rows.push(l);
    }
    assert_eq!(rows.len(), full.len());
    for (p, (x, y)) in rows.iter().zip(&full).enumerate() {
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(x), bits(y), "position {p}");
    }
}
