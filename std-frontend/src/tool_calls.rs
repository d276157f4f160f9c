//! Tool calling (OpenAI's `tools`): the tools put into the prompt the way the model's chat
//! template expects them, and the calls read back out of what the model writes.
//!
//! Each family writes its calls its own way; the template's text says which family it is (as
//! llama.cpp tells them apart). A template that shows no format of its own gets llama.cpp's
//! generic one: the tools described in the system prompt and the reply one JSON object,
//! `{"tool_call": {...}}` or `{"response": "..."}`.
use anyhow::{bail, Result};
use serde_json::{json, Map, Value};

use crate::chat::Message;
use crate::constraint::Trigger;
use crate::json_schema::Schema;

mod partial;

/// The most tools one request may offer.
pub const MAX_TOOLS: usize = 128;

/// A function the model may call.
#[derive(Clone, Debug)]
pub struct Tool {
    pub name: String,
    /// Its arguments' JSON schema (an object of no properties when the request gives none).
    pub parameters: Value,
    /// OpenAI's `{"type": "function", "function": {...}}`, parameters filled in: what
    /// templates read.
    pub spec: Value,
}

impl Tool {
    /// The tools of a request's `tools` array, checked: functions with names of 1 to 64
    /// letters, digits, `_`, `-` or `.` (OpenAI's rule), each named once.
    pub fn list(tools: &Value) -> Result<Vec<Tool>> {
        let Some(list) = tools
            .as_array()
            .filter(|l| (1..=MAX_TOOLS).contains(&l.len()))
        else {
            bail!("tools must be an array of 1 to {MAX_TOOLS} tools");
        };
        let mut out: Vec<Tool> = Vec::with_capacity(list.len());
        for (i, tool) in list.iter().enumerate() {
            match tool.get("type").and_then(Value::as_str) {
                None | Some("function") => {}
                Some(other) => bail!("tools[{i}]: type {other:?} is not supported (function is)"),
            }
            let Some(function) = tool.get("function").and_then(Value::as_object) else {
                bail!("tools[{i}] needs a function object");
            };
            let name = function.get("name").and_then(Value::as_str).unwrap_or("");
            let valid = |c: char| c.is_ascii_alphanumeric() || "_-.".contains(c);
            if name.is_empty() || name.len() > 64 || !name.chars().all(valid) {
                bail!(
                    "tools[{i}]: the function name {name:?} must be 1 to 64 letters, digits, \
                     underscores, dashes or dots"
                );
            }
            if out.iter().any(|t| t.name == name) {
                bail!("tools[{i}]: two tools are named {name:?}");
            }
            if !matches!(function.get("description"), None | Some(Value::String(_))) {
                bail!("tools[{i}]: the description must be a string");
            }
            let parameters = match function.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => bail!("tools[{i}]: parameters must be a JSON schema object"),
            };
            let mut function = function.clone();
            function.insert("parameters".into(), parameters.clone());
            out.push(Tool {
                name: name.to_owned(),
                parameters,
                spec: json!({"type": "function", "function": function}),
            });
        }
        Ok(out)
    }
}

/// A call the model wrote: the function's name and its arguments as JSON text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

/// A reply split into its text for the user and its calls.
#[derive(Debug, PartialEq, Eq)]
pub struct Reply {
    pub content: String,
    pub calls: Vec<ToolCall>,
}

/// A reply that must be a call (`tool_choice` `required` or a named function): the text the
/// reply starts with, put after the prompt, and what the model writes after it.
#[derive(Debug)]
pub struct Forced {
    pub prefix: String,
    pub body: ForcedBody,
}

/// What the model writes after a forced call's prefix.
#[derive(Debug)]
pub enum ForcedBody {
    /// JSON of this schema.
    Json(Value),
    /// One of these openings, then JSON of its schema: a tool's name and `[ARGS]`, then its
    /// arguments (Mistral's `[ARGS]` format, whose call names its tool outside its JSON).
    Named(Vec<(String, Value)>),
}

impl Forced {
    /// The schema of the JSON after the prefix, where the body is JSON alone.
    pub fn schema(&self) -> Option<&Value> {
        match &self.body {
            ForcedBody::Json(schema) => Some(schema),
            ForcedBody::Named(_) => None,
        }
    }
}

/// How a family writes its calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one block per call:
    /// Hermes 2 Pro and 3, Qwen2.5, Qwen3.
    Hermes,
    /// The reply a JSON object `{"name": ..., "parameters": {...}}`, or one after
    /// `<|python_tag|>`: Llama 3.1 to 3.3.
    Llama3,
    /// `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`: Mistral 7B v0.3, Mistral NeMo.
    MistralJson,
    /// `[TOOL_CALLS]name[ARGS]{...}`, once per call: Mistral Small 3.2, Devstral, Ministral 3.
    MistralArgs,
    /// llama.cpp's generic format, for every other template: the tools in the system prompt,
    /// the reply `{"tool_call": {"name": ..., "arguments": {...}}}` or `{"response": "..."}`.
    Generic,
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";

impl ToolFormat {
    pub const ALL: [ToolFormat; 5] = [
        ToolFormat::Hermes,
        ToolFormat::Llama3,
        ToolFormat::MistralJson,
        ToolFormat::MistralArgs,
        ToolFormat::Generic,
    ];

    /// The format a chat template's text shows its model writing calls in.
    pub fn of_template(source: &str) -> Self {
        if source.contains(MISTRAL_CALLS) {
            if source.contains(MISTRAL_ARGS) {
                ToolFormat::MistralArgs
            } else {
                ToolFormat::MistralJson
            }
        } else if source.contains(HERMES_OPEN) {
            ToolFormat::Hermes
        } else if source.contains("<|start_header_id|>") && source.contains("ipython") {
            ToolFormat::Llama3
        } else {
            ToolFormat::Generic
        }
    }

    /// Whether the template itself renders `tools` (the generic format's go into the system
    /// prompt instead).
    pub fn template_renders_tools(self) -> bool {
        self != ToolFormat::Generic
    }

    /// The texts of a call's markup: kept in the reply's text where they are special tokens.
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes => &[HERMES_OPEN, HERMES_CLOSE],
            ToolFormat::Llama3 => &[PYTHON_TAG],
            ToolFormat::MistralJson => &[MISTRAL_CALLS],
            ToolFormat::MistralArgs => &[MISTRAL_CALLS, MISTRAL_ARGS],
            ToolFormat::Generic => &[],
        }
    }

    /// Whether a reply of this format may be a call from its first character on (a JSON
    /// object), so that a stream holds it back until it ends.
    fn calls_from_the_start(self) -> bool {
        matches!(self, ToolFormat::Llama3 | ToolFormat::Generic)
    }

    /// The texts that open a reply's calls (besides the JSON-first formats' opening `{`).
    fn openers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes => &[HERMES_OPEN],
            ToolFormat::Llama3 => &[PYTHON_TAG],
            ToolFormat::MistralJson | ToolFormat::MistralArgs => &[MISTRAL_CALLS],
            ToolFormat::Generic => &[],
        }
    }

    /// Where the calls of a reply's `text` would begin.
    fn calls_start(self, text: &str) -> Option<usize> {
        let start = text.trim_start();
        if self.calls_from_the_start() && start.starts_with('{') {
            return Some(text.len() - start.len());
        }
        self.openers().iter().filter_map(|o| text.find(o)).min()
    }

    /// The reply's content and calls: the text before the calls (less its trailing white
    /// space), the generic format's response, and any text after the calls. A call cut short
    /// (the reply ran out of tokens) is a call as far as it is written, as a stream gives it
    /// out. Text that is not calls stays content, whole.
    pub fn parse(self, text: &str) -> Reply {
        let read = self
            .calls_start(text)
            .and_then(|at| Some((at, partial::read(self, &text[at..], true)?)));
        let Some((at, calls)) = read else {
            return Reply {
                content: text.to_owned(),
                calls: Vec::new(),
            };
        };
        let after = calls.end.map_or("", |end| &text[at + end..]);
        let mut content = text[..at].trim_end().to_owned() + &calls.response.unwrap_or_default();
        content += match content.is_empty() {
            true => after.trim(),
            false => after.trim_end(),
        };
        Reply {
            content,
            calls: calls.calls,
        }
    }

    /// What makes the reply a call of `name` (or, with `None`, of any of `tools`): the prefix
    /// the format opens a call with, and what follows: JSON whose schema makes it a call (a
    /// call to any of several tools is a union told apart by the name, written first), or in
    /// Mistral's `[ARGS]` format a tool's name and `[ARGS]`, then that tool's arguments. A
    /// call's arguments follow its function's schema where the schema compiler takes it (any
    /// object otherwise).
    ///
    /// # Errors
    /// `name` is not one of `tools`.
    pub fn forced(self, tools: &[Tool], name: Option<&str>) -> Result<Forced> {
        let chosen: Vec<&Tool> = match name {
            Some(name) => match tools.iter().find(|t| t.name == name) {
                Some(t) => vec![t],
                None => bail!("tool_choice names {name:?}, which is not one of the tools"),
            },
            None => tools.iter().collect(),
        };
        if self == ToolFormat::MistralArgs {
            let named = chosen
                .iter()
                .map(|t| {
                    let mut defs = Map::new();
                    let schema = with_defs(arguments(t, &mut defs), defs);
                    (format!("{}{MISTRAL_ARGS}", t.name), schema)
                })
                .collect();
            return Ok(Forced {
                prefix: MISTRAL_CALLS.to_owned(),
                body: ForcedBody::Named(named),
            });
        }
        let schema = self.reply_schema(&chosen, |call| match self {
            ToolFormat::Generic => json!({
                "type": "object",
                "properties": {"tool_call": call},
                "required": ["tool_call"],
            }),
            _ => call,
        });
        let prefix = match self {
            ToolFormat::Hermes => format!("{HERMES_OPEN}\n"),
            // The array's closing bracket never comes (the reply ends with the object), and
            // the reading does without it.
            ToolFormat::MistralJson => format!("{MISTRAL_CALLS}["),
            _ => String::new(),
        };
        Ok(Forced {
            prefix,
            body: ForcedBody::Json(schema),
        })
    }

    /// What keeps a reply that may call `tools` (`tool_choice` `auto`) well formed: schemas of
    /// the JSON, each with the texts after which it applies (llama.cpp's lazy grammars: a
    /// call's JSON after the text that opens it, free text elsewhere). One schema for most
    /// formats; Mistral's `[ARGS]` format, whose call names its tool before the JSON, one a
    /// tool: its arguments after `[TOOL_CALLS]name[ARGS]`. The generic format's reply is all
    /// JSON (one schema, no triggers): a call, or a response; where the model `thinks`, from
    /// the reply's start or after its reasoning.
    pub fn auto_constraint(self, tools: &[Tool], thinks: bool) -> Vec<(Value, Vec<Trigger>)> {
        let all: Vec<&Tool> = tools.iter().collect();
        let anywhere = |text: &str| Trigger {
            text: text.as_bytes().to_vec(),
            at_start: false,
        };
        let first_brace = || Trigger {
            text: b"{".to_vec(),
            at_start: true,
        };
        let triggers = match self {
            ToolFormat::Hermes => vec![anywhere(HERMES_OPEN)],
            ToolFormat::Llama3 => vec![first_brace(), anywhere(PYTHON_TAG)],
            // The first call of the list; the list's closing goes free.
            ToolFormat::MistralJson => vec![anywhere(&format!("{MISTRAL_CALLS}["))],
            ToolFormat::MistralArgs => {
                return tools
                    .iter()
                    .map(|t| {
                        let mut defs = Map::new();
                        let schema = with_defs(arguments(t, &mut defs), defs);
                        let opening = format!("{MISTRAL_CALLS}{}{MISTRAL_ARGS}", t.name);
                        (schema, vec![anywhere(&opening)])
                    })
                    .collect()
            }
            ToolFormat::Generic => {
                // One of the two, as llama.cpp's `anyOf` of the two objects has it: a call
                // with a response after it ran on to `max_tokens`, and `{}` said nothing.
                let schema = self.reply_schema(&all, |call| {
                    json!({
                        "type": "object",
                        "properties": {"tool_call": call, "response": {"type": "string"}},
                        "minProperties": 1,
                        "maxProperties": 1,
                    })
                });
                let triggers = match thinks {
                    true => vec![first_brace(), anywhere(crate::reasoning::CLOSE)],
                    false => Vec::new(),
                };
                return vec![(schema, triggers)];
            }
        };
        vec![(self.reply_schema(&all, |call| call), triggers)]
    }

    /// The schema of a reply (`in_reply` puts a call in it) whose call is to one of `chosen`,
    /// each with its arguments' schema, the name telling them apart; where more tools than a
    /// union tells apart are offered, the name one of theirs (or any string, past an enum's
    /// limit) and the arguments any object.
    fn reply_schema(self, chosen: &[&Tool], in_reply: impl Fn(Value) -> Value) -> Value {
        let args_key = match self {
            ToolFormat::Llama3 => "parameters",
            _ => "arguments",
        };
        let mut defs = Map::new();
        let mut calls: Vec<Value> = chosen
            .iter()
            .map(|t| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, args_key: arguments(t, &mut defs)},
                    "required": ["name", args_key],
                })
            })
            .collect();
        let call = match calls.len() {
            1 => calls.remove(0),
            _ => json!({ "anyOf": calls }),
        };
        let typed = with_defs(in_reply(call), defs);
        if Schema::compile(&typed).is_ok() {
            return typed;
        }
        let names: Vec<&str> = chosen.iter().map(|t| t.name.as_str()).collect();
        let named = in_reply(json!({
            "type": "object",
            "properties": {"name": {"enum": names}, args_key: {"type": "object"}},
            "required": ["name", args_key],
        }));
        if Schema::compile(&named).is_ok() {
            return named;
        }
        // More names than an enum holds.
        in_reply(json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, args_key: {"type": "object"}},
            "required": ["name", args_key],
        }))
    }

    /// `messages` as this format's template takes them. The generic format's: the tools
    /// described in the system prompt, earlier calls as the JSON the model wrote, and tool
    /// results as user turns (templates without tools may have no tool role).
    pub fn prompt_messages(self, tools: &[Tool], messages: Vec<Message>) -> Vec<Message> {
        if self != ToolFormat::Generic {
            return messages;
        }
        let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
        let prompt = generic_system_prompt(tools);
        for m in messages {
            match m.role.as_str() {
                "system" | "developer" if out.is_empty() => out.push(Message::text(
                    "system",
                    format!("{}\n\n{prompt}", m.content),
                )),
                "assistant" if m.tool_calls.is_some() => {
                    let calls = m.tool_calls.as_ref().and_then(Value::as_array);
                    let calls: Vec<Value> = calls
                        .into_iter()
                        .flatten()
                        .map(|c| c.get("function").cloned().unwrap_or(Value::Null))
                        .collect();
                    let text = match calls.as_slice() {
                        [one] => json!({ "tool_call": one }),
                        _ => json!({ "tool_calls": calls }),
                    };
                    out.push(Message::text("assistant", text.to_string()));
                }
                "tool" => {
                    let response = json!({"tool_response": {
                        "tool_call_id": m.tool_call_id, "content": m.content,
                    }});
                    out.push(Message::text("user", response.to_string()));
                }
                _ => out.push(m),
            }
        }
        if out.first().map(|m| m.role.as_str()) != Some("system") {
            out.insert(0, Message::text("system", prompt));
        }
        out
    }
}

/// The generic format's instructions, as llama.cpp words them.
fn generic_system_prompt(tools: &[Tool]) -> String {
    let specs: Vec<&Value> = tools.iter().map(|t| &t.spec["function"]).collect();
    format!(
        "You can call any of the following tools to satisfy the user's requests: {}\n\n\
         Respond in JSON format, either with `tool_call` (a request to call a tool) or with \
         `response` (a reply to the user's request): {{\"tool_call\": {{\"name\": TOOL_NAME, \
         \"arguments\": {{...}}}}}} or {{\"response\": \"...\"}}",
        serde_json::to_string_pretty(&specs).unwrap_or_default()
    )
}

/// The schema of `tool`'s arguments: its parameters, their definitions (`$defs`,
/// `definitions`) moved to `defs` for the root, where their `$ref`s point; any object where the
/// compiler does not take the parameters, or a definition's name is another tool's.
fn arguments(tool: &Tool, defs: &mut Map<String, Value>) -> Value {
    let any = json!({"type": "object"});
    if Schema::compile(&tool.parameters).is_err() {
        return any;
    }
    let mut own = tool.parameters.clone();
    let mut moved = Vec::new();
    for key in ["$defs", "definitions"] {
        let Some(Value::Object(these)) = own.as_object_mut().and_then(|o| o.remove(key)) else {
            continue;
        };
        for (name, schema) in these {
            let clash = defs
                .get(key)
                .and_then(|d| d.get(&name))
                .is_some_and(|old| *old != schema);
            if clash {
                return any;
            }
            moved.push((key, name, schema));
        }
    }
    for (key, name, schema) in moved {
        let group = defs.entry(key).or_insert_with(|| json!({}));
        if let Some(group) = group.as_object_mut() {
            group.insert(name, schema);
        }
    }
    own
}

/// `schema` with `defs` at its root.
fn with_defs(mut schema: Value, defs: Map<String, Value>) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.extend(defs);
    }
    schema
}

/// What a stream gives out of a reply as it is written.
#[derive(Debug, PartialEq, Eq)]
pub enum Streamed {
    Content(String),
    /// A call begins: its function's name.
    Call(String),
    /// More of the last call's arguments.
    Arguments(String),
}

/// A streamed reply's text, read as it comes: the text before its calls streams as content,
/// each call's name once whole and its arguments as they are written (`partial` reads them;
/// the pieces add up to what `ToolFormat::parse` makes of the whole reply).
pub struct CallWatch {
    format: ToolFormat,
    /// More than one call (`parallel_tool_calls`); otherwise the first alone.
    parallel: bool,
    text: String,
    /// Bytes of `text` streamed as content before the calls.
    sent: usize,
    /// Where the calls begin in `text`, once seen.
    calls_at: Option<usize>,
    /// Of each call streamed, the bytes of its arguments streamed.
    calls: Vec<usize>,
    /// Bytes streamed of the generic format's response, and of the text after the calls.
    response_sent: usize,
    after_sent: usize,
}

impl CallWatch {
    /// A watch over a reply that starts with `prefix` (a forced call's: it is all call).
    pub fn new(format: ToolFormat, prefix: &str, parallel: bool) -> Self {
        CallWatch {
            format,
            parallel,
            text: prefix.to_owned(),
            sent: 0,
            calls_at: (!prefix.is_empty()).then_some(0),
            calls: Vec::new(),
            response_sent: 0,
            after_sent: 0,
        }
    }

    /// Adds `piece` of the reply; returns what may stream now.
    pub fn push(&mut self, piece: &str) -> Vec<Streamed> {
        self.text += piece;
        let mut out = Vec::new();
        if self.calls_at.is_none() {
            let content = self.before_calls();
            if !content.is_empty() {
                out.push(Streamed::Content(content));
            }
        }
        if self.calls_at.is_some() {
            self.follow(false, &mut out);
        }
        out
    }

    /// The reply's end: what is left to stream, and how many calls it made.
    pub fn finish(&mut self) -> (Vec<Streamed>, usize) {
        let mut out = Vec::new();
        match self.calls_at {
            Some(_) => self.follow(true, &mut out),
            None if self.sent < self.text.len() => {
                out.push(Streamed::Content(self.text[self.sent..].to_owned()))
            }
            None => {}
        }
        (out, self.calls.len())
    }

    /// The content before the calls that may stream now; notes where the calls begin once
    /// they do.
    fn before_calls(&mut self) -> String {
        if self.format.calls_from_the_start() && self.sent == 0 {
            let start = self.text.trim_start();
            if start.starts_with('{') {
                self.calls_at = Some(self.text.len() - start.len());
                return String::new();
            }
            if start.is_empty() || PYTHON_TAG.starts_with(start) {
                return String::new();
            }
        }
        let rest = &self.text[self.sent..];
        let openers = self.format.openers();
        // White space before the calls is not content (`parse` trims it): it waits for what
        // follows it.
        if let Some(at) = openers.iter().filter_map(|m| rest.find(m)).min() {
            self.calls_at = Some(self.sent + at);
            let piece = rest[..at].trim_end().to_owned();
            self.sent += piece.len();
            return piece;
        }
        // Hold back a tail that may be the start of an opener.
        let hold = openers
            .iter()
            .filter_map(|m| (1..m.len()).rev().find(|&k| rest.ends_with(&m[..k])))
            .max()
            .unwrap_or(0);
        let piece = rest[..rest.len() - hold].trim_end().to_owned();
        self.sent += piece.len();
        piece
    }

    /// Streams what more the calls' text holds: the response, calls begun, their arguments,
    /// and the text after the calls once they end.
    fn follow(&mut self, ended: bool, out: &mut Vec<Streamed>) {
        let at = self.calls_at.unwrap_or(0);
        let region = &self.text[at..];
        let Some(calls) = partial::read(self.format, region, ended) else {
            // Not calls: the text is content (none of it streamed yet).
            if ended && self.sent < self.text.len() {
                out.push(Streamed::Content(self.text[self.sent..].to_owned()));
            }
            return;
        };
        if let Some(response) = &calls.response {
            if response.len() > self.response_sent {
                out.push(Streamed::Content(response[self.response_sent..].to_owned()));
                self.response_sent = response.len();
            }
        }
        let limit = if self.parallel { usize::MAX } else { 1 };
        for (k, call) in calls.calls.into_iter().take(limit).enumerate() {
            if k == self.calls.len() {
                out.push(Streamed::Call(call.name));
                self.calls.push(0);
            }
            let sent = &mut self.calls[k];
            if call.arguments.len() > *sent {
                out.push(Streamed::Arguments(call.arguments[*sent..].to_owned()));
                *sent = call.arguments.len();
            }
        }
        if let Some(end) = calls.end {
            let after = &region[end..];
            let after = match self.sent == 0 && self.response_sent == 0 {
                true => after.trim(),
                false => after.trim_end(),
            };
            if after.len() > self.after_sent {
                out.push(Streamed::Content(after[self.after_sent..].to_owned()));
                self.after_sent = after.len();
            }
        }
    }
}

/// A call's id: nine letters and digits (Mistral's templates take no other), from `n`.
pub fn call_id(n: u64) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    // splitmix64: neighbouring `n` give unrelated ids.
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (0..9)
        .map(|i| ALPHABET[(z >> (i * 7)) as usize % ALPHABET.len()] as char)
        .collect()
}

/// The messages' calls in OpenAI's shape with each call's `arguments` as a JSON object where it
/// is one (templates write them with `tojson`).
pub fn template_tool_calls(calls: &Value) -> Option<Value> {
    let calls = calls.as_array()?;
    let out = calls
        .iter()
        .map(|c| {
            let mut c = c.clone();
            if let Some(Value::String(args)) = c.pointer("/function/arguments") {
                if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(args) {
                    c["function"]["arguments"] = v;
                }
            }
            c
        })
        .collect();
    Some(Value::Array(out))
}

/// A call in OpenAI's shape.
pub fn openai_call(call: &ToolCall, id: &str) -> Value {
    let mut function = Map::new();
    function.insert("name".into(), call.name.clone().into());
    function.insert("arguments".into(), call.arguments.clone().into());
    json!({"id": id, "type": "function", "function": function})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    fn weather() -> Vec<Tool> {
        Tool::list(&json!([{"type": "function", "function": {
            "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}}]))
        .unwrap()
    }

    #[test]
    fn each_format_reads_its_calls() {
        let paris = call("get_weather", r#"{"city":"Paris"}"#);
        let cases = [
            (
                ToolFormat::Hermes,
                "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                "Let me look.",
            ),
            (
                ToolFormat::Llama3,
                "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
                "",
            ),
            (
                ToolFormat::Llama3,
                "Checking.<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
                "Checking.",
            ),
            (
                ToolFormat::MistralJson,
                "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcdef123\"}]",
                "",
            ),
            (
                ToolFormat::MistralArgs,
                "Sure. [TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}",
                "Sure.",
            ),
            (
                ToolFormat::Generic,
                " {\"tool_call\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}",
                "",
            ),
        ];
        for (format, text, content) in cases {
            let reply = format.parse(text);
            assert_eq!(reply.content, content, "{format:?}: {text}");
            assert_eq!(
                reply.calls,
                std::slice::from_ref(&paris),
                "{format:?}: {text}"
            );
        }
    }

    #[test]
    fn several_calls_in_one_reply() {
        let two = [call("a", r#"{"x":1}"#), call("b", "{}")];
        let hermes = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>";
        assert_eq!(ToolFormat::Hermes.parse(hermes).calls, two);
        let mistral = "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]";
        assert_eq!(ToolFormat::MistralJson.parse(mistral).calls, two);
        let args = "[TOOL_CALLS]a[ARGS]{\"x\": 1}[TOOL_CALLS]b[ARGS]{}";
        assert_eq!(ToolFormat::MistralArgs.parse(args).calls, two);
        let llama =
            "{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}}";
        assert_eq!(ToolFormat::Llama3.parse(llama).calls, two);
        let generic =
            "{\"tool_calls\": [{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\"}]}";
        assert_eq!(ToolFormat::Generic.parse(generic).calls, two);
    }

    /// Text that is not a whole call stays the reply's content, whatever the format.
    #[test]
    fn text_that_is_not_a_call_is_content() {
        for (format, text) in [
            (
                ToolFormat::Hermes,
                "Use <tool_call> tags, like <tool_call>{\"oops\": 1}",
            ),
            (ToolFormat::Llama3, "{\"answer\": 42}"),
            (ToolFormat::Llama3, "{\"name\": \"a\", \"parameters\": 5}"),
            (ToolFormat::Hermes, "<tool_call>\n{\"name\": 7}</tool_call>"),
            (ToolFormat::MistralJson, "[TOOL_CALLS] not json"),
            (ToolFormat::MistralArgs, "[TOOL_CALLS]a{\"x\": 1}"),
            (ToolFormat::Generic, "{\"tool_call\": {\"arguments\": {}}}"),
            (ToolFormat::Generic, "Plain words."),
        ] {
            let reply = format.parse(text);
            assert!(reply.calls.is_empty(), "{format:?}: {text}");
            assert_eq!(reply.content, text);
        }
        let reply = ToolFormat::Generic.parse("{\"response\": \"It is sunny.\"}");
        assert_eq!(reply.content, "It is sunny.");
        assert!(reply.calls.is_empty());
    }

    #[test]
    fn templates_name_their_format() {
        let cases = [
            ("{{ '<tool_call>\\n' }}", ToolFormat::Hermes),
            (
                "<|start_header_id|>ipython<|end_header_id|>",
                ToolFormat::Llama3,
            ),
            (
                "<|start_header_id|>user<|end_header_id|>",
                ToolFormat::Generic,
            ),
            ("[TOOL_CALLS][", ToolFormat::MistralJson),
            ("[TOOL_CALLS]{{ name }}[ARGS]", ToolFormat::MistralArgs),
            ("<|im_start|>", ToolFormat::Generic),
        ];
        for (source, format) in cases {
            assert_eq!(ToolFormat::of_template(source), format, "{source}");
        }
    }

    #[test]
    fn tool_lists_are_checked() {
        let bad = [
            json!([]),
            json!({"type": "function"}),
            json!([{"type": "retrieval", "function": {"name": "a"}}]),
            json!([{"type": "function"}]),
            json!([{"type": "function", "function": {"name": "has space"}}]),
            json!([{"type": "function", "function": {"name": ""}}]),
            json!([{"type": "function", "function": {"name": "a", "parameters": 3}}]),
            json!([{"function": {"name": "a"}}, {"function": {"name": "a"}}]),
        ];
        for tools in bad {
            assert!(Tool::list(&tools).is_err(), "{tools}");
        }
        let tools = Tool::list(&json!([{"function": {"name": "now"}}])).unwrap();
        assert_eq!(tools[0].spec["function"]["parameters"]["type"], "object");
    }

    /// A forced call: the prefix and any text of the schema parse back into the call.
    #[test]
    fn forced_calls_parse_back() {
        let tools = weather();
        let arguments = r#"{"city":"Paris"}"#;
        for format in ToolFormat::ALL {
            let forced = format.forced(&tools, Some("get_weather")).unwrap();
            let body = match (format, &forced.body) {
                (ToolFormat::MistralArgs, ForcedBody::Named(named)) => {
                    let [(opening, schema)] = &named[..] else {
                        panic!("one tool named");
                    };
                    Schema::compile(schema).unwrap();
                    format!("{opening}{arguments}")
                }
                (_, ForcedBody::Named(_)) => panic!("{format:?}: the name is in the JSON"),
                (ToolFormat::Llama3, ForcedBody::Json(_)) => {
                    format!(r#"{{"name":"get_weather","parameters":{arguments}}}"#)
                }
                (ToolFormat::Generic, ForcedBody::Json(_)) => {
                    format!(r#"{{"tool_call":{{"name":"get_weather","arguments":{arguments}}}}}"#)
                }
                (_, ForcedBody::Json(_)) => {
                    format!(r#"{{"name":"get_weather","arguments":{arguments}}}"#)
                }
            };
            if let Some(schema) = forced.schema() {
                Schema::compile(schema).unwrap();
            }
            let reply = format.parse(&(forced.prefix.clone() + &body));
            assert_eq!(reply.calls, [call("get_weather", arguments)], "{format:?}");
            assert_eq!(reply.content, "");
        }
        assert!(ToolFormat::Hermes.forced(&tools, Some("other")).is_err());
    }

    /// Mistral's `[ARGS]` format forced to call any of several tools: the reply is one tool's
    /// name, `[ARGS]` and JSON of that tool's arguments' schema, nothing else.
    #[test]
    fn a_named_call_to_any_of_several_tools() {
        use crate::constraint::{Automaton, Choice};
        use std::sync::Arc;
        let mut tools = weather();
        tools.extend(
            Tool::list(&json!([{"function": {"name": "get_time", "parameters": {
                "type": "object", "properties": {"zone": {"type": "string"}},
                "required": ["zone"]}}}, {"function": {"name": "get"}}]))
            .unwrap(),
        );
        let forced = ToolFormat::MistralArgs.forced(&tools, None).unwrap();
        assert_eq!(forced.prefix, "[TOOL_CALLS]");
        let ForcedBody::Named(named) = forced.body else {
            panic!("a name, then JSON");
        };
        let options = named
            .iter()
            .map(|(o, s)| (o.as_bytes().to_vec(), Arc::new(Schema::compile(s).unwrap())))
            .collect();
        let choice = Choice::new(options).unwrap();
        let whole = |text: &str| {
            let end = choice.start().feed(&choice, text.as_bytes());
            end.is_some_and(|s| s.is_complete())
        };
        assert!(whole(r#"get_weather[ARGS]{"city": "Paris"}"#));
        assert!(whole(r#"get_time[ARGS]{"zone": "UTC"}"#));
        assert!(whole(r#"get[ARGS]{}"#));
        assert!(!whole(r#"get_time[ARGS]{"city": "Paris"}"#));
        assert!(!whole(r#"get_date[ARGS]{}"#));
        assert!(!whole(r#"get_weather[ARGS]"#));
        assert!(choice.start().feed(&choice, b"got").is_none());
        let reply = ToolFormat::MistralArgs.parse(r#"[TOOL_CALLS]get_time[ARGS]{"zone": "UTC"}"#);
        assert_eq!(reply.calls, [call("get_time", r#"{"zone":"UTC"}"#)]);
    }

    /// A call to any of several tools: the name picks the tool, whose own schema the arguments
    /// keep.
    #[test]
    fn a_call_to_any_of_several_tools_keeps_its_own_schema() {
        use crate::constraint::Automaton;
        let mut tools = weather();
        tools.extend(
            Tool::list(&json!([{"function": {"name": "get_time", "parameters": {
                "type": "object", "properties": {"zone": {"type": "string"}},
                "required": ["zone"]}}}]))
            .unwrap(),
        );
        for format in [ToolFormat::Hermes, ToolFormat::MistralJson] {
            let forced = format.forced(&tools, None).unwrap();
            let schema = Schema::compile(forced.schema().unwrap()).unwrap();
            let whole = |text: &str| {
                let end = schema.start().feed(&schema, text.as_bytes());
                end.is_some_and(|s| s.is_complete())
            };
            assert!(whole(
                r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#
            ));
            assert!(whole(
                r#"{"name": "get_time", "arguments": {"zone": "UTC"}}"#
            ));
            assert!(!whole(
                r#"{"name": "get_time", "arguments": {"city": "Paris"}}"#
            ));
            assert!(!whole(r#"{"name": "get_weather", "arguments": {}}"#));
            assert!(!whole(r#"{"name": "get_date", "arguments": {}}"#));
        }
    }

    /// Parameters with `$defs` keep them at the root their `$ref`s point into; a schema the
    /// compiler does not take leaves the arguments any object.
    #[test]
    fn forced_arguments_keep_their_definitions() {
        let tools = Tool::list(&json!([{"function": {"name": "f", "parameters": {
            "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "required": ["p"],
            "$defs": {"P": {"type": "integer"}}}}}, {"function": {"name": "g", "parameters": {
            "type": "object", "properties": {"s": {"type": "string", "pattern": "^a"}}}}}]))
        .unwrap();
        let forced = |tools: &[Tool], name| {
            let forced = ToolFormat::Hermes.forced(tools, name).unwrap();
            forced.schema().unwrap().clone()
        };
        let f = forced(&tools, Some("f"));
        assert!(f["$defs"]["P"].is_object());
        Schema::compile(&f).unwrap();
        // Two tools' definitions of one name, unlike: the second's arguments are any object.
        let clash = Tool::list(&json!([{"function": {"name": "f", "parameters": {
            "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}},
            "$defs": {"P": {"type": "integer"}}}}}, {"function": {"name": "h", "parameters": {
            "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}},
            "$defs": {"P": {"type": "string"}}}}}]))
        .unwrap();
        let both = forced(&clash, None);
        Schema::compile(&both).unwrap();
        assert_eq!(both["$defs"]["P"]["type"], "integer");
        assert_eq!(
            both["anyOf"][1]["properties"]["arguments"],
            json!({"type": "object"})
        );
        let g = forced(&tools, Some("g"));
        assert_eq!(g["properties"]["arguments"], json!({"type": "object"}));
    }

    /// However many tools a request offers (up to `MAX_TOOLS`), a call's schema compiles.
    #[test]
    fn every_tool_list_has_a_call_schema() {
        for n in [1, 2, 64, 65, MAX_TOOLS] {
            let list: Vec<Value> = (0..n)
                .map(|i| {
                    json!({"function": {"name": format!("f{i}"), "parameters": {
                    "type": "object", "properties": {"x": {"type": "string"}}}}})
                })
                .collect();
            let tools = Tool::list(&Value::Array(list)).unwrap();
            for format in [ToolFormat::Hermes, ToolFormat::Generic] {
                let forced = format.forced(&tools, None).unwrap();
                let schema = forced.schema().unwrap();
                Schema::compile(schema).unwrap_or_else(|e| panic!("{n} tools: {e}"));
                let (auto, _) = &format.auto_constraint(&tools, false)[0];
                Schema::compile(auto).unwrap_or_else(|e| panic!("{n} tools: {e}"));
            }
        }
    }

    /// `auto`: Hermes, Llama 3 and Mistral's JSON list constrain a call after its opening;
    /// Mistral's `[ARGS]` a tool's arguments after the opening that names it; the generic
    /// format's reply is a call or a response.
    #[test]
    fn auto_constraints_follow_the_format() {
        use crate::constraint::Automaton;
        let tools = weather();
        let [(hermes, triggers)] = &ToolFormat::Hermes.auto_constraint(&tools, false)[..] else {
            panic!("one schema");
        };
        assert_eq!(triggers.len(), 1);
        assert_eq!(triggers[0].text, b"<tool_call>");
        Schema::compile(hermes).unwrap();
        let (_, llama) = &ToolFormat::Llama3.auto_constraint(&tools, false)[0];
        assert!(llama[0].at_start && llama[0].text == b"{");
        let two = Tool::list(&json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "required": ["city"],
                "properties": {"city": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "get_time"}},
        ]))
        .unwrap();
        let mistral = ToolFormat::MistralArgs.auto_constraint(&two, false);
        let openings: Vec<&[u8]> = mistral.iter().map(|(_, t)| t[0].text.as_slice()).collect();
        assert_eq!(
            openings,
            [
                &b"[TOOL_CALLS]get_weather[ARGS]"[..],
                b"[TOOL_CALLS]get_time[ARGS]"
            ]
        );
        let weather_args = Schema::compile(&mistral[0].0).unwrap();
        let end = weather_args
            .start()
            .feed(&weather_args, br#"{"city": "Paris"}"#);
        assert!(end.is_some_and(|s| s.is_complete()));
        assert!(weather_args
            .start()
            .feed(&weather_args, br#"{"town""#)
            .is_none());
        let [(generic, none)] = &ToolFormat::Generic.auto_constraint(&tools, false)[..] else {
            panic!("one schema");
        };
        assert!(none.is_empty());
        // A model that thinks first: JSON from the reply's start, or after its reasoning.
        let (_, thinking) = &ToolFormat::Generic.auto_constraint(&tools, true)[0];
        let texts: Vec<&[u8]> = thinking.iter().map(|t| t.text.as_slice()).collect();
        assert_eq!(texts, [&b"{"[..], b"</think>"]);
        let schema = Schema::compile(generic).unwrap();
        let whole = |text: &str| {
            let end = schema.start().feed(&schema, text.as_bytes());
            end.is_some_and(|s| s.is_complete())
        };
        assert!(whole(r#"{"response": "Hello."}"#));
        assert!(whole(
            r#"{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}"#
        ));
        assert!(!whole(
            r#"{"tool_call": {"name": "get_weather", "arguments": {}}}"#
        ));
        assert!(!whole(r#"{"answer": "Hello."}"#));
        // One or the other, never both nor neither.
        assert!(!whole(
            r#"{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}, "response": "x"}"#
        ));
        assert!(!whole("{}"));
    }

    /// A call cut short (the reply ran out of tokens) is a call as far as it is written; text
    /// after the calls is content.
    #[test]
    fn cut_calls_and_text_after_calls() {
        let cut =
            ToolFormat::Hermes.parse("<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, ");
        assert_eq!(cut.calls, [call("a", r#"{"x":[1,"#)]);
        assert_eq!(cut.content, "");
        let named = ToolFormat::MistralArgs.parse("[TOOL_CALLS]a[ARGS]");
        assert!(named.calls.is_empty(), "no arguments begun: not yet a call");
        let after = ToolFormat::Llama3.parse("{\"name\": \"a\", \"parameters\": {}} and more text");
        assert_eq!(after.calls, [call("a", "{}")]);
        assert_eq!(after.content, "and more text");
        let both = ToolFormat::Hermes.parse(
            "Looking.\n<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\nDone.\n",
        );
        assert_eq!(both.content, "Looking.\nDone.");
    }

    /// Arguments are the JSON the model wrote, its white space between tokens left out; a
    /// string of arguments is its text.
    #[test]
    fn arguments_keep_what_the_model_wrote() {
        let text = "<tool_call>{\"name\": \"a\", \"arguments\": {\"n\": 1.50, \"s\": \"x \\u00e9 \\\" y\",\n \"z\": [ ]}}</tool_call>";
        let reply = ToolFormat::Hermes.parse(text);
        assert_eq!(
            reply.calls,
            [call("a", r#"{"n":1.50,"s":"x \u00e9 \" y","z":[]}"#)]
        );
        let stringly = r#"{"tool_call": {"name": "a", "arguments": "{\"x\": 1}"}}"#;
        assert_eq!(
            ToolFormat::Generic.parse(stringly).calls,
            [call("a", r#"{"x": 1}"#)]
        );
    }

    /// What a stream gives out, put together: its content and its calls.
    fn streamed(
        format: ToolFormat,
        prefix: &str,
        text: &str,
        step: usize,
        parallel: bool,
    ) -> Reply {
        let mut watch = CallWatch::new(format, prefix, parallel);
        let chars: Vec<char> = text.chars().collect();
        let mut pieces = Vec::new();
        for piece in chars.chunks(step) {
            pieces.extend(watch.push(&piece.iter().collect::<String>()));
        }
        let (rest, made) = watch.finish();
        pieces.extend(rest);
        let mut reply = Reply {
            content: String::new(),
            calls: Vec::new(),
        };
        for piece in pieces {
            match piece {
                Streamed::Content(text) => reply.content += &text,
                Streamed::Call(name) => reply.calls.push(call(&name, "")),
                Streamed::Arguments(more) => reply.calls.last_mut().unwrap().arguments += &more,
            }
        }
        assert_eq!(made, reply.calls.len());
        reply
    }

    /// A stream's pieces add up to what the whole reply parses into, in every format, however
    /// the text comes in pieces and wherever it is cut short.
    #[test]
    fn a_stream_adds_up_to_the_whole_reply() {
        let cases = [
            (ToolFormat::Hermes, "", "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris \\ud83d\\ude00\"}}\n</tool_call>"),
            (ToolFormat::Hermes, "", "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": {\"y\": [1, 2]}}}</tool_call><tool_call>{\"arguments\": \"{}\", \"name\": \"b\"}</tool_call> then text"),
            (ToolFormat::Hermes, "<tool_call>\n", "{\"name\": \"a\", \"arguments\": {\"q\": \"<tool_call>\"}}"),
            (ToolFormat::Hermes, "", "Use <tool_call> tags, like <tool_call>{\"oops\": 1}"),
            (ToolFormat::Hermes, "", "a < b <t"),
            (ToolFormat::Llama3, "", "  {\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}}"),
            (ToolFormat::Llama3, "", "Checking.<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": \"}\"}}"),
            (ToolFormat::Llama3, "", "{\"answer\": 42}"),
            (ToolFormat::Llama3, "", "It is sunny."),
            (ToolFormat::MistralJson, "", "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": 1}, \"id\": \"abc\"}, {\"name\": \"b\", \"arguments\": {}}] "),
            (ToolFormat::MistralJson, "[TOOL_CALLS][", "{\"name\": \"a\", \"arguments\": {\"x\": true}}"),
            (ToolFormat::MistralJson, "", "[TOOL_CALLS] not json"),
            (ToolFormat::MistralArgs, "", "Sure. [TOOL_CALLS]a[ARGS]{\"x\": 1}[TOOL_CALLS]b[ARGS]{}"),
            (ToolFormat::MistralArgs, "", "[TOOL_CALLS]a{\"x\": 1}"),
            (ToolFormat::Generic, "", " {\"tool_call\": {\"name\": \"a\", \"arguments\": {\"x\": \"\\n\"}}}"),
            (ToolFormat::Generic, "", "{\"tool_calls\": [{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\"}]}"),
            (ToolFormat::Generic, "", "{\"response\": \"It is \\\"sunny\\\" \\u00e9\\ud83d\\ude00.\"}"),
            (ToolFormat::Generic, "", "{\"tool_call\": {\"arguments\": {}}}"),
            (ToolFormat::Generic, "", "Plain words."),
        ];
        for (format, prefix, text) in cases {
            let ends: Vec<usize> = (0..=text.len())
                .filter(|&k| text.is_char_boundary(k))
                .collect();
            for end in ends {
                let text = &text[..end];
                for parallel in [true, false] {
                    let mut whole = format.parse(&(prefix.to_owned() + text));
                    if !parallel {
                        whole.calls.truncate(1);
                    }
                    for step in [1, 2, 3, 7, 1000] {
                        let stream = streamed(format, prefix, text, step, parallel);
                        assert_eq!(stream, whole, "{format:?}, step {step}: {prefix}{text}");
                    }
                }
            }
        }
    }

    /// A call's name streams once whole, its arguments as they are written; the text before a
    /// call streams as it comes, white space that may precede a call held back.
    #[test]
    fn a_stream_gives_out_calls_as_they_are_written() {
        let mut watch = CallWatch::new(ToolFormat::Hermes, "", true);
        assert_eq!(
            watch.push("Let me look. "),
            [Streamed::Content("Let me look.".into())]
        );
        assert_eq!(watch.push("<tool_call>\n{\"name\": \"get_wea"), []);
        assert_eq!(
            watch.push("ther\", \"arguments\": {\"city\": \"Pa"),
            [
                Streamed::Call("get_weather".into()),
                Streamed::Arguments(r#"{"city":"Pa"#.into())
            ]
        );
        assert_eq!(
            watch.push("ris\"}}\n</tool"),
            [Streamed::Arguments(r#"ris"}"#.into())]
        );
        assert_eq!(watch.push("_call>"), []);
        assert_eq!(watch.finish(), (Vec::new(), 1));
        // The generic format's response streams as its characters come.
        let mut watch = CallWatch::new(ToolFormat::Generic, "", true);
        assert_eq!(
            watch.push(" {\"response\": \"Hi"),
            [Streamed::Content("Hi".into())]
        );
        assert_eq!(watch.push(" \\u00"), [Streamed::Content(" ".into())]);
        assert_eq!(watch.push("e9\"}"), [Streamed::Content("\u{e9}".into())]);
        assert_eq!(watch.finish(), (Vec::new(), 0));
    }

    #[test]
    fn generic_prompts_carry_the_tools() {
        let messages = vec![
            Message::text("user", "Weather in Paris?"),
            Message {
                tool_calls: Some(json!([{"id": "abcdef123", "type": "function", "function":
                    {"name": "get_weather", "arguments": {"city": "Paris"}}}])),
                ..Message::text("assistant", "")
            },
            Message {
                tool_call_id: Some("abcdef123".into()),
                ..Message::text("tool", "Sunny, 21 C")
            },
        ];
        let out = ToolFormat::Generic.prompt_messages(&weather(), messages);
        let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert!(out[0].content.contains("\"get_weather\""));
        assert!(out[0].content.contains("The weather in a city"));
        let call: Value = serde_json::from_str(&out[2].content).unwrap();
        assert_eq!(call["tool_call"]["arguments"]["city"], "Paris");
        assert!(out[3].content.contains("Sunny, 21 C"));
    }

    #[test]
    fn call_ids_are_nine_letters_and_digits() {
        let ids: Vec<String> = (0..100).map(call_id).collect();
        assert!(ids
            .iter()
            .all(|id| id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric())));
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ids.len());
    }
}
