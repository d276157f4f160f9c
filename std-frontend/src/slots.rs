//! KV slots: the caches of several sequences that run together, one forward pass over the next
//! tokens of any of them (`sapient serve`'s requests, `sapient bench --parallel`'s sequences), in
//! CPU memory with the mat-muls on a thread pool, or in one GPU session.
use anyhow::Result;
use sapient_core::{Config, Exec, KvCache, KvFormat, Model, Scratch, Want};

use crate::run::{self, CpuRunner, Pooling};

/// Where KV slots live and their forward passes run.
pub trait KvSlots {
    fn config(&self) -> &Config;
    /// Positions held in `slot`'s cache.
    fn len(&self, slot: usize) -> usize;
    /// Drops `slot`'s positions from `len` on.
    fn truncate(&mut self, slot: usize, len: usize);
    /// One forward pass: `tokens[i]` continues the sequence in slot `slots[i]` (ascending, each
    /// once) and fills `wants[i]`.
    fn forward(&mut self, slots: &[usize], tokens: &[&[u32]], wants: &mut [Want<'_>])
        -> Result<()>;
    /// Normalized mean-pooled embeddings of `texts`, apart from the slots.
    fn embeddings(&mut self, texts: &[&[u32]], max_batch: usize) -> Result<Vec<Vec<f32>>>;
}

/// KV slots in CPU memory (each an arena of its own), mat-muls on `exec`.
struct CpuSlots<'a, 'm, 'w, E> {
    model: &'m Model<'w>,
    exec: &'m E,
    kv: KvFormat,
    caches: Vec<KvCache<'a>>,
    scratch: Scratch<'a>,
}

impl<E: Exec> KvSlots for CpuSlots<'_, '_, '_, E> {
    fn config(&self) -> &Config {
        &self.model.config
    }

    fn len(&self, slot: usize) -> usize {
        self.caches[slot].len()
    }

    fn truncate(&mut self, slot: usize, len: usize) {
        self.caches[slot].truncate(len);
    }

    fn forward(
        &mut self,
        slots: &[usize],
        tokens: &[&[u32]],
        wants: &mut [Want<'_>],
    ) -> Result<()> {
        let mut refs: Vec<&mut KvCache<'_>> = self
            .caches
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| slots.contains(i))
            .map(|(_, c)| c)
            .collect();
        if refs.len() != slots.len() || !slots.is_sorted() {
            anyhow::bail!("a forward pass names each KV slot once, in order");
        }
        let (model, exec) = (self.model, self.exec);
        model.forward_many(tokens, &mut refs, &mut self.scratch, exec, wants)?;
        Ok(())
    }

    fn embeddings(&mut self, texts: &[&[u32]], max_batch: usize) -> Result<Vec<Vec<f32>>> {
        let runner = CpuRunner::new(self.model, self.kv, self.exec);
        run::embeddings(&runner, texts, Pooling::Mean, true, max_batch)
    }
}

/// Calls `f` with `n` KV slots of `ctx` positions in `kv` format in CPU memory, running batches
/// of up to `max_batch` tokens of `model` on `exec`.
pub fn with_cpu_slots<R, E: Exec>(
    model: &Model<'_>,
    exec: &E,
    kv: KvFormat,
    (n, ctx, max_batch): (usize, usize, usize),
    f: impl FnOnce(&mut dyn KvSlots) -> Result<R>,
) -> Result<R> {
    let c = &model.config;
    let slot_bytes = KvCache::bytes_needed(c, ctx, kv)?;
    let mut arenas = (0..n)
        .map(|_| run::zeroed::<u8>(slot_bytes, "a KV slot"))
        .collect::<Result<Vec<_>>>()?;
    let caches = arenas
        .iter_mut()
        .map(|m| KvCache::new(c, ctx, kv, m))
        .collect::<sapient_core::Result<Vec<_>>>()?;
    let mut scratch_mem = run::zeroed::<f32>(
        Scratch::bytes_needed(c, max_batch)?.div_ceil(4),
        "the scratch",
    )?;
    let scratch = Scratch::new(c, max_batch, bytemuck::cast_slice_mut(&mut scratch_mem))?;
    f(&mut CpuSlots {
        model,
        exec,
        kv,
        caches,
        scratch,
    })
}

/// KV slots in one GPU session.
#[cfg(feature = "gpu")]
struct GpuSlots<'m> {
    model: &'m crate::gpu::GpuModel,
    session: crate::gpu::GpuSession<'m>,
}

#[cfg(feature = "gpu")]
impl KvSlots for GpuSlots<'_> {
    fn config(&self) -> &Config {
        run::Runner::config(self.model)
    }

    fn len(&self, slot: usize) -> usize {
        self.session.slot_len(slot)
    }

    fn truncate(&mut self, slot: usize, len: usize) {
        self.session.truncate_slot(slot, len);
    }

    fn forward(
        &mut self,
        slots: &[usize],
        tokens: &[&[u32]],
        wants: &mut [Want<'_>],
    ) -> Result<()> {
        self.session.forward_slots(slots, tokens, wants)
    }

    fn embeddings(&mut self, texts: &[&[u32]], max_batch: usize) -> Result<Vec<Vec<f32>>> {
        run::embeddings(self.model, texts, Pooling::Mean, true, max_batch)
    }
}

/// Calls `f` with `n` KV slots of `ctx` positions in one GPU session of `model` that runs
/// batches of up to `max_batch` tokens.
#[cfg(feature = "gpu")]
pub fn with_gpu_slots<R>(
    model: &crate::gpu::GpuModel,
    (n, ctx, max_batch): (usize, usize, usize),
    f: impl FnOnce(&mut dyn KvSlots) -> Result<R>,
) -> Result<R> {
    let session = crate::gpu::GpuSession::with_slots(model, n, ctx, max_batch)?;
    f(&mut GpuSlots { model, session })
}
