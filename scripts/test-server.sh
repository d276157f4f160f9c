#!/usr/bin/env bash
# `sapient serve` against the official openai Python client (tests/server/openai_client.py,
# tests/server/tool_calls.py) and under malformed and hostile request bodies
# (tests/server/hostile_requests.py), on loopback, with SmolLM2 Q4_1. The client lives in a virtual environment under
# ~/.cache/sapient (made once). Part of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$HOME/.cache/sapient/venv-openai"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import openai" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check openai
fi
bash scripts/fetch-model.sh >/dev/null
cargo build --release -q -p sapient
bin="$(bash scripts/target-dir.sh)/release/sapient"
timeout 600 "$venv/bin/python" tests/server/openai_client.py "$bin" models/SmolLM2-135M-Instruct.Q4_1.gguf
timeout 300 "$venv/bin/python" tests/server/tool_calls.py "$bin" models/SmolLM2-135M-Instruct.Q4_1.gguf
timeout 300 python3 tests/server/hostile_requests.py "$bin" models/SmolLM2-135M-Instruct.Q4_1.gguf
