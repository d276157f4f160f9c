//! Running a model with arenas from the heap: what the CLI and the tests share.
use anyhow::Result;
use sapient_core::exec::Exec;
use sapient_core::model::mean_rows;
use sapient_core::{Config, KvCache, KvFormat, Model, Scratch, Want};

/// Tokens processed per batch when none is asked for: enough to tile every weight block over many
/// tokens, small enough that the scratch stays a few MiB for small models.
pub const DEFAULT_BATCH: usize = 256;

/// Heap memory for a KV cache and a scratch, sized with the core's `bytes_needed`.
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
        let kv = vec![0u8; KvCache::bytes_needed(config, max_seq, kv_format)?];
        // A Vec<f32> gives the scratch the 4-byte alignment it needs.
        let scratch = vec![0f32; Scratch::bytes_needed(config, max_batch)?.div_ceil(4)];
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
pub fn logits<E: Exec>(
    model: &Model<'_>,
    tokens: &[u32],
    all: bool,
    kv: KvFormat,
    exec: &E,
) -> Result<Vec<Vec<f32>>> {
    let c = &model.config;
    let mut arenas = Arenas::new(c, tokens.len(), kv, tokens.len().clamp(1, DEFAULT_BATCH))?;
    let (mut cache, mut scratch) = arenas.borrow(c)?;
    let rows = if all { tokens.len() } else { 1 };
    let mut out = vec![0f32; rows * c.vocab_size];
    let want = if all {
        Want::AllLogits(&mut out)
    } else {
        Want::LastLogits(&mut out)
    };
    model.forward(tokens, &mut cache, &mut scratch, exec, want)?;
    Ok(out.chunks(c.vocab_size).map(<[f32]>::to_vec).collect())
}

/// Greedy continuation of `prompt`: up to `max_tokens` tokens, stopping after any of `stop`.
pub fn greedy<E: Exec>(
    model: &Model<'_>,
    prompt: &[u32],
    max_tokens: usize,
    stop: &[u32],
    kv: KvFormat,
    exec: &E,
) -> Result<Vec<u32>> {
    let c = &model.config;
    let mut arenas = Arenas::new(
        c,
        prompt.len() + max_tokens,
        kv,
        prompt.len().clamp(1, DEFAULT_BATCH),
    )?;
    let (mut cache, mut scratch) = arenas.borrow(c)?;
    let mut logits = vec![0f32; c.vocab_size];
    let mut out = Vec::with_capacity(max_tokens);
    let mut input = prompt.to_vec();
    while out.len() < max_tokens {
        model.forward(
            &input,
            &mut cache,
            &mut scratch,
            exec,
            Want::LastLogits(&mut logits),
        )?;
        let next = sapient_core::sample::argmax(&logits);
        out.push(next);
        if stop.contains(&next) {
            break;
        }
        input.clear();
        input.push(next);
    }
    Ok(out)
}

/// Final hidden states (after the final norm) of every position, `n × hidden`.
pub fn hidden_states<E: Exec>(
    model: &Model<'_>,
    tokens: &[u32],
    kv: KvFormat,
    exec: &E,
) -> Result<Vec<f32>> {
    let c = &model.config;
    let mut arenas = Arenas::new(c, tokens.len(), kv, tokens.len().clamp(1, DEFAULT_BATCH))?;
    let (mut cache, mut scratch) = arenas.borrow(c)?;
    let mut hidden = vec![0f32; tokens.len() * c.hidden_size];
    model.forward(
        tokens,
        &mut cache,
        &mut scratch,
        exec,
        Want::Hidden(&mut hidden),
    )?;
    Ok(hidden)
}

/// The mean of the final hidden states over positions.
pub fn embedding<E: Exec>(
    model: &Model<'_>,
    tokens: &[u32],
    kv: KvFormat,
    exec: &E,
) -> Result<Vec<f32>> {
    let hidden = hidden_states(model, tokens, kv, exec)?;
    let mut out = vec![0f32; model.config.hidden_size];
    mean_rows(&hidden, model.config.hidden_size, &mut out)?;
    Ok(out)
}

/// Perplexity with llama.cpp's and the reference's recipe: non-overlapping windows of `ctx`
/// tokens (a partial last window is dropped), each from an empty cache, every token but the
/// first of a window scored; NLL summed in f64. Returns (ppl, scored tokens).
pub fn perplexity<E: Exec>(
    model: &Model<'_>,
    tokens: &[u32],
    ctx: usize,
    kv: KvFormat,
    exec: &E,
) -> Result<(f64, usize)> {
    anyhow::ensure!(ctx >= 2, "--ctx must be at least 2");
    anyhow::ensure!(
        tokens.len() >= ctx,
        "the text has {} tokens, fewer than one window of {ctx}",
        tokens.len()
    );
    let c = &model.config;
    let batch = ctx.min(64);
    let mut arenas = Arenas::new(c, ctx, kv, batch)?;
    let (mut cache, mut scratch) = arenas.borrow(c)?;
    let mut logits = vec![0f32; batch * c.vocab_size];
    let (mut nll, mut scored) = (0f64, 0usize);
    for window in tokens.chunks_exact(ctx) {
        cache.clear();
        for (b, part) in window.chunks(batch).enumerate() {
            let out = &mut logits[..part.len() * c.vocab_size];
            model.forward(part, &mut cache, &mut scratch, exec, Want::AllLogits(out))?;
            for (i, row) in out.chunks_exact(c.vocab_size).enumerate() {
                let pos = b * batch + i;
                if pos + 1 < ctx {
                    nll -= log_softmax_at(row, window[pos + 1] as usize);
                    scored += 1;
                }
            }
        }
    }
    Ok(((nll / scored as f64).exp(), scored))
}

fn log_softmax_at(row: &[f32], target: usize) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v)) as f64;
    let sum: f64 = row.iter().map(|v| (*v as f64 - max).exp()).sum();
    row[target] as f64 - max - sum.ln()
}
