#!/usr/bin/env python3
"""llama-server's own routes through `sapient serve`: `/infill` (fill in the middle, as
llama.vim and llama.vscode call it) with OpenAI's `suffix` on the completions route beside it,
and `/completion`.

Usage: tests/server/native_routes.py SAPIENT_BINARY FIM_MODEL.gguf PLAIN_MODEL.gguf

FIM_MODEL has fill-in-the-middle tokens (tests/server/fim_model.py writes one); PLAIN_MODEL has
none. Greedy middles and continuations equal `sapient generate`'s (`--suffix` for middles),
whole and streamed; the answers have llama-server's shape; the context, stop strings and token
limits reach them; every malformed field is a 400 naming it.
"""
import json
import subprocess
import sys
import urllib.error
import urllib.request

import openai
from openai import OpenAI

import serve_process

BIN, FIM_MODEL, PLAIN_MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
NAME = "coder"
PREFIX = "def fibonacci(n):\n    "
SUFFIX = "\n\nprint(fibonacci(10))\n"


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def post(port, path, body):
    """POSTs `body` as JSON; returns (status, parsed JSON)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def events(port, path, body):
    """The `data:` objects of a streamed answer, and whether it ended with `[DONE]`."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        data = [line[6:] for line in r.read().decode().splitlines() if line.startswith("data: ")]
    done = bool(data) and data[-1] == "[DONE]"
    return [json.loads(d) for d in data if d != "[DONE]"], done


def generated(model, n, *extra):
    """`sapient generate` greedy: (text, prompt ids, generated ids)."""
    out = subprocess.run([BIN, "generate", "-m", model, "-t", "2", "--temperature", "0", "-n", str(n),
                          "--format", "json", *extra], capture_output=True, text=True, timeout=120, check=True)
    r = json.loads(out.stdout)
    return r["text"], r["prompt_ids"], r["generated_ids"]


want_text, want_prompt, want_ids = generated(FIM_MODEL, 24, "-p", PREFIX, "--suffix", SUFFIX, "--ctx", "1024")

with serve_process.served(BIN, FIM_MODEL, NAME, "--ctx", "1024", "--parallel", "2") as port:
    base = dict(input_prefix=PREFIX, input_suffix=SUFFIX, temperature=0, n_predict=24)
    status, r = post(port, "/infill", base)
    check(status == 200 and r["content"] == want_text, "/infill: the middle sapient generate --suffix writes")
    check(r["stop"] is True and r["stop_type"] in ("eos", "limit") and r["truncated"] is False and
          r["tokens_evaluated"] == len(want_prompt) and r["tokens_predicted"] == len(want_ids) and
          r["model"] == NAME, f"/infill: llama.cpp's fields ({r['stop_type']}, {r['tokens_evaluated']} evaluated)")
    chunks, done = events(port, "/infill", base | {"stream": True})
    check("".join(c["content"] for c in chunks) == want_text and not done and chunks[-1]["stop"] is True and
          all(c["stop"] is False for c in chunks[:-1]) and chunks[-1]["tokens_predicted"] == len(want_ids),
          "/infill streamed: the same middle, llama.cpp's chunks, no [DONE]")
    status, limited = post(port, "/infill", base | {"n_predict": 3})
    check(status == 200 and limited["tokens_predicted"] == 3 and limited["stop_type"] == "limit",
          "/infill n_predict: the limit, stop_type limit")
    unlimited = post(port, "/infill", base | {"n_predict": -1, "model": NAME})[1]
    check(unlimited["content"].startswith(want_text) or want_text.startswith(unlimited["content"]),
          "/infill n_predict -1: no limit but the context's (and a model field is optional)")
    if len(want_text) > 4:
        word = want_text[2:4]
        worded = post(port, "/infill", base | {"stop": [word]})[1]
        check(worded["stop_type"] == "word" and worded["content"] == want_text[:want_text.index(word)],
              f"/infill stop {word!r}: the middle up to it, stop_type word")
    extra = [{"filename": "util.py", "text": "def helper():\n    return 1\n"}, {"text": "X = 2\n"}]
    with_extra = post(port, "/infill", base | {"input_extra": extra})[1]
    check(with_extra["tokens_evaluated"] > r["tokens_evaluated"] + 10,
          "/infill input_extra: the other files go into the prompt")
    started = post(port, "/infill", base | {"prompt": "if n < 2:"})[1]
    check(started["tokens_evaluated"] > r["tokens_evaluated"], "/infill prompt: the middle's start goes into the prompt")
    long_prefix = "".join(f"x{i} = {i}\n" for i in range(2000))
    cut = post(port, "/infill", base | {"input_prefix": long_prefix, "n_predict": 8})[1]
    check(cut["truncated"] is True and cut["tokens_evaluated"] <= 1024 - 8,
          f"/infill: a prefix longer than the context is cut ({cut['tokens_evaluated']} tokens)")

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    c = client.completions.create(model=NAME, prompt=PREFIX, suffix=SUFFIX, temperature=0, max_tokens=24)
    check(c.choices[0].text == want_text and c.usage.prompt_tokens == len(want_prompt),
          "completions with suffix: the same middle (openai client)")
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(
        model=NAME, prompt=PREFIX, suffix=SUFFIX, temperature=0, max_tokens=24, stream=True) if ch.choices)
    check(streamed == want_text, "completions with suffix, streamed: the same middle")

    bad = [
        ("/infill", {"input_prefix": 3}, "input_prefix"),
        ("/infill", {"input_extra": "x"}, "input_extra"),
        ("/infill", {"input_extra": [{"filename": "a"}]}, "input_extra"),
        ("/infill", {"n_predict": 0}, "n_predict"),
        ("/infill", {"n_predict": "many"}, "n_predict"),
        ("/infill", {"n_probs": 3}, "n_probs"),
        ("/infill", {"echo": True}, "echo"),
        ("/infill", {"n": 2}, "n = 1"),
        ("/infill", {"temperature": -1}, "temperature"),
        ("/v1/completions", {"model": NAME, "prompt": "x", "suffix": 5}, "suffix"),
        ("/v1/completions", {"model": NAME, "prompt": [1, 2], "suffix": "y"}, "token ids"),
        ("/v1/completions", {"model": NAME, "prompt": "x", "suffix": "y", "echo": True}, "echo"),
    ]
    for path, body, word in bad:
        status, e = post(port, path, body)
        check(status == 400 and word in e["error"]["message"], f"{path} {body}: 400 naming {word!r}")
    status, e = post(port, "/infill", {"model": "other", "input_prefix": "x"})
    check(status == 404, "/infill naming another model: 404")

with serve_process.served(BIN, PLAIN_MODEL, NAME, "--ctx", "512") as port:
    for path, body in [("/infill", {"input_prefix": "x", "input_suffix": "y"}),
                       ("/v1/completions", {"model": NAME, "prompt": "x", "suffix": "y"})]:
        status, e = post(port, path, body)
        check(status == 400 and "fill-in-the-middle" in e["error"]["message"],
              f"{path} on a model without FIM tokens: 400 saying so")

    # /completion: a prompt's continuation in llama-server's shape.
    prompt = "The three primary colors are"
    text, prompt_ids, ids = generated(PLAIN_MODEL, 16, "-p", prompt, "--ctx", "512")
    base = {"prompt": prompt, "temperature": 0, "n_predict": 16}
    status, r = post(port, "/completion", base)
    check(status == 200 and r["content"] == text and r["tokens_evaluated"] == len(prompt_ids) and
          r["tokens_predicted"] == len(ids) and r["stop"] is True and r["stop_type"] in ("eos", "limit"),
          "/completion: sapient generate's continuation, llama-server's fields")
    check(post(port, "/completions", base)[1]["content"] == text, "/completions: the same route")
    check(post(port, "/completion", base | {"prompt": prompt_ids})[1]["content"] == text,
          "/completion: the prompt as token ids")
    chunks, done = events(port, "/completion", base | {"stream": True})
    check("".join(c["content"] for c in chunks) == text and not done and chunks[-1]["stop"] is True,
          "/completion streamed: the same text, no [DONE]")
    for body, word in [({"n_predict": 16}, "prompt"), (base | {"n_probs": 2}, "n_probs"),
                       (base | {"prompt": []}, "prompt"), (base | {"model": "other"}, "model")]:
        status, e = post(port, "/completion", body)
        check(status in (400, 404) and word in e["error"]["message"], f"/completion {body}: {status} naming {word!r}")
out = subprocess.run([BIN, "generate", "-m", PLAIN_MODEL, "-p", "x", "--suffix", "y"],
                     capture_output=True, text=True, timeout=60)
check(out.returncode != 0 and "fill-in-the-middle" in out.stderr,
      "generate --suffix on a model without FIM tokens: an error saying so")
print("all llama-server route checks passed")
