#!/usr/bin/env bash
# The core on a microcontroller: writes a fixture as a Q8_0 GGUF (sapient quantize), compiles it
# into the Cortex-M4F firmware of embedded/firmware (weights in flash, static arenas, no heap),
# runs it under qemu-system-arm (mps2-an386, one instruction a nanosecond: `-icount shift=0`),
# and checks that its greedy tokens are the host's `sapient generate` on the same file. Prints
# the firmware's flash and RAM use and the SysTick ticks it counted (25 MHz: 40 instructions a
# tick); with --measure-stack, also the smallest stack (to 1 KiB) the run succeeds with.
#
# Usage: scripts/embedded-demo.sh [--measure-stack] [FIXTURE]   (default: llama_hd32)
# Needs qemu-system-arm (Debian: apt-get install qemu-system-arm) and Python 3 with numpy.
# SAPIENT_BIN names a sapient binary to use instead of building the release one.
set -euo pipefail
cd "$(dirname "$0")/.."
measure_stack=false
if [ "${1:-}" = "--measure-stack" ]; then
    measure_stack=true
    shift
fi
fixture="${SAPIENT_FIXTURES:-tests/fixtures}/tiny/${1:-llama_hd32}"
prompt=1,5,9,13,17,21,25
if ! command -v qemu-system-arm >/dev/null; then
    echo "qemu-system-arm is missing: apt-get install qemu-system-arm" >&2
    exit 1
fi
rustup target add thumbv7em-none-eabihf >/dev/null 2>&1 || true
source scripts/embedded-model.sh
embedded_model "$fixture"

firmware_target="$target_dir/firmware"
(cd embedded/firmware && CARGO_TARGET_DIR="$firmware_target" cargo build --release -q)
elf="$firmware_target/thumbv7em-none-eabihf/release/sapient-firmware"
run_firmware() {
    (cd embedded/firmware && CARGO_TARGET_DIR="$firmware_target" timeout "$1" cargo run --release -q)
}
firmware_out=$(run_firmware 600)
firmware_tokens=$(printf '%s\n' "$firmware_out" | grep '^tokens:')
echo "firmware (qemu mps2-an386): $firmware_tokens"
printf '%s\n' "$firmware_out" | grep -v '^tokens:'

host=$(host_tokens "$prompt" 16)
echo "host:                       $host"
# The fixture itself, quantized to Q8_0 at load: the same weights, so the same tokens.
host_fixture=$(host_tokens "$prompt" 16 "$fixture")
echo "host, from the fixture:     $host_fixture"

# Flash holds the vector table, code and read-only data (the model); RAM the arenas (.bss and
# .data) and the stack.
size -A "$elf" | awk '
    $1 == ".vector_table" || $1 == ".text" || $1 == ".rodata" || $1 == ".data" { flash += $2 }
    $1 == ".data" || $1 == ".bss" || $1 == ".uninit" { ram += $2 }
    END { printf "flash: %d bytes, RAM (static): %d bytes\n", flash, ram }'

if [ "$firmware_tokens" != "$host" ] || [ "$host_fixture" != "$host" ]; then
    echo "the firmware's tokens differ from the host's" >&2
    exit 1
fi
echo "same tokens"

if $measure_stack; then
    # The stack sits below the arenas (embedded/firmware/memory.x): too small a stack faults, and
    # the board then hangs in the fault handler, which the timeout ends.
    lo=1 hi=128
    while [ $((hi - lo)) -gt 1 ]; do
        mid=$(((lo + hi) / 2))
        if [ "$(SAPIENT_FIRMWARE_STACK=$((mid * 1024)) run_firmware 20 2>/dev/null |
            grep '^tokens:')" = "$firmware_tokens" ]; then
            hi=$mid
        else
            lo=$mid
        fi
    done
    echo "stack: the run needs $hi KiB (it fails with $lo KiB)"
    # Leave the firmware built with its default stack.
    (cd embedded/firmware && CARGO_TARGET_DIR="$firmware_target" cargo build --release -q)
fi
