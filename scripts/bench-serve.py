#!/usr/bin/env python3
"""Load test of an OpenAI-compatible server (sapient serve, llama.cpp's llama-server): for each
concurrency N, N streaming completions at once (distinct prompts, greedy, a fixed max_tokens);
prints the aggregate throughput (completion tokens / wall time, the prompts' prefill included),
the aggregate decode throughput (tokens received while every stream is past its first token and
none has finished, per second of that window: the rate of the decode steps alone, as
llama-batched-bench's S_TG counts it), the median time to first token, and tokens/s per stream.
Standard library only.

With --rounds R the list of concurrencies runs R times in turn (1, 8, 1, 8, ...), so that a
shared machine's drift falls on every concurrency alike, and a last line gives per concurrency
the medians over the rounds and the median of each round's ratio to the first concurrency.

With --json every request asks for one JSON object (`response_format` `json_object`, and
llama-server's `json_schema` `{"type": "object"}` for its completions route) and may end when
the object closes: the cost of constrained sampling, set against the same run without --json.

Usage: scripts/bench-serve.py URL MODEL_NAME [--concurrency 1,4,8,16] [--max-tokens 64] [--rounds R] [--json]
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
p.add_argument("--json", action="store_true")
args = p.parse_args()
u = urllib.parse.urlparse(args.url)


def one(i, tag, results):
    body = {
        "model": args.model,
        # Distinct in every run, so that no server answers a prompt from its prompt cache.
        "prompt": f"Story number {tag}-{i}. Once upon a time, in a village by the sea, there lived",
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        # llama-server: keep generating past an end-of-sequence token, as sapient's max_tokens
        # runs here hardly ever meet one; sapient ignores unknown fields.
        "ignore_eos": True,
    }
    if args.json:
        body["prompt"] = f"Story number {tag}-{i}, as one JSON object with many fields:"
        body["response_format"] = {"type": "json_object"}
        body["json_schema"] = {"type": "object"}
        # The object's end is an end of sequence that must end the request.
        del body["ignore_eos"]
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t0 = time.time()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    first, tokens, stamps = None, 0, []
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
                stamps.append(time.time())
                if first is None:
                    first = stamps[-1] - t0
    results[i] = (first, tokens or len(stamps), time.time() - t0, stamps)


def decode_rate(results):
    """Tokens per second inside the window where all streams decode (see the top)."""
    start = max(r[3][0] for r in results)
    end = min(r[3][-1] for r in results)
    if end <= start:
        return None
    inside = sum(1 for r in results for s in r[3] if start < s <= end)
    return round(inside / (end - start), 1)


levels = [int(x) for x in args.concurrency.split(",")]
rows = {n: [] for n in levels}
for rnd in range(args.rounds):
    for run, n in enumerate(levels):
        results = [None] * n
        t0 = time.time()
        tag = f"{int(t0) % 10000}{run}{rnd}"
        threads = [threading.Thread(target=one, args=(i, tag, results)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.time() - t0
        total = sum(r[1] for r in results)
        ttft = statistics.median(r[0] for r in results if r[0] is not None)
        per_stream = statistics.median(r[1] / r[2] for r in results)
        row = {"concurrency": n, "completion_tokens": total, "wall_s": round(wall, 2),
               "tokens_per_s": round(total / wall, 1),
               "decode_tokens_per_s": decode_rate(results), "median_ttft_s": round(ttft, 3),
               "median_stream_tokens_per_s": round(per_stream, 1)}
        rows[n].append(row)
        print(json.dumps(row), flush=True)

if args.rounds > 1:
    def median(n, key, digits=1):
        values = [r[key] for r in rows[n] if r[key] is not None]
        return round(statistics.median(values), digits) if values else None

    def ratio(n, key):
        pairs = [(a[key], b[key]) for a, b in zip(rows[levels[0]], rows[n]) if a[key] and b[key]]
        return round(statistics.median(b / a for a, b in pairs), 2) if pairs else None

    print(json.dumps({"rounds": args.rounds, "medians": [
        {"concurrency": n, "tokens_per_s": median(n, "tokens_per_s"),
         "decode_tokens_per_s": median(n, "decode_tokens_per_s"),
         "median_ttft_s": median(n, "median_ttft_s", 3),
         "ratio_tokens_per_s": ratio(n, "tokens_per_s"),
         "ratio_decode_tokens_per_s": ratio(n, "decode_tokens_per_s")} for n in levels]}), flush=True)
