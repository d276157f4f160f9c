//! The `sapient` command line.
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use sapient::load::{self, LoadOptions, ModelFiles, Quantize};
use sapient::{run, Rayon};
use sapient_core::{KvFormat, Model};
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "sapient",
    version,
    about = "Llama-family LLM inference on the CPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the logits of a prompt given as token ids, as JSON.
    Logits {
        #[command(flatten)]
        model: ModelArgs,
        /// Logits of every position, not only the last.
        #[arg(long)]
        all_positions: bool,
    },
    /// Continue a prompt given as token ids (greedy).
    Generate {
        #[command(flatten)]
        model: ModelArgs,
        #[arg(long, default_value_t = 32)]
        max_tokens: usize,
        /// Only 0 (greedy) for now.
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
    /// Print the mean of the final hidden states of a prompt given as token ids.
    Embed {
        #[command(flatten)]
        model: ModelArgs,
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
}

#[derive(Args)]
struct ModelArgs {
    /// A Hugging Face checkpoint directory, or a .safetensors file with config.json beside it.
    #[arg(short, long)]
    model: PathBuf,
    /// Read the config from this file instead of config.json beside the weights.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Prompt token ids, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    prompt_ids: Vec<u32>,
    /// What to do with f32/f16/bf16 matrices at load.
    #[arg(long, value_enum, default_value_t = QuantizeArg::Q8_0)]
    quantize: QuantizeArg,
    /// KV cache format (default: q8_0 when head_dim is a multiple of 32, f32 otherwise).
    #[arg(long, value_enum)]
    kv: Option<KvArg>,
    /// Worker threads (default: one per physical core).
    #[arg(short, long)]
    threads: Option<usize>,
}

#[derive(Clone, Copy, ValueEnum)]
enum QuantizeArg {
    None,
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
    files: ModelFiles,
    exec: Rayon,
    quantize: Quantize,
    kv: Option<KvArg>,
    prompt: Vec<u32>,
}

impl Loaded {
    fn open(a: ModelArgs) -> Result<Self> {
        let quantize = match a.quantize {
            QuantizeArg::None => Quantize::None,
            QuantizeArg::Q8_0 => Quantize::Q8_0,
        };
        let opts = LoadOptions {
            quantize,
            config_file: a.config,
        };
        if a.prompt_ids.is_empty() {
            bail!("--prompt-ids is empty");
        }
        Ok(Loaded {
            files: ModelFiles::open(&a.model, &opts)?,
            exec: Rayon::new(a.threads)?,
            quantize,
            kv: a.kv,
            prompt: a.prompt_ids,
        })
    }

    fn model(&self) -> Result<Model<'_>> {
        let model = self.files.model(self.quantize)?;
        eprintln!("{}", load::summary(&model, self.files.hf.arch.name()));
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
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run_command(command: Command) -> Result<()> {
    match command {
        Command::Logits {
            model,
            all_positions,
        } => {
            let l = Loaded::open(model)?;
            let m = l.model()?;
            let logits = run::logits(&m, &l.prompt, all_positions, l.kv_format(&m), &l.exec)?;
            println!("{}", json!({ "prompt_ids": l.prompt, "logits": logits }));
        }
        Command::Generate {
            model,
            max_tokens,
            temperature,
            format,
        } => {
            if temperature != 0.0 {
                bail!("only --temperature 0 (greedy) is implemented for --prompt-ids");
            }
            let l = Loaded::open(model)?;
            let m = l.model()?;
            let stop = l.files.hf.eos_token_ids.clone();
            let ids = run::greedy(&m, &l.prompt, max_tokens, &stop, l.kv_format(&m), &l.exec)?;
            match format {
                OutputFormat::Json => println!(
                    "{}",
                    json!({ "prompt_ids": l.prompt, "generated_ids": ids })
                ),
                OutputFormat::Text => println!(
                    "{}",
                    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
                ),
            }
        }
        Command::Embed { model, format } => {
            let l = Loaded::open(model)?;
            let m = l.model()?;
            let e = run::embedding(&m, &l.prompt, l.kv_format(&m), &l.exec)?;
            match format {
                OutputFormat::Json => println!("{}", json!({ "embedding": e })),
                OutputFormat::Text => println!(
                    "{}",
                    e.iter().map(f32::to_string).collect::<Vec<_>>().join(" ")
                ),
            }
        }
    }
    Ok(())
}
