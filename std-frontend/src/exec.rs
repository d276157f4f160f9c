//! `Exec` on a rayon pool built once.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use sapient_core::exec::{ChunkFn, Exec};
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
        if self.threads() == 1 {
            return sapient_core::Serial.for_each_chunk(out, chunk_len, f);
        }
        let mut split = || {
            out.par_chunks_mut(chunk_len.max(1))
                .enumerate()
                .try_for_each(|(i, c)| f(i, c))
        };
        // Inside `run` we are on one of the pool's threads already: split right here.
        if self.pool.current_thread_index().is_some() {
            split()
        } else {
            self.pool.install(split)
        }
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
