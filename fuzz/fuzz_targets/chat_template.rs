#![no_main]
//! The chat-template renderer on hostile templates (a template is code from a file): bounded
//! time and output, errors rather than panics. The input is the template, then after a line
//! `--` the messages, one per line as `role: content`.
use libfuzzer_sys::fuzz_target;
use sapient::chat::{ChatTemplate, Message};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (template, messages) = text.split_once("\n--\n").unwrap_or((&text, "user: hi"));
    let messages: Vec<Message> = messages
        .lines()
        .map(|l| {
            let (role, content) = l.split_once(": ").unwrap_or(("user", l));
            Message {
                role: role.into(),
                content: content.into(),
            }
        })
        .collect();
    let Ok(t) = ChatTemplate::new(template.into(), "<s>".into(), "</s>".into()) else {
        return;
    };
    let _ = t.render(&messages, true);
    let _ = t.render(&messages, false);
});
