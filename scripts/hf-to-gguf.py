#!/usr/bin/env python3
"""Writes a float32 Hugging Face Llama checkpoint as a GGUF file the way llama.cpp's
convert_hf_to_gguf.py does (its LlamaModel: Q/K rows permuted to the adjacent-pair RoPE layout,
the tensor names, the hyper-parameter keys, and rope_freqs.weight computed from a "llama3"
rope_scaling), with the gguf package of the same llama.cpp (gguf-py), without torch.

    python3 scripts/hf-to-gguf.py CHECKPOINT_DIR OUT.gguf

Needs numpy and gguf-py on PYTHONPATH ($(scripts/fetch-llama-cpp.sh)/gguf-py). Writes
tests/data/llama3_rope.gguf from tests/fixtures/tiny/llama3_rope; .ci/run checks that it
still does, byte for byte.
"""
import json
import math
import struct
import sys
from pathlib import Path

import numpy as np
import gguf


def read_safetensors(path):
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            sys.exit(f"{name}: {t['dtype']}; this script converts float32 checkpoints")
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=np.float32).reshape(t["shape"])
    return out


def permute(w, n_head, n_head_kv):
    """LlamaModel.permute: (i, i + d/2) pairs become (2i, 2i + 1)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def rope_factors(rope, dim):
    """LlamaModel.generate_extra_tensors, in float32 as torch computes it there."""
    base = rope.get("rope_theta", 10000.0)
    freqs = np.float32(1.0) / (
        np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    )
    factor = rope.get("factor", 8.0)
    low = rope.get("low_freq_factor", 1.0)
    high = rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in freqs:
        wavelen = np.float32(2 * math.pi) / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (np.float32(old) / wavelen - np.float32(low)) / np.float32(high - low)
            out.append(1 / ((1 - smooth) / np.float32(factor) + smooth))
    return np.array(out, dtype=np.float32)


def main(src, dst):
    src = Path(src)
    c = json.loads((src / "config.json").read_text())
    rope = c.get("rope_parameters") or dict(c.get("rope_scaling") or {}, rope_theta=c.get("rope_theta", 10000.0))
    n_head, n_kv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    head_dim = c.get("head_dim") or c["hidden_size"] // n_head

    w = gguf.GGUFWriter(dst, "llama")
    w.add_name(src.name)
    w.add_vocab_size(c["vocab_size"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    t = read_safetensors(src / "model.safetensors")
    if rope.get("rope_type", "").lower() == "llama3":
        w.add_tensor("rope_freqs.weight", rope_factors(rope, head_dim))
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    layer = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    for i in range(c["num_hidden_layers"]):
        for hf, gg in layer.items():
            names[f"model.layers.{i}.{hf}"] = f"blk.{i}.{gg}"
    for name, data in t.items():
        if name == "lm_head.weight" and c.get("tie_word_embeddings"):
            continue
        if name.endswith("q_proj.weight"):
            data = permute(data, n_head, n_head)
        elif name.endswith("k_proj.weight"):
            data = permute(data, n_head, n_kv)
        w.add_tensor(names[name], np.ascontiguousarray(data))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
