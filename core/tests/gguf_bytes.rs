//! Our reference quantizers produce the same bytes as the `gguf` Python package's
//! (`gguf.quants.quantize`), and our dequantizers the same values as its `dequantize`, on the
//! vectors `scripts/gen_quant_vectors.py` wrote.
use sapient_core::kernels::Kernels;
use sapient_core::quant::{dequantize_row, quantize_row, Format};

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn quantizers_match_gguf_py_bytes() {
    let text = include_str!("data/gguf_quants.txt");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 4 * 35, "test data is incomplete");
    for case in lines.chunks(4) {
        let head: Vec<&str> = case[0].split(' ').collect();
        let (name, format) = (head[0], head[1]);
        let format = match format {
            "q8_0" => Format::Q8_0,
            "q4_0" => Format::Q4_0,
            "q4_1" => Format::Q4_1,
            "q5_0" => Format::Q5_0,
            "q5_1" => Format::Q5_1,
            f => panic!("unknown format {f}"),
        };
        let x: Vec<f32> = hex(case[1])
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let expected = hex(case[2]);
        let mut ours = vec![0u8; format.row_bytes(x.len()).unwrap()];
        quantize_row(format, &x, &mut ours).unwrap();
        assert_eq!(ours, expected, "{name} {format}");
        let mut back = vec![0f32; x.len()];
        dequantize_row(format, &expected, &mut back).unwrap();
        // Bit for bit, except that a NaN's sign and payload are the CPU's (x86 makes -NaN of
        // inf·0, aarch64 +NaN).
        let bits = |v: f32| {
            if v.is_nan() {
                f32::NAN.to_bits()
            } else {
                v.to_bits()
            }
        };
        let want: Vec<u32> = hex(case[3])
            .chunks(4)
            .map(|b| bits(f32::from_le_bytes(b.try_into().unwrap())))
            .collect();
        let got: Vec<u32> = back.iter().map(|v| bits(*v)).collect();
        assert_eq!(got, want, "{name} {format}: dequantized");
        if format == Format::Q8_0 {
            let mut simd = vec![0u8; ours.len()];
            Kernels::best().quantize_q8_0(&x, &mut simd).unwrap();
            assert_eq!(simd, expected, "{name} {format} ({})", Kernels::best().name);
        }
    }
}

/// Our k-quant, IQ4, IQ3, IQ2, IQ1 and ternary dequantizers give the `gguf` package's values exactly.
#[test]
fn k_quant_dequantizers_match_gguf_py() {
    let text = include_str!("data/gguf_kquants.txt");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 48);
    for case in lines.chunks(3) {
        let head: Vec<&str> = case[0].split(' ').collect();
        let format = match head[0] {
            "q4_k" => Format::Q4K,
            "q5_k" => Format::Q5K,
            "q6_k" => Format::Q6K,
            "q3_k" => Format::Q3K,
            "q2_k" => Format::Q2K,
            "iq4_xs" => Format::IQ4XS,
            "iq4_nl" => Format::IQ4NL,
            "iq3_s" => Format::IQ3S,
            "iq3_xxs" => Format::IQ3XXS,
            "iq2_xxs" => Format::IQ2XXS,
            "iq2_xs" => Format::IQ2XS,
            "iq2_s" => Format::IQ2S,
            "iq1_s" => Format::IQ1S,
            "iq1_m" => Format::IQ1M,
            "tq1_0" => Format::TQ1_0,
            "tq2_0" => Format::TQ2_0,
            f => panic!("unknown format {f}"),
        };
        let n: usize = head[1].parse().unwrap();
        let bytes = hex(case[1]);
        let expected: Vec<f32> = hex(case[2])
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let mut ours = vec![0f32; n * format.block_len()];
        dequantize_row(format, &bytes, &mut ours).unwrap();
        assert_eq!(ours, expected, "{format}");
    }
}

/// Our Q4_K, Q5_K, Q6_K, IQ4_XS and IQ4_NL quantizers make the bytes ggml's quantizers make
/// (what llama-quantize writes without an importance matrix), on the rows
/// `scripts/gen_kquantize_vectors.py` had libggml-base quantize.
#[test]
fn k_quantizers_match_ggml_bytes() {
    let text = include_str!("data/ggml_kquantize.txt");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 3 * 50, "test data is incomplete");
    for case in lines.chunks(3) {
        let head: Vec<&str> = case[0].split(' ').collect();
        let format = match head[1] {
            "q4_k" => Format::Q4K,
            "q5_k" => Format::Q5K,
            "q6_k" => Format::Q6K,
            "iq4_xs" => Format::IQ4XS,
            "iq4_nl" => Format::IQ4NL,
            f => panic!("unknown format {f}"),
        };
        let x: Vec<f32> = hex(case[1])
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let mut ours = vec![0u8; format.row_bytes(x.len()).unwrap()];
        quantize_row(format, &x, &mut ours).unwrap();
        assert!(ours == hex(case[2]), "{} {format}: bytes differ", head[0]);
    }
}
