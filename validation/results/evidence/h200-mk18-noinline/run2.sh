#!/usr/bin/env bash
# Second call: the partials' worker count as a template constant (NW) in the not-inlined builds.
#   bash validation/results/evidence/h200-mk18-noinline/run2.sh $OUT/ni2
set -u
out=${1:?out dir}; mkdir -p "$out"
export PYTHONPATH=$PWD/build/pydeps PYTHONUNBUFFERED=1
one() {  # name defines model batch args...
  local name=$1 defs=$2 model=$3 batch=$4; shift 4
  MKSIM_KERNEL_DEFINES="$defs" timeout 150 python3 -m validation.megakernel --model $model --batch $batch \
    --modes megakernel --reps 10 --json "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $(grep -h 'measured' "$out/$name.log" | head -1)"
  grep -h 'trace:' "$out/$name.log" | cut -c1-330
}
S1="--wl kv_splits=16 --wl fuse_norm=1"
F="--wl fuse_rope=1 --wl fuse_silu=1"
one 1b-b1-inl "-DMK_ATTN=1" llama-3.2-1b 1 $S1 $F
one 1b-b1-t1 "-DMK_ATTN=1 -DMK_ATTN_NOINLINE=1" llama-3.2-1b 1 $S1 $F
one 1b-b1-t2 "-DMK_ATTN=2 -DMK_ATTN_NOINLINE=1" llama-3.2-1b 1 $S1 $F
one 8b-b1-t2 "-DMK_ATTN=2 -DMK_ATTN_NOINLINE=1" llama-3.1-8b 1 --wl fuse_norm=1 $F
one 1b-b8-t2 "-DMK_ATTN=2 -DMK_ATTN_NOINLINE=1" llama-3.2-1b 8 --wl fuse_norm=1 $F
one 1b-b1-inl2 "-DMK_ATTN=1" llama-3.2-1b 1 $S1 $F
cd "$out/.." && tar czf ni2.tgz "$(basename "$out")"
