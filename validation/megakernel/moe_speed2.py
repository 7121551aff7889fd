"""The MoE megakernel's batch-1 step, second round (validation/results/h200-moe-speed-2), on one H200 in one
command (< 7 minutes):

    python -m validation.megakernel.moe_speed2 OUT [--round 1|2] [--dry-run]

What it runs is :func:`validation.megakernel.moe_speed.run` with its own builds and cases. Builds
(:data:`BUILDS`, ``MKSIM_KERNEL_DEFINES``):

- ``base``: no defines, the kernel as it is (the early expert stream; ``early`` of h200-moe-speed);
- ``ftopk``: ``-DMK_MOE_FTOPK=1``, each MoE layer's top-k run by the router's last task on its SM (a
  ticket per router task), not as a task of its own after a hop (mk_kernel.cu, above ``mk_ftopk_router``).

Designs (:func:`validation.megakernel.moe_speed.workload_options`): ``plan`` (the suite's schedule),
``plan_fn`` (the norms fused into the matmuls after them), ``plan_fn_kvN`` (and the KV cache split ``N``
times: more attention partials, each shorter), ``plan_fn_red`` (and the attention reduction merged in the
O projection's input load, ``fuse_reduce``). Each case is checked against torch (route tables exactly),
timed (median of 20), and its per-op phases recorded, as moe_speed does. ``--round 2``
(:data:`CASES2`): the kernel as it is, the KV split around round 1's best and deeper rings (``_pN_dN``:
pages of N KiB, N of them; :func:`validation.megakernel.moe_speed.schedule_options`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from . import moe_speed

BUDGET_S = 300.0  # no case begun after this (the compiles included)
BUILDS: dict[str, str] = {"base": "", "ftopk": "-DMK_MOE_FTOPK=1"}
Q, O = "qwen3-30b-a3b", "olmoe-1b-7b"
# (model, batch, design, builds), most wanted first. The KV split: 16 for qwen3-30b-a3b (4 KV heads: 64
# partials), 8 for OLMoE (16 KV heads: 128 partials); the default is 5 for both.
CASES: tuple[tuple[str, int, str, tuple[str, ...]], ...] = (
    (Q, 1, "plan_fn", ("base", "ftopk")),
    (O, 1, "plan_fn", ("base", "ftopk")),
    (Q, 1, "plan", ("base", "ftopk")),
    (O, 1, "plan", ("base", "ftopk")),
    (Q, 1, "plan_fn_kv16", ("base", "ftopk")),
    (O, 1, "plan_fn_kv8", ("base", "ftopk")),
    (Q, 1, "plan_fn_red", ("base",)),
    (O, 1, "plan_fn_red", ("base",)),
    (Q, 8, "plan_fn", ("base", "ftopk")),
    (O, 8, "plan_fn", ("base", "ftopk")),
    (Q, 8, "plan", ("base",)),
    (O, 8, "plan", ("base",)),
)


# round 2 (the kernel as it is): the KV split around the best of round 1, and deeper rings in the shared
# memory the round-1 schedules leave free (qwen3-30b-a3b: 3 x 32 KiB pages and 28 KiB free; OLMoE 4 x 32
# and 29 KiB free; 4 x 39 KiB is refused, 228 KiB): more of each expert task's bytes in flight at its start
CASES2: tuple[tuple[str, int, str, tuple[str, ...]], ...] = (
    (Q, 1, "plan_fn_kv16", ("base",)),
    (O, 1, "plan_fn_kv8", ("base",)),
    (Q, 1, "plan_fn_kv16_p40_d3", ("base",)),
    (Q, 1, "plan_fn_kv16_p30_d4", ("base",)),
    (O, 1, "plan_fn_kv8_p38_d4", ("base",)),
    (O, 1, "plan_fn_kv8_p31_d5", ("base",)),
    (Q, 1, "plan_fn_kv32", ("base",)),
    (Q, 1, "plan_fn_kv8", ("base",)),
    (O, 1, "plan_fn_kv6", ("base",)),
    (Q, 1, "plan_fn_kv16_p24_d5", ("base",)),
)
ROUNDS = {"1": CASES, "2": CASES2}


def main(argv: list[str]) -> int:
    rnd = argv[argv.index("--round") + 1] if "--round" in argv[:-1] else "1"
    if not argv or argv[0].startswith("-") or rnd not in ROUNDS:
        print("usage: python -m validation.megakernel.moe_speed2 OUT [--round 1|2] [--dry-run]", file=sys.stderr)
        return 2
    doc = moe_speed.run(Path(argv[0]), dry="--dry-run" in argv[1:], budget_s=BUDGET_S, cases=ROUNDS[rnd],
                        builds=BUILDS)
    bad = [f"{r['model']} b{r['batch']} {r['design']} {r['build']}" for r in doc["records"]
           if "failed" in r or r.get("ok") is False or "refused" in r]
    print(json.dumps({"summary": moe_speed.summarize(doc["records"]), "bad": bad, "skipped": doc.get("skipped", [])}))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
