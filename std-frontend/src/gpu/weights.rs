//! Weights as the shaders read them: each matrix repacked once at upload into words the GPU can
//! index (quants, then f32 scales and minimums per block or half, or for the k-quants their
//! super-blocks' f32 scales and each block's 8-bit multipliers), split into parts by rows wherever
//! one would exceed a storage binding.
use anyhow::{bail, Result};
use half::{bf16, f16};
use sapient_core::quant::k_quants::BLOCKS_PER_SUPER;
use sapient_core::quant::{
    iq4_nl, Block, BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S,
    BlockIQ3XXS, BlockIQ4NL, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1,
    BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0, BlockTQ1_0, BlockTQ2_0, Format, KBlock,
    QK,
};
use sapient_core::{Matrix, RopeStyle};
use wgpu::util::DeviceExt;

/// How a matrix's words are laid out on the device; one `deq` in formats.wgsl each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuFormat {
    Q8_0,
    Q4_0,
    Q4_1,
    /// Q4_1 with 5-bit quants: 4 words of low nibbles and one of high bits a block (7 words with
    /// the scale and minimum, where Q8_HALVES takes 12).
    Q5,
    /// 6-bit quants less 32 (4 words of low nibbles, 2 of high bits) with an f32 scale per 16
    /// values: 8 words a block.
    Q6Halves,
    /// 8-bit quants with an f32 scale and minimum per 16 values: every integer format's values
    /// exactly (the k-quants' halves, `k_quants::KBlock`).
    Q8Halves,
    /// Q4_K's super-blocks: Q4_1's nibbles; per 8 blocks an f32 `d` and `-dmin`, per block an
    /// 8-bit scale and minimum (4.75 bits a value, where the file takes 4.5).
    Q4K,
    /// Q5_K's (and Q4_K's): Q5's quants under Q4_K's scales (5.75 bits a value, the file 5.5).
    Q5K,
    /// Q6_K's and Q3_K's: Q6_HALVES' quants; per 8 blocks an f32 `d`, per half an 8-bit signed
    /// scale (6.625 bits a value, Q6_K's file 6.5625).
    Q6K,
    F16,
    F32,
}

impl GpuFormat {
    /// Every layout (the shader tests compile each).
    #[cfg(test)]
    pub const ALL: [GpuFormat; 11] = [
        GpuFormat::Q8_0,
        GpuFormat::Q4_0,
        GpuFormat::Q4_1,
        GpuFormat::Q5,
        GpuFormat::Q6Halves,
        GpuFormat::Q8Halves,
        GpuFormat::Q4K,
        GpuFormat::Q5K,
        GpuFormat::Q6K,
        GpuFormat::F16,
        GpuFormat::F32,
    ];

    /// The device layout for a core format, each value exact: the i-quants' grid values whose
    /// blocks have one scale are 8-bit quants (IQ4_XS's block scale `d·(ls − 32)`, IQ3_S's
    /// `d·(1 + 2s)`, IQ1_S's values `8g ± 1` under `d/8·(2s + 1)`, an f32; TQ1_0's and TQ2_0's
    /// ternary values under `d`); Q4_K, Q5_K, Q6_K and Q3_K keep their super-blocks' scales
    /// (each block's `d·scale` and `-dmin·min` products of an f16 and an 8-bit integer, exact
    /// in f32); Q5_0's and Q5_1's blocks are Q5's (Q5_0's minimum `-16·d`); Q2_K and the
    /// i-quants with a scale per half (IQ2_XS, IQ2_S, IQ1_M) the 8-bit halves; BF16 widens to
    /// F32.
    pub fn of(format: Format) -> Self {
        match format {
            Format::Q8_0
            | Format::IQ4NL
            | Format::IQ4XS
            | Format::IQ3S
            | Format::IQ3XXS
            | Format::IQ2XXS
            | Format::IQ1S
            | Format::TQ1_0
            | Format::TQ2_0 => GpuFormat::Q8_0,
            Format::Q4_0 => GpuFormat::Q4_0,
            Format::Q4_1 => GpuFormat::Q4_1,
            Format::Q4K => GpuFormat::Q4K,
            Format::Q5K => GpuFormat::Q5K,
            Format::Q5_0 | Format::Q5_1 => GpuFormat::Q5,
            Format::Q6K | Format::Q3K => GpuFormat::Q6K,
            Format::Q2K | Format::IQ2XS | Format::IQ2S | Format::IQ1M => GpuFormat::Q8Halves,
            Format::F16 => GpuFormat::F16,
            Format::F32 | Format::BF16 => GpuFormat::F32,
        }
    }

    /// The layout of matrices sharing one mat-mul (Q|K|V, gate|up): their own where they
    /// agree; else the smallest integer layout that holds them all (Q8_HALVES holds any), or
    /// f32.
    pub fn common(formats: impl IntoIterator<Item = Format> + Clone) -> Self {
        let mut layouts = formats.clone().into_iter().map(GpuFormat::of);
        let first = layouts.next().unwrap_or(GpuFormat::F32);
        if layouts.all(|l| l == first) {
            return first;
        }
        [
            GpuFormat::Q4K,
            GpuFormat::Q5K,
            GpuFormat::Q6K,
            GpuFormat::Q5,
            GpuFormat::Q6Halves,
            GpuFormat::Q8_0,
            GpuFormat::Q8Halves,
        ]
        .into_iter()
        .find(|l| formats.clone().into_iter().all(|f| l.holds(f)))
        .unwrap_or(GpuFormat::F32)
    }

    /// Whether `write_blocks` can write `format`'s blocks in this layout, each value exact.
    fn holds(self, format: Format) -> bool {
        let own = GpuFormat::of(format);
        match self {
            // Q4_0's and Q5_0's quants less their offset are 8-bit, 6-bit (one scale, no
            // minimum) and, plus 16 under the minimum -16·d, 5-bit ones; Q6_K's and Q3_K's 6-bit
            // under a scale per half; Q4_K's and Q5_K's 5-bit under one per block.
            GpuFormat::Q8_0 => own == self || matches!(format, Format::Q4_0 | Format::Q5_0),
            GpuFormat::Q6Halves => matches!(
                format,
                Format::Q4_0 | Format::Q5_0 | Format::Q6K | Format::Q3K
            ),
            GpuFormat::Q5 => {
                matches!(own, GpuFormat::Q5 | GpuFormat::Q4_1)
                    || matches!(format, Format::Q4_0 | Format::Q4K | Format::Q5K)
            }
            GpuFormat::Q5K => matches!(format, Format::Q4K | Format::Q5K),
            GpuFormat::Q8Halves => own.is_integer(),
            GpuFormat::Q4_0
            | GpuFormat::Q4_1
            | GpuFormat::Q4K
            | GpuFormat::Q6K
            | GpuFormat::F16 => own == self,
            GpuFormat::F32 => true,
        }
    }

    /// Whether the quants are integers that packed 8-bit dot products can take.
    pub fn is_integer(self) -> bool {
        !matches!(self, GpuFormat::F16 | GpuFormat::F32)
    }

    pub fn name(self) -> &'static str {
        match self {
            GpuFormat::Q8_0 => "Q8_0",
            GpuFormat::Q4_0 => "Q4_0",
            GpuFormat::Q4_1 => "Q4_1",
            GpuFormat::Q5 => "Q5",
            GpuFormat::Q6Halves => "Q6_HALVES",
            GpuFormat::Q8Halves => "Q8_HALVES",
            GpuFormat::Q4K => "Q4_K",
            GpuFormat::Q5K => "Q5_K",
            GpuFormat::Q6K => "Q6_K",
            GpuFormat::F16 => "F16",
            GpuFormat::F32 => "F32",
        }
    }

    /// The section of formats.wgsl with its `deq` and `qdot` (Q5 shares Q4_1's scales, Q5_K
    /// Q4_K's).
    pub fn scales_section(self) -> &'static str {
        match self {
            GpuFormat::Q5 => GpuFormat::Q4_1.name(),
            GpuFormat::Q5K => GpuFormat::Q4K.name(),
            _ => self.name(),
        }
    }

    /// The section of formats.wgsl with its `qword`, if it has quants.
    pub fn quants_section(self) -> Option<&'static str> {
        match self {
            GpuFormat::Q8_0 | GpuFormat::Q8Halves => Some("bytes"),
            GpuFormat::Q4_0 | GpuFormat::Q4_1 | GpuFormat::Q4K => Some("nibbles"),
            GpuFormat::Q5 | GpuFormat::Q5K => Some("nibbles_bit"),
            GpuFormat::Q6Halves | GpuFormat::Q6K => Some("nibbles_2bits"),
            GpuFormat::F16 | GpuFormat::F32 => None,
        }
    }

    /// Words of quants (or values) per 32-value block.
    fn block_words(self) -> usize {
        match self {
            GpuFormat::Q8_0 | GpuFormat::Q8Halves => 8,
            GpuFormat::Q4_0 | GpuFormat::Q4_1 | GpuFormat::Q4K => 4,
            GpuFormat::Q5 | GpuFormat::Q5K => 5,
            GpuFormat::Q6Halves | GpuFormat::Q6K => 6,
            GpuFormat::F16 => 16,
            GpuFormat::F32 => 32,
        }
    }

    /// Whether the layout keeps the k-quants' super-block scales (`write_super_blocks`).
    fn is_super(self) -> bool {
        matches!(self, GpuFormat::Q4K | GpuFormat::Q5K | GpuFormat::Q6K)
    }

    /// Words of scales of a row of `blocks` blocks (the word at `d_off`): an f32 per block or
    /// half, or per super-block of 8 blocks `d` (and `-dmin`).
    fn scale_words(self, blocks: usize) -> usize {
        match self {
            GpuFormat::Q8_0 | GpuFormat::Q4_0 | GpuFormat::Q4_1 | GpuFormat::Q5 => blocks,
            GpuFormat::Q6Halves | GpuFormat::Q8Halves => 2 * blocks,
            GpuFormat::Q4K | GpuFormat::Q5K => 2 * blocks / BLOCKS_PER_SUPER,
            GpuFormat::Q6K => blocks / BLOCKS_PER_SUPER,
            GpuFormat::F16 | GpuFormat::F32 => 0,
        }
    }

    /// Words after the scales (at `m_off`): an f32 minimum per block or half, or for the
    /// super-block layouts each block's two 8-bit multipliers, two blocks to a word.
    fn min_words(self, blocks: usize) -> usize {
        match self {
            GpuFormat::Q4_1 | GpuFormat::Q5 => blocks,
            GpuFormat::Q8Halves => 2 * blocks,
            GpuFormat::Q4K | GpuFormat::Q5K | GpuFormat::Q6K => blocks / 2,
            GpuFormat::Q8_0
            | GpuFormat::Q4_0
            | GpuFormat::Q6Halves
            | GpuFormat::F16
            | GpuFormat::F32 => 0,
        }
    }
}

/// The order of an uploaded matrix's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowOrder {
    /// The matrices' rows one after another.
    Stacked,
    /// Row by row in turn (gate, up, gate, up, ...: the SwiGLU epilogue reads them in pairs).
    Interleaved,
    /// Stacked, with the dimensions of each head in the first `rotated` rows (Q|K) ordered j,
    /// j + head_dim/2, j + 1, ...: the pairs that RoPE rotates by halves become neighbours, as
    /// the Q|K|V epilogue takes them (the pairs of adjacent RoPE are neighbours when stacked).
    RopePairs { head_dim: usize, rotated: usize },
}

impl RowOrder {
    /// Q|K|V's order, its first `rotated` rows (Q|K) in heads of `head_dim` that RoPE rotates in
    /// `style`'s pairs: each pair neighbours, as the Q|K|V epilogue takes them.
    pub fn qkv(style: RopeStyle, head_dim: usize, rotated: usize) -> Self {
        match style {
            RopeStyle::Adjacent => RowOrder::Stacked,
            RopeStyle::Halves => RowOrder::RopePairs { head_dim, rotated },
        }
    }

    /// The row of the stacked matrices that row `r` of the upload holds (not `Interleaved`).
    pub fn stacked_row(self, r: usize) -> usize {
        match self {
            RowOrder::RopePairs { head_dim, rotated } if r < rotated => {
                let u = r % head_dim;
                r - u + u / 2 + (u % 2) * (head_dim / 2)
            }
            _ => r,
        }
    }
}

/// Rows `row0 .. row0 + rows` of a matrix, in one storage buffer.
pub struct Part {
    pub buffer: wgpu::Buffer,
    pub row0: usize,
    pub rows: usize,
    /// Word offsets of the scales and the minimums.
    pub d_off: usize,
    pub m_off: usize,
}

pub struct GpuMatrix {
    pub format: GpuFormat,
    pub cols: usize,
    /// Blocks of 32 per row (rows of float formats are padded with zeros to whole blocks).
    pub blocks: usize,
    pub parts: Vec<Part>,
}

impl GpuMatrix {
    /// Uploads the rows of `mats` as one matrix (Q|K|V; gate|up), in `order`. Matrices of
    /// different formats are widened to f32 together. Parts hold whole multiples of
    /// `row_multiple` rows, at most `max_binding` bytes each.
    pub fn upload(
        device: &wgpu::Device,
        name: &str,
        mats: &[&Matrix<'_>],
        order: RowOrder,
        row_multiple: usize,
        max_binding: u64,
    ) -> Result<Self> {
        let cols = mats[0].cols;
        if mats.iter().any(|m| m.cols != cols) {
            bail!("{name}: matrices of different widths cannot share a mat-mul");
        }
        let interleave = order == RowOrder::Interleaved;
        if interleave && mats.iter().any(|m| m.rows != mats[0].rows) {
            bail!("{name}: interleaved matrices need the same number of rows");
        }
        let format = GpuFormat::common(mats.iter().map(|m| m.format));
        let rows: usize = mats.iter().map(|m| m.rows).sum();
        let blocks = cols.div_ceil(QK);
        if format != GpuFormat::F32 && format != GpuFormat::F16 && !cols.is_multiple_of(QK) {
            bail!("{name}: {cols} columns are not whole blocks of {QK}");
        }
        // Row `r` of the uploaded matrix.
        let source = |r: usize| -> (&Matrix<'_>, usize) {
            if interleave {
                (mats[r % mats.len()], r / mats.len())
            } else {
                let mut r = order.stacked_row(r);
                for m in mats {
                    if r < m.rows {
                        return (m, r);
                    }
                    r -= m.rows;
                }
                unreachable!("row index checked against the sum of rows")
            }
        };
        let (qw, sw, mw) = (
            blocks * format.block_words(),
            format.scale_words(blocks),
            format.min_words(blocks),
        );
        let row_words = qw + sw + mw;
        let max_rows = (max_binding as usize / (row_words * 4)) / row_multiple * row_multiple;
        if max_rows == 0 {
            bail!(
                "{name}: one row ({} bytes) exceeds the GPU's storage binding limit",
                row_words * 4
            );
        }
        let mut parts = Vec::new();
        let mut row0 = 0;
        let mut widened = vec![0f32; cols];
        let mut ints = Vec::with_capacity(blocks);
        while row0 < rows {
            let n = (rows - row0).min(max_rows);
            let mut words = vec![0u32; n * row_words];
            let (qs, scales) = words.split_at_mut(n * qw);
            let (ds, ms) = scales.split_at_mut(n * sw);
            for i in 0..n {
                let (m, r) = source(row0 + i);
                let bytes = m.row(r);
                let q = &mut qs[i * qw..][..qw];
                let d = &mut ds[i * sw..][..sw];
                let mins = &mut ms[i * mw..][..mw];
                if format == GpuFormat::F32 {
                    if matches!(m.format, Format::F32 | Format::BF16) {
                        widen_row(bytes, cols, q);
                    } else {
                        m.dequantize_row(r, &mut widened)?;
                        for (w, v) in q.iter_mut().zip(&widened) {
                            *w = v.to_bits();
                        }
                    }
                } else if format == GpuFormat::of(m.format)
                    && matches!(
                        m.format,
                        Format::Q8_0 | Format::Q4_0 | Format::Q4_1 | Format::F16
                    )
                {
                    repack_row(format, bytes, q, d, mins);
                } else if format.is_super() {
                    write_super_blocks(format, m.format, bytes, q, d, mins);
                } else {
                    int_blocks(m.format, bytes, &mut ints);
                    write_blocks(format, &ints, q, d, mins);
                }
            }
            let buffer = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(name),
                contents: bytemuck::cast_slice(&words),
                usage: wgpu::BufferUsages::STORAGE,
            });
            parts.push(Part {
                buffer,
                row0,
                rows: n,
                d_off: n * qw,
                m_off: n * (qw + sw),
            });
            row0 += n;
        }
        Ok(GpuMatrix {
            format,
            cols,
            blocks,
            parts,
        })
    }
}

fn f16_bits(b: &[u8]) -> u32 {
    f16::from_le_bytes([b[0], b[1]]).to_f32().to_bits()
}

fn word(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// One row of Q8_0, Q4_0, Q4_1 or F16 blocks into its own layout: quant words `q`, scales `d`
/// and (Q4_1) minimums `m`, byte for byte.
fn repack_row(format: GpuFormat, bytes: &[u8], q: &mut [u32], d: &mut [u32], m: &mut [u32]) {
    match format {
        GpuFormat::Q8_0 => {
            for (b, blk) in bytes.chunks_exact(2 + QK).enumerate() {
                d[b] = f16_bits(blk);
                for j in 0..QK / 4 {
                    q[b * 8 + j] = word(&blk[2 + 4 * j..]);
                }
            }
        }
        GpuFormat::Q4_0 => {
            for (b, blk) in bytes.chunks_exact(2 + QK / 2).enumerate() {
                d[b] = f16_bits(blk);
                for j in 0..4 {
                    q[b * 4 + j] = word(&blk[2 + 4 * j..]);
                }
            }
        }
        GpuFormat::Q4_1 => {
            for (b, blk) in bytes.chunks_exact(4 + QK / 2).enumerate() {
                d[b] = f16_bits(blk);
                m[b] = f16_bits(&blk[2..]);
                for j in 0..4 {
                    q[b * 4 + j] = word(&blk[4 + 4 * j..]);
                }
            }
        }
        GpuFormat::F16 => {
            for (i, pair) in bytes.chunks(4).enumerate() {
                let lo = u16::from_le_bytes([pair[0], pair[1]]) as u32;
                let hi = pair
                    .get(2..4)
                    .map_or(0, |h| u16::from_le_bytes([h[0], h[1]]) as u32);
                q[i] = lo | hi << 16;
            }
        }
        GpuFormat::Q5
        | GpuFormat::Q6Halves
        | GpuFormat::Q8Halves
        | GpuFormat::Q4K
        | GpuFormat::Q5K
        | GpuFormat::Q6K
        | GpuFormat::F32 => {
            unreachable!("{format:?} rows are transcoded or widened, never repacked")
        }
    }
}

/// A row of F32 or BF16 values as f32 words (BF16 widened exactly).
fn widen_row(bytes: &[u8], cols: usize, q: &mut [u32]) {
    if bytes.len() == cols * 4 {
        for (w, b) in q.iter_mut().zip(bytes.chunks_exact(4)) {
            *w = word(b);
        }
    } else {
        for (w, b) in q.iter_mut().zip(bytes.chunks_exact(2)) {
            *w = bf16::from_le_bytes([b[0], b[1]]).to_f32().to_bits();
        }
    }
}

/// A 32-value block of any integer format as signed quants with, per 16-value half, a scale
/// and a minimum: value `k` is `scale[k / 16]·q[k] + min[k / 16]`, as the core widens it.
#[derive(Clone, Copy)]
struct IntBlock {
    q: [i8; QK],
    scale: [f32; 2],
    min: [f32; 2],
}

impl IntBlock {
    fn new(q: [i8; QK], scale: f32, min: f32) -> Self {
        IntBlock {
            q,
            scale: [scale; 2],
            min: [min; 2],
        }
    }
}

/// The blocks of one row of an integer format, in order, into `out`.
fn int_blocks(format: Format, bytes: &[u8], out: &mut Vec<IntBlock>) {
    out.clear();
    let signed = |q: [u8; QK], offset: i32| q.map(|v| (v as i32 - offset) as i8);
    match format {
        Format::Q8_0 => out.extend(bytes.chunks_exact(BlockQ8_0::BYTES).map(|b| {
            let b = BlockQ8_0::read(b);
            IntBlock::new(b.qs, b.d.to_f32(), 0.0)
        })),
        Format::Q4_0 => out.extend(bytes.chunks_exact(BlockQ4_0::BYTES).map(|b| {
            let b = BlockQ4_0::read(b);
            IntBlock::new(signed(nibbles(&b.qs), 8), b.d.to_f32(), 0.0)
        })),
        Format::Q4_1 => out.extend(bytes.chunks_exact(BlockQ4_1::BYTES).map(|b| {
            let b = BlockQ4_1::read(b);
            IntBlock::new(signed(nibbles(&b.qs), 0), b.d.to_f32(), b.m.to_f32())
        })),
        Format::Q5_0 => out.extend(bytes.chunks_exact(BlockQ5_0::BYTES).map(|b| {
            let b = BlockQ5_0::read(b);
            IntBlock::new(signed(b.quants(), 16), b.d.to_f32(), 0.0)
        })),
        Format::Q5_1 => out.extend(bytes.chunks_exact(BlockQ5_1::BYTES).map(|b| {
            let b = BlockQ5_1::read(b);
            IntBlock::new(signed(b.quants(), 0), b.d.to_f32(), b.m.to_f32())
        })),
        Format::Q2K => k_blocks::<BlockQ2K>(bytes, out),
        Format::Q3K => k_blocks::<BlockQ3K>(bytes, out),
        Format::Q4K => k_blocks::<BlockQ4K>(bytes, out),
        Format::Q5K => k_blocks::<BlockQ5K>(bytes, out),
        Format::Q6K => k_blocks::<BlockQ6K>(bytes, out),
        Format::IQ4NL => out.extend(bytes.chunks_exact(BlockIQ4NL::BYTES).map(|b| {
            let b = BlockIQ4NL::read(b);
            IntBlock::new(iq4_nl::grid_values(&b.qs), b.d.to_f32(), 0.0)
        })),
        Format::IQ4XS => k_blocks::<BlockIQ4XS>(bytes, out),
        Format::IQ3S => k_blocks::<BlockIQ3S>(bytes, out),
        Format::IQ3XXS => k_blocks::<BlockIQ3XXS>(bytes, out),
        Format::IQ2XXS => k_blocks::<BlockIQ2XXS>(bytes, out),
        Format::IQ2XS => k_blocks::<BlockIQ2XS>(bytes, out),
        Format::IQ2S => k_blocks::<BlockIQ2S>(bytes, out),
        Format::IQ1S => k_blocks::<BlockIQ1S>(bytes, out),
        Format::IQ1M => k_blocks::<BlockIQ1M>(bytes, out),
        Format::TQ1_0 => k_blocks::<BlockTQ1_0>(bytes, out),
        Format::TQ2_0 => k_blocks::<BlockTQ2_0>(bytes, out),
        Format::F32 | Format::F16 | Format::BF16 => {
            unreachable!("{format:?} is not an integer format")
        }
    }
}

/// The low nibbles of a block's 32 quants as Q4_1's words: value k's the low one of byte k for
/// k < 16, else the high one of byte k - 16.
fn nibble_words(u: &[u8; QK]) -> [u32; 4] {
    core::array::from_fn(|j| {
        (0..4).fold(0, |w, i| {
            let (lo, hi) = (u[4 * j + i] as u32 & 15, u[16 + 4 * j + i] as u32 & 15);
            w | (lo | hi << 4) << (8 * i)
        })
    })
}

/// A block's 5-bit quants 0..31 as Q5's words: `nibble_words`, then the high bits (value k's in
/// bit k).
fn q5_words(u: &[u8; QK]) -> [u32; 5] {
    let [a, b, c, d] = nibble_words(u);
    let high = (0..QK).fold(0, |w, k| w | ((u[k] as u32 >> 4) & 1) << k);
    [a, b, c, d, high]
}

/// A block's 6-bit quants 0..63 as Q6_HALVES' words: `nibble_words`, then each half's high bits
/// (value k's two in bits 2k and 2k + 1 of the half's word).
fn q6_words(u: &[u8; QK]) -> [u32; 6] {
    let [a, b, c, d] = nibble_words(u);
    let high = |half: &[u8]| {
        half.iter()
            .enumerate()
            .fold(0, |w, (k, &v)| w | ((v as u32 >> 4) & 3) << (2 * k))
    };
    [a, b, c, d, high(&u[..16]), high(&u[16..])]
}

/// One row of `source` (Q4_K, Q5_K, Q6_K or Q3_K) in its super-block layout `format` (`holds`
/// says which): quant words `q`; per super-block `d` (and `-dmin`) in f32 into `d`; per block
/// its two 8-bit multipliers (its scale and minimum, or its halves' signed scales) into 16 bits
/// of `ints`, the first block of a pair low.
fn write_super_blocks(
    format: GpuFormat,
    source: Format,
    bytes: &[u8],
    q: &mut [u32],
    d: &mut [u32],
    ints: &mut [u32],
) {
    match source {
        Format::Q4K => super_blocks::<BlockQ4K>(format, bytes, q, d, ints),
        Format::Q5K => super_blocks::<BlockQ5K>(format, bytes, q, d, ints),
        Format::Q6K => super_blocks::<BlockQ6K>(format, bytes, q, d, ints),
        Format::Q3K => super_blocks::<BlockQ3K>(format, bytes, q, d, ints),
        _ => unreachable!("{source:?} has no super-block layout"),
    }
}

fn super_blocks<K: KBlock>(
    format: GpuFormat,
    bytes: &[u8],
    q: &mut [u32],
    d: &mut [u32],
    ints: &mut [u32],
) {
    debug_assert_eq!(K::HAS_MIN, format != GpuFormat::Q6K);
    for (s, sb) in bytes.chunks_exact(K::BYTES).enumerate() {
        let (scale, dmin) = K::d_dmin(sb);
        let k = K::ints(sb);
        if K::HAS_MIN {
            d[2 * s] = scale.to_bits();
            d[2 * s + 1] = (-dmin).to_bits();
        } else {
            d[s] = scale.to_bits();
        }
        for j in 0..BLOCKS_PER_SUPER {
            let b = s * BLOCKS_PER_SUPER + j;
            let pair = if K::HAS_MIN {
                debug_assert!(k.scales[2 * j] == k.scales[2 * j + 1]);
                [k.scales[2 * j], k.mins[2 * j]]
            } else {
                [k.scales[2 * j], k.scales[2 * j + 1]]
            };
            let bits = pair[0] as u8 as u32 | (pair[1] as u8 as u32) << 8;
            ints[b / 2] |= bits << (16 * (b % 2));
            let stored = K::quants(sb, j);
            match format {
                GpuFormat::Q4K => q[b * 4..][..4].copy_from_slice(&nibble_words(&stored)),
                GpuFormat::Q5K => q[b * 5..][..5].copy_from_slice(&q5_words(&stored)),
                _ => {
                    let u = stored.map(|v| (v as i32 - K::OFFSET + 32) as u8);
                    q[b * 6..][..6].copy_from_slice(&q6_words(&u));
                }
            }
        }
    }
}

/// Q4_0's and Q4_1's 32 nibbles in value order (low nibbles first, then high ones).
fn nibbles(qs: &[u8; QK / 2]) -> [u8; QK] {
    core::array::from_fn(|k| {
        if k < QK / 2 {
            qs[k] & 0x0f
        } else {
            qs[k - QK / 2] >> 4
        }
    })
}

/// A k-quant row's blocks: each half `(d·scale)·(stored − OFFSET) − dmin·min`
/// (`k_quants::dequantize_blocks`).
fn k_blocks<K: KBlock>(bytes: &[u8], out: &mut Vec<IntBlock>) {
    for sb in bytes.chunks_exact(K::BYTES) {
        let (d, dmin) = K::d_dmin(sb);
        let ints = K::ints(sb);
        for j in 0..BLOCKS_PER_SUPER {
            let half = |h: usize| {
                let min = if K::HAS_MIN {
                    -(dmin * ints.mins[2 * j + h] as f32)
                } else {
                    0.0
                };
                (d * ints.scales[2 * j + h] as f32, min)
            };
            let ((s0, m0), (s1, m1)) = (half(0), half(1));
            out.push(IntBlock {
                q: K::quants(sb, j).map(|v| (v as i32 - K::OFFSET) as i8),
                scale: [s0, s1],
                min: [m0, m1],
            });
        }
    }
}

/// Blocks into an integer layout's quant words `q`, scales `d` and minimums `m`. The Q8_0, Q4_1
/// and Q5 layouts take blocks whose halves agree (and, Q8_0, no minimum; Q4_1, quants 0..15; Q5,
/// quants 0..31, or -16..15 and no minimum); Q6_HALVES quants -32..31 and no minimum.
fn write_blocks(
    format: GpuFormat,
    blocks: &[IntBlock],
    q: &mut [u32],
    d: &mut [u32],
    m: &mut [u32],
) {
    let bytes = |v: &[i8]| u32::from_le_bytes([v[0] as u8, v[1] as u8, v[2] as u8, v[3] as u8]);
    for (b, blk) in blocks.iter().enumerate() {
        match format {
            GpuFormat::Q8_0 => {
                debug_assert!(blk.scale[0] == blk.scale[1] && blk.min == [0.0; 2]);
                d[b] = blk.scale[0].to_bits();
                for (j, v) in blk.q.chunks_exact(4).enumerate() {
                    q[b * 8 + j] = bytes(v);
                }
            }
            GpuFormat::Q4_1 => {
                debug_assert!(blk.scale[0] == blk.scale[1] && blk.min[0] == blk.min[1]);
                d[b] = blk.scale[0].to_bits();
                m[b] = blk.min[0].to_bits();
                let u = blk.q.map(|v| v as u8);
                q[b * 4..][..4].copy_from_slice(&nibble_words(&u));
            }
            GpuFormat::Q5 => {
                debug_assert!(blk.scale[0] == blk.scale[1] && blk.min[0] == blk.min[1]);
                // Q5_0's quants -16..15 as 0..31 under the minimum -16·d (exact: a power of two).
                let offset = if blk.q.iter().any(|&v| v < 0) { 16 } else { 0 };
                debug_assert!(offset == 0 || blk.min[0] == 0.0);
                d[b] = blk.scale[0].to_bits();
                m[b] = (blk.min[0] - offset as f32 * blk.scale[0]).to_bits();
                let u = blk.q.map(|v| (v as i32 + offset) as u8);
                q[b * 5..][..5].copy_from_slice(&q5_words(&u));
            }
            GpuFormat::Q6Halves => {
                debug_assert!(blk.min == [0.0; 2]);
                for h in 0..2 {
                    d[2 * b + h] = blk.scale[h].to_bits();
                }
                let u = blk.q.map(|v| (v as i32 + 32) as u8);
                q[b * 6..][..6].copy_from_slice(&q6_words(&u));
            }
            GpuFormat::Q8Halves => {
                for h in 0..2 {
                    d[2 * b + h] = blk.scale[h].to_bits();
                    m[2 * b + h] = blk.min[h].to_bits();
                }
                for (j, v) in blk.q.chunks_exact(4).enumerate() {
                    q[b * 8 + j] = bytes(v);
                }
            }
            GpuFormat::Q4_0
            | GpuFormat::Q4K
            | GpuFormat::Q5K
            | GpuFormat::Q6K
            | GpuFormat::F16
            | GpuFormat::F32 => {
                unreachable!("{format:?} rows are repacked, widened or kept in super-blocks")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every integer format's blocks, as transcoded, give the core's values bit for bit.
    #[test]
    fn int_blocks_are_the_cores_values() {
        let (rows, cols) = (3, 512);
        let mut rng = sapient_core::sample::Rng::new(5);
        let mut blocks = Vec::new();
        for format in sapient_core::quant::QUANTIZED {
            let m = crate::gpu::tests::random_matrix(&mut rng, format, rows, cols);
            let mut want = vec![0f32; cols];
            for r in 0..rows {
                m.dequantize_row(r, &mut want).unwrap();
                int_blocks(format, m.row(r), &mut blocks);
                assert_eq!(blocks.len(), cols / QK, "{format:?}");
                let got: Vec<f32> = blocks
                    .iter()
                    .flat_map(|b| (0..QK).map(|k| b.scale[k / 16] * b.q[k] as f32 + b.min[k / 16]))
                    .collect();
                // Equal as numbers (a zero may differ in sign: `q·d + 0` against `q·d`).
                assert_eq!(got, want, "{format:?} row {r}");
                // What each layout's `write_blocks` takes.
                let layout = GpuFormat::of(format);
                if matches!(layout, GpuFormat::Q8_0 | GpuFormat::Q4_1 | GpuFormat::Q5) {
                    assert!(blocks
                        .iter()
                        .all(|b| b.scale[0] == b.scale[1] && b.min[0] == b.min[1]));
                }
                let quants_in = |range: std::ops::Range<i8>| {
                    blocks.iter().all(|b| b.q.iter().all(|q| range.contains(q)))
                };
                let no_min = blocks.iter().all(|b| b.min == [0.0; 2]);
                match layout {
                    GpuFormat::Q4_1 => assert!(quants_in(0..16), "{format:?}"),
                    GpuFormat::Q5 => assert!(
                        quants_in(0..32) || (quants_in(-16..16) && no_min),
                        "{format:?}"
                    ),
                    GpuFormat::Q6Halves => assert!(quants_in(-32..32) && no_min, "{format:?}"),
                    _ => {}
                }
            }
        }
    }

    /// The k-quants in their super-block layouts (Q4_K also in Q5_K's) hold the core's values
    /// bit for bit, read as formats.wgsl reads them.
    #[test]
    fn super_blocks_are_the_cores_values() {
        let (rows, cols) = (3, 768);
        let mut rng = sapient_core::sample::Rng::new(7);
        let cases = [
            (Format::Q4K, GpuFormat::Q4K),
            (Format::Q4K, GpuFormat::Q5K),
            (Format::Q5K, GpuFormat::Q5K),
            (Format::Q6K, GpuFormat::Q6K),
            (Format::Q3K, GpuFormat::Q6K),
        ];
        for (format, layout) in cases {
            assert!(layout.holds(format));
            let m = crate::gpu::tests::random_matrix(&mut rng, format, rows, cols);
            let blocks = cols / QK;
            let bw = layout.block_words();
            for r in 0..rows {
                let mut q = vec![0u32; blocks * bw];
                let mut d = vec![0u32; layout.scale_words(blocks)];
                let mut ints = vec![0u32; layout.min_words(blocks)];
                write_super_blocks(layout, format, m.row(r), &mut q, &mut d, &mut ints);
                let got: Vec<f32> = (0..cols)
                    .map(|i| {
                        let (b, k) = (i / QK, i % QK);
                        let word = q[b * bw + (k % 16) / 4];
                        let mut n = (word >> (8 * (k % 4) + 4 * (k / 16))) & 15;
                        if layout == GpuFormat::Q5K {
                            n |= ((q[b * 5 + 4] >> k) & 1) << 4;
                        } else if layout == GpuFormat::Q6K {
                            n |= ((q[b * 6 + 4 + k / 16] >> (2 * (k % 16))) & 3) << 4;
                        }
                        let bits = ints[b / 2] >> (16 * (b % 2));
                        let s = b / BLOCKS_PER_SUPER;
                        let f = |w: u32| f32::from_bits(w);
                        if layout == GpuFormat::Q6K {
                            let scale = (bits >> (8 * (k / 16))) as u8 as i8;
                            (n as f32 - 32.0) * (f(d[s]) * scale as f32)
                        } else {
                            let scale = f(d[2 * s]) * (bits & 0xff) as f32;
                            let min = f(d[2 * s + 1]) * ((bits >> 8) & 0xff) as f32;
                            n as f32 * scale + min
                        }
                    })
                    .collect();
                let mut want = vec![0f32; cols];
                m.dequantize_row(r, &mut want).unwrap();
                assert_eq!(got, want, "{format:?} in {layout:?}, row {r}");
            }
        }
    }

    /// Q|K|V's rows for RoPE by halves: each head's pairs (j, j + head_dim/2) neighbours, every
    /// row once, V's rows where they were.
    #[test]
    fn rope_pairs_are_neighbours() {
        for hd in [2, 6, 64] {
            let (rotated, rows) = (3 * hd, 5 * hd);
            let order = RowOrder::qkv(RopeStyle::Halves, hd, rotated);
            let stacked: Vec<usize> = (0..rows).map(|r| order.stacked_row(r)).collect();
            let mut seen = stacked.clone();
            seen.sort_unstable();
            assert_eq!(seen, (0..rows).collect::<Vec<_>>(), "hd {hd}");
            for r in (0..rotated).step_by(2) {
                let (a, b) = (stacked[r], stacked[r + 1]);
                assert_eq!(
                    (a / hd, b - a, a % hd),
                    (r / hd, hd / 2, r % hd / 2),
                    "hd {hd}"
                );
            }
            assert!((rotated..rows).all(|r| stacked[r] == r));
            let adjacent = RowOrder::qkv(RopeStyle::Adjacent, hd, rotated);
            assert!((0..rows).all(|r| adjacent.stacked_row(r) == r));
        }
    }

    #[test]
    fn matrices_of_a_mat_mul_share_a_layout() {
        use GpuFormat as G;
        let common = |f: &[Format]| GpuFormat::common(f.iter().copied());
        assert_eq!(common(&[Format::Q4K, Format::Q4K]), G::Q4K);
        assert_eq!(common(&[Format::Q6K, Format::Q3K]), G::Q6K);
        assert_eq!(common(&[Format::Q5K, Format::Q5_0]), G::Q5);
        assert_eq!(common(&[Format::Q6K, Format::Q4_0]), G::Q6Halves);
        assert_eq!(common(&[Format::Q5_0, Format::Q5_0, Format::Q8_0]), G::Q8_0);
        assert_eq!(
            common(&[Format::Q4K, Format::Q4K, Format::Q6K]),
            G::Q8Halves
        );
        assert_eq!(common(&[Format::Q4_0, Format::Q4_1]), G::Q5);
        assert_eq!(common(&[Format::Q4K, Format::Q5K]), G::Q5K);
        assert_eq!(common(&[Format::Q6K, Format::Q5_0]), G::Q6Halves);
        assert_eq!(common(&[Format::Q8_0, Format::Q4_0]), G::Q8_0);
        assert_eq!(common(&[Format::Q2K, Format::Q4_0]), G::Q8Halves);
        assert_eq!(common(&[Format::Q8_0, Format::F16]), G::F32);
        assert_eq!(common(&[Format::F16, Format::F16]), G::F16);
        assert_eq!(common(&[Format::BF16, Format::F32]), G::F32);
    }
}
