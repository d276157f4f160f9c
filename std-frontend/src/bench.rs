//! `sapient bench`: prefill and decode speed the way llama.cpp's `llama-bench` measures them
//! (pp: a prompt of N tokens; tg: N tokens fed one at a time; each from an empty cache, or from
//! one already holding `depth` tokens, like llama-bench's `-d`), after a warm-up, over
//! repetitions.
use std::time::Instant;

use anyhow::Result;
use sapient_core::sample::Rng;
use sapient_core::Want;

use crate::run::{Runner, Session, DEFAULT_BATCH};

/// Mean and sample standard deviation.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rate {
    pub mean: f64,
    pub stddev: f64,
}

impl Rate {
    fn of(samples: &[f64]) -> Rate {
        let n = samples.len() as f64;
        if samples.is_empty() {
            return Rate::default();
        }
        let mean = samples.iter().sum::<f64>() / n;
        let var = if samples.len() > 1 {
            samples.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (n - 1.0)
        } else {
            0.0
        };
        Rate {
            mean,
            stddev: var.sqrt(),
        }
    }
}

pub struct BenchResult {
    pub prefill: Option<Rate>,
    pub decode: Option<Rate>,
    /// GPU dispatches per decoded token (none on the CPU).
    pub dispatches_per_token: Option<usize>,
}

/// What to measure: tokens of prefill and of single-token decoding (0 skips either), each after
/// `depth` tokens were put in the cache untimed.
#[derive(Debug, Clone, Copy)]
pub struct Tests {
    pub prompt: usize,
    pub generate: usize,
    pub depth: usize,
}

/// Runs `reps` timed repetitions (after one warm-up) of each test.
pub fn bench(runner: &impl Runner, tests: Tests, reps: usize) -> Result<BenchResult> {
    let c = runner.config();
    let Tests {
        prompt,
        generate,
        depth,
    } = tests;
    let ctx = depth + prompt.max(generate).max(1);
    let batch = prompt.max(depth).clamp(1, DEFAULT_BATCH);
    let mut rng = Rng::new(42);
    let tokens: Vec<u32> = (0..ctx)
        .map(|_| (rng.next_u64() % c.vocab_size as u64) as u32)
        .collect();
    let vocab = c.vocab_size;
    runner.with_session(ctx, batch, |s| {
        // The cache as each test starts: empty, then `depth` tokens prefilled.
        let mut depth_logits = vec![0f32; vocab];
        let mut fill = |s: &mut dyn Session| -> Result<()> {
            s.truncate(0);
            if depth > 0 {
                s.forward(&tokens[..depth], Want::LastLogits(&mut depth_logits))?;
            }
            Ok(())
        };
        let tokens_after = &tokens[depth..];
        let mut logits = vec![0f32; vocab];
        let (mut pp, mut tg) = (Vec::new(), Vec::new());
        for rep in 0..=reps {
            if prompt > 0 {
                fill(s)?;
                let t = Instant::now();
                s.forward(&tokens_after[..prompt], Want::LastLogits(&mut logits))?;
                let rate = prompt as f64 / t.elapsed().as_secs_f64();
                if rep > 0 {
                    pp.push(rate);
                }
            }
            if generate > 0 {
                fill(s)?;
                let t = Instant::now();
                for &tok in &tokens_after[..generate] {
                    s.forward(&[tok], Want::LastLogits(&mut logits))?;
                }
                let rate = generate as f64 / t.elapsed().as_secs_f64();
                if rep > 0 {
                    tg.push(rate);
                }
            }
        }
        Ok(BenchResult {
            prefill: (prompt > 0).then(|| Rate::of(&pp)),
            decode: (generate > 0).then(|| Rate::of(&tg)),
            dispatches_per_token: if generate > 0 {
                s.dispatches_per_token()
            } else {
                None
            },
        })
    })
}

/// The process's peak resident memory, from /proc (Linux); None elsewhere.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
