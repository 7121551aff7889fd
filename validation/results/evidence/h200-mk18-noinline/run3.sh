#!/usr/bin/env bash
# Third call: the matmul task as a function of its own too (MK_MM_NOINLINE), with either attention.
#   bash validation/results/evidence/h200-mk18-noinline/run3.sh $OUT/ni3
set -u
out=${1:?out dir}; mkdir -p "$out"
export PYTHONPATH=$PWD/build/pydeps PYTHONUNBUFFERED=1
one() {  # name defines model batch args...
  local name=$1 defs=$2 model=$3 batch=$4; shift 4
  MKSIM_KERNEL_DEFINES="$defs" timeout 150 python3 -m validation.megakernel --model $model --batch $batch \
    --modes megakernel --reps 10 --json "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $(grep -ho 'measured *[0-9.]* us (spread [0-9.]*)' "$out/$name.log" | head -1)" \
       "$(grep -ho 'matmul n=[0-9]* wait [0-9.]* compute [0-9.]*' "$out/$name.log")" \
       "| $(grep -ho 'attn_partial n=[0-9]* wait [0-9.]* compute [0-9.]*' "$out/$name.log")"
}
S1="--wl kv_splits=16 --wl fuse_norm=1"
F="--wl fuse_rope=1 --wl fuse_silu=1"
M1="-DMK_ATTN=1 -DMK_MM_NOINLINE=1"
M2="-DMK_ATTN=2 -DMK_ATTN_NOINLINE=1 -DMK_MM_NOINLINE=1"
M3="-DMK_ATTN=2 -DMK_MM_NOINLINE=1"
one 1b-b1-base "-DMK_ATTN=1" llama-3.2-1b 1 $S1 $F
one 1b-b1-m1 "$M1" llama-3.2-1b 1 $S1 $F
one 1b-b1-m2 "$M2" llama-3.2-1b 1 $S1 $F
one 1b-b1-m3 "$M3" llama-3.2-1b 1 $S1 $F
one 8b-b1-m2 "$M2" llama-3.1-8b 1 --wl fuse_norm=1 $F
one 8b-b1-m3 "$M3" llama-3.1-8b 1 --wl fuse_norm=1 $F
one 1b-b8-m2 "$M2" llama-3.2-1b 8 --wl fuse_norm=1 $F
one 1b-b8-m3 "$M3" llama-3.2-1b 8 --wl fuse_norm=1 $F
one 1b-b1-base2 "-DMK_ATTN=1" llama-3.2-1b 1 $S1 $F
cd "$out/.." && tar czf ni3.tgz "$(basename "$out")"
