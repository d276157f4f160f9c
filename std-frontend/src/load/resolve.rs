//! Turning what a user typed after `--model` into files: a path, or a Hugging Face id looked up
//! offline in the local hub cache.
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

/// The hub cache: `$HF_HUB_CACHE`, `$HF_HOME/hub`, or `~/.cache/huggingface/hub`.
pub fn hub_cache() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE") {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = std::env::var_os("HF_HOME") {
        return Some(PathBuf::from(p).join("hub"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface/hub"))
}

/// A path that exists, or the snapshot of a hub id (`org/name`) in the local cache.
pub fn resolve(spec: &str) -> Result<PathBuf> {
    let path = Path::new(spec);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    let mut looked = vec![path.display().to_string()];
    if let Some((org, name)) = spec.split_once('/') {
        if !org.is_empty() && !name.is_empty() && !name.contains('/') && !org.starts_with('.') {
            if let Some(cache) = hub_cache() {
                let repo = cache.join(format!("models--{org}--{name}"));
                if let Some(snapshot) = snapshot(&repo) {
                    return Ok(snapshot);
                }
                looked.push(format!("{}/snapshots/*", repo.display()));
            }
        }
    }
    bail!("model not found: looked for {}", looked.join(" and "))
}

/// The snapshot `refs/main` points at, or else the most recently modified one.
fn snapshot(repo: &Path) -> Option<PathBuf> {
    let snapshots = repo.join("snapshots");
    if let Ok(rev) = std::fs::read_to_string(repo.join("refs/main")) {
        let p = snapshots.join(rev.trim());
        if p.is_dir() {
            return Some(p);
        }
    }
    std::fs::read_dir(&snapshots)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_snapshot_in_the_hub_cache_layout() {
        let root = std::env::temp_dir().join(format!("sapient-hub-{}", std::process::id()));
        let repo = root.join("models--Org--Tiny");
        std::fs::create_dir_all(repo.join("snapshots/abc123")).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "abc123\n").unwrap();
        assert_eq!(snapshot(&repo), Some(repo.join("snapshots/abc123")));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_missing_model_says_where_it_looked() {
        let err = resolve("no-such-org/no-such-model")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no-such-org/no-such-model")
                && err.contains("models--no-such-org--no-such-model"),
            "{err}"
        );
    }
}
