//! The server's gauges, counters and histograms, in Prometheus' text format under the names a
//! router's endpoint picker reads (`sapient:num_requests_waiting`, `sapient:kv_cache_usage_perc`,
//! as vLLM's `vllm:*` gauges that the Gateway API Inference Extension scrapes).
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Upper bounds (seconds) of the latency histograms' buckets.
const BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A latency histogram: counts per bucket, the sum in microseconds, the count.
#[derive(Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, seconds: f64) {
        if let Some(i) = BUCKETS.iter().position(|b| seconds <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_us
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (b, n) in BUCKETS.iter().zip(&self.buckets) {
            cumulative += n.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

#[derive(Default)]
pub struct Metrics {
    /// Requests queued for a KV slot.
    pub waiting: AtomicUsize,
    /// Requests holding a KV slot.
    pub running: AtomicUsize,
    /// KV positions in use, and in all.
    pub kv_used: AtomicUsize,
    pub kv_total: AtomicUsize,
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens whose keys and values a slot still held from an earlier request.
    pub prompt_tokens_cached: AtomicU64,
    pub generation_tokens: AtomicU64,
    /// Requests that ended, by how: a stop (token or string), the length limit, the client
    /// leaving.
    pub finished_stop: AtomicU64,
    pub finished_length: AtomicU64,
    pub cancelled: AtomicU64,
    pub time_to_first_token: Histogram,
    pub inter_token: Histogram,
}

impl Metrics {
    /// Prometheus' text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let load = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        let gauge = |out: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(
            &mut out,
            "sapient:num_requests_waiting",
            "Requests waiting for a KV slot.",
            load(&self.waiting) as f64,
        );
        gauge(
            &mut out,
            "sapient:num_requests_running",
            "Requests holding a KV slot.",
            load(&self.running) as f64,
        );
        let total = load(&self.kv_total).max(1) as f64;
        gauge(
            &mut out,
            "sapient:kv_cache_usage_perc",
            "Share of the KV cache's positions in use (0 to 1).",
            load(&self.kv_used) as f64 / total,
        );
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(
            &mut out,
            "sapient:prompt_tokens_total",
            "Prompt tokens processed.",
            get(&self.prompt_tokens),
        );
        counter(
            &mut out,
            "sapient:prompt_tokens_cached_total",
            "Prompt tokens not prefilled: a KV slot held them from an earlier request.",
            get(&self.prompt_tokens_cached),
        );
        counter(
            &mut out,
            "sapient:generation_tokens_total",
            "Tokens generated.",
            get(&self.generation_tokens),
        );
        let _ = writeln!(
            out,
            "# HELP sapient:request_success_total Requests finished, by reason.\n# TYPE sapient:request_success_total counter"
        );
        for (reason, v) in [
            ("stop", &self.finished_stop),
            ("length", &self.finished_length),
            ("cancelled", &self.cancelled),
        ] {
            let _ = writeln!(
                out,
                "sapient:request_success_total{{finished_reason=\"{reason}\"}} {}",
                get(v)
            );
        }
        self.time_to_first_token.write(
            &mut out,
            "sapient:time_to_first_token_seconds",
            "From a request's arrival to its first token.",
        );
        self.inter_token.write(
            &mut out,
            "sapient:inter_token_latency_seconds",
            "Between consecutive tokens of a request.",
        );
        out
    }
}
