#!/usr/bin/env bash
# Single ops of the kernel with the tensor-core attention as default (MK_ATTN=2, mk_run_task
# inlined): each op of a graph-mode step timed alone (L2 flushed), its tasks from the trace; for
# python -m validation.kernel_costs ... --kinds attn_partial,attn_reduce. From the repo root:
#   bash validation/results/evidence/h200-attn-ops/run.sh $OUT/ops
set -u
out=${1:?out dir}; mkdir -p "$out"
export PYTHONPATH=$PWD/build/pydeps PYTHONUNBUFFERED=1
t0=$(date +%s)
one() {  # name model batch
  if [ $(( $(date +%s) - t0 )) -gt 230 ]; then echo "$1 skipped (time)"; return; fi
  timeout 110 python3 -m validation.megakernel --model $2 --batch $3 --modes graph --single-ops --reps 10 \
    --json "$out/$1.json" > "$out/$1.log" 2>&1
  echo "$1 rc=$? $(date +%s) $(grep -h 'measured' "$out/$1.log" | head -1)"
}
one llama-3.2-1b-b1 llama-3.2-1b 1
one llama-3.1-8b-b1 llama-3.1-8b 1
one llama-3.2-1b-b8 llama-3.2-1b 8
one llama-3.2-1b-b4 llama-3.2-1b 4
cd "$out/.." && tar czf ops.tgz "$(basename "$out")"
