//! Choosing the next token from logits: greedy, temperature, top-k, top-p, min-p and a
//! repetition penalty, applied in llama.cpp's order (penalty, top-k, top-p, min-p, temperature),
//! with a seeded RNG so that a seed reproduces a run exactly.
use alloc::vec::Vec;

use crate::error::{Error, Result};

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
    /// How many of the latest tokens the penalty looks at.
    pub repeat_last_n: usize,
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
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            ..Self::default()
        }
    }

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
        Ok(())
    }
}

/// xoshiro256** seeded through splitmix64: small, fast, and the same on every platform.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
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

pub struct Sampler {
    config: SamplerConfig,
    rng: Rng,
    /// (token, logit then probability); allocated once, reused for every token.
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(config: SamplerConfig) -> Result<Self> {
        config.validate()?;
        Ok(Sampler {
            rng: Rng::new(config.seed),
            config,
            candidates: Vec::new(),
        })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Whether every choice is the argmax of the raw logits (greedy, no penalty): a backend can
    /// then pick the token itself (`Want::LastArgmax`) without handing over the logits.
    pub fn is_argmax(&self) -> bool {
        let c = &self.config;
        (c.temperature == 0.0 || c.top_k == 1) && c.repeat_penalty == 1.0
    }

    /// Whether every choice is a function of the logits alone (greedy or top-k 1): no random
    /// draw, so a draft token is right exactly when it is that choice.
    pub fn is_deterministic(&self) -> bool {
        self.config.temperature == 0.0 || self.config.top_k == 1
    }

    /// The next token given `logits` and the tokens so far (for the repetition penalty).
    /// `logits` is modified by the penalty.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        match filter(&self.config, &mut self.candidates, logits, history) {
            Choice::Token(t) => t,
            Choice::Candidates => draw(&self.candidates, self.rng.next_f32()),
        }
    }

    /// As `sample`, and `probs` ← the distribution the token was drawn from, as (token,
    /// probability) pairs, most likely first (one pair of probability 1 when deterministic): what
    /// a draft hands to `verify`.
    pub fn sample_with_probs(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        probs: &mut Vec<(u32, f32)>,
    ) -> u32 {
        let t = self.sample(logits, history);
        probs.clear();
        if self.is_deterministic() {
            probs.push((t, 1.0));
        } else {
            probs.extend_from_slice(&self.candidates);
        }
        t
    }

    /// Speculative sampling's check of one draft token: `logits` are the target's at the
    /// draft's position, `draft_probs` the distribution the draft drew `draft` from
    /// (`sample_with_probs`; a deterministic draft, such as an n-gram lookup, passes
    /// `[(draft, 1.0)]`). Deterministic sampling accepts exactly the token `sample` would
    /// choose. Otherwise the draft is accepted with probability min(1, p(draft) / q(draft)), and
    /// a rejection draws from max(0, p − q) renormalized, so the token that comes out is
    /// distributed as the target's own `sample` (Leviathan et al., 2023).
    pub fn verify(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        draft: u32,
        draft_probs: &[(u32, f32)],
    ) -> Verdict {
        let p = match filter(&self.config, &mut self.candidates, logits, history) {
            Choice::Token(t) if t == draft => return Verdict::Accepted,
            Choice::Token(t) => return Verdict::Rejected(t),
            Choice::Candidates => &mut self.candidates,
        };
        let prob_of = |dist: &[(u32, f32)], t: u32| {
            dist.iter()
                .find(|(id, _)| *id == t)
                .map_or(0.0, |(_, p)| *p)
        };
        let (p_draft, q_draft) = (prob_of(p, draft), prob_of(draft_probs, draft));
        let u = self.rng.next_f32();
        if u * q_draft < p_draft {
            return Verdict::Accepted;
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
            return Verdict::Rejected(p[0].0);
        }
        p.iter_mut().for_each(|(_, prob)| *prob /= residual_sum);
        Verdict::Rejected(draw(p, u))
    }
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

/// Applies the repetition penalty to `logits`, then (unless the choice is deterministic) fills
/// `cand` with the surviving tokens and their probabilities, most likely first.
fn filter(
    c: &SamplerConfig,
    cand: &mut Vec<(u32, f32)>,
    logits: &mut [f32],
    history: &[u32],
) -> Choice {
    if c.repeat_penalty != 1.0 {
        let start = history.len().saturating_sub(c.repeat_last_n);
        let recent = &history[start..];
        for (i, &t) in recent.iter().enumerate() {
            // Penalize each distinct token once.
            if recent[..i].contains(&t) {
                continue;
            }
            if let Some(l) = logits.get_mut(t as usize) {
                *l = if *l > 0.0 {
                    *l / c.repeat_penalty
                } else {
                    *l * c.repeat_penalty
                };
            }
        }
    }
    if c.temperature == 0.0 || c.top_k == 1 {
        return Choice::Token(argmax(logits));
    }
    cand.clear();
    cand.extend(
        logits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_nan())
            .map(|(i, l)| (i as u32, *l)),
    );
    if cand.is_empty() {
        return Choice::Token(0);
    }
    // Most likely first; ties keep the lower id first, so runs are reproducible.
    let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if c.top_k > 0 && c.top_k < cand.len() {
        cand.select_nth_unstable_by(c.top_k - 1, by_logit);
        cand.truncate(c.top_k);
    }
    cand.sort_unstable_by(by_logit);
    softmax_in_place(cand, 1.0);
    if c.top_p < 1.0 {
        let mut sum = 0.0;
        let mut keep = cand.len();
        for (i, (_, p)) in cand.iter().enumerate() {
            sum += p;
            if sum >= c.top_p {
                keep = i + 1;
                break;
            }
        }
        cand.truncate(keep);
    }
    if c.min_p > 0.0 {
        let threshold = cand[0].1 * c.min_p;
        let keep = cand
            .iter()
            .take_while(|(_, p)| *p >= threshold)
            .count()
            .max(1);
        cand.truncate(keep);
    }
    // Temperature rescales the survivors' logits: p^(1/T), renormalized.
    for (_, p) in cand.iter_mut() {
        *p = libm::logf(*p);
    }
    softmax_in_place(cand, c.temperature);
    Choice::Candidates
}

/// The token of `dist` (probabilities summing to 1) that the uniform draw `u` lands on.
fn draw(dist: &[(u32, f32)], u: f32) -> u32 {
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
fn softmax_in_place(cand: &mut [(u32, f32)], temperature: f32) {
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

/// The index of the largest logit (the lowest index on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, l) in logits.iter().enumerate() {
        if *l > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use proptest::prelude::*;

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
            prop_assert_eq!(s.sample(&mut l.clone(), &[]), argmax(&l));
        }

        #[test]
        fn same_seed_same_tokens(l in logits(), seed in any::<u64>()) {
            let c = SamplerConfig { seed, top_k: 0, ..SamplerConfig::default() };
            let (mut a, mut b) = (Sampler::new(c).unwrap(), Sampler::new(c).unwrap());
            for _ in 0..20 {
                prop_assert_eq!(a.sample(&mut l.clone(), &[]), b.sample(&mut l.clone(), &[]));
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
                let t = s.sample(&mut l.clone(), &[]) as usize;
                let rank = order.iter().position(|&i| i == t).unwrap();
                let mass_before: f32 = order[..rank].iter().map(|&i| pr[i]).sum();
                // Everything ranked above `t` did not yet reach p (with float slack).
                prop_assert!(mass_before < p + 1e-4, "rank {} mass {} p {}", rank, mass_before, p);
            }
        }

        /// The token is never less likely than min_p times the most likely one.
        #[test]
        fn min_p_never_picks_an_unlikely_token(l in logits(), seed in any::<u64>(), m in 0.01f32..1.0) {
            let mut s = Sampler::new(SamplerConfig { temperature: 1.5, top_k: 0, top_p: 1.0, min_p: m, seed, ..SamplerConfig::default() }).unwrap();
            let pr = probs(&l);
            let best = pr.iter().fold(0f32, |a, b| a.max(*b));
            for _ in 0..10 {
                let t = s.sample(&mut l.clone(), &[]) as usize;
                prop_assert!(pr[t] >= best * m * (1.0 - 1e-4), "p {} best {} min_p {}", pr[t], best, m);
            }
        }
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
        s.sample_with_probs(&mut logits.to_vec(), &[], &mut probs);
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
                let d = draft.sample_with_probs(&mut draft_logits.to_vec(), &[], &mut q);
                drafted[d as usize] += 1;
                let verdict = target.verify(&mut target_logits.to_vec(), &[], d, &q);
                out[match verdict {
                    Verdict::Accepted => d,
                    Verdict::Rejected(t) => t,
                } as usize] += 1;
                // A point-mass draft cycling through every token, kept or filtered.
                let d = (trial % 6) as u32;
                point[match target.verify(&mut target_logits.to_vec(), &[], d, &[(d, 1.0)]) {
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
        assert_eq!(s.verify(&mut l.to_vec(), &[], 1, &[]), Verdict::Accepted);
        assert_eq!(s.verify(&mut l.to_vec(), &[], 2, &[]), Verdict::Rejected(1));
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            ..SamplerConfig::greedy()
        })
        .unwrap();
        assert_eq!(s.verify(&mut l.to_vec(), &[1], 2, &[]), Verdict::Accepted);
    }

    #[test]
    fn repetition_penalty_discourages_seen_tokens() {
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            ..SamplerConfig::greedy()
        })
        .unwrap();
        let mut l = vec![1.0, 0.9, -1.0];
        assert_eq!(s.sample(&mut l, &[0]), 1);
        assert_eq!(l, vec![0.5, 0.9, -1.0]);
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
}
