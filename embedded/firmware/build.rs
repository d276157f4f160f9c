//! Puts `memory.x` where cortex-m-rt's `link.x` looks for it, with `stack.x` giving the stack's
//! size (`SAPIENT_FIRMWARE_STACK` bytes, 128 KiB by default: the core documents about 100 KiB
//! for a forward pass).
use std::path::PathBuf;

const DEFAULT_STACK: u32 = 128 * 1024;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let stack = match std::env::var("SAPIENT_FIRMWARE_STACK") {
        Ok(s) => s
            .parse::<u32>()
            .expect("SAPIENT_FIRMWARE_STACK is a number of bytes"),
        Err(_) => DEFAULT_STACK,
    };
    std::fs::copy("memory.x", out.join("memory.x")).unwrap();
    std::fs::write(out.join("stack.x"), format!("STACK_SIZE = {stack};\n")).unwrap();
    println!("cargo:rustc-link-search={}", out.display());
    println!("cargo:rerun-if-changed=memory.x");
    println!("cargo:rerun-if-env-changed=SAPIENT_FIRMWARE_STACK");
}
