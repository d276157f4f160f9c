//! TQ1_0: 256 ternary values as `{ qs: [u8; 48], qh: [u8; 4], d: f16 }` (54 bytes), five base-3
//! digits per byte of `qs` and four per byte of `qh`; ggml's value is `d·(t − 1)` with `t` a
//! digit (0, 1 or 2). In value order: digits 0..5 of `qs[0..32]` (32 values each), digits 0..5
//! of `qs[32..48]` (16 each), digits 0..4 of `qh` (4 each). Digit `n` of a byte `b` is ggml's
//! `(u8(b·3ⁿ)·3) >> 8`: the bytes hold the digits as a fraction of 243, rounded up. Read as a
//! k-quant: every half's scale 1, stored quants `t` with the offset 1.
use super::k_quants::{u16_at, KBlock, KInts, UNIT_INTS};
use super::QK;

/// TQ1_0, read in place.
pub struct BlockTQ1_0;

/// `3ⁿ` for the digits of a byte.
pub const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Digit `n` (0..5) of `b` in TQ1_0's packing.
#[inline(always)]
pub fn trit(b: u8, n: usize) -> u8 {
    ((b.wrapping_mul(POW3[n]) as u16 * 3) >> 8) as u8
}

impl BlockTQ1_0 {
    /// Byte offset of the last 16 bytes of five digits.
    pub const QS_TAIL: usize = 32;
    /// Byte offset of the four bytes of four digits.
    pub const QH: usize = 48;

    /// Value `v` of block `j` as (the byte holding it, its digit).
    #[inline(always)]
    pub fn digit_of(j: usize, v: usize) -> (usize, usize) {
        match j {
            0..5 => (v, j),
            5 | 6 => (Self::QS_TAIL + v % 16, 2 * (j - 5) + v / 16),
            _ if v < 16 => (Self::QS_TAIL + v, 4),
            _ => (Self::QH + (v - 16) % 4, (v - 16) / 4),
        }
    }
}

impl KBlock for BlockTQ1_0 {
    const BYTES: usize = 54;
    const HAS_MIN: bool = false;
    const OFFSET: i32 = 1;
    /// A stored quant is a base-3 digit.
    const MAX_QUANT: u8 = 2;
    const SHARED_HALVES: bool = true;
    #[inline(always)]
    fn f16_bits(sb: &[u8]) -> [u16; 2] {
        let d = u16_at(sb, 52);
        [d, d]
    }
    #[inline(always)]
    fn ints(_: &[u8]) -> KInts {
        UNIT_INTS
    }
    fn quants(sb: &[u8], j: usize) -> [u8; QK] {
        core::array::from_fn(|v| {
            let (at, n) = Self::digit_of(j, v);
            trit(sb[at], n)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::k_quants::{dequantize_blocks, QK_K};
    use alloc::vec::Vec;
    use half::f16;
    use proptest::prelude::*;

    proptest! {
        /// ggml's `dequantize_row_tq1_0`, written out, is what the k-quant form gives.
        #[test]
        fn k_quant_form_is_ggml_dequantization(sb in proptest::collection::vec(any::<u8>(), 54)) {
            let mut sb = sb;
            sb[53] &= 0x3b; // a finite d
            let mut y = [0f32; QK_K];
            dequantize_blocks::<BlockTQ1_0>(&sb, &mut y);
            let d = f16::from_le_bytes([sb[52], sb[53]]).to_f32();
            let pow3: [u8; 6] = [1, 3, 9, 27, 81, 243];
            let value = |b: u8, n: usize| {
                let q = b.wrapping_mul(pow3[n]);
                let xi = ((q as u16 * 3) >> 8) as i16;
                (xi - 1) as f32 * d
            };
            let mut want = Vec::new();
            for n in 0..5 {
                want.extend((0..32).map(|m| value(sb[m], n)));
            }
            for n in 0..5 {
                want.extend((0..16).map(|m| value(sb[32 + m], n)));
            }
            for n in 0..4 {
                want.extend((0..4).map(|j| value(sb[48 + j], n)));
            }
            prop_assert_eq!(&y[..], &want[..]);
        }
    }
}
