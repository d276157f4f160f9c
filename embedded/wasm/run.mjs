// Runs sapient-wasm's compiled-in model: node run.mjs MODULE.wasm PROMPT_IDS NEW_TOKENS
// (PROMPT_IDS comma-separated), printing "tokens: <ids>", and on stderr how long it took.
import { readFileSync } from 'node:fs';

const [wasmPath, promptArg, newArg] = process.argv.slice(2);
if (!wasmPath || !promptArg || !newArg) {
  console.error('usage: node run.mjs MODULE.wasm PROMPT_IDS NEW_TOKENS');
  process.exit(2);
}
const { instance } = await WebAssembly.instantiate(readFileSync(wasmPath));
const { memory, prompt_ids, generated_ids, generate } = instance.exports;
const prompt = promptArg.split(',').map(Number);
new Uint32Array(memory.buffer, prompt_ids(), prompt.length).set(prompt);
const start = performance.now();
const n = generate(prompt.length, Number(newArg));
const ms = performance.now() - start;
if (n < 0) {
  console.error(n === -1 ? 'prompt or token count out of range' : 'sapient-core reported an error');
  process.exit(1);
}
const ids = new Uint32Array(memory.buffer, generated_ids(), n);
console.log(`tokens: ${Array.from(ids).join(' ')}`);
console.error(`generate: ${ms.toFixed(1)} ms for the prompt and ${n} tokens`);
