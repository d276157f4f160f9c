//! Running a model on a backend: sessions (a KV cache and working memory) and what the CLI and
//! the tests do with them.
use anyhow::Result;
use sapient_core::exec::Exec;
use sapient_core::model::mean_rows;
use sapient_core::{Config, KvCache, KvFormat, Model, Scratch, Want};

/// Tokens processed per batch when none is asked for: enough to tile every weight block over many
/// tokens, small enough that the scratch stays a few MiB for small models.
pub const DEFAULT_BATCH: usize = 256;

/// A model with a KV cache and working memory on one backend: what generation, perplexity and
/// the benchmarks drive.
pub trait Session {
    fn config(&self) -> &Config;
    /// Runs `tokens` after the positions the cache holds, and fills `want`.
    fn forward(&mut self, tokens: &[u32], want: Want<'_>) -> Result<()>;
    /// Positions the cache holds.
    fn kv_len(&self) -> usize;
    /// Positions the cache can hold.
    fn max_seq(&self) -> usize;
    /// Forgets every position after the first `len`.
    fn truncate(&mut self, len: usize);
    /// GPU dispatches the last one-token forward pass recorded (none on the CPU).
    fn dispatches_per_token(&self) -> Option<usize> {
        None
    }
    /// Starts timing every kernel on the device (`bench --profile`); an error where the backend
    /// cannot.
    fn time_kernels(&mut self) -> Result<()> {
        anyhow::bail!("kernel times need the GPU backend")
    }
    /// The kernel times since `time_kernels` or the last call.
    fn take_kernel_times(&mut self) -> KernelTimes {
        KernelTimes::default()
    }
}

/// One kernel's time on the device over the passes timed.
#[derive(Debug, Clone)]
pub struct KernelTime {
    pub kernel: &'static str,
    pub calls: u64,
    pub nanos: f64,
}

/// Kernel times on the device, from timestamps on each side of every dispatch, and the host's.
#[derive(Debug, Clone, Default)]
pub struct KernelTimes {
    pub kernels: Vec<KernelTime>,
    /// From each submission's first timestamp to its last, summed: the kernels, and the gaps
    /// between them that the GPU spent on barriers and starting the next.
    pub span_nanos: f64,
    /// The host's time recording and submitting each submission, from its first dispatch to the
    /// queue taking it.
    pub host_nanos: f64,
    /// Dispatches past the timestamps a submission holds.
    pub untimed: u64,
}

impl KernelTimes {
    /// Counts `calls` of `kernel` that took `nanos` in all.
    pub fn count(&mut self, kernel: &'static str, calls: u64, nanos: f64) {
        match self.kernels.iter_mut().find(|k| k.kernel == kernel) {
            Some(k) => {
                k.calls += calls;
                k.nanos += nanos;
            }
            None => self.kernels.push(KernelTime {
                kernel,
                calls,
                nanos,
            }),
        }
    }

    /// Adds `other`'s times to these.
    pub fn add(&mut self, other: KernelTimes) {
        for k in other.kernels {
            self.count(k.kernel, k.calls, k.nanos);
        }
        self.span_nanos += other.span_nanos;
        self.host_nanos += other.host_nanos;
        self.untimed += other.untimed;
    }
}

/// A model on a backend, which opens sessions.
pub trait Runner {
    fn config(&self) -> &Config;
    /// Calls `f` with a session of `max_seq` positions that runs up to `max_batch` tokens at once.
    fn with_session<R>(
        &self,
        max_seq: usize,
        max_batch: usize,
        f: impl FnOnce(&mut dyn Session) -> Result<R>,
    ) -> Result<R>;

    /// Runs independent sequences from empty caches and fills `wants[s]` for `tokens[s]`. A
    /// backend that can runs them in shared batches of up to `max_batch` tokens (the weights
    /// read once for all); this default runs them one after another.
    fn forward_sequences(
        &self,
        tokens: &[&[u32]],
        wants: &mut [Want<'_>],
        max_batch: usize,
    ) -> Result<()> {
        anyhow::ensure!(tokens.len() == wants.len(), "one want per sequence");
        for (seq, want) in tokens.iter().zip(wants.iter_mut()) {
            let want = reborrow(want);
            let batch = seq.len().clamp(1, max_batch);
            self.with_session(seq.len(), batch, |s| s.forward(seq, want))?;
        }
        Ok(())
    }
}

/// A shorter-lived `Want` over the same output.
fn reborrow<'a>(want: &'a mut Want<'_>) -> Want<'a> {
    match want {
        Want::Nothing => Want::Nothing,
        Want::LastLogits(o) => Want::LastLogits(o),
        Want::LastArgmax(id) => Want::LastArgmax(id),
        Want::AllLogits(o) => Want::AllLogits(o),
        Want::Hidden(o) => Want::Hidden(o),
    }
}

/// The CPU backend: the core's `Model` with a KV format and an executor.
pub struct CpuRunner<'m, 'w, E> {
    pub model: &'m Model<'w>,
    pub kv: KvFormat,
    pub exec: &'m E,
}

impl<'m, 'w, E: Exec> CpuRunner<'m, 'w, E> {
    pub fn new(model: &'m Model<'w>, kv: KvFormat, exec: &'m E) -> Self {
        CpuRunner { model, kv, exec }
    }
}

impl<E: Exec> Runner for CpuRunner<'_, '_, E> {
    fn config(&self) -> &Config {
        &self.model.config
    }

    fn with_session<R>(
        &self,
        max_seq: usize,
        max_batch: usize,
        f: impl FnOnce(&mut dyn Session) -> Result<R>,
    ) -> Result<R> {
        let c = &self.model.config;
        let mut arenas = Arenas::new(c, max_seq, self.kv, max_batch)?;
        let (cache, scratch) = arenas.borrow(c)?;
        f(&mut CpuSession {
            model: self.model,
            cache,
            scratch,
            exec: self.exec,
        })
    }

    /// All sequences in one `forward_many`: one KV arena cut into a cache per sequence.
    fn forward_sequences(
        &self,
        tokens: &[&[u32]],
        wants: &mut [Want<'_>],
        max_batch: usize,
    ) -> Result<()> {
        let c = &self.model.config;
        let sizes = tokens
            .iter()
            .map(|t| KvCache::bytes_needed(c, t.len(), self.kv))
            .collect::<sapient_core::Result<Vec<usize>>>()?;
        let mut kv = zeroed::<u8>(sizes.iter().sum(), "the KV caches")?;
        let mut caches = Vec::with_capacity(tokens.len());
        let mut rest = kv.as_mut_slice();
        for (t, size) in tokens.iter().zip(&sizes) {
            let (mem, tail) = rest.split_at_mut(*size);
            caches.push(KvCache::new(c, t.len(), self.kv, mem)?);
            rest = tail;
        }
        let mut caches: Vec<&mut KvCache<'_>> = caches.iter_mut().collect();
        let batch = max_batch.max(1);
        let mut scratch =
            zeroed::<f32>(Scratch::bytes_needed(c, batch)?.div_ceil(4), "the scratch")?;
        let mut scratch = Scratch::new(c, batch, bytemuck::cast_slice_mut(&mut scratch))?;
        Ok(self
            .model
            .forward_many(tokens, &mut caches, &mut scratch, self.exec, wants)?)
    }
}

/// A CPU session over heap arenas.
pub struct CpuSession<'a, 'w, E> {
    pub model: &'a Model<'w>,
    pub cache: KvCache<'a>,
    pub scratch: Scratch<'a>,
    pub exec: &'a E,
}

impl<E: Exec> Session for CpuSession<'_, '_, E> {
    fn config(&self) -> &Config {
        &self.model.config
    }

    fn forward(&mut self, tokens: &[u32], want: Want<'_>) -> Result<()> {
        let (cache, scratch) = (&mut self.cache, &mut self.scratch);
        Ok(self
            .model
            .forward(tokens, cache, scratch, self.exec, want)?)
    }

    fn kv_len(&self) -> usize {
        self.cache.len()
    }

    fn max_seq(&self) -> usize {
        self.cache.max_seq()
    }

    fn truncate(&mut self, len: usize) {
        self.cache.truncate(len)
    }
}

/// Heap memory for a KV cache and a scratch, sized with the core's `bytes_needed`.
/// `n` zeroed elements for `what`, or an error naming it when the allocator cannot give them (a
/// `--ctx` or `--parallel` too large for this machine), where `vec!` would abort the process.
/// The fallible reservation is a probe, dropped at once: `vec!` then gets zeroed pages from
/// the OS, touched only as the cache fills, where writing the zeros would touch them all.
pub fn zeroed<T: Clone + Default>(n: usize, what: &str) -> Result<Vec<T>> {
    let mut probe: Vec<T> = Vec::new();
    probe.try_reserve_exact(n).map_err(|_| {
        anyhow::anyhow!(
            "cannot allocate {} MiB for {what}: more than this machine gives (ask for a shorter context or fewer sequences)",
            (n as u128 * core::mem::size_of::<T>() as u128) >> 20
        )
    })?;
    drop(probe);
    Ok(vec![T::default(); n])
}

pub struct Arenas {
    pub kv: Vec<u8>,
    scratch: Vec<f32>,
    pub max_seq: usize,
    pub kv_format: KvFormat,
    pub max_batch: usize,
}

impl Arenas {
    pub fn new(
        config: &Config,
        max_seq: usize,
        kv_format: KvFormat,
        max_batch: usize,
    ) -> Result<Self> {
        let kv = zeroed(
            KvCache::bytes_needed(config, max_seq, kv_format)?,
            "the KV cache",
        )?;
        // A Vec<f32> gives the scratch the 4-byte alignment it needs.
        let scratch = zeroed(
            Scratch::bytes_needed(config, max_batch)?.div_ceil(4),
            "the scratch",
        )?;
        Ok(Arenas {
            kv,
            scratch,
            max_seq,
            kv_format,
            max_batch,
        })
    }

    /// An empty KV cache and a scratch over these arenas.
    pub fn borrow(&mut self, config: &Config) -> Result<(KvCache<'_>, Scratch<'_>)> {
        let cache = KvCache::new(config, self.max_seq, self.kv_format, &mut self.kv)?;
        let scratch = Scratch::new(
            config,
            self.max_batch,
            bytemuck::cast_slice_mut(&mut self.scratch),
        )?;
        Ok((cache, scratch))
    }
}

/// Logits of the last position, or of every position when `all`.
pub fn logits(runner: &impl Runner, tokens: &[u32], all: bool) -> Result<Vec<Vec<f32>>> {
    let vocab = runner.config().vocab_size;
    let batch = tokens.len().clamp(1, DEFAULT_BATCH);
    runner.with_session(tokens.len(), batch, |s| {
        let rows = if all { tokens.len() } else { 1 };
        let mut out = vec![0f32; rows * vocab];
        let want = if all {
            Want::AllLogits(&mut out)
        } else {
            Want::LastLogits(&mut out)
        };
        s.forward(tokens, want)?;
        Ok(out.chunks(vocab).map(<[f32]>::to_vec).collect())
    })
}

/// Greedy continuation of `prompt`: up to `max_tokens` tokens, stopping after any of `stop`.
pub fn greedy(
    runner: &impl Runner,
    prompt: &[u32],
    max_tokens: usize,
    stop: &[u32],
) -> Result<Vec<u32>> {
    let batch = prompt.len().clamp(1, DEFAULT_BATCH);
    runner.with_session(prompt.len() + max_tokens, batch, |s| {
        let mut out = Vec::with_capacity(max_tokens);
        let mut input = prompt.to_vec();
        while out.len() < max_tokens {
            let mut next = 0;
            s.forward(&input, Want::LastArgmax(&mut next))?;
            out.push(next);
            if stop.contains(&next) {
                break;
            }
            input.clear();
            input.push(next);
        }
        Ok(out)
    })
}

/// Final hidden states (after the final norm) of every position, `n × hidden`.
pub fn hidden_states(runner: &impl Runner, tokens: &[u32]) -> Result<Vec<f32>> {
    let hidden = runner.config().hidden_size;
    let batch = tokens.len().clamp(1, DEFAULT_BATCH);
    runner.with_session(tokens.len(), batch, |s| {
        let mut out = vec![0f32; tokens.len() * hidden];
        s.forward(tokens, Want::Hidden(&mut out))?;
        Ok(out)
    })
}

/// The mean of the final hidden states over positions.
pub fn embedding(runner: &impl Runner, tokens: &[u32]) -> Result<Vec<f32>> {
    Ok(embeddings(runner, &[tokens], Pooling::Mean, false, DEFAULT_BATCH)?.remove(0))
}

/// How an embedding is made from a text's final hidden states (after the final norm).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over positions.
    Mean,
    /// The last position's (for models trained to put the text's meaning there, such as
    /// decoder embedding models that end each text with EOS).
    Last,
}

/// One embedding per text, `hidden_size` values each (scaled to unit length when `normalize`).
/// Texts share forward passes: as many as fit in `max_batch` tokens (and the core's
/// `MAX_SEGMENTS` sequences) go through the model together; a longer text runs alone, in
/// batches.
pub fn embeddings(
    runner: &impl Runner,
    texts: &[&[u32]],
    pooling: Pooling,
    normalize: bool,
    max_batch: usize,
) -> Result<Vec<Vec<f32>>> {
    if let Some(i) = texts.iter().position(|t| t.is_empty()) {
        anyhow::bail!("text {} has no tokens: nothing to embed", i + 1);
    }
    let h = runner.config().hidden_size;
    let mut out = Vec::with_capacity(texts.len());
    let mut start = 0;
    while start < texts.len() {
        // The next group: texts while their tokens fit in one batch (at least one text).
        let mut end = start + 1;
        let mut total = texts[start].len();
        while end < texts.len()
            && end - start < sapient_core::model::MAX_SEGMENTS
            && total + texts[end].len() <= max_batch
        {
            total += texts[end].len();
            end += 1;
        }
        let group = &texts[start..end];
        let mut hidden: Vec<Vec<f32>> = group.iter().map(|t| vec![0f32; t.len() * h]).collect();
        let mut wants: Vec<Want<'_>> = hidden.iter_mut().map(|o| Want::Hidden(o)).collect();
        runner.forward_sequences(group, &mut wants, max_batch)?;
        for rows in &hidden {
            let mut e = vec![0f32; h];
            match pooling {
                Pooling::Mean => mean_rows(rows, h, &mut e)?,
                Pooling::Last => e.copy_from_slice(&rows[rows.len() - h..]),
            }
            if normalize {
                let norm = e.iter().map(|v| v * v).sum::<f32>().sqrt();
                if norm > 0.0 {
                    e.iter_mut().for_each(|v| *v /= norm);
                }
            }
            out.push(e);
        }
        start = end;
    }
    Ok(out)
}

/// How `perplexity` cuts a text into windows and which predictions it scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PerplexityRecipe {
    /// Non-overlapping windows of `ctx` tokens, the text's own tokens only, every prediction
    /// inside a window scored (transformers' usual evaluation).
    EveryPosition,
    /// llama.cpp's `llama-perplexity`: the same windows, the first token of each replaced by
    /// `bos` where the model has one, and only the predictions of the second half of each window
    /// scored (positions `ctx / 2 .. ctx - 1`), so every scored token has at least half a window
    /// of context. Its numbers compare with llama-perplexity's on the same tokens.
    LlamaCpp { bos: Option<u32> },
}

/// Perplexity of `tokens` in windows of `ctx` as `recipe` says: `(exp(mean NLL), scored)`.
pub fn perplexity(
    runner: &impl Runner,
    tokens: &[u32],
    ctx: usize,
    recipe: PerplexityRecipe,
) -> Result<(f64, usize)> {
    anyhow::ensure!(ctx >= 2, "--ctx must be at least 2");
    let windows = match recipe {
        PerplexityRecipe::EveryPosition => 1,
        // llama-perplexity refuses fewer than two windows.
        PerplexityRecipe::LlamaCpp { .. } => 2,
    };
    anyhow::ensure!(
        tokens.len() >= windows * ctx,
        "the text has {} tokens, fewer than {windows} window(s) of {ctx}",
        tokens.len()
    );
    let first_scored = match recipe {
        PerplexityRecipe::EveryPosition => 0,
        PerplexityRecipe::LlamaCpp { .. } => ctx / 2,
    };
    let vocab = runner.config().vocab_size;
    let batch = ctx.min(64);
    runner.with_session(ctx, batch, |s| {
        let mut logits = vec![0f32; batch * vocab];
        let mut window = vec![0u32; ctx];
        let (mut nll, mut scored) = (0f64, 0usize);
        for text in tokens.chunks_exact(ctx) {
            window.copy_from_slice(text);
            if let PerplexityRecipe::LlamaCpp { bos: Some(bos) } = recipe {
                window[0] = bos;
            }
            s.truncate(0);
            for (b, part) in window.chunks(batch).enumerate() {
                let out = &mut logits[..part.len() * vocab];
                s.forward(part, Want::AllLogits(out))?;
                for (i, row) in out.chunks_exact(vocab).enumerate() {
                    let pos = b * batch + i;
                    if pos >= first_scored && pos + 1 < ctx {
                        nll -= log_softmax_at(row, window[pos + 1] as usize);
                        scored += 1;
                    }
                }
            }
        }
        Ok(((nll / scored as f64).exp(), scored))
    })
}

fn log_softmax_at(row: &[f32], target: usize) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v)) as f64;
    let sum: f64 = row.iter().map(|v| (*v as f64 - max).exp()).sum();
    row[target] as f64 - max - sum.ln()
}
