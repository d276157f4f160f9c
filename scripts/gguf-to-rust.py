#!/usr/bin/env python3
"""Writes the Rust module embedded/model-image compiles a GGUF model into (for the firmware and
the WebAssembly module): its `Config` as a `const`, each matrix as a (format, byte range, rows,
cols) of the GGUF bytes it `include_bytes!`s, and the norms as f32 arrays (exact, as bit
patterns). It builds borrowed `Matrix`es over those ranges at start; nothing is copied or
allocated.

Usage: PYTHONPATH=<llama.cpp>/gguf-py scripts/gguf-to-rust.py MODEL.gguf OUT.rs

Supports what sapient's GGUF loader supports for the `llama` and `qwen2` architectures (the same
keys and defaults as std-frontend/src/load/gguf_config.rs); the matrices may be in any format
the core reads in place.
"""
import struct
import sys

from gguf import GGUFReader

FORMATS = {
    "F32": "F32", "F16": "F16", "BF16": "BF16", "Q8_0": "Q8_0", "Q4_0": "Q4_0", "Q4_1": "Q4_1",
    "Q5_0": "Q5_0", "Q5_1": "Q5_1", "Q2_K": "Q2K", "Q3_K": "Q3K", "Q4_K": "Q4K", "Q5_K": "Q5K", "Q6_K": "Q6K",
}
LAYER_MATRICES = [("wq", "attn_q"), ("wk", "attn_k"), ("wv", "attn_v"), ("wo", "attn_output"),
                  ("w_gate", "ffn_gate"), ("w_up", "ffn_up"), ("w_down", "ffn_down")]


def value(reader, key):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def main(path, out_path):
    r = GGUFReader(path)
    arch = value(r, "general.architecture")
    rope_style = {"llama": "Adjacent", "qwen2": "Halves"}.get(arch)
    if rope_style is None:
        sys.exit(f"{path}: architecture {arch!r} is not llama or qwen2")
    tensors = {t.name: t for t in r.tensors}

    def key(k, default=None):
        v = value(r, f"{arch}.{k}")
        if v is None and default is None:
            sys.exit(f"{path}: GGUF key {arch}.{k} is missing")
        return default if v is None else v

    hidden, heads = key("embedding_length"), key("attention.head_count")
    kv_heads = key("attention.head_count_kv", heads)
    head_dim = key("attention.key_length", hidden // heads)
    vocab = value(r, f"{arch}.vocab_size") or int(tensors["token_embd.weight"].shape[1])
    layers = key("block_count")
    window = value(r, f"{arch}.attention.sliding_window")
    config = {
        "vocab_size": vocab, "hidden_size": hidden,
        "intermediate_size": key("feed_forward_length"), "n_layers": layers,
        "n_heads": heads, "n_kv_heads": kv_heads, "head_dim": head_dim,
        "rms_norm_eps": f32(key("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": f32(key("rope.freq_base", 10000.0)),
        "rope_style": f"RopeStyle::{rope_style}", "rope_scaling": "None",
        "tie_word_embeddings": str("output.weight" not in tensors).lower(),
        "qkv_bias": str("blk.0.attn_q.bias" in tensors).lower(),
        "sliding_window": "None" if window is None else f"Some({window})",
        "max_position_embeddings": key("context_length", 2048),
    }
    if "rope_freqs.weight" in tensors:
        sys.exit(f"{path}: rope_freqs.weight (Llama 3.1 frequency factors) is not written here")

    def matrix(name):
        t = tensors[name]
        kind = FORMATS.get(t.tensor_type.name)
        if kind is None:
            sys.exit(f"{path}: tensor {name} is {t.tensor_type.name}, which the core does not read")
        cols, rows = (int(d) for d in t.shape)
        return (f"Tensor {{ format: Format::{kind}, start: {t.data_offset}, "
                f"end: {t.data_offset + t.n_bytes}, rows: {rows}, cols: {cols} }}")

    def vector(name):
        t = tensors[name]
        if t.tensor_type.name != "F32":
            sys.exit(f"{path}: norm {name} is {t.tensor_type.name}, not F32")
        bits = ", ".join(f"f32::from_bits(0x{struct.unpack('<I', struct.pack('<f', v))[0]:08x})"
                         for v in t.data.tolist())
        return f"[{bits}]"

    out = [f"// Written by scripts/gguf-to-rust.py from {path.split('/')[-1]}; do not edit.",
           "pub const CONFIG: Config = Config {"]
    out += [f"    {k}: {v}," for k, v in config.items()]
    out += ["};", "",
            f"pub const EMBED: Tensor = {matrix('token_embd.weight')};",
            "pub const OUTPUT: Option<Tensor> = " + (
                f"Some({matrix('output.weight')});" if "output.weight" in tensors else "None;"),
            f"pub static NORM: [f32; {hidden}] = {vector('output_norm.weight')};", "",
            f"pub const LAYERS: [LayerTensors; {layers}] = ["]
    for i in range(layers):
        out.append("    LayerTensors {")
        out += [f"        {field}: {matrix(f'blk.{i}.{gguf}.weight')}," for field, gguf in LAYER_MATRICES]
        out.append("    },")
    out += ["];", "", f"pub static LAYER_NORMS: [[[f32; {hidden}]; 2]; {layers}] = ["]
    for i in range(layers):
        out.append(f"    [{vector(f'blk.{i}.attn_norm.weight')}, {vector(f'blk.{i}.ffn_norm.weight')}],")
    out.append("];")
    if config["qkv_bias"] == "true":
        sys.exit(f"{path}: q/k/v biases (Qwen2) are not written here")
    with open(out_path, "w") as f:
        f.write("\n".join(out) + "\n")


def f32(x):
    """A float literal that reads back as the f32 the file holds."""
    return f"f32::from_bits(0x{struct.unpack('<I', struct.pack('<f', x))[0]:08x})"


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
