#!/usr/bin/env bash
# sapient against llama.cpp on the same GGUF files, thread count and machine, run by run.
#
#   scripts/bench-vs-llama-cpp.sh [threads] [repetitions] [depth] [models]
#
# models: `base` (default) is SmolLM2-135M in Q8_0 and Q4_1; `kquants` is SmolLM2-135M Q4_K_M
# (mostly Q5_0: its 576-wide rows are no multiple of 256) and, so that the k-quant kernels carry
# the load, TinyLlama-1.1B's shape with random weights (scripts/random-gguf.py) in Q4_K_M, Q6_K and
# Q2_K (mostly Q2_K, with Q3_K, Q4_K and Q6_K where llama-quantize gives those more bits);
# `iquants` is SmolLM2-135M IQ4_XS (mostly IQ4_NL, the fallback for its 576-wide rows) and the
# TinyLlama shape in IQ4_XS (with Q5_K for V and the first down projections, Q6_K output) and
# IQ3_M (IQ3_S, with Q4_K for V, the first down projections and the attention output);
# `lowbit` is the TinyLlama shape in IQ3_XXS, IQ2_M (mostly IQ2_S), IQ2_XXS, IQ1_S and IQ1_M, quantized
# with an importance matrix (llama-imatrix over tests/fixtures/text/GPL-3.txt: those types need
# one, whatever the weights); `ternary` is the TinyLlama shape in TQ1_0 and TQ2_0 (ternary weights
# times a scale per 256, as llama-quantize rounds them).
#
# Builds llama.cpp's llama-bench and llama-quantize (CPU only) from the source vendored in the
# PyPI sdist of llama-cpp-python, cached in ~/.cache/sapient/llama.cpp; makes a Q8_0 GGUF from
# the Q4_1 one with llama-quantize --allow-requantize; then alternates the two tools, pp512 and
# tg128 each run (after `depth` tokens already in the cache, llama-bench's -d; 0 by default),
# and prints every figure and the medians' ratios.
#
# With SAPIENT_CPU_KERNELS set to a lesser table this CPU runs (`avx2`, `avx2+vnni`), sapient runs
# those kernels and llama.cpp is built with the same instruction sets: an AVX2 or AVX-VNNI host,
# approximately, on an AVX-512 one.
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${1:-2}"
reps="${2:-5}"
depth="${3:-0}"
set="${4:-base}"
version=0.3.36
# llama.cpp gets the instruction sets sapient picks on this CPU (AVX2+FMA+F16C, plus AVX-VNNI and
# AVX-512 F/BW/VL/VNNI where present), never -march=native: these machines' CPUs report AMX,
# and llama.cpp 0.3.36's AMX kernels die of SIGILL here (its first tilezero; BENCHMARKS.md).
flags="-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
isa=avx2
if grep -qw avx_vnni /proc/cpuinfo; then
    flags="$flags -DGGML_AVX_VNNI=ON"
    isa=avx2-vnni
fi
if grep -qw avx512vl /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && grep -qw avx512_vnni /proc/cpuinfo; then
    flags="$flags -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON"
    isa=avx512
fi
case "${SAPIENT_CPU_KERNELS:-}" in
    "") ;;
    avx2)
        flags="-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
        isa=avx2
        ;;
    avx2+vnni)
        flags="-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=ON"
        isa=avx2-vnni
        ;;
    *)
        echo "SAPIENT_CPU_KERNELS=$SAPIENT_CPU_KERNELS: no llama.cpp build matches it (avx2, avx2+vnni)" >&2
        exit 2
        ;;
esac
cache="${SAPIENT_LLAMA_CPP_CACHE:-$HOME/.cache/sapient/llama.cpp}/$isa"
bin="$cache/build/bin"

if [ ! -x "$bin/llama-bench" ] || [ ! -x "$bin/llama-quantize" ] || [ ! -x "$bin/llama-imatrix" ]; then
    command -v cmake >/dev/null || { apt-get update -q && apt-get install -y -q cmake; } >&2
    src=$(bash scripts/fetch-llama-cpp.sh)
    echo "building llama.cpp ($isa) in $cache" >&2
    # shellcheck disable=SC2086 # $flags is a list of options
    cmake -S "$src" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF $flags \
        -DLLAMA_CURL=OFF -DGGML_METAL=OFF -DGGML_CUDA=OFF -DLLAMA_BUILD_TESTS=OFF >&2
    cmake --build "$cache/build" -j "$(nproc)" --target llama-bench llama-quantize \
        llama-imatrix >&2
fi

q4=$(bash scripts/fetch-model.sh)
# quantize IN OUT TYPE: llama-quantize, once.
quantize() {
    [ -f "$2" ] || "$bin/llama-quantize" --allow-requantize "$1" "$2" "$3" >/dev/null 2>&1
}
# random_1b TYPE: TinyLlama-1.1B's shape with random F16 weights (scripts/random-gguf.py, made
# where a file is missing), through llama-quantize once.
f16=models/random-tinyllama-1.1b.F16.gguf
random_1b_f16() {
    if [ ! -f "$f16" ]; then
        python3 -m pip install --quiet numpy pyyaml tqdm >&2
        PYTHONPATH="$(bash scripts/fetch-llama-cpp.sh)/gguf-py" python3 scripts/random-gguf.py "$f16"
    fi
}
random_1b() {
    local out="models/random-tinyllama-1.1b.$1.gguf"
    [ -f "$out" ] || random_1b_f16
    quantize "$f16" "$out" "$1"
}
# random_1b_imatrix TYPE: as random_1b, with an importance matrix (made once).
random_1b_imatrix() {
    local out="models/random-tinyllama-1.1b.$1.gguf" imatrix=models/random-tinyllama-1.1b.imatrix.gguf
    [ -f "$out" ] && return
    random_1b_f16
    if [ ! -f "$imatrix" ]; then
        "$bin/llama-imatrix" -m "$f16" -f "${SAPIENT_FIXTURES:-tests/fixtures}/text/GPL-3.txt" \
            -o "$imatrix" -c 128 --chunks 8 -t "$threads" >/dev/null 2>&1
    fi
    "$bin/llama-quantize" --imatrix "$imatrix" "$f16" "$out" "$1" >/dev/null 2>&1
}
case "$set" in
base)
    quantize "$q4" models/SmolLM2-135M-Instruct.Q8_0.gguf Q8_0
    models="models/SmolLM2-135M-Instruct.Q8_0.gguf $q4"
    ;;
kquants)
    quantize "$q4" models/SmolLM2-135M-Instruct.Q4_K_M.gguf Q4_K_M
    random_1b Q4_K_M
    random_1b Q6_K
    random_1b Q2_K
    models="models/SmolLM2-135M-Instruct.Q4_K_M.gguf models/random-tinyllama-1.1b.Q4_K_M.gguf models/random-tinyllama-1.1b.Q6_K.gguf models/random-tinyllama-1.1b.Q2_K.gguf"
    ;;
iquants)
    quantize "$q4" models/SmolLM2-135M-Instruct.IQ4_XS.gguf IQ4_XS
    random_1b IQ4_XS
    random_1b IQ3_M
    models="models/SmolLM2-135M-Instruct.IQ4_XS.gguf models/random-tinyllama-1.1b.IQ4_XS.gguf models/random-tinyllama-1.1b.IQ3_M.gguf"
    ;;
lowbit)
    for t in IQ3_XXS IQ2_M IQ2_XXS IQ1_S IQ1_M; do
        random_1b_imatrix "$t"
    done
    models="models/random-tinyllama-1.1b.IQ3_XXS.gguf models/random-tinyllama-1.1b.IQ2_M.gguf models/random-tinyllama-1.1b.IQ2_XXS.gguf models/random-tinyllama-1.1b.IQ1_S.gguf models/random-tinyllama-1.1b.IQ1_M.gguf"
    ;;
ternary)
    random_1b TQ1_0
    random_1b TQ2_0
    models="models/random-tinyllama-1.1b.TQ1_0.gguf models/random-tinyllama-1.1b.TQ2_0.gguf"
    ;;
*)
    echo "unknown model set $set (base, kquants, iquants, lowbit, ternary)" >&2
    exit 2
    ;;
esac
cargo build --release --quiet -p sapient
sapient="$(bash scripts/target-dir.sh)/release/sapient"

# shellcheck disable=SC2086 # $models is a list of files
python3 - "$bin/llama-bench" "$sapient" "$threads" "$reps" "$depth" $models <<'PY'
import json, statistics, subprocess, sys
llama_bench, sapient, threads, reps, depth, *models = sys.argv[1:]
reps = int(reps)

def llama(model, p, n):
    out = subprocess.run([llama_bench, "-m", model, "-t", threads, "-p", str(p), "-n", str(n), "-d", depth, "-r", "1", "-o", "json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)[0]["avg_ts"]

def ours(model, p, n):
    out = subprocess.run([sapient, "bench", "-m", model, "-t", threads, "-p", str(p), "-n", str(n), "-d", depth, "-r", "1", "--format", "json"],
                         check=True, capture_output=True, text=True).stdout
    j = json.loads(out)
    return j["prefill_tokens_per_s"] if p else j["decode_tokens_per_s"]

for model in models:
    for test, p, n in (("pp512", 512, 0), ("tg128", 0, 128)):
        a, b = [], []
        for _ in range(reps):
            a.append(ours(model, p, n))
            b.append(llama(model, p, n))
        ma, mb = statistics.median(a), statistics.median(b)
        name = model.rsplit("/", 1)[-1]
        at = f" @ d{depth}" if depth != "0" else ""
        print(f"{name} {test}{at} t={threads}: sapient {ma:.1f} tok/s {[round(x, 1) for x in a]}, "
              f"llama.cpp {mb:.1f} tok/s {[round(x, 1) for x in b]}, ratio {ma / mb:.2f}")
PY
