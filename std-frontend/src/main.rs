//! The `sapient` command line. Exit codes: 0 success, 1 runtime error, 2 usage error.
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use sapient::chat::{ChatTemplate, Message};
use sapient::constraint::{OutputConstraint, SortedVocab};
use sapient::dry::{sequence_breakers, DEFAULT_BREAKERS};
use sapient::generate::Stats;
use sapient::generate::{generate, Stop};
use sapient::grammar::Grammar;
use sapient::infill::{Fim, FimRequest};
use sapient::json_schema::Schema;
use sapient::load::{self, resolve, LoadOptions, ModelFiles, Quantize};
use sapient::run::{self, CpuRunner, PerplexityRecipe, Runner, Session, DEFAULT_BATCH};
use sapient::speculative::{generate_speculative, Draft, DraftStats, ModelDraft};
use sapient::tokenizer::{TextStream, Tokenizer};
use sapient::Rayon;
use sapient_core::sample::{Sampler, SamplerConfig};
use sapient_core::{Config, KvCache, KvFormat, Model, Scratch};
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "sapient",
    version,
    about = "Llama-family LLM inference on the CPU and the GPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Continue a prompt, streaming the text to stdout.
    Generate(GenerateArgs),
    /// Talk to a model; the conversation stays in the KV cache across turns.
    Chat(ChatArgs),
    /// Print a prompt's logits as JSON.
    Logits {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        prompt: PromptArgs,
        /// Logits of every position, not only the last.
        #[arg(long)]
        all_positions: bool,
    },
    /// Print embeddings: the final hidden states of a text pooled into one vector, for one text
    /// or for every line of a file (texts share forward passes).
    Embed {
        #[command(flatten)]
        model: ModelArgs,
        /// The text.
        #[arg(short, long, conflicts_with_all = ["file", "prompt_ids"], required_unless_present_any = ["file", "prompt_ids"])]
        prompt: Option<String>,
        /// One text per line; one embedding per line comes out, in order.
        #[arg(short, long, conflicts_with = "prompt_ids")]
        file: Option<PathBuf>,
        /// The text as token ids, comma-separated (no BOS is added).
        #[arg(long, value_delimiter = ',')]
        prompt_ids: Option<Vec<u32>>,
        /// Do not put the BOS token before each text even where the model asks for it.
        #[arg(long)]
        no_bos: bool,
        /// mean: the mean over positions; last: the last position's hidden state.
        #[arg(long, value_enum, default_value_t = PoolingArg::Mean)]
        pooling: PoolingArg,
        /// Scale each embedding to unit length (for cosine similarity).
        #[arg(long)]
        normalize: bool,
        /// Most tokens per forward pass: texts are packed into passes of this many.
        #[arg(long, default_value_t = DEFAULT_BATCH)]
        batch: usize,
        /// text: one line of numbers per embedding; json: {"embedding": [...]} for one text,
        /// {"embeddings": [[...], ...]} for a file.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
    /// Perplexity of a text file in non-overlapping windows of --ctx tokens.
    Perplexity {
        #[command(flatten)]
        model: ModelArgs,
        /// The text file.
        #[arg(short, long)]
        file: PathBuf,
        #[arg(long, default_value_t = 512)]
        ctx: usize,
        /// every-position: the text's tokens only, every prediction scored (transformers' way);
        /// llama-cpp: llama-perplexity's (BOS first where the model has one, the second half of
        /// each window scored), so the two tools' numbers compare.
        #[arg(long, value_enum, default_value_t = RecipeArg::EveryPosition)]
        recipe: RecipeArg,
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
    /// Measure prefill and decode speed, like llama.cpp's llama-bench.
    Bench {
        #[command(flatten)]
        model: ModelArgs,
        /// Prompt tokens to prefill (0 skips).
        #[arg(short = 'p', long, default_value_t = 512)]
        prompt: usize,
        /// Tokens to decode one at a time (0 skips).
        #[arg(short = 'n', long, default_value_t = 128)]
        generate: usize,
        /// Tokens already in the cache when each test starts (prefilled, untimed), like
        /// llama-bench's -d: decoding speed at a long context.
        #[arg(short = 'd', long, default_value_t = 0)]
        depth: usize,
        /// Sequences decoded together in the decode test (one token of each per forward pass, as
        /// `serve` runs them; llama-batched-bench's -npl): its rate counts all their tokens.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
        parallel: u16,
        /// Timed repetitions, after one warm-up.
        #[arg(short = 'r', long, default_value_t = 5)]
        reps: usize,
        /// Time every kernel on the GPU too (timestamp queries around each dispatch): per token,
        /// each kernel's calls and microseconds, and the GPU's span from first to last.
        #[arg(long, conflicts_with = "parallel")]
        profile: bool,
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
    /// Print the token ids of a text (works on vocabulary-only GGUF files).
    Tokenize {
        /// A model directory, a .gguf file (vocabulary-only ones too), or a Hugging Face id in the
        /// local cache.
        #[arg(short, long)]
        model: String,
        /// The text.
        #[arg(short, long, conflicts_with = "file", required_unless_present = "file")]
        prompt: Option<String>,
        /// Read the text from this file.
        #[arg(short, long)]
        file: Option<PathBuf>,
        /// Do not put the BOS token first even where the model asks for it.
        #[arg(long)]
        no_bos: bool,
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
    /// Write a model (Hugging Face directory, safetensors or GGUF) as a GGUF file llama.cpp loads,
    /// its matrices in the formats --type names.
    Quantize {
        /// The model to read: a directory, a .gguf or .safetensors file, or a Hugging Face id in
        /// the local cache.
        input: String,
        /// The GGUF file to write.
        output: PathBuf,
        /// f16 and q8_0: every matrix (as llama.cpp's convert_hf_to_gguf.py --outtype); q4_0,
        /// q4_1, q4_k, q6_k, q4_k_m, q5_k_m, iq4_nl, iq4_xs: as llama-quantize without an
        /// importance matrix (the output matrix in Q6_K, the K_M and IQ4 mixes, the fallbacks
        /// for rows that are no whole number of blocks).
        #[arg(long = "type", value_enum)]
        target: TargetArg,
        /// Worker threads (default: one per physical core).
        #[arg(short, long)]
        threads: Option<usize>,
    },
    /// Serve the model over HTTP with OpenAI's API (chat, completions, embeddings, models) and
    /// continuous batching; Anthropic's Messages API, llama-server's /completion and /infill
    /// (fill in the middle), /health and Prometheus /metrics beside it.
    Serve(ServeArgs),
    /// Describe a model: architecture, hyper-parameters, tensors, KV cache memory.
    Inspect {
        /// A model directory, .gguf or .safetensors file, or a Hugging Face id in the local cache.
        model: String,
        /// Context length to size the KV cache for.
        #[arg(long, default_value_t = 4096)]
        ctx: usize,
    },
}

#[derive(Args, Clone)]
struct ModelArgs {
    /// A Hugging Face checkpoint directory, a .gguf file, a .safetensors file with config.json
    /// beside it, or a Hugging Face id (org/name) in the local hub cache.
    #[arg(short, long)]
    model: String,
    /// Read the config from this file instead of config.json beside the weights.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Matrix formats at load: auto quantizes float matrices to Q8_0 and keeps quantized ones
    /// (Q8_0, Q4_x, Q5_x, the k-quants, the IQ formats) as the file has them; q8_0 converts
    /// every matrix to Q8_0, quantized ones too; none keeps float matrices as f32; f32 widens
    /// every matrix (slow; for checking).
    #[arg(long, value_enum, default_value_t = QuantizeArg::Auto)]
    quantize: QuantizeArg,
    /// KV cache format (default: q8_0 when head_dim is a multiple of 32, f32 otherwise; on the
    /// GPU f32).
    #[arg(long, value_enum)]
    kv: Option<KvArg>,
    /// Worker threads (default: one per physical core).
    #[arg(short, long)]
    threads: Option<usize>,
    /// Where to run: auto takes a hardware GPU when this build has the GPU backend and one is
    /// present (never a software one), the CPU otherwise; gpu takes any GPU adapter, or fails.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    Cpu,
    Gpu,
    Auto,
}

#[derive(Args)]
struct PromptArgs {
    /// The prompt as text.
    #[arg(
        short,
        long,
        conflicts_with = "prompt_ids",
        required_unless_present = "prompt_ids"
    )]
    prompt: Option<String>,
    /// The prompt as token ids, comma-separated (no BOS is added).
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Do not put the BOS token before a text prompt even where the model asks for it.
    #[arg(long)]
    no_bos: bool,
}

#[derive(Args)]
struct SamplingArgs {
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// 0 disables.
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// 1 disables.
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// 0 disables.
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// 1 disables.
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Lower each recent token's logit by this times its count (OpenAI's); 0 disables.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    frequency_penalty: f32,
    /// Lower each recent token's logit by this (OpenAI's); 0 disables.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    presence_penalty: f32,
    /// How many of the latest tokens the penalties look at.
    #[arg(long, default_value_t = 64)]
    repeat_last_n: usize,
    /// Keep the tokens within this many standard deviations of the largest logit; 0 disables.
    #[arg(
        long = "top-nsigma",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    top_n_sigma: f32,
    /// Locally typical sampling: keep the tokens nearest the entropy up to this probability; 1
    /// disables.
    #[arg(long = "typical", default_value_t = 1.0)]
    typical_p: f32,
    /// XTC: the chance that a draw excludes its top choices (every token above
    /// --xtc-threshold but the least likely of them); 0 disables.
    #[arg(long, default_value_t = 0.0)]
    xtc_probability: f32,
    /// XTC's threshold (above 0.5 nothing is excluded).
    #[arg(long, default_value_t = 0.1)]
    xtc_threshold: f32,
    /// DRY: lower the logit of a token that would extend a repetition of the text by this
    /// times --dry-base to the power of (its length - --dry-allowed-length); 0 disables.
    #[arg(long, default_value_t = 0.0)]
    dry_multiplier: f32,
    /// DRY's base.
    #[arg(long, default_value_t = 1.75)]
    dry_base: f32,
    /// DRY: the longest repetition left alone.
    #[arg(long, default_value_t = 2)]
    dry_allowed_length: usize,
    /// DRY: how many of the latest tokens it looks at; -1 all, 0 disables.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(-1..))]
    dry_penalty_last_n: i64,
    /// Mirostat 1 or 2 (0 disables): the draw set adapts so the text's surprise tracks
    /// --mirostat-ent; it replaces the other filters and the penalties, as in llama.cpp.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    mirostat: u8,
    /// Mirostat's learning rate (eta).
    #[arg(long, default_value_t = 0.1)]
    mirostat_lr: f32,
    /// Mirostat's target surprise (tau), in bits.
    #[arg(long, default_value_t = 5.0)]
    mirostat_ent: f32,
    /// DRY: a text a repetition does not count across (repeatable; replaces the defaults:
    /// newline, ':', '"' and '*'; "none" for none).
    #[arg(long = "dry-sequence-breaker")]
    dry_sequence_breaker: Vec<String>,
    /// Seed of the sampler (default: from the clock, printed on stderr).
    #[arg(long)]
    seed: Option<u64>,
}

#[derive(Args)]
struct DraftArgs {
    /// Speculative decoding with this smaller model (same vocabulary) as the draft: it proposes
    /// --draft-tokens tokens, the model checks them in one pass. Output as without it.
    #[arg(long, conflicts_with = "draft")]
    draft_model: Option<String>,
    /// Speculative decoding without a second model: ngram proposes what followed the latest
    /// earlier occurrence of the text's last 3 or 2 tokens (prompt lookup).
    #[arg(long, value_enum)]
    draft: Option<DraftArg>,
    /// Tokens the draft proposes per pass of the model.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=64))]
    draft_tokens: u16,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DraftArg {
    Ngram,
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    draft: DraftArgs,
    #[arg(short = 'n', long, default_value_t = 128)]
    max_tokens: usize,
    /// Context length (default: the prompt plus --max-tokens, at most the model's).
    #[arg(long)]
    ctx: Option<usize>,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    format: OutputFormat,
    /// Keep the output one JSON object (as the server's response_format json_object): every
    /// token sampled continues valid JSON, and generation ends only once the object is closed.
    #[arg(long, conflicts_with = "json_schema")]
    json: bool,
    /// Keep the output a value of this JSON schema (inline, starting with `{`, or a file's path),
    /// as the server's response_format json_schema.
    #[arg(long, value_name = "SCHEMA", conflicts_with_all = ["grammar", "grammar_file"])]
    json_schema: Option<String>,
    /// Keep the output a sentence of this GBNF grammar (llama.cpp's format; its `root` rule is
    /// the whole output), as llama.cpp's --grammar and the server's `grammar` field.
    #[arg(long, value_name = "GBNF", conflicts_with_all = ["json", "grammar_file"])]
    grammar: Option<String>,
    /// --grammar, read from a file (llama.cpp's grammars/*.gbnf).
    #[arg(long, value_name = "FILE", conflicts_with = "json")]
    grammar_file: Option<PathBuf>,
    /// Fill in the middle: write what goes between --prompt and this text, in the model's
    /// fill-in-the-middle prompt (code models: Qwen2.5-Coder, StarCoder 2, DeepSeek-Coder,
    /// CodeLlama...); they are cut to fit the context less --max-tokens.
    #[arg(long, conflicts_with_all = ["prompt_ids", "no_bos"])]
    suffix: Option<String>,
}

#[derive(Args)]
struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    draft: DraftArgs,
    /// A system prompt.
    #[arg(long)]
    system: Option<String>,
    /// A Jinja chat template to use instead of the model's.
    #[arg(long, value_name = "FILE")]
    chat_template_file: Option<std::path::PathBuf>,
    /// Most tokens per reply.
    #[arg(short = 'n', long, default_value_t = 512)]
    max_tokens: usize,
    /// Context length of the whole conversation.
    #[arg(long, default_value_t = 4096)]
    ctx: usize,
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Requests generating at once; each holds a KV cache of --ctx positions. More wait in a
    /// queue.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    parallel: u16,
    /// Context (prompt and reply) of each request.
    #[arg(long, default_value_t = 4096)]
    ctx: usize,
    /// Most tokens per forward pass (each running request's next token, then prompt chunks).
    #[arg(long, default_value_t = DEFAULT_BATCH)]
    batch: usize,
    /// Require `Authorization: Bearer KEY` on the /v1 routes.
    #[arg(long)]
    api_key: Option<String>,
    /// The model's name in the API (default: the model file's or directory's name).
    #[arg(long)]
    alias: Option<String>,
    /// A Jinja chat template to use instead of the model's (its text also says how the model
    /// writes tool calls).
    #[arg(long, value_name = "FILE")]
    chat_template_file: Option<std::path::PathBuf>,
    /// Where a thinking model's reasoning (`<think>...</think>`) goes in chat replies:
    /// `reasoning_content` (deepseek; auto is the same), or the content as written (none).
    #[arg(long, value_enum, default_value_t = ReasoningFormat::Auto)]
    reasoning_format: ReasoningFormat,
    /// Requests that may wait for a free slot; more get 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Largest max_tokens a request may ask for.
    #[arg(long, default_value_t = 8192)]
    max_tokens_limit: usize,
    /// Open connections at once; more wait to be accepted.
    #[arg(long, default_value_t = 256)]
    max_connections: usize,
    /// Seconds running requests get to finish after SIGTERM or Ctrl-C.
    #[arg(long, default_value_t = 10)]
    shutdown_timeout: u64,
    /// Seconds a client gets to send a request's line and headers (and, on a kept-alive
    /// connection, to start the next request); slower ones are disconnected, so that idle or
    /// trickling connections cannot hold every place of --max-connections.
    #[arg(long, default_value_t = 30)]
    header_timeout: u64,
}

/// llama-server's `--reasoning-format` values.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ReasoningFormat {
    Auto,
    Deepseek,
    None,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum TargetArg {
    F16,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q4_0")]
    Q4_0,
    #[value(name = "q4_1")]
    Q4_1,
    #[value(name = "q4_k")]
    Q4K,
    #[value(name = "q6_k")]
    Q6K,
    #[value(name = "q4_k_m")]
    Q4KM,
    #[value(name = "q5_k_m")]
    Q5KM,
    #[value(name = "iq4_nl")]
    IQ4NL,
    #[value(name = "iq4_xs")]
    IQ4XS,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PoolingArg {
    Mean,
    Last,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RecipeArg {
    EveryPosition,
    LlamaCpp,
}

#[derive(Clone, Copy, ValueEnum)]
enum QuantizeArg {
    Auto,
    None,
    F32,
    #[value(name = "q8_0")]
    Q8_0,
}

#[derive(Clone, Copy, ValueEnum)]
enum KvArg {
    F32,
    F16,
    #[value(name = "q8_0")]
    Q8_0,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OutputFormat {
    Text,
    Json,
}

struct Loaded {
    source: Source,
    /// Shared with a draft model's `Loaded`: one pool, never two spinning at once.
    exec: Arc<Rayon>,
    quantize: Quantize,
    kv: Option<KvArg>,
    backend: BackendArg,
}

/// Where the model comes from: files, or random weights of a known shape (`random:SHAPE`).
enum Source {
    Files(ModelFiles),
    Random(load::random::RandomSpec),
}

/// A loaded model on the backend the user chose.
enum Engine<'m, 'w> {
    Cpu(CpuRunner<'m, 'w, Rayon>),
    #[cfg(feature = "gpu")]
    Gpu(Box<sapient::gpu::GpuModel>),
}

impl Engine<'_, '_> {
    fn name(&self) -> &'static str {
        match self {
            Engine::Cpu(_) => "cpu",
            #[cfg(feature = "gpu")]
            Engine::Gpu(_) => "gpu",
        }
    }
}

impl Runner for Engine<'_, '_> {
    fn config(&self) -> &Config {
        match self {
            Engine::Cpu(r) => r.config(),
            #[cfg(feature = "gpu")]
            Engine::Gpu(g) => g.config(),
        }
    }

    fn with_session<R>(
        &self,
        max_seq: usize,
        max_batch: usize,
        f: impl FnOnce(&mut dyn Session) -> Result<R>,
    ) -> Result<R> {
        match self {
            Engine::Cpu(r) => r.with_session(max_seq, max_batch, f),
            #[cfg(feature = "gpu")]
            Engine::Gpu(g) => g.with_session(max_seq, max_batch, f),
        }
    }
}

impl Loaded {
    fn open(a: &ModelArgs) -> Result<Self> {
        let quantize = match a.quantize {
            QuantizeArg::None => Quantize::None,
            QuantizeArg::F32 => Quantize::F32,
            QuantizeArg::Auto => Quantize::Auto,
            QuantizeArg::Q8_0 => Quantize::Q8_0,
        };
        let opts = LoadOptions {
            quantize,
            config_file: a.config.clone(),
        };
        let source = match load::random::parse(&a.model)? {
            Some(spec) => Source::Random(spec),
            None => Source::Files(ModelFiles::open(&resolve::resolve(&a.model)?, &opts)?),
        };
        Ok(Loaded {
            source,
            exec: Arc::new(Rayon::new(a.threads)?),
            quantize,
            kv: a.kv,
            backend: a.backend,
        })
    }

    /// A draft model for speculative decoding: `args`' options with `path` as the model, on this
    /// model's thread pool.
    fn open_draft(&self, args: &ModelArgs, path: &str) -> Result<Self> {
        let args = ModelArgs {
            model: path.to_owned(),
            config: None,
            ..args.clone()
        };
        let draft = Loaded {
            exec: self.exec.clone(),
            ..Loaded::open(&args)?
        };
        // Ids only mean the same token where both models share the vocabulary: the same
        // tokenization where both have a tokenizer, the same size otherwise.
        let tokenizers = |l: &Loaded| l.files().ok().and_then(|f| Tokenizer::load(f).ok());
        let (size, draft_size) = (self.config().vocab_size, draft.config().vocab_size);
        let same = match (tokenizers(self), tokenizers(&draft)) {
            (Some(tok), Some(dtok)) => {
                let probe = "The quick brown fox: 1234, naïve café — 東京 🎉\n\tdef f(x): return x";
                tok.vocab_size() == dtok.vocab_size() && tok.encode(probe)? == dtok.encode(probe)?
            }
            _ => size == draft_size,
        };
        if !same {
            bail!(
                "the draft model {path} has another vocabulary ({draft_size} tokens) than the model ({size} tokens); a draft must share the model's tokenizer"
            );
        }
        Ok(draft)
    }

    /// The model on the chosen backend; the GPU's adapter is named on stderr.
    fn engine<'m, 'w>(&'m self, model: &'m Model<'w>) -> Result<Engine<'m, 'w>> {
        let cpu = || Engine::Cpu(CpuRunner::new(model, self.kv_format(model), &*self.exec));
        #[cfg(feature = "gpu")]
        {
            use sapient::gpu::{GpuKv, GpuModel, GpuOptions};
            // The GPU keeps its KV cache in f32 unless `--kv` asks for another.
            let kv = match self.kv {
                None | Some(KvArg::F32) => GpuKv::F32,
                Some(KvArg::F16) => GpuKv::F16,
                Some(KvArg::Q8_0) => GpuKv::Q8_0,
            };
            let software = match self.backend {
                BackendArg::Cpu => return Ok(cpu()),
                BackendArg::Gpu => true,
                BackendArg::Auto => false,
            };
            let opts = GpuOptions {
                allow_software: software,
                kv,
                ..GpuOptions::default()
            };
            match GpuModel::new(model, &opts)? {
                Some(g) => {
                    eprintln!("GPU: {}", g.summary());
                    Ok(Engine::Gpu(Box::new(g)))
                }
                None if software => {
                    bail!("--backend gpu: no GPU adapter found (wgpu: Metal, Vulkan, DX12)")
                }
                None => Ok(cpu()),
            }
        }
        #[cfg(not(feature = "gpu"))]
        {
            if self.backend == BackendArg::Gpu {
                bail!("--backend gpu: this sapient was built without the GPU backend (cargo build --release --features gpu)");
            }
            Ok(cpu())
        }
    }

    fn config(&self) -> &Config {
        match &self.source {
            Source::Files(f) => &f.config,
            Source::Random(r) => &r.config,
        }
    }

    /// The model's files; a random model has none (no tokenizer, no chat template).
    fn files(&self) -> Result<&ModelFiles> {
        match &self.source {
            Source::Files(f) => Ok(f),
            Source::Random(r) => bail!(
                "random:{} has random weights and no tokenizer: give --prompt-ids",
                r.name
            ),
        }
    }

    /// Builds the model with a progress bar (shown only on a terminal) and a one-line summary.
    fn model(&self) -> Result<Model<'_>> {
        let t0 = Instant::now();
        let (layers, arch) = match &self.source {
            Source::Files(f) => (f.config.n_layers, f.arch.clone()),
            Source::Random(r) => (r.config.n_layers, format!("random {}", r.name)),
        };
        let bar = indicatif::ProgressBar::new(layers as u64).with_style(
            indicatif::ProgressStyle::with_template("loading {bar:30} {pos}/{len} layers").unwrap(),
        );
        let progress = |n: usize| bar.set_position(n as u64);
        let model = match &self.source {
            Source::Files(f) => f.model_with_progress(self.quantize, &progress)?,
            Source::Random(r) => load::random::model(r, &progress)?,
        };
        bar.finish_and_clear();
        eprintln!(
            "{} (loaded in {:.2}s, {} kernels, {} threads)",
            load::summary(&model, &arch),
            t0.elapsed().as_secs_f64(),
            model.kernels().name,
            sapient_core::Exec::threads(&*self.exec)
        );
        Ok(model)
    }

    fn kv_format(&self, model: &Model<'_>) -> KvFormat {
        match self.kv {
            Some(KvArg::F32) => KvFormat::F32,
            Some(KvArg::F16) => KvFormat::F16,
            Some(KvArg::Q8_0) => KvFormat::Q8_0,
            None => KvFormat::default_for(&model.config),
        }
    }

    fn prompt(&self, p: &PromptArgs) -> Result<(Vec<u32>, Option<Tokenizer>)> {
        match (&p.prompt_ids, &p.prompt) {
            (Some(ids), _) => {
                if ids.is_empty() {
                    bail!("--prompt-ids is empty");
                }
                let tok = self.files().ok().and_then(|f| Tokenizer::load(f).ok());
                Ok((ids.clone(), tok))
            }
            (None, Some(text)) => {
                let tok = Tokenizer::load(self.files()?)?;
                let ids = encode(&tok, text, p.no_bos)?;
                if ids.is_empty() {
                    bail!("the prompt is empty");
                }
                Ok((ids, Some(tok)))
            }
            (None, None) => bail!("give --prompt or --prompt-ids"),
        }
    }
}

/// What proposes tokens for speculative decoding.
enum DraftChoice {
    None,
    Ngram,
    Model(Box<Loaded>),
}

impl DraftArgs {
    /// The draft asked for, for a target sampled as `sampling`.
    fn open(
        &self,
        target: &Loaded,
        args: &ModelArgs,
        sampling: &SamplerConfig,
    ) -> Result<DraftChoice> {
        let drafting = self.draft_model.is_some() || self.draft.is_some();
        if drafting && sampling.mirostat != 0 && sampling.temperature != 0.0 {
            bail!(
                "--mirostat does not combine with speculative decoding (--draft-model, --draft): \
                 its target adapts with each token drawn"
            );
        }
        Ok(match (&self.draft_model, self.draft) {
            (Some(path), _) => DraftChoice::Model(Box::new(target.open_draft(args, path)?)),
            (None, Some(DraftArg::Ngram)) => DraftChoice::Ngram,
            (None, None) => DraftChoice::None,
        })
    }
}

/// What a draft model's sampler's seed is: the target's, mixed, so that the two draw apart.
const DRAFT_SEED_MIX: u64 = 0xd4af_7000;

/// A draft model's sampler: `target`'s configuration and DRY breakers, with another seed, so
/// that its proposals follow the target's distribution.
fn draft_sampler(target: &Sampler<'_>) -> Result<Sampler<'static>> {
    Ok(target.reseeded(target.config().seed ^ DRAFT_SEED_MIX)?)
}

/// Calls `f` with a session of `ctx` positions on `engine` and the draft `choice` asks for (a
/// draft model gets a session of the same size, and draws with `draft_sampler`).
fn with_draft<R>(
    engine: &Engine<'_, '_>,
    choice: &DraftChoice,
    draft_sampler: Sampler<'static>,
    ctx: usize,
    batch: usize,
    f: impl FnOnce(&mut dyn Session, Option<&mut Draft<'_>>) -> Result<R>,
) -> Result<R> {
    match choice {
        DraftChoice::None => engine.with_session(ctx, batch, |s| f(s, None)),
        DraftChoice::Ngram => engine.with_session(ctx, batch, |s| f(s, Some(&mut Draft::Ngram))),
        DraftChoice::Model(l) => {
            let m = l.model()?;
            let draft_engine = l.engine(&m)?;
            draft_engine.with_session(ctx, batch, |ds| {
                let mut draft = Draft::Model(Box::new(ModelDraft::new(ds, draft_sampler)));
                engine.with_session(ctx, batch, |s| f(s, Some(&mut draft)))
            })
        }
    }
}

/// `text`'s ids, with the model's BOS first unless `no_bos`.
fn encode(tok: &Tokenizer, text: &str, no_bos: bool) -> Result<Vec<u32>> {
    if no_bos {
        tok.encode(text)
    } else {
        tok.encode_prompt(text)
    }
}

impl SamplingArgs {
    fn config(&self) -> SamplerConfig {
        let seed = self.seed.unwrap_or_else(|| {
            let s = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            if self.temperature > 0.0 {
                eprintln!("seed: {s}");
            }
            s
        });
        SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            repeat_last_n: self.repeat_last_n,
            top_n_sigma: self.top_n_sigma,
            typical_p: self.typical_p,
            xtc_probability: self.xtc_probability,
            xtc_threshold: self.xtc_threshold,
            dry_multiplier: self.dry_multiplier,
            dry_base: self.dry_base,
            dry_allowed_length: self.dry_allowed_length,
            dry_penalty_last_n: usize::try_from(self.dry_penalty_last_n).unwrap_or(usize::MAX),
            mirostat: self.mirostat,
            mirostat_tau: self.mirostat_ent,
            mirostat_eta: self.mirostat_lr,
            seed,
        }
    }

    /// A sampler of `sampling`, with DRY's sequence breakers in `tokenizer`'s vocabulary
    /// where DRY is on (none without a tokenizer: token ids in, token ids out).
    fn sampler(
        &self,
        sampling: SamplerConfig,
        tokenizer: Option<&Tokenizer>,
    ) -> Result<Sampler<'static>> {
        let sampler = Sampler::new(sampling)?;
        let (Some(tok), true) = (tokenizer, sampling.dry_multiplier > 0.0) else {
            return Ok(sampler);
        };
        let breakers: Vec<String> = match &self.dry_sequence_breaker[..] {
            [] => DEFAULT_BREAKERS.iter().map(|b| b.to_string()).collect(),
            [none] if none == "none" => return Ok(sampler),
            given => given.to_vec(),
        };
        let breakers = sequence_breakers(tok, &breakers).context("--dry-sequence-breaker")?;
        Ok(sampler.with_sequence_breakers(Arc::new(breakers)))
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    match run_command(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`sapient generate ... | head`): nothing to say, nobody to say it to.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn run_command(command: Command) -> Result<()> {
    match command {
        Command::Generate(a) => cmd_generate(a),
        Command::Chat(a) => cmd_chat(a),
        Command::Logits {
            model,
            prompt,
            all_positions,
        } => {
            let l = Loaded::open(&model)?;
            let (ids, _) = l.prompt(&prompt)?;
            let m = l.model()?;
            let logits = run::logits(&l.engine(&m)?, &ids, all_positions)?;
            println!("{}", json!({ "prompt_ids": ids, "logits": logits }));
            Ok(())
        }
        Command::Embed {
            model,
            prompt,
            file,
            prompt_ids,
            no_bos,
            pooling,
            normalize,
            batch,
            format,
        } => {
            let l = Loaded::open(&model)?;
            let texts: Vec<Vec<u32>> = match (prompt_ids, prompt, &file) {
                (Some(ids), _, _) => {
                    if ids.is_empty() {
                        bail!("--prompt-ids is empty");
                    }
                    vec![ids]
                }
                (None, Some(text), _) => {
                    vec![encode(&Tokenizer::load(l.files()?)?, &text, no_bos)?]
                }
                (None, None, Some(path)) => {
                    let tok = Tokenizer::load(l.files()?)?;
                    let text = std::fs::read_to_string(path)
                        .with_context(|| format!("cannot read {}", path.display()))?;
                    text.lines()
                        .enumerate()
                        .map(|(i, line)| {
                            let ids = encode(&tok, line, no_bos)?;
                            if ids.is_empty() {
                                bail!("{} line {}: no tokens to embed", path.display(), i + 1);
                            }
                            Ok(ids)
                        })
                        .collect::<Result<_>>()?
                }
                (None, None, None) => bail!("give --prompt, --file or --prompt-ids"),
            };
            if texts.iter().any(Vec::is_empty) {
                bail!("the text has no tokens: nothing to embed");
            }
            let m = l.model()?;
            let pooling = match pooling {
                PoolingArg::Mean => run::Pooling::Mean,
                PoolingArg::Last => run::Pooling::Last,
            };
            let refs: Vec<&[u32]> = texts.iter().map(Vec::as_slice).collect();
            let engine = l.engine(&m)?;
            let e = run::embeddings(&engine, &refs, pooling, normalize, batch.max(1))?;
            let mut out = std::io::stdout().lock();
            match (format, file.is_some()) {
                (OutputFormat::Json, true) => writeln!(out, "{}", json!({ "embeddings": e }))?,
                (OutputFormat::Json, false) => writeln!(out, "{}", json!({ "embedding": e[0] }))?,
                (OutputFormat::Text, _) => {
                    for v in &e {
                        let line: Vec<String> = v.iter().map(f32::to_string).collect();
                        writeln!(out, "{}", line.join(" "))?;
                    }
                }
            }
            Ok(())
        }
        Command::Perplexity {
            model,
            file,
            ctx,
            recipe,
            format,
        } => {
            let l = Loaded::open(&model)?;
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let tok = Tokenizer::load(l.files()?)?;
            let (ids, recipe) = match recipe {
                RecipeArg::EveryPosition => (tok.encode(&text)?, PerplexityRecipe::EveryPosition),
                // llama-perplexity tokenizes with the model's BOS and puts it first in each window.
                RecipeArg::LlamaCpp => (
                    tok.encode_prompt(&text)?,
                    PerplexityRecipe::LlamaCpp { bos: tok.bos },
                ),
            };
            let m = l.model()?;
            let engine = l.engine(&m)?;
            let t0 = Instant::now();
            let (ppl, scored) = run::perplexity(&engine, &ids, ctx, recipe)?;
            let processed = ids.len() / ctx * ctx;
            let tps = processed as f64 / t0.elapsed().as_secs_f64();
            match format {
                OutputFormat::Json => println!(
                    "{}",
                    json!({ "ppl": ppl, "scored_tokens": scored, "tokens_per_s": tps })
                ),
                OutputFormat::Text => {
                    println!("perplexity {ppl:.4} over {scored} scored tokens ({tps:.1} tokens/s)")
                }
            }
            Ok(())
        }
        Command::Inspect { model, ctx } => cmd_inspect(&model, ctx),
        Command::Serve(a) => cmd_serve(a),
        Command::Quantize {
            input,
            output,
            target,
            threads,
        } => cmd_quantize(&input, &output, target, threads),
        Command::Tokenize {
            model,
            prompt,
            file,
            no_bos,
            format,
        } => {
            let tok = Tokenizer::open(&resolve::resolve(&model)?)?;
            let text = match (prompt, file) {
                (Some(p), _) => p,
                (None, Some(f)) => std::fs::read_to_string(&f)
                    .with_context(|| format!("cannot read {}", f.display()))?,
                (None, None) => bail!("give --prompt or --file"),
            };
            let ids = encode(&tok, &text, no_bos)?;
            let mut out = std::io::stdout().lock();
            match format {
                OutputFormat::Json => writeln!(out, "{}", serde_json::json!({ "ids": ids }))?,
                OutputFormat::Text => {
                    let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
                    writeln!(out, "{}", ids.join(" "))?
                }
            }
            Ok(())
        }
        Command::Bench {
            model,
            prompt,
            generate,
            depth,
            parallel,
            reps,
            profile,
            format,
        } => {
            let l = Loaded::open(&model)?;
            let m = l.model()?;
            let threads = sapient_core::Exec::threads(&*l.exec);
            let parallel = usize::from(parallel);
            let engine = l.engine(&m)?;
            let reps = reps.max(1);
            let tests = sapient::bench::Tests {
                prompt,
                generate: if parallel > 1 { 0 } else { generate },
                depth,
                profile,
            };
            let mut r = sapient::bench::bench(&engine, tests, reps)?;
            if parallel > 1 && generate > 0 {
                let tests = sapient::bench::Tests { generate, ..tests };
                let shape = (parallel, depth + generate, sapient::run::DEFAULT_BATCH);
                let decode = |slots: &mut dyn sapient::slots::KvSlots| {
                    sapient::bench::decode_parallel(slots, parallel, tests, reps)
                };
                r.decode = Some(match &engine {
                    Engine::Cpu(c) => {
                        sapient::slots::with_cpu_slots(c.model, c.exec, c.kv, shape, decode)?
                    }
                    #[cfg(feature = "gpu")]
                    Engine::Gpu(g) => sapient::slots::with_gpu_slots(g, shape, decode)?,
                });
            }
            let rss = sapient::bench::peak_rss_bytes();
            match format {
                OutputFormat::Json => println!(
                    "{}",
                    json!({
                        "threads": threads,
                        "depth": depth,
                        "prefill_tokens": prompt,
                        "prefill_tokens_per_s": r.prefill.map(|r| r.mean),
                        "prefill_stddev": r.prefill.map(|r| r.stddev),
                        "decode_tokens": generate,
                        "parallel": parallel,
                        "decode_tokens_per_s": r.decode.map(|r| r.mean),
                        "decode_stddev": r.decode.map(|r| r.stddev),
                        "backend": engine.name(),
                        "dispatches_per_token": r.dispatches_per_token,
                        "peak_rss_bytes": rss,
                        "kernel_times": profile.then(|| json!({
                            "prefill": r.prefill_times.as_ref()
                                .map(|t| sapient::bench::kernel_times_json(t, prompt * reps)),
                            "decode": r.decode_times.as_ref()
                                .map(|t| sapient::bench::kernel_times_json(t, generate * reps)),
                        })),
                    })
                ),
                OutputFormat::Text => {
                    // As llama-bench names them: "pp512", "tg128 @ d4096".
                    let at = if depth > 0 {
                        format!(" @ d{depth}")
                    } else {
                        String::new()
                    };
                    if let Some(p) = r.prefill {
                        println!(
                            "pp{prompt}{at}  t={threads}: {:.1} ± {:.1} tokens/s",
                            p.mean, p.stddev
                        );
                    }
                    if let Some(d) = r.decode {
                        let streams = if parallel > 1 {
                            format!(" x{parallel} sequences")
                        } else {
                            String::new()
                        };
                        println!(
                            "tg{generate}{at}{streams}  t={threads}: {:.1} ± {:.1} tokens/s",
                            d.mean, d.stddev
                        );
                    }
                    if let Some(d) = r.dispatches_per_token {
                        println!("GPU dispatches per decoded token: {d}");
                    }
                    let tests = [
                        (format!("pp{prompt}"), &r.prefill_times, prompt),
                        (format!("tg{generate}"), &r.decode_times, generate),
                    ];
                    for (test, times, tokens) in tests {
                        if let Some(t) = times {
                            let title = format!("GPU kernel times, {test}{at}");
                            let table = sapient::bench::kernel_times_text(&title, t, tokens * reps);
                            print!("{table}");
                        }
                    }
                    if let Some(b) = rss {
                        println!(
                            "peak resident memory: {:.1} MiB",
                            b as f64 / (1 << 20) as f64
                        );
                    }
                }
            }
            Ok(())
        }
    }
}

fn cmd_generate(a: GenerateArgs) -> Result<()> {
    let schema = a.json_schema.as_deref().map(read_schema).transpose()?;
    let grammar = match (&a.grammar, &a.grammar_file) {
        (Some(text), _) => Some(Grammar::parse(text).context("--grammar")?),
        (_, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--grammar-file: cannot read {}", path.display()))?;
            Some(
                Grammar::parse(&text)
                    .with_context(|| format!("--grammar-file {}", path.display()))?,
            )
        }
        (None, None) => None,
    };
    let l = Loaded::open(&a.model)?;
    let mut stop = l.files().map_or(Vec::new(), |f| f.eos_token_ids.clone());
    let (prompt, tok) = match &a.suffix {
        None => l.prompt(&a.prompt)?,
        Some(suffix) => {
            let (prompt, tok, ends) = fim_prompt(&l, &a, suffix)?;
            stop.extend(ends);
            (prompt, Some(tok))
        }
    };
    let tok = tok.map(Arc::new);
    let m = l.model()?;
    let c = &m.config;
    let ctx = a
        .ctx
        .unwrap_or((prompt.len() + a.max_tokens).min(c.context_length().max(prompt.len())));
    if prompt.len() > ctx {
        bail!(
            "the prompt has {} tokens, more than the context of {ctx}",
            prompt.len()
        );
    }
    let sampling = a.sampling.config();
    let mut sampler = a.sampling.sampler(sampling, tok.as_deref())?;
    let draft = a.draft.open(&l, &a.model, &sampling)?;
    let engine = l.engine(&m)?;
    let constrained = a.json || schema.is_some() || grammar.is_some();
    let mut constraint = match (&tok, constrained) {
        (_, false) => None,
        (_, true) if !matches!(draft, DraftChoice::None) => bail!(
            "--json, --json-schema and --grammar do not combine with speculative decoding \
             (--draft-model, --draft)"
        ),
        (None, true) => {
            bail!(
                "--json, --json-schema and --grammar need the model's tokenizer (the tokens' text)"
            )
        }
        (Some(t), true) => {
            let vocab = Arc::new(SortedVocab::new(t, c.vocab_size));
            Some(match (schema, grammar) {
                (Some(schema), _) => {
                    OutputConstraint::with_schema(vocab, t.clone(), Arc::new(schema))
                }
                (None, Some(grammar)) => {
                    OutputConstraint::with_grammar(vocab, t.clone(), Arc::new(grammar))
                }
                (None, None) => OutputConstraint::new(vocab, t.clone()),
            })
        }
    };
    let mut out_ids = Vec::new();
    let mut stream = tok.as_deref().map(TextStream::new);
    let json = a.format == OutputFormat::Json;
    let mut stdout = std::io::stdout().lock();
    let mut history = Vec::new();
    let batch = prompt.len().clamp(1, DEFAULT_BATCH);
    let draft_tokens = a.draft.draft_tokens as usize;
    // Ctrl-C ends the generation: what was generated stays printed, and the exit code is 130.
    ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst))?;
    let drafting = draft_sampler(&sampler)?;
    let (stats, why, spec) = with_draft(&engine, &draft, drafting, ctx, batch, |session, d| {
        generate_with(
            session,
            d.map(|d| (d, draft_tokens)),
            &mut sampler,
            constraint.as_mut(),
            &prompt,
            &mut history,
            a.max_tokens,
            &stop,
            |t| {
                out_ids.push(t);
                if !json {
                    match stream.as_mut() {
                        Some(s) => {
                            if let Some(text) = s.push(t)? {
                                write!(stdout, "{text}")?;
                                stdout.flush()?;
                            }
                        }
                        None => write!(stdout, "{t} ")?,
                    }
                }
                Ok(!INTERRUPTED.load(Ordering::SeqCst))
            },
        )
    })?;
    if let Some(rest) = stream
        .as_mut()
        .map(TextStream::finish)
        .transpose()?
        .flatten()
    {
        if !json {
            write!(stdout, "{rest}")?;
        }
    }
    if json {
        let text = match &tok {
            Some(t) => Some(t.decode(&out_ids, true)?),
            None => None,
        };
        let mut out = json!({ "prompt_ids": prompt, "generated_ids": out_ids, "text": text });
        if let Some(d) = spec {
            out["draft_proposed"] = json!(d.proposed);
            out["draft_accepted"] = json!(d.accepted);
        }
        writeln!(stdout, "{out}")?;
    } else {
        writeln!(stdout)?;
    }
    if why == Stop::ContextFull {
        eprintln!("note: stopped at the end of the context ({ctx} tokens); raise --ctx for more");
    }
    eprintln!("{}", stats.summary());
    if let Some(d) = spec {
        eprintln!("{}", d.summary());
    }
    if why == Stop::Interrupted {
        stdout.flush()?;
        eprintln!("interrupted");
        std::process::exit(130);
    }
    Ok(())
}

/// `generate --suffix`: the prompt's text and `suffix` around the gap, as the model's
/// fill-in-the-middle prompt in the context less `--max-tokens` (at most half of it); with the
/// tokenizer, and the tokens that end the middle.
fn fim_prompt(
    l: &Loaded,
    a: &GenerateArgs,
    suffix: &str,
) -> Result<(Vec<u32>, Tokenizer, Vec<u32>)> {
    let files = l.files()?;
    let tok = Tokenizer::load(files)?;
    let Some(fim) = Fim::find(&tok, files.gguf())? else {
        bail!(
            "--suffix needs a model with fill-in-the-middle tokens; {} has none",
            files.path.display()
        );
    };
    let Some(prefix) = a.prompt.prompt.as_deref() else {
        bail!("--suffix needs the prompt as text (--prompt)");
    };
    let ctx = a.ctx.unwrap_or(files.config.context_length());
    let limit = ctx - a.max_tokens.min(ctx / 2);
    let request = FimRequest {
        prefix,
        suffix,
        ..FimRequest::default()
    };
    let p = fim.prompt(&tok, &request, limit)?;
    if p.truncated {
        eprintln!("note: the prompt and the suffix were cut to fit {limit} tokens");
    }
    Ok((p.ids, tok, fim.end_ids().to_vec()))
}

/// `--json-schema`: inline JSON when it starts with `{`, otherwise a file holding it.
fn read_schema(arg: &str) -> Result<Schema> {
    let text = if arg.trim_start().starts_with('{') {
        arg.to_owned()
    } else {
        std::fs::read_to_string(arg).with_context(|| format!("--json-schema: cannot read {arg}"))?
    };
    let value: serde_json::Value =
        serde_json::from_str(&text).context("--json-schema is not valid JSON")?;
    Schema::compile(&value).context("--json-schema")
}

/// `generate` (its output kept to a language with `constraint`), or `generate_speculative`
/// with a draft and its tokens per pass.
#[allow(clippy::too_many_arguments)]
fn generate_with(
    session: &mut dyn Session,
    draft: Option<(&mut Draft<'_>, usize)>,
    sampler: &mut Sampler,
    constraint: Option<&mut OutputConstraint>,
    new_tokens: &[u32],
    history: &mut Vec<u32>,
    max_tokens: usize,
    stop: &[u32],
    on_token: impl FnMut(u32) -> Result<bool>,
) -> Result<(Stats, Stop, Option<DraftStats>)> {
    match draft {
        None => generate(
            session, sampler, constraint, new_tokens, history, max_tokens, stop, on_token,
        )
        .map(|(stats, why)| (stats, why, None)),
        Some((draft, k)) => generate_speculative(
            session, draft, k, sampler, new_tokens, history, max_tokens, stop, on_token,
        )
        .map(|(stats, why, spec)| (stats, why, Some(spec))),
    }
}

/// Set while a reply is streaming: Ctrl-C then ends the reply instead of the program.
static GENERATING: AtomicBool = AtomicBool::new(false);
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

fn cmd_chat(a: ChatArgs) -> Result<()> {
    ctrlc::set_handler(|| {
        if GENERATING.load(Ordering::SeqCst) {
            INTERRUPTED.store(true, Ordering::SeqCst);
        } else {
            println!();
            std::process::exit(0);
        }
    })?;
    let l = Loaded::open(&a.model)?;
    let tok = Tokenizer::load(l.files()?)?;
    let template = ChatTemplate::load(l.files()?, &tok, a.chat_template_file.as_deref())?;
    let m = l.model()?;
    let sampling = a.sampling.config();
    let mut sampler = a.sampling.sampler(sampling, Some(&tok))?;
    let draft = a.draft.open(&l, &a.model, &sampling)?;
    let draft_tokens = a.draft.draft_tokens as usize;
    let engine = l.engine(&m)?;
    let mut stop = l.files()?.eos_token_ids.clone();
    stop.extend(sapient::chat::end_of_turn_ids(&tok));
    let mut messages: Vec<Message> = a
        .system
        .iter()
        .map(|s| Message::text("system", s.clone()))
        .collect();
    // The tokens the cache holds, in order.
    let mut history: Vec<u32> = Vec::new();
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    eprintln!("(Ctrl-D or Ctrl-C to quit; Ctrl-C during a reply ends the reply)");
    with_draft(
        &engine,
        &draft,
        draft_sampler(&sampler)?,
        a.ctx,
        DEFAULT_BATCH,
        |session, mut d| loop {
            write!(stdout, "> ")?;
            stdout.flush()?;
            let mut line = String::new();
            if stdin.lock().read_line(&mut line)? == 0 {
                writeln!(stdout)?;
                return Ok(());
            }
            let line = line.trim_end_matches(['\n', '\r']);
            if line.trim().is_empty() {
                continue;
            }
            messages.push(Message::text("user", line.to_owned()));
            let text = template.render(&messages, true)?;
            let ids = tok.encode_chat(&text)?;
            // Only what the cache does not hold yet goes through the model.
            let common = history.iter().zip(&ids).take_while(|(a, b)| a == b).count();
            session.truncate(common);
            history.truncate(common);
            let room = session.max_seq() - common;
            if ids.len() - common >= room {
                messages.pop();
                eprintln!(
                    "error: the conversation no longer fits in --ctx {}",
                    session.max_seq()
                );
                continue;
            }
            let mut reply_ids = Vec::new();
            let mut stream = TextStream::new(&tok);
            INTERRUPTED.store(false, Ordering::SeqCst);
            GENERATING.store(true, Ordering::SeqCst);
            let result = generate_with(
                session,
                d.as_deref_mut().map(|d| (d, draft_tokens)),
                &mut sampler,
                None,
                &ids[common..],
                &mut history,
                a.max_tokens,
                &stop,
                |t| {
                    reply_ids.push(t);
                    if let Some(text) = stream.push(t)? {
                        write!(stdout, "{text}")?;
                        stdout.flush()?;
                    }
                    Ok(!INTERRUPTED.load(Ordering::SeqCst))
                },
            );
            GENERATING.store(false, Ordering::SeqCst);
            let (stats, _, spec) = result?;
            if let Some(rest) = stream.finish()? {
                write!(stdout, "{rest}")?;
            }
            writeln!(stdout)?;
            match spec {
                Some(d) => eprintln!("[{}; {}]", stats.summary(), d.summary()),
                None => eprintln!("[{}]", stats.summary()),
            }
            messages.push(Message::text("assistant", tok.decode(&reply_ids, true)?));
        },
    )
}

fn cmd_serve(a: ServeArgs) -> Result<()> {
    let l = Loaded::open(&a.model)?;
    let files = l.files()?;
    let m = l.model()?;
    let engine = l.engine(&m)?;
    let ctx = a.ctx.min(m.config.context_length().max(1));
    let model_id = a.alias.clone().unwrap_or_else(|| {
        let p = &files.path;
        let name = if p.is_dir() {
            p.file_name()
        } else {
            p.file_stem()
        };
        name.map_or("model".into(), |n| n.to_string_lossy().into_owned())
    });
    let opts = sapient::serve::ServeOptions {
        addr: std::net::SocketAddr::new(a.host, a.port),
        parallel: a.parallel as usize,
        ctx,
        batch: a.batch.max(1),
        kv: l.kv_format(&m),
        api_key: a.api_key,
        queue_limit: a.queue,
        max_tokens_limit: a.max_tokens_limit,
        body_limit: 8 << 20,
        max_connections: a.max_connections,
        shutdown_grace: std::time::Duration::from_secs(a.shutdown_timeout),
        header_timeout: std::time::Duration::from_secs(a.header_timeout.max(1)),
        model_id,
        chat_template_file: a.chat_template_file,
        reasoning: a.reasoning_format != ReasoningFormat::None,
    };
    let backend = match &engine {
        Engine::Cpu(_) => sapient::serve::ServeBackend::Cpu(&m, &l.exec),
        #[cfg(feature = "gpu")]
        Engine::Gpu(g) => sapient::serve::ServeBackend::Gpu(g),
    };
    sapient::serve::serve(files, backend, opts)
}

fn cmd_quantize(
    input: &str,
    output: &std::path::Path,
    target: TargetArg,
    threads: Option<usize>,
) -> Result<()> {
    use sapient::convert::{write_model, Target};
    let target = match target {
        TargetArg::F16 => Target::F16,
        TargetArg::Q8_0 => Target::Q8_0,
        TargetArg::Q4_0 => Target::Q4_0,
        TargetArg::Q4_1 => Target::Q4_1,
        TargetArg::Q4K => Target::Q4K,
        TargetArg::Q6K => Target::Q6K,
        TargetArg::Q4KM => Target::Q4KM,
        TargetArg::Q5KM => Target::Q5KM,
        TargetArg::IQ4NL => Target::IQ4NL,
        TargetArg::IQ4XS => Target::IQ4XS,
    };
    let path = resolve::resolve(input)?;
    if output.exists() && std::fs::canonicalize(output)? == std::fs::canonicalize(&path)? {
        bail!("the output {} is the input", output.display());
    }
    let files = ModelFiles::open(&path, &LoadOptions::default())?;
    let model = files.model(Quantize::AsStored)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.unwrap_or_else(num_cpus::get_physical).max(1))
        .build()?;
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template("writing {bar:30} {pos}/{len} tensors").unwrap(),
    );
    let t0 = Instant::now();
    let report = pool.install(|| {
        write_model(
            &files,
            &model,
            output,
            target,
            &|done, total| {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
            },
            &mut |w| bar.suspend(|| eprintln!("warning: {w}")),
        )
    })?;
    bar.finish_and_clear();
    eprintln!(
        "wrote {}: {} tensors ({}), {:.1} MiB in {:.1}s",
        output.display(),
        report.tensors,
        report
            .types
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect::<Vec<_>>()
            .join(", "),
        report.bytes as f64 / (1 << 20) as f64,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

fn cmd_inspect(spec: &str, ctx: usize) -> Result<()> {
    let path = resolve::resolve(spec)?;
    let files = ModelFiles::open(
        &path,
        &LoadOptions {
            quantize: Quantize::None,
            config_file: None,
        },
    )?;
    let c = &files.config;
    println!("model: {}", path.display());
    #[cfg(feature = "gpu")]
    {
        let adapters = sapient::gpu::adapters();
        if adapters.is_empty() {
            println!("GPU adapters: none");
        }
        for a in adapters {
            println!("GPU adapter: {a}");
        }
    }
    println!("architecture: {}", files.arch);
    println!(
        "vocab {}, hidden {}, intermediate {}, layers {}, heads {} (kv {}), head_dim {}",
        c.vocab_size,
        c.hidden_size,
        c.intermediate_size,
        c.n_layers,
        c.n_heads,
        c.n_kv_heads,
        c.head_dim
    );
    println!(
        "rms_norm_eps {}, rope theta {} ({:?} pairs){}, max positions {}, tied embeddings {}, qkv bias {}, sliding window {:?}",
        c.rms_norm_eps,
        c.rope_theta,
        c.rope_style,
        c.rope_scaling.map_or(String::new(), |s| format!(", {} scaling x{}", s.name(), s.factor())),
        c.max_position_embeddings,
        c.tie_word_embeddings,
        c.qkv_bias,
        c.sliding_window
    );
    if let Some(g) = files.gguf() {
        let mut by_type: std::collections::BTreeMap<&str, usize> = Default::default();
        let mut params = 0usize;
        for t in g.tensors.values() {
            *by_type.entry(t.ggml_type.name()).or_default() += 1;
            params += t.dims.iter().product::<usize>();
        }
        println!(
            "GGUF v{}: {} tensors ({}), {:.1}M parameters",
            g.version,
            g.tensors.len(),
            by_type
                .iter()
                .map(|(k, v)| format!("{v} {k}"))
                .collect::<Vec<_>>()
                .join(", "),
            params as f64 / 1e6
        );
    }
    // As `generate` loads it by default: quantized matrices in place, float ones as Q8_0.
    let m = files.model(Quantize::Auto)?;
    println!("{}", load::summary(&m, &files.arch));
    println!(
        "weights read per decoded token: {:.1} MiB",
        load::weight_bytes_per_token(&m) as f64 / (1 << 20) as f64
    );
    for kv in [KvFormat::F32, KvFormat::F16, KvFormat::Q8_0] {
        match KvCache::bytes_needed(c, ctx, kv) {
            Ok(b) => println!(
                "KV cache for {ctx} tokens in {:?}: {:.1} MiB",
                kv,
                b as f64 / (1 << 20) as f64
            ),
            Err(e) => println!("KV cache in {kv:?}: {e}"),
        }
    }
    // The activations' arena: decoding one token at a time, and prefilling in `generate`'s
    // batches.
    for batch in [1, DEFAULT_BATCH] {
        match Scratch::bytes_needed(c, batch) {
            Ok(b) => println!(
                "scratch for batches of {batch} tokens: {:.1} KiB",
                b as f64 / 1024.0
            ),
            Err(e) => println!("scratch for batches of {batch} tokens: {e}"),
        }
    }
    Ok(())
}
