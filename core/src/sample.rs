//! Choosing the next token from logits: greedy, temperature, top-k, top-p, min-p and a
//! repetition penalty, applied in llama.cpp's order (penalty, top-k, top-p, min-p, temperature),
//! with a seeded RNG so that a seed reproduces a run exactly.
use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::error::{Error, Result};

/// How tokens are chosen from the logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerConfig {
    /// 0 means greedy.
    pub temperature: f32,
    /// Keep the `k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `p`; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 keeps all.
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of recently seen tokens; 1 is off.
    pub repeat_penalty: f32,
    /// Subtract this times a token's count among the recent tokens from its logit (OpenAI's
    /// `frequency_penalty`); 0 is off.
    pub frequency_penalty: f32,
    /// Subtract this from the logit of every token among the recent ones (OpenAI's
    /// `presence_penalty`); 0 is off.
    pub presence_penalty: f32,
    /// How many of the latest tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Keep the tokens whose logits are within `top_n_sigma` standard deviations (of the
    /// logits) of the largest; 0 or less keeps all (llama.cpp's `--top-nsigma`).
    pub top_n_sigma: f32,
    /// Locally typical sampling: keep the tokens whose surprise is closest to the
    /// distribution's entropy, up to this much probability; 1 keeps all.
    pub typical_p: f32,
    /// Exclude top choices (XTC): with this probability a draw drops every token at least
    /// `xtc_threshold` likely but the least likely of them; 0 is off.
    pub xtc_probability: f32,
    /// XTC's threshold; above 0.5 no two tokens reach it, so nothing is dropped.
    pub xtc_threshold: f32,
    /// DRY ("don't repeat yourself", llama.cpp's): a token that would extend a repetition of
    /// `dry_allowed_length` tokens or more has `dry_multiplier · dry_base^(length − allowed)`
    /// taken off its logit; 0 is off.
    pub dry_multiplier: f32,
    /// DRY's base, at least 1.
    pub dry_base: f32,
    /// The longest repetition DRY lets go unpenalized.
    pub dry_allowed_length: usize,
    /// How many of the latest tokens DRY looks at (`usize::MAX`: all, up to the vocabulary's
    /// size, as many as the candidates' buffer holds); 0 is off.
    pub dry_penalty_last_n: usize,
    /// Mirostat (1 or 2, llama.cpp's `--mirostat`; 0 is off): each draw keeps the tokens
    /// whose surprise stays under a target it adapts so the text's surprise tracks
    /// `mirostat_tau` (learning rate `mirostat_eta`). As in llama.cpp it replaces every other
    /// filter and the penalties: temperature, then mirostat.
    pub mirostat: u8,
    /// Mirostat's target surprise, in bits.
    pub mirostat_tau: f32,
    /// Mirostat's learning rate.
    pub mirostat_eta: f32,
    /// Seeds the random draws: the same seed and logits give the same tokens.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            repeat_last_n: 64,
            top_n_sigma: 0.0,
            typical_p: 1.0,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            dry_multiplier: 0.0,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_penalty_last_n: usize::MAX,
            mirostat: 0,
            mirostat_tau: 5.0,
            mirostat_eta: 0.1,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Always the most likely token.
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Rejects parameters out of their range.
    ///
    /// # Errors
    /// [`Error::InvalidSampling`] naming the first such parameter.
    pub fn validate(&self) -> Result<()> {
        let bad = |field, reason| Err(Error::InvalidSampling { field, reason });
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad("temperature", "must be finite and >= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", "must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", "must be in [0, 1]");
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return bad("repeat_penalty", "must be finite and > 0");
        }
        if !self.frequency_penalty.is_finite() {
            return bad("frequency_penalty", "must be finite");
        }
        if !self.presence_penalty.is_finite() {
            return bad("presence_penalty", "must be finite");
        }
        if !self.top_n_sigma.is_finite() {
            return bad("top_n_sigma", "must be finite");
        }
        if !(self.typical_p > 0.0 && self.typical_p <= 1.0) {
            return bad("typical_p", "must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.xtc_probability) {
            return bad("xtc_probability", "must be in [0, 1]");
        }
        if !(0.0..=1.0).contains(&self.xtc_threshold) {
            return bad("xtc_threshold", "must be in [0, 1]");
        }
        if !(self.dry_multiplier.is_finite() && self.dry_multiplier >= 0.0) {
            return bad("dry_multiplier", "must be finite and >= 0");
        }
        if !(self.dry_base.is_finite() && self.dry_base >= 1.0) {
            return bad("dry_base", "must be finite and >= 1");
        }
        if self.mirostat > 2 {
            return bad("mirostat", "must be 0, 1 or 2");
        }
        if !(self.mirostat_tau.is_finite() && self.mirostat_tau >= 0.0) {
            return bad("mirostat_tau", "must be finite and >= 0");
        }
        if !(self.mirostat_eta.is_finite() && self.mirostat_eta >= 0.0) {
            return bad("mirostat_eta", "must be finite and >= 0");
        }
        Ok(())
    }

    /// Whether every choice is the most likely token (temperature 0; top-k 1 unless mirostat,
    /// which ignores top-k).
    fn picks_the_likeliest(&self) -> bool {
        self.temperature == 0.0 || (self.mirostat == 0 && self.top_k == 1)
    }

    /// Whether any penalty changes the logits (mirostat takes them as they are).
    fn penalizes(&self) -> bool {
        (self.mirostat == 0 && self.classic_penalties()) || self.dry()
    }

    /// Whether the repetition, frequency or presence penalty is on.
    fn classic_penalties(&self) -> bool {
        self.repeat_penalty != 1.0 || self.frequency_penalty != 0.0 || self.presence_penalty != 0.0
    }

    /// Whether DRY is on (never under mirostat).
    fn dry(&self) -> bool {
        self.mirostat == 0 && self.dry_multiplier > 0.0 && self.dry_penalty_last_n > 0
    }
}

/// xoshiro256** seeded through splitmix64: small, fast, and the same on every platform.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    /// Uniform in [0, 1).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// One candidate token: its id, and its logit (later its probability).
pub type Candidate = (u32, f32);

/// Picks tokens from logits. Sampling (anything but greedy) sorts the vocabulary's tokens in a
/// buffer of one [`Candidate`] per token: grown on first use by [`Sampler::new`], or caller memory
/// with [`Sampler::in_memory`] (firmware, no allocator).
pub struct Sampler<'c> {
    config: SamplerConfig,
    rng: Rng,
    candidates: Candidates<'c>,
    /// DRY's sequence breakers (none unless given).
    breakers: Option<Arc<SequenceBreakers>>,
    /// Mirostat's surprise target, adapted after each draw.
    mu: f32,
    /// How many candidates the last draw kept.
    kept: usize,
}

/// Where the sampler keeps its candidates.
enum Candidates<'c> {
    Owned(Vec<Candidate>),
    Borrowed(&'c mut [Candidate]),
}

impl Candidates<'_> {
    /// Room for `n` candidates.
    fn room(&mut self, n: usize) -> Result<&mut [Candidate]> {
        match self {
            Candidates::Owned(v) => {
                if v.len() < n {
                    v.resize(n, (0, 0.0));
                }
                Ok(&mut v[..n])
            }
            Candidates::Borrowed(b) => {
                let got = core::mem::size_of_val(*b);
                b.get_mut(..n).ok_or(Error::ArenaTooSmall {
                    what: "sampler candidates",
                    needed: n * size_of::<Candidate>(),
                    got,
                })
            }
        }
    }

    fn get(&self, n: usize) -> &[Candidate] {
        match self {
            Candidates::Owned(v) => &v[..n],
            Candidates::Borrowed(b) => &b[..n],
        }
    }
}

impl Sampler<'static> {
    /// A sampler that allocates its candidate buffer (one [`Candidate`] per vocabulary entry) the
    /// first time it samples.
    ///
    /// # Errors
    /// [`Error::InvalidSampling`] naming a parameter out of its range.
    pub fn new(config: SamplerConfig) -> Result<Self> {
        Self::with_candidates(config, Candidates::Owned(Vec::new()))
    }
}

impl<'c> Sampler<'c> {
    /// A sampler that keeps its candidates in `buf`, which needs
    /// [`Sampler::candidates_needed`]`(vocab_size)` entries unless sampling is greedy without
    /// DRY (greedy decoding never touches it otherwise; an empty slice will do). Allocates
    /// nothing.
    ///
    /// # Errors
    /// [`Error::InvalidSampling`] naming a parameter out of its range.
    pub fn in_memory(config: SamplerConfig, buf: &'c mut [Candidate]) -> Result<Self> {
        Self::with_candidates(config, Candidates::Borrowed(buf))
    }

    /// Candidates `in_memory` needs for a vocabulary of `vocab_size` tokens.
    pub const fn candidates_needed(vocab_size: usize) -> usize {
        vocab_size
    }

    fn with_candidates(config: SamplerConfig, candidates: Candidates<'c>) -> Result<Self> {
        config.validate()?;
        Ok(Sampler {
            rng: Rng::new(config.seed),
            config,
            candidates,
            breakers: None,
            mu: 2.0 * config.mirostat_tau,
            kept: 0,
        })
    }

    /// The sampler with DRY's sequence breakers: a repetition that crosses one does not count
    /// on past it.
    pub fn with_sequence_breakers(mut self, breakers: Arc<SequenceBreakers>) -> Self {
        self.breakers = Some(breakers);
        self
    }

    /// A fresh sampler of the same configuration and sequence breakers, drawing from `seed`:
    /// a draft model's, whose proposals should follow the target's distribution.
    ///
    /// # Errors
    /// None in practice (the configuration was checked already); as [`Sampler::new`].
    pub fn reseeded(&self, seed: u64) -> Result<Sampler<'static>> {
        let mut sampler = Sampler::new(SamplerConfig {
            seed,
            ..self.config
        })?;
        sampler.breakers = self.breakers.clone();
        Ok(sampler)
    }

    /// Its configuration.
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Whether every choice is the argmax of the raw logits (greedy, no penalty): a backend can
    /// then pick the token itself (`Want::LastArgmax`) without handing over the logits.
    pub fn is_argmax(&self) -> bool {
        let c = &self.config;
        c.picks_the_likeliest() && !c.penalizes()
    }

    /// Whether every choice is a function of the logits alone (greedy or top-k 1): no random
    /// draw, so a draft token is right exactly when it is that choice.
    pub fn is_deterministic(&self) -> bool {
        self.config.picks_the_likeliest()
    }

    /// The next token given `logits` and the tokens so far (for the repetition penalty).
    /// `logits` is modified by the penalty.
    ///
    /// # Errors
    /// [`Error::ArenaTooSmall`] if the caller's candidate buffer (`in_memory`) holds fewer
    /// entries than `logits` when sampling is not greedy.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> Result<u32> {
        match self.filter(logits, history)? {
            Choice::Token(t) => Ok(t),
            Choice::Candidates => {
                let u = self.rng.next_f32();
                let kept = self.kept();
                let token = draw(kept, u);
                let c = &self.config;
                if c.mirostat != 0 {
                    // The target moves against the surprise the draw had.
                    let p = kept.iter().find(|k| k.0 == token).map_or(1.0, |k| k.1);
                    self.mu -= c.mirostat_eta * (-libm::log2f(p) - c.mirostat_tau);
                }
                Ok(token)
            }
        }
    }

    /// As `sample`, and `probs` ← the distribution the token was drawn from, as (token,
    /// probability) pairs, most likely first (one pair of probability 1 when deterministic): what
    /// a draft hands to `verify`.
    ///
    /// # Errors
    /// As `sample`.
    pub fn sample_with_probs(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        probs: &mut Vec<Candidate>,
    ) -> Result<u32> {
        let t = self.sample(logits, history)?;
        probs.clear();
        if self.is_deterministic() {
            probs.push((t, 1.0));
        } else {
            probs.extend_from_slice(self.kept());
        }
        Ok(t)
    }

    /// Speculative sampling's check of one draft token: `logits` are the target's at the
    /// draft's position, `draft_probs` the distribution the draft drew `draft` from
    /// (`sample_with_probs`; a deterministic draft, such as an n-gram lookup, passes
    /// `[(draft, 1.0)]`). Deterministic sampling accepts exactly the token `sample` would
    /// choose. Otherwise the draft is accepted with probability min(1, p(draft) / q(draft)), and
    /// a rejection draws from max(0, p − q) renormalized, so the token that comes out is
    /// distributed as the target's own `sample` (Leviathan et al., 2023).
    ///
    /// # Errors
    /// As `sample`.
    pub fn verify(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        draft: u32,
        draft_probs: &[Candidate],
    ) -> Result<Verdict> {
        if self.config.mirostat != 0 && !self.config.picks_the_likeliest() {
            return Err(Error::InvalidSampling {
                field: "mirostat",
                reason: "adapts with each token drawn, which speculative verification does not do",
            });
        }
        match self.filter(logits, history)? {
            Choice::Token(t) if t == draft => return Ok(Verdict::Accepted),
            Choice::Token(t) => return Ok(Verdict::Rejected(t)),
            Choice::Candidates => {}
        }
        let kept = self.kept;
        let p = self.candidates.room(kept)?;
        let prob_of = |dist: &[Candidate], t: u32| {
            dist.iter()
                .find(|(id, _)| *id == t)
                .map_or(0.0, |(_, p)| *p)
        };
        let (p_draft, q_draft) = (prob_of(p, draft), prob_of(draft_probs, draft));
        let u = self.rng.next_f32();
        if u * q_draft < p_draft {
            return Ok(Verdict::Accepted);
        }
        let u = self.rng.next_f32();
        let mut residual_sum = 0.0;
        for (t, prob) in p.iter_mut() {
            *prob = (*prob - prob_of(draft_probs, *t)).max(0.0);
            residual_sum += *prob;
        }
        if residual_sum <= 0.0 {
            // p ≤ q everywhere means p = q (up to rounding), so acceptance was certain; rounding
            // got here. Any token of p is then a draw from p.
            return Ok(Verdict::Rejected(p[0].0));
        }
        p.iter_mut().for_each(|(_, prob)| *prob /= residual_sum);
        Ok(Verdict::Rejected(draw(p, u)))
    }

    /// The candidates the last draw kept, most likely first.
    fn kept(&self) -> &[Candidate] {
        self.candidates.get(self.kept)
    }

    /// Applies the repetition penalty to `logits`, then (unless the choice is deterministic)
    /// fills the candidates with the surviving tokens and their probabilities, most likely
    /// first. The filters run in llama.cpp's order: penalties, DRY, top-n-sigma, top-k,
    /// typical, top-p, min-p, XTC, temperature.
    fn filter(&mut self, logits: &mut [f32], history: &[u32]) -> Result<Choice> {
        let c = &self.config;
        if c.mirostat == 0 && c.classic_penalties() {
            apply_penalties(c, logits, history);
        }
        if c.dry() {
            let scratch = self.candidates.room(logits.len())?;
            apply_dry(c, self.breakers.as_deref(), logits, history, scratch);
        }
        if c.picks_the_likeliest() {
            return Ok(Choice::Token(argmax(logits)));
        }
        let room = self.candidates.room(logits.len())?;
        let mut n = 0;
        for (i, l) in logits.iter().enumerate() {
            if !l.is_nan() {
                room[n] = (i as u32, *l);
                n += 1;
            }
        }
        if n == 0 {
            return Ok(Choice::Token(0));
        }
        if c.mirostat != 0 {
            self.kept = mirostat(&mut room[..n], c, self.mu, logits.len());
            return Ok(Choice::Candidates);
        }
        if c.top_n_sigma > 0.0 {
            n = top_n_sigma(&mut room[..n], c.top_n_sigma);
        }
        // Most likely first; ties keep the lower id first, so runs are reproducible.
        let by_logit = |a: &Candidate, b: &Candidate| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if c.top_k > 0 && c.top_k < n {
            room[..n].select_nth_unstable_by(c.top_k - 1, by_logit);
            n = c.top_k;
        }
        let cand = &mut room[..n];
        cand.sort_unstable_by(by_logit);
        softmax_in_place(cand, 1.0);
        if c.typical_p < 1.0 {
            n = typical(cand, c.typical_p);
        }
        if c.top_p < 1.0 {
            let mut sum = 0.0;
            for (i, (_, p)) in cand[..n].iter().enumerate() {
                sum += p;
                if sum >= c.top_p {
                    n = i + 1;
                    break;
                }
            }
        }
        if c.min_p > 0.0 {
            let threshold = cand[0].1 * c.min_p;
            n = cand[..n]
                .iter()
                .take_while(|(_, p)| *p >= threshold)
                .count()
                .max(1);
        }
        let mut cand = &mut cand[..n];
        if c.xtc_probability > 0.0 && c.xtc_threshold <= 0.5 && n > 1 {
            let u = self.rng.next_f32();
            if u < c.xtc_probability {
                let dropped = xtc_dropped(cand, c.xtc_threshold);
                cand.copy_within(dropped.., 0);
                n -= dropped;
                cand = &mut cand[..n];
            }
        }
        // Temperature rescales the survivors' logits: p^(1/T), renormalized.
        for (_, p) in cand.iter_mut() {
            *p = libm::logf(*p);
        }
        softmax_in_place(cand, c.temperature);
        self.kept = n;
        Ok(Choice::Candidates)
    }
}

/// Mirostat's draw set, as llama.cpp's: `cand`'s logits at the temperature, softmaxed, most
/// likely first; version 2 keeps the tokens whose surprise (`-log2 p`) is at most `mu`, version
/// 1 the top k its Zipf estimate over the 100 likeliest gives for `mu` in a vocabulary of
/// `n_vocab`. At least one; renormalized. Returns how many.
fn mirostat(cand: &mut [Candidate], c: &SamplerConfig, mu: f32, n_vocab: usize) -> usize {
    cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    softmax_in_place(cand, c.temperature);
    let n = if c.mirostat == 2 {
        cand.iter().take_while(|k| -libm::log2f(k.1) <= mu).count()
    } else {
        const M: usize = 100;
        let (mut sum_tb, mut sum_tt) = (0.0f32, 0.0f32);
        for i in 0..(M - 1).min(cand.len() - 1) {
            let t = libm::logf((i + 2) as f32 / (i + 1) as f32);
            let b = libm::logf(cand[i].1 / cand[i + 1].1);
            sum_tb += t * b;
            sum_tt += t * t;
        }
        let s_hat = sum_tb / sum_tt;
        let epsilon = s_hat - 1.0;
        let k = libm::powf(
            epsilon * libm::powf(2.0, mu) / (1.0 - libm::powf(n_vocab as f32, -epsilon)),
            1.0 / s_hat,
        );
        match k {
            k if k.is_nan() => 1,
            k if k >= cand.len() as f32 => cand.len(),
            k => k as usize,
        }
    };
    let n = n.clamp(1, cand.len());
    let kept = &mut cand[..n];
    let total: f32 = kept.iter().map(|k| k.1).sum();
    kept.iter_mut().for_each(|k| k.1 /= total);
    n
}

/// Keeps (first, in place) the candidates whose logits are within `n` standard deviations of
/// the largest, the mean and deviation taken over the finite logits (llama.cpp's top-n-sigma);
/// returns how many.
fn top_n_sigma(cand: &mut [Candidate], n: f32) -> usize {
    let finite = || cand.iter().map(|c| c.1).filter(|l| l.is_finite());
    let count = finite().count();
    if count == 0 {
        return cand.len();
    }
    let max = finite().fold(f32::NEG_INFINITY, f32::max);
    let mean = finite().sum::<f32>() / count as f32;
    let variance = finite().map(|l| (l - mean) * (l - mean)).sum::<f32>() / count as f32;
    let floor = max - n * libm::sqrtf(variance);
    let mut kept = 0;
    for i in 0..cand.len() {
        if cand[i].1 >= floor {
            cand.swap(kept, i);
            kept += 1;
        }
    }
    kept
}

/// Locally typical sampling (Meister et al., 2022) on `cand` (probabilities, most likely
/// first): the candidates whose surprise `-ln p` is closest to the entropy, in that order,
/// until their probability passes `p`; they are put first, most likely first again, and
/// renormalized. Returns how many.
fn typical(cand: &mut [Candidate], p: f32) -> usize {
    let entropy: f32 = cand
        .iter()
        .filter(|c| c.1 > 0.0)
        .map(|c| -c.1 * libm::logf(c.1))
        .sum();
    let distance = |c: &Candidate| libm::fabsf(-libm::logf(c.1) - entropy);
    cand.sort_unstable_by(|a, b| distance(a).total_cmp(&distance(b)).then(a.0.cmp(&b.0)));
    let mut sum = 0.0;
    let mut n = cand.len();
    for (i, c) in cand.iter().enumerate() {
        sum += c.1;
        if sum > p {
            n = i + 1;
            break;
        }
    }
    let kept = &mut cand[..n];
    kept.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let total: f32 = kept.iter().map(|c| c.1).sum();
    kept.iter_mut().for_each(|c| c.1 /= total);
    n
}

/// How many of `cand`'s first candidates (most likely first) XTC drops: every one at least
/// `threshold` likely (among `cand`, renormalized) but the last of them.
fn xtc_dropped(cand: &[Candidate], threshold: f32) -> usize {
    let total: f32 = cand.iter().map(|c| c.1).sum();
    let above = cand.iter().take_while(|c| c.1 / total >= threshold).count();
    above.saturating_sub(1)
}

/// What `Sampler::verify` decided about a draft token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The draft token stands.
    Accepted,
    /// The draft token is replaced by this one, and every draft token after it is void.
    Rejected(u32),
}

/// The outcome of `filter`.
enum Choice {
    /// The token is decided (greedy, top-k 1, or nothing to choose from).
    Token(u32),
    /// The candidates hold the distribution to draw from.
    Candidates,
}

/// For each distinct token among the last `repeat_last_n` of `history`, as llama.cpp orders
/// them: divides its logit by `repeat_penalty` if positive (multiplies if not), then subtracts
/// `frequency_penalty` times its count and `presence_penalty`. Quadratic in the window (no
/// memory to count in); the window is short.
fn apply_penalties(c: &SamplerConfig, logits: &mut [f32], history: &[u32]) {
    let start = history.len().saturating_sub(c.repeat_last_n);
    let recent = &history[start..];
    for (i, &t) in recent.iter().enumerate() {
        // Each distinct token once, at its first place in the window.
        if recent[..i].contains(&t) {
            continue;
        }
        if let Some(l) = logits.get_mut(t as usize) {
            *l = if *l > 0.0 {
                *l / c.repeat_penalty
            } else {
                *l * c.repeat_penalty
            };
            let count = recent[i..].iter().filter(|&&u| u == t).count();
            *l -= count as f32 * c.frequency_penalty + c.presence_penalty;
        }
    }
}

/// DRY's sequence breakers, as token sequences: a head token (whose text holds a breaker, or
/// ends with its start) and the tokens of the rest of the breaker's text (none when the head
/// holds it all), as llama.cpp works them out from a vocabulary.
#[derive(Debug, Default)]
pub struct SequenceBreakers {
    /// (head, tail), sorted.
    sequences: Vec<(u32, Vec<u32>)>,
}

impl SequenceBreakers {
    /// Breakers of these (head, tail) sequences.
    pub fn new(mut sequences: Vec<(u32, Vec<u32>)>) -> Self {
        sequences.sort_unstable();
        sequences.dedup();
        SequenceBreakers { sequences }
    }

    /// The tails of the breakers whose head is `token`.
    fn tails(&self, token: u32) -> impl Iterator<Item = &[u32]> {
        let from = self.sequences.partition_point(|(h, _)| *h < token);
        let to = self.sequences.partition_point(|(h, _)| *h <= token);
        self.sequences[from..to].iter().map(|(_, t)| t.as_slice())
    }
}

/// DRY, as llama.cpp applies it: among the last `dry_penalty_last_n` tokens of `history`
/// (at most `scratch`'s length), each earlier place whose tokens up to it repeat the text's
/// last ones (no further back than the latest sequence breaker) makes the token that followed it
/// there a repetition's next token; the longest repetition each such token would extend, if
/// `dry_allowed_length` or more, takes `dry_multiplier · dry_base^(length − allowed)` off its
/// logit (the exponent clamped where the power would overflow), unless the token is a breaker
/// itself. `scratch` holds the (token, length) pairs.
fn apply_dry(
    c: &SamplerConfig,
    breakers: Option<&SequenceBreakers>,
    logits: &mut [f32],
    history: &[u32],
    scratch: &mut [Candidate],
) {
    let n = history.len().min(c.dry_penalty_last_n).min(scratch.len());
    let h = &history[history.len() - n..];
    // A repetition reaches back no further than the latest breaker's end.
    let mut rep_limit = n;
    if let Some(breakers) = breakers {
        for i in 0..n {
            let longest = breakers
                .tails(h[n - 1 - i])
                .filter(|tail| tail.len() <= i && tail.iter().zip(&h[n - i..]).all(|(a, b)| a == b))
                .map(<[u32]>::len)
                .max();
            if let Some(longest) = longest {
                rep_limit = i - longest;
                break;
            }
        }
    }
    if rep_limit < c.dry_allowed_length || n < 2 {
        return;
    }
    const FLOAT_MAX_LOG: f32 = 88.722_84;
    let max_exponent = if c.dry_base > 1.000_001 {
        (FLOAT_MAX_LOG / libm::logf(c.dry_base)) as usize
    } else {
        0
    };
    // Longer repetitions than this take the clamped penalty all the same.
    let cap = rep_limit.min(c.dry_allowed_length.saturating_add(max_exponent));
    let mut found = 0;
    for p in 0..n - 1 {
        let limit = cap.min(p + 1);
        let length = (0..limit).take_while(|&k| h[p - k] == h[n - 1 - k]).count();
        if length >= c.dry_allowed_length {
            scratch[found] = (h[p + 1], length as f32);
            found += 1;
        }
    }
    let found = &mut scratch[..found];
    // Each token's longest first.
    found.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.total_cmp(&a.1)));
    let mut previous = None;
    for &(token, length) in found.iter() {
        if previous == Some(token) {
            continue;
        }
        previous = Some(token);
        let single_breaker = breakers.is_some_and(|b| b.tails(token).any(|t| t.is_empty()));
        let Some(logit) = logits.get_mut(token as usize) else {
            continue;
        };
        if single_breaker {
            continue;
        }
        let mut exponent = length as usize - c.dry_allowed_length;
        if max_exponent > 0 {
            exponent = exponent.min(max_exponent);
        }
        *logit -= c.dry_multiplier * libm::powf(c.dry_base, exponent as f32);
    }
}

/// The token of `dist` (probabilities summing to 1) that the uniform draw `u` lands on.
fn draw(dist: &[Candidate], u: f32) -> u32 {
    let mut acc = 0.0;
    for &(t, p) in dist {
        acc += p;
        if u < acc {
            return t;
        }
    }
    dist[dist.len() - 1].0
}

/// Candidates' values (logits, sorted descending) -> probabilities of `value / temperature`.
fn softmax_in_place(cand: &mut [Candidate], temperature: f32) {
    let max = cand[0].1;
    let mut sum = 0.0;
    for (_, v) in cand.iter_mut() {
        *v = libm::expf((*v - max) / temperature);
        sum += *v;
    }
    for (_, v) in cand.iter_mut() {
        *v /= sum;
    }
}

/// The index of the largest logit (the lowest index on ties; NaN never wins, and a NaN first
/// logit is never beaten, as with `>` compared one by one).
///
/// A chunk's largest value in sixteen running maxima (vector lanes), then its first index only
/// where that chunk of 256 beats the best so far: a vocabulary's worth at vector speed, not one
/// dependent comparison per logit (a decode step of eight sequences takes eight of these on the
/// thread the others wait for).
pub fn argmax(logits: &[f32]) -> u32 {
    const LANES: usize = 16;
    const CHUNK: usize = 16 * LANES;
    let Some(&first) = logits.first() else {
        return 0;
    };
    let (mut best, mut best_value) = (0, first);
    for (c, chunk) in logits.chunks(CHUNK).enumerate() {
        let mut lanes = [f32::NEG_INFINITY; LANES];
        let (parts, rest) = chunk.as_chunks::<LANES>();
        for part in parts {
            keep_larger(&mut lanes, part);
        }
        keep_larger(&mut lanes, rest);
        let top = lanes
            .iter()
            .fold(f32::NEG_INFINITY, |m, v| if *v > m { *v } else { m });
        if top > best_value {
            best_value = top;
            best = c * CHUNK + chunk.iter().position(|v| *v == top).unwrap_or(0);
        }
    }
    best as u32
}

/// Log-probabilities of the model's own distribution: the softmax of the logits as they come
/// from the model, before penalties, biases or temperature (what OpenAI's `logprobs` report).
#[derive(Debug, Clone, Copy)]
pub struct LogSoftmax {
    /// The largest logit plus the log of the sum of `exp(logit - max)`.
    log_norm: f32,
}

impl LogSoftmax {
    /// The largest logit is subtracted first, so no term overflows; the terms are added in
    /// f64, so a vocabulary of any size loses nothing to rounding.
    pub fn of(logits: &[f32]) -> Self {
        let max = logits.get(argmax(logits) as usize).copied().unwrap_or(0.0);
        let sum: f64 = logits.iter().map(|&l| f64::from(libm::expf(l - max))).sum();
        LogSoftmax {
            log_norm: max + libm::log(sum) as f32,
        }
    }

    /// The log-probability of a token whose logit is `logit`.
    pub fn log_prob(&self, logit: f32) -> f32 {
        logit - self.log_norm
    }
}

/// The ids of the `n` largest logits, largest first (the lower id first on ties; NaN never
/// counts as large), into `out`.
pub fn top_ids(logits: &[f32], n: usize, out: &mut Vec<u32>) {
    out.clear();
    if n == 0 {
        return;
    }
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() || (out.len() == n && l <= logits[out[n - 1] as usize]) {
            continue;
        }
        // Insert after every kept id whose logit is at least `l`: ties keep the lower id first.
        let at = out.partition_point(|&t| logits[t as usize] >= l);
        if out.len() == n {
            out.pop();
        }
        out.insert(at, i as u32);
    }
}

/// `lanes[i] = values[i]` where that is larger (`>`: NaN never is).
#[inline(always)]
fn keep_larger(lanes: &mut [f32], values: &[f32]) {
    for (l, v) in lanes.iter_mut().zip(values) {
        if *v > *l {
            *l = *v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use proptest::prelude::*;

    /// `argmax` as its contract reads: one comparison per logit.
    fn argmax_one_by_one(logits: &[f32]) -> u32 {
        let mut best = 0;
        for (i, l) in logits.iter().enumerate() {
            if *l > logits[best] {
                best = i;
            }
        }
        best as u32
    }

    proptest! {
        #[test]
        #[cfg_attr(miri, ignore = "too slow under Miri; run natively")]
        fn argmax_is_the_first_largest(
            l in proptest::collection::vec(
                prop_oneof![
                    4 => -3i32..3,
                    1 => Just(100),
                    1 => Just(101),
                    1 => Just(102),
                    1 => Just(103),
                ],
                0..700,
            )
        ) {
            // Few distinct values (ties everywhere), the special ones (100 NaN, 101 -inf,
            // 102 +inf, 103 -0.0), and lengths across several chunks of 256.
            let l: Vec<f32> = l
                .iter()
                .map(|&v| match v {
                    100 => f32::NAN,
                    101 => f32::NEG_INFINITY,
                    102 => f32::INFINITY,
                    103 => -0.0,
                    v => v as f32,
                })
                .collect();
            prop_assert_eq!(argmax(&l), argmax_one_by_one(&l));
        }

        #[test]
        #[cfg_attr(miri, ignore = "too slow under Miri; run natively")]
        fn argmax_finds_the_largest_anywhere(
            l in proptest::collection::vec(-1e4f32..1e4, 0..700)
        ) {
            prop_assert_eq!(argmax(&l), argmax_one_by_one(&l));
        }
    }

    fn logits() -> impl Strategy<Value = Vec<f32>> {
        proptest::collection::vec(-20f32..20.0, 2..200)
    }

    fn probs(l: &[f32]) -> Vec<f32> {
        let max = l.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
        let e: Vec<f32> = l.iter().map(|v| libm::expf(v - max)).collect();
        let s: f32 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    }

    proptest! {
        #[test]
        fn top_k_1_is_greedy(l in logits(), seed in any::<u64>(), t in 0.1f32..3.0) {
            let mut s = Sampler::new(SamplerConfig { temperature: t, top_k: 1, top_p: 1.0, min_p: 0.0, seed, ..SamplerConfig::default() }).unwrap();
            prop_assert_eq!(s.sample(&mut l.clone(), &[]).unwrap(), argmax(&l));
        }

        #[test]
        #[cfg_attr(miri, ignore = "too slow under Miri; run natively")]
        fn same_seed_same_tokens(l in logits(), seed in any::<u64>()) {
            let c = SamplerConfig { seed, top_k: 0, ..SamplerConfig::default() };
            let (mut a, mut b) = (Sampler::new(c).unwrap(), Sampler::new(c).unwrap());
            for _ in 0..20 {
                prop_assert_eq!(a.sample(&mut l.clone(), &[]).unwrap(), b.sample(&mut l.clone(), &[]).unwrap());
            }
        }

        /// The token always comes from the smallest most-likely set whose mass reaches top_p.
        #[test]
        fn top_p_stays_in_the_nucleus(l in logits(), seed in any::<u64>(), p in 0.05f32..1.0) {
            let mut s = Sampler::new(SamplerConfig { temperature: 1.0, top_k: 0, top_p: p, min_p: 0.0, seed, ..SamplerConfig::default() }).unwrap();
            let pr = probs(&l);
            let mut order: Vec<usize> = (0..l.len()).collect();
            order.sort_by(|a, b| l[*b].total_cmp(&l[*a]).then(a.cmp(b)));
            for _ in 0..10 {
                let t = s.sample(&mut l.clone(), &[]).unwrap() as usize;
                let rank = order.iter().position(|&i| i == t).unwrap();
                let mass_before: f32 = order[..rank].iter().map(|&i| pr[i]).sum();
                // Everything ranked above `t` did not yet reach p (with float slack).
                prop_assert!(mass_before < p + 1e-4, "rank {} mass {} p {}", rank, mass_before, p);
            }
        }

        /// The token is never less likely than min_p times the most likely one.
        #[test]
        #[cfg_attr(miri, ignore = "too slow under Miri; run natively")]
        fn min_p_never_picks_an_unlikely_token(l in logits(), seed in any::<u64>(), m in 0.01f32..1.0) {
            let mut s = Sampler::new(SamplerConfig { temperature: 1.5, top_k: 0, top_p: 1.0, min_p: m, seed, ..SamplerConfig::default() }).unwrap();
            let pr = probs(&l);
            let best = pr.iter().fold(0f32, |a, b| a.max(*b));
            for _ in 0..10 {
                let t = s.sample(&mut l.clone(), &[]).unwrap() as usize;
                prop_assert!(pr[t] >= best * m * (1.0 - 1e-4), "p {} best {} min_p {}", pr[t], best, m);
            }
        }
    }

    proptest! {
        #[test]
        fn log_probs_are_the_log_of_the_softmax(l in logits()) {
            let lp = LogSoftmax::of(&l);
            let p = probs(&l);
            let total: f64 = l.iter().map(|&v| libm::exp(f64::from(lp.log_prob(v)))).sum();
            prop_assert!((total - 1.0).abs() < 1e-4, "probabilities add up to {total}");
            for (&v, &q) in l.iter().zip(&p) {
                prop_assert!((libm::expf(lp.log_prob(v)) - q).abs() < 1e-5);
            }
        }

        #[test]
        fn top_ids_are_the_first_n_of_a_stable_sort(l in logits(), n in 0usize..40) {
            let mut top = Vec::new();
            top_ids(&l, n, &mut top);
            let mut sorted: Vec<u32> = (0..l.len() as u32).collect();
            sorted.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]));
            sorted.truncate(n);
            prop_assert_eq!(top, sorted);
        }
    }

    #[test]
    fn top_ids_keep_the_lower_id_on_ties_and_skip_nan() {
        let l = [1.0, f32::NAN, 3.0, 1.0, 3.0, 2.0];
        let mut top = Vec::new();
        top_ids(&l, 4, &mut top);
        assert_eq!(top, [2, 4, 5, 0]);
        top_ids(&l, 0, &mut top);
        assert!(top.is_empty());
    }

    /// Pearson's chi-square of `counts` against the distribution `p`.
    fn chi_square(counts: &[u32], p: &[f32]) -> f64 {
        let n: u32 = counts.iter().sum();
        counts
            .iter()
            .zip(p)
            .filter(|(_, p)| **p > 0.0)
            .map(|(c, p)| {
                let e = n as f64 * *p as f64;
                (*c as f64 - e).powi(2) / e
            })
            .sum()
    }

    /// The distribution `config` samples from `logits`.
    fn sampled_distribution(config: SamplerConfig, logits: &[f32]) -> Vec<f32> {
        let mut s = Sampler::new(config).unwrap();
        let mut probs = Vec::new();
        s.sample_with_probs(&mut logits.to_vec(), &[], &mut probs)
            .unwrap();
        let mut p = vec![0.0; logits.len()];
        for (t, pr) in probs {
            p[t as usize] = pr;
        }
        p
    }

    /// Speculative sampling keeps the target's distribution: the token that comes out of
    /// `verify` (the draft's when accepted, the replacement otherwise) is distributed as the
    /// target's `sample`, for a model draft (q from other logits) and for a deterministic draft
    /// (q a point mass, as an n-gram lookup proposes). The counts of the draft's own tokens fail
    /// the same test, so the test can tell the two apart.
    #[test]
    #[cfg_attr(miri, ignore = "millions of steps: minutes under Miri; run natively")]
    fn speculative_sampling_keeps_the_target_distribution() {
        let target_logits = [1.0, 0.2, -0.5, 2.0, 0.0, -2.0];
        let draft_logits = [0.0, 1.5, 0.5, 1.0, -1.0, 0.3];
        let configs = [
            SamplerConfig {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                temperature: 0.7,
                top_k: 4,
                top_p: 0.9,
                min_p: 0.05,
                ..SamplerConfig::default()
            },
        ];
        const TRIALS: usize = 100_000;
        // Chi-square with 5 degrees of freedom exceeds 40 with probability about 1e-7.
        const CRITICAL: f64 = 40.0;
        for (i, config) in configs.into_iter().enumerate() {
            let p = sampled_distribution(config, &target_logits);
            let mut draft = Sampler::new(SamplerConfig { seed: 7, ..config }).unwrap();
            let mut target = Sampler::new(SamplerConfig { seed: 11, ..config }).unwrap();
            let (mut out, mut drafted, mut point) = ([0u32; 6], [0u32; 6], [0u32; 6]);
            let mut q = Vec::new();
            for trial in 0..TRIALS {
                let d = draft
                    .sample_with_probs(&mut draft_logits.to_vec(), &[], &mut q)
                    .unwrap();
                drafted[d as usize] += 1;
                let verdict = target
                    .verify(&mut target_logits.to_vec(), &[], d, &q)
                    .unwrap();
                out[match verdict {
                    Verdict::Accepted => d,
                    Verdict::Rejected(t) => t,
                } as usize] += 1;
                // A point-mass draft cycling through every token, kept or filtered.
                let d = (trial % 6) as u32;
                point[match target
                    .verify(&mut target_logits.to_vec(), &[], d, &[(d, 1.0)])
                    .unwrap()
                {
                    Verdict::Accepted => d,
                    Verdict::Rejected(t) => t,
                } as usize] += 1;
            }
            let (x_out, x_point) = (chi_square(&out, &p), chi_square(&point, &p));
            assert!(
                x_out < CRITICAL,
                "config {i}: chi2 {x_out} {out:?} vs {p:?}"
            );
            assert!(x_point < CRITICAL, "config {i}: chi2 {x_point} {point:?}");
            let x_drafted = chi_square(&drafted, &p);
            assert!(x_drafted > 100.0 * CRITICAL, "config {i}: {x_drafted}");
        }
    }

    /// Deterministic sampling accepts exactly the token it would choose, and replaces any other
    /// draft with it; a repetition penalty counts.
    #[test]
    fn deterministic_verify_is_exact() {
        let mut s = Sampler::new(SamplerConfig::greedy()).unwrap();
        let l = [0.1, 3.0, 2.9, -1.0];
        assert_eq!(
            s.verify(&mut l.to_vec(), &[], 1, &[]).unwrap(),
            Verdict::Accepted
        );
        assert_eq!(
            s.verify(&mut l.to_vec(), &[], 2, &[]).unwrap(),
            Verdict::Rejected(1)
        );
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            ..SamplerConfig::greedy()
        })
        .unwrap();
        assert_eq!(
            s.verify(&mut l.to_vec(), &[1], 2, &[]).unwrap(),
            Verdict::Accepted
        );
    }

    /// OpenAI's penalties: the count times `frequency_penalty` plus `presence_penalty`, only
    /// within the window, after the repetition penalty.
    #[test]
    fn frequency_and_presence_penalties() {
        let mut s = Sampler::new(SamplerConfig {
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            repeat_penalty: 2.0,
            repeat_last_n: 4,
            ..SamplerConfig::greedy()
        })
        .unwrap();
        assert!(!s.is_argmax());
        let mut l = vec![3.0, 2.0, -1.0, 1.0];
        // Token 3 is outside the window; 0 is in it three times, 2 once.
        assert_eq!(s.sample(&mut l, &[3, 0, 2, 0, 0]).unwrap(), 1);
        assert_eq!(l, vec![3.0 / 2.0 - 1.5 - 0.25, 2.0, -2.0 - 0.5 - 0.25, 1.0]);
        let bad = SamplerConfig {
            presence_penalty: f32::NAN,
            ..SamplerConfig::greedy()
        };
        assert!(Sampler::new(bad).is_err());
    }

    #[test]
    fn repetition_penalty_discourages_seen_tokens() {
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            ..SamplerConfig::greedy()
        })
        .unwrap();
        let mut l = vec![1.0, 0.9, -1.0];
        assert_eq!(s.sample(&mut l, &[0]).unwrap(), 1);
        assert_eq!(l, vec![0.5, 0.9, -1.0]);
    }

    proptest! {
        /// Caller memory gives the same tokens as the sampler's own buffer.
        #[test]
        #[cfg_attr(miri, ignore = "too slow under Miri; run natively")]
        fn caller_memory_samples_as_owned(l in logits(), seed in any::<u64>(), top_k in 0usize..50) {
            let c = SamplerConfig { seed, top_k, ..SamplerConfig::default() };
            let mut buf = vec![(0u32, 0f32); Sampler::candidates_needed(l.len())];
            let mut borrowed = Sampler::in_memory(c, &mut buf).unwrap();
            let mut owned = Sampler::new(c).unwrap();
            for _ in 0..10 {
                prop_assert_eq!(
                    borrowed.sample(&mut l.clone(), &[]).unwrap(),
                    owned.sample(&mut l.clone(), &[]).unwrap()
                );
            }
        }
    }

    #[test]
    fn caller_memory_too_small_is_an_error() {
        let mut l = vec![0.5, 0.25, 1.0, -1.0];
        let mut small = [(0u32, 0f32); 3];
        let mut s = Sampler::in_memory(SamplerConfig::default(), &mut small).unwrap();
        assert_eq!(
            s.sample(&mut l, &[]),
            Err(Error::ArenaTooSmall {
                what: "sampler candidates",
                needed: 32,
                got: 24
            })
        );
        // Greedy decoding needs no candidates at all.
        let mut greedy = Sampler::in_memory(SamplerConfig::greedy(), &mut []).unwrap();
        assert_eq!(greedy.sample(&mut l, &[]), Ok(2));
    }

    #[test]
    fn bad_parameters_are_errors() {
        assert!(Sampler::new(SamplerConfig {
            top_p: 0.0,
            ..SamplerConfig::default()
        })
        .is_err());
        assert!(Sampler::new(SamplerConfig {
            temperature: -1.0,
            ..SamplerConfig::default()
        })
        .is_err());
        assert!(Sampler::new(SamplerConfig {
            min_p: 2.0,
            ..SamplerConfig::default()
        })
        .is_err());
    }

    /// The distribution a sampler draws from for `probabilities` (as logits `ln p`),
    /// temperature 1 and every other filter off but those `c` sets.
    fn drawn_from(c: SamplerConfig, probabilities: &[f32]) -> Vec<Candidate> {
        let c = SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..c
        };
        let mut s = Sampler::new(c).unwrap();
        let mut logits: Vec<f32> = probabilities.iter().map(|p| libm::logf(*p)).collect();
        let mut probs = Vec::new();
        s.sample_with_probs(&mut logits, &[], &mut probs).unwrap();
        probs
    }

    fn assert_close(got: &[Candidate], want: &[(u32, f32)]) {
        assert_eq!(got.len(), want.len(), "{got:?}");
        for (g, w) in got.iter().zip(want) {
            assert!(
                g.0 == w.0 && (g.1 - w.1).abs() < 1e-5,
                "{got:?} against {want:?}"
            );
        }
    }

    /// Typical sampling keeps the tokens whose surprise is nearest the entropy (1.168 nats):
    /// 0.3's (1.204) and 0.5's (0.693), which pass 0.5 together, renormalized.
    #[test]
    fn typical_keeps_the_tokens_nearest_the_entropy() {
        let c = SamplerConfig {
            typical_p: 0.5,
            ..SamplerConfig::default()
        };
        let got = drawn_from(c, &[0.1, 0.5, 0.1, 0.3]);
        assert_close(&got, &[(1, 0.625), (3, 0.375)]);
        // Up to all of them.
        let all = drawn_from(
            SamplerConfig {
                typical_p: 0.99,
                ..c
            },
            &[0.1, 0.5, 0.1, 0.3],
        );
        assert_eq!(all.len(), 4);
    }

    /// XTC drops every token at least as likely as its threshold but the least likely of them,
    /// when its draw says so (always, at probability 1); under two such tokens, none.
    #[test]
    fn xtc_excludes_the_top_choices() {
        let c = SamplerConfig {
            xtc_probability: 1.0,
            xtc_threshold: 0.25,
            ..SamplerConfig::default()
        };
        let got = drawn_from(c, &[0.1, 0.4, 0.2, 0.3]);
        assert_close(&got, &[(3, 0.5), (2, 1.0 / 3.0), (0, 1.0 / 6.0)]);
        let one = drawn_from(c, &[0.1, 0.7, 0.1, 0.1]);
        assert_eq!(one.len(), 4);
        let off = drawn_from(
            SamplerConfig {
                xtc_threshold: 0.6,
                ..c
            },
            &[0.1, 0.4, 0.2, 0.3],
        );
        assert_eq!(off.len(), 4);
    }

    /// Top-n-sigma keeps the logits within n standard deviations of the largest: of 10, 9, 1
    /// and 0 (mean 5, deviation 4.53), one deviation keeps 10 and 9.
    #[test]
    fn top_n_sigma_keeps_the_logits_near_the_largest() {
        let c = SamplerConfig {
            top_n_sigma: 1.0,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplerConfig::default()
        };
        let mut s = Sampler::new(c).unwrap();
        let mut probs = Vec::new();
        let mut logits = vec![1.0, 10.0, 0.0, 9.0, f32::NEG_INFINITY];
        s.sample_with_probs(&mut logits, &[], &mut probs).unwrap();
        let e = libm::expf(-1.0);
        assert_close(&probs, &[(1, 1.0 / (1.0 + e)), (3, e / (1.0 + e))]);
    }

    #[test]
    fn the_new_filters_refuse_values_out_of_range() {
        for c in [
            SamplerConfig {
                typical_p: 0.0,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                typical_p: 1.5,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                xtc_probability: -0.1,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                xtc_threshold: 2.0,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                top_n_sigma: f32::NAN,
                ..SamplerConfig::default()
            },
        ] {
            assert!(c.validate().is_err(), "{c:?}");
        }
    }

    /// DRY on llama.cpp's worked example, `a b c c b c y a b c` (base 2, multiplier 1,
    /// repetitions of 2 allowed): `c` would extend `a b c` (3 tokens: a penalty of 2), `y` would
    /// extend `b c` (2: 1); a breaker limits how far back a repetition counts, and a
    /// single-token breaker is never penalized.
    #[test]
    fn dry_penalizes_the_tokens_that_extend_a_repetition() {
        let history = [1, 2, 3, 3, 2, 3, 9, 1, 2, 3];
        let c = SamplerConfig {
            temperature: 0.0,
            dry_multiplier: 1.0,
            dry_base: 2.0,
            dry_allowed_length: 2,
            ..SamplerConfig::default()
        };
        let penalties = |breakers: Option<SequenceBreakers>| {
            let mut s = Sampler::new(c).unwrap();
            if let Some(b) = breakers {
                s = s.with_sequence_breakers(Arc::new(b));
            }
            let mut logits = vec![0.0f32; 10];
            s.sample(&mut logits, &history).unwrap();
            logits
        };
        let mut want = vec![0.0f32; 10];
        (want[3], want[9]) = (-2.0, -1.0);
        assert_eq!(penalties(None), want);
        // `y` a breaker: the repetitions after it still count, `y` itself goes free.
        want[9] = 0.0;
        assert_eq!(
            penalties(Some(SequenceBreakers::new(vec![(9, vec![])]))),
            want
        );
        // The last `a` a breaker: repetitions reach back two tokens at most.
        (want[3], want[9]) = (-1.0, -1.0);
        assert_eq!(
            penalties(Some(SequenceBreakers::new(vec![(1, vec![])]))),
            want
        );
        // `b c` a breaker of two tokens, at the very end: nothing repeats past it.
        let two = SequenceBreakers::new(vec![(2, vec![3])]);
        assert_eq!(penalties(Some(two)), vec![0.0f32; 10]);
        // A window of the last four tokens: `y a b c` holds no repetition.
        let window = SamplerConfig {
            dry_penalty_last_n: 4,
            ..c
        };
        let mut logits = vec![0.0f32; 10];
        Sampler::new(window)
            .unwrap()
            .sample(&mut logits, &history)
            .unwrap();
        assert_eq!(logits, vec![0.0f32; 10]);
    }

    /// A reseeded sampler (a draft model's) keeps the configuration and the breakers: on the
    /// worked example above, the breaker `b c` still stops every penalty; only the seed changes.
    #[test]
    fn a_reseeded_sampler_keeps_its_breakers() {
        let history = [1, 2, 3, 3, 2, 3, 9, 1, 2, 3];
        let c = SamplerConfig {
            temperature: 0.8,
            dry_multiplier: 1.0,
            dry_base: 2.0,
            dry_allowed_length: 2,
            seed: 7,
            ..SamplerConfig::default()
        };
        let target = Sampler::new(c)
            .unwrap()
            .with_sequence_breakers(Arc::new(SequenceBreakers::new(vec![(2, vec![3])])));
        let draft = target.reseeded(99).unwrap();
        assert_eq!(draft.config().seed, 99);
        assert_eq!(draft.config().temperature, 0.8);
        let mut logits = vec![0.0f32; 10];
        let mut greedy = draft.reseeded(1).unwrap();
        greedy.config.temperature = 0.0;
        greedy.sample(&mut logits, &history).unwrap();
        assert_eq!(logits, vec![0.0f32; 10], "no penalty past the breaker");
    }

    /// A long run of one token: the penalty's exponent stops where the power would overflow,
    /// so the logit stays finite.
    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri; run natively")]
    fn dry_penalties_stay_finite() {
        let history = vec![5u32; 2000];
        let c = SamplerConfig {
            temperature: 0.0,
            dry_multiplier: 1.0,
            dry_base: 1.75,
            ..SamplerConfig::default()
        };
        let mut logits = vec![0.0f32; 4096];
        Sampler::new(c)
            .unwrap()
            .sample(&mut logits, &history)
            .unwrap();
        assert!(logits[5].is_finite() && logits[5] < -1e30, "{}", logits[5]);
        assert!(logits.iter().enumerate().all(|(t, l)| t == 5 || *l == 0.0));
    }

    /// Mirostat 2 keeps the tokens whose surprise is at most its target (first twice tau), and
    /// moves the target against each draw's surprise: followed draw by draw.
    #[test]
    fn mirostat_2_tracks_its_target() {
        let (tau, eta) = (1.0f32, 1.0f32);
        let c = SamplerConfig {
            mirostat: 2,
            mirostat_tau: tau,
            mirostat_eta: eta,
            temperature: 1.0,
            seed: 3,
            ..SamplerConfig::default()
        };
        let mut s = Sampler::new(c).unwrap();
        let p = [0.5f32, 0.25, 0.125, 0.125];
        let mut mu = 2.0 * tau;
        let mut probs = Vec::new();
        for _ in 0..20 {
            let mut logits: Vec<f32> = p.iter().map(|p| libm::logf(*p)).collect();
            let t = s.sample_with_probs(&mut logits, &[], &mut probs).unwrap();
            let kept: Vec<usize> = (0..4).filter(|&i| -libm::log2f(p[i]) <= mu).collect();
            let kept = if kept.is_empty() { vec![0] } else { kept };
            let total: f32 = kept.iter().map(|&i| p[i]).sum();
            let want: Vec<(u32, f32)> = kept.iter().map(|&i| (i as u32, p[i] / total)).collect();
            assert_close(&probs, &want);
            let drawn = p[t as usize] / total;
            mu -= eta * (-libm::log2f(drawn) - tau);
        }
    }

    /// Mirostat 1 on a Zipf distribution of exponent 2 (p ∝ 1/i²) over 1000 tokens: its
    /// estimate of the exponent is 2, so it keeps sqrt(2^mu / (1 - 1/1000)) tokens: 8 for mu 6.
    #[test]
    fn mirostat_1_keeps_the_zipf_estimates_top_k() {
        let c = SamplerConfig {
            mirostat: 1,
            mirostat_tau: 3.0,
            temperature: 1.0,
            ..SamplerConfig::default()
        };
        let mut s = Sampler::new(c).unwrap();
        let mut logits: Vec<f32> = (1..=1000).map(|i| -2.0 * libm::logf(i as f32)).collect();
        let mut probs = Vec::new();
        s.sample_with_probs(&mut logits, &[], &mut probs).unwrap();
        assert_eq!(probs.len(), 8, "{probs:?}");
    }

    /// Under mirostat, as in llama.cpp, the penalties do not apply, top-k does not make it
    /// greedy, and speculative verification (which would not adapt its target) is refused.
    #[test]
    fn mirostat_replaces_the_other_filters() {
        let c = SamplerConfig {
            mirostat: 2,
            repeat_penalty: 1.5,
            top_k: 1,
            temperature: 1.0,
            ..SamplerConfig::default()
        };
        let mut s = Sampler::new(c).unwrap();
        assert!(!s.is_deterministic());
        let greedy = Sampler::new(SamplerConfig {
            temperature: 0.0,
            ..c
        })
        .unwrap();
        assert!(greedy.is_argmax(), "no penalty under mirostat");
        assert!(s.verify(&mut [0.0, 1.0], &[], 1, &[(1, 1.0)]).is_err());
        assert!(SamplerConfig { mirostat: 3, ..c }.validate().is_err());
        assert!(SamplerConfig {
            mirostat_tau: -1.0,
            ..c
        }
        .validate()
        .is_err());
    }
}
