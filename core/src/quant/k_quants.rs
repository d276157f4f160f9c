//! ggml's k-quants (256-value super-blocks), the formats of the popular Q4_K_M files. sapient
//! reads them by dequantizing at load (then quantizing to Q8_0); these follow ggml's
//! `dequantize_row_q{4,5,6}_K` exactly.
use super::f16_at;

/// Values per super-block.
pub const QK_K: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KQuant {
    Q4K,
    Q5K,
    Q6K,
}

impl KQuant {
    pub const fn block_bytes(self) -> usize {
        match self {
            KQuant::Q4K => 144,
            KQuant::Q5K => 176,
            KQuant::Q6K => 210,
        }
    }

    /// Dequantizes `bytes` (whole super-blocks) into `out` (`QK_K` values per block).
    pub fn dequantize_row(self, bytes: &[u8], out: &mut [f32]) -> crate::Result<()> {
        let nb = bytes.len() / self.block_bytes();
        if !bytes.len().is_multiple_of(self.block_bytes()) || out.len() != nb * QK_K {
            return Err(crate::Error::Length {
                what: "k-quant row",
                expected: nb * QK_K,
                got: out.len(),
            });
        }
        for (b, y) in bytes
            .chunks_exact(self.block_bytes())
            .zip(out.chunks_exact_mut(QK_K))
        {
            match self {
                KQuant::Q4K => q4_k(b, y),
                KQuant::Q5K => q5_k(b, y),
                KQuant::Q6K => q6_k(b, y),
            }
        }
        Ok(())
    }
}

/// The 6-bit scale and min of sub-block `j` from the 12 packed scale bytes.
fn scale_min_k4(j: usize, q: &[u8]) -> (f32, f32) {
    let (d, m) = if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    };
    (d as f32, m as f32)
}

/// `{ d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128] }`
fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, min) = (f16_at(b), f16_at(&b[2..]));
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (k, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (s1, m1) = scale_min_k4(2 * k, scales);
        let (s2, m2) = scale_min_k4(2 * k + 1, scales);
        for l in 0..32 {
            y[l] = d * s1 * (q[l] & 0x0f) as f32 - min * m1;
            y[l + 32] = d * s2 * (q[l] >> 4) as f32 - min * m2;
        }
    }
}

/// `{ d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128] }`
fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, min) = (f16_at(b), f16_at(&b[2..]));
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (k, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (s1, m1) = scale_min_k4(2 * k, scales);
        let (s2, m2) = scale_min_k4(2 * k + 1, scales);
        let (u1, u2) = (1u8 << (2 * k), 2u8 << (2 * k));
        for l in 0..32 {
            let hi1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let hi2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d * s1 * ((q[l] & 0x0f) + hi1) as f32 - min * m1;
            y[l + 32] = d * s2 * ((q[l] >> 4) + hi2) as f32 - min * m2;
        }
    }
}

/// `{ ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16 }`
fn q6_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(&b[208..]);
    for n in 0..2 {
        let ql = &b[64 * n..64 * n + 64];
        let qh = &b[128 + 32 * n..128 + 32 * n + 32];
        let sc = &b[192 + 8 * n..192 + 8 * n + 8];
        let y = &mut y[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}
