#!/usr/bin/env bash
# Session 9, third call: where a matmul task's compute goes (input rows, first page, pages, flush),
# from the diagnostic stamps of -DMK_TRACE_X=1 and 2, at llama-3.2-1b b1 and b8 and llama-3.1-8b b1;
# and the same stamps with the ring's copies left out (MK_NO_COPY: the workers alone) or the
# workers' arithmetic left out (MK_NO_MMA: the copies alone); those two give wrong products.
#   bash validation/results/evidence/h200-mk18-ring/run3.sh $OUT/r3
set -u
out=${1:?out dir}; mkdir -p "$out/tr"
export PYTHONPATH=$PWD/build/pydeps PYTHONUNBUFFERED=1
here=validation/results/evidence/h200-mk18-ring
one() {  # name X model batch args...  (EXTRA: more defines)
  local name=$1 x=$2 model=$3 batch=$4; shift 4
  MKSIM_KERNEL_DEFINES="-DMK_TRACE_X=$x ${EXTRA:-}" timeout 150 python3 -m validation.megakernel --model $model --batch $batch \
    --modes megakernel --reps 10 --json "$out/$name.json" --traces "$out/tr/$name" "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $(grep -ho 'measured *[0-9.]* us' "$out/$name.log" | head -1)"
  python3 $here/stamps.py "$out"/tr/$name/*.npz $x | tee "$out/$name.stamps.json"
}
F="--wl fuse_norm=1 --wl fuse_rope=1 --wl fuse_silu=1"
S="--wl kv_splits=16"
one 1b-b1-x1 1 llama-3.2-1b 1 $S $F
one 1b-b1-x2 2 llama-3.2-1b 1 $S $F
one 1b-b8-x1 1 llama-3.2-1b 8 $F
one 1b-b8-x2 2 llama-3.2-1b 8 $F
one 8b-b1-x1 1 llama-3.1-8b 1 $F
EXTRA=-DMK_NO_COPY=1 one 1b-b1-nocopy 1 llama-3.2-1b 1 $S $F
EXTRA=-DMK_NO_MMA=1 one 1b-b1-nomma 1 llama-3.2-1b 1 $S $F
EXTRA=-DMK_NO_COPY=1 one 1b-b8-nocopy 1 llama-3.2-1b 8 $F
rm -rf "$out/tr"
cd "$out/.." && tar czf r3.tgz "$(basename "$out")"
