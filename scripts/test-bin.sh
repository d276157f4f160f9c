#!/usr/bin/env bash
# Prints the path of the `sapient` binary that `cargo test --workspace --features
# sapient-tests/gpu ARGS...` builds (the test profile's, for the integration tests), or nothing
# where those tests build none (`--lib`, say).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --features sapient-tests/gpu --no-run --message-format=json "$@" 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if t.get("kind") == ["bin"] and t.get("name") == "sapient" and not m["profile"]["test"]:
        print(m["executable"] or "")
'
