//! One memory-mapped `.safetensors` file, its header parsed by the `safetensors` crate.
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::{Dtype as StDtype, Metadata};
use safetensors::{SafeTensorError, SafeTensors};

/// The element types sapient reads from safetensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    BF16,
}

impl Dtype {
    fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
        }
    }

    /// The little-endian values in `bytes` as f32.
    pub fn to_f32(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        }
    }
}

pub struct SafetensorsFile {
    path: String,
    map: Mmap,
    data_start: usize,
    meta: Metadata,
}

impl SafetensorsFile {
    pub fn open(path: &Path) -> Result<Self> {
        let map = super::map_file(path)?;
        let (header, meta) = SafeTensors::read_metadata(&map[..]).map_err(|e| {
            anyhow!(
                "{}: not a valid safetensors file: {}",
                path.display(),
                describe(&e, map.len())
            )
        })?;
        Ok(SafetensorsFile {
            path: path.display().to_string(),
            map,
            data_start: 8 + header,
            meta,
        })
    }

    pub fn names(&self) -> Vec<String> {
        self.meta.tensors().into_keys().collect()
    }

    /// A tensor's dtype, shape and bytes, checked against the file's size.
    pub fn tensor(&self, name: &str) -> Result<(Dtype, &[usize], &[u8])> {
        let info = self
            .meta
            .info(name)
            .ok_or_else(|| anyhow!("tensor {name} is missing from {}", self.path))?;
        let dtype = match info.dtype {
            StDtype::F32 => Dtype::F32,
            StDtype::F16 => Dtype::F16,
            StDtype::BF16 => Dtype::BF16,
            other => bail!(
                "tensor {name} in {} has dtype {other:?}; sapient reads F32, F16 and BF16",
                self.path
            ),
        };
        let (start, end) = info.data_offsets;
        let bytes = self
            .map
            .get(self.data_start + start..self.data_start + end)
            .with_context(|| format!("tensor {name} lies past the end of {}", self.path))?;
        let elems = info
            .shape
            .iter()
            .try_fold(1usize, |a, d| a.checked_mul(*d))
            .ok_or_else(|| anyhow!("tensor {name} has an absurd shape {:?}", info.shape))?;
        if elems.checked_mul(dtype.size()) != Some(bytes.len()) {
            bail!(
                "tensor {name} in {}: shape {:?} does not match its {} bytes",
                self.path,
                info.shape,
                bytes.len()
            );
        }
        Ok((dtype, &info.shape, bytes))
    }
}

/// What a header error of the `safetensors` crate means, in words.
fn describe(e: &SafeTensorError, file_len: usize) -> String {
    match e {
        SafeTensorError::HeaderTooSmall => {
            format!("{file_len} bytes cannot hold the 8-byte header length")
        }
        SafeTensorError::InvalidHeaderLength => {
            "the header length points past the end of the file (truncated?)".into()
        }
        SafeTensorError::HeaderTooLarge => "the header length is absurd (over 100 MB)".into(),
        SafeTensorError::InvalidHeader | SafeTensorError::InvalidHeaderStart => {
            "the header is not a UTF-8 JSON object".into()
        }
        SafeTensorError::InvalidHeaderDeserialization | SafeTensorError::JsonError(_) => {
            "the header is not the JSON of a tensor table".into()
        }
        SafeTensorError::TensorInvalidInfo => {
            "a tensor's shape and dtype disagree with its data offsets".into()
        }
        SafeTensorError::InvalidOffset(name) => {
            format!("tensor {name}'s data offsets overlap another tensor or leave a gap")
        }
        SafeTensorError::MetadataIncompleteBuffer => {
            "the tensors' data does not end where the file does (truncated?)".into()
        }
        SafeTensorError::ValidationOverflow => "a tensor's shape overflows".into(),
        other => format!("{other:?}"),
    }
}
