#!/usr/bin/env python3
"""Writes a Llama GGUF with random F16 weights in a real model's shape, with a SentencePiece
vocabulary of placeholder tokens, for benchmarks where the real file cannot be fetched. llama.cpp
loads it (and llama-quantize turns it into Q4_K_M, Q6_K, ...), and so does sapient.

    python3 scripts/random-gguf.py OUT.gguf [shape]

shape: tinyllama-1.1b (default: hidden 2048, intermediate 5632, 22 layers, 32 heads, 4 KV heads,
vocab 32000), or tiny-256 (hidden 256, intermediate 512, 2 layers, vocab 512: tests/data). Needs numpy and gguf-py on PYTHONPATH ($(scripts/fetch-llama-cpp.sh)/gguf-py).
"""
import sys

import numpy as np
import gguf

SHAPES = {
    "tinyllama-1.1b": dict(hidden=2048, ff=5632, layers=22, heads=32, kv_heads=4, vocab=32000, ctx=2048),
    # Rows of 256 and 512 values, so that llama-quantize makes real k-quants of every matrix: the
    # llama.cpp-made files in tests/data.
    "tiny-256": dict(hidden=256, ff=512, layers=2, heads=4, kv_heads=2, vocab=512, ctx=256),
}


def main(out, shape="tinyllama-1.1b"):
    s = SHAPES[shape]
    h, ff, hd = s["hidden"], s["ff"], s["hidden"] // s["heads"]
    kv = s["kv_heads"] * hd
    rng = np.random.default_rng(0)

    def mat(rows, cols):
        # Scaled like an initialized network, so activations stay in range through the layers.
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float16)

    w = gguf.GGUFWriter(out, "llama")
    w.add_name(f"random {shape}")
    w.add_vocab_size(s["vocab"])
    w.add_context_length(s["ctx"])
    w.add_embedding_length(h)
    w.add_block_count(s["layers"])
    w.add_feed_forward_length(ff)
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("llama")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(s["vocab"] - len(tokens))]
    types = [2, 3, 3] + [6] * 256 + [1] * (s["vocab"] - 259)
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(s["vocab"] - 259)])
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    w.add_tensor("token_embd.weight", mat(s["vocab"], h))
    w.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    w.add_tensor("output.weight", mat(s["vocab"], h))
    for i in range(s["layers"]):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(h, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(h, h))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(kv, h))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(kv, h))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(h, h))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(h, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(ff, h))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(ff, h))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(h, ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(*sys.argv[1:])
