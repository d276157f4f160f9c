//! `Exec` on a rayon pool built once.
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sapient_core::exec::{self, ByteChunkFn, ChunkFn, Exec};
use sapient_core::Result;

pub struct Rayon {
    pool: rayon::ThreadPool,
}

impl Rayon {
    /// A pool of `threads` threads; `None` means one per physical core.
    pub fn new(threads: Option<usize>) -> anyhow::Result<Self> {
        let n = threads.unwrap_or_else(num_cpus::get_physical).max(1);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(n).build()?;
        Ok(Rayon { pool })
    }
}

impl Exec for Rayon {
    fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    fn for_each_chunk(&self, out: &mut [f32], chunk_len: usize, f: &ChunkFn<'_>) -> Result<()> {
        self.split(out, chunk_len, f)
    }

    fn for_each_byte_chunk(
        &self,
        out: &mut [u8],
        chunk_len: usize,
        f: &ByteChunkFn<'_>,
    ) -> Result<()> {
        self.split(out, chunk_len, f)
    }

    /// Runs `f` on one of the pool's threads while the others look for its chunks without
    /// pause (`help_until`). Left to rayon, an idle thread falls asleep within tens of microseconds, less than
    /// the serial work between two of a decoded token's mat-vecs, and each mat-vec then began
    /// with a futex wake (3.5% of a 1.1B Q4_K_M decode's samples, a sleep and a wake per call).
    fn run(&self, f: &mut (dyn FnMut() + Send)) {
        if self.threads() == 1 {
            return self.pool.install(f);
        }
        let done = AtomicBool::new(false);
        let f = Mutex::new(f);
        self.pool.broadcast(|thread| {
            if thread.index() == 0 {
                let _done = SetOnDrop(&done);
                let mut f = f.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                f();
            } else {
                help_until(&done);
            }
        });
    }
}

impl Rayon {
    /// `for_each_chunk` over any elements: on the calling thread alone with one thread, else
    /// split by halves on the pool.
    fn split<T: Send>(
        &self,
        out: &mut [T],
        chunk_len: usize,
        f: &(dyn Fn(usize, &mut [T]) -> Result<()> + Sync),
    ) -> Result<()> {
        if self.threads() == 1 {
            return exec::in_order(out, chunk_len, f);
        }
        let mut split = || split_chunks(out, chunk_len.max(1), 0, f);
        // Inside `run` we are on one of the pool's threads already: split right here.
        if self.pool.current_thread_index().is_some() {
            split()
        } else {
            self.pool.install(split)
        }
    }
}

/// Runs the chunks of `out` (the first numbered `first`) by halves, one half possibly on another
/// thread. A half that waits for the other, stolen, half spins and runs other pending jobs
/// meanwhile, where rayon's own wait hands the CPU to the OS between looks (a system call each:
/// 4-5% faster decoding and prefill on two threads without them).
fn split_chunks<T: Send>(
    out: &mut [T],
    chunk_len: usize,
    first: usize,
    f: &(dyn Fn(usize, &mut [T]) -> Result<()> + Sync),
) -> Result<()> {
    let chunks = out.len().div_ceil(chunk_len);
    if chunks <= 1 {
        return if out.is_empty() {
            Ok(())
        } else {
            f(first, out)
        };
    }
    let half = chunks / 2;
    let (a, b) = out.split_at_mut(half * chunk_len);
    // 0: the second half has not started, 1: it runs (on another thread), 2: it is done.
    let second = AtomicU8::new(0);
    let (ra, rb) = rayon::join(
        || {
            let r = split_chunks(a, chunk_len, first, f);
            // Not started by now: `join` runs it here next. Started: it runs elsewhere, and
            // the OS gets the CPU now and then in case that thread waits for this one's core.
            let mut polls = 0u32;
            while second.load(Ordering::Acquire) == 1 {
                if rayon::yield_now() == Some(rayon::Yield::Executed) {
                    continue;
                }
                polls = polls.wrapping_add(1);
                if polls.is_multiple_of(64) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            r
        },
        || {
            second.store(1, Ordering::Release);
            let r = split_chunks(b, chunk_len, first + half, f);
            second.store(2, Ordering::Release);
            r
        },
    );
    ra.and(rb)
}

/// How long a helper looks for work that does not come before it leaves the rest of the pass
/// to rayon (which lets it sleep): far longer than the gaps between a forward pass's parallel
/// sections, short enough that a pass with long serial stretches, or a machine running more
/// threads than it has cores, does not keep a core spinning for nothing.
const IDLE_LIMIT: Duration = Duration::from_millis(1);

/// Runs the pool's pending jobs until `done`, or until none came for `IDLE_LIMIT`; while there
/// are none, spins, and lets the OS run something else now and then.
fn help_until(done: &AtomicBool) {
    let mut idle = 0u32;
    let mut idle_since = Instant::now();
    while !done.load(Ordering::Acquire) {
        if let Some(rayon::Yield::Executed) = rayon::yield_now() {
            idle = 0;
            continue;
        }
        if idle == 0 {
            idle_since = Instant::now();
        }
        idle = idle.wrapping_add(1);
        if idle.is_multiple_of(64) {
            if idle_since.elapsed() > IDLE_LIMIT {
                return;
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Sets its flag when dropped, so that the helpers stop even if `f` panics.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sapient_core::Error;

    /// Every chunk once, with its index, inside `run` and outside it, for lengths that are not
    /// multiples of the chunk length: of floats and of bytes.
    #[test]
    fn every_chunk_runs_once_with_its_index() {
        for threads in [1, 2, 3, 4] {
            let pool = Rayon::new(Some(threads)).unwrap();
            for (len, chunk_len) in [(0, 4), (1, 4), (7, 1), (10, 3), (64, 16), (1000, 7)] {
                let check = |exec: &Rayon| {
                    let mut out = vec![0.0f32; len];
                    exec.for_each_chunk(&mut out, chunk_len, &|i, c| {
                        assert!(c.len() <= chunk_len && !c.is_empty());
                        for v in c.iter_mut() {
                            *v += (i + 1) as f32;
                        }
                        Ok(())
                    })
                    .unwrap();
                    let want: Vec<f32> = (0..len).map(|j| (j / chunk_len + 1) as f32).collect();
                    assert_eq!(out, want, "{threads} threads, {len} by {chunk_len}");
                    let mut bytes = vec![0u8; len];
                    exec.for_each_byte_chunk(&mut bytes, chunk_len, &|i, c| {
                        assert!(c.len() <= chunk_len && !c.is_empty());
                        for v in c.iter_mut() {
                            *v = v.wrapping_add(i as u8 + 1);
                        }
                        Ok(())
                    })
                    .unwrap();
                    let want: Vec<u8> = want.iter().map(|&v| v as usize as u8).collect();
                    assert_eq!(
                        bytes, want,
                        "bytes: {threads} threads, {len} by {chunk_len}"
                    );
                };
                check(&pool);
                pool.run(&mut || check(&pool));
            }
        }
    }

    /// An error from any chunk comes back, and every other chunk still ran.
    #[test]
    fn a_chunk_error_is_returned() {
        let pool = Rayon::new(Some(2)).unwrap();
        let mut out = vec![0.0f32; 100];
        let r = pool.for_each_chunk(&mut out, 10, &|i, c| {
            c.fill(1.0);
            if i == 7 {
                Err(Error::InvalidArgument {
                    what: "chunk",
                    reason: "seven",
                })
            } else {
                Ok(())
            }
        });
        assert!(matches!(
            r,
            Err(Error::InvalidArgument {
                reason: "seven",
                ..
            })
        ));
        assert!(out.iter().all(|&v| v == 1.0));
    }
}
