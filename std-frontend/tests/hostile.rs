//! Hostile model files, through the library and through the CLI: every one is an error whose
//! message names the problem; the CLI exits 1 with one line on stderr, never a panic, never a
//! signal, within seconds.
//!
//! The files are made from the repository's fixtures: a valid Q8_0 GGUF written by
//! `sapient quantize` from `tiny/llama`, and copies of that checkpoint's directory, then cut,
//! patched or rewritten.
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sapient::load::gguf::Gguf;
use sapient::{LoadOptions, ModelFiles, Quantize};

/// Longest a hostile file may keep the CLI busy.
const DEADLINE: Duration = Duration::from_secs(10);

fn fixtures() -> PathBuf {
    match std::env::var("SAPIENT_FIXTURES") {
        Ok(p) => PathBuf::from(p),
        Err(_) => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures"),
    }
}

/// A fresh directory for one test, removed when the test is done with it (a failing test's
/// stays, to look at).
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn scratch_dir(test: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("sapient-hostile-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// Runs the CLI with `stdin`, killing it at the deadline: (exit code, stderr).
fn cli(args: &[&str], stdin: &str) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sapient"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The CLI may fail before reading its input: a closed pipe is no error here.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            return (status.code(), err);
        }
        if start.elapsed() > DEADLINE {
            child.kill().unwrap();
            panic!("sapient {args:?} still ran after {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The CLI on `args` fails cleanly: exit code 1 (no signal), one line on stderr that contains
/// `needle`, no panic.
fn fails_cleanly(args: &[&str], stdin: &str, needle: &str) {
    let (code, err) = cli(args, stdin);
    // The calls pass `--backend cpu`: a GPU build's adapter probe may print lines of its own
    // (lavapipe's "error: XDG_RUNTIME_DIR ..."); sapient's starts with "error:" too.
    let ours: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(code, Some(1), "sapient {args:?}: {err}");
    assert!(!err.contains("panicked"), "sapient {args:?}: {err}");
    assert_eq!(ours.len(), 1, "sapient {args:?}: {err}");
    assert!(
        ours[0].contains(needle),
        "sapient {args:?}: {err:?} does not name {needle:?}"
    );
}

/// Generating two tokens from `model` fails cleanly, naming `needle`.
fn generate_fails(model: &Path, needle: &str) {
    let m = model.to_str().unwrap();
    fails_cleanly(
        &[
            "generate",
            "-m",
            m,
            "--prompt-ids",
            "1,2,3",
            "-n",
            "2",
            "--backend",
            "cpu",
        ],
        "",
        needle,
    );
}

/// Loading `model` through the library fails (at open or at building the model), naming `needle`.
fn load_fails(model: &Path, needle: &str) {
    let err = match ModelFiles::open(model, &LoadOptions::default()) {
        Err(e) => e,
        Ok(files) => match files.model(Quantize::AsStored) {
            Err(e) => e,
            Ok(_) => panic!("{} loaded", model.display()),
        },
    };
    let msg = format!("{err:#}");
    assert!(msg.contains(needle), "{msg:?} does not name {needle:?}");
}

/// A valid Q8_0 GGUF of the `llama` fixture, written by the CLI into `dir`.
fn good_gguf(dir: &Path) -> (PathBuf, Vec<u8>) {
    let path = dir.join("good.gguf");
    let src = fixtures().join("tiny/llama");
    let out = Command::new(env!("CARGO_BIN_EXE_sapient"))
        .args(["quantize", src.to_str().unwrap(), path.to_str().unwrap()])
        .args(["--type", "q8_0"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes)
}

/// Where the tensor table entry of `name` keeps its dimensions and its data offset.
struct TableEntry {
    dims_at: usize,
    n_dims: usize,
    offset_at: usize,
}

fn table_entry(buf: &[u8], name: &str) -> TableEntry {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend_from_slice(name.as_bytes());
    let at = buf
        .windows(key.len())
        .position(|w| w == key)
        .unwrap_or_else(|| panic!("no tensor {name}"))
        + key.len();
    let n_dims = u32::from_le_bytes(buf[at..at + 4].try_into().unwrap()) as usize;
    TableEntry {
        dims_at: at + 4,
        n_dims,
        offset_at: at + 4 + 8 * n_dims + 4,
    }
}

fn put_u64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn truncated_gguf_at_every_byte_and_boundary() {
    let dir = scratch_dir("gguf-truncated");
    let (_, good) = good_gguf(&dir);
    let g = Gguf::parse(&good).unwrap();
    let data_start = g.tensors.values().map(|t| t.start).min().unwrap();
    // The parser on every prefix of the header and at every tensor's edges.
    let mut cuts: Vec<usize> = (0..data_start + 1).collect();
    for t in g.tensors.values() {
        cuts.extend([t.start + 1, t.start + t.len / 2, t.start + t.len - 1]);
    }
    for &n in &cuts {
        assert!(
            Gguf::parse(&good[..n]).is_err(),
            "a prefix of {n} bytes parsed"
        );
    }
    // The library and the CLI at the structural boundaries: inside the magic, after it, after
    // the version, after each count, inside the metadata, inside the tensor table, inside the
    // data, one byte short.
    let first = g.order.first().unwrap();
    let table = table_entry(&good, first).dims_at;
    for n in [
        2,
        4,
        8,
        16,
        24,
        40,
        table - 1,
        table + 4,
        data_start - 1,
        data_start + 100,
        good.len() - 1,
    ] {
        let p = write(&dir, &format!("cut-{n}.gguf"), &good[..n]);
        load_fails(&p, "GGUF");
        generate_fails(&p, "GGUF");
    }
}

#[test]
fn lying_gguf_tables_are_errors() {
    let dir = scratch_dir("gguf-lying");
    let (_, good) = good_gguf(&dir);
    let g = Gguf::parse(&good).unwrap();
    let [a, b] = ["blk.0.attn_q.weight", "blk.0.attn_k.weight"].map(|n| table_entry(&good, n));
    let offset =
        |e: &TableEntry| u64::from_le_bytes(good[e.offset_at..e.offset_at + 8].try_into().unwrap());

    let mut cases: Vec<(&str, Vec<u8>, &str)> = Vec::new();
    let mut f = good.clone();
    put_u64(&mut f, a.offset_at, 1 << 40);
    cases.push(("offset past the end", f, "past the end"));
    let mut f = good.clone();
    put_u64(&mut f, a.offset_at, u64::MAX - 31);
    cases.push(("offset near 2^64", f, "past the end"));
    let mut f = good.clone();
    put_u64(&mut f, a.offset_at, offset(&a) + 1);
    cases.push(("misaligned offset", f, "not aligned"));
    let mut f = good.clone();
    put_u64(&mut f, b.offset_at, offset(&a) + 32);
    cases.push(("overlapping tensors", f, "overlap"));
    let mut f = good.clone();
    assert_eq!(a.n_dims, 2);
    put_u64(&mut f, a.dims_at, 1 << 40);
    put_u64(&mut f, a.dims_at + 8, 1 << 40);
    cases.push(("dimensions whose product overflows", f, "absurd shape"));
    let mut f = good.clone();
    put_u64(&mut f, a.dims_at + 8, 65);
    cases.push(("a shape the data does not hold", f, "overlap"));
    let mut f = good.clone();
    put_u64(&mut f, 8, 1 << 63);
    cases.push(("2^63 tensors", f, "tensor count"));
    let mut f = good.clone();
    put_u64(&mut f, 16, 1 << 63);
    cases.push(("2^63 metadata pairs", f, "metadata count"));
    let mut f = good.clone();
    put_u64(&mut f, 24, 1 << 40);
    cases.push(("a key of 2^40 bytes", f, "metadata key"));
    for (what, bytes, needle) in cases {
        assert!(Gguf::parse(&bytes).is_err(), "{what} parsed");
        let p = write(&dir, "lying.gguf", &bytes);
        load_fails(&p, needle);
        generate_fails(&p, needle);
    }
    assert!(g.tensors.len() > 2);
}

/// A Q8_0 block scale of NaN or infinity would turn every logit after it into NaN: an error
/// naming the non-finite values, not a token chosen from garbage.
#[test]
fn non_finite_scales_are_errors() {
    let dir = scratch_dir("gguf-nan");
    let (_, good) = good_gguf(&dir);
    let g = Gguf::parse(&good).unwrap();
    let q = &g.tensors["blk.1.attn_q.weight"];
    for (what, bits) in [("nan", 0x7e00u16), ("inf", 0x7c00u16)] {
        let mut f = good.clone();
        // The scale of the tensor's second block.
        f[q.start + 34..q.start + 36].copy_from_slice(&bits.to_le_bytes());
        let p = write(&dir, &format!("{what}.gguf"), &f);
        generate_fails(&p, "not finite");
    }
}

/// The `llama` fixture's directory with `edit` applied, in a fresh directory.
fn edited_checkpoint(test: &str, edit: impl FnOnce(&Path)) -> Scratch {
    let dir = scratch_dir(test);
    for f in std::fs::read_dir(fixtures().join("tiny/llama")).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
    }
    edit(&dir);
    dir
}

/// The safetensors file's header (as JSON) and its data.
fn split_safetensors(bytes: &[u8]) -> (serde_json::Value, &[u8]) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (
        serde_json::from_slice(&bytes[8..8 + n]).unwrap(),
        &bytes[8 + n..],
    )
}

fn join_safetensors(header: &serde_json::Value, data: &[u8]) -> Vec<u8> {
    let h = serde_json::to_vec(header).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out
}

#[test]
fn hostile_safetensors_are_errors() {
    let good = std::fs::read(fixtures().join("tiny/llama/model.safetensors")).unwrap();
    let (header, data) = split_safetensors(&good);
    let header_end = 8 + good.len() - data.len() - 8;
    let name = "model.layers.0.self_attn.q_proj.weight";
    assert!(header.get(name).is_some());
    let with = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut h = header.clone();
        edit(&mut h);
        join_safetensors(&h, data)
    };
    let mut cases: Vec<(String, Vec<u8>, &str)> = Vec::new();
    for (n, needle) in [
        (0, "8-byte header length"),
        (4, "8-byte header length"),
        (8, "header length points past"),
        (9, "header length points past"),
        (header_end / 2, "header length points past"),
        (header_end - 1, "header length points past"),
        (header_end + 1, "does not end where the file does"),
        (good.len() - 1, "does not end where the file does"),
    ] {
        cases.push((format!("cut at {n}"), good[..n].to_vec(), needle));
    }
    let mut f = good.clone();
    f[..8].copy_from_slice(&(1u64 << 63).to_le_bytes());
    cases.push(("header of 2^63 bytes".into(), f, "header length is absurd"));
    cases.push((
        "offsets past the end".into(),
        with(&|h| h[name]["data_offsets"][1] = (data.len() as u64 + 4096).into()),
        "disagree with its data offsets",
    ));
    cases.push((
        "overlapping offsets".into(),
        with(&|h| {
            let o = h[name]["data_offsets"].clone();
            h["model.layers.0.self_attn.k_proj.weight"]["data_offsets"] = o;
        }),
        "overlap another tensor",
    ));
    cases.push((
        "shape against offsets".into(),
        with(&|h| h[name]["shape"] = serde_json::json!([64, 65])),
        "disagree with its data offsets",
    ));
    cases.push((
        "shape overflowing".into(),
        with(&|h| h[name]["shape"] = serde_json::json!([1u64 << 40, 1u64 << 40])),
        "shape overflows",
    ));
    cases.push((
        "integer dtype".into(),
        with(&|h| h[name]["dtype"] = "I8".into()),
        "disagree with its data offsets",
    ));
    for (i, (what, bytes, needle)) in cases.into_iter().enumerate() {
        let dir = edited_checkpoint(&format!("st-{i}"), |d| {
            std::fs::write(d.join("model.safetensors"), &bytes).unwrap();
        });
        eprintln!("{what}");
        load_fails(&dir, needle);
        generate_fails(&dir, needle);
    }
}

/// NaN weights in a float checkpoint: refused at load, naming the tensor.
#[test]
fn nan_weights_are_errors() {
    let dir = edited_checkpoint("st-nan", |d| {
        let good = std::fs::read(d.join("model.safetensors")).unwrap();
        let (header, data) = split_safetensors(&good);
        let [start, _] = [0, 1].map(|i| {
            header["model.layers.1.mlp.down_proj.weight"]["data_offsets"][i]
                .as_u64()
                .unwrap() as usize
        });
        let mut data = data.to_vec();
        data[start + 40..start + 44].copy_from_slice(&f32::NAN.to_le_bytes());
        std::fs::write(
            d.join("model.safetensors"),
            join_safetensors(&header, &data),
        )
        .unwrap();
    });
    generate_fails(&dir, "not finite");
}

/// A change to a checkpoint directory.
type Edit<'a> = Box<dyn Fn(&Path) + 'a>;

#[test]
fn hostile_configs_are_errors() {
    let set = |key: &'static str, value: serde_json::Value| {
        move |d: &Path| {
            let p = d.join("config.json");
            let mut c: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            c[key] = value.clone();
            std::fs::write(p, c.to_string()).unwrap();
        }
    };
    let cases: Vec<(&str, Edit<'_>, &str)> = vec![
        (
            "heads not dividing the hidden size",
            Box::new(|d: &Path| {
                set("num_attention_heads", 6.into())(d);
                set("head_dim", serde_json::Value::Null)(d);
            }),
            "hidden_size",
        ),
        (
            "query heads not a multiple of KV heads",
            Box::new(set("num_key_value_heads", 3.into())),
            "num_key_value_heads",
        ),
        (
            "a vocabulary the embedding does not have",
            Box::new(set("vocab_size", 1000.into())),
            "embed_tokens has shape [512, 64]",
        ),
        (
            "an unknown architecture",
            Box::new(|d: &Path| {
                set("model_type", "gpt9".into())(d);
                set("architectures", serde_json::json!(["Gpt9ForCausalLM"]))(d);
            }),
            "unknown architecture",
        ),
        (
            "2^40 layers",
            Box::new(set("num_hidden_layers", (1u64 << 40).into())),
            "num_hidden_layers",
        ),
        (
            "config.json that does not parse",
            Box::new(|d: &Path| {
                std::fs::write(d.join("config.json"), "{\"hidden_size\": ").unwrap()
            }),
            "config.json",
        ),
    ];
    for (i, (what, edit, needle)) in cases.into_iter().enumerate() {
        let dir = edited_checkpoint(&format!("config-{i}"), edit);
        eprintln!("{what}");
        load_fails(&dir, needle);
        generate_fails(&dir, needle);
    }
}

#[test]
fn token_ids_outside_the_vocabulary_are_errors() {
    let m = fixtures().join("tiny/llama");
    let m = m.to_str().unwrap();
    fails_cleanly(
        &[
            "generate",
            "-m",
            m,
            "--prompt-ids",
            "1,512",
            "-n",
            "2",
            "--backend",
            "cpu",
        ],
        "",
        "512",
    );
}

/// A byte-level BPE `tokenizer.json` with the 256 byte tokens and no merges: small enough for
/// the fixture's 512-token vocabulary.
fn byte_level_tokenizer() -> String {
    // GPT-2's printable stand-ins for the bytes.
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xa1..=0xac)
        .chain(0xae..=0xff)
        .collect();
    let mut chars = printable.clone();
    let mut extra = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + extra);
            extra += 1;
        }
    }
    let vocab: serde_json::Map<String, serde_json::Value> = printable
        .iter()
        .zip(&chars)
        .map(|(b, c)| (char::from_u32(*c).unwrap().to_string(), (*b).into()))
        .collect();
    serde_json::json!({
        "version": "1.0",
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": []}
    })
    .to_string()
}

#[test]
fn hostile_tokenizers_and_templates_are_errors() {
    // The tokenizer works: the cases below fail for what they change, nothing else.
    let dir = edited_checkpoint("tok-good", |d| {
        std::fs::write(d.join("tokenizer.json"), byte_level_tokenizer()).unwrap();
    });
    let m = dir.to_str().unwrap();
    let (code, err) = cli(
        &[
            "generate",
            "-m",
            m,
            "-p",
            "hi",
            "-n",
            "2",
            "--backend",
            "cpu",
        ],
        "",
    );
    assert_eq!(code, Some(0), "{err}");

    let dir = edited_checkpoint("tok-broken", |d| {
        std::fs::write(
            d.join("tokenizer.json"),
            "{\"model\": {\"type\": \"BPE\", \"vocab\": [",
        )
        .unwrap();
    });
    let m = dir.to_str().unwrap();
    fails_cleanly(
        &["generate", "-m", m, "-p", "hi", "-n", "2"],
        "",
        "tokenizer.json",
    );

    for (what, template, needle) in [
        (
            "a loop that does not end",
            "{% for i in range(10000) %}{% for j in range(10000) %}{% for k in range(10000) %}{% endfor %}{% endfor %}{% endfor %}",
            "steps",
        ),
        ("an exploding output", "{% for i in range(10000) %}{{ 'x' * 1000000 }}{% endfor %}", "bytes"),
        ("unbounded recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "chat template"),
        ("a syntax error", "{% for m in messages %}", "chat template"),
    ] {
        let dir = edited_checkpoint("tok-template", |d| {
            std::fs::write(d.join("tokenizer.json"), byte_level_tokenizer()).unwrap();
            let config = serde_json::json!({ "chat_template": template });
            std::fs::write(d.join("tokenizer_config.json"), config.to_string()).unwrap();
        });
        let m = dir.to_str().unwrap();
        let (code, err) = cli(&["chat", "-m", m, "-n", "2", "--backend", "cpu"], "hello\n");
        assert_eq!(code, Some(1), "{what}: {err}");
        assert!(!err.contains("panicked"), "{what}: {err}");
        assert!(err.contains(needle), "{what}: {err}");
    }
}

/// Found by fuzzing `load_forward` on its own seeds: with hidden size 32 and an intermediate
/// size of 48 (no multiple of 32), the scratch arena held no room for the Q16 activations that
/// the Q, K, V and gate/up matrices still take, and every forward failed.
#[test]
fn fuzz_seed_models_generate() {
    let dir = scratch_dir("fuzz-seeds");
    let seeds = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/load_forward");
    let mut ran = 0;
    for seed in std::fs::read_dir(seeds).unwrap() {
        let seed = seed.unwrap().path();
        // The fuzzer's own finds sit beside the seeds.
        if !seed
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("seed-")
        {
            continue;
        }
        let path = dir.join("model.gguf");
        std::fs::copy(&seed, &path).unwrap();
        let (code, err) = cli(
            &[
                "generate",
                "-m",
                path.to_str().unwrap(),
                "--prompt-ids",
                "1,2",
                "-n",
                "3",
            ],
            "",
        );
        assert_eq!(code, Some(0), "{}: {err}", seed.display());
        ran += 1;
    }
    assert!(ran >= 6, "only {ran} seeds");
}

/// Limits reached at run time: a prompt longer than the context is refused before any work; a
/// generation that fills the context stops with a note and keeps (and prints) what it made.
#[test]
fn context_limits_fail_cleanly() {
    let m = fixtures().join("tiny/llama");
    let m = m.to_str().unwrap();
    fails_cleanly(
        &[
            "generate",
            "-m",
            m,
            "--prompt-ids",
            "1,2,3,4,5,6,7,8,9,10",
            "--ctx",
            "8",
        ],
        "",
        "more than the context of 8",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_sapient"))
        .args([
            "generate",
            "-m",
            m,
            "--prompt-ids",
            "1,2,3",
            "--ctx",
            "8",
            "--backend",
            "cpu",
        ])
        .args(["-n", "20", "--temperature", "0", "--format", "json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("end of the context"), "{err}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Three prompt positions and five generated tokens fill the eight; the sixth token comes
    // from the last position's logits without needing a place in the cache.
    assert_eq!(json["generated_ids"].as_array().unwrap().len(), 6, "{json}");
}
