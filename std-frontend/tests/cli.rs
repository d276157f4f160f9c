//! The `sapient` binary: its JSON outputs, exit codes and error lines.
use std::path::PathBuf;
use std::process::{Command, Output};

fn sapient(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sapient"))
        .args(args)
        .output()
        .unwrap()
}

/// The repository's `tests/fixtures`, or `$SAPIENT_FIXTURES`, as the golden tests find them.
fn fixtures() -> PathBuf {
    match std::env::var("SAPIENT_FIXTURES") {
        Ok(p) => PathBuf::from(p),
        Err(_) => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures"),
    }
}

fn fixture(name: &str) -> String {
    let p = fixtures().join("tiny").join(name);
    p.to_str().unwrap().to_owned()
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn logits_json_has_one_row_per_position() {
    let m = fixture("llama");
    let last = json(&sapient(&[
        "logits",
        "--model",
        &m,
        "--prompt-ids",
        "1,5,9",
        "--quantize",
        "none",
        "--kv",
        "f32",
    ]));
    assert_eq!(last["prompt_ids"], serde_json::json!([1, 5, 9]));
    assert_eq!(last["logits"].as_array().unwrap().len(), 1);
    assert_eq!(last["logits"][0].as_array().unwrap().len(), 512);
    let all = json(&sapient(&[
        "logits",
        "--model",
        &m,
        "--prompt-ids",
        "1,5,9",
        "--all-positions",
        "--threads",
        "2",
    ]));
    assert_eq!(all["logits"].as_array().unwrap().len(), 3);
}

#[test]
fn generate_and_embed_json() {
    let m = fixture("qwen2");
    let g = json(&sapient(&[
        "generate",
        "--model",
        &m,
        "--prompt-ids",
        "1,5,9",
        "--max-tokens",
        "4",
        "--temperature",
        "0",
        "--format",
        "json",
    ]));
    assert_eq!(g["generated_ids"].as_array().unwrap().len(), 4);
    let e = json(&sapient(&[
        "embed",
        "--model",
        &m,
        "--prompt-ids",
        "1,5,9",
        "--format",
        "json",
    ]));
    assert_eq!(e["embedding"].as_array().unwrap().len(), 128);
}

#[test]
fn same_seed_same_tokens_from_the_cli() {
    let m = fixture("llama_hd32");
    let run = |seed: &str| {
        json(&sapient(&[
            "generate",
            "-m",
            &m,
            "--prompt-ids",
            "3,4",
            "-n",
            "12",
            "--temperature",
            "1.0",
            "--seed",
            seed,
            "--format",
            "json",
        ]))["generated_ids"]
            .clone()
    };
    assert_eq!(run("7"), run("7"));
}

#[test]
fn usage_errors_exit_2_and_runtime_errors_exit_1_with_one_line() {
    let out = sapient(&["logits", "--prompt-ids", "1"]);
    assert_eq!(out.status.code(), Some(2));
    let out = sapient(&["logits", "--model", "/no/such/model", "--prompt-ids", "1"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: model not found") && err.lines().count() == 1,
        "{err}"
    );
    let out = sapient(&[
        "logits",
        "--model",
        &fixture("llama"),
        "--prompt-ids",
        "1,99999",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("99999"));
}

/// `SAPIENT_CPU_KERNELS` picks the kernels (the load summary names them; the scalar table's
/// logits agree with the fastest table's), and a name the machine has no table of is an error
/// naming the ones it has.
#[test]
fn cpu_kernels_from_the_environment() {
    let m = fixture("llama");
    let args = [
        "logits",
        "--model",
        &m,
        "--prompt-ids",
        "1,5,9",
        "--threads",
        "1",
    ];
    let run = |kernels: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sapient"));
        c.args(args).env_remove("SAPIENT_CPU_KERNELS");
        if let Some(k) = kernels {
            c.env("SAPIENT_CPU_KERNELS", k);
        }
        c.output().unwrap()
    };
    let fastest = run(None);
    let scalar = run(Some("scalar"));
    assert!(String::from_utf8_lossy(&scalar.stderr).contains(", scalar kernels,"));
    let logits = |out: &Output| -> Vec<f64> {
        let row = json(out)["logits"][0].clone();
        serde_json::from_value(row).unwrap()
    };
    let (a, b) = (logits(&fastest), logits(&scalar));
    assert_eq!(a.len(), b.len());
    let worst = a
        .iter()
        .zip(&b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(worst < 1e-2, "scalar and fastest kernels differ by {worst}");
    let out = run(Some("no-such-kernels"));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("SAPIENT_CPU_KERNELS=no-such-kernels") && err.contains("scalar"),
        "{err}"
    );
}

/// A context or a number of sequences whose KV cache the machine cannot hold is an error that
/// says so, where the allocator would abort the process (half a petabyte: past any address
/// space, whatever the OS's overcommit policy).
#[test]
fn a_kv_cache_too_large_for_the_machine_is_an_error() {
    let m = fixture("llama");
    for args in [
        &[
            "generate",
            "-m",
            &m,
            "--prompt-ids",
            "1,2",
            "-n",
            "2",
            "--ctx",
            "1000000000000",
        ][..],
        &[
            "bench",
            "-m",
            &m,
            "-p",
            "0",
            "-n",
            "2",
            "--parallel",
            "2",
            "-d",
            "1000000000000",
        ][..],
    ] {
        let out = sapient(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.lines()
                .last()
                .unwrap_or("")
                .starts_with("error: cannot allocate"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn inspect_reports_the_kv_cache_size() {
    let out = sapient(&["inspect", &fixture("mistral"), "--ctx", "1024"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("architecture: mistral") && text.contains("sliding window Some(16)"),
        "{text}"
    );
    // 2 layers x K,V x 1024 positions x 1 kv head x 32 f32 values.
    assert!(
        text.contains("KV cache for 1024 tokens in F32: 0.5 MiB"),
        "{text}"
    );
    // docs/embedded.md's formula: 4·(2h + 2q + 2kv + ff + d + tmp + r·V) + 72·w/32 with h 128,
    // q 128, kv 32, ff 192, d 32, tmp 512, r 1, V 512, w 192: 7728 bytes.
    assert!(
        text.contains("scratch for batches of 1 tokens: 7.5 KiB"),
        "{text}"
    );
}

/// `--quantize q8_0` converts a quantized file's matrices to Q8_0; the default keeps them.
#[test]
fn quantize_q8_0_converts_quantized_matrices() {
    let dir = std::env::temp_dir().join(format!("sapient-cli-requantize-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let q4 = dir.join("llama_hd32.q4_0.gguf");
    let out = sapient(&[
        "quantize",
        &fixture("llama_hd32"),
        q4.to_str().unwrap(),
        "--type",
        "q4_0",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = |quantize: &[&str]| {
        let mut args = vec![
            "generate",
            "-m",
            q4.to_str().unwrap(),
            "--prompt-ids",
            "1,2,3",
        ];
        args.extend_from_slice(&["-n", "1", "--backend", "cpu"]);
        args.extend_from_slice(quantize);
        let out = sapient(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let kept = summary(&[]);
    assert!(kept.contains("matrices: 1 q8_0, 14 q4_0"), "{kept}");
    let converted = summary(&["--quantize", "q8_0"]);
    assert!(converted.contains("matrices: 15 q8_0"), "{converted}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A two-turn chat on the real model: the second turn feeds only its own new tokens, since the
/// first turn stays in the KV cache; end of input ends the program cleanly.
#[test]
fn chat_keeps_the_conversation_in_the_cache() {
    use std::io::Write;
    let model =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        model.is_file(),
        "run scripts/fetch-model.sh first (scripts/test.sh does)"
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_sapient"))
        .args([
            "chat",
            "-m",
            model.to_str().unwrap(),
            "--temperature",
            "0",
            "-n",
            "16",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"What is the capital of France?\nAnd of Italy?\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.matches("> ").count(),
        3,
        "two replies, then the prompt at end of input: {stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let prompts: Vec<usize> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("[prompt: "))
        .map(|l| l.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(prompts.len(), 2, "{stderr}");
    // The whole second conversation is longer than the first turn's prompt; only its new part
    // (the end of the first reply's turn and the new question) goes through the model.
    assert!(prompts[1] < prompts[0], "{prompts:?}");
}

/// `bench --format json` reports both tests, at a depth too.
#[test]
fn bench_json_reports_rates_at_a_depth() {
    let m = fixture("llama");
    let args = |depth: &str| {
        sapient(&[
            "bench", "-m", &m, "-p", "8", "-n", "4", "-d", depth, "-r", "1", "-t", "2", "--format",
            "json",
        ])
    };
    let r = json(&args("20"));
    assert_eq!(r["threads"], 2);
    assert_eq!(r["depth"], 20);
    assert!(r["prefill_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(r["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(args("-1").status.code(), Some(2));
}

/// `bench --parallel N` decodes N sequences together and reports their tokens per second;
/// zero sequences is a usage error.
#[test]
fn bench_parallel_decodes_several_sequences() {
    let m = fixture("llama");
    let args = |n: &str| {
        sapient(&[
            "bench",
            "-m",
            &m,
            "-p",
            "0",
            "-n",
            "4",
            "--parallel",
            n,
            "-r",
            "1",
            "-t",
            "2",
            "--backend",
            "cpu",
            "--format",
            "json",
        ])
    };
    let r = json(&args("9"));
    assert_eq!(r["parallel"], 9);
    assert_eq!(r["prefill_tokens_per_s"], serde_json::Value::Null);
    assert!(r["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(args("0").status.code(), Some(2));
}

/// Whether wgpu finds no adapter: the GPU tests then skip, saying so (unless
/// `SAPIENT_REQUIRE_GPU` is set, as CI sets it, where they fail).
#[cfg(feature = "gpu")]
fn no_gpu() -> bool {
    if !sapient::gpu::adapters().is_empty() {
        return false;
    }
    assert!(
        std::env::var_os("SAPIENT_REQUIRE_GPU").is_none(),
        "SAPIENT_REQUIRE_GPU is set but wgpu finds no adapter"
    );
    eprintln!("SKIPPED: no GPU adapter");
    true
}

/// `--backend gpu` (any adapter, lavapipe included) gives the CPU's greedy tokens with each KV
/// cache format, and `bench` reports its dispatches per decoded token (five per layer and three
/// more; six per layer with a Q8_0 cache), times each kernel (`--profile`, which the CPU refuses)
/// and decodes several sequences together.
#[cfg(feature = "gpu")]
#[test]
fn gpu_backend_from_the_cli() {
    if no_gpu() {
        return;
    }
    let m = fixture("qwen2");
    let generate = |backend: &str, kv: &str| {
        json(&sapient(&[
            "generate",
            "-m",
            &m,
            "--prompt-ids",
            "1,5,9,13",
            "-n",
            "12",
            "--temperature",
            "0",
            "--kv",
            kv,
            "--format",
            "json",
            "--backend",
            backend,
        ]))["generated_ids"]
            .clone()
    };
    assert_eq!(generate("gpu", "f32"), generate("cpu", "f32"));
    assert_eq!(generate("gpu", "f16"), generate("cpu", "f16"));
    assert_eq!(generate("gpu", "q8_0"), generate("cpu", "q8_0"));
    let two_tokens = |model: &str, kv: &str| {
        let args = ["generate", "-m", model, "--prompt-ids", "1,5", "-n", "2"];
        sapient(&[&args[..], &["--kv", kv, "--backend", "gpu"]].concat())
    };
    let out = two_tokens(&m, "q8_0");
    assert!(String::from_utf8_lossy(&out.stderr).contains("GPU: "));
    assert!(String::from_utf8_lossy(&out.stderr).contains("q8_0 KV cache"));
    // Q8_0 blocks of 32 need heads of a multiple of 32 values (the llama fixture's have 16).
    let out = two_tokens(&fixture("llama"), "q8_0");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--kv q8_0 needs heads of a multiple of 32 values; this model's have 16"),
        "{err}"
    );
    let bench = |backend: &str, extra: &[&str]| {
        let mut args = vec![
            "bench",
            "-m",
            &m,
            "-p",
            "8",
            "-n",
            "4",
            "-r",
            "1",
            "--format",
            "json",
            "--backend",
            backend,
        ];
        args.extend_from_slice(extra);
        sapient(&args)
    };
    let plain = json(&bench("gpu", &[]));
    assert_eq!(plain["backend"], "gpu");
    let layers = 2; // the qwen2 fixture's
    assert_eq!(plain["dispatches_per_token"], 5 * layers + 3);
    // A Q8_0 cache's new rows are quantized in a dispatch of their own.
    let q8_0 = json(&bench("gpu", &["--kv", "q8_0"]));
    assert_eq!(q8_0["dispatches_per_token"], 6 * layers + 3);
    // --profile: every kernel's time per token, on the GPU only.
    let timed = json(&bench("gpu", &["--profile"]));
    let decode = &timed["kernel_times"]["decode"];
    let kernels = decode["kernels"].as_array().unwrap();
    let calls: f64 = kernels
        .iter()
        .map(|k| k["calls_per_token"].as_f64().unwrap())
        .sum();
    assert_eq!(calls, (5 * layers + 3) as f64);
    assert!(kernels.iter().any(|k| k["kernel"] == "attention"));
    assert!(decode["gpu_span_us_per_token"].as_f64().unwrap() > 0.0);
    assert!(decode["host_us_per_token"].as_f64().unwrap() > 0.0);
    assert!(
        timed["kernel_times"]["prefill"]["kernels_us_per_token"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    let cpu = bench("cpu", &["--profile"]);
    assert_eq!(cpu.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&cpu.stderr).contains("kernel times need the GPU backend"));
    // Several sequences decoding together in one GPU session's KV slots.
    let parallel = json(&sapient(&[
        "bench",
        "-m",
        &m,
        "-p",
        "0",
        "-n",
        "4",
        "-d",
        "3",
        "-r",
        "1",
        "--parallel",
        "3",
        "--backend",
        "gpu",
        "--format",
        "json",
    ]));
    assert_eq!(parallel["parallel"], 3);
    assert!(parallel["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
}

/// Without the GPU backend, asking for it is a clear error (exit 1), and `auto` runs on the CPU.
#[cfg(not(feature = "gpu"))]
#[test]
fn gpu_backend_missing_is_a_clear_error() {
    let m = fixture("qwen2");
    let out = sapient(&[
        "logits",
        "-m",
        &m,
        "--prompt-ids",
        "1,5",
        "--backend",
        "gpu",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--features gpu"));
    json(&sapient(&[
        "logits",
        "-m",
        &m,
        "--prompt-ids",
        "1,5",
        "--backend",
        "auto",
    ]));
}

/// `tokenize` gives the reference ids of SmolLM2's prompts from its GGUF file, from `-p` and from
/// `-f`, with and without the BOS the file does not ask for.
#[test]
fn tokenize_prints_the_reference_ids() {
    let model =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let model = model.to_str().unwrap();
    let reference = fixtures().join("smollm2/reference.json");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(reference).unwrap()).unwrap();
    let prompts = reference["prompts"].as_array().unwrap();
    assert!(!prompts.is_empty());
    let dir = std::env::temp_dir().join(format!("sapient-tokenize-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for p in prompts {
        let text = p["prompt"].as_str().unwrap();
        let out = json(&sapient(&[
            "tokenize", "-m", model, "-p", text, "--format", "json",
        ]));
        assert_eq!(out["ids"], p["ids"], "{text:?}");
        let file = dir.join("prompt.txt");
        std::fs::write(&file, text).unwrap();
        let out = sapient(&["tokenize", "-m", model, "-f", file.to_str().unwrap()]);
        let ids: Vec<u64> = String::from_utf8(out.stdout)
            .unwrap()
            .split_whitespace()
            .map(|t| t.parse().unwrap())
            .collect();
        assert_eq!(serde_json::json!(ids), p["ids"], "{text:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
    let out = sapient(&["tokenize", "-m", "/nonexistent/model.gguf", "-p", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/model.gguf"));
}

fn smollm2() -> String {
    let model =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        model.is_file(),
        "run scripts/fetch-model.sh first (scripts/test.sh does)"
    );
    model.to_str().unwrap().to_owned()
}

/// `embed -f`: one embedding per line, in order, each the one `-p` gives for that line; pooling
/// and normalization as asked; an empty line is an error naming it.
#[test]
fn embed_a_file_of_texts() {
    let m = smollm2();
    let dir = std::env::temp_dir().join(format!("sapient-embed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lines = ["The capital of France is", "Hello world", "fn main() {}"];
    let file = dir.join("lines.txt");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let file = file.to_str().unwrap();
    let kv = ["--kv", "f32"];
    let many = json(&sapient(
        &[
            &["embed", "-m", &m, "-f", file, "--format", "json"],
            &kv[..],
        ]
        .concat(),
    ));
    let many = many["embeddings"].as_array().unwrap();
    assert_eq!(many.len(), lines.len());
    for (line, e) in lines.iter().zip(many) {
        let one = json(&sapient(
            &[
                &["embed", "-m", &m, "-p", line, "--format", "json"],
                &kv[..],
            ]
            .concat(),
        ));
        assert_eq!(&one["embedding"], e, "{line}");
    }
    let unit = json(&sapient(&[
        "embed",
        "-m",
        &m,
        "-f",
        file,
        "--pooling",
        "last",
        "--normalize",
        "--format",
        "json",
    ]));
    for e in unit["embeddings"].as_array().unwrap() {
        let norm: f64 = e
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap().powi(2))
            .sum();
        assert!((norm - 1.0).abs() < 1e-4, "{norm}");
    }
    let holed = dir.join("holed.txt");
    std::fs::write(&holed, "one\n\nthree\n").unwrap();
    let out = sapient(&["embed", "-m", &m, "-f", holed.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `generate --draft-model` and `--draft ngram`: the same tokens as without a draft, with the
/// draft's counts in the JSON; a draft with another vocabulary is refused.
#[test]
fn speculative_generation_from_the_cli() {
    let m = smollm2();
    let base = [
        "generate",
        "-m",
        &m,
        "-p",
        "def add(a, b):\n    return a + b\n\ndef add3(a, b, c):",
        "-n",
        "24",
        "--temperature",
        "0",
        "--format",
        "json",
    ];
    let plain = json(&sapient(&base));
    for draft in [
        &["--draft", "ngram"][..],
        &["--draft-model", &m, "--draft-tokens", "4"][..],
    ] {
        let spec = json(&sapient(&[&base[..], draft].concat()));
        assert_eq!(spec["generated_ids"], plain["generated_ids"], "{draft:?}");
        assert!(spec["draft_proposed"].as_u64().is_some(), "{spec}");
        assert!(spec["draft_accepted"].as_u64() <= spec["draft_proposed"].as_u64());
    }
    let tiny = fixture("llama");
    let out = sapient(&[&base[..], &["--draft-model", &tiny]].concat());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("vocabulary"), "{err}");
}

/// A reader that stops reading (`sapient generate ... | head -c 10`) ends sapient quietly, and
/// Ctrl-C keeps what was generated and exits with 130.
#[test]
fn closed_pipe_and_ctrl_c_end_generation_cleanly() {
    use std::io::Read;
    use std::process::Stdio;
    let m = smollm2();
    let args = [
        "generate",
        "-m",
        &m,
        "-p",
        "Once upon a time",
        "-n",
        "3000",
        "--ctx",
        "4096",
        "--temperature",
        "0",
    ];
    let mut child = Command::new(env!("CARGO_BIN_EXE_sapient"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 10];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // The read end is dropped here: the next write fails with a broken pipe.
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    // (A GPU build's adapter probe may print its own lines; sapient's would name the pipe.)
    assert!(
        !err.contains("Broken pipe") && !err.contains("panicked"),
        "{err}"
    );

    let mut child = Command::new(env!("CARGO_BIN_EXE_sapient"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once text streams, generation (and its Ctrl-C handler) has started.
    let mut stdout = child.stdout.take().unwrap();
    stdout.read_exact(&mut first).unwrap();
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted"), "{err}");
}

/// `sapient serve --backend gpu`: two greedy completions at once (their tokens share the GPU
/// session's forward passes, each in its own KV slot) give `sapient generate`'s CPU text.
#[cfg(feature = "gpu")]
#[test]
fn serve_on_the_gpu() {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    if no_gpu() {
        return;
    }
    let m = smollm2();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // Killed when the test ends, passed or not.
    struct Server(std::process::Child);
    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let server = Server(
        Command::new(env!("CARGO_BIN_EXE_sapient"))
            .args(["serve", "-m", &m, "--backend", "gpu", "--parallel", "2"])
            .args(["--ctx", "64", "--port", &port.to_string()])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let request = |method: &str, path: &str, body: &str| -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(300))).ok()?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(head.as_bytes()).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while request("GET", "/health", "").is_none_or(|r| !r.starts_with("HTTP/1.1 200")) {
        assert!(Instant::now() < deadline, "the server never came up");
        std::thread::sleep(Duration::from_millis(200));
    }
    let prompts = ["The capital of France is", "Once upon a time"];
    let texts: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                s.spawn(move || {
                    let body = serde_json::json!({
                        "model": "SmolLM2-135M-Instruct.Q4_1", "prompt": p,
                        "max_tokens": 3, "temperature": 0,
                    });
                    let reply = request("POST", "/v1/completions", &body.to_string()).unwrap();
                    let (_, body) = reply.split_once("\r\n\r\n").unwrap();
                    let v: serde_json::Value = serde_json::from_str(body).unwrap();
                    v["choices"][0]["text"].as_str().unwrap().to_string()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    drop(server);
    for (p, text) in prompts.iter().zip(&texts) {
        let want = json(&sapient(&[
            "generate",
            "-m",
            &m,
            "-p",
            p,
            "-n",
            "3",
            "--temperature",
            "0",
            "--backend",
            "cpu",
            "--format",
            "json",
        ]))["text"]
            .clone();
        assert_eq!(text, want.as_str().unwrap(), "{p}");
    }
}
