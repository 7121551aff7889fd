#!/usr/bin/env bash
# Session 9, fourth call: the tensor-core matmul is bound by its workers (run3: with the copies left
# out a gate_up task takes as long), ~0.66 us a page of fixed cost. Variants that cut or amortise it:
# no integer division on the per-page path (MK_MM_FASTDIV=1) and larger pages (48 and 64 KiB, the
# depth what fits), interleaved; with the diagnostic stamps (MK_TRACE_X=1) where marked.
#   bash validation/results/evidence/h200-mk18-ring/run4.sh $OUT/r4
set -u
out=${1:?out dir}; mkdir -p "$out/tr"
export PYTHONPATH=$PWD/build/pydeps PYTHONUNBUFFERED=1
here=validation/results/evidence/h200-mk18-ring
t0=$(date +%s)
one() {  # name defines model batch args...
  local name=$1 defs=$2 model=$3 batch=$4; shift 4
  if [ $(( $(date +%s) - t0 )) -gt 400 ]; then echo "$name skipped (time)"; return; fi
  local tr=""; case "$defs" in *MK_TRACE_X*) tr="--traces $out/tr/$name";; esac
  MKSIM_KERNEL_DEFINES="$defs" timeout 150 python3 -m validation.megakernel --model $model --batch $batch \
    --modes megakernel --reps 20 --json "$out/$name.json" $tr "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $(grep -ho 'measured *[0-9.]* us (spread [0-9.]*)' "$out/$name.log" | head -1)" \
       "$(grep -ho 'max rel err [0-9.e+-]*' "$out/$name.log" | head -1)" \
       "$(grep -ho 'matmul n=[0-9]* wait [0-9.]* compute [0-9.]*' "$out/$name.log")"
  grep -h "^error\|Error" "$out/$name.log" | head -2
  if [ -n "$tr" ]; then python3 $here/stamps.py "$out"/tr/$name/*.npz 1 | tee "$out/$name.stamps.json"; fi
}
F="--wl fuse_norm=1 --wl fuse_rope=1 --wl fuse_silu=1"
S="--wl kv_splits=16"
D="-DMK_MM_FASTDIV=1"
P64="--opt page_KiB=64 --opt prefetch_depth=2"
P48="--opt page_KiB=48 --opt prefetch_depth=3"
one b1-base "" llama-3.2-1b 1 $S $F
one b1-fd "$D" llama-3.2-1b 1 $S $F
one b1-p64 "" llama-3.2-1b 1 $S $F $P64
one b1-p48 "" llama-3.2-1b 1 $S $F $P48
one b1-fd-p64 "$D" llama-3.2-1b 1 $S $F $P64
one b1-fd-p48 "$D" llama-3.2-1b 1 $S $F $P48
one b1-base2 "" llama-3.2-1b 1 $S $F
one b1-fd2 "$D" llama-3.2-1b 1 $S $F
one b1-fd-nocopy "$D -DMK_NO_COPY=1 -DMK_TRACE_X=1" llama-3.2-1b 1 $S $F
one b1-p64-nocopy "$D -DMK_NO_COPY=1 -DMK_TRACE_X=1" llama-3.2-1b 1 $S $F $P64
one 8b-base "" llama-3.1-8b 1 $F
one 8b-fd "$D" llama-3.1-8b 1 $F
one 8b-fd-p64 "$D" llama-3.1-8b 1 $F $P64
one b8-base "" llama-3.2-1b 8 $F
one b8-fd-p44 "$D" llama-3.2-1b 8 $F --opt page_KiB=44 --opt prefetch_depth=2
rm -rf "$out/tr"
cd "$out/.." && tar czf r4.tgz "$(basename "$out")"
