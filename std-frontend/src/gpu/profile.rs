//! Kernel times on the device for `bench --profile`: a timestamp query on each side of every
//! dispatch gives the kernel's time on the GPU, which the wall clock cannot separate from the
//! host's recording, submission and read-back; the host's part is timed too.
use std::time::Instant;

use anyhow::{anyhow, Result};

use super::map_read;
use crate::run::KernelTimes;

/// Timestamps one submission holds at most (wgpu's limit on a query set): two per pass.
const QUERIES: u32 = 4096;

pub(super) struct KernelTimer {
    pub(super) queries: wgpu::QuerySet,
    /// Whether the device writes timestamps between the dispatches of a pass (Vulkan does; Apple
    /// GPUs do not): then timed dispatches share one pass as untimed ones do, else each takes a
    /// pass of its own, timed at its ends.
    pub(super) inside_passes: bool,
    resolved: wgpu::Buffer,
    readable: wgpu::Buffer,
    /// Nanoseconds per timestamp tick.
    period: f64,
    /// The kernel of each pass recorded since the last read.
    pending: Vec<&'static str>,
    /// When the first dispatch of the submission being recorded was.
    recording_since: Option<Instant>,
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
            inside_passes: device
                .features()
                .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
            period: queue.get_timestamp_period() as f64,
            pending: Vec::new(),
            recording_since: None,
            times: KernelTimes::default(),
        }
    }

    /// The queries before and after the next dispatch, which runs `kernel`; `None` (the
    /// dispatch counted as untimed) once the submission's queries are used up.
    pub(super) fn queries(&mut self, kernel: &'static str) -> Option<[u32; 2]> {
        self.recording_since.get_or_insert_with(Instant::now);
        let first = 2 * self.pending.len() as u32;
        if first + 2 > QUERIES {
            self.times.untimed += 1;
            return None;
        }
        self.pending.push(kernel);
        Some([first, first + 1])
    }

    /// Once the queue has taken a submission: the host's time recording and submitting it.
    pub(super) fn submitted(&mut self) {
        if let Some(since) = self.recording_since.take() {
            self.times.host_nanos += since.elapsed().as_nanos() as f64;
        }
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
