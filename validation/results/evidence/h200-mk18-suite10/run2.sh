#!/usr/bin/env bash
# Session 10, second call: what polling the data (sync="sentinel") costs. (a) mech_bench poll: a
# waiter warp per SM polling bytes that stay the sentinel while the other warps stream DRAM, and
# a producer's stores to 131 pollers seeing them; (b) plan2.json through validation.megakernel.ab:
# llama-3.2-1b b1 and b8, counter against sentinel as it is, with the pollers sleeping 256 / 2048 ns
# after a pass that left units pending, with 4 polls in flight a lane instead of 16; and the fused
# b1 schedule with 5 (the searched schedule's) against 16 KV splits, interleaved.
#   bash validation/results/evidence/h200-mk18-suite10/run2.sh $OUT/s2
set -u
out=${1:?out dir}; mkdir -p "$out"
export PYTHONPATH=$PWD/build/pydeps PYTHONUNBUFFERED=1
here=validation/results/evidence/h200-mk18-suite10
nvcc -O3 -arch=sm_90 -std=c++17 -Xptxas -v -o "$out/mech_bench" validation/mechanisms/mech_bench.cu > "$out/build.txt" 2>&1
echo "build rc=$?"
timeout 150 "$out/mech_bench" poll > "$out/poll.json" 2> "$out/poll.err"; echo "poll rc=$?"; rm -f "$out/mech_bench"
timeout 400 python3 -m validation.megakernel.ab $here/plan2.json --out "$out/ab" --budget-s 330 > "$out/ab.log" 2>&1
echo "ab rc=$?"; tail -14 "$out/ab.log"
cd "$out/.." && tar czf s2.tgz "$(basename "$out")"
