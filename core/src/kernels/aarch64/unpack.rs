//! How each Q16-side weight format's blocks become 32 signed bytes and their scales (the
//! `Unpack` trait and one impl per format), and the bit-twiddling helpers the formats share (the
//! k-quants' bytes are in `kquants`).
use super::*;
use crate::quant::iq4_nl::IQ4_VALUES;

/// A weight block's 32 quants as signed bytes (values 0..16, 16..32).
pub(super) trait Unpack {
    const BYTES: usize;
    /// Whether the block has a minimum whose term `m·(dx·Σq)` is added.
    const HAS_MIN: bool = false;
    /// The quants of the block at the start of `b` (`BYTES` long).
    fn unpack(b: &[u8]) -> (int8x16_t, int8x16_t);
    /// The scale and the minimum: an f16 scale first and, with a minimum, an f16 minimum after
    /// it.
    #[inline(always)]
    fn scales(b: &[u8]) -> (f32, f32) {
        (f16_at(b), if Self::HAS_MIN { f16_at(&b[2..]) } else { 0.0 })
    }
}

impl Unpack for BlockQ8_0 {
    const BYTES: usize = Self::BYTES;
    #[inline(always)]
    fn unpack(b: &[u8]) -> (int8x16_t, int8x16_t) {
        let q = &b[2..Self::BYTES];
        // SAFETY: `q` holds the block's 32 quants.
        unsafe {
            let p = q.as_ptr() as *const i8;
            (vld1q_s8(p), vld1q_s8(p.add(16)))
        }
    }
}

impl Unpack for BlockQ4_0 {
    const BYTES: usize = Self::BYTES;
    #[inline(always)]
    fn unpack(b: &[u8]) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = nibbles(&b[2..]);
        // SAFETY: register-only NEON arithmetic.
        unsafe {
            let eight = vdupq_n_s8(8);
            (
                vsubq_s8(vreinterpretq_s8_u8(lo), eight),
                vsubq_s8(vreinterpretq_s8_u8(hi), eight),
            )
        }
    }
}

impl Unpack for BlockQ4_1 {
    const BYTES: usize = Self::BYTES;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn unpack(b: &[u8]) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = nibbles(&b[4..]);
        // SAFETY: register-only; nibbles are 0..=15, so reinterpreting them as i8 keeps them.
        unsafe { (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi)) }
    }
}

impl Unpack for BlockQ5_0 {
    const BYTES: usize = Self::BYTES;
    #[inline(always)]
    fn unpack(b: &[u8]) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = fives(&b[2..6], &b[6..]);
        // SAFETY: register-only NEON arithmetic; five-bit quants are 0..=31, so as i8 they stay.
        unsafe {
            let sixteen = vdupq_n_s8(16);
            (
                vsubq_s8(vreinterpretq_s8_u8(lo), sixteen),
                vsubq_s8(vreinterpretq_s8_u8(hi), sixteen),
            )
        }
    }
}

impl Unpack for BlockQ5_1 {
    const BYTES: usize = Self::BYTES;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn unpack(b: &[u8]) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = fives(&b[4..8], &b[8..]);
        // SAFETY: register-only; five-bit quants are 0..=31, so reinterpreting them as i8 keeps them.
        unsafe { (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi)) }
    }
}

impl Unpack for BlockIQ4NL {
    const BYTES: usize = Self::BYTES;
    #[inline(always)]
    fn unpack(b: &[u8]) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = nibbles(&b[2..]);
        // SAFETY: the grid is 16 bytes; the rest is register-only NEON arithmetic.
        unsafe {
            let grid = vld1q_s8(IQ4_VALUES.as_ptr());
            (vqtbl1q_s8(grid, lo), vqtbl1q_s8(grid, hi))
        }
    }
}

/// The five-bit quants of a Q5 block (fifth bits `qh`, 4 bytes; nibbles `qs`): elements 0..16
/// and 16..32. Each lane picks the byte of `qh` that holds its bit and tests it.
#[inline(always)]
pub(super) fn fives(qh: &[u8], qs: &[u8]) -> (uint8x16_t, uint8x16_t) {
    const BYTE_LO: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
    const BYTE_HI: [u8; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let (lo, hi) = nibbles(qs);
    // SAFETY: register-only NEON arithmetic, and loads of the three 16-byte tables.
    unsafe {
        let bits = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
        let q = vreinterpretq_u8_u32(vdupq_n_u32(bits));
        let bit = vld1q_u8(BIT.as_ptr());
        let sixteen = vdupq_n_u8(16);
        let fifth_lo = vandq_u8(
            vtstq_u8(vqtbl1q_u8(q, vld1q_u8(BYTE_LO.as_ptr())), bit),
            sixteen,
        );
        let fifth_hi = vandq_u8(
            vtstq_u8(vqtbl1q_u8(q, vld1q_u8(BYTE_HI.as_ptr())), bit),
            sixteen,
        );
        (vorrq_u8(lo, fifth_lo), vorrq_u8(hi, fifth_hi))
    }
}

/// The 32 nibbles of a Q4 block: elements 0..16 (low nibbles) and 16..32 (high nibbles).
#[inline(always)]
pub(super) fn nibbles(qs: &[u8]) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: the callers pass a slice of at least 16 bytes.
    unsafe {
        let v = vld1q_u8(qs[..16].as_ptr());
        (vandq_u8(v, vdupq_n_u8(0x0f)), vshrq_n_u8(v, 4))
    }
}
