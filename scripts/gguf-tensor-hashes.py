#!/usr/bin/env python3
"""Prints a GGUF's tensors as JSON, name -> [ggml type name, FNV-1a 64 of its bytes as hex], the
record tests compare `sapient quantize`'s output with (tests/data/smollm2_TYPE_tensors.json:
llama-quantize --allow-requantize SmolLM2-135M-Instruct.Q4_1.gguf OUT TYPE, llama.cpp 0.3.36, for
IQ4_XS and Q5_K_M).

    PYTHONPATH=$(scripts/fetch-llama-cpp.sh)/gguf-py python3 scripts/gguf-tensor-hashes.py FILE
"""
import json
import sys

import numpy as np
from gguf import GGUFReader


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def main(path):
    tensors = {}
    for t in GGUFReader(path).tensors:
        data = np.asarray(t.data).tobytes()
        tensors[t.name] = [t.tensor_type.name, f"{fnv1a64(data):016x}"]
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(tensors.items())]
    print("{\n" + ",\n".join(lines) + "\n}")


if __name__ == "__main__":
    main(*sys.argv[1:])
