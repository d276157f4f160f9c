#!/usr/bin/env bash
# Line and region coverage of fuzz targets over their corpora (the seeds plus whatever earlier
# `cargo fuzz run`s added to fuzz/corpus/<target>), one llvm-cov report per target, restricted to
# the project's own files.
#
# Usage: scripts/fuzz-coverage.sh [TARGET...]   (default: the parser and model targets)
# Needs a nightly toolchain with llvm-tools (installed here) and cargo-fuzz. Reports land in
# fuzz/coverage/<target>/report.txt; the last line is the total over every file the binary holds.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
NIGHTLY=$(rustup toolchain list | grep -o '^nightly[^ ]*' | head -n 1)
rustup "+$NIGHTLY" component add llvm-tools-preview >/dev/null
llvm_cov="$(rustc "+$NIGHTLY" --print sysroot)/lib/rustlib/$(rustc "+$NIGHTLY" -vV | sed -n 's/^host: //p')/bin/llvm-cov"
host=$(rustc "+$NIGHTLY" -vV | sed -n 's/^host: //p')
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf_header gguf_tokenizer chat_template safetensors_config load_forward)
for t in "${targets[@]}"; do
    mkdir -p "coverage/$t"
    if ! cargo "+$NIGHTLY" fuzz coverage "$t" >"coverage/$t/build.log" 2>&1; then
        tail -n 20 "coverage/$t/build.log" >&2
        exit 1
    fi
    # cargo-fuzz builds coverage binaries under fuzz/target whatever CARGO_TARGET_DIR says.
    "$llvm_cov" report "target/$host/coverage/$host/release/$t" \
        -instr-profile="coverage/$t/coverage.profdata" \
        -ignore-filename-regex='(\.cargo|rustc|/rustlib/)' >"coverage/$t/report.txt"
    printf '%s: %s\n' "$t" "$(tail -n 1 "coverage/$t/report.txt")"
done
