//! Continuous batching: one thread owns the model's KV slots and runs every admitted request
//! together. Each step puts one decode token of every generating request and prefill chunks of
//! new ones into a single `Model::forward_many`, so the weights are streamed once per step for
//! all of them; each request gets the bits it would get alone (the kernels are batch-invariant),
//! so a greedy request's tokens do not depend on what else is running.
//!
//! The KV cache is a pool of `parallel` slots of `ctx` positions; a request waits in the queue
//! until a slot is free and is never dropped for lack of one. A request whose client went away
//! (its event receiver dropped) frees its slot at the next step.
//!
//! A slot keeps its keys and values after its request ends. A new request takes the free slot
//! whose tokens share the longest start with its prompt (the next turn of a chat resends the
//! whole conversation; many requests share a system prompt), and only the rest of its prompt is
//! prefilled. The result is the same bits as a prefill from the start: prefill and decoding
//! agree exactly however the tokens are split into steps.
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use sapient_core::sample::{top_ids, LogSoftmax, Sampler, SamplerConfig, SequenceBreakers};
use sapient_core::{KvFormat, Model, Want};
use tokio::sync::{mpsc, oneshot};

use super::metrics::Metrics;
use crate::constraint::OutputConstraint;
use crate::slots::{self, KvSlots};
use crate::Rayon;

/// Why a request stopped generating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// A stop token (or, decided by the HTTP side, a stop string).
    Stop,
    /// `max_tokens`, or the end of its KV slot.
    Length,
}

/// A generated token's log-probability under the model's distribution (the softmax of its
/// raw logits, before penalties, biases and temperature), and the likeliest tokens' with theirs.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    /// Most likely first.
    pub top: Vec<(u32, f32)>,
}

/// What the engine tells a request.
#[derive(Debug)]
pub enum Event {
    Token {
        id: u32,
        /// When the request asked for them.
        logprobs: Option<TokenLogprobs>,
    },
    Done {
        finish: Finish,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
    /// The request has a slot: this many of its prompt's first tokens were in the slot's cache
    /// already and are not run again.
    Started {
        cached_tokens: usize,
    },
    /// The log-probabilities of prompt tokens after the first, in order, as their positions
    /// are run (a request that asked for `prompt_logprobs`).
    PromptLogprobs(Vec<TokenLogprobs>),
    Failed(String),
}

/// A generation request.
pub struct Job {
    pub prompt: Vec<u32>,
    pub sampling: SamplerConfig,
    /// Added to these tokens' logits before sampling (token ids checked against the vocabulary).
    pub logit_bias: Vec<(u32, f32)>,
    pub max_tokens: usize,
    /// Tokens that end generation (not reported).
    pub stop: Vec<u32>,
    /// `Some(n)`: report each token's log-probability and the `n` likeliest tokens' with it.
    pub logprobs: Option<usize>,
    /// Report those of the prompt's tokens too (`echo`): the prompt is run whole, from no
    /// cached start, in chunks of at most `PROMPT_LOGPROBS_CHUNK` tokens.
    pub prompt_logprobs: bool,
    /// Keeps the output to a language (`response_format` `json_object` or `json_schema`,
    /// `grammar`, tools' calls).
    pub constraint: Option<OutputConstraint>,
    /// DRY's sequence breakers, where the sampling asks for DRY.
    pub sequence_breakers: Option<Arc<SequenceBreakers>>,
    pub events: mpsc::UnboundedSender<Event>,
    /// Set by the receiving side when a stop string ended the request before it dropped its
    /// events: the request finished, it was not abandoned.
    pub stopped_by_text: Arc<AtomicBool>,
    pub arrived: Instant,
}

pub enum Request {
    Generate(Box<Job>),
    /// Normalized mean-pooled embeddings of texts.
    Embed {
        texts: Vec<Vec<u32>>,
        reply: oneshot::Sender<Result<Vec<Vec<f32>>>>,
    },
}

pub struct EngineConfig {
    /// KV slots: requests generating at once.
    pub parallel: usize,
    /// Positions per slot.
    pub ctx: usize,
    /// Most tokens per step (decode tokens first, then prefill chunks).
    pub batch: usize,
    pub kv: KvFormat,
}

/// A request holding a slot.
struct Running {
    job: Job,
    sampler: Sampler<'static>,
    /// The prompt and every token generated so far.
    tokens: Vec<u32>,
    /// How many of `tokens` are in the slot's cache.
    fed: usize,
    generated: usize,
    logits: Vec<f32>,
    /// The logits before biases and penalties, kept for `logprobs` (empty when not asked).
    raw_logits: Vec<f32>,
    /// Every position's logits of a prompt chunk, for `prompt_logprobs` (empty otherwise).
    chunk_logits: Vec<f32>,
    last_token: Option<Instant>,
}

/// Runs requests from `requests` on the CPU until every sender is gone and no work is left.
pub fn run_cpu(
    model: &Model<'_>,
    exec: &Rayon,
    cfg: &EngineConfig,
    requests: Receiver<Request>,
    metrics: &Arc<Metrics>,
) -> Result<()> {
    let shape = (cfg.parallel, cfg.ctx, cfg.batch);
    slots::with_cpu_slots(model, exec, cfg.kv, shape, |kv| {
        run(kv, cfg, requests, metrics)
    })
}

/// Runs requests from `requests` on a GPU session of `cfg.parallel` KV slots.
#[cfg(feature = "gpu")]
pub fn run_gpu(
    model: &crate::gpu::GpuModel,
    cfg: &EngineConfig,
    requests: Receiver<Request>,
    metrics: &Arc<Metrics>,
) -> Result<()> {
    let shape = (cfg.parallel, cfg.ctx, cfg.batch);
    slots::with_gpu_slots(model, shape, |kv| run(kv, cfg, requests, metrics))
}

/// Runs requests from `requests` on `kv` until every sender is gone and no work is left.
fn run(
    kv: &mut dyn KvSlots,
    cfg: &EngineConfig,
    requests: Receiver<Request>,
    metrics: &Arc<Metrics>,
) -> Result<()> {
    let vocab_size = kv.config().vocab_size;
    metrics
        .kv_total
        .store(cfg.parallel * cfg.ctx, Ordering::Relaxed);
    let mut slots: Vec<Option<Running>> = (0..cfg.parallel).map(|_| None).collect();
    // A free slot's tokens in its cache, and when it was freed (in steps): the longest shared
    // start wins, then the slot freed longest ago, so the freshest caches last.
    let mut held: Vec<Vec<u32>> = vec![Vec::new(); cfg.parallel];
    let mut freed_at = vec![0u64; cfg.parallel];
    let mut steps = 0u64;
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut open = true;
    loop {
        // Take what arrived; sleep on the channel only when there is nothing to do.
        let idle = waiting.is_empty() && slots.iter().all(Option::is_none);
        if idle && !open {
            return Ok(());
        }
        let mut next = if idle {
            requests.recv().map_err(|_| TryRecvError::Disconnected)
        } else {
            requests.try_recv()
        };
        loop {
            match next {
                Ok(Request::Generate(job)) => waiting.push_back(*job),
                // Embeddings run here, between two steps: a pass over their texts delays the
                // running requests' next tokens by that much.
                Ok(Request::Embed { texts, reply }) => {
                    let refs: Vec<&[u32]> = texts.iter().map(Vec::as_slice).collect();
                    let _ = reply.send(kv.embeddings(&refs, cfg.batch));
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
            next = requests.try_recv();
        }
        // Admit waiting requests into free slots, oldest first.
        while let Some(job) = waiting.front() {
            let free = (0..slots.len()).filter(|&i| slots[i].is_none());
            let Some(i) = free.max_by_key(|&i| {
                (
                    shared_start(&held[i], &job.prompt),
                    std::cmp::Reverse(freed_at[i]),
                )
            }) else {
                break;
            };
            let Some(job) = waiting.pop_front() else {
                break;
            };
            metrics.waiting.fetch_sub(1, Ordering::Relaxed);
            let sampler = match Sampler::new(job.sampling) {
                Ok(s) => match &job.sequence_breakers {
                    Some(b) => s.with_sequence_breakers(b.clone()),
                    None => s,
                },
                Err(e) => {
                    let _ = job.events.send(Event::Failed(e.to_string()));
                    continue;
                }
            };
            metrics.running.fetch_add(1, Ordering::Relaxed);
            // The last prompt token is always run: its logits give the first new token. A
            // prompt whose logprobs are asked for is run whole.
            let kept = match job.prompt_logprobs {
                true => 0,
                false => {
                    shared_start(&held[i], &job.prompt).min(job.prompt.len().saturating_sub(1))
                }
            };
            kv.truncate(i, kept);
            held[i].clear();
            metrics
                .prompt_tokens_cached
                .fetch_add(kept as u64, Ordering::Relaxed);
            let _ = job.events.send(Event::Started {
                cached_tokens: kept,
            });
            slots[i] = Some(Running {
                sampler,
                tokens: job.prompt.clone(),
                fed: kept,
                generated: 0,
                logits: vec![0.0; vocab_size],
                raw_logits: Vec::new(),
                chunk_logits: Vec::new(),
                last_token: None,
                job,
            });
        }
        let ended = step(kv, cfg, &mut slots, metrics)?;
        steps += 1;
        for (i, mut tokens) in ended {
            tokens.truncate(kv.len(i));
            held[i] = tokens;
            freed_at[i] = steps;
        }
        let used: usize = (0..slots.len())
            .filter(|&i| slots[i].is_some())
            .map(|i| kv.len(i))
            .sum();
        metrics.kv_used.store(used, Ordering::Relaxed);
    }
}

/// Most prompt tokens a step runs of a request that asked for its prompt's logprobs: each
/// position's logits are kept (`vocab_size` floats a token).
const PROMPT_LOGPROBS_CHUNK: usize = 16;

/// After a step ran `n` tokens of `r` with every position's logits (`chunk_logits`): sends the
/// logprobs of the prompt tokens those positions predict, and hands the last position's logits
/// on when the chunk ended the prompt.
fn report_prompt_logprobs(r: &mut Running, n: usize) {
    let vocab = r.logits.len();
    let top = r.job.logprobs.unwrap_or(0);
    let entries: Vec<TokenLogprobs> = (0..n)
        .filter_map(|j| {
            let next = *r.job.prompt.get(r.fed + j + 1)?;
            Some(token_logprobs(
                &r.chunk_logits[j * vocab..][..vocab],
                next,
                top,
            ))
        })
        .collect();
    if r.fed + n == r.tokens.len() {
        r.logits
            .copy_from_slice(&r.chunk_logits[(n - 1) * vocab..][..vocab]);
    }
    r.chunk_logits.clear();
    if !entries.is_empty() {
        let _ = r.job.events.send(Event::PromptLogprobs(entries));
    }
}

/// How many tokens `a` and `b` start with in common.
fn shared_start(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// One forward pass over every running request's next tokens, then sampling and reporting.
/// Returns the slots whose requests ended, each with the request's tokens.
fn step(
    kv: &mut dyn KvSlots,
    cfg: &EngineConfig,
    slots: &mut [Option<Running>],
    metrics: &Metrics,
) -> Result<Vec<(usize, Vec<u32>)>> {
    // Decode tokens first (one each), then prefill chunks in the budget that is left.
    let mut budget = cfg.batch;
    let mut take = vec![0usize; slots.len()];
    for (t, s) in take.iter_mut().zip(slots.iter()) {
        if let Some(r) = s {
            if r.tokens.len() - r.fed == 1 && budget > 0 {
                *t = 1;
                budget -= 1;
            }
        }
    }
    for (t, s) in take.iter_mut().zip(slots.iter()) {
        if let Some(r) = s {
            let pending = r.tokens.len() - r.fed;
            if pending > 1 && budget > 0 {
                *t = pending.min(budget);
                if r.job.prompt_logprobs {
                    *t = (*t).min(PROMPT_LOGPROBS_CHUNK);
                }
                budget -= *t;
            }
        }
    }
    // Prompt tokens in this step (the rest of `take` are generated tokens fed back).
    let prefill: usize = slots
        .iter()
        .zip(&take)
        .filter_map(|(s, &n)| {
            s.as_ref()
                .map(|r| n.min(r.job.prompt.len().saturating_sub(r.fed)))
        })
        .sum();
    let mut inputs: Vec<&[u32]> = Vec::new();
    let mut wants: Vec<Want<'_>> = Vec::new();
    let mut running: Vec<usize> = Vec::new();
    for (i, (s, &n)) in slots.iter_mut().zip(&take).enumerate() {
        let Some(Running {
            job,
            tokens,
            fed,
            logits,
            chunk_logits,
            ..
        }) = s
        else {
            continue;
        };
        if n == 0 {
            continue;
        }
        inputs.push(&tokens[*fed..*fed + n]);
        // Logits only where the chunk reaches the last token, or at every position of a
        // prompt chunk whose logprobs are asked for.
        wants.push(if job.prompt_logprobs && *fed + 1 < job.prompt.len() {
            chunk_logits.resize(n * logits.len(), 0.0);
            Want::AllLogits(chunk_logits)
        } else if *fed + n == tokens.len() {
            Want::LastLogits(logits)
        } else {
            Want::Nothing
        });
        running.push(i);
    }
    if inputs.is_empty() {
        return Ok(Vec::new());
    }
    kv.forward(&running, &inputs, &mut wants)?;
    metrics
        .prompt_tokens
        .fetch_add(prefill as u64, Ordering::Relaxed);
    drop((inputs, wants));

    let mut ended = Vec::new();
    for (i, (s, &n)) in slots.iter_mut().zip(&take).enumerate() {
        let Some(r) = s.as_mut() else { continue };
        if n == 0 {
            continue;
        }
        if !r.chunk_logits.is_empty() {
            report_prompt_logprobs(r, n);
        }
        r.fed += n;
        if r.fed < r.tokens.len() {
            continue;
        }
        let outcome = next_token(r, cfg, metrics);
        let finished = match outcome {
            Outcome::Continue => None,
            Outcome::Finished(f) => Some(Some(f)),
            Outcome::Gone => Some(None),
        };
        if let Some(finish) = finished {
            match finish {
                Some(finish) => {
                    let _ = r.job.events.send(Event::Done {
                        finish,
                        prompt_tokens: r.job.prompt.len(),
                        completion_tokens: r.generated,
                    });
                    let counter = match finish {
                        Finish::Stop => &metrics.finished_stop,
                        Finish::Length => &metrics.finished_length,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                None if r.job.stopped_by_text.load(Ordering::Relaxed) => {
                    metrics.finished_stop.fetch_add(1, Ordering::Relaxed);
                }
                None => {
                    metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                }
            }
            metrics.running.fetch_sub(1, Ordering::Relaxed);
            if let Some(r) = s.take() {
                ended.push((i, r.tokens));
            }
        }
    }
    Ok(ended)
}

enum Outcome {
    Continue,
    Finished(Finish),
    /// The client went away.
    Gone,
}

/// Samples a request's next token from its logits and reports it.
fn next_token(r: &mut Running, cfg: &EngineConfig, metrics: &Metrics) -> Outcome {
    if r.job.events.is_closed() {
        return Outcome::Gone;
    }
    // `max_tokens` 0 (with `echo`): the prompt alone.
    if r.job.max_tokens == 0 {
        return Outcome::Finished(Finish::Length);
    }
    if r.job.logprobs.is_some() {
        r.raw_logits.clone_from(&r.logits);
    }
    for &(t, bias) in &r.job.logit_bias {
        if let Some(l) = r.logits.get_mut(t as usize) {
            *l += bias;
        }
    }
    let token = match &mut r.job.constraint {
        Some(constraint) => {
            constraint.sample(&mut r.sampler, &mut r.logits, &r.tokens, &r.job.stop)
        }
        None => r
            .sampler
            .sample(&mut r.logits, &r.tokens)
            .map_err(anyhow::Error::from),
    };
    let token = match token {
        Ok(t) => t,
        Err(e) => {
            let _ = r.job.events.send(Event::Failed(format!("{e:#}")));
            return Outcome::Gone;
        }
    };
    if r.job.stop.contains(&token) {
        return Outcome::Finished(Finish::Stop);
    }
    let now = Instant::now();
    match r.last_token {
        None => metrics
            .time_to_first_token
            .observe((now - r.job.arrived).as_secs_f64()),
        Some(t) => metrics.inter_token.observe((now - t).as_secs_f64()),
    }
    r.last_token = Some(now);
    metrics.generation_tokens.fetch_add(1, Ordering::Relaxed);
    let logprobs = r
        .job
        .logprobs
        .map(|n| token_logprobs(&r.raw_logits, token, n));
    if r.job
        .events
        .send(Event::Token {
            id: token,
            logprobs,
        })
        .is_err()
    {
        return Outcome::Gone;
    }
    r.generated += 1;
    r.tokens.push(token);
    // The token just sampled is fed at the next step, if there is room for it.
    if r.generated >= r.job.max_tokens || r.tokens.len() > cfg.ctx {
        return Outcome::Finished(Finish::Length);
    }
    Outcome::Continue
}

/// `token`'s log-probability under `logits` and the `n` likeliest tokens' (ids within the
/// vocabulary: the sampler chose `token` from these logits).
fn token_logprobs(logits: &[f32], token: u32, n: usize) -> TokenLogprobs {
    let dist = LogSoftmax::of(logits);
    let mut ids = Vec::with_capacity(n);
    top_ids(logits, n, &mut ids);
    TokenLogprobs {
        logprob: dist.log_prob(logits[token as usize]),
        top: ids
            .into_iter()
            .map(|t| (t, dist.log_prob(logits[t as usize])))
            .collect(),
    }
}
