//! `Exec` on a rayon pool built once.
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

    fn run(&self, f: &mut (dyn FnMut() + Send)) {
        self.pool.install(f)
    }
}
