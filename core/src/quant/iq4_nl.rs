//! IQ4_NL: 32 values as `{ d: f16, qs: [u8; 16] }`, nibbles as Q4_0's, each an index into a
//! fixed non-uniform grid (`IQ4_VALUES`); value `d · IQ4_VALUES[n]`. IQ4_XS (`iq4_xs`) shares
//! the grid and the quantizer.
use half::f16;

use super::k_quantize::GROUP_MAX_EPS;
use super::{Block, BlockQ4_0, QK};

/// ggml's `kvalues_iq4nl`: the value each 4-bit quant stands for, denser near zero, where
/// weights are.
pub const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// One IQ4_NL block, laid out exactly as ggml's `block_iq4_nl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockIQ4NL {
    /// The scale: value = `d · IQ4_VALUES[q]`.
    pub d: f16,
    /// Value j's index in the low nibble of byte j, value j + 16's in its high nibble.
    pub qs: [u8; QK / 2],
}

const _: () = assert!(core::mem::size_of::<BlockIQ4NL>() == BlockIQ4NL::BYTES);

impl BlockIQ4NL {
    /// Bytes of a stored block: Q4_0's layout.
    pub const BYTES: usize = BlockQ4_0::BYTES;
}

impl Block for BlockIQ4NL {
    const BYTES: usize = Self::BYTES;

    /// What `llama-quantize` writes without an importance matrix (ggml's `quantize_iq4_nl`: the
    /// scale searched over 15 candidates; its `quantize_row_iq4_nl_ref` skips the search).
    fn quantize(x: &[f32; QK]) -> Self {
        let mut l = [0u8; QK];
        let d = best_scale(x);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (l, v) in l.iter_mut().zip(x) {
            *l = nearest_value(id * v);
        }
        BlockIQ4NL {
            d: f16::from_f32(d),
            qs: pack_nibbles(&l),
        }
    }

    fn read(b: &[u8]) -> Self {
        let BlockQ4_0 { d, qs } = BlockQ4_0::read(b);
        BlockIQ4NL { d, qs }
    }

    fn write(&self, out: &mut [u8]) {
        BlockQ4_0 {
            d: self.d,
            qs: self.qs,
        }
        .write(out)
    }

    fn dequantize(&self, out: &mut [f32; QK]) {
        let d = self.d.to_f32();
        for (o, v) in out.iter_mut().zip(grid_values(&self.qs)) {
            *o = d * v as f32;
        }
    }
}

/// The 32 grid values of 16 bytes of nibbles, in order (low nibbles first).
pub fn grid_values(qs: &[u8]) -> [i8; QK] {
    core::array::from_fn(|j| {
        let n = qs[j % (QK / 2)];
        IQ4_VALUES[(if j < QK / 2 { n & 0x0f } else { n >> 4 }) as usize]
    })
}

/// 32 indices (0..16) as ggml packs them: value j in the low nibble of byte j, value j + 16 in
/// its high nibble.
pub(super) fn pack_nibbles(l: &[u8; QK]) -> [u8; QK / 2] {
    core::array::from_fn(|j| l[j] | (l[j + QK / 2] << 4))
}

/// ggml's `best_index_int8` over the grid: the index of the value nearest `x` (the lower one
/// on a tie).
pub(super) fn nearest_value(x: f32) -> u8 {
    let v = |i: usize| IQ4_VALUES[i] as f32;
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut lo, mut hi) = (0, 15);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < v(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - v(hi - 1) < v(hi) - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

/// The scale of one block of 32 values, as ggml's `quantize_row_iq4_nl_impl` searches it
/// without an importance matrix (weights `x²`): the least-squares scale for the indices of
/// `max / -127` and of 15 scales around it, the best of them; zero for a block of (near) zeros.
pub(super) fn best_scale(x: &[f32; QK]) -> f32 {
    const TRIES: i32 = 7;
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if libm::fabsf(v) > amax {
            amax = libm::fabsf(v);
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let first = IQ4_VALUES[0] as f32;
    // Σ w·q·x and Σ w·q² over the block for the indices scale `1 / id` gives.
    let sums = |id: f32| {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for &v in x {
            let q = IQ4_VALUES[nearest_value(id * v) as usize] as f32;
            let w = v * v;
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let (sumqx, sumq2) = sums(1.0 / (-max / first));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for step in -TRIES..=TRIES {
        let (sumqx, sumq2) = sums((step as f32 + first) / max);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_blocks;
    use proptest::prelude::*;

    #[test]
    fn nearest_value_is_nearest() {
        for i in -1400..=1400 {
            let x = i as f32 / 10.0;
            let got = IQ4_VALUES[nearest_value(x) as usize] as f32;
            let best = IQ4_VALUES
                .iter()
                .map(|&v| libm::fabsf(v as f32 - x))
                .fold(f32::MAX, f32::min);
            assert_eq!(libm::fabsf(got - x), best, "{x}");
        }
    }

    proptest! {
        #[test]
        fn round_trip_stays_near(x in proptest::collection::vec(-1e3f32..1e3, QK)) {
            let b = BlockIQ4NL::quantize(x.as_slice().try_into().unwrap());
            let mut bytes = [0u8; BlockIQ4NL::BYTES];
            b.write(&mut bytes);
            prop_assert_eq!(BlockIQ4NL::read(&bytes), b);
            let mut y = [0f32; QK];
            dequantize_blocks::<BlockIQ4NL>(&bytes, &mut y);
            // The grid's widest gap is 24 of its 240 steps, and its ends are 14 steps apart in
            // magnitude: with a least-squares scale no value moves by a quarter of the range.
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (a, b) in x.iter().zip(&y) {
                prop_assert!((a - b).abs() <= amax * 0.25 + 1e-3, "{} vs {}", a, b);
            }
        }
    }
}
