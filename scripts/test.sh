#!/usr/bin/env bash
# The test command: gets the real model and llama.cpp's tokenizer data the tests use (once),
# then runs every test of the workspace. Reads its fixtures from tests/fixtures (or SAPIENT_FIXTURES).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/fetch-model.sh >/dev/null
# llama.cpp's tokenizer test data (vocabulary-only GGUFs with expected ids), downloaded once.
SAPIENT_LLAMA_CPP_SRC="$(bash scripts/fetch-llama-cpp.sh)"
export SAPIENT_LLAMA_CPP_SRC
# Mistral's Tekken vocabulary with mistral_common's ids for its cases, made once.
SAPIENT_TEKKEN_VOCAB="$(bash scripts/fetch-tekken-vocab.sh)"
export SAPIENT_TEKKEN_VOCAB
# The GPU backend's tests run on any adapter wgpu finds (lavapipe will do) and skip, saying so,
# where there is none.
cargo test --workspace --features sapient-tests/gpu "$@"
# The HTTP server, through the official openai Python client, on the `sapient` binary the tests
# built (the test profile's: a release build took three minutes of a cold run, the slower binary
# one more); where they built none, test-server.sh builds the release one.
SAPIENT_BIN=$(bash scripts/test-bin.sh "$@")
export SAPIENT_BIN
bash scripts/test-server.sh
