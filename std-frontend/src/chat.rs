//! Chat templates: the Jinja template a model ships (GGUF `tokenizer.chat_template`, or
//! `chat_template` in `tokenizer_config.json`), rendered with minijinja.
use anyhow::{anyhow, Result};
use minijinja::{context, Environment, Error, ErrorKind};
use serde::Serialize;

use crate::load::ModelFiles;
use crate::tokenizer::Tokenizer;

/// ChatML, for models that ship no template.
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

#[derive(Debug, Clone, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// The ids of the tokens chat templates end a turn with, where the vocabulary has them.
pub fn end_of_turn_ids(tokenizer: &Tokenizer) -> Vec<u32> {
    ["<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"]
        .iter()
        .filter_map(|t| tokenizer.id(t))
        .collect()
}

/// The most template instructions one rendering runs: real templates take thousands per message.
const TEMPLATE_FUEL: u64 = 50_000_000;

/// The most bytes one rendering writes: far more than any context holds as text.
const TEMPLATE_OUTPUT_LIMIT: usize = 64 << 20;

/// A `Vec` that refuses to grow past `TEMPLATE_OUTPUT_LIMIT`.
struct CappedWriter(Vec<u8>);

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > TEMPLATE_OUTPUT_LIMIT {
            return Err(std::io::Error::other("chat template output limit"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl ChatTemplate {
    /// The model's template, or ChatML (with a note on stderr) when it has none.
    pub fn load(files: &ModelFiles, tokenizer: &Tokenizer) -> Result<Self> {
        let mut source = files
            .gguf()
            .and_then(|g| g.str("tokenizer.chat_template"))
            .map(str::to_owned);
        let (mut bos, mut eos) = (String::new(), String::new());
        if let Ok(text) = std::fs::read_to_string(files.dir().join("tokenizer_config.json")) {
            let v: serde_json::Value = serde_json::from_str(&text)?;
            if source.is_none() {
                source = match v.get("chat_template") {
                    Some(serde_json::Value::String(s)) => Some(s.clone()),
                    Some(serde_json::Value::Array(list)) => list
                        .iter()
                        .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                        .and_then(|t| t.get("template")?.as_str())
                        .map(str::to_owned),
                    _ => None,
                };
            }
            let token = |k: &str| match v.get(k) {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                Some(o) => o.get("content").and_then(|c| c.as_str()).map(str::to_owned),
                None => None,
            };
            bos = token("bos_token").unwrap_or_default();
            eos = token("eos_token").unwrap_or_default();
        }
        let piece = |id: Option<u32>| {
            id.and_then(|i| tokenizer.decode(&[i], false).ok())
                .unwrap_or_default()
        };
        if bos.is_empty() {
            bos = piece(files.bos_token_id);
        }
        if eos.is_empty() {
            eos = piece(files.eos_token_ids.first().copied());
        }
        let source = source.unwrap_or_else(|| {
            eprintln!("note: the model ships no chat template; using ChatML");
            CHATML.to_owned()
        });
        Self::new(source, bos, eos)
    }

    pub fn new(source: String, bos: String, eos: String) -> Result<Self> {
        let mut env = Environment::new();
        // A template is code from a file: bound its work, so that a loop ends in an error.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source)
            .map_err(|e| anyhow!("the chat template does not parse: {e}"))?;
        Ok(ChatTemplate { env, bos, eos })
    }

    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let t = self.env.get_template("chat")?;
        let mut out = CappedWriter(Vec::new());
        t.render_captured_to(
            context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos,
                eos_token => &self.eos,
            },
            &mut out,
        )
        .map_err(|e| match e.kind() {
            ErrorKind::WriteFailure => anyhow!(
                "chat template: the rendered prompt passes {TEMPLATE_OUTPUT_LIMIT} bytes"
            ),
            ErrorKind::OutOfFuel => anyhow!(
                "chat template: rendering took more than {TEMPLATE_FUEL} steps (a loop that does not end?)"
            ),
            _ => anyhow!("chat template: {e}"),
        })?;
        String::from_utf8(out.0).map_err(|_| anyhow!("chat template: output is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_chatml_with_python_methods() {
        let src = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'].strip() }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let t = ChatTemplate::new(src.into(), String::new(), String::new()).unwrap();
        let out = t
            .render(
                &[Message {
                    role: "user".into(),
                    content: " hi ".into(),
                }],
                true,
            )
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn hostile_templates_end_in_errors() {
        let render = |src: &str| {
            ChatTemplate::new(src.into(), String::new(), String::new())
                .unwrap()
                .render(&[], false)
                .unwrap_err()
                .to_string()
        };
        let looping = render(
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        );
        assert!(looping.contains("steps"), "{looping}");
        let huge = render("{% for i in range(1000) %}{{ 'x' * 1000000 }}{% endfor %}");
        assert!(huge.contains("bytes"), "{huge}");
        let recursive = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
        assert!(recursive.contains("chat template"), "{recursive}");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new(
            "{{ raise_exception('no system role') }}".into(),
            String::new(),
            String::new(),
        )
        .unwrap();
        assert!(t
            .render(&[], false)
            .unwrap_err()
            .to_string()
            .contains("no system role"));
    }
}
