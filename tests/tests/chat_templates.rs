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
    .map(|(role, content)| Message::text(role, content));
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

/// The templates llama.cpp keeps of Llama-family models (`models/templates/` of the source
/// `scripts/fetch-llama-cpp.sh` fetches) render a conversation: every message's text comes out
/// (the turns in order; the system prompt where the template puts it, which for Mistral NeMo is
/// the last user turn), and the last user turn is followed by the assistant's.
#[test]
fn llama_family_templates_from_llama_cpp_render() {
    let Some(models) = sapient_tests::llama_cpp_models() else {
        eprintln!("SKIPPED: no llama.cpp source (run scripts/fetch-llama-cpp.sh)");
        return;
    };
    let conversation = [
        ("system", "You are a helpful assistant"),
        ("user", "Hello"),
        ("assistant", "Hi there"),
        ("user", "Who are you"),
    ]
    .map(|(role, content)| Message::text(role, content));
    for name in [
        "meta-llama-Llama-3.1-8B-Instruct",
        "meta-llama-Llama-3.2-3B-Instruct",
        "meta-llama-Llama-3.3-70B-Instruct",
        "mistralai-Mistral-Nemo-Instruct-2407",
        "Mistral-Small-3.2-24B-Instruct-2506",
        "unsloth-mistral-Devstral-Small-2507",
        "mistralai-Ministral-3-14B-Reasoning-2512",
        "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
        "HuggingFaceTB-SmolLM3-3B",
        "Qwen-Qwen2.5-7B-Instruct",
        "ibm-granite-granite-3.3-2B-Instruct",
        "microsoft-Phi-3.5-mini-instruct",
    ] {
        let path = models.join(format!("templates/{name}.jinja"));
        let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let text = ChatTemplate::new(source, "<s>".into(), "</s>".into())
            .and_then(|t| t.render(&conversation, true))
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert!(
            text.contains(&*conversation[0].content),
            "{name}: no system prompt\n{text}"
        );
        let mut at = 0;
        for m in &conversation[1..] {
            let found = text[at..].find(m.content.as_str());
            at += found.unwrap_or_else(|| panic!("{name}: {:?} missing in\n{text}", m.content));
        }
        assert!(
            text.len() > at + "Who are you".len(),
            "{name}: no assistant turn\n{text}"
        );
    }
}

/// The tool-calling templates llama.cpp keeps render a conversation with tools, an earlier call
/// and its result: each shows its format, and the prompt has the tool's name and description,
/// the call's arguments and the result (the generic format's through the system prompt).
#[test]
fn tool_calling_templates_render_tools_calls_and_results() {
    use sapient::tool_calls::{template_tool_calls, Tool, ToolFormat};
    let Some(models) = sapient_tests::llama_cpp_models() else {
        eprintln!("SKIPPED: no llama.cpp source (run scripts/fetch-llama-cpp.sh)");
        return;
    };
    let tools = Tool::list(&serde_json::json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]))
    .unwrap();
    let calls = serde_json::json!([{"id": "call0a1b2", "type": "function", "function":
        {"name": "get_weather", "arguments": "{\"city\": \"Lisbon\"}"}}]);
    let conversation = vec![
        Message::text("system", "You are a helpful assistant"),
        Message::text("user", "What is the weather in Lisbon?"),
        Message {
            tool_calls: template_tool_calls(&calls),
            ..Message::text("assistant", "")
        },
        Message {
            tool_call_id: Some("call0a1b2".into()),
            name: Some("get_weather".into()),
            ..Message::text("tool", "Sunny, 24 C")
        },
    ];
    for (name, format) in [
        ("Qwen-Qwen2.5-7B-Instruct", ToolFormat::Hermes),
        ("Qwen-Qwen3-0.6B", ToolFormat::Hermes),
        (
            "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
            ToolFormat::Hermes,
        ),
        (
            "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
            ToolFormat::Hermes,
        ),
        ("meta-llama-Llama-3.1-8B-Instruct", ToolFormat::Llama3),
        ("meta-llama-Llama-3.2-3B-Instruct", ToolFormat::Llama3),
        ("meta-llama-Llama-3.3-70B-Instruct", ToolFormat::Llama3),
        (
            "mistralai-Mistral-Nemo-Instruct-2407",
            ToolFormat::MistralJson,
        ),
        (
            "Mistral-Small-3.2-24B-Instruct-2506",
            ToolFormat::MistralArgs,
        ),
        (
            "unsloth-mistral-Devstral-Small-2507",
            ToolFormat::MistralArgs,
        ),
        ("HuggingFaceTB-SmolLM3-3B", ToolFormat::Generic),
        ("microsoft-Phi-3.5-mini-instruct", ToolFormat::Generic),
    ] {
        let path = models.join(format!("templates/{name}.jinja"));
        let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let template = ChatTemplate::new(source, "<s>".into(), "</s>".into()).unwrap();
        assert_eq!(template.tool_format(), format, "{name}");
        let messages = format.prompt_messages(&tools, conversation.clone());
        let specs: Value = tools.iter().map(|t| t.spec.clone()).collect();
        let specs = format.template_renders_tools().then_some(&specs);
        let text = template
            .render_with(
                &messages,
                &sapient::chat::RenderOptions {
                    tools: specs,
                    variables: None,
                },
                true,
            )
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        for needle in [
            "get_weather",
            "Current weather in a city",
            "Lisbon",
            "Sunny, 24 C",
        ] {
            assert!(
                text.contains(needle),
                "{name}: {needle:?} missing in\n{text}"
            );
        }
        assert!(
            text.find("Lisbon?") < text.rfind("Sunny, 24 C"),
            "{name}: the result before the question\n{text}"
        );
    }
}

/// Thinking models' templates: each thinks in `<think>` tags; DeepSeek R1's and QwQ's open the
/// reasoning in the generation prompt; Qwen3's closes it empty when `enable_thinking` is false.
#[test]
fn thinking_templates_open_and_close_their_reasoning() {
    use sapient::chat::RenderOptions;
    use sapient::reasoning::prompt_opens_thinking;
    let Some(models) = sapient_tests::llama_cpp_models() else {
        eprintln!("SKIPPED: no llama.cpp source (run scripts/fetch-llama-cpp.sh)");
        return;
    };
    let conversation = [Message::text("user", "What is 2 + 2?")];
    let load = |name: &str| {
        let path = models.join(format!("templates/{name}.jinja"));
        let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        ChatTemplate::new(source, "<s>".into(), "</s>".into()).unwrap()
    };
    for (name, thinks, opens) in [
        ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", true, true),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", true, true),
        ("Qwen-QwQ-32B", true, true),
        ("Qwen-Qwen3-0.6B", true, false),
        ("HuggingFaceTB-SmolLM3-3B", true, false),
        ("Qwen-Qwen2.5-7B-Instruct", false, false),
    ] {
        let template = load(name);
        assert_eq!(template.thinks(), thinks, "{name}");
        let prompt = template.render(&conversation, true).unwrap();
        assert_eq!(prompt_opens_thinking(&prompt), opens, "{name}:\n{prompt}");
    }
    let qwen3 = load("Qwen-Qwen3-0.6B");
    let off = serde_json::json!({"enable_thinking": false});
    let options = RenderOptions {
        variables: Some(&off),
        ..RenderOptions::default()
    };
    let prompt = qwen3.render_with(&conversation, &options, true).unwrap();
    assert!(prompt.ends_with("<think>\n\n</think>\n\n"), "{prompt}");
}
