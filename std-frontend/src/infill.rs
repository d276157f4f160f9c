//! Fill-in-the-middle (FIM): code models trained to write what goes between a prefix and a
//! suffix (Qwen2.5-Coder, StarCoder 2, DeepSeek-Coder, CodeLlama, CodeGemma...). The prompt is
//! the prefix after the model's prefix token, the suffix after its suffix token, then its middle
//! token, after which the model writes the middle (the "PSM" order every one of these uses).
//! Editors ask for it through llama.cpp's `/infill` and OpenAI's `suffix`.
use anyhow::{bail, Result};

use crate::load::gguf::Gguf;
use crate::tokenizer::Tokenizer;

/// The token texts of each role, as llama.cpp looks for them when a GGUF file does not name
/// the ids (so that the same tokens are found, and the same prompt made).
const PREFIX_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const SUFFIX_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const MIDDLE_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const REPO_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FILE_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Tokens that end a middle besides the model's end of sequence and its padding, repository
/// and file separator tokens: an end of text the chat models' GGUF files do not name as their
/// EOS, CodeLlama's end of infill.
const END_TEXTS: &[&str] = &["<|endoftext|>", "<EOT>", "▁<EOT>"];

/// What separates the extra files' texts where the model has no file separator (llama.cpp's).
const SNIPPET_SEPARATOR: &str = "\n\n--- snippet ---\n\n";

/// A model's fill-in-the-middle tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fim {
    prefix: u32,
    suffix: u32,
    middle: u32,
    /// Opens a repository's name (repository-level prompts: Qwen2.5-Coder, StarCoder 2).
    repo: Option<u32>,
    /// Opens another file of the repository.
    file_sep: Option<u32>,
    /// Tokens that end the middle, besides the model's end of sequence.
    ends: Vec<u32>,
}

/// Another file of the project, put before the prefix as context (llama.cpp's `input_extra`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraFile {
    pub filename: String,
    pub text: String,
}

/// What to fill in: the text before the gap, the text after it, the text the middle starts
/// with (llama.cpp's `prompt`), and other files as context.
#[derive(Debug, Clone, Copy, Default)]
pub struct FimRequest<'a> {
    pub prefix: &'a str,
    pub suffix: &'a str,
    pub middle: &'a str,
    pub extra: &'a [ExtraFile],
}

/// A fill-in-the-middle prompt's ids, and whether some of the request had to be cut to fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FimPrompt {
    pub ids: Vec<u32>,
    pub truncated: bool,
}

impl Fim {
    /// The model's FIM tokens: the ids its GGUF file names (`tokenizer.ggml.fim_pre_token_id`
    /// and the rest, or the older `prefix_token_id` keys), else those its vocabulary has by
    /// the texts the families use. `None` when it lacks a prefix, suffix or middle token.
    ///
    /// # Errors
    /// A GGUF key names an id outside the vocabulary.
    pub fn find(tokenizer: &Tokenizer, gguf: Option<&Gguf>) -> Result<Option<Fim>> {
        let vocab = tokenizer.vocab_size();
        let named = |keys: &[&str]| -> Result<Option<u32>> {
            for key in keys {
                let key = format!("tokenizer.ggml.{key}");
                if let Some(id) = gguf.and_then(|g| g.u64(&key)) {
                    if id >= vocab as u64 {
                        bail!("{key} = {id} is outside the vocabulary of {vocab} tokens");
                    }
                    return Ok(Some(id as u32));
                }
            }
            Ok(None)
        };
        let by_text = |texts: &[&str]| texts.iter().find_map(|t| tokenizer.id(t));
        let role = |keys: &[&str], texts: &[&str]| -> Result<Option<u32>> {
            Ok(named(keys)?.or_else(|| by_text(texts)))
        };
        let prefix = role(&["fim_pre_token_id", "prefix_token_id"], PREFIX_TEXTS)?;
        let suffix = role(&["fim_suf_token_id", "suffix_token_id"], SUFFIX_TEXTS)?;
        let middle = role(&["fim_mid_token_id", "middle_token_id"], MIDDLE_TEXTS)?;
        let repo = role(&["fim_rep_token_id"], REPO_TEXTS)?;
        let file_sep = role(&["fim_sep_token_id"], FILE_SEP_TEXTS)?;
        let (Some(prefix), Some(suffix), Some(middle)) = (prefix, suffix, middle) else {
            return Ok(None);
        };
        let mut ends: Vec<u32> = END_TEXTS.iter().filter_map(|t| tokenizer.id(t)).collect();
        ends.extend(role(&["fim_pad_token_id"], PAD_TEXTS)?);
        ends.extend(repo);
        ends.extend(file_sep);
        ends.sort_unstable();
        ends.dedup();
        Ok(Some(Fim {
            prefix,
            suffix,
            middle,
            repo,
            file_sep,
            ends,
        }))
    }

    /// Tokens that end the middle, besides the model's end of sequence.
    pub fn end_ids(&self) -> &[u32] {
        &self.ends
    }

    /// The prompt of `request` in at most `limit` tokens: `[BOS] [context] PRE prefix middle
    /// SUF suffix MID`. The context is llama-server's repository-level layout (Qwen2.5-Coder's
    /// and StarCoder 2's): where the model has the tokens, the repository token and
    /// `myproject`, each extra file after a file separator and its name, and the current file's
    /// separator and the name `filename`; without a file separator, each extra file after a
    /// `--- snippet ---` line. So a middle reads as llama-server's for the same request (which
    /// puts a BOS after the context, not before it); the texts are read as text, special
    /// tokens' texts in them included, as llama-server reads them. What does not fit is cut:
    /// the prefix from its start and the suffix from its end, three quarters of the room kept
    /// for the prefix when both are long, then the context from its start.
    ///
    /// # Errors
    /// The text the middle starts with and the special tokens alone exceed `limit`.
    pub fn prompt(
        &self,
        tokenizer: &Tokenizer,
        request: &FimRequest<'_>,
        limit: usize,
    ) -> Result<FimPrompt> {
        let prefix = tokenizer.encode_plain(request.prefix)?;
        let suffix = tokenizer.encode_plain(request.suffix)?;
        let middle = tokenizer.encode_plain(request.middle)?;
        let extra = self.extra_ids(tokenizer, request.extra)?;
        let fixed = usize::from(tokenizer.bos.is_some()) + 3 + middle.len();
        let Some(room) = limit.checked_sub(fixed) else {
            bail!(
                "the fill-in-the-middle prompt needs {fixed} tokens before any prefix or suffix; \
                 the limit is {limit}"
            );
        };
        let suffix_take = suffix.len().min(room - prefix.len().min(room * 3 / 4));
        let prefix_take = prefix.len().min(room - suffix_take);
        let extra_take = extra.len().min(room - suffix_take - prefix_take);
        let truncated =
            prefix_take < prefix.len() || suffix_take < suffix.len() || extra_take < extra.len();
        let mut ids = Vec::with_capacity(fixed + room);
        ids.extend(tokenizer.bos);
        ids.extend_from_slice(&extra[extra.len() - extra_take..]);
        ids.push(self.prefix);
        ids.extend_from_slice(&prefix[prefix.len() - prefix_take..]);
        ids.extend_from_slice(&middle);
        ids.push(self.suffix);
        ids.extend_from_slice(&suffix[..suffix_take]);
        ids.push(self.middle);
        Ok(FimPrompt { ids, truncated })
    }

    /// The context before the prefix: the repository, the extra files, and the current file's
    /// separator, as llama-server writes them (its placeholder names included, with or without
    /// extra files, where the model has the tokens).
    fn extra_ids(&self, tokenizer: &Tokenizer, extra: &[ExtraFile]) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if let Some(repo) = self.repo {
            ids.push(repo);
            ids.extend(tokenizer.encode_plain("myproject\n")?);
        }
        for file in extra {
            match self.file_sep {
                Some(sep) => {
                    ids.push(sep);
                    ids.extend(tokenizer.encode_plain(&format!("{}\n", file.filename))?);
                }
                None => ids.extend(tokenizer.encode_plain(SNIPPET_SEPARATOR)?),
            }
            ids.extend(tokenizer.encode_plain(&file.text)?);
        }
        if let Some(sep) = self.file_sep {
            ids.push(sep);
            ids.extend(tokenizer.encode_plain("filename\n")?);
        }
        Ok(ids)
    }
}
