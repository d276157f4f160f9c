//! llama.cpp's own chat template tests (`tests/test-chat-template.cpp` of the source
//! `scripts/fetch-llama-cpp.sh` fetches, its Jinja cases, as `scripts/llama-cpp-chat-templates.py`
//! copies them into tests/data): each template, rendered for the same conversation, gives the
//! text llama.cpp expects. They cover blocks' whitespace (trimmed as transformers and llama.cpp
//! trim it) and templates without a system role (the system prompt joins the first user turn).
use std::path::Path;

use sapient::chat::{ChatTemplate, Message};
use serde_json::Value;

#[test]
fn llama_cpp_chat_templates_render_as_llama_cpp_expects() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/llama_cpp_chat_templates.json");
    let cases: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let conversation = [
        ("system", "You are a helpful assistant"),
        ("user", "Hello"),
        ("assistant", "Hi there"),
        ("user", "Who are you"),
        ("assistant", "   I am an assistant   "),
        ("user", "Another question"),
    ]
    .map(|(role, content)| Message {
        role: role.into(),
        content: content.into(),
    });
    let text = |c: &Value, k: &str| c[k].as_str().unwrap().to_owned();
    let mut failures = Vec::new();
    let mut compared = 0;
    for case in &cases {
        if !case["supported_with_jinja"].as_bool().unwrap() || case["extra"].as_bool().unwrap() {
            continue;
        }
        let name = text(case, "name");
        assert!(
            !text(case, "template_str").is_empty(),
            "{name}: no template"
        );
        let mut want = text(case, "expected_output_jinja");
        if want.is_empty() {
            want = text(case, "expected_output");
        }
        let t = ChatTemplate::new(
            text(case, "template_str"),
            text(case, "bos_token"),
            text(case, "eos_token"),
        );
        let got = t.and_then(|t| t.render(&conversation, true));
        compared += 1;
        match got {
            Ok(got) if got == want => {}
            Ok(got) => failures.push(format!("{name}:\n  want {want:?}\n  got  {got:?}")),
            Err(e) => failures.push(format!("{name}: {e:#}")),
        }
    }
    assert!(compared >= 30, "only {compared} cases compared");
    assert!(
        failures.is_empty(),
        "{} of {compared} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
