//! Shared by the model-loading targets: a scratch directory per process, and load + forward.
use std::path::{Path, PathBuf};

use sapient::run::CpuRunner;
use sapient::{LoadOptions, ModelFiles, Quantize};
use sapient_core::{KvFormat, Serial};

/// This process's scratch directory (fuzzing runs one input at a time per process).
pub fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sapient-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Loads `path` as the CLI does and, if it loads, runs the logits of two tokens on the CPU:
/// errors anywhere are fine, panics are not.
pub fn load_and_run(path: &Path) {
    let Ok(files) = ModelFiles::open(path, &LoadOptions::default()) else {
        return;
    };
    // A model too large for a fuzzing process is refused by its config, not run.
    if files.config.vocab_size * files.config.hidden_size > 1 << 24 || files.config.n_layers > 8 {
        return;
    }
    let Ok(model) = files.model(Quantize::AsStored) else {
        return;
    };
    let _ = sapient::run::logits(
        &CpuRunner::new(&model, KvFormat::F32, &Serial),
        &[1, 2],
        false,
    );
}
