#!/usr/bin/env python3
"""`sapient serve` under malformed and hostile request bodies, on loopback.

Usage: tests/server/hostile_requests.py SAPIENT_BINARY MODEL.gguf [COUNT]

Starts from a valid body for each POST route and breaks it at random (a field of another type,
out of range, huge, empty, nested deep, missing, unknown fields, odd Unicode; or bytes that are
no JSON at all: truncated, invalid UTF-8, nested past any parser's depth), COUNT times in all
(300 by default) from a fixed seed, so a failure replays; then a body over the size limit.
Every answer must be a 200 or a 4xx with OpenAI's error object (`{"error": {"message", "type",
"code"}}`), never a 5xx, a dropped connection or a hang. Then clients that hold every connection
place (--max-connections 2) without sending a whole request head, one silent and one trickling
its headers, must be disconnected after --header-timeout, and a plain request served; at the end
no request is left running (/metrics). Standard library only.
"""
import json
import random
import select
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import serve_process

BIN, MODEL = sys.argv[1], sys.argv[2]
COUNT = int(sys.argv[3]) if len(sys.argv) > 3 else 300
NAME = "smollm2"
HEADER_TIMEOUT = 2


def start():
    # A small context and token limit keep each valid request short.
    return serve_process.start(BIN, MODEL, NAME, "--parallel", "4", "--ctx", "256",
                               "--max-tokens-limit", "4", "--max-connections", "2",
                               "--header-timeout", str(HEADER_TIMEOUT))


def post(port, path, body):
    """POSTs `body` (bytes); returns (status, response bytes). Raises on a dropped connection or
    a hang (no answer in 60 s)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post_oversized(port, path, body):
    """POSTs a body larger than the server takes, as curl does: the server may answer and close
    before the whole body is sent (a broken pipe for a client that only reads after sending), so
    stop sending once an answer is readable and read it. Returns (status, response body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode())
        sent = 0
        try:
            while sent < len(body) and not select.select([s], [], [], 0)[0]:
                sent += s.send(body[sent:sent + (64 << 10)])
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        while chunk := s.recv(1 << 16):
            answer += chunk
    head, _, content = answer.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 "):
        raise SystemExit(f"FAILED: an oversized body to {path}: no HTTP answer ({answer[:200]!r})")
    if b"transfer-encoding: chunked" in head.lower():
        raise SystemExit(f"FAILED: an oversized body to {path}: a chunked answer ({head!r})")
    return int(head.split()[1]), content


BASES = {
    "/v1/chat/completions": {
        "model": NAME, "messages": [{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "Hi!"}],
        "max_tokens": 2, "temperature": 0, "stream": False,
    },
    "/v1/completions": {
        "model": NAME, "prompt": "The capital of France is", "max_tokens": 2, "temperature": 0.7,
        "top_p": 0.9, "seed": 1, "stop": ["\n"], "stream": False,
    },
    "/v1/embeddings": {"model": NAME, "input": ["one", "two"]},
    "/v1/messages": {
        "model": NAME, "max_tokens": 2, "system": "Be brief.", "stop_sequences": ["\n"],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi!"}]}],
    },
    "/v1/responses": {
        "model": NAME, "instructions": "Be brief.", "max_output_tokens": 2, "temperature": 0,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi!"}]},
                  {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "ok"}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "text": {"format": {"type": "text"}}, "store": False,
        "include": ["message.output_text.logprobs"], "top_logprobs": 2,
    },
    "/completion": {"prompt": "Once upon a time", "n_predict": 2, "temperature": 0.5, "top_k": 20},
    "/infill": {"input_prefix": "def f(", "input_suffix": "\n", "prompt": "x",
                "input_extra": [{"filename": "a.py", "text": "A = 1\n"}], "n_predict": 2},
    "/tokenize": {"content": "Hello world", "with_pieces": True},
    "/detokenize": {"tokens": [1, 2, 3]},
}

FIELDS = ["model", "messages", "prompt", "input", "max_tokens", "max_completion_tokens",
          "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stream", "stream_options",
          "n", "best_of", "logit_bias", "presence_penalty", "frequency_penalty",
          "repeat_penalty", "repeat_last_n", "logprobs", "top_logprobs", "response_format", "echo", "suffix",
          "tools", "tool_choice", "parallel_tool_calls", "user", "encoding_format", "content", "tokens",
          "with_pieces", "add_special", "input_prefix", "input_suffix", "input_extra", "n_predict", "n_probs",
          "system", "stop_sequences", "thinking", "output_config", "max_tokens", "instructions",
          "max_output_tokens", "text", "reasoning", "store", "previous_response_id", "background", "truncation",
          "grammar", "grammar_lazy", "grammar_triggers", "json_schema", "top_n_sigma", "typical_p", "xtc_probability", "xtc_threshold",
          "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers",
          "include"]


def weird(rng, depth=0):
    """A value of any JSON type, often one that no field wants."""
    pool = [
        None, True, False, 0, -1, 1, 2, 3, 0.5, -0.0, 1e308, -1e308, 2**63, 2**64 + 1, -2**63,
        "", "x", "0", "NaN", "Infinity", "\u0000", "\ud7ff\ue000", "é" * 50, "<|im_end|>",
        "a" * rng.choice([1, 100, 5000]), [], {}, [[]], [None], [1, 2, 3], ["a", 1, None],
        {"type": "text"}, {"type": "json_object"}, {"include_usage": "yes"},
        {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"$ref": "#"}}}}},
        {"type": "json_schema", "json_schema": {"schema": {"$ref": "#"}}},
        {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {
            "e": {"enum": [1, "1", None, [], {}]}, "n": {"anyOf": [{"type": "integer"}, {"type": "number"}]}}}}},
        {"type": "json_schema", "json_schema": {"schema": {"type": "object", "required": ["x"]}}},
        [{"type": 2, "value": "(a*)*$"}], [{"type": 3, "value": "x" * 5000}], [{"type": 0, "token": -1}],
        [{"type": 1, "value": ""}], [{"type": 1}], 'root ::= "x"',
        [{"role": "user"}], [{"role": 1, "content": "x"}], [{"content": "x"}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        [{"role": "user", "content": [{"type": "text", "text": 5}]}],
        [{"role": "user", "content": None}], [{"role": "tool", "content": "x"}],
        [{"type": "function", "function": {"name": "f"}}], "required", "auto", "none",
        {"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": 1}},
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
            "a": {"$ref": "#"}, "b": {"type": "string", "pattern": "x"}}}}}],
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
        [{"function": {"name": "f%d" % i}} for i in range(rng.choice([2, 64, 200]))],
        [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}],
        [{"role": "assistant", "tool_calls": "x"}, {"role": "tool", "tool_call_id": [], "content": "x"}],
        {"0": 100}, {"-1": 1}, {"99999999999": 1}, {"1": "a"}, {"1": 1e9},
        list(range(rng.choice([10, 300]))), [rng.randrange(-5, 70000) for _ in range(8)],
    ]
    if depth < 3 and rng.random() < 0.2:
        return rng.choice([[weird(rng, depth + 1)], {"k": weird(rng, depth + 1)}])
    return rng.choice(pool)


def nested(depth):
    return "[" * depth + "]" * depth


def mutate(rng, path):
    base = json.loads(json.dumps(BASES[path]))
    kind = rng.random()
    if kind < 0.08:
        # Not JSON, or JSON of the wrong shape.
        text = json.dumps(base).encode()
        return rng.choice([
            text[: rng.randrange(len(text))],
            b"\xff\xfe" + text,
            text.replace(b'"Hi!"', b'"\xc3\x28"'),
            nested(rng.choice([64, 200, 100000])).encode(),
            b"[]", b"null", b"42", b'"text"', b"", b"{}" * 3,
            b'{"model": "' + NAME.encode() + b'", "model": 1}',
        ])
    for _ in range(rng.randint(1, 3)):
        op = rng.random()
        if op < 0.6:
            base[rng.choice(FIELDS)] = weird(rng)
        elif op < 0.8 and base:
            base.pop(rng.choice(list(base)))
        else:
            base["x-" + str(rng.randrange(1000))] = weird(rng)
    # A stream stays a stream only when asked as a boolean: the answer is then SSE.
    return json.dumps(base).encode()


def check_answer(status, body, what, anthropic=False):
    """A 200, or a 4xx with an error object: OpenAI's, or on `anthropic` routes Anthropic's
    (`{"type": "error", "error": {"type", "message"}}`)."""
    if status == 200:
        return
    if not 400 <= status < 500:
        raise SystemExit(f"FAILED: {what}: status {status}: {body[:300]!r}")
    try:
        answer = json.loads(body)
        err = answer["error"]
        ok = isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
        ok = ok and (answer["type"] == "error" if anthropic else "code" in err)
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise SystemExit(f"FAILED: {what}: status {status} without an OpenAI error object: {body[:300]!r}")


proc, port = start()
try:
    rng = random.Random(1234)
    statuses = {}
    for i in range(COUNT):
        path = rng.choice(list(BASES))
        body = mutate(rng, path)
        try:
            status, answer = post(port, path, body)
        except Exception as e:  # a dropped connection, a reset or a timeout
            raise SystemExit(f"FAILED: request {i} to {path} ({body[:300]!r}): {e!r}")
        check_answer(status, answer, f"request {i} to {path} ({body[:200]!r})", path == "/v1/messages")
        statuses[status] = statuses.get(status, 0) + 1
    print(f"ok: {COUNT} malformed or hostile bodies answered 200 or 4xx with an error object: {statuses}")
    big = json.dumps({"model": NAME, "prompt": "a" * (9 << 20), "max_tokens": 1}).encode()
    for path in BASES:
        status, answer = post_oversized(port, path, big)
        check_answer(status, answer, f"a 9 MiB body to {path}", path == "/v1/messages")
        if status != 413:
            raise SystemExit(f"FAILED: a 9 MiB body to {path}: status {status}, not 413")
    print("ok: a body over the 8 MiB limit is a 413 with an error object")
    # Both connection places taken by clients that never finish a request head.
    trickling = socket.create_connection(("127.0.0.1", port))
    trickling.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    silent = socket.create_connection(("127.0.0.1", port))
    t0 = time.time()
    status, answer = post(port, "/v1/completions", json.dumps(BASES["/v1/completions"]).encode())
    if status != 200 or not json.loads(answer)["choices"]:
        raise SystemExit(f"FAILED: a plain request afterwards: {status} {answer[:300]!r}")
    waited = time.time() - t0
    for s, what in ((trickling, "trickling its headers"), (silent, "silent")):
        s.settimeout(HEADER_TIMEOUT + 10)
        try:
            closed = s.recv(100) == b""
        except OSError:
            closed = False
        if not closed:
            raise SystemExit(f"FAILED: a client {what} was not disconnected after --header-timeout")
        s.close()
    if waited > HEADER_TIMEOUT + 10:
        raise SystemExit(f"FAILED: a plain request waited {waited:.1f} s behind idle connections")
    print(f"ok: idle and trickling clients holding every connection place are disconnected "
          f"after --header-timeout; a plain request waited {waited:.1f} s")
    time.sleep(0.5)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        running = [l for l in r.read().decode().splitlines() if l.startswith("sapient:num_requests_running ")]
    if running != ["sapient:num_requests_running 0"]:
        raise SystemExit(f"FAILED: requests left running: {running}")
    print("ok: the server still answers, with no request left running")
finally:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
