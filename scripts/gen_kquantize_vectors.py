#!/usr/bin/env python3
"""Writes core/tests/data/ggml_kquantize.txt: rows of test signals and the bytes ggml's own
quantizers make of them, as llama-quantize runs them without an importance matrix: the reference
k-quant ones (`quantize_row_q{4,5,6}_K_ref` in libggml-base) and the IQ4 ones
(`quantize_iq4_xs`, `quantize_iq4_nl`, with no weights: their `_ref` twins search less).

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

def rows_of(quantize):
    """`quantize(src, dst, nrow, n_per_row, quant_weights)` on one row, no weights."""
    quantize.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)
    quantize.restype = ctypes.c_size_t
    return lambda x, y, n: quantize(x, y, 1, n, None)


for f in (lib.quantize_row_q4_K_ref, lib.quantize_row_q5_K_ref, lib.quantize_row_q6_K_ref):
    f.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    f.restype = None
formats = (
    ("q4_k", lib.quantize_row_q4_K_ref, 144),
    ("q6_k", lib.quantize_row_q6_K_ref, 210),
    ("q5_k", lib.quantize_row_q5_K_ref, 176),
    ("iq4_xs", rows_of(lib.quantize_iq4_xs), 136),
    ("iq4_nl", rows_of(lib.quantize_iq4_nl), 18 * 8),
)

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
