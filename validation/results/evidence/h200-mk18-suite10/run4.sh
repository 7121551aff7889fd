#!/usr/bin/env bash
# Session 10, fourth call: plan4.json through validation.megakernel.ab — the model's choice of KV
# splits against silicon (llama-3.2-1b fused b1 at 5/8/16 splits, b4 and b8 at 3/5/10, llama-3.1-8b
# b1 at 5/16), and single ops (graph mode, L2 flushed) of the fused-reduction schedule at b1/b4/b8,
# whose o_proj tasks a later fit of the merge needs.
#   bash validation/results/evidence/h200-mk18-suite10/run4.sh $OUT/s4
set -u
out=${1:?out dir}; mkdir -p "$out"
export PYTHONPATH=$PWD/build/pydeps PYTHONUNBUFFERED=1
here=validation/results/evidence/h200-mk18-suite10
timeout 420 python3 -m validation.megakernel.ab $here/plan4.json --out "$out/ab" --budget-s 360 > "$out/ab.log" 2>&1
echo "ab rc=$?"; grep -h "measured" "$out/ab.log" | cut -c1-110
cd "$out/.." && tar czf s4.tgz "$(basename "$out")"
