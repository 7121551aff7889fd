#!/usr/bin/env bash
# Session 9, second call: the L2 prefetcher gated to the phases in which the workers' task streams
# nothing (MK_L2PF_GATE=1), with the ring's copies marked evict_first (MK_RING_HINT=1), against the
# kernel as it is; variants interleaved (A B A B) since two runs of one case differ by ~2 %.
#   bash validation/results/evidence/h200-mk18-ring/run2.sh $OUT/r2
set -u
out=${1:?out dir}; mkdir -p "$out/tr"
export PYTHONPATH=$PWD/build/pydeps PYTHONUNBUFFERED=1
t0=$(date +%s)
one() {  # name defines model batch args...
  local name=$1 defs=$2 model=$3 batch=$4; shift 4
  if [ $(( $(date +%s) - t0 )) -gt 480 ]; then echo "$name skipped (time)"; return; fi
  MKSIM_KERNEL_DEFINES="$defs" timeout 150 python3 -m validation.megakernel --model $model --batch $batch \
    --modes megakernel --reps 20 --json "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $(grep -ho 'measured *[0-9.]* us (spread [0-9.]*)' "$out/$name.log" | head -1)" \
       "$(grep -ho 'max rel err [0-9.e+-]*' "$out/$name.log" | head -1)" \
       "$(grep -ho 'matmul n=[0-9]* wait [0-9.]* compute [0-9.]*' "$out/$name.log")" \
       "| $(grep -ho 'attn_partial n=[0-9]* wait [0-9.]* compute [0-9.]*' "$out/$name.log")"
  grep -h "^error\|Error" "$out/$name.log" | head -2
}
F="--wl fuse_norm=1 --wl fuse_rope=1 --wl fuse_silu=1"
S="--wl kv_splits=16"
H="-DMK_RING_HINT=1"
G="-DMK_RING_HINT=1 -DMK_L2PF_GATE=1"
one b1-base "" llama-3.2-1b 1 $S $F
one b1-hint "$H" llama-3.2-1b 1 $S $F
one b1-g256 "$G" llama-3.2-1b 1 $S $F --opt l2_prefetch_KiB=256 --traces "$out/tr/g256"
one b1-g512 "$G" llama-3.2-1b 1 $S $F --opt l2_prefetch_KiB=512
one b1-base2 "" llama-3.2-1b 1 $S $F
one b1-g256last "$G -DMK_L2PF_KIND=3" llama-3.2-1b 1 $S $F --opt l2_prefetch_KiB=256
one b1-g1024 "$G" llama-3.2-1b 1 $S $F --opt l2_prefetch_KiB=1024
one b1-h128 "$H" llama-3.2-1b 1 $S $F --opt l2_prefetch_KiB=128
one b1-hint2 "$H" llama-3.2-1b 1 $S $F
one b1-g256b "$G" llama-3.2-1b 1 $S $F --opt l2_prefetch_KiB=256
one b8-base "" llama-3.2-1b 8 $F
one b8-g256 "$G" llama-3.2-1b 8 $F --opt l2_prefetch_KiB=256
one 8b-base "" llama-3.1-8b 1 $F
one 8b-g256 "$G" llama-3.1-8b 1 $F --opt l2_prefetch_KiB=256
python3 - "$out" <<'PY'
import json, sys, glob, os
import mksim
from validation.suite_anatomy import op_trace_of_npz, layer_anatomy, middle_layer
out = sys.argv[1]; res = {}
for npz in glob.glob(f"{out}/tr/*/*.npz"):
    j = "b1-" + os.path.basename(os.path.dirname(npz))
    r = json.load(open(f"{out}/{j}.json"))[0]
    wl = mksim.models.workload(r["model"], batch=r["batch"], kv_len=r["kv_len"], **r["wl"])
    tr = op_trace_of_npz(npz)
    res[j] = {"op_trace": tr, "anatomy": layer_anatomy(tr, wl.ops, middle_layer(wl.ops), 4558.0)}
json.dump(res, open(f"{out}/anatomy.json", "w"))
PY
rm -rf "$out/tr"
cd "$out/.." && tar czf r2.tgz "$(basename "$out")"
