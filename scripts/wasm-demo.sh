#!/usr/bin/env bash
# The core in WebAssembly: writes a fixture as a Q8_0 GGUF (sapient quantize), compiles it into
# embedded/wasm (wasm32-unknown-unknown, no heap, no wasm-bindgen), runs it with Node.js
# (embedded/wasm/run.mjs), and checks that its greedy tokens are the host's `sapient generate` on
# the same file. Prints the module's size.
#
# Usage: scripts/wasm-demo.sh [FIXTURE]   (default: llama_hd32, from tests/fixtures/tiny)
# Needs Node.js and Python 3 with numpy. SAPIENT_BIN names a sapient binary to use instead of
# building the release one.
set -euo pipefail
cd "$(dirname "$0")/.."
fixture="${SAPIENT_FIXTURES:-tests/fixtures}/tiny/${1:-llama_hd32}"
prompt=1,5,9,13,17,21,25
if ! command -v node >/dev/null; then
    echo "Node.js is missing" >&2
    exit 1
fi
rustup target add wasm32-unknown-unknown >/dev/null 2>&1 || true
source scripts/embedded-model.sh
embedded_model "$fixture"

wasm_target="$target_dir/wasm"
(cd embedded/wasm && CARGO_TARGET_DIR="$wasm_target" cargo build --release -q)
module="$wasm_target/wasm32-unknown-unknown/release/sapient_wasm.wasm"
wasm=$(node embedded/wasm/run.mjs "$module" "$prompt" 16)
echo "WebAssembly (Node $(node --version)): $wasm"
host=$(host_tokens "$prompt" 16)
echo "host:                      $host"
host_fixture=$(host_tokens "$prompt" 16 "$fixture")
echo "host, from the fixture:    $host_fixture"
echo "module: $(stat -c %s "$module") bytes"
if [ "$wasm" != "$host" ] || [ "$host_fixture" != "$host" ]; then
    echo "the WebAssembly module's tokens differ from the host's" >&2
    exit 1
fi
echo "same tokens"
