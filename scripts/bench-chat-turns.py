#!/usr/bin/env python3
"""A multi-turn chat against an OpenAI-compatible server: each turn resends the whole
conversation (a long system prompt, the replies so far, a new question), as chat front-ends do;
prints each turn's prompt tokens and time to first token. With a prompt cache, turns after the
first prefill only what is new. Standard library only.

Usage: scripts/bench-chat-turns.py URL MODEL_NAME
"""
import http.client
import json
import sys
import time
import urllib.parse

u = urllib.parse.urlparse(sys.argv[1])
model = sys.argv[2]
messages = [{"role": "system", "content": "You are a helpful assistant who answers in detail. " * 8}]
for question in ["Tell me about the sea.", "And about mountains?", "Which is older?", "Why?", "Summarize."]:
    messages.append({"role": "user", "content": question})
    body = {"model": model, "messages": messages, "max_tokens": 48, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t0 = time.time()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    first, text, usage = None, "", None
    for line in conn.getresponse():
        line = line.strip()
        if not line.startswith(b"data: ") or line[6:] == b"[DONE]":
            continue
        obj = json.loads(line[6:])
        usage = obj.get("usage") or usage
        for c in obj.get("choices", []):
            piece = c.get("delta", {}).get("content")
            if piece:
                text += piece
                first = first if first is not None else time.time() - t0
    messages.append({"role": "assistant", "content": text})
    print(json.dumps({"prompt_tokens": usage["prompt_tokens"], "ttft_s": round(first, 3)}), flush=True)
