#!/usr/bin/env bash
# Session 10, first call: issue 18's suite on the kernel of session 9 (MK_MM_FASTDIV=1), commit 25cc6d2.
# (a) the 48 standard cases with traces (-> validation/results/h200), (b) the held-out llama-3.2-3b at
# batch 1, 4, 8 in every mode, megakernel default / fused / sentinel (-> validation/results/h200-heldout),
# (c) inductor_graph llama-3.2-1b b1 KV 1024 in the same call (the 1.5x target).
#   bash validation/results/evidence/h200-mk18-suite10/run1.sh $OUT/s1
set -u
out=${1:?out dir}; mkdir -p "$out"
export PYTHONPATH=$PWD/build/pydeps PYTHONUNBUFFERED=1
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
timeout 300 python3 -m validation.suite_run run --out "$out/suite" --traces --timeout-s 240 > "$out/log-suite.txt" 2>&1
echo "suite rc=$?"; tail -2 "$out/log-suite.txt"
timeout 150 python3 - "$out/heldout" > "$out/log-heldout.txt" 2>&1 <<'PY'
import dataclasses, sys
from validation import suite as vs
cases = []  # no searched schedule for a held-out model; fused: the builder's KV splits
for c in vs.standard_cases(("llama-3.2-3b",), (1, 4, 8)):
    if c.schedule == "fused":
        c = dataclasses.replace(c, workload_options=tuple(o for o in c.workload_options if o[0] != "kv_splits"))
    if c.schedule != "searched":
        cases.append(c)
doc = vs.run_suite(cases, sys.argv[1], timeout_s=120, say=lambda m: print(m, flush=True))
print(len(doc["cases"]), "cases; not begun:", doc["not_begun"])
PY
echo "heldout rc=$?"; tail -2 "$out/log-heldout.txt"
timeout 200 python3 -m validation.stacks run --out "$out/inductor" --models llama-3.2-1b --stacks inductor_graph \
  --batches 1 --kv 1024 --ops-models '' --timeout 170 > "$out/log-inductor.txt" 2>&1
echo "inductor rc=$?"; tail -3 "$out/log-inductor.txt"
cd "$out/.." && tar czf s1.tgz "$(basename "$out")"
