//! How each weight format's blocks become 32 signed bytes and their scales (the `Unpack`
//! trait and one impl per format), and the bit-twiddling helpers the formats share.
use super::*;

/// A weight block's 32 quants as signed bytes (values 0..16, 16..32). Blocks are stored in
/// units of `BYTES` bytes: one block, or a k-quant super-block of `UNIT` blocks, where `j` says
/// which.
pub(super) trait Unpack {
    const BYTES: usize;
    /// Blocks of 32 values per unit.
    const UNIT: usize = 1;
    /// Whether the block has a minimum whose term `m·(dx·Σq)` is added.
    const HAS_MIN: bool = false;
    /// Whether the "minimum" is the scale of the block's second half instead (Q6_K, Q3_K, Q2_K).
    const HALF_SCALES: bool = false;
    /// Whether each half also has a minimum (Q2_K, with `HALF_SCALES`).
    const HALF_MINS: bool = false;
    /// The quants of block `j` of the unit at the start of `b` (`BYTES` long).
    fn unpack(b: &[u8], j: usize) -> (int8x16_t, int8x16_t);
    /// The scale and the minimum of a single-block unit: an f16 scale first and, with a
    /// minimum, an f16 minimum after it. K-quants read theirs with `unit_scales`.
    #[inline(always)]
    fn scales(b: &[u8]) -> (f32, f32) {
        debug_assert_eq!(Self::UNIT, 1);
        (f16_at(b), if Self::HAS_MIN { f16_at(&b[2..]) } else { 0.0 })
    }
    /// The scales and minimums (or second scales) of all `UNIT` blocks of a k-quant super-block,
    /// which a kernel walking the blocks in order reads once per super-block.
    fn unit_scales(_b: &[u8]) -> ([f32; BLOCKS_PER_SUPER], [f32; BLOCKS_PER_SUPER]) {
        unreachable!("single-block formats have no super-blocks")
    }
    /// The half minimums of all `UNIT` blocks of a super-block (`HALF_MINS` only), read with
    /// the scales.
    fn unit_mins(_b: &[u8]) -> ([f32; BLOCKS_PER_SUPER], [f32; BLOCKS_PER_SUPER]) {
        unreachable!("only formats with half minimums have them")
    }
}

macro_rules! k_unpack {
    ($($t:ty => $unpack:expr),* $(,)?) => {$(
        impl Unpack for $t {
            const BYTES: usize = <$t as KBlock>::BYTES;
            const UNIT: usize = BLOCKS_PER_SUPER;
            const HAS_MIN: bool = <$t as KBlock>::HAS_MIN;
            const HALF_SCALES: bool = <$t as KBlock>::HALF_SCALES;
            const HALF_MINS: bool = <$t as KBlock>::HALF_MINS;
            #[inline(always)]
            fn unpack(b: &[u8], j: usize) -> (int8x16_t, int8x16_t) {
                $unpack(b, j)
            }
            #[inline(always)]
            fn unit_scales(b: &[u8]) -> ([f32; BLOCKS_PER_SUPER], [f32; BLOCKS_PER_SUPER]) {
                <$t as KBlock>::unit_scales(b)
            }
            #[inline(always)]
            fn unit_mins(b: &[u8]) -> ([f32; BLOCKS_PER_SUPER], [f32; BLOCKS_PER_SUPER]) {
                <$t as KBlock>::unit_mins(b)
            }
        }
    )*};
}

k_unpack!(
    BlockQ2K => |b: &[u8], j: usize| {
        let (lo, hi) = bits32(&b[16 + 32 * (j / 4)..][..32], 2 * (j % 4), 3);
        // SAFETY: register-only; the quants are 0..=3, so reinterpreting them as i8 keeps them.
        unsafe { (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi)) }
    },
    BlockQ3K => |b: &[u8], j: usize| {
        let (low_lo, low_hi) = bits32(&b[32 + 32 * (j / 4)..][..32], 2 * (j % 4), 3);
        let (high_lo, high_hi) = bits32(&b[..32], j, 1);
        // SAFETY: register-only; the quants are 0..=7 before the bias, -4..=3 after.
        unsafe {
            let bias = vdupq_n_s8(4);
            (
                vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low_lo, vshlq_n_u8(high_lo, 2))), bias),
                vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low_hi, vshlq_n_u8(high_hi, 2))), bias),
            )
        }
    },
    BlockQ4K => |b: &[u8], j: usize| {
        let (lo, hi) = bits32(&b[16 + 32 * (j / 2)..][..32], 4 * (j % 2), 0x0f);
        // SAFETY: register-only; nibbles are 0..=15, so reinterpreting them as i8 keeps them.
        unsafe { (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi)) }
    },
    BlockQ5K => |b: &[u8], j: usize| {
        let (lo, hi) = bits32(&b[48 + 32 * (j / 2)..][..32], 4 * (j % 2), 0x0f);
        let (h_lo, h_hi) = bits32(&b[16..48], j, 1);
        // SAFETY: register-only; the quants are 0..=31, so as i8 they stay.
        unsafe {
            (
                vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8(h_lo, 4))),
                vreinterpretq_s8_u8(vorrq_u8(hi, vshlq_n_u8(h_hi, 4))),
            )
        }
    },
    BlockQ6K => |b: &[u8], j: usize| {
        let (n, c) = (j / 4, j % 4);
        let (lo, hi) = bits32(&b[64 * n + 32 * (c % 2)..][..32], 4 * (c / 2), 0x0f);
        let (h_lo, h_hi) = bits32(&b[128 + 32 * n..][..32], 2 * c, 3);
        // SAFETY: register-only; the quants are 0..=63 before the bias, -32..=31 after.
        unsafe {
            let bias = vdupq_n_s8(32);
            (
                vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8(h_lo, 4))), bias),
                vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(hi, vshlq_n_u8(h_hi, 4))), bias),
            )
        }
    },
);

/// `(byte >> shift) & mask` of the 32 bytes of `b`: nibbles, or a k-quant's high bits.
#[inline(always)]
pub(super) fn bits32(b: &[u8], shift: usize, mask: u8) -> (uint8x16_t, uint8x16_t) {
    let b = &b[..32];
    // SAFETY: `b` holds 32 bytes; the rest is register-only NEON arithmetic.
    unsafe {
        let count = vdupq_n_s8(-(shift as i8));
        let mask = vdupq_n_u8(mask);
        let v0 = vshlq_u8(vld1q_u8(b.as_ptr()), count);
        let v1 = vshlq_u8(vld1q_u8(b.as_ptr().add(16)), count);
        (vandq_u8(v0, mask), vandq_u8(v1, mask))
    }
}

impl Unpack for BlockQ8_0 {
    const BYTES: usize = Self::BYTES;
    #[inline(always)]
    fn unpack(b: &[u8], _: usize) -> (int8x16_t, int8x16_t) {
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
    fn unpack(b: &[u8], _: usize) -> (int8x16_t, int8x16_t) {
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
    fn unpack(b: &[u8], _: usize) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = nibbles(&b[4..]);
        // SAFETY: register-only; nibbles are 0..=15, so reinterpreting them as i8 keeps them.
        unsafe { (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi)) }
    }
}

impl Unpack for BlockQ5_0 {
    const BYTES: usize = Self::BYTES;
    #[inline(always)]
    fn unpack(b: &[u8], _: usize) -> (int8x16_t, int8x16_t) {
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
    fn unpack(b: &[u8], _: usize) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = fives(&b[4..8], &b[8..]);
        // SAFETY: register-only; five-bit quants are 0..=31, so reinterpreting them as i8 keeps them.
        unsafe { (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi)) }
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
