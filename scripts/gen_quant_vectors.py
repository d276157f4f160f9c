#!/usr/bin/env python3
"""Writes core/tests/data/gguf_quants.txt: inputs, the bytes the `gguf` Python package's
reference quantizers (gguf.quants.quantize) produce for them, and the values its dequantizers
give back, for Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1.

Run once (numpy, and gguf-py: PYTHONPATH=$(scripts/fetch-llama-cpp.sh)/gguf-py) and commit the
output; the core test compares our quantizers' bytes and dequantizers' values with it. Each case
is four lines: `name format n`, the inputs as little-endian f32 hex, the expected bytes as hex,
the dequantized values as little-endian f32 hex.
"""
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize


def cases():
    n = 256
    i = np.arange(n, dtype=np.float32)
    yield "ggml_signal", (0.1 + 2 * np.cos(i)).astype(np.float32)
    rng = np.random.default_rng(1234)
    yield "normal", rng.standard_normal(n).astype(np.float32)
    yield "wide", (rng.standard_normal(n) * np.exp(rng.uniform(-20, 20, n))).astype(np.float32)
    yield "zeros", np.zeros(64, dtype=np.float32)
    # Exact halves on the quantization grid, where rounding direction matters.
    halves = np.tile(np.array([127, 2.5, -2.5, 0.5, -0.5, 1.5, 126.5, -126.5], dtype=np.float32), 8)
    yield "halves", halves
    yield "small_ints", (rng.integers(-20, 20, 128)).astype(np.float32)
    yield "tiny", (rng.standard_normal(96) * 1e-6).astype(np.float32)


def main(out: Path):
    lines = []
    for name, x in cases():
        for fmt, t in (("q8_0", T.Q8_0), ("q4_0", T.Q4_0), ("q4_1", T.Q4_1), ("q5_0", T.Q5_0), ("q5_1", T.Q5_1)):
            q = quantize(x.reshape(1, -1), t)
            lines.append(f"{name} {fmt} {x.size}")
            lines.append(x.astype("<f4").tobytes().hex())
            lines.append(np.asarray(q, dtype=np.uint8).tobytes().hex())
            lines.append(dequantize(q, t).astype("<f4").tobytes().hex())
    out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "core/tests/data/gguf_quants.txt"))
