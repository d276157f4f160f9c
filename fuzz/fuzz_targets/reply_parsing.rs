#![no_main]
//! A model's reply read as tool calls (every format) and as reasoning and answer, on any text:
//! no panics, and what streams in pieces of any size, put end to end, is what the whole reply
//! gives (tool calls: content, names and arguments). The first byte picks the pieces' size (in
//! characters) and whether several calls are taken, the rest is the reply.
use libfuzzer_sys::fuzz_target;
use sapient::reasoning::{split, ReasoningWatch, Split};
use sapient::tool_calls::{CallWatch, Streamed, ToolCall, ToolFormat};

fuzz_target!(|data: &[u8]| {
    let Some((&step, text)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(text);
    let pieces: Vec<String> = text
        .chars()
        .collect::<Vec<_>>()
        .chunks(usize::from(step % 16) + 1)
        .map(|c| c.iter().collect())
        .collect();
    let parallel = step & 0x80 != 0;
    for format in ToolFormat::ALL {
        let mut whole = format.parse(&text);
        if !parallel {
            whole.calls.truncate(1);
        }
        let mut watch = CallWatch::new(format, "", parallel);
        let mut streamed = Vec::new();
        for piece in &pieces {
            streamed.extend(watch.push(piece));
        }
        let (end, made) = watch.finish();
        streamed.extend(end);
        let mut content = String::new();
        let mut calls: Vec<ToolCall> = Vec::new();
        for piece in streamed {
            match piece {
                Streamed::Content(text) => content += &text,
                Streamed::Call(name) => calls.push(ToolCall {
                    name,
                    arguments: String::new(),
                }),
                Streamed::Arguments(more) => {
                    let call = calls.last_mut().expect("arguments after a call");
                    call.arguments += &more;
                }
            }
        }
        assert_eq!(made, calls.len(), "{format:?}");
        assert_eq!(content, whole.content, "{format:?}");
        assert_eq!(calls, whole.calls, "{format:?}");
    }
    for opened in [false, true] {
        let whole = split(&text, opened);
        let mut watch = ReasoningWatch::new(opened);
        let (mut reasoning, mut content) = (String::new(), String::new());
        for piece in &pieces {
            let (r, c) = watch.push(piece);
            reasoning += &r;
            content += &c;
        }
        let (r, c) = watch.finish();
        assert_eq!(
            Split {
                reasoning: reasoning + &r,
                content: content + &c
            },
            whole
        );
    }
});
