// Cargo's runner for wasm32-wasip1 test binaries: runs one under Node.js's WASI (preview 1),
// with its arguments, the environment and the file system, and exits with its status.
// CARGO_TARGET_WASM32_WASIP1_RUNNER="node --no-warnings --no-wasm-tier-up $PWD/scripts/wasi-runner.mjs"
// (--no-wasm-tier-up: see .ci/run)
import { readFileSync } from 'node:fs';
import { WASI } from 'node:wasi';

const [wasm, ...args] = process.argv.slice(2);
const wasi = new WASI({
  version: 'preview1',
  args: [wasm, ...args],
  env: process.env,
  preopens: { '/': '/' },
  returnOnExit: true,
});
const { instance } = await WebAssembly.instantiate(readFileSync(wasm), wasi.getImportObject());
process.exitCode = wasi.start(instance);
