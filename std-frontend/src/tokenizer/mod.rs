//! Text <-> token ids: from `tokenizer.json` with the `tokenizers` crate, or built from a GGUF
//! file's `tokenizer.ggml.*` keys. From GGUF, byte-level BPE (`tokenizer.ggml.model = "gpt2"`)
//! with the pre-tokenizers `pre_tokenizer` lists, and SentencePiece (`llama`, see `spm`).
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Result};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::load::gguf::{Gguf, Value};
use crate::load::ModelFiles;

pub mod spm;

use spm::{Spm, TokenKind};

/// GPT-2's pre-tokenizer regex, and the ones llama.cpp (`llm_tokenizer_bpe`) uses for the
/// vocabularies that depart from it.
const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const FALCON_REGEXES: [&str; 3] = [
    r"[\p{P}\$\+<=>\^~\|`]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"[0-9][0-9][0-9]",
];
const DEEPSEEK_CODER_REGEXES: [&str; 5] = [
    r"[\r\n]",
    r"\s?\p{L}+",
    r"\s?\p{P}+",
    r"[一-龥ࠀ-一가-퟿]+",
    r"\p{N}",
];
const BLOOM_REGEX: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";
/// DeepSeek LLM's, with llama.cpp's character classes by code point: some of their Greek letters
/// have canonical equivalents that a tool normalizing the text would swap in, breaking a range.
const DEEPSEEK_LLM_REGEXES: [&str; 6] = [
    r"[\r\n]",
    concat!(
        r"\s?[A-Za-z\u{b5}\u{c0}-\u{d6}\u{d8}-\u{f6}\u{f8}-\u{1ba}\u{1bc}-\u{1bf}",
        r"\u{1c4}-\u{293}\u{295}-\u{2af}\u{370}-\u{373}\u{376}\u{377}\u{37b}-\u{37d}\u{37f}",
        r"\u{386}\u{388}-\u{38a}\u{38c}\u{38e}-\u{3a1}\u{3a3}-\u{3f5}\u{3f7}-\u{481}",
        r"\u{48a}-\u{52f}\u{531}-\u{556}\u{10a0}-\u{10c5}\u{13a0}-\u{13f5}\u{13f8}-\u{13fd}",
        r"\u{1c90}-\u{1cba}\u{1cbd}-\u{1cbf}\u{1d00}-\u{1d2b}\u{1d6b}-\u{1d77}",
        r"\u{1d79}-\u{1d9a}\u{1e00}-\u{1f15}\u{1f18}-\u{1f1d}\u{1f20}-\u{1f45}",
        r"\u{1f48}-\u{1f4d}\u{1f50}-\u{1f57}\u{1f59}\u{1f5b}\u{1f5d}\u{1f5f}-\u{1f7d}",
        r"\u{1f80}-\u{1fb4}\u{1fb6}-\u{1fbc}\u{1fbe}\u{1fc2}-\u{1fc4}\u{1fc6}-\u{1fcc}",
        r"\u{1fd0}-\u{1fd3}\u{1fd6}-\u{1fdb}\u{1fe0}-\u{1fec}\u{1ff2}-\u{1ff4}",
        r"\u{1ff6}-\u{1ffc}\u{2102}\u{2107}\u{210a}-\u{2113}\u{2115}\u{2119}-\u{211d}\u{2124}",
        r"\u{2126}\u{2128}\u{212a}-\u{212d}\u{212f}-\u{2134}\u{2139}\u{213c}-\u{213f}",
        r"\u{2145}-\u{2149}\u{214e}\u{2183}\u{2184}\u{2c00}-\u{2c7b}\u{2c7e}-\u{2ce4}",
        r"\u{2ceb}-\u{2cee}\u{2cf2}\u{2cf3}\u{a640}-\u{a66d}\u{a680}-\u{a69b}\u{a722}-\u{a76f}",
        r"\u{a771}-\u{a787}\u{a78b}-\u{a78e}\u{ab70}-\u{abbf}\u{fb00}-\u{fb06}",
        r"\u{fb13}-\u{fb17}\u{ff21}-\u{ff3a}\u{ff41}-\u{ff5a}\u{10400}-\u{1044f}",
        r"\u{104b0}-\u{104d3}\u{104d8}-\u{104fb}\u{10c80}-\u{10cb2}\u{10cc0}-\u{10cf2}",
        r"\u{118a0}-\u{118df}\u{1e900}-\u{1e943}]+",
    ),
    r"\s?[!-/:-~\u{ff01}-\u{ff0f}\u{ff1a}-\u{ff5e}\u{2018}-\u{201f}\u{3000}-\u{3002}]+",
    r"\s+$",
    r"[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+",
    r"\p{N}+",
];
/// ByteDance's Seed-Coder.
const SEED_CODER_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Mistral's Tekken (Mistral NeMo, Ministral, Mistral Small 3): the regex of its
/// `tokenizer.json`, which llama.cpp rewrites for its own regex engine.
const TEKKEN_REGEX: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The GGUF `tokenizer.ggml.pre` names whose pre-tokenizer sapient builds, for error messages
/// and the README.
pub const BPE_PRE_TOKENIZERS: &str = "default, gpt2, gpt-2, phi-2, mpt, olmo, jais, trillion, \
    gigachat, a.x-4.0, mellum, llama-bpe, llama3, llama-v3, dbrx, smaug-bpe, falcon3, pixtral, \
    midm-2.0, qwen2, stablelm2, deepseek-r1-qwen, megrez, qwen35, smollm, starcoder, refact, \
    command-r, codeshell, exaone, minerva-7b, falcon, deepseek-coder, deepseek-llm, chatglm-bpe, \
    bloom, gpt3-finnish, poro-chat, viking, tekken, seed-coder";

pub struct Tokenizer {
    model: Model,
    /// Prepended to prompts when the model's files ask for it.
    pub bos: Option<u32>,
    /// A `tokenizers` model's twin that reads special tokens' texts as text, made when
    /// `encode_plain` first needs it.
    plain: OnceLock<Box<tokenizers::Tokenizer>>,
}

enum Model {
    /// A `tokenizer.json`, or byte-level BPE from GGUF.
    Hf(Box<tokenizers::Tokenizer>),
    /// A SentencePiece vocabulary from GGUF.
    Spm(Box<Spm>),
}

impl Tokenizer {
    /// `tokenizer.json` beside the model, or the GGUF file's own vocabulary.
    pub fn load(files: &ModelFiles) -> Result<Self> {
        let json = files.dir().join("tokenizer.json");
        if json.is_file() && (files.gguf().is_none() || files.path.is_dir()) {
            return Self::from_json(&json);
        }
        match files.gguf() {
            Some(g) => Self::from_gguf(g),
            None => bail!(
                "no tokenizer: {} has no tokenizer.json",
                files.dir().display()
            ),
        }
    }

    /// The tokenizer alone, without the weights or config a model needs: of a `.gguf` file
    /// (vocabulary-only ones too), or of a directory's `tokenizer.json` or single `.gguf`.
    pub fn open(path: &std::path::Path) -> Result<Self> {
        let gguf = if path.is_dir() {
            let json = path.join("tokenizer.json");
            if json.is_file() {
                return Self::from_json(&json);
            }
            crate::load::only_gguf(path)?.ok_or_else(|| {
                anyhow!(
                    "no tokenizer: {} has neither tokenizer.json nor a .gguf file",
                    path.display()
                )
            })?
        } else {
            path.to_path_buf()
        };
        if gguf.extension().is_none_or(|e| e != "gguf") {
            bail!(
                "no tokenizer: {} is neither a directory nor a .gguf file",
                path.display()
            );
        }
        let map = crate::load::map_file(&gguf)?;
        let g = Gguf::parse(&map).map_err(|e| anyhow!("in {}: {e:#}", gguf.display()))?;
        Self::from_gguf(&g)
    }

    pub fn from_json(path: &std::path::Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| anyhow!("cannot read {}: {e}", path.display()))?;
        Ok(Tokenizer {
            model: Model::Hf(Box::new(inner)),
            bos: None,
            plain: OnceLock::new(),
        })
    }

    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let kind = g.str("tokenizer.ggml.model").unwrap_or("");
        let tokens = strings(g, "tokenizer.ggml.tokens")?;
        let types: Vec<TokenKind> = match g.get("tokenizer.ggml.token_type") {
            Some(Value::Array(a)) => a.iter().map(|v| TokenKind::from_gguf(integer(v))).collect(),
            _ => vec![TokenKind::Normal; tokens.len()],
        };
        if types.len() != tokens.len() {
            bail!(
                "GGUF vocabulary has {} tokens but {} token types",
                tokens.len(),
                types.len()
            );
        }
        let model = match kind {
            "gpt2" => Model::Hf(Box::new(bpe_from_gguf(g, &tokens, &types)?)),
            "llama" => Model::Spm(Box::new(spm_from_gguf(g, &tokens, types)?)),
            other => bail!(
                "GGUF tokenizer model {other:?} is not supported: sapient builds SentencePiece (\"llama\") and byte-level BPE (\"gpt2\") tokenizers from GGUF; for others put a tokenizer.json beside the model"
            ),
        };
        // SentencePiece vocabularies add BOS unless told not to, as llama.cpp does.
        let add_bos = g
            .get("tokenizer.ggml.add_bos_token")
            .and_then(Value::as_bool)
            .unwrap_or(kind == "llama");
        let bos = match g.u64("tokenizer.ggml.bos_token_id") {
            Some(id) if add_bos => {
                if id >= tokens.len() as u64 {
                    bail!(
                        "BOS token id {id} is outside the vocabulary of {}",
                        tokens.len()
                    );
                }
                Some(id as u32)
            }
            _ => None,
        };
        Ok(Tokenizer {
            model,
            bos,
            plain: OnceLock::new(),
        })
    }

    /// Token ids of `text`; special tokens written in the text (`<|im_start|>`) are recognized, no
    /// BOS is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match &self.model {
            Model::Hf(t) => {
                let enc = t
                    .encode(text, false)
                    .map_err(|e| anyhow!("tokenizer: {e}"))?;
                Ok(enc.get_ids().to_vec())
            }
            Model::Spm(s) => s.encode(text),
        }
    }

    /// Token ids of `text` read as text: special tokens' texts in it (`<|endoftext|>` in a
    /// source file) stay text, as llama.cpp tokenizes with `parse_special` off; no BOS. For
    /// text from outside a prompt's own markup (the code of a fill-in-the-middle prompt).
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        match &self.model {
            Model::Hf(t) => {
                let plain = self.plain.get_or_init(|| {
                    let mut plain = t.clone();
                    plain.set_encode_special_tokens(true);
                    plain
                });
                let enc = plain
                    .encode(text, false)
                    .map_err(|e| anyhow!("tokenizer: {e}"))?;
                Ok(enc.get_ids().to_vec())
            }
            Model::Spm(s) => s.encode_plain(text),
        }
    }

    /// Token ids of a prompt: `encode`, after the BOS token when the model asks for one.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids: Vec<u32> = self.bos.into_iter().collect();
        ids.extend(self.encode(text)?);
        Ok(ids)
    }

    /// Token ids of a rendered chat: `encode`, with the BOS token first where the model asks
    /// for one and the template did not already write it.
    pub fn encode_chat(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode(text)?;
        if let Some(bos) = self.bos.filter(|b| ids.first() != Some(b)) {
            ids.insert(0, bos);
        }
        Ok(ids)
    }

    /// The text of a whole sequence (SentencePiece: without the space its encoding put first).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        match &self.model {
            Model::Hf(t) => t
                .decode(ids, skip_special)
                .map_err(|e| anyhow!("tokenizer: {e}")),
            Model::Spm(s) => Ok(s.decode(ids, skip_special, true)),
        }
    }

    /// The text of tokens that continue a sequence: `decode` without removing a leading space.
    pub fn decode_continuation(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        match &self.model {
            Model::Spm(s) => Ok(s.decode(ids, skip_special, false)),
            Model::Hf(_) => self.decode(ids, skip_special),
        }
    }

    /// The bytes token `id` stands for, as it would appear in decoded text (special tokens
    /// as their text; a byte token as its byte, even where that is half a character). Empty
    /// for an id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        match &self.model {
            Model::Spm(s) => {
                let mut out = Vec::new();
                s.piece(id, false, &mut out);
                out
            }
            Model::Hf(t) => {
                let Some(token) = t.id_to_token(id) else {
                    return Vec::new();
                };
                let byte_level = matches!(
                    t.get_decoder(),
                    Some(tokenizers::DecoderWrapper::ByteLevel(_))
                );
                if byte_level {
                    // Added tokens are stored as their text, which has no characters outside
                    // the byte-level alphabet's printable ASCII, so this maps them too.
                    if let Some(bytes) = token.chars().map(byte_level_byte).collect() {
                        return bytes;
                    }
                }
                if let Some(b) = spm::parse_byte_token(&token) {
                    return vec![b];
                }
                t.decode(&[id], false)
                    .map(String::into_bytes)
                    .unwrap_or_default()
            }
        }
    }

    /// Ids of the special tokens (control tokens: chat markers, BOS/EOS...), which decoded text
    /// leaves out.
    pub fn special_ids(&self) -> Vec<u32> {
        match &self.model {
            Model::Spm(s) => s.special_ids(),
            Model::Hf(t) => {
                let mut ids: Vec<u32> = t
                    .get_added_tokens_decoder()
                    .into_iter()
                    .filter(|(_, a)| a.special)
                    .map(|(id, _)| id)
                    .collect();
                ids.sort_unstable();
                ids
            }
        }
    }

    /// The tokenizer as a Hugging Face `tokenizer.json` (byte-level BPE ones; a SentencePiece
    /// vocabulary has no such form here).
    pub fn to_hf_json(&self) -> Result<String> {
        match &self.model {
            Model::Hf(t) => t.to_string(true).map_err(|e| anyhow!("tokenizer: {e}")),
            Model::Spm(_) => bail!("a SentencePiece vocabulary has no tokenizer.json form here"),
        }
    }

    pub fn id(&self, token: &str) -> Option<u32> {
        match &self.model {
            Model::Hf(t) => t.token_to_id(token),
            Model::Spm(s) => s.id(token),
        }
    }

    pub fn vocab_size(&self) -> usize {
        match &self.model {
            Model::Hf(t) => t.get_vocab_size(true),
            Model::Spm(s) => s.vocab_size(),
        }
    }
}

fn bpe_from_gguf(g: &Gguf, tokens: &[&str], types: &[TokenKind]) -> Result<tokenizers::Tokenizer> {
    let merges = strings(g, "tokenizer.ggml.merges")?;
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
    let pre = g.str("tokenizer.ggml.pre").unwrap_or("default");
    let (pre_tokenizer, ignore_merges) = pre_tokenizer(pre)?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| anyhow!("cannot build the BPE model from GGUF: {e}"))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pre_tokenizer));
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    let added: Vec<AddedToken> = tokens
        .iter()
        .zip(types)
        .filter(|(_, t)| matches!(t, TokenKind::Control | TokenKind::UserDefined))
        .map(|(s, t)| AddedToken::from(s.to_string(), *t == TokenKind::Control))
        .collect();
    inner.add_special_tokens(&added);
    Ok(inner)
}

fn spm_from_gguf(g: &Gguf, tokens: &[&str], types: Vec<TokenKind>) -> Result<Spm> {
    let scores: Vec<f32> = match g.get("tokenizer.ggml.scores") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_f64()
                    .map(|f| f as f32)
                    .ok_or_else(|| anyhow!("GGUF tokenizer.ggml.scores holds a non-number"))
            })
            .collect::<Result<_>>()?,
        _ => vec![0.0; tokens.len()],
    };
    let unknown = g
        .u64("tokenizer.ggml.unknown_token_id")
        .map(|u| u32::try_from(u).unwrap_or(u32::MAX));
    let add_space_prefix = g
        .get("tokenizer.ggml.add_space_prefix")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let strip_after = phi3_strip_after(g.str("general.name"), tokens, &types);
    Spm::new(
        tokens.iter().map(|t| t.to_string()).collect(),
        scores,
        types,
        unknown,
        add_space_prefix,
        &strip_after,
    )
}

/// The special tokens that drop the whitespace after them: in a Phi-3 model (by its
/// `general.name`, as llama.cpp tells), all but `<unk>`, `<s>` and `<|endoftext|>`, as Phi-3's
/// `tokenizer.json` marks them (`rstrip`). Its chat template writes a newline after each turn's
/// tokens (`<|user|>`, `<|end|>`), which the model never saw.
fn phi3_strip_after(name: Option<&str>, tokens: &[&str], types: &[TokenKind]) -> Vec<u32> {
    let name = name.unwrap_or("").to_lowercase();
    if !(name.contains("phi-3") || name.contains("phi3")) {
        return Vec::new();
    }
    (0..tokens.len() as u32)
        .filter(|&i| {
            let (text, kind) = (tokens[i as usize], types[i as usize]);
            kind.is_special() && !matches!(text, "<unk>" | "<s>" | "<|endoftext|>")
        })
        .collect()
}

fn integer(v: &Value) -> i64 {
    match v {
        Value::I32(t) => *t as i64,
        other => other.as_u64().map_or(0, |t| t as i64),
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

/// The pre-tokenizer llama.cpp uses for the GGUF `tokenizer.ggml.pre` name `pre` (its regexes
/// applied in turn, each splitting the pieces the previous one left), and whether a piece that
/// is a whole vocabulary entry skips the merges (llama.cpp's `ignore_merges`).
fn pre_tokenizer(pre: &str) -> Result<(PreTokenizerWrapper, bool)> {
    let regexes: &[&str] = match pre {
        "default" | "gpt2" | "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "trillion"
        | "gigachat" | "a.x-4.0" | "mellum" => &[GPT2_REGEX],
        "llama-bpe" | "llama3" | "llama-v3" | "dbrx" | "smaug-bpe" | "falcon3" | "pixtral"
        | "midm-2.0" => &[LLAMA3_REGEX],
        "qwen2" | "stablelm2" | "deepseek-r1-qwen" | "megrez" => &[QWEN2_REGEX],
        "qwen35" => &[QWEN35_REGEX],
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
        | "minerva-7b" => &[r"\p{N}", GPT2_REGEX],
        "falcon" => &FALCON_REGEXES,
        "deepseek-coder" => &DEEPSEEK_CODER_REGEXES,
        "deepseek-llm" => &DEEPSEEK_LLM_REGEXES,
        "chatglm-bpe" => &[LLAMA3_REGEX],
        "bloom" | "gpt3-finnish" | "poro-chat" => &[BLOOM_REGEX],
        "viking" => &[BLOOM_REGEX, r"\p{N}"],
        "tekken" => &[TEKKEN_REGEX],
        "seed-coder" => &[SEED_CODER_REGEX],
        other => bail!(
            "GGUF pre-tokenizer {other:?} is not supported (sapient knows: {BPE_PRE_TOKENIZERS}); put the model's tokenizer.json beside it"
        ),
    };
    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(regexes.len() + 1);
    for re in regexes {
        let split = Split::new(
            SplitPattern::Regex((*re).to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| anyhow!("pre-tokenizer regex: {e}"))?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, true, false).into());
    let ignore_merges = matches!(
        pre,
        "llama-bpe" | "llama3" | "llama-v3" | "falcon3" | "pixtral" | "midm-2.0" | "tekken"
    );
    Ok((Sequence::new(steps).into(), ignore_merges))
}

/// The byte a character of GPT-2's byte-level alphabet stands for: printable Latin-1 bytes are
/// themselves, the other 68 bytes are `U+0100 + n` in increasing order of the byte.
fn byte_level_byte(c: char) -> Option<u8> {
    let printable = |b: u32| matches!(b, 0x21..=0x7e | 0xa1..=0xac | 0xae..=0xff);
    let c = c as u32;
    if printable(c) {
        return Some(c as u8);
    }
    let n = c.checked_sub(0x100)?;
    (0u32..256)
        .filter(|&b| !printable(b))
        .nth(n as usize)
        .map(|b| b as u8)
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
            .decode_continuation(&self.ids[self.prev..self.cur], true)?;
        self.ids.push(id);
        let now = self
            .tokenizer
            .decode_continuation(&self.ids[self.prev..], true)?;
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
            .decode_continuation(&self.ids[self.prev..self.cur], true)?;
        let now = self
            .tokenizer
            .decode_continuation(&self.ids[self.prev..], true)?;
        self.prev = self.ids.len();
        self.cur = self.ids.len();
        Ok(now
            .get(before.len()..)
            .filter(|s| !s.is_empty())
            .map(str::to_owned))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name the error message and the README list builds its pre-tokenizer (each regex
    /// compiles), and a name outside the list is refused by name.
    #[test]
    fn every_listed_pre_tokenizer_builds() {
        let names: Vec<&str> = BPE_PRE_TOKENIZERS.split(',').map(str::trim).collect();
        assert!(names.len() >= 40, "{names:?}");
        for name in names {
            if let Err(e) = pre_tokenizer(name) {
                panic!("{name}: {e:#}");
            }
        }
        let e = pre_tokenizer("gpt-4o").expect_err("gpt-4o is not supported");
        assert!(format!("{e:#}").contains("\"gpt-4o\""), "{e:#}");
    }
}
