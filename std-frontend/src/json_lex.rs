//! The lexical pieces both JSON automata (`json_output`'s any object, `json_schema`'s values of
//! a schema) read byte by byte: strings with their escapes and UTF-8, numbers, and the three
//! literals.

/// What a byte did to the piece being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<T> {
    /// The piece goes on, in this state.
    Continue(T),
    /// The piece is whole. For a string the byte was its closing quote; for a number the byte
    /// is not part of it and follows it.
    End,
    /// The byte cannot come here.
    Invalid,
}

/// Inside a string, after its opening quote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Str {
    escape: Escape,
    /// Continuation bytes the current UTF-8 character still needs.
    utf8_left: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Escape {
    #[default]
    None,
    /// After `\`.
    Backslash,
    /// After `\u` and this many hex digits.
    Hex(u8),
}

impl Str {
    #[inline]
    pub fn next(self, b: u8) -> Step<Str> {
        let go = |escape, utf8_left| Step::Continue(Str { escape, utf8_left });
        match self.escape {
            Escape::Backslash => match b {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => go(Escape::None, 0),
                b'u' => go(Escape::Hex(0), 0),
                _ => Step::Invalid,
            },
            Escape::Hex(n) if b.is_ascii_hexdigit() => go(
                if n == 3 {
                    Escape::None
                } else {
                    Escape::Hex(n + 1)
                },
                0,
            ),
            Escape::Hex(_) => Step::Invalid,
            Escape::None if self.utf8_left > 0 => match b {
                0x80..=0xbf => go(Escape::None, self.utf8_left - 1),
                _ => Step::Invalid,
            },
            Escape::None => match b {
                b'"' => Step::End,
                b'\\' => go(Escape::Backslash, 0),
                0x00..=0x1f | 0x7f..=0xc1 | 0xf5..=0xff => Step::Invalid,
                0xc2..=0xdf => go(Escape::None, 1),
                0xe0..=0xef => go(Escape::None, 2),
                0xf0..=0xf4 => go(Escape::None, 3),
                _ => go(Escape::None, 0),
            },
        }
    }
}

/// Digits a number's integer part, fraction or exponent may have, as llama.cpp's JSON grammars
/// allow: more say nothing a model means, and an unbounded run of digits is a loop a sampled
/// model can fall into until `max_tokens` (a 400-digit population was seen).
pub const MAX_DIGITS: u8 = 16;

/// The part of a number read so far; the digit parts with their digits so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Number {
    Minus,
    Zero,
    Int(u8),
    Dot,
    Fraction(u8),
    E,
    ExponentSign,
    Exponent(u8),
}

impl Number {
    /// The number a value starting with `b` begins, if it does.
    pub fn start(b: u8) -> Option<Number> {
        match b {
            b'-' => Some(Number::Minus),
            b'0' => Some(Number::Zero),
            b'1'..=b'9' => Some(Number::Int(1)),
            _ => None,
        }
    }

    /// Whether the number may end here.
    pub fn is_whole(self) -> bool {
        matches!(
            self,
            Number::Zero | Number::Int(_) | Number::Fraction(_) | Number::Exponent(_)
        )
    }

    /// The next byte; an `integer` has no fraction or exponent.
    #[inline]
    pub fn next(self, b: u8, integer: bool) -> Step<Number> {
        let more = |n: u8| (n < MAX_DIGITS).then_some(n + 1);
        let next = match (self, b) {
            (Number::Minus, b'0') => Some(Number::Zero),
            (Number::Minus, b'1'..=b'9') => Some(Number::Int(1)),
            (Number::Int(n), b'0'..=b'9') => more(n).map(Number::Int),
            (Number::Zero | Number::Int(_), b'.') if !integer => Some(Number::Dot),
            (Number::Dot, b'0'..=b'9') => Some(Number::Fraction(1)),
            (Number::Fraction(n), b'0'..=b'9') => more(n).map(Number::Fraction),
            (Number::Zero | Number::Int(_) | Number::Fraction(_), b'e' | b'E') if !integer => {
                Some(Number::E)
            }
            (Number::E, b'+' | b'-') => Some(Number::ExponentSign),
            (Number::E | Number::ExponentSign, b'0'..=b'9') => Some(Number::Exponent(1)),
            (Number::Exponent(n), b'0'..=b'9') => more(n).map(Number::Exponent),
            // A whole number ends at the first byte that cannot continue it.
            (n, _) if n.is_whole() => return Step::End,
            _ => return Step::Invalid,
        };
        match next {
            Some(next) => Step::Continue(next),
            // One digit too many cannot follow.
            None => Step::Invalid,
        }
    }
}

/// Inside `true`, `false` or `null`: which, and how many of its bytes are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Word {
    word: u8,
    len: u8,
}

const WORDS: [&[u8]; 3] = [b"true", b"false", b"null"];

impl Word {
    /// The literal a value starting with `b` begins (`true`/`false` only where `boolean`,
    /// `null` only where `null`).
    pub fn start(b: u8, boolean: bool, null: bool) -> Option<Word> {
        let word = match b {
            b't' | b'f' if boolean => usize::from(b == b'f'),
            b'n' if null => 2,
            _ => return None,
        };
        Some(Word {
            word: word as u8,
            len: 1,
        })
    }

    /// The next byte: `End` when it completes the literal.
    #[inline]
    pub fn next(self, b: u8) -> Step<Word> {
        let w = WORDS[self.word as usize];
        if w[self.len as usize] != b {
            return Step::Invalid;
        }
        if self.len as usize + 1 == w.len() {
            return Step::End;
        }
        Step::Continue(Word {
            len: self.len + 1,
            ..self
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How `text` reads as one number followed by a space: whole, or the byte where it was
    /// refused or ended early.
    fn read(text: &str, integer: bool) -> Result<(), usize> {
        let bytes = text.as_bytes();
        let mut n = Number::start(bytes[0]).ok_or(0usize)?;
        for (i, &b) in bytes
            .iter()
            .enumerate()
            .skip(1)
            .chain([(bytes.len(), &b' ')])
        {
            match n.next(b, integer) {
                Step::Continue(next) => n = next,
                Step::End if i == bytes.len() => return Ok(()),
                Step::End | Step::Invalid => return Err(i),
            }
        }
        Err(bytes.len())
    }

    #[test]
    fn numbers_have_at_most_sixteen_digits_a_part() {
        let sixteen = "1234567890123456";
        for ok in [
            "0",
            "-0",
            "7",
            sixteen,
            &format!("-{sixteen}"),
            &format!("0.{sixteen}"),
            &format!("{sixteen}.{sixteen}e-{sixteen}"),
            "1E+5",
        ] {
            assert_eq!(read(ok, false), Ok(()), "{ok}");
        }
        for (bad, at) in [
            (format!("{sixteen}7"), 16),
            (format!("-{sixteen}7"), 17),
            (format!("1.{sixteen}7"), 18),
            (format!("1e{sixteen}7"), 18),
            ("01".to_owned(), 1),
            ("1.".to_owned(), 2),
            ("1e+".to_owned(), 3),
        ] {
            assert_eq!(read(&bad, false), Err(at), "{bad}");
        }
        assert_eq!(read("1.5", true), Err(1), "an integer ends before its dot");
    }
}
