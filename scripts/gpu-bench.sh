#!/usr/bin/env bash
# The GPU backend against the CPU backend on this machine: `sapient bench` on both, one JSON line
# per run (tokens/s, dispatches per decoded token, peak memory; then each GPU kernel's time in a
# run of its own, `--profile`), on models of real shapes with random weights, so that it runs
# where no model file can be fetched; then eight sequences decoding together (`--parallel 8`, as
# `sapient serve` runs them) on each backend; then the GPU decoding at a long context with its KV
# cache in f32, f16 and Q8_0.
#
#   scripts/gpu-bench.sh [sapient binary built with --features gpu] [reps]
#
# Without a binary it builds one (cargo build --release --features gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
sapient="${1:-}"
reps="${2:-3}"
if [ -z "$sapient" ]; then
    cargo build --release --quiet -p sapient --features gpu
    sapient="$(bash scripts/target-dir.sh)/release/sapient"
fi
for model in random:smollm2-135m:q8_0 random:smollm2-135m:q4_1 random:smollm2-135m:q4_k_m \
    random:llama-3.1-8b:q8_0; do
    for backend in gpu cpu; do
        printf '%s %s: ' "$model" "$backend"
        "$sapient" bench -m "$model" --backend "$backend" -p 512 -n 128 -r "$reps" \
            --format json 2>&1 | grep -E '^\{|^GPU|^error' | tr '\n' ' '
        echo
    done
    # Each kernel's time, in a run of its own: a profiled token is one submission, where a
    # plain one is submitted in pieces as it is recorded.
    printf '%s gpu --profile: ' "$model"
    "$sapient" bench -m "$model" --backend gpu -p 512 -n 32 -r 1 --profile --format json 2>&1 |
        grep -E '^\{|^error' | tr '\n' ' '
    echo
done
for backend in gpu cpu; do
    printf 'random:smollm2-135m:q8_0 %s --parallel 8: ' "$backend"
    "$sapient" bench -m random:smollm2-135m:q8_0 --backend "$backend" -p 0 -n 64 --parallel 8 \
        -r "$reps" --format json 2>&1 | grep -E '^\{|^error' | tr '\n' ' '
    echo
done
for kv in f32 f16 q8_0; do
    printf 'random:smollm2-135m:q8_0 gpu -d 2048 --kv %s: ' "$kv"
    "$sapient" bench -m random:smollm2-135m:q8_0 --backend gpu -p 0 -n 64 -d 2048 \
        --kv "$kv" -r "$reps" --profile --format json 2>&1 | grep -E '^\{|^error' | tr '\n' ' '
    echo
done
