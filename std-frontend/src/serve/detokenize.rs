//! A request's generated tokens turned into the text it is answered with: stop strings applied,
//! no half character handed out, and each token's log-probabilities reported with the text that
//! holds it, in OpenAI's chat and completion shapes.
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::engine::TokenLogprobs;
use crate::tokenizer::Tokenizer;

/// A generated token whose text has been handed out, with its log-probabilities.
pub struct Reported {
    pub id: u32,
    pub logprobs: TokenLogprobs,
    /// Where the token's text starts in the completion, in characters.
    pub offset: usize,
}

/// A token waiting for its text to be handed out.
struct Pending {
    reported: Reported,
    /// Where its text starts, in bytes.
    start: usize,
}

/// Text of generated tokens as it grows, with stop strings applied.
pub struct Detokenizer {
    tokenizer: Arc<Tokenizer>,
    ids: Vec<u32>,
    /// Bytes of text already handed out.
    sent: usize,
    stop: Vec<String>,
    /// Set when a stop string ends the text (the engine counts the request as stopped).
    stopped: Arc<AtomicBool>,
    /// The stop string that ended the text, as an index into `stop`.
    matched: Option<usize>,
    /// Bytes and characters of the text without its trailing half character, if any.
    whole: (usize, usize),
    pending: VecDeque<Pending>,
    /// Every token is reported, whatever text it has (the text is complete).
    finished: bool,
    /// Special tokens whose text stays in (the markers of tool calls).
    kept: Vec<u32>,
}

impl Detokenizer {
    pub fn new(tokenizer: Arc<Tokenizer>, stop: Vec<String>, stopped: Arc<AtomicBool>) -> Self {
        Detokenizer {
            tokenizer,
            ids: Vec::new(),
            sent: 0,
            stop,
            stopped,
            matched: None,
            whole: (0, 0),
            pending: VecDeque::new(),
            finished: false,
            kept: Vec::new(),
        }
    }

    /// Keeps the text of these special tokens, which decoding otherwise leaves out.
    pub fn keeping(mut self, special: Vec<u32>) -> Self {
        self.kept = special;
        self
    }

    /// The text of every token so far.
    fn decoded(&self) -> String {
        if !self.ids.iter().any(|id| self.kept.contains(id)) {
            return self
                .tokenizer
                .decode_continuation(&self.ids, true)
                .unwrap_or_default();
        }
        let mut text = String::new();
        for run in self.ids.split_inclusive(|id| self.kept.contains(id)) {
            let (ids, kept) = match run.split_last() {
                Some((last, ids)) if self.kept.contains(last) => (ids, Some(*last)),
                _ => (run, None),
            };
            text += &self
                .tokenizer
                .decode_continuation(ids, true)
                .unwrap_or_default();
            if let Some(id) = kept {
                text += &self.tokenizer.decode(&[id], false).unwrap_or_default();
            }
        }
        text
    }

    /// Tokens pushed so far.
    pub fn tokens(&self) -> usize {
        self.ids.len()
    }

    /// Adds a token (with its log-probabilities when the request asked for them). Returns the
    /// next piece of text that is safe to hand out (no half character, nothing that may become a
    /// stop string), and whether a stop string was reached.
    pub fn push(&mut self, id: u32, logprobs: Option<TokenLogprobs>) -> (String, bool) {
        if let Some(logprobs) = logprobs {
            self.pending.push_back(Pending {
                reported: Reported {
                    id,
                    logprobs,
                    offset: self.whole.1,
                },
                start: self.whole.0,
            });
        }
        self.ids.push(id);
        let text = self.decoded();
        let complete = text.trim_end_matches('\u{fffd}').len();
        if let Some(added) = text.get(self.whole.0..complete) {
            self.whole = (complete, self.whole.1 + added.chars().count());
        }
        let first_stop = self.stop.iter().enumerate();
        let first_stop = first_stop.filter_map(|(i, s)| Some((text.find(s.as_str())?, i)));
        if let Some((at, i)) = first_stop.min() {
            self.matched = Some(i);
            self.stopped.store(true, Ordering::Relaxed);
            let piece = text.get(self.sent..at).unwrap_or_default().to_owned();
            self.sent = at;
            return (piece, true);
        }
        // Hold back a half-decoded character, and the longest tail that could start a stop
        // string (it starts at a character boundary, as the stop string does).
        let mut hold = 0;
        for s in &self.stop {
            if let Some(k) = (1..s.len())
                .rev()
                .find(|&k| s.is_char_boundary(k) && text[..complete].ends_with(&s[..k]))
            {
                hold = hold.max(k);
            }
        }
        let safe = (complete - hold).max(self.sent);
        let piece = text.get(self.sent..safe).unwrap_or_default().to_owned();
        self.sent = safe;
        (piece, false)
    }

    /// The stop string that ended the text, once one has.
    pub fn stop_string(&self) -> Option<&str> {
        self.matched.map(|i| self.stop[i].as_str())
    }

    /// Whatever was held back, at the end.
    pub fn finish(&mut self) -> String {
        let text = self.decoded();
        let piece = text.get(self.sent..).unwrap_or_default().to_owned();
        self.sent = text.len();
        self.finished = true;
        piece
    }

    /// The log-probabilities of the tokens whose text starts in what has been handed out (all
    /// of them after `finish`), not reported before. A stop string's tokens never are.
    pub fn reported(&mut self) -> Vec<Reported> {
        let mut out = Vec::new();
        while let Some(p) = self.pending.front() {
            if !self.finished && p.start >= self.sent {
                break;
            }
            if let Some(p) = self.pending.pop_front() {
                out.push(p.reported);
            }
        }
        out
    }
}

/// A token's text for `logprobs`: its bytes, and those as a string (a half character as U+FFFD).
pub fn token_text(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tokenizer.token_bytes(id);
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Chat's `logprobs` object: `{"content": [{token, logprob, bytes, top_logprobs}, ...]}`.
pub fn chat_logprobs(tokenizer: &Tokenizer, tokens: &[Reported]) -> Value {
    let entry = |id: u32, logprob: f32| {
        let (token, bytes) = token_text(tokenizer, id);
        json!({ "token": token, "logprob": logprob, "bytes": bytes })
    };
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut v = entry(t.id, t.logprobs.logprob);
            v["top_logprobs"] = t
                .logprobs
                .top
                .iter()
                .map(|&(id, lp)| entry(id, lp))
                .collect();
            v
        })
        .collect();
    json!({ "content": content, "refusal": null })
}

/// The completions route's `logprobs` object: parallel lists of the tokens, their
/// log-probabilities, the likeliest tokens at each position (text to log-probability) and
/// where each token's text starts, in characters. With `echo`, the prompt's tokens come first
/// (the first has no log-probability: nothing predicts it) and the completion's offsets count
/// from the start of the prompt's text, `echo.2` characters long.
pub fn completion_logprobs(
    tokenizer: &Tokenizer,
    tokens: &[Reported],
    echo: Option<(&[u32], &[TokenLogprobs], usize)>,
) -> Value {
    let text = |id: u32| token_text(tokenizer, id).0;
    let top = |lp: &TokenLogprobs| {
        let map: Map<String, Value> = lp.top.iter().map(|&(id, l)| (text(id), json!(l))).collect();
        Value::Object(map)
    };
    let (mut names, mut logprobs, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    let mut shift = 0;
    if let Some((ids, prompt, chars)) = echo {
        let mut offset = 0;
        for (k, &id) in ids.iter().enumerate() {
            let name = text(id);
            offsets.push(json!(offset));
            offset += name.chars().count();
            names.push(name);
            let lp = k.checked_sub(1).and_then(|k| prompt.get(k));
            logprobs.push(lp.map_or(Value::Null, |lp| json!(lp.logprob)));
            tops.push(lp.map_or(Value::Null, top));
        }
        shift = chars;
    }
    for t in tokens {
        names.push(text(t.id));
        logprobs.push(json!(t.logprobs.logprob));
        tops.push(top(&t.logprobs));
        offsets.push(json!(shift + t.offset));
    }
    json!({
        "tokens": names,
        "token_logprobs": logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    })
}
