"""Writes a vocabulary-only GGUF of Mistral's Tekken tokenizer (Mistral NeMo's `tekken.json`, as
mistral_common ships it) the way llama.cpp's converter writes Mistral-format models, and test
cases in llama.cpp's `test-tokenizer-0` layout: the inputs (`.inp`, each case followed by
`\\n__ggml_vocab_test__\\n`) and the ids mistral_common's Tekkenizer gives them (`.out`).

Usage: python tekken-vocab.py LLAMA_CPP_SRC TEXT_FILE OUT_DIR
(LLAMA_CPP_SRC for its gguf-py and test inputs; TEXT_FILE's paragraphs are cases too.)
"""
import glob
import pathlib
import shutil
import sys
import tempfile

src, text_file, out = (pathlib.Path(a) for a in sys.argv[1:4])
sys.path.insert(0, str(src / "gguf-py"))
import gguf  # noqa: E402
import mistral_common  # noqa: E402
from gguf.vocab import MistralTokenizerType, MistralVocab  # noqa: E402

with tempfile.TemporaryDirectory() as model:
    data = pathlib.Path(mistral_common.__file__).parent / "data"
    shutil.copy(data / "tekken_240718.json", pathlib.Path(model) / "tekken.json")
    vocab = MistralVocab(pathlib.Path(model))
assert vocab.tokenizer_type == MistralTokenizerType.tekken

# As llama.cpp's conversion/base.py `_set_vocab_mistral` writes it.
out.mkdir(parents=True, exist_ok=True)
w = gguf.GGUFWriter(str(out / "ggml-vocab-tekken.gguf"), "llama")
tokens, scores, types = zip(*vocab.all_tokens())
w.add_tokenizer_model(vocab.gguf_tokenizer_model)
w.add_tokenizer_pre("tekken")
w.add_token_merges(vocab.extract_vocab_merges_from_model())
w.add_bos_token_id(vocab.bos_id)
w.add_eos_token_id(vocab.eos_id)
w.add_unk_token_id(vocab.unk_id)
w.add_pad_token_id(vocab.pad_id)
w.add_token_list(list(tokens))
w.add_token_scores(list(scores))
w.add_token_types(list(types))
w.add_vocab_size(vocab.vocab_size)
w.add_add_bos_token(True)
w.add_add_eos_token(False)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()

sep = "\n__ggml_vocab_test__\n"
texts = []
for f in sorted(glob.glob(str(src / "models" / "ggml-vocab-*.gguf.inp"))):
    cases = open(f, encoding="utf-8", newline="").read().split(sep)
    texts += cases[:-1] if cases[-1] == "" else cases
paragraphs = open(text_file, encoding="utf-8", newline="").read().split("\n\n")
texts += [p for p in paragraphs[:120] if p.strip()]
texts += [
    "Tekken: naïve café, Größe, ÉCOLE, İstanbul, ǅemal, ᾈ, ﬁ ligature",
    "Привет, мир! Καλημέρα κόσμε. مرحبا بالعالم. שלום עולם. नमस्ते दुनिया.",
    "日本語のテキストと中文文本，还有한국어 텍스트。",
    "def f(x):\r\n\treturn x**2  # 12345678901234567890\n\n\n   trailing   ",
    "CamelCaseWord HTTPServer iPhone XMLHttpRequest McDonald's O'NEIL'S",
    "emoji 🦙🔥👍🏽 and ZWJ 👨‍👩‍👧‍👦 \u00a0nbsp\u2009thin\u3000ideographic",
    "path/to/file.rs\n//comment\r\n/* block */ a/b/c ///",
    "   leading spaces\tand\ttabs\n\n\nand newlines\r\r\n",
]
seen = set()
cases = [t for t in texts if not (t in seen or seen.add(t))]
tekkenizer = vocab.tokenizer
with open(out / "ggml-vocab-tekken.gguf.inp", "w", encoding="utf-8", newline="") as inp:
    inp.write("".join(t + sep for t in cases))
with open(out / "ggml-vocab-tekken.gguf.out", "w", encoding="utf-8", newline="") as ids:
    for t in cases:
        ids.write(" ".join(map(str, tekkenizer.encode(t, bos=False, eos=False))) + "\n")
print(f"{len(cases)} cases, {vocab.vocab_size} tokens", file=sys.stderr)
