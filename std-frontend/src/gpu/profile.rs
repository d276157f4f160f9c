//! Kernel times on the device for `bench --profile`: every dispatch is its own compute pass,
//! and a timestamp query at each end of a pass gives the kernel's time on the GPU, which the
//! wall clock cannot separate from the host's recording, submission and read-back.
use anyhow::{anyhow, Result};

use super::map_read;
use crate::run::KernelTimes;

/// Timestamps one submission holds at most (wgpu's limit on a query set): two per pass.
const QUERIES: u32 = 4096;

pub(super) struct KernelTimer {
    queries: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    readable: wgpu::Buffer,
    /// Nanoseconds per timestamp tick.
    period: f64,
    /// The kernel of each pass recorded since the last read.
    pending: Vec<&'static str>,
    times: KernelTimes,
}

impl KernelTimer {
    pub(super) fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Self {
        let bytes = QUERIES as u64 * 8;
        KernelTimer {
            queries: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("kernel times"),
                ty: wgpu::QueryType::Timestamp,
                count: QUERIES,
            }),
            resolved: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kernel times"),
                size: bytes,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            readable: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kernel times, read back"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            period: queue.get_timestamp_period() as f64,
            pending: Vec::new(),
            times: KernelTimes::default(),
        }
    }

    /// The timestamp writes of the next pass, which runs `kernel`; `None` (the pass counted as
    /// untimed) once the submission's queries are used up.
    pub(super) fn pass(
        &mut self,
        kernel: &'static str,
    ) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let first = 2 * self.pending.len() as u32;
        if first + 2 > QUERIES {
            self.times.untimed += 1;
            return None;
        }
        self.pending.push(kernel);
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.queries,
            beginning_of_pass_write_index: Some(first),
            end_of_pass_write_index: Some(first + 1),
        })
    }

    /// Records, at the end of a submission, the copy of its timestamps to the readable buffer.
    pub(super) fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        let n = 2 * self.pending.len() as u32;
        if n > 0 {
            encoder.resolve_query_set(&self.queries, 0..n, &self.resolved, 0);
            encoder.copy_buffer_to_buffer(&self.resolved, 0, &self.readable, 0, n as u64 * 8);
        }
    }

    /// After the submission `resolve` ended: waits for it and adds its passes' times.
    pub(super) fn collect(&mut self, device: &wgpu::Device) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let bytes = self.pending.len() as u64 * 16;
        let slice = self.readable.slice(..bytes);
        map_read(device, &slice).map_err(|e| anyhow!("the kernel times: {e}"))?;
        let view = slice
            .get_mapped_range()
            .map_err(|e| anyhow!("reading the kernel times: {e}"))?;
        let ticks: &[u64] = bytemuck::cast_slice(&view);
        for (kernel, pass) in self.pending.iter().zip(ticks.chunks_exact(2)) {
            let nanos = pass[1].saturating_sub(pass[0]) as f64 * self.period;
            self.times.count(kernel, 1, nanos);
        }
        let first = ticks.first().copied().unwrap_or(0);
        let last = ticks.last().copied().unwrap_or(0);
        self.times.span_nanos += last.saturating_sub(first) as f64 * self.period;
        drop(view);
        self.readable.unmap();
        self.pending.clear();
        Ok(())
    }

    /// The times since the last call.
    pub(super) fn take(&mut self) -> KernelTimes {
        std::mem::take(&mut self.times)
    }
}
