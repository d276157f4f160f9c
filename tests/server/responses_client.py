#!/usr/bin/env python3
"""OpenAI's Responses API through `sapient serve`, driven by the official `openai` Python
client's `responses`.

Usage: tests/server/responses_client.py SAPIENT_BINARY MODEL.gguf

A response equals the chat route's reply to the same conversation (greedy), whole and
streamed; `previous_response_id` continues a stored conversation (its prefix found in the
cache), `store: false` keeps nothing; stored responses are retrieved and deleted; tools
(forced, streamed, a result carried back), structured output and reasoning reach it; the
output text's log-probabilities are the chat route's; errors come in OpenAI's shape with their
statuses.
"""
import json
import sys
import urllib.error
import urllib.request

import openai
from openai import OpenAI

import serve_process
from templates import HERMES, THINKING

BIN, MODEL = sys.argv[1], sys.argv[2]
NAME = "smollm2"
KEY = "test-key"
WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather in a city",
           "parameters": {"type": "object", "required": ["city", "unit"], "properties": {
               "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def raw(port, body, key=KEY):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/responses", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json",
                                                         "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def chat_reply(chat, messages, **kw):
    c = chat.chat.completions.create(model=NAME, temperature=0, messages=messages, **kw)
    return c.choices[0], c.usage


def streamed(client, **request):
    """The stream's event types (checked in order of sequence number) and its final response:
    the client's, or the `response.incomplete` event's (which the client's helper does not
    take for final)."""
    types = []
    with client.responses.stream(**request) as s:
        for event in s:
            if event.sequence_number != len(types):
                raise SystemExit(f"FAILED: event {event.type} has sequence number {event.sequence_number}")
            types.append(event.type)
            if event.type == "response.incomplete":
                return types, event.response
        return types, s.get_final_response()


with serve_process.served(BIN, MODEL, NAME, "--api-key", KEY, "--ctx", "1024", "--parallel", "2") as port:
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=120)
    system = "You are a terse geography teacher."
    question = "What is the capital of France?"

    r = client.responses.create(model=NAME, instructions=system, input=question, max_output_tokens=24,
                                temperature=0)
    # Continued at once, while the first turn is still in a slot's cache.
    follow = client.responses.create(model=NAME, previous_response_id=r.id, input="And of Germany?",
                                     instructions=system, max_output_tokens=24, temperature=0)
    check(follow.usage.input_tokens_details.cached_tokens > r.usage.input_tokens // 2,
          f"its earlier turns found in the cache ({follow.usage.input_tokens_details.cached_tokens} "
          f"of {follow.usage.input_tokens} tokens)")
    choice, usage = chat_reply(client, [{"role": "system", "content": system}, {"role": "user", "content": question}],
                               max_tokens=24)
    want = choice.message.content
    status = {"stop": "completed", "length": "incomplete"}[choice.finish_reason]
    check(r.object == "response" and r.id.startswith("resp_") and [o.type for o in r.output] == ["message"] and
          r.output_text == want, "a response: the chat route's reply, as one message item")
    check(r.status == status and r.usage.input_tokens == usage.prompt_tokens and
          r.usage.output_tokens == usage.completion_tokens and
          r.usage.total_tokens == usage.prompt_tokens + usage.completion_tokens,
          f"status {r.status} and usage as chat's")
    check(r.instructions == system and r.max_output_tokens == 24 and r.temperature == 0 and r.store,
          "the request's fields echoed in the response")

    items = client.responses.create(model=NAME, max_output_tokens=24, temperature=0, input=[
        {"role": "developer", "content": system},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is the capital"},
                                                        {"type": "input_text", "text": " of France?"}]}])
    check(items.output_text == want, "input items (a developer message, input_text parts): the same reply")

    types, final = streamed(client, model=NAME, instructions=system, input=question, max_output_tokens=24,
                            temperature=0)
    check(types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                        "response.content_part.added"] and "response.output_text.delta" in types and
          types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                         f"response.{status}"], f"streamed: the API's events in order ({len(types)})")
    check(final.output_text == want and final.status == status and
          final.usage.output_tokens == r.usage.output_tokens, "streamed: the same text, status and usage")

    short = client.responses.create(model=NAME, input=question, max_output_tokens=2, temperature=0)
    check(short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens" and
          short.usage.output_tokens == 2, "out of tokens: incomplete, for max_output_tokens")
    types, final = streamed(client, model=NAME, input=question, max_output_tokens=2, temperature=0)
    check(types[-1] == "response.incomplete" and final.status == "incomplete", "streamed: response.incomplete")

    choice, usage = chat_reply(client, [{"role": "system", "content": system}, {"role": "user", "content": question},
                                        {"role": "assistant", "content": want},
                                        {"role": "user", "content": "And of Germany?"}], max_tokens=24)
    check(follow.output_text == choice.message.content and follow.usage.input_tokens == usage.prompt_tokens and
          follow.previous_response_id == r.id, "previous_response_id: the stored conversation continued")
    chained = client.responses.create(model=NAME, previous_response_id=follow.id, input="And of Italy?",
                                      max_output_tokens=24, temperature=0)
    check(chained.usage.input_tokens > follow.usage.input_tokens, "a chain of three responses")

    check(client.responses.retrieve(r.id).model_dump() == r.model_dump(), "a stored response retrieved as created")
    client.responses.delete(r.id)
    try:
        client.responses.retrieve(r.id)
        check(False, "a deleted response: 404")
    except openai.NotFoundError:
        check(True, "a deleted response: 404")
    unstored = client.responses.create(model=NAME, input=question, max_output_tokens=4, store=False)
    for what, call in [("retrieved", lambda: client.responses.retrieve(unstored.id)),
                       ("continued", lambda: client.responses.create(model=NAME, input="x",
                                                                     previous_response_id=unstored.id))]:
        try:
            call()
            check(False, f"store false: not {what}")
        except openai.NotFoundError:
            check(True, f"store false: a 404 when {what}")

    city = {"type": "object", "required": ["name", "country", "population"], "additionalProperties": False,
            "properties": {"name": {"type": "string"}, "country": {"type": "string"},
                           "population": {"type": "integer"}}}
    for seed in range(3):
        out = client.responses.create(model=NAME, input="Describe Paris.", max_output_tokens=400,
                                      text={"format": {"type": "json_schema", "name": "city", "schema": city}},
                                      temperature=1.0, extra_body={"seed": seed})
        value = json.loads(out.output_text)
        check(out.status == "completed" and set(value) == {"name", "country", "population"} and
              isinstance(value["population"], int), f"text.format json_schema (seed {seed}): a value of the schema")

    digits = client.responses.create(model=NAME, input="How many legs has a cat?", max_output_tokens=8,
                                     temperature=0, extra_body={"grammar": "root ::= [0-9]{1,2}"})
    check(digits.status == "completed" and digits.output_text.isdigit(),
          f"the grammar extension: a sentence of it ({digits.output_text!r})")

    # Log-probabilities: the chat route's for the same conversation, whole and streamed.
    chat = client.chat.completions.create(model=NAME, temperature=0, max_tokens=12, logprobs=True, top_logprobs=3,
                                          messages=[{"role": "user", "content": question}])
    chat_lp = [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
               for t in chat.choices[0].logprobs.content]
    lp = client.responses.create(model=NAME, input=question, max_output_tokens=12, temperature=0,
                                 include=["message.output_text.logprobs"], top_logprobs=3)
    part = lp.output[0].content[0]
    got = [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]) for t in part.logprobs]
    check(got == chat_lp and len(got) == lp.usage.output_tokens and "".join(t[0] for t in got) == part.text and
          all(len(t[2]) == 3 and t[2][0][1] >= t[2][-1][1] for t in got) and lp.top_logprobs == 3,
          f"include message.output_text.logprobs, top_logprobs 3: the chat route's ({len(got)} tokens)")
    deltas, done = [], None
    with client.responses.stream(model=NAME, input=question, max_output_tokens=12, temperature=0,
                                 include=["message.output_text.logprobs"], top_logprobs=3) as s:
        for event in s:
            if event.type == "response.output_text.delta":
                deltas += [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
                           for t in event.logprobs]
            if event.type == "response.output_text.done":
                done = [t.token for t in event.logprobs]
        final = s.get_final_response()
    final_lp = [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
                for t in final.output[0].content[0].logprobs]
    check(deltas == chat_lp and done == [t[0] for t in chat_lp] and final_lp == chat_lp,
          "streamed: the deltas' logprobs add up to the same, as do the done event's and the response's")
    plain = client.responses.create(model=NAME, input=question, max_output_tokens=4, temperature=0)
    check(plain.output[0].content[0].logprobs == [], "no logprobs unless asked for")

    try:
        OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0).responses.create(
            model=NAME, input=question)
        check(False, "a wrong key: 401")
    except openai.AuthenticationError:
        check(True, "a wrong key: 401")
    try:
        client.responses.create(model="gpt-nonexistent", input=question)
        check(False, "an unknown model: 404")
    except openai.NotFoundError:
        check(True, "an unknown model: 404")
    bad = [
        ("no input", {}, "input"),
        ("an input of a number", {"input": 7}, "input"),
        ("an image part", {"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]}, "input_image"),
        ("a tool role", {"input": [{"role": "tool", "content": "x"}]}, "role"),
        ("a function_call without its call_id", {"input": [{"type": "function_call", "name": "f"}]}, "call_id"),
        ("a hosted tool", {"input": question, "tools": [{"type": "web_search"}]}, "web_search"),
        ("an unknown tool_choice", {"input": question, "tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ("a format that is not a schema", {"input": question, "text": {"format": {"type": "xml"}}}, "text.format"),
        ("a bad reasoning effort", {"input": question, "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ("background", {"input": question, "background": True}, "background"),
        ("truncation auto", {"input": question, "truncation": "auto"}, "truncation"),
        ("max_output_tokens 0", {"input": question, "max_output_tokens": 0}, "max_output_tokens"),
        ("temperature out of range", {"input": question, "temperature": 5}, "temperature"),
        ("top_logprobs 21", {"input": question, "top_logprobs": 21}, "top_logprobs"),
        ("include of a string", {"input": question, "include": "message.output_text.logprobs"}, "include"),
        ("a prompt longer than the context", {"input": "hello " * 2000}, "context"),
    ]
    for what, body, word in bad:
        status, e = raw(port, {"model": NAME} | body)
        check(status == 400 and e["error"]["type"] == "invalid_request_error" and word in e["error"]["message"],
              f"{what}: 400 naming {word!r}")
    status, e = raw(port, {"model": NAME, "input": "x", "previous_response_id": "resp_nothing"})
    check(status == 404 and "resp_nothing" in e["error"]["message"], "an unknown previous_response_id: 404 naming it")

# Tools through a Hermes template: a forced call comes back as a function_call item, whole and
# streamed alike; its output carried back reads as the chat route's tool message.
with serve_process.served_with_template(BIN, MODEL, NAME, HERMES, "--ctx", "2048") as port:
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    ask = "What is the weather like in Paris?"
    forced = client.responses.create(model=NAME, input=ask, tools=[WEATHER], tool_choice="required",
                                     max_output_tokens=80, temperature=0)
    calls = [o for o in forced.output if o.type == "function_call"]
    args = json.loads(calls[0].arguments) if calls else {}
    check(forced.status == "completed" and calls and calls[0].name == "get_weather" and calls[0].call_id and
          {"city", "unit"} <= set(args) and args["unit"] in ("celsius", "fahrenheit"),
          f"tool_choice required: a function_call item of the schema ({args})")
    types, final = streamed(client, model=NAME, input=ask, tools=[WEATHER],
                            tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=80,
                            temperature=0)
    streamed_calls = [o for o in final.output if o.type == "function_call"]
    deltas = types.count("response.function_call_arguments.delta")
    check(deltas > 1 and "response.function_call_arguments.done" in types and
          [(c.name, json.loads(c.arguments)) for c in streamed_calls] == [(c.name, args) for c in calls[:1]],
          f"a named function, streamed: the same call, its arguments in {deltas} deltas as written")
    result = "18 degrees and sunny"
    answered = client.responses.create(model=NAME, tools=[WEATHER], max_output_tokens=24, temperature=0, input=[
        {"role": "user", "content": ask},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": result}])
    choice, usage = chat_reply(client, [
        {"role": "user", "content": ask},
        {"role": "assistant", "content": "", "tool_calls": [{"id": calls[0].call_id, "type": "function", "function": {
            "name": "get_weather", "arguments": calls[0].arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].call_id, "content": result}], tools=[{
            "type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}],
        max_tokens=24)
    check(answered.usage.input_tokens == usage.prompt_tokens and answered.output_text == (choice.message.content or ""),
          f"a function_call_output carried back: the chat route's prompt ({usage.prompt_tokens} tokens) and reply")
    continued = client.responses.create(model=NAME, previous_response_id=forced.id, tools=[WEATHER],
                                        max_output_tokens=24, temperature=0, input=[
                                            {"type": "function_call_output", "call_id": calls[0].call_id,
                                             "output": result}])
    check(continued.usage.input_tokens == answered.usage.input_tokens,
          "the output after previous_response_id: the same prompt as the whole conversation sent again")

# A thinking template (as Qwen3's): the reasoning comes back as a reasoning item, whole and
# streamed; `reasoning.effort: none` reaches the template.
with serve_process.served_with_template(BIN, MODEL, NAME, THINKING, "--ctx", "1024") as port:
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    request = dict(model=NAME, input="Why is the sky blue?", max_output_tokens=16, temperature=0)
    m = client.responses.create(**request)
    check(m.output[0].type == "reasoning" and m.output[0].content[0].text and
          0 < m.usage.output_tokens_details.reasoning_tokens <= m.usage.output_tokens,
          f"a thinking model: a reasoning item first ({m.usage.output_tokens_details.reasoning_tokens} reasoning tokens)")
    types, final = streamed(client, **request)
    check("response.reasoning_text.delta" in types and
          [o.model_dump(exclude={"id"}) for o in final.output] == [o.model_dump(exclude={"id"}) for o in m.output],
          "a thinking model, streamed: the same items (reasoning_text events)")
    off = client.responses.create(**request, reasoning={"effort": "none"})
    check(off.usage.input_tokens > m.usage.input_tokens and off.output[0].type == "message",
          "reasoning effort none: the template closes <think>, the reply is a message")
print("all Responses API checks passed")
