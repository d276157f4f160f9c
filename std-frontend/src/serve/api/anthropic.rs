//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`), for the
//! clients written against it (the `anthropic` SDKs, agents that take `ANTHROPIC_BASE_URL`),
//! as llama-server and vLLM serve it. A request is read into the chat route's (messages with
//! their text, `tool_use` and `tool_result` blocks; tools; `tool_choice`; `thinking`;
//! `output_config.format`), so that tools, reasoning, structured output and sampling are the
//! chat route's own; the answer is written back as
//! content blocks (`thinking`, `text`, `tool_use`) and, streamed, as Anthropic's events.
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use super::{
    launch, parse_body, prepare_chat, read_body, request_id, sse, ApiError, ApiResult, AppState,
    Ended, Piece, StreamShape, Usage, LLAMA_SAMPLING,
};

/// An error in Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`), with the
/// status the chat route gave it.
pub(super) fn anthropic_error(e: ApiError) -> Response {
    let kind = match e.status {
        StatusCode::BAD_REQUEST => "invalid_request_error",
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        _ => "api_error",
    };
    let status = e.status;
    let retry = status == StatusCode::SERVICE_UNAVAILABLE;
    let body = json!({ "type": "error", "error": { "type": kind, "message": e.message } });
    let mut response = (status, Json(body)).into_response();
    if retry {
        response.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static("1"),
        );
    }
    response
}

/// Whether a request's path is one of this module's, whose errors take Anthropic's shape.
pub(super) fn is_anthropic_path(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(message)
}

/// A block list's text: its `text` blocks joined by newlines (what a text-only model reads).
fn blocks_text(content: &Value, what: &str) -> ApiResult<String> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for b in blocks {
                match (b.get("type").and_then(Value::as_str), b.get("text")) {
                    (Some("text"), Some(Value::String(t))) => texts.push(t.as_str()),
                    (Some(other), _) if other != "text" => {
                        return Err(bad(format!(
                            "{what}: {other} blocks are not supported here (text only)"
                        )))
                    }
                    _ => return Err(bad(format!("{what}: a text block needs its text"))),
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err(bad(format!(
            "{what} must be a string or an array of blocks"
        ))),
    }
}

/// A user turn's messages in the chat route's shape: its tool results as `tool` messages (in
/// order, before its text), then its text.
fn user_messages(content: &Value, out: &mut Vec<Value>) -> ApiResult<()> {
    let Value::Array(blocks) = content else {
        out.push(json!({ "role": "user", "content": blocks_text(content, "a user message")? }));
        return Ok(());
    };
    let mut texts = Vec::new();
    for b in blocks {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => match b.get("text") {
                Some(Value::String(t)) => texts.push(t.clone()),
                _ => return Err(bad("a user message: a text block needs its text")),
            },
            Some("tool_result") => {
                let Some(Value::String(id)) = b.get("tool_use_id") else {
                    return Err(bad("a tool_result block needs its tool_use_id"));
                };
                let mut text = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => blocks_text(c, "a tool_result's content")?,
                };
                if b.get("is_error") == Some(&Value::Bool(true)) {
                    text.insert_str(0, "Error: ");
                }
                out.push(json!({ "role": "tool", "tool_call_id": id, "content": text }));
            }
            Some(other) => {
                return Err(bad(format!(
                    "a user message: {other} blocks are not supported here (text and \
                     tool_result only)"
                )))
            }
            None => return Err(bad("a user message: a block without a type")),
        }
    }
    if !texts.is_empty() {
        out.push(json!({ "role": "user", "content": texts.join("\n") }));
    }
    Ok(())
}

/// An assistant turn in the chat route's shape: its text, and its `tool_use` blocks as calls
/// (earlier thinking is left out, as the chat templates leave it).
fn assistant_message(content: &Value) -> ApiResult<Value> {
    let Value::Array(blocks) = content else {
        let text = blocks_text(content, "an assistant message")?;
        return Ok(json!({ "role": "assistant", "content": text }));
    };
    let mut texts = Vec::new();
    let mut calls = Vec::new();
    for b in blocks {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => match b.get("text") {
                Some(Value::String(t)) => texts.push(t.as_str()),
                _ => return Err(bad("an assistant message: a text block needs its text")),
            },
            Some("tool_use") => {
                let (Some(Value::String(id)), Some(Value::String(name)), Some(input)) =
                    (b.get("id"), b.get("name"), b.get("input"))
                else {
                    return Err(bad("a tool_use block needs its id, name and input"));
                };
                calls.push(json!({ "id": id, "type": "function",
                                   "function": { "name": name, "arguments": input.to_string() } }));
            }
            Some("thinking" | "redacted_thinking") => {}
            Some(other) => {
                return Err(bad(format!(
                    "an assistant message: {other} blocks are not supported here"
                )))
            }
            None => return Err(bad("an assistant message: a block without a type")),
        }
    }
    let mut message = json!({ "role": "assistant", "content": texts.join("\n") });
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    Ok(message)
}

/// The chat route's request for a Messages API request.
fn chat_request(body: &Value) -> ApiResult<Value> {
    let mut chat = Map::new();
    // Anthropic's fields of the same meaning, and the chat route's sampling extensions and
    // grammar.
    let same = [
        "model",
        "temperature",
        "top_p",
        "top_k",
        "stream",
        "seed",
        "grammar",
        "grammar_lazy",
        "grammar_triggers",
        "presence_penalty",
        "frequency_penalty",
    ];
    for key in same.into_iter().chain(LLAMA_SAMPLING) {
        if let Some(v) = body.get(key) {
            chat.insert(key.into(), v.clone());
        }
    }
    match body.get("max_tokens") {
        Some(v) if v.as_u64().is_some_and(|n| n > 0) => {
            chat.insert("max_tokens".into(), v.clone());
        }
        _ => {
            return Err(bad(
                "max_tokens must be a positive integer (it is required)",
            ))
        }
    }
    if let Some(stop) = body.get("stop_sequences").filter(|v| !v.is_null()) {
        // The chat route's limit (OpenAI's): a 400 naming this field, not `stop`.
        let Some(list) = stop
            .as_array()
            .filter(|l| l.len() <= 4 && l.iter().all(Value::is_string))
        else {
            return Err(bad("stop_sequences must be an array of up to 4 strings"));
        };
        chat.insert("stop".into(), Value::Array(list.clone()));
    }
    let mut messages = Vec::new();
    match body.get("system") {
        None | Some(Value::Null) => {}
        Some(system) => {
            let text = blocks_text(system, "system")?;
            messages.push(json!({ "role": "system", "content": text }));
        }
    }
    let Some(Value::Array(turns)) = body.get("messages") else {
        return Err(bad("messages must be an array"));
    };
    for turn in turns {
        let content = turn.get("content").unwrap_or(&Value::Null);
        match turn.get("role").and_then(Value::as_str) {
            Some("user") => user_messages(content, &mut messages)?,
            Some("assistant") => messages.push(assistant_message(content)?),
            _ => return Err(bad("a message's role must be user or assistant")),
        }
    }
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = body.get("tools").filter(|v| !v.is_null()) {
        let Value::Array(tools) = tools else {
            return Err(bad("tools must be an array"));
        };
        let functions = tools
            .iter()
            .map(|t| {
                match t.get("type").and_then(Value::as_str) {
                    None | Some("custom") => {}
                    Some(other) => {
                        return Err(bad(format!(
                            "tools: {other} is one of Anthropic's own tools, which this server \
                             does not run"
                        )))
                    }
                }
                let mut function = json!({ "name": t.get("name").cloned().unwrap_or(Value::Null) });
                if let Some(d) = t.get("description") {
                    function["description"] = d.clone();
                }
                if let Some(schema) = t.get("input_schema") {
                    function["parameters"] = schema.clone();
                }
                Ok(json!({ "type": "function", "function": function }))
            })
            .collect::<ApiResult<Vec<_>>>()?;
        chat.insert("tools".into(), Value::Array(functions));
    }
    if let Some(choice) = body.get("tool_choice").filter(|v| !v.is_null()) {
        let openai = match choice.get("type").and_then(Value::as_str) {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => match choice.get("name") {
                Some(Value::String(name)) => {
                    json!({ "type": "function", "function": { "name": name } })
                }
                _ => return Err(bad("tool_choice of type tool needs the tool's name")),
            },
            _ => return Err(bad("tool_choice's type must be auto, any, tool or none")),
        };
        chat.insert("tool_choice".into(), openai);
        if choice.get("disable_parallel_tool_use") == Some(&Value::Bool(true)) {
            chat.insert("parallel_tool_calls".into(), json!(false));
        }
    }
    // Structured outputs: `output_config.format` (and the older `output_format`).
    let format = body
        .pointer("/output_config/format")
        .filter(|v| !v.is_null());
    if let Some(format) = format.or(body.get("output_format").filter(|v| !v.is_null())) {
        match (
            format.get("type").and_then(Value::as_str),
            format.get("schema"),
        ) {
            (Some("json_schema"), Some(schema)) => {
                let json_schema = json!({ "name": "output", "schema": schema });
                chat.insert(
                    "response_format".into(),
                    json!({ "type": "json_schema", "json_schema": json_schema }),
                );
            }
            _ => {
                return Err(bad(
                    "output_config.format must be {\"type\": \"json_schema\", \"schema\": ...}",
                ))
            }
        }
    }
    if let Some(thinking) = body.get("thinking").filter(|v| !v.is_null()) {
        let on = match thinking.get("type").and_then(Value::as_str) {
            Some("enabled") => true,
            Some("disabled") => false,
            _ => return Err(bad("thinking's type must be enabled or disabled")),
        };
        chat.insert(
            "chat_template_kwargs".into(),
            json!({ "enable_thinking": on }),
        );
    }
    Ok(Value::Object(chat))
}

/// Anthropic's `stop_reason` and `stop_sequence` of a reply that ended so.
fn stop_reason(ended: &Ended) -> (&'static str, Value) {
    match (ended.reason, &ended.stop_string) {
        ("tool_calls", _) => ("tool_use", Value::Null),
        ("length", _) => ("max_tokens", Value::Null),
        (_, Some(s)) => ("stop_sequence", json!(s)),
        _ => ("end_turn", Value::Null),
    }
}

/// A call's `tool_use` block (its arguments, JSON text, as the input object).
fn tool_use_block(call: &Value) -> Value {
    let function = &call["function"];
    let input = function["arguments"]
        .as_str()
        .and_then(|a| serde_json::from_str::<Value>(a).ok())
        .unwrap_or_else(|| json!({}));
    json!({ "type": "tool_use", "id": call["id"], "name": function["name"], "input": input })
}

/// Which kind of content block a stream has open.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    Thinking,
    ToolUse,
}

/// Anthropic's streamed events: `message_start`, each content block's start, deltas and stop,
/// `message_delta` with the stop reason and usage, `message_stop`.
struct MessageEvents {
    /// The message as `message_start` shows it.
    message: Value,
    open: Option<Block>,
    /// The index of the next block.
    next: usize,
}

fn event(name: &'static str, v: Value) -> SseEvent {
    SseEvent::default().event(name).data(v.to_string())
}

impl MessageEvents {
    fn close(&mut self, out: &mut Vec<SseEvent>) {
        if self.open.take().is_some() {
            let index = self.next - 1;
            out.push(event(
                "content_block_stop",
                json!({ "type": "content_block_stop", "index": index }),
            ));
        }
    }

    /// Opens a block of `kind` (its start showing `block`) unless one is open, and returns
    /// its index.
    fn ensure(&mut self, kind: Block, block: Value, out: &mut Vec<SseEvent>) -> usize {
        if self.open != Some(kind) {
            self.start(kind, block, out);
        }
        self.next - 1
    }

    /// Closes the open block and starts `block`, of `kind`.
    fn start(&mut self, kind: Block, block: Value, out: &mut Vec<SseEvent>) {
        self.close(out);
        out.push(event(
            "content_block_start",
            json!({ "type": "content_block_start", "index": self.next, "content_block": block }),
        ));
        self.open = Some(kind);
        self.next += 1;
    }
}

impl StreamShape for MessageEvents {
    fn piece(&mut self, _: usize, piece: Piece<'_>) -> Vec<SseEvent> {
        let mut out = Vec::new();
        match piece {
            Piece::Open => out.push(event(
                "message_start",
                json!({ "type": "message_start", "message": self.message }),
            )),
            Piece::Text("", _) | Piece::Reasoning("") | Piece::Prompt(_) => {}
            Piece::Text(text, _) => {
                let block = json!({ "type": "text", "text": "" });
                let index = self.ensure(Block::Text, block, &mut out);
                let delta = json!({ "type": "text_delta", "text": text });
                out.push(event(
                    "content_block_delta",
                    json!({ "type": "content_block_delta", "index": index, "delta": delta }),
                ));
            }
            Piece::Reasoning(text) => {
                let block = json!({ "type": "thinking", "thinking": "", "signature": "" });
                let index = self.ensure(Block::Thinking, block, &mut out);
                let delta = json!({ "type": "thinking_delta", "thinking": text });
                out.push(event(
                    "content_block_delta",
                    json!({ "type": "content_block_delta", "index": index, "delta": delta }),
                ));
            }
            Piece::Call(_, id, name) => {
                let block = json!({ "type": "tool_use", "id": id, "name": name, "input": {} });
                self.start(Block::ToolUse, block, &mut out);
            }
            Piece::Arguments(_, delta) => {
                let delta = json!({ "type": "input_json_delta", "partial_json": delta });
                out.push(event(
                    "content_block_delta",
                    json!({ "type": "content_block_delta", "index": self.next - 1,
                            "delta": delta }),
                ));
            }
            Piece::Finish(ended) => {
                self.close(&mut out);
                let (reason, sequence) = stop_reason(&ended);
                out.push(event(
                    "message_delta",
                    json!({ "type": "message_delta",
                            "delta": { "stop_reason": reason, "stop_sequence": sequence },
                            "usage": { "output_tokens": ended.completion_tokens } }),
                ));
                out.push(event("message_stop", json!({ "type": "message_stop" })));
            }
        }
        out
    }

    fn end(&mut self, _: &Usage) -> Vec<SseEvent> {
        Vec::new()
    }

    fn error(&mut self, message: &str) -> SseEvent {
        event(
            "error",
            json!({ "type": "error", "error": { "type": "api_error", "message": message } }),
        )
    }
}

/// `POST /v1/messages`.
pub async fn messages(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match message(&state, body).await {
        Ok(r) => r,
        Err(e) => anthropic_error(e),
    }
}

async fn message(state: &AppState, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let body = parse_body(&read_body(state, body)?)?;
    let mut request = chat_request(&body)?;
    // Anthropic's max_tokens is a ceiling, and agents send their model's (32000 and more):
    // above this server's limit it is lowered to it, not refused.
    if request["max_tokens"].as_u64() > Some(state.max_tokens_limit as u64) {
        request["max_tokens"] = json!(state.max_tokens_limit);
    }
    let chat = prepare_chat(state, &request)?;
    let input_tokens = chat.ids.len();
    let launched = launch(state, &chat.ids, &chat.g, &state.end_of_turn, chat.reply())?;
    let id = request_id("msg").replacen('-', "_", 1);
    if chat.g.stream {
        let shape = MessageEvents {
            message: json!({
                "id": id, "type": "message", "role": "assistant", "model": state.model_id,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": { "input_tokens": input_tokens, "output_tokens": 0 },
            }),
            open: None,
            next: 0,
        };
        return Ok(sse(launched.streamed(), input_tokens, shape).into_response());
    }
    let choice = launched.wholes().await?.remove(0);
    let mut content = Vec::new();
    if !choice.reply.reasoning.is_empty() {
        content.push(
            json!({ "type": "thinking", "thinking": choice.reply.reasoning, "signature": "" }),
        );
    }
    if !choice.reply.content.is_empty() {
        content.push(json!({ "type": "text", "text": choice.reply.content }));
    }
    content.extend(choice.reply.calls.iter().map(tool_use_block));
    // A reply of nothing at all is one empty text block (where clients read the first).
    if content.is_empty() {
        content.push(json!({ "type": "text", "text": "" }));
    }
    let ended = Ended {
        reason: choice.finish,
        stop_string: choice.whole.stop_string,
        completion_tokens: choice.whole.completion_tokens,
        cached_tokens: choice.whole.cached_tokens,
    };
    let (reason, sequence) = stop_reason(&ended);
    Ok(Json(json!({
        "id": id, "type": "message", "role": "assistant", "model": state.model_id,
        "content": content, "stop_reason": reason, "stop_sequence": sequence,
        "usage": { "input_tokens": input_tokens, "output_tokens": ended.completion_tokens },
    }))
    .into_response())
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens, `max_tokens` not needed.
pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let counted = (|| {
        let mut body = parse_body(&read_body(&state, body)?)?;
        body["max_tokens"] = json!(1);
        body["stream"] = json!(false);
        let chat = prepare_chat(&state, &chat_request(&body)?)?;
        Ok(Json(json!({ "input_tokens": chat.ids.len() })).into_response())
    })();
    counted.unwrap_or_else(anthropic_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_with_tools_reads_as_the_chat_routes() {
        let body = json!({
            "model": "m", "max_tokens": 64, "stop_sequences": ["END"], "top_k": 5,
            "system": [{"type": "text", "text": "Be terse."}, {"type": "text", "text": "Use tools."}],
            "tools": [{"name": "get_weather", "description": "Weather",
                       "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "thinking": {"type": "disabled"},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "...", "signature": ""},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "18C"}]},
                    {"type": "tool_result", "tool_use_id": "t2", "content": "down", "is_error": true},
                    {"type": "text", "text": "Thanks."}]},
            ],
        });
        let want = json!({
            "model": "m", "max_tokens": 64, "stop": ["END"], "top_k": 5,
            "messages": [
                {"role": "system", "content": "Be terse.\nUse tools."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "Let me look.", "tool_calls": [
                    {"id": "t1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "t1", "content": "18C"},
                {"role": "tool", "tool_call_id": "t2", "content": "Error: down"},
                {"role": "user", "content": "Thanks."},
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather",
                       "description": "Weather", "parameters": {"type": "object"}}}],
            "tool_choice": "required",
            "parallel_tool_calls": false,
            "chat_template_kwargs": {"enable_thinking": false},
        });
        assert_eq!(chat_request(&body).ok(), Some(want));
    }

    #[test]
    fn stop_reasons_follow_how_the_reply_ended() {
        let ended = |reason, stop: Option<&str>| Ended {
            reason,
            stop_string: stop.map(str::to_owned),
            completion_tokens: 1,
            cached_tokens: 0,
        };
        assert_eq!(stop_reason(&ended("stop", None)).0, "end_turn");
        assert_eq!(
            stop_reason(&ended("stop", Some("END"))),
            ("stop_sequence", json!("END"))
        );
        assert_eq!(stop_reason(&ended("length", None)).0, "max_tokens");
        assert_eq!(stop_reason(&ended("tool_calls", None)).0, "tool_use");
    }
}
