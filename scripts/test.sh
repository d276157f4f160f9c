#!/usr/bin/env bash
# The test command: gets the real model the end-to-end tests use (once), then runs every test of
# the workspace. Needs ../shared/fixtures beside the repository (or SAPIENT_FIXTURES).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/fetch-model.sh >/dev/null
# The GPU backend's tests run on any adapter wgpu finds (lavapipe will do) and skip, saying so,
# where there is none.
cargo test --workspace --features sapient-tests/gpu "$@"
