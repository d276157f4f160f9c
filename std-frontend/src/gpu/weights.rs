//! Weights as the shaders read them: each matrix repacked once at upload into words the GPU can
//! index (quants, then one f32 scale per block, and a minimum for Q4_1), split into parts by rows
//! wherever one would exceed a storage binding.
use anyhow::{bail, Result};
use half::{bf16, f16};
use sapient_core::quant::{Format, QK};
use sapient_core::Matrix;
use wgpu::util::DeviceExt;

/// How a matrix's words are laid out on the device; one `deq` in formats.wgsl each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuFormat {
    Q8_0,
    Q4_0,
    Q4_1,
    F16,
    F32,
}

impl GpuFormat {
    /// The device layout for a core format: BF16 widens to F32 (exactly), and so do the formats
    /// without GPU kernels yet, Q5_0, Q5_1 and the k-quants (their exact values, in several
    /// times their memory).
    pub fn of(format: Format) -> Self {
        match format {
            Format::Q8_0 => GpuFormat::Q8_0,
            Format::Q4_0 => GpuFormat::Q4_0,
            Format::Q4_1 => GpuFormat::Q4_1,
            Format::F16 => GpuFormat::F16,
            Format::F32
            | Format::BF16
            | Format::Q5_0
            | Format::Q5_1
            | Format::Q2K
            | Format::Q3K
            | Format::Q4K
            | Format::Q5K
            | Format::Q6K => GpuFormat::F32,
        }
    }

    /// Whether rows stored in `format` are repacked byte for byte (otherwise they are widened
    /// to f32 values first).
    fn repacks(format: Format) -> bool {
        matches!(
            format,
            Format::Q8_0 | Format::Q4_0 | Format::Q4_1 | Format::F16 | Format::F32 | Format::BF16
        )
    }

    /// Whether the quants are integers that packed 8-bit dot products can take.
    pub fn is_integer(self) -> bool {
        matches!(self, GpuFormat::Q8_0 | GpuFormat::Q4_0 | GpuFormat::Q4_1)
    }

    pub fn name(self) -> &'static str {
        match self {
            GpuFormat::Q8_0 => "Q8_0",
            GpuFormat::Q4_0 => "Q4_0",
            GpuFormat::Q4_1 => "Q4_1",
            GpuFormat::F16 => "F16",
            GpuFormat::F32 => "F32",
        }
    }

    /// Words of quants (or values) per 32-value block.
    fn block_words(self) -> usize {
        match self {
            GpuFormat::Q8_0 => 8,
            GpuFormat::Q4_0 | GpuFormat::Q4_1 => 4,
            GpuFormat::F16 => 16,
            GpuFormat::F32 => 32,
        }
    }

    /// Words of scales (and minimums) per block.
    fn scale_words(self) -> usize {
        match self {
            GpuFormat::Q8_0 | GpuFormat::Q4_0 => 1,
            GpuFormat::Q4_1 => 2,
            GpuFormat::F16 | GpuFormat::F32 => 0,
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
    /// Uploads the rows of `mats` one after another as one matrix (Q|K|V), or interleaved row by
    /// row when `interleave` (gate, up, gate, up, ...: the SwiGLU epilogue reads them in pairs).
    /// Matrices of different formats are widened to f32 together. Parts hold whole multiples of
    /// `row_multiple` rows, at most `max_binding` bytes each.
    pub fn upload(
        device: &wgpu::Device,
        name: &str,
        mats: &[&Matrix<'_>],
        interleave: bool,
        row_multiple: usize,
        max_binding: u64,
    ) -> Result<Self> {
        let cols = mats[0].cols;
        if mats.iter().any(|m| m.cols != cols) {
            bail!("{name}: matrices of different widths cannot share a mat-mul");
        }
        if interleave && mats.iter().any(|m| m.rows != mats[0].rows) {
            bail!("{name}: interleaved matrices need the same number of rows");
        }
        let same = mats.iter().all(|m| m.format == mats[0].format);
        let format = if same {
            GpuFormat::of(mats[0].format)
        } else {
            GpuFormat::F32
        };
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
                let mut r = r;
                for m in mats {
                    if r < m.rows {
                        return (m, r);
                    }
                    r -= m.rows;
                }
                unreachable!("row index checked against the sum of rows")
            }
        };
        let row_words = blocks * (format.block_words() + format.scale_words());
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
        while row0 < rows {
            let n = (rows - row0).min(max_rows);
            let qs_words = n * blocks * format.block_words();
            let mut words = vec![0u32; n * row_words];
            let (qs, scales) = words.split_at_mut(qs_words);
            let (ds, ms) = scales.split_at_mut(n * blocks * format.scale_words().min(1));
            for i in 0..n {
                let (m, r) = source(row0 + i);
                let bytes = m.row(r);
                let q =
                    &mut qs[i * blocks * format.block_words()..][..blocks * format.block_words()];
                let d = if ds.is_empty() {
                    &mut []
                } else {
                    &mut ds[i * blocks..(i + 1) * blocks]
                };
                if same && GpuFormat::repacks(m.format) {
                    repack_row(format, bytes, cols, q, d, ms, i * blocks);
                } else {
                    m.dequantize_row(r, &mut widened)?;
                    for (w, v) in q.iter_mut().zip(&widened) {
                        *w = v.to_bits();
                    }
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
                d_off: qs_words,
                m_off: qs_words + n * blocks,
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

/// One row of ggml blocks into quant words `q`, scales `d` and (Q4_1) minimums `m[m0 ..]`.
fn repack_row(
    format: GpuFormat,
    bytes: &[u8],
    cols: usize,
    q: &mut [u32],
    d: &mut [u32],
    m: &mut [u32],
    m0: usize,
) {
    let f16_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32().to_bits();
    let word = |b: &[u8], i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    match format {
        GpuFormat::Q8_0 => {
            for (b, blk) in bytes.chunks_exact(2 + QK).enumerate() {
                d[b] = f16_at(blk, 0);
                for j in 0..QK / 4 {
                    q[b * 8 + j] = word(blk, 2 + 4 * j);
                }
            }
        }
        GpuFormat::Q4_0 => {
            for (b, blk) in bytes.chunks_exact(2 + QK / 2).enumerate() {
                d[b] = f16_at(blk, 0);
                for j in 0..4 {
                    q[b * 4 + j] = word(blk, 2 + 4 * j);
                }
            }
        }
        GpuFormat::Q4_1 => {
            for (b, blk) in bytes.chunks_exact(4 + QK / 2).enumerate() {
                d[b] = f16_at(blk, 0);
                m[m0 + b] = f16_at(blk, 2);
                for j in 0..4 {
                    q[b * 4 + j] = word(blk, 4 + 4 * j);
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
        GpuFormat::F32 => {
            // F32, or BF16 widened exactly.
            if bytes.len() == cols * 4 {
                for (w, b) in q.iter_mut().zip(bytes.chunks_exact(4)) {
                    *w = word(b, 0);
                }
            } else {
                for (w, b) in q.iter_mut().zip(bytes.chunks_exact(2)) {
                    *w = bf16::from_le_bytes([b[0], b[1]]).to_f32().to_bits();
                }
            }
        }
    }
}
