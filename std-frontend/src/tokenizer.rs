//! Text <-> token ids with the `tokenizers` crate: from `tokenizer.json`, or built from a GGUF
//! file's `tokenizer.ggml.*` keys. GGUF's byte-level BPE (`tokenizer.ggml.model = "gpt2"`) is
//! supported with the pre-tokenizers of SmolLM (`smollm`), GPT-2 (`gpt2`, `default`), Llama 3
//! (`llama-bpe`) and Qwen2 (`qwen2`); SentencePiece vocabularies (`llama`) need a tokenizer.json.
use anyhow::{anyhow, bail, Result};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::load::gguf::{Gguf, Value};
use crate::load::ModelFiles;

const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GGUF token types (llama.cpp's `llama_token_type`).
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Prepended to prompts when the model's files ask for it.
    pub bos: Option<u32>,
}

impl Tokenizer {
    /// `tokenizer.json` beside the model, or the GGUF file's own vocabulary.
    pub fn load(files: &ModelFiles) -> Result<Self> {
        let json = files.dir().join("tokenizer.json");
        if json.is_file() && (files.gguf().is_none() || files.path.is_dir()) {
            let inner = tokenizers::Tokenizer::from_file(&json)
                .map_err(|e| anyhow!("cannot read {}: {e}", json.display()))?;
            return Ok(Tokenizer { inner, bos: None });
        }
        match files.gguf() {
            Some(g) => Self::from_gguf(g),
            None => bail!(
                "no tokenizer: {} has no tokenizer.json",
                files.dir().display()
            ),
        }
    }

    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let model = g.str("tokenizer.ggml.model").unwrap_or("");
        if model != "gpt2" {
            bail!(
                "GGUF tokenizer model {model:?} is not supported: sapient builds byte-level BPE (\"gpt2\") tokenizers from GGUF; for others put a tokenizer.json beside the model"
            );
        }
        let tokens = strings(g, "tokenizer.ggml.tokens")?;
        let merges = strings(g, "tokenizer.ggml.merges")?;
        let types: Vec<i64> = match g.get("tokenizer.ggml.token_type") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| match v {
                    Value::I32(t) => *t as i64,
                    other => other.as_u64().map_or(0, |t| t as i64),
                })
                .collect(),
            _ => vec![1; tokens.len()],
        };
        let vocab: ahash::AHashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i as u32))
            .collect();
        let merges = merges
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| anyhow!("GGUF merge {m:?} is not two tokens"))
            })
            .collect::<Result<Vec<_>>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| anyhow!("cannot build the BPE model from GGUF: {e}"))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        let pre = g.str("tokenizer.ggml.pre").unwrap_or("default");
        inner.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let added: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, t)| **t == TOKEN_CONTROL || **t == TOKEN_USER_DEFINED)
            .map(|(s, t)| AddedToken::from(s.to_string(), *t == TOKEN_CONTROL))
            .collect();
        inner.add_special_tokens(&added);
        let add_bos = g
            .get("tokenizer.ggml.add_bos_token")
            .and_then(Value::as_bool)
            == Some(true);
        let bos = g
            .u64("tokenizer.ggml.bos_token_id")
            .map(|v| v as u32)
            .filter(|_| add_bos);
        Ok(Tokenizer { inner, bos })
    }

    /// Token ids of `text`; special tokens written in the text (`<|im_start|>`) are recognized, no
    /// BOS is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| anyhow!("tokenizer: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids of a prompt: `encode`, after the BOS token when the model asks for one.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids: Vec<u32> = self.bos.into_iter().collect();
        ids.extend(self.encode(text)?);
        Ok(ids)
    }

    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| anyhow!("tokenizer: {e}"))
    }

    pub fn id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

fn strings<'g>(g: &'g Gguf, key: &str) -> Result<Vec<&'g str>> {
    let a = g
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("GGUF file has no {key}"))?;
    a.iter()
        .map(|v| {
            v.as_str()
                .ok_or_else(|| anyhow!("GGUF {key} holds a non-string"))
        })
        .collect()
}

fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper> {
    let split = |re: &str| -> Result<PreTokenizerWrapper> {
        let s = Split::new(
            SplitPattern::Regex(re.to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| anyhow!("pre-tokenizer regex: {e}"))?;
        Ok(Sequence::new(vec![s.into(), ByteLevel::new(false, true, false).into()]).into())
    };
    Ok(match pre {
        // SmolLM2's tokenizer.json: single digits first, then the GPT-2 regex.
        "smollm" => Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])
        .into(),
        "llama-bpe" | "llama3" => split(LLAMA3_REGEX)?,
        "qwen2" => split(QWEN2_REGEX)?,
        "gpt2" | "default" => ByteLevel::new(false, true, true).into(),
        other => {
            eprintln!(
                "warning: GGUF pre-tokenizer {other:?} is not known to sapient; using GPT-2's"
            );
            ByteLevel::new(false, true, true).into()
        }
    })
}

/// Turns a stream of token ids into text without ever emitting half a UTF-8 character: the
/// tokens since the last emitted boundary are decoded together, and text is emitted only when
/// it no longer ends in an incomplete character.
pub struct TextStream<'t> {
    tokenizer: &'t Tokenizer,
    ids: Vec<u32>,
    /// Start of the tokens whose text is not final yet.
    prev: usize,
    /// Tokens up to here have been emitted.
    cur: usize,
}

impl<'t> TextStream<'t> {
    pub fn new(tokenizer: &'t Tokenizer) -> Self {
        TextStream {
            tokenizer,
            ids: Vec::new(),
            prev: 0,
            cur: 0,
        }
    }

    /// Adds a token; returns the text it completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        let before = self
            .tokenizer
            .decode(&self.ids[self.prev..self.cur], true)?;
        self.ids.push(id);
        let now = self.tokenizer.decode(&self.ids[self.prev..], true)?;
        if now.len() > before.len()
            && !now.ends_with('\u{fffd}')
            && now.is_char_boundary(before.len())
        {
            let text = now[before.len()..].to_owned();
            self.prev = self.cur;
            self.cur = self.ids.len();
            Ok(Some(text))
        } else {
            Ok(None)
        }
    }

    /// Whatever is left at the end of the stream (possibly with replacement characters).
    pub fn finish(&mut self) -> Result<Option<String>> {
        let before = self
            .tokenizer
            .decode(&self.ids[self.prev..self.cur], true)?;
        let now = self.tokenizer.decode(&self.ids[self.prev..], true)?;
        self.prev = self.ids.len();
        self.cur = self.ids.len();
        Ok(now
            .get(before.len()..)
            .filter(|s| !s.is_empty())
            .map(str::to_owned))
    }
}
