//! A reply's calls read as far as they are written, so that a stream can give out each call's
//! name as soon as it is whole and its arguments as they come (OpenAI's `tool_calls` deltas,
//! Anthropic's `input_json_delta`, the Responses API's `function_call_arguments.delta`).
//!
//! Reading a longer text never takes back what a shorter one gave: a call counts once its name
//! is whole and its arguments have begun (or its object has closed without them), its
//! arguments only grow, and where the calls end, once known, stays. A whole reply is read the
//! same way, so that a stream's pieces add up to the whole answer.
use super::{ToolCall, ToolFormat, HERMES_CLOSE, HERMES_OPEN, MISTRAL_ARGS, MISTRAL_CALLS};

/// The calls of a reply's text from where they begin.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Calls {
    /// Each call whose name is whole, its arguments as far as written: the JSON object with the
    /// white space between its tokens left out (a call that closed without arguments has `{}`,
    /// arguments written as a JSON string have its text once it is whole).
    pub calls: Vec<ToolCall>,
    /// The generic format's `response`, as far as its characters are whole.
    pub response: Option<String>,
    /// Where the calls' text ends and the reply's text goes on; `None` while it may still go on
    /// with calls.
    pub end: Option<usize>,
}

/// How a scan of a JSON piece ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scan {
    /// Whole, ending before this byte.
    Done(usize),
    /// The text ends inside it; what is written of it is sure up to this byte (not in an
    /// escape cut short, which may yet turn out malformed).
    Cut(usize),
    /// Not JSON at this byte.
    Bad(usize),
}

/// How reading the items (calls, separators) of the calls' text stopped.
enum Stop {
    /// The text at this byte is not calls: the calls end there (or, with none read, the text is
    /// not calls at all).
    At(usize),
    /// The text ends; an item still open began at this byte (at the text's end when a call's
    /// arguments were cut short).
    More(usize),
}

/// The calls in `region` (a reply's text from where `format`'s calls begin); `ended` when the
/// reply ends there. `None` when the text is not calls (nor, in the generic format, a
/// response): it is the reply's content.
pub(super) fn read(format: ToolFormat, region: &str, ended: bool) -> Option<Calls> {
    let mut out = Calls::default();
    let stop = match format {
        ToolFormat::Hermes => hermes(region, &mut out),
        ToolFormat::Llama3 => llama3(region, &mut out),
        ToolFormat::MistralJson => mistral_json(region, &mut out),
        ToolFormat::MistralArgs => mistral_args(region, &mut out),
        ToolFormat::Generic => generic(region, &mut out),
    };
    let something = !out.calls.is_empty() || out.response.is_some();
    out.end = match stop {
        Stop::At(at) => Some(at),
        Stop::More(at) if ended => Some(at),
        Stop::More(_) => None,
    };
    // Text known to hold neither calls nor a response is content.
    let settled = ended || matches!(stop, Stop::At(_));
    (something || !settled).then_some(out)
}

/// A call object as far as it is written.
#[derive(Default)]
struct CallObject {
    name: Option<String>,
    /// Where its arguments' value begins, where what is sure of it ends, and whether it has
    /// ended (whole, or broken there).
    arguments: Option<(usize, usize, bool)>,
    /// Whether the object has closed.
    closed: bool,
}

impl CallObject {
    /// Whether it counts as a call yet.
    fn counts(&self) -> bool {
        self.name.is_some() && (self.arguments.is_some() || self.closed)
    }

    fn call(&self, s: &str) -> ToolCall {
        let arguments = match self.arguments {
            None => "{}".to_owned(),
            Some((start, _, true)) if s.as_bytes()[start] == b'"' => string(s, start).1,
            Some((start, _, false)) if s.as_bytes()[start] == b'"' => String::new(),
            Some((start, end, _)) => without_white_space(&s[start..end]),
        };
        ToolCall {
            name: self.name.clone().unwrap_or_default(),
            arguments,
        }
    }
}

/// Reads the call object at `at` (a `{`), its arguments under the first of `argument_keys` it
/// writes, and how its scan ended: `Bad` at the byte where it stops being a call object (a
/// name that is not a string, arguments that are neither an object nor a string, malformed
/// JSON).
fn call_object(s: &str, at: usize, argument_keys: &[&str]) -> (CallObject, Scan) {
    let b = s.as_bytes();
    let mut call = CallObject::default();
    let mut i = at + 1;
    loop {
        i = white_space(b, i);
        match b.get(i) {
            None => return (call, Scan::Cut(s.len())),
            Some(b'}') => {
                call.closed = true;
                return (call, Scan::Done(i + 1));
            }
            Some(b'"') => {}
            Some(_) => return (call, Scan::Bad(i)),
        }
        let (key, after) = match string(s, i) {
            (Scan::Done(end), text) => (text, end),
            (scan, _) => return (call, scan),
        };
        i = white_space(b, after);
        match b.get(i) {
            None => return (call, Scan::Cut(s.len())),
            Some(b':') => i = white_space(b, i + 1),
            Some(_) => return (call, Scan::Bad(i)),
        }
        if i == b.len() {
            return (call, Scan::Cut(s.len()));
        }
        let value = if key == "name" && call.name.is_none() {
            if b[i] != b'"' {
                return (call, Scan::Bad(i));
            }
            let (scan, text) = string(s, i);
            if let Scan::Done(_) = scan {
                call.name = Some(text).filter(|n| !n.is_empty());
                if call.name.is_none() {
                    return (call, Scan::Bad(i));
                }
            }
            scan
        } else if argument_keys.contains(&key.as_str()) && call.arguments.is_none() {
            if !matches!(b[i], b'{' | b'"') {
                return (call, Scan::Bad(i));
            }
            // Arguments broken part way are what was written before the break.
            let scan = value(s, i);
            call.arguments = Some(match scan {
                Scan::Done(end) | Scan::Bad(end) => (i, end, true),
                Scan::Cut(sure) => (i, sure, false),
            });
            scan
        } else {
            value(s, i)
        };
        i = match value {
            Scan::Done(end) => white_space(b, end),
            other => return (call, other),
        };
        match b.get(i) {
            None => return (call, Scan::Cut(s.len())),
            Some(b',') => i += 1,
            Some(b'}') => {}
            Some(_) => return (call, Scan::Bad(i)),
        }
    }
}

/// Reads the call object at `at` into `out`: `Ok` with where it ends, or how reading stops
/// (`item` is where the call's item began: a text that is not a call ends the calls there).
fn take_call(
    s: &str,
    at: usize,
    item: usize,
    argument_keys: &[&str],
    out: &mut Calls,
) -> Result<usize, Stop> {
    let (call, scan) = call_object(s, at, argument_keys);
    if call.counts() {
        out.calls.push(call.call(s));
    }
    match scan {
        Scan::Done(end) if call.counts() => Ok(end),
        // A call's object cut short, or broken after it counts: the calls end with it.
        Scan::Cut(_) if call.counts() => Err(Stop::More(s.len())),
        Scan::Bad(at) if call.counts() => Err(Stop::At(at)),
        Scan::Cut(_) => Err(Stop::More(item)),
        Scan::Done(_) | Scan::Bad(_) => Err(Stop::At(item)),
    }
}

/// `<tool_call>` blocks, each a call object (a missing closing tag is forgiven).
fn hermes(s: &str, out: &mut Calls) -> Stop {
    let b = s.as_bytes();
    let mut at = 0;
    loop {
        let item = white_space(b, at);
        let open = match literal(s, item, HERMES_OPEN) {
            Scan::Done(end) => white_space(b, end),
            Scan::Cut(_) => return Stop::More(at),
            Scan::Bad(_) => return Stop::At(at),
        };
        match b.get(open) {
            None => return Stop::More(item),
            Some(b'{') => {}
            Some(_) => return Stop::At(item),
        }
        let end = match take_call(s, open, item, &["arguments", "parameters"], out) {
            Ok(end) => end,
            Err(stop) => return stop,
        };
        let after = white_space(b, end);
        at = match literal(s, after, HERMES_CLOSE) {
            Scan::Done(close) => close,
            Scan::Cut(_) => return Stop::More(after),
            Scan::Bad(_) => end,
        };
    }
}

/// Call objects, separated by `;` or white space, after `<|python_tag|>` or from the start.
fn llama3(s: &str, out: &mut Calls) -> Stop {
    let b = s.as_bytes();
    let mut at = match literal(s, 0, super::PYTHON_TAG) {
        Scan::Done(end) => end,
        Scan::Cut(_) => return Stop::More(0),
        Scan::Bad(_) => 0,
    };
    loop {
        // Text after the calls begins after their separators.
        let mut text_at = at;
        let mut item = white_space(b, at);
        while b.get(item) == Some(&b';') {
            text_at = item + 1;
            item = white_space(b, text_at);
        }
        match b.get(item) {
            None => return Stop::More(text_at),
            Some(b'{') => {}
            Some(_) => return Stop::At(text_at),
        }
        at = match take_call(s, item, item, &["parameters", "arguments"], out) {
            Ok(end) => end,
            Err(stop) => return stop,
        };
    }
}

/// `[TOOL_CALLS]` and a JSON array of call objects (its closing bracket may never come).
fn mistral_json(s: &str, out: &mut Calls) -> Stop {
    let b = s.as_bytes();
    let list = match literal(s, 0, MISTRAL_CALLS) {
        Scan::Done(end) => white_space(b, end),
        Scan::Cut(_) => return Stop::More(0),
        Scan::Bad(_) => return Stop::At(0),
    };
    match b.get(list) {
        None => return Stop::More(0),
        Some(b'[') => {}
        Some(_) => return Stop::At(0),
    }
    let mut at = list + 1;
    loop {
        let item = white_space(b, at);
        match b.get(item) {
            None => return Stop::More(item),
            Some(b']') => return Stop::At(item + 1),
            Some(b'{') => {}
            Some(_) => return Stop::At(item),
        }
        let end = match take_call(s, item, item, &["arguments"], out) {
            Ok(end) => white_space(b, end),
            Err(stop) => return stop,
        };
        at = match b.get(end) {
            None => return Stop::More(end),
            Some(b',') => end + 1,
            Some(b']') => return Stop::At(end + 1),
            Some(_) => return Stop::At(end),
        };
    }
}

/// `[TOOL_CALLS]name[ARGS]{...}`, repeated.
fn mistral_args(s: &str, out: &mut Calls) -> Stop {
    let b = s.as_bytes();
    let mut at = 0;
    loop {
        let item = white_space(b, at);
        let name_at = match literal(s, item, MISTRAL_CALLS) {
            Scan::Done(end) => end,
            Scan::Cut(_) => return Stop::More(at),
            Scan::Bad(_) => return Stop::At(at),
        };
        let Some(args) = s[name_at..].find(MISTRAL_ARGS).map(|k| name_at + k) else {
            return Stop::More(item);
        };
        let name = s[name_at..args].trim();
        let object = white_space(b, args + MISTRAL_ARGS.len());
        match b.get(object) {
            _ if name.is_empty() => return Stop::At(item),
            None => return Stop::More(item),
            Some(b'{') => {}
            Some(_) => return Stop::At(item),
        }
        let scan = value(s, object);
        let (Scan::Done(end) | Scan::Bad(end) | Scan::Cut(end)) = scan;
        out.calls.push(ToolCall {
            name: name.to_owned(),
            arguments: without_white_space(&s[object..end]),
        });
        at = match scan {
            Scan::Done(end) => end,
            Scan::Cut(_) => return Stop::More(s.len()),
            Scan::Bad(bad) => return Stop::At(bad),
        };
    }
}

/// The generic format's object: `{"tool_call": {...}}`, `{"tool_calls": [...]}` or
/// `{"response": "..."}`.
fn generic(s: &str, out: &mut Calls) -> Stop {
    let b = s.as_bytes();
    let keys = ["arguments", "parameters"];
    // Where the calls' text would end if the object were broken here.
    let broken = |out: &Calls, at: usize| Stop::At(if out.response.is_some() { at } else { 0 });
    let start = white_space(b, 0);
    if b.get(start) != Some(&b'{') {
        return Stop::At(0);
    }
    let mut i = start + 1;
    loop {
        i = white_space(b, i);
        match b.get(i) {
            None => return Stop::More(0),
            Some(b'}') => return Stop::At(i + 1),
            Some(b'"') => {}
            Some(_) => return broken(out, i),
        }
        let (key, after) = match string(s, i) {
            (Scan::Done(end), text) => (text, end),
            (Scan::Cut(_), _) => return Stop::More(0),
            (Scan::Bad(_), _) => return broken(out, i),
        };
        i = white_space(b, after);
        match b.get(i) {
            None => return Stop::More(0),
            Some(b':') => i = white_space(b, i + 1),
            Some(_) => return broken(out, i),
        }
        let Some(&first) = b.get(i) else {
            return Stop::More(0);
        };
        let scan = match (key.as_str(), first) {
            ("tool_call", b'{') => match take_call(s, i, 0, &keys, out) {
                Ok(end) => Scan::Done(end),
                Err(stop) => return stop,
            },
            ("tool_calls", b'[') => match generic_list(s, i + 1, out) {
                Ok(end) => Scan::Done(end),
                Err(stop) => return stop,
            },
            // A response broken part way is what was written before the break.
            ("response", b'"') if out.response.is_none() => {
                let (scan, text) = string(s, i);
                out.response = Some(text);
                scan
            }
            ("tool_call" | "tool_calls", _) => return broken(out, i),
            _ => value(s, i),
        };
        i = match scan {
            Scan::Done(end) => white_space(b, end),
            Scan::Cut(_) if out.response.is_some() || !out.calls.is_empty() => {
                return Stop::More(s.len())
            }
            Scan::Cut(_) => return Stop::More(0),
            Scan::Bad(at) => return broken(out, at),
        };
        match b.get(i) {
            None => return Stop::More(0),
            Some(b',') => i += 1,
            Some(b'}') => {}
            Some(_) => return broken(out, i),
        }
    }
}

/// The call objects of the generic format's `tool_calls` list, from after its `[`: where the
/// list ends.
fn generic_list(s: &str, mut at: usize, out: &mut Calls) -> Result<usize, Stop> {
    let b = s.as_bytes();
    loop {
        let item = white_space(b, at);
        match b.get(item) {
            None => return Err(Stop::More(0)),
            Some(b']') => return Ok(item + 1),
            Some(b'{') => {}
            Some(_) => return Err(Stop::At(0)),
        }
        let end = white_space(b, take_call(s, item, 0, &["arguments", "parameters"], out)?);
        at = match b.get(end) {
            None => return Err(Stop::More(s.len())),
            Some(b',') => end + 1,
            Some(b']') => return Ok(end + 1),
            Some(_) => return Err(Stop::At(end)),
        };
    }
}

/// Past JSON's white space from `at`.
fn white_space(b: &[u8], mut at: usize) -> usize {
    while matches!(b.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// Whether `lit` is at `at`: whole, cut short by the text's end, or not there.
fn literal(s: &str, at: usize, lit: &str) -> Scan {
    let rest = &s.as_bytes()[at.min(s.len())..];
    if rest.starts_with(lit.as_bytes()) {
        Scan::Done(at + lit.len())
    } else if lit.as_bytes().starts_with(rest) {
        Scan::Cut(at)
    } else {
        Scan::Bad(at)
    }
}

/// The JSON value at `at` (not white space): strings, objects and arrays by their brackets,
/// other values as the run of characters they are written in.
fn value(s: &str, at: usize) -> Scan {
    let b = s.as_bytes();
    let mut open: Vec<u8> = Vec::new();
    let mut i = at;
    loop {
        let Some(&c) = b.get(i) else {
            return Scan::Cut(i);
        };
        match c {
            b'"' => match string(s, i).0 {
                Scan::Done(end) => i = end,
                other => return other,
            },
            b'{' | b'[' => {
                open.push(c);
                i += 1;
            }
            b'}' | b']' => {
                let expected = if c == b'}' { b'{' } else { b'[' };
                if open.pop() != Some(expected) {
                    return Scan::Bad(i);
                }
                i += 1;
            }
            _ if open.is_empty() => {
                let scalar = b[i..]
                    .iter()
                    .take_while(|c| c.is_ascii_alphanumeric() || b"+-.".contains(c))
                    .count();
                return match (scalar, i + scalar) {
                    (0, _) => Scan::Bad(i),
                    (_, end) if end == b.len() => Scan::Cut(end),
                    (_, end) => Scan::Done(end),
                };
            }
            _ => i += 1,
        }
        if open.is_empty() {
            return Scan::Done(i);
        }
    }
}

/// The JSON string at `at` (its `"`), and its text as far as its characters are whole.
fn string(s: &str, at: usize) -> (Scan, String) {
    let (text, end) = string_text(&s[at + 1..]);
    let scan = match end {
        StringEnd::Closed(len) => Scan::Done(at + 1 + len + 1),
        StringEnd::Cut(len) => Scan::Cut(at + 1 + len),
        StringEnd::Bad(len) => Scan::Bad(at + 1 + len),
    };
    (scan, text)
}

/// How a string's contents end.
enum StringEnd {
    /// At its closing quote, after this many bytes.
    Closed(usize),
    /// Cut short, its characters whole for this many bytes.
    Cut(usize),
    /// Not JSON after this many bytes: a control character, an unknown escape, a lone
    /// surrogate.
    Bad(usize),
}

/// The text of a JSON string's contents `raw` (from after its opening quote) as far as its
/// characters are whole (an escape cut short waits for the rest), and how the string ends.
fn string_text(raw: &str) -> (String, StringEnd) {
    let b = raw.as_bytes();
    let mut text = String::new();
    let mut i = 0;
    let hex = |at: usize| -> Option<u32> {
        let digits = raw.get(at..at + 4)?;
        digits
            .bytes()
            .all(|d| d.is_ascii_hexdigit())
            .then(|| u32::from_str_radix(digits, 16).ok())?
    };
    loop {
        let Some(&c) = b.get(i) else {
            return (text, StringEnd::Cut(i));
        };
        match c {
            b'"' => return (text, StringEnd::Closed(i)),
            0..=0x1f => return (text, StringEnd::Bad(i)),
            b'\\' => {}
            _ => {
                let ch = raw[i..].chars().next().unwrap_or_default();
                text.push(ch);
                i += ch.len_utf8();
                continue;
            }
        }
        let Some(&e) = b.get(i + 1) else {
            return (text, StringEnd::Cut(i));
        };
        let simple = match e {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                // The escape (`n` bytes with a low surrogate's after a high one's) cut short by
                // the text's end, what is written of it possibly right.
                let cut_short = |n: usize| {
                    let mut written = raw[i + 2..].bytes();
                    raw.len() < i + n
                        && written.all(|d| d.is_ascii_hexdigit() || b"\\u".contains(&d))
                };
                let Some(unit) = hex(i + 2) else {
                    let end = match cut_short(6) {
                        true => StringEnd::Cut(i),
                        false => StringEnd::Bad(i),
                    };
                    return (text, end);
                };
                let (code, len) = match unit {
                    0xd800..=0xdbff => {
                        let low = (raw.get(i + 6..i + 8) == Some("\\u"))
                            .then(|| hex(i + 8))
                            .flatten();
                        match low {
                            Some(low @ 0xdc00..=0xdfff) => {
                                (0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00), 12)
                            }
                            _ if cut_short(12) => return (text, StringEnd::Cut(i)),
                            _ => return (text, StringEnd::Bad(i)),
                        }
                    }
                    0xdc00..=0xdfff => return (text, StringEnd::Bad(i)),
                    _ => (unit, 6),
                };
                text.push(char::from_u32(code).unwrap_or_default());
                i += len;
                continue;
            }
            _ => return (text, StringEnd::Bad(i)),
        };
        text.push(simple);
        i += 2;
    }
}

/// JSON text with the white space between its tokens left out (strings kept as written).
fn without_white_space(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in json.chars() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
        } else if matches!(c, ' ' | '\t' | '\n' | '\r') {
            continue;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_read_as_far_as_their_characters_are_whole() {
        let (text, end) = string_text(r#"a\"b\\c\/\n\u00e9\ud83d\ude00" rest"#);
        assert_eq!(text, "a\"b\\c/\n\u{e9}\u{1f600}");
        assert!(matches!(end, StringEnd::Closed(29)));
        // Cut inside an escape: the text stops before it, and so does what is sure.
        for raw in [
            r"ab\",
            r"ab\u0",
            r"ab\ud83d",
            r"ab\ud83d\u",
            r"ab\ud83d\ude0",
        ] {
            let (text, end) = string_text(raw);
            assert_eq!(text, "ab", "{raw}");
            assert!(matches!(end, StringEnd::Cut(2)), "{raw}");
        }
        for raw in [r"ab\x", r"ab\u00g0", r"ab\ude00", r"ab\ud83dx", "ab\ncd"] {
            let (text, end) = string_text(raw);
            assert_eq!(text, "ab", "{raw:?}");
            assert!(matches!(end, StringEnd::Bad(2)), "{raw:?}");
        }
    }

    #[test]
    fn values_end_at_their_brackets() {
        let s = r#"{"a": "}]", "b": [1, {"c": null}]} tail"#;
        assert_eq!(value(s, 0), Scan::Done(s.len() - 5));
        assert_eq!(value("{\"a\": [1, 2", 0), Scan::Cut(11));
        assert_eq!(value("{\"a\": \"x\\u12", 0), Scan::Cut(8));
        assert_eq!(value("{\"a\": [1}", 0), Scan::Bad(8));
        assert_eq!(value("12", 0), Scan::Cut(2));
        assert_eq!(value("12,", 0), Scan::Done(2));
        assert_eq!(
            without_white_space("{ \"a b\" :\n [1, \"\\\" x\"] }"),
            r#"{"a b":[1,"\" x"]}"#
        );
    }

    /// Each format's calls: counted once named with arguments begun, cut short as written.
    #[test]
    fn calls_count_once_named_with_arguments_begun() {
        let named = read(ToolFormat::Hermes, r#"<tool_call>{"name": "a", "#, false).unwrap();
        assert!(named.calls.is_empty());
        assert_eq!(named.end, None);
        let begun = read(
            ToolFormat::Hermes,
            r#"<tool_call>{"name": "a", "arguments": {"x"#,
            false,
        );
        let begun = begun.unwrap();
        assert_eq!(begun.calls[0].arguments, r#"{"x"#);
        let list = read(
            ToolFormat::MistralJson,
            r#"[TOOL_CALLS][{"name": "a", "arguments": {}}] ok"#,
            false,
        );
        assert_eq!(list.unwrap().end, Some(44));
        assert_eq!(
            read(ToolFormat::MistralJson, "[TOOL_CALLS] no", false),
            None
        );
        // Not yet known to be calls: a reply that ends there is none.
        assert!(read(ToolFormat::Llama3, r#"{"na"#, false).is_some());
        assert_eq!(read(ToolFormat::Llama3, r#"{"na"#, true), None);
    }
}
