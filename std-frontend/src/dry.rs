//! DRY's sequence breakers as a vocabulary writes them, worked out as llama.cpp does: a
//! repetition that crosses a breaker's text (a newline, `:`, a quote...) does not count on past
//! it, whichever tokens carry the text.
use anyhow::{bail, Result};
use sapient_core::sample::SequenceBreakers;

use crate::tokenizer::Tokenizer;

/// llama.cpp's default breakers.
pub const DEFAULT_BREAKERS: [&str; 4] = ["\n", ":", "\"", "*"];

/// The most breakers a request may give.
pub const MAX_BREAKERS: usize = 64;

/// A breaker's text is cut to this many bytes, as llama.cpp cuts it.
const MAX_BREAKER_BYTES: usize = 40;

/// A breaker's tail is cut to this many tokens, as llama.cpp cuts it.
const MAX_TAIL_TOKENS: usize = 20;

/// The token sequences of `breakers` in `tokenizer`'s vocabulary: every token whose text holds
/// a breaker (alone), and every token whose text ends with a breaker's start, followed by the
/// tokens of the breaker's rest.
///
/// # Errors
/// More than `MAX_BREAKERS` breakers, an empty one, or the tokenizer's.
pub fn sequence_breakers(tokenizer: &Tokenizer, breakers: &[String]) -> Result<SequenceBreakers> {
    if breakers.len() > MAX_BREAKERS {
        bail!("at most {MAX_BREAKERS} DRY sequence breakers");
    }
    let words: Vec<Vec<u8>> = (0..tokenizer.vocab_size() as u32)
        .map(|id| tokenizer.token_bytes(id))
        .collect();
    let mut sequences = Vec::new();
    for breaker in breakers {
        if breaker.is_empty() {
            bail!("a DRY sequence breaker is empty");
        }
        let mut cut = breaker.len().min(MAX_BREAKER_BYTES);
        while !breaker.is_char_boundary(cut) {
            cut -= 1;
        }
        let text = &breaker[..cut];
        for (id, word) in words.iter().enumerate() {
            let id = id as u32;
            if word.windows(text.len()).any(|w| w == text.as_bytes()) {
                sequences.push((id, Vec::new()));
                continue;
            }
            // Each place the word's end begins the breaker: the rest of it is the tail.
            for at in 0..word.len() {
                let end = &word[at..];
                let Some(rest) = text.as_bytes().strip_prefix(end) else {
                    continue;
                };
                // A tail that begins inside a character is not text to tokenize.
                let Ok(rest) = std::str::from_utf8(rest) else {
                    continue;
                };
                let mut tail = tokenizer.encode(rest)?;
                tail.truncate(MAX_TAIL_TOKENS);
                sequences.push((id, tail));
            }
        }
    }
    Ok(SequenceBreakers::new(sequences))
}
