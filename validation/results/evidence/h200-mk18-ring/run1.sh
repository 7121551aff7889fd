#!/usr/bin/env bash
# Session 9, first call: how much the ring's depth (and page size) is worth in the step, with the
# per-task stamps of the baseline cases kept for the per-layer anatomy of today's kernel.
#   bash validation/results/evidence/h200-mk18-ring/run1.sh $OUT/r1
set -u
out=${1:?out dir}; mkdir -p "$out/tr"
export PYTHONPATH=$PWD/build/pydeps PYTHONUNBUFFERED=1
t0=$(date +%s)
one() {  # name model batch args...
  local name=$1 model=$2 batch=$3; shift 3
  if [ $(( $(date +%s) - t0 )) -gt 420 ]; then echo "$name skipped (time)"; return; fi
  timeout 150 python3 -m validation.megakernel --model $model --batch $batch \
    --modes megakernel --reps 10 --json "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $(grep -ho 'measured *[0-9.]* us (spread [0-9.]*)' "$out/$name.log" | head -1)" \
       "$(grep -ho 'max rel err [0-9.e+-]*' "$out/$name.log" | head -1)" \
       "$(grep -ho 'matmul n=[0-9]* wait [0-9.]* compute [0-9.]*' "$out/$name.log")" \
       "| $(grep -ho 'attn_partial n=[0-9]* wait [0-9.]* compute [0-9.]*' "$out/$name.log")"
  grep -h "^error\|Error" "$out/$name.log" | head -2
}
F="--wl fuse_norm=1 --wl fuse_rope=1 --wl fuse_silu=1"
S="--wl kv_splits=16"
one 1b-b1-d4 llama-3.2-1b 1 $S $F --traces "$out/tr/d4"
one 1b-b1-d5 llama-3.2-1b 1 $S $F --opt prefetch_depth=5
one 1b-b1-d2 llama-3.2-1b 1 $S $F --opt prefetch_depth=2
one 1b-b1-d3 llama-3.2-1b 1 $S $F --opt prefetch_depth=3
one 1b-b1-p36d5 llama-3.2-1b 1 $S $F --opt page_KiB=36 --opt prefetch_depth=5
one 1b-b1-p28d6 llama-3.2-1b 1 $S $F --opt page_KiB=28 --opt prefetch_depth=6
one 1b-b1-p16d10 llama-3.2-1b 1 $S $F --opt page_KiB=16 --opt prefetch_depth=10
one 1b-b8-d2 llama-3.2-1b 8 $F --traces "$out/tr/b8"
one 8b-b1-d4 llama-3.1-8b 1 $F --traces "$out/tr/8b"
one 8b-b1-d3 llama-3.1-8b 1 $F --opt prefetch_depth=3
one 1b-b1-d4b llama-3.2-1b 1 $S $F
python3 - "$out" <<'PY'
import json, sys, glob, os
import mksim
from validation.suite_anatomy import op_trace_of_npz, layer_anatomy, middle_layer
out = sys.argv[1]; res = {}
for npz in glob.glob(f"{out}/tr/*/*.npz"):
    tag = os.path.basename(os.path.dirname(npz))
    j = {"d4": "1b-b1-d4", "b8": "1b-b8-d2", "8b": "8b-b1-d4"}[tag]
    r = json.load(open(f"{out}/{j}.json"))[0]
    wl = mksim.models.workload(r["model"], batch=r["batch"], kv_len=r["kv_len"], **r["wl"])
    tr = op_trace_of_npz(npz)
    res[j] = {"op_trace": tr, "anatomy": layer_anatomy(tr, wl.ops, middle_layer(wl.ops), 4558.0)}
json.dump(res, open(f"{out}/anatomy.json", "w"))
PY
rm -rf "$out/tr"
cd "$out/.." && tar czf r1.tgz "$(basename "$out")"
