#![no_main]
//! JSON output's schema compiler and automaton on hostile schemas (a schema comes from a
//! request): errors rather than panics, bounded work. The input is the schema's JSON, then after
//! a line `--` the bytes fed to the automaton (and to the one for any object).
use libfuzzer_sys::fuzz_target;
use sapient::constraint::Automaton;
use sapient::json_output::JsonPrefix;
use sapient::json_schema::Schema;

fuzz_target!(|data: &[u8]| {
    let split = data.windows(4).position(|w| w == b"\n--\n");
    let (schema, output) = match split {
        Some(at) => (&data[..at], &data[at + 4..]),
        None => (data, &b"{}"[..]),
    };
    let mut free = Some(JsonPrefix::default());
    for &b in output {
        free = free.and_then(|p| p.step(&(), b));
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(schema) else {
        return;
    };
    let Ok(schema) = Schema::compile(&value) else {
        return;
    };
    let mut state = Some(schema.start());
    for &b in output {
        state = state.and_then(|s| s.step(&schema, b));
    }
    let _ = state.map(|s| s.is_complete());
});
