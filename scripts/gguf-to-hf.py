#!/usr/bin/env python3
"""Writes a Hugging Face checkpoint directory from a `llama` GGUF with a byte-level BPE (gpt2)
vocabulary: config.json, model.safetensors (f32, dequantized with gguf-py, Q/K rows put back in
Hugging Face's rotate-halves order), tokenizer.json, tokenizer_config.json.

It exists to check `sapient quantize` against llama.cpp from a Hugging Face directory where the
hub is not reachable (BENCHMARKS.md): SmolLM2's GGUF -> this directory -> sapient quantize ->
llama-simple / llama-perplexity.
Usage: PYTHONPATH=.../gguf-py scripts/gguf-to-hf.py MODEL.gguf OUT_DIR [PRE_TOKENIZER_JSON]
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

src, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
r = GGUFReader(str(src))


def field(key):
    f = r.fields[key]
    if f.types[0].name == "STRING":
        return bytes(f.parts[f.data[0]]).decode()
    if f.types[0].name == "ARRAY":
        if f.types[-1].name == "STRING":
            return [bytes(f.parts[i]).decode() for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    return f.parts[f.data[0]].tolist()[0]


assert field("general.architecture") == "llama" and field("tokenizer.ggml.model") == "gpt2"
a = "llama."
n_head, n_kv = field(a + "attention.head_count"), field(a + "attention.head_count_kv")
names = {t.name for t in r.tensors}
config = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": field(a + "embedding_length"),
    "intermediate_size": field(a + "feed_forward_length"),
    "num_hidden_layers": field(a + "block_count"),
    "num_attention_heads": n_head,
    "num_key_value_heads": n_kv,
    "rms_norm_eps": field(a + "attention.layer_norm_rms_epsilon"),
    "rope_theta": field(a + "rope.freq_base"),
    "max_position_embeddings": field(a + "context_length"),
    "vocab_size": len(field("tokenizer.ggml.tokens")),
    "tie_word_embeddings": "output.weight" not in names,
    "bos_token_id": field("tokenizer.ggml.bos_token_id"),
    "eos_token_id": field("tokenizer.ggml.eos_token_id"),
    "hidden_act": "silu",
    "torch_dtype": "float32",
}
(out / "config.json").write_text(json.dumps(config, indent=1))


def unpermute(w, heads):
    # Inverse of llama.cpp's converter's permute: adjacent pairs back to halves.
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


hf_names = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
per_layer = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
tensors = {}
for t in r.tensors:
    values = dequantize(t.data, t.tensor_type).astype("<f4").reshape(list(reversed([int(d) for d in t.shape])))
    if t.name.startswith("blk."):
        _, i, rest = t.name.split(".", 2)
        name = f"model.layers.{i}.{per_layer[rest]}"
        if rest == "attn_q.weight":
            values = unpermute(values, n_head)
        elif rest == "attn_k.weight":
            values = unpermute(values, n_kv)
    else:
        name = hf_names[t.name]
    tensors[name] = np.ascontiguousarray(values)
header, offset = {}, 0
for name, v in tensors.items():
    header[name] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [offset, offset + v.nbytes]}
    offset += v.nbytes
head = json.dumps(header).encode()
head += b" " * (-len(head) % 8)
with open(out / "model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(head)) + head)
    for v in tensors.values():
        f.write(v.tobytes())

tokens, types = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type")
control = [i for i, ty in enumerate(types) if ty == 3]
pre = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {
    # SmolLM2's: digits one by one, then GPT-2's byte-level split.
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ],
}
tokenizer = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": [
        {"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i in control
    ],
    "normalizer": None,
    "pre_tokenizer": pre,
    "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    "model": {
        "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
        "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
        "vocab": {t: i for i, t in enumerate(tokens)},
        "merges": field("tokenizer.ggml.merges"),
    },
}
(out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
tok_config = {
    "bos_token": tokens[config["bos_token_id"]],
    "eos_token": tokens[config["eos_token_id"]],
    "chat_template": field("tokenizer.chat_template"),
    "add_bos_token": bool(field("tokenizer.ggml.add_bos_token")) if "tokenizer.ggml.add_bos_token" in r.fields else False,
}
(out / "tokenizer_config.json").write_text(json.dumps(tok_config, ensure_ascii=False, indent=1))
print(f"wrote {out}: {len(tensors)} tensors, {len(tokens)} tokens")
