#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora under fuzz/corpus/<target>/seed-* (committed; what the
fuzzer adds beside them is git-ignored). Deterministic; standard library only.

Usage: scripts/fuzz-corpus.py SAPIENT_BINARY

- safetensors_config: tiny checkpoints (hidden 32, one layer, vocabulary 48) whose configs are the
  repository's fixtures' configs (llama, qwen2 with its biases, mistral, linear and YaRN RoPE
  scaling) shrunk, with f16 weights.
- load_forward, gguf_header: the same checkpoints written as GGUF by `sapient quantize` (q8_0, f16).
- gguf_tokenizer: small SentencePiece and byte-level BPE vocabularies in the target's line format,
  encoding the SmolLM2 reference prompts.
- chat_template: ChatML, Llama 2 and Llama 3 style templates with the reference prompts as
  messages.
- json_schema: schemas of the kinds structured-output clients send (nested objects, arrays,
  enums, Optional fields, recursive $refs, dictionaries, discriminated unions) with a value of
  each as the output.
- reply_parsing: replies with tool calls in each format, reasoning, and text that only looks so.
- grammar: GBNF grammars of each construct (strings, classes, negation, `.`, groups, the
  repetitions, comments, escapes) with a sentence of each as the output.
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
fixtures = os.environ.get("SAPIENT_FIXTURES", os.path.join(root, "tests", "fixtures"))
corpus = os.path.join(root, "fuzz", "corpus")
sapient = sys.argv[1]

SHAPE = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    vocab_size=48,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)


def seed(target, name, data):
    d = os.path.join(corpus, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def values(n, k):
    """n deterministic values in [-0.5, 0.5)."""
    return [math.sin(0.37 * i + k) * 0.5 for i in range(n)]


def tensors(config):
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q, kv = config["num_attention_heads"] * 16, config["num_key_value_heads"] * 16
    t = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h], "lm_head.weight": [v, h]}
    p = "model.layers.0."
    t.update({
        p + "input_layernorm.weight": [h],
        p + "post_attention_layernorm.weight": [h],
        p + "self_attn.q_proj.weight": [q, h],
        p + "self_attn.k_proj.weight": [kv, h],
        p + "self_attn.v_proj.weight": [kv, h],
        p + "self_attn.o_proj.weight": [h, q],
        p + "mlp.gate_proj.weight": [i, h],
        p + "mlp.up_proj.weight": [i, h],
        p + "mlp.down_proj.weight": [h, i],
    })
    if config.get("model_type") == "qwen2":
        t.update({p + "self_attn.q_proj.bias": [q], p + "self_attn.k_proj.bias": [kv],
                  p + "self_attn.v_proj.bias": [kv]})
    return t


def safetensors(config):
    header, data = {}, b""
    for k, (name, shape) in enumerate(sorted(tensors(config).items())):
        n = math.prod(shape)
        vals = [1.0 + x * 0.1 for x in values(n, k)] if name.endswith("norm.weight") else values(n, k)
        raw = struct.pack("<%de" % n, *vals)
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


prompts = [p["prompt"] for p in json.load(open(os.path.join(fixtures, "smollm2", "reference.json")))["prompts"]]

# The tiny fixtures' architectures, and RoPE scaling (linear, YaRN) from the repository's own.
checkpoints = [(arch, os.path.join(fixtures, "tiny", arch)) for arch in ["llama", "qwen2", "mistral"]]
checkpoints += [(name, os.path.join(root, "tests", "fixtures", "rope_scaling", name))
                for name in ["llama_linear_rope", "qwen2_yarn"]]

with tempfile.TemporaryDirectory() as tmp:
    for arch, path in checkpoints:
        config = json.load(open(os.path.join(path, "config.json")))
        config.update(SHAPE)
        config.pop("rope_scaling", None)
        text = json.dumps(config, indent=1).encode()
        st = safetensors(config)
        seed("safetensors_config", arch, struct.pack("<I", len(text)) + text + st)
        d = os.path.join(tmp, arch)
        os.makedirs(d)
        open(os.path.join(d, "config.json"), "wb").write(text)
        open(os.path.join(d, "model.safetensors"), "wb").write(st)
        for ty in ["q8_0", "f16"]:
            out = os.path.join(tmp, f"{arch}-{ty}.gguf")
            subprocess.run([sapient, "quantize", d, out, "--type", ty], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            data = open(out, "rb").read()
            seed("load_forward", f"{arch}-{ty}", data)
            seed("gguf_header", f"{arch}-{ty}", data)

# SentencePiece: the byte tokens, a few pieces with the space marker.
spm = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
spm += ["▁", "▁the", "▁a", "▁of", "the", "he", "th", "e", "t", "h", "▁T", "▁The", "▁capital"]
# Byte-level BPE: GPT-2's 256 stand-ins for the bytes, merges building a few words.
printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
stand_ins, extra = {}, 0
for b in range(256):
    stand_ins[b] = chr(b) if b in printable else chr(256 + extra)
    extra += b not in printable
bpe = [stand_ins[b] for b in range(256)]
merges = ["t h", "th e", "Ġ t", "Ġt he", "i s", "a n", "an d", "Ġ c", "Ġc a"]
bpe += ["th", "the", "Ġt", "Ġthe", "is", "an", "and", "Ġc", "Ġca", "<|im_start|>", "<|im_end|>"]
for i, text in enumerate(prompts[:3]):
    seed("gguf_tokenizer", f"spm-{i}", ("llama bos=1 unk=0\n" + "\n".join(spm) + "\n--\n--\n" + text).encode())
    seed("gguf_tokenizer", f"bpe-{i}",
         ("gpt2 pre=smollm\n" + "\n".join(bpe) + "\n--\n" + "\n".join(merges) + "\n--\n" + text).encode())

templates = {
    "chatml": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "llama2": "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'].strip() }} [/INST]"
              "{% elif m['role'] == 'assistant' %} {{ m['content'] }}{{ eos_token }}{% else %}"
              "{{ raise_exception('unknown role') }}{% endif %}{% endfor %}",
    "llama3": "{% set loop_messages = messages %}{% for message in loop_messages %}"
              "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}"
              "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
}
for name, t in templates.items():
    msgs = "\n".join(f"{r}: {p}" for r, p in zip(["system", "user", "assistant", "user"], prompts))
    seed("chat_template", name, (t + "\n--\n" + msgs).encode())

schemas = {
    "person": ({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "height": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "pet": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]},
        "mood": {"enum": ["happy", "sad", 1, None]}},
        "required": ["name", "age"], "additionalProperties": False,
        "$defs": {"Pet": {"type": "object", "properties": {"kind": {"const": "cat"}}}}},
        '{"name": "Ann\\u00e9", "age": 30, "pet": {"kind": "cat"}, "tags": ["a"], "mood": 1}'),
    "tree": ({"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#"}}}},
             '{"children": [{"children": []}, {}]}'),
    "dictionary": ({"type": "object", "properties": {"scores": {"type": "object",
                    "additionalProperties": {"type": ["integer", "null"]}}}},
                   '{"scores": {"a": 1, "b": null}}'),
    "union": ({"type": "object", "properties": {"pet": {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
         "required": ["kind", "lives"]},
        {"type": "object", "properties": {"kind": {"const": "dog"}}, "required": ["kind"]}]}}},
        '{"pet": {"kind": "cat", "lives": 9}}'),
}
for name, (schema, value) in schemas.items():
    seed("json_schema", name, (json.dumps(schema) + "\n--\n" + value).encode())

# A step size byte, then a reply: calls in each format, reasoning, and text that only looks so.
replies = {
    "hermes": 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "llama3": '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "b", "parameters": {}}',
    "python_tag": 'Checking.<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "mistral": '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]',
    "mistral_args": 'Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]b[ARGS]{}',
    "generic": '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}',
    "response": '  {"response": "It is sunny."}',
    "thinking": '<think>\nLet me see: 2 + 2.\n</think>\n\nThe answer is 4. </think> <tool_call>',
    "lookalike": 'Use <tool_ or </thi or [TOOL_CALL or <|python_ta, like <tool_call>{"oops": 1}',
}
for step, (name, text) in enumerate(replies.items()):
    seed("reply_parsing", name, bytes([step]) + text.encode())

grammars = {
    "arithmetic": ('root ::= expr\nexpr ::= term ([-+*/] term)*\nterm ::= [0-9]+ | "(" expr ")"\n',
                   "(1+23)*4"),
    "list": ('root ::= ("- " item)+ # a list\nitem ::= [^\\n]+ "\\n"\n', "- one\n- two\n"),
    "repeats": ('root ::= ("0x" [A-F0-9]{2} " "?){3,5} "é"? .{0,2}\n', "0xFF 0x12 0xABé\u2603"),
    "nested": ('root ::= (\n  "a" |\n  "b" ( "c" )*\n)+ [\\x41-\\u0042\\-]\n', "abccA"),
}
for name, (grammar, sentence) in grammars.items():
    seed("grammar", name, (grammar + "\n--\n" + sentence).encode())
