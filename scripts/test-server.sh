#!/usr/bin/env bash
# `sapient serve` against the official openai Python client (tests/server/openai_client.py,
# tests/server/tool_calls.py, and its Responses API in tests/server/responses_client.py), the
# anthropic one (tests/server/anthropic_client.py), and under
# malformed and hostile request bodies
# (tests/server/hostile_requests.py), on loopback, with SmolLM2 Q4_1; llama-server's own
# routes (tests/server/native_routes.py), fill in the middle on SmolLM2's weights with
# StarCoder's vocabulary. The client lives in a virtual environment under ~/.cache/sapient
# (made once). Part of scripts/test.sh, which passes the binary `cargo test` built (SAPIENT_BIN);
# alone, it builds the release one.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$HOME/.cache/sapient/venv-openai"
# numpy and pyyaml: llama.cpp's gguf-py, which writes the fill-in-the-middle test model.
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import openai, anthropic, numpy, yaml" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check openai anthropic numpy pyyaml
fi
bash scripts/fetch-model.sh >/dev/null
bin="${SAPIENT_BIN:-}"
if [ -z "$bin" ]; then
    cargo build --release -q -p sapient
    bin="$(bash scripts/target-dir.sh)/release/sapient"
fi
timeout 600 "$venv/bin/python" tests/server/openai_client.py "$bin" models/SmolLM2-135M-Instruct.Q4_1.gguf
timeout 300 "$venv/bin/python" tests/server/tool_calls.py "$bin" models/SmolLM2-135M-Instruct.Q4_1.gguf
timeout 300 "$venv/bin/python" tests/server/anthropic_client.py "$bin" models/SmolLM2-135M-Instruct.Q4_1.gguf
timeout 300 "$venv/bin/python" tests/server/responses_client.py "$bin" models/SmolLM2-135M-Instruct.Q4_1.gguf
timeout 300 python3 tests/server/hostile_requests.py "$bin" models/SmolLM2-135M-Instruct.Q4_1.gguf
fim_dir=$(mktemp -d)
trap 'rm -rf "$fim_dir"' EXIT
llama_cpp="${SAPIENT_LLAMA_CPP_SRC:-$(bash scripts/fetch-llama-cpp.sh)}"
PYTHONPATH="$llama_cpp/gguf-py" "$venv/bin/python" tests/server/fim_model.py \
    models/SmolLM2-135M-Instruct.Q4_1.gguf "$llama_cpp/models/ggml-vocab-starcoder.gguf" "$fim_dir/fim.gguf"
timeout 300 "$venv/bin/python" tests/server/native_routes.py "$bin" "$fim_dir/fim.gguf" models/SmolLM2-135M-Instruct.Q4_1.gguf
