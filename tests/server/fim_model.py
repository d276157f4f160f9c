"""Writes a model with fill-in-the-middle tokens for the server's FIM tests: SmolLM2's weights
and settings with StarCoder's vocabulary (llama.cpp's ggml-vocab-starcoder.gguf, which has
<fim_prefix>, <fim_suffix>, <fim_middle>), both 49152 tokens. Its text is not meaningful;
the tests compare it with `sapient generate --suffix` and check the routes' shapes.

usage: fim_model.py MODEL.gguf VOCAB.gguf OUT.gguf (gguf-py on PYTHONPATH)"""
import sys

from gguf import GGUFReader, GGUFValueType, GGUFWriter


def copy_field(writer, field):
    if field.name.startswith("GGUF.") or field.name == "general.architecture":
        return
    kind = field.types[0]
    sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
    writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)


def main():
    model_path, vocab_path, out = sys.argv[1:4]
    model, vocab = GGUFReader(model_path), GGUFReader(vocab_path)
    assert len(model.fields["tokenizer.ggml.tokens"].data) == len(vocab.fields["tokenizer.ggml.tokens"].data)
    writer = GGUFWriter(out, arch=model.fields["general.architecture"].contents())
    for field in model.fields.values():
        if not field.name.startswith("tokenizer."):
            copy_field(writer, field)
    for field in vocab.fields.values():
        if field.name.startswith("tokenizer."):
            copy_field(writer, field)
    for t in model.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in model.tensors:
        writer.write_tensor_data(t.data)
    writer.close()


if __name__ == "__main__":
    main()
