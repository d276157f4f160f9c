//! `Exec`: the one hook for parallelism. The core splits work into independent chunks of an
//! output slice; an executor decides where they run. `Serial` runs them in order; the std
//! frontend runs them on a rayon pool, and an embedded caller may use its RTOS threads.
use crate::error::Result;

/// The work of one chunk: its index and its part of the output.
pub type ChunkFn<'f> = dyn Fn(usize, &mut [f32]) -> Result<()> + Sync + 'f;

/// The work of one chunk of bytes (a mat-mul's quantized input): its index and its part.
pub type ByteChunkFn<'f> = dyn Fn(usize, &mut [u8]) -> Result<()> + Sync + 'f;

/// How the core runs work on several threads: the one hook between it and a thread pool.
/// `Serial` runs everything on the calling thread; the std frontend implements it with rayon, a
/// firmware with its RTOS's threads.
pub trait Exec: Sync {
    /// How many chunks can usefully run at once.
    fn threads(&self) -> usize;

    /// Calls `f(i, chunk)` for every `chunk_len`-long chunk of `out` (the last may be shorter), in
    /// any order and possibly at once, and returns the first error any call returned.
    ///
    /// # Errors
    /// The first error a call of `f` returned.
    fn for_each_chunk(&self, out: &mut [f32], chunk_len: usize, f: &ChunkFn<'_>) -> Result<()>;

    /// As `for_each_chunk`, over bytes: a prefill quantizes its mat-muls' inputs this way. The
    /// default runs the chunks in order on the calling thread; an executor with threads splits
    /// them as it splits `for_each_chunk`'s (a serial quantizer took 3% of SmolLM2 Q8_0's
    /// prefill on two threads, the other thread waiting).
    ///
    /// # Errors
    /// The first error a call of `f` returned.
    fn for_each_byte_chunk(
        &self,
        out: &mut [u8],
        chunk_len: usize,
        f: &ByteChunkFn<'_>,
    ) -> Result<()> {
        in_order(out, chunk_len, f)
    }

    /// Runs `f`, which will call `for_each_chunk` many times, where those calls are cheapest: a
    /// thread pool runs it on one of its own threads, so that each call splits work among the
    /// pool directly instead of handing it over from outside and waiting.
    fn run(&self, f: &mut (dyn FnMut() + Send)) {
        f()
    }
}

/// Runs every chunk on the calling thread.
#[derive(Debug, Default, Clone, Copy)]
pub struct Serial;

impl Exec for Serial {
    fn threads(&self) -> usize {
        1
    }

    fn for_each_chunk(&self, out: &mut [f32], chunk_len: usize, f: &ChunkFn<'_>) -> Result<()> {
        in_order(out, chunk_len, f)
    }
}

/// `f(i, chunk)` for every `chunk_len`-long chunk of `out` (the last may be shorter), in order
/// on the calling thread: `Serial`'s way, and an executor's with one thread.
///
/// # Errors
/// The first error a call of `f` returned; the chunks after it do not run.
pub fn in_order<T>(
    out: &mut [T],
    chunk_len: usize,
    f: &(dyn Fn(usize, &mut [T]) -> Result<()> + Sync + '_),
) -> Result<()> {
    for (i, c) in out.chunks_mut(chunk_len.max(1)).enumerate() {
        f(i, c)?;
    }
    Ok(())
}
