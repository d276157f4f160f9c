//! `sapient bench`: prefill and decode speed the way llama.cpp's `llama-bench` measures them
//! (pp: a prompt of N tokens from an empty cache; tg: N tokens fed one at a time from an empty
//! cache), after a warm-up, over repetitions.
use std::time::Instant;

use anyhow::Result;
use sapient_core::exec::Exec;
use sapient_core::sample::Rng;
use sapient_core::{KvFormat, Model, Want};

use crate::run::{Arenas, DEFAULT_BATCH};

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
}

/// Runs `reps` timed repetitions (after one warm-up) of a `prompt`-token prefill and of
/// `generate` single-token steps; 0 skips either.
pub fn bench<E: Exec>(
    model: &Model<'_>,
    exec: &E,
    kv: KvFormat,
    prompt: usize,
    generate: usize,
    reps: usize,
) -> Result<BenchResult> {
    let c = &model.config;
    let ctx = prompt.max(generate).max(1);
    let mut arenas = Arenas::new(c, ctx, kv, prompt.clamp(1, DEFAULT_BATCH))?;
    let (mut cache, mut scratch) = arenas.borrow(c)?;
    let mut rng = Rng::new(42);
    let tokens: Vec<u32> = (0..ctx)
        .map(|_| (rng.next_u64() % c.vocab_size as u64) as u32)
        .collect();
    let mut logits = vec![0f32; c.vocab_size];
    let (mut pp, mut tg) = (Vec::new(), Vec::new());
    for rep in 0..=reps {
        if prompt > 0 {
            cache.clear();
            let t = Instant::now();
            model.forward(
                &tokens[..prompt],
                &mut cache,
                &mut scratch,
                exec,
                Want::LastLogits(&mut logits),
            )?;
            let rate = prompt as f64 / t.elapsed().as_secs_f64();
            if rep > 0 {
                pp.push(rate);
            }
        }
        if generate > 0 {
            cache.clear();
            let t = Instant::now();
            for &tok in &tokens[..generate] {
                model.forward(
                    &[tok],
                    &mut cache,
                    &mut scratch,
                    exec,
                    Want::LastLogits(&mut logits),
                )?;
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
    })
}

/// The process's peak resident memory, from /proc (Linux); None elsewhere.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
