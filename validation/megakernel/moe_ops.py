"""The MoE kernel's A/B and its single ops on one H200, in one command (< 8 minutes):

    python -m validation.megakernel.moe_ops OUT [--dry-run]

1. A/B of the MoE device functions: the step's top-k and combine as they are (``mk_topk``,
   ``mk_combine`` in mk_ops.cuh) against the first versions (``-DMK_MOE_V1=1``), each build in turn in
   this process: the megakernel (moe_stride) of qwen3-30b-a3b and olmoe-1b-7b at batch 1 (then, with
   time left, batch 8 and the combine's loads four at a time, ``-DMK_COMBINE_CHUNK=4``). Each: checked
   against torch (route tables exactly), timed (median of 20), the trace per kind and its ``moe`` part
   (expert tasks split by active slot; the router's end to the top-k's; the top-k's end to the
   experts' start). Into ``OUT/ab.json``.
2. Single ops: each distinct op of olmoe-1b-7b, qwen3-30b-a3b and mixtral-8x7b at batch 1 and 8 in
   ``graph`` mode, run alone as one kernel with L2 flushed (``gpu.Runner.time_ops``; the MoE ops'
   records say which slots were active), after the step is checked once. Into
   ``OUT/single_ops.json``, the rows ``python -m validation kernel-costs`` reads:

       python -m validation kernel-costs OUT/single_ops.json --kinds topk,combine \\
           --profile hwmodels/profiles/mksim.toml

   fits the top-k and combine tables and holds the expert matmuls against the matmul table.

Every kernel launch has a watchdog; the whole stops starting cases at 7 minutes; a hung kernel (the
GPU context lost) ends it. ``OUT/moe_ops.json`` gathers everything with the device and the commit.
``--dry-run``: plan every case on the CPU (schedules, kernel plans, predictions) and write what the
run would, without timings: what a test runs.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import mksim
from mksim import models

from . import program as P
from .abcase import commit, device, one_line, run_case, runner

GPU = "h200"
KV = 1024
BUDGET_S = 7 * 60
WATCHDOG_S = 120.0
# (model, batch, build name, extra defines): the A/B, most wanted first
AB: tuple[tuple[str, int, str, str], ...] = (
    ("qwen3-30b-a3b", 1, "new", ""), ("qwen3-30b-a3b", 1, "v1", "-DMK_MOE_V1=1"),
    ("olmoe-1b-7b", 1, "new", ""), ("olmoe-1b-7b", 1, "v1", "-DMK_MOE_V1=1"),
)
AB_MORE: tuple[tuple[str, int, str, str], ...] = (
    ("qwen3-30b-a3b", 1, "combine4", "-DMK_COMBINE_CHUNK=4"), ("qwen3-30b-a3b", 1, "new", ""),
    ("qwen3-30b-a3b", 8, "new", ""), ("qwen3-30b-a3b", 8, "v1", "-DMK_MOE_V1=1"),
    ("olmoe-1b-7b", 8, "new", ""), ("olmoe-1b-7b", 8, "v1", "-DMK_MOE_V1=1"),
)
SINGLE: tuple[tuple[str, int], ...] = tuple((m, b) for m in ("olmoe-1b-7b", "qwen3-30b-a3b", "mixtral-8x7b")
                                            for b in (1, 8))


def schedule(model: str, T: int, mode: str) -> Any:
    """The step's schedule as the device runs it: ``megakernel`` with moe_stride, or a chain mode."""
    cfg = models.get(model)
    opts = dict(P.kernel_options(cfg, T, KV, GPU, mode))
    if mode == "megakernel":
        opts["moe_dispatch"] = "stride"
    return mksim.build_schedule(models.workload(cfg, batch=T, kv_len=KV, fuse_silu=True), GPU, mode, **opts)


def ab_case(model: str, T: int, build: str, defines: str, dry: bool) -> dict:
    rec: dict[str, Any] = {"model": model, "batch": T, "mode": "megakernel", "design": "moe_stride", "build": build,
                           "defines": defines}

    def measured(r: Any, _s: Any, times: list[float]) -> dict[str, Any]:
        return {"measured_us": statistics.median(times), "spread_us": max(times) - min(times), "times_us": times,
                "trace": r.trace_summary()}

    return run_case(rec, lambda: schedule(model, T, "megakernel"), defines, dry,
                    predict=lambda s: float(mksim.simulate(s, timeline=False).latency_us), reps=20,
                    watchdog_s=WATCHDOG_S, checked=topk_err, measured=measured)


def topk_err(local: dict[str, float]) -> dict[str, float]:
    """The largest relative error of an MoE step's top-k ops (their route tables)."""
    return {"topk_err": max(v for k, v in local.items() if k.endswith(".topk"))}


def single_case(model: str, T: int, dry: bool) -> dict:
    rec: dict[str, Any] = {"model": model, "batch": T, "mode": "graph", "single_ops": []}
    t0 = time.monotonic()
    try:
        s = schedule(model, T, "graph")
        plan = P.plan(s)
        rec["kernel"] = {"page_B": plan.page_B, "depth": plan.depth, "smem_B": plan.smem_B}
        if dry:
            rec["ops"] = sum(1 for op in s.workload.ops if op.kind in ("topk", "combine")
                             or op.attrs.get("grouped") == "experts")
            return rec
        r = runner(s, "")
    except Exception as exc:
        rec["refused"] = one_line(exc)
        return rec
    try:
        local, _ = r.check(WATCHDOG_S)
        worst = max(local, key=local.__getitem__)
        rec.update(ok=local[worst] <= 1e-2, max_rel_err=local[worst], worst_op=worst)
        rec["single_ops"] = r.time_ops(reps=10, watchdog_s=WATCHDOG_S)
    except Exception as exc:
        rec["failed"] = one_line(exc)
        rec["traceback"] = traceback.format_exc()[-1500:]
    finally:
        r.close()
        rec["wall_s"] = time.monotonic() - t0
    return rec


def run(out: Path, dry: bool = False, budget_s: float = BUDGET_S) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    t_end = time.monotonic() + budget_s
    doc: dict[str, Any] = {"commit": commit(), "device": "" if dry else device(), "dry_run": dry, "gpu": GPU,
                           "kv_len": KV, "ab": [], "single_ops": []}
    hung = False

    def save() -> None:
        (out / "ab.json").write_text(json.dumps(doc["ab"], indent=1, default=float))
        (out / "single_ops.json").write_text(json.dumps(doc["single_ops"], indent=1, default=float))
        (out / "moe_ops.json").write_text(json.dumps(doc, indent=1, default=float))

    def note(rec: dict) -> None:
        nonlocal hung
        keep = {k: v for k, v in rec.items() if k not in ("traceback", "trace", "single_ops", "times_us")}
        print(json.dumps(keep, default=float), flush=True)
        hung = hung or "hung" in str(rec.get("failed", ""))
        save()

    # (model, batch, build, defines) of an A/B case; build None: the model's single ops
    todo: list[tuple[str, int, str | None, str]] = [*AB, *((m, b, None, "") for m, b in SINGLE), *AB_MORE]
    for model, T, build, defines in todo:
        if hung:
            break
        if time.monotonic() > t_end:
            doc["skipped"] = doc.get("skipped", []) + [f"{model} b{T} {build or 'single ops'}"]
            continue
        if build is not None:
            rec = ab_case(model, T, build, defines, dry=dry)
            doc["ab"].append(rec)
        else:
            rec = single_case(model, T, dry=dry)
            doc["single_ops"].append(rec)
        note(rec)
    save()
    return doc


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("usage: python -m validation.megakernel.moe_ops OUT [--dry-run]", file=sys.stderr)
        return 2
    doc = run(Path(argv[0]), dry="--dry-run" in argv[1:])
    bad = [f"{r['model']} b{r['batch']} {r.get('build', r['mode'])}" for r in doc["ab"] + doc["single_ops"]
           if "failed" in r or r.get("ok") is False]
    print(json.dumps({"ab": len(doc["ab"]), "single": len(doc["single_ops"]), "bad": bad,
                      "skipped": doc.get("skipped", [])}))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
