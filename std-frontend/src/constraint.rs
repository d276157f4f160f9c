//! Output constrained to a language: one JSON object (`json_output.rs`), a value of a JSON
//! schema (`json_schema.rs`) or a sentence of a GBNF grammar (`grammar.rs`), whole or after a
//! trigger (tool calls, lazy grammars). Every token sampled keeps the text a prefix of the
//! language, and the stop tokens are allowed only once it is a whole sentence.
//!
//! The check is a pushdown automaton over bytes. Sampling is lazy, as llama.cpp's grammar
//! sampling is: the token drawn from the unconstrained logits is kept when the automaton
//! accepts it (most tokens of a model that knows the format are), otherwise every
//! token the automaton rejects is masked and the draw is repeated. For a random draw that is
//! rejection sampling, so a token comes out with its probability among the accepted ones. The
//! mask walks the vocabulary sorted by bytes, so a shared prefix is stepped through once and a
//! dead one skips every token that starts with it.
use std::sync::Arc;

use anyhow::{bail, Result};
use sapient_core::sample::Sampler;

use crate::grammar::{Grammar, GrammarState};
use crate::json_output::JsonPrefix;
use crate::json_schema::{Schema, SchemaPrefix};
use crate::tokenizer::Tokenizer;

/// A pushdown automaton over bytes whose state is a value, stepped by `Rules` (a compiled
/// schema or grammar, or nothing).
pub trait Automaton: Clone {
    type Rules;
    /// The state after byte `b`, or `None` if it leaves no valid continuation.
    fn step(&self, rules: &Self::Rules, b: u8) -> Option<Self>;
    /// Whether the text so far is a whole value, so that the output may end.
    fn is_complete(&self) -> bool;
    /// The state after `bytes`.
    fn feed(mut self, rules: &Self::Rules, bytes: &[u8]) -> Option<Self> {
        for &b in bytes {
            self = self.step(rules, b)?;
        }
        Some(self)
    }
}

/// The vocabulary as bytes, sorted, for masking: special tokens left out (decoded text has no
/// trace of them, so they can never be part of the JSON).
pub struct SortedVocab {
    /// (bytes, id), sorted by bytes.
    tokens: Vec<(Vec<u8>, u32)>,
    /// How many leading bytes each token shares with the one before it.
    shared: Vec<usize>,
    vocab_size: usize,
}

impl SortedVocab {
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize) -> Self {
        let special = tokenizer.special_ids();
        let mut tokens: Vec<(Vec<u8>, u32)> = (0..vocab_size as u32)
            .filter(|id| special.binary_search(id).is_err())
            .map(|id| (tokenizer.token_bytes(id), id))
            .filter(|(bytes, _)| !bytes.is_empty())
            .collect();
        tokens.sort_unstable();
        let shared = (0..tokens.len())
            .map(|i| match i.checked_sub(1) {
                Some(p) => tokens[p]
                    .0
                    .iter()
                    .zip(&tokens[i].0)
                    .take_while(|(a, b)| a == b)
                    .count(),
                None => 0,
            })
            .collect();
        SortedVocab {
            tokens,
            shared,
            vocab_size,
        }
    }

    /// `allowed[id]` ← whether token `id`'s bytes may follow `from` (special tokens never).
    pub fn allowed<A: Automaton>(&self, rules: &A::Rules, from: A, allowed: &mut Vec<bool>) {
        allowed.clear();
        allowed.resize(self.vocab_size, false);
        // states[k]: the state after the current token's first k bytes, for as long a prefix
        // as the automaton accepts.
        let mut states = vec![from];
        for ((bytes, id), &shared) in self.tokens.iter().zip(&self.shared) {
            if states.len() <= shared {
                // A prefix this token shares with the one before was already rejected.
                continue;
            }
            states.truncate(shared + 1);
            for &b in &bytes[shared..] {
                match states[states.len() - 1].step(rules, b) {
                    Some(s) => states.push(s),
                    None => break,
                }
            }
            if states.len() == bytes.len() + 1 {
                allowed[*id as usize] = true;
            }
        }
    }
}

/// What the output must be, and how far it has got. One per request, cloned once a token: the
/// schema's larger state costs nothing worth a box.
#[derive(Clone)]
#[allow(clippy::large_enum_variant)]
enum Progress {
    /// Any JSON object.
    Object(JsonPrefix),
    /// A value of a schema.
    Schema(Arc<Schema>, SchemaPrefix),
    /// A sentence of a grammar.
    Grammar(Arc<Grammar>, GrammarState),
    /// One of several openings, then a value of its schema.
    Choice(Arc<Choice>, ChoicePrefix),
}

impl Progress {
    fn is_complete(&self) -> bool {
        match self {
            Progress::Object(p) => p.is_complete(),
            Progress::Schema(_, p) => p.is_complete(),
            Progress::Grammar(_, p) => p.is_complete(),
            Progress::Choice(_, p) => p.is_complete(),
        }
    }

    /// The progress after `bytes`, if the text may continue with them.
    fn feed(&self, bytes: &[u8]) -> Option<Progress> {
        match self {
            Progress::Object(p) => p.feed(&(), bytes).map(Progress::Object),
            Progress::Schema(s, p) => p.feed(s, bytes).map(|p| Progress::Schema(s.clone(), p)),
            Progress::Grammar(g, p) => {
                let p = p.clone().feed(g, bytes)?;
                Some(Progress::Grammar(g.clone(), p))
            }
            Progress::Choice(c, p) => p.feed(c, bytes).map(|p| Progress::Choice(c.clone(), p)),
        }
    }

    /// `allowed[id]` ← whether token `id` may come next.
    fn allowed(&self, vocab: &SortedVocab, allowed: &mut Vec<bool>) {
        match self {
            Progress::Object(p) => vocab.allowed(&(), *p, allowed),
            Progress::Schema(s, p) => vocab.allowed(s.as_ref(), *p, allowed),
            Progress::Grammar(g, p) => vocab.allowed(g.as_ref(), p.clone(), allowed),
            Progress::Choice(c, p) => vocab.allowed(c.as_ref(), *p, allowed),
        }
    }
}

/// One of several openings, then a value of the schema that opening picks: a call to any of
/// several tools in a format that names the tool before its JSON (Mistral's `[ARGS]`: the
/// tool's name and `[ARGS]`, then its arguments).
pub struct Choice {
    /// (opening, schema), sorted by opening.
    options: Vec<(Vec<u8>, Arc<Schema>)>,
}

impl Choice {
    /// # Errors
    /// No options, an empty opening, or an opening that begins another (the text could not
    /// tell them apart).
    pub fn new(mut options: Vec<(Vec<u8>, Arc<Schema>)>) -> Result<Self> {
        options.sort_by(|a, b| a.0.cmp(&b.0));
        if options.is_empty() || options[0].0.is_empty() {
            bail!("a choice needs options, each with an opening");
        }
        if let Some(pair) = options.windows(2).find(|p| p[1].0.starts_with(&p[0].0)) {
            bail!(
                "the opening {:?} begins another, {:?}",
                String::from_utf8_lossy(&pair[0].0),
                String::from_utf8_lossy(&pair[1].0)
            );
        }
        Ok(Choice { options })
    }

    pub fn start(&self) -> ChoicePrefix {
        ChoicePrefix::Opening {
            from: 0,
            to: self.options.len(),
            len: 0,
        }
    }
}

/// How far a choice has got. Stepped once a byte, as a schema's prefix is: its size costs less
/// than a box.
#[derive(Clone, Copy, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum ChoicePrefix {
    /// `len` bytes written, the first `len` of each of the openings `from..to` (sorted, so the
    /// openings a prefix leaves are a run of them).
    Opening { from: usize, to: usize, len: usize },
    /// Option `option`'s opening written, and its value this far.
    Value { option: usize, value: SchemaPrefix },
}

impl Automaton for ChoicePrefix {
    type Rules = Choice;

    fn step(&self, choice: &Choice, b: u8) -> Option<Self> {
        match *self {
            ChoicePrefix::Value { option, value } => Some(ChoicePrefix::Value {
                option,
                value: value.step(&choice.options[option].1, b)?,
            }),
            ChoicePrefix::Opening { from, to, len } => {
                // Every opening of the run is longer than `len` (a whole one became a value).
                let run = &choice.options[from..to];
                let lo = from + run.partition_point(|(o, _)| o[len] < b);
                let hi = from + run.partition_point(|(o, _)| o[len] <= b);
                if lo == hi {
                    return None;
                }
                let (opening, schema) = &choice.options[lo];
                // Whole: the only opening of the run, as none begins another.
                if opening.len() == len + 1 {
                    return Some(ChoicePrefix::Value {
                        option: lo,
                        value: schema.start(),
                    });
                }
                Some(ChoicePrefix::Opening {
                    from: lo,
                    to: hi,
                    len: len + 1,
                })
            }
        }
    }

    fn is_complete(&self) -> bool {
        matches!(self, ChoicePrefix::Value { value, .. } if value.is_complete())
    }
}

/// Text after which (or, with `at_start`, from which) a lazy constraint's JSON begins.
#[derive(Clone, Debug)]
pub struct Trigger {
    pub text: Vec<u8>,
    /// Only as the reply's first bytes other than white space, and the JSON starts with them
    /// (a Llama 3 call is the reply's JSON object); otherwise anywhere, the JSON after them.
    pub at_start: bool,
}

/// What begins a lazy grammar (llama-server's `grammar_triggers`): the grammar then holds from
/// the trigger to the end of the output, its text included.
#[derive(Clone, Debug)]
pub enum GrammarTrigger {
    /// This token is drawn; the grammar starts with its bytes.
    Token(u32),
    /// These bytes appear anywhere in the output; the grammar starts with them.
    Word(Vec<u8>),
    /// The output so far matches this expression: the whole output where it is anchored at
    /// both ends, anywhere otherwise. The grammar starts at its first capture group that
    /// matched something, or else at the match.
    Pattern(regex::bytes::Regex),
}

impl GrammarTrigger {
    /// Where in `text` (the whole output, its last `new` bytes just drawn as `token`) the
    /// grammar starts, if this trigger fires.
    fn start(&self, text: &[u8], new: usize, token: u32) -> Option<usize> {
        match self {
            GrammarTrigger::Token(t) => (*t == token).then(|| text.len() - new),
            GrammarTrigger::Word(word) => {
                // Only a match that ends in the new bytes: an earlier one would have fired.
                let from = (text.len() - new).saturating_sub(word.len().saturating_sub(1));
                text[from..]
                    .windows(word.len().max(1))
                    .position(|w| w == word.as_slice())
                    .map(|at| from + at)
            }
            GrammarTrigger::Pattern(regex) => {
                let found = regex.captures(text)?;
                let group = found.iter().skip(1).flatten().find(|g| !g.is_empty());
                Some(group.unwrap_or(found.get(0)?).start())
            }
        }
    }
}

/// A lazy grammar before its trigger: what fires it, and the output so far (its text from the
/// trigger on is the grammar's first).
struct PendingGrammar {
    triggers: Arc<[GrammarTrigger]>,
    text: Vec<u8>,
}

/// A lazy constraint between values: the reply's last bytes, to find a trigger in.
struct Waiting {
    tail: Vec<u8>,
    /// The reply has had bytes other than white space.
    started: bool,
}

/// One request's constraint: the text so far, and what its sampling needs.
pub struct OutputConstraint {
    vocab: Arc<SortedVocab>,
    tokenizer: Arc<Tokenizer>,
    progress: Progress,
    /// The logits before a draw, to draw again under the mask.
    saved: Vec<f32>,
    allowed: Vec<bool>,
    /// A lazy constraint's schemas, each with the triggers after which its values come
    /// (llama.cpp's lazy grammars): one holds from its trigger to the end of the value, then
    /// the output waits for the next; empty for output that is all JSON.
    lazy: Vec<(Arc<Schema>, Vec<Trigger>)>,
    /// `Some` while a lazy constraint waits for a trigger.
    waiting: Option<Waiting>,
    /// `Some` while a lazy grammar waits for its trigger.
    pending: Option<PendingGrammar>,
}

impl OutputConstraint {
    /// Output that is any one JSON object.
    pub fn new(vocab: Arc<SortedVocab>, tokenizer: Arc<Tokenizer>) -> Self {
        OutputConstraint {
            vocab,
            tokenizer,
            progress: Progress::Object(JsonPrefix::default()),
            saved: Vec::new(),
            allowed: Vec::new(),
            lazy: Vec::new(),
            waiting: None,
            pending: None,
        }
    }

    /// Output that is free text, but a value of a schema after each of its triggers (a tool
    /// call's JSON after the text that opens it; with schemas of their own, a call's
    /// arguments after the text that names its tool). `lazy` is not empty.
    pub fn lazy(
        vocab: Arc<SortedVocab>,
        tokenizer: Arc<Tokenizer>,
        lazy: Vec<(Arc<Schema>, Vec<Trigger>)>,
    ) -> Self {
        let first = lazy[0].0.clone();
        OutputConstraint {
            lazy,
            waiting: Some(Waiting {
                tail: Vec::new(),
                started: false,
            }),
            ..Self::with_schema(vocab, tokenizer, first)
        }
    }

    /// While waiting: takes in a drawn token's bytes, and begins a value of the schema whose
    /// trigger they complete where the bytes after it may start the value.
    fn watch(&mut self, bytes: &[u8]) {
        let Some(waiting) = &mut self.waiting else {
            return;
        };
        let new_from = waiting.tail.len();
        waiting.tail.extend_from_slice(bytes);
        let tail = &waiting.tail;
        let fired = self.lazy.iter().find_map(|(schema, triggers)| {
            let from = triggers.iter().find_map(|t| {
                if t.at_start {
                    let skipped = tail.iter().take_while(|b| b.is_ascii_whitespace()).count();
                    (!waiting.started && tail[skipped..].starts_with(&t.text)).then_some(skipped)
                } else {
                    let at = tail
                        .windows(t.text.len().max(1))
                        .position(|w| w == t.text.as_slice())
                        .filter(|&at| at + t.text.len() > new_from)?;
                    Some(at + t.text.len())
                }
            })?;
            Some((schema, from))
        });
        let began = fired.and_then(|(schema, from)| {
            let progress = schema.start().feed(schema, &tail[from..])?;
            Some((schema.clone(), progress))
        });
        if let Some((schema, progress)) = began {
            self.progress = Progress::Schema(schema, progress);
            self.waiting = None;
            return;
        }
        waiting.started |= waiting.tail.iter().any(|b| !b.is_ascii_whitespace());
        // Keep what may be the start of a trigger.
        let keep = self
            .lazy
            .iter()
            .flat_map(|(_, triggers)| triggers)
            .map(|t| t.text.len())
            .max()
            .unwrap_or(1)
            - 1;
        let cut = waiting.tail.len().saturating_sub(keep);
        waiting.tail.drain(..cut);
    }

    /// Output that is one value of `schema`.
    pub fn with_schema(
        vocab: Arc<SortedVocab>,
        tokenizer: Arc<Tokenizer>,
        schema: Arc<Schema>,
    ) -> Self {
        OutputConstraint {
            progress: Progress::Schema(schema.clone(), schema.start()),
            ..Self::new(vocab, tokenizer)
        }
    }

    /// Output that is one sentence of `grammar`.
    pub fn with_grammar(
        vocab: Arc<SortedVocab>,
        tokenizer: Arc<Tokenizer>,
        grammar: Arc<Grammar>,
    ) -> Self {
        OutputConstraint {
            progress: Progress::Grammar(grammar.clone(), grammar.start()),
            ..Self::new(vocab, tokenizer)
        }
    }

    /// Output that is free text until one of `triggers` fires, then a sentence of `grammar`
    /// from the trigger's text on to the end (llama.cpp's lazy grammars). `triggers` is not
    /// empty.
    pub fn lazy_grammar(
        vocab: Arc<SortedVocab>,
        tokenizer: Arc<Tokenizer>,
        grammar: Arc<Grammar>,
        triggers: Arc<[GrammarTrigger]>,
    ) -> Self {
        OutputConstraint {
            pending: Some(PendingGrammar {
                triggers,
                text: Vec::new(),
            }),
            ..Self::with_grammar(vocab, tokenizer, grammar)
        }
    }

    /// While a lazy grammar is pending: takes in drawn `token`, and once a trigger fires, feeds
    /// the grammar the output from the trigger on.
    ///
    /// # Errors
    /// When the grammar rejects that text (a grammar that cannot begin with its trigger).
    fn await_trigger(&mut self, token: u32) -> Result<()> {
        let Some(pending) = &mut self.pending else {
            return Ok(());
        };
        let bytes = self.tokenizer.token_bytes(token);
        pending.text.extend_from_slice(&bytes);
        let text = &pending.text;
        let Some(start) = pending
            .triggers
            .iter()
            .find_map(|t| t.start(text, bytes.len(), token))
        else {
            return Ok(());
        };
        let Some(progress) = self.progress.feed(&text[start..]) else {
            bail!(
                "the grammar does not accept the text its trigger began: {:?}",
                String::from_utf8_lossy(&text[start..])
            );
        };
        self.progress = progress;
        self.pending = None;
        Ok(())
    }

    /// Output that is one of `choice`'s openings, then a value of its schema.
    pub fn with_choice(
        vocab: Arc<SortedVocab>,
        tokenizer: Arc<Tokenizer>,
        choice: Arc<Choice>,
    ) -> Self {
        OutputConstraint {
            progress: Progress::Choice(choice.clone(), choice.start()),
            ..Self::new(vocab, tokenizer)
        }
    }

    /// Whether the text is whole (generation may only stop now): free text before a lazy
    /// grammar's trigger is.
    pub fn is_complete(&self) -> bool {
        self.pending.is_some() || self.progress.is_complete()
    }

    /// The progress after `token`, if the text may continue with it; a stop token only once
    /// the text is whole.
    fn accepts(&self, token: u32, stop: &[u32]) -> Option<Progress> {
        if stop.contains(&token) {
            return self.is_complete().then(|| self.progress.clone());
        }
        self.progress.feed(&self.tokenizer.token_bytes(token))
    }

    /// `self.allowed` ← the tokens `accepts` takes.
    fn mask(&mut self, vocab_size: usize, stop: &[u32]) {
        if self.is_complete() {
            self.allowed.clear();
            self.allowed.resize(vocab_size, false);
            for &t in stop {
                if let Some(a) = self.allowed.get_mut(t as usize) {
                    *a = true;
                }
            }
            return;
        }
        self.progress.allowed(&self.vocab, &mut self.allowed);
    }

    /// Draws the next token with `sampler` among those that keep the text a prefix of the
    /// language asked for (or, once it is whole, among `stop`), and moves past it.
    ///
    /// # Errors
    /// When no token of the vocabulary can continue the text (no stop token after a whole
    /// value), or the sampler's.
    pub fn sample(
        &mut self,
        sampler: &mut Sampler<'_>,
        logits: &mut [f32],
        history: &[u32],
        stop: &[u32],
    ) -> Result<u32> {
        if !self.lazy.is_empty() && self.waiting.is_none() && self.is_complete() {
            // A lazy constraint's value is whole: free text again, until the next trigger.
            self.waiting = Some(Waiting {
                tail: Vec::new(),
                started: true,
            });
        }
        if self.waiting.is_some() {
            let token = sampler.sample(logits, history)?;
            self.watch(&self.tokenizer.token_bytes(token));
            return Ok(token);
        }
        if self.pending.is_some() {
            let token = sampler.sample(logits, history)?;
            self.await_trigger(token)?;
            return Ok(token);
        }
        self.saved.clear();
        self.saved.extend_from_slice(logits);
        let token = sampler.sample(logits, history)?;
        if let Some(next) = self.accepts(token, stop) {
            self.progress = next;
            return Ok(token);
        }
        logits.copy_from_slice(&self.saved);
        self.mask(logits.len(), stop);
        let mut any = false;
        for (i, l) in logits.iter_mut().enumerate() {
            if self.allowed.get(i) == Some(&true) {
                any = true;
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        if !any {
            bail!("no token of the vocabulary can continue the constrained output");
        }
        let token = sampler.sample(logits, history)?;
        match self.accepts(token, stop) {
            Some(next) => {
                self.progress = next;
                Ok(token)
            }
            // The mask allows only accepted tokens; a sampler that drew a masked one anyway
            // (every allowed logit -inf as well) is refused rather than followed.
            None => bail!("the sampler drew a token outside the constraint's mask"),
        }
    }
}
