#!/usr/bin/env bash
# Session 10, fifth call: the suite's megakernel default, searched and fused cases again, the
# schedules searched again (validation/schedules/: KV splits up to 4x the default, the fused trial
# at the split the model prefers), so that searched and default are measured in one call; merged
# into validation/results/h200 with `mksim validate merge` (these cases replace the first call's).
#   bash validation/results/evidence/h200-mk18-suite10/run5.sh $OUT/s5
set -u
out=${1:?out dir}; mkdir -p "$out"
export PYTHONPATH=$PWD/build/pydeps PYTHONUNBUFFERED=1
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
timeout 400 python3 -m validation.suite_run run --out "$out/suite" --only megakernel:default \
  --only megakernel:searched --only megakernel:fused --timeout-s 300 > "$out/log.txt" 2>&1
echo "suite rc=$?"; grep -v "refused" "$out/log.txt" | cut -c1-120
cd "$out/.." && tar czf s5.tgz "$(basename "$out")"
