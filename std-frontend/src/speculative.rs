//! Speculative decoding: a cheap draft proposes the next few tokens, the target checks them all
//! in one batched forward pass (logits at every new position) and keeps the longest prefix it
//! agrees with, plus one token of its own. The target's KV cache then drops the rejected
//! positions.
//!
//! Greedy output is the target's own, token for token: the CPU backend gives a batch's logits
//! bit for bit as one token at a time would, and a deterministic sampler accepts exactly the
//! token it would have chosen. With sampling, `Sampler::verify`'s rejection rule keeps the
//! target's distribution.
use anyhow::{ensure, Result};
use sapient_core::sample::{Sampler, Verdict};
use sapient_core::Want;

use crate::generate::{check_room, Stats, Stop};
use crate::run::Session;

/// Where proposals come from.
pub enum Draft<'s> {
    /// A smaller model with the target's vocabulary, in a session of its own.
    Model(Box<ModelDraft<'s>>),
    /// Prompt lookup: the tokens that followed the latest earlier occurrence of the context's
    /// last n-gram (longest n first, down to one token). No second model; it pays off where the
    /// output repeats its input (code edits, summaries, chat over a document).
    Ngram,
}

/// Longest n-gram `Draft::Ngram` looks up.
const NGRAM_MAX: usize = 3;
/// Shortest n-gram it takes: one token alone recurs by chance too often to predict much.
const NGRAM_MIN: usize = 2;

/// A draft model's session and sampler, and the tokens its cache holds.
pub struct ModelDraft<'s> {
    session: &'s mut dyn Session,
    sampler: Sampler<'static>,
    /// The tokens in the draft's cache, in order.
    fed: Vec<u32>,
    logits: Vec<f32>,
}

impl<'s> ModelDraft<'s> {
    /// `sampler` is the draft's own, configured as the target's (with another seed) so that
    /// its distribution is close to the target's.
    pub fn new(session: &'s mut dyn Session, sampler: Sampler<'static>) -> Self {
        let vocab = session.config().vocab_size;
        ModelDraft {
            session,
            sampler,
            fed: Vec::new(),
            logits: vec![0.0; vocab],
        }
    }

    /// Runs the prompt through the draft's cache, so that its first proposal only feeds one token.
    fn prefill(&mut self, prompt: &[u32]) -> Result<()> {
        self.session.truncate(0);
        self.fed.clear();
        self.session.forward(prompt, Want::Nothing)?;
        self.fed.extend_from_slice(prompt);
        Ok(())
    }

    /// Up to `k` tokens to follow `context`, each with the distribution it was drawn from.
    fn propose(
        &mut self,
        context: &[u32],
        k: usize,
        tokens: &mut Vec<u32>,
        probs: &mut Vec<Vec<(u32, f32)>>,
    ) -> Result<()> {
        // Keep what the cache shares with the context; feed the rest.
        let common = self
            .fed
            .iter()
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count()
            // The last context token is fed again so that its logits come out.
            .min(context.len() - 1);
        self.session.truncate(common);
        self.fed.truncate(common);
        let room = self.session.max_seq() - common;
        ensure!(
            context.len() - common <= room,
            "the draft model's context ({}) is full",
            self.session.max_seq()
        );
        let mut input = &context[common..];
        let mut next;
        for i in 0..k {
            self.session
                .forward(input, Want::LastLogits(&mut self.logits))?;
            self.fed.extend_from_slice(input);
            if probs.len() <= i {
                probs.push(Vec::new());
            }
            next = self
                .sampler
                .sample_with_probs(&mut self.logits, &self.fed, &mut probs[i])?;
            tokens.push(next);
            if self.session.kv_len() == self.session.max_seq() {
                break;
            }
            input = std::slice::from_ref(tokens.last().unwrap());
        }
        Ok(())
    }
}

/// Up to `k` tokens that followed the latest earlier occurrence of the longest of `context`'s
/// final n-grams (n from `NGRAM_MAX` down to `NGRAM_MIN`) that occurred before.
pub fn ngram_proposal(context: &[u32], k: usize, tokens: &mut Vec<u32>) {
    for n in (NGRAM_MIN..=NGRAM_MAX).rev() {
        if context.len() <= n {
            continue;
        }
        let tail = &context[context.len() - n..];
        // Latest first: the most recent occurrence predicts best.
        let start = (0..context.len() - n)
            .rev()
            .find(|&s| &context[s..s + n] == tail);
        if let Some(s) = start {
            let follow = &context[s + n..];
            tokens.extend_from_slice(&follow[..follow.len().min(k)]);
            return;
        }
    }
}

/// How speculation went.
#[derive(Debug, Default, Clone, Copy)]
pub struct DraftStats {
    pub proposed: usize,
    pub accepted: usize,
    /// Batched forward passes of the target after the prompt.
    pub target_passes: usize,
}

impl DraftStats {
    pub fn summary(&self) -> String {
        let share = |a: usize, b: usize| if b > 0 { a as f64 / b as f64 } else { 0.0 };
        format!(
            "draft: {} of {} proposed tokens accepted ({:.0}%), {:.2} tokens per target pass",
            self.accepted,
            self.proposed,
            100.0 * share(self.accepted, self.proposed),
            share(self.accepted + self.target_passes, self.target_passes)
        )
    }
}

/// `generate::generate` with `draft` proposing up to `draft_tokens` tokens per target pass (fewer
/// after rejections); the
/// same contract: the cache ends holding every token that was fed, the last token sampled is
/// reported but not fed, and the tokens reported are those `generate` would report without a
/// draft (the same ones when sampling is deterministic, the same distribution otherwise).
#[allow(clippy::too_many_arguments)]
pub fn generate_speculative(
    target: &mut dyn Session,
    draft: &mut Draft<'_>,
    draft_tokens: usize,
    sampler: &mut Sampler,
    new_tokens: &[u32],
    history: &mut Vec<u32>,
    max_tokens: usize,
    stop: &[u32],
    mut on_token: impl FnMut(u32) -> Result<bool>,
) -> Result<(Stats, Stop, DraftStats)> {
    let vocab = target.config().vocab_size;
    let mut stats = Stats {
        prompt_tokens: new_tokens.len(),
        ..Stats::default()
    };
    let mut spec = DraftStats::default();
    check_room(target, new_tokens.len())?;
    // Cache positions before `history` (none for `generate` and `chat`, which keep them equal).
    let offset = target.kv_len().saturating_sub(history.len());
    let mut rows = vec![0f32; (draft_tokens + 1) * vocab];
    let t0 = std::time::Instant::now();
    target.forward(new_tokens, Want::LastLogits(&mut rows[..vocab]))?;
    history.extend_from_slice(new_tokens);
    if let Draft::Model(m) = draft {
        m.prefill(history)?;
    }
    stats.prompt_secs = t0.elapsed().as_secs_f64();

    let t1 = std::time::Instant::now();
    let mut next = sampler.sample(&mut rows[..vocab], history)?;
    let (mut proposal, mut probs) = (Vec::new(), Vec::new());
    let mut length = draft_tokens;
    // Reports `token` as `generate` does, with `fed` tokens before it in the cache; says why
    // generation ends there, if it does.
    let max_seq = target.max_seq();
    let mut emit = |token: u32, fed: usize, stats: &mut Stats| -> Result<Option<Stop>> {
        if stop.contains(&token) {
            return Ok(Some(Stop::EndOfSequence));
        }
        stats.generated_tokens += 1;
        if !on_token(token)? {
            return Ok(Some(Stop::Interrupted));
        }
        if stats.generated_tokens == max_tokens {
            return Ok(Some(Stop::MaxTokens));
        }
        if offset + fed == max_seq {
            return Ok(Some(Stop::ContextFull));
        }
        Ok(None)
    };
    let why = 'gen: loop {
        if max_tokens == 0 {
            break Stop::MaxTokens;
        }
        if let Some(why) = emit(next, history.len(), &mut stats)? {
            break why;
        }
        history.push(next);
        // Room for `next` and the proposal, and no proposal past the last token asked for.
        let room = target.max_seq() - (offset + history.len());
        let k = length
            .min(room)
            .min(max_tokens - stats.generated_tokens - 1);
        proposal.clear();
        if k > 0 {
            match draft {
                Draft::Model(m) => m.propose(history, k, &mut proposal, &mut probs)?,
                Draft::Ngram => ngram_proposal(history, k, &mut proposal),
            }
        }
        // A draft with a larger vocabulary may propose what the target cannot take.
        let usable = proposal
            .iter()
            .take_while(|t| (**t as usize) < vocab)
            .count();
        proposal.truncate(usable);
        spec.proposed += proposal.len();
        spec.target_passes += 1;

        let input: Vec<u32> = std::iter::once(next)
            .chain(proposal.iter().copied())
            .collect();
        let rows = &mut rows[..input.len() * vocab];
        target.forward(&input, Want::AllLogits(rows))?;
        let first = history.len();
        let mut replacement = None;
        for (i, &d) in proposal.iter().enumerate() {
            let row = &mut rows[i * vocab..(i + 1) * vocab];
            let verdict = match draft {
                Draft::Model(_) => sampler.verify(row, history, d, &probs[i])?,
                Draft::Ngram => sampler.verify(row, history, d, &[(d, 1.0)])?,
            };
            match verdict {
                Verdict::Accepted => history.push(d),
                Verdict::Rejected(t) => {
                    replacement = Some(t);
                    break;
                }
            }
        }
        let accepted = history.len() - first;
        spec.accepted += accepted;
        // Hugging Face's schedule for the proposal length: longer while every proposal stands,
        // shorter after each rejection, so that a draft that is mostly wrong costs little.
        length = if accepted == proposal.len() && !proposal.is_empty() {
            (length + 2).min(draft_tokens)
        } else if !proposal.is_empty() {
            (length - 1).max(1)
        } else {
            length
        };
        // Report the accepted draft tokens; each is in the cache already.
        for j in 0..accepted {
            if let Some(why) = emit(history[first + j], first + j, &mut stats)? {
                history.truncate(first + j);
                target.truncate(offset + history.len());
                break 'gen why;
            }
        }
        target.truncate(offset + history.len());
        // Every draft token stood: the target's own token after the last comes free.
        next = match replacement {
            Some(t) => t,
            None => sampler.sample(&mut rows[accepted * vocab..(accepted + 1) * vocab], history)?,
        };
    };
    stats.generate_secs = t1.elapsed().as_secs_f64();
    Ok((stats, why, spec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_lookup_takes_the_longest_latest_match() {
        let mut out = Vec::new();
        // "1 2 3" occurred before, followed by 4 5; the later "2 3 9" loses to the longer match.
        ngram_proposal(&[1, 2, 3, 4, 5, 2, 3, 9, 1, 2, 3], 2, &mut out);
        assert_eq!(out, [4, 5]);
        out.clear();
        // Only the last two tokens recur: their latest earlier occurrence counts.
        ngram_proposal(&[7, 1, 7, 1, 2, 8, 7, 1], 3, &mut out);
        assert_eq!(out, [2, 8, 7]);
        out.clear();
        // One recurring token is not enough.
        ngram_proposal(&[7, 1, 2, 7], 3, &mut out);
        assert!(out.is_empty());
        ngram_proposal(&[1, 2, 3], 4, &mut out);
        assert!(out.is_empty());
    }
}
