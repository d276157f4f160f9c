//! sapient: what the core needs an operating system for. Loading models from memory-mapped files
//! (Hugging Face safetensors directories), a rayon executor, and the helpers behind the `sapient`
//! command line.
pub mod bench;
pub mod chat;
pub mod constraint;
pub mod convert;
pub mod dry;
pub mod exec;
pub mod generate;
#[cfg(feature = "gpu")]
pub mod gpu;
pub mod grammar;
pub mod infill;
mod json_lex;
pub mod json_output;
pub mod json_schema;
pub mod load;
pub mod reasoning;
pub mod run;
pub mod serve;
pub mod slots;
pub mod speculative;
pub mod tokenizer;
pub mod tool_calls;

pub use exec::Rayon;
pub use load::{LoadOptions, ModelFiles, Quantize};
