#![no_main]
//! The GBNF grammar parser and matcher on hostile grammars (a grammar comes from a request):
//! errors rather than panics, bounded work. The input is the grammar's text, then after a line
//! `--` the bytes fed to the matcher.
use libfuzzer_sys::fuzz_target;
use sapient::constraint::Automaton;
use sapient::grammar::Grammar;

fuzz_target!(|data: &[u8]| {
    let split = data.windows(4).position(|w| w == b"\n--\n");
    let (grammar, output) = match split {
        Some(at) => (&data[..at], &data[at + 4..]),
        None => (data, &b""[..]),
    };
    let Ok(text) = std::str::from_utf8(grammar) else {
        return;
    };
    let Ok(grammar) = Grammar::parse(text) else {
        return;
    };
    let mut state = Some(grammar.start());
    for &b in output {
        state = state.and_then(|s| s.step(&grammar, b));
    }
    let _ = state.map(|s| s.is_complete());
});
