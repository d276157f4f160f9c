#!/usr/bin/env python3
"""Writes core/src/quant/iq_grids.rs: ggml's fixed grids of the 1-, 2- and 3-bit i-quants
(`iq2xxs_grid`, `iq2xs_grid`, `iq2s_grid`, `iq3xxs_grid`, `iq1s_grid` in ggml-common.h),
copied from llama.cpp's source as `scripts/fetch-llama-cpp.sh` fetches it.

Usage: scripts/gen_iq_grids.py [LLAMA_CPP_SRC] [OUT]
"""
import re
import subprocess
import sys
from pathlib import Path

TABLES = (
    # (ggml name, Rust name, element type, doc)
    ("iq2xxs_grid", "IQ2XXS_GRID", "u64", "IQ2_XXS's eight magnitudes (8, 25, 43) per entry."),
    ("iq2xs_grid", "IQ2XS_GRID", "u64", "IQ2_XS's eight magnitudes (8, 25, 43) per entry."),
    ("iq2s_grid", "IQ2S_GRID", "u64", "IQ2_S's eight magnitudes (8, 25, 43) per entry."),
    ("iq3xxs_grid", "IQ3XXS_GRID", "u32", "IQ3_XXS's four magnitudes (4 to 62) per entry."),
    ("iq1s_grid", "IQ1S_GRID", "u64", "IQ1_S's eight values (-1, 0, 1 as `i8`) per entry."),
)

src = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(
    subprocess.run(["bash", "scripts/fetch-llama-cpp.sh"], check=True, capture_output=True, text=True).stdout.strip())
out = Path(sys.argv[2] if len(sys.argv) > 2 else "core/src/quant/iq_grids.rs")
header = (src / "ggml/src/ggml-common.h").read_text()

lines = [
    "//! ggml's fixed grids of the 1-, 2- and 3-bit i-quants, as `ggml-common.h` has them (written",
    "//! by `scripts/gen_iq_grids.py`). A format's quants index an entry; each byte of the entry is",
    "//! one value's magnitude (IQ1_S: one signed value).",
]
for ggml, name, ty, doc in TABLES:
    body = re.search(r"GGML_TABLE_BEGIN\(\w+, " + ggml + r", \w+\)(.*?)GGML_TABLE_END\(\)", header, re.S)
    values = re.findall(r"0x[0-9a-f]+", body.group(1))
    width = 16 if ty == "u64" else 8
    per_line = 4 if ty == "u64" else 8
    lines += ["", f"/// ggml's `{ggml}`: {doc}", "#[rustfmt::skip]", f"pub static {name}: [{ty}; {len(values)}] = ["]
    for i in range(0, len(values), per_line):
        lines.append("    " + " ".join(f"0x{int(v, 16):0{width}x}," for v in values[i:i + per_line]))
    lines.append("];")
out.write_text("\n".join(lines) + "\n")
