//! llama-server's own routes, in its own shapes, for the clients written against them:
//! `/completion` (a prompt's continuation: Continue's llama.cpp provider, scripts) and `/infill`
//! (fill in the middle: llama.vim, llama.vscode). `n_predict` is their `max_tokens`; the other
//! fields are the completions route's. Answers are `{"content", "stop", "stop_type", ...}`,
//! whole, or streamed as such events with no `[DONE]` after the last.
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::{
    check_model, count, data, fim_prompt, generation, launch, parse_body, prompt_ids, read_body,
    sse, ApiError, ApiResult, AppState, Ended, Generation, Kind, Piece, ReplyParsing, StreamShape,
    Usage,
};
use crate::infill::{ExtraFile, FimRequest};

/// A native route's body, parsed, with its generation settings. The model need not be named
/// (llama-server serves one); fields of OpenAI's routes these answers have no place for are
/// refused.
fn native_request(state: &AppState, body: &[u8], route: &str) -> ApiResult<(Value, Generation)> {
    let mut body = parse_body(body)?;
    if body.get("model").is_some_and(|m| !m.is_null()) {
        check_model(state, &body)?;
    }
    for key in ["echo", "suffix", "logprobs", "n_probs", "tools"] {
        if body.get(key).is_some_and(|v| !v.is_null()) {
            return Err(ApiError::bad_request(format!(
                "{key} is not a field of {route}"
            )));
        }
    }
    if count(&body, "n", 1)? != 1 {
        return Err(ApiError::bad_request(format!(
            "{route} answers one choice (n = 1)"
        )));
    }
    // Negative: no limit but the context's.
    match body
        .get("n_predict")
        .filter(|v| !v.is_null())
        .map(Value::as_i64)
    {
        None => {}
        Some(Some(n)) if n < 0 => {}
        Some(Some(n)) if n > 0 => body["max_tokens"] = json!(n),
        Some(_) => {
            return Err(ApiError::bad_request(
                "n_predict must be a positive integer, or -1 for no limit",
            ))
        }
    }
    let g = generation(&body, Kind::Completion, state.vocab_size)?;
    Ok((body, g))
}

/// llama-server's answer, whole or as the last event of a stream.
fn last(model: &str, content: &str, ended: &Ended, evaluated: usize, truncated: bool) -> Value {
    let stop_type = match (ended.reason, &ended.stop_string) {
        ("length", _) => "limit",
        (_, Some(_)) => "word",
        _ => "eos",
    };
    json!({
        "index": 0, "content": content, "stop": true, "model": model,
        "stop_type": stop_type, "stopping_word": ended.stop_string.as_deref().unwrap_or(""),
        "tokens_predicted": ended.completion_tokens, "tokens_evaluated": evaluated,
        "truncated": truncated,
    })
}

/// llama-server's streamed events.
struct NativeChunks {
    model: String,
    evaluated: usize,
    truncated: bool,
}

impl StreamShape for NativeChunks {
    fn piece(&mut self, _: usize, piece: Piece<'_>) -> Vec<SseEvent> {
        match piece {
            Piece::Text(text, _) => {
                vec![data(json!({ "index": 0, "content": text, "stop": false }))]
            }
            Piece::Finish(ended) => {
                let v = last(&self.model, "", &ended, self.evaluated, self.truncated);
                vec![data(v)]
            }
            Piece::Open
            | Piece::Prompt(_)
            | Piece::Reasoning(_)
            | Piece::Call(..)
            | Piece::Arguments(..) => Vec::new(),
        }
    }

    fn end(&mut self, _: &Usage) -> Vec<SseEvent> {
        Vec::new()
    }

    fn error(&mut self, message: &str) -> SseEvent {
        data(json!({ "error": { "message": message, "type": "server_error" } }))
    }
}

/// Generates from `ids` until one of `stop` (or a stop string, or the limit) and answers in
/// llama-server's shape; `truncated`: the prompt was cut to fit.
async fn native_answer(
    state: &AppState,
    ids: Vec<u32>,
    g: &Generation,
    stop: &[u32],
    truncated: bool,
) -> ApiResult<Response> {
    let evaluated = ids.len();
    let reply = ReplyParsing {
        tools: None,
        reasoning: None,
    };
    let launched = launch(state, &ids, g, stop, reply)?;
    if g.stream {
        let shape = NativeChunks {
            model: state.model_id.clone(),
            evaluated,
            truncated,
        };
        return Ok(sse(launched.streamed(), evaluated, shape).into_response());
    }
    let mut wholes = launched.wholes().await?;
    let choice = wholes.remove(0);
    let ended = Ended {
        reason: choice.finish,
        stop_string: choice.whole.stop_string,
        completion_tokens: choice.whole.completion_tokens,
        cached_tokens: choice.whole.cached_tokens,
    };
    let v = last(
        &state.model_id,
        &choice.reply.content,
        &ended,
        evaluated,
        truncated,
    );
    Ok(Json(v).into_response())
}

/// `/completion` (and `/completions`): `prompt`, text (after the model's BOS where it asks
/// for one) or token ids.
pub async fn completion(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let body = read_body(&state, body)?;
    let (body, g) = native_request(&state, &body, "/completion")?;
    let ids = prompt_ids(
        &state,
        body.get("prompt"),
        "prompt must be a string or an array of token ids",
    )?;
    native_answer(&state, ids, &g, &state.eos, false).await
}

/// `/infill`: `input_prefix`, `input_suffix`, `input_extra` (other files: `filename`, `text`)
/// and `prompt` (the text the middle starts with), as the model's fill-in-the-middle prompt.
pub async fn infill(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let body = read_body(&state, body)?;
    let (body, g) = native_request(&state, &body, "/infill")?;
    let text = |key: &str| match body.get(key) {
        None | Some(Value::Null) => Ok(""),
        Some(Value::String(s)) => Ok(s.as_str()),
        Some(_) => Err(ApiError::bad_request(format!("{key} must be a string"))),
    };
    let extra = match body.get("input_extra") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(files)) => files
            .iter()
            .map(|f| match (f.get("filename"), f.get("text")) {
                (None | Some(Value::Null), Some(Value::String(text))) => Some(ExtraFile {
                    filename: "tmp".into(),
                    text: text.clone(),
                }),
                (Some(Value::String(name)), Some(Value::String(text))) => Some(ExtraFile {
                    filename: name.clone(),
                    text: text.clone(),
                }),
                _ => None,
            })
            .collect::<Option<_>>()
            .ok_or_else(|| {
                ApiError::bad_request(
                    "input_extra must be an array of objects with a text (and a filename)",
                )
            })?,
        Some(_) => return Err(ApiError::bad_request("input_extra must be an array")),
    };
    let request = FimRequest {
        prefix: text("input_prefix")?,
        suffix: text("input_suffix")?,
        middle: text("prompt")?,
        extra: &extra,
    };
    let prompt = fim_prompt(&state, &request, &g)?;
    native_answer(&state, prompt.ids, &g, &state.fim_stop, prompt.truncated).await
}
