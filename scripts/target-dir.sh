#!/usr/bin/env bash
# Prints cargo's target directory for this workspace: ./target, or wherever CARGO_TARGET_DIR (or
# a cargo config's build.target-dir) puts it.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p'
