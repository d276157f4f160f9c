#!/usr/bin/env bash
# Streams a completion of a prompt from SmolLM2-135M-Instruct, fetching the model on first use.
#   scripts/demo.sh ["prompt"]
set -euo pipefail
cd "$(dirname "$0")/.."
prompt="${1:-Once upon a time, in a small village by the sea,}"
model=$(bash scripts/fetch-model.sh)
cargo build --release --quiet -p sapient
exec "$(bash scripts/target-dir.sh)/release/sapient" generate -m "$model" -p "$prompt" --max-tokens 200
