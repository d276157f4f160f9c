//! Output that is one JSON object (OpenAI's `response_format: {"type": "json_object"}`,
//! `generate --json`): a pushdown automaton over bytes whose state is a small `Copy` value,
//! which keeps the text a prefix of a valid JSON object (RFC 8259) and says when it is whole.
use crate::constraint::Automaton;
use crate::json_lex::{Number, Step, Str, Word};

/// Open containers a JSON object may nest (one bit each).
const MAX_DEPTH: u8 = 64;
/// Whitespace bytes allowed in a row: enough for pretty-printed nesting, and no room for a model
/// to loop on newlines until `max_tokens`.
pub const MAX_SPACES: u8 = 64;

/// Where the automaton is in the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// Before the top-level object.
    Start,
    /// Where a value goes: after `:`, or after `,` in an array.
    Value,
    /// After `[`: a value or `]`.
    ArrayOpen,
    /// After `{`: a key or `}`.
    ObjectOpen,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After a value in a container: `,` or the container's closer.
    Next,
    /// Inside a string (an object's key when `key`).
    Str {
        key: bool,
        lex: Str,
    },
    Number(Number),
    Word(Word),
    /// The top-level object is closed.
    Done,
}

/// A prefix of a JSON object, as the automaton's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonPrefix {
    /// The open containers, the innermost in bit 0: 1 an object, 0 an array.
    stack: u64,
    depth: u8,
    /// Whitespace bytes in a row just before here.
    spaces: u8,
    at: At,
}

impl Default for JsonPrefix {
    fn default() -> Self {
        JsonPrefix {
            stack: 0,
            depth: 0,
            spaces: 0,
            at: At::Start,
        }
    }
}

impl Automaton for JsonPrefix {
    type Rules = ();

    fn step(&self, _: &(), b: u8) -> Option<Self> {
        self.advance(b)
    }

    fn is_complete(&self) -> bool {
        self.at == At::Done
    }
}

impl JsonPrefix {
    /// Before any JSON value (`default()` is before an object).
    pub fn any_value() -> Self {
        JsonPrefix {
            at: At::Value,
            ..Self::default()
        }
    }

    /// Whether a value at the top level ends here if the next byte cannot continue it: a
    /// number does (where it may end), a string, literal or container ends at its last byte.
    pub fn value_ends_here(&self) -> bool {
        self.depth == 0
            && matches!(
                self.at,
                At::Number(n) if n.is_whole()
            )
    }

    fn with(self, at: At) -> Option<Self> {
        Some(JsonPrefix {
            at,
            spaces: 0,
            ..self
        })
    }

    fn open(self, object: bool) -> Option<Self> {
        if self.depth == MAX_DEPTH {
            return None;
        }
        Some(JsonPrefix {
            stack: self.stack << 1 | u64::from(object),
            depth: self.depth + 1,
            spaces: 0,
            at: if object {
                At::ObjectOpen
            } else {
                At::ArrayOpen
            },
        })
    }

    fn in_object(self) -> bool {
        self.stack & 1 == 1
    }

    /// Closes the innermost container (`}` for an object, `]` for an array) if `b` is its closer.
    fn close(self, b: u8) -> Option<Self> {
        let closer = if self.in_object() { b'}' } else { b']' };
        if self.depth == 0 || b != closer {
            return None;
        }
        JsonPrefix {
            stack: self.stack >> 1,
            depth: self.depth - 1,
            ..self
        }
        .value_done()
    }

    /// A value just ended.
    fn value_done(self) -> Option<Self> {
        self.with(if self.depth == 0 { At::Done } else { At::Next })
    }

    /// The first byte of a value.
    fn value(self, b: u8) -> Option<Self> {
        match b {
            b'{' => self.open(true),
            b'[' => self.open(false),
            b'"' => self.with(At::Str {
                key: false,
                lex: Str::default(),
            }),
            _ => match Number::start(b) {
                Some(n) => self.with(At::Number(n)),
                None => self.with(At::Word(Word::start(b, true, true)?)),
            },
        }
    }

    fn key(self) -> Option<Self> {
        self.with(At::Str {
            key: true,
            lex: Str::default(),
        })
    }

    /// The state after byte `b`, or `None` if it leaves no valid continuation.
    pub fn advance(self, b: u8) -> Option<Self> {
        let between_tokens = matches!(
            self.at,
            At::Start | At::Value | At::ArrayOpen | At::ObjectOpen | At::Key | At::Colon | At::Next
        );
        if between_tokens && matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            return (self.spaces < MAX_SPACES).then_some(JsonPrefix {
                spaces: self.spaces + 1,
                ..self
            });
        }
        match self.at {
            At::Start if b == b'{' => self.open(true),
            At::Value => self.value(b),
            At::ArrayOpen if b == b']' => self.close(b),
            At::ArrayOpen => self.value(b),
            At::ObjectOpen if b == b'}' => self.close(b),
            At::ObjectOpen | At::Key if b == b'"' => self.key(),
            At::Colon if b == b':' => self.with(At::Value),
            At::Next if b == b',' => self.with(if self.in_object() { At::Key } else { At::Value }),
            At::Next => self.close(b),
            At::Str { key, lex } => match lex.next(b) {
                Step::Continue(lex) => self.with(At::Str { key, lex }),
                Step::End if key => self.with(At::Colon),
                Step::End => self.value_done(),
                Step::Invalid => None,
            },
            At::Number(n) => match n.next(b, false) {
                Step::Continue(n) => self.with(At::Number(n)),
                // The byte that ended the number follows the value.
                Step::End => self.value_done()?.advance(b),
                Step::Invalid => None,
            },
            At::Word(w) => match w.next(b) {
                Step::Continue(w) => self.with(At::Word(w)),
                Step::End => self.value_done(),
                Step::Invalid => None,
            },
            At::Start | At::ObjectOpen | At::Key | At::Colon | At::Done => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(text: &str) -> Option<JsonPrefix> {
        JsonPrefix::default().feed(&(), text.as_bytes())
    }

    #[test]
    fn whole_objects_are_complete() {
        for text in [
            "{}",
            " {\"a\": 1}",
            "{\"a\":[1,-2.5e+3,0,true,false,null,\"x\\\"\\u00e9\\n\"],\"b\":{\"c\":{}}}",
            "{\"é😀\": [[], {}, -0.0, 1E9]}",
            "{\n  \"a\": [\n    1\n  ]\n}",
        ] {
            let s = prefix(text).unwrap_or_else(|| panic!("{text:?} rejected"));
            assert!(s.is_complete(), "{text:?} not complete");
        }
    }

    #[test]
    fn prefixes_are_accepted_and_incomplete() {
        let text = "{\"key\": [1.5e-3, \"str\\u12ab\", {\"n\": nul";
        for end in 0..=text.len() {
            let s = prefix(&text[..end]).unwrap_or_else(|| panic!("{:?}", &text[..end]));
            assert!(!s.is_complete());
        }
    }

    #[test]
    fn invalid_json_is_rejected() {
        for text in [
            "[]",
            "\"a\"",
            "1",
            "{a",
            "{\"a\" 1}",
            "{\"a\":}",
            "{\"a\":1,}",
            "{\"a\":[1,]}",
            "{\"a\":01}",
            "{\"a\":1.}",
            "{\"a\":1.e5}",
            "{\"a\":-}",
            "{\"a\":tru }",
            "{\"a\":\"\\x\"}",
            "{\"a\":\"\\u12g4\"}",
            "{\"a\":\"tab\there\"}",
            "{\"a\":1]",
            "{\"a\":[1}",
            "{}x",
            "{} ",
            "{}}",
        ] {
            assert!(prefix(text).is_none(), "{text:?} accepted");
        }
    }

    #[test]
    fn invalid_utf8_in_strings_is_rejected() {
        assert!(JsonPrefix::default().feed(&(), b"{\"\xff").is_none());
        assert!(JsonPrefix::default().feed(&(), b"{\"\xc3(").is_none());
        assert!(JsonPrefix::default().feed(&(), b"{\"\xc3\xa9\"").is_some());
    }

    #[test]
    fn nesting_and_whitespace_are_bounded() {
        let deep = "{\"a\":".to_owned() + &"[".repeat(MAX_DEPTH as usize - 1);
        let s = prefix(&deep).expect("depth at the limit");
        assert!(s.feed(&(), b"[").is_none());
        let spaces = "{".to_owned() + &" ".repeat(MAX_SPACES as usize);
        let s = prefix(&spaces).expect("spaces at the limit");
        assert!(s.feed(&(), b" ").is_none());
        assert!(s.feed(&(), b"}").is_some());
    }
}
