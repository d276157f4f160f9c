#!/usr/bin/env python3
"""Tool calling through `sapient serve`, driven by the official `openai` Python client.

Usage: tests/server/tool_calls.py SAPIENT_BINARY MODEL.gguf

SmolLM2's template shows no tool format, so its replies take llama.cpp's generic one (the tools
in the system prompt, the reply a JSON object); a Hermes template (`--chat-template-file`)
takes the `<tool_call>` one, and a Mistral template the `[TOOL_CALLS]name[ARGS]{...}` one, whose
forced call of any of several tools names one of them. Forced calls (`required`, a named function) are calls of the
tools' schemas, greedy and sampled, whole and streamed alike (arguments as they are written,
a call cut short by max_tokens as far as written); a conversation carries calls and
their results back; every malformed field is a 400 naming it. A thinking template (Qwen3's
shape) has the reply's reasoning in `reasoning_content`, whole and streamed alike, and
`chat_template_kwargs` reach the template.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request

import openai
from openai import OpenAI

import serve_process
from templates import HERMES, MISTRAL_ARGS, THINKING

BIN, MODEL = sys.argv[1], sys.argv[2]
NAME = "smollm2"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "required": ["city", "unit"], "properties": {
        "city": {"type": "string", "description": "The city's name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "The time now in a time zone",
    "parameters": {"type": "object", "required": ["timezone"],
                   "properties": {"timezone": {"type": "string", "enum": [
                       "UTC", "Europe/Paris", "America/New_York", "Asia/Tokyo"]}}}}}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]

def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def valid_call(call, tools):
    """Whether `call` (the client's object) calls one of `tools` with arguments of its schema
    (required properties present, strings strings, enums kept)."""
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    if call.type != "function" or call.function.name not in by_name:
        return False
    if not re.fullmatch(r"[A-Za-z0-9]{9}", call.id):
        return False
    args = json.loads(call.function.arguments)
    schema = by_name[call.function.name]
    if set(args) != set(schema["properties"]) or not set(schema["required"]) <= set(args):
        return False
    for key, value in args.items():
        prop = schema["properties"][key]
        if not isinstance(value, str) or ("enum" in prop and value not in prop["enum"]):
            return False
    return True


def streamed(client, **request):
    """A streamed reply gathered: (content, calls as (id, name, arguments), finish reason, the
    chunks that carried arguments). A call's first chunk has its id, type and name (and no
    arguments yet); later chunks only more of its arguments."""
    content, calls, finish, argument_chunks = "", {}, None, 0
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for c in choice.delta.tool_calls or []:
                if c.index not in calls:
                    if not (c.id and c.type == "function" and c.function.name and c.function.arguments == ""):
                        raise SystemExit(f"FAILED: a call's first chunk without its id, type and name: {c}")
                    calls[c.index] = [c.id, c.function.name, ""]
                elif c.id or c.function.name:
                    raise SystemExit(f"FAILED: a call's later chunk names it again: {c}")
                else:
                    calls[c.index][2] += c.function.arguments or ""
                    argument_chunks += 1
            finish = choice.finish_reason or finish
    return content, [tuple(calls[k]) for k in sorted(calls)], finish, argument_chunks


def whole_calls(message):
    return [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []]


def forced_calls(client, label):
    """`required` and named choices give calls of the tools' schemas (several tools: the name
    picks the schema), streamed as whole."""
    for tools, choice, names in [
        ([WEATHER], "required", {"get_weather"}),
        ([WEATHER, CLOCK], "required", {"get_weather", "get_time"}),
        ([WEATHER, CLOCK], {"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
    ]:
        request = dict(model=NAME, messages=QUESTION, tools=tools, tool_choice=choice,
                       temperature=0, max_tokens=120)
        r = client.chat.completions.create(**request)
        choice0 = r.choices[0]
        calls = choice0.message.tool_calls or []
        what = f"{label}: tool_choice {json.dumps(choice)} of {len(tools)} tools"
        check(choice0.finish_reason == "tool_calls" and choice0.message.content is None and
              len(calls) == 1 and calls[0].function.name in names and valid_call(calls[0], tools),
              f"{what}: a call of the tool's schema ({whole_calls(choice0.message)}, {choice0.finish_reason})")
        content, stream_calls, finish, chunks = streamed(client, **request)
        same = [(n, a) for _, n, a in stream_calls] == [(n, a) for _, n, a in whole_calls(choice0.message)]
        check(content == "" and finish == "tool_calls" and same and chunks > 1,
              f"{what}: streamed as whole, the arguments in {chunks} chunks as written")
    # A call cut short by max_tokens: a call as far as it is written, finish_reason length, and
    # streamed alike.
    request = dict(model=NAME, messages=QUESTION, tools=[WEATHER], tool_choice="required", temperature=0)
    full = client.chat.completions.create(max_tokens=120, **request)
    cut_at = full.usage.completion_tokens * 2 // 3
    cut = client.chat.completions.create(max_tokens=cut_at, **request).choices[0]
    cut_calls = whole_calls(cut.message)
    full_arguments = full.choices[0].message.tool_calls[0].function.arguments
    content, stream_calls, finish, _ = streamed(client, max_tokens=cut_at, **request)
    check(cut.finish_reason == "length" and len(cut_calls) == 1 and cut_calls[0][1] == "get_weather" and
          full_arguments.startswith(cut_calls[0][2]) and len(cut_calls[0][2]) < len(full_arguments) and
          finish == "length" and [(n, a) for _, n, a in stream_calls] == [(n, a) for _, n, a in cut_calls],
          f"{label}: a call cut short at {cut_at} tokens: {cut_calls[0][2] if cut_calls else None!r}, "
          "as written, streamed alike")
    for seed in range(4):
        r = client.chat.completions.create(model=NAME, messages=QUESTION, tools=[WEATHER, CLOCK],
                                           tool_choice="required", temperature=1.0, seed=seed,
                                           max_tokens=120)
        calls = r.choices[0].message.tool_calls or []
        check(len(calls) == 1 and valid_call(calls[0], [WEATHER, CLOCK]),
              f"{label}: sampled (seed {seed}), still a call of a tool's schema")


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def carried_back(client, port, label):
    """A call and its result, sent back as the conversation goes on, are in the prompt (as
    /tokenize renders it with the tools), and the model answers."""
    call = client.chat.completions.create(model=NAME, messages=QUESTION, tools=[WEATHER],
                                          tool_choice="required", temperature=0, max_tokens=120)
    asked = call.choices[0].message
    history = QUESTION + [asked.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": asked.tool_calls[0].id, "content": "Sunny, 24 C"}]
    answer = client.chat.completions.create(model=NAME, messages=history, tools=[WEATHER],
                                            temperature=0, max_tokens=24)
    ids = post(port, "/tokenize", {"messages": history, "tools": [WEATHER]})["tokens"]
    prompt = post(port, "/detokenize", {"tokens": ids})["content"]
    arguments = json.loads(asked.tool_calls[0].function.arguments)
    check(answer.choices[0].message.content is not None or answer.choices[0].message.tool_calls,
          f"{label}: a call and its result carried back, answered")
    check(answer.usage.prompt_tokens == len(ids) and "Sunny, 24 C" in prompt and
          all(v in prompt for v in arguments.values()) and "get_weather" in prompt,
          f"{label}: the call and its result in the prompt")


with serve_process.served(BIN, MODEL, NAME, "--parallel", "2", "--ctx", "1024") as port:
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    forced_calls(client, "generic format")

    # The model chooses: whatever it writes is an answer, whole and streamed alike.
    request = dict(model=NAME, messages=QUESTION, tools=[WEATHER], temperature=0, max_tokens=40)
    r = client.chat.completions.create(**request)
    message = r.choices[0].message
    check(bool(message.content) or bool(message.tool_calls), "tool_choice auto: a reply or a call")
    content, calls, finish, _ = streamed(client, **request)
    check(content == (message.content or "") and
          [(n, a) for _, n, a in calls] == [(n, a) for _, n, a in whole_calls(message)] and
          finish == r.choices[0].finish_reason, "tool_choice auto: streamed as whole")

    # The generic format's reply is all JSON: a call of the schema, or the response's text.
    for seed in range(4):
        r = client.chat.completions.create(model=NAME, messages=QUESTION, tools=[WEATHER, CLOCK],
                                           temperature=1.0, seed=seed, max_tokens=80)
        choice0 = r.choices[0]
        calls = choice0.message.tool_calls or []
        if calls:
            check(choice0.finish_reason == "tool_calls" and all(valid_call(c, [WEATHER, CLOCK]) for c in calls),
                  f"tool_choice auto (seed {seed}): calls of the tools' schemas")
        else:
            check(choice0.finish_reason in ("stop", "length") and choice0.message.content and
                  "tool_call" not in choice0.message.content,
                  f"tool_choice auto (seed {seed}): the response's text ({choice0.message.content[:40]!r})")

    # tool_choice none: the tools stay out of the prompt.
    plain = client.chat.completions.create(model=NAME, messages=QUESTION, temperature=0, max_tokens=16)
    none = client.chat.completions.create(model=NAME, messages=QUESTION, temperature=0, max_tokens=16,
                                          tools=[WEATHER], tool_choice="none")
    check(none.choices[0].message.content == plain.choices[0].message.content and
          none.usage.prompt_tokens == plain.usage.prompt_tokens, "tool_choice none: as without tools")

    carried_back(client, port, "generic format")

    # parallel_tool_calls false: one call at most.
    r = client.chat.completions.create(model=NAME, messages=QUESTION, tools=[WEATHER], tool_choice="required",
                                       parallel_tool_calls=False, temperature=0, max_tokens=120)
    check(len(r.choices[0].message.tool_calls) == 1, "parallel_tool_calls false: one call")

    bad = [
        ("a tool name with a space", dict(tools=[{"type": "function", "function": {"name": "get weather"}}])),
        ("two tools of one name", dict(tools=[WEATHER, WEATHER])),
        ("an empty tool list", dict(tools=[])),
        ("a tool that is not a function", dict(tools=[{"type": "retrieval"}])),
        ("parameters that are not a schema", dict(tools=[{"type": "function", "function": {"name": "f", "parameters": 1}}])),
        ("a named tool that is not offered", dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})),
        ("tool_choice required without tools", dict(tool_choice="required")),
        ("an unknown tool_choice", dict(tools=[WEATHER], tool_choice="sometimes")),
        ("parallel_tool_calls not a boolean", dict(tools=[WEATHER], parallel_tool_calls="yes")),
        ("tools with response_format", dict(tools=[WEATHER], response_format={"type": "json_object"})),
        ("a message's malformed tool_calls", dict(messages=QUESTION + [{"role": "assistant", "tool_calls": [{"id": "x"}]}])),
        ("a tool message's id not a string", dict(messages=QUESTION + [{"role": "tool", "tool_call_id": 7, "content": "x"}])),
    ]
    for what, fields in bad:
        request = dict(model=NAME, messages=QUESTION, max_tokens=4) | fields
        try:
            client.chat.completions.create(**request)
            check(False, f"{what}: 400")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and e.body["message"], f"{what}: 400 ({e.body['message']})")
    try:
        client.completions.create(model=NAME, prompt="x", max_tokens=4, extra_body={"tools": [WEATHER]})
        check(False, "tools on the completions route: 400")
    except openai.BadRequestError as e:
        check("chat completions" in e.body["message"], "tools on the completions route: 400")

with serve_process.served_with_template(BIN, MODEL, NAME, HERMES, "--ctx", "1024") as port:
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    forced_calls(client, "Hermes format (--chat-template-file)")
    carried_back(client, port, "Hermes format")

# Mistral's [ARGS] format names the tool before its JSON: a forced call of any of several tools
# is one of their names, then that tool's arguments.
with serve_process.served_with_template(BIN, MODEL, NAME, MISTRAL_ARGS, "--ctx", "1024") as port:
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    forced_calls(client, "Mistral [ARGS] format (--chat-template-file)")
    carried_back(client, port, "Mistral [ARGS] format")
# A thinking template (as Qwen3's): the reply opens inside <think> unless the request's
# chat_template_kwargs turn thinking off.
with serve_process.served_with_template(BIN, MODEL, NAME, THINKING, "--ctx", "1024") as port:
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    request = dict(model=NAME, messages=QUESTION, temperature=0, max_tokens=16)
    r = client.chat.completions.create(**request)
    message = r.choices[0].message
    reasoning = getattr(message, "reasoning_content", None)
    check(bool(reasoning) and not message.content,
          f"a reply inside an opened <think>: all reasoning_content ({reasoning!r})")

    def gathered(**extra):
        parts = {"reasoning_content": "", "content": ""}
        for chunk in client.chat.completions.create(stream=True, **request, **extra):
            for choice in chunk.choices:
                parts["content"] += choice.delta.content or ""
                parts["reasoning_content"] += getattr(choice.delta, "reasoning_content", None) or ""
        return parts

    check(gathered() == {"reasoning_content": reasoning, "content": ""}, "reasoning streamed as whole")
    plain = client.chat.completions.create(**request, extra_body={"reasoning_format": "none"})
    check(plain.choices[0].message.content.strip() == reasoning and
          getattr(plain.choices[0].message, "reasoning_content", None) is None,
          "reasoning_format none: the text as written, in content")
    off = client.chat.completions.create(**request, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    check(off.usage.prompt_tokens > r.usage.prompt_tokens and off.choices[0].message.content and
          getattr(off.choices[0].message, "reasoning_content", None) is None,
          "chat_template_kwargs enable_thinking false: the template closes <think>, the reply is content")
    for what, extra in [("chat_template_kwargs not an object", {"chat_template_kwargs": "x"}),
                        ("an unknown reasoning_format", {"reasoning_format": "loud"})]:
        try:
            client.chat.completions.create(**request, extra_body=extra)
            check(False, f"{what}: 400")
        except openai.BadRequestError as e:
            check(e.status_code == 400, f"{what}: 400 ({e.body['message']})")

with tempfile.TemporaryDirectory() as tmp:
    missing = os.path.join(tmp, "missing.jinja")
    out = subprocess.run([BIN, "serve", "-m", MODEL, "--port", "0", "--chat-template-file", missing],
                         capture_output=True, text=True, timeout=60)
    check(out.returncode != 0 and "missing.jinja" in out.stderr,
          "--chat-template-file of a missing file: an error naming it")
print("all tool calling checks passed")
