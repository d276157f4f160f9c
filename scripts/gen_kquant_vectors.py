#!/usr/bin/env python3
"""Writes core/tests/data/gguf_kquants.txt: random Q4_K, Q5_K, Q6_K, Q3_K and Q2_K super-blocks,
IQ4_XS, IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, TQ1_0 and TQ2_0 super-blocks and IQ4_NL
blocks, and the
values the `gguf` Python package's dequantizers (gguf.quants.dequantize) give for them.

Each case is three lines: `format n_blocks`, the block bytes as hex, the values as f32 hex.
"""
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

rng = np.random.default_rng(7)
lines = []
for fmt, t, size, scale_offsets in (("q4_k", T.Q4_K, 144, (0, 2)), ("q5_k", T.Q5_K, 176, (0, 2)), ("q6_k", T.Q6_K, 210, (208,)), ("q3_k", T.Q3_K, 110, (108,)), ("q2_k", T.Q2_K, 84, (80, 82)), ("iq4_xs", T.IQ4_XS, 136, (0,)), ("iq4_nl", T.IQ4_NL, 18, (0,)), ("iq3_s", T.IQ3_S, 110, (0,)),
                                         ("iq3_xxs", T.IQ3_XXS, 98, (0,)), ("iq2_xxs", T.IQ2_XXS, 66, (0,)),
                                         ("iq2_xs", T.IQ2_XS, 74, (0,)), ("iq2_s", T.IQ2_S, 82, (0,)),
                                         ("iq1_s", T.IQ1_S, 50, (0,)), ("iq1_m", T.IQ1_M, 56, ()),
                                         ("tq1_0", T.TQ1_0, 54, (52,)), ("tq2_0", T.TQ2_0, 66, (64,))):
    n = 3
    blocks = rng.integers(0, 256, (n, size), dtype=np.uint8)
    for b in blocks:
        for off in scale_offsets:
            # Finite, modest f16 scales, so that every value is a plain number.
            b[off:off + 2] = np.frombuffer(np.float16(rng.uniform(-0.05, 0.05)).tobytes(), dtype=np.uint8)
        if t == T.IQ1_M:
            # IQ1_M's f16 d is the top nibbles of its four scale words, lowest first.
            d = int(np.frombuffer(np.float16(rng.uniform(-0.05, 0.05)).tobytes(), dtype=np.uint16)[0])
            for i in range(4):
                b[49 + 2 * i] = (b[49 + 2 * i] & 0x0F) | (((d >> (4 * i)) & 0xF) << 4)
    values = dequantize(blocks.reshape(-1), t).astype("<f4")
    lines += [f"{fmt} {n}", blocks.tobytes().hex(), values.tobytes().hex()]
out = Path(sys.argv[1] if len(sys.argv) > 1 else "core/tests/data/gguf_kquants.txt")
out.write_text("\n".join(lines) + "\n")
