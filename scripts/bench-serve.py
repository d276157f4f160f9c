#!/usr/bin/env python3
"""Load test of an OpenAI-compatible server (sapient serve, llama.cpp's llama-server): for each
concurrency N, N streaming completions at once (distinct prompts, greedy, a fixed max_tokens);
prints the aggregate decode throughput (completion tokens / wall time), the median time to
first token, and tokens/s per stream. Standard library only.

Usage: scripts/bench-serve.py URL MODEL_NAME [--concurrency 1,4,8,16] [--max-tokens 64]
"""
import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse

p = argparse.ArgumentParser()
p.add_argument("url")
p.add_argument("model")
p.add_argument("--concurrency", default="1,4,8,16")
p.add_argument("--max-tokens", type=int, default=64)
p.add_argument("--rounds", type=int, default=1)
args = p.parse_args()
u = urllib.parse.urlparse(args.url)


def one(i, results):
    body = {
        "model": args.model,
        "prompt": f"Story number {i}. Once upon a time, in a village by the sea, there lived",
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        # llama-server: keep generating past an end-of-sequence token, as sapient's max_tokens
        # runs here hardly ever meet one; sapient ignores unknown fields.
        "ignore_eos": True,
    }
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t0 = time.time()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    first, tokens, chunks = None, 0, 0
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        obj = json.loads(data)
        if obj.get("usage"):
            tokens = obj["usage"]["completion_tokens"]
        for c in obj.get("choices", []):
            if c.get("text"):
                chunks += 1
                if first is None:
                    first = time.time() - t0
    results[i] = (first, tokens or chunks, time.time() - t0)


for n in [int(x) for x in args.concurrency.split(",")]:
    for _ in range(args.rounds):
        results = [None] * n
        t0 = time.time()
        threads = [threading.Thread(target=one, args=(i, results)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.time() - t0
        total = sum(r[1] for r in results)
        ttft = statistics.median(r[0] for r in results if r[0] is not None)
        per_stream = statistics.median(r[1] / r[2] for r in results)
        print(json.dumps({"concurrency": n, "completion_tokens": total, "wall_s": round(wall, 2),
                          "tokens_per_s": round(total / wall, 1), "median_ttft_s": round(ttft, 3),
                          "median_stream_tokens_per_s": round(per_stream, 1)}), flush=True)
