//! OpenAI's Responses API (`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`), for
//! the clients written against it (the `openai` SDKs' `responses`, Codex and other agents), as
//! vLLM and Ollama serve it. A request's `instructions` and `input` items are read into the
//! chat route's messages, with its `tools`, `tool_choice`, `text.format` and `reasoning`, so
//! that tools, reasoning, structured output and sampling are the chat route's own; the answer
//! is written back as output items (`reasoning`, `message`, `function_call`) and, streamed, as
//! the API's events. Stored responses (`store`, on by default) are kept in memory, the oldest
//! dropped past a bound, so that `previous_response_id` can continue a conversation.
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use super::super::detokenize::{chat_logprobs, Reported};
use super::{
    launch, now_secs, parse_body, prepare_chat, read_body, request_id, sse, ApiError, ApiResult,
    AppState, Ended, Piece, StreamShape, Usage, LLAMA_SAMPLING, MAX_TOP_LOGPROBS,
};

/// Most responses kept for `previous_response_id` and `GET /v1/responses/{id}`.
const STORED_RESPONSES: usize = 1024;
/// Most bytes (as JSON text) the kept responses and their conversations take together.
const STORED_BYTES: usize = 64 << 20;

/// A stored response: the object as answered, and its conversation as the chat route's
/// messages (the previous responses', this one's input and its reply; never the instructions,
/// which the API does not carry over).
struct Stored {
    id: String,
    response: Value,
    history: Vec<Value>,
    bytes: usize,
}

/// The stored responses, oldest first, and the bytes they take.
#[derive(Default)]
struct Kept {
    responses: VecDeque<Stored>,
    bytes: usize,
}

/// The responses this server keeps, in memory: at most `STORED_RESPONSES` of them in at most
/// `STORED_BYTES`, the oldest dropped first (the newest is always kept).
#[derive(Default)]
pub struct ResponseStore {
    kept: Mutex<Kept>,
}

impl ResponseStore {
    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        // A panic while holding the lock leaves the list whole: every change is one push/pop.
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn insert(&self, id: String, response: Value, history: Vec<Value>) {
        let bytes =
            response.to_string().len() + history.iter().map(|m| m.to_string().len()).sum::<usize>();
        let mut kept = self.kept();
        kept.bytes += bytes;
        kept.responses.push_back(Stored {
            id,
            response,
            history,
            bytes,
        });
        while kept.responses.len() > 1
            && (kept.responses.len() > STORED_RESPONSES || kept.bytes > STORED_BYTES)
        {
            if let Some(old) = kept.responses.pop_front() {
                kept.bytes -= old.bytes;
            }
        }
    }

    /// The response stored as `id` and its conversation.
    fn get(&self, id: &str) -> Option<(Value, Vec<Value>)> {
        let kept = self.kept();
        let stored = kept.responses.iter().find(|s| s.id == id)?;
        Some((stored.response.clone(), stored.history.clone()))
    }

    /// Forgets the response stored as `id`; whether there was one.
    fn remove(&self, id: &str) -> bool {
        let mut kept = self.kept();
        let Some(at) = kept.responses.iter().position(|s| s.id == id) else {
            return false;
        };
        if let Some(old) = kept.responses.remove(at) {
            kept.bytes -= old.bytes;
        }
        true
    }
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(message)
}

fn not_found(id: &str) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        kind: "invalid_request_error",
        code: None,
        message: format!("no response with id {id:?} is stored here"),
    }
}

/// A content part list's text (`input_text`, `output_text`, and the chat route's `text`)
/// joined, or a string as it is.
fn parts_text(content: &Value, what: &str) -> ApiResult<String> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("input_text" | "output_text" | "text"), Some(Value::String(t))) => {
                        text += t
                    }
                    (Some("refusal"), _) => {
                        text += p.get("refusal").and_then(Value::as_str).unwrap_or("")
                    }
                    (Some(other), _) if !other.ends_with("text") => {
                        return Err(bad(format!(
                            "{what}: {other} parts are not supported here (text only)"
                        )))
                    }
                    _ => return Err(bad(format!("{what}: a text part needs its text"))),
                }
            }
            Ok(text)
        }
        _ => Err(bad(format!(
            "{what} must be a string or an array of content parts"
        ))),
    }
}

/// `input` as the chat route's messages: a string is one user message; items are messages
/// (`developer` read as `system`), `function_call`s (the assistant's calls, joined to the
/// assistant message before them) and `function_call_output`s (`tool` messages); earlier
/// `reasoning` items are left out, as chat templates leave out earlier thinking.
fn input_messages(input: &Value) -> ApiResult<Vec<Value>> {
    let items = match input {
        Value::String(text) => return Ok(vec![json!({ "role": "user", "content": text })]),
        Value::Array(items) => items,
        _ => return Err(bad("input must be a string or an array of items")),
    };
    let mut messages: Vec<Value> = Vec::with_capacity(items.len());
    for item in items {
        let kind = item.get("type").and_then(Value::as_str);
        match kind {
            None | Some("message") => {
                let role =
                    match item.get("role").and_then(Value::as_str) {
                        Some("developer" | "system") => "system",
                        Some(role @ ("user" | "assistant")) => role,
                        _ => return Err(bad(
                            "an input message's role must be user, assistant, system or developer",
                        )),
                    };
                let content = item.get("content").unwrap_or(&Value::Null);
                let text = parts_text(content, "an input message's content")?;
                messages.push(json!({ "role": role, "content": text }));
            }
            Some("function_call") => {
                let (Some(Value::String(call_id)), Some(Value::String(name))) =
                    (item.get("call_id"), item.get("name"))
                else {
                    return Err(bad("a function_call item needs its call_id and name"));
                };
                let arguments = match item.get("arguments") {
                    Some(Value::String(a)) => a.clone(),
                    None | Some(Value::Null) => "{}".into(),
                    Some(_) => return Err(bad("a function_call's arguments must be a string")),
                };
                let call = json!({ "id": call_id, "type": "function",
                                   "function": { "name": name, "arguments": arguments } });
                let joins = messages
                    .last()
                    .is_some_and(|m| m["role"] == "assistant" && m.get("tool_call_id").is_none());
                if joins {
                    let last = messages.last_mut().expect("checked above");
                    match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                        Some(calls) => calls.push(call),
                        None => last["tool_calls"] = json!([call]),
                    }
                } else {
                    messages.push(json!({ "role": "assistant", "content": "",
                                          "tool_calls": [call] }));
                }
            }
            Some("function_call_output") => {
                let Some(Value::String(call_id)) = item.get("call_id") else {
                    return Err(bad("a function_call_output item needs its call_id"));
                };
                let output = item.get("output").unwrap_or(&Value::Null);
                let text = parts_text(output, "a function_call_output's output")?;
                messages.push(json!({ "role": "tool", "tool_call_id": call_id, "content": text }));
            }
            Some("reasoning") => {}
            Some(other) => {
                return Err(bad(format!(
                    "input items of type {other} are not supported here (message, \
                     function_call, function_call_output and reasoning are)"
                )))
            }
        }
    }
    Ok(messages)
}

/// The system messages a conversation starts with, joined into one (templates take one
/// system message, first).
fn join_leading_system(messages: Vec<Value>) -> Vec<Value> {
    let leading = messages
        .iter()
        .take_while(|m| m["role"] == "system")
        .count();
    if leading < 2 {
        return messages;
    }
    let mut rest = messages.into_iter();
    let texts: Vec<String> = rest
        .by_ref()
        .take(leading)
        .map(|m| m["content"].as_str().unwrap_or("").to_owned())
        .collect();
    let mut out = vec![json!({ "role": "system", "content": texts.join("\n\n") })];
    out.extend(rest);
    out
}

/// A Responses request read: the chat route's request, the conversation to store with the
/// reply, and the response object before its output.
struct ResponseRequest {
    chat: Value,
    history: Vec<Value>,
    head: Value,
    store: bool,
}

/// `tools` in the chat route's shape (functions only).
fn chat_tools(tools: &Value) -> ApiResult<Value> {
    let Value::Array(tools) = tools else {
        return Err(bad("tools must be an array"));
    };
    let functions = tools
        .iter()
        .map(|t| {
            match t.get("type").and_then(Value::as_str) {
                Some("function") => {}
                Some(other) => {
                    return Err(bad(format!(
                        "tools: {other} is one of OpenAI's hosted tools, which this server does \
                         not run (function tools are supported)"
                    )))
                }
                None => return Err(bad("tools: a tool needs its type (function)")),
            }
            let mut function = Map::new();
            for key in ["name", "description", "parameters", "strict"] {
                if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
                    function.insert(key.into(), v.clone());
                }
            }
            Ok(json!({ "type": "function", "function": function }))
        })
        .collect::<ApiResult<Vec<_>>>()?;
    Ok(Value::Array(functions))
}

/// `tool_choice` in the chat route's shape.
fn chat_tool_choice(choice: &Value) -> ApiResult<Value> {
    match choice {
        Value::String(s) if ["auto", "none", "required"].contains(&s.as_str()) => {
            Ok(choice.clone())
        }
        Value::Object(o) if o.get("type") == Some(&json!("function")) => match o.get("name") {
            Some(Value::String(name)) => {
                Ok(json!({ "type": "function", "function": { "name": name } }))
            }
            _ => Err(bad(
                "tool_choice of type function needs the function's name",
            )),
        },
        _ => Err(bad(
            "tool_choice must be auto, none, required or {\"type\": \"function\", \"name\"}",
        )),
    }
}

/// `text.format` as the chat route's `response_format` (`None` for text).
fn chat_response_format(format: &Value) -> ApiResult<Option<Value>> {
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({ "type": "json_object" }))),
        Some("json_schema") => {
            let Some(schema) = format.get("schema") else {
                return Err(bad("text.format of type json_schema needs its schema"));
            };
            let name = format.get("name").cloned().unwrap_or(json!("output"));
            let json_schema = json!({ "name": name, "schema": schema });
            Ok(Some(
                json!({ "type": "json_schema", "json_schema": json_schema }),
            ))
        }
        _ => Err(bad(
            "text.format's type must be text, json_object or json_schema",
        )),
    }
}

/// Fields that ask for what this server does not do: a 400 naming them.
fn refuse_unsupported(body: &Value) -> ApiResult<()> {
    if body.get("background") == Some(&Value::Bool(true)) {
        return Err(bad(
            "background responses are not supported by this server (stream instead)",
        ));
    }
    match body.get("truncation") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "disabled" => {}
        Some(_) => {
            return Err(bad(
                "truncation must be \"disabled\": this server does not drop earlier input \
                 (a conversation longer than the context is a 400)",
            ))
        }
    }
    for key in ["conversation", "prompt"] {
        if body.get(key).is_some_and(|v| !v.is_null()) {
            return Err(bad(format!("{key} is not supported by this server")));
        }
    }
    Ok(())
}

/// What `include` names that asks for the output text's log-probabilities.
const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

/// Whether the request asks for its reply's log-probabilities (`include` names
/// `message.output_text.logprobs`, or `top_logprobs` is above 0), and with how many likeliest
/// tokens at each position. `include`'s other values name what this server has none of
/// (hosted tools' results, encrypted reasoning), so they add nothing.
fn requested_logprobs(body: &Value) -> ApiResult<Option<usize>> {
    let included = match body.get("include") {
        None | Some(Value::Null) => false,
        Some(Value::Array(items)) => {
            let mut included = false;
            for item in items {
                let Some(item) = item.as_str() else {
                    return Err(bad("include must be an array of strings"));
                };
                included |= item == INCLUDE_LOGPROBS;
            }
            included
        }
        Some(_) => return Err(bad("include must be an array of strings")),
    };
    let top = match body.get("top_logprobs") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .filter(|n| *n as usize <= MAX_TOP_LOGPROBS)
            .ok_or_else(|| {
                bad(format!(
                    "top_logprobs must be a whole number from 0 to {MAX_TOP_LOGPROBS}"
                ))
            })? as usize,
    };
    Ok((included || top > 0).then_some(top))
}

/// Tokens' log-probabilities as an output text's `logprobs`: `{token, logprob, bytes,
/// top_logprobs}` each, as the chat route has them.
fn logprob_entries(state: &AppState, tokens: &[Reported]) -> Vec<Value> {
    if tokens.is_empty() {
        return Vec::new();
    }
    match chat_logprobs(&state.tokenizer, tokens)["content"].take() {
        Value::Array(entries) => entries,
        _ => Vec::new(),
    }
}

/// Reads a Responses request into the chat route's, with the stored conversation it
/// continues.
fn read_request(state: &AppState, body: &Value) -> ApiResult<ResponseRequest> {
    refuse_unsupported(body)?;
    let store = match body.get("store") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("store must be a boolean")),
    };
    let previous = match body.get("previous_response_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id.as_str()),
        Some(_) => return Err(bad("previous_response_id must be a string")),
    };
    let mut history = match previous {
        Some(id) => state.responses.get(id).ok_or_else(|| not_found(id))?.1,
        None => Vec::new(),
    };
    let instructions = match body.get("instructions") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => return Err(bad("instructions must be a string")),
    };
    let logprobs = requested_logprobs(body)?;
    history.extend(input_messages(body.get("input").unwrap_or(&json!([])))?);
    if history.is_empty() {
        return Err(bad("input must be a string or a non-empty array of items"));
    }
    let mut messages: Vec<Value> = instructions
        .map(|i| json!({ "role": "system", "content": i }))
        .into_iter()
        .collect();
    messages.extend(history.iter().cloned());

    let mut chat = Map::new();
    // The chat route's fields of the same meaning, and its extensions (sampling, grammar).
    let same = [
        "model",
        "temperature",
        "top_p",
        "stream",
        "parallel_tool_calls",
        "seed",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "reasoning_format",
        "grammar",
        "grammar_lazy",
        "grammar_triggers",
    ];
    for key in same.into_iter().chain(LLAMA_SAMPLING) {
        if let Some(v) = body.get(key) {
            chat.insert(key.into(), v.clone());
        }
    }
    chat.insert(
        "messages".into(),
        Value::Array(join_leading_system(messages)),
    );
    match body.get("max_output_tokens") {
        None | Some(Value::Null) => {}
        // A ceiling: above this server's limit it is lowered to it, not refused.
        Some(v) => match v.as_u64().filter(|&n| n > 0) {
            Some(n) => {
                chat.insert(
                    "max_tokens".into(),
                    json!(n.min(state.max_tokens_limit as u64)),
                );
            }
            None => return Err(bad("max_output_tokens must be a positive integer")),
        },
    }
    if let Some(tools) = body.get("tools").filter(|v| !v.is_null()) {
        chat.insert("tools".into(), chat_tools(tools)?);
    }
    if let Some(choice) = body.get("tool_choice").filter(|v| !v.is_null()) {
        chat.insert("tool_choice".into(), chat_tool_choice(choice)?);
    }
    let format = body.pointer("/text/format").filter(|v| !v.is_null());
    if let Some(response_format) = format.map(chat_response_format).transpose()?.flatten() {
        chat.insert("response_format".into(), response_format);
    }
    let variables = template_variables(body)?;
    if !variables.is_empty() {
        chat.insert("chat_template_kwargs".into(), Value::Object(variables));
    }
    if let Some(top) = logprobs {
        chat.insert("logprobs".into(), json!(true));
        chat.insert("top_logprobs".into(), json!(top));
    }

    let head = response_head(state, body, chat.get("max_tokens"), store);
    Ok(ResponseRequest {
        chat: Value::Object(chat),
        history,
        head,
        store,
    })
}

/// The request's template variables: its `chat_template_kwargs`, and `reasoning.effort` as
/// `enable_thinking` (off for `none`) and `reasoning_effort`.
fn template_variables(body: &Value) -> ApiResult<Map<String, Value>> {
    let mut variables = match body.get("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(v)) => v.clone(),
        Some(_) => return Err(bad("chat_template_kwargs must be an object")),
    };
    let effort = body.pointer("/reasoning/effort").filter(|v| !v.is_null());
    match effort.map(|e| e.as_str()) {
        None => {}
        Some(Some("none")) => {
            variables.insert("enable_thinking".into(), json!(false));
        }
        Some(Some(e @ ("minimal" | "low" | "medium" | "high" | "xhigh"))) => {
            variables.insert("enable_thinking".into(), json!(true));
            variables.insert("reasoning_effort".into(), json!(e));
        }
        Some(_) => {
            return Err(bad(
                "reasoning.effort must be none, minimal, low, medium, high or xhigh",
            ))
        }
    }
    Ok(variables)
}

/// A new response's id: its time and 64 bits no client can guess (std's per-process random
/// hash keys), since a stored response is read back by its id alone.
fn response_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let time = request_id("resp").replacen('-', "_", 1);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write(time.as_bytes());
    format!("{time}{:016x}", hasher.finish())
}

/// The response object before its output: its id, and the request's settings as it echoes
/// them (`max_tokens`: the chat route's, after lowering).
fn response_head(state: &AppState, body: &Value, max_tokens: Option<&Value>, store: bool) -> Value {
    let field = |key: &str, default: Value| match body.get(key) {
        None | Some(Value::Null) => default,
        Some(v) => v.clone(),
    };
    let format = match body.pointer("/text/format") {
        None | Some(Value::Null) => json!({ "type": "text" }),
        Some(f) => f.clone(),
    };
    json!({
        "id": response_id(),
        "object": "response",
        "created_at": now_secs(),
        "status": "in_progress",
        "background": false,
        "completed_at": null,
        "error": null,
        "incomplete_details": null,
        "instructions": body.get("instructions"),
        "max_output_tokens": max_tokens,
        "metadata": field("metadata", json!({})),
        "model": state.model_id,
        "output": [],
        "parallel_tool_calls": field("parallel_tool_calls", json!(true)),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": { "effort": body.pointer("/reasoning/effort"), "summary": null },
        "store": store,
        "temperature": field("temperature", json!(1.0)),
        "text": { "format": format },
        "tool_choice": field("tool_choice", json!("auto")),
        "tools": field("tools", json!([])),
        "top_logprobs": field("top_logprobs", json!(0)),
        "top_p": field("top_p", json!(1.0)),
        "truncation": "disabled",
        "usage": null,
        "user": field("user", Value::Null),
    })
}

/// An output item's id: its kind's prefix, the response's id stem and the item's index.
fn item_id(prefix: &str, response_id: &str, index: usize) -> String {
    let stem = response_id.trim_start_matches("resp_");
    format!("{prefix}_{stem}{index:02}")
}

fn output_text(text: &str, logprobs: &[Value]) -> Value {
    json!({ "type": "output_text", "text": text, "annotations": [], "logprobs": logprobs })
}

fn reasoning_text(text: &str) -> Value {
    json!({ "type": "reasoning_text", "text": text })
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({ "type": "reasoning", "id": id, "summary": [], "status": status,
            "content": [reasoning_text(text)] })
}

fn message_item(id: &str, text: &str, logprobs: &[Value], status: &str) -> Value {
    json!({ "type": "message", "id": id, "status": status, "role": "assistant",
            "content": [output_text(text, logprobs)] })
}

/// A call (in OpenAI's chat shape) as a `function_call` item.
fn function_call_item(id: &str, call: &Value, arguments: &str, status: &str) -> Value {
    json!({ "type": "function_call", "id": id, "call_id": call["id"],
            "name": call["function"]["name"], "arguments": arguments, "status": status })
}

/// The reply as the chat route's assistant message, for the stored conversation.
fn assistant_message(content: &str, calls: &[Value]) -> Value {
    let mut message = json!({ "role": "assistant", "content": content });
    if !calls.is_empty() {
        message["tool_calls"] = json!(calls);
    }
    message
}

/// What a reply holds once it has ended: its parts, how it ended, and its tokens.
struct Finished<'a> {
    reasoning: &'a str,
    content: &'a str,
    /// The reply's tokens' log-probabilities (`logprob_entries`), when asked for: the
    /// message's, as the chat route reports them (reasoning's and calls' tokens too).
    logprobs: &'a [Value],
    calls: &'a [Value],
    ended: &'a Ended,
    input_tokens: usize,
    /// The tokens of the reasoning's text.
    reasoning_tokens: usize,
}

/// The response object of a reply that ended: `head` with its output items, status and
/// usage. `incomplete` when the reply ran out of tokens.
fn finished_response(head: &Value, output: Vec<Value>, f: &Finished<'_>) -> Value {
    let mut response = head.clone();
    let out_of_tokens = f.ended.reason == "length";
    response["status"] = json!(if out_of_tokens {
        "incomplete"
    } else {
        "completed"
    });
    if out_of_tokens {
        response["incomplete_details"] = json!({ "reason": "max_output_tokens" });
    } else {
        response["completed_at"] = json!(now_secs());
    }
    response["output"] = Value::Array(output);
    let output_tokens = f.ended.completion_tokens;
    response["usage"] = json!({
        "input_tokens": f.input_tokens,
        "input_tokens_details": { "cached_tokens": f.ended.cached_tokens },
        "output_tokens": output_tokens,
        "output_tokens_details": { "reasoning_tokens": f.reasoning_tokens },
        "total_tokens": f.input_tokens + output_tokens,
    });
    response
}

/// The output items of a whole reply: its reasoning, its text and its calls, in that order.
fn output_items(id: &str, f: &Finished<'_>) -> Vec<Value> {
    let status = if f.ended.reason == "length" {
        "incomplete"
    } else {
        "completed"
    };
    let mut items = Vec::new();
    if !f.reasoning.is_empty() {
        items.push(reasoning_item(
            &item_id("rs", id, items.len()),
            f.reasoning,
            status,
        ));
    }
    // A reply of nothing at all is one empty message.
    if !f.content.is_empty() || (items.is_empty() && f.calls.is_empty()) {
        items.push(message_item(
            &item_id("msg", id, items.len()),
            f.content,
            f.logprobs,
            status,
        ));
    }
    for call in f.calls {
        let arguments = call["function"]["arguments"].as_str().unwrap_or("{}");
        let item_id = item_id("fc", id, items.len());
        items.push(function_call_item(&item_id, call, arguments, status));
    }
    items
}

/// Which kind of output item a stream has open.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Reasoning,
    Message,
}

/// The Responses API's streamed events: `response.created` and `response.in_progress`, each
/// output item's `added`, deltas, `done`, then `response.completed` (or
/// `response.incomplete`) with the whole response, which is stored where the request asks.
struct ResponseEvents {
    head: Value,
    /// The conversation to store with the reply; `None` when not storing.
    history: Option<Vec<Value>>,
    state: Arc<AppState>,
    /// Items done, in order.
    output: Vec<Value>,
    /// The open item's kind and text.
    open: Option<(Open, String)>,
    /// The open message's tokens' log-probabilities (when asked for).
    logprobs: Vec<Value>,
    /// Those of tokens reported with no text of the message (before it opened, or held back
    /// text's), for its next delta.
    pending: Vec<Value>,
    /// The open call in the chat route's shape, and its arguments so far (filled in when it
    /// ends).
    call: Option<(Value, String)>,
    reasoning: String,
    content: String,
    calls: Vec<Value>,
    ended: Option<Ended>,
    sequence: u64,
}

impl ResponseEvents {
    fn event(&mut self, kind: &'static str, mut v: Value) -> SseEvent {
        v["type"] = json!(kind);
        v["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        SseEvent::default().event(kind).data(v.to_string())
    }

    fn response_id(&self) -> String {
        self.head["id"].as_str().unwrap_or_default().to_owned()
    }

    /// Ends the open item: its text's `done`, its part's and its own.
    fn close(&mut self, out: &mut Vec<SseEvent>) {
        let status = match &self.ended {
            Some(e) if e.reason == "length" => "incomplete",
            _ => "completed",
        };
        if let Some((call, arguments)) = self.call.take() {
            self.close_call(call, arguments, status, out);
        }
        let Some((kind, text)) = self.open.take() else {
            return;
        };
        let index = self.output.len();
        let (item, part, done) = match kind {
            Open::Reasoning => {
                let id = item_id("rs", &self.response_id(), index);
                let item = reasoning_item(&id, &text, status);
                (item, reasoning_text(&text), "response.reasoning_text.done")
            }
            Open::Message => {
                let id = item_id("msg", &self.response_id(), index);
                self.logprobs.append(&mut self.pending);
                let item = message_item(&id, &text, &self.logprobs, status);
                let part = output_text(&text, &self.logprobs);
                (item, part, "response.output_text.done")
            }
        };
        let at = json!({ "item_id": item["id"], "output_index": index, "content_index": 0 });
        let mut text_done = at.clone();
        text_done["text"] = json!(text);
        if kind == Open::Message {
            text_done["logprobs"] = json!(std::mem::take(&mut self.logprobs));
        }
        out.push(self.event(done, text_done));
        let mut part_done = at;
        part_done["part"] = part;
        out.push(self.event("response.content_part.done", part_done));
        out.push(self.event(
            "response.output_item.done",
            json!({ "output_index": index, "item": item }),
        ));
        self.output.push(item);
    }

    /// Streams `delta` into an item of `kind`, opening one (and closing another) as needed; a
    /// message's with its tokens' log-probabilities `logprobs` (and those pending).
    fn delta(&mut self, kind: Open, delta: &str, logprobs: Vec<Value>, out: &mut Vec<SseEvent>) {
        if self.open.as_ref().map(|(k, _)| *k) != Some(kind) {
            self.close(out);
            let index = self.output.len();
            let (item, part) = match kind {
                Open::Reasoning => {
                    let id = item_id("rs", &self.response_id(), index);
                    let mut item = reasoning_item(&id, "", "in_progress");
                    item["content"] = json!([]);
                    (item, reasoning_text(""))
                }
                Open::Message => {
                    let id = item_id("msg", &self.response_id(), index);
                    let mut item = message_item(&id, "", &[], "in_progress");
                    item["content"] = json!([]);
                    (item, output_text("", &[]))
                }
            };
            let item_id = item["id"].clone();
            out.push(self.event(
                "response.output_item.added",
                json!({ "output_index": index, "item": item }),
            ));
            out.push(self.event(
                "response.content_part.added",
                json!({ "item_id": item_id, "output_index": index, "content_index": 0,
                        "part": part }),
            ));
            self.open = Some((kind, String::new()));
        }
        let index = self.output.len();
        let id = match kind {
            Open::Reasoning => item_id("rs", &self.response_id(), index),
            Open::Message => item_id("msg", &self.response_id(), index),
        };
        let mut v = json!({ "item_id": id, "output_index": index, "content_index": 0,
                            "delta": delta });
        let name = match kind {
            Open::Reasoning => {
                self.reasoning += delta;
                "response.reasoning_text.delta"
            }
            Open::Message => {
                self.content += delta;
                let mut logprobs = logprobs;
                if !self.pending.is_empty() {
                    logprobs.splice(0..0, self.pending.drain(..));
                }
                self.logprobs.extend(logprobs.iter().cloned());
                v["logprobs"] = json!(logprobs);
                "response.output_text.delta"
            }
        };
        if let Some((_, text)) = &mut self.open {
            *text += delta;
        }
        out.push(self.event(name, v));
    }

    /// A call's item begins: added, in progress.
    fn call(&mut self, id: &str, name: &str, out: &mut Vec<SseEvent>) {
        self.close(out);
        let index = self.output.len();
        let item_id = item_id("fc", &self.response_id(), index);
        let call = json!({ "id": id, "type": "function",
                           "function": { "name": name, "arguments": "" } });
        let added = function_call_item(&item_id, &call, "", "in_progress");
        out.push(self.event(
            "response.output_item.added",
            json!({ "output_index": index, "item": added }),
        ));
        self.call = Some((call, String::new()));
    }

    /// More of the open call's arguments.
    fn arguments(&mut self, delta: &str, out: &mut Vec<SseEvent>) {
        let Some((_, arguments)) = &mut self.call else {
            return;
        };
        *arguments += delta;
        let index = self.output.len();
        let id = item_id("fc", &self.response_id(), index);
        out.push(self.event(
            "response.function_call_arguments.delta",
            json!({ "item_id": id, "output_index": index, "delta": delta }),
        ));
    }

    /// The open call's end: its arguments done, the item done.
    fn close_call(
        &mut self,
        mut call: Value,
        arguments: String,
        status: &str,
        out: &mut Vec<SseEvent>,
    ) {
        let index = self.output.len();
        let id = item_id("fc", &self.response_id(), index);
        out.push(self.event(
            "response.function_call_arguments.done",
            json!({ "item_id": id, "output_index": index, "arguments": arguments,
                    "name": call["function"]["name"] }),
        ));
        let item = function_call_item(&id, &call, &arguments, status);
        out.push(self.event(
            "response.output_item.done",
            json!({ "output_index": index, "item": item }),
        ));
        self.output.push(item);
        call["function"]["arguments"] = json!(arguments);
        self.calls.push(call);
    }
}

impl StreamShape for ResponseEvents {
    fn piece(&mut self, _: usize, piece: Piece<'_>) -> Vec<SseEvent> {
        let mut out = Vec::new();
        match piece {
            Piece::Open => {
                let response = json!({ "response": self.head });
                out.push(self.event("response.created", response.clone()));
                out.push(self.event("response.in_progress", response));
            }
            Piece::Reasoning("") | Piece::Prompt(_) => {}
            Piece::Text("", tokens) => {
                let entries = logprob_entries(&self.state, tokens);
                self.pending.extend(entries);
            }
            Piece::Text(text, tokens) => {
                let entries = logprob_entries(&self.state, tokens);
                self.delta(Open::Message, text, entries, &mut out);
            }
            Piece::Reasoning(text) => self.delta(Open::Reasoning, text, Vec::new(), &mut out),
            Piece::Call(_, id, name) => self.call(id, name, &mut out),
            Piece::Arguments(_, delta) => self.arguments(delta, &mut out),
            Piece::Finish(ended) => {
                self.ended = Some(ended);
                self.close(&mut out);
            }
        }
        out
    }

    fn end(&mut self, usage: &Usage) -> Vec<SseEvent> {
        let Some(ended) = self.ended.take() else {
            return Vec::new();
        };
        let finished = Finished {
            reasoning: &self.reasoning,
            content: &self.content,
            logprobs: &[],
            calls: &self.calls,
            ended: &ended,
            input_tokens: usage.prompt_tokens,
            reasoning_tokens: reasoning_tokens(&self.state, &self.reasoning),
        };
        let mut output = std::mem::take(&mut self.output);
        // A reply of nothing at all is one empty message, as whole answers have it.
        if output.is_empty() {
            let id = item_id("msg", &self.response_id(), 0);
            let logprobs = std::mem::take(&mut self.pending);
            output.push(message_item(&id, "", &logprobs, "completed"));
        }
        let response = finished_response(&self.head, output, &finished);
        if let Some(mut history) = self.history.take() {
            history.push(assistant_message(&self.content, &self.calls));
            let id = self.response_id();
            self.state.responses.insert(id, response.clone(), history);
        }
        let kind = match response["status"].as_str() {
            Some("incomplete") => "response.incomplete",
            _ => "response.completed",
        };
        vec![self.event(kind, json!({ "response": response }))]
    }

    fn error(&mut self, message: &str) -> SseEvent {
        self.event(
            "error",
            json!({ "code": "server_error", "message": message, "param": null }),
        )
    }
}

/// The tokens of a reply's reasoning text (what `output_tokens_details.reasoning_tokens`
/// counts).
fn reasoning_tokens(state: &AppState, reasoning: &str) -> usize {
    if reasoning.is_empty() {
        return 0;
    }
    state.tokenizer.encode(reasoning).map_or(0, |ids| ids.len())
}

/// `POST /v1/responses`.
pub async fn create_response(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let body = parse_body(&read_body(&state, body)?)?;
    let request = read_request(&state, &body)?;
    let chat = prepare_chat(&state, &request.chat)?;
    let input_tokens = chat.ids.len();
    let launched = launch(&state, &chat.ids, &chat.g, &state.end_of_turn, chat.reply())?;
    if chat.g.stream {
        let shape = ResponseEvents {
            head: request.head,
            history: request.store.then_some(request.history),
            state: state.clone(),
            output: Vec::new(),
            open: None,
            logprobs: Vec::new(),
            pending: Vec::new(),
            reasoning: String::new(),
            content: String::new(),
            calls: Vec::new(),
            call: None,
            ended: None,
            sequence: 0,
        };
        return Ok(sse(launched.streamed(), input_tokens, shape).into_response());
    }
    let choice = launched.wholes().await?.remove(0);
    let ended = Ended {
        reason: choice.finish,
        stop_string: choice.whole.stop_string,
        completion_tokens: choice.whole.completion_tokens,
        cached_tokens: choice.whole.cached_tokens,
    };
    let reply = &choice.reply;
    let logprobs = logprob_entries(&state, &choice.whole.logprobs);
    let finished = Finished {
        reasoning: &reply.reasoning,
        content: &reply.content,
        logprobs: &logprobs,
        calls: &reply.calls,
        ended: &ended,
        input_tokens,
        reasoning_tokens: reasoning_tokens(&state, &reply.reasoning),
    };
    let id = request.head["id"].as_str().unwrap_or_default().to_owned();
    let output = output_items(&id, &finished);
    let response = finished_response(&request.head, output, &finished);
    if request.store {
        let mut history = request.history;
        history.push(assistant_message(&reply.content, &reply.calls));
        state.responses.insert(id, response.clone(), history);
    }
    Ok(Json(response).into_response())
}

/// `GET /v1/responses/{id}`: a stored response.
pub async fn get_response(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let (response, _) = state.responses.get(&id).ok_or_else(|| not_found(&id))?;
    Ok(Json(response))
}

/// `DELETE /v1/responses/{id}`: forgets a stored response.
pub async fn delete_response(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    if !state.responses.remove(&id) {
        return Err(not_found(&id));
    }
    Ok(Json(
        json!({ "id": id, "object": "response.deleted", "deleted": true }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_items_read_as_the_chat_routes_messages() {
        let input = json!([
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "Weather in "},
                         {"type": "input_text", "text": "Paris?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather",
             "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "18C"},
            {"type": "function_call_output", "call_id": "c2",
             "output": [{"type": "input_text", "text": "noon"}]},
            {"type": "function_call", "call_id": "c3", "name": "get_weather", "arguments": "{}"},
        ]);
        let call = |id: &str, name: &str, arguments: &str| {
            json!({"id": id, "type": "function",
                   "function": {"name": name, "arguments": arguments}})
        };
        let want = vec![
            json!({"role": "system", "content": "Use tools."}),
            json!({"role": "user", "content": "Weather in Paris?"}),
            json!({"role": "assistant", "content": "Let me look.", "tool_calls": [
                call("c1", "get_weather", "{\"city\":\"Paris\"}"),
                call("c2", "get_time", "{}")]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "18C"}),
            json!({"role": "tool", "tool_call_id": "c2", "content": "noon"}),
            json!({"role": "assistant", "content": "",
                   "tool_calls": [call("c3", "get_weather", "{}")]}),
        ];
        assert_eq!(input_messages(&input).ok(), Some(want));
        assert_eq!(
            input_messages(&json!("Hi")).ok(),
            Some(vec![json!({"role": "user", "content": "Hi"})])
        );
        for bad_input in [
            json!(7),
            json!([{"role": "tool", "content": "x"}]),
            json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
            json!([{"type": "function_call", "name": "f"}]),
            json!([{"type": "function_call_output", "output": "x"}]),
            json!([{"type": "web_search_call", "id": "w"}]),
        ] {
            assert!(input_messages(&bad_input).is_err(), "{bad_input}");
        }
    }

    #[test]
    fn leading_system_messages_join() {
        let messages = vec![
            json!({"role": "system", "content": "A"}),
            json!({"role": "system", "content": "B"}),
            json!({"role": "user", "content": "C"}),
            json!({"role": "system", "content": "D"}),
        ];
        assert_eq!(
            join_leading_system(messages),
            vec![
                json!({"role": "system", "content": "A\n\nB"}),
                json!({"role": "user", "content": "C"}),
                json!({"role": "system", "content": "D"}),
            ]
        );
    }

    #[test]
    fn tools_choices_and_formats_read_as_the_chat_routes() {
        let tools = json!([{"type": "function", "name": "f", "description": "d",
                            "parameters": {"type": "object"}, "strict": true}]);
        assert_eq!(
            chat_tools(&tools).ok(),
            Some(
                json!([{"type": "function", "function": {"name": "f", "description": "d",
                         "parameters": {"type": "object"}, "strict": true}}])
            )
        );
        assert!(chat_tools(&json!([{"type": "web_search"}])).is_err());
        assert_eq!(
            chat_tool_choice(&json!({"type": "function", "name": "f"})).ok(),
            Some(json!({"type": "function", "function": {"name": "f"}}))
        );
        assert_eq!(
            chat_tool_choice(&json!("required")).ok(),
            Some(json!("required"))
        );
        assert!(chat_tool_choice(&json!("any")).is_err());
        assert_eq!(
            chat_response_format(&json!({"type": "text"})).ok(),
            Some(None)
        );
        assert_eq!(
            chat_response_format(&json!({"type": "json_schema", "name": "n",
                                         "schema": {"type": "object"}}))
            .ok(),
            Some(Some(json!({"type": "json_schema",
                             "json_schema": {"name": "n", "schema": {"type": "object"}}})))
        );
        assert!(chat_response_format(&json!({"type": "json_schema"})).is_err());
    }

    #[test]
    fn the_store_keeps_the_newest_within_its_bounds() {
        let store = ResponseStore::default();
        for i in 0..STORED_RESPONSES + 3 {
            store.insert(format!("r{i}"), json!(i), Vec::new());
        }
        assert!(store.get("r2").is_none());
        assert_eq!(store.get("r3").map(|s| s.0), Some(json!(3)));
        assert!(store.remove("r3"));
        assert!(!store.remove("r3"));
        let big = "x".repeat(STORED_BYTES / 2);
        store.insert("big1".into(), json!(big), Vec::new());
        store.insert("big2".into(), json!(big), Vec::new());
        assert!(store.get("big1").is_none(), "past the byte bound");
        assert!(store.get("big2").is_some(), "the newest is kept");
    }

    #[test]
    fn a_reply_that_ran_out_of_tokens_is_incomplete() {
        let head = json!({"id": "resp_1", "status": "in_progress", "output": []});
        let ended = |reason| Ended {
            reason,
            stop_string: None,
            completion_tokens: 5,
            cached_tokens: 2,
        };
        let calls = [json!({"id": "c1", "type": "function",
                            "function": {"name": "f", "arguments": "{}"}})];
        let finish = |ended: &Ended, calls: &[Value]| {
            let f = Finished {
                reasoning: "hmm",
                content: "Hi",
                logprobs: &[],
                calls,
                ended,
                input_tokens: 7,
                reasoning_tokens: 1,
            };
            finished_response(&head, output_items("resp_1", &f), &f)
        };
        let r = finish(&ended("length"), &[]);
        assert_eq!(r["status"], "incomplete");
        assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(r["usage"]["total_tokens"], 12);
        assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 2);
        let kinds: Vec<&Value> = r["output"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| &i["type"])
            .collect();
        assert_eq!(kinds, [&json!("reasoning"), &json!("message")]);
        let r = finish(&ended("tool_calls"), &calls);
        assert_eq!(r["status"], "completed");
        assert_eq!(r["output"][2]["type"], "function_call");
        assert_eq!(r["output"][2]["call_id"], "c1");
        assert_eq!(r["output"][2]["id"], "fc_102");
    }
}
