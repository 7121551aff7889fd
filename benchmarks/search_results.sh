#!/usr/bin/env bash
# The searches reported in docs/search.md: 200 trials, seed 0, two workers, each model on h200 and h100.
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/results
mkdir -p "$out"
rm -f "$out/search.db"
for model in llama-3.2-1b llama-3.1-8b; do
  for gpu in h200 h100; do
    db="$out/search.db"  # one fresh database per run of this script (removed above)
    mksim search --model "$model" --gpu "$gpu" --trials 200 --seed 0 --workers 2 --storage "sqlite:///$db" \
      --out "$out/best-$model-$gpu.json" --json > "$out/search-$model-$gpu.json"
    echo "$model $gpu done"
  done
done
