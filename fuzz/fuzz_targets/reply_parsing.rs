#![no_main]
//! A model's reply read as tool calls (every format) and as reasoning and answer, on any text:
//! no panics, and what streams in pieces of any size, put end to end, is what the whole reply
//! gives. The first byte picks the pieces' size (in characters), the rest is the reply.
use libfuzzer_sys::fuzz_target;
use sapient::reasoning::{split, ReasoningWatch, Split};
use sapient::tool_calls::{CallWatch, ToolFormat};

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
    for format in ToolFormat::ALL {
        let whole = format.parse(&text);
        let mut watch = CallWatch::new(format, "");
        let mut streamed = String::new();
        for piece in &pieces {
            streamed += &watch.push(piece);
        }
        let end = watch.finish();
        assert_eq!(streamed + &end.content, whole.content, "{format:?}");
        assert_eq!(end.calls, whole.calls, "{format:?}");
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
