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

    /// The next token given `logits` and the tokens so far (for the repetition penalty).
    /// `logits` is modified by the penalty.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        let c = self.config;
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
            return argmax(logits);
        }
        let cand = &mut self.candidates;
        cand.clear();
        cand.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.is_nan())
                .map(|(i, l)| (i as u32, *l)),
        );
        if cand.is_empty() {
            return 0;
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
        let u = self.rng.next_f32();
        let mut acc = 0.0;
        for &(t, p) in cand.iter() {
            acc += p;
            if u < acc {
                return t;
            }
        }
        cand[cand.len() - 1].0
    }
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
