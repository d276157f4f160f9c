#!/usr/bin/env bash
# Two `sapient serve` replicas behind LiteLLM's proxy, on loopback: the openai client talks to the
# proxy, the proxy spreads requests over the replicas, and each replica's /metrics shows its
# share. LiteLLM lives in a virtual environment under ~/.cache/sapient (installed once from PyPI).
#   scripts/scale-out-demo.sh [MODEL.gguf]
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$model" ] || bash scripts/fetch-model.sh >/dev/null
venv="$HOME/.cache/sapient/venv-litellm"
if [ ! -x "$venv/bin/litellm" ]; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check 'litellm[proxy]' openai
fi
cargo build --release -q -p sapient
bin="$(bash scripts/target-dir.sh)/release/sapient"
work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
for port in 8091 8092; do
    "$bin" serve -m "$model" --port "$port" --alias smollm2 --parallel 4 -t 1 2>"$work/replica-$port.log" &
    pids+=($!)
done
cat > "$work/litellm.yaml" <<YAML
model_list:
  - model_name: smollm2
    litellm_params: { model: openai/smollm2, api_base: "http://127.0.0.1:8091/v1", api_key: none }
  - model_name: smollm2
    litellm_params: { model: openai/smollm2, api_base: "http://127.0.0.1:8092/v1", api_key: none }
router_settings:
  routing_strategy: simple-shuffle
general_settings:
  master_key: sk-sapient-demo-0123456789abcdef
YAML
"$venv/bin/litellm" --config "$work/litellm.yaml" --host 127.0.0.1 --port 4000 >"$work/litellm.log" 2>&1 &
pids+=($!)
for url in http://127.0.0.1:8091/health http://127.0.0.1:8092/health http://127.0.0.1:4000/health/liveliness; do
    for _ in $(seq 120); do curl -sf "$url" >/dev/null && break; sleep 0.5; done
    curl -sf "$url" >/dev/null || { echo "$url did not come up" >&2; cat "$work"/*.log >&2; exit 1; }
done
"$venv/bin/python" - <<'PY'
import concurrent.futures, re, urllib.request
from openai import OpenAI
client = OpenAI(base_url="http://127.0.0.1:4000", api_key="sk-sapient-demo-0123456789abcdef")
def ask(i):
    r = client.chat.completions.create(model="smollm2", temperature=0, max_tokens=16,
                                       messages=[{"role": "user", "content": f"Say a word about the number {i}."}])
    return r.choices[0].message.content
with concurrent.futures.ThreadPoolExecutor(8) as pool:
    for i, text in enumerate(pool.map(ask, range(16))):
        print(f"{i:2}: {text!r}")
counts = []
for port in (8091, 8092):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    done = sum(float(v) for v in re.findall(r'^sapient:request_success_total\{[^}]*\} (\S+)', text, re.M))
    counts.append(done)
    print(f"replica :{port} finished {done:.0f} requests")
assert all(c > 0 for c in counts) and sum(counts) == 16, counts
print("both replicas served requests through the proxy")
PY
