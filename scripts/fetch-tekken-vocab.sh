#!/usr/bin/env bash
# Prints the directory of a vocabulary-only GGUF of Mistral's Tekken tokenizer with test cases
# whose ids come from mistral_common (the reference implementation; llama.cpp ships no such
# file), making them once into ${SAPIENT_TEKKEN_CACHE:-~/.cache/sapient/tekken}.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${SAPIENT_TEKKEN_CACHE:-$HOME/.cache/sapient/tekken}"
if [ ! -f "$cache/ggml-vocab-tekken.gguf.out" ]; then
    echo "making the Tekken vocabulary and its cases in $cache" >&2
    src="$(bash scripts/fetch-llama-cpp.sh)"
    venv="$cache/venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "mistral-common==1.13.1" numpy pyyaml >&2
    "$venv/bin/python" scripts/tekken-vocab.py "$src" tests/fixtures/text/GPL-3.txt "$cache"
fi
echo "$cache"
