// Cargo's runner for wasm32-wasip1 test binaries: runs one under Node.js's WASI (preview 1),
// with its arguments, the environment and the file system, and exits with its status.
// CARGO_TARGET_WASM32_WASIP1_RUNNER="node --no-warnings $PWD/scripts/wasi-runner.mjs"
//
// The binary runs in a child Node process, started again (up to three times) only when that
// process dies of SIGSEGV or SIGABRT: Node 20's V8 crashes inside its own builtins at the end of
// core's test binary (after "test result: ok", every time with --single-threaded, about one run
// in five with both cores busy; the same on the code before IQ formats existed), a runtime fault,
// not a result. A test that fails exits with its status and is never run again.
import { readFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { WASI } from 'node:wasi';

const [wasm, ...args] = process.argv.slice(2);
if (process.env.SAPIENT_WASI_CHILD) {
  const wasi = new WASI({
    version: 'preview1',
    args: [wasm, ...args],
    env: process.env,
    preopens: { '/': '/' },
    returnOnExit: true,
  });
  const { instance } = await WebAssembly.instantiate(readFileSync(wasm), wasi.getImportObject());
  process.exitCode = wasi.start(instance);
} else {
  const env = { ...process.env, SAPIENT_WASI_CHILD: '1' };
  const argv = [...process.execArgv, ...process.argv.slice(1)];
  for (let attempt = 1; ; attempt++) {
    const run = spawnSync(process.execPath, argv, { stdio: 'inherit', env });
    const crashed = run.signal === 'SIGSEGV' || run.signal === 'SIGABRT';
    if (crashed && attempt < 3) {
      console.error(`wasi-runner: Node died of ${run.signal}; running ${wasm} again`);
      continue;
    }
    process.exitCode = run.status ?? 1;
    if (run.signal) console.error(`wasi-runner: Node died of ${run.signal}`);
    break;
  }
}
