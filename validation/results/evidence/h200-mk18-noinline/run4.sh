#!/usr/bin/env bash
# Fourth call: mk_run_task forced inline (byte-identical cubin with MK_ATTN=1); the tensor-core
# attention (MK_ATTN=2) then inlines with 4 B of spills instead of an outlined, spilling mk_run_task.
#   bash validation/results/evidence/h200-mk18-noinline/run4.sh $OUT/ni4
set -u
out=${1:?out dir}; mkdir -p "$out"
export PYTHONPATH=$PWD/build/pydeps PYTHONUNBUFFERED=1
t0=$(date +%s)
one() {  # name defines model batch args...
  local name=$1 defs=$2 model=$3 batch=$4; shift 4
  if [ $(( $(date +%s) - t0 )) -gt 300 ]; then echo "$name skipped (time)"; return; fi
  MKSIM_KERNEL_DEFINES="$defs" timeout 120 python3 -m validation.megakernel --model $model --batch $batch \
    --modes megakernel --reps 10 --json "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $(grep -ho 'measured *[0-9.]* us (spread [0-9.]*)' "$out/$name.log" | head -1)" \
       "$(grep -ho 'max rel err [0-9.e+-]*' "$out/$name.log" | head -1)" \
       "$(grep -ho 'matmul n=[0-9]* wait [0-9.]* compute [0-9.]*' "$out/$name.log")" \
       "| $(grep -ho 'attn_partial n=[0-9]* wait [0-9.]* compute [0-9.]*' "$out/$name.log")"
}
S1="--wl kv_splits=16 --wl fuse_norm=1"
F="--wl fuse_rope=1 --wl fuse_silu=1"
one 1b-b1-a1 "-DMK_ATTN=1" llama-3.2-1b 1 $S1 $F
one 1b-b1-a2 "-DMK_ATTN=2" llama-3.2-1b 1 $S1 $F
one 8b-b1-a1 "-DMK_ATTN=1" llama-3.1-8b 1 --wl fuse_norm=1 $F
one 8b-b1-a2 "-DMK_ATTN=2" llama-3.1-8b 1 --wl fuse_norm=1 $F
one 1b-b8-a1 "-DMK_ATTN=1" llama-3.2-1b 8 --wl fuse_norm=1 $F
one 1b-b8-a2 "-DMK_ATTN=2" llama-3.2-1b 8 --wl fuse_norm=1 $F
one 3b-b1-a2 "-DMK_ATTN=2" llama-3.2-3b 1 --wl fuse_norm=1 $F
one 1b-b4-a1 "-DMK_ATTN=1" llama-3.2-1b 4 --wl fuse_norm=1 $F
one 1b-b4-a2 "-DMK_ATTN=2" llama-3.2-1b 4 --wl fuse_norm=1 $F
cd "$out/.." && tar czf ni4.tgz "$(basename "$out")"
