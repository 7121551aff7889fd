#!/usr/bin/env bash
# Session 10, third call: 131 SMs reading the same bytes just written (mech_bench bcast: a matmul
# task's input rows, the fused reduction's partials), the poll sweep again (another machine), and
# plan3.json: the attention reduction fused into o_proj (fuse_reduce) at 2, 3, 5 KV splits against
# the fused schedule at 16, llama-3.2-1b b1, twice interleaved; b8 fused with input-row stamps.
#   bash validation/results/evidence/h200-mk18-suite10/run3.sh $OUT/s3
set -u
out=${1:?out dir}; mkdir -p "$out"
export PYTHONPATH=$PWD/build/pydeps PYTHONUNBUFFERED=1
here=validation/results/evidence/h200-mk18-suite10
nvcc -O3 -arch=sm_90 -std=c++17 -Xptxas -v -o "$out/mech_bench" validation/mechanisms/mech_bench.cu > "$out/build.txt" 2>&1
echo "build rc=$?"
timeout 120 "$out/mech_bench" bcast > "$out/bcast.json" 2> "$out/bcast.err"; echo "bcast rc=$?"
timeout 120 "$out/mech_bench" poll > "$out/poll.json" 2> "$out/poll.err"; echo "poll rc=$?"; rm -f "$out/mech_bench"
timeout 300 python3 -m validation.megakernel.ab $here/plan3.json --out "$out/ab" --budget-s 240 > "$out/ab.log" 2>&1
echo "ab rc=$?"; grep -h "measured" "$out/ab.log" | cut -c1-140
cd "$out/.." && tar czf s3.tgz "$(basename "$out")"
