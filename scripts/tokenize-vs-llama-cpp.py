#!/usr/bin/env python3
"""`sapient tokenize` against llama.cpp's `llama-tokenize` on random texts.

Usage: scripts/tokenize-vs-llama-cpp.py SAPIENT LLAMA_TOKENIZE [--count N] [--seed S] GGUF...

Each text joins 1-8 pieces drawn from a fixed seed: words, numbers, runs of spaces, tabs and
newlines, contractions, special tokens' texts (`<s>`, `</s>`, `<|im_start|>`, `<|end|>`...),
CJK, Hangul, accents and combining marks, emoji with joiners, zero-width and no-break spaces,
SentencePiece's `▁`, code and URLs, or random ASCII and random code points. Both tools
tokenize it with special tokens recognized and no BOS (`llama-tokenize --no-escape`, so a
backslash is a backslash); every text whose ids differ is printed, and the exit status is 1
if any did. llama.cpp's test vocabularies are in the source `scripts/fetch-llama-cpp.sh`
fetches (`models/ggml-vocab-*.gguf`), `llama-tokenize` is a target of its CMake build.

Known differences, where sapient follows Hugging Face's tokenizers and llama.cpp 0.3.36 does
not: llama.cpp makes a normal `</s>` token a control token (Qwen2 and Qwen3.5 vocabularies),
and its regexes split a no-break space before U+3000 differently under deepseek-llm's
pre-tokenizer.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

PIECES = [
    "Hello", " world", "  ", "\n", "\n\n", "\t", "   \n ", "123", "4567890", "3.14", "'s", "'ll",
    "n't", " <s>", "</s>", "<unk>", "<|endoftext|>", "<|im_start|>", "<|end|>", "日本語",
    "中文字符", "한국어", "Ñandú", "café", "naïve", "e\u0301", "🙂", "👨‍👩‍👧", "🏳️‍🌈", "\u200b",
    "\u00a0", "ﬁ", "Ⅻ", "ß", "İ", "Ω", "ǅ", "ꙮ", "\U0001F600\U0001F601",
    "def f(x):\n    return x*2", "http://example.com/a?b=c", "$$\\frac{a}{b}$$", "<<<>>>",
    "!!!???", "...", "—", "…", "\r\n", " \u3000 ", "ABCdef", "CamelCaseWord", "snake_case_word",
    "  leading", "trailing  ", "▁", "▁▁x", "<0x0A>", "a\\nb",
]


def random_text(rng):
    out = []
    for _ in range(rng.randint(1, 8)):
        r = rng.random()
        if r < 0.6:
            out.append(rng.choice(PIECES))
        elif r < 0.8:
            out.append("".join(chr(rng.randint(32, 126)) for _ in range(rng.randint(1, 10))))
        else:
            ranges = [(0xA0, 0x2FFF), (0x3000, 0x9FFF), (0x1F300, 0x1FAFF)]
            out.append("".join(chr(rng.randint(*rng.choice(ranges)))
                               for _ in range(rng.randint(1, 4))))
    return "".join(out)


def ids(cmd):
    p = subprocess.run(cmd, capture_output=True)
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {p.stderr.decode(errors='replace')[-300:]}")
    return p.stdout.decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sapient")
    ap.add_argument("llama_tokenize")
    ap.add_argument("ggufs", nargs="+")
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    differ = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "text.txt")
        for gguf in a.ggufs:
            rng = random.Random(a.seed)
            bad = 0
            for _ in range(a.count):
                text = random_text(rng)
                with open(path, "w", encoding="utf-8", newline="") as f:
                    f.write(text)
                want = json.loads(ids([a.llama_tokenize, "-m", gguf, "-f", path, "--ids",
                                       "--no-bos", "--no-escape", "--log-disable"])
                                  .strip().splitlines()[-1])
                got = json.loads(ids([a.sapient, "tokenize", "-m", gguf, "-f", path, "--no-bos",
                                      "--format", "json"]))["ids"]
                if got != want:
                    bad += 1
                    print(f"{os.path.basename(gguf)}: {text!r}\n  llama.cpp {want}\n  sapient   {got}")
            print(f"{os.path.basename(gguf)}: {a.count - bad} of {a.count} texts the same")
            differ += bad
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
