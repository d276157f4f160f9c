//! TQ2_0: 256 ternary values as `{ qs: [u8; 64], d: f16 }` (66 bytes), two bits each in Q2_K's
//! order (block `j` in bits `2(j % 4)` of `qs[32(j / 4)..]`); ggml's value is `d·(q − 1)`. Read
//! as a k-quant: every half's scale 1, stored quants `q` (0..=3) with the offset 1.
use super::k_quants::{u16_at, KBlock, KInts, UNIT_INTS};
use super::QK;

/// TQ2_0, read in place.
pub struct BlockTQ2_0;

impl KBlock for BlockTQ2_0 {
    const BYTES: usize = 66;
    const HAS_MIN: bool = false;
    const OFFSET: i32 = 1;
    /// A stored quant is two bits.
    const MAX_QUANT: u8 = 3;
    const SHARED_HALVES: bool = true;
    #[inline(always)]
    fn f16_bits(sb: &[u8]) -> [u16; 2] {
        let d = u16_at(sb, 64);
        [d, d]
    }
    #[inline(always)]
    fn ints(_: &[u8]) -> KInts {
        UNIT_INTS
    }
    fn quants(sb: &[u8], j: usize) -> [u8; QK] {
        core::array::from_fn(|m| (sb[32 * (j / 4) + m] >> (2 * (j % 4))) & 3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::k_quants::{dequantize_blocks, QK_K};
    use half::f16;
    use proptest::prelude::*;

    proptest! {
        /// ggml's `dequantize_row_tq2_0`, written out, is what the k-quant form gives.
        #[test]
        fn k_quant_form_is_ggml_dequantization(sb in proptest::collection::vec(any::<u8>(), 66)) {
            let mut sb = sb;
            sb[65] &= 0x3b; // a finite d
            let mut y = [0f32; QK_K];
            dequantize_blocks::<BlockTQ2_0>(&sb, &mut y);
            let d = f16::from_le_bytes([sb[64], sb[65]]).to_f32();
            let mut want = [0f32; QK_K];
            let mut k = 0;
            for j in (0..64).step_by(32) {
                for l in 0..4 {
                    for m in 0..32 {
                        let q = ((sb[j + m] >> (2 * l)) & 3) as i32;
                        want[k] = (q - 1) as f32 * d;
                        k += 1;
                    }
                }
            }
            prop_assert_eq!(y, want);
        }
    }
}
