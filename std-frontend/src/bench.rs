//! `sapient bench`: prefill and decode speed the way llama.cpp's `llama-bench` measures them
//! (pp: a prompt of N tokens; tg: N tokens fed one at a time; each from an empty cache, or from
//! one already holding `depth` tokens, like llama-bench's `-d`), after a warm-up, over
//! repetitions.
use std::time::Instant;

use anyhow::Result;
use sapient_core::sample::Rng;
use sapient_core::Want;

use crate::run::{KernelTimes, Runner, Session, DEFAULT_BATCH};
use crate::slots::KvSlots;

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
    /// Kernel times on the device over the timed repetitions, with `Tests::profile`.
    pub prefill_times: Option<KernelTimes>,
    pub decode_times: Option<KernelTimes>,
}

/// What to measure: tokens of prefill and of single-token decoding (0 skips either), each after
/// `depth` tokens were put in the cache untimed.
#[derive(Debug, Clone, Copy)]
pub struct Tests {
    pub prompt: usize,
    pub generate: usize,
    pub depth: usize,
    /// Time every kernel on the device too (GPU only).
    pub profile: bool,
}

/// Runs `reps` timed repetitions (after one warm-up) of each test.
pub fn bench(runner: &impl Runner, tests: Tests, reps: usize) -> Result<BenchResult> {
    let c = runner.config();
    let Tests {
        prompt,
        generate,
        depth,
        profile,
    } = tests;
    if prompt == 0 && generate == 0 {
        return Ok(BenchResult {
            prefill: None,
            decode: None,
            dispatches_per_token: None,
            prefill_times: None,
            decode_times: None,
        });
    }
    let ctx = depth + prompt.max(generate);
    let batch = prompt.max(depth).clamp(1, DEFAULT_BATCH);
    let vocab = c.vocab_size;
    runner.with_session(ctx, batch, |s| {
        if profile {
            s.time_kernels()?;
        }
        // Made once the cache is there: a depth it cannot hold is its error, not an abort here.
        let tokens = random_tokens(&mut Rng::new(42), ctx, vocab);
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
        let (mut pp_times, mut tg_times) = (KernelTimes::default(), KernelTimes::default());
        for rep in 0..=reps {
            if prompt > 0 {
                fill(s)?;
                s.take_kernel_times();
                let t = Instant::now();
                s.forward(&tokens_after[..prompt], Want::LastLogits(&mut logits))?;
                let rate = prompt as f64 / t.elapsed().as_secs_f64();
                if rep > 0 {
                    pp.push(rate);
                    pp_times.add(s.take_kernel_times());
                }
            }
            if generate > 0 {
                fill(s)?;
                s.take_kernel_times();
                let t = Instant::now();
                for &tok in &tokens_after[..generate] {
                    s.forward(&[tok], Want::LastLogits(&mut logits))?;
                }
                let rate = generate as f64 / t.elapsed().as_secs_f64();
                if rep > 0 {
                    tg.push(rate);
                    tg_times.add(s.take_kernel_times());
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
            prefill_times: (profile && prompt > 0).then_some(pp_times),
            decode_times: (profile && generate > 0).then_some(tg_times),
        })
    })
}

/// Decoding as many sequences as `slots` holds together, as a server's decode steps do
/// (llama.cpp's `llama-batched-bench` measures the same): each step feeds one token of every
/// sequence to one forward pass and takes each one's logits. Every sequence starts from `depth`
/// tokens (prefilled untimed); the rate is all sequences' tokens per second. The slots hold
/// `depth + generate` positions each (`slots::with_cpu_slots` or `with_gpu_slots`).
pub fn decode_parallel(
    slots: &mut dyn KvSlots,
    n_seq: usize,
    tests: Tests,
    reps: usize,
) -> Result<Rate> {
    let vocab = slots.config().vocab_size;
    let Tests {
        generate, depth, ..
    } = tests;
    anyhow::ensure!(
        n_seq > 0 && generate > 0,
        "parallel decoding needs sequences and tokens"
    );
    let ctx = depth + generate;
    let mut rng = Rng::new(42);
    let tokens: Vec<Vec<u32>> = (0..n_seq)
        .map(|_| random_tokens(&mut rng, ctx, vocab))
        .collect();
    let all: Vec<usize> = (0..n_seq).collect();
    let mut logits = vec![vec![0f32; vocab]; n_seq];
    let mut rates = Vec::new();
    for rep in 0..=reps {
        for (slot, seq) in tokens.iter().enumerate() {
            slots.truncate(slot, 0);
            if depth > 0 {
                slots.forward(&[slot], &[&seq[..depth]], &mut [Want::Nothing])?;
            }
        }
        let t = Instant::now();
        for i in depth..ctx {
            let step: Vec<&[u32]> = tokens.iter().map(|s| &s[i..i + 1]).collect();
            let mut wants: Vec<Want<'_>> = logits
                .iter_mut()
                .map(|l| Want::LastLogits(l.as_mut_slice()))
                .collect();
            slots.forward(&all, &step, &mut wants)?;
        }
        if rep > 0 {
            rates.push((n_seq * generate) as f64 / t.elapsed().as_secs_f64());
        }
    }
    Ok(Rate::of(&rates))
}

/// `n` token ids drawn uniformly from the vocabulary.
fn random_tokens(rng: &mut Rng, n: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect()
}

/// The process's peak resident memory, from /proc (Linux); None elsewhere.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Kernel times per token of `tokens`, largest first: (kernel, calls, µs).
fn per_token(times: &KernelTimes, tokens: usize) -> Vec<(&'static str, f64, f64)> {
    let n = tokens.max(1) as f64;
    let mut rows: Vec<_> = times
        .kernels
        .iter()
        .map(|k| (k.kernel, k.calls as f64 / n, k.nanos / 1e3 / n))
        .collect();
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    rows
}

/// `times` over `tokens` as JSON: per token, each kernel's calls and µs, their sum, the span
/// from each submission's first timestamp to its last, and the host's recording and submitting.
pub fn kernel_times_json(times: &KernelTimes, tokens: usize) -> serde_json::Value {
    let rows = per_token(times, tokens);
    let kernels: Vec<_> = rows
        .iter()
        .map(|&(kernel, calls, us)| {
            serde_json::json!({
                "kernel": kernel,
                "calls_per_token": calls,
                "us_per_token": us,
                "us_per_call": us / calls.max(f64::MIN_POSITIVE),
            })
        })
        .collect();
    serde_json::json!({
        "kernels": kernels,
        "kernels_us_per_token": rows.iter().map(|r| r.2).sum::<f64>(),
        "gpu_span_us_per_token": times.span_nanos / 1e3 / tokens.max(1) as f64,
        "host_us_per_token": times.host_nanos / 1e3 / tokens.max(1) as f64,
        "untimed_dispatches": times.untimed,
    })
}

/// `times` over `tokens` as a table, under `title`.
pub fn kernel_times_text(title: &str, times: &KernelTimes, tokens: usize) -> String {
    let rows = per_token(times, tokens);
    let sum: f64 = rows.iter().map(|r| r.2).sum();
    let span = times.span_nanos / 1e3 / tokens.max(1) as f64;
    let host = times.host_nanos / 1e3 / tokens.max(1) as f64;
    let mut out = format!(
        "{title}, per token: kernels {sum:.1} µs, GPU span {span:.1} µs (kernels and the gaps \
         between them), host {host:.1} µs (recording and submitting)\n  \
         {:<18} {:>8} {:>10} {:>10} {:>6}\n",
        "kernel", "calls", "µs/call", "µs", "share"
    );
    for (kernel, calls, us) in rows {
        out += &format!(
            "  {kernel:<18} {calls:>8.2} {:>10.2} {us:>10.1} {:>5.1}%\n",
            us / calls.max(f64::MIN_POSITIVE),
            100.0 * us / sum.max(f64::MIN_POSITIVE)
        );
    }
    if times.untimed > 0 {
        out += &format!("  ({} dispatches untimed)\n", times.untimed);
    }
    out
}
