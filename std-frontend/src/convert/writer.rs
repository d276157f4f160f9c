//! Writing GGUF v3: the header, the metadata, the tensor table, then each tensor's data, aligned
//! to 32 bytes, streamed one tensor at a time so that a large model never sits in memory whole.
use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::load::gguf::{GgmlType, Value};

const ALIGNMENT: usize = 32;

/// A tensor to write: its name, its dimensions in ggml's order (innermost first: `[cols, rows]`
/// for a matrix) and its type.
pub struct TensorEntry {
    pub name: String,
    pub dims: Vec<usize>,
    pub ty: GgmlType,
}

impl TensorEntry {
    /// Bytes of its data.
    pub fn bytes(&self) -> Result<usize> {
        let (values_per_block, block_bytes) = self.ty.block();
        let n: usize = self.dims.iter().product();
        if self.dims.first().is_none_or(|d| d % values_per_block != 0) {
            bail!(
                "tensor {}: {} values per row are no whole number of {} blocks",
                self.name,
                self.dims.first().copied().unwrap_or(0),
                self.ty.name()
            );
        }
        Ok(n / values_per_block * block_bytes)
    }
}

/// Writes `path` (through a temporary file beside it, renamed at the end, so that a failure
/// never leaves a truncated model behind): `metadata`, then `tensors`, whose data
/// `fill(i, buf)` writes into `buf` (cleared, exactly `tensors[i].bytes()` long afterwards).
pub fn write_gguf(
    path: &Path,
    metadata: &[(String, Value)],
    tensors: &[TensorEntry],
    mut fill: impl FnMut(usize, &mut Vec<u8>) -> Result<()>,
) -> Result<()> {
    let tmp = path.with_extension("gguf.partial");
    let file =
        std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let result = (|| -> Result<()> {
        let mut head = Vec::new();
        head.extend_from_slice(b"GGUF");
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
        for (key, value) in metadata {
            string(&mut head, key);
            head.extend_from_slice(&value_type(value).to_le_bytes());
            write_value(&mut head, value)?;
        }
        let mut offset = 0usize;
        for t in tensors {
            string(&mut head, &t.name);
            head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                head.extend_from_slice(&(*d as u64).to_le_bytes());
            }
            head.extend_from_slice(&t.ty.id().to_le_bytes());
            head.extend_from_slice(&(offset as u64).to_le_bytes());
            offset += t.bytes()?.next_multiple_of(ALIGNMENT);
        }
        head.resize(head.len().next_multiple_of(ALIGNMENT), 0);
        out.write_all(&head)?;
        let mut buf = Vec::new();
        for (i, t) in tensors.iter().enumerate() {
            buf.clear();
            fill(i, &mut buf)?;
            let want = t.bytes()?;
            if buf.len() != want {
                bail!(
                    "tensor {}: {} bytes of data, expected {want}",
                    t.name,
                    buf.len()
                );
            }
            buf.resize(want.next_multiple_of(ALIGNMENT), 0);
            out.write_all(&buf)?;
        }
        out.flush()?;
        Ok(())
    })();
    match result {
        Ok(()) => std::fs::rename(&tmp, path)
            .with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display())),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e.context(format!("writing {}", path.display())))
        }
    }
}

fn string(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

/// GGUF's id of a value's type.
fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn write_value(b: &mut Vec<u8>, v: &Value) -> Result<()> {
    match v {
        Value::U8(x) => b.push(*x),
        Value::I8(x) => b.push(*x as u8),
        Value::U16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => b.push(*x as u8),
        Value::String(s) => string(b, s),
        Value::U64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::Array(items) => {
            // An empty array's element type is never read; u32 as gguf-py writes it.
            let item = items.first().map_or(4, value_type);
            if items.iter().any(|v| value_type(v) != item) {
                bail!("a GGUF array holds values of one type");
            }
            if item == 9 {
                bail!("nested GGUF arrays are not supported");
            }
            b.extend_from_slice(&item.to_le_bytes());
            b.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for v in items {
                write_value(b, v)?;
            }
        }
    }
    Ok(())
}
