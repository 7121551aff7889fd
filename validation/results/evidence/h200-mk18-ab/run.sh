#!/usr/bin/env bash
# Issue 18, first look on the H200: today's matmul/attention (MK_MM=1 MK_ATTN=1) against the new
# ones, the fused epilogues and the L2 prefetcher, each op checked. Run from the repo root:
#   bash validation/results/evidence/h200-mk18-ab/run.sh $OUT/ab
set -u
out=${1:?out dir}; mkdir -p "$out"
export PYTHONPATH=$PWD/build/pydeps PYTHONUNBUFFERED=1
one() {  # name defines model batch args...
  local name=$1 defs=$2 model=$3 batch=$4; shift 4
  MKSIM_KERNEL_DEFINES="$defs" timeout 170 python3 -m validation.megakernel --model $model --batch $batch \
    --modes megakernel --reps 10 --json "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $(grep -h 'measured' "$out/$name.log" | head -1)"
}
S1="--wl kv_splits=16 --wl fuse_norm=1"
F="--wl fuse_rope=1 --wl fuse_silu=1"
one 1b-b1-old "-DMK_MM=1 -DMK_ATTN=1" llama-3.2-1b 1 $S1
one 1b-b1-mm "-DMK_MM=2 -DMK_ATTN=1" llama-3.2-1b 1 $S1
one 1b-b1-new "-DMK_MM=2 -DMK_ATTN=2" llama-3.2-1b 1 $S1
one 1b-b1-fused "-DMK_MM=2 -DMK_ATTN=2" llama-3.2-1b 1 $S1 $F
one 1b-b1-fused-l2 "-DMK_MM=2 -DMK_ATTN=2" llama-3.2-1b 1 $S1 $F --opt l2_prefetch_KiB=256
one 1b-b1-fused-l2line "-DMK_MM=2 -DMK_ATTN=2 -DMK_L2PF_KIND=1" llama-3.2-1b 1 $S1 $F --opt l2_prefetch_KiB=256
one 1b-b8-old "-DMK_MM=1 -DMK_ATTN=1" llama-3.2-1b 8 --wl fuse_norm=1
one 1b-b8-new "-DMK_MM=2 -DMK_ATTN=2" llama-3.2-1b 8 --wl fuse_norm=1
one 1b-b8-fused "-DMK_MM=2 -DMK_ATTN=2" llama-3.2-1b 8 --wl fuse_norm=1 $F
one 8b-b1-old "-DMK_MM=1 -DMK_ATTN=1" llama-3.1-8b 1 --wl fuse_norm=1
one 8b-b1-new "-DMK_MM=2 -DMK_ATTN=2" llama-3.1-8b 1 --wl fuse_norm=1
one 8b-b1-fused "-DMK_MM=2 -DMK_ATTN=2" llama-3.1-8b 1 --wl fuse_norm=1 $F
one 1b-b1-sentinel "-DMK_MM=2 -DMK_ATTN=2" llama-3.2-1b 1 $S1 $F --opt sync=sentinel
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
cd "$out/.." && tar czf ab.tgz "$(basename "$out")"
