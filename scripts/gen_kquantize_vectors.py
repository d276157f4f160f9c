#!/usr/bin/env python3
"""Writes core/tests/data/ggml_kquantize.txt: rows of test signals and the bytes ggml's own
reference k-quant quantizers (`quantize_row_q4_K_ref`, `quantize_row_q6_K_ref` in libggml-base,
what llama-quantize runs without an importance matrix) make of them.

Each case is three lines: `name format n_values`, the values as f32 hex, the bytes as hex.
Usage: scripts/gen_kquantize_vectors.py [LIBGGML_BASE_SO] [OUT]
(default: the library scripts/bench-vs-llama-cpp.sh builds).
"""
import ctypes
import sys
from pathlib import Path

import numpy as np

lib_path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.home() / ".cache/sapient/llama.cpp/avx2/build/bin/libggml-base.so"
out = Path(sys.argv[2] if len(sys.argv) > 2 else "core/tests/data/ggml_kquantize.txt")
lib = ctypes.CDLL(str(lib_path))
QK_K = 256
formats = (("q4_k", lib.quantize_row_q4_K_ref, 144), ("q6_k", lib.quantize_row_q6_K_ref, 210))
for _, f, _ in formats:
    f.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    f.restype = None

rng = np.random.default_rng(11)
n = 2 * QK_K
signals = {
    # llama.cpp's tests/test-quantize-fns.cpp signal.
    "ggml_signal": 0.1 + 2.0 * np.cos(np.arange(n) + 0.0),
    "normal": rng.normal(0, 0.02, n),
    "outliers": np.where(rng.random(n) < 0.02, rng.normal(0, 1.0, n), rng.normal(0, 0.01, n)),
    "positive": rng.uniform(0.5, 1.5, n),
    "negative": rng.uniform(-3.0, -1.0, n),
    "zeros": np.zeros(n),
    "constant": np.full(n, 0.25),
    "tiny": rng.normal(0, 1e-6, n),
    "large": rng.normal(0, 300.0, n),
    "sparse": np.where(rng.random(n) < 0.1, rng.normal(0, 1.0, n), 0.0),
}
lines = []
for name, x in signals.items():
    x = np.ascontiguousarray(x, dtype="<f4")
    for fmt, f, size in formats:
        y = np.zeros(n // QK_K * size, dtype=np.uint8)
        f(x.ctypes.data, y.ctypes.data, n)
        lines += [f"{name} {fmt} {n}", x.tobytes().hex(), y.tobytes().hex()]
out.write_text("\n".join(lines) + "\n")
print(f"wrote {len(lines) // 3} cases to {out}")
