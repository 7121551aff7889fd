#!/usr/bin/env bash
# Session 9, fifth call: the kernel with MK_MM_FASTDIV=1 as its default. (a) the five steps of the
# mksim profile's validation record (schedules of ../../h200-mk-steps), (b) single ops (graph mode,
# L2 flushed, --single-ops) at 8-64 KiB pages for the refit of the matmul kind.
#   bash validation/results/evidence/h200-mk18-ring/run5.sh $OUT/r5
set -u
out=${1:?out dir}; mkdir -p "$out/steps" "$out/ops"
export PYTHONPATH=$PWD/build/pydeps PYTHONUNBUFFERED=1
t0=$(date +%s)
one() {  # file modes model batch args...
  local f=$1 modes=$2 model=$3 batch=$4; shift 4
  if [ $(( $(date +%s) - t0 )) -gt 290 ]; then echo "$f skipped (time)"; return; fi
  timeout 120 python3 -m validation.megakernel --model $model --batch $batch --modes $modes --reps 10 \
    --json "$out/$f.json" "$@" > "$out/$f.log" 2>&1
  echo "$f rc=$? $(grep -ho 'measured *[0-9.]* us (spread [0-9.]*)' "$out/$f.log" | tr '\n' ' ')" \
       "$(grep -ho 'max rel err [0-9.e+-]*' "$out/$f.log" | tr '\n' ' ')"
}
F="--wl fuse_norm=1 --wl fuse_rope=1 --wl fuse_silu=1"
one steps/llama-3.2-1b-b1 megakernel llama-3.2-1b 1 --wl kv_splits=16 $F
one steps/llama-3.2-1b-b4 megakernel llama-3.2-1b 4 $F
one steps/llama-3.2-1b-b8 megakernel llama-3.2-1b 8 $F
one steps/llama-3.1-8b-b1 megakernel llama-3.1-8b 1 $F
one steps/llama-3.2-3b-b1 megakernel llama-3.2-3b 1 $F
for c in 1:1:32:4 1:1:16:2 1:1:64:2 1:1:8:4 1:8:32:2 8:1:32:4; do
  IFS=: read m b p d <<< "$c"; M=llama-3.2-1b; [ $m = 8 ] && M=llama-3.1-8b
  one ops/$M-b$b-p$p-d$d graph $M $b --single-ops --opt page_KiB=$p --opt prefetch_depth=$d
done
cd "$out/.." && tar czf r5.tgz "$(basename "$out")"
