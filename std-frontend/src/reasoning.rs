//! A thinking model's reasoning told apart from its answer: the text between `<think>` and
//! `</think>` (DeepSeek R1 and its distills, Qwen3, QwQ, SmolLM3) becomes the message's
//! `reasoning_content`, as llama-server and vLLM answer it, and the rest its `content`.
//!
//! A template whose generation prompt already opens `<think>` (DeepSeek R1's) has the reply
//! begin inside the reasoning, with no opening tag of its own.

pub const OPEN: &str = "<think>";
pub const CLOSE: &str = "</think>";

/// Whether a chat template's model thinks in `<think>` tags.
pub fn template_thinks(source: &str) -> bool {
    source.contains(OPEN) && source.contains(CLOSE)
}

/// Whether a rendered prompt ends inside an opened `<think>`.
pub fn prompt_opens_thinking(prompt: &str) -> bool {
    prompt.trim_end().ends_with(OPEN)
}

/// A reply split into its reasoning and its answer, each without the white space around it.
#[derive(Debug, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

/// `text` (a reply that begins inside the reasoning when `opened`) split. A reply that opens
/// no reasoning is all content; one whose reasoning does not close (cut short) all reasoning.
pub fn split(text: &str, opened: bool) -> Split {
    let inside = match (opened, text.trim_start().strip_prefix(OPEN)) {
        (true, _) => text,
        (false, Some(inside)) => inside,
        (false, None) => {
            return Split {
                reasoning: String::new(),
                content: text.to_owned(),
            }
        }
    };
    let (reasoning, content) = inside.split_once(CLOSE).unwrap_or((inside, ""));
    Split {
        reasoning: reasoning.trim().to_owned(),
        content: content.trim_start().to_owned(),
    }
}

/// Where a streamed reply is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// Before its first bytes other than white space: reasoning opens there, or not at all.
    Start,
    Reasoning,
    Content,
}

/// A streamed reply split as it comes, each piece handed out once nothing after it can change
/// where it belongs; what streams, put end to end, is what `split` gives.
pub struct ReasoningWatch {
    text: String,
    part: Part,
    /// Where the current part's text starts in `text`, and how much of it has been handed out.
    from: usize,
    sent: usize,
    /// The part's leading white space is not its text (it follows a tag).
    after_tag: bool,
}

impl ReasoningWatch {
    pub fn new(opened: bool) -> Self {
        ReasoningWatch {
            text: String::new(),
            part: if opened { Part::Reasoning } else { Part::Start },
            from: 0,
            sent: 0,
            after_tag: opened,
        }
    }

    /// Adds `piece`; returns the reasoning and the content that may stream now.
    pub fn push(&mut self, piece: &str) -> (String, String) {
        self.text += piece;
        let mut reasoning = String::new();
        if self.part == Part::Start {
            let start = self.text.trim_start();
            if start.is_empty() || (OPEN.starts_with(start) && start.len() < OPEN.len()) {
                return (String::new(), String::new());
            }
            let skipped = self.text.len() - start.len();
            match start.starts_with(OPEN) {
                true => self.enter(Part::Reasoning, skipped + OPEN.len(), true),
                false => self.enter(Part::Content, 0, false),
            }
        }
        if self.part == Part::Reasoning {
            let rest = &self.text[self.from..];
            match rest.find(CLOSE) {
                Some(at) => {
                    reasoning = self.give(at, true);
                    self.enter(Part::Content, self.from + at + CLOSE.len(), true);
                }
                None => {
                    // Hold back a tail that may open the closing tag.
                    let hold = (1..CLOSE.len())
                        .rev()
                        .find(|&k| rest.ends_with(&CLOSE[..k]))
                        .unwrap_or(0);
                    return (self.give(rest.len() - hold, true), String::new());
                }
            }
        }
        let content = match self.part {
            Part::Content => {
                let len = self.text.len() - self.from;
                self.give(len, false)
            }
            _ => String::new(),
        };
        (reasoning, content)
    }

    /// What was held back, at the end: the reasoning and the content.
    pub fn finish(mut self) -> (String, String) {
        let len = self.text.len() - self.from;
        match self.part {
            Part::Reasoning => (self.give(len, true), String::new()),
            Part::Start | Part::Content => (String::new(), self.give(len, false)),
        }
    }

    fn enter(&mut self, part: Part, from: usize, after_tag: bool) {
        self.part = part;
        self.from = from;
        self.sent = 0;
        self.after_tag = after_tag;
    }

    /// The current part's text up to `end` (from its start), not yet handed out: after a tag,
    /// without the white space it starts with; with `trim_end` (reasoning, which `split`
    /// trims), without the white space it ends with, which goes out with what follows it, if
    /// anything does.
    fn give(&mut self, end: usize, trim_end: bool) -> String {
        let part = &self.text[self.from..self.from + end];
        let lead = match self.after_tag {
            true => part.len() - part.trim_start().len(),
            false => 0,
        };
        let end = match trim_end {
            true => part.trim_end().len(),
            false => part.len(),
        };
        let start = self.sent.max(lead);
        if end <= start {
            return String::new();
        }
        self.sent = end;
        part[start..end].to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_split_at_their_tags() {
        let cases = [
            ("<think>\nHmm.\n</think>\n\nHello!", false, "Hmm.", "Hello!"),
            ("  <think>Hmm.</think>Hello!", false, "Hmm.", "Hello!"),
            ("Hmm, 2 + 2.\n</think>\n\n4", true, "Hmm, 2 + 2.", "4"),
            ("Hello!", false, "", "Hello!"),
            ("<think>\nStill thinking", false, "Still thinking", ""),
            ("Still thinking", true, "Still thinking", ""),
            ("Say <think> here", false, "", "Say <think> here"),
            ("<think></think>Hi", false, "", "Hi"),
        ];
        for (text, opened, reasoning, content) in cases {
            let s = split(text, opened);
            assert_eq!(
                (s.reasoning.as_str(), s.content.as_str()),
                (reasoning, content),
                "{text:?}"
            );
        }
    }

    /// Streamed in pieces of any size, the parts come out as `split` gives them.
    #[test]
    fn a_stream_splits_as_the_whole() {
        let texts = [
            (
                "<think>\nLet me see: 2 + 2.\nIt is 4.\n</think>\n\nThe answer is 4.",
                false,
            ),
            (
                "First, </thin think.\n</think>\nDone. </think> stays.",
                true,
            ),
            ("No reasoning at all, < or <t.", false),
            ("\n<think>\nCut short", false),
            ("<thi", false),
            ("", true),
        ];
        for (text, opened) in texts {
            let want = split(text, opened);
            for step in [1, 2, 3, 5, 1000] {
                let mut watch = ReasoningWatch::new(opened);
                let (mut reasoning, mut content) = (String::new(), String::new());
                let chars: Vec<char> = text.chars().collect();
                for piece in chars.chunks(step) {
                    let (r, c) = watch.push(&piece.iter().collect::<String>());
                    reasoning += &r;
                    content += &c;
                }
                let (r, c) = watch.finish();
                reasoning += &r;
                content += &c;
                let got = Split { reasoning, content };
                assert_eq!(got, want, "{text:?} in pieces of {step}");
            }
        }
    }

    #[test]
    fn templates_and_prompts_that_think() {
        assert!(template_thinks("{{ '<think>\\n' }}...{{ '</think>' }}"));
        assert!(!template_thinks("<|im_start|>"));
        assert!(prompt_opens_thinking("<|Assistant|><think>\n"));
        assert!(!prompt_opens_thinking("<|im_start|>assistant\n"));
    }
}
