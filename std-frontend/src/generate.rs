//! Prompt -> tokens: the generation loop with its stop conditions, and its timing.
use std::time::Instant;

use anyhow::Result;
use sapient_core::sample::Sampler;
use sapient_core::Want;

use crate::constraint::OutputConstraint;
use crate::run::Session;

#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub prompt_tokens: usize,
    pub prompt_secs: f64,
    pub generated_tokens: usize,
    pub generate_secs: f64,
}

impl Stats {
    pub fn summary(&self) -> String {
        let rate = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        format!(
            "prompt: {} tokens, {:.1} tokens/s; generation: {} tokens, {:.1} tokens/s",
            self.prompt_tokens,
            rate(self.prompt_tokens, self.prompt_secs),
            self.generated_tokens,
            rate(self.generated_tokens, self.generate_secs)
        )
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    EndOfSequence,
    MaxTokens,
    ContextFull,
    Interrupted,
}

/// Runs `new_tokens` after what the session's cache holds, then samples up to `max_tokens`
/// tokens, calling `on_token` with each (it returns false to stop). The cache ends holding every
/// token that was fed through the model; the last token sampled (a stop token, or the last of
/// `max_tokens`) is reported but not fed. With `constraint`, every token keeps the text a
/// prefix of its language (a JSON object, a schema's value, a grammar's sentence), and a stop
/// token comes only once it is whole.
#[allow(clippy::too_many_arguments)]
pub fn generate(
    session: &mut dyn Session,
    sampler: &mut Sampler,
    mut constraint: Option<&mut OutputConstraint>,
    new_tokens: &[u32],
    history: &mut Vec<u32>,
    max_tokens: usize,
    stop: &[u32],
    mut on_token: impl FnMut(u32) -> Result<bool>,
) -> Result<(Stats, Stop)> {
    let mut logits = vec![0f32; session.config().vocab_size];
    let mut stats = Stats {
        prompt_tokens: new_tokens.len(),
        ..Stats::default()
    };
    check_room(session, new_tokens.len())?;
    // Greedy decoding lets the backend pick the token (a GPU then reads back one id), unless
    // the constraint must see the logits.
    let argmax = sampler.is_argmax() && constraint.is_none();
    let mut next = 0;
    let step = |s: &mut dyn Session, tokens: &[u32], logits: &mut [f32], next: &mut u32| {
        if argmax {
            s.forward(tokens, Want::LastArgmax(next))
        } else {
            s.forward(tokens, Want::LastLogits(logits))
        }
    };
    let t0 = Instant::now();
    step(session, new_tokens, &mut logits, &mut next)?;
    history.extend_from_slice(new_tokens);
    stats.prompt_secs = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let mut why = Stop::MaxTokens;
    for i in 0..max_tokens {
        if let Some(constraint) = constraint.as_deref_mut() {
            next = constraint.sample(sampler, &mut logits, history, stop)?;
        } else if !argmax {
            next = sampler.sample(&mut logits, history)?;
        }
        if stop.contains(&next) {
            why = Stop::EndOfSequence;
            break;
        }
        stats.generated_tokens += 1;
        if !on_token(next)? {
            why = Stop::Interrupted;
            break;
        }
        if i + 1 == max_tokens {
            break;
        }
        if session.kv_len() == session.max_seq() {
            why = Stop::ContextFull;
            break;
        }
        let token = next;
        step(session, &[token], &mut logits, &mut next)?;
        history.push(token);
    }
    stats.generate_secs = t1.elapsed().as_secs_f64();
    Ok((stats, why))
}

/// Fails unless `session`'s cache has room for `n` more tokens.
pub(crate) fn check_room(session: &dyn Session, n: usize) -> Result<()> {
    if n > session.max_seq() - session.kv_len() {
        return Err(sapient_core::Error::ContextFull {
            pos: session.kv_len(),
            tokens: n,
            max_seq: session.max_seq(),
        }
        .into());
    }
    Ok(())
}
