//! SentencePiece vocabularies from GGUF (`tokenizer.ggml.model = "llama"`: Llama 2, TinyLlama,
//! Mistral, Vicuna, CodeLlama, Phi-3), tokenized as llama.cpp's `llm_tokenizer_spm` does: spaces
//! become `▁`, the text starts as one symbol per character, and the adjacent pair whose merge is
//! the best-scoring vocabulary entry is merged until none is; characters no entry covers become
//! their UTF-8 bytes' `<0xNN>` tokens.
use std::cmp::Ordering;
use std::collections::BinaryHeap;

use ahash::AHashMap;
use anyhow::{anyhow, bail, Result};

/// llama.cpp's `llama_token_type`, as GGUF stores it in `tokenizer.ggml.token_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenKind {
    pub fn from_gguf(t: i64) -> TokenKind {
        match t {
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => TokenKind::Normal,
        }
    }

    /// Tokens matched in the text before tokenizing it (llama.cpp's special-token partition).
    pub fn is_special(self) -> bool {
        matches!(
            self,
            TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
        )
    }
}

/// The space marker SentencePiece writes in place of ' '.
const SPACE: &str = "\u{2581}";

pub struct Spm {
    tokens: Vec<String>,
    scores: Vec<f32>,
    kinds: Vec<TokenKind>,
    ids: AHashMap<String, u32>,
    /// Special tokens, longest text first: matched in that order, as llama.cpp does.
    specials: Vec<Special>,
    /// The `<0xNN>` token of each byte, or the unknown token where the vocabulary has none.
    bytes: [Option<u32>; 256],
    /// Whether a text that does not follow a special token gets a leading space.
    add_space_prefix: bool,
}

/// A special token the text is split at.
struct Special {
    id: u32,
    /// Whether the ASCII whitespace right after it is dropped (llama.cpp's `RSTRIP`).
    strips_after: bool,
}

/// A piece of the input: text to tokenize, or a special token matched in it.
enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

impl Spm {
    /// `tokens`, their `scores` and `kinds` (all as long), the unknown token, whether texts get
    /// a leading space, and the special tokens that drop the ASCII whitespace after them.
    pub fn new(
        tokens: Vec<String>,
        scores: Vec<f32>,
        kinds: Vec<TokenKind>,
        unknown: Option<u32>,
        add_space_prefix: bool,
        strip_after: &[u32],
    ) -> Result<Spm> {
        if scores.len() != tokens.len() || kinds.len() != tokens.len() {
            bail!(
                "SentencePiece vocabulary: {} tokens, {} scores, {} token types",
                tokens.len(),
                scores.len(),
                kinds.len()
            );
        }
        if tokens.len() > u32::MAX as usize {
            bail!("SentencePiece vocabulary of {} tokens", tokens.len());
        }
        if let Some(u) = unknown.filter(|&u| u as usize >= tokens.len()) {
            bail!(
                "unknown token id {u} is outside the vocabulary of {}",
                tokens.len()
            );
        }
        // Later duplicates win, as in llama.cpp's `token_to_id`.
        let ids: AHashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let strip_after: ahash::AHashSet<u32> = strip_after.iter().copied().collect();
        let mut specials: Vec<Special> = (0..tokens.len() as u32)
            .filter(|&i| kinds[i as usize].is_special() && !tokens[i as usize].is_empty())
            .map(|id| Special {
                id,
                strips_after: strip_after.contains(&id),
            })
            .collect();
        specials.sort_by_key(|s| std::cmp::Reverse(tokens[s.id as usize].len()));
        let bytes = std::array::from_fn(|b| {
            ids.get(&format!("<0x{b:02X}>"))
                .or_else(|| {
                    let one = [b as u8];
                    std::str::from_utf8(&one).ok().and_then(|s| ids.get(s))
                })
                .copied()
                .or(unknown)
        });
        Ok(Spm {
            tokens,
            scores,
            kinds,
            ids,
            specials,
            bytes,
            add_space_prefix,
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// Ids of the control, unknown and unused tokens.
    pub fn special_ids(&self) -> Vec<u32> {
        (0..self.kinds.len() as u32)
            .filter(|&i| self.kinds[i as usize].is_special())
            .collect()
    }

    pub fn id(&self, token: &str) -> Option<u32> {
        self.ids.get(token).copied()
    }

    /// Token ids of `text`, special tokens written in it recognized; no BOS.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        let mut after_special = true;
        for fragment in self.partition(text) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(t) => {
                    let mut text = String::with_capacity(t.len() + 3);
                    if self.add_space_prefix && after_special {
                        text.push(' ');
                    }
                    text.push_str(t);
                    self.encode_text(&text.replace(' ', SPACE), &mut out)?;
                    after_special = false;
                }
            }
        }
        Ok(out)
    }

    /// Token ids of `text` with no special token matched in it; no BOS.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        if text.is_empty() {
            return Ok(out);
        }
        let prefix = if self.add_space_prefix { " " } else { "" };
        self.encode_text(&format!("{prefix}{text}").replace(' ', SPACE), &mut out)?;
        Ok(out)
    }

    /// Splits `text` at the special tokens it holds, longest first.
    fn partition<'t>(&self, text: &'t str) -> Vec<Fragment<'t>> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut fragments = vec![Fragment::Text(text)];
        for &Special { id, strips_after } in &self.specials {
            let special = self.tokens[id as usize].as_str();
            if !fragments
                .iter()
                .any(|f| matches!(f, Fragment::Text(t) if t.contains(special)))
            {
                continue;
            }
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for f in fragments {
                let Fragment::Text(mut t) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(at) = t.find(special) {
                    if at > 0 {
                        next.push(Fragment::Text(&t[..at]));
                    }
                    next.push(Fragment::Token(id));
                    t = &t[at + special.len()..];
                    if strips_after {
                        t = t.trim_start_matches(|c: char| c.is_ascii_whitespace() || c == '\x0b');
                    }
                }
                if !t.is_empty() {
                    next.push(Fragment::Text(t));
                }
            }
            fragments = next;
        }
        fragments
    }

    /// llama.cpp's `llm_tokenizer_spm_session::tokenize` on one piece of text (spaces already
    /// replaced by `▁`).
    fn encode_text(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        // Symbols as a linked list over the characters: `len` 0 once merged into the left one.
        let mut symbols: Vec<Symbol> = Vec::new();
        for (start, c) in text.char_indices() {
            let i = symbols.len();
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: Some(i + 1),
            });
        }
        match symbols.last_mut() {
            Some(last) => last.next = None,
            None => return Ok(()),
        }
        let mut queue = BinaryHeap::new();
        for i in 1..symbols.len() {
            self.push_bigram(text, &symbols, i - 1, i, &mut queue);
        }
        while let Some(b) = queue.pop() {
            let (left, right) = (&symbols[b.left], &symbols[b.right]);
            // Skip pairs one of whose symbols has changed since.
            if left.len == 0 || right.len == 0 || left.len + right.len != b.len {
                continue;
            }
            let right_next = right.next;
            symbols[b.left].len += symbols[b.right].len;
            symbols[b.right].len = 0;
            symbols[b.left].next = right_next;
            if let Some(n) = right_next {
                symbols[n].prev = Some(b.left);
            }
            if let Some(p) = symbols[b.left].prev {
                self.push_bigram(text, &symbols, p, b.left, &mut queue);
            }
            if let Some(n) = right_next {
                self.push_bigram(text, &symbols, b.left, n, &mut queue);
            }
        }
        let mut at = Some(0);
        while let Some(i) = at {
            let s = &symbols[i];
            let piece = &text[s.start..s.start + s.len];
            // Every merge makes a vocabulary entry, so only single characters can miss.
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &byte in piece.as_bytes() {
                        out.push(self.bytes[byte as usize].ok_or_else(|| {
                            anyhow!(
                                "the vocabulary has no token for byte 0x{byte:02X} and no unknown token"
                            )
                        })?);
                    }
                }
            }
            at = s.next;
        }
        Ok(())
    }

    fn push_bigram(
        &self,
        text: &str,
        symbols: &[Symbol],
        left: usize,
        right: usize,
        queue: &mut BinaryHeap<Bigram>,
    ) {
        let (l, r) = (&symbols[left], &symbols[right]);
        let len = l.len + r.len;
        if let Some(&id) = self.ids.get(&text[l.start..l.start + len]) {
            queue.push(Bigram {
                left,
                right,
                score: self.scores[id as usize],
                len,
            });
        }
    }

    /// The bytes `id` stands for: `▁` as a space, `<0xNN>` as its byte; control and unknown
    /// tokens as their text unless `skip_special`. Unknown ids give nothing.
    pub fn piece(&self, id: u32, skip_special: bool, out: &mut Vec<u8>) {
        let Some(text) = self.tokens.get(id as usize) else {
            return;
        };
        match self.kinds[id as usize] {
            TokenKind::Normal => out.extend_from_slice(text.replace(SPACE, " ").as_bytes()),
            TokenKind::UserDefined => out.extend_from_slice(text.as_bytes()),
            TokenKind::Byte => match parse_byte_token(text) {
                Some(b) => out.push(b),
                None => out.extend_from_slice(text.as_bytes()),
            },
            TokenKind::Control | TokenKind::Unknown | TokenKind::Unused => {
                if !skip_special {
                    out.extend_from_slice(text.as_bytes());
                }
            }
        }
    }

    /// The text of `ids`: pieces joined, and with `strip_prefix` the space `encode` put before
    /// the text removed from the first token (decoding a whole sequence, as llama.cpp's
    /// detokenizer does).
    pub fn decode(&self, ids: &[u32], skip_special: bool, strip_prefix: bool) -> String {
        let mut bytes = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            self.piece(id, skip_special, &mut bytes);
            if i == 0 && strip_prefix && self.add_space_prefix && bytes.first() == Some(&b' ') {
                bytes.remove(0);
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// `<0xNN>` -> the byte NN.
pub fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge: the best score first, then the leftmost (llama.cpp's `llm_bigram_spm`).
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    len: usize,
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vocabulary where "ab" outscores "bc": "abc" must become "ab" + "c".
    fn vocab() -> Spm {
        let tokens = [
            "<unk>", "<s>", "a", "b", "c", "ab", "bc", "▁", "▁ab", "<0x41>",
        ];
        let scores = [0.0, 0.0, -1.0, -1.0, -1.0, -2.0, -3.0, -1.0, -0.5, 0.0];
        let kinds = [
            TokenKind::Unknown,
            TokenKind::Control,
            TokenKind::Normal,
            TokenKind::Normal,
            TokenKind::Normal,
            TokenKind::Normal,
            TokenKind::Normal,
            TokenKind::Normal,
            TokenKind::Normal,
            TokenKind::Byte,
        ];
        Spm::new(
            tokens.iter().map(|s| s.to_string()).collect(),
            scores.to_vec(),
            kinds.to_vec(),
            Some(0),
            true,
            &[1],
        )
        .unwrap()
    }

    #[test]
    fn merges_by_score_and_falls_back_to_bytes() {
        let v = vocab();
        assert_eq!(v.encode("abc").unwrap(), vec![8, 4]);
        // 'A' has a byte token; 'Z' falls back to <unk>.
        assert_eq!(v.encode("A").unwrap(), vec![7, 9]);
        assert_eq!(v.encode("Z").unwrap(), vec![7, 0]);
        assert_eq!(v.encode("").unwrap(), Vec::<u32>::new());
        // A special token in the text; the text after it gets the space prefix again.
        assert_eq!(v.encode("<s>ab").unwrap(), vec![1, 8]);
        // <s> drops the ASCII whitespace after it (here), <unk> does not.
        assert_eq!(v.encode("<s> \n\tab").unwrap(), vec![1, 8]);
        assert_eq!(v.encode("<unk> ab").unwrap(), vec![0, 7, 8]);
        assert_eq!(v.decode(&[8, 4, 9], true, true), "abcA");
        assert_eq!(v.decode(&[8, 4], true, false), " abc");
        assert_eq!(v.decode(&[1, 5], false, true), "<s>ab");
    }

    #[test]
    fn rejects_inconsistent_vocabularies() {
        let e = Spm::new(vec!["a".into()], vec![], vec![], None, true, &[]);
        assert!(e.err().unwrap().to_string().contains("0 scores"));
        let e = Spm::new(
            vec!["a".into()],
            vec![0.0],
            vec![TokenKind::Normal],
            Some(5),
            true,
            &[],
        );
        assert!(e.err().unwrap().to_string().contains("unknown token id 5"));
    }
}
