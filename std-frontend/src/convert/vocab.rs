//! A Hugging Face tokenizer as GGUF's `tokenizer.ggml.*` metadata, the way llama.cpp's
//! converter writes it for byte-level BPE vocabularies (`gpt2` model): tokens by id (padded to
//! the model's vocabulary with `[PAD{id}]`), token types, merges, the pre-tokenizer's name
//! (recognized by the hash of its tokenization of a fixed text), the special tokens and the
//! chat template.
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

use super::pre_hashes::{CHECK_TEXT, PRE_TOKENIZER_HASHES};
use super::protobuf;
use crate::load::gguf::Value;

/// llama.cpp's token types (SentencePiece's piece types have the same numbers).
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;
const BYTE: i32 = 6;

/// A vocabulary's metadata, and its token texts by id (to find the special tokens).
struct Vocabulary {
    meta: Vec<(String, Value)>,
    texts: Vec<String>,
}

/// The metadata for the tokenizer in `dir` (`tokenizer.model` or `tokenizer.json`,
/// `tokenizer_config.json`, the chat template), for a model of `vocab_size` tokens whose
/// `config.json` gives `bos`/`eos` ids as a fallback. Warnings (a pre-tokenizer llama.cpp does
/// not know) go to `warn`.
pub fn hf_tokenizer_metadata(
    dir: &Path,
    vocab_size: usize,
    bos: Option<u32>,
    eos: Option<u32>,
    warn: &mut dyn FnMut(String),
) -> Result<Vec<(String, Value)>> {
    let config = read_json(&dir.join("tokenizer_config.json")).unwrap_or(Json::Null);
    // As llama.cpp's converter for `llama` models: SentencePiece first.
    let spm = dir.join("tokenizer.model");
    let Vocabulary { mut meta, texts } = if spm.is_file() {
        sentencepiece_metadata(&spm, &config, vocab_size)?
    } else {
        bpe_metadata(&dir.join("tokenizer.json"), vocab_size, warn)?
    };
    let id_of = |key: &str| -> Option<u32> {
        let text = match &config[key] {
            Json::String(s) => s.as_str(),
            Json::Object(o) => o.get("content")?.as_str()?,
            _ => return None,
        };
        texts.iter().position(|t| t == text).map(|id| id as u32)
    };
    let ids = [
        ("bos", id_of("bos_token").or(bos)),
        ("eos", id_of("eos_token").or(eos)),
        ("unknown", id_of("unk_token")),
        ("padding", id_of("pad_token")),
    ];
    for (name, id) in ids {
        if let Some(id) = id {
            meta.push((format!("tokenizer.ggml.{name}_token_id"), Value::U32(id)));
        }
    }
    for key in ["add_bos_token", "add_eos_token"] {
        if let Some(b) = config[key].as_bool() {
            meta.push((format!("tokenizer.ggml.{key}"), Value::Bool(b)));
        }
    }
    if let Some(template) = chat_template(dir, &config) {
        meta.push((
            "tokenizer.chat_template".to_owned(),
            Value::String(template),
        ));
    }
    Ok(meta)
}

/// A byte-level BPE `tokenizer.json` as the `gpt2` model's metadata, and the token texts.
fn bpe_metadata(
    path: &Path,
    vocab_size: usize,
    warn: &mut dyn FnMut(String),
) -> Result<Vocabulary> {
    let json = read_json(path)?;
    let model = &json["model"];
    if model["type"].as_str() != Some("BPE") {
        bail!(
            "{}: only byte-level BPE tokenizers can be written to GGUF (this one is {})",
            path.display(),
            model["type"]
        );
    }
    if model["byte_fallback"].as_bool() == Some(true) {
        bail!(
            "{}: a SentencePiece-style tokenizer.json (byte fallback) needs its tokenizer.model beside it to be written to GGUF",
            path.display()
        );
    }
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| anyhow!("{}: model.vocab is not a map", path.display()))?;
    let mut tokens: Vec<Option<(String, i32)>> = vec![None; vocab_size];
    let mut place = |id: u64, text: &str, ty: i32| -> Result<()> {
        let slot = tokens.get_mut(id as usize).ok_or_else(|| {
            anyhow!(
                "{}: token id {id} ({text:?}) is past the model's vocabulary of {vocab_size}",
                path.display()
            )
        })?;
        *slot = Some((text.to_owned(), ty));
        Ok(())
    };
    for (text, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| anyhow!("{}: the id of {text:?} is not a number", path.display()))?;
        place(id, text, NORMAL)?;
    }
    for added in json["added_tokens"].as_array().into_iter().flatten() {
        let (Some(id), Some(text)) = (added["id"].as_u64(), added["content"].as_str()) else {
            bail!("{}: an added token lacks its id or content", path.display());
        };
        let ty = if added["special"].as_bool() == Some(true) || looks_special(text) {
            CONTROL
        } else {
            USER_DEFINED
        };
        let text = if ty == USER_DEFINED {
            text.replace('\u{2581}', " ")
        } else {
            text.to_owned()
        };
        place(id, &text, ty)?;
    }
    let (token_texts, types): (Vec<Value>, Vec<Value>) = tokens
        .into_iter()
        .enumerate()
        .map(|(id, t)| {
            let (text, ty) = t.unwrap_or_else(|| (format!("[PAD{id}]"), UNUSED));
            (Value::String(text), Value::I32(ty))
        })
        .unzip();
    let merges: Vec<Value> = model["merges"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| match m {
            Json::String(s) => Ok(Value::String(s.clone())),
            Json::Array(pair) => match (pair.first(), pair.get(1)) {
                (Some(Json::String(a)), Some(Json::String(b))) => {
                    Ok(Value::String(format!("{a} {b}")))
                }
                _ => bail!("{}: a merge is not a pair of strings", path.display()),
            },
            _ => bail!("{}: a merge is neither a string nor a pair", path.display()),
        })
        .collect::<Result<_>>()?;

    let pre = pre_tokenizer(path)?.unwrap_or_else(|| {
        warn(format!(
            "{}: llama.cpp does not know this BPE pre-tokenizer; writing \"default\" (llama.cpp may then split text differently)",
            path.display()
        ));
        "default".to_owned()
    });
    let names = token_texts
        .iter()
        .map(|t| t.as_str().unwrap_or_default().to_owned())
        .collect();
    let meta = vec![
        (
            "tokenizer.ggml.model".to_owned(),
            Value::String("gpt2".into()),
        ),
        ("tokenizer.ggml.pre".to_owned(), Value::String(pre)),
        (
            "tokenizer.ggml.tokens".to_owned(),
            Value::Array(token_texts),
        ),
        ("tokenizer.ggml.token_type".to_owned(), Value::Array(types)),
        ("tokenizer.ggml.merges".to_owned(), Value::Array(merges)),
    ];
    Ok(Vocabulary { meta, texts: names })
}

/// A SentencePiece `tokenizer.model` as the `llama` model's metadata, and the token texts:
/// llama.cpp's `_create_vocab_sentencepiece` (the pieces with their scores and types, padded
/// with unused `[PAD{id}]`, then `added_tokens.json` and `tokenizer_config.json`'s
/// `added_tokens_decoder` on top).
fn sentencepiece_metadata(path: &Path, config: &Json, vocab_size: usize) -> Result<Vocabulary> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let pieces =
        protobuf::sentencepieces(&bytes).with_context(|| format!("in {}", path.display()))?;
    let mut tokens: Vec<String> = (0..vocab_size).map(|i| format!("[PAD{i}]")).collect();
    let mut scores = vec![-10000.0f32; vocab_size];
    let mut types = vec![UNUSED; vocab_size];
    for (id, p) in pieces.into_iter().enumerate().take(vocab_size) {
        tokens[id] = p.piece;
        scores[id] = p.score;
        // The converter asks only for unknown, control, unused and byte pieces.
        types[id] = match p.kind {
            UNKNOWN | CONTROL | UNUSED | BYTE => p.kind,
            _ => NORMAL,
        };
    }
    let mut set = |id: usize, text: &str, ty: i32| {
        if id < vocab_size {
            tokens[id] = text.to_owned();
            scores[id] = -1000.0;
            types[id] = ty;
        }
    };
    if let Ok(added) = read_json(&path.with_file_name("added_tokens.json")) {
        for (text, id) in added.as_object().into_iter().flatten() {
            if let Some(id) = id.as_u64() {
                set(id as usize, text, USER_DEFINED);
            }
        }
    }
    for (id, data) in config["added_tokens_decoder"]
        .as_object()
        .into_iter()
        .flatten()
    {
        let (Ok(id), Some(text)) = (id.parse::<usize>(), data["content"].as_str()) else {
            continue;
        };
        if data["special"].as_bool() == Some(true) || looks_special(text) {
            set(id, text, CONTROL);
        } else {
            set(id, &text.replace('\u{2581}', " "), USER_DEFINED);
        }
    }
    let meta = vec![
        (
            "tokenizer.ggml.model".to_owned(),
            Value::String("llama".into()),
        ),
        (
            "tokenizer.ggml.pre".to_owned(),
            Value::String("default".into()),
        ),
        (
            "tokenizer.ggml.tokens".to_owned(),
            Value::Array(tokens.iter().cloned().map(Value::String).collect()),
        ),
        (
            "tokenizer.ggml.scores".to_owned(),
            Value::Array(scores.into_iter().map(Value::F32).collect()),
        ),
        (
            "tokenizer.ggml.token_type".to_owned(),
            Value::Array(types.into_iter().map(Value::I32).collect()),
        ),
    ];
    Ok(Vocabulary {
        meta,
        texts: tokens,
    })
}

fn read_json(path: &Path) -> Result<Json> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))
}

/// llama.cpp's converter also marks added tokens that look like control tokens as control.
fn looks_special(text: &str) -> bool {
    ["<pad>", "<mask>", "<2mass>", "[@BOS@]"].contains(&text)
        || (text.starts_with("<|") && text.ends_with("|>"))
        || (text.starts_with("<\u{ff5c}") && text.ends_with("\u{ff5c}>"))
        || (text.starts_with("<unused") && text.ends_with('>'))
}

/// The name llama.cpp gives this tokenizer's pre-tokenizer: the hash of the ids of
/// `CHECK_TEXT` (special tokens added, as transformers' `encode` does) looked up in its table.
fn pre_tokenizer(path: &Path) -> Result<Option<String>> {
    let tok = tokenizers::Tokenizer::from_file(path)
        .map_err(|e| anyhow!("cannot read {}: {e}", path.display()))?;
    let ids = tok
        .encode(CHECK_TEXT, true)
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let listed: Vec<String> = ids.get_ids().iter().map(u32::to_string).collect();
    let hash = Sha256::digest(format!("[{}]", listed.join(", ")).as_bytes());
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    Ok(PRE_TOKENIZER_HASHES
        .iter()
        .find(|(h, _)| *h == hex)
        .map(|(_, name)| (*name).to_owned()))
}

/// `tokenizer_config.json`'s `chat_template` (a string, or the `default` of a list of named
/// templates), or `chat_template.jinja` beside it.
fn chat_template(dir: &Path, config: &Json) -> Option<String> {
    match &config["chat_template"] {
        Json::String(s) => return Some(s.clone()),
        Json::Array(list) => {
            let default = list
                .iter()
                .find(|t| t["name"].as_str() == Some("default"))?;
            return default["template"].as_str().map(str::to_owned);
        }
        _ => {}
    }
    std::fs::read_to_string(dir.join("chat_template.jinja")).ok()
}
