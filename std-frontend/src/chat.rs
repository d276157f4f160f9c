//! Chat templates: the Jinja template a model ships (GGUF `tokenizer.chat_template`, or
//! `chat_template` in `tokenizer_config.json`), rendered with minijinja.
use std::path::Path;

use anyhow::{anyhow, Result};
use minijinja::{context, Environment, Error, ErrorKind};
use serde::Serialize;

use crate::load::ModelFiles;
use crate::tokenizer::Tokenizer;
use crate::tool_calls::ToolFormat;

/// ChatML, for models that ship no template.
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A conversation's turn, as templates read it (OpenAI's message fields).
#[derive(Debug, Clone, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
    /// An assistant turn's calls: OpenAI's `tool_calls`, each call's `arguments` an object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// A tool turn's answer to this call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Message {
    /// A turn of text alone.
    pub fn text(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
}

/// The ids of the tokens chat templates end a turn with, where the vocabulary has them.
pub fn end_of_turn_ids(tokenizer: &Tokenizer) -> Vec<u32> {
    [
        "<|im_end|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|end|>",
        "<end_of_turn>",
    ]
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

/// What a request adds to its messages' rendering.
#[derive(Default)]
pub struct RenderOptions<'a> {
    /// The tools the model may call (OpenAI's `tools`, as templates read them).
    pub tools: Option<&'a serde_json::Value>,
    /// Variables for the template (a request's `chat_template_kwargs`, such as Qwen3's
    /// `enable_thinking`), an object.
    pub variables: Option<&'a serde_json::Value>,
}

pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    /// Whether the template renders a system message (llama.cpp's `supports_system_role`);
    /// where it does not, the system prompt goes before the first user message instead.
    system_role: bool,
    /// How the model writes tool calls, as the template's text shows.
    tool_format: ToolFormat,
    /// The model thinks in `<think>` tags, as the template's text shows.
    thinks: bool,
}

impl ChatTemplate {
    /// The template of `file` when given, else the model's, or ChatML (with a note on stderr)
    /// when it has none.
    pub fn load(files: &ModelFiles, tokenizer: &Tokenizer, file: Option<&Path>) -> Result<Self> {
        let mut source = match file {
            Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
                anyhow!("cannot read the chat template file {}: {e}", path.display())
            })?),
            None => files
                .gguf()
                .and_then(|g| g.str("tokenizer.chat_template"))
                .map(str::to_owned),
        };
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
        // As transformers' `apply_chat_template` and llama.cpp render them: a block tag's
        // newline and the indentation before it are not output.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // A template is code from a file: bound its work, so that a loop ends in an error.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        // transformers gives templates the date (Llama 3.2 puts it in the system turn; Mistral
        // Small 3.2 and Granite 3.3 need it).
        env.add_function("strftime_now", |format: String| -> Result<String, Error> {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            strftime(&format, now).map_err(|e| Error::new(ErrorKind::InvalidOperation, e))
        });
        let tool_format = ToolFormat::of_template(&source);
        let thinks = crate::reasoning::template_thinks(&source);
        env.add_template_owned("chat", source)
            .map_err(|e| anyhow!("the chat template does not parse: {e}"))?;
        let mut template = ChatTemplate {
            env,
            bos,
            eos,
            system_role: true,
            tool_format,
            thinks,
        };
        // A template renders a system message if its text comes out; one that raises an error
        // on it, or drops it, does not (the probe llama.cpp runs, to the same end).
        let needle = "<System Needle 7f3a>";
        let probe = [("system", needle), ("user", "User message")]
            .map(|(role, content)| Message::text(role, content));
        template.system_role = template
            .render_as_is(&probe, &RenderOptions::default(), true)
            .is_ok_and(|text| text.contains(needle));
        Ok(template)
    }

    /// How the model writes tool calls.
    pub fn tool_format(&self) -> ToolFormat {
        self.tool_format
    }

    /// Whether the model thinks in `<think>` tags before it answers.
    pub fn thinks(&self) -> bool {
        self.thinks
    }

    /// The prompt for `messages`, with the assistant's turn opened when `add_generation_prompt`.
    /// As llama.cpp does: OpenAI's `developer` role is the system role, and a leading system
    /// message goes before the first user message's text (and a line break) where the template
    /// has no system role.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, &RenderOptions::default(), add_generation_prompt)
    }

    /// `render`, with what a request adds: tools, and variables for the template.
    pub fn render_with(
        &self,
        messages: &[Message],
        options: &RenderOptions<'_>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let with_system_roles: Vec<Message>;
        let messages = if messages.iter().any(|m| m.role == "developer") {
            with_system_roles = messages
                .iter()
                .map(|m| Message {
                    role: if m.role == "developer" {
                        "system"
                    } else {
                        &m.role
                    }
                    .to_owned(),
                    ..m.clone()
                })
                .collect();
            &with_system_roles[..]
        } else {
            messages
        };
        match messages {
            [system, first, rest @ ..] if !self.system_role && system.role == "system" => {
                let mut merged = Vec::with_capacity(rest.len() + 1);
                merged.push(Message {
                    content: format!("{}\n{}", system.content, first.content),
                    ..first.clone()
                });
                merged.extend_from_slice(rest);
                self.render_as_is(&merged, options, add_generation_prompt)
            }
            [system] if !self.system_role && system.role == "system" => {
                self.render_as_is(&[], options, add_generation_prompt)
            }
            _ => self.render_as_is(messages, options, add_generation_prompt),
        }
    }

    fn render_as_is(
        &self,
        messages: &[Message],
        options: &RenderOptions<'_>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let t = self.env.get_template("chat")?;
        let mut out = CappedWriter(Vec::new());
        let base = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos,
            eos_token => &self.eos,
        };
        // Templates test `tools is defined`: a request without tools leaves it undefined.
        let ctx = match options.tools {
            Some(tools) => context! { tools => tools, ..base },
            None => base,
        };
        // The request's own variables, under the ones above (which win where names meet).
        let ctx = match options.variables {
            Some(vars) => context! { ..ctx, ..minijinja::Value::from_serialize(vars) },
            None => ctx,
        };
        // Thinking on unless the request says otherwise, as llama.cpp renders templates (its
        // copies of DeepSeek R1's close the reasoning without it).
        let ctx = context! { ..ctx, ..context! { enable_thinking => true } };
        t.render_captured_to(ctx, &mut out)
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

/// `format` for the UTC time `unix_seconds`, with C's `strftime` directives for dates and times
/// (`%Y %y %m %d %e %j %b %B %a %A %H %I %M %S %p %%`); another directive is an error naming it.
fn strftime(format: &str, unix_seconds: u64) -> Result<String, String> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
    ];
    let days = unix_seconds / 86_400;
    let secs = unix_seconds % 86_400;
    let (year, month, day) = civil_date(days);
    let day_of_year = days - days_before_year(year) + 1;
    // 1 January 1970 was a Thursday.
    let weekday = ((days + 4) % 7) as usize;
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let part = match chars.next() {
            Some('Y') => year.to_string(),
            Some('y') => format!("{:02}", year % 100),
            Some('m') => format!("{month:02}"),
            Some('d') => format!("{day:02}"),
            Some('e') => format!("{day:2}"),
            Some('j') => format!("{day_of_year:03}"),
            Some('b') => MONTHS[month as usize - 1][..3].to_string(),
            Some('B') => MONTHS[month as usize - 1].to_string(),
            Some('a') => DAYS[weekday][..3].to_string(),
            Some('A') => DAYS[weekday].to_string(),
            Some('H') => format!("{hour:02}"),
            Some('I') => format!("{:02}", (hour + 11) % 12 + 1),
            Some('M') => format!("{minute:02}"),
            Some('S') => format!("{second:02}"),
            Some('p') => if hour < 12 { "AM" } else { "PM" }.to_string(),
            Some('%') => "%".to_string(),
            Some(other) => return Err(format!("strftime_now: %{other} is not supported")),
            None => return Err("strftime_now: the format ends in %".to_string()),
        };
        out.push_str(&part);
    }
    Ok(out)
}

/// The (year, month, day) of the day `days` after 1 January 1970 (Howard Hinnant's
/// `civil_from_days`, for days on or after that date).
fn civil_date(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// Days from 1 January 1970 to 1 January of `year` (1970 or later).
fn days_before_year(year: u64) -> u64 {
    let leap_days = |y: u64| y / 4 - y / 100 + y / 400;
    (year - 1970) * 365 + leap_days(year - 1) - leap_days(1969)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_chatml_with_python_methods() {
        let src = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'].strip() }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let t = ChatTemplate::new(src.into(), String::new(), String::new()).unwrap();
        let out = t.render(&[Message::text("user", " hi ")], true).unwrap();
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

    /// A template without a system role (it raises an error on one) gets the system prompt in
    /// the first user turn, or not at all when no turn follows it.
    #[test]
    fn a_system_prompt_joins_the_first_turn_where_the_template_has_no_system_role() {
        let src = "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}";
        let t = ChatTemplate::new(src.into(), String::new(), String::new()).unwrap();
        let message = Message::text;
        let two = [message("system", "Be brief."), message("user", "Hi")];
        assert_eq!(t.render(&two, true).unwrap(), "[user] Be brief.\nHi\n");
        assert_eq!(t.render(&two[..1], true).unwrap(), "");
        let developer = [message("developer", "Be brief."), message("user", "Hi")];
        assert_eq!(
            t.render(&developer, true).unwrap(),
            "[user] Be brief.\nHi\n"
        );
    }

    /// OpenAI's `developer` role reaches a template as `system`.
    #[test]
    fn the_developer_role_is_the_system_role() {
        let src = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}";
        let t = ChatTemplate::new(src.into(), String::new(), String::new()).unwrap();
        let messages = ["developer", "user"].map(|role| Message::text(role, "x"));
        assert_eq!(t.render(&messages, true).unwrap(), "[system] x\n[user] x\n");
    }

    /// A request's template variables reach the template, and cannot replace its messages.
    #[test]
    fn request_variables_reach_the_template() {
        let src = "{% for m in messages %}{{ m['content'] }}{% endfor %}|{{ enable_thinking }}";
        let t = ChatTemplate::new(src.into(), String::new(), String::new()).unwrap();
        let vars = serde_json::json!({"enable_thinking": false, "messages": []});
        let options = RenderOptions {
            variables: Some(&vars),
            ..RenderOptions::default()
        };
        let out = t.render_with(&[Message::text("user", "hi")], &options, true);
        assert_eq!(out.unwrap(), "hi|False");
        // Thinking is on where the request does not say.
        let out = t.render(&[Message::text("user", "hi")], true);
        assert_eq!(out.unwrap(), "hi|True");
    }

    #[test]
    fn strftime_formats_dates_as_c_does() {
        // 26 July 2024, 13:05:09 UTC: a Friday, the 208th day of a leap year.
        let t = 1_721_999_109;
        assert_eq!(strftime("%d %b %Y", t).unwrap(), "26 Jul 2024");
        assert_eq!(strftime("%Y-%m-%d", t).unwrap(), "2024-07-26");
        assert_eq!(strftime("%B %d, %Y", t).unwrap(), "July 26, 2024");
        assert_eq!(
            strftime("%A %a %j %y %e %H:%M:%S %I%p %%", t).unwrap(),
            "Friday Fri 208 24 26 13:05:09 01PM %"
        );
        assert_eq!(strftime("%Y-%m-%d %A", 0).unwrap(), "1970-01-01 Thursday");
        // The last day of a leap year, and of a century that is not one.
        assert_eq!(
            strftime("%Y-%m-%d %j", 1_735_603_200).unwrap(),
            "2024-12-31 366"
        );
        assert_eq!(
            strftime("%Y-%m-%d %j", 4_107_456_000).unwrap(),
            "2100-02-28 059"
        );
        assert!(strftime("%Q", t).unwrap_err().contains("%Q"));
        let t = ChatTemplate::new(
            "{{ strftime_now('%Y') }}".into(),
            String::new(),
            String::new(),
        )
        .unwrap();
        assert!(t.render(&[], false).unwrap().parse::<u32>().unwrap() >= 2024);
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
