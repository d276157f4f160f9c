//! One error type for the whole core. Variants carry numbers and static names, never allocated
//! strings, so reporting an error costs nothing on the hot path.
use core::fmt;

/// The core's `Result`: `Error` unless said otherwise.
pub type Result<T, E = Error> = core::result::Result<T, E>;

/// Everything that can go wrong in the core, each naming what was wrong.
// Copy, with no destructor, so that `const fn`s (the arenas' `bytes_needed`) can return it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// A slice had the wrong length.
    Length {
        /// The slice.
        what: &'static str,
        /// The length it needed.
        expected: usize,
        /// Its length.
        got: usize,
    },
    /// Two things that must agree in length or count do not (in the style of candle's
    /// `ShapeMismatchBinaryOp`): `op` names the operation, each side what it counts.
    Mismatch {
        /// The operation.
        op: &'static str,
        /// The left side: what it is, and its length or count.
        lhs: (&'static str, usize),
        /// The right side, likewise.
        rhs: (&'static str, usize),
    },
    /// An index (a row, a layer, a position) past the end of what it indexes.
    OutOfRange {
        /// What was indexed.
        what: &'static str,
        /// The index.
        index: usize,
        /// How many there are.
        len: usize,
    },
    /// A size whose computation overflows `usize`.
    Overflow {
        /// The size.
        what: &'static str,
    },
    /// An argument that breaks a rule of the call other than a length.
    InvalidArgument {
        /// The argument or call.
        what: &'static str,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// A length that must be a multiple of a format's block size was not.
    NotBlockMultiple {
        /// What has the length.
        what: &'static str,
        /// The length.
        len: usize,
        /// The block size it must be a multiple of.
        block: usize,
    },
    /// A backend could not run a step (a GPU's device error, say); the backend reports details.
    Backend(&'static str),
    /// A caller-provided arena is smaller than `bytes_needed` said.
    ArenaTooSmall {
        /// The arena.
        what: &'static str,
        /// Bytes it needs.
        needed: usize,
        /// Bytes it was given.
        got: usize,
    },
    /// A caller-provided arena does not start at the alignment its contents need.
    Misaligned {
        /// The arena.
        what: &'static str,
        /// The alignment it needs, in bytes.
        align: usize,
    },
    /// Writing past the end of the KV cache.
    ContextFull {
        /// Positions the cache held.
        pos: usize,
        /// Tokens that were to be added.
        tokens: usize,
        /// Positions the cache can hold.
        max_seq: usize,
    },
    /// A token id outside the vocabulary.
    TokenOutOfRange {
        /// The id.
        token: u32,
        /// The vocabulary's size.
        vocab: usize,
    },
    /// A configuration value that cannot describe a working model.
    InvalidConfig {
        /// The field, by its Hugging Face `config.json` name.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A weight whose shape disagrees with the configuration.
    Shape {
        /// The tensor, by its Hugging Face name.
        tensor: &'static str,
        /// Its layer, for a layer's tensors.
        layer: Option<usize>,
        /// `[rows, cols]` the configuration implies (`[n, 1]` for a vector).
        expected: [usize; 2],
        /// Its shape.
        got: [usize; 2],
    },
    /// A weight format that an operation does not support.
    UnsupportedFormat {
        /// The operation.
        what: &'static str,
        /// The format.
        format: crate::quant::Format,
    },
    /// The architecture named by a model is not one sapient implements.
    UnknownArchitecture(ArchName),
    /// A sampling parameter out of its range.
    InvalidSampling {
        /// The parameter.
        field: &'static str,
        /// Its range.
        reason: &'static str,
    },
    /// A result that came out NaN or infinite: weights (or scales) that are not finite numbers.
    NotFinite {
        /// What came out so.
        what: &'static str,
        /// Its row.
        row: usize,
    },
}

impl Error {
    /// An `UnknownArchitecture` error holding (a prefix of) `name`.
    pub fn unknown_architecture(name: &str) -> Self {
        let mut arch = ArchName {
            bytes: [0; ArchName::CAPACITY],
            len: 0,
        };
        for c in name.chars() {
            let end = arch.len as usize + c.len_utf8();
            if end > ArchName::CAPACITY {
                break;
            }
            c.encode_utf8(&mut arch.bytes[arch.len as usize..end]);
            arch.len = end as u8;
        }
        Error::UnknownArchitecture(arch)
    }
}

/// The first characters of an architecture's name, stored inline (an error allocates nothing).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ArchName {
    bytes: [u8; ArchName::CAPACITY],
    len: u8,
}

impl ArchName {
    const CAPACITY: usize = 48;

    /// The name (its first 48 bytes, in whole characters).
    pub fn as_str(&self) -> &str {
        // Only whole characters are stored, so the prefix is UTF-8.
        core::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or_default()
    }
}

impl fmt::Debug for ArchName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for ArchName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Length {
                what,
                expected,
                got,
            } => write!(f, "{what}: expected length {expected}, got {got}"),
            Error::Mismatch { op, lhs, rhs } => write!(
                f,
                "{op}: {} {} against {} {}",
                lhs.1, lhs.0, rhs.1, rhs.0
            ),
            Error::OutOfRange { what, index, len } => {
                write!(f, "{what} {index} is out of range (there are {len})")
            }
            Error::Overflow { what } => write!(f, "the size of {what} overflows"),
            Error::InvalidArgument { what, reason } => write!(f, "{what}: {reason}"),
            Error::NotBlockMultiple { what, len, block } => {
                write!(f, "{what}: length {len} is not a multiple of the block size {block}")
            }
            Error::ArenaTooSmall { what, needed, got } => write!(
                f,
                "{what} arena too small: needs {needed} bytes, was given {got}"
            ),
            Error::Backend(what) => write!(f, "{what}"),
            Error::Misaligned { what, align } => {
                write!(f, "{what} arena is not aligned to {align} bytes")
            }
            Error::ContextFull {
                pos,
                tokens,
                max_seq,
            } => write!(
                f,
                "context full: {tokens} token(s) at position {pos} do not fit in a KV cache of {max_seq} positions"
            ),
            Error::TokenOutOfRange { token, vocab } => {
                write!(f, "token id {token} is outside the vocabulary of {vocab}")
            }
            Error::InvalidConfig { field, reason } => write!(f, "invalid config: {field} {reason}"),
            Error::Shape {
                tensor,
                layer,
                expected,
                got,
            } => {
                write!(f, "tensor {tensor}")?;
                if let Some(l) = layer {
                    write!(f, " of layer {l}")?;
                }
                write!(
                    f,
                    " has shape [{}, {}], the config says [{}, {}]",
                    got[0], got[1], expected[0], expected[1]
                )
            }
            Error::UnsupportedFormat { what, format } => {
                write!(f, "{what} does not support format {format}")
            }
            Error::UnknownArchitecture(name) => write!(
                f,
                "unknown architecture {name:?}: sapient runs llama, mistral, qwen2 and the idefics3 (SmolVLM) text backbone"
            ),
            Error::InvalidSampling { field, reason } => {
                write!(f, "invalid sampling parameter: {field} {reason}")
            }
            Error::NotFinite { what, row } => write!(
                f,
                "the {what} of token {row} are not finite (NaN or infinity): the model's weights or scales hold values that are not finite numbers"
            ),
        }
    }
}

impl core::error::Error for Error {}
