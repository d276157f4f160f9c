#!/usr/bin/env python3
"""Reads a GGUF file with llama.cpp's `gguf` Python package (GGUFReader) and checks it as llama.cpp
would read it: the architecture and its hyper-parameters are there, every tensor's data has the
size its type and shape say, and every tensor dequantizes (gguf.quants) to finite values.

Usage: PYTHONPATH=.../gguf-py scripts/check-gguf.py FILE [EXPECTED_TENSOR_TYPE_COUNTS]
where the counts look like "f32=61,q4_K=16,q5_0=166,q6_K=14,q8_0=15".
"""
import sys
from collections import Counter

import numpy as np
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

path = sys.argv[1]
r = GGUFReader(path)
arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
for key in ("embedding_length", "block_count", "feed_forward_length", "attention.head_count"):
    assert f"{arch}.{key}" in r.fields, f"{path}: {arch}.{key} is missing"
counts = Counter()
for t in r.tensors:
    block, size = GGML_QUANT_SIZES[t.tensor_type]
    n = int(np.prod(t.shape))
    assert t.n_bytes == n // block * size, f"{t.name}: {t.n_bytes} bytes for {n} {t.tensor_type.name} values"
    values = dequantize(t.data, t.tensor_type)
    assert values.size == n and np.isfinite(values).all(), f"{t.name}: not finite"
    counts[t.tensor_type.name.lower().replace("_k", "_K")] += 1
if len(sys.argv) > 2:
    want = {k: int(v) for k, v in (kv.split("=") for kv in sys.argv[2].split(","))}
    assert dict(counts) == want, f"{path}: tensor types {dict(counts)}, expected {want}"
print(f"{path}: {arch}, {len(r.tensors)} tensors {dict(sorted(counts.items()))}, {len(r.fields)} metadata keys: read by gguf-py")
