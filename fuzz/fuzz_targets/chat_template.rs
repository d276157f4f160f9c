#![no_main]
//! The chat-template renderer on hostile templates (a template is code from a file): bounded
//! time and output, errors rather than panics, with and without tools and template variables.
//! The input is the template, then after a line `--` the messages, one per line as
//! `role: content`.
use libfuzzer_sys::fuzz_target;
use sapient::chat::{ChatTemplate, Message, RenderOptions};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (template, messages) = text.split_once("\n--\n").unwrap_or((&text, "user: hi"));
    let messages: Vec<Message> = messages
        .lines()
        .map(|l| {
            let (role, content) = l.split_once(": ").unwrap_or(("user", l));
            Message::text(role, content)
        })
        .collect();
    let Ok(t) = ChatTemplate::new(template.into(), "<s>".into(), "</s>".into()) else {
        return;
    };
    let _ = t.render(&messages, true);
    let _ = t.render(&messages, false);
    let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let variables = serde_json::json!({"enable_thinking": false});
    let options = RenderOptions {
        tools: Some(&tools),
        variables: Some(&variables),
    };
    let _ = t.render_with(&messages, &options, true);
});
