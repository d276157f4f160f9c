//! GGUF v2/v3: the header, metadata and tensor table, checked against the file before anything is
//! allocated or read, with limits like llama.cpp's.
use std::collections::HashMap;

use anyhow::{anyhow, bail, Context, Result};
use sapient_core::Format;

const MAGIC: &[u8; 4] = b"GGUF";
/// ggml's GGML_MAX_NAME: tensor names are at most this long.
const MAX_NAME: usize = 64;
/// ggml's GGML_MAX_DIMS.
const MAX_DIMS: usize = 4;
const DEFAULT_ALIGNMENT: usize = 32;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) if v >= 0 => Some(v as u64),
            Value::I16(v) if v >= 0 => Some(v as u64),
            Value::I32(v) if v >= 0 => Some(v as u64),
            Value::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// ggml tensor types sapient reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    IQ4NL,
    IQ4XS,
    IQ3S,
    IQ3XXS,
    IQ2XXS,
    IQ2XS,
    IQ2S,
    IQ1S,
    IQ1M,
    TQ1_0,
    TQ2_0,
}

/// ggml's names of the types sapient does not read, for error messages.
fn ggml_type_name(id: u32) -> Option<&'static str> {
    Some(match id {
        15 => "Q8_K",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        39 => "MXFP4",
        _ => return None,
    })
}

impl GgmlType {
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2K,
            11 => GgmlType::Q3K,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            20 => GgmlType::IQ4NL,
            23 => GgmlType::IQ4XS,
            21 => GgmlType::IQ3S,
            18 => GgmlType::IQ3XXS,
            16 => GgmlType::IQ2XXS,
            17 => GgmlType::IQ2XS,
            22 => GgmlType::IQ2S,
            19 => GgmlType::IQ1S,
            29 => GgmlType::IQ1M,
            34 => GgmlType::TQ1_0,
            35 => GgmlType::TQ2_0,
            30 => GgmlType::BF16,
            _ => return None,
        })
    }

    /// ggml's id of this type.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2K => 10,
            GgmlType::Q3K => 11,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::IQ4NL => 20,
            GgmlType::IQ4XS => 23,
            GgmlType::IQ3S => 21,
            GgmlType::IQ3XXS => 18,
            GgmlType::IQ2XXS => 16,
            GgmlType::IQ2XS => 17,
            GgmlType::IQ2S => 22,
            GgmlType::IQ1S => 19,
            GgmlType::IQ1M => 29,
            GgmlType::TQ1_0 => 34,
            GgmlType::TQ2_0 => 35,
            GgmlType::BF16 => 30,
        }
    }

    /// The core's format of this type.
    pub fn format(self) -> Format {
        match self {
            GgmlType::F32 => Format::F32,
            GgmlType::F16 => Format::F16,
            GgmlType::BF16 => Format::BF16,
            GgmlType::Q4_0 => Format::Q4_0,
            GgmlType::Q4_1 => Format::Q4_1,
            GgmlType::Q5_0 => Format::Q5_0,
            GgmlType::Q5_1 => Format::Q5_1,
            GgmlType::Q8_0 => Format::Q8_0,
            GgmlType::Q2K => Format::Q2K,
            GgmlType::Q3K => Format::Q3K,
            GgmlType::Q4K => Format::Q4K,
            GgmlType::Q5K => Format::Q5K,
            GgmlType::Q6K => Format::Q6K,
            GgmlType::IQ4NL => Format::IQ4NL,
            GgmlType::IQ4XS => Format::IQ4XS,
            GgmlType::IQ3S => Format::IQ3S,
            GgmlType::IQ3XXS => Format::IQ3XXS,
            GgmlType::IQ2XXS => Format::IQ2XXS,
            GgmlType::IQ2XS => Format::IQ2XS,
            GgmlType::IQ2S => Format::IQ2S,
            GgmlType::IQ1S => Format::IQ1S,
            GgmlType::IQ1M => Format::IQ1M,
            GgmlType::TQ1_0 => Format::TQ1_0,
            GgmlType::TQ2_0 => Format::TQ2_0,
        }
    }

    /// The type of the core's `format` (every format is one).
    pub fn of(format: Format) -> Self {
        match format {
            Format::F32 => GgmlType::F32,
            Format::F16 => GgmlType::F16,
            Format::BF16 => GgmlType::BF16,
            Format::Q4_0 => GgmlType::Q4_0,
            Format::Q4_1 => GgmlType::Q4_1,
            Format::Q5_0 => GgmlType::Q5_0,
            Format::Q5_1 => GgmlType::Q5_1,
            Format::Q8_0 => GgmlType::Q8_0,
            Format::Q2K => GgmlType::Q2K,
            Format::Q3K => GgmlType::Q3K,
            Format::Q4K => GgmlType::Q4K,
            Format::Q5K => GgmlType::Q5K,
            Format::Q6K => GgmlType::Q6K,
            Format::IQ4NL => GgmlType::IQ4NL,
            Format::IQ4XS => GgmlType::IQ4XS,
            Format::IQ3S => GgmlType::IQ3S,
            Format::IQ3XXS => GgmlType::IQ3XXS,
            Format::IQ2XXS => GgmlType::IQ2XXS,
            Format::IQ2XS => GgmlType::IQ2XS,
            Format::IQ2S => GgmlType::IQ2S,
            Format::IQ1S => GgmlType::IQ1S,
            Format::IQ1M => GgmlType::IQ1M,
            Format::TQ1_0 => GgmlType::TQ1_0,
            Format::TQ2_0 => GgmlType::TQ2_0,
        }
    }

    /// (values per block, bytes per block)
    pub fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q2K => (256, 84),
            GgmlType::Q3K => (256, 110),
            GgmlType::Q4K => (256, 144),
            GgmlType::Q5K => (256, 176),
            GgmlType::Q6K => (256, 210),
            GgmlType::IQ4NL => (32, 18),
            GgmlType::IQ4XS => (256, 136),
            GgmlType::IQ3S => (256, 110),
            GgmlType::IQ3XXS => (256, 98),
            GgmlType::IQ2XXS => (256, 66),
            GgmlType::IQ2XS => (256, 74),
            GgmlType::IQ2S => (256, 82),
            GgmlType::IQ1S => (256, 50),
            GgmlType::IQ1M => (256, 56),
            GgmlType::TQ1_0 => (256, 54),
            GgmlType::TQ2_0 => (256, 66),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::BF16 => "bf16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q2K => "q2_K",
            GgmlType::Q3K => "q3_K",
            GgmlType::Q4K => "q4_K",
            GgmlType::Q5K => "q5_K",
            GgmlType::Q6K => "q6_K",
            GgmlType::IQ4NL => "iq4_nl",
            GgmlType::IQ4XS => "iq4_xs",
            GgmlType::IQ3S => "iq3_s",
            GgmlType::IQ3XXS => "iq3_xxs",
            GgmlType::IQ2XXS => "iq2_xxs",
            GgmlType::IQ2XS => "iq2_xs",
            GgmlType::IQ2S => "iq2_s",
            GgmlType::IQ1S => "iq1_s",
            GgmlType::IQ1M => "iq1_m",
            GgmlType::TQ1_0 => "tq1_0",
            GgmlType::TQ2_0 => "tq2_0",
        }
    }
}

#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// ggml order: `dims[0]` is the row length (an HF `[out, in]` weight is `{in, out}`).
    pub dims: Vec<usize>,
    pub ggml_type: GgmlType,
    /// Absolute byte range in the file.
    pub start: usize,
    pub len: usize,
}

#[derive(Debug)]
pub struct Gguf {
    pub version: u32,
    pub metadata: HashMap<String, Value>,
    pub tensors: HashMap<String, TensorInfo>,
    /// Tensor names in file order.
    pub order: Vec<String>,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(|| {
                anyhow!(
                    "truncated GGUF: {what} at offset {} needs {n} bytes, the file has {}",
                    self.pos,
                    self.buf.len()
                )
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }

    /// A count that each item of which takes at least `min_item` bytes: bounded by the file.
    fn count(&mut self, what: &str, min_item: usize) -> Result<usize> {
        let n = self.u64(what)?;
        let limit = self.remaining() / min_item.max(1);
        if n > limit as u64 {
            bail!(
                "GGUF {what} is {n}, more than the {} bytes left could hold",
                self.remaining()
            );
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.count(what, 1)?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| anyhow!("GGUF {what} is not valid UTF-8"))
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(self.take(1, key)?[0]),
            1 => Value::I8(self.take(1, key)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.take(2, key)?.try_into().unwrap())),
            3 => Value::I16(i16::from_le_bytes(self.take(2, key)?.try_into().unwrap())),
            4 => Value::U32(self.u32(key)?),
            5 => Value::I32(self.u32(key)? as i32),
            6 => Value::F32(f32::from_bits(self.u32(key)?)),
            7 => Value::Bool(self.take(1, key)?[0] != 0),
            8 => Value::String(self.string(key)?),
            9 => {
                if depth > 0 {
                    bail!("GGUF key {key}: nested arrays are not supported");
                }
                let item = self.u32(key)?;
                let min = match item {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    _ => bail!("GGUF key {key}: array of unknown type {item}"),
                };
                let n = self.count(key, min)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(item, key, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64(key)?),
            11 => Value::I64(self.u64(key)? as i64),
            12 => Value::F64(f64::from_bits(self.u64(key)?)),
            other => bail!("GGUF key {key} has unknown value type {other}"),
        })
    }
}

impl Gguf {
    /// Parses the header of the GGUF file in `buf` and checks every tensor's range against it.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let mut r = Reader { buf, pos: 0 };
        if r.take(4, "magic")? != MAGIC {
            bail!("not a GGUF file (bad magic)");
        }
        let version = r.u32("version")?;
        if !(2..=3).contains(&version) {
            bail!("GGUF version {version} is not supported (sapient reads versions 2 and 3)");
        }
        // A tensor info takes at least 8 (name length) + 4 (dims) + 4 (type) + 8 (offset) bytes;
        // a key-value pair at least 8 + 4 + 1.
        let n_tensors = r.count("tensor count", 24)?;
        let n_kv = r.count("metadata count", 13)?;
        let mut metadata = HashMap::with_capacity(n_kv);
        for _ in 0..n_kv {
            let key = r.string("metadata key")?;
            let ty = r.u32(&key)?;
            let value = r.value(ty, &key, 0)?;
            if metadata.insert(key.clone(), value).is_some() {
                bail!("GGUF metadata key {key} appears twice");
            }
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 16 => a as usize,
                _ => bail!("GGUF general.alignment {v:?} is not a power of two"),
            },
        };

        let mut raw = Vec::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            let name = r.string("tensor name")?;
            if name.len() > MAX_NAME {
                bail!("GGUF tensor name {name:?} is longer than {MAX_NAME} bytes");
            }
            let n_dims = r.u32(&name)? as usize;
            if n_dims == 0 || n_dims > MAX_DIMS {
                bail!("GGUF tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)");
            }
            let mut dims = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                let d = r.u64(&name)?;
                if d > i64::MAX as u64 {
                    bail!("GGUF tensor {name} has an absurd dimension {d}");
                }
                dims.push(d as usize);
            }
            let ty = r.u32(&name)?;
            let ggml_type = GgmlType::from_id(ty).ok_or_else(|| match ggml_type_name(ty) {
                Some(t) => anyhow!(
                    "GGUF tensor {name} is {t} (ggml type {ty}), which sapient does not read yet"
                ),
                None => anyhow!(
                    "GGUF tensor {name} has ggml type {ty}, which is not a ggml type sapient knows"
                ),
            })?;
            let offset = r.u64(&name)?;
            raw.push((name, dims, ggml_type, offset));
        }
        let data_start = r.pos.div_ceil(alignment) * alignment;

        let mut tensors = HashMap::with_capacity(n_tensors);
        let mut order = Vec::with_capacity(n_tensors);
        for (name, dims, ggml_type, offset) in raw {
            let elems = dims
                .iter()
                .try_fold(1usize, |a, d| a.checked_mul(*d))
                .with_context(|| format!("GGUF tensor {name} has an absurd shape {dims:?}"))?;
            let (block_len, block_bytes) = ggml_type.block();
            if dims[0] % block_len != 0 {
                bail!(
                    "GGUF tensor {name}: rows of {} values are not whole {} blocks",
                    dims[0],
                    ggml_type.name()
                );
            }
            let len = (elems / block_len)
                .checked_mul(block_bytes)
                .with_context(|| format!("GGUF tensor {name} is too large"))?;
            if offset % alignment as u64 != 0 {
                bail!("GGUF tensor {name}: offset {offset} is not aligned to {alignment}");
            }
            let start = usize::try_from(offset)
                .ok()
                .and_then(|o| o.checked_add(data_start))
                .filter(|s| s.checked_add(len).is_some_and(|e| e <= buf.len()))
                .ok_or_else(|| {
                    anyhow!(
                        "GGUF tensor {name}: {len} bytes at data offset {offset} lie past the end of the file ({} bytes)",
                        buf.len()
                    )
                })?;
            if tensors
                .insert(
                    name.clone(),
                    TensorInfo {
                        dims,
                        ggml_type,
                        start,
                        len,
                    },
                )
                .is_some()
            {
                bail!("GGUF tensor {name} appears twice");
            }
            order.push(name);
        }
        // Tensors that share bytes are a lying table: one write would change two weights.
        let mut spans: Vec<(usize, usize, &str)> = tensors
            .iter()
            .map(|(name, t)| (t.start, t.len, name.as_str()))
            .collect();
        spans.sort_unstable();
        for pair in spans.windows(2) {
            let ((a_start, a_len, a), (b_start, _, b)) = (pair[0], pair[1]);
            if b_start < a_start + a_len {
                bail!("GGUF tensors {a} and {b} overlap (bytes {b_start}.. lie inside {a})");
            }
        }
        Ok(Gguf {
            version,
            metadata,
            tensors,
            order,
        })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    pub fn u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }

    pub fn f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(Value::as_f64)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes a GGUF v3 file: metadata (string values only) and tensors (name, dims, type, data).
    pub fn write(meta: &[(&str, &str)], tensors: &[(&str, &[u64], u32, &[u8])]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(meta.len() as u64).to_le_bytes());
        let s = |b: &mut Vec<u8>, s: &str| {
            b.extend_from_slice(&(s.len() as u64).to_le_bytes());
            b.extend_from_slice(s.as_bytes());
        };
        for (k, v) in meta {
            s(&mut b, k);
            b.extend_from_slice(&8u32.to_le_bytes());
            s(&mut b, v);
        }
        let mut offset = 0u64;
        for (name, dims, ty, data) in tensors {
            s(&mut b, name);
            b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in *dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(&offset.to_le_bytes());
            offset += (data.len() as u64).div_ceil(32) * 32;
        }
        b.resize(b.len().div_ceil(32) * 32, 0);
        for (_, _, _, data) in tensors {
            b.extend_from_slice(data);
            b.resize(b.len().div_ceil(32) * 32, 0);
        }
        b
    }

    fn err(buf: &[u8]) -> String {
        format!("{:#}", Gguf::parse(buf).unwrap_err())
    }

    #[test]
    fn reads_what_it_wrote() {
        let data = [0u8; 34 * 2];
        let f = write(
            &[("general.architecture", "llama")],
            &[("w", &[32, 2], 8, &data)],
        );
        let g = Gguf::parse(&f).unwrap();
        assert_eq!(g.str("general.architecture"), Some("llama"));
        assert_eq!(g.tensors["w"].dims, vec![32, 2]);
        assert_eq!(g.tensors["w"].len, 68);
    }

    /// The grid i-quants are read with ggml's block sizes; a type sapient does not read is an
    /// error naming it.
    #[test]
    fn i_quant_and_ternary_types_parse_and_mxfp4_is_named() {
        for (id, format, bytes) in [
            (16, Format::IQ2XXS, 66),
            (17, Format::IQ2XS, 74),
            (18, Format::IQ3XXS, 98),
            (19, Format::IQ1S, 50),
            (29, Format::IQ1M, 56),
            (34, Format::TQ1_0, 54),
            (35, Format::TQ2_0, 66),
            (22, Format::IQ2S, 82),
        ] {
            let data = vec![0u8; 2 * bytes];
            let f = write(&[], &[("w", &[256, 2], id, &data)]);
            let g = Gguf::parse(&f).unwrap();
            assert_eq!(g.tensors["w"].ggml_type.format(), format);
            assert_eq!(g.tensors["w"].len, 2 * bytes, "{format}");
        }
        let f = write(&[], &[("w", &[32, 2], 39, &[0u8; 34])]);
        assert!(err(&f).contains("MXFP4"), "{}", err(&f));
    }

    #[test]
    fn hostile_headers_are_errors() {
        let data = [0u8; 34 * 2];
        let good = write(
            &[("general.architecture", "llama")],
            &[("w", &[32, 2], 8, &data)],
        );
        // Truncated anywhere before the end of the tensor data: an error, never a panic.
        let t = &Gguf::parse(&good).unwrap().tensors["w"];
        for n in 0..t.start + t.len {
            assert!(
                Gguf::parse(&good[..n]).is_err(),
                "prefix of {n} bytes parsed"
            );
        }
        assert!(err(b"GGML\x03\0\0\0").contains("magic"));
        let mut v1 = good.clone();
        v1[4] = 1;
        assert!(err(&v1).contains("version 1"));

        // An absurd tensor count.
        let mut absurd = good.clone();
        absurd[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(err(&absurd).contains("tensor count"), "{}", err(&absurd));
        // An absurd metadata count.
        let mut absurd = good.clone();
        absurd[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(err(&absurd).contains("metadata count"));
        // An absurd string length.
        let mut absurd = good.clone();
        absurd[24..32].copy_from_slice(&(1u64 << 50).to_le_bytes());
        assert!(err(&absurd).contains("metadata key"));

        // A tensor whose data lies past the end.
        let past = write(&[], &[("w", &[32, 1000], 8, &data)]);
        assert!(err(&past).contains("past the end"), "{}", err(&past));
        // Dimensions whose product overflows.
        let huge = write(&[], &[("w", &[1 << 40, 1 << 40], 0, &data)]);
        assert!(err(&huge).contains("absurd"), "{}", err(&huge));
        // An unknown type, a misaligned offset, too many dimensions.
        let unknown = write(&[], &[("w", &[32, 2], 99, &data)]);
        assert!(err(&unknown).contains("ggml type 99"));
        let dims5 = write(&[], &[("w", &[1, 1, 1, 1, 32], 0, &data)]);
        assert!(err(&dims5).contains("dimensions"));
    }
}
