#!/usr/bin/env bash
# Session 10, sixth call: what the sentinel's acquire fence after the polls costs at batch 1 and 8
# (plan6.json: llama-3.2-1b default schedule, counter, sentinel, sentinel built with
# -DMK_SENTINEL_FENCE=0), for the model's next sentinel term. Evidence only: compositions.
#   bash validation/results/evidence/h200-mk18-suite10/run6.sh $OUT/s6
set -u
out=${1:?out dir}; mkdir -p "$out"
export PYTHONPATH=$PWD/build/pydeps PYTHONUNBUFFERED=1
here=validation/results/evidence/h200-mk18-suite10
timeout 300 python3 -m validation.megakernel.ab $here/plan6.json --out "$out/ab" --budget-s 240 > "$out/ab.log" 2>&1
echo "ab rc=$?"; grep -h "measured" "$out/ab.log" | cut -c1-110
cd "$out/.." && tar czf s6.tgz "$(basename "$out")"
