//! Output constrained to a GBNF grammar (llama.cpp's `--grammar`, llama-server's `grammar`
//! field): the grammar's rules parsed as llama.cpp parses them (string literals, character
//! classes with ranges and `^`, `.`, rule references, groups, `*`, `+`, `?` and `{m,n}`,
//! comments), the output matched against `root` code point by code point.
//!
//! The matcher is llama.cpp's: a set of stacks of positions in the grammar, each a way the text
//! so far can continue, the top the character element that comes next and below it what
//! follows each enclosing rule. A code point keeps the stacks whose top matches it, each moved
//! past it and expanded until its top is a character again (or it is empty: the text may end).
//! Stacks are bounded in number and depth, so that no grammar makes a step run away; token
//! references (`<[id]>`, `<think>`) are refused, as the matcher sees the output's bytes.
use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use anyhow::{bail, Result};

use crate::constraint::Automaton;

/// Elements of a compiled grammar: bounds the work of compiling a hostile one.
const MAX_ELEMENTS: usize = 100_000;
/// Ways the text can continue at once; a step that would need more is refused. llama.cpp's
/// grammars need at most 12 on their sample texts; the bound keeps a hostile grammar's mask (a
/// step for each byte of the vocabulary's tokens, each over every way) from stalling the
/// engine.
const MAX_STACKS: usize = 64;
/// Groups open at once in the grammar's text (the parser recurses into each).
const MAX_NESTING: usize = 64;
/// Rules open at once in one way.
const MAX_DEPTH: usize = 512;
/// Stacks one expansion may visit.
const MAX_EXPANSIONS: usize = 16_384;

/// One element of an alternative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Element {
    /// The end of an alternative.
    End,
    /// A code point in (or, `negated`, outside) the ranges `ranges[from..from + len]`.
    Chars { from: u32, len: u32, negated: bool },
    /// Any code point.
    Any,
    /// Rule `0`'s text.
    Rule(u32),
}

/// A compiled grammar.
#[derive(Debug)]
pub struct Grammar {
    /// Every alternative of every rule, each a run of elements ended by `End`.
    elements: Vec<Element>,
    /// Each rule's alternatives: the position of each one's first element.
    rules: Vec<Vec<u32>>,
    /// The code point ranges of `Chars` elements, inclusive.
    ranges: Vec<(u32, u32)>,
    root: u32,
    /// Each rule reference's expansion, made when first needed (`None`: past the bounds).
    expansions: Vec<OnceLock<Option<Expansion>>>,
}

/// What a rule reference on top of a stack stands for, whatever is below it: the ways of
/// stacking characters in its place (each bottom first: what follows the reference, then the
/// rule's inside), and whether the rule and what follows it in its alternative can be empty
/// (then the stack below continues too).
#[derive(Debug)]
struct Expansion {
    segments: Vec<Vec<u32>>,
    nullable: bool,
}

/// A parsed rule: its alternatives, each a sequence of elements (without `End`).
type Alternatives = Vec<Vec<Element>>;

struct Parser {
    src: Vec<char>,
    pos: usize,
    ids: HashMap<String, u32>,
    names: Vec<String>,
    rules: Vec<Option<Alternatives>>,
    ranges: Vec<(u32, u32)>,
    elements: usize,
    /// Groups open here.
    nesting: usize,
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.src.get(self.pos).copied()
    }

    fn peek_at(&self, ahead: usize) -> Option<char> {
        self.src.get(self.pos + ahead).copied()
    }

    /// Where `pos` is, for an error: its line and column, from 1.
    fn at(&self) -> String {
        let before = &self.src[..self.pos.min(self.src.len())];
        let line = before.iter().filter(|&&c| c == '\n').count() + 1;
        let column = before.iter().rev().take_while(|&&c| c != '\n').count() + 1;
        format!("line {line}, column {column}")
    }

    /// Skips spaces, tabs and comments, and line ends where `newlines` allows them.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.pos += 1,
                '\r' | '\n' if newlines => self.pos += 1,
                '#' => {
                    while self.peek().is_some_and(|c| c != '\r' && c != '\n') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Result<String> {
        let start = self.pos;
        while self.peek().is_some_and(is_word_char) {
            self.pos += 1;
        }
        if self.pos == start {
            bail!("grammar: expected a rule name at {}", self.at());
        }
        Ok(self.src[start..self.pos].iter().collect())
    }

    /// The id of the rule called `name`, defined yet or not.
    fn symbol(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.rules.len() as u32;
        self.ids.insert(name.to_owned(), id);
        self.names.push(name.to_owned());
        self.rules.push(None);
        id
    }

    /// A new rule for a group or a repetition inside rule `parent`.
    fn generated(&mut self, parent: &str) -> u32 {
        let id = self.rules.len() as u32;
        self.names.push(format!("{parent}_{id}"));
        self.rules.push(None);
        id
    }

    fn define(&mut self, id: u32, alternatives: Alternatives) -> Result<()> {
        self.elements += alternatives.iter().map(|a| a.len() + 1).sum::<usize>();
        if self.elements > MAX_ELEMENTS {
            bail!(
                "grammar: more than {MAX_ELEMENTS} elements once its repetitions are written out"
            );
        }
        self.rules[id as usize] = Some(alternatives);
        Ok(())
    }

    fn hex(&mut self, digits: usize) -> Result<u32> {
        let mut value = 0u32;
        for _ in 0..digits {
            let d = self.peek().and_then(|c| c.to_digit(16));
            let Some(d) = d else {
                bail!("grammar: expected {digits} hex digits at {}", self.at());
            };
            value = value << 4 | d;
            self.pos += 1;
        }
        Ok(value)
    }

    /// One character of a string or class: itself, or an escape.
    fn char(&mut self) -> Result<u32> {
        let Some(c) = self.peek() else {
            bail!("grammar: unexpected end of input at {}", self.at());
        };
        self.pos += 1;
        if c != '\\' {
            return Ok(c as u32);
        }
        let Some(e) = self.peek() else {
            bail!("grammar: unexpected end of input at {}", self.at());
        };
        self.pos += 1;
        Ok(match e {
            'x' => self.hex(2)?,
            'u' => self.hex(4)?,
            'U' => self.hex(8)?,
            't' => '\t' as u32,
            'r' => '\r' as u32,
            'n' => '\n' as u32,
            '\\' | '"' | '[' | ']' | '-' => e as u32,
            _ => {
                self.pos -= 2;
                bail!("grammar: unknown escape \\{e} at {}", self.at())
            }
        })
    }

    fn alternatives(&mut self, rule: &str, nested: bool) -> Result<Alternatives> {
        let mut alternatives = vec![self.sequence(rule, nested)?];
        while self.peek() == Some('|') {
            self.pos += 1;
            self.space(true);
            alternatives.push(self.sequence(rule, nested)?);
        }
        Ok(alternatives)
    }

    fn sequence(&mut self, rule: &str, nested: bool) -> Result<Vec<Element>> {
        let mut sequence = Vec::new();
        // Where the last item (what a repetition repeats) starts.
        let mut last = None;
        while let Some(c) = self.peek() {
            match c {
                '"' => {
                    self.pos += 1;
                    last = Some(sequence.len());
                    while self.peek() != Some('"') {
                        if self.peek().is_none() {
                            bail!("grammar: a string is not closed ({})", self.at());
                        }
                        let c = self.char()?;
                        sequence.push(self.class(&[(c, c)], false));
                    }
                    self.pos += 1;
                }
                '[' => {
                    self.pos += 1;
                    let negated = self.peek() == Some('^');
                    if negated {
                        self.pos += 1;
                    }
                    let mut ranges = Vec::new();
                    while self.peek() != Some(']') {
                        if self.peek().is_none() {
                            bail!("grammar: a character class is not closed ({})", self.at());
                        }
                        let low = self.char()?;
                        let high = match (self.peek(), self.peek_at(1)) {
                            (Some('-'), Some(next)) if next != ']' => {
                                self.pos += 1;
                                self.char()?
                            }
                            _ => low,
                        };
                        if high < low {
                            bail!("grammar: the range ends before it starts ({})", self.at());
                        }
                        ranges.push((low, high));
                    }
                    self.pos += 1;
                    last = Some(sequence.len());
                    sequence.push(self.class(&ranges, negated));
                }
                '.' => {
                    self.pos += 1;
                    last = Some(sequence.len());
                    sequence.push(Element::Any);
                }
                '(' => {
                    if self.nesting == MAX_NESTING {
                        bail!(
                            "grammar: groups nested more than {MAX_NESTING} deep at {}",
                            self.at()
                        );
                    }
                    self.pos += 1;
                    self.space(true);
                    let group = self.generated(rule);
                    self.nesting += 1;
                    let alternatives = self.alternatives(rule, true)?;
                    self.nesting -= 1;
                    self.define(group, alternatives)?;
                    if self.peek() != Some(')') {
                        bail!("grammar: expected ')' at {}", self.at());
                    }
                    self.pos += 1;
                    last = Some(sequence.len());
                    sequence.push(Element::Rule(group));
                }
                '*' | '+' | '?' => {
                    self.pos += 1;
                    let (min, max) = match c {
                        '*' => (0, None),
                        '+' => (1, None),
                        _ => (0, Some(1)),
                    };
                    last = Some(self.repeat(rule, &mut sequence, last, min, max)?);
                }
                '{' => {
                    self.pos += 1;
                    let (min, max) = self.bounds()?;
                    last = Some(self.repeat(rule, &mut sequence, last, min, max)?);
                }
                '<' | '!' => bail!(
                    "grammar: token references ({c}...) are not supported: sapient matches the \
                     output's text ({})",
                    self.at()
                ),
                c if is_word_char(c) => {
                    let name = self.name()?;
                    last = Some(sequence.len());
                    let id = self.symbol(&name);
                    sequence.push(Element::Rule(id));
                }
                _ => break,
            }
            self.space(nested);
        }
        Ok(sequence)
    }

    fn class(&mut self, ranges: &[(u32, u32)], negated: bool) -> Element {
        let from = self.ranges.len() as u32;
        self.ranges.extend_from_slice(ranges);
        Element::Chars {
            from,
            len: ranges.len() as u32,
            negated,
        }
    }

    fn number(&mut self) -> Result<u32> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let digits: String = self.src[start..self.pos].iter().collect();
        match digits.parse::<u32>() {
            Ok(n) if n <= MAX_ELEMENTS as u32 => Ok(n),
            _ => bail!("grammar: expected a repetition count at {}", self.at()),
        }
    }

    /// `{m}`, `{m,}` or `{m,n}`, after the `{`.
    fn bounds(&mut self) -> Result<(u32, Option<u32>)> {
        self.space(false);
        let min = self.number()?;
        self.space(false);
        let max = match self.peek() {
            Some(',') => {
                self.pos += 1;
                self.space(false);
                if self.peek() == Some('}') {
                    None
                } else {
                    Some(self.number()?)
                }
            }
            _ => Some(min),
        };
        self.space(false);
        if self.peek() != Some('}') {
            bail!("grammar: expected '}}' at {}", self.at());
        }
        self.pos += 1;
        if max.is_some_and(|max| max < min) {
            bail!(
                "grammar: a repetition's maximum is below its minimum ({})",
                self.at()
            );
        }
        Ok((min, max))
    }

    /// Replaces the last item of `sequence` (from `last`) by `min` to `max` (or more, `None`)
    /// of it; returns where the repeated item now starts.
    fn repeat(
        &mut self,
        rule: &str,
        sequence: &mut Vec<Element>,
        last: Option<usize>,
        min: u32,
        max: Option<u32>,
    ) -> Result<usize> {
        let Some(start) = last.filter(|&s| s < sequence.len()) else {
            bail!(
                "grammar: a repetition with nothing before it at {}",
                self.at()
            );
        };
        let item = sequence.split_off(start);
        // A string of several characters repeats as a whole: one rule of it.
        let one = match item[..] {
            [one] => one,
            _ => {
                let id = self.generated(rule);
                self.define(id, vec![item])?;
                Element::Rule(id)
            }
        };
        let copies = min as usize + max.map_or(1, |max| (max - min) as usize);
        if self.elements + copies * 3 > MAX_ELEMENTS {
            bail!(
                "grammar: more than {MAX_ELEMENTS} elements once its repetitions are written out"
            );
        }
        sequence.extend(std::iter::repeat_n(one, min as usize));
        match max {
            // item* ::= item item* | (nothing)
            None => {
                let id = self.generated(rule);
                self.define(id, vec![vec![one, Element::Rule(id)], Vec::new()])?;
                sequence.push(Element::Rule(id));
            }
            // (item (item (item)?)?)?, as deep as the optional copies.
            Some(max) => {
                let mut inner: Option<u32> = None;
                for _ in min..max {
                    let id = self.generated(rule);
                    let mut first = vec![one];
                    first.extend(inner.map(Element::Rule));
                    self.define(id, vec![first, Vec::new()])?;
                    inner = Some(id);
                }
                sequence.extend(inner.map(Element::Rule));
            }
        }
        Ok(start)
    }

    fn grammar(mut self) -> Result<Grammar> {
        self.space(true);
        while self.peek().is_some() {
            let name = self.name()?;
            self.space(false);
            if self.src.get(self.pos..self.pos + 3) != Some(&[':', ':', '=']) {
                bail!("grammar: expected ::= after {name} at {}", self.at());
            }
            self.pos += 3;
            self.space(true);
            let id = self.symbol(&name);
            if self.rules[id as usize].is_some() {
                bail!("grammar: rule {name} is defined twice");
            }
            let alternatives = self.alternatives(&name, false)?;
            self.define(id, alternatives)?;
            match self.peek() {
                None | Some('\n') => self.pos += 1,
                Some('\r') => self.pos += 1 + usize::from(self.peek_at(1) == Some('\n')),
                Some(c) => bail!("grammar: unexpected {c:?} at {}", self.at()),
            }
            self.space(true);
        }
        let Some(&root) = self.ids.get("root") else {
            bail!("grammar: there is no root rule");
        };
        let mut elements = Vec::with_capacity(self.elements);
        let mut rules = Vec::with_capacity(self.rules.len());
        for (id, rule) in self.rules.iter().enumerate() {
            let Some(alternatives) = rule else {
                bail!("grammar: rule {} is used but not defined", self.names[id]);
            };
            let mut starts = Vec::with_capacity(alternatives.len());
            for alternative in alternatives {
                starts.push(elements.len() as u32);
                elements.extend_from_slice(alternative);
                elements.push(Element::End);
            }
            rules.push(starts);
        }
        let grammar = Grammar {
            expansions: (0..elements.len()).map(|_| OnceLock::new()).collect(),
            elements,
            rules,
            ranges: self.ranges,
            root,
        };
        if let Some(rule) = grammar.left_recursive() {
            bail!(
                "grammar: rule {} is left-recursive (it can begin with itself), which the \
                 matcher cannot follow",
                self.names[rule]
            );
        }
        if grammar.try_start().is_none() {
            bail!(
                "grammar: its start has more ways of continuing than the matcher keeps \
                 ({MAX_STACKS}; rules {MAX_DEPTH} deep)"
            );
        }
        Ok(grammar)
    }
}

/// A set of stacks, sorted and without repeats.
type Stacks = Vec<Vec<u32>>;

impl Grammar {
    /// Parses GBNF text.
    pub fn parse(text: &str) -> Result<Grammar> {
        Parser {
            src: text.chars().collect(),
            pos: 0,
            ids: HashMap::new(),
            names: Vec::new(),
            rules: Vec::new(),
            ranges: Vec::new(),
            elements: 0,
            nesting: 0,
        }
        .grammar()
    }

    /// A rule that can begin with itself, as llama.cpp finds them: through the rules that
    /// begin an alternative, or follow rules that may be empty (by an empty alternative).
    fn left_recursive(&self) -> Option<usize> {
        let may_be_empty: Vec<bool> = self
            .rules
            .iter()
            .map(|starts| {
                let empty = |&s: &u32| self.elements[s as usize] == Element::End;
                starts.iter().any(empty)
            })
            .collect();
        // Depth-first over "begins with" edges: 1 in progress, 2 done.
        let mut mark = vec![0u8; self.rules.len()];
        for start in 0..self.rules.len() {
            if mark[start] != 0 {
                continue;
            }
            let mut path: Vec<(usize, Vec<usize>)> =
                vec![(start, self.begins_with(start, &may_be_empty))];
            mark[start] = 1;
            while let Some((rule, next)) = path.last_mut() {
                let rule = *rule;
                match next.pop() {
                    Some(r) if mark[r] == 1 => return Some(r),
                    Some(r) if mark[r] == 0 => {
                        mark[r] = 1;
                        let edges = self.begins_with(r, &may_be_empty);
                        path.push((r, edges));
                    }
                    Some(_) => {}
                    None => {
                        mark[rule] = 2;
                        path.pop();
                    }
                }
            }
        }
        None
    }

    /// The rules an alternative of `rule` may begin with.
    fn begins_with(&self, rule: usize, may_be_empty: &[bool]) -> Vec<usize> {
        let mut out = Vec::new();
        for &start in &self.rules[rule] {
            for element in &self.elements[start as usize..] {
                match *element {
                    Element::Rule(r) => {
                        out.push(r as usize);
                        if !may_be_empty[r as usize] {
                            break;
                        }
                    }
                    _ => break,
                }
            }
        }
        out
    }

    /// Before any output.
    pub fn start(&self) -> GrammarState {
        // `parse` checked that the start is within the bounds.
        self.try_start().unwrap_or(GrammarState {
            ways: Ways::default(),
            partial: None,
        })
    }

    /// Before any output, unless that takes more ways than the matcher keeps.
    fn try_start(&self) -> Option<GrammarState> {
        let mut ways = Ways::default();
        for &start in &self.rules[self.root as usize] {
            if !self.settle(&[], start, &mut ways) {
                return None;
            }
        }
        Some(GrammarState {
            ways,
            partial: None,
        })
    }

    /// The expansion of the rule reference at `at`.
    fn expansion(&self, at: u32) -> Option<&Expansion> {
        self.expansions[at as usize]
            .get_or_init(|| {
                let mut stacks = Vec::new();
                if !self.expand(vec![at], &mut stacks) {
                    return None;
                }
                let nullable = stacks.iter().any(Vec::is_empty);
                stacks.retain(|s| !s.is_empty());
                stacks.sort_unstable();
                stacks.dedup();
                Some(Expansion {
                    segments: stacks,
                    nullable,
                })
            })
            .as_ref()
    }

    /// Adds to `ways` the stacks that `below` with position `at` on top stands for, with a
    /// character (or nothing) on top: past the end of an alternative the stack below goes on,
    /// a rule reference is its expansion. Returns false past the bounds.
    fn settle(&self, mut below: &[u32], mut at: u32, ways: &mut Ways) -> bool {
        loop {
            match self.elements[at as usize] {
                Element::Chars { .. } | Element::Any => return ways.push(below, &[at]),
                Element::Rule(_) => {
                    let Some(expansion) = self.expansion(at) else {
                        return false;
                    };
                    for segment in &expansion.segments {
                        if !ways.push(below, segment) {
                            return false;
                        }
                    }
                    if !expansion.nullable {
                        return true;
                    }
                }
                Element::End => {}
            }
            // The end of an alternative, or a rule that may be empty: what is below goes on.
            match below.split_last() {
                Some((&next, rest)) => (at, below) = (next, rest),
                None => return ways.push(&[], &[]),
            }
        }
    }

    /// Adds to `out` the stacks `stack` stands for with a character (or nothing) on top:
    /// rule references on top replaced by each of the rule's alternatives, over what follows
    /// them. Returns false when the expansion grows past the bounds.
    fn expand(&self, stack: Vec<u32>, out: &mut Stacks) -> bool {
        let mut todo = vec![stack];
        let mut seen: HashSet<Vec<u32>> = HashSet::new();
        while let Some(stack) = todo.pop() {
            if seen.contains(&stack) {
                continue;
            }
            if seen.len() >= MAX_EXPANSIONS || stack.len() > MAX_DEPTH {
                return false;
            }
            let Some(&top) = stack.last() else {
                out.push(stack);
                continue;
            };
            match self.elements[top as usize] {
                Element::Rule(rule) => {
                    let mut below = stack[..stack.len() - 1].to_vec();
                    // What follows the reference, unless the reference ends its alternative.
                    if self.elements[top as usize + 1] != Element::End {
                        below.push(top + 1);
                    }
                    for &start in &self.rules[rule as usize] {
                        let mut next = below.clone();
                        if self.elements[start as usize] != Element::End {
                            next.push(start);
                        }
                        todo.push(next);
                    }
                }
                Element::Chars { .. } | Element::Any => out.push(stack.clone()),
                Element::End => unreachable!("stacks never hold the end of an alternative"),
            }
            seen.insert(stack);
        }
        true
    }

    /// Whether the character element at `at` takes some code point in `low..=high`.
    fn takes_any(&self, at: u32, low: u32, high: u32) -> bool {
        match self.elements[at as usize] {
            Element::Any => true,
            Element::Chars { from, len, negated } => {
                let ranges = &self.ranges[from as usize..][..len as usize];
                let overlaps = ranges.iter().any(|&(l, h)| l <= high && low <= h);
                if !negated || !overlaps {
                    return overlaps != negated;
                }
                // Some code point of low..=high outside every range.
                let covered = |c: u32| ranges.iter().any(|&(l, h)| l <= c && c <= h);
                if low == high {
                    return !covered(low);
                }
                let mut c = low;
                loop {
                    if !covered(c) {
                        return true;
                    }
                    let Some(next) = ranges
                        .iter()
                        .filter(|&&(l, h)| l <= c && c <= h)
                        .map(|&(_, h)| h)
                        .max()
                        .and_then(|h| h.checked_add(1))
                    else {
                        return false;
                    };
                    if next > high {
                        return false;
                    }
                    c = next;
                }
            }
            Element::Rule(_) | Element::End => false,
        }
    }
}

/// Stacks, one after another in one buffer (each its length, then its positions, bottom
/// first), each once: a state is one allocation, and a step writes the next without more.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Ways {
    buffer: Vec<u32>,
    count: usize,
}

impl Ways {
    fn iter(&self) -> impl Iterator<Item = &[u32]> {
        let mut at = 0;
        std::iter::from_fn(move || {
            let len = *self.buffer.get(at)? as usize;
            let stack = &self.buffer[at + 1..at + 1 + len];
            at += len + 1;
            Some(stack)
        })
    }

    /// Adds the stack `below` then `top`, unless it is here already; false past the bounds.
    fn push(&mut self, below: &[u32], top: &[u32]) -> bool {
        let len = below.len() + top.len();
        if len > MAX_DEPTH || self.count >= MAX_STACKS {
            return false;
        }
        let is_new = self
            .iter()
            .all(|s| s.len() != len || s[..below.len()] != *below || s[below.len()..] != *top);
        if is_new {
            self.buffer.push(len as u32);
            self.buffer.extend_from_slice(below);
            self.buffer.extend_from_slice(top);
            self.count += 1;
        }
        true
    }
}

/// How far the output has got in a grammar: the ways it can continue, and a UTF-8 sequence
/// begun.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrammarState {
    ways: Ways,
    partial: Option<Utf8Begun>,
}

/// A code point whose UTF-8 sequence has begun.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Utf8Begun {
    /// Its bits so far.
    bits: u32,
    /// The continuation bytes it still needs.
    more: u8,
    /// The least code point its length encodes.
    least: u32,
}

impl GrammarState {
    /// The state after code point `c`.
    fn advance(&self, grammar: &Grammar, c: u32) -> Option<GrammarState> {
        let mut ways = Ways {
            buffer: Vec::with_capacity(self.ways.buffer.len() + 8),
            count: 0,
        };
        for stack in self.ways.iter() {
            let Some((&top, below)) = stack.split_last() else {
                continue;
            };
            if grammar.takes_any(top, c, c) && !grammar.settle(below, top + 1, &mut ways) {
                return None;
            }
        }
        (ways.count > 0).then_some(GrammarState {
            ways,
            partial: None,
        })
    }
}

impl Automaton for GrammarState {
    type Rules = Grammar;

    fn step(&self, grammar: &Grammar, b: u8) -> Option<Self> {
        let (bits, more, least) = match self.partial {
            None => match b {
                0x00..=0x7f => return self.advance(grammar, b as u32),
                0xc2..=0xdf => (b as u32 & 0x1f, 1, 0x80),
                0xe0..=0xef => (b as u32 & 0x0f, 2, 0x800),
                0xf0..=0xf4 => (b as u32 & 0x07, 3, 0x1_0000),
                _ => return None,
            },
            Some(p) if b & 0xc0 == 0x80 => (p.bits << 6 | (b as u32 & 0x3f), p.more - 1, p.least),
            Some(_) => return None,
        };
        // The code points these bytes may begin, less overlong encodings (of fewer bytes).
        let shift = 6 * more as u32;
        let low = (bits << shift).max(least);
        let high = (bits << shift | ((1 << shift) - 1)).min(0x10_ffff);
        if low > high {
            return None;
        }
        if more == 0 {
            // Surrogates are not characters.
            let c = char::from_u32(bits)?;
            return self.advance(grammar, c as u32);
        }
        // Keep the ways that some code point starting with these bytes continues.
        let mut ways = Ways {
            buffer: Vec::with_capacity(self.ways.buffer.len()),
            count: 0,
        };
        for stack in self.ways.iter() {
            if stack
                .last()
                .is_some_and(|&top| grammar.takes_any(top, low, high))
            {
                ways.buffer.push(stack.len() as u32);
                ways.buffer.extend_from_slice(stack);
                ways.count += 1;
            }
        }
        (ways.count > 0).then_some(GrammarState {
            ways,
            partial: Some(Utf8Begun { bits, more, least }),
        })
    }

    fn is_complete(&self) -> bool {
        self.partial.is_none() && self.ways.iter().any(|s| s.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `text` is a whole sentence of `grammar`.
    fn matches(grammar: &Grammar, text: &str) -> bool {
        grammar
            .start()
            .feed(grammar, text.as_bytes())
            .is_some_and(|s| s.is_complete())
    }

    fn check(grammar: &str, passing: &[&str], failing: &[&str]) {
        let g = Grammar::parse(grammar).unwrap_or_else(|e| panic!("{grammar}: {e:#}"));
        for text in passing {
            assert!(matches(&g, text), "{grammar}: {text:?} should match");
        }
        for text in failing {
            assert!(!matches(&g, text), "{grammar}: {text:?} should not match");
        }
    }

    // The cases below are those of llama.cpp's tests/test-grammar-integration.cpp.
    #[test]
    fn simple_and_medium_grammars() {
        check(
            "root ::= expr\nexpr ::= term (\"+\" term)*\nterm ::= number\nnumber ::= [0-9]+",
            &["42", "1+2+3+4+5", "123+456"],
            &["+", "/ 3", "1+2+3+4+5+", "12a45"],
        );
        check(
            r#"
            root ::= expression
            expression ::= term ws (("+"|"-") ws term)*
            term ::= factor ws (("*"|"/") ws factor)*
            factor ::= number | variable | "(" expression ")" | function-call
            number ::= [0-9]+
            variable ::= [a-zA-Z_][a-zA-Z0-9_]*
            function-call ::= variable ws "(" (expression ("," ws expression)*)? ")"
            ws ::= [ \t\n\r]?"#,
            &[
                "42",
                "1*2*3*4*5",
                "x+10",
                "(a+b)*(c-d)",
                "func()",
                "func(x,y+2)",
                "f(g(x),h(y,z))",
                "a * (b + c) - d / e",
                "f(g(x), h(y, z))",
            ],
            &[
                "+",
                "/ 3x",
                "x + + y",
                "a * / b",
                "func(,)",
                "func(x y)",
                "(a + b",
                "x + y)",
                "42 +",
                "func(",
                "f(g(x), h(y, z)",
            ],
        );
    }

    #[test]
    fn any_character_counts_code_points() {
        check(
            r#"root ::= ... "abc" ..."#,
            &["abcabcabc", "aaaabcccc", "🔵🟠✅abc❌🟠🔵"],
            &[
                "aaabcccc",
                "aaaaabcccc",
                "aaaabccc",
                "🔵🟠✅❌abc❌✅🟠🔵",
                "🔵🟠abc🟠🔵",
            ],
        );
    }

    #[test]
    fn quantifiers() {
        let many_a = "a".repeat(60);
        check(
            r#"root ::= "a"*"#,
            &["", "a", "aaaaa", &many_a],
            &["b", "ab", "ba"],
        );
        check(r#"root ::= "a"+"#, &["a", &many_a], &["", "b", "aab"]);
        check(r#"root ::= "a"?"#, &["", "a"], &["b", "aa"]);
        check(
            "root ::= cons+ vowel* cons? (vowel cons)*\nvowel ::= [aeiouy]\ncons ::= [bcdfghjklmnpqrstvwxyz]",
            &["yes", "no", "noyes", "crwth", "four", "bryyyy"],
            &["yess", "yesno", "forty", "catyyy"],
        );
        check(
            "root ::= [ab]{4}",
            &["aaaa", "bbbb", "abab"],
            &["a", "aaaaa"],
        );
        check(
            "root ::= [ab]{4,}",
            &["aaaa", "aaaaab", "ababab"],
            &["", "aba"],
        );
        check("root ::= [ab]{0,4}", &["", "a", "aaab"], &["aaaaa"]);
        check(
            r#"root ::= ("0x" [A-F0-9]{2} " "?){3,5}"#,
            &["0xFF 0x12 0xAB", "0xFF 0x12 0xAB 0x00 0x00"],
            &["", "0xFF", "0xFF 0x12", "0xFF 0x12 0xAB 0x00 0x00 0x00"],
        );
        check("root ::= ( [x]* )*", &["", "x", "xx"], &["y", "yy"]);
        check(r#"root ::= "ab"{2} "c""#, &["ababc"], &["abc", "abbc"]);
    }

    #[test]
    fn classes_escapes_and_comments() {
        check(
            "root ::= [^\\n\"]+ \"\\n\" # a line\n  # nothing here\n",
            &["héllo wörld\n", "a\n"],
            &["\n", "a\"b\n", "a"],
        );
        check(
            r#"root ::= [\x41-\x43] "\u00e9" [\-\]]"#,
            &["Aé-", "Cé]"],
            &["Dé-", "Ae-"],
        );
        check("root ::= [ぁ-ゟ]+", &["ひらがな"], &["カタカナ"]);
        // An alternative may start on the line after `|`, and parentheses span lines.
        check(
            "root ::= \"a\" |\n  \"b\"\nx ::= (\n  \"c\"\n)",
            &["a", "b"],
            &["c"],
        );
    }

    #[test]
    fn partial_utf8_keeps_only_ways_it_can_complete() {
        let g = Grammar::parse("root ::= \"é\" | \"a\"").unwrap();
        assert!(g.start().step(&g, 0xc3).is_some(), "é begins with 0xc3");
        assert!(
            g.start().step(&g, 0xe2).is_none(),
            "no 3-byte code point here"
        );
        let s = g.start().step(&g, 0xc3).unwrap();
        assert!(!s.is_complete());
        assert!(s.clone().step(&g, 0xa9).is_some_and(|s| s.is_complete()));
        assert!(s.step(&g, 0xa8).is_none());
        // Overlong encodings and surrogates are not UTF-8: "\xe0\x81\x91" is not "Q".
        let letter = Grammar::parse(r"root ::= [A-Z] | [\u0800-\uffff]").unwrap();
        assert!(letter.start().feed(&letter, b"\xe0\x81").is_none());
        assert!(letter.start().feed(&letter, b"\xc1\x91").is_none());
        assert!(letter.start().feed(&letter, b"\xed\xa0\x80").is_none());
        assert!(letter.start().feed(&letter, "\u{800}".as_bytes()).is_some());
        let negated = Grammar::parse("root ::= [^é]").unwrap();
        assert!(negated.start().feed(&negated, "è".as_bytes()).is_some());
        assert!(negated.start().feed(&negated, "é".as_bytes()).is_none());
    }

    #[test]
    fn bad_grammars_are_errors_naming_the_problem() {
        for (grammar, want) in [
            ("rot ::= \"a\"", "no root"),
            ("root ::= a", "a is used but not defined"),
            ("root ::= \"a", "not closed"),
            ("root ::= [a", "not closed"),
            ("root ::= (\"a\"", "expected ')'"),
            ("root ::= * \"a\"", "nothing before it"),
            ("root ::= \"a\"{3,2}", "below its minimum"),
            ("root ::= \"a\"{x}", "repetition count"),
            ("root ::= \"\\q\"", "unknown escape"),
            ("root ::= [z-a]", "ends before it starts"),
            ("root = \"a\"", "expected ::="),
            ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
            ("root ::= root \"a\" | \"b\"", "left-recursive"),
            (
                "root ::= e root \"x\" | \"y\"\ne ::= \"z\" | ",
                "left-recursive",
            ),
            ("root ::= <[10]> \"a\"", "token references"),
            (
                &format!("root ::= {}", vec!["[a-z]"; 65].join(" | ")),
                "more ways",
            ),
            ("root ::= \"a\"{100000}{100000}", "elements"),
            (
                &format!(
                    "root ::= {}\"a\"{}",
                    "(".repeat(100_000),
                    ")".repeat(100_000)
                ),
                "nested",
            ),
        ] {
            let e = Grammar::parse(grammar).map(|_| ()).unwrap_err();
            assert!(format!("{e:#}").contains(want), "{grammar}: {e:#}");
        }
    }

    #[test]
    fn ambiguous_grammars_stay_bounded() {
        // Every split of the a's is a way; duplicates fold, so the stacks stay few.
        let g = Grammar::parse("root ::= (\"a\" | \"aa\" | x)* \nx ::= \"a\"+").unwrap();
        let text = "a".repeat(200);
        let s = g.start().feed(&g, text.as_bytes()).expect("matches");
        assert!(s.is_complete() && s.ways.count < 16, "{}", s.ways.count);
    }
}
