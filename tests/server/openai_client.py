#!/usr/bin/env python3
"""`sapient serve` driven by the official `openai` Python client, on loopback.

Usage: tests/server/openai_client.py SAPIENT_BINARY MODEL.gguf

Checks chat and completions (streamed and not), embeddings and models; greedy results equal to
`sapient generate` / `sapient embed` (with penalties too; logit_bias); every error case with its status and OpenAI error object;
32 concurrent streams with --parallel 8 each equal to the same request alone (slots reused, their
cached prompt starts too); a prompt extending an earlier one prefilled from the cached start;
cancelled streams freeing their slots (/metrics); a graceful exit on SIGTERM. Every wait is
bounded.
"""
import concurrent.futures
import json
import math
import re
import signal
import subprocess
import sys
import time
import typing
import urllib.error
import urllib.request

import openai
import pydantic
from openai import OpenAI

import serve_process

BIN, MODEL = sys.argv[1], sys.argv[2]
KEY = "test-key"
NAME = "smollm2"


def start(*extra):
    return serve_process.start(BIN, MODEL, NAME, *extra)


def raw(port, path, body, key=KEY):
    """POSTs `body` (bytes) and returns (status, parsed JSON)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST")
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.load(e), e.headers


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def cli(*args):
    out = subprocess.run([BIN, *args, "-m", MODEL, "--format", "json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


proc, port = start("--parallel", "8", "--api-key", KEY, "--ctx", "512", "--queue", "64")
client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=120)
try:
    models = client.models.list()
    check([m.id for m in models.data] == [NAME], "GET /v1/models lists the model")

    prompt = "The capital of France is"
    want = cli("generate", "-p", prompt, "-n", "16", "--temperature", "0")["text"]
    got = client.completions.create(model=NAME, prompt=prompt, max_tokens=16, temperature=0)
    check(got.choices[0].text == want, f"completion equals sapient generate ({want!r})")
    check(got.usage.completion_tokens == 16 and got.choices[0].finish_reason == "length", "completion usage and finish")
    streamed = "".join(
        c.choices[0].text for c in client.completions.create(
            model=NAME, prompt=prompt, max_tokens=16, temperature=0, stream=True) if c.choices)
    check(streamed == want, "streamed completion equals the whole one")
    # The next turn resends the text so far: a slot still holds its start, only the rest is run.
    cached_before = metrics(port)["sapient:prompt_tokens_cached_total"]
    longer = prompt + want
    want_longer = cli("generate", "-p", longer, "-n", "8", "--temperature", "0")["text"]
    got_longer = client.completions.create(model=NAME, prompt=longer, max_tokens=8, temperature=0)
    check(got_longer.choices[0].text == want_longer, "a prompt extending an earlier one equals sapient generate")
    check(metrics(port)["sapient:prompt_tokens_cached_total"] >= cached_before + 6,
          "its start came from the earlier request's KV slot (/metrics)")

    # Sampling controls beyond temperature: greedy with penalties is deterministic, so the server
    # and the CLI must agree, and differ from the plain answer.
    penalized = cli("generate", "-p", prompt, "-n", "16", "--temperature", "0",
                    "--presence-penalty", "1.5", "--frequency-penalty", "0.5")["text"]
    got = client.completions.create(model=NAME, prompt=prompt, max_tokens=16, temperature=0,
                                    presence_penalty=1.5, frequency_penalty=0.5)
    check(got.choices[0].text == penalized != want,
          f"presence and frequency penalties equal sapient generate's ({penalized!r})")
    # llama-server's samplers beyond: XTC (every draw excludes its top choices), top-n-sigma
    # (a sliver of a deviation leaves the largest logit alone: greedy at any temperature),
    # typical sampling, DRY and mirostat, each as `sapient generate`'s flags give it for the
    # same seed.
    for label, fields, flags in [
        ("xtc", {"xtc_probability": 1.0, "xtc_threshold": 0.05},
         ["--xtc-probability", "1", "--xtc-threshold", "0.05"]),
        ("top_n_sigma", {"top_n_sigma": 0.001}, ["--top-nsigma", "0.001"]),
        ("typical_p", {"typical_p": 0.3}, ["--typical", "0.3"]),
        ("dry", {"dry_multiplier": 0.8, "dry_allowed_length": 1, "dry_penalty_last_n": 64},
         ["--dry-multiplier", "0.8", "--dry-allowed-length", "1", "--dry-penalty-last-n", "64"]),
        ("dry with breakers", {"dry_multiplier": 0.8, "dry_sequence_breakers": [" the", "."]},
         ["--dry-multiplier", "0.8", "--dry-sequence-breaker", " the", "--dry-sequence-breaker", "."]),
        ("mirostat 2", {"mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.2},
         ["--mirostat", "2", "--mirostat-ent", "3", "--mirostat-lr", "0.2"]),
        ("mirostat 1", {"mirostat": 1, "mirostat_tau": 4.0}, ["--mirostat", "1", "--mirostat-ent", "4"]),
    ]:
        extra = dict(fields, top_k=0, min_p=0.0)
        served = client.completions.create(model=NAME, prompt=prompt, max_tokens=16, temperature=1.5,
                                           top_p=1.0, seed=7, extra_body=extra).choices[0].text
        generated = cli("generate", "-p", prompt, "-n", "16", "--temperature", "1.5", "--top-k", "0",
                        "--top-p", "1", "--min-p", "0", "--seed", "7", *flags)["text"]
        check(served == generated, f"{label}: as sapient generate gives it ({served!r})")
        if label == "xtc":
            check(served != want, "xtc: the greedy answer's top choices excluded")
        if label == "top_n_sigma":
            check(served == want, "top_n_sigma: only the largest logit left, the greedy answer")
    # DRY against a loop: greedy repeats "one two three", DRY takes the repetition's next token
    # down.
    loop = "one two three one two three one two three one two"
    plain = client.completions.create(model=NAME, prompt=loop, max_tokens=2, temperature=0).choices[0].text
    dry = client.completions.create(model=NAME, prompt=loop, max_tokens=2, temperature=0,
                                    extra_body={"dry_multiplier": 2.0}).choices[0].text
    check(plain.startswith(" three") and not dry.startswith(" three"),
          f"dry: the loop broken ({plain!r} -> {dry!r})")
    for bad in [{"typical_p": 0}, {"xtc_probability": 2}, {"xtc_threshold": -1}, {"top_n_sigma": "x"},
                {"dry_base": 0.5}, {"dry_penalty_last_n": -2}, {"dry_sequence_breakers": [""]},
                {"dry_sequence_breakers": "x"}, {"dry_multiplier": -1}, {"mirostat": 3},
                {"mirostat": 1.5}, {"mirostat_tau": -1}]:
        request = json.dumps(dict(model=NAME, prompt=prompt, max_tokens=2, **bad)).encode()
        status, err, _ = raw(port, "/v1/completions", request)
        check(status == 400 and list(bad)[0] in err["error"]["message"],
              f"{bad}: 400 naming the field ({err['error']['message']})")
    comma = cli("tokenize", "-p", ",", "--no-bos")["ids"]
    biased = client.completions.create(model=NAME, prompt=prompt, max_tokens=4, temperature=0,
                                       logit_bias={str(comma[0]): 100})
    check(comma == [comma[0]] and biased.choices[0].text == ",,,,", "logit_bias +100 forces its token")

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    whole = client.chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=24)
    text = whole.choices[0].message.content
    check(bool(text) and whole.choices[0].finish_reason in ("stop", "length"), f"chat completion ({text!r})")
    chunks = list(client.chat.completions.create(
        model=NAME, messages=messages, temperature=0, max_tokens=24, stream=True,
        stream_options={"include_usage": True}))
    check("".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text,
          "streamed chat equals the whole one")
    check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens,
          "the last streamed chunk carries the usage")
    # The same prompt again: all of it but the last token is in a slot's cache already.
    again = client.chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=24)
    cached = [u.prompt_tokens_details.cached_tokens for u in (chunks[-1].usage, again.usage)]
    check(cached == [whole.usage.prompt_tokens - 1] * 2,
          f"usage.prompt_tokens_details.cached_tokens: the prompt found in the cache ({cached})")
    stops_before = metrics(port)['sapient:request_success_total{finished_reason="stop"}']
    stopped = client.chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=24, stop=["Paris"])
    check("Paris" not in stopped.choices[0].message.content and stopped.choices[0].finish_reason == "stop",
          "a stop string ends the reply before it")
    deadline = time.time() + 10
    while metrics(port)['sapient:request_success_total{finished_reason="stop"}'] == stops_before and time.time() < deadline:
        time.sleep(0.05)
    check(metrics(port)['sapient:request_success_total{finished_reason="stop"}'] == stops_before + 1,
          "a request a stop string ended counts as stopped (/metrics)")

    # logprobs: the log-softmax of the model's own logits at each generated position, as
    # `sapient logits` gives them for the prompt and the tokens before.
    gen = cli("generate", "-p", prompt, "-n", "4", "--temperature", "0")
    out = subprocess.run([BIN, "logits", "-m", MODEL, "--all-positions", "--prompt-ids",
                          ",".join(map(str, gen["prompt_ids"] + gen["generated_ids"][:3]))],
                         capture_output=True, text=True, timeout=120)
    rows = json.loads(out.stdout)["logits"][-4:]

    def log_softmax(row):
        top = max(row)
        norm = top + math.log(sum(math.exp(v - top) for v in row))
        return [v - norm for v in row]

    want_lp = [log_softmax(r) for r in rows]
    lp = client.completions.create(model=NAME, prompt=prompt, max_tokens=4, temperature=0, logprobs=3).choices[0]
    check(lp.text == gen["text"] and "".join(lp.logprobs.tokens) == lp.text,
          "completion logprobs: the tokens put together are the text")
    check(all(abs(got - want_lp[i][t]) < 1e-4 for i, (got, t) in
              enumerate(zip(lp.logprobs.token_logprobs, gen["generated_ids"]))),
          f"completion logprobs equal the log-softmax of sapient logits ({lp.logprobs.token_logprobs})")
    check(all(len(top) == 3 and max(top.values()) == top[tok] and abs(top[tok] - got) < 1e-6
              for top, tok, got in zip(lp.logprobs.top_logprobs, lp.logprobs.tokens, lp.logprobs.token_logprobs)),
          "completion top_logprobs: three, the greedy token the likeliest")
    check(lp.logprobs.text_offset == [len("".join(lp.logprobs.tokens[:i])) for i in range(4)],
          "completion text_offset: where each token starts")
    streamed = [c.choices[0].logprobs for c in client.completions.create(
        model=NAME, prompt=prompt, max_tokens=4, temperature=0, logprobs=3, stream=True)
        if c.choices and c.choices[0].logprobs]
    check(sum((s.token_logprobs for s in streamed), []) == lp.logprobs.token_logprobs,
          "streamed completion logprobs equal the whole answer's")
    chat = client.chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=8,
                                          logprobs=True, top_logprobs=2).choices[0]
    content = chat.logprobs.content
    check("".join(t.token for t in content) == chat.message.content and
          all(bytes(t.bytes) == t.token.encode() and len(t.top_logprobs) == 2 and
              t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob and
              t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob for t in content),
          "chat logprobs: tokens, bytes and top_logprobs of the reply")
    streamed = [t for c in client.chat.completions.create(
        model=NAME, messages=messages, temperature=0, max_tokens=8, logprobs=True, top_logprobs=2, stream=True)
        if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    check([(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content],
          "streamed chat logprobs equal the whole answer's")
    stopped = client.chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=24,
                                             stop=["Paris"], logprobs=True).choices[0]
    tokens = [t.token for t in stopped.logprobs.content]
    check("".join(tokens).startswith(stopped.message.content) and
          len("".join(tokens[:-1])) < len(stopped.message.content) and "Paris" not in "".join(tokens[:-1]),
          f"logprobs end with the token the stop string starts in ({tokens[-2:]})")
    for route, body in [("/v1/chat/completions", {"messages": messages, "logprobs": True, "top_logprobs": 21}),
                        ("/v1/chat/completions", {"messages": messages, "top_logprobs": 2}),
                        ("/v1/chat/completions", {"messages": messages, "logprobs": 5}),
                        ("/v1/completions", {"prompt": "x", "logprobs": True})]:
        status, err, _ = raw(port, route, json.dumps({"model": NAME, **body}).encode())
        check(status == 400 and "logprobs" in err["error"]["message"], f"{route} {body}: 400 naming logprobs")

    # echo with logprobs, as evaluation harnesses score a text (lm-evaluation-harness's
    # loglikelihood): the prompt's tokens' log-probabilities, max_tokens 0, over several prompt
    # chunks, equal to the log-softmax of sapient logits at each position.
    scored = "The quick brown fox jumps over the lazy dog. " * 4 + "Paris is the capital of France."
    scored_ids = cli("tokenize", "-p", scored)["ids"]
    out = subprocess.run([BIN, "logits", "-m", MODEL, "--all-positions", "--prompt-ids",
                          ",".join(map(str, scored_ids))], capture_output=True, text=True, timeout=120)
    rows = json.loads(out.stdout)["logits"]
    want_scores = [log_softmax(rows[k - 1])[scored_ids[k]] for k in range(1, len(scored_ids))]
    echoed = client.completions.create(model=NAME, prompt=scored, max_tokens=0, echo=True, logprobs=1,
                                       temperature=0).choices[0]
    lps = echoed.logprobs
    check(len(scored_ids) > 40 and echoed.text == scored and "".join(lps.tokens) == scored and
          lps.token_logprobs[0] is None and lps.top_logprobs[0] is None and
          max(abs(a - b) for a, b in zip(lps.token_logprobs[1:], want_scores)) < 1e-4 and
          len(lps.token_logprobs) == len(scored_ids) and echoed.finish_reason == "length",
          f"echo, max_tokens 0: the prompt's {len(scored_ids)} tokens scored as sapient logits gives them")
    both = client.completions.create(model=NAME, prompt=[gen["prompt_ids"]], max_tokens=4, echo=True,
                                     logprobs=2, temperature=0).choices[0]
    check(both.text == prompt + gen["text"] and both.logprobs.token_logprobs[-4:] == lp.logprobs.token_logprobs
          and both.logprobs.text_offset[5:] == [len(prompt) + o for o in lp.logprobs.text_offset],
          "echo with token ids and generation: the prompt, then the same tokens and logprobs as without it")
    # Streamed, the prompt comes first in a chunk of its own (with its tokens' logprobs), then
    # the generated text: the whole answer's text and logprobs, piece by piece.
    for n in [1, 2]:
        parts, tokens, logprobs, offsets = {}, {}, {}, {}
        for chunk in client.completions.create(model=NAME, prompt=scored, max_tokens=6, echo=True, logprobs=2,
                                               temperature=0, stream=True, n=n):
            for c in chunk.choices:
                parts.setdefault(c.index, []).append(c.text)
                if c.logprobs:
                    tokens.setdefault(c.index, []).extend(c.logprobs.tokens)
                    logprobs.setdefault(c.index, []).extend(c.logprobs.token_logprobs)
                    offsets.setdefault(c.index, []).extend(c.logprobs.text_offset)
        echo_whole = client.completions.create(model=NAME, prompt=scored, max_tokens=6, echo=True, logprobs=2,
                                          temperature=0).choices[0]
        firsts = [next(p for p in parts[i] if p) for i in range(n)]
        want = echo_whole.logprobs
        check(all("".join(parts[i]) == echo_whole.text and firsts[i] == scored and tokens[i] == want.tokens
                  and logprobs[i] == want.token_logprobs and offsets[i] == want.text_offset for i in range(n)),
              f"echo streamed ({n} choice{'s' * (n > 1)}): the prompt's chunk first, then the whole answer's "
              "text and logprobs piece by piece")
    plain = "".join(c.choices[0].text for c in client.completions.create(
        model=NAME, prompt=prompt, max_tokens=4, echo=True, temperature=0, stream=True))
    check(plain == prompt + client.completions.create(model=NAME, prompt=prompt, max_tokens=4,
                                                      temperature=0).choices[0].text,
          "echo streamed without logprobs: the prompt, then the text")
    for route, body in [("/v1/chat/completions", {"messages": messages, "echo": True}),
                        ("/v1/completions", {"prompt": "x", "max_tokens": 0})]:
        status, err, _ = raw(port, route, json.dumps({"model": NAME, **body}).encode())
        check(status == 400 and ("echo" in err["error"]["message"] or "max_tokens" in err["error"]["message"]),
              f"{route} {body}: 400 ({err['error']['message']!r})")

    # n choices: choice i is the request alone with seed + i; usage counts every choice's tokens.
    three = client.completions.create(model=NAME, prompt=prompt, max_tokens=8, temperature=1.0, seed=5, n=3)
    alone = [client.completions.create(model=NAME, prompt=prompt, max_tokens=8, temperature=1.0,
                                       seed=5 + i).choices[0].text for i in range(3)]
    check([c.index for c in three.choices] == [0, 1, 2] and [c.text for c in three.choices] == alone and
          len(set(alone)) > 1 and three.usage.completion_tokens == 24,
          "n=3: each choice equals the request alone with seed + i")
    texts = ["", "", ""]
    finished = []
    for c in client.completions.create(model=NAME, prompt=prompt, max_tokens=8, temperature=1.0, seed=5, n=3,
                                       stream=True, stream_options={"include_usage": True}):
        for ch in c.choices:
            texts[ch.index] += ch.text
            if ch.finish_reason:
                finished.append(ch.index)
        usage = c.usage or None
    check(texts == alone and sorted(finished) == [0, 1, 2] and usage.completion_tokens == 24,
          "n=3 streamed: each choice's chunks make the same texts, each finishes, usage counts all")
    parts, reasons = ["", ""], ["", ""]
    for c in client.chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=24,
                                            stop=["Paris"], n=2, stream=True):
        for ch in c.choices:
            parts[ch.index] += ch.delta.content or ""
            reasons[ch.index] = ch.finish_reason or reasons[ch.index]
    check(parts == [stopped.message.content] * 2 and reasons == ["stop", "stop"],
          "n=2 streamed chat with a stop string: both choices stop before it")
    for body in [{"n": 17}, {"n": 0}]:
        status, err, _ = raw(port, "/v1/completions", json.dumps({"model": NAME, "prompt": "x", **body}).encode())
        check(status == 400 and "n" in err["error"]["message"], f"{body}: 400 ({err['error']['message']!r})")

    # Tools the request forbids the model to call are no obstacle: the plain answer.
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    unused = client.chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=24,
                                            tools=[tool], tool_choice="none")
    check(unused.choices[0].message.content == text, "tools with tool_choice none: the answer without them")

    # /tokenize and /detokenize, in llama-server's and vLLM's shapes.
    ids = cli("tokenize", "-p", prompt)["ids"]
    status, tk, _ = raw(port, "/tokenize", json.dumps({"content": prompt}).encode())
    check(status == 200 and tk["tokens"] == ids and tk["count"] == len(ids) and tk["max_model_len"] == 512,
          "/tokenize: the ids sapient tokenize gives")
    status, tk, _ = raw(port, "/tokenize", json.dumps({"model": NAME, "messages": messages}).encode())
    check(status == 200 and tk["count"] == whole.usage.prompt_tokens, "/tokenize of messages: the chat's prompt tokens")
    status, tk, _ = raw(port, "/tokenize", json.dumps({"content": prompt, "with_pieces": True}).encode())
    check("".join(t["piece"] for t in tk["tokens"]) == prompt, "/tokenize with_pieces: the pieces make the text")
    status, dt, _ = raw(port, "/detokenize", json.dumps({"tokens": ids}).encode())
    check(status == 200 and dt["content"] == dt["prompt"] == prompt, "/detokenize: the text back")
    for path, body, code in [("/detokenize", {"tokens": [99999999]}, 400), ("/tokenize", {}, 400),
                             ("/tokenize", {"content": 5}, 400)]:
        status, err, _ = raw(port, path, json.dumps(body).encode())
        check(status == code and "error" in err, f"{path} {body}: {code}")
    status, err, _ = raw(port, "/tokenize", json.dumps({"content": "x"}).encode(), key="wrong")
    check(status == 401, "/tokenize with a wrong API key: 401")

    # response_format json_object: the reply is one JSON object, whole when the model stops.
    asked = [{"role": "user", "content": "Reply with a JSON object with the keys city and country for Paris."}]
    j = client.chat.completions.create(model=NAME, messages=asked, temperature=0, max_tokens=60,
                                       response_format={"type": "json_object"}).choices[0]
    check(j.finish_reason == "stop" and json.loads(j.message.content).get("city") == "Paris",
          f"json_object: a whole JSON object ({j.message.content!r})")
    cat = [{"role": "user", "content": "Give me a JSON object describing a cat."}]
    free = client.chat.completions.create(model=NAME, messages=cat, temperature=0, max_tokens=24).choices[0]
    held = client.chat.completions.create(model=NAME, messages=cat, temperature=0, max_tokens=24,
                                          response_format={"type": "json_object"}).choices[0]
    check(free.message.content.startswith("```") and held.message.content.lstrip().startswith("{"),
          f"json_object: text a model wraps in a fence comes out bare ({held.message.content[:12]!r})")
    for seed in range(4):
        chunks = list(client.chat.completions.create(
            model=NAME, messages=cat, temperature=1.0, seed=seed, max_tokens=48, stream=True,
            response_format={"type": "json_object"}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        check(text.lstrip().startswith("{") and "```" not in text and
              (finish != ["stop"] or isinstance(json.loads(text), dict)),
              f"json_object, sampled with seed {seed}: {finish} {text[:40]!r}")

    # response_format json_schema, through the client's pydantic parsing.
    class City(pydantic.BaseModel):
        city: str
        country: str
        population: int

    parsed = client.chat.completions.parse(model=NAME, messages=asked, temperature=0, max_tokens=60,
                                           response_format=City).choices[0]
    check(parsed.finish_reason == "stop" and parsed.message.parsed.city == "Paris" and
          isinstance(parsed.message.parsed.population, int),
          f"json_schema: the reply parses as the pydantic model ({parsed.message.content!r})")
    # A discriminated union (pydantic's): the tag written first picks the branch.
    class Cat(pydantic.BaseModel):
        kind: typing.Literal["cat"]
        lives: int

    class Dog(pydantic.BaseModel):
        kind: typing.Literal["dog"]
        good: bool

    class Pet(pydantic.BaseModel):
        pet: typing.Union[Cat, Dog] = pydantic.Field(discriminator="kind")

    pet_question = [{"role": "user", "content": "Describe a cat as JSON."}]
    for seed in range(3):
        parsed = client.chat.completions.parse(model=NAME, messages=pet_question, temperature=1.0, seed=seed,
                                               max_tokens=60, response_format=Pet).choices[0]
        check(parsed.finish_reason == "stop" and isinstance(parsed.message.parsed.pet, (Cat, Dog)),
              f"json_schema: a discriminated union parses (seed {seed}: {parsed.message.content!r})")
    dated = {"type": "json_schema", "json_schema": {"name": "d", "schema": {
        "type": "object", "properties": {"when": {"type": "string", "format": "date-time"}}}}}
    status, err, _ = raw(port, "/v1/chat/completions",
                         json.dumps({"model": NAME, "messages": asked, "response_format": dated}).encode())
    check(status == 400 and "format" in err["error"]["message"],
          f"json_schema with a keyword it cannot check: 400 naming it ({err['error']['message']!r})")

    # grammar (llama-server's field): a GBNF grammar, on the completions, chat and native routes,
    # as `generate --grammar` keeps it.
    yes_no = 'root ::= ("Yes" | "No") ", " [a-z ]{1,30} "."'
    question = "Is Paris in France?"
    for seed in range(3):
        c = client.completions.create(model=NAME, prompt=question, max_tokens=40, temperature=1.0, seed=seed,
                                      extra_body={"grammar": yes_no}).choices[0]
        check(c.finish_reason == "stop" and re.fullmatch(r"(Yes|No), [a-z ]{1,30}\.", c.text),
              f"grammar, sampled with seed {seed}: a whole sentence of it ({c.text!r})")
    mine = cli("generate", "-p", question, "-n", "40", "--temperature", "0", "--grammar", yes_no)["text"]
    c = client.completions.create(model=NAME, prompt=question, max_tokens=40, temperature=0,
                                  extra_body={"grammar": yes_no}).choices[0]
    check(c.text == mine and re.fullmatch(r"(Yes|No), [a-z ]{1,30}\.", mine),
          f"grammar: the completions route equals generate --grammar ({mine!r})")
    legs = client.chat.completions.create(model=NAME, temperature=0, max_tokens=8, messages=[
        {"role": "user", "content": "How many legs has a cat?"}], extra_body={"grammar": "root ::= [0-9]{1,2}"})
    check(legs.choices[0].finish_reason == "stop" and legs.choices[0].message.content.isdigit(),
          f"grammar on the chat route: digits ({legs.choices[0].message.content!r})")
    status, native, _ = raw(port, "/completion", json.dumps({"prompt": question, "n_predict": 40, "temperature": 0,
                                                             "grammar": yes_no}).encode())
    check(status == 200 and native["content"] == mine, "grammar on /completion: the same text")
    city_schema = {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}
    status, native, _ = raw(port, "/completion", json.dumps({"prompt": question, "n_predict": 40, "temperature": 0,
                                                             "json_schema": city_schema}).encode())
    check(status == 200 and set(json.loads(native["content"])) == {"city"},
          f"json_schema on /completion: a value of the schema ({native['content']!r})")
    for what, extra, word in [
        ("a rule used but not defined", {"grammar": "root ::= answer"}, "answer is used but not defined"),
        ("left recursion", {"grammar": 'root ::= root "x" | "y"'}, "left-recursive"),
        ("a token reference", {"grammar": "root ::= <[1]>"}, "token references"),
        ("not a string", {"grammar": 5}, "grammar must be a string"),
        ("with response_format", {"grammar": yes_no, "response_format": {"type": "json_object"}}, "send one"),
        ("lazy, not a boolean", {"grammar": yes_no, "grammar_lazy": "yes"}, "grammar_lazy must be a boolean"),
        ("lazy without triggers", {"grammar": yes_no, "grammar_lazy": True}, "needs grammar_triggers"),
        ("lazy without a grammar", {"grammar_lazy": True, "grammar_triggers": [{"type": 1, "value": "x"}]},
         "needs a grammar"),
        ("a trigger of no type", {"grammar": yes_no, "grammar_lazy": True,
                                  "grammar_triggers": [{"type": 7, "value": "x"}]}, "type must be"),
        ("a token trigger outside the vocabulary", {"grammar": yes_no, "grammar_lazy": True,
                                                    "grammar_triggers": [{"type": 0, "token": 99999999}]}, "token"),
        ("a pattern trigger that does not compile", {"grammar": yes_no, "grammar_lazy": True,
                                                     "grammar_triggers": [{"type": 2, "value": "(x"}]}, "pattern"),
    ]:
        status, err, _ = raw(port, "/v1/completions", json.dumps({"model": NAME, "prompt": "x", **extra}).encode())
        check(status == 400 and word in err["error"]["message"], f"grammar, {what}: 400 naming it")

    # grammar_lazy (llama-server's): free text, as without the grammar, until a trigger word;
    # from the word on, a sentence of the grammar.
    story = "Once upon a time"
    plain = client.completions.create(model=NAME, prompt=story, max_tokens=40, temperature=0).choices[0].text
    word = next(w for w in plain.split()[3:] if w.isalpha() and len(w) >= 4)
    at = plain.find(word)
    lazy = {"grammar": f'root ::= "{word}" [^.\\n]{{0,60}} "."', "grammar_lazy": True,
            "grammar_triggers": [{"type": 1, "value": word}]}
    for what, triggers in [(f"a word trigger ({word!r})", lazy["grammar_triggers"]),
                           ("a pattern trigger, from its capture group",
                            [{"type": 2, "value": f"[\\s\\S]*?({word})"}])]:
        c = client.completions.create(model=NAME, prompt=story, max_tokens=80, temperature=0,
                                      extra_body=dict(lazy, grammar_triggers=triggers)).choices[0]
        check(c.finish_reason == "stop" and c.text[:at] == plain[:at]
              and re.fullmatch(re.escape(word) + r"[^.\n]{0,60}\.", c.text[at:]),
              f"grammar_lazy, {what}: free text, then the grammar ({c.text!r})")
    # A full pattern (type 3) must match the whole output, each of its alternatives too: the
    # word alone never is the whole output here, so the text goes free all through.
    full = dict(lazy, grammar_triggers=[{"type": 3, "value": f"@@|({word})"}])
    c = client.completions.create(model=NAME, prompt=story, max_tokens=40, temperature=0,
                                  extra_body=full).choices[0]
    check(c.text == plain, f"grammar_lazy, a full pattern the output never is: free text ({c.text!r})")
    refused = {"grammar": 'root ::= "@@"', "grammar_lazy": True, "grammar_triggers": [{"type": 1, "value": word}]}
    status, err, _ = raw(port, "/v1/completions", json.dumps({"model": NAME, "prompt": story, "max_tokens": 40,
                                                              "temperature": 0, **refused}).encode())
    check(status == 500 and "does not accept" in err["error"]["message"],
          f"grammar_lazy, a trigger the grammar refuses: an error naming it ({status}, {err})")

    emb = client.embeddings.create(model=NAME, input=["Hello world", prompt])
    mine = cli("embed", "-p", prompt, "--normalize")["embedding"]
    check(len(emb.data) == 2 and max(abs(a - b) for a, b in zip(emb.data[1].embedding, mine)) < 1e-5,
          "embeddings equal sapient embed --normalize")

    status, body, _ = raw(port, "/v1/chat/completions", b"{not json")
    check(status == 400 and body["error"]["type"] == "invalid_request_error", "bad JSON: 400")
    status, body, _ = raw(port, "/v1/chat/completions", json.dumps({"model": NAME}).encode())
    check(status == 400 and "messages" in body["error"]["message"], "missing messages: 400")
    status, body, _ = raw(port, "/v1/completions", json.dumps({"model": NAME, "prompt": "x", "temperature": 9}).encode())
    check(status == 400 and "temperature" in body["error"]["message"], "bad temperature: 400")
    for field, value in [("suffix", "end"), ("tools", [{"type": "function", "function": {"name": "f"}}]),
                         ("response_format", {"type": "grammar", "grammar": "root ::= x"}), ("logit_bias", {"99999999": 1})]:
        status, body, _ = raw(port, "/v1/completions", json.dumps({"model": NAME, "prompt": "x", field: value}).encode())
        check(status == 400 and field in body["error"]["message"], f"{field} it cannot honour: 400 naming it")
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", headers={"Authorization": f"Bearer {KEY}"})
    try:
        urllib.request.urlopen(req, timeout=10)
        check(False, "GET on a POST route: 405")
    except urllib.error.HTTPError as e:
        check(e.code == 405 and json.load(e)["error"]["code"] == "method_not_allowed", "GET on a POST route: 405")
    try:
        urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": "Bearer wrong"}), timeout=10)
        check(False, "wrong API key: 401")
    except urllib.error.HTTPError as e:
        check(e.code == 401 and json.load(e)["error"]["code"] == "invalid_api_key", "wrong API key: 401")
    status, body, _ = raw(port, "/v1/completions", json.dumps({"model": NAME, "prompt": "x"}).encode(), key="wrong")
    check(status == 401 and body["error"]["code"] == "invalid_api_key", "wrong API key on a POST: 401")
    try:
        client.chat.completions.create(model="gpt-4", messages=messages)
        check(False, "unknown model: 404")
    except openai.NotFoundError as e:
        check(e.status_code == 404 and e.body["code"] == "model_not_found", "unknown model: 404")
    try:
        client.completions.create(model=NAME, prompt="word " * 600, max_tokens=4)
        check(False, "prompt longer than the context: 400")
    except openai.BadRequestError as e:
        check(e.body["code"] == "context_length_exceeded", "prompt longer than the context: 400")

    # 32 streams at once, 8 generating at a time: each the same as alone.
    prompts = [f"Count from {i} to {i + 5}:" for i in range(32)]
    alone = [client.completions.create(model=NAME, prompt=p, max_tokens=12, temperature=0).choices[0].text
             for p in prompts]

    def stream(p):
        return "".join(c.choices[0].text for c in client.completions.create(
            model=NAME, prompt=p, max_tokens=12, temperature=0, stream=True) if c.choices)

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        together = list(pool.map(stream, prompts))
    check(together == alone, "32 concurrent streams equal each request alone")

    # Streams the client abandons free their slots.
    before = metrics(port)
    opened = [client.completions.create(model=NAME, prompt=p, max_tokens=400, temperature=0, stream=True)
              for p in prompts[:4]]
    for s in opened:
        next(iter(s))
        s.close()
    deadline = time.time() + 30
    while time.time() < deadline:
        m = metrics(port)
        if m["sapient:num_requests_running"] == 0:
            break
        time.sleep(0.1)
    cancelled = m['sapient:request_success_total{finished_reason="cancelled"}']
    check(m["sapient:num_requests_running"] == 0 and
          cancelled >= before['sapient:request_success_total{finished_reason="cancelled"}'] + 4,
          "abandoned streams free their slots (/metrics)")
    check(m["sapient:kv_cache_usage_perc"] == 0, "the KV cache is free again")
finally:
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=30)
check(code == 0, "SIGTERM: a clean exit")

# A full queue: one slot, one waiting place, three long requests at once.
proc, port = start("--parallel", "1", "--queue", "1", "--ctx", "512")
try:
    body = json.dumps({"model": NAME, "prompt": "Once upon a time", "max_tokens": 200, "temperature": 0}).encode()
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: raw(port, "/v1/completions", body, key=None), range(3)))
    full = [r for r in results if r[0] == 503]
    check(len(full) >= 1 and all(r[0] == 200 for r in results if r[0] != 503), "a full queue: 503 for the rest")
    check(full[0][1]["error"]["code"] == "queue_full" and full[0][2]["Retry-After"] is not None,
          "503 carries Retry-After and an error object")
finally:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
# One connection at a time: a second client waits to be accepted, then is served.
proc, port = start("--max-connections", "1")
try:
    body = json.dumps({"model": NAME, "prompt": "Hello", "max_tokens": 8, "temperature": 0}).encode()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: raw(port, "/v1/completions", body, key=None), range(2)))
    check([r[0] for r in results] == [200, 200] and results[0][1]["choices"] == results[1][1]["choices"],
          "--max-connections 1: the second client waits, then gets the same answer")
finally:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
print("all server checks passed")
