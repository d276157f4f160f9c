#!/usr/bin/env bash
# Speculative decoding against plain decoding, greedy, the runs interleaved:
#   scripts/bench-speculative.sh [threads] [reps]
# Model: SmolLM2-135M-Instruct Q8_0 (models/, made by scripts/bench-vs-llama-cpp.sh), drafted
# by its Q4_1 file and by the n-gram lookup, on a story prompt and on a code-editing prompt
# whose reply copies the code it was given. Prints decode tokens/s and acceptance per run.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
reps=${2:-3}
bin=$(scripts/target-dir.sh)/release/sapient
model=models/SmolLM2-135M-Instruct.Q8_0.gguf
draft=models/SmolLM2-135M-Instruct.Q4_1.gguf
[[ -f $model && -f $draft ]] || { echo "need $model and $draft (scripts/bench-vs-llama-cpp.sh makes them)" >&2; exit 1; }
cargo build --release -q -p sapient
story="Once upon a time, in a small village by the sea,"
code='<|im_start|>user
Rename the variable `total` to `acc` in this function and change nothing else:

```python
def sum_squares(values):
    total = 0
    for v in values:
        if v is None:
            continue
        total += v * v
    return total


def mean_square(values):
    n = len([v for v in values if v is not None])
    if n == 0:
        return 0.0
    return sum_squares(values) / n
```<|im_end|>
<|im_start|>assistant
```python
def sum_squares(values):
    acc = 0
'
for rep in $(seq "$reps"); do
  for how in plain "draft-model Q4_1" ngram; do
    case $how in
      plain) flags=() ;;
      ngram) flags=(--draft ngram) ;;
      *) flags=(--draft-model "$draft") ;;
    esac
    for name in story code; do
      [[ $name == story ]] && prompt=$story || prompt=$code
      line=$("$bin" generate -m "$model" -p "$prompt" -n 128 --temperature 0 -t "$threads" "${flags[@]}" 2>&1 >/dev/null |
        grep -o 'generation: [0-9]* tokens, [0-9.]* tokens/s\|accepted ([0-9]*%)' | tr '\n' ' ')
      echo "$rep	$how	$name	$line"
    done
  done
done
