# Sourced by embedded-demo.sh and wasm-demo.sh (from the repository root): what both do with a
# fixture before and after running it on their target.
#   embedded_model FIXTURE  writes embedded/model/model.gguf (Q8_0, by sapient quantize) and the
#                           module scripts/gguf-to-rust.py writes from it; sets $sapient (the
#                           SAPIENT_BIN binary, or a release build) and $target_dir.
#   host_tokens PROMPT N [MODEL]  prints "tokens: <ids>": sapient generate's greedy ids on the
#                           host for MODEL (default: the same GGUF).

embedded_model() {
    target_dir="$(bash scripts/target-dir.sh)"
    sapient="${SAPIENT_BIN:-}"
    if [ -z "$sapient" ]; then
        cargo build --release -q -p sapient
        sapient="$target_dir/release/sapient"
    fi
    mkdir -p embedded/model
    "$sapient" quantize "$1" embedded/model/model.gguf --type q8_0 2>/dev/null
    # The module that places the GGUF's tensors, written with llama.cpp's own GGUF reader.
    python3 -c 'import numpy' 2>/dev/null || python3 -m pip install --quiet numpy
    PYTHONPATH="$(bash scripts/fetch-llama-cpp.sh)/gguf-py" \
        python3 scripts/gguf-to-rust.py embedded/model/model.gguf embedded/model/model.rs
}

host_tokens() {
    printf 'tokens: '
    "$sapient" generate --model "${3:-embedded/model/model.gguf}" --prompt-ids "$1" --max-tokens "$2" \
        --temperature 0 --format json --backend cpu 2>/dev/null |
        python3 -c 'import json, sys; print(" ".join(map(str, json.load(sys.stdin)["generated_ids"])))'
}
