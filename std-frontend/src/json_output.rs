//! Output constrained to one JSON object (OpenAI's `response_format: {"type": "json_object"}`,
//! `generate --json`): every token sampled keeps the text a prefix of a valid JSON object
//! (RFC 8259), and the stop tokens are allowed only once the object is closed.
//!
//! The check is a pushdown automaton over bytes whose state is a small `Copy` value. Sampling
//! is lazy, as llama.cpp's grammar sampling is: the token drawn from the unconstrained logits is
//! kept when the automaton accepts it (most tokens of a JSON-minded model are), otherwise every
//! token the automaton rejects is masked and the draw is repeated. For a random draw that is
//! rejection sampling, so a token comes out with its probability among the accepted ones. The
//! mask walks the vocabulary sorted by bytes, so a shared prefix is stepped through once and a
//! dead one skips every token that starts with it.
use std::sync::Arc;

use anyhow::{bail, Result};
use sapient_core::sample::Sampler;

use crate::json_lex::{Number, Step, Str, Word};
use crate::json_schema::{Schema, SchemaPrefix};
use crate::tokenizer::Tokenizer;

/// Open containers a JSON object may nest (one bit each).
const MAX_DEPTH: u8 = 64;
/// Whitespace bytes allowed in a row: enough for pretty-printed nesting, and no room for a model
/// to loop on newlines until `max_tokens`.
pub const MAX_SPACES: u8 = 64;

/// A pushdown automaton over bytes whose state is a small `Copy` value, stepped by `Rules`
/// (a compiled schema, or nothing).
pub trait Automaton: Copy {
    type Rules;
    /// The state after byte `b`, or `None` if it leaves no valid continuation.
    fn step(self, rules: &Self::Rules, b: u8) -> Option<Self>;
    /// Whether the text so far is a whole value, so that the output may end.
    fn is_complete(&self) -> bool;
    /// The state after `bytes`.
    fn feed(mut self, rules: &Self::Rules, bytes: &[u8]) -> Option<Self> {
        for &b in bytes {
            self = self.step(rules, b)?;
        }
        Some(self)
    }
}

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

    fn step(self, _: &(), b: u8) -> Option<Self> {
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

/// The vocabulary as bytes, sorted, for masking: special tokens left out (decoded text has no
/// trace of them, so they can never be part of the JSON).
pub struct JsonVocab {
    /// (bytes, id), sorted by bytes.
    tokens: Vec<(Vec<u8>, u32)>,
    /// How many leading bytes each token shares with the one before it.
    shared: Vec<usize>,
    vocab_size: usize,
}

impl JsonVocab {
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize) -> Self {
        let special = tokenizer.special_ids();
        let mut tokens: Vec<(Vec<u8>, u32)> = (0..vocab_size as u32)
            .filter(|id| special.binary_search(id).is_err())
            .map(|id| (tokenizer.token_bytes(id), id))
            .filter(|(bytes, _)| !bytes.is_empty())
            .collect();
        tokens.sort_unstable();
        let shared = (0..tokens.len())
            .map(|i| match i.checked_sub(1) {
                Some(p) => tokens[p]
                    .0
                    .iter()
                    .zip(&tokens[i].0)
                    .take_while(|(a, b)| a == b)
                    .count(),
                None => 0,
            })
            .collect();
        JsonVocab {
            tokens,
            shared,
            vocab_size,
        }
    }

    /// `allowed[id]` ← whether token `id`'s bytes may follow `from` (special tokens never).
    pub fn allowed<A: Automaton>(&self, rules: &A::Rules, from: A, allowed: &mut Vec<bool>) {
        allowed.clear();
        allowed.resize(self.vocab_size, false);
        // states[k]: the state after the current token's first k bytes, for as long a prefix
        // as the automaton accepts.
        let mut states = vec![from];
        for ((bytes, id), &shared) in self.tokens.iter().zip(&self.shared) {
            if states.len() <= shared {
                // A prefix this token shares with the one before was already rejected.
                continue;
            }
            states.truncate(shared + 1);
            for &b in &bytes[shared..] {
                match states[states.len() - 1].step(rules, b) {
                    Some(s) => states.push(s),
                    None => break,
                }
            }
            if states.len() == bytes.len() + 1 {
                allowed[*id as usize] = true;
            }
        }
    }
}

/// What the output must be, and how far it has got. One per request, copied once a token: the
/// schema's larger state costs nothing worth a box.
#[derive(Clone, Copy)]
#[allow(clippy::large_enum_variant)]
enum Progress {
    /// Any JSON object.
    Object(JsonPrefix),
    /// A value of the request's schema.
    Schema(SchemaPrefix),
}

/// Text after which (or, with `at_start`, from which) a lazy constraint's JSON begins.
#[derive(Clone, Debug)]
pub struct Trigger {
    pub text: Vec<u8>,
    /// Only as the reply's first bytes other than white space, and the JSON starts with them
    /// (a Llama 3 call is the reply's JSON object); otherwise anywhere, the JSON after them.
    pub at_start: bool,
}

/// A lazy constraint between values: the reply's last bytes, to find a trigger in.
struct Waiting {
    tail: Vec<u8>,
    /// The reply has had bytes other than white space.
    started: bool,
}

/// One request's constraint: the JSON so far, and what its sampling needs.
pub struct JsonOutput {
    vocab: Arc<JsonVocab>,
    tokenizer: Arc<Tokenizer>,
    /// The compiled schema, with `Progress::Schema`.
    schema: Option<Arc<Schema>>,
    progress: Progress,
    /// The logits before a draw, to draw again under the mask.
    saved: Vec<f32>,
    allowed: Vec<bool>,
    /// A lazy constraint's schemas, each with the triggers after which its values come
    /// (llama.cpp's lazy grammars): one holds from its trigger to the end of the value, then
    /// the output waits for the next; empty for output that is all JSON.
    lazy: Vec<(Arc<Schema>, Vec<Trigger>)>,
    /// `Some` while a lazy constraint waits for a trigger.
    waiting: Option<Waiting>,
}

impl JsonOutput {
    /// Output that is any one JSON object.
    pub fn new(vocab: Arc<JsonVocab>, tokenizer: Arc<Tokenizer>) -> Self {
        JsonOutput {
            vocab,
            tokenizer,
            schema: None,
            progress: Progress::Object(JsonPrefix::default()),
            saved: Vec::new(),
            allowed: Vec::new(),
            lazy: Vec::new(),
            waiting: None,
        }
    }

    /// Output that is free text, but a value of a schema after each of its triggers (a tool
    /// call's JSON after the text that opens it; with schemas of their own, a call's
    /// arguments after the text that names its tool). `lazy` is not empty.
    pub fn lazy(
        vocab: Arc<JsonVocab>,
        tokenizer: Arc<Tokenizer>,
        lazy: Vec<(Arc<Schema>, Vec<Trigger>)>,
    ) -> Self {
        let first = lazy[0].0.clone();
        JsonOutput {
            lazy,
            waiting: Some(Waiting {
                tail: Vec::new(),
                started: false,
            }),
            ..Self::with_schema(vocab, tokenizer, first)
        }
    }

    /// While waiting: takes in a drawn token's bytes, and begins a value of the schema whose
    /// trigger they complete where the bytes after it may start the value.
    fn watch(&mut self, bytes: &[u8]) {
        let Some(waiting) = &mut self.waiting else {
            return;
        };
        let new_from = waiting.tail.len();
        waiting.tail.extend_from_slice(bytes);
        let tail = &waiting.tail;
        let fired = self.lazy.iter().find_map(|(schema, triggers)| {
            let from = triggers.iter().find_map(|t| {
                if t.at_start {
                    let skipped = tail.iter().take_while(|b| b.is_ascii_whitespace()).count();
                    (!waiting.started && tail[skipped..].starts_with(&t.text)).then_some(skipped)
                } else {
                    let at = tail
                        .windows(t.text.len().max(1))
                        .position(|w| w == t.text.as_slice())
                        .filter(|&at| at + t.text.len() > new_from)?;
                    Some(at + t.text.len())
                }
            })?;
            Some((schema, from))
        });
        let began = fired.and_then(|(schema, from)| {
            let progress = schema.start().feed(schema, &tail[from..])?;
            Some((schema.clone(), progress))
        });
        if let Some((schema, progress)) = began {
            self.schema = Some(schema);
            self.progress = Progress::Schema(progress);
            self.waiting = None;
            return;
        }
        waiting.started |= waiting.tail.iter().any(|b| !b.is_ascii_whitespace());
        // Keep what may be the start of a trigger.
        let keep = self
            .lazy
            .iter()
            .flat_map(|(_, triggers)| triggers)
            .map(|t| t.text.len())
            .max()
            .unwrap_or(1)
            - 1;
        let cut = waiting.tail.len().saturating_sub(keep);
        waiting.tail.drain(..cut);
    }

    /// Output that is one value of `schema`.
    pub fn with_schema(
        vocab: Arc<JsonVocab>,
        tokenizer: Arc<Tokenizer>,
        schema: Arc<Schema>,
    ) -> Self {
        JsonOutput {
            progress: Progress::Schema(schema.start()),
            schema: Some(schema),
            ..Self::new(vocab, tokenizer)
        }
    }

    /// Whether the value is whole (generation may only stop now).
    pub fn is_complete(&self) -> bool {
        match self.progress {
            Progress::Object(p) => p.is_complete(),
            Progress::Schema(p) => p.is_complete(),
        }
    }

    /// The progress after `bytes`, if the JSON may continue with them.
    fn feed(&self, bytes: &[u8]) -> Option<Progress> {
        match (self.progress, &self.schema) {
            (Progress::Object(p), _) => p.feed(&(), bytes).map(Progress::Object),
            (Progress::Schema(p), Some(schema)) => p.feed(schema, bytes).map(Progress::Schema),
            (Progress::Schema(_), None) => None,
        }
    }

    /// The progress after `token`, if the JSON may continue with it; a stop token only once
    /// the value is whole.
    fn accepts(&self, token: u32, stop: &[u32]) -> Option<Progress> {
        if stop.contains(&token) {
            return self.is_complete().then_some(self.progress);
        }
        self.feed(&self.tokenizer.token_bytes(token))
    }

    /// `self.allowed` ← the tokens `accepts` takes.
    fn mask(&mut self, vocab_size: usize, stop: &[u32]) {
        if self.is_complete() {
            self.allowed.clear();
            self.allowed.resize(vocab_size, false);
            for &t in stop {
                if let Some(a) = self.allowed.get_mut(t as usize) {
                    *a = true;
                }
            }
            return;
        }
        match (self.progress, &self.schema) {
            (Progress::Object(p), _) => self.vocab.allowed(&(), p, &mut self.allowed),
            (Progress::Schema(p), Some(schema)) => {
                self.vocab.allowed(schema.as_ref(), p, &mut self.allowed)
            }
            (Progress::Schema(_), None) => self.allowed.clear(),
        }
    }

    /// Draws the next token with `sampler` among those that keep the text a prefix of the
    /// JSON asked for (or, once it is whole, among `stop`), and moves past it.
    ///
    /// # Errors
    /// When no token of the vocabulary can continue the text (no stop token after a whole
    /// value), or the sampler's.
    pub fn sample(
        &mut self,
        sampler: &mut Sampler<'_>,
        logits: &mut [f32],
        history: &[u32],
        stop: &[u32],
    ) -> Result<u32> {
        if !self.lazy.is_empty() && self.waiting.is_none() && self.is_complete() {
            // A lazy constraint's value is whole: free text again, until the next trigger.
            self.waiting = Some(Waiting {
                tail: Vec::new(),
                started: true,
            });
        }
        if self.waiting.is_some() {
            let token = sampler.sample(logits, history)?;
            self.watch(&self.tokenizer.token_bytes(token));
            return Ok(token);
        }
        self.saved.clear();
        self.saved.extend_from_slice(logits);
        let token = sampler.sample(logits, history)?;
        if let Some(next) = self.accepts(token, stop) {
            self.progress = next;
            return Ok(token);
        }
        logits.copy_from_slice(&self.saved);
        self.mask(logits.len(), stop);
        let mut any = false;
        for (i, l) in logits.iter_mut().enumerate() {
            if self.allowed.get(i) == Some(&true) {
                any = true;
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        if !any {
            bail!("no token of the vocabulary can continue the JSON output");
        }
        let token = sampler.sample(logits, history)?;
        match self.accepts(token, stop) {
            Some(next) => {
                self.progress = next;
                Ok(token)
            }
            // The mask allows only accepted tokens; a sampler that drew a masked one anyway
            // (every allowed logit -inf as well) is refused rather than followed.
            None => bail!("the sampler drew a token outside the JSON mask"),
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
