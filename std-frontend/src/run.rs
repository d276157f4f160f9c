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

/// The index of the largest value (the first one on ties), as greedy decoding picks it.
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
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
        let next = argmax(&logits);
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
