#!/usr/bin/env bash
# Session 9, sixth call (the last of the session's device time): the matmul's pages taken in turn by
# two or four groups of worker warps (MK_MM_GROUPS=2, 4; an experiment) against the kernel as it is
# (MK_MM_GROUPS=1, MK_MM_FASTDIV=1); and the gated L2 prefetcher again on this kernel.
#   bash validation/results/evidence/h200-mk18-ring/run6.sh $OUT/r6
set -u
out=${1:?out dir}; mkdir -p "$out"
export PYTHONPATH=$PWD/build/pydeps PYTHONUNBUFFERED=1
t0=$(date +%s)
one() {  # name defines model batch args...
  local name=$1 defs=$2 model=$3 batch=$4; shift 4
  if [ $(( $(date +%s) - t0 )) -gt 140 ]; then echo "$name skipped (time)"; return; fi
  MKSIM_KERNEL_DEFINES="$defs" timeout 60 python3 -m validation.megakernel --model $model --batch $batch \
    --modes megakernel --reps 20 --json "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $(grep -ho 'measured *[0-9.]* us (spread [0-9.]*)' "$out/$name.log" | head -1)" \
       "$(grep -ho 'max rel err [0-9.e+-]*' "$out/$name.log" | head -1)" \
       "$(grep -ho 'matmul n=[0-9]* wait [0-9.]* compute [0-9.]*' "$out/$name.log")"
  grep -h "^error\|Error" "$out/$name.log" | head -2
}
F="--wl fuse_norm=1 --wl fuse_rope=1 --wl fuse_silu=1"
S="--wl kv_splits=16"
one b1-base "" llama-3.2-1b 1 $S $F
one b1-g2 "-DMK_MM_GROUPS=2" llama-3.2-1b 1 $S $F
one b1-g4 "-DMK_MM_GROUPS=4" llama-3.2-1b 1 $S $F
one b1-base2 "" llama-3.2-1b 1 $S $F
one b8-g2 "-DMK_MM_GROUPS=2" llama-3.2-1b 8 $F
one b8-base "" llama-3.2-1b 8 $F
one 8b-g2 "-DMK_MM_GROUPS=2" llama-3.1-8b 1 $F
one b1-pf256 "-DMK_RING_HINT=1 -DMK_L2PF_GATE=1" llama-3.2-1b 1 $S $F --opt l2_prefetch_KiB=256
cd "$out/.." && tar czf r6.tgz "$(basename "$out")"
