#!/usr/bin/env bash
# Issue 18: the attention partials as a function of their own (MK_ATTN_NOINLINE) against the inlined
# build whose tensor-core attention spilled inside the matmul; the L2 prefetcher again on a build
# without spills; a held-out model. Every op checked against torch. From the repo root:
#   bash validation/results/evidence/h200-mk18-noinline/run1.sh $OUT/ni
set -u
out=${1:?out dir}; mkdir -p "$out"
export PYTHONPATH=$PWD/build/pydeps PYTHONUNBUFFERED=1
t0=$(date +%s)
one() {  # name defines model batch args...
  local name=$1 defs=$2 model=$3 batch=$4; shift 4
  if [ $(( $(date +%s) - t0 )) -gt 500 ]; then echo "$name skipped (time)"; return; fi
  MKSIM_KERNEL_DEFINES="$defs" timeout 150 python3 -m validation.megakernel --model $model --batch $batch \
    --modes megakernel --reps 10 --json "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $(grep -h 'measured' "$out/$name.log" | head -1)"
}
S1="--wl kv_splits=16 --wl fuse_norm=1"
F="--wl fuse_rope=1 --wl fuse_silu=1"
INL="-DMK_ATTN=1 -DMK_ATTN_NOINLINE=0"   # the suite's kernel
one 1b-b1-inl "$INL" llama-3.2-1b 1 $S1 $F
one 1b-b1-a1 "-DMK_ATTN=1" llama-3.2-1b 1 $S1 $F
one 1b-b1-a2 "-DMK_ATTN=2" llama-3.2-1b 1 $S1 $F
one 1b-b8-inl "$INL" llama-3.2-1b 8 --wl fuse_norm=1 $F
one 1b-b8-a2 "-DMK_ATTN=2" llama-3.2-1b 8 --wl fuse_norm=1 $F
one 8b-b1-inl "$INL" llama-3.1-8b 1 --wl fuse_norm=1 $F
one 8b-b1-a2 "-DMK_ATTN=2" llama-3.1-8b 1 --wl fuse_norm=1 $F
one 1b-b1-a1-l2 "-DMK_ATTN=1" llama-3.2-1b 1 $S1 $F --opt l2_prefetch_KiB=256
one 1b-b1-a2-l2 "-DMK_ATTN=2" llama-3.2-1b 1 $S1 $F --opt l2_prefetch_KiB=256
one 3b-b1-a1 "-DMK_ATTN=1" llama-3.2-3b 1 --wl fuse_norm=1 $F
one 1b-b1-inl2 "$INL" llama-3.2-1b 1 $S1 $F
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
cd "$out/.." && tar czf ni.tgz "$(basename "$out")"
