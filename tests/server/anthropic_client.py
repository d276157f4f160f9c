#!/usr/bin/env python3
"""Anthropic's Messages API through `sapient serve`, driven by the official `anthropic`
Python client.

Usage: tests/server/anthropic_client.py SAPIENT_BINARY MODEL.gguf

A message equals the chat route's reply to the same conversation (greedy), whole and
streamed; stop sequences, tool use (forced, and a result carried back), structured output,
token counting and the API key reach it; errors come in Anthropic's shape with their statuses.
"""
import json
import sys
import urllib.error
import urllib.request

import anthropic
from anthropic import Anthropic
from openai import OpenAI

import serve_process
from templates import THINKING

BIN, MODEL = sys.argv[1], sys.argv[2]
NAME = "smollm2"
KEY = "test-key"
# The client's own fields no longer include the sampling ones; the server reads them.
GREEDY = {"temperature": 0}
WEATHER = {"name": "get_weather", "description": "The current weather in a city",
           "input_schema": {"type": "object", "required": ["city", "unit"], "properties": {
               "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def raw(port, body, key=KEY):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/messages", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json", "x-api-key": key})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


with serve_process.served(BIN, MODEL, NAME, "--api-key", KEY, "--ctx", "1024", "--parallel", "2") as port:
    client = Anthropic(base_url=f"http://127.0.0.1:{port}", api_key=KEY, max_retries=0, timeout=120)
    chat = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=120)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    system = "You are a terse geography teacher."

    m = client.messages.create(model=NAME, max_tokens=24, extra_body=GREEDY, system=system, messages=question)
    c = chat.chat.completions.create(model=NAME, max_tokens=24, temperature=0,
                                     messages=[{"role": "system", "content": system}] + question)
    want = c.choices[0].message.content
    finish = {"stop": "end_turn", "length": "max_tokens"}[c.choices[0].finish_reason]
    check(m.type == "message" and m.role == "assistant" and [b.type for b in m.content] == ["text"] and
          m.content[0].text == want, "a message: the chat route's reply, as a text block")
    check(m.stop_reason == finish and m.usage.input_tokens == c.usage.prompt_tokens and
          m.usage.output_tokens == c.usage.completion_tokens, f"stop_reason {m.stop_reason} and usage as chat's")

    with client.messages.stream(model=NAME, max_tokens=24, extra_body=GREEDY, system=system, messages=question) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    check(streamed == want and final.content[0].text == want and final.stop_reason == finish and
          final.usage.output_tokens == m.usage.output_tokens, "streamed: the same text, stop reason and usage")

    ceiling = client.messages.create(model=NAME, max_tokens=64000, system=system, messages=question, extra_body=GREEDY)
    check(ceiling.content[0].text.startswith(want), "max_tokens above the server's limit: lowered to it, not refused")

    blocks = client.messages.create(model=NAME, max_tokens=24, extra_body=GREEDY, messages=[
        {"role": "user", "content": [{"type": "text", "text": "What is the capital"},
                                     {"type": "text", "text": "of France?"}]}])
    check(blocks.content[0].text, "text blocks of a user turn")

    if len(want) > 6:
        word = want[3:6]
        stopped = client.messages.create(model=NAME, max_tokens=24, extra_body=GREEDY, system=system,
                                         messages=question, stop_sequences=[word, "zzz"])
        check(stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word and
              stopped.content[0].text == want[:want.index(word)], f"stop_sequences: stopped at {word!r}, named")

    forced = client.messages.create(model=NAME, max_tokens=80, extra_body=GREEDY, messages=[
        {"role": "user", "content": "What is the weather like in Paris?"}], tools=[WEATHER], tool_choice={"type": "any"})
    uses = [b for b in forced.content if b.type == "tool_use"]
    check(forced.stop_reason == "tool_use" and len(uses) >= 1 and uses[0].name == "get_weather" and
          isinstance(uses[0].input, dict) and {"city", "unit"} <= set(uses[0].input) and
          uses[0].input["unit"] in ("celsius", "fahrenheit"), f"tool_choice any: a tool_use block of the schema ({uses[0].input})")
    with client.messages.stream(model=NAME, max_tokens=80, extra_body=GREEDY, messages=[
            {"role": "user", "content": "What is the weather like in Paris?"}], tools=[WEATHER],
            tool_choice={"type": "tool", "name": "get_weather"}) as s:
        deltas = sum(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in s)
        final = s.get_final_message()
    streamed_uses = [b for b in final.content if b.type == "tool_use"]
    check(final.stop_reason == "tool_use" and deltas > 1 and
          [(b.name, b.input) for b in streamed_uses] == [(b.name, b.input) for b in uses],
          f"a named tool, streamed: the same tool_use blocks, the input in {deltas} input_json_delta events")
    follow = client.messages.create(model=NAME, max_tokens=24, extra_body=GREEDY, tools=[WEATHER], messages=[
        {"role": "user", "content": "What is the weather like in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id, "name": "get_weather", "input": uses[0].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "18 degrees and sunny"}]}])
    counted = client.messages.count_tokens(model=NAME, tools=[WEATHER], messages=[
        {"role": "user", "content": "What is the weather like in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id, "name": "get_weather", "input": uses[0].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "18 degrees and sunny"}]}])
    check(follow.usage.input_tokens == counted.input_tokens > forced.usage.input_tokens,
          f"a tool result carried back ({counted.input_tokens} tokens, counted alike by count_tokens)")

    city = {"type": "object", "required": ["name", "country", "population"], "properties": {
        "name": {"type": "string"}, "country": {"type": "string"}, "population": {"type": "integer"}}}
    for seed in range(3):
        out = client.messages.create(model=NAME, max_tokens=400, messages=[{"role": "user", "content": "Describe Paris."}],
                                     output_config={"format": {"type": "json_schema", "schema": city}},
                                     extra_body={"temperature": 1.0, "seed": seed})
        check(out.stop_reason == "end_turn", f"output_config.format (seed {seed}): the value ends")
        value = json.loads(out.content[0].text)
        check(set(value) == {"name", "country", "population"} and isinstance(value["population"], int),
              f"output_config.format (seed {seed}): a value of the schema")

    digits = client.messages.create(model=NAME, max_tokens=8, messages=[{"role": "user", "content": "How many legs has a cat?"}],
                                    extra_body={"temperature": 0, "grammar": "root ::= [0-9]{1,2}"})
    check(digits.stop_reason == "end_turn" and digits.content[0].text.isdigit(),
          f"the grammar extension: a sentence of it ({digits.content[0].text!r})")

    try:
        Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="wrong", max_retries=0).messages.create(
            model=NAME, max_tokens=4, messages=question)
        check(False, "a wrong key: 401")
    except anthropic.AuthenticationError as e:
        check(e.status_code == 401 and e.body["error"]["type"] == "authentication_error", "a wrong key: 401 in Anthropic's shape")
    try:
        client.messages.create(model="claude-nonexistent", max_tokens=4, messages=question)
        check(False, "an unknown model: 404")
    except anthropic.NotFoundError as e:
        check(e.body["error"]["type"] == "not_found_error", "an unknown model: 404 not_found_error")
    bad = [
        ("no max_tokens", {"messages": question}, "max_tokens"),
        ("an image block", {"max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}, "image"),
        ("a system role in messages", {"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, "role"),
        ("a tool_result without its id", {"max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "tool_result", "content": "x"}]}]}, "tool_use_id"),
        ("an Anthropic server tool", {"max_tokens": 4, "messages": question,
                                      "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search"),
        ("an unknown tool_choice", {"max_tokens": 4, "messages": question, "tools": [WEATHER],
                                    "tool_choice": {"type": "sometimes"}}, "tool_choice"),
        ("a bad thinking", {"max_tokens": 4, "messages": question, "thinking": {"type": "maybe"}}, "thinking"),
        ("five stop sequences", {"max_tokens": 4, "messages": question, "stop_sequences": list("abcde")}, "stop_sequences"),
        ("a format that is not a schema", {"max_tokens": 4, "messages": question,
                                            "output_config": {"format": {"type": "xml"}}}, "output_config"),
        ("temperature out of range", {"max_tokens": 4, "messages": question, "temperature": 5}, "temperature"),
    ]
    for what, body, word in bad:
        status, e = raw(port, {"model": NAME} | body)
        check(status == 400 and e["type"] == "error" and e["error"]["type"] == "invalid_request_error" and
              word in e["error"]["message"], f"{what}: 400 invalid_request_error naming {word!r}")

# A thinking template (as Qwen3's): the reasoning comes back as a thinking block, whole and
# streamed; `thinking: {"type": "disabled"}` reaches the template.
with serve_process.served_with_template(BIN, MODEL, NAME, THINKING, "--ctx", "1024") as port:
    client = Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="none", max_retries=0, timeout=120)
    request = dict(model=NAME, max_tokens=16, messages=[{"role": "user", "content": "Why is the sky blue?"}],
                   extra_body=GREEDY)
    m = client.messages.create(**request)
    check(m.content[0].type == "thinking" and m.content[0].thinking, "a thinking model: a thinking block first")
    with client.messages.stream(**request) as s:
        final = s.get_final_message()
    check([b.model_dump() for b in final.content] == [b.model_dump() for b in m.content],
          "a thinking model, streamed: the same blocks (thinking_delta)")
    off = client.messages.create(**request, thinking={"type": "disabled"})
    check(off.usage.input_tokens > m.usage.input_tokens and off.content[0].type == "text",
          "thinking disabled: the template closes <think>, the reply is text")
print("all Anthropic API checks passed")
